//! Execution state transitions. Each one locks the execution row, appends its
//! event, and changes the state in the same transaction.
//!
//! A terminal transition also releases everything the execution holds: its
//! unfinished tasks are cancelled (their concurrency slots go to the next
//! waiting tasks), its mutexes pass to their next waiters, its places in
//! mutex waiting lines are removed, and its quota counters are updated.
//! Each follows the lock order of `base::locks`: the execution's tasks, then
//! its row, then quota counters, concurrency keys and mutex keys.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use sheaf_core::state::{ExecutionState, TaskKind};

use crate::base::errors::{not_ready, unknown_execution};
use crate::base::jsonb::Jsonb;
use crate::base::plans::{Stmt, exec, run};
use crate::base::rows;
use crate::mutex;
use crate::queue::complete::{self, Taken};
use crate::queue::hooks::{ExecutionHooks, Outcome, TaskEvent};
use crate::queue::{caps, promote, tasks};
use crate::workflow::executions::{self, Locked};
use crate::workflow::hooks::EXECUTIONS;
use crate::workflow::{children, external, history, quota, start};

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
const SET_STATE: Stmt = Stmt::write(
    "UPDATE executions SET state = $2, paused_from = $3, wake_at = CASE WHEN $5 THEN $4 ELSE wake_at END \
     WHERE id = $1",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TIMESTAMPTZOID,
        PgBuiltInOids::BOOLOID,
    ],
);
const DUE_WAKES: Stmt = Stmt::write(
    "SELECT id FROM executions WHERE state = 'SUSPENDED' AND wake_at <= now() \
     ORDER BY wake_at LIMIT $1 FOR UPDATE SKIP LOCKED",
    &[PgBuiltInOids::INT8OID],
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
    let bytes: i64 = Spi::connect_mut(|client| {
        let table = run(
            client,
            &CLOSE,
            &[
                id.into(),
                how.state().as_str().into(),
                result.into(),
                error.into(),
            ],
        );
        rows::only_value(table, "closing an execution")
    });
    if let Some(key) = &e.quota_key {
        quota::add(key, -1, -bytes, 0);
    }
    caps::release_held(cancelled);
    mutex::release_all(id);
    if children::enabled() {
        // As a parent: its children's parent_close, through the relay. As
        // a child: its end to its parent (the parent's row after its own).
        children::parent_ended(id, how.state());
        if let Some(parent) = e.parent_id {
            children::report_end(id, parent);
        }
        // As a sender: its outbox keeps only what is still to deliver.
        external::sender_ended(id);
    }
    true
}

/// Completes a task of an execution claimed under `token` and ends its
/// execution `how`, in one transaction: the task's `TaskCompleted` (with
/// `result`) comes first in the history, then the execution's end. (Ending
/// the execution on its own would cancel the task, and its completion would
/// then be refused.) A stale token raises 55P03, a task that is gone P0002, a task of no execution
/// 55000, and either changes nothing.
pub fn close_with_task(task_id: pgrx::Uuid, token: i64, result: Option<serde_json::Value>, how: Close) {
    let Taken {
        key,
        execution_id,
        kind,
        secs,
    } = complete::take(task_id, token);
    let Some(execution_id) = execution_id else {
        not_ready(format!(
            "task {task_id} belongs to no execution: complete it with sheaf.complete"
        ));
    };
    // The task row is held: the execution's other tasks, then its row, as in
    // `close` (`base::locks`). The record runs in between, as a dead-lettered
    // workflow task's does.
    let record = || {
        EXECUTIONS.task_outcome(TaskEvent {
            execution_id,
            task_id,
            kind: &kind,
            outcome: Outcome::Completed { result },
            secs,
        });
    };
    close_after(execution_id, how, record);
    // Concurrency keys after the execution row.
    if let Some(key) = key {
        caps::release(&key, 1);
    }
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

/// Sets an execution's state; `wake_at`: `Some(t)` sets the timer to `t`,
/// `None` keeps it.
fn set_state(
    e: &Locked,
    state: ExecutionState,
    paused_from: Option<ExecutionState>,
    wake_at: Option<Option<TimestampWithTimeZone>>,
) {
    exec(
        &SET_STATE,
        &[
            e.id.into(),
            state.as_str().into(),
            paused_from.map(ExecutionState::as_str).into(),
            wake_at.flatten().into(),
            wake_at.is_some().into(),
        ],
    );
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
    set_state(&e, ExecutionState::Paused, Some(e.state), None);
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
    set_state(&e, to, None, None);
    promote::place(parked);
    true
}

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
            set_state(&e, ExecutionState::Suspended, None, Some(wake_at));
            true
        }
    }
}

