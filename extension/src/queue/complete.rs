//! Completing claimed tasks. A completed task leaves the hot table; its slot
//! goes to the next waiting task of its key; its result goes to its
//! execution's history.

use std::collections::{BTreeMap, HashSet};

use pgrx::prelude::*;

use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::queue::caps;
use crate::queue::hooks::{ExecutionHooks, Outcome, TaskEvent};
use crate::queue::lease::not_running;
use crate::queue::tasks::{RUNNING, attempt_secs, claim_times};

pub const MAX_BATCH: usize = 10_000;

const COMPLETE_ARGS: &[PgBuiltInOids] = &[
    PgBuiltInOids::UUIDOID,
    PgBuiltInOids::INT8OID,
    PgBuiltInOids::TEXTOID,
];
macro_rules! complete {
    ($catalog:tt) => {
        concat!(
            "DELETE FROM tasks WHERE id = $1 AND token = $2 AND state = $3 \
             RETURNING concurrency_key, execution_id, kind, ",
            attempt_secs!($catalog, "now()")
        )
    };
}
const COMPLETE: [Stmt; 2] = [
    Stmt::write(complete!(0), COMPLETE_ARGS),
    Stmt::write(complete!(1), COMPLETE_ARGS),
];
// Two steps, so every statement is a primary-key seek whatever the batch:
// lock the entries still running, then delete those whose token matches.
const RUNNING_TOKENS: Stmt = Stmt::write(
    "SELECT id, token FROM tasks WHERE id = ANY($1) AND state = $2 ORDER BY id FOR UPDATE",
    &[PgBuiltInOids::UUIDARRAYOID, PgBuiltInOids::TEXTOID],
);
macro_rules! delete_batch {
    ($catalog:tt) => {
        concat!(
            "DELETE FROM tasks WHERE id = ANY($1) RETURNING id, concurrency_key, execution_id, kind, ",
            attempt_secs!($catalog, "now()")
        )
    };
}
const DELETE_BATCH: [Stmt; 2] = [
    Stmt::write(delete_batch!(0), &[PgBuiltInOids::UUIDARRAYOID]),
    Stmt::write(delete_batch!(1), &[PgBuiltInOids::UUIDARRAYOID]),
];

/// Completes a task claimed under `token`; its execution (if any) hears of
/// it with `result`. A stale token (the lease was lost) raises 55P03, a
/// task that is gone P0002; either changes nothing.
pub fn complete(
    task_id: pgrx::Uuid,
    token: i64,
    result: Option<serde_json::Value>,
    hooks: &dyn ExecutionHooks,
) {
    let Taken {
        key,
        execution_id,
        kind,
        secs,
    } = take(task_id, token);
    // The execution row before the concurrency key (`base::locks`).
    if let Some(execution_id) = execution_id {
        record(hooks, execution_id, task_id, &kind, result, secs);
    }
    if let Some(key) = key {
        caps::release(&key, 1);
    }
}

row! {
    /// A completed task's row, as `take` removed it.
    pub struct Taken {
        /// Its concurrency key: the caller releases its slot (`caps::release`),
        /// after anything it does to the task's execution (`base::locks`).
        pub key: Option<String>,
        pub execution_id: Option<pgrx::Uuid>,
        /// `workflow` or `activity`.
        pub kind: String,
        /// The attempt's seconds since its claim (`TaskEvent::secs`).
        pub secs: Option<f64>,
    }
}

/// Removes a task claimed under `token` from the table, and nothing else:
/// its execution is not told and its slot is still held. A stale token
/// raises 55P03 and changes nothing.
pub fn take(task_id: pgrx::Uuid, token: i64) -> Taken {
    COMPLETE[claim_times()]
        .first(
            &[task_id.into(), token.into(), RUNNING.into()],
            "completing a task",
        )
        .unwrap_or_else(|| not_running(task_id, token))
}

/// Completes the entries of `ids` whose token in `tokens` (paired by
/// position) is current; returns, in input order, whether each completed.
pub fn complete_batch(
    ids: Vec<pgrx::Uuid>,
    tokens: Vec<i64>,
    hooks: &dyn ExecutionHooks,
) -> Vec<(pgrx::Uuid, bool)> {
    let wanted: HashSet<(pgrx::Uuid, i64)> = ids.iter().copied().zip(tokens).collect();
    let done: Vec<Deleted> = {
        let matching: Vec<pgrx::Uuid> = RUNNING_TOKENS
            .all::<Token>(&[ids.clone().into(), RUNNING.into()], "completing tasks")
            .into_iter()
            .filter(|t| wanted.contains(&(t.id, t.token)))
            .map(|t| t.id)
            .collect();
        if matching.is_empty() {
            Vec::new()
        } else {
            DELETE_BATCH[claim_times()].all(&[matching.into()], "completing tasks")
        }
    };
    // Execution rows before concurrency keys (`base::locks`); keys in a
    // fixed order, so no two batches lock two keys in opposite orders.
    for d in &done {
        if let Some(execution_id) = d.execution_id {
            record(hooks, execution_id, d.id, &d.kind, None, d.secs);
        }
    }
    let mut per_key: BTreeMap<&str, i32> = BTreeMap::new();
    for d in &done {
        if let Some(key) = &d.key {
            *per_key.entry(key.as_str()).or_default() += 1;
        }
    }
    for (key, n) in per_key {
        caps::release(key, n);
    }
    let completed: HashSet<pgrx::Uuid> = done.iter().map(|d| d.id).collect();
    ids.into_iter()
        .map(move |id| (id, completed.contains(&id)))
        .collect()
}

