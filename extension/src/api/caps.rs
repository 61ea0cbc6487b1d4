//! Concurrency caps: setting one, and reading every key's use of its slots.

use pgrx::prelude::*;
use sheaf_core::options::{MAX_CONCURRENCY_KEY_BYTES, check_concurrency_key};

use crate::base::args::{self, required};
use crate::base::audit;
use crate::base::errors::bad_argument;
use crate::base::names::{self, Kind};
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
    // The name rule (`args::new_name`) on a cap set; removing one is a
    // lookup, and a key with a cap or slots in use keeps working.
    if max_running.is_some() {
        args::new_name(key, "key", MAX_CONCURRENCY_KEY_BYTES, || {
            names::stored(Kind::ConcurrencyKey, key)
        });
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
