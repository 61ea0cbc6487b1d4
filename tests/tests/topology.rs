//! The fleet's topology digest, enforced by real shards (the suite's own 3:
//! a digest published here would refuse the other suites' clients). Once a
//! client publishes the fleet's digest, a client configured with another
//! residency map is refused on placed work by every shard, naming both
//! digests, while its id-routed calls keep working; a rolling change
//! accepts both digests until the new one is published with `replace`; a
//! client that declares nothing is not checked. `shard_health` reads each
//! shard's readiness along the way: no live worker, then ready, then the
//! digest mismatch. Then one fleet configuration, applied to every shard,
//! and the drift a change behind its back makes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sheaf_driver::{
    Client, ClientError, EnqueueOptions, FleetConfig, HealthReason, Placement, PoolOptions, StartOptions,
    TaskContext, TaskDone, Topology, TopologyBuilder, Worker, WorkerOptions, config_drift,
};

fn own(args: &[&str]) -> String {
    sheaf_tests::own_shards("topology", 24400, args)
}

fn client(builder: TopologyBuilder, declare: bool) -> Arc<Client> {
    let options = PoolOptions::default().declare_topology(declare);
    Arc::new(Client::new(builder.build().expect("a topology"), options).expect("a client"))
}

/// Whether a start and an enqueue on every shard are refused as a mismatch.
async fn refused_everywhere(c: &Client, topology: &Topology, tag: &str) -> bool {
    for s in topology.shards() {
        let start = c
            .start_workflow(
                "topo-wf",
                &format!("{tag}-{}", s.id),
                json!({}),
                StartOptions::new().placement(Placement::Shard(s.id)),
            )
            .await;
        let enqueue = c
            .enqueue(
                "topo-q",
                json!({}),
                EnqueueOptions::new().placement(Placement::Shard(s.id)),
            )
            .await;
        match (start, enqueue) {
            (
                Err(ClientError::TopologyMismatch {
                    client_digest,
                    accepted_digests,
                    ..
                }),
                Err(ClientError::TopologyMismatch { .. }),
            ) => {
                assert_eq!(client_digest, c.topology().digest());
                assert!(!accepted_digests.contains(&client_digest));
            }
            _ => return false,
        }
    }
    true
}

async fn accepted_everywhere(c: &Client, topology: &Topology, tag: &str) -> bool {
    for s in topology.shards() {
        let start = c
            .start_workflow(
                "topo-wf",
                &format!("{tag}-{}", s.id),
                json!({}),
                StartOptions::new().placement(Placement::Shard(s.id)),
            )
            .await;
        if start.is_err() {
            return false;
        }
    }
    true
}

