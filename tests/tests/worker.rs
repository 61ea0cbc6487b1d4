//! The worker loop against three live shards: it drains every shard and
//! serves them round-robin, heartbeats long tasks, retries failures and
//! panics, drains gracefully or releases what it cannot finish, registers
//! itself, and shows in `topology_status()` and the metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use sheaf_driver::protocol::Steps;
use sheaf_driver::{
    CancelReason, Client, Coverage, EnqueueOptions, ExecutionId, ExecutionState, Placement, PoolOptions,
    ShardId, StartOptions, TaskContext, TaskDone, TaskFailure, Worker, WorkerOptions,
};
use sheaf_tests::{connect, fleet, unique, until};
use tokio::time::Instant;

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
            .enqueue(
                queue,
                json!({ "i": i }),
                EnqueueOptions::new().placement(Placement::Shard(on)),
            )
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
        move |ctx: TaskContext| {
            let seen = seen.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                let task = ctx.task();
                seen.lock().unwrap().push(task.shard);
                Ok(TaskDone::Complete(Some(
                    json!({ "done": task.payload.to_value().unwrap()["i"] }).into(),
                )))
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
        move |_ctx: TaskContext| async move {
            tokio::time::sleep(pause).await;
            Ok(TaskDone::Complete(None))
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
    // Well under the handler's 30 s, whatever the machine's load: the
    // drain gave up after its 200 ms instead of waiting for the handler.
    assert!(
        started.elapsed() < Duration::from_secs(20),
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
    let reasons = Arc::new(Mutex::new(Vec::new()));
    let (s, f, r) = (started.clone(), finished.clone(), reasons.clone());
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new(unique("w"), [queue.clone()])
            .coverage(Coverage::Shards(vec![on]))
            .concurrency(4)
            .lease(Duration::from_secs(60)),
        move |ctx: TaskContext| {
            let (s, f, r) = (s.clone(), f.clone(), r.clone());
            async move {
                // Spawned apart, so it outlives the handler's abort.
                tokio::spawn(async move {
                    ctx.cancelled().await;
                    r.lock().unwrap().push(ctx.cancel_reason());
                });
                s.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(3)).await;
                f.fetch_add(1, Ordering::SeqCst);
                Ok(TaskDone::Complete(None))
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
    assert_eq!(*reasons.lock().unwrap(), vec![Some(CancelReason::Shutdown); 4]);
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
        .enqueue(
            &queue,
            json!("long"),
            EnqueueOptions::new().placement(Placement::Shard(on)),
        )
        .await
        .unwrap();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let seen = attempts.clone();
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new(unique("w"), [queue.clone()])
            .coverage(Coverage::Shards(vec![on]))
            .lease(Duration::from_secs(1)),
        move |ctx: TaskContext| {
            let seen = seen.clone();
            async move {
                let task = ctx.task();
                if task.payload.as_str() == r#""long""# {
                    // Three leases long: only heartbeats keep it ours.
                    tokio::time::sleep(Duration::from_millis(3_000)).await;
                    return Ok(TaskDone::Complete(Some(json!("finished").into())));
                }
                seen.lock().unwrap().push(task.attempt);
                match task.attempt {
                    1 => Err(TaskFailure::retryable("first try fails").retry_in(Duration::from_millis(50))),
                    2 => panic!("second try panics"),
                    _ => Ok(TaskDone::Complete(None)),
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
        |_ctx: TaskContext| async { Ok(TaskDone::Complete(None)) },
    )
    .unwrap();
    until("the worker to register", Duration::from_secs(10), async || {
        let status = client.admin().topology_status(Duration::from_secs(5)).await;
        status.shards.iter().all(|s| {
            s.probe
                .live_workers
                .iter()
                .any(|w| w.name == name && w.queues == [served.clone()])
        })
    })
    .await;
    let status = client.admin().topology_status(Duration::from_secs(5)).await;
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
    let client = client(PoolOptions::default().max_size(1));
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new(unique("w"), [unique("q")]).coverage(Coverage::Shards(vec![shard(1)])),
        |_ctx: TaskContext| async { Ok(TaskDone::Complete(None)) },
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
        |_ctx| async { Ok(sheaf_driver::TaskDone::Complete(None)) },
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
    let status = client.admin().topology_status(Duration::from_secs(5)).await;
    for s in &status.shards {
        assert!(
            s.probe.live_workers.iter().all(|w| w.name != name),
            "still registered after shutdown: {s:?}"
        );
        assert!(
            !client
                .protocol()
                .worker_deregister(s.probe.shard, name)
                .await
                .unwrap(),
            "already gone from shard {}",
            s.probe.shard
        );
    }
}

/// Sends workflow `name`'s tasks to a queue of its own on every shard.
async fn declare(name: &str) -> String {
    let queue = unique("worker-wf-q");
    for s in fleet().shards() {
        connect(s)
            .await
            .execute(
                "SELECT sheaf.declare_workflow($1, $2)",
                &[&name, &json!({ "queue": queue })],
            )
            .await
            .unwrap();
    }
    queue
}

/// An execution's event types and payloads, in order, read on its shard.
async fn history(id: ExecutionId) -> Vec<(String, serde_json::Value)> {
    let db = connect(fleet().get(id.shard().unwrap()).unwrap()).await;
    db.query(
        "SELECT event_type, payload FROM sheaf.history($1, 0, 1000)",
        &[&id.as_uuid()],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// A workflow task's handler can end its execution with its own result in
/// one transaction. (Calling `complete_execution` from the handler cancels
/// the handler's own task, so its completion was refused and counted as a
/// lost lease: 50 of 50.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workflow_task_ends_its_execution_without_losing_its_own_result() {
    const N: usize = 50;
    let client = client(PoolOptions::default());
    let name = unique("wf-done");
    let queue = declare(&name).await;
    let mut ids = Vec::new();
    for i in 0..N {
        let started = client
            .start_workflow(&name, &format!("w-{i}"), json!({ "i": i }), StartOptions::new())
            .await
            .unwrap();
        ids.push(started.execution_id);
    }
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new(unique("w"), [queue.clone()]).concurrency(8),
        |ctx: TaskContext| async move {
            let task = ctx.task();
            assert_eq!(
                (task.kind.as_str(), task.execution_id.is_some()),
                ("workflow", true)
            );
            let id = task.execution_id.map(|e| e.to_string());
            Ok(TaskDone::CompleteExecution(
                json!({ "total": 42, "of": id }).into(),
            ))
        },
    )
    .unwrap();
    // Waits for the completions, then reports what happened instead.
    let deadline = Instant::now() + Duration::from_secs(30);
    while worker.stats().completed < N as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = worker.stats();
    assert_eq!(
        (stats.completed, stats.lost, stats.failed),
        (N as u64, 0, 0),
        "{stats:?}"
    );
    for id in &ids {
        let execution = client.get_execution(*id).await.unwrap().unwrap();
        let result = json!({ "total": 42, "of": id.to_string() });
        assert_eq!(execution.state, ExecutionState::Completed, "{execution:?}");
        assert_eq!(
            execution.result.as_ref().map(|r| r.to_value().unwrap()),
            Some(result.clone())
        );
        let events = history(*id).await;
        let tail: Vec<&str> = events[events.len() - 2..].iter().map(|e| e.0.as_str()).collect();
        assert_eq!(tail, ["TaskCompleted", "WorkflowCompleted"], "{events:?}");
        assert_eq!(
            events[events.len() - 2].1["result"],
            result,
            "the task's result is in the history"
        );
    }
    assert_eq!(unfinished(&queue).await, 0);
    worker.shutdown().await;
}

/// The other ends of a workflow task: fail the execution with it, or
/// complete the task alone and leave the execution running (continue later).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workflow_task_fails_its_execution_or_leaves_it_running() {
    let client = client(PoolOptions::default());
    let name = unique("wf-ends");
    let queue = declare(&name).await;
    let fail = client
        .start_workflow(&name, "fail", json!({ "end": "fail" }), StartOptions::new())
        .await
        .unwrap();
    let later = client
        .start_workflow(&name, "later", json!({ "end": "later" }), StartOptions::new())
        .await
        .unwrap();
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new(unique("w"), [queue.clone()]),
        |ctx: TaskContext| async move {
            let execution = ctx.task().execution_id.expect("a workflow task");
            let e = ctx.client().get_execution(execution).await.unwrap().unwrap();
            if e.input.to_value().unwrap()["end"] == "fail" {
                Ok(TaskDone::FailExecution("the order was refused".into()))
            } else {
                Ok(TaskDone::Complete(Some(json!("step 1 done").into())))
            }
        },
    )
    .unwrap();
    until("both tasks to finish", Duration::from_secs(20), async || {
        worker.stats().completed == 2
    })
    .await;
    assert_eq!(worker.stats().lost, 0);
    let failed = client.get_execution(fail.execution_id).await.unwrap().unwrap();
    assert_eq!(
        (failed.state.as_str(), failed.error.as_deref()),
        ("FAILED", Some("the order was refused"))
    );
    let running = client.get_execution(later.execution_id).await.unwrap().unwrap();
    assert_eq!(running.state, ExecutionState::Running);
    let events = history(later.execution_id).await;
    assert_eq!(events.last().map(|e| e.0.as_str()), Some("TaskCompleted"));
    assert_eq!(events.last().unwrap().1["result"], json!("step 1 done"));
    worker.shutdown().await;
    client.cancel_execution(later.execution_id, None).await.unwrap();
}

/// `activity_ends_wake_the_workflow_that_enqueued_them`'s handler: an
/// activity returns ten times its `n`; a run's first workflow task enqueues
/// three (and even-numbered runs suspend), a woken one completes the run
/// once its history holds all three results.
async fn activity_workflow(ctx: TaskContext, acts: String) -> Result<TaskDone, TaskFailure> {
    const ACTIVITIES: usize = 3;
    let task = ctx.task();
    if task.kind.as_str() == "activity" {
        let n = task.payload.to_value().unwrap()["n"].as_i64().unwrap();
        return Ok(TaskDone::Complete(Some(json!(n * 10).into())));
    }
    let id = task.execution_id.expect("a workflow task");
    let c = ctx.client();
    if task.payload.to_value().unwrap()["woken"] != json!(true) {
        for n in 0..ACTIVITIES {
            c.enqueue(&acts, json!({ "n": n }), EnqueueOptions::new().execution(id))
                .await
                .unwrap();
        }
        let input = c.get_execution(id).await.unwrap().unwrap().input;
        // Refused only if the activities already ended and a woken task
        // completed the run.
        if input.to_value().unwrap()["i"].as_i64().unwrap() % 2 == 0
            && c.suspend_execution(id, None).await.is_err()
        {
            let e = c.get_execution(id).await.unwrap().unwrap();
            assert_eq!(e.state, ExecutionState::Completed, "{e:?}");
        }
        return Ok(TaskDone::Complete(None));
    }
    let done: Vec<i64> = c
        .history(id, 0, 1000)
        .await
        .unwrap()
        .events
        .iter()
        .filter(|e| e.event_type.as_str() == "TaskCompleted")
        .filter_map(|e| {
            let p = e.payload.to_value().unwrap();
            (p["kind"] == "activity").then(|| p["result"].as_i64().unwrap())
        })
        .collect();
    if done.len() == ACTIVITIES {
        Ok(TaskDone::CompleteExecution(
            json!({ "sum": done.iter().sum::<i64>() }).into(),
        ))
    } else {
        Ok(TaskDone::Complete(None))
    }
}

/// Under `activity_ends: wake` a workflow that enqueued activities and
/// returned learns of their ends with no polling: each end wakes it (a
/// suspended run resumes, a running one gets its next workflow task), and
/// the run completes once, when its history shows all three activities
/// done. Half the runs suspend themselves, half just return.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn activity_ends_wake_the_workflow_that_enqueued_them() {
    const RUNS: usize = 6;
    let client = client(PoolOptions::default());
    let name = unique("wf-acts");
    let queue = unique("worker-wf-q");
    let acts = unique("worker-acts");
    for s in fleet().shards() {
        connect(s)
            .await
            .execute(
                "SELECT sheaf.declare_workflow($1, $2)",
                &[&name, &json!({ "queue": queue, "activity_ends": "wake" })],
            )
            .await
            .unwrap();
    }
    let mut ids = Vec::new();
    for i in 0..RUNS {
        let started = client
            .start_workflow(&name, &format!("w-{i}"), json!({ "i": i }), StartOptions::new())
            .await
            .unwrap();
        ids.push(started.execution_id);
    }
    let acts_queue = acts.clone();
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new(unique("w"), [queue.clone(), acts.clone()]).concurrency(8),
        move |ctx: TaskContext| activity_workflow(ctx, acts_queue.clone()),
    )
    .unwrap();
    until("every run to complete", Duration::from_secs(30), async || {
        for id in &ids {
            let e = client.get_execution(*id).await.unwrap().unwrap();
            if e.state != ExecutionState::Completed {
                return false;
            }
        }
        true
    })
    .await;
    worker.shutdown().await;
    for id in &ids {
        let e = client.get_execution(*id).await.unwrap().unwrap();
        assert_eq!(
            e.result.as_ref().map(|r| r.to_value().unwrap()),
            Some(json!({ "sum": 30 }))
        );
        let events = history(*id).await;
        let of = |t: &str| events.iter().filter(|e| e.0 == t).count();
        assert_eq!(of("WorkflowCompleted"), 1, "{events:?}");
        let activities = events
            .iter()
            .filter(|e| e.0 == "TaskCompleted" && e.1["kind"] == "activity")
            .count();
        assert_eq!(activities, 3, "{events:?}");
    }
    assert_eq!(unfinished(&queue).await + unfinished(&acts).await, 0);
}

