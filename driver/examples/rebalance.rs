//! The rebalancing part of `scripts/demo`, in two modes:
//!
//! - `serve`: a worker covering every shard of `SHEAF_SHARDS` (a new one
//!   included, so `sheaf shard health --candidate N` reads it `ready`),
//!   running until stdin closes or it is killed; its workflow tasks park
//!   each run on a one-hour timer.
//! - `prepare SHARD N`: a hot shard: `N` runs of `demo-sub` pinned to
//!   `SHARD`; waits until each is parked on its timer (quiescent), then
//!   prints the first run's workflow id and execution id (the oldest: the
//!   first a rebalance moves; the demo resolves its id after the move).
//!
//! By hand: `SHEAF_SHARDS=... cargo run -p sheaf-driver --example rebalance -- serve`.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;
use sheaf_driver::{
    Client, ExecutionState, Placement, PoolOptions, ShardId, StartOptions, TaskContext, TaskDone,
    TaskFailure, Topology, Worker, WorkerOptions,
};

type Error = Box<dyn std::error::Error + Send + Sync>;

const NAME: &str = "demo-sub";

/// A subscription's workflow task: park until the next renewal, an hour out.
async fn handle(task: TaskContext) -> Result<TaskDone, TaskFailure> {
    let Some(id) = task.task().execution_id else {
        return Err(TaskFailure::permanent("not a workflow task"));
    };
    task.client()
        .suspend_execution(id, Some(SystemTime::now() + Duration::from_secs(3600)))
        .await
        .map_err(|e| TaskFailure::retryable(e.to_string()))?;
    Ok(TaskDone::Complete(None))
}

fn client() -> Result<Arc<Client>, Error> {
    Ok(Arc::new(Client::new(
        Topology::from_env()?,
        PoolOptions::default(),
    )?))
}

async fn serve() -> Result<(), Error> {
    let c = client()?;
    let report = c
        .admin()
        .declare_workflow(NAME, json!({"queue": "demo-sub"}))
        .await;
    if !report.is_complete() {
        return Err(format!("declaring {NAME}: {:?}", report.failed).into());
    }
    let worker = Worker::start(c, WorkerOptions::new("demo-sub-worker", ["demo-sub"]), handle)?;
    println!("serving");
    // Until the demo closes our stdin (or kills us).
    tokio::task::spawn_blocking(|| std::io::Read::read(&mut std::io::stdin(), &mut [0u8; 1])).await??;
    worker.shutdown().await;
    Ok(())
}

async fn prepare(shard: u32, n: usize) -> Result<(), Error> {
    let c = client()?;
    let shard = ShardId::new(shard)?;
    let run = std::process::id();
    let mut runs = Vec::new();
    for i in 0..n {
        let wid = format!("sub-{run}-{i}");
        let started = c
            .start_workflow(
                NAME,
                &wid,
                json!({"plan": "monthly", "seat": i}),
                StartOptions::new().placement(Placement::Shard(shard)),
            )
            .await?;
        runs.push((wid, started.execution_id));
    }
    let (_, id) = runs.last().cloned().ok_or("no run")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.get_execution(id).await?.map(|e| e.state) != Some(ExecutionState::Suspended) {
        if Instant::now() > deadline {
            return Err("the runs did not park on their timers within a minute".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every earlier one parked before the last (one queue, in order).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (wid, first) = &runs[0];
    println!("{wid} {first}");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["serve"] => serve().await,
        ["prepare", shard, n] => prepare(shard.parse()?, n.parse()?).await,
        _ => Err("usage: rebalance serve | rebalance prepare SHARD N".into()),
    }
}
