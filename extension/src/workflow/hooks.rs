//! The workflow layer's side of `queue::hooks`: what a task's outcome does
//! to its execution (whether an execution takes a new task is
//! `executions::INTAKE`), the wake an activity's end brings under a policy's
//! `activity_ends: wake`, and a task's completion that ends its execution.

use std::collections::BTreeMap;

use sheaf_core::policy::ActivityEnds;
use sheaf_core::state::TaskKind;

use crate::base::errors::not_ready;
use crate::queue::caps;
use crate::queue::complete::{self, Taken};
use crate::queue::hooks::{ExecutionHooks, Outcome, TaskEvent};
use crate::workflow::lifecycle::{self, Close};
use crate::workflow::{executions, history, policy, quota, wake};

/// Executions as the queue sees them.
pub struct Executions;

/// The one implementation; the api layer hands it to queue functions.
pub static EXECUTIONS: Executions = Executions;

impl ExecutionHooks for Executions {
    fn task_outcome(&self, event: TaskEvent<'_>) {
        let TaskEvent {
            execution_id,
            task_id,
            kind,
            outcome,
            secs,
        } = event;
        let task = task_id.to_string();
        // Every attempt-ending event carries the attempt's seconds, which
        // the usage report sums (`workflow::usage`).
        let with_secs = |mut payload: serde_json::Value| {
            if let Some(secs) = secs {
                payload["secs"] = serde_json::json!(secs.max(0.0));
            }
            payload
        };
        match outcome {
            Outcome::Completed { result } => {
                history::append(
                    execution_id,
                    "TaskCompleted",
                    with_secs(serde_json::json!({"task_id": task, "kind": kind, "result": result})),
                );
                activity_ended(execution_id, &task, kind, "TaskCompleted");
            }
            Outcome::Failed { attempt, error } => {
                history::append(
                    execution_id,
                    "TaskFailed",
                    with_secs(
                        serde_json::json!({"task_id": task, "kind": kind, "attempt": attempt, "error": error}),
                    ),
                );
            }
            Outcome::Reaped { attempt } => {
                history::append(
                    execution_id,
                    "TaskReaped",
                    with_secs(serde_json::json!({"task_id": task, "kind": kind, "attempt": attempt})),
                );
            }
            Outcome::Cancelled { reason } => {
                history::append(
                    execution_id,
                    "TaskCancelled",
                    serde_json::json!({"task_id": task, "kind": kind, "reason": reason}),
                );
                activity_ended(execution_id, &task, kind, "TaskCancelled");
            }
            Outcome::DeadLettered { attempts, error } => {
                let record = || {
                    history::append(
                        execution_id,
                        "TaskDeadLettered",
                        with_secs(
                            serde_json::json!({"task_id": task, "kind": kind, "attempts": attempts, "error": error}),
                        ),
                    );
                    if let Some(quota_key) = executions::quota_key_of(execution_id) {
                        quota::add(&quota_key, 0, 0, 1);
                    }
                };
                // A workflow task that ran out of attempts fails its
                // execution: its other tasks are locked before the record
                // touches the execution row (`base::locks`). Out of the
                // order among tasks: this transaction already holds the dead
                // task (a reap, every task it reaped), so a concurrent end of
                // the same execution that holds a sibling and waits for one
                // of those deadlocks with it (40P01, docs/reference/sql/mutex.md).
                if kind == "workflow" && executions::state_of(execution_id).is_some() {
                    lifecycle::close_after(
                        execution_id,
                        Close::Failed {
                            error: format!(
                                "workflow task {task_id} dead-lettered after {attempts} attempt(s): {error}"
                            ),
                        },
                        record,
                    );
                } else {
                    record();
                    activity_ended(execution_id, &task, kind, "TaskDeadLettered");
                }
            }
        }
    }

    fn dead_letters_gone(&self, execution_ids: &[pgrx::Uuid]) {
        // Counter rows in key order (the lock order, `base::locks`).
        let mut per_quota_key: BTreeMap<String, i64> = BTreeMap::new();
        for id in execution_ids {
            if let Some(key) = executions::quota_key_of(*id) {
                *per_quota_key.entry(key).or_default() += 1;
            }
        }
        for (key, k) in per_quota_key {
            quota::add(&key, 0, 0, -k);
        }
    }
}

