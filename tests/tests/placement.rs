//! Placement in SQL (issue 37): the suite's own 3 shards (a topology
//! published here would be enforced on the other suites' clients). The
//! driver publishes its topology as a projection; every shard computes the
//! same digest from it, and every shard's placement functions
//! (`place_start`, `place_task`, `place_mutex`, `locate_id`) answer as the
//! driver's router does, locally, for many keys under a topology with a
//! reserved shard, a residency map and a forward.

use std::sync::Arc;

use serde_json::json;
use sheaf_driver::{
    Client, ExecutionId, MutexKey, Placement, PoolOptions, ShardId, Topology, TopologyBuilder,
};

fn own(args: &[&str]) -> String {
    sheaf_tests::own_shards("placement", 23700, args)
}

fn client(builder: TopologyBuilder) -> Arc<Client> {
    let topology = builder.build().expect("a topology");
    Arc::new(Client::new(topology, PoolOptions::default()).expect("a client"))
}

/// What a placement call answers on `db`: the shard, or the SQLSTATE of a refusal.
async fn ask(
    db: &tokio_postgres::Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Option<i32>, String> {
    match db.query_one(sql, params).await {
        Ok(row) => Ok(row.get(0)),
        Err(e) => Err(sheaf_tests::code(&e).unwrap_or("none").to_owned()),
    }
}

fn owner(r: Result<ShardId, sheaf_driver::RouteError>) -> Result<Option<i32>, String> {
    r.map(|s| Some(i32::from(s.get())))
        .map_err(|_| "22023".to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shard_places_work_as_the_router_does() {
    let spec = own(&["up", "--count", "3", "--no-install"]);
    let fleet = || TopologyBuilder::from_spec(&spec).expect("own shards");
    let plain: Topology = fleet().build().expect("a topology");
    let ids: Vec<u32> = plain.shards().map(|s| u32::from(s.id.get())).collect();
    let (a, b, c) = (ids[0], ids[1], ids[2]);
    // One reserved shard (pinned work only), a residency map, a forward of
    // a retired shard's ids.
    let cl = client(
        fleet()
            .reserved([c])
            .residency("eu", c)
            .residency("us", b)
            .forward(9, a),
    );
    let topology = cl.topology().clone();
    let report = cl.admin().publish_topology(false).await;
    assert!(report.is_complete(), "{:?}", report.failed);
    for (shard, (digest, previous)) in &report.ok {
        assert_eq!(
            digest,
            &topology.digest(),
            "shard {shard} hashed the projection alike"
        );
        assert_eq!(previous, &None);
    }

    let placements = [
        (Placement::Auto, None),
        (Placement::Auto, Some("acme")),
        (Placement::RoutingKey("route-1".into()), None),
        (Placement::ResidencyKey("eu".into()), None),
        (Placement::ResidencyKey("us".into()), Some("acme")),
        (Placement::ResidencyKey("mars".into()), None),
        (Placement::Shard(ShardId::new(c).unwrap()), Some("acme")),
        (Placement::Shard(ShardId::new(a).unwrap()), None),
        (Placement::Shard(ShardId::new(77).unwrap()), None),
    ];
    for shard in topology.shards() {
        let db = sheaf_tests::connect(shard).await;
        same_answers(&db, &cl, &placements).await;
    }
    own(&["down"]);
}

fn placement_json(p: &Placement, tenant: Option<&str>) -> serde_json::Value {
    let mut v = match p {
        Placement::Shard(s) => json!({"shard": s.get()}),
        Placement::ResidencyKey(k) => json!({"residency_key": k}),
        Placement::RoutingKey(k) => json!({"routing_key": k}),
        _ => json!({}),
    };
    if let Some(t) = tenant {
        v["tenant"] = json!(t);
    }
    v
}

/// Shard `db`'s placement functions answer as `cl`'s router, for many keys.
async fn same_answers(db: &tokio_postgres::Client, cl: &Client, placements: &[(Placement, Option<&str>)]) {
    let topology = cl.topology();
    for i in 0..40 {
        let wf = format!("flow-{}", i % 3);
        let id = format!("key-{i}");
        for (p, tenant) in placements {
            let opts = json!({"placement": placement_json(p, *tenant)});
            let sql = ask(db, "SELECT sheaf.place_start($1, $2, $3)", &[&wf, &id, &opts]).await;
            assert_eq!(
                sql,
                owner(topology.place(&wf, &id, p, *tenant)),
                "{wf} {id} {p:?} {tenant:?}"
            );
        }
        // Debounced: by the debounce key alone.
        let opts = json!({"debounce": {"key": id, "window": "1s"}});
        let sql = ask(db, "SELECT sheaf.place_start($1, 'any', $2)", &[&wf, &opts]).await;
        let routed = topology.place(&format!("debounce:{wf}"), &id, &Placement::Auto, None);
        assert_eq!(sql, owner(routed));
        // Keyed tasks: by (queue, idempotency key), then (rate:<limit>, rate key).
        let opts = json!({"idempotency_key": id});
        let sql = ask(db, "SELECT sheaf.place_task('mail', $1)", &[&opts]).await;
        assert_eq!(sql, owner(topology.place("mail", &id, &Placement::Auto, None)));
        let opts = json!({"rate_limit": "smtp", "rate_key": id});
        let sql = ask(db, "SELECT sheaf.place_task('mail', $1)", &[&opts]).await;
        assert_eq!(
            sql,
            owner(topology.place("rate:smtp", &id, &Placement::Auto, None))
        );
        // Mutex keys.
        let key = MutexKey::new(id.clone());
        let sql = ask(db, "SELECT sheaf.place_mutex($1)", &[&id]).await;
        assert_eq!(sql, Ok(Some(i32::from(cl.mutex_shard(&key).get()))));
    }
    let nothing = ask(db, "SELECT sheaf.place_task('mail', '{}')", &[]).await;
    assert_eq!(nothing, Ok(None), "an unkeyed task goes to any writable shard");
    // Ids minted on each shard, and on a retired one.
    for origin in topology.shards().map(|s| s.id).chain([ShardId::new(9).unwrap()]) {
        let id = ExecutionId::mint(origin).expect("an id");
        let sql = ask(db, "SELECT sheaf.locate_id($1)", &[&id.as_uuid()]).await;
        assert_eq!(sql, Ok(Some(i32::from(id.route(topology).get()))), "{origin}");
    }
}
