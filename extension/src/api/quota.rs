//! Quotas: a key's counters, and recounting them.

use pgrx::prelude::*;

use crate::base::args;
use crate::workflow::quota;

/// A quota key's usage, from its counters (zeros for a key never seen).
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn quota_usage(
    key: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(active_executions, i64),
        name!(history_bytes, i64),
        name!(dead_letters, i64),
    ),
> {
    let u = quota::usage(args::key(key, "key"));
    TableIterator::once((u.active, u.bytes, u.dead))
}

/// Recounts a quota key's usage from the executions and dead letters, stores
/// it in the counters, and returns it. Comparing it with `quota_usage` taken
/// just before shows whether the counters drifted.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn quota_recompute(
    key: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(active_executions, i64),
        name!(history_bytes, i64),
        name!(dead_letters, i64),
    ),
> {
    let u = quota::recompute(args::key(key, "key"));
    TableIterator::once((u.active, u.bytes, u.dead))
}
