//! Operator listings: one task, a queue's tasks by state, dead letters, and
//! every queue with its counts. Each walk follows an index `tasks` (or
//! `dead_letters`) already has, from a keyset anchor
//! (`sheaf_core::listing`), so a page costs its rows, not the table; nothing
//! here writes, and nothing was added to the claim's tables for it.

use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use sheaf_core::listing::{DeadAnchor, STATE_ORDER, TaskAnchor};
use sheaf_core::state::TaskState;

use crate::base::errors::bad_argument;
use crate::base::plans::Stmt;
use crate::base::rows::{Split, row};

/// The columns every task row starts with (`t` is `tasks`).
macro_rules! task_columns {
    () => {
        "t.id, t.queue, t.kind, t.state, t.priority, t.attempts, t.max_attempts, t.run_at, t.enqueued_at, \
         t.concurrency_key, t.lease_expires_at, t.last_error, t.execution_id, \
         (SELECT p.progress FROM task_progress p WHERE p.task_id = t.id) AS progress"
    };
}

/// A listed task: id, kind, state, priority, attempts, max_attempts,
/// run_at, enqueued_at, concurrency_key, lease end, last_error, execution,
/// progress, and its anchor.
pub type ListedTask = (
    pgrx::Uuid,
    String,
    String,
    i32,
    i32,
    i32,
    TimestampWithTimeZone,
    TimestampWithTimeZone,
    Option<String>,
    Option<TimestampWithTimeZone>,
    Option<String>,
    Option<pgrx::Uuid>,
    Option<pgrx::JsonB>,
    pgrx::JsonB,
);

row! {
    /// A task's `task_columns!()`.
    struct TaskRow {
        id: pgrx::Uuid,
        _queue: String,
        kind: String,
        state: String,
        priority: i32,
        attempts: i32,
        max_attempts: i32,
        run_at: TimestampWithTimeZone,
        enqueued_at: TimestampWithTimeZone,
        concurrency_key: Option<String>,
        lease_expires_at: Option<TimestampWithTimeZone>,
        last_error: Option<String>,
        execution_id: Option<pgrx::Uuid>,
        progress: Option<pgrx::JsonB>,
    }
}

row! {
    /// A ready task's place in line, after its `TaskRow`.
    struct ReadyKeys {
        k1: f64,
        k2: f64,
        seq: i64,
    }
}

row! {
    /// A scheduled, running or paused task's anchor, after its `TaskRow`:
    /// a time (run_at, lease end, or its execution's creation) and an id
    /// (its own, or its execution's).
    struct TimedKeys {
        at: TimestampWithTimeZone,
        id: pgrx::Uuid,
    }
}

row! {
    /// A waiting task's place in its key's line, after its `TaskRow`.
    struct WaitingKeys {
        key: String,
        priority: i32,
        seq: i64,
    }
}

