//! What N shards cost the driver: the connections a `Worker` process (with
//! its relay, and without), a standalone `Relay` and a reading client hold
//! at 4, 16 and 64 shards, and the fan-out reads' latency at each width
//! (`list_executions` page 1, `find_execution`).
//!
//! ```text
//! cargo run --release -p sheaf-benches --bin width-bench                                 # 4,16,64 shards, 16 databases per cluster
//! cargo run --release -p sheaf-benches --bin width-bench -- --widths 4,16 --per-cluster 4 --reps 50
//! ```
//! The shards are databases spread over a few local clusters of its own
//! (`scripts/shards up --bare --release`, PostgreSQL `--pg`): shard `i` is
//! database `sheaf_s<i>` on cluster `i % clusters`, so every width spreads
//! over every cluster. Each driver role connects with an `application_name`
//! of its own, and its connections are counted in `pg_stat_activity`:
//! idle (started, nothing to do), peak (sampled every 100 ms while a burst
//! of tasks spread over every shard is worked off) and held after it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;
use sheaf_driver::{
    Client, EnqueueOptions, ExecutionFilter, PoolOptions, Relay, RelayOptions, Resolution, SortOrder,
    TaskDone, Topology, Worker, WorkerOptions,
};
use tokio_postgres::NoTls;

#[path = "../support.rs"]
mod support;
use support::{Error, fill, pct};

#[derive(Parser)]
#[command(about = "Connections per worker, relay and reader, and fan-out read latency, at N shards")]
struct Cli {
    /// The fleet widths measured (shards).
    #[arg(long, value_delimiter = ',', default_values_t = [4, 16, 64])]
    widths: Vec<usize>,
    /// Shard databases per cluster (the clusters: the widest width / this).
    #[arg(long, default_value_t = 16)]
    per_cluster: usize,
    /// Executions per shard, for the fan-out reads.
    #[arg(long, default_value_t = 2_000)]
    per_shard: u32,
    /// Tasks per shard in the burst the worker works off.
    #[arg(long, default_value_t = 50)]
    tasks_per_shard: usize,
    /// Queues the worker claims from (the burst is spread over them): its
    /// connections do not grow with them.
    #[arg(long, default_value_t = 4)]
    queues: usize,
    /// The worker's concurrency.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Calls per read figure.
    #[arg(long, default_value_t = 200)]
    reps: usize,
    /// PostgreSQL major of the clusters.
    #[arg(long, default_value_t = 15)]
    pg: u32,
}

/// The clusters' admin connections (database `postgres`), and each shard's
/// URL without its application name.
struct Fleet {
    admins: Vec<tokio_postgres::Client>,
    shards: Vec<String>,
}

impl Fleet {
    /// `width` shards, each role's connections named `role`.
    fn topology(&self, width: usize, role: &str) -> Result<Topology, Error> {
        let spec = self.shards[..width]
            .iter()
            .enumerate()
            .map(|(i, url)| format!("{i}={url}?application_name={role}"))
            .collect::<Vec<_>>()
            .join(",");
        Ok(Topology::parse(&spec)?)
    }

    /// Connections named `role`: in all, and on the busiest shard.
    async fn connections(&self, role: &str) -> Result<(i64, i64), Error> {
        let (mut all, mut busiest) = (0, 0);
        for admin in &self.admins {
            for row in admin
                .query(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 GROUP BY datname",
                    &[&role],
                )
                .await?
            {
                let n: i64 = row.get(0);
                all += n;
                busiest = busiest.max(n);
            }
        }
        Ok((all, busiest))
    }

