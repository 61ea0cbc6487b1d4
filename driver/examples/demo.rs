//! The main demo: a mixed workload on every local shard, drained by
//! concurrent workers, printing throughput and the per-key caps held.
//!
//! `scripts/demo` runs it against the shards it brings up. By hand:
//! `SHEAF_SHARDS=... cargo run -p sheaf-driver --example demo`.
//!
//! Each shard gets the same workload: priorities 0..3, a few tasks scheduled
//! a second ahead, and tasks spread over capped tenant keys. Workers claim in
//! batches and complete; a sampler watches each capped key's running count
//! from consistent snapshots. Every number printed is measured, not assumed.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sheaf_driver::{Shard, Topology};
use tokio_postgres::{Client, NoTls};

const TASKS_PER_SHARD: i32 = 20_000;
const WORKERS_PER_SHARD: usize = 4;
/// Tenants and their caps: the demo's concurrency keys.
const TENANTS: [(&str, i32); 4] = [
    ("tenant-a", 2),
    ("tenant-b", 4),
    ("tenant-c", 8),
    ("tenant-d", 16),
];

type Error = Box<dyn std::error::Error + Send + Sync>;

async fn connect(shard: &Shard) -> Result<Client, Error> {
    let (client, connection) = tokio_postgres::connect(&shard.url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let spec = std::env::var("SHEAF_SHARDS").map_err(|_| "set SHEAF_SHARDS (scripts/shards up prints it)")?;
    let topology = Topology::parse(&spec)?;
    println!(
        "demo: {} shards, {TASKS_PER_SHARD} tasks each, {WORKERS_PER_SHARD} workers each",
        topology.len()
    );

    let mut shard_runs = Vec::new();
    for shard in topology.shards().cloned() {
        shard_runs.push(tokio::spawn(run_shard(shard)));
    }
    let mut total = 0u64;
    let started = Instant::now();
    for run in shard_runs {
        total += run.await??;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "all shards: {total} tasks in {secs:.1} s = {:.0} tasks/s",
        total as f64 / secs
    );
    Ok(())
}

async fn run_shard(shard: Shard) -> Result<u64, Error> {
    let db = connect(&shard).await?;
    let queue = format!("demo-{}", std::process::id());
    for (tenant, cap) in TENANTS {
        db.execute("SELECT sheaf.set_concurrency_limit($1, $2)", &[&tenant, &cap])
            .await?;
    }
    let loaded = Instant::now();
    enqueue_workload(&db, &queue).await?;
    println!(
        "shard {}: enqueued {TASKS_PER_SHARD} in {:.2} s",
        shard.id,
        loaded.elapsed().as_secs_f64()
    );

    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(sample_caps(shard.clone(), stop.clone()));
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..WORKERS_PER_SHARD {
        workers.push(tokio::spawn(work(
            shard.clone(),
            queue.clone(),
            format!("demo-{w}"),
            done.clone(),
        )));
    }
    for w in workers {
        w.await??;
    }
    stop.store(true, Ordering::Relaxed);
    let peaks = sampler.await??;
    let secs = started.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    println!(
        "shard {}: drained {n} tasks in {secs:.2} s = {:.0} tasks/s",
        shard.id,
        n as f64 / secs
    );
    for (tenant, cap) in TENANTS {
        let peak = peaks.get(tenant).copied().unwrap_or(0);
        let verdict = if peak <= cap as i64 { "held" } else { "EXCEEDED" };
        println!(
            "shard {}:   {tenant}: cap {cap}, peak running {peak} ({verdict})",
            shard.id
        );
        if peak > cap as i64 {
            return Err(format!("shard {}: cap of {tenant} exceeded", shard.id).into());
        }
    }
    Ok(n)
}

/// A quarter of the tasks belong to a capped tenant, the rest are free;
/// priorities 0..3; one batch in twenty is scheduled a second ahead.
async fn enqueue_workload(db: &Client, queue: &str) -> Result<(), Error> {
    let batch = 500;
    for b in 0..TASKS_PER_SHARD / batch {
        let mut opts = serde_json::json!({"priority": b % 4});
        if b % 4 == 1 {
            opts["concurrency_key"] = TENANTS[(b as usize / 4) % TENANTS.len()].0.into();
        }
        let later = b % 20 == 7;
        db.execute(
            "SELECT count(*) FROM sheaf.enqueue_batch($1, \
                 array_fill(jsonb_build_object('batch', $2::int), ARRAY[$3::int]), \
                 $4::jsonb || CASE WHEN $5 THEN jsonb_build_object('run_at', now() + interval '1 second') \
                                  ELSE '{}' END)",
            &[&queue, &b, &batch, &opts, &later],
        )
        .await?;
    }
    Ok(())
}

/// Claims in batches of 10 and completes them, until the queue is empty.
async fn work(shard: Shard, queue: String, worker: String, done: Arc<AtomicU64>) -> Result<(), Error> {
    let db = connect(&shard).await?;
    loop {
        let rows = db
            .query(
                "SELECT task_id, token FROM sheaf.claim($1, $2, 10)",
                &[&queue, &worker],
            )
            .await?;
        if rows.is_empty() {
            let left: i64 = db
                .query_one(
                    "SELECT ready + scheduled + running + waiting FROM sheaf.queue_stats($1)",
                    &[&queue],
                )
                .await?
                .get(0);
            if left == 0 {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        let ids: Vec<uuid::Uuid> = rows.iter().map(|r| r.get(0)).collect();
        let tokens: Vec<i64> = rows.iter().map(|r| r.get(1)).collect();
        db.execute(
            "SELECT count(*) FROM sheaf.complete_batch($1, $2)",
            &[&ids, &tokens],
        )
        .await?;
        done.fetch_add(ids.len() as u64, Ordering::Relaxed);
    }
}

/// The highest running count seen per capped key, from consistent snapshots.
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
