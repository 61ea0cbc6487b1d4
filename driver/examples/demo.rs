//! The main demo: a mixed workload sent through the driver across every
//! local shard, drained by concurrent workers, printing the per-shard
//! distribution, throughput, the per-key caps held, and `topology_status()`.
//!
//! `scripts/demo` runs it against the shards it brings up. By hand:
//! `SHEAF_SHARDS=... cargo run -p sheaf-driver --example demo`.
//!
//! Tasks go to the shards that can take them (no affinity): priorities
//! 0..3, some scheduled a second ahead, a quarter spread over capped tenant
//! keys. Two workers (as two processes would) cover every shard round-robin;
//! a sampler watches each capped key's running count on each shard. Every
//! number printed is measured, not assumed.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use sheaf_driver::{
    Client, EnqueueOptions, PoolOptions, Shard, ShardId, TaskContext, TaskDone, Topology, Worker,
    WorkerOptions,
};
use tokio_postgres::NoTls;

const TASKS: usize = 12_000;
const ENQUEUERS: usize = 32;
const WORKERS: usize = 2;
/// Tenants and their caps: the demo's concurrency keys (one namespace per shard).
const TENANTS: [(&str, i32); 4] = [
    ("tenant-a", 2),
    ("tenant-b", 4),
    ("tenant-c", 8),
    ("tenant-d", 16),
];

type Error = Box<dyn std::error::Error + Send + Sync>;

