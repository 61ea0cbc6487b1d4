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

fn own_pair(args: &[&str]) -> String {
    sheaf_tests::own_shards("enforcement", 23800, args)
}

/// A workflow id of `wf` that `topology` places on `shard`.
fn id_owned_by(topology: &Topology, wf: &str, shard: ShardId) -> String {
    (0..10_000)
        .map(|n| format!("order-{n}"))
        .find(|id| topology.place(wf, id, &Placement::Auto, None) == Ok(shard))
        .expect("a key for every shard")
}

/// The SQLSTATE and the owner a DETAIL names, of a refusal.
fn refusal(e: &tokio_postgres::Error) -> (String, Option<u64>) {
    let db = e.as_db_error().expect("a refusal from the shard");
    let owner = db
        .detail()
        .and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .and_then(|d| d["owner_shard"].as_u64());
    (db.code().code().to_owned(), owner)
}

/// Live runs of (`wf`, `id`) on `db`.
async fn live_runs(db: &tokio_postgres::Client, wf: &str, id: &str) -> i64 {
    db.query_one(
        "SELECT count(*) FROM sheaf.executions WHERE workflow_name = $1 AND workflow_id = $2 \
           AND state IN ('RUNNING', 'SUSPENDED', 'PAUSED')",
        &[&wf, &id],
    )
    .await
    .expect("counting runs")
    .get(0)
}

/// Issue 37's first "done when": on a published two-shard topology, a start
/// sent by plain SQL to the shard that does not own its key is refused
/// naming the owner, the owner takes it, and no second live run can be made
/// without explicit placement; keyed tasks likewise. The driver's starts,
/// placed or pinned, and its starts in a transaction are taken; a rollout
/// (the previous projection kept) takes both projections' placements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_refuse_work_their_topology_places_elsewhere() {
    let spec = own_pair(&["up", "--count", "2", "--no-install"]);
    let fleet = || TopologyBuilder::from_spec(&spec).expect("own shards");
    let cl = client(fleet());
    let topology = cl.topology().clone();
    let ids: Vec<ShardId> = topology.shards().map(|s| s.id).collect();
    let (a, b) = (ids[0], ids[1]);
    let (db_a, db_b) = (
        sheaf_tests::connect(topology.get(a).unwrap()).await,
        sheaf_tests::connect(topology.get(b).unwrap()).await,
    );
    // Before anything is published, a shard takes what it is sent.
    let early = id_owned_by(&topology, "early", b);
    db_a.query_one(START, &[&"early", &early, &json!({})])
        .await
        .expect("nothing is checked before a topology is published");
    let report = cl.admin().publish_topology(false).await;
    assert!(report.is_complete(), "{:?}", report.failed);
    let key = plain_sql_is_checked(&topology, (a, &db_a), (b, &db_b)).await;
    the_driver_says_where_it_places(&cl, a, b, &key).await;

    // The run made before enforcement is misplaced, and named with its
    // owner; the runs pinned to a shard are not.
    let misplaced = cl.admin().misplaced_runs(100).await;
    assert!(misplaced.is_complete(), "{:?}", misplaced.failed);
    let listed: Vec<(ShardId, String, Option<ShardId>)> = misplaced
        .ok
        .values()
        .flatten()
        .map(|m| (m.shard, m.workflow_id.clone(), m.owner))
        .collect();
    assert_eq!(listed, vec![(a, early.clone(), Some(b))]);
    // Two live runs of one key (the owner's, and one pinned elsewhere):
    // find names both.
    let theirs = id_owned_by(&topology, "enforced", b);
    match cl.find_execution("enforced", &theirs).await.expect("find") {
        sheaf_driver::Resolution::Found { shard, also_live, .. } => {
            let mut shards: Vec<ShardId> = also_live.iter().map(|e| e.shard).chain([shard]).collect();
            shards.sort();
            assert_eq!(shards, vec![a, b], "every live run of the key");
        }
        other => panic!("{other:?}"),
    }
    let out = std::process::Command::new(sheaf_tests::cli_binary())
        .args(["--json", "find", "enforced", &theirs])
        .env("SHEAF_SHARDS", spec.trim().replace('\n', ","))
        .env_remove("SHEAF_TOPOLOGY_DIGEST")
        .output()
        .expect("the CLI runs");
    let found: serde_json::Value = serde_json::from_slice(&out.stdout).expect("find's JSON");
    assert_eq!(found["also_live"].as_array().map(Vec::len), Some(1), "{found}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("1 more live run(s)"),
        "sheaf find warns: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Shard health reports it (health.rs's unit test: without holding the
    // shard back for it), and the probe's gauge counts it.
    let health = cl
        .admin()
        .shard_health(Some(a), std::time::Duration::from_secs(10))
        .await;
    let reasons = &health[0].reason_codes;
    assert!(
        reasons.contains(&sheaf_driver::HealthReason::MisplacedRuns),
        "{health:?}"
    );
    let gauge = format!("sheaf_shard_misplaced_runs{{shard=\"{a}\"}} 1");
    assert!(cl.metrics_text().contains(&gauge), "{}", cl.metrics_text());

    // A rollout: b stops taking new work, the previous projection kept.
    let drained = client(fleet().writable([u32::from(a.get())]));
    let report = drained.admin().publish_topology(true).await;
    assert!(report.is_complete(), "{:?}", report.failed);
    let later = id_owned_by(&topology, "later", b);
    db_b.query_one(START, &[&"later", &later, &json!({})])
        .await
        .expect("the previous projection still places it on b");
    let report = drained.admin().publish_topology(false).await;
    assert!(report.is_complete(), "{:?}", report.failed);
    let again = id_owned_by(&topology, "again", b);
    let e = db_b
        .query_one(START, &[&"again", &again, &json!({})])
        .await
        .expect_err("once replaced, only the new projection counts");
    assert_eq!(refusal(&e), ("23514".into(), Some(u64::from(a.get()))));
    own_pair(&["down"]);
}

