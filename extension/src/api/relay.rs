//! The relay's primitives (the driver's relay calls them; see
//! `cross_shard_children` in sql/schema.sql for the edges).

use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use sheaf_core::children::{CloseKind, Report};
use sheaf_core::excerpt::quoted;

use crate::api::executions::check_workflow_id;
use crate::base::args::{self, required};
use crate::base::errors::bad_argument;
use crate::base::jsonb::Jsonb;
use crate::workflow::{policy, relay};

/// The most lifecycle rows one `relay_take` leases.
const MAX_TAKE: i32 = 1000;
/// The most child ids one `relay_take` names.
const MAX_NAMED: usize = 1000;

/// Leases up to `max_rows` (1..1000) lifecycle rows on this shard for
/// `lease`: the due ones, or those of `child_ids` (due or not) that no other
/// relay holds. `lease_token` fences the caller's `relay_report`.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn relay_take(
    max_rows: default!(Option<i32>, 100),
    lease: default!(Option<Interval>, "'30 seconds'"),
    child_ids: default!(Option<Vec<Option<pgrx::Uuid>>>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(child_id, pgrx::Uuid),
        name!(parent_id, pgrx::Uuid),
        name!(target_shard, i32),
        name!(state, String),
        name!(workflow_name, String),
        name!(workflow_id, String),
        name!(input, Option<pgrx::JsonB>),
        name!(close_requested, Option<String>),
        name!(close_reason, Option<String>),
        name!(close_delivered, bool),
        name!(parent_ended, bool),
        name!(attempts, i32),
        name!(lease_token, i64),
    ),
> {
    let max_rows = args::page_rows(max_rows, MAX_TAKE);
    let lease_secs = args::lease_secs("lease", required(lease, "lease"));
    let named = child_ids.map(|ids| {
        if ids.len() > MAX_NAMED {
            bad_argument(
                "child_ids",
                format!("must name at most {MAX_NAMED} children, got {}", ids.len()),
            );
        }
        args::no_nulls(ids, "child_ids")
    });
    TableIterator::new(relay::take(max_rows, lease_secs, named).into_iter().map(|t| {
        (
            t.child_id,
            t.parent_id,
            t.target_shard,
            t.state,
            t.workflow_name,
            t.workflow_id,
            t.input,
            t.close_requested,
            t.close_reason,
            t.close_delivered,
            t.parent_ended,
            t.attempts,
            t.lease_token,
        )
    }))
}

/// Records what an edge did for lifecycle row `child_id`, held under
/// `lease_token`. `outcome` has one key: `started` (true), `conflict` (the
/// active run's id), `refused` (the message), `closed` (true or false),
/// `ended` ({state, result, error}), `pending` (seconds until the next look)
/// or `failed` (the error; backs off). Returns `held`, `released`, `settled`
/// or `stale` (the lease is not the caller's: nothing changed).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn relay_report(
    child_id: Option<pgrx::Uuid>,
    lease_token: Option<i64>,
    outcome: Option<Jsonb>,
) -> &'static str {
    let child = required(child_id, "child_id");
    let token = required(lease_token, "lease_token");
    let outcome = required(outcome, "outcome").checked("outcome");
    let r =
        Report::parse(&outcome.clone().parse("outcome")).unwrap_or_else(|e| bad_argument(&e.option, e.why));
    relay::report(child, token, &r, outcome)
}

/// Starts child `child_id` (minted for this shard) of `parent_id` (on
/// another shard) by its id: `outcome` `started`, `exists` (started
/// before), or `conflict` with `execution_id` the active run of its (name,
/// workflow id), not adopted. Gates and quotas refuse as for any start.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn relay_start_child(
    child_id: Option<pgrx::Uuid>,
    parent_id: Option<pgrx::Uuid>,
    name: Option<&str>,
    workflow_id: Option<&str>,
    input: Option<Jsonb>,
) -> TableIterator<'static, (name!(outcome, &'static str), name!(execution_id, pgrx::Uuid))> {
    let child = required(child_id, "child_id");
    let parent = required(parent_id, "parent_id");
    let name = policy::check_name(name);
    let workflow_id = check_workflow_id(workflow_id);
    let input = required(input, "input").checked("input");
    TableIterator::once(relay::start_remote(child, parent, name, workflow_id, input))
}

/// Closes child `child_id` of `parent_id` here, `how` `cancel` or
/// `terminate`; `false` if it had ended. An execution that is not that
/// parent's child is refused.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn relay_close_child(
    child_id: Option<pgrx::Uuid>,
    parent_id: Option<pgrx::Uuid>,
    how: Option<&str>,
    reason: default!(Option<&str>, "NULL"),
) -> bool {
    let child = required(child_id, "child_id");
    let parent = required(parent_id, "parent_id");
    let how = required(how, "how");
    let how = CloseKind::parse(how)
        .unwrap_or_else(|| bad_argument("how", format!("must be cancel or terminate, got {}", quoted(how))));
    relay::close_remote(child, parent, how, reason.map(str::to_owned))
}

/// This shard's lifecycle rows by target shard, state and requested close:
/// how many, how many failing, the oldest, the most attempts, the latest error.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn relay_backlog() -> TableIterator<
    'static,
    (
        name!(target_shard, i32),
        name!(state, String),
        name!(close_requested, Option<String>),
        name!(rows, i64),
        name!(failing, i64),
        name!(oldest, TimestampWithTimeZone),
        name!(max_attempts, i32),
        name!(last_error, Option<String>),
    ),
> {
    TableIterator::new(relay::backlog().into_iter().map(|b| {
        (
            b.target_shard,
            b.state,
            b.close_requested,
            b.rows,
            b.failing,
            b.oldest,
            b.max_attempts,
            b.last_error,
        )
    }))
}
