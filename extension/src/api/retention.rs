//! Retention: `set_retention`, `retention`, and the relay's marks
//! `relay_pulled` and `seal_run_ended` (with `seals_due`). `maintain`
//! applies the policy.

use pgrx::prelude::*;
use sheaf_core::retention::Retention;

use crate::base::args::{page_rows, required};
use crate::base::audit;
use crate::base::errors::{bad_argument, not_ready};
use crate::base::jsonb::Jsonb;
use crate::workflow::retention;

/// The most seals one `seals_due` returns.
const MAX_SEALS: i32 = 1000;

/// Sets how long this shard keeps what has ended, and returns the whole
/// policy: `{"executions": "30days", "dead_letters": "14days", "seals":
/// "90days", "idle_queues": "7days", "workflows": {"<name>":
/// {"executions": "365days"}}}`. Fields
/// not given stay as they were; `null` (or `"forever"`) keeps forever, the
/// default. Durations: `30days`, `12h`, whole seconds; 1 minute to 100
/// years. `maintain` deletes what is past it in bounded batches.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn set_retention(opts: Option<Jsonb>) -> pgrx::JsonB {
    let patch = required(opts, "opts").parse("opts");
    if !retention::enabled() {
        not_ready("this shard's catalog predates set_retention: run ALTER EXTENSION sheaf UPDATE");
    }
    let mut policy = retention::policy();
    if let Err(e) = policy.merge(&patch) {
        bad_argument(&e.field, e.why);
    }
    retention::store(&policy);
    let json = policy.to_json();
    audit::record("set_retention", "retention", "ok", json.clone());
    pgrx::JsonB(json)
}

/// This shard's retention policy, as `set_retention` returns it.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn retention() -> pgrx::JsonB {
    let policy: Retention = retention::policy();
    pgrx::JsonB(policy.to_json())
}

/// The relay pulled ended child `child_id`'s end into its parent's history
/// on another shard: retention may delete the child now. True if this
/// marked it; false for a run not ended or marked already. A child that
/// moved is forwarded (55000 with DETAIL `moved_to`).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn relay_pulled(child_id: Option<pgrx::Uuid>) -> bool {
    let id = required(child_id, "child_id");
    retention::pulled(id)
}

/// Up to `max_rows` (1..1000) seals here past their `seals` window whose
/// run the relay has not found ended yet, oldest move first: the relay
/// follows each forward, and sends `seal_run_ended` for a run that ended
/// (or is gone) where it lives. Retention deletes no seal before: it is
/// the only forward for ids of this shard.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn seals_due(
    max_rows: default!(Option<i32>, 100),
) -> TableIterator<'static, (name!(execution_id, pgrx::Uuid), name!(moved_to, Option<i32>))> {
    TableIterator::new(
        retention::seals_due(page_rows(max_rows, MAX_SEALS))
            .into_iter()
            .map(|s| (s.execution_id, s.moved_to)),
    )
}

/// The relay found seal `execution_id`'s run ended where it lives (or gone
/// from there): retention may delete the seal once its window has passed.
/// False if `execution_id` is not a seal here.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn seal_run_ended(execution_id: Option<pgrx::Uuid>) -> bool {
    retention::seal_run_ended(required(execution_id, "execution_id"))
}
