//! Cancelling one task (`sheaf.cancel_task`), and telling its holder.
//!
//! An unclaimed task (scheduled, waiting, ready, paused) leaves at once and
//! its slot passes on. A running one cannot: its handler may still be at
//! work, so it keeps its slot (a cap is never exceeded in fact) and is
//! fenced out of its holder by negating its token. The holder's next fenced
//! call finds no task under its token and, through `told`, gets 57000
//! instead of "lease lost"; it then gives the task back (`release`), which
//! `settle`s it. A holder that never does is settled by the reaper when the
//! lease ends. Every cancellation is recorded in `task_cancellations`.

use pgrx::prelude::*;
use sheaf_core::state::TaskState;

use crate::base::catalog::{self, Feature};
use crate::base::errors::{not_ready, task_cancelled, unknown_task};
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::queue::caps;
use crate::queue::hooks::{ExecutionHooks, Outcome, TaskEvent};

/// Whether this catalog has cancellations (a 0.1.0 catalog, under a newer
/// library before `ALTER EXTENSION sheaf UPDATE`, has none).
pub fn enabled() -> bool {
    catalog::has(Feature::Cancellations)
}

// The ready row first, as a claim takes it (`base::locks`): a claim in
// flight is waited for, and the task is then found running.
const UNREADY: Stmt = Stmt::write("DELETE FROM ready WHERE task_id = $1", &[PgBuiltInOids::UUIDOID]);
const LOCK: Stmt = Stmt::write(
    "SELECT state, kind, queue, token, concurrency_key, execution_id FROM tasks WHERE id = $1 FOR UPDATE",
    &[PgBuiltInOids::UUIDOID],
);
const DELETE: Stmt = Stmt::write("DELETE FROM tasks WHERE id = $1", &[PgBuiltInOids::UUIDOID]);
const FENCE: Stmt = Stmt::write(
    "UPDATE tasks SET token = -token WHERE id = $1",
    &[PgBuiltInOids::UUIDOID],
);
// Recorded once: a task has one cancellation.
const RECORD: Stmt = Stmt::write(
    "INSERT INTO task_cancellations (task_id, queue, execution_id, token, reason, settled_at) \
     VALUES ($1, $2, $3, $4, $5, CASE WHEN $4 IS NULL THEN now() END)",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::TEXTOID,
    ],
);
const FORMER: Stmt = Stmt::read(
    "SELECT EXISTS (SELECT 1 FROM task_cancellations WHERE task_id = $1), \
            EXISTS (SELECT 1 FROM dead_letters WHERE id = $1)",
    &[PgBuiltInOids::UUIDOID],
);
const REASON_FOR_TOKEN: Stmt = Stmt::read(
    "SELECT reason FROM task_cancellations WHERE task_id = $1 AND token = $2",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::INT8OID],
);
// The holder gave it back, or its lease ran out: it leaves now. Each a
// seek by id (a join here once let a generic plan read every running task).
const SETTLE: Stmt = Stmt::write(
    "UPDATE task_cancellations SET settled_at = now() \
     WHERE task_id = $1 AND token = $2 AND settled_at IS NULL RETURNING 1",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::INT8OID],
);
const SETTLE_EXPIRED: Stmt = Stmt::write(
    "UPDATE task_cancellations SET settled_at = now() WHERE task_id = $1 AND settled_at IS NULL",
    &[PgBuiltInOids::UUIDOID],
);
const LEAVE: Stmt = Stmt::write(
    "DELETE FROM tasks WHERE id = $1 AND state = 'running' RETURNING concurrency_key",
    &[PgBuiltInOids::UUIDOID],
);
const PRUNE: Stmt = Stmt::write(
    "WITH d AS (DELETE FROM task_cancellations WHERE task_id IN ( \
       SELECT task_id FROM task_cancellations WHERE settled_at < now() - interval '7 days' \
       ORDER BY settled_at LIMIT $1) RETURNING 1) \
     SELECT count(*) FROM d",
    &[PgBuiltInOids::INT8OID],
);

row! {
    /// A task's row, locked.
    struct Locked {
        state: String,
        kind: String,
        queue: String,
        token: Option<i64>,
        key: Option<String>,
        execution_id: Option<pgrx::Uuid>,
    }
}

row! {
    /// Whether a task that is gone was cancelled, or is a dead letter.
    struct Former {
        cancelled: bool,
        dead: bool,
    }
}