const READY: Stmt = Stmt::read(
    concat!(
        "SELECT ",
        task_columns!(),
        ", r.k1, r.k2, r.seq FROM ready r JOIN tasks t ON t.id = r.task_id \
         WHERE r.queue = $1 AND (r.k1, r.k2, r.seq) > ($2, $3, $4) \
         ORDER BY r.k1, r.k2, r.seq LIMIT $5"
    ),
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::INT8OID,
    ],
);
const SCHEDULED: Stmt = Stmt::read(
    concat!(
        "SELECT ",
        task_columns!(),
        ", t.run_at, t.id FROM tasks t \
         WHERE t.queue = $1 AND t.state = 'scheduled' AND (t.run_at, t.id) > ($2, $3) \
         ORDER BY t.run_at, t.id LIMIT $4"
    ),
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TIMESTAMPTZOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT8OID,
    ],
);
const RUNNING: Stmt = Stmt::read(
    concat!(
        "SELECT ",
        task_columns!(),
        ", t.lease_expires_at, t.id FROM tasks t \
         WHERE t.queue = $1 AND t.state = 'running' AND (t.lease_expires_at, t.id) > ($2, $3) \
         ORDER BY t.lease_expires_at, t.id LIMIT $4"
    ),
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TIMESTAMPTZOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT8OID,
    ],
);
/// `tasks_waiting` is by key, priority descending, seq: the rest of the
/// anchor's priority, then its lower priorities, then the later keys, each
/// a seek of its own (the index has no queue: other queues' waiting tasks
/// are stepped over).
macro_rules! waiting_branch {
    ($b:literal, $cond:literal, $order:literal) => {
        concat!(
            "(SELECT ",
            $b,
            " AS b, ",
            task_columns!(),
            ", t.concurrency_key AS ck, t.priority AS p, t.seq AS s FROM tasks t \
             WHERE t.state = 'waiting' AND ",
            $cond,
            " AND t.queue = $1 ORDER BY ",
            $order,
            " LIMIT $5)"
        )
    };
}
const WAITING: Stmt = Stmt::read(
    concat!(
        "SELECT ",
        "id, queue, kind, state, priority, attempts, max_attempts, run_at, enqueued_at, \
         concurrency_key, lease_expires_at, last_error, execution_id, progress, ck, p, s FROM (",
        waiting_branch!(
            "1",
            "t.concurrency_key = $2 AND t.priority = $3 AND t.seq > $4",
            "t.seq"
        ),
        " UNION ALL ",
        waiting_branch!(
            "2",
            "t.concurrency_key = $2 AND t.priority < $3",
            "t.priority DESC, t.seq"
        ),
        " UNION ALL ",
        waiting_branch!(
            "3",
            "t.concurrency_key > $2",
            "t.concurrency_key, t.priority DESC, t.seq"
        ),
        ") w ORDER BY b, ck, p DESC, s LIMIT $5"
    ),
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::INT8OID,
    ],
);
/// Paused tasks belong to paused executions: those in order, then each
/// one's tasks.
const PAUSED: Stmt = Stmt::read(
    concat!(
        "SELECT ",
        task_columns!(),
        ", e.created_at, e.id FROM executions e JOIN tasks t ON t.execution_id = e.id \
         WHERE e.state = 'PAUSED' AND (e.created_at, e.id) >= ($2, $3) \
           AND t.state = 'paused' AND t.queue = $1 AND (e.created_at, e.id, t.id) > ($2, $3, $4) \
         ORDER BY e.created_at, e.id, t.id LIMIT $5"
    ),
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TIMESTAMPTZOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT8OID,
    ],
);

/// The lowest id, where a walk by (time, id) starts.
fn nil() -> pgrx::Uuid {
    pgrx::Uuid::from_bytes([0; 16])
}

/// The highest id, where a walk newest first starts.
fn max_id() -> pgrx::Uuid {
    pgrx::Uuid::from_bytes([0xff; 16])
}

fn uuid(id: uuid::Uuid) -> pgrx::Uuid {
    pgrx::Uuid::from_bytes(*id.as_bytes())
}

fn core_uuid(id: pgrx::Uuid) -> uuid::Uuid {
    uuid::Uuid::from_bytes(*id.as_bytes())
}

fn micros(at: TimestampWithTimeZone) -> i64 {
    pg_sys::TimestampTz::from(at)
}

fn timestamp(arg: &str, at: i64) -> TimestampWithTimeZone {
    TimestampWithTimeZone::try_from(at)
        .unwrap_or_else(|_| bad_argument(arg, format!("holds a time out of range: {at}")))
}

/// One state's page: its rows after `after` (the state's own anchor, or
/// its start), each with its anchor.
fn page_of(queue: &str, state: TaskState, after: Option<&TaskAnchor>, limit: i64) -> Vec<ListedTask> {
    match state {
        TaskState::Ready => ready_page(queue, after, limit),
        TaskState::Scheduled | TaskState::Running => timed_page(queue, state, after, limit),
        TaskState::Waiting => waiting_page(queue, after, limit),
        TaskState::Paused => paused_page(queue, after, limit),
    }
}