/// Wakes a suspended execution: RUNNING again, with a new workflow task.
/// A paused execution that was suspended wakes into paused-from-running
/// (its task waits for the resume). `false` if it was not suspended.
pub fn wake(id: pgrx::Uuid) -> bool {
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
        set_state(&e, ExecutionState::Running, None, Some(None));
    } else {
        set_state(
            &e,
            ExecutionState::Paused,
            Some(ExecutionState::Running),
            Some(None),
        );
    }
    executions::enqueue_workflow_task(
        &e,
        Jsonb::from_value(
            serde_json::json!({"workflow_name": e.workflow_name, "workflow_id": e.workflow_id, "woken": true}),
        ),
        0,
        None,
    );
    true
}

/// Ends up to `max` active executions past their `timeout_at` `TIMED_OUT`;
/// returns how many. One that ended, or began to move, since it was read is
/// left alone.
pub fn time_out_due(max: i64) -> i64 {
    if !start::timeouts_enabled() {
        return 0;
    }
    let due: Vec<(pgrx::Uuid, TimestampWithTimeZone)> = Spi::connect_mut(|client| {
        rows::all(
            run(client, &DUE_TIMEOUTS, &[max.into()]),
            "reading overdue executions",
        )
    });
    due.into_iter()
        .filter(|&(id, timeout_at)| {
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

/// Wakes up to `max` suspended executions whose timer is due; returns how many.
pub fn wake_due(max: i64) -> i64 {
    let due: Vec<pgrx::Uuid> =
        Spi::connect_mut(|client| rows::values(run(client, &DUE_WAKES, &[max.into()]), "reading due timers"));
    due.into_iter().filter(|id| wake(*id)).count() as i64
}

/// Wakes an execution that an event concerns (a child's end, the outcome
/// of its external signal or cancel): a suspended one wakes; a running (or
/// paused) one without a workflow task waiting to run gets one, so a
/// handler that already read its history runs again.
pub fn wake_for_event(e: &Locked) {
    let suspended = e.state == ExecutionState::Suspended
        || (e.state == ExecutionState::Paused && e.paused_from == Some(ExecutionState::Suspended));
    if suspended {
        wake(e.id);
    } else if e.state.is_active() && !tasks::has_unclaimed_of_execution(e.id, TaskKind::Workflow.as_str()) {
        executions::enqueue_workflow_task(
            e,
            Jsonb::from_value(serde_json::json!({"workflow_name": e.workflow_name,
                                                 "workflow_id": e.workflow_id, "woken": true})),
            0,
            None,
        );
    }
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
        let (other, ..) = start("w", "next", json!({"k": "k"}));
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
        let (a, ..) = start("w", "a", json!({"k": "k"}));
        let (b, ..) = start("w", "b", json!({"k": "k"}));
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
        let (a, ..) = start("w", "a", json!({}));
        Spi::run("UPDATE sheaf.tasks SET max_attempts = 1").unwrap();
        let t = claim("default", 1);
        Spi::run_with_args(
            "SELECT sheaf.fail($1, $2, 'boom')",
            &[t[0].0.into(), t[0].1.into()],
        )
        .unwrap();
        assert_eq!(state(a), "FAILED");
    }

    #[pg_test]
    fn a_dead_lettered_workflow_task_fails_its_execution_at_once() {
        init();
        let (a, ..) = start("w", "a", json!({}));
        let t = claim("default", 1);
        Spi::run_with_args(
            "SELECT sheaf.dead_letter($1, $2, 'hopeless')",
            &[t[0].0.into(), t[0].1.into()],
        )
        .unwrap();
        assert_eq!(state(a), "FAILED");
        assert_eq!(count("SELECT count(*) FROM sheaf.dead_letters"), 1);
    }

    /// The events of an execution, in order.
    fn events(id: pgrx::Uuid) -> Vec<String> {
        Spi::connect(|client| {
            client
                .select(
                    "SELECT event_type FROM sheaf.events WHERE execution_id = $1 ORDER BY seq",
                    None,
                    &[id.into()],
                )
                .unwrap()
                .map(|row| row.get::<String>(1).unwrap().unwrap())
                .collect()
        })
    }

    #[pg_test]
    fn a_workflow_task_completes_with_its_execution_in_one_call() {
        init();
        let (a, ..) = start("w", "a", json!({}));
        let t = claim("default", 1);
        Spi::run_with_args(
            "SELECT sheaf.complete_task_and_execution($1, $2, '{\"total\": 3}')",
            &[t[0].0.into(), t[0].1.into()],
        )
        .unwrap();
        assert_eq!(state(a), "COMPLETED");
        let e = events(a);
        assert_eq!(&e[e.len() - 2..], ["TaskCompleted", "WorkflowCompleted"], "{e:?}");
        assert_eq!(
            Spi::get_one_with_args::<i64>(
                "SELECT (result->>'total')::bigint FROM sheaf.executions WHERE id = $1",
                &[a.into()]
            )
            .unwrap(),
            Some(3)
        );
        assert_eq!(count("SELECT count(*) FROM sheaf.tasks"), 0);
    }

    #[pg_test]
    fn a_workflow_task_completes_and_fails_its_execution_in_one_call() {
        init();
        let (a, ..) = start("w", "a", json!({}));
        let t = claim("default", 1);
        Spi::run_with_args(
            "SELECT sheaf.complete_task_and_fail_execution($1, $2, 'gave up')",
            &[t[0].0.into(), t[0].1.into()],
        )
        .unwrap();
        assert_eq!(state(a), "FAILED");
        let e = events(a);
        assert_eq!(&e[e.len() - 2..], ["TaskCompleted", "WorkflowFailed"], "{e:?}");
    }

    #[pg_test(
        error = "task 00010000-0000-8000-8000-000000000001 belongs to no execution: complete it with sheaf.complete"
    )]
    fn a_task_of_no_execution_cannot_end_one() {
        init();
        crate::testing::enqueue("q", json!({}), json!({}));
        let t = claim("q", 1);
        // A known id, for the message (a running task is in no other table).
        Spi::run("UPDATE sheaf.tasks SET id = '00010000-0000-8000-8000-000000000001'").unwrap();
        Spi::run_with_args(
            "SELECT sheaf.complete_task_and_execution('00010000-0000-8000-8000-000000000001', $1, NULL)",
            &[t[0].1.into()],
        )
        .unwrap();
    }

    #[pg_test]
    fn pause_parks_tasks_and_resume_brings_them_back() {
        init();
        let (a, ..) = start("w", "a", json!({}));
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

    #[pg_test]
    fn suspend_and_wake_enqueue_a_new_workflow_task() {
        init();
        let (a, ..) = start("w", "a", json!({}));
        let t = claim("default", 1);
        crate::testing::complete(&t[0]);
        assert!(call(
            "SELECT sheaf.suspend_execution($1, now() - interval '1 second')",
            a
        ));
        assert_eq!(state(a), "SUSPENDED");
        let woken = Spi::get_one::<i64>("SELECT (sheaf.maintain()->>'woken')::bigint").unwrap();
        assert_eq!(woken, Some(1));
        assert_eq!(state(a), "RUNNING");
        assert_eq!(
            count("SELECT count(*) FROM sheaf.tasks WHERE kind = 'workflow'"),
            1
        );
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
