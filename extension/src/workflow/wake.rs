//! Suspending and waking an execution: its timer (`wake_at`), a wake's new
//! workflow task, and the wake an event brings (a child's end, the outcome
//! of an external signal or cancel, an activity's end under a policy's
//! `activity_ends: wake`). A wake locks the execution row only:
//! it locks none of its tasks, it inserts a new one.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use sheaf_core::state::{ExecutionState, TaskKind};

use crate::base::errors::not_ready;
use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;
use crate::queue::tasks;
use crate::workflow::executions::{self, Locked};
use crate::workflow::history;

const DUE_WAKES: Stmt = Stmt::write(
    "SELECT id FROM executions WHERE state = 'SUSPENDED' AND wake_at <= now() \
     ORDER BY wake_at LIMIT $1 FOR UPDATE SKIP LOCKED",
    &[PgBuiltInOids::INT8OID],
);

/// Suspends a running execution until `wake`, or until `wake_at` (then
/// `wake_due` wakes it). `false` if it was already suspended; 55000 if it is
/// paused or has ended.
pub fn suspend(id: pgrx::Uuid, wake_at: Option<TimestampWithTimeZone>) -> bool {
    let e = executions::lock_active(id, "be suspended");
    match e.state {
        ExecutionState::Suspended => false,
        ExecutionState::Paused => not_ready(format!(
            "execution {id} is PAUSED: resume it before suspending it"
        )),
        _ => {
            history::append(id, "WorkflowSuspended", serde_json::json!({ "wake_at": wake_at }));
            executions::set_state(&e, ExecutionState::Suspended, None, Some(wake_at));
            true
        }
    }
}

/// Wakes a suspended execution: RUNNING again, with a new workflow task.
/// A paused execution that was suspended wakes into paused-from-running
/// (its task waits for the resume). `false` if it was not suspended.
pub fn wake(id: pgrx::Uuid) -> bool {
    wake_because(id, None)
}

/// The workflow task a wake enqueues: the run's name and id, `woken`, and
/// what woke it when an event says (`activity_ended`).
fn woken_payload(e: &Locked, cause: Option<&serde_json::Value>) -> Jsonb {
    let mut payload =
        serde_json::json!({"workflow_name": e.workflow_name, "workflow_id": e.workflow_id, "woken": true});
    if let Some(cause) = cause {
        payload["activity_ended"] = cause.clone();
    }
    Jsonb::from_value(payload)
}

fn wake_because(id: pgrx::Uuid, cause: Option<&serde_json::Value>) -> bool {
    // The execution row first: a wake locks none of the execution's tasks,
    // it only inserts a new one (`base::locks`: new rows are no one's yet).
    let e = executions::lock_active(id, "be woken");
    let suspended = e.state == ExecutionState::Suspended;
    let paused_suspended =
        e.state == ExecutionState::Paused && e.paused_from == Some(ExecutionState::Suspended);
    if !suspended && !paused_suspended {
        return false;
    }
    history::append(id, "WorkflowWoken", serde_json::json!({}));
    if suspended {
        executions::set_state(&e, ExecutionState::Running, None, Some(None));
    } else {
        executions::set_state(
            &e,
            ExecutionState::Paused,
            Some(ExecutionState::Running),
            Some(None),
        );
    }
    executions::enqueue_workflow_task(&e, woken_payload(&e, cause), 0, None);
    true
}

/// Wakes up to `max` suspended executions whose timer is due; returns how many.
pub fn wake_due(max: i64) -> i64 {
    let due: Vec<pgrx::Uuid> = DUE_WAKES.values(&[max.into()], "reading due timers");
    due.into_iter().filter(|id| wake(*id)).count() as i64
}

/// Wakes an execution that an event concerns (a child's end, the outcome
/// of its external signal or cancel): a suspended one wakes; a running (or
/// paused) one without a workflow task waiting to run gets one, so a
/// handler that already read its history runs again.
pub fn wake_for_event(e: &Locked) {
    wake_for(e, None);
}

/// `wake_for_event` for an activity's end: the workflow task it enqueues
/// (if any) names the activity (`cause`: its task id and event type).
pub fn wake_for_activity(e: &Locked, cause: &serde_json::Value) {
    wake_for(e, Some(cause));
}

fn wake_for(e: &Locked, cause: Option<&serde_json::Value>) {
    let suspended = e.state == ExecutionState::Suspended
        || (e.state == ExecutionState::Paused && e.paused_from == Some(ExecutionState::Suspended));
    if suspended {
        wake_because(e.id, cause);
    } else if e.state.is_active() && !tasks::has_unclaimed_of_execution(e.id, TaskKind::Workflow.as_str()) {
        executions::enqueue_workflow_task(e, woken_payload(e, cause), 0, None);
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{claim, count, init, start, state};
    use pgrx::prelude::*;
    use serde_json::json;

    #[pg_test]
    fn suspend_and_wake_enqueue_a_new_workflow_task() {
        init();
        let a = start("w", "a", json!({})).id;
        let t = claim("default", 1);
        crate::testing::complete(&t[0]);
        assert_eq!(
            Spi::get_one_with_args::<bool>(
                "SELECT sheaf.suspend_execution($1, now() - interval '1 second')",
                &[a.into()]
            )
            .unwrap(),
            Some(true)
        );
        assert_eq!(state(a), "SUSPENDED");
        let woken = Spi::get_one::<i64>("SELECT (sheaf.maintain()->>'woken')::bigint").unwrap();
        assert_eq!(woken, Some(1));
        assert_eq!(state(a), "RUNNING");
        assert_eq!(
            count("SELECT count(*) FROM sheaf.tasks WHERE kind = 'workflow'"),
            1
        );
    }
}
