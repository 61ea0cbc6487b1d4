//! Execution state transitions that lock the execution's tasks before its
//! row: pause, resume, and the end (`close`). Each one locks the execution
//! row, appends its event, and changes the state in the same transaction.
//! Suspending and waking, which lock the row only, are `wake`.
//!
//! A terminal transition also releases everything the execution holds: its
//! unfinished tasks are cancelled (their concurrency slots go to the next
//! waiting tasks), its mutexes pass to their next waiters, its places in
//! mutex waiting lines are removed, and its quota counters are updated.
//! Each follows the lock order of `base::locks`: the execution's tasks, then
//! its row, then quota counters, concurrency keys and mutex keys.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use sheaf_core::state::ExecutionState;

use crate::base::errors::{not_ready, unknown_execution};
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::mutex;
use crate::queue::{caps, promote, tasks};
use crate::workflow::{executions, external, family, history, quota};

/// How an execution ends.
pub enum Close {
    Completed {
        result: Option<serde_json::Value>,
    },
    Failed {
        error: String,
    },
    Cancelled {
        reason: Option<String>,
    },
    Terminated {
        reason: Option<String>,
    },
    /// Its `opts.execution_timeout` ran out (`maintain`).
    TimedOut {
        timeout_at: TimestampWithTimeZone,
    },
    /// Continued by `successor` (continue-as-new).
    ContinuedAsNew {
        successor: pgrx::Uuid,
    },
}

impl Close {
    fn state(&self) -> ExecutionState {
        match self {
            Close::Completed { .. } => ExecutionState::Completed,
            Close::Failed { .. } => ExecutionState::Failed,
            Close::Cancelled { .. } => ExecutionState::Cancelled,
            Close::Terminated { .. } => ExecutionState::Terminated,
            Close::TimedOut { .. } => ExecutionState::TimedOut,
            Close::ContinuedAsNew { .. } => ExecutionState::ContinuedAsNew,
        }
    }

    fn event(&self) -> (&'static str, serde_json::Value) {
        match self {
            Close::Completed { result } => ("WorkflowCompleted", serde_json::json!({ "result": result })),
            Close::Failed { error } => ("WorkflowFailed", serde_json::json!({ "error": error })),
            Close::Cancelled { reason } => ("WorkflowCancelled", serde_json::json!({ "reason": reason })),
            Close::Terminated { reason } => ("WorkflowTerminated", serde_json::json!({ "reason": reason })),
            Close::TimedOut { timeout_at } => (
                "WorkflowTimedOut",
                serde_json::json!({ "timeout_at": timeout_at }),
            ),
            Close::ContinuedAsNew { successor } => (
                "WorkflowContinuedAsNew",
                serde_json::json!({ "successor": successor.to_string() }),
            ),
        }
    }
}

const CLOSE: Stmt = Stmt::write(
    "UPDATE executions SET state = $2, result = $3, error = $4, closed_at = now(), \
            wake_at = NULL, paused_from = NULL \
     WHERE id = $1 RETURNING history_bytes",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::TEXTOID,
    ],
);
// Read without a lock: `close` locks the run's tasks before its row.
const DUE_TIMEOUTS: Stmt = Stmt::write(
    "SELECT id, timeout_at FROM executions \
     WHERE timeout_at <= now() AND state IN ('RUNNING', 'SUSPENDED', 'PAUSED') \
     ORDER BY timeout_at LIMIT $1",
    &[PgBuiltInOids::INT8OID],
);

/// Ends an execution; `false` if it had already ended (nothing changes).
/// A migrating or migrated execution refuses (55000): its own shard ends it.
pub fn close(id: pgrx::Uuid, how: Close) -> bool {
    close_after(id, how, || {})
}

/// `close`, running `first` once the execution's tasks are locked and
/// before its row is (a dead-lettered workflow task records itself there,
/// which updates the row). `first` runs also when the execution has ended.
pub fn close_after(id: pgrx::Uuid, how: Close, first: impl FnOnce()) -> bool {
    match executions::state_of(id) {
        None => unknown_execution(id),
        Some(state) if !state.is_active() => {
            first();
            return refuse_migrating(id, state);
        }
        Some(_) => {}
    }
    // Tasks before the execution row (`base::locks`): a completing or
    // failing task holds its row and then appends to its execution's history.
    let cancelled = tasks::delete_of_execution(id);
    first();
    let e = executions::lock(id);
    if !e.state.is_active() {
        return refuse_migrating(id, e.state);
    }
    let (event_type, payload) = how.event();
    history::append(id, event_type, payload);
    let (result, error) = match &how {
        Close::Completed { result } => (result.clone().map(pgrx::JsonB), None),
        Close::Failed { error } => (None, Some(error.clone())),
        Close::Cancelled { reason } | Close::Terminated { reason } => (None, reason.clone()),
        Close::TimedOut { .. } => (None, Some("execution timeout".to_owned())),
        Close::ContinuedAsNew { .. } => (None, None),
    };
    // The row is locked above: the update returns it.
    let bytes: i64 = CLOSE.one_value(
        &[
            id.into(),
            how.state().as_str().into(),
            result.into(),
            error.into(),
        ],
        "closing an execution",
    );
    if let Some(key) = &e.quota_key {
        quota::add(key, -1, -bytes, 0);
    }
    caps::release_held(cancelled);
    mutex::release_all(id);
    if family::enabled() {
        // As a parent: its children's parent_close, through the relay. As
        // a child: its end to its parent (the parent's row after its own).
        family::parent_ended(id, how.state());
        if let Some(parent) = e.parent_id {
            family::report_end(id, parent);
        }
        // As a sender: its outbox keeps only what is still to deliver.
        external::sender_ended(id);
    }
    true
}

