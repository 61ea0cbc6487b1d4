//! `sheaf.maintain()`: every bounded sweep in one call, for pg_cron or a
//! worker loop. Claims already do the per-queue sweeps inline; this covers
//! queues nobody is claiming from (visiting only those with due or expired
//! work), timers of suspended executions, execution timeouts, due schedules,
//! rate-limit lines, expired mutex leases, the
//! registries, and retention.

use pgrx::prelude::*;

use crate::mutex;
use crate::queue::workers::{self, LIVE_SECS};
use crate::queue::{cancel, lease, progress, promote, queues, rate, ready};
use crate::workflow::hooks::EXECUTIONS;
use crate::workflow::{debounce, lifecycle, policy, retention, schedules, wake};

const PROMOTE_MAX: i64 = 10_000;
const REAP_MAX: i64 = 1_000;
const PRUNE_MAX: i64 = 10_000;
const WAKE_MAX: i64 = 1_000;
/// Overdue executions ended `TIMED_OUT` per call.
const TIMEOUT_MAX: i64 = 1_000;
/// Due schedules fired per call (each up to its catch-up policy's fires).
const SCHEDULE_MAX: i64 = 100;
/// Rate-limit lines whose head comes within the lookahead, per call, and the
/// units they time.
const RATE_BUCKETS_MAX: i64 = 1_000;
const RATE_UNITS_MAX: i64 = 100_000;
const RECLAIM_MAX: i64 = 1_000;
/// Ended runs (and, apart, dead letters) retention deletes per call.
const RETENTION_MAX: i64 = 1_000;

/// Runs every bounded sweep once and reports what each did.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn maintain() -> pgrx::JsonB {
    let mut promoted = 0;
    for q in promote::due_queues() {
        if promoted >= PROMOTE_MAX {
            break;
        }
        promoted += promote::due(&q, PROMOTE_MAX - promoted, None);
    }
    let reaped = lease::reap_all(REAP_MAX, &EXECUTIONS);
    let woken = wake::wake_due(WAKE_MAX);
    let timed_out = lifecycle::time_out_due(TIMEOUT_MAX);
    let schedules_fired = schedules::fire_due(SCHEDULE_MAX);
    let rate_units_timed = rate::sweep(RATE_BUCKETS_MAX, RATE_UNITS_MAX, &policy::current_pace);
    let rate_buckets_pruned = rate::prune(PRUNE_MAX);
    let pending_starts_pruned = debounce::prune(PRUNE_MAX);
    let mutexes_reclaimed = mutex::reclaim(RECLAIM_MAX);
    let workers_pruned = workers::prune(PRUNE_MAX);
    let fairness_keys_pruned = ready::prune_fairness_keys(PRUNE_MAX);
    let cancellations_pruned = cancel::prune(PRUNE_MAX);
    let progress_pruned = progress::prune(PRUNE_MAX);
    let policy = retention::policy();
    let retained = retention::prune(&policy, RETENTION_MAX, &EXECUTIONS);
    let schedule_fires_pruned = policy
        .schedule_fires
        .secs()
        .map_or(0, |secs| schedules::prune_fires(secs, PRUNE_MAX));
    let idle_queues_dropped = policy.idle_queues.secs().map_or(0, queues::expire_idle);
    pgrx::JsonB(serde_json::json!({
        "promoted": promoted,
        "reaped": reaped,
        "woken": woken,
        "timed_out": timed_out,
        "schedules_fired": schedules_fired,
        "rate_units_timed": rate_units_timed,
        "rate_buckets_pruned": rate_buckets_pruned,
        "pending_starts_pruned": pending_starts_pruned,
        "schedule_fires_pruned": schedule_fires_pruned,
        "mutexes_reclaimed": mutexes_reclaimed,
        "workers_pruned": workers_pruned,
        "fairness_keys_pruned": fairness_keys_pruned,
        "cancellations_pruned": cancellations_pruned,
        "progress_pruned": progress_pruned,
        "retention": retained.to_json(),
        "idle_queues_dropped": idle_queues_dropped,
        "live_worker_secs": LIVE_SECS,
    }))
}