row! {
    /// A running task's id and the token it was claimed under.
    struct Token {
        id: pgrx::Uuid,
        token: i64,
    }
}

row! {
    /// A task a batch completed.
    struct Deleted {
        id: pgrx::Uuid,
        key: Option<String>,
        execution_id: Option<pgrx::Uuid>,
        kind: String,
        /// The attempt's seconds since its claim.
        secs: Option<f64>,
    }
}

fn record(
    hooks: &dyn ExecutionHooks,
    execution_id: pgrx::Uuid,
    task_id: pgrx::Uuid,
    kind: &str,
    result: Option<serde_json::Value>,
    secs: Option<f64>,
) {
    hooks.task_outcome(TaskEvent {
        execution_id,
        task_id,
        kind,
        outcome: Outcome::Completed { result },
        secs,
    });
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::{Claimed, claim, count, enqueue, init, one, values};
    use pgrx::prelude::*;
    use serde_json::json;

    /// Entries of `tasks_running` read so far in this transaction.
    fn running_entries_read() -> i64 {
        count("SELECT pg_stat_get_xact_tuples_returned('sheaf.tasks_running'::regclass)")
    }

    /// Finding a running task by id is one primary-key seek, whatever the
    /// statistics say: planned while two tasks ran, the generic plan of a
    /// completion once chose `tasks_running` and read every running task.
    #[pg_test]
    fn a_task_is_found_by_its_id_not_among_the_running() {
        init();
        for n in 0..1000 {
            enqueue("q", json!({"n": n}), json!({}));
        }
        // Each statement planned while few tasks run, as a fresh backend
        // plans them; then 300 more run.
        Spi::run("ANALYZE sheaf.tasks").expect("analyze");
        let few = claim("q", 10);
        use_each(&few[..5]);
        let many = claim("q", 300);
        let before = running_entries_read();
        use_each(&few[5..]);
        use_each(&many[..5]);
        let read = running_entries_read() - before;
        assert!(
            read < 50,
            "{read} entries of tasks_running read to find 10 tasks by id"
        );
    }

    /// Heartbeat, fail, release, complete and complete_batch, on 5 tasks.
    fn use_each(t: &[Claimed]) {
        let args = |i: usize| [t[i].id.into(), t[i].token.into()];
        Spi::run_with_args("SELECT sheaf.heartbeat($1, $2)", &args(0)).expect("heartbeat");
        Spi::run_with_args("SELECT * FROM sheaf.fail($1, $2, 'x', '1 hour')", &args(0)).expect("fail");
        Spi::run_with_args("SELECT sheaf.release($1, $2)", &args(1)).expect("release");
        Spi::run_with_args("SELECT sheaf.complete($1, $2)", &args(2)).expect("complete");
        Spi::run_with_args(
            "SELECT * FROM sheaf.complete_batch(ARRAY[$1], ARRAY[$2])",
            &args(3),
        )
        .expect("batch");
        Spi::run_with_args("SELECT sheaf.snooze($1, $2, '1 hour')", &args(4)).expect("snooze");
    }

    #[pg_test]
    fn complete_batch_reports_stale_entries_and_completes_the_rest() {
        init();
        for n in 0..3 {
            enqueue("q", json!({"n": n}), json!({}));
        }
        let t = claim("q", 3);
        let report: Vec<bool> = values(
            "SELECT completed FROM sheaf.complete_batch(ARRAY[$1, $2, $3], ARRAY[$4, $5, $6])",
            &[
                t[0].id.into(),
                t[1].id.into(),
                t[2].id.into(),
                t[0].token.into(),
                (t[1].token + 1000).into(),
                t[2].token.into(),
            ],
        );
        assert_eq!(report, vec![true, false, true]);
        assert_eq!(
            count("SELECT count(*) FROM sheaf.tasks"),
            1,
            "the stale one is untouched"
        );
    }

    #[pg_test]
    fn a_result_goes_to_the_execution_history() {
        init();
        Spi::run(
            "INSERT INTO sheaf.executions (id, workflow_name, workflow_id, state, seq, queue, input) \
             VALUES ('00010000-0000-8000-8000-000000000001', 'wf', 'w1', 'RUNNING', 1, 'q', '{}')",
        )
        .unwrap();
        enqueue(
            "q",
            json!({}),
            json!({"execution_id": "00010000-0000-8000-8000-000000000001"}),
        );
        let t = claim("q", 1);
        Spi::run_with_args(
            "SELECT sheaf.complete($1, $2, '{\"ok\": 42}')",
            &[t[0].id.into(), t[0].token.into()],
        )
        .unwrap();
        row! {
            struct Event {
                event_type: String,
                result_ok: Option<i64>,
            }
        }
        let event: Event = one(
            "SELECT event_type, (payload #>> '{result,ok}')::bigint FROM sheaf.events",
            &[],
        );
        assert_eq!(event.event_type, "TaskCompleted");
        assert_eq!(event.result_ok, Some(42));
        assert!(count("SELECT history_bytes FROM sheaf.executions") > 0);
    }

    #[pg_test(
        error = "no task 00010000-0000-8000-8000-000000000009 on this shard: it already finished, or never existed"
    )]
    fn completing_a_task_that_is_gone_is_unknown() {
        init();
        Spi::run("SELECT sheaf.complete('00010000-0000-8000-8000-000000000009', 7)").unwrap();
    }
}