/// Cancels task `task_id`; whether this call did (false: it was cancelled
/// already). An unclaimed task leaves now, a running one is marked for its
/// holder. Its execution hears of it through `hooks`. A workflow task is
/// refused (its execution is what to cancel), as is a dead letter.
pub fn cancel(task_id: pgrx::Uuid, reason: Option<&str>, hooks: &dyn ExecutionHooks) -> bool {
    if !enabled() {
        not_ready("this shard's catalog predates cancel_task: run ALTER EXTENSION sheaf UPDATE");
    }
    UNREADY.exec(&[task_id.into()]);
    let row: Option<Locked> = LOCK.first(&[task_id.into()], "locking a task");
    let Some(Locked {
        state,
        kind,
        queue,
        token,
        key,
        execution_id,
    }) = row
    else {
        let Former { cancelled, dead } = FORMER.one(&[task_id.into()], "looking a task up");
        if cancelled {
            return false;
        }
        if dead {
            not_ready(format!(
                "task {task_id} is a dead letter: redrive it or purge it (purge_dead_letters) instead"
            ));
        }
        unknown_task(task_id)
    };
    if kind == "workflow" {
        not_ready(format!(
            "task {task_id} is a workflow task: cancel its execution instead (cancel_execution)"
        ));
    }
    let state: TaskState = state.parse().unwrap_or_else(|_| {
        crate::base::errors::internal(format!("reading task {task_id}'s state {state:?}"))
    });
    let running = state == TaskState::Running;
    if running && token.is_some_and(|t| t < 0) {
        return false;
    }
    let holder = if running { token } else { None };
    RECORD.exec(&[
        task_id.into(),
        queue.into(),
        execution_id.into(),
        holder.into(),
        reason.into(),
    ]);
    if running {
        FENCE.exec(&[task_id.into()]);
    } else {
        DELETE.exec(&[task_id.into()]);
    }
    // The execution row before the concurrency key (`base::locks`).
    if let Some(execution_id) = execution_id {
        hooks.task_outcome(TaskEvent {
            execution_id,
            task_id,
            kind: &kind,
            outcome: Outcome::Cancelled { reason },
            secs: None,
        });
    }
    if !running {
        caps::release_held(vec![(state, key)]);
    }
    true
}

/// For a fenced call that found no task running under `token`: 57000 if
/// the task was cancelled while this token held it (the holder is told to
/// stop); otherwise it returns, and the caller raises what it would have.
pub fn told(task_id: pgrx::Uuid, token: i64) {
    if !enabled() {
        return;
    }
    let reason: Option<Option<String>> = REASON_FOR_TOKEN
        .value::<Option<String>>(&[task_id.into(), token.into()], "looking a cancellation up");
    if let Some(reason) = reason {
        task_cancelled(task_id, reason.as_deref());
    }
}

/// The holder of a cancelled running task gives it back under its `token`:
/// the task leaves and its slot passes on. Whether there was such a task.
pub fn settle(task_id: pgrx::Uuid, token: i64) -> bool {
    if !enabled() {
        return false;
    }
    if SETTLE.count(&[task_id.into(), token.into()]) == 0 {
        return false;
    }
    let Some(key) = LEAVE.value::<Option<String>>(&[task_id.into()], "settling a cancelled task") else {
        return false;
    };
    caps::release_held(vec![(TaskState::Running, key)]);
    true
}

/// A cancelled running task whose lease expired (the reaper holds its row):
/// it leaves, and the caller frees its slot.
pub fn settle_expired(task_id: pgrx::Uuid) {
    SETTLE_EXPIRED.exec(&[task_id.into()]);
    LEAVE.exec(&[task_id.into()]);
}

const REASON: Stmt = Stmt::read(
    "SELECT reason FROM task_cancellations WHERE task_id = $1",
    &[PgBuiltInOids::UUIDOID],
);

/// If task `task_id` was cancelled (and its record is kept): its reason.
pub fn cancelled(task_id: pgrx::Uuid) -> Option<Option<String>> {
    if !enabled() {
        return None;
    }
    REASON.value::<Option<String>>(&[task_id.into()], "looking a cancellation up")
}

