//! `sheaf.maintain()`: every bounded sweep in one call, for pg_cron or a
//! worker loop. Claims already do the per-queue sweeps inline; this covers
//! queues nobody is claiming from, timers of suspended executions, expired
//! mutex leases, and the registries.

use pgrx::prelude::*;

use crate::errors::SpiResultExt;
use crate::workers::LIVE_SECS;
use crate::{lease, lifecycle, mutex, promote, queue};

const PROMOTE_MAX: i64 = 10_000;
const REAP_MAX: i64 = 1_000;
const PRUNE_MAX: i64 = 10_000;
const WAKE_MAX: i64 = 1_000;
const RECLAIM_MAX: i64 = 1_000;

/// Runs every bounded sweep once and reports what each did.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn maintain() -> pgrx::JsonB {
    let mut promoted = 0;
    for q in queue::names() {
        if promoted >= PROMOTE_MAX {
            break;
        }
        promoted += promote::due(&q, PROMOTE_MAX - promoted);
    }
    let reaped = lease::reap_all(REAP_MAX);
    let woken = lifecycle::wake_due(WAKE_MAX);
    let mutexes_reclaimed = mutex::reclaim(RECLAIM_MAX);
    // Workers silent for a day are gone, not just late.
    let workers_pruned = Spi::get_one_with_args::<i64>(
        "WITH d AS (DELETE FROM workers WHERE name IN (\
           SELECT name FROM workers WHERE last_seen_at < now() - interval '1 day' LIMIT $1) RETURNING 1) \
         SELECT count(*) FROM d",
        &[PRUNE_MAX.into()],
    )
    .or_internal("pruning workers")
    .unwrap_or(0);
    // A key whose finish tag is behind the virtual time behaves exactly like
    // a key never seen, so its row can go.
    let fairness_keys_pruned = Spi::get_one_with_args::<i64>(
        "WITH d AS (DELETE FROM fairness_keys f WHERE (f.queue, f.key) IN (\
           SELECT f2.queue, f2.key FROM fairness_keys f2 JOIN queues q ON q.name = f2.queue \
           WHERE f2.finish <= q.vtime LIMIT $1) RETURNING 1) \
         SELECT count(*) FROM d",
        &[PRUNE_MAX.into()],
    )
    .or_internal("pruning fairness keys")
    .unwrap_or(0);
    pgrx::JsonB(serde_json::json!({
        "promoted": promoted,
        "reaped": reaped,
        "woken": woken,
        "mutexes_reclaimed": mutexes_reclaimed,
        "workers_pruned": workers_pruned,
        "fairness_keys_pruned": fairness_keys_pruned,
        "live_worker_secs": LIVE_SECS,
    }))
}
