//! Completing claimed tasks: validate, complete, report.

use pgrx::prelude::*;

use crate::base::args::{self, required};
use crate::base::errors::{bad_argument, require_read_committed};
use crate::base::jsonb::Jsonb;
use crate::base::list::List;
use crate::queue::complete;
use crate::workflow::continuation;
use crate::workflow::hooks::{self, EXECUTIONS};
use crate::workflow::lifecycle::Close;

/// Completes a task claimed under `token`. A stale token (the lease was lost)
/// raises 55P03, a task that is gone (finished, or never there) P0002; either
/// changes nothing.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn complete(task_id: Option<pgrx::Uuid>, token: Option<i64>, result: default!(Option<Jsonb>, "NULL")) {
    let task_id = required(task_id, "task_id");
    let token = required(token, "token");
    let result = result.map(|r| r.sized("result").parse("result"));
    complete::complete(task_id, token, result, &EXECUTIONS);
}

/// Completes a task of an execution claimed under `token` and completes its
/// execution with `result`, in one transaction: the history gets the task's
/// `TaskCompleted` (with `result`), then `WorkflowCompleted`. For the
/// workflow task that decides its execution is done (ending the execution
/// first would cancel the task, and its completion would be refused). A
/// stale token raises 55P03, a task that is gone P0002, a task of no
/// execution 55000.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn complete_task_and_execution(task_id: Option<pgrx::Uuid>, token: Option<i64>, result: Option<Jsonb>) {
    let task_id = required(task_id, "task_id");
    let token = required(token, "token");
    let result = result.map(|r| r.sized("result").parse("result"));
    hooks::close_with_task(task_id, token, result.clone(), Close::Completed { result });
}

/// Completes a task of an execution claimed under `token` and fails its
/// execution with `error`, in one transaction: the history gets the task's
/// `TaskCompleted`, then `WorkflowFailed`. A stale token raises 55P03, a
/// task of no execution 55000.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn complete_task_and_fail_execution(task_id: Option<pgrx::Uuid>, token: Option<i64>, error: Option<&str>) {
    let task_id = required(task_id, "task_id");
    let token = required(token, "token");
    let error = args::text(required(error, "error"), "error").to_owned();
    hooks::close_with_task(task_id, token, None, Close::Failed { error });
}

/// Completes a task of an execution claimed under `token` and continues
/// its execution as new with `input`, in one transaction (see
/// `continue_as_new`); returns the successor's id. For the workflow task
/// that decides its run goes on as a fresh one. A stale token raises 55P03,
/// a task that is gone P0002, a task of no execution 55000.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn complete_task_and_continue_as_new(
    task_id: Option<pgrx::Uuid>,
    token: Option<i64>,
    input: Option<Jsonb>,
) -> pgrx::Uuid {
    require_read_committed("complete_task_and_continue_as_new");
    let task_id = required(task_id, "task_id");
    let token = required(token, "token");
    let input = required(input, "input").sized("input");
    continuation::with_task(task_id, token, input)
}

/// Completes many tasks at once; reports each entry, in input order:
/// `completed = false` for a stale one (nothing changed for it), the rest
/// complete. At most 10,000 entries.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn complete_batch(
    task_ids: Option<List<pgrx::Uuid>>,
    tokens: Option<List<i64>>,
) -> TableIterator<'static, (name!(task_id, pgrx::Uuid), name!(completed, bool))> {
    let (ids, tokens) = finished(task_ids, tokens, 1);
    TableIterator::new(complete::complete_batch(ids, tokens, &EXECUTIONS))
}

/// Validates a batch of finished tasks: ids and tokens paired by position,
/// at least `min` and at most `complete::MAX_BATCH` of them.
pub(super) fn finished(
    task_ids: Option<List<pgrx::Uuid>>,
    tokens: Option<List<i64>>,
    min: usize,
) -> (Vec<pgrx::Uuid>, Vec<i64>) {
    let task_ids = required(task_ids, "task_ids");
    let tokens = required(tokens, "tokens");
    if task_ids.len() != tokens.len() {
        bad_argument(
            "tokens",
            format!(
                "must pair up with task_ids: {} ids, {} tokens",
                task_ids.len(),
                tokens.len()
            ),
        );
    }
    if task_ids.len() < min || task_ids.len() > complete::MAX_BATCH {
        bad_argument(
            "task_ids",
            format!(
                "must hold {min} to {} ids, got {}",
                complete::MAX_BATCH,
                task_ids.len()
            ),
        );
    }
    (task_ids.into_items("task_ids"), tokens.into_items("tokens"))
}