/// Deletes up to `max` cancellations settled over a week ago; how many.
pub fn prune(max: i64) -> i64 {
    if !enabled() {
        return 0;
    }
    PRUNE.one_value(&[max.into()], "pruning task cancellations")
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{claim, count, enqueue, init, ns, start};
    use pgrx::prelude::*;
    use serde_json::json;

    fn cancel(id: pgrx::Uuid) -> bool {
        Spi::get_one_with_args::<bool>("SELECT sheaf.cancel_task($1, 'not needed')", &[id.into()])
            .unwrap()
            .unwrap()
    }

    /// The SQLSTATE of `sql` (run in a subtransaction, so the test goes on).
    fn sqlstate(sql: &str, args: Vec<pgrx::datum::DatumWithOid<'_>>) -> String {
        PgTryBuilder::new(|| {
            Spi::run_with_args(sql, &args).unwrap();
            "ok".to_string()
        })
        .catch_others(|e| match e {
            pgrx::pg_sys::panic::CaughtError::PostgresError(r)
            | pgrx::pg_sys::panic::CaughtError::ErrorReport(r) => {
                format!("{:?}", r.sql_error_code())
            }
            other => format!("{other:?}"),
        })
        .execute()
    }

    #[pg_test]
    fn an_unclaimed_task_leaves_at_once_and_its_slot_passes_on() {
        init();
        Spi::run("SELECT sheaf.set_concurrency_limit('ck', 1)").unwrap();
        let first = enqueue("q", json!({"n": 1}), json!({"concurrency_key": "ck"}));
        enqueue("q", json!({"n": 2}), json!({"concurrency_key": "ck"}));
        let later = enqueue("q", json!({"n": 3}), json!({"run_at": "2090-01-01T00:00:00Z"}));
        assert!(cancel(first), "the ready task, holding the key's one slot");
        assert!(cancel(later), "a scheduled task");
        assert!(!cancel(first), "a second cancel changes nothing");
        assert_eq!(ns(&claim("q", 5)), vec![2], "the waiting task took the slot");
        assert_eq!(count("SELECT count(*) FROM sheaf.ready"), 0);
        assert_eq!(
            count("SELECT count(*) FROM sheaf.task_cancellations WHERE settled_at IS NOT NULL"),
            2
        );
    }

    #[pg_test]
    fn a_running_task_is_marked_its_holder_told_and_release_ends_it() {
        init();
        Spi::run("SELECT sheaf.set_concurrency_limit('ck', 1)").unwrap();
        enqueue("q", json!({"n": 1}), json!({"concurrency_key": "ck"}));
        enqueue("q", json!({"n": 2}), json!({"concurrency_key": "ck"}));
        let t = claim("q", 1);
        let (id, token) = (t[0].id, t[0].token);
        assert!(cancel(id));
        assert!(!cancel(id), "marked once");
        assert_eq!(
            ns(&claim("q", 5)),
            Vec::<i64>::new(),
            "it keeps its slot while its holder may run"
        );
        for sql in [
            "SELECT sheaf.heartbeat($1, $2)",
            "SELECT sheaf.complete($1, $2)",
            "SELECT * FROM sheaf.fail($1, $2, 'x')",
            "SELECT sheaf.snooze($1, $2, '1 minute')",
            "SELECT sheaf.set_progress($1, $2, '{}')",
        ] {
            assert_eq!(
                sqlstate(sql, vec![id.into(), token.into()]),
                "ERRCODE_OPERATOR_INTERVENTION",
                "{sql}"
            );
        }
        assert_eq!(
            sqlstate(
                "SELECT sheaf.heartbeat($1, $2)",
                vec![id.into(), (token + 1).into()]
            ),
            "ERRCODE_LOCK_NOT_AVAILABLE",
            "another token is only stale"
        );
        Spi::run_with_args("SELECT sheaf.release($1, $2)", &[id.into(), token.into()]).unwrap();
        assert_eq!(
            count("SELECT count(*) FROM sheaf.tasks WHERE (payload->>'n')::int = 1"),
            0
        );
        assert_eq!(ns(&claim("q", 5)), vec![2], "the slot passed on");
        assert_eq!(
            sqlstate("SELECT sheaf.complete($1, $2)", vec![id.into(), token.into()]),
            "ERRCODE_OPERATOR_INTERVENTION",
            "still told after it left"
        );
    }

    #[pg_test]
    fn a_cancelled_running_task_whose_holder_vanished_leaves_at_its_lease_end() {
        init();
        let id = enqueue("q", json!({"n": 1}), json!({"max_attempts": 1}));
        claim("q", 1);
        assert!(cancel(id));
        Spi::run("UPDATE sheaf.tasks SET lease_expires_at = now() - interval '1 second'").unwrap();
        assert_eq!(
            Spi::get_one::<i32>("SELECT sheaf.reap_expired()").unwrap(),
            Some(1)
        );
        assert_eq!(count("SELECT count(*) FROM sheaf.tasks"), 0);
        assert_eq!(
            count("SELECT count(*) FROM sheaf.dead_letters"),
            0,
            "cancelled, not dead"
        );
        assert_eq!(
            count("SELECT count(*) FROM sheaf.task_cancellations WHERE settled_at IS NOT NULL"),
            1
        );
    }

    #[pg_test]
    fn a_workflow_task_and_a_dead_letter_are_refused_an_activity_is_in_the_history() {
        init();
        let execution = start("wf", "w1", json!({})).id;
        let workflow_task = Spi::get_one_with_args::<pgrx::Uuid>(
            "SELECT id FROM sheaf.tasks WHERE execution_id = $1 AND kind = 'workflow'",
            &[execution.into()],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            sqlstate("SELECT sheaf.cancel_task($1)", vec![workflow_task.into()]),
            "ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE"
        );
        let activity = Spi::get_one_with_args::<pgrx::Uuid>(
            "SELECT sheaf.enqueue('acts', '{}', jsonb_build_object('execution_id', $1::text))",
            &[execution.into()],
        )
        .unwrap()
        .unwrap();
        assert!(cancel(activity));
        assert_eq!(
            count(
                "SELECT count(*) FROM sheaf.events WHERE event_type = 'TaskCancelled' AND payload->>'reason' = 'not needed'"
            ),
            1
        );
        let dead = enqueue("q", json!({}), json!({"max_attempts": 1}));
        Spi::run(
            "SELECT f.* FROM sheaf.claim('q', 'w', 1) c, LATERAL sheaf.fail(c.task_id, c.token, 'boom') f",
        )
        .unwrap();
        assert_eq!(
            sqlstate("SELECT sheaf.cancel_task($1)", vec![dead.into()]),
            "ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE"
        );
        assert_eq!(
            sqlstate(
                "SELECT sheaf.cancel_task('00000000-0000-0000-0000-000000000001')",
                vec![]
            ),
            "ERRCODE_NO_DATA_FOUND"
        );
        assert_eq!(
            sqlstate("SELECT * FROM sheaf.get_task($1)", vec![activity.into()]),
            "ERRCODE_NO_DATA_FOUND",
            "a cancelled task is not kept"
        );
    }

    #[pg_test]
    fn progress_is_kept_beside_the_task_shown_and_pruned_after_it() {
        init();
        enqueue("q", json!({"n": 1}), json!({}));
        let t = claim("q", 1);
        let (id, token) = (t[0].id, t[0].token);
        for p in [json!({"done": 1}), json!({"done": 2})] {
            Spi::run_with_args(
                "SELECT sheaf.set_progress($1, $2, $3)",
                &[id.into(), token.into(), pgrx::JsonB(p).into()],
            )
            .unwrap();
        }
        let shown =
            Spi::get_one_with_args::<pgrx::JsonB>("SELECT progress FROM sheaf.get_task($1)", &[id.into()])
                .unwrap()
                .unwrap();
        assert_eq!(shown.0, json!({"done": 2}));
        let listed = Spi::get_one::<pgrx::JsonB>("SELECT progress FROM sheaf.list_tasks('q', 'running')")
            .unwrap()
            .unwrap();
        assert_eq!(listed.0, json!({"done": 2}));
        assert_eq!(
            sqlstate(
                "SELECT sheaf.set_progress($1, $2, $3)",
                vec![
                    id.into(),
                    token.into(),
                    pgrx::JsonB(json!("x".repeat(70_000))).into()
                ]
            ),
            "ERRCODE_PROGRAM_LIMIT_EXCEEDED"
        );
        Spi::run_with_args("SELECT sheaf.complete($1, $2)", &[id.into(), token.into()]).unwrap();
        let pruned = Spi::get_one::<i64>("SELECT (sheaf.maintain()->>'progress_pruned')::bigint")
            .unwrap()
            .unwrap();
        assert_eq!(pruned, 1);
    }
}