/// Fresh shards read `no_live_worker`, and ready once a worker serves them.
async fn fresh_shards_become_ready(a: &Arc<Client>, topology: &Topology) {
    // Fresh shards: nothing serves them yet.
    let verdicts = a.admin().shard_health(None, Duration::from_secs(5)).await;
    assert_eq!(verdicts.len(), 3);
    assert!(
        verdicts
            .iter()
            .all(|v| v.reason_codes == [HealthReason::NoLiveWorker]),
        "{verdicts:?}"
    );
    let worker = Worker::start(
        a.clone(),
        WorkerOptions::new("topo-worker", ["topo-idle"]),
        |_t: TaskContext| async { Ok(TaskDone::Complete(None)) },
    )
    .expect("a worker");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let candidate = topology.shards().nth(2).map(|s| s.id);
        let v = a.admin().shard_health(candidate, Duration::from_secs(5)).await;
        if v.len() == 1 && v[0].ready {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the candidate never became ready: {v:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_configured_unlike_the_fleet_is_refused_on_placed_work() {
    let spec = own(&["up", "--count", "3", "--no-install"]);
    let fleet = || TopologyBuilder::from_spec(&spec).expect("own shards");
    let topology = fleet().build().expect("a topology");
    let a = client(fleet(), true);
    let b = client(fleet().residency("eu", 1), true);
    assert_ne!(a.topology().digest(), b.topology().digest());
    let silent = client(fleet().residency("eu", 2), false);

    fresh_shards_become_ready(&a, &topology).await;

    // Nothing published: nothing checked.
    assert!(accepted_everywhere(&b, &topology, "before").await);
    let report = a.admin().publish_topology(false).await;
    assert!(report.is_complete(), "{:?}", report.failed);
    assert!(
        refused_everywhere(&b, &topology, "b").await,
        "b differs from the fleet"
    );
    assert!(accepted_everywhere(&a, &topology, "a").await);
    assert!(
        accepted_everywhere(&silent, &topology, "silent").await,
        "declares nothing"
    );
    // Its id-routed calls keep working.
    let started = a
        .start_workflow("topo-wf", "by-id", json!({}), StartOptions::new())
        .await
        .expect("a start");
    assert!(
        b.get_execution(started.execution_id)
            .await
            .expect("read")
            .is_some()
    );
    assert!(
        b.signal(started.execution_id, "s", json!(1), None)
            .await
            .expect("signal")
    );

    // A rolling change to b's map: both accepted, then only b's.
    let report = b.admin().publish_topology(true).await;
    assert!(report.is_complete(), "{:?}", report.failed);
    let published = a.admin().published_topology().await;
    for p in published.ok.values() {
        let p = p.as_ref().expect("published");
        assert_eq!(
            (p.digest.as_str(), p.previous.as_deref()),
            (
                b.topology().digest().as_str(),
                Some(a.topology().digest().as_str())
            )
        );
    }
    assert!(accepted_everywhere(&a, &topology, "a-rollout").await);
    assert!(accepted_everywhere(&b, &topology, "b-rollout").await);
    assert!(b.admin().publish_topology(false).await.is_complete());
    assert!(
        refused_everywhere(&a, &topology, "a-after").await,
        "the old map, once replaced"
    );
    let status = b.admin().topology_status(std::time::Duration::from_secs(5)).await;
    for s in &status.shards {
        assert_eq!(s.probe.accepted_digests, vec![b.topology().digest()]);
    }
    // a's view now: every shard refuses its digest.
    let verdicts = a.admin().shard_health(None, Duration::from_secs(5)).await;
    assert!(
        verdicts
            .iter()
            .all(|v| v.reason_codes.contains(&HealthReason::TopologyDigestMismatch)),
        "{verdicts:?}"
    );
    one_configuration_and_its_drift(&b, &topology).await;
    own(&["down"]);
}

/// `apply_config` reaches every shard; a change behind its back on one
/// shard is drift, named by `config_drift` and by `shard_health`.
async fn one_configuration_and_its_drift(c: &Arc<Client>, topology: &Topology) {
    let config = FleetConfig::parse(
        r#"{"workflows": {"topo-flow": {"queue": "topo-q"}},
            "queues": {"topo-q": {"aging_secs": 30}},
            "caps": {"topo-key": 3}}"#,
    )
    .expect("a configuration");
    let ops = Client::new(
        c.topology().clone(),
        PoolOptions::default().actor(Some("ops bot".into())),
    )
    .expect("a client");
    let report = ops.admin().apply_config(&config).await;
    assert!(report.is_complete(), "{:?}", report.failed);
    // Each shard's audit log names the action and who did it.
    let audit = c.admin().fleet_audit_log(20).await;
    assert_eq!(audit.ok.len(), 3);
    for entries in audit.ok.values() {
        let cap = entries
            .iter()
            .find(|e| e.action == "set_concurrency_limit" && e.target.as_deref() == Some("topo-key"))
            .expect("the cap's entry");
        assert_eq!((cap.actor.as_str(), cap.outcome.as_str()), ("ops bot", "ok"));
        assert!(
            entries.iter().any(|e| e.action == "publish_topology"),
            "{entries:?}"
        );
    }
    let held = c.admin().fleet_config().await;
    assert_eq!(held.ok.len(), 3);
    for cfg in held.ok.values() {
        assert_eq!(cfg.caps.get("topo-key"), Some(&Some(3)));
        assert_eq!(cfg.queues["topo-q"]["aging_secs"], 30);
        assert_eq!(cfg.workflows["topo-flow"]["queue"], "topo-q");
    }
    assert!(config_drift(&held).is_empty());
    let odd = topology.shards().nth(1).expect("a shard");
    let db = sheaf_tests::connect(odd).await;
    db.execute("SELECT sheaf.set_concurrency_limit('topo-key', 9)", &[])
        .await
        .expect("a change behind the fleet's back");
    let drift = config_drift(&c.admin().fleet_config().await);
    assert_eq!(drift.keys().copied().collect::<Vec<_>>(), [odd.id]);
    assert_eq!(drift[&odd.id], ["cap \"topo-key\" differs"]);
    let verdict = c.admin().shard_health(Some(odd.id), Duration::from_secs(5)).await;
    assert!(
        verdict[0].reason_codes.contains(&HealthReason::ConfigDrift),
        "{verdict:?}"
    );
    // Applying the file again is the remedy.
    assert!(c.admin().apply_config(&config).await.is_complete());
    assert!(config_drift(&c.admin().fleet_config().await).is_empty());
}
