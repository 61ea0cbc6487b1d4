//! Rebalancing: executions moved per second (each with a 20-event history
//! of 1 KB payloads), the unavailability window of each move (cutover
//! commit to claimable on the target) p50/p99, and a dry run over a large
//! population. Durable and asynchronous commits side by side, in
//! alternating rounds on the same two shards (the same databases; the
//! second client's connections set `synchronous_commit = off`).
//!
//! ```text
//! cargo run --release -p sheaf-benches --bin rebalance-bench        # its own 2 shards (scripts/shards, --release)
//! cargo run --release -p sheaf-benches --bin rebalance-bench -- --executions 10000 --rounds 5 --dry 100000
//! SHEAF_SHARDS=0=postgres://...,1=postgres://... cargo run -p sheaf-benches --bin rebalance-bench -- --executions 50 --rounds 1 --dry 200
//! ```

use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use serde_json::json;
use sheaf_driver::{Client, MoveOutcome, PoolOptions, RebalanceOptions, ShardId, Topology};

#[derive(Parser)]
#[command(about = "rebalance throughput, unavailability window and dry-run cost")]
struct Cli {
    /// Executions moved per commit mode, split over the rounds (0: only
    /// the dry run).
    #[arg(long, default_value_t = 10_000)]
    executions: usize,
    /// Events in each history (1 KB payloads).
    #[arg(long, default_value_t = 20)]
    events: usize,
    /// Alternating rounds (durable, async, durable, ...).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Executions the dry run reads (0: none).
    #[arg(long, default_value_t = 100_000)]
    dry: usize,
    /// PostgreSQL major of the bench clusters.
    #[arg(long, default_value_t = 15)]
    pg: u32,
}

#[path = "../support.rs"]
mod support;
use support::{Error, pct};

