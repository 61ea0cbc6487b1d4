//! The worker loop against three live shards: it drains every shard and
//! serves them round-robin, heartbeats long tasks, retries failures and
//! panics, drains gracefully or releases what it cannot finish, registers
//! itself, and shows in `topology_status()` and the metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use sheaf_driver::{
    ClaimedTask, Client, Coverage, Placement, PoolOptions, ShardId, TaskFailure, Worker, WorkerOptions,
};
use sheaf_tests::{connect, fleet, unique};

fn client(options: PoolOptions) -> Arc<Client> {
    Arc::new(Client::new(fleet().clone(), options).expect("pools for the fleet"))
}

fn shard(n: u16) -> ShardId {
    ShardId::new(n as u32).unwrap()
}

fn shards() -> Vec<ShardId> {
    fleet().shards().map(|s| s.id).collect()
}

/// Enqueues `n` tasks of `queue` on one shard.
async fn fill(client: &Client, queue: &str, on: ShardId, n: usize) {
    for i in 0..n {
        let placed = client
            .enqueue(queue, json!({ "i": i }), json!({}), Placement::Shard(on.get()))
            .await
            .unwrap();
        assert_eq!(placed.shard, on);
        assert_eq!(placed.task_id.shard(), Some(on));
    }
}

/// Tasks of `queue` still unfinished on each shard, read there by SQL.
async fn unfinished(queue: &str) -> i64 {
    let mut total = 0;
    for s in fleet().shards() {
        let db = connect(s).await;
        let row = db
            .query_one(
                "SELECT ready + scheduled + running + waiting FROM sheaf.queue_stats($1)",
                &[&queue],
            )
            .await
            .unwrap();
        total += row.get::<_, i64>(0);
    }
    total
}