/// A snooze runs the task again later with the same attempt; a permanent
/// failure skips the attempts left and dead-letters it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snooze_keeps_the_attempt_and_a_permanent_failure_dead_letters_at_once() {
    let client = client(PoolOptions::default());
    let on = shards()[1];
    let queue = unique("worker-outcomes");
    for what in ["snooze", "hopeless"] {
        client
            .enqueue(
                &queue,
                json!(what),
                EnqueueOptions::new()
                    .max_attempts(5)
                    .placement(Placement::Shard(on)),
            )
            .await
            .unwrap();
    }
    let runs = Arc::new(Mutex::new(Vec::new()));
    let seen = runs.clone();
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new(unique("w"), [queue.clone()])
            .coverage(Coverage::Shards(vec![on]))
            .idle_poll(Duration::from_millis(50)),
        move |ctx: TaskContext| {
            let seen = seen.clone();
            async move {
                let task = ctx.task();
                let mut runs = seen.lock().unwrap();
                let before = runs
                    .iter()
                    .filter(|r: &&(serde_json::Value, i32, Instant)| {
                        Some(&r.0) == task.payload.to_value().ok().as_ref()
                    })
                    .count();
                let payload = task.payload.to_value().unwrap_or_default();
                runs.push((payload.clone(), task.attempt, Instant::now()));
                match (payload.as_str(), before) {
                    (Some("snooze"), 0) => Ok(TaskDone::Snooze(Duration::from_millis(500))),
                    (Some("snooze"), _) => Ok(TaskDone::Complete(None)),
                    _ => Err(TaskFailure::permanent("no retry can fix this").retry_in(Duration::ZERO)),
                }
            }
        },
    )
    .unwrap();
    until("both tasks to end", Duration::from_secs(20), async || {
        let s = worker.stats();
        s.completed == 1 && s.dead_lettered == 1
    })
    .await;
    let stats = worker.stats();
    assert_eq!((stats.snoozed, stats.failed, stats.lost), (1, 1, 0), "{stats:?}");
    let runs = runs.lock().unwrap().clone();
    let snoozed: Vec<_> = runs.iter().filter(|r| r.0 == json!("snooze")).collect();
    assert_eq!(
        snoozed.iter().map(|r| r.1).collect::<Vec<_>>(),
        vec![1, 1],
        "the snooze spent no attempt"
    );
    assert!(
        snoozed[1].2 - snoozed[0].2 >= Duration::from_millis(500),
        "{runs:?}"
    );
    assert_eq!(
        runs.iter().filter(|r| r.0 == json!("hopeless")).count(),
        1,
        "it ran once"
    );
    let db = connect(fleet().get(on).unwrap()).await;
    let dead: i64 = db
        .query_one("SELECT dead FROM sheaf.queue_stats($1)", &[&queue])
        .await
        .unwrap()
        .get(0);
    assert_eq!(dead, 1);
    assert_eq!(unfinished(&queue).await, 0);
    worker.shutdown().await;
}

