//! Child workflows across shards: a parent fans out 30 children over every
//! shard (`ChildPlacement::Distributed`), each child returns its number
//! squared, and the parent completes with the sum once every child's end is
//! in its history. Two workers drive it all, each running the relay for the
//! shards it covers. Prints where the children ran, how long it took, and
//! the parent's id last (`scripts/demo` hands it to `sheaf tree`).
//!
//! By hand: `SHEAF_SHARDS=... cargo run -p sheaf-driver --example children`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sheaf_driver::{
    ChildPlacement, Client, ExecutionId, ExecutionState, PoolOptions, StartOptions, TaskContext, TaskDone,
    TaskFailure, Topology, Worker, WorkerOptions,
};

const CHILDREN: i64 = 30;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// One workflow task of the parent or of a child.
async fn handle(task: TaskContext) -> Result<TaskDone, TaskFailure> {
    let c = task.client().clone();
    let Some(id) = task.task().execution_id else {
        return Err(TaskFailure::permanent("not a workflow task"));
    };
    let fail = |e: sheaf_driver::ClientError| TaskFailure::retryable(e.to_string());
    let e = c
        .get_execution(id)
        .await
        .map_err(fail)?
        .ok_or_else(|| TaskFailure::permanent("gone"))?;
    if e.workflow_name == "demo-child" {
        let n = e.input.to_value().ok().and_then(|v| v["n"].as_i64()).unwrap_or(0);
        return Ok(TaskDone::CompleteExecution(json!({"square": n * n}).into()));
    }
    // The parent: spawn every child once (a retried task spawns the same
    // ones), then wait for their ends, woken by each.
    let history = c.history(id, 0, 1000).await.map_err(fail)?;
    if !history.events.iter().any(|ev| ev.event_type == "ChildStarted") {
        for n in 0..CHILDREN {
            c.start_child(
                id,
                "demo-child",
                &format!("c-{n}"),
                json!({"n": n}),
                ChildPlacement::Distributed,
            )
            .await
            .map_err(fail)?;
        }
        return Ok(TaskDone::Complete(None));
    }
    let mut sum = 0;
    let mut ended = 0;
    let mut after = 0;
    loop {
        let page = c.history(id, after, 1000).await.map_err(fail)?;
        for ev in page.events.iter().filter(|ev| ev.event_type == "ChildCompleted") {
            ended += 1;
            sum += ev
                .payload
                .to_value()
                .ok()
                .and_then(|v| v["result"]["square"].as_i64())
                .unwrap_or(0);
        }
        match page.next_after {
            Some(n) => after = n,
            None => break,
        }
    }
    if ended == CHILDREN {
        Ok(TaskDone::CompleteExecution(json!({"sum_of_squares": sum}).into()))
    } else {
        Ok(TaskDone::Complete(None))
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let spec = std::env::var("SHEAF_SHARDS").map_err(|_| "set SHEAF_SHARDS (scripts/shards up prints it)")?;
    let client = Arc::new(Client::new(Topology::parse(&spec)?, PoolOptions::default())?);
    let queue = format!("demo-flow-{}", std::process::id());
    for name in ["demo-parent", "demo-child"] {
        let report = client
            .admin()
            .declare_workflow(name, json!({"queue": queue}))
            .await;
        if !report.is_complete() {
            return Err(format!("declaring {name} failed on some shard: {:?}", report.failed).into());
        }
    }
    let workers = (0..2)
        .map(|w| {
            Worker::start(
                client.clone(),
                WorkerOptions::new(format!("demo-flow-{w}-{}", std::process::id()), [queue.clone()])
                    .concurrency(16)
                    .idle_poll(Duration::from_millis(200)),
                handle,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    let parent: ExecutionId = client
        .start_workflow(
            "demo-parent",
            &format!("fan-out-{}", std::process::id()),
            json!({}),
            StartOptions::new(),
        )
        .await?
        .execution_id;
    println!(
        "parent {parent} fans out {CHILDREN} children over {} shards",
        client.topology().len()
    );
    let done = loop {
        let e = client.get_execution(parent).await?.ok_or("the parent is gone")?;
        if e.state != ExecutionState::Running && e.state != ExecutionState::Suspended {
            break e;
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err("the parent did not finish in 2 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "parent {} in {:.2} s with {}",
        done.state,
        started.elapsed().as_secs_f64(),
        done.result
            .as_ref()
            .map_or("no result".into(), |r| r.as_str().to_owned())
    );
    let kids = client.children(parent).await?;
    let mut per_shard: BTreeMap<String, usize> = BTreeMap::new();
    for k in &kids.items {
        *per_shard.entry(k.shard.to_string()).or_default() += 1;
    }
    for (shard, n) in &per_shard {
        println!("  shard {shard}: {n} children");
    }
    for w in workers {
        w.shutdown().await;
    }
    if done.state != ExecutionState::Completed {
        return Err(format!("the parent ended {}", done.state).into());
    }
    println!("{parent}");
    Ok(())
}