async fn until(what: &str, timeout: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deep_backlog_on_one_shard_does_not_starve_the_others() {
    let ids = shards();
    let (deep, others) = (ids[0], &ids[1..]);
    let client = client(PoolOptions::default());
    let queue = unique("worker-fair");
    fill(&client, &queue, deep, 600).await;
    for &s in others {
        fill(&client, &queue, s, 60).await;
    }
    let order = Arc::new(Mutex::new(Vec::new()));
    let seen = order.clone();
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new(unique("w"), [queue.clone()])
            .concurrency(8)
            .batch(8),
        move |task: ClaimedTask| {
            let seen = seen.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                seen.lock().unwrap().push(task.shard);
                Ok(Some(json!({ "done": task.payload["i"] })))
            }
        },
    )
    .unwrap();
    assert!(worker.uncovered_writable().is_empty());
    until("every task to finish", Duration::from_secs(60), async || {
        worker.stats().completed == 600 + 60 * others.len() as u64
    })
    .await;
    assert_eq!(unfinished(&queue).await, 0);
    let stats = worker.stats();
    assert_eq!(stats.claimed[&deep], 600);
    for s in others {
        assert_eq!(stats.claimed[s], 60);
    }
    assert_eq!((stats.failed, stats.released, stats.lost), (0, 0, 0));
    // Round-robin: the small shards finish while the deep one still has most
    // of its backlog. Draining shard by shard would put them after task 600.
    let order = order.lock().unwrap().clone();
    let last_small = order.iter().rposition(|s| *s != deep).unwrap();
    assert!(
        last_small < 350,
        "the last task of a small shard finished at position {last_small} of {}",
        order.len()
    );
    let report = worker.shutdown().await;
    assert_eq!((report.in_hand, report.released, report.timed_out), (0, 0, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_waits_for_tasks_in_hand_or_releases_them_unspent() {
    let client = client(PoolOptions::default());
    let on = shards()[1];
    let handler = |pause: Duration| {
        move |_task: ClaimedTask| async move {
            tokio::time::sleep(pause).await;
            Ok(None)
        }
    };

    // Short tasks: the drain waits for them and releases nothing.
    let queue = unique("worker-drain");
    fill(&client, &queue, on, 3).await;
    let options = || {
        WorkerOptions::new(unique("w"), [queue.clone()])
            .coverage(Coverage::Shards(vec![on]))
            .concurrency(3)
    };
    let worker = Worker::start(client.clone(), options(), handler(Duration::from_millis(300))).unwrap();
    until("3 claims", Duration::from_secs(10), async || {
        worker.stats().claimed.get(&on) == Some(&3)
    })
    .await;
    let report = worker.shutdown().await;
    assert_eq!((report.in_hand, report.released, report.timed_out), (3, 0, false));
    assert_eq!(unfinished(&queue).await, 0);

    // Tasks that outlast the drain timeout go back, attempt not spent.
    let queue = unique("worker-release");
    fill(&client, &queue, on, 3).await;
    let options = WorkerOptions::new(unique("w"), [queue.clone()])
        .coverage(Coverage::Shards(vec![on]))
        .concurrency(3)
        .drain_timeout(Duration::from_millis(200));
    let worker = Worker::start(client.clone(), options, handler(Duration::from_secs(30))).unwrap();
    until("3 claims", Duration::from_secs(10), async || {
        worker.stats().claimed.get(&on) == Some(&3)
    })
    .await;
    let started = tokio::time::Instant::now();
    let report = worker.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!((report.in_hand, report.released, report.timed_out), (3, 3, true));
    let db = connect(fleet().get(on).unwrap()).await;
    let again = db
        .query("SELECT attempt FROM sheaf.claim($1, 'checker', 10)", &[&queue])
        .await
        .unwrap();
    let attempts: Vec<i32> = again.iter().map(|r| r.get(0)).collect();
    assert_eq!(attempts, vec![1, 1, 1], "released tasks keep their attempt");
}

/// Tasks of `queue` on `on` in each state: (ready, running), read by SQL.
async fn ready_and_running(queue: &str, on: ShardId) -> (i64, i64) {
    let db = connect(fleet().get(on).unwrap()).await;
    let row = db
        .query_one("SELECT ready, running FROM sheaf.queue_stats($1)", &[&queue])
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Dropping a worker stops its handlers and gives their tasks back at once
/// (they used to run on, detached, while their tasks stayed `running` until
/// the lease expired, and then ran again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropping_a_worker_stops_its_handlers_and_releases_their_tasks() {
    let client = client(PoolOptions::default());
    let on = shards()[0];
    let queue = unique("worker-drop");
    fill(&client, &queue, on, 4).await;
    let (started, finished) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (s, f) = (started.clone(), finished.clone());
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new(unique("w"), [queue.clone()])
            .coverage(Coverage::Shards(vec![on]))
            .concurrency(4)
            .lease(Duration::from_secs(60)),
        move |_task: ClaimedTask| {
            let (s, f) = (s.clone(), f.clone());
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(3)).await;
                f.fetch_add(1, Ordering::SeqCst);
                Ok(None)
            }
        },
    )
    .unwrap();
    until("4 handlers to start", Duration::from_secs(10), async || {
        started.load(Ordering::SeqCst) == 4
    })
    .await;
    let dropped = tokio::time::Instant::now();
    drop(worker);
    until(
        "the tasks to be ready again",
        Duration::from_secs(2),
        async || ready_and_running(&queue, on).await == (4, 0),
    )
    .await;
    // Past the handlers' sleep: none of them ran on to its end.
    tokio::time::sleep_until(dropped + Duration::from_secs(4)).await;
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "a handler ran on after the drop"
    );
    assert_eq!(ready_and_running(&queue, on).await, (4, 0));
    let db = connect(fleet().get(on).unwrap()).await;
    let again = db
        .query("SELECT attempt FROM sheaf.claim($1, 'checker', 10)", &[&queue])
        .await
        .unwrap();
    let attempts: Vec<i32> = again.iter().map(|r| r.get(0)).collect();
    assert_eq!(attempts, vec![1; 4], "released tasks keep their attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn long_tasks_keep_their_lease_and_failures_and_panics_are_retried() {
    let client = client(PoolOptions::default());
    let on = shards()[2];
    let queue = unique("worker-retry");
    fill(&client, &queue, on, 1).await;
    client
        .enqueue(&queue, json!("long"), json!({}), Placement::Shard(on.get()))
        .await
        .unwrap();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let seen = attempts.clone();
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new(unique("w"), [queue.clone()])
            .coverage(Coverage::Shards(vec![on]))
            .lease(Duration::from_secs(1)),
        move |task: ClaimedTask| {
            let seen = seen.clone();
            async move {
                if task.payload == json!("long") {
                    // Three leases long: only heartbeats keep it ours.
                    tokio::time::sleep(Duration::from_millis(3_000)).await;
                    return Ok(Some(json!("finished")));
                }
                seen.lock().unwrap().push(task.attempt);
                match task.attempt {
                    1 => Err(TaskFailure::new("first try fails").retry_in(Duration::from_millis(50))),
                    2 => panic!("second try panics"),
                    _ => Ok(None),
                }
            }
        },
    )
    .unwrap();
    until("both tasks to finish", Duration::from_secs(20), async || {
        worker.stats().completed == 2
    })
    .await;
    let stats = worker.stats();
    assert_eq!((stats.failed, stats.lost), (2, 0), "{stats:?}");
    assert_eq!(*attempts.lock().unwrap(), vec![1, 2, 3]);
    assert_eq!(unfinished(&queue).await, 0);
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_workers_and_stranded_work_show_in_topology_status_and_metrics() {
    let client = client(PoolOptions::default());
    let ids = shards();
    let served = unique("worker-served");
    let orphan = unique("worker-orphan");
    fill(&client, &orphan, ids[1], 2).await;
    let name = unique("w-status");
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new(name.clone(), [served.clone()]),
        |_task: ClaimedTask| async { Ok(None) },
    )
    .unwrap();
    until("the worker to register", Duration::from_secs(10), async || {
        let status = client.topology_status(Duration::from_secs(5)).await;
        status.shards.iter().all(|s| {
            s.probe
                .live_workers
                .iter()
                .any(|w| w.name == name && w.queues == [served.clone()])
        })
    })
    .await;
    let status = client.topology_status(Duration::from_secs(5)).await;
    assert_eq!(status.shards.len(), ids.len());
    for s in &status.shards {
        assert!(
            s.probe.reachable && s.schema_parity && s.readable && s.writable,
            "{s:?}"
        );
        assert_eq!(s.probe.reported_shard_id, Some(s.probe.shard.get() as i32));
        let stranded: Vec<_> = s.probe.stranded.iter().filter(|q| q.queue == orphan).collect();
        if s.probe.shard == ids[1] {
            assert_eq!(stranded.len(), 1, "{s:?}");
            assert_eq!(stranded[0].ready, 2);
        } else {
            assert!(stranded.is_empty(), "{s:?}");
        }
    }
    assert!(!status.healthy(), "stranded work makes the fleet unhealthy");
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["shards"][0]["breaker"], "closed");

    let text = client.metrics_text();
    for s in &ids {
        for line in [
            format!("sheaf_shard_up{{shard=\"{s}\"}} 1"),
            format!("sheaf_shard_breaker_state{{shard=\"{s}\"}} 0"),
        ] {
            assert!(text.contains(&line), "missing {line:?} in\n{text}");
        }
        assert!(
            text.contains(&format!(
                "sheaf_shard_requests_total{{outcome=\"ok\",shard=\"{s}\"}}"
            )),
            "{text}"
        );
    }
    assert!(text.contains(&format!("sheaf_shard_stranded_ready{{shard=\"{}\"}}", ids[1])));
    worker.shutdown().await;
    assert_deregistered(&client, &name).await;

    // Clean up the orphans so later status checks of this fleet stay quiet.
    let db = connect(fleet().get(ids[1]).unwrap()).await;
    for row in db
        .query(
            "SELECT task_id, token FROM sheaf.claim($1, 'cleanup', 10)",
            &[&orphan],
        )
        .await
        .unwrap()
    {
        let (id, token): (uuid::Uuid, i64) = (row.get(0), row.get(1));
        db.execute("SELECT sheaf.complete($1, $2)", &[&id, &token])
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undersized_pool_and_uncovered_shards_are_reported_at_start() {
    let client = client(PoolOptions {
        max_size: 1,
        ..PoolOptions::default()
    });
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new(unique("w"), [unique("q")]).coverage(Coverage::Shards(vec![shard(1)])),
        |_task: ClaimedTask| async { Ok(None) },
    )
    .unwrap();
    let uncovered: Vec<ShardId> = shards().into_iter().filter(|s| *s != shard(1)).collect();
    assert_eq!(worker.uncovered_writable(), uncovered.as_slice());
    let warnings = worker.startup_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("shard 1") && warnings[0].contains("size it at 2"),
        "{warnings:?}"
    );
    worker.shutdown().await;
}

