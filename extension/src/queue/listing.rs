//! Operator listings: one task, a queue's tasks by state, dead letters, and
//! every queue with its counts. Each walk follows an index `tasks` (or
//! `dead_letters`) already has, from a keyset anchor
//! (`sheaf_core::listing`), so a page costs its rows, not the table; nothing
//! here writes, and nothing was added to the claim's tables for it.

use pgrx::datum::{DatumWithOid, Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use sheaf_core::listing::{DeadAnchor, STATE_ORDER, TaskAnchor};
use sheaf_core::state::TaskState;

use crate::base::errors::bad_argument;
use crate::base::plans::{Stmt, run};
use crate::base::rows;

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

type TaskRow = (
    pgrx::Uuid,
    String,
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
);

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
    let found: Vec<(TaskRow, (f64, f64, i64))> = Spi::connect_mut(|client| {
        let args = [queue.into(), k1.into(), k2.into(), seq.into(), limit.into()];
        split(rows::all(run(client, &READY, &args), "listing ready tasks"))
    });
    found
        .into_iter()
        .map(|(row, (k1, k2, seq))| with_anchor(row, &TaskAnchor::Ready { k1, k2, seq }))
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
    let found: Vec<(TaskRow, (TimestampWithTimeZone, pgrx::Uuid))> = Spi::connect_mut(|client| {
        let args = [queue.into(), at.into(), id.into(), limit.into()];
        split(rows::all(run(client, stmt, &args), doing))
    });
    found
        .into_iter()
        .map(|(row, (at, id))| {
            let (at, id) = (micros(at), core_uuid(id));
            let anchor = if scheduled {
                TaskAnchor::Scheduled { at, id }
            } else {
                TaskAnchor::Running { at, id }
            };
            with_anchor(row, &anchor)
        })
        .collect()
}

fn waiting_page(queue: &str, after: Option<&TaskAnchor>, limit: i64) -> Vec<ListedTask> {
    let (key, priority, seq) = match after {
        Some(TaskAnchor::Waiting { key, priority, seq }) => (key.as_str(), *priority, *seq),
        _ => ("", 0, 0),
    };
    let found: Vec<(TaskRow, (String, i32, i64))> = Spi::connect_mut(|client| {
        let args = [
            queue.into(),
            key.into(),
            priority.into(),
            seq.into(),
            limit.into(),
        ];
        split(rows::all(run(client, &WAITING, &args), "listing waiting tasks"))
    });
    found
        .into_iter()
        .map(|(row, (key, priority, seq))| with_anchor(row, &TaskAnchor::Waiting { key, priority, seq }))
        .collect()
}

fn paused_page(queue: &str, after: Option<&TaskAnchor>, limit: i64) -> Vec<ListedTask> {
    let (at, execution, id) = match after {
        Some(TaskAnchor::Paused { at, execution_id, id }) => {
            (timestamp("after", *at), uuid(*execution_id), uuid(*id))
        }
        _ => (TimestampWithTimeZone::negative_infinity(), nil(), nil()),
    };
    let found: Vec<(TaskRow, (TimestampWithTimeZone, pgrx::Uuid))> = Spi::connect_mut(|client| {
        let args = [queue.into(), at.into(), execution.into(), id.into(), limit.into()];
        split(rows::all(run(client, &PAUSED, &args), "listing paused tasks"))
    });
    found
        .into_iter()
        .map(|(row, (at, execution))| {
            let anchor = TaskAnchor::Paused {
                at: micros(at),
                execution_id: core_uuid(execution),
                id: core_uuid(row.0),
            };
            with_anchor(row, &anchor)
        })
        .collect()
}

/// Rows read as one flat tuple, split into the task and its anchor's keys.
fn split<A, B>(rows: Vec<rows::Split<A, B>>) -> Vec<(A, B)> {
    rows.into_iter().map(|r| (r.0, r.1)).collect()
}

/// The row without its queue (the caller's argument, not repeated in
/// every row), and its anchor.
fn with_anchor(row: TaskRow, anchor: &TaskAnchor) -> ListedTask {
    let (
        id,
        _queue,
        kind,
        state,
        priority,
        attempts,
        max_attempts,
        run_at,
        enqueued_at,
        key,
        lease,
        error,
        execution,
        progress,
    ) = row;
    (
        id,
        kind,
        state,
        priority,
        attempts,
        max_attempts,
        run_at,
        enqueued_at,
        key,
        lease,
        error,
        execution,
        progress,
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
/// was dead-lettered, and its progress.
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
        ", t.payload, t.lease_owner, t.idempotency_key, t.fairness_key, NULL::timestamptz \
         FROM tasks t WHERE t.id = $1 \
         UNION ALL \
         SELECT d.id, d.queue, d.kind, 'dead', d.priority, d.attempts, d.max_attempts, NULL, d.enqueued_at, \
                d.concurrency_key, NULL, d.last_error, d.execution_id, \
                (SELECT p.progress FROM task_progress p WHERE p.task_id = d.id), d.payload, NULL, d.idempotency_key, \
                d.fairness_key, d.dead_at \
         FROM dead_letters d WHERE d.id = $1"
    ),
    &[PgBuiltInOids::UUIDOID],
);

