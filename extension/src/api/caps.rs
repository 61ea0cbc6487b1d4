//! Concurrency caps: setting one, and reading every key's use of its slots.

use pgrx::prelude::*;
use sheaf_core::options::check_concurrency_key;

use crate::base::args::required;
use crate::base::audit;
use crate::base::errors::bad_argument;
use crate::queue::{caps, stats};

/// Sets the cap of a concurrency key (`max_running` NULL removes it). Keys
/// are one namespace per shard, across queues. Lowering a cap never lets
/// running exceed it: ready tasks beyond the new cap go back to waiting;
/// running tasks finish. Raising or removing it promotes waiting tasks
/// (removing promotes all of them, in this transaction).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn set_concurrency_limit(key: Option<&str>, max_running: Option<i32>) {
    let key = required(key, "key");
    if let Err(why) = check_concurrency_key(key) {
        bad_argument("key", why);
    }
    if let Some(m) = max_running
        && m < 0
    {
        bad_argument(
            "max_running",
            format!("must be >= 0 (or NULL to remove the cap), got {m}"),
        );
    }
    caps::set_limit(key, max_running);
    audit::record(
        "set_concurrency_limit",
        key,
        "ok",
        serde_json::json!({"max_running": max_running}),
    );
}

/// Per concurrency key: its cap (NULL if uncapped) and how many of its tasks
/// are running, ready and waiting: the operator's view of every key. Lists
/// capped keys and keys with unfinished tasks.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn concurrency_stats() -> TableIterator<
    'static,
    (
        name!(concurrency_key, String),
        name!(max_running, Option<i32>),
        name!(running, i64),
        name!(ready, i64),
        name!(waiting, i64),
    ),
> {
    TableIterator::new(
        stats::concurrency()
            .into_iter()
            .map(|k| (k.key, k.max_running, k.running, k.ready, k.waiting)),
    )
}
