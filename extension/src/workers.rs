//! The live-worker registry: which queues have a worker right now.

use pgrx::prelude::*;

use crate::errors::{SpiResultExt, bad_argument, no_nulls, required};
use crate::{lease, queue};

/// A worker is live while its last heartbeat is younger than this.
pub const LIVE_SECS: i32 = 60;

/// Records that `worker` is alive and serving `queues`. Call it more often
/// than every 60 seconds.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn worker_heartbeat(worker: Option<&str>, queues: Option<Vec<Option<String>>>) {
    let worker = lease::check_worker(worker);
    let queues = required(queues, "queues");
    if queues.len() > 1_000 {
        bad_argument(
            "queues",
            format!("must hold at most 1000 names, got {}", queues.len()),
        );
    }
    let queues = no_nulls(queues, "queues");
    for q in &queues {
        queue::check_name(Some(q));
    }
    Spi::run_with_args(
        "INSERT INTO workers (name, queues, last_seen_at) VALUES ($1, $2, now()) \
         ON CONFLICT (name) DO UPDATE SET queues = excluded.queues, last_seen_at = excluded.last_seen_at",
        &[worker.into(), queues.into()],
    )
    .or_internal("recording a worker heartbeat");
}
