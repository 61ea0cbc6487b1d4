//! Fleet-wide calls against live shards: policies applied to every shard
//! with a per-shard report (a shard that refuses is reported, not hidden),
//! fan-out reads per shard with totals, redrive grouped by shard.

use std::time::Duration;

use serde_json::json;
use sheaf_driver::protocol::Steps;
use sheaf_driver::{
    Client, ClientError, EnqueueOptions, Placement, PoolOptions, QueueOptions, ShardId, StartOptions,
    Topology,
};
use sheaf_tests::{fleet, unique};

fn client() -> Client {
    Client::new(fleet().clone(), PoolOptions::default()).expect("a client for the test fleet")
}

/// The test fleet plus shard 9, which nobody listens for.
fn client_with_a_dead_shard() -> (Client, ShardId) {
    let b = fleet().shards().fold(Topology::builder(), |b, s| {
        b.shard(u32::from(s.id.get()), s.url.clone())
    });
    let t = b
        .shard(9, "postgres://postgres@127.0.0.1:1/sheaf")
        .build()
        .expect("a topology");
    let options = PoolOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .acquire_timeout(Duration::from_secs(1));
    let dead = ShardId::new(9).expect("an id");
    (Client::new(t, options).expect("a client"), dead)
}

fn live_ids() -> Vec<ShardId> {
    fleet().shards().map(|s| s.id).collect()
}

#[tokio::test]
async fn a_half_applied_policy_says_which_shards_did_not_take_it() {
    let (c, dead) = client_with_a_dead_shard();
    let name = unique("policy");
    let policy = json!({"concurrency": {"key": "input.tenant", "limit": 1, "on_conflict": "reject"}});
    let report = c.admin().declare_workflow(&name, policy.clone()).await;
    assert!(!report.is_complete());
    assert_eq!(report.ok.keys().copied().collect::<Vec<_>>(), live_ids());
    assert_eq!(report.failed.keys().copied().collect::<Vec<_>>(), [dead]);
    match &report.failed[&dead] {
        ClientError::Shard { error, .. } => assert_eq!(error.shard(), dead),
        other => panic!("the dead shard's failure: {other:?}"),
    }
    let text = report.into_result().expect_err("incomplete").to_string();
    assert!(text.starts_with("1 of 4 shards failed"), "{text}");

    // Where it applied, it is in force: a second start of the tenant is refused.
    let live = client();
    for shard in live_ids() {
        let opts = StartOptions::new().placement(Placement::Shard(shard));
        live.start_workflow(&name, &unique("a"), json!({"tenant": "t"}), opts.clone())
            .await
            .expect("the first start");
        match live
            .start_workflow(&name, &unique("b"), json!({"tenant": "t"}), opts)
            .await
        {
            Err(ClientError::GateRejected { shard: s, .. }) => assert_eq!(s, shard),
            other => panic!("shard {shard}: {other:?}"),
        }
    }
    // The whole fleet: complete. A bad policy: refused by every shard, each reported.
    assert!(live.admin().declare_workflow(&name, policy).await.is_complete());
    let bad = live
        .admin()
        .declare_workflow(&name, json!({"concurrency": {"limit": -1}}))
        .await;
    assert!(bad.ok.is_empty());
    assert!(
        bad.failed
            .values()
            .all(|e| matches!(e, ClientError::InvalidArgument { .. })),
        "{bad:?}"
    );
}

#[tokio::test]
async fn caps_and_queue_configuration_report_per_shard() {
    let (c, dead) = client_with_a_dead_shard();
    let key = unique("cap");
    let report = c.admin().set_concurrency_limit(&key, Some(3)).await;
    assert_eq!((report.ok.len(), report.failed.len()), (3, 1));
    let stats = c.admin().concurrency_stats().await;
    assert!(
        stats.failed.contains_key(&dead),
        "a fan-out read reports the dead shard"
    );
    for shard in live_ids() {
        let mine: Vec<_> = stats.ok[&shard]
            .iter()
            .filter(|s| s.concurrency_key == key)
            .collect();
        assert_eq!(mine.len(), 1, "shard {shard}");
        assert_eq!(mine[0].max_running, Some(3));
    }
    let queue = unique("cfg");
    let configs = client()
        .admin()
        .configure_queue(&queue, &QueueOptions::new().aging_secs(Some(30)).notify(false))
        .await
        .into_result()
        .expect("every shard");
    assert_eq!(configs.len(), 3);
    for config in configs.values() {
        assert_eq!(
            (config.aging_secs, config.fairness, config.notify),
            (Some(30), false, false)
        );
        assert_eq!(config.queue, queue);
    }
    assert!(
        client()
            .admin()
            .set_concurrency_limit(&key, None)
            .await
            .is_complete()
    );
}