fn refuse_migrating(id: pgrx::Uuid, state: ExecutionState) -> bool {
    // A seal sends the call where the run lives now.
    executions::forward(id, state);
    if state.is_migrating() {
        not_ready(format!(
            "execution {id} is {state}: it is ended where it now runs"
        ));
    }
    false
}

/// Pauses a running or suspended execution: its ready, waiting and scheduled
/// tasks are parked (holding no slot) until it resumes; running tasks
/// finish. `false` if it was already paused; 55000 if it has ended.
pub fn pause(id: pgrx::Uuid) -> bool {
    if executions::state_of(id) == Some(ExecutionState::Paused) {
        return false;
    }
    // Tasks before the execution row, as in `close`.
    let parked = tasks::park_of_execution(id);
    let e = executions::lock_active(id, "be paused");
    if e.state == ExecutionState::Paused {
        // Paused meanwhile: its tasks were parked already.
        return false;
    }
    history::append(
        e.id,
        "WorkflowPaused",
        serde_json::json!({ "from": e.state.as_str() }),
    );
    executions::set_state(&e, ExecutionState::Paused, Some(e.state), None);
    caps::release_held(parked);
    true
}

/// Resumes a paused execution in the state it was paused from; its parked
/// tasks go back in line. `false` if it was not paused; 55000 if it has ended.
pub fn resume(id: pgrx::Uuid) -> bool {
    // Tasks before the execution row, as in `close`: lock the parked tasks
    // of an execution that reads as paused, then its row.
    let parked = match executions::state_of(id) {
        Some(ExecutionState::Paused) => tasks::unpark_of_execution(id),
        _ => Vec::new(),
    };
    let e = executions::lock_active(id, "be resumed");
    if e.state != ExecutionState::Paused {
        // Not paused (or resumed meanwhile, which unparked its tasks).
        return false;
    }
    let to = e.paused_from.unwrap_or(ExecutionState::Running);
    history::append(e.id, "WorkflowResumed", serde_json::json!({ "to": to.as_str() }));
    executions::set_state(&e, to, None, None);
    promote::place(parked);
    true
}

/// Ends up to `max` active executions past their `timeout_at` `TIMED_OUT`;
/// returns how many. One that ended, or began to move, since it was read is
/// left alone.
pub fn time_out_due(max: i64) -> i64 {
    if !executions::timeouts_enabled() {
        return 0;
    }
    row! {
        /// An active execution past its `timeout_at`.
        struct Due {
            id: pgrx::Uuid,
            timeout_at: TimestampWithTimeZone,
        }
    }
    let due: Vec<Due> = DUE_TIMEOUTS.all(&[max.into()], "reading overdue executions");
    due.into_iter()
        .filter(|&Due { id, timeout_at }| {
            executions::state_of(id).is_some_and(ExecutionState::is_active)
                && close_active(id, Close::TimedOut { timeout_at })
        })
        .count() as i64
}

