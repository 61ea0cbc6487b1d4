//! The live-worker registry: which queues have a worker right now.

use pgrx::prelude::*;

use crate::base::plans::Stmt;
use crate::base::rows::row;

/// A worker is live while its last heartbeat is younger than this.
pub const LIVE_SECS: i32 = 60;

const HEARTBEAT: Stmt = Stmt::write(
    "INSERT INTO workers (name, queues, last_seen_at) VALUES ($1, $2, now()) \
     ON CONFLICT (name) DO UPDATE SET queues = excluded.queues, last_seen_at = excluded.last_seen_at",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::TEXTARRAYOID],
);
const DEREGISTER: Stmt = Stmt::write(
    "WITH d AS (DELETE FROM workers WHERE name = $1 RETURNING 1) SELECT count(*) > 0 FROM d",
    &[PgBuiltInOids::TEXTOID],
);
const LIVE: Stmt = Stmt::read(
    "SELECT name, queues, last_seen_at FROM workers \
     WHERE last_seen_at > now() - make_interval(secs => $1) ORDER BY name",
    &[PgBuiltInOids::FLOAT8OID],
);
// Workers silent for a day are gone, not just late.
const PRUNE: Stmt = Stmt::write(
    "WITH d AS (DELETE FROM workers WHERE name IN (\
       SELECT name FROM workers WHERE last_seen_at < now() - interval '1 day' LIMIT $1) RETURNING 1) \
     SELECT count(*) FROM d",
    &[PgBuiltInOids::INT8OID],
);

/// Records that `worker` (validated) is alive and serving `queues`.
pub fn heartbeat(worker: &str, queues: Vec<String>) {
    HEARTBEAT.exec(&[worker.into(), queues.into()]);
}

/// Takes `worker` (validated) out of the registry; whether it was in it.
pub fn deregister(worker: &str) -> bool {
    DEREGISTER.one_value(&[worker.into()], "deregistering a worker")
}

row! {
    /// A live worker: its name, the queues it serves, when it was last seen.
    pub struct Live {
        pub name: String,
        pub queues: Vec<String>,
        pub last_seen_at: pgrx::datum::TimestampWithTimeZone,
    }
}

/// The workers whose last heartbeat is younger than `LIVE_SECS`.
pub fn live() -> Vec<Live> {
    LIVE.all(&[(LIVE_SECS as f64).into()], "reading live workers")
}

/// Deletes up to `max` workers silent for a day; returns how many.
pub fn prune(max: i64) -> i64 {
    PRUNE.one_value(&[max.into()], "pruning workers")
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