fn ready_page(queue: &str, after: Option<&TaskAnchor>, limit: i64) -> Vec<ListedTask> {
    let (k1, k2, seq) = match after {
        Some(TaskAnchor::Ready { k1, k2, seq }) => (*k1, *k2, *seq),
        _ => (f64::NEG_INFINITY, f64::NEG_INFINITY, i64::MIN),
    };
    let found: Vec<Split<TaskRow, ReadyKeys>> = READY.all(
        &[queue.into(), k1.into(), k2.into(), seq.into(), limit.into()],
        "listing ready tasks",
    );
    found
        .into_iter()
        .map(
            |Split {
                 head,
                 tail: ReadyKeys { k1, k2, seq },
             }| { with_anchor(head, &TaskAnchor::Ready { k1, k2, seq }) },
        )
        .collect()
}

/// Scheduled tasks by `run_at`, running ones by lease end.
fn timed_page(queue: &str, state: TaskState, after: Option<&TaskAnchor>, limit: i64) -> Vec<ListedTask> {
    let (at, id) = match after {
        Some(TaskAnchor::Scheduled { at, id } | TaskAnchor::Running { at, id }) => {
            (timestamp("after", *at), uuid(*id))
        }
        _ => (TimestampWithTimeZone::negative_infinity(), nil()),
    };
    let scheduled = state == TaskState::Scheduled;
    let (stmt, doing) = if scheduled {
        (&SCHEDULED, "listing scheduled tasks")
    } else {
        (&RUNNING, "listing running tasks")
    };
    let found: Vec<Split<TaskRow, TimedKeys>> =
        stmt.all(&[queue.into(), at.into(), id.into(), limit.into()], doing);
    found
        .into_iter()
        .map(
            |Split {
                 head,
                 tail: TimedKeys { at, id },
             }| {
                let (at, id) = (micros(at), core_uuid(id));
                let anchor = if scheduled {
                    TaskAnchor::Scheduled { at, id }
                } else {
                    TaskAnchor::Running { at, id }
                };
                with_anchor(head, &anchor)
            },
        )
        .collect()
}

fn waiting_page(queue: &str, after: Option<&TaskAnchor>, limit: i64) -> Vec<ListedTask> {
    let (key, priority, seq) = match after {
        Some(TaskAnchor::Waiting { key, priority, seq }) => (key.as_str(), *priority, *seq),
        _ => ("", 0, 0),
    };
    let found: Vec<Split<TaskRow, WaitingKeys>> = WAITING.all(
        &[
            queue.into(),
            key.into(),
            priority.into(),
            seq.into(),
            limit.into(),
        ],
        "listing waiting tasks",
    );
    found
        .into_iter()
        .map(
            |Split {
                 head,
                 tail: WaitingKeys { key, priority, seq },
             }| { with_anchor(head, &TaskAnchor::Waiting { key, priority, seq }) },
        )
        .collect()
}

fn paused_page(queue: &str, after: Option<&TaskAnchor>, limit: i64) -> Vec<ListedTask> {
    let (at, execution, id) = match after {
        Some(TaskAnchor::Paused { at, execution_id, id }) => {
            (timestamp("after", *at), uuid(*execution_id), uuid(*id))
        }
        _ => (TimestampWithTimeZone::negative_infinity(), nil(), nil()),
    };
    let found: Vec<Split<TaskRow, TimedKeys>> = PAUSED.all(
        &[queue.into(), at.into(), execution.into(), id.into(), limit.into()],
        "listing paused tasks",
    );
    found
        .into_iter()
        .map(
            |Split {
                 head,
                 tail: TimedKeys { at, id: execution },
             }| {
                let anchor = TaskAnchor::Paused {
                    at: micros(at),
                    execution_id: core_uuid(execution),
                    id: core_uuid(head.id),
                };
                with_anchor(head, &anchor)
            },
        )
        .collect()
}

/// The row without its queue (the caller's argument, not repeated in
/// every row), and its anchor.
fn with_anchor(row: TaskRow, anchor: &TaskAnchor) -> ListedTask {
    (
        row.id,
        row.kind,
        row.state,
        row.priority,
        row.attempts,
        row.max_attempts,
        row.run_at,
        row.enqueued_at,
        row.concurrency_key,
        row.lease_expires_at,
        row.last_error,
        row.execution_id,
        row.progress,
        pgrx::JsonB(anchor.to_json()),
    )
}

