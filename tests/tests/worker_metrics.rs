//! The metrics a worker keeps current, against live shards: what became of
//! each task by shard and queue, claim and task latency, and the shard-up
//! and stranded gauges refreshed by the worker itself (no status probe).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use sheaf_driver::{
    Client, Coverage, EnqueueOptions, Placement, PoolOptions, ShardId, TaskContext, TaskDone, TaskFailure,
    TaskOutcome, Worker, WorkerOptions,
};
use sheaf_tests::{fleet, unique};

async fn until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn enqueue(client: &Client, queue: &str, on: ShardId, payload: serde_json::Value) {
    client
        .enqueue(
            queue,
            payload,
            EnqueueOptions::new().placement(Placement::Shard(on)),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_counts_outcomes_by_shard_and_queue_and_refreshes_its_gauges() {
    let client = Arc::new(Client::new(fleet().clone(), PoolOptions::default()).unwrap());
    let on = fleet().shards().nth(1).expect("a second shard").id;
    let queue = unique("metrics-q");
    let nobody = unique("metrics-stranded");
    for what in ["ok", "ok", "ok", "hopeless", "later"] {
        enqueue(&client, &queue, on, json!(what)).await;
    }
    // Ready work on a queue no worker serves: stranded.
    for _ in 0..3 {
        enqueue(&client, &nobody, on, json!("waiting")).await;
    }
    let options = WorkerOptions::new(unique("w"), [queue.clone()])
        .coverage(Coverage::Shards(vec![on]))
        .idle_poll(Duration::from_millis(50))
        .register_every(Duration::from_millis(200));
    // A snooze spends no attempt, so the handler remembers it snoozed.
    let snoozed = Arc::new(AtomicBool::new(false));
    let worker = Worker::start(client.clone(), options, move |ctx: TaskContext| {
        let snoozed = snoozed.clone();
        async move {
            match ctx.task().payload.as_str() {
                r#""ok""# => Ok(TaskDone::Complete(None)),
                r#""later""# if !snoozed.swap(true, Ordering::SeqCst) => {
                    Ok(TaskDone::Snooze(Duration::from_millis(100)))
                }
                r#""later""# => Ok(TaskDone::Complete(None)),
                _ => Err(TaskFailure::permanent("no retry can fix this")),
            }
        }
    })
    .unwrap();
    let metrics = client.metrics();
    until("every outcome counted", Duration::from_secs(20), || {
        metrics.tasks_total(on, &queue, TaskOutcome::Completed) == 4
            && metrics.tasks_total(on, &queue, TaskOutcome::DeadLettered) == 1
    })
    .await;
    assert_eq!(metrics.tasks_total(on, &queue, TaskOutcome::Snoozed), 1);
    assert_eq!(metrics.tasks_total(on, &queue, TaskOutcome::Lost), 0);
    assert!(metrics.claims_timed(on, &queue) > 0);
    // The worker's own registration refreshed the gauges for its shard.
    until("the stranded gauge", Duration::from_secs(10), || {
        metrics.shard_up(on) && metrics.stranded_ready(on) >= 3
    })
    .await;
    let text = client.metrics_text();
    let line = format!(r#"sheaf_tasks_total{{outcome="completed",queue="{queue}",shard="{on}"}} 4"#);
    assert!(text.contains(&line), "{line} missing");
    assert!(
        text.contains("sheaf_task_duration_seconds_bucket"),
        "no task histogram"
    );
    worker.shutdown().await;
}
