//! A shard whose schema this driver does not work with is reported as such,
//! by status and by every call, before anything is sent to it: never a
//! 42883 (undefined function) halfway through a call.

use std::time::Duration;

use sheaf_driver::{Client, ClientError, PoolOptions, ShardError, ShardId, Topology};
use sheaf_tests::{fleet, own_database, unique};

/// A scratch database on shard 0's cluster, its URL, and a topology that
/// calls it shard 7.
async fn scratch(with_extension: bool) -> (String, String, Topology) {
    let shard = fleet().shards().next().expect("a shard");
    let db = unique("schema").replace('-', "_");
    let c = own_database::recreate(&shard.url, &db).await;
    let url = format!(
        "{}/{db}",
        shard.url.rsplit_once('/').expect("a database in the URL").0
    );
    if with_extension {
        c.batch_execute(
            "CREATE EXTENSION sheaf; SELECT sheaf.init_shard(7); \
             UPDATE pg_extension SET extversion = '9.9.9' WHERE extname = 'sheaf'",
        )
        .await
        .expect("a shard on a schema version from the future");
    }
    let topology = Topology::parse(&format!("7={url}")).expect("topology");
    (db, url, topology)
}

async fn drop_db(db: &str) {
    own_database::drop(&fleet().shards().next().expect("a shard").url, db).await;
}

#[tokio::test]
async fn a_shard_on_an_unknown_schema_is_refused_by_name() {
    for with_extension in [true, false] {
        let (db, _, topology) = scratch(with_extension).await;
        let client = Client::new(topology, PoolOptions::default()).expect("client");
        let shard = ShardId::new(7).expect("id");
        let e = client
            .claim(shard, "q", "w", 1, Duration::from_secs(30))
            .await
            .expect_err("the schema is not one the driver works with");
        let expected = if with_extension { Some("9.9.9") } else { None };
        match &e {
            ClientError::Shard {
                error: ShardError::IncompatibleSchema { shard: s, schema },
                ..
            } => {
                assert_eq!(*s, shard);
                assert_eq!(schema.as_deref(), expected);
            }
            other => panic!("expected IncompatibleSchema, got {other:?}"),
        }
        let text = e.to_string();
        assert!(text.contains("shard 7"), "{text}");
        if with_extension {
            assert!(
                text.contains("9.9.9") && text.contains("ALTER EXTENSION sheaf UPDATE"),
                "{text}"
            );
        } else {
            assert!(text.contains("not installed"), "{text}");
        }

        let status = client.admin().topology_status(Duration::from_secs(5)).await;
        let probe = &status.shards[0].probe;
        assert!(probe.reachable);
        assert!(!probe.schema_compatible);
        assert!(!probe.healthy());
        let problem = probe.problem.as_deref().unwrap_or_default();
        assert!(
            problem.contains(if with_extension { "9.9.9" } else { "not installed" }),
            "{problem}"
        );
        drop(client);
        drop_db(&db).await;
    }
}

#[tokio::test]
async fn the_fleet_runs_a_schema_this_driver_works_with() {
    let client = Client::new(fleet().clone(), PoolOptions::default()).expect("client");
    let status = client.admin().topology_status(Duration::from_secs(5)).await;
    for s in &status.shards {
        assert!(s.probe.schema_compatible, "{:?}", s.probe);
    }
}