/// An activity of an execution ended for good (`event`: its history event):
/// under its workflow's `activity_ends: wake` the execution is woken, and
/// the workflow task a wake enqueues names the activity. Its history event
/// is already appended, so the execution row is this transaction's already
/// (`base::locks`). A retried attempt is no end; an execution that ended
/// deleted its tasks without an outcome, so its own end wakes nothing.
fn activity_ended(execution_id: pgrx::Uuid, task_id: &str, kind: &str, event: &str) {
    if kind != TaskKind::Activity.as_str() {
        return;
    }
    let Some(e) = executions::try_lock(execution_id) else {
        return;
    };
    if !e.state.is_active() || policy::load(&e.workflow_name).activity_ends != ActivityEnds::Wake {
        return;
    }
    wake::wake_for_activity(&e, &serde_json::json!({"task_id": task_id, "event": event}));
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
    lifecycle::close_after(execution_id, how, record);
    // Concurrency keys after the execution row.
    if let Some(key) = key {
        caps::release(&key, 1);
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::testing::{Claimed, claim, count, declare, enqueue, init, start, state, values};
    use pgrx::prelude::*;
    use serde_json::json;

    /// The events of an execution, in order.
    fn events(id: pgrx::Uuid) -> Vec<String> {
        values(
            "SELECT event_type FROM sheaf.events WHERE execution_id = $1 ORDER BY seq",
            &[id.into()],
        )
    }

    /// Starts `a` of workflow `w`, hands its first workflow task to a
    /// worker and leaves it running, and enqueues `n` activities of it on
    /// queue `acts`.
    fn run_with_activities(n: usize, max_attempts: i32) -> (pgrx::Uuid, Claimed) {
        let a = start("w", "a", json!({})).id;
        let mut t = claim("default", 1);
        for i in 0..n {
            enqueue(
                "acts",
                json!({"i": i}),
                json!({"execution_id": a.to_string(), "max_attempts": max_attempts}),
            );
        }
        (a, t.remove(0))
    }

    /// `run_with_activities`, then the workflow task completes and the run
    /// suspends with no timer.
    fn suspended_with_activities(n: usize, max_attempts: i32) -> pgrx::Uuid {
        let (a, t) = run_with_activities(n, max_attempts);
        crate::testing::complete(&t);
        Spi::run_with_args("SELECT sheaf.suspend_execution($1)", &[a.into()]).unwrap();
        assert_eq!(state(a), "SUSPENDED");
        a
    }

    /// The `activity_ended` of each unclaimed workflow task's payload.
    fn wakes() -> Vec<pgrx::JsonB> {
        values(
            "SELECT COALESCE(payload->'activity_ended', 'null') FROM sheaf.tasks WHERE kind = 'workflow' AND state <> 'running' \
             ORDER BY id",
            &[],
        )
    }

    fn workflow_tasks() -> i64 {
        count("SELECT count(*) FROM sheaf.tasks WHERE kind = 'workflow'")
    }

    #[pg_test]
    fn an_activity_end_wakes_a_suspended_run_naming_the_activity() {
        init();
        declare("w", json!({"activity_ends": "wake"}));
        let a = suspended_with_activities(2, 1);
        let acts = claim("acts", 2);
        crate::testing::complete(&acts[0]);
        assert_eq!(state(a), "RUNNING");
        let woken = wakes();
        assert_eq!(woken.len(), 1);
        assert_eq!(
            woken[0].0,
            json!({"task_id": acts[0].id.to_string(), "event": "TaskCompleted"})
        );
        let e = events(a);
        assert_eq!(&e[e.len() - 2..], ["TaskCompleted", "WorkflowWoken"], "{e:?}");
        // The second end finds a workflow task waiting: no second one.
        crate::testing::complete(&acts[1]);
        assert_eq!(workflow_tasks(), 1);
        assert_eq!(events(a).last().map(String::as_str), Some("TaskCompleted"));
    }

    #[pg_test]
    fn an_activity_end_while_the_workflow_task_runs_enqueues_the_next_one() {
        init();
        declare("w", json!({"activity_ends": "wake"}));
        let (a, running) = run_with_activities(1, 1);
        let act = claim("acts", 1);
        crate::testing::complete(&act[0]);
        assert_eq!(state(a), "RUNNING");
        assert_eq!(workflow_tasks(), 2, "the running one and the next");
        assert_eq!(wakes()[0].0["task_id"], json!(act[0].id.to_string()));
        // The handler that already read its history finishes; the next runs.
        crate::testing::complete(&running);
        assert_eq!(claim("default", 1).len(), 1);
    }

    #[pg_test]
    fn an_activity_end_with_a_workflow_task_waiting_adds_none() {
        init();
        declare("w", json!({"activity_ends": "wake"}));
        let a = start("w", "a", json!({})).id;
        enqueue("acts", json!({}), json!({"execution_id": a.to_string()}));
        crate::testing::complete(&claim("acts", 1)[0]);
        assert_eq!(workflow_tasks(), 1);
        assert_eq!(wakes()[0].0, json!(null), "the first workflow task, not a wake's");
    }

    #[pg_test]
    fn a_retried_attempt_wakes_nothing_and_a_dead_letter_wakes() {
        init();
        declare("w", json!({"activity_ends": "wake"}));
        let a = suspended_with_activities(1, 2);
        let act = claim("acts", 1);
        Spi::run_with_args(
            "SELECT sheaf.fail($1, $2, 'flaky', '0 s')",
            &[act[0].id.into(), act[0].token.into()],
        )
        .unwrap();
        assert_eq!(state(a), "SUSPENDED", "a retry is no end");
        assert_eq!(workflow_tasks(), 0);
        let act = claim("acts", 1);
        Spi::run_with_args(
            "SELECT sheaf.fail($1, $2, 'flaky again', '0 s')",
            &[act[0].id.into(), act[0].token.into()],
        )
        .unwrap();
        assert_eq!(state(a), "RUNNING");
        assert_eq!(
            wakes()[0].0,
            json!({"task_id": act[0].id.to_string(), "event": "TaskDeadLettered"})
        );
    }

    #[pg_test]
    fn an_operator_cancel_wakes_and_the_runs_own_end_does_not() {
        init();
        declare("w", json!({"activity_ends": "wake"}));
        let a = suspended_with_activities(2, 1);
        let act = claim("acts", 1);
        let waiting: pgrx::Uuid = Spi::get_one_with_args(
            "SELECT id FROM sheaf.tasks WHERE kind = 'activity' AND id <> $1",
            &[act[0].id.into()],
        )
        .unwrap()
        .unwrap();
        Spi::run_with_args("SELECT sheaf.cancel_task($1, 'not needed')", &[waiting.into()]).unwrap();
        assert_eq!(state(a), "RUNNING");
        assert_eq!(
            wakes()[0].0,
            json!({"task_id": waiting.to_string(), "event": "TaskCancelled"})
        );
        // Ending the run cancels its running activity: no outcome, no wake.
        Spi::run_with_args("SELECT sheaf.cancel_execution($1, 'done')", &[a.into()]).unwrap();
        assert_eq!(state(a), "CANCELLED");
        assert_eq!(count("SELECT count(*) FROM sheaf.tasks"), 0);
        assert_eq!(events(a).last().map(String::as_str), Some("WorkflowCancelled"));
    }

    #[pg_test]
    fn without_the_option_an_activity_end_only_records() {
        init();
        declare("w", json!({"activity_ends": "record"}));
        let a = suspended_with_activities(1, 1);
        crate::testing::complete(&claim("acts", 1)[0]);
        assert_eq!(state(a), "SUSPENDED");
        assert_eq!(workflow_tasks(), 0);
        assert_eq!(events(a).last().map(String::as_str), Some("TaskCompleted"));
        // Nor does one of a run whose workflow declared no policy.
        let b = start("v", "b", json!({})).id;
        crate::testing::complete(&claim("default", 1)[0]);
        enqueue("acts", json!({}), json!({"execution_id": b.to_string()}));
        crate::testing::complete(&claim("acts", 1)[0]);
        assert_eq!(workflow_tasks(), 0);
        assert_eq!(state(b), "RUNNING");
    }

    #[pg_test]
    fn a_workflow_task_completes_with_its_execution_in_one_call() {
        init();
        let a = start("w", "a", json!({})).id;
        let t = claim("default", 1);
        Spi::run_with_args(
            "SELECT sheaf.complete_task_and_execution($1, $2, '{\"total\": 3}')",
            &[t[0].id.into(), t[0].token.into()],
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
        let a = start("w", "a", json!({})).id;
        let t = claim("default", 1);
        Spi::run_with_args(
            "SELECT sheaf.complete_task_and_fail_execution($1, $2, 'gave up')",
            &[t[0].id.into(), t[0].token.into()],
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
            &[t[0].token.into()],
        )
        .unwrap();
    }
}
