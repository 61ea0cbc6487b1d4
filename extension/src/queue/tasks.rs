//! Existing tasks: moving them between states (readying, and an
//! execution's tasks for its close, pause and resume), and the statement
//! pieces other modules read task rows with.

use pgrx::prelude::*;
use sheaf_core::state::TaskState;

use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::queue::floor;
use crate::queue::ready;
/// `'running'`, for the statements that find a running task by id: they
/// take it as a parameter, never as a literal. With `state = 'running'`
/// written out, the planner can prove the predicate of the partial index
/// `tasks_running` and may pick that index for the generic plan (it did,
/// for a completion), which then reads every running task's entry, and
/// under a held snapshot every dead one too, where one primary-key seek
/// does.
pub const RUNNING: &str = "running";

/// Which form of a statement that reads `tasks.claimed_at` runs: 1 on a
/// 0.2.0 catalog, 0 on an older one (between installing this library and
/// `ALTER EXTENSION sheaf UPDATE`), where the column is missing. The claim
/// floors arrived in the same release, so their check answers for both.
pub fn claim_times() -> usize {
    floor::enabled() as usize
}

/// An attempt's seconds since its claim, as a statement's output column
/// (`$end` is when the attempt ended), and its stand-in on an older
/// catalog ([`claim_times`]).
macro_rules! attempt_secs {
    (0, $end:expr) => {
        "NULL::float8"
    };
    (1, $end:expr) => {
        concat!("extract(epoch FROM ", $end, " - claimed_at)::float8")
    };
}
pub(crate) use attempt_secs;

/// The queues with a task in `$state` for which `$cond` holds (on `t`), by
/// a skip scan of that state's partial index by queue: one probe per queue
/// with tasks in that state, never one per queue ever created (`maintain`).
macro_rules! queues_with {
    ($state:literal, $cond:literal) => {
        concat!(
            "WITH RECURSIVE q(queue) AS ( \
               (SELECT queue FROM tasks WHERE state = '",
            $state,
            "' ORDER BY queue LIMIT 1) \
               UNION ALL \
               SELECT (SELECT t.queue FROM tasks t WHERE t.state = '",
            $state,
            "' AND t.queue > q.queue \
                       ORDER BY t.queue LIMIT 1) \
               FROM q WHERE q.queue IS NOT NULL) \
             SELECT q.queue FROM q WHERE q.queue IS NOT NULL AND EXISTS ( \
               SELECT 1 FROM tasks t WHERE t.state = '",
            $state,
            "' AND t.queue = q.queue AND ",
            $cond,
            ")"
        )
    };
}
pub(crate) use queues_with;

const NEEDING_FAIR_START: Stmt = Stmt::read(
    "SELECT t.id, t.queue, t.fairness_key, t.fairness_weight \
     FROM tasks t JOIN queues q ON q.name = t.queue \
     WHERE t.id = ANY($1) AND q.fairness AND t.fair_start IS NULL \
     ORDER BY t.queue, t.priority DESC, t.seq",
    &[PgBuiltInOids::UUIDARRAYOID],
);
const SET_READY: Stmt = Stmt::write(
    "UPDATE tasks t SET state = 'ready', fair_start = coalesce(x.fair_start, t.fair_start) \
     FROM unnest($1::uuid[], $2::float8[]) AS x(id, fair_start) WHERE t.id = x.id",
    &[PgBuiltInOids::UUIDARRAYOID, PgBuiltInOids::FLOAT8ARRAYOID],
);
row! {
    /// A task entering a fairness queue for the first time.
    struct Fair {
        id: pgrx::Uuid,
        queue: String,
        fairness_key: Option<String>,
        fairness_weight: f64,
    }
}

row! {
    /// A task an execution's close or pause took: its (previous) state and
    /// concurrency key.
    struct Held {
        state: TaskState,
        key: Option<String>,
    }
}

row! {
    /// A parked task, locked.
    struct Parked {
        id: pgrx::Uuid,
        key: Option<String>,
        priority: i32,
        seq: i64,
    }
}

/// Marks existing tasks ready (the caller has admitted them), fixing the
/// fairness start tag of those entering a fairness queue for the first time.
/// The caller then inserts their ready rows with `ready::insert`.
pub fn set_ready(ids: &[pgrx::Uuid]) {
    if ids.is_empty() {
        return;
    }
    let needing: Vec<Fair> = NEEDING_FAIR_START.all(&[ids.to_vec().into()], "reading fairness keys");
    let mut starts: Vec<Option<f64>> = vec![None; ids.len()];
    let index: std::collections::HashMap<pgrx::Uuid, usize> =
        ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    let mut i = 0;
    while i < needing.len() {
        let queue = &needing[i].queue;
        let group: Vec<_> = needing[i..].iter().take_while(|t| &t.queue == queue).collect();
        let tags = ready::fair_starts(
            queue,
            &group
                .iter()
                .map(|t| (t.fairness_key.clone(), t.fairness_weight))
                .collect::<Vec<_>>(),
        );
        for (t, tag) in group.iter().zip(tags) {
            if let Some(&pos) = index.get(&t.id) {
                starts[pos] = Some(tag);
            }
        }
        i += group.len();
    }
    SET_READY.exec(&[ids.to_vec().into(), starts.into()]);
}

