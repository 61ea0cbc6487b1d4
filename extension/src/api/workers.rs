//! The live-worker registry: heartbeats in, live workers out.

use pgrx::prelude::*;
use sheaf_core::options::MAX_KEY_BYTES;

use crate::base::args::{self, required};
use crate::base::errors::bad_argument;
use crate::base::list::List;
use crate::base::names::{self, Kind};
use crate::queue::{queues, workers};

/// Records that `worker` is alive and serving `queues`. Call it more often
/// than every 60 seconds.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn worker_heartbeat(worker: Option<&str>, queues: Option<List<String>>) {
    let worker = args::key(worker, "worker");
    // The name rule (`args::new_name`): a registered worker keeps beating.
    args::new_name(worker, "worker", MAX_KEY_BYTES, || {
        names::stored(Kind::Worker, worker)
    });
    let names = required(queues, "queues");
    if names.len() > 1_000 {
        bad_argument(
            "queues",
            format!("must hold at most 1000 names, got {}", names.len()),
        );
    }
    let names = names.into_items("queues");
    for q in &names {
        queues::check_name(Some(q));
    }
    workers::heartbeat(worker, names);
}

/// Takes `worker` out of the live-worker registry at once (a worker shutting
/// down), so its queues show as stranded now rather than 60 seconds later;
/// whether it was registered.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn worker_deregister(worker: Option<&str>) -> bool {
    workers::deregister(args::key(worker, "worker"))
}

/// The workers whose last heartbeat is younger than 60 seconds, and the
/// queues each serves. At most one row per worker name.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn live_workers() -> TableIterator<
    'static,
    (
        name!(worker, String),
        name!(queues, Vec<String>),
        name!(last_seen_at, pgrx::datum::TimestampWithTimeZone),
    ),
> {
    TableIterator::new(
        workers::live()
            .into_iter()
            .map(|w| (w.name, w.queues, w.last_seen_at)),
    )
}
