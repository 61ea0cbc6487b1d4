//! Erasing an execution's payloads on this shard (`workflow::erase`).

use pgrx::prelude::*;

use crate::base::args::required;
use crate::base::jsonb::Jsonb;
use crate::workflow::erase;

/// Erases the payloads of an execution on this shard (admin): its input,
/// result, error and every event's payload, and those of its tasks, dead
/// letters, outbox rows and unstarted cross-shard children, become
/// `{"erased": true}` (the one exception to append-only history). A run
/// that lives here must have ended (55000); a seal of a run that moved is
/// erased as it is. Returns `{"found": false}` when this shard holds no
/// row of it, else `{"found": true, "state", "events", "rows",
/// "bytes_before", "bytes_after", "migrated_from_shards"}` (the shards it
/// lived on before). `Client::erase_payloads` runs it on every shard: a
/// drain hands seals to shards a run never lived on.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn erase_payloads(execution_id: Option<pgrx::Uuid>) -> Jsonb {
    let id = required(execution_id, "execution_id");
    let report = match erase::erase(id) {
        None => serde_json::json!({"found": false}),
        Some(mut r) => {
            r["found"] = serde_json::Value::Bool(true);
            r
        }
    };
    Jsonb::from_value(report)
}
