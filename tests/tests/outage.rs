//! A stopped shard: the pool fails loudly and by name, its breaker opens and
//! short-circuits, the other shards keep serving (a worker keeps draining
//! them), status and metrics show it down, and the shard is back after it
//! restarts. Runs its own three shards (a real cluster is stopped here).

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sheaf_driver::{
    BreakerState, Client, ClientError, EnqueueOptions, Outcome, Placement, PoolOptions, ShardError, ShardId,
    ShardPools, TaskContext, TaskDone, Topology, Worker, WorkerOptions,
};

fn shards(args: &[&str]) -> String {
    sheaf_tests::own_shards("outage", 25500, args)
}

async fn shard_id(pools: &ShardPools, shard: ShardId) -> Result<i32, ShardError> {
    let conn = pools.get(shard).await?;
    Ok(conn
        .query_one("SELECT sheaf.shard_id()", &[])
        .await
        .expect("query")
        .get(0))
}

/// The pool's answer for a shard that is down. A pooled connection the
/// client has not yet seen close may be handed out once and fail on use;
/// that is not the pool's answer, so ask again.
async fn pool_refusal(pools: &ShardPools, shard: ShardId) -> ShardError {
    for _ in 0..20 {
        match pools.get(shard).await {
            Err(e) => return e,
            Ok(conn) => {
                assert!(
                    conn.query_one("SELECT 1", &[]).await.is_err(),
                    "shard {shard} answered while stopped"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    panic!("the pool kept handing out connections to a stopped shard");
}

// A scenario reads top to bottom as one story (set up, race, check);
// split into helpers it would scatter what it asserts.
#[allow(clippy::too_many_lines)]
#[tokio::test]
async fn a_stopped_shard_fails_loudly_opens_its_breaker_and_spares_the_others() {
    let topology = Topology::parse(&shards(&["up", "--count", "3", "--no-install"])).unwrap();
    let options = PoolOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .acquire_timeout(Duration::from_secs(2))
        .breaker_threshold(2)
        .breaker_cooldown(Duration::from_secs(2));
    let pools = ShardPools::new(&topology, options.clone()).unwrap();
    let id = |n: u32| ShardId::new(n).unwrap();
    for n in 0..3 {
        assert_eq!(shard_id(&pools, id(n)).await.unwrap(), n as i32);
    }
    let client = Arc::new(Client::new(topology.clone(), options).unwrap());
    let queue = "outage-q";
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new("outage-worker", [queue]).idle_poll(Duration::from_millis(100)),
        |_task: TaskContext| async { Ok(TaskDone::Complete(None)) },
    )
    .unwrap();
    let completed_on = |worker: &Worker| worker.stats().completed;

    shards(&["stop-one", "1"]);
    for attempt in 0..2 {
        match pool_refusal(&pools, id(1)).await {
            e @ ShardError::Unreachable { .. } => {
                let text = e.to_string();
                assert!(text.contains("shard 1"), "{text}");
                assert!(
                    !text.contains("shard 0") && !text.contains("shard 2"),
                    "names one shard: {text}"
                );
            }
            other => panic!("attempt {attempt}: expected unreachable, got {other:?}"),
        }
    }
    assert_eq!(pools.breaker_state(id(1)), Some(BreakerState::Open));
    assert!(matches!(
        shard_id(&pools, id(1)).await,
        Err(ShardError::ShortCircuited { .. })
    ));
    // The others keep serving, unaffected.
    assert_eq!(shard_id(&pools, id(0)).await.unwrap(), 0);
    assert_eq!(shard_id(&pools, id(2)).await.unwrap(), 2);
    assert_eq!(pools.breaker_state(id(0)), Some(BreakerState::Closed));

    // The client: a call for work on shard 1 fails loudly, naming only it.
    let refused = client
        .enqueue(
            queue,
            json!(1),
            EnqueueOptions::new().placement(Placement::Shard(id(1))),
        )
        .await
        .unwrap_err();
    let text = refused.to_string();
    assert!(matches!(refused, ClientError::Shard { .. }), "{refused:?}");
    assert!(
        text.contains("shard 1") && text.contains("queue \"outage-q\""),
        "{text}"
    );
    assert!(!text.contains("shard 0") && !text.contains("shard 2"), "{text}");
    // The worker keeps draining the other shards meanwhile.
    for n in [0u16, 2] {
        for _ in 0..5 {
            client
                .enqueue(
                    queue,
                    json!(n),
                    EnqueueOptions::new().placement(Placement::Shard(id(n.into()))),
                )
                .await
                .unwrap();
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while completed_on(&worker) < 10 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", worker.stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = client.admin().topology_status(Duration::from_secs(2)).await;
    let down = &status.shards[1];
    assert!(!down.probe.reachable && down.probe.problem.is_some(), "{down:?}");
    assert!(status.shards[0].probe.reachable && status.shards[2].probe.reachable);
    assert!(!status.healthy());
    let metrics = client.metrics();
    assert!(metrics.requests_total(id(1), Outcome::ConnectionError) >= 1);
    assert!(metrics.requests_total(id(1), Outcome::ShortCircuited) >= 1);
    assert!(metrics.requests_total(id(0), Outcome::Ok) >= 5);
    let text = client.metrics_text();
    assert!(text.contains("sheaf_shard_up{shard=\"1\"} 0"), "{text}");
    assert!(text.contains("sheaf_shard_up{shard=\"0\"} 1"), "{text}");

    shards(&["start-one", "1"]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        shard_id(&pools, id(1)).await.unwrap(),
        1,
        "the half-open probe succeeds"
    );
    assert_eq!(pools.breaker_state(id(1)), Some(BreakerState::Closed));
    assert!(matches!(pools.get(id(7)).await, Err(ShardError::NoPool { .. })));

    // Back up: the worker drains shard 1 too.
    for _ in 0..5 {
        client
            .enqueue(
                queue,
                json!(1),
                EnqueueOptions::new().placement(Placement::Shard(id(1))),
            )
            .await
            .unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while worker.stats().claimed.get(&id(1)).copied().unwrap_or(0) < 5 || completed_on(&worker) < 15 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", worker.stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.shutdown().await;

    shards(&["down"]);
}