// An execution's tasks, for its state changes (the workflow layer's close,
// pause and resume). Ready rows first, as the claim locks them (ready row,
// then task row).
const UNREADY: Stmt = Stmt::write(
    "DELETE FROM ready WHERE task_id = ANY(ARRAY(\
       SELECT id FROM tasks WHERE execution_id = $1 AND state = 'ready'))",
    &[PgBuiltInOids::UUIDOID],
);
// Every statement locking several tasks locks them in id order
// (`base::locks`), here before the DELETE takes them: a DELETE alone locks in
// the order of the execution's index, which is not the order of ids, and a
// batch completing two of its tasks meanwhile deadlocked with it (once in 60
// rounds of terminal_pairs' cancel vs complete).
const DELETE_OF_EXECUTION: Stmt = Stmt::write(
    "WITH mine AS (SELECT id FROM tasks WHERE execution_id = $1 ORDER BY id FOR UPDATE) \
     DELETE FROM tasks t USING mine WHERE t.id = mine.id RETURNING t.state, t.concurrency_key",
    &[PgBuiltInOids::UUIDOID],
);
// Ready, waiting and scheduled tasks wait, holding no slot, until resumed.
const PARK: Stmt = Stmt::write(
    "WITH old AS (SELECT id, state, concurrency_key FROM tasks \
                  WHERE execution_id = $1 AND state IN ('ready', 'waiting', 'scheduled') ORDER BY id FOR UPDATE) \
     UPDATE tasks t SET state = 'paused' FROM old WHERE t.id = old.id \
     RETURNING old.state, old.concurrency_key",
    &[PgBuiltInOids::UUIDOID],
);
const UNPARK_FUTURE: Stmt = Stmt::write(
    "UPDATE tasks SET state = 'scheduled' WHERE execution_id = $1 AND state = 'paused' AND run_at > now()",
    &[PgBuiltInOids::UUIDOID],
);
// Locked in id order, as a cancel locks them: locked in admission order
// instead, a resume and a cancel of an execution of several tasks could each
// wait for a task the other holds (seen once in 60 rounds of terminal_pairs'
// resume vs cancel). The caller sorts.
const PARKED: Stmt = Stmt::write(
    "SELECT id, concurrency_key, priority, seq FROM tasks WHERE execution_id = $1 AND state = 'paused' \
     ORDER BY id FOR UPDATE",
    &[PgBuiltInOids::UUIDOID],
);

// `FOR SHARE SKIP LOCKED`: a task a claim is taking right now (its row
// locked by the claim's update) does not count, and one found is held until
// this transaction ends, so a claim of it waits and its handler reads what
// this transaction wrote. Only ever tried, never waited for, so taking a
// task row after its execution's row closes no cycle (`base::locks`).
const UNCLAIMED_OF_EXECUTION: Stmt = Stmt::write(
    "SELECT count(*) > 0 FROM (SELECT 1 FROM tasks WHERE execution_id = $1 AND kind = $2 AND state <> $3 \
     LIMIT 1 FOR SHARE SKIP LOCKED) u",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
    ],
);

/// Whether an execution has a task of `kind` that no one holds yet
/// (scheduled, waiting, ready or parked): it will run, and read what the
/// execution's history has by then. A task being claimed concurrently is
/// not counted (it may have read the history already); one that is counted
/// stays unclaimed until this transaction commits.
pub fn has_unclaimed_of_execution(execution_id: pgrx::Uuid, kind: &str) -> bool {
    UNCLAIMED_OF_EXECUTION.one_value(
        &[execution_id.into(), kind.into(), RUNNING.into()],
        "looking for an execution's unclaimed task",
    )
}

const LOCK_READY_OF_EXECUTION: Stmt = Stmt::write(
    "SELECT task_id FROM ready WHERE task_id = ANY(ARRAY(\
       SELECT id FROM tasks WHERE execution_id = $1 AND state = 'ready')) ORDER BY task_id FOR UPDATE",
    &[PgBuiltInOids::UUIDOID],
);
const LOCK_OF_EXECUTION: Stmt = Stmt::write(
    "SELECT id FROM tasks WHERE execution_id = $1 ORDER BY id FOR UPDATE",
    &[PgBuiltInOids::UUIDOID],
);

/// Locks an execution's ready rows, then its tasks (`base::locks`),
/// changing nothing: for a caller that must read its row's state before
/// deciding to change them.
pub fn lock_of_execution(execution_id: pgrx::Uuid) {
    LOCK_READY_OF_EXECUTION.exec(&[execution_id.into()]);
    LOCK_OF_EXECUTION.exec(&[execution_id.into()]);
}

/// Deletes an execution's unfinished tasks (locking them); returns
/// `(state, key)` of each, for `caps::release_held`.
pub fn delete_of_execution(execution_id: pgrx::Uuid) -> Vec<(TaskState, Option<String>)> {
    UNREADY.exec(&[execution_id.into()]);
    let held: Vec<Held> = DELETE_OF_EXECUTION.all(&[execution_id.into()], "cancelling tasks");
    held.into_iter().map(|h| (h.state, h.key)).collect()
}

/// Parks an execution's ready, waiting and scheduled tasks (locking them);
/// returns `(previous state, key)` of each, for `caps::release_held`.
pub fn park_of_execution(execution_id: pgrx::Uuid) -> Vec<(TaskState, Option<String>)> {
    UNREADY.exec(&[execution_id.into()]);
    let held: Vec<Held> = PARK.all(&[execution_id.into()], "parking tasks");
    held.into_iter().map(|h| (h.state, h.key)).collect()
}

/// Locks an execution's parked tasks, and makes those not yet due
/// scheduled again; returns the rest, `(id, key)` in the order they should
/// be admitted (`promote::place`).
pub fn unpark_of_execution(execution_id: pgrx::Uuid) -> Vec<(pgrx::Uuid, Option<String>)> {
    UNPARK_FUTURE.exec(&[execution_id.into()]);
    let mut parked: Vec<Parked> = PARKED.all(&[execution_id.into()], "unparking tasks");
    // Priority first, then enqueue order: the line of a concurrency key.
    parked.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.seq.cmp(&b.seq)));
    parked.into_iter().map(|p| (p.id, p.key)).collect()
}
