//! Dead letters: tasks whose attempts ran out, kept until redriven.

use pgrx::prelude::*;

use crate::base::errors::SpiResultExt;
use crate::base::plans::{Stmt, run};
use crate::queue::hooks::{ExecutionHooks, Outcome, TaskEvent};
use crate::queue::{caps, promote};

const BURY: Stmt = Stmt::write(
    "WITH t AS (DELETE FROM tasks WHERE id = $1 RETURNING *) \
     INSERT INTO dead_letters (id, queue, kind, payload, priority, attempts, max_attempts, execution_id, \
                               concurrency_key, fairness_key, fairness_weight, idempotency_key, \
                               last_error, enqueued_at) \
     SELECT id, queue, kind, payload, priority, attempts, max_attempts, execution_id, concurrency_key, \
            fairness_key, fairness_weight, idempotency_key, $2, enqueued_at FROM t \
     RETURNING concurrency_key, execution_id, kind, attempts",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::TEXTOID],
);

/// Moves a running task to the dead letters and frees its slot; its
/// execution hears of it through `hooks` (a workflow task's execution fails).
pub fn bury(task_id: pgrx::Uuid, error: &str, hooks: &dyn ExecutionHooks) {
    let row: Option<(Option<String>, Option<pgrx::Uuid>, String, i32)> = Spi::connect_mut(|client| {
        let row = run(client, &BURY, &[task_id.into(), error.into()]).next()?;
        Some((
            row.get::<String>(1).or_internal("burying a task"),
            row.get::<pgrx::Uuid>(2).or_internal("burying a task"),
            row.get::<String>(3)
                .or_internal("burying a task")
                .unwrap_or_default(),
            row.get::<i32>(4).or_internal("burying a task").unwrap_or(0),
        ))
    });
    let Some((key, execution_id, kind, attempts)) = row else {
        return;
    };
    if let Some(key) = key {
        caps::release(&key, 1);
    }
    if let Some(execution_id) = execution_id {
        hooks.task_outcome(TaskEvent {
            execution_id,
            task_id,
            kind: &kind,
            outcome: Outcome::DeadLettered { attempts, error },
        });
    }
}

/// Puts dead letters back in line with fresh attempts; returns how many moved.
/// Ids that are not dead letters are ignored, and so are (they stay dead
/// letters) one whose idempotency key an unfinished task holds again, and
/// one whose execution is not running or suspended.
/// The executions of those that moved hear of it through `hooks`.
/// (The statement reads `executions` itself: one statement decides which
/// dead letters may move.)
pub fn redrive(ids: Vec<pgrx::Uuid>, hooks: &dyn ExecutionHooks) -> i32 {
    let moved: Vec<(pgrx::Uuid, Option<String>, Option<pgrx::Uuid>)> = Spi::connect_mut(|client| {
        client
            .update(
                "WITH d AS (DELETE FROM dead_letters d WHERE id = ANY($1) \
                   AND NOT EXISTS (SELECT 1 FROM tasks t \
                                   WHERE t.queue = d.queue AND t.idempotency_key = d.idempotency_key) \
                   AND (d.execution_id IS NULL OR EXISTS (SELECT 1 FROM executions e \
                        WHERE e.id = d.execution_id AND e.state IN ('RUNNING', 'SUSPENDED'))) \
                   RETURNING *) \
                 INSERT INTO tasks (id, queue, kind, payload, priority, state, seq, enqueued_at, run_at, \
                                    attempts, max_attempts, execution_id, concurrency_key, fairness_key, \
                                    fairness_weight, idempotency_key, last_error) \
                 SELECT id, queue, kind, payload, priority, 'scheduled', nextval('task_seq'), enqueued_at, now(), \
                        0, max_attempts, execution_id, concurrency_key, fairness_key, fairness_weight, \
                        idempotency_key, last_error \
                 FROM d \
                 RETURNING id, concurrency_key, execution_id",
                None,
                &[ids.into()],
            )
            .or_internal("redriving dead letters")
            .filter_map(|row| {
                Some((
                    row.get::<pgrx::Uuid>(1).or_internal("redriving")?,
                    row.get::<String>(2).or_internal("redriving"),
                    row.get::<pgrx::Uuid>(3).or_internal("redriving"),
                ))
            })
            .collect()
    });
    let n = moved.len() as i32;
    let executions: Vec<pgrx::Uuid> = moved.iter().filter_map(|m| m.2).collect();
    if !executions.is_empty() {
        hooks.redriven(&executions);
    }
    promote::place(moved.into_iter().map(|m| (m.0, m.1)).collect());
    n
}
