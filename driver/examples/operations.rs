//! Day-2 operations, the demo's part: 10 tasks on each shard of one queue,
//! two of them poison (a handler that refuses them for good, so they go
//! straight to the dead letters), one reporting progress as it goes. A
//! worker covering every shard drains the queue; the program prints what it
//! did and, last, the queue's name (`scripts/demo` hands it to `sheaf
//! dead-letters list` and `redrive`).
//!
//! By hand: `SHEAF_SHARDS=... cargo run -p sheaf-driver --example operations`
//! (or `SHEAF_DATABASE_URL=...` alone: one database as a fleet of one).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sheaf_driver::{
    Client, EnqueueOptions, Placement, PoolOptions, TaskContext, TaskDone, TaskFailure, Worker, WorkerOptions,
};

type Error = Box<dyn std::error::Error + Send + Sync>;

async fn handle(task: TaskContext) -> Result<TaskDone, TaskFailure> {
    let payload = task.task().payload.to_value().unwrap_or_default();
    if payload["poison"] == json!(true) {
        return Err(TaskFailure::permanent(format!(
            "order {} has no customer: no retry can fix it",
            payload["n"]
        )));
    }
    for step in 1..=3 {
        // Shown by `sheaf tasks get` while it runs.
        let _ = task.progress(json!({"step": step, "of": 3})).await;
    }
    Ok(TaskDone::Complete(Some(json!({"done": payload["n"]}).into())))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let client = Arc::new(Client::from_env(PoolOptions::default()).await?);
    let queue = format!("demo-orders-{}", std::process::id());
    let shards: Vec<_> = client.topology().shards().map(|s| s.id).collect();
    for &shard in &shards {
        for n in 0..10 {
            let poison = n % 5 == 4;
            client
                .enqueue(
                    &queue,
                    json!({"n": n, "poison": poison}),
                    EnqueueOptions::new().placement(Placement::Shard(shard)),
                )
                .await?;
        }
    }
    let started = Instant::now();
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new(format!("demo-ops-{}", std::process::id()), [queue.clone()])
            .idle_poll(Duration::from_millis(200)),
        handle,
    )?;
    let total = 10 * shards.len() as u64;
    while worker.stats().completed + worker.stats().dead_lettered < total {
        if started.elapsed() > Duration::from_secs(60) {
            return Err("the queue did not drain in 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = worker.stats();
    worker.shutdown().await;
    println!(
        "{} tasks over {} shards: {} completed, {} dead-lettered (poison), in {:.1} s",
        total,
        shards.len(),
        stats.completed,
        stats.dead_lettered,
        started.elapsed().as_secs_f64()
    );
    println!("{queue}");
    Ok(())
}