/// The task `id` (or its dead letter), if this shard has it.
pub fn get(id: pgrx::Uuid) -> Option<TaskDetail> {
    Spi::connect_mut(|client| {
        let found: Option<rows::Split<TaskDetailHead, TaskDetailTail>> =
            rows::first(run(client, &GET, &[id.into()]), "reading a task");
        found.map(|rows::Split(h, t)| {
            (
                h.1, h.2, h.3, h.4, h.5, h.6, h.7, h.8, h.9, h.10, h.11, h.12, t.0, t.1, t.2, t.3, t.4, h.13,
            )
        })
    })
}

type TaskDetailHead = (
    pgrx::Uuid,
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
    Option<pgrx::JsonB>,
);
type TaskDetailTail = (
    pgrx::JsonB,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<TimestampWithTimeZone>,
);

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

type DeadRow = (
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
);

/// Dead letters (of `queue`, or every queue), newest first, after `after`.
pub fn dead_letters(queue: Option<&str>, after: Option<DeadAnchor>, limit: i64) -> Vec<ListedDead> {
    let (at, id) = match after {
        Some(a) => (timestamp("after", a.at), uuid(a.id)),
        None => (TimestampWithTimeZone::positive_infinity(), max_id()),
    };
    let found: Vec<DeadRow> = Spi::connect_mut(|client| {
        let table = match queue {
            Some(q) => {
                let args: [DatumWithOid<'_>; 4] = [q.into(), at.into(), id.into(), limit.into()];
                run(client, &DEAD_OF_QUEUE, &args)
            }
            None => run(client, &DEAD, &[at.into(), id.into(), limit.into()]),
        };
        rows::all(table, "listing dead letters")
    });
    found
        .into_iter()
        .map(
            |(id, queue, kind, priority, attempts, max, execution, key, error, enqueued, dead)| {
                let anchor = DeadAnchor {
                    at: micros(dead),
                    id: core_uuid(id),
                };
                (
                    id,
                    queue,
                    kind,
                    priority,
                    attempts,
                    max,
                    execution,
                    key,
                    error,
                    enqueued,
                    dead,
                    pgrx::JsonB(anchor.to_json()),
                )
            },
        )
        .collect()
}

/// A queue as `list_queues` shows it: name, aging_secs, fairness, notify,
/// created_at, then its tasks ready, scheduled, running, waiting, paused,
/// its dead letters, and the age of its oldest ready task.
pub type QueueRow = (
    String,
    Option<i32>,
    bool,
    bool,
    TimestampWithTimeZone,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    Option<Interval>,
);

/// Each state counted on its own index; the waiting and paused tasks
/// (whose indexes have no queue) counted once, grouped.
const QUEUES: Stmt = Stmt::read(
    "SELECT q.name, q.aging_secs, q.fairness, q.notify, q.created_at, \
            (SELECT count(*) FROM ready r WHERE r.queue = q.name), \
            (SELECT count(*) FROM tasks t WHERE t.queue = q.name AND t.state = 'scheduled'), \
            (SELECT count(*) FROM tasks t WHERE t.queue = q.name AND t.state = 'running'), \
            coalesce(w.n, 0), coalesce(p.n, 0), \
            (SELECT count(*) FROM dead_letters d WHERE d.queue = q.name), \
            now() - (SELECT min(t.enqueued_at) FROM ready r JOIN tasks t ON t.id = r.task_id \
                     WHERE r.queue = q.name) \
     FROM queues q \
     LEFT JOIN (SELECT queue, count(*) AS n FROM tasks WHERE state = 'waiting' GROUP BY queue) w \
       ON w.queue = q.name \
     LEFT JOIN (SELECT t.queue, count(*) AS n FROM executions e JOIN tasks t ON t.execution_id = e.id \
                WHERE e.state = 'PAUSED' AND t.state = 'paused' GROUP BY t.queue) p \
       ON p.queue = q.name \
     ORDER BY q.name",
    &[],
);

/// Every queue of this shard, by name.
pub fn queues() -> Vec<QueueRow> {
    QUEUES.all(&[], "listing queues")
}
