//! Operator views of the queue: counts by state, stranded work, concurrency
//! keys. They scan a queue's rows: not hot paths.

use pgrx::datum::Interval;
use pgrx::prelude::*;

use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::queue::workers::LIVE_SECS;

row! {
    /// One queue's tasks by state, its dead letters, its live workers, and
    /// the age of its oldest ready task.
    pub struct QueueCounts {
        pub ready: i64,
        pub scheduled: i64,
        pub running: i64,
        pub waiting: i64,
        pub dead: i64,
        pub live_workers: i64,
        pub oldest_ready_age: Option<Interval>,
    }
}

row! {
    /// A queue with ready tasks and no live worker: its ready count and the
    /// age of its oldest ready task.
    pub struct Stranded {
        pub queue: String,
        pub ready: i64,
        pub oldest_ready_age: Option<Interval>,
    }
}

row! {
    /// A concurrency key: its cap (`None` if uncapped), and its running,
    /// ready and waiting tasks.
    pub struct KeyCounts {
        pub key: String,
        pub max_running: Option<i32>,
        pub running: i64,
        pub ready: i64,
        pub waiting: i64,
    }
}

const QUEUE: Stmt = Stmt::read(
    "SELECT (SELECT count(*) FROM ready WHERE queue = $1), \
            count(*) FILTER (WHERE state = 'scheduled'), \
            count(*) FILTER (WHERE state = 'running'), \
            count(*) FILTER (WHERE state = 'waiting'), \
            (SELECT count(*) FROM dead_letters WHERE queue = $1), \
            (SELECT count(*) FROM workers WHERE $1 = ANY(queues) \
                AND last_seen_at > now() - make_interval(secs => $2)), \
            now() - (SELECT min(t.enqueued_at) FROM ready r JOIN tasks t ON t.id = r.task_id \
                     WHERE r.queue = $1) \
     FROM tasks WHERE queue = $1",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::FLOAT8OID],
);
const STRANDED: Stmt = Stmt::read(
    "SELECT q.name, \
            (SELECT count(*) FROM ready r WHERE r.queue = q.name), \
            now() - (SELECT min(t.enqueued_at) FROM ready r JOIN tasks t ON t.id = r.task_id \
                     WHERE r.queue = q.name) \
     FROM queues q \
     WHERE EXISTS (SELECT 1 FROM ready r WHERE r.queue = q.name) \
       AND NOT EXISTS (SELECT 1 FROM workers w WHERE q.name = ANY(w.queues) \
                       AND w.last_seen_at > now() - make_interval(secs => $1)) \
     ORDER BY q.name",
    &[PgBuiltInOids::FLOAT8OID],
);
const CONCURRENCY: Stmt = Stmt::read(
    "SELECT coalesce(c.key, t.concurrency_key), l.max_running, \
            coalesce(t.running, 0), coalesce(t.ready, 0), coalesce(t.waiting, 0) \
     FROM (SELECT concurrency_key, \
                  count(*) FILTER (WHERE state = 'running') AS running, \
                  count(*) FILTER (WHERE state = 'ready') AS ready, \
                  count(*) FILTER (WHERE state = 'waiting') AS waiting \
           FROM tasks WHERE concurrency_key IS NOT NULL GROUP BY concurrency_key) t \
     FULL JOIN (SELECT key FROM concurrency_limits) c ON c.key = t.concurrency_key \
     LEFT JOIN concurrency_limits l ON l.key = coalesce(c.key, t.concurrency_key) \
     ORDER BY 1",
    &[],
);

/// One queue's tasks by state, its dead letters, its live workers, and the
/// age of its oldest ready task.
pub fn queue(name: &str) -> QueueCounts {
    QUEUE.one(&[name.into(), (LIVE_SECS as f64).into()], "reading queue stats")
}

/// Claimable work nobody is claiming: each queue with ready tasks and no
/// live worker serving it, with its ready count and the age of its oldest
/// ready task. Walks the queue list and seeks each queue's ready rows, so
/// its cost follows the queues and the stranded rows only.
pub fn stranded() -> Vec<Stranded> {
    STRANDED.all(&[(LIVE_SECS as f64).into()], "reading stranded work")
}

/// Per concurrency key: its cap (`None` if uncapped), and its running,
/// ready and waiting tasks; capped keys and keys with unfinished tasks.
pub fn concurrency() -> Vec<KeyCounts> {
    CONCURRENCY.all(&[], "reading concurrency stats")
}
