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
    include_str!("sql/queue_stats.sql"),
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::FLOAT8OID],
);
const STRANDED: Stmt = Stmt::read(include_str!("sql/stranded_work.sql"), &[PgBuiltInOids::FLOAT8OID]);
const CONCURRENCY: Stmt = Stmt::read(include_str!("sql/concurrency_stats.sql"), &[]);

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
