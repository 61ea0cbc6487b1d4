//! Failing a claimed task: validate, record the attempt, say what comes next.

use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;

use crate::base::args::{self, required};
use crate::queue::retry;
use crate::workflow::hooks::EXECUTIONS;

/// Records a failed attempt of a task claimed under `token`. Until its
/// attempts run out it is retried after `retry_in`, or by default after an
/// exponential backoff with jitter (1 s, 2 s, 4 s … capped at 1 h, ±25%);
/// then it moves to the dead letters. Returns when it will run again (NULL
/// once dead-lettered). A stale token raises 55P03, a task that is gone
/// P0002; either changes nothing.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn fail(
    task_id: Option<pgrx::Uuid>,
    token: Option<i64>,
    error: Option<&str>,
    retry_in: default!(Option<Interval>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(retry_at, Option<TimestampWithTimeZone>),
        name!(dead_lettered, bool),
    ),
> {
    let task_id = required(task_id, "task_id");
    let token = required(token, "token");
    let error = args::text(required(error, "error"), "error");
    let retry_secs = retry_in.map(|r| args::delay_secs("retry_in", r, retry::MAX_RETRY_SECS));
    TableIterator::new(vec![retry::fail(task_id, token, error, retry_secs, &EXECUTIONS)])
}

/// Gives a task claimed under `token` back to run again after `delay` (0
/// to 365 days) without spending an attempt: the handler chose to wait (a
/// rate limit, a resource not ready yet), it did not fail. It holds no
/// concurrency slot while it waits; its execution's history is not written.
/// Returns when it runs again. A stale token raises 55P03, a task that is
/// gone P0002; either changes nothing.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn snooze(task_id: Option<pgrx::Uuid>, token: Option<i64>, delay: Option<Interval>) -> TimestampWithTimeZone {
    let task_id = required(task_id, "task_id");
    let token = required(token, "token");
    let delay = args::delay_secs("delay", required(delay, "delay"), retry::MAX_RETRY_SECS);
    retry::snooze(task_id, token, delay)
}

/// Moves a task claimed under `token` to the dead letters now, whatever
/// attempts it has left: a failure no retry can fix. As when its last
/// attempt fails, its slot is freed, its execution's history gets
/// `TaskDeadLettered`, and a workflow task's execution fails. A stale token
/// raises 55P03 and changes nothing.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn dead_letter(task_id: Option<pgrx::Uuid>, token: Option<i64>, error: Option<&str>) {
    let task_id = required(task_id, "task_id");
    let token = required(token, "token");
    let error = args::text(required(error, "error"), "error");
    retry::dead_letter(task_id, token, error, &EXECUTIONS);
}