    /// Waits until no connection is named `role` (a dropped client's
    /// connections close in the background).
    async fn gone(&self, role: &str) -> Result<(), Error> {
        let until = Instant::now() + Duration::from_secs(30);
        while self.connections(role).await?.0 > 0 {
            if Instant::now() > until {
                return Err(format!("connections of {role} still open after 30 s").into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

/// Starts the clusters and makes `shards` shard databases over them
/// (kept between runs: a database that has the extension is reused).
async fn fleet(cli: &Cli, shards: usize) -> Result<Fleet, Error> {
    let clusters = shards.div_ceil(cli.per_cluster).max(1);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new(root.join("scripts/shards"))
        .args(["up", "--bare", "--release", "--count", &clusters.to_string()])
        .args(["--pg", &cli.pg.to_string(), "--dir", "/tmp/sheaf-bench/width"])
        .args(["--base-port", "26200"])
        .output()?;
    if !out.status.success() {
        return Err(format!("scripts/shards: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let bases: Vec<String> = String::from_utf8(out.stdout)?
        .lines()
        .filter_map(|l| {
            l.split_once('=')
                .map(|(_, url)| url.trim_end_matches("/postgres").to_owned())
        })
        .collect();
    let mut admins = Vec::new();
    for base in &bases {
        let (db, conn) = tokio_postgres::connect(&format!("{base}/postgres"), NoTls).await?;
        tokio::spawn(conn);
        admins.push(db);
    }
    let made = (0..clusters).map(|c| {
        let (admin, base) = (&admins[c], &bases[c]);
        async move {
            for i in (c..shards).step_by(clusters) {
                make_shard(admin, base, i).await?;
            }
            Ok::<_, Error>(())
        }
    });
    for r in futures::future::join_all(made).await {
        r?;
    }
    let shards = (0..shards)
        .map(|i| format!("{}/sheaf_s{i}", bases[i % clusters]))
        .collect();
    Ok(Fleet { admins, shards })
}

/// Shard `i`: database `sheaf_s<i>` with the extension, initialised as `i`.
async fn make_shard(admin: &tokio_postgres::Client, base: &str, i: usize) -> Result<(), Error> {
    let name = format!("sheaf_s{i}");
    let exists = admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await?
        .is_some();
    if !exists {
        admin.batch_execute(&format!("CREATE DATABASE {name}")).await?;
    }
    let (db, conn) = tokio_postgres::connect(&format!("{base}/{name}"), NoTls).await?;
    let conn = tokio::spawn(conn);
    let has = db
        .query_opt("SELECT 1 FROM pg_extension WHERE extname = 'sheaf'", &[])
        .await?
        .is_some();
    if !has {
        db.batch_execute("CREATE EXTENSION sheaf").await?;
        db.execute("SELECT sheaf.init_shard($1)", &[&(i as i32)]).await?;
    }
    drop(db);
    conn.await??;
    Ok(())
}

/// Connections of one role: idle, peak while the burst is worked off, and
/// held after it.
#[derive(Default)]
struct Held {
    idle: (i64, i64),
    peak: (i64, i64),
    after: (i64, i64),
}

impl Held {
    fn show(&self, width: usize) -> String {
        let per = |n: i64| n as f64 / width as f64;
        format!(
            "{:>4} / {:>4} / {:>4}  ({:.1} per shard at peak, busiest shard {})",
            self.idle.0,
            self.peak.0,
            self.after.0,
            per(self.peak.0),
            self.peak.1
        )
    }
}

/// A worker (with or without its relay) over `width` shards: its
/// connections while a burst of tasks on every shard is worked off.
async fn worker(cli: &Cli, fleet: &Fleet, width: usize, relay: bool) -> Result<Held, Error> {
    let role = if relay {
        "width-worker"
    } else {
        "width-worker-bare"
    };
    let client = Arc::new(Client::new(fleet.topology(width, role)?, PoolOptions::default())?);
    let queues: Vec<String> = (0..cli.queues.max(1)).map(|q| format!("width-{q}")).collect();
    let mut options = WorkerOptions::new(role, queues.clone()).concurrency(cli.concurrency);
    if !relay {
        options = options.relay(None).rebalance_resume(None);
    }
    let done = Arc::new(AtomicU64::new(0));
    let counted = done.clone();
    let w = Worker::start(client, options, move |_| {
        let done = counted.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            done.fetch_add(1, Ordering::Relaxed);
            Ok(TaskDone::Complete(None))
        }
    })?;
    // Its listeners and first claims settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut held = Held {
        idle: fleet.connections(role).await?,
        ..Held::default()
    };
    held.peak = held.idle;
    let producer = Client::new(fleet.topology(width, "width-producer")?, PoolOptions::default())?;
    let total = (cli.tasks_per_shard * width) as u64;
    for chunk in (0..total).collect::<Vec<_>>().chunks(64) {
        let sends = chunk.iter().map(|k| {
            producer.enqueue(
                &queues[*k as usize % queues.len()],
                json!({ "k": k }),
                EnqueueOptions::new(),
            )
        });
        for r in futures::future::join_all(sends).await {
            r?;
        }
        let now = fleet.connections(role).await?;
        held.peak = (held.peak.0.max(now.0), held.peak.1.max(now.1));
    }
    let until = Instant::now() + Duration::from_secs(300);
    while done.load(Ordering::Relaxed) < total {
        if Instant::now() > until {
            return Err(format!(
                "{role}: {} of {total} tasks done after 300 s",
                done.load(Ordering::Relaxed)
            )
            .into());
        }
        let now = fleet.connections(role).await?;
        held.peak = (held.peak.0.max(now.0), held.peak.1.max(now.1));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    held.after = fleet.connections(role).await?;
    w.shutdown().await;
    drop(producer);
    fleet.gone(role).await?;
    fleet.gone("width-producer").await?;
    Ok(held)
}

/// A standalone relay over `width` shards, idle for a few sweeps.
async fn relay(fleet: &Fleet, width: usize) -> Result<(i64, i64), Error> {
    let role = "width-relay";
    let client = Arc::new(Client::new(fleet.topology(width, role)?, PoolOptions::default())?);
    let shards = client.topology().shards().map(|s| s.id).collect();
    let r = Relay::start(client, shards, RelayOptions::default());
    tokio::time::sleep(Duration::from_secs(4)).await;
    let held = fleet.connections(role).await?;
    r.shutdown().await;
    fleet.gone(role).await?;
    Ok(held)
}

/// p50 and p99 (ms) of `reps` calls of `call`.
async fn timed<F, Fut>(reps: usize, mut call: F) -> Result<(f64, f64), Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), Error>>,
{
    let mut ms = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        call().await?;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((pct(&mut ms, 0.5), pct(&mut ms, 0.99)))
}

/// Fan-out reads at `width`: a page of executions and a find, p50/p99; and
/// the reading client's connections after them.
async fn reads(cli: &Cli, fleet: &Fleet, width: usize) -> Result<BTreeMap<&'static str, (f64, f64)>, Error> {
    let role = "width-reader";
    let c = Client::new(fleet.topology(width, role)?, PoolOptions::default())?;
    let filter = ExecutionFilter::new();
    let mut out = BTreeMap::new();
    let page = timed(cli.reps, || async {
        c.list_executions(&filter, None, 50, SortOrder::Desc).await?;
        Ok(())
    })
    .await?;
    out.insert("list", page);
    let find = timed(cli.reps, || async {
        match c.find_execution("bench-3", "b-3").await? {
            Resolution::Found { .. } => Ok(()),
            other => Err(format!("find: {other:?}").into()),
        }
    })
    .await?;
    out.insert("find", find);
    let (n, _) = fleet.connections(role).await?;
    out.insert("reader connections", (n as f64, n as f64 / width as f64));
    drop(c);
    fleet.gone(role).await?;
    Ok(out)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let cli = Cli::parse();
    let widest = cli.widths.iter().copied().max().ok_or("no width")?;
    if cli.widths.contains(&0) || widest > 99 {
        return Err("widths are 1..99 shards".into());
    }
    let started = Instant::now();
    let fleet = fleet(&cli, widest).await?;
    let fills = fleet.shards.iter().map(|url| fill(url, cli.per_shard));
    for r in futures::future::join_all(fills).await {
        r?;
    }
    println!(
        "{widest} shards over {} clusters of PostgreSQL {} ({} databases each), {} executions per shard, ready in {:.0?}",
        fleet.admins.len(),
        cli.pg,
        cli.per_cluster,
        cli.per_shard,
        started.elapsed()
    );
    println!(
        "worker: {} queues, concurrency {}, a burst of {} tasks per shard; connections idle / peak / after the burst\n",
        cli.queues, cli.concurrency, cli.tasks_per_shard
    );
    for &width in &cli.widths {
        let with_relay = worker(&cli, &fleet, width, true).await?;
        let bare = worker(&cli, &fleet, width, false).await?;
        let (relay_all, relay_busiest) = relay(&fleet, width).await?;
        let r = reads(&cli, &fleet, width).await?;
        println!("{width} shards");
        println!("  worker + relay     {}", with_relay.show(width));
        println!("  worker, no relay   {}", bare.show(width));
        println!("  relay alone        {relay_all:>4} (busiest shard {relay_busiest})");
        println!(
            "  reader             {:>4} after the reads below",
            r["reader connections"].0
        );
        println!(
            "  list page 1        p50 {:.2} ms  p99 {:.2} ms",
            r["list"].0, r["list"].1
        );
        println!(
            "  find               p50 {:.2} ms  p99 {:.2} ms\n",
            r["find"].0, r["find"].1
        );
    }
    Ok(())
}