const START: &str = "SELECT execution_id FROM sheaf.start_workflow($1, $2, '{}', $3)";

/// Starts and keyed tasks sent by plain SQL: the owner takes them, the
/// other shard names it. The idempotency key of a task `b` owns.
async fn plain_sql_is_checked(
    topology: &Topology,
    (a, db_a): (ShardId, &tokio_postgres::Client),
    (b, db_b): (ShardId, &tokio_postgres::Client),
) -> String {
    let wf = "enforced";
    let theirs = id_owned_by(topology, wf, b);

    // Plain SQL to the wrong shard: refused, naming the owner.
    let e = db_a
        .query_one(START, &[&wf, &theirs, &json!({})])
        .await
        .expect_err("a misplaced start");
    assert_eq!(refusal(&e), ("23514".into(), Some(u64::from(b.get()))), "{e}");
    let message = e
        .as_db_error()
        .map(|d| d.message().to_owned())
        .unwrap_or_default();
    assert!(message.contains(&format!("belongs to shard {b} ")), "{message}");
    let e = db_a
        .query_one(
            "SELECT sheaf.signal_with_start($1, $2, '{}', 'go', '{}')",
            &[&wf, &theirs],
        )
        .await
        .expect_err("a misplaced signal-with-start");
    assert_eq!(refusal(&e).0, "23514");
    // The owner takes it; the other shard still refuses a second run.
    db_b.query_one(START, &[&wf, &theirs, &json!({})])
        .await
        .expect("the owner takes it");
    assert!(db_a.query_one(START, &[&wf, &theirs, &json!({})]).await.is_err());
    assert_eq!(
        (
            live_runs(db_a, wf, &theirs).await,
            live_runs(db_b, wf, &theirs).await
        ),
        (0, 1)
    );
    // Explicit placement is the caller's word: it is taken.
    let pinned = json!({"placement": {"shard": a.get()}});
    db_a.query_one(START, &[&wf, &theirs, &pinned])
        .await
        .expect("a start placed here in so many words");
    assert_eq!(live_runs(db_a, wf, &theirs).await, 1);

    // Keyed tasks: by (queue, idempotency key).
    let key = (0..10_000)
        .map(|n| format!("mail-{n}"))
        .find(|k| topology.place("mail", k, &Placement::Auto, None) == Ok(b))
        .unwrap();
    let e = db_a
        .query_one(
            "SELECT sheaf.enqueue('mail', '{}', $1)",
            &[&json!({"idempotency_key": key})],
        )
        .await
        .expect_err("a misplaced keyed task");
    assert_eq!(refusal(&e), ("23514".into(), Some(u64::from(b.get()))));
    db_a.query_one("SELECT sheaf.enqueue('mail', '{}', '{}')", &[])
        .await
        .expect("an unkeyed task goes anywhere");
    key
}

/// The driver places as the shards do, and says so when it pins (a pinned
/// start, a start and a keyed task in a transaction on `a` that `b` owns).
async fn the_driver_says_where_it_places(cl: &Client, a: ShardId, b: ShardId, key: &str) {
    let topology = cl.topology();
    let wf = "enforced";
    for n in 0..30 {
        let id = format!("driven-{n}");
        let started = cl
            .start_workflow(wf, &id, json!({}), sheaf_driver::StartOptions::new())
            .await
            .expect("a routed start");
        assert_eq!(
            started.shard,
            topology.place(wf, &id, &Placement::Auto, None).unwrap()
        );
        cl.enqueue(
            "mail",
            json!({}),
            sheaf_driver::EnqueueOptions::new().idempotency_key(format!("driven-{n}")),
        )
        .await
        .expect("a routed keyed task");
    }
    let theirs_too = id_owned_by(topology, "pinned", b);
    let started = cl
        .start_workflow(
            "pinned",
            &theirs_too,
            json!({}),
            sheaf_driver::StartOptions::new().placement(Placement::Shard(a)),
        )
        .await
        .expect("a pinned start");
    assert_eq!(started.shard, a);
    let mut conn = cl.shard_connection(a).await.expect("a connection");
    let tx = conn.transaction().await.expect("a transaction");
    let on = sheaf_driver::OnShard::verify(&tx, a).await.expect("shard a");
    let in_tx = id_owned_by(topology, "in-tx", b);
    on.start_workflow("in-tx", &in_tx, json!({}), sheaf_driver::StartOptions::new())
        .await
        .expect("a start in a transaction is placed on its shard");
    on.enqueue(
        "mail",
        json!({}),
        sheaf_driver::EnqueueOptions::new().idempotency_key(key),
    )
    .await
    .expect("a keyed task in a transaction is placed on its shard");
    tx.commit().await.expect("commit");
}