/// A queue's tasks in `state` (every state, in `STATE_ORDER`, when `None`),
/// after `after`, at most `limit`.
pub fn tasks(
    queue: &str,
    state: Option<TaskState>,
    after: Option<&TaskAnchor>,
    limit: i64,
) -> Vec<ListedTask> {
    let states: Vec<TaskState> = match state {
        Some(s) => vec![s],
        None => {
            let from = after.map_or(0, |a| {
                STATE_ORDER.iter().position(|s| *s == a.state()).unwrap_or(0)
            });
            STATE_ORDER[from..].to_vec()
        }
    };
    let mut out = Vec::new();
    for s in states {
        let left = limit - out.len() as i64;
        if left <= 0 {
            break;
        }
        let own = after.filter(|a| a.state() == s);
        out.extend(page_of(queue, s, own, left));
    }
    out
}

/// A task or a dead letter, by id: the listed columns (its queue, not its
/// id), then payload, lease owner, idempotency key, fairness key, when it
/// was dead-lettered, and its progress ([`Started`] adds when its running
/// attempt was claimed).
pub type TaskDetail = (
    String,
    String,
    String,
    i32,
    i32,
    i32,
    Option<TimestampWithTimeZone>,
    TimestampWithTimeZone,
    Option<String>,
    Option<TimestampWithTimeZone>,
    Option<String>,
    Option<pgrx::Uuid>,
    pgrx::JsonB,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<TimestampWithTimeZone>,
    Option<pgrx::JsonB>,
);

const GET: Stmt = Stmt::read(
    concat!(
        "SELECT ",
        task_columns!(),
        ", t.payload, t.lease_owner, t.idempotency_key, t.fairness_key, NULL::timestamptz, \
                CASE WHEN t.state = 'running' THEN t.claimed_at END \
         FROM tasks t WHERE t.id = $1 \
         UNION ALL \
         SELECT d.id, d.queue, d.kind, 'dead', d.priority, d.attempts, d.max_attempts, NULL, d.enqueued_at, \
                d.concurrency_key, NULL, d.last_error, d.execution_id, \
                (SELECT p.progress FROM task_progress p WHERE p.task_id = d.id), d.payload, NULL, d.idempotency_key, \
                d.fairness_key, d.dead_at, NULL \
         FROM dead_letters d WHERE d.id = $1"
    ),
    &[PgBuiltInOids::UUIDOID],
);

/// A task's detail and when its running attempt was claimed (`None`
/// unless it is running).
pub type Started = (TaskDetail, Option<TimestampWithTimeZone>);

/// The task `id` (or its dead letter), if this shard has it.
pub fn get(id: pgrx::Uuid) -> Option<Started> {
    GET.first::<Detail>(&[id.into()], "reading a task").map(|d| {
        let detail = (
            d.queue,
            d.kind,
            d.state,
            d.priority,
            d.attempts,
            d.max_attempts,
            d.run_at,
            d.enqueued_at,
            d.concurrency_key,
            d.lease_expires_at,
            d.last_error,
            d.execution_id,
            d.payload,
            d.lease_owner,
            d.idempotency_key,
            d.fairness_key,
            d.dead_at,
            d.progress,
        );
        (detail, d.started_at)
    })
}

row! {
    /// A row of `GET`: a task's `task_columns!()` (a dead letter's, with no
    /// `run_at`), then its detail.
    struct Detail {
        _id: pgrx::Uuid,
        queue: String,
        kind: String,
        state: String,
        priority: i32,
        attempts: i32,
        max_attempts: i32,
        run_at: Option<TimestampWithTimeZone>,
        enqueued_at: TimestampWithTimeZone,
        concurrency_key: Option<String>,
        lease_expires_at: Option<TimestampWithTimeZone>,
        last_error: Option<String>,
        execution_id: Option<pgrx::Uuid>,
        progress: Option<pgrx::JsonB>,
        payload: pgrx::JsonB,
        lease_owner: Option<String>,
        idempotency_key: Option<String>,
        fairness_key: Option<String>,
        dead_at: Option<TimestampWithTimeZone>,
        started_at: Option<TimestampWithTimeZone>,
    }
}

