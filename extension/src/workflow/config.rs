//! What a fleet declares once and every shard should hold alike: workflow
//! policies, queue options that differ from the defaults, concurrency caps.
//! `sheaf.fleet_config()` returns this shard's, so the driver can apply one
//! file to every shard and show any drift between them.

use pgrx::prelude::*;

use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;

// Queues enqueued to without configuration keep the defaults (no aging, no
// fairness, notify on) and are left out: only what someone declared shows.
const SNAPSHOT: Stmt = Stmt::read(
    "SELECT jsonb_build_object( \
       'workflows', coalesce((SELECT jsonb_object_agg(workflow_name, policy) FROM workflow_policies), '{}'), \
       'queues', coalesce((SELECT jsonb_object_agg(name, jsonb_build_object( \
                               'aging_secs', aging_secs, 'fairness', fairness, 'notify', notify)) \
                           FROM queues WHERE aging_secs IS NOT NULL OR fairness OR NOT notify), '{}'), \
       'caps', coalesce((SELECT jsonb_object_agg(key, max_running) FROM concurrency_limits), '{}'))",
    &[],
);

/// This shard's declared configuration.
pub fn snapshot() -> Jsonb {
    SNAPSHOT.one_value(&[], "reading the fleet configuration")
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::init;
    use pgrx::prelude::*;
    use serde_json::json;

    #[pg_test]
    fn the_snapshot_holds_what_was_declared_and_nothing_else() {
        init();
        Spi::run("SELECT sheaf.enqueue('plain', '{}')").unwrap();
        Spi::run("SELECT sheaf.configure_queue('slow', '{\"aging_secs\": 60}')").unwrap();
        Spi::run("SELECT sheaf.set_concurrency_limit('tenant-a', 4)").unwrap();
        Spi::run("SELECT sheaf.declare_workflow('w', '{\"queue\": \"slow\"}')").unwrap();
        let got = Spi::get_one::<pgrx::JsonB>("SELECT sheaf.fleet_config()")
            .unwrap()
            .unwrap()
            .0;
        assert_eq!(
            got["queues"],
            json!({"slow": {"aging_secs": 60, "fairness": false, "notify": true}})
        );
        assert_eq!(got["caps"], json!({"tenant-a": 4}));
        assert_eq!(got["workflows"]["w"]["queue"], "slow");
    }
}