async fn sql(topology: &Topology, shard: ShardId) -> Result<tokio_postgres::Client, Error> {
    let url = &topology.get(shard).ok_or("a shard")?.url;
    let (db, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    Ok(db)
}

/// `n` runs of `name` on `shard`, each with `events` 1 KB events, made
/// inside the database (the setup is not what is measured).
async fn populate(
    db: &tokio_postgres::Client,
    name: &str,
    tag: &str,
    n: usize,
    events: usize,
) -> Result<(), Error> {
    // In transactions of at most 5,000 starts: each holds advisory locks
    // until it commits, and a lock table has room for so many.
    for (i, start) in (0..n).step_by(5000).enumerate() {
        populate_chunk(db, name, &format!("{tag}-{i}"), (n - start).min(5000), events).await?;
    }
    Ok(())
}

async fn populate_chunk(
    db: &tokio_postgres::Client,
    name: &str,
    tag: &str,
    n: usize,
    events: usize,
) -> Result<(), Error> {
    let n = n as i64;
    let events = events as i64;
    if events == 0 {
        db.execute(
            "SELECT count(*) FROM (SELECT sheaf.start_workflow($1, $2 || '-' || g, '{}', '{}') \
             FROM generate_series(1, $3::bigint) g) s",
            &[&name, &tag, &n],
        )
        .await?;
        return Ok(());
    }
    db.execute(
        "WITH s AS (SELECT (sheaf.start_workflow($1, $2 || '-' || g, '{}', '{}')).execution_id AS id \
                    FROM generate_series(1, $3::bigint) g) \
         SELECT count(sheaf.append_event(s.id, 'Note', jsonb_build_object('pad', repeat('x', 1000), 'n', e))) \
         FROM s, generate_series(1, $4::bigint) e",
        &[&name, &tag, &n, &events],
    )
    .await?;
    Ok(())
}

struct Round {
    moved: usize,
    secs: f64,
    windows_ms: Vec<f64>,
}

async fn round(c: &Client, from: ShardId, to: ShardId, limit: usize) -> Result<Round, Error> {
    let t = Instant::now();
    let reports = c
        .admin()
        .rebalance(from, to, &RebalanceOptions::default().limit(limit), |_, _| {})
        .await?;
    let secs = t.elapsed().as_secs_f64();
    let mut windows_ms = Vec::new();
    for r in &reports {
        if let Ok(MoveOutcome::Moved { unavailable, .. }) = &r.outcome {
            windows_ms.push(unavailable.as_secs_f64() * 1000.0);
        }
    }
    Ok(Round {
        moved: windows_ms.len(),
        secs,
        windows_ms,
    })
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let cli = Cli::parse();
    let spec = match std::env::var("SHEAF_SHARDS") {
        Ok(s) => s,
        Err(_) => support::release_shards(2, cli.pg, "/tmp/sheaf-bench-rebalance", 25975)?,
    };
    let durable = Topology::parse(&spec)?;
    let async_spec: Vec<String> = durable
        .shards()
        .map(|s| {
            let sep = if s.url.contains('?') { '&' } else { '?' };
            format!("{}={}{sep}options=-c%20synchronous_commit%3Doff", s.id, s.url)
        })
        .collect();
    let fast = Topology::parse(&async_spec.join(","))?;
    let mut ids = durable.shards().map(|s| s.id);
    let (a, b) = (ids.next().ok_or("two shards")?, ids.next().ok_or("two shards")?);
    let clients = [
        (
            "durable",
            Arc::new(Client::new(durable.clone(), PoolOptions::default())?),
        ),
        ("async", Arc::new(Client::new(fast, PoolOptions::default())?)),
    ];
    let name = format!("rebalance-bench-{}", std::process::id());
    let admin = clients[0].1.admin();
    let report = admin.declare_workflow(&name, json!({"queue": name})).await;
    if !report.is_complete() {
        return Err(format!("declaring the workflow failed: {:?}", report.failed).into());
    }
    let db_a = sql(&durable, a).await?;
    let per_round = cli.executions / cli.rounds.max(1);
    println!(
        "two shards; {} executions per commit mode in {} alternating rounds, {} events of 1 KB each",
        per_round * cli.rounds.max(1),
        cli.rounds.max(1),
        cli.events
    );
    let mut results: [(Vec<f64>, Vec<f64>); 2] = Default::default();
    for r in (0..cli.rounds.max(1)).filter(|_| per_round > 0) {
        for (i, (_, c)) in clients.iter().enumerate() {
            populate(&db_a, &name, &format!("r{r}-{i}"), per_round, cli.events).await?;
            let got = round(c, a, b, per_round).await?;
            results[i].0.push(got.moved as f64 / got.secs);
            results[i].1.extend(got.windows_ms);
        }
    }
    for (i, (mode, _)) in clients.iter().enumerate().filter(|_| per_round > 0) {
        let (rates, windows) = &mut results[i];
        let (lo, hi) = (
            rates.iter().copied().fold(f64::INFINITY, f64::min),
            rates.iter().copied().fold(0.0, f64::max),
        );
        println!(
            "{mode:<8} moves/s median {:.0} (rounds {lo:.0}..{hi:.0}); unavailable p50 {:.2} ms, p99 {:.2} ms ({} moves)",
            pct(rates, 0.5),
            pct(windows, 0.5),
            pct(windows, 0.99),
            windows.len()
        );
    }
    if cli.dry > 0 {
        populate(&db_a, &name, "dry", cli.dry, 0).await?;
        let mut secs = Vec::new();
        let mut seen = 0;
        for _ in 0..3 {
            let t = Instant::now();
            let reports = admin
                .rebalance(a, b, &RebalanceOptions::default().dry_run(true), |_, _| {})
                .await?;
            secs.push(t.elapsed().as_secs_f64());
            seen = reports.len();
        }
        println!(
            "dry run over {seen} unfinished executions: median {:.2} s (3 runs: {:.2}..{:.2} s)",
            pct(&mut secs.clone(), 0.5),
            secs.iter().copied().fold(f64::INFINITY, f64::min),
            secs.iter().copied().fold(0.0, f64::max)
        );
    }
    Ok(())
}