/// `close` of a run read as active: `false`, never an error, if it ended
/// or began to move meanwhile (its tasks and row are locked, in that order,
/// before its state is trusted).
fn close_active(id: pgrx::Uuid, how: Close) -> bool {
    tasks::lock_of_execution(id);
    executions::try_lock(id).is_some_and(|e| e.state.is_active()) && close(id, how)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{claim, count, declare, init, start, state};
    use pgrx::prelude::*;
    use serde_json::json;

    fn call(sql: &str, id: pgrx::Uuid) -> bool {
        Spi::get_one_with_args::<bool>(sql, &[id.into()])
            .unwrap()
            .unwrap()
    }

    #[pg_test]
    fn maintain_ends_an_overdue_run_timed_out_and_releases_it() {
        init();
        declare(
            "w",
            json!({"queue": "wq", "concurrency": {"key": "input.k", "limit": 1}}),
        );
        Spi::run(
            "SELECT sheaf.start_workflow('w', 'late', '{\"k\": \"k\"}', '{\"execution_timeout\": \"1s\"}')",
        )
        .unwrap();
        let other = start("w", "next", json!({"k": "k"})).id;
        let late = Spi::get_one::<pgrx::Uuid>("SELECT id FROM sheaf.executions WHERE workflow_id = 'late'")
            .unwrap()
            .unwrap();
        let timed_out = || {
            Spi::get_one::<i64>("SELECT (sheaf.maintain()->>'timed_out')::bigint")
                .unwrap()
                .unwrap()
        };
        assert_eq!(timed_out(), 0, "not due yet");
        // Due: moved back rather than waited for.
        Spi::run("UPDATE sheaf.executions SET timeout_at = clock_timestamp() - interval '1 second' WHERE workflow_id = 'late'")
            .unwrap();
        assert_eq!(timed_out(), 1);
        assert_eq!(
            (state(late), state(other)),
            ("TIMED_OUT".into(), "RUNNING".into())
        );
        assert_eq!(
            count(&format!(
                "SELECT count(*) FROM sheaf.events WHERE execution_id = '{late}' AND event_type = 'WorkflowTimedOut'"
            )),
            1
        );
        assert_eq!(claim("wq", 1).len(), 1, "the slot went to the next run's task");
        assert_eq!(timed_out(), 0, "ended once");
        assert_eq!(
            count(
                "SELECT timed_out FROM sheaf.usage_report(now() - interval '1 hour', now() + interval '1 hour')"
            ),
            1
        );
    }

    #[pg_test]
    fn a_terminal_transition_cancels_tasks_frees_slots_and_locks() {
        init();
        declare(
            "w",
            json!({"queue": "wq", "concurrency": {"key": "input.k", "limit": 1}}),
        );
        let a = start("w", "a", json!({"k": "k"})).id;
        let b = start("w", "b", json!({"k": "k"})).id;
        let t = claim("wq", 1);
        assert_eq!(t.len(), 1);
        Spi::run_with_args("SELECT * FROM sheaf.mutex_acquire('m', $1)", &[a.into()]).unwrap();
        Spi::run_with_args("SELECT * FROM sheaf.mutex_acquire('m', $1)", &[b.into()]).unwrap();
        assert!(call("SELECT sheaf.terminate_execution($1, 'stop')", a));
        assert!(
            !call("SELECT sheaf.cancel_execution($1, NULL)", a),
            "already ended"
        );
        assert_eq!(state(a), "TERMINATED");
        assert_eq!(
            Spi::get_one::<pgrx::Uuid>("SELECT holder FROM sheaf.mutex_status('m')").unwrap(),
            Some(b),
            "the lock passed to the next waiter"
        );
        assert_eq!(claim("wq", 1).len(), 1, "the slot went to b's task");
    }

    #[pg_test]
    fn a_dead_lettered_workflow_task_fails_its_execution() {
        init();
        let a = start("w", "a", json!({})).id;
        Spi::run("UPDATE sheaf.tasks SET max_attempts = 1").unwrap();
        let t = claim("default", 1);
        Spi::run_with_args(
            "SELECT sheaf.fail($1, $2, 'boom')",
            &[t[0].id.into(), t[0].token.into()],
        )
        .unwrap();
        assert_eq!(state(a), "FAILED");
    }

    #[pg_test]
    fn a_dead_lettered_workflow_task_fails_its_execution_at_once() {
        init();
        let a = start("w", "a", json!({})).id;
        let t = claim("default", 1);
        Spi::run_with_args(
            "SELECT sheaf.dead_letter($1, $2, 'hopeless')",
            &[t[0].id.into(), t[0].token.into()],
        )
        .unwrap();
        assert_eq!(state(a), "FAILED");
        assert_eq!(count("SELECT count(*) FROM sheaf.dead_letters"), 1);
    }

    #[pg_test]
    fn pause_parks_tasks_and_resume_brings_them_back() {
        init();
        let a = start("w", "a", json!({})).id;
        assert!(call("SELECT sheaf.pause_execution($1)", a));
        assert!(!call("SELECT sheaf.pause_execution($1)", a));
        assert!(
            claim("default", 1).is_empty(),
            "a paused execution's task is not claimable"
        );
        assert!(call("SELECT sheaf.resume_execution($1)", a));
        assert_eq!(state(a), "RUNNING");
        assert_eq!(claim("default", 1).len(), 1);
    }

    #[pg_test(error = "execution 00010000-0000-8000-8000-000000000001 is COMPLETED: cannot be paused")]
    fn pausing_an_ended_execution_is_refused() {
        init();
        Spi::run(
            "INSERT INTO sheaf.executions (id, workflow_name, workflow_id, state, seq, queue, input) \
             VALUES ('00010000-0000-8000-8000-000000000001', 'w', 'a', 'COMPLETED', 1, 'default', '{}')",
        )
        .unwrap();
        Spi::run("SELECT sheaf.pause_execution('00010000-0000-8000-8000-000000000001')").unwrap();
    }
}