/// A listed dead letter: id, queue, kind, priority, attempts,
/// max_attempts, execution, concurrency_key, last_error, enqueued_at,
/// dead_at, and its anchor.
pub type ListedDead = (
    pgrx::Uuid,
    String,
    String,
    i32,
    i32,
    i32,
    Option<pgrx::Uuid>,
    Option<String>,
    Option<String>,
    TimestampWithTimeZone,
    TimestampWithTimeZone,
    pgrx::JsonB,
);

macro_rules! dead_columns {
    () => {
        "d.id, d.queue, d.kind, d.priority, d.attempts, d.max_attempts, d.execution_id, d.concurrency_key, \
         d.last_error, d.enqueued_at, d.dead_at"
    };
}
const DEAD_OF_QUEUE: Stmt = Stmt::read(
    concat!(
        "SELECT ",
        dead_columns!(),
        " FROM dead_letters d WHERE d.queue = $1 AND (d.dead_at, d.id) < ($2, $3) \
         ORDER BY d.dead_at DESC, d.id DESC LIMIT $4"
    ),
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TIMESTAMPTZOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT8OID,
    ],
);
const DEAD: Stmt = Stmt::read(
    concat!(
        "SELECT ",
        dead_columns!(),
        " FROM dead_letters d WHERE (d.dead_at, d.id) < ($1, $2) \
         ORDER BY d.dead_at DESC, d.id DESC LIMIT $3"
    ),
    &[
        PgBuiltInOids::TIMESTAMPTZOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT8OID,
    ],
);

row! {
    /// A dead letter's `dead_columns!()`.
    struct DeadRow {
        id: pgrx::Uuid,
        queue: String,
        kind: String,
        priority: i32,
        attempts: i32,
        max_attempts: i32,
        execution_id: Option<pgrx::Uuid>,
        concurrency_key: Option<String>,
        last_error: Option<String>,
        enqueued_at: TimestampWithTimeZone,
        dead_at: TimestampWithTimeZone,
    }
}

/// Dead letters (of `queue`, or every queue), newest first, after `after`.
pub fn dead_letters(queue: Option<&str>, after: Option<DeadAnchor>, limit: i64) -> Vec<ListedDead> {
    let (at, id) = match after {
        Some(a) => (timestamp("after", a.at), uuid(a.id)),
        None => (TimestampWithTimeZone::positive_infinity(), max_id()),
    };
    let found: Vec<DeadRow> = match queue {
        Some(q) => DEAD_OF_QUEUE.all(
            &[q.into(), at.into(), id.into(), limit.into()],
            "listing dead letters",
        ),
        None => DEAD.all(&[at.into(), id.into(), limit.into()], "listing dead letters"),
    };
    found
        .into_iter()
        .map(|d| {
            let anchor = DeadAnchor {
                at: micros(d.dead_at),
                id: core_uuid(d.id),
            };
            (
                d.id,
                d.queue,
                d.kind,
                d.priority,
                d.attempts,
                d.max_attempts,
                d.execution_id,
                d.concurrency_key,
                d.last_error,
                d.enqueued_at,
                d.dead_at,
                pgrx::JsonB(anchor.to_json()),
            )
        })
        .collect()
}

row! {
    /// A queue as `list_queues` shows it: its settings, then its tasks in
    /// each state, its dead letters, and the age of its oldest ready task.
    pub struct QueueRow {
        pub name: String,
        pub aging_secs: Option<i32>,
        pub fairness: bool,
        pub notify: bool,
        pub created_at: TimestampWithTimeZone,
        pub ready: i64,
        pub scheduled: i64,
        pub running: i64,
        pub waiting: i64,
        pub paused: i64,
        pub dead: i64,
        pub oldest_ready_age: Option<Interval>,
    }
}

/// Each state counted on its own index; the waiting and paused tasks
/// (whose indexes have no queue) counted once, grouped.
const QUEUES: Stmt = Stmt::read(include_str!("sql/list_queues.sql"), &[]);

/// Every queue of this shard, by name.
pub fn queues() -> Vec<QueueRow> {
    QUEUES.all(&[], "listing queues")
}
