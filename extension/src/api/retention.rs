//! Retention: `set_retention`, `retention`, and the relay's mark
//! `relay_pulled`. `maintain` applies the policy.

use pgrx::prelude::*;
use sheaf_core::retention::Retention;

use crate::base::args::required;
use crate::base::audit;
use crate::base::errors::{bad_argument, not_ready};
use crate::base::jsonb::Jsonb;
use crate::workflow::retention;

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