// The demo's script, step after step as it prints them.
#[allow(clippy::too_many_lines)]
#[tokio::main]
async fn main() -> Result<(), Error> {
    let spec = std::env::var("SHEAF_SHARDS").map_err(|_| "set SHEAF_SHARDS (scripts/shards up prints it)")?;
    let topology = Topology::parse(&spec)?;
    let client = Arc::new(Client::new(
        topology.clone(),
        PoolOptions::default().max_size(48),
    )?);
    println!(
        "demo: {} shards, {TASKS} tasks placed by the driver, {WORKERS} workers covering every shard",
        topology.len()
    );
    for shard in topology.shards() {
        let db = connect(shard).await?;
        for (tenant, cap) in TENANTS {
            db.execute("SELECT sheaf.set_concurrency_limit($1, $2)", &[&tenant, &cap])
                .await?;
        }
    }

    let queue = format!("demo-{}", std::process::id());
    let started = Instant::now();
    let placed = enqueue_workload(&client, &queue).await?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "enqueued {TASKS} through the driver in {secs:.2} s = {:.0} tasks/s ({ENQUEUERS} concurrent callers)",
        TASKS as f64 / secs
    );
    for (shard, n) in &placed {
        println!(
            "  shard {shard}: {n} tasks ({:.1}%)",
            100.0 * *n as f64 / TASKS as f64
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    let samplers: Vec<_> = topology
        .shards()
        .cloned()
        .map(|s| tokio::spawn(sample_caps(s, stop.clone())))
        .collect();
    let started = Instant::now();
    let workers = (0..WORKERS)
        .map(|w| {
            Worker::start(
                client.clone(),
                WorkerOptions::new(format!("demo-worker-{w}-{}", std::process::id()), [queue.clone()])
                    .concurrency(32)
                    .batch(32)
                    .idle_poll(Duration::from_millis(200)),
                |_task: TaskContext| async { Ok(TaskDone::Complete(None)) },
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    loop {
        let done: u64 = workers.iter().map(|w| w.stats().completed).sum();
        if done >= TASKS as u64 {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            return Err(format!("only {done} of {TASKS} tasks finished in 5 minutes").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    println!(
        "drained {TASKS} tasks in {secs:.2} s = {:.0} tasks/s",
        TASKS as f64 / secs
    );
    let mut claimed: BTreeMap<ShardId, Vec<u64>> = BTreeMap::new();
    for w in &workers {
        for (shard, n) in w.stats().claimed {
            claimed.entry(shard).or_default().push(n);
        }
    }
    for (shard, per_worker) in &claimed {
        println!("  shard {shard}: claimed {per_worker:?} by worker");
    }
    for (shard, sampler) in topology.shards().zip(samplers) {
        let peaks = sampler.await??;
        for (tenant, cap) in TENANTS {
            let peak = peaks.get(tenant).copied().unwrap_or(0);
            let verdict = if peak <= cap as i64 { "held" } else { "EXCEEDED" };
            println!(
                "  shard {}: {tenant}: cap {cap}, peak running {peak} ({verdict})",
                shard.id
            );
            if peak > cap as i64 {
                return Err(format!("shard {}: cap of {tenant} exceeded", shard.id).into());
            }
        }
    }

    let status = client.admin().topology_status(Duration::from_secs(5)).await;
    println!("topology_status() while the workers are live:");
    println!(
        "  {:<6} {:<10} {:<8} {:<9} {:<8} {:<13} {:<7} stranded",
        "shard", "reachable", "breaker", "roles", "schema", "schema parity", "workers"
    );
    for s in &status.shards {
        let roles = s.roles();
        let stranded = s.stranded_ready();
        println!(
            "  {:<6} {:<10} {:<8} {:<9} {:<8} {:<13} {:<7} {stranded}",
            s.probe.shard,
            if s.probe.reachable { "yes" } else { "NO" },
            format!("{:?}", s.breaker).to_lowercase(),
            roles,
            s.probe.schema_version.as_deref().unwrap_or("-"),
            if s.schema_parity { "yes" } else { "NO" },
            s.probe.live_workers.len(),
        );
    }
    for w in workers {
        w.shutdown().await;
    }
    println!("metrics (Prometheus text, excerpt):");
    for line in client.metrics_text().lines() {
        if line.starts_with("sheaf_shard_requests_total")
            || line.starts_with("sheaf_shard_claimed_total")
            || line.starts_with("sheaf_shard_up")
        {
            println!("  {line}");
        }
    }
    start_orders(&client).await?;
    Ok(())
}

/// Workflow runs for `sheaf list` and `sheaf find` in `scripts/demo`:
/// `demo-order` runs placed across the shards by (name, workflow id), each
/// with a tenant search attribute and metered units; a third completed.
async fn start_orders(client: &Client) -> Result<(), Error> {
    let mut per_shard: BTreeMap<ShardId, usize> = BTreeMap::new();
    for n in 0..24 {
        let tenant = TENANTS[n % TENANTS.len()].0;
        let opts = sheaf_driver::StartOptions::new()
            .search_attr("tenant", tenant)
            .search_attr("amount", 10 * n as i64);
        let s = client
            .start_workflow("demo-order", &format!("order-{n}"), json!({"n": n}), opts)
            .await?;
        *per_shard.entry(s.shard).or_default() += 1;
        client
            .record_usage(s.execution_id, json!({"llm_calls": 1, "tokens": 100 + n}))
            .await?;
        if n % 3 == 0 {
            client
                .complete_execution(s.execution_id, json!({"ok": true}))
                .await?;
        }
    }
    println!("24 demo-order runs started, per shard: {per_shard:?}");
    Ok(())
}

/// Every task placed by the driver (`Auto`), from concurrent callers;
/// returns how many landed on each shard.
async fn enqueue_workload(client: &Arc<Client>, queue: &str) -> Result<BTreeMap<ShardId, usize>, Error> {
    let placed = futures::stream::iter(0..TASKS)
        .map(|i| {
            let client = client.clone();
            let queue = queue.to_owned();
            async move {
                let mut opts = EnqueueOptions::new().priority((i % 4) as i32);
                if i % 4 == 1 {
                    opts = opts.concurrency_key(TENANTS[(i / 4) % TENANTS.len()].0);
                }
                if i % 20 == 7 {
                    opts = opts.run_at(std::time::SystemTime::now() + Duration::from_secs(1));
                }
                client
                    .enqueue(&queue, json!({ "n": i }), opts)
                    .await
                    .map(|e| e.shard)
            }
        })
        .buffer_unordered(ENQUEUERS)
        .collect::<Vec<_>>()
        .await;
    let mut per_shard = BTreeMap::new();
    for shard in placed {
        *per_shard.entry(shard?).or_default() += 1;
    }
    Ok(per_shard)
}

async fn connect(shard: &Shard) -> Result<tokio_postgres::Client, Error> {
    let (client, connection) = tokio_postgres::connect(&shard.url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// The highest running count seen per capped key on one shard.
async fn sample_caps(shard: Shard, stop: Arc<AtomicBool>) -> Result<HashMap<String, i64>, Error> {
    let db = connect(&shard).await?;
    let mut peaks: HashMap<String, i64> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        for row in db
            .query(
                "SELECT concurrency_key, running FROM sheaf.concurrency_stats()",
                &[],
            )
            .await?
        {
            let peak = peaks.entry(row.get(0)).or_default();
            *peak = (*peak).max(row.get(1));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(peaks)
}
