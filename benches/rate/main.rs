//! Rate limits: what they cost the claim, and how closely they pace.
//!
//! 1. Claim p50: one queue holds `--keys` rate-limited keys all saturated
//!    (each key's bucket spent for an hour) with `--waiting` tasks waiting on
//!    them, beside plain ready tasks; another queue holds only the plain
//!    ready tasks. Claim + complete is timed on both, alternating in rounds
//!    (the VM is noisy: the two are compared side by side, in one run).
//!    Goal: the limited queue within 1.3× of the plain one.
//! 2. Pace: `--rate` tokens a second (burst 10) for `--pace-secs` seconds,
//!    drained by 4 claimers while a loop runs `maintain()` every second;
//!    tokens granted (tasks claimed) a second against the declared rate.
//!    Goal: within 5% over a minute.
//!
//! Durable commits (the shard's default).
//!
//! ```text
//! cargo run --release -p sheaf-benches --bin rate-bench                      # its own shard (--release), 1,000 keys, 100K waiting, 60 s
//! SHEAF_SHARDS=0=postgres://... cargo run -p sheaf-benches --bin rate-bench -- --keys 50 --waiting 2000 --rounds 2 --pace-secs 5   # CI's smoke run
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;
use sheaf_driver::{Client, EnqueueOptions, Placement, PoolOptions, ShardId, Topology};

#[path = "../support.rs"]
mod support;
use support::{Error, pct};

#[derive(Parser)]
#[command(about = "rate limits: claim p50 beside saturated keys, and tokens granted a second")]
struct Cli {
    /// Rate-limited keys, all saturated.
    #[arg(long, default_value_t = 1_000)]
    keys: i64,
    /// Tasks waiting on them.
    #[arg(long, default_value_t = 100_000)]
    waiting: i64,
    /// Claim + complete samples per queue per round.
    #[arg(long, default_value_t = 500)]
    samples: usize,
    /// Rounds (queue order alternates).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Tokens a second in the pace run.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// How long the pace run measures.
    #[arg(long, default_value_t = 60)]
    pace_secs: u64,
    /// PostgreSQL major of the bench shard.
    #[arg(long, default_value_t = 15)]
    pg: u32,
}

/// Fills `queue` with `waiting` tasks of `keys` saturated keys of limit
/// `limit` (each key's first task spends its bucket for an hour; the rest
/// wait in the lines), written through `sheaf.enqueue_batch` per key.
async fn saturate(
    db: &tokio_postgres::Client,
    limit: &str,
    queue: &str,
    keys: i64,
    waiting: i64,
) -> Result<(), Error> {
    db.execute(
        "SELECT sheaf.declare_rate_limit($1, '{\"rate\": 1, \"period\": \"1 hour\", \"burst\": 1, \"key\": \"payload.k\"}')",
        &[&limit],
    )
    .await?;
    let per_key = (waiting / keys).max(1);
    for k in 0..keys {
        db.execute(
            "SELECT count(*) FROM sheaf.enqueue_batch($1, \
                (SELECT array_agg(jsonb_build_object('k', $3::bigint, 'n', n)) FROM generate_series(1, $4::bigint) n), \
                jsonb_build_object('rate_limit', $2::text))",
            &[&queue, &limit, &k, &(per_key + 1)],
        )
        .await?;
    }
    db.batch_execute("VACUUM ANALYZE sheaf.tasks, sheaf.rate_waiting, sheaf.rate_buckets")
        .await?;
    Ok(())
}

