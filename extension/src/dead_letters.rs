//! Dead letters: tasks whose attempts ran out, kept until redriven.

use pgrx::prelude::*;

use crate::errors::{SpiResultExt, bad_argument, no_nulls, required};
use crate::plans::{Stmt, run};
use crate::{concurrency, executions, history, lifecycle, promote, quota};

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

/// Moves a running task to the dead letters and frees its slot.
pub fn bury(task_id: pgrx::Uuid, error: &str) {
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
        concurrency::release(&key, 1);
    }
    if let Some(execution_id) = execution_id {
        history::append(
            execution_id,
            "TaskDeadLettered",
            serde_json::json!({"task_id": task_id.to_string(), "kind": kind, "attempts": attempts, "error": error}),
        );
        if let Some(quota_key) = executions::quota_key_of(execution_id) {
            quota::add(&quota_key, 0, 0, 1);
        }
        // A workflow task that ran out of attempts fails its execution.
        if kind == "workflow" && executions::state_of(execution_id).is_some() {
            lifecycle::close(
                execution_id,
                lifecycle::Close::Failed {
                    error: format!(
                        "workflow task {task_id} dead-lettered after {attempts} attempt(s): {error}"
                    ),
                },
            );
        }
    }
}

/// Puts dead letters back in line with fresh attempts; returns how many moved.
/// Ids that are not dead letters are ignored, and so are (they stay dead
/// letters) one whose idempotency key an unfinished task holds again, and
/// one whose execution is not running or suspended.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn redrive(task_ids: Option<Vec<Option<pgrx::Uuid>>>) -> i32 {
    let ids = required(task_ids, "task_ids");
    if ids.len() > 10_000 {
        bad_argument(
            "task_ids",
            format!("must hold at most 10000 ids, got {}", ids.len()),
        );
    }
    let ids = no_nulls(ids, "task_ids");
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
    let mut per_quota_key: std::collections::BTreeMap<String, i64> = Default::default();
    for execution_id in moved.iter().filter_map(|m| m.2) {
        if let Some(key) = executions::quota_key_of(execution_id) {
            *per_quota_key.entry(key).or_default() += 1;
        }
    }
    for (key, k) in per_quota_key {
        quota::add(&key, 0, 0, -k);
    }
    promote::place(moved.into_iter().map(|m| (m.0, m.1)).collect());
    n
}