#[tokio::test]
async fn redrive_goes_to_each_ids_shard_and_reports_per_shard() {
    let c = client();
    let queue = unique("dead");
    let shards = live_ids();
    let mut dead_letters = Vec::new();
    for &shard in &shards[..2] {
        let options = EnqueueOptions::new()
            .max_attempts(1)
            .placement(Placement::Shard(shard));
        let task = c.enqueue(&queue, json!({}), options).await.expect("enqueue");
        let claimed = c
            .claim(shard, &queue, "w", 1, Duration::from_secs(30))
            .await
            .expect("claim");
        let outcome = c
            .fail(claimed[0].task_id, claimed[0].token, "boom", None)
            .await
            .expect("fail");
        assert!(outcome.dead_lettered);
        dead_letters.push(task.task_id);
    }
    let stats = c.admin().queue_stats(&queue).await;
    assert_eq!(stats.total().dead, 2);
    let report = c.admin().redrive(&dead_letters).await;
    assert!(report.is_complete(), "{:?}", report.failed);
    assert_eq!(report.ok.keys().copied().collect::<Vec<_>>(), shards[..2]);
    assert!(report.ok.values().all(|&n| n == 1));
    assert_eq!(report.total(), 2);
    // Again: nothing is a dead letter any more; each shard skips its id.
    assert_eq!(c.admin().redrive(&dead_letters).await.total(), 0);
    assert_eq!(c.admin().queue_stats(&queue).await.total().ready, 2);
}

#[tokio::test]
async fn fleet_reads_answer_per_shard() {
    let c = client();
    let queue = unique("stranded");
    let shard = live_ids()[2];
    c.enqueue(
        &queue,
        json!({}),
        EnqueueOptions::new().placement(Placement::Shard(shard)),
    )
    .await
    .expect("enqueue");
    let stranded = c.admin().stranded_work().await;
    assert!(stranded.is_complete());
    assert!(
        stranded.ok[&shard]
            .iter()
            .any(|s| s.queue == queue && s.ready == 1)
    );
    let worker = unique("worker");
    c.protocol()
        .worker_heartbeat(shard, &worker, std::slice::from_ref(&queue))
        .await
        .expect("heartbeat");
    let live = c.admin().live_workers().await;
    let seen: Vec<_> = live.ok[&shard].iter().filter(|w| w.worker == worker).collect();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].queues, std::slice::from_ref(&queue));
    assert!(
        !c.admin().stranded_work().await.ok[&shard]
            .iter()
            .any(|s| s.queue == queue)
    );
    assert!(
        c.protocol()
            .worker_deregister(shard, &worker)
            .await
            .expect("deregister")
    );

    let usage = c.admin().quota_usage(&unique("nokey")).await;
    assert_eq!((usage.ok.len(), usage.total().active_executions), (3, 0));
    let recount = c.admin().quota_recompute(&unique("nokey")).await;
    assert!(recount.is_complete());
    for shard in live_ids() {
        let info = c.admin().shard_info(shard).await.expect("shard_info");
        assert!(info.matches(), "{info:?}");
        assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
        c.admin()
            .init_shard(shard)
            .await
            .expect("init_shard is idempotent for the same id");
        assert!(c.admin().reap_expired(shard, 100).await.expect("reap") >= 0);
        assert!(c.admin().mutex_reclaim(shard, 100).await.expect("reclaim") >= 0);
    }
}