/// Outside a tokio runtime `Worker::start` returns an error (it used to
/// panic after counting its claim loops against the pools).
#[test]
fn a_worker_needs_a_runtime() {
    let client = std::sync::Arc::new(
        sheaf_driver::Client::new(sheaf_tests::fleet().clone(), sheaf_driver::PoolOptions::default())
            .expect("client"),
    );
    let started = sheaf_driver::Worker::start(
        client,
        sheaf_driver::WorkerOptions::new("no-runtime", ["q"]),
        |_task| async { Ok(None) },
    );
    assert!(
        matches!(started, Err(sheaf_driver::WorkerError::NoRuntime)),
        "{:?}",
        started.err()
    );
}
/// A graceful shutdown deregisters at once (it used to stay "live" for the
/// 60 s after its last heartbeat, hiding stranded work meanwhile).
async fn assert_deregistered(client: &Client, name: &str) {
    let status = client.topology_status(Duration::from_secs(5)).await;
    for s in &status.shards {
        assert!(
            s.probe.live_workers.iter().all(|w| w.name != name),
            "still registered after shutdown: {s:?}"
        );
        assert!(
            !client.worker_deregister(s.probe.shard, name).await.unwrap(),
            "already gone from shard {}",
            s.probe.shard
        );
    }
}
