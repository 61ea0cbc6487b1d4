//! The cost of the topology digest check on the paths that accept placed
//! work: enqueue and start p50/p99 from a client that declares its digest
//! to a shard that published it, against a client that declares nothing
//! (not checked), side by side in alternating rounds on one shard.
//!
//! ```text
//! cargo run --release -p sheaf-benches --bin digest-bench                 # its own shard (scripts/shards, --release)
//! SHEAF_SHARDS=0=postgres://... cargo run --release -p sheaf-benches --bin digest-bench -- --reps 200
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;
use sheaf_driver::{Client, EnqueueOptions, PoolOptions, StartOptions, Topology};

#[derive(Parser)]
#[command(about = "enqueue and start p50/p99 with and without the topology digest check")]
struct Cli {
    /// Calls per client, per figure.
    #[arg(long, default_value_t = 2000)]
    reps: usize,
    /// Alternating rounds the calls are split into.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// PostgreSQL major of the bench cluster.
    #[arg(long, default_value_t = 15)]
    pg: u32,
}

#[path = "../support.rs"]
mod support;
use support::{Error, pct};

fn ms(v: &mut [Duration], p: f64) -> f64 {
    let mut v: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    pct(&mut v, p)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let cli = Cli::parse();
    let spec = match std::env::var("SHEAF_SHARDS") {
        Ok(s) => s,
        Err(_) => support::release_shards(1, cli.pg, "/tmp/sheaf-bench-digest", 25985)?,
    };
    let topology = Topology::parse(spec.lines().next().unwrap_or(&spec))?;
    let make = |declare| {
        Client::new(topology.clone(), PoolOptions::default().declare_topology(declare)).map(Arc::new)
    };
    let (checked, unchecked) = (make(true)?, make(false)?);
    let report = checked.admin().publish_topology(false).await;
    if !report.is_complete() {
        return Err(format!("publishing the digest failed: {:?}", report.failed).into());
    }
    let run = std::process::id();
    let per_round = (cli.reps / cli.rounds.max(1)).max(1);
    let mut times: [[Vec<Duration>; 2]; 2] = Default::default();
    for round in 0..cli.rounds {
        for (i, c) in [&checked, &unchecked].into_iter().enumerate() {
            for k in 0..per_round {
                let t = Instant::now();
                c.enqueue(
                    &format!("digest-bench-{run}"),
                    json!({"k": k}),
                    EnqueueOptions::new(),
                )
                .await?;
                times[i][0].push(t.elapsed());
                let t = Instant::now();
                c.start_workflow(
                    "digest-bench",
                    &format!("{run}-{i}-{round}-{k}"),
                    json!({}),
                    StartOptions::new(),
                )
                .await?;
                times[i][1].push(t.elapsed());
            }
        }
    }
    let commit: String = {
        let (db, conn) = tokio_postgres::connect(
            &topology.shards().next().ok_or("a shard")?.url,
            tokio_postgres::NoTls,
        )
        .await?;
        tokio::spawn(conn);
        db.query_one("SHOW synchronous_commit", &[]).await?.get(0)
    };
    println!(
        "one shard, synchronous_commit = {commit}, {} calls per figure in {} alternating rounds",
        per_round * cli.rounds,
        cli.rounds
    );
    for (name, what) in [("enqueue", 0), ("start_workflow", 1)] {
        let (mut a, mut b) = (times[0][what].clone(), times[1][what].clone());
        println!(
            "{name:<15} declared + checked: p50 {:.3} ms, p99 {:.3} ms; not declared: p50 {:.3} ms, p99 {:.3} ms",
            ms(&mut a, 0.5),
            ms(&mut a, 0.99),
            ms(&mut b, 0.5),
            ms(&mut b, 0.99)
        );
    }
    Ok(())
}