/// Claim + complete latencies (ms) of `n` plain tasks on `queue`.
async fn claims(client: &Client, shard: ShardId, queue: &str, n: usize) -> Result<Vec<f64>, Error> {
    let on = || EnqueueOptions::new().placement(Placement::Shard(shard));
    for i in 0..n {
        client.enqueue(queue, json!({ "plain": i }), on()).await?;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let at = Instant::now();
        let tasks = client
            .claim(shard, queue, "rate-bench", 1, Duration::from_secs(30))
            .await?;
        for t in tasks {
            client.complete(t.task_id, t.token, None).await?;
        }
        out.push(at.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(out)
}

async fn claim_cost(
    cli: &Cli,
    client: &Client,
    db: &tokio_postgres::Client,
    shard: ShardId,
) -> Result<(), Error> {
    let pid = std::process::id();
    let (limit, limited, plain) = (
        format!("bench-{pid}"),
        format!("limited-{pid}"),
        format!("plain-{pid}"),
    );
    let filled = Instant::now();
    saturate(db, &limit, &limited, cli.keys, cli.waiting).await?;
    let waiting: i64 = db
        .query_one(
            "SELECT count(*) FROM sheaf.rate_waiting WHERE name = $1",
            &[&limit],
        )
        .await?
        .get(0);
    println!(
        "{} keys saturated, {waiting} tasks waiting in their lines ({:.0} s to fill)",
        cli.keys,
        filled.elapsed().as_secs_f64()
    );
    let (mut ratios, mut all_limited, mut all_plain) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..cli.rounds {
        let (mut l, mut p) = if round % 2 == 0 {
            let l = claims(client, shard, &limited, cli.samples).await?;
            (l, claims(client, shard, &plain, cli.samples).await?)
        } else {
            let p = claims(client, shard, &plain, cli.samples).await?;
            (claims(client, shard, &limited, cli.samples).await?, p)
        };
        let (lp, pp) = (pct(&mut l, 0.5), pct(&mut p, 0.5));
        println!(
            "round {round}: claim+complete p50 limited queue {lp:.3} ms, plain queue {pp:.3} ms, ratio {:.2}",
            lp / pp
        );
        ratios.push(lp / pp);
        all_limited.extend(l);
        all_plain.extend(p);
    }
    let (lo, hi) = (
        ratios.iter().copied().fold(f64::INFINITY, f64::min),
        ratios.iter().copied().fold(0.0, f64::max),
    );
    println!(
        "claim+complete p50 over {} rounds: limited {:.3} ms, plain {:.3} ms; ratio median {:.2} (spread {lo:.2}..{hi:.2}; goal <= 1.3)",
        cli.rounds,
        pct(&mut all_limited, 0.5),
        pct(&mut all_plain, 0.5),
        pct(&mut ratios, 0.5)
    );
    Ok(())
}

/// `total` tasks of limit `limit` on `queue`, in batches of 10,000.
async fn fill(db: &tokio_postgres::Client, queue: &str, limit: &str, total: i64) -> Result<(), Error> {
    let mut enqueued = 0;
    while enqueued < total {
        let n = (total - enqueued).min(10_000);
        db.execute(
            "SELECT count(*) FROM sheaf.enqueue_batch($1, \
                (SELECT array_agg(jsonb_build_object('n', n)) FROM generate_series(1, $3::bigint) n), \
                jsonb_build_object('rate_limit', $2::text))",
            &[&queue, &limit, &n],
        )
        .await?;
        enqueued += n;
    }
    Ok(())
}

async fn pace(
    cli: &Cli,
    client: Arc<Client>,
    db: &tokio_postgres::Client,
    shard: ShardId,
) -> Result<(), Error> {
    let pid = std::process::id();
    let (limit, queue) = (format!("pace-{pid}"), format!("pace-{pid}"));
    db.execute(
        "SELECT sheaf.declare_rate_limit($1, jsonb_build_object('rate', $2::float8, 'period', '1s', 'burst', 10))",
        &[&limit, &cli.rate],
    )
    .await?;
    // More than the run can drain, so the bucket is the only limit.
    let total = (cli.rate * (cli.pace_secs as f64 + 40.0)) as i64;
    fill(db, &queue, &limit, total).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let claimed = Arc::new(AtomicU64::new(0));
    let maintainer = {
        let (client, stop) = (client.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let _ = client.admin().maintain(shard).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let claimers: Vec<_> = (0..4)
        .map(|w| {
            let (client, stop, claimed, queue) =
                (client.clone(), stop.clone(), claimed.clone(), queue.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match client
                        .claim(shard, &queue, &format!("pace-{w}"), 16, Duration::from_secs(30))
                        .await
                    {
                        Ok(tasks) if !tasks.is_empty() => {
                            for t in tasks {
                                if client.complete(t.task_id, t.token, None).await.is_ok() {
                                    claimed.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        _ => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                }
            })
        })
        .collect();
    // The burst and the first second are left out: the steady pace is measured.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (start, began) = (claimed.load(Ordering::Relaxed), Instant::now());
    let mut per_second = Vec::new();
    let mut last = start;
    while began.elapsed() < Duration::from_secs(cli.pace_secs) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = claimed.load(Ordering::Relaxed);
        per_second.push((now - last) as f64);
        last = now;
    }
    let secs = began.elapsed().as_secs_f64();
    let granted = (claimed.load(Ordering::Relaxed) - start) as f64 / secs;
    stop.store(true, Ordering::Relaxed);
    for c in claimers {
        c.await?;
    }
    maintainer.await?;
    println!(
        "pace: declared {:.1}/s; granted {granted:.2}/s over {secs:.0} s ({:+.2}%; goal within 5%); \
         per second p50 {:.0}, min {:.0}, max {:.0}",
        cli.rate,
        (granted / cli.rate - 1.0) * 100.0,
        pct(&mut per_second, 0.5),
        per_second.first().copied().unwrap_or(0.0),
        per_second.last().copied().unwrap_or(0.0)
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let cli = Cli::parse();
    let spec = match std::env::var("SHEAF_SHARDS") {
        Ok(s) => s,
        Err(_) => support::release_shards(1, cli.pg, "/tmp/sheaf-bench-rate", 25975)?,
    };
    let topology = Topology::parse(&spec)?;
    let shard = topology.shards().next().ok_or("a shard")?;
    let (db, conn) = tokio_postgres::connect(&shard.url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let shard = shard.id;
    let client = Arc::new(Client::new(topology.clone(), PoolOptions::default())?);
    claim_cost(&cli, &client, &db, shard).await?;
    pace(&cli, client, &db, shard).await?;
    Ok(())
}