/// A workflow task's permanent failure fails its execution now, as its
/// last failed attempt would.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_permanent_failure_of_a_workflow_task_fails_its_execution() {
    let client = client(PoolOptions::default());
    let name = unique("wf-hopeless");
    let wf_queue = declare(&name).await;
    let started = client
        .start_workflow(&name, "hopeless", json!({}), StartOptions::new())
        .await
        .unwrap();
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new(unique("w"), [wf_queue]),
        |_ctx: TaskContext| async { Err(TaskFailure::permanent("hopeless")) },
    )
    .unwrap();
    until("the execution to fail", Duration::from_secs(20), async || {
        let e = client.get_execution(started.execution_id).await.unwrap().unwrap();
        e.state == ExecutionState::Failed
    })
    .await;
    assert_eq!((worker.stats().failed, worker.stats().dead_lettered), (1, 1));
    worker.shutdown().await;
}

/// The handler's context: a heartbeat now moves the lease deadline, and the
/// cancellation signal fires with `LeaseLost` when the task goes away under
/// it (here: its execution is cancelled), after which the handler is
/// stopped and the task counts as lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_context_heartbeats_and_signals_a_lost_lease() {
    let client = client(PoolOptions::default());
    let name = unique("wf-cancelled");
    let queue = declare(&name).await;
    let started = client
        .start_workflow(&name, "cancel-me", json!({}), StartOptions::new())
        .await
        .unwrap();
    let seen: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let (record, finished) = (seen.clone(), Arc::new(AtomicU64::new(0)));
    let done = finished.clone();
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new(unique("w"), [queue]).lease(Duration::from_secs(1)),
        move |ctx: TaskContext| {
            let (record, done) = (record.clone(), done.clone());
            async move {
                let before = ctx.lease_deadline();
                tokio::time::sleep(Duration::from_millis(100)).await;
                let after = ctx
                    .heartbeat()
                    .await
                    .expect("a heartbeat while the lease is held");
                assert!(after > before && ctx.lease_deadline() == after);
                record.lock().unwrap().push("heartbeat".into());
                let watcher = ctx.clone();
                // Spawned apart, so it outlives the handler's abort.
                tokio::spawn(async move {
                    watcher.cancelled().await;
                    record
                        .lock()
                        .unwrap()
                        .push(format!("{:?}", watcher.cancel_reason()));
                });
                tokio::time::sleep(Duration::from_secs(10)).await;
                done.fetch_add(1, Ordering::SeqCst);
                Ok(TaskDone::Complete(None))
            }
        },
    )
    .unwrap();
    until("the handler's heartbeat", Duration::from_secs(10), async || {
        seen.lock().unwrap().len() == 1
    })
    .await;
    assert!(
        client
            .cancel_execution(started.execution_id, Some("not needed"))
            .await
            .unwrap()
    );
    until("the signal", Duration::from_secs(3), async || {
        seen.lock().unwrap().len() == 2
    })
    .await;
    assert_eq!(*seen.lock().unwrap(), ["heartbeat", "Some(LeaseLost)"]);
    until("the loss to be counted", Duration::from_secs(3), async || {
        worker.stats().lost == 1
    })
    .await;
    let report = worker.shutdown().await;
    assert_eq!((report.in_hand, report.released), (0, 0));
    assert_eq!(finished.load(Ordering::SeqCst), 0, "the handler was stopped");
}
