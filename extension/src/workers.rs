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
    let rows = Spi::connect(|client| {
        client
            .select(
                "SELECT name, queues, last_seen_at FROM workers \
                 WHERE last_seen_at > now() - make_interval(secs => $1) ORDER BY name",
                None,
                &[(LIVE_SECS as f64).into()],
            )
            .or_internal("reading live workers")
            .map(|row| {
                let read = || -> Result<_, pgrx::spi::SpiError> {
                    Ok((
                        row.get::<String>(1)?.unwrap_or_default(),
                        row.get::<Vec<String>>(2)?.unwrap_or_default(),
                        row.get::<pgrx::datum::TimestampWithTimeZone>(3)?,
                    ))
                };
                read().or_internal("reading live workers")
            })
            .filter_map(|(name, queues, seen)| seen.map(|seen| (name, queues, seen)))
            .collect::<Vec<_>>()
    });
    TableIterator::new(rows)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::testing::{count, enqueue, init};

    #[pg_test]
    fn a_heartbeat_makes_a_worker_live_until_it_goes_quiet() {
        init();
        Spi::run("SELECT sheaf.worker_heartbeat('w1', ARRAY['a', 'b'])").unwrap();
        Spi::run("SELECT sheaf.worker_heartbeat('w2', ARRAY['c'])").unwrap();
        assert_eq!(count("SELECT count(*) FROM sheaf.live_workers()"), 2);
        assert_eq!(
            count(
                "SELECT count(*) FROM sheaf.live_workers() WHERE worker = 'w1' AND queues = ARRAY['a', 'b']"
            ),
            1
        );
        Spi::run("UPDATE sheaf.workers SET last_seen_at = now() - interval '61 seconds' WHERE name = 'w2'")
            .unwrap();
        assert_eq!(count("SELECT count(*) FROM sheaf.live_workers()"), 1);
    }

    #[pg_test]
    fn stranded_work_is_ready_work_no_live_worker_serves() {
        init();
        enqueue("served", serde_json::json!(1), serde_json::json!({}));
        enqueue("orphan", serde_json::json!(1), serde_json::json!({}));
        enqueue("orphan", serde_json::json!(2), serde_json::json!({}));
        enqueue(
            "later",
            serde_json::json!(1),
            serde_json::json!({"run_at": "2999-01-01T00:00:00Z"}),
        );
        Spi::run("SELECT sheaf.worker_heartbeat('w1', ARRAY['served'])").unwrap();
        assert_eq!(count("SELECT count(*) FROM sheaf.stranded_work()"), 1);
        assert_eq!(
            count("SELECT ready FROM sheaf.stranded_work() WHERE queue = 'orphan'"),
            2
        );
        // A worker that went quiet no longer covers its queue.
        Spi::run("UPDATE sheaf.workers SET last_seen_at = now() - interval '2 minutes'").unwrap();
        assert_eq!(count("SELECT count(*) FROM sheaf.stranded_work()"), 2);
    }
}
