//! Leases: giving a task back, extending its lease, reaping expired ones.

use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;

use crate::base::args::{self, required};
use crate::queue::lease;
use crate::workflow::hooks::EXECUTIONS;

/// Gives a claimed task back without spending an attempt (a draining worker).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn release(task_id: Option<pgrx::Uuid>, token: Option<i64>) {
    let task_id = required(task_id, "task_id");
    let token = required(token, "token");
    lease::release(task_id, token);
}

/// Extends a task's lease from now by `extend` (default: the lease it was
/// claimed with); returns the new lease end.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn heartbeat(
    task_id: Option<pgrx::Uuid>,
    token: Option<i64>,
    extend: default!(Option<Interval>, "NULL"),
) -> TimestampWithTimeZone {
    let task_id = required(task_id, "task_id");
    let token = required(token, "token");
    let extend = extend.map(|e| args::lease_secs("extend", e));
    lease::extend(task_id, token, extend)
}

/// Reaps up to `max_rows` expired leases across all queues; returns how many.
/// A task on its last attempt becomes a dead letter (and a workflow task's
/// execution fails).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn reap_expired(max_rows: default!(Option<i32>, 1000)) -> i32 {
    lease::reap_all(args::max_rows(max_rows), &EXECUTIONS) as i32
}
