//! The fleet's topology digest on this shard: published by an operator,
//! read back for status.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

use crate::base::args::required;
use crate::base::audit;
use crate::base::errors::bad_argument;
use crate::base::topology;

/// Publishes the fleet's topology digest (`sha256:` and 64 hex digits, as
/// `sheaf topology digest` prints it) on this shard: from now on placed
/// work (starts, enqueues, children) from a client that declares another
/// digest is refused (55000). The digest it replaces stays accepted as
/// `previous` while a change rolls out, unless `keep_previous` is false.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn publish_topology(
    topology_digest: Option<&str>,
    keep_previous: default!(Option<bool>, true),
) -> TableIterator<'static, (name!(digest, String), name!(previous, Option<String>))> {
    let digest = required(topology_digest, "topology_digest");
    if !sheaf_core::digest::is_digest(digest) {
        bad_argument(
            "topology_digest",
            format!(
                "must be sha256: and 64 lowercase hex digits, got {} bytes",
                digest.len()
            ),
        );
    }
    let keep = required(keep_previous, "keep_previous");
    let topology::Accepted {
        digest: now,
        previous,
    } = topology::publish(digest, keep);
    audit::record(
        "publish_topology",
        &now,
        "ok",
        serde_json::json!({"previous": previous}),
    );
    TableIterator::once((now, previous))
}

/// The digest published on this shard, the previous one still accepted,
/// and when; no row if none was published.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn published_topology() -> TableIterator<
    'static,
    (
        name!(digest, String),
        name!(previous, Option<String>),
        name!(published_at, TimestampWithTimeZone),
    ),
> {
    TableIterator::new(topology::published().map(|p| (p.digest, p.previous, p.at)))
}
