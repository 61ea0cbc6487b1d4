//! The workflow layer's side of `queue::hooks`: what a task's outcome does
//! to its execution.

use std::collections::BTreeMap;

use sheaf_core::state::ExecutionState;

use crate::base::errors::{not_ready, unknown_execution};
use crate::queue::hooks::{ExecutionHooks, Intake, Outcome, TaskEvent};
use crate::workflow::lifecycle::{self, Close};
use crate::workflow::{executions, history, quota};

/// Executions as the queue sees them.
pub struct Executions;

/// The one implementation; the api layer hands it to queue functions.
pub static EXECUTIONS: Executions = Executions;

impl ExecutionHooks for Executions {
    fn intake(&self, id: pgrx::Uuid) -> Intake {
        match executions::state_of(id) {
            None => unknown_execution(id),
            Some(ExecutionState::Paused) => Intake::Parked,
            Some(state) if state.takes_tasks() => Intake::Open,
            Some(state) => {
                // A task for a run that moved goes where it lives.
                crate::workflow::executions::forward(id, state);
                not_ready(format!("execution {id} is {state}: it takes no new tasks"))
            }
        }
    }

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
