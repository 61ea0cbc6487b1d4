//! The claim benchmark: sheaf against the textbook `FOR UPDATE SKIP LOCKED`
//! queue, in the same Postgres, on the same workload.
//!
//! A custom harness, because claims consume rows: every measured cycle is
//! enqueue + claim + complete, so the backlog stays at the depth under test.
//!
//! ```text
//! cargo run --release -p sheaf-benches --bin claim-bench -- modes      # every mode, 1K..1M, 16 rounds of 1 s windows
//! cargo run --release -p sheaf-benches --bin claim-bench -- modes --modes plain --commit async
//! cargo run --release -p sheaf-benches --bin claim-bench -- batch      # batch 100 vs single
//! cargo run --release -p sheaf-benches --bin claim-bench -- steady --minutes 10
//! cargo run --release -p sheaf-benches --bin claim-bench -- snapshot --secs 60 --modes plain --depths 1000
//! cargo run --release -p sheaf-benches --bin claim-bench -- gates      # admission gates, quota, mutex
//! cargo run --release -p sheaf-benches --bin claim-bench -- smoke      # seconds, for CI
//! ```
//! Without `--url` it starts its own one-shard cluster with `scripts/shards`.

mod gates;
mod systems;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use systems::{Ops, System, queue_name};
use tokio_postgres::{Client, NoTls};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// One queue, random priorities 0..3.
    Plain,
    /// The backlog spread over 64 queues.
    Queues64,
    /// A key capped at 1 holding 100K rows at the head of the queue.
    Saturated,
    /// Every task under one of 4 keys capped far above the backlog: each
    /// enqueue takes a slot and each completion frees one.
    Capped,
    /// Priority aging (60 s per step).
    Aging,
    /// Fairness over 5,000 keys.
    Fairness,
    /// 1M tasks scheduled far in the future, besides the due backlog.
    Future,
}

/// How the measured clients commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Commit {
    /// `synchronous_commit = on`: every commit waits for its WAL flush.
    Durable,
    /// `synchronous_commit = off`: the CPU cost, without the fsync.
    Async,
}

#[derive(Parser)]
#[command(about = "Claim latency and throughput vs backlog depth: sheaf and the textbook SKIP LOCKED queue")]
struct Cli {
    /// A database to use (it is wiped). Default: a bench cluster started with scripts/shards.
    #[arg(long, env = "SHEAF_BENCH_URL")]
    url: Option<String>,
    /// Concurrent clients.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every mode at every depth, both systems.
    Modes {
        #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000,1000000")]
        depths: Vec<i64>,
        #[arg(long, value_delimiter = ',', value_enum)]
        modes: Option<Vec<Mode>>,
        /// Seconds per measured window.
        #[arg(long, default_value_t = 1)]
        secs: u64,
        /// Rounds per mode and depth: a window each of sheaf, the textbook
        /// queue and the 1K reference queue. Throughput is the median window,
        /// the ratio the median round's (with the quartiles of the rounds'),
        /// latencies are pooled.
        #[arg(long, default_value_t = 16)]
        rounds: usize,
        /// How the measured clients commit.
        #[arg(long, value_enum, default_value = "durable")]
        commit: Commit,
    },
    /// Throughput of claim/complete in batches of 100 vs one at a time.
    Batch {
        #[arg(long, default_value_t = 5)]
        secs: u64,
    },
    /// A long steady run: tasks/s each minute (and against a 1K reference),
    /// table and index sizes at the end.
    Steady {
        #[arg(long, default_value_t = 10)]
        minutes: u64,
    },
    /// Throughput while a REPEATABLE READ transaction holds a snapshot, vs
    /// without, per mode, depth and commit mode; dead tuples at the end of
    /// the held window, and how long after it they take to come back down.
    Snapshot(SnapshotRuns),
    /// start_workflow admissions per policy, quota check cost vs history size, mutex cycles.
    Gates {
        /// Seconds measured per row.
        #[arg(long, default_value_t = 5)]
        secs: u64,
        /// Events in the big history of the quota row.
        #[arg(long, default_value_t = 1_000_000)]
        events: i64,
        /// Clients contending for one mutex key.
        #[arg(long, default_value_t = 8)]
        contenders: usize,
    },
    /// Every mode at 1K for a second, and gates with 1-second rows: proves the harness runs (CI).
    Smoke,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let url = match cli.url.clone() {
        Some(url) => url,
        None => start_bench_shard()?,
    };
    let admin = connect(&url).await?;
    admin.batch_execute("SET client_min_messages = warning").await?;
    let clients = cli.clients;
    match cli.command {
        Cmd::Modes {
            depths,
            modes,
            secs,
            rounds,
            commit,
        } => {
            let modes = modes.unwrap_or_else(|| Mode::value_variants().to_vec());
            run_modes(
                &url,
                &admin,
                &modes,
                &depths,
                Duration::from_secs(secs),
                rounds.max(1),
                clients,
                1,
                commit,
            )
            .await?
        }
        Cmd::Smoke => {
            // The fixed extras shrink 100-fold: a smoke run proves the harness, not the figures.
            run_modes(
                &url,
                &admin,
                Mode::value_variants(),
                &[1000],
                Duration::from_secs(1),
                1,
                2,
                100,
                Commit::Durable,
            )
            .await?;
            let opts = gates::Opts {
                window: Duration::from_secs(1),
                clients: 2,
                history_events: 10_000,
                contenders: 8,
            };
            gates::run(&url, &admin, &opts).await?
        }
        Cmd::Gates {
            secs,
            events,
            contenders,
        } => {
            let opts = gates::Opts {
                window: Duration::from_secs(secs),
                clients,
                history_events: events,
                contenders,
            };
            gates::run(&url, &admin, &opts).await?
        }
        Cmd::Batch { secs } => run_batch(&url, &admin, Duration::from_secs(secs)).await?,
        Cmd::Steady { minutes } => run_steady(&url, &admin, minutes, clients).await?,
        Cmd::Snapshot(runs) => run_snapshot(&url, &admin, &runs, clients).await?,
    }
    Ok(())
}

fn start_bench_shard() -> Result<String, Box<dyn std::error::Error>> {
    // Read at run time (cargo run sets it): a shared target directory can
    // hand this checkout a binary built in another one.
    let manifest =
        std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    let root = PathBuf::from(manifest).join("..");
    let out = Command::new(root.join("scripts/shards"))
        .args([
            "up",
            "--count",
            "1",
            "--pg",
            "15",
            "--dir",
            "/tmp/sheaf-bench/pg15",
            "--base-port",
            "26150",
            "--release",
        ])
        .output()?;
    if !out.status.success() {
        return Err(format!("scripts/shards failed:\n{}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let line = String::from_utf8(out.stdout)?;
    let url = line
        .trim()
        .split_once('=')
        .map(|(_, u)| u.to_owned())
        .ok_or("no shard printed")?;
    Ok(url)
}

async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// What one measurement saw.
struct Measured {
    cycles: u64,
    elapsed: Duration,
    claim_latencies: Vec<Duration>,
    /// When each cycle ended, from the window's start.
    ends: Vec<Duration>,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.cycles as f64 / self.elapsed.as_secs_f64()
    }

    /// Windows run one after another, as one.
    fn sum(windows: Vec<Measured>) -> Measured {
        let mut all = Measured {
            cycles: 0,
            elapsed: Duration::ZERO,
            claim_latencies: Vec::new(),
            ends: Vec::new(),
        };
        for w in windows {
            all.ends.extend(w.ends.iter().map(|e| all.elapsed + *e));
            all.cycles += w.cycles;
            all.elapsed += w.elapsed;
            all.claim_latencies.extend(w.claim_latencies);
        }
        all
    }

    /// Several windows as one: the median window's throughput, every
    /// window's latencies.
    fn pool(mut windows: Vec<Measured>) -> Measured {
        windows.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
        let median = windows.len() / 2;
        let claim_latencies = windows
            .iter_mut()
            .flat_map(|w| std::mem::take(&mut w.claim_latencies))
            .collect();
        let Measured {
            cycles,
            elapsed,
            ends,
            ..
        } = windows.swap_remove(median);
        Measured {
            cycles,
            elapsed,
            claim_latencies,
            ends,
        }
    }

    /// Cycles per second in each of `n` equal slices of the window: whether
    /// a held snapshot's cost grows while it is held.
    fn slices(&self, n: usize) -> Vec<f64> {
        let slice = self.elapsed / n as u32;
        let mut counts = vec![0u64; n];
        for end in &self.ends {
            let i = (end.as_secs_f64() / slice.as_secs_f64()) as usize;
            counts[i.min(n - 1)] += 1;
        }
        counts.iter().map(|c| *c as f64 / slice.as_secs_f64()).collect()
    }

    fn percentile_ms(&self, p: f64) -> f64 {
        if self.claim_latencies.is_empty() {
            return f64::NAN;
        }
        let mut v = self.claim_latencies.clone();
        v.sort();
        let i = ((v.len() as f64 - 1.0) * p).round() as usize;
        v[i].as_secs_f64() * 1000.0
    }
}

/// `clients` connections of one system, kept open across measured windows,
/// so a window measures cycles, not connection set-up: windows can be short
/// and many, alternating with the other system's.
struct Pool {
    mode: Mode,
    clients: Vec<Arc<(Client, Ops)>>,
    /// Each client's next workload index (queue, priority, fairness key).
    next: Vec<usize>,
}

impl Pool {
    async fn open(
        url: &str,
        system: System,
        mode: Mode,
        clients: usize,
    ) -> Result<Pool, tokio_postgres::Error> {
        Pool::open_with(url, system, mode, clients, Commit::Durable).await
    }

    async fn open_with(
        url: &str,
        system: System,
        mode: Mode,
        clients: usize,
        commit: Commit,
    ) -> Result<Pool, tokio_postgres::Error> {
        let mut pool = Pool {
            mode,
            clients: Vec::new(),
            next: (0..clients).collect(),
        };
        for _ in 0..clients {
            let db = connect(url).await?;
            if commit == Commit::Async {
                db.batch_execute("SET synchronous_commit = off").await?;
            }
            let ops = Ops::prepare(&db, system, mode).await?;
            pool.clients.push(Arc::new((db, ops)));
        }
        Ok(pool)
    }

    /// Every client runs full cycles (enqueue one, claim one, complete it)
    /// for `window`; at least one cycle each.
    async fn window(&mut self, window: Duration) -> Result<Measured, Box<dyn std::error::Error>> {
        let started = Instant::now();
        let stride = self.clients.len();
        let mut handles = Vec::new();
        for (c, start) in self.clients.iter().zip(&self.next) {
            let (c, mode, start) = (c.clone(), self.mode, *start);
            handles.push(tokio::spawn(async move {
                let (db, ops) = &*c;
                let (mut lat, mut ends) = (Vec::new(), Vec::new());
                let mut i = start;
                let deadline = Instant::now() + window;
                loop {
                    let queue = queue_name(mode, i);
                    let fkey = format!("f{}", i % systems::FAIR_KEYS as usize);
                    let fairness_key = (mode == Mode::Fairness).then_some(fkey.as_str());
                    let ckey = systems::capped_key(i as i64);
                    let concurrency_key = (mode == Mode::Capped).then_some(ckey.as_str());
                    ops.enqueue(db, &queue, (i % 4) as i32, fairness_key, concurrency_key)
                        .await?;
                    let t = Instant::now();
                    let claimed = ops.claim(db, &queue, 1).await?;
                    lat.push(t.elapsed());
                    for task in &claimed {
                        ops.complete(db, task).await?;
                    }
                    ends.push(started.elapsed());
                    i += stride;
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                Ok::<_, tokio_postgres::Error>((i, lat, ends))
            }));
        }
        let mut measured = Measured {
            cycles: 0,
            elapsed: Duration::ZERO,
            claim_latencies: Vec::new(),
            ends: Vec::new(),
        };
        for (h, next) in handles.into_iter().zip(self.next.iter_mut()) {
            let (i, lat, ends) = h.await??;
            measured.cycles += lat.len() as u64;
            measured.claim_latencies.extend(lat);
            measured.ends.extend(ends);
            *next = i;
        }
        measured.elapsed = started.elapsed();
        Ok(measured)
    }
}

/// The database of the 1K reference queue: beside the one under test, in the
/// same cluster.
fn reference_url(url: &str) -> String {
    let name = |db: &str| format!("{db}_ref");
    if let Some((scheme, rest)) = url.split_once("://") {
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (db, query) = path.split_once('?').map_or((path, None), |(d, q)| (d, Some(q)));
        let db = if db.is_empty() { "postgres" } else { db };
        let query = query.map(|q| format!("?{q}")).unwrap_or_default();
        format!("{scheme}://{authority}/{}{query}", name(db))
    } else {
        let db = url
            .split_whitespace()
            .filter_map(|kv| kv.strip_prefix("dbname="))
            .next_back()
            .unwrap_or("postgres");
        format!("{url} dbname={}", name(db))
    }
}

/// Creates the reference database afresh.
async fn create_reference(admin: &Client, url: &str) -> Result<Client, Box<dyn std::error::Error>> {
    let reference = reference_url(url);
    let config: tokio_postgres::Config = reference.parse()?;
    let db = config.get_dbname().ok_or("the reference url names no database")?;
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"))
        .await?;
    admin.batch_execute(&format!("CREATE DATABASE \"{db}\"")).await?;
    let client = connect(&reference).await?;
    client.batch_execute("SET client_min_messages = warning").await?;
    Ok(client)
}

/// The median of each round's sheaf ÷ textbook throughput, with the
/// quartiles: the spread shows how much of a ratio near 1 is the machine.
fn round_ratios(s: &[Measured], t: &[Measured]) -> (f64, f64, f64) {
    let mut r: Vec<f64> = s.iter().zip(t).map(|(s, t)| s.rate() / t.rate()).collect();
    r.sort_by(f64::total_cmp);
    let at = |q: f64| r[((r.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.25), at(0.75))
}

/// Every mode at every depth. Each round measures three windows: sheaf and
/// the textbook queue at the depth under test, and sheaf on a reference
/// queue held at the first depth in a database of its own; the order
/// reverses every round. This machine's speed drifts by ±20 % over seconds
/// and minutes, so both comparisons are made between windows seconds apart:
/// the throughput ratio is the median round's, and the depth ratio divides
/// the p50 at this depth by the reference's p50 over the same rounds.
#[allow(clippy::too_many_arguments)]
async fn run_modes(
    url: &str,
    admin: &Client,
    modes: &[Mode],
    depths: &[i64],
    window: Duration,
    rounds: usize,
    clients: usize,
    shrink: i64,
    commit: Commit,
) -> Result<(), Box<dyn std::error::Error>> {
    let reference = reference_url(url);
    let ref_admin = create_reference(admin, url).await?;
    println!(
        "{:<10} {:>8}  {:>9} {:>9} {:>9}  {:>9} {:>9} {:>9}  {:>18}  {:>10}",
        "mode",
        "depth",
        "sheaf p50",
        "p99",
        "cycles/s",
        "text p50",
        "p99",
        "cycles/s",
        "ratio (q1-q3)",
        "p50/ref 1K"
    );
    for &mode in modes {
        systems::reset(admin, mode, shrink).await?;
        systems::reset(&ref_admin, mode, shrink).await?;
        systems::fill(&ref_admin, mode, depths[0]).await?;
        let mut sheaf = Pool::open_with(url, System::Sheaf, mode, clients, commit).await?;
        let mut text = Pool::open_with(url, System::Textbook, mode, clients, commit).await?;
        let mut refq = Pool::open_with(&reference, System::Sheaf, mode, clients, commit).await?;
        let mut filled = 0;
        let mut first_p50 = None;
        let mut last = None;
        for &depth in depths {
            systems::fill(admin, mode, depth - filled).await?;
            filled = depth;
            let (mut s, mut t, mut r) = (Vec::new(), Vec::new(), Vec::new());
            for round in 0..rounds {
                if round % 2 == 0 {
                    s.push(sheaf.window(window).await?);
                    t.push(text.window(window).await?);
                    r.push(refq.window(window).await?);
                } else {
                    r.push(refq.window(window).await?);
                    t.push(text.window(window).await?);
                    s.push(sheaf.window(window).await?);
                }
            }
            let (ratio, q1, q3) = round_ratios(&s, &t);
            let (s, t, r) = (Measured::pool(s), Measured::pool(t), Measured::pool(r));
            let p50 = s.percentile_ms(0.5);
            let paired = p50 / r.percentile_ms(0.5);
            first_p50.get_or_insert(p50);
            last = Some((p50, paired));
            println!(
                "{:<10} {:>8}  {:>7.2}ms {:>7.2}ms {:>9.0}  {:>7.2}ms {:>7.2}ms {:>9.1}  {:>5.2}x ({:.2}-{:.2}x)  {:>10.2}",
                format!("{mode:?}").to_lowercase(),
                depth,
                p50,
                s.percentile_ms(0.99),
                s.rate(),
                t.percentile_ms(0.5),
                t.percentile_ms(0.99),
                t.rate(),
                ratio,
                q1,
                q3,
                paired
            );
        }
        if let (Some(first), Some((p50, paired))) = (first_p50, last)
            && depths.len() > 1
        {
            println!(
                "{:<10} sheaf p50 at {} / p50 at {}: {:.2} against the reference in the same rounds ({:.2} against the first row)",
                format!("{mode:?}").to_lowercase(),
                depths[depths.len() - 1],
                depths[0],
                paired,
                p50 / first
            );
        }
    }
    Ok(())
}

async fn run_batch(url: &str, admin: &Client, window: Duration) -> Result<(), Box<dyn std::error::Error>> {
    systems::reset(admin, Mode::Plain, 1).await?;
    systems::fill(admin, Mode::Plain, 300_000).await?;
    let db = connect(url).await?;
    let ops = Ops::prepare(&db, System::Sheaf, Mode::Plain).await?;
    let mut rates = Vec::new();
    for batch in [1, 100] {
        let started = Instant::now();
        let mut done = 0i64;
        while started.elapsed() < window {
            let claimed = ops.claim(&db, "bench", batch).await?;
            if batch == 1 {
                for t in &claimed {
                    ops.complete(&db, t).await?;
                    done += 1;
                }
            } else {
                done += ops.complete_batch(&db, &claimed).await?;
            }
        }
        let rate = done as f64 / started.elapsed().as_secs_f64();
        println!("batch {batch:>3}: {rate:>9.0} tasks/s (claim + complete, durable commits, 1 client)");
        rates.push(rate);
    }
    println!("batch 100 / batch 1: {:.1}x", rates[1] / rates[0]);
    Ok(())
}

async fn run_steady(
    url: &str,
    admin: &Client,
    minutes: u64,
    clients: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    systems::reset(admin, Mode::Plain, 1).await?;
    systems::fill(admin, Mode::Plain, 10_000).await?;
    // This machine's speed drifts by tens of percent within seconds: every
    // 10 s of each minute end with 1 s on a 1K queue in a database of its own,
    // and the ratio to it over the minute is what shows decay.
    let ref_admin = create_reference(admin, url).await?;
    systems::reset(&ref_admin, Mode::Plain, 1).await?;
    systems::fill(&ref_admin, Mode::Plain, 1_000).await?;
    let mut steady = Pool::open(url, System::Sheaf, Mode::Plain, clients).await?;
    let mut refq = Pool::open(&reference_url(url), System::Sheaf, Mode::Plain, clients).await?;
    for minute in 1..=minutes {
        let (mut m, mut r) = (Vec::new(), Vec::new());
        for _ in 0..6 {
            m.push(steady.window(Duration::from_secs(9)).await?);
            r.push(refq.window(Duration::from_secs(1)).await?);
        }
        let (m, r) = (Measured::sum(m), Measured::sum(r));
        println!(
            "minute {minute:>2}: {:>7.0} cycles/s, claim p50 {:.2} ms, p99 {:.2} ms; reference 1K {:>7.0} cycles/s, ratio {:.2}",
            m.rate(),
            m.percentile_ms(0.5),
            m.percentile_ms(0.99),
            r.rate(),
            m.rate() / r.rate()
        );
    }
    let sizes = admin
        .query(
            "SELECT c.relname, pg_size_pretty(pg_relation_size(c.oid)), c.relkind::text \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'sheaf' AND c.relkind IN ('r', 'i') \
               AND c.relname IN ('tasks', 'ready', 'tasks_pkey', 'ready_pkey', 'ready_claim', \
                                 'tasks_scheduled', 'tasks_running', 'tasks_waiting') \
             ORDER BY 1",
            &[],
        )
        .await?;
    for row in sizes {
        println!(
            "  {:<16} {:>10} ({})",
            row.get::<_, String>(0),
            row.get::<_, String>(1),
            row.get::<_, String>(2)
        );
    }
    Ok(())
}

#[derive(clap::Args)]
struct SnapshotRuns {
    /// Seconds of each window (free-running, then held).
    #[arg(long, default_value_t = 60)]
    secs: u64,
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "plain,aging,fairness"
    )]
    modes: Vec<Mode>,
    #[arg(long, value_delimiter = ',', default_value = "1000,100000")]
    depths: Vec<i64>,
    #[arg(long, value_delimiter = ',', value_enum, default_value = "durable,async")]
    commits: Vec<Commit>,
    /// The systems to measure, each in turn on the same fill.
    #[arg(long, value_delimiter = ',', value_enum, default_value = "sheaf,textbook")]
    systems: Vec<System>,
    /// Free-then-held pairs per system; the ratios are reported per round,
    /// then their median and spread.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Seconds of free-running cycles before the first round, unmeasured:
    /// right after the fill's VACUUM the tables are at their tidiest, and a
    /// first free window there runs faster than the steady state every
    /// later one measures.
    #[arg(long, default_value_t = 20)]
    warmup: u64,
}

/// Dead tuples of the tables a cycle churns, as the statistics have them.
async fn dead_tuples(admin: &Client) -> Result<String, tokio_postgres::Error> {
    // Other backends report at most once a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let rows = admin
        .query(
            "SELECT schemaname || '.' || relname, n_dead_tup FROM pg_stat_user_tables \
             WHERE (schemaname = 'sheaf' AND relname IN ('ready', 'tasks', 'ready_floors', 'queues', 'concurrency_limits', \
                                                         'concurrency_slots', 'fairness_keys')) \
                OR (schemaname = 'textbook' AND relname = 'jobs') \
             ORDER BY 1",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| format!("{} {}", r.get::<_, String>(0), r.get::<_, i64>(1)))
        .collect::<Vec<_>>()
        .join(", "))
}

/// What the claim's sweep probe (promotion and reaping, `SWEEP_PROBE` in
/// extension/src/queue/claim.rs) costs now: its two seeks on the heads of
/// tasks_scheduled and tasks_running, planned as sheaf plans them, in
/// milliseconds and buffers read; whole (at most once a second, and once
/// per 100 times its cost) and over a window of the last 2 s (the sweeps
/// in between).
async fn sweep_probe_cost(admin: &Client, queue: &str) -> Result<String, tokio_postgres::Error> {
    admin
        .batch_execute("SET enable_seqscan = off; SET enable_bitmapscan = off")
        .await?;
    let mut parts = Vec::new();
    for (name, cond) in [
        ("scheduled whole", "state = 'scheduled' AND run_at <= now()"),
        (
            "2 s",
            "state = 'scheduled' AND run_at <= now() AND run_at >= now() - interval '2 s'",
        ),
        ("running whole", "state = 'running' AND lease_expires_at < now()"),
        (
            "2 s",
            "state = 'running' AND lease_expires_at < now() AND lease_expires_at >= now() - interval '2 s'",
        ),
    ] {
        let plan: serde_json::Value = admin
            .query_one(
                &format!(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) \
                     SELECT EXISTS (SELECT 1 FROM sheaf.tasks WHERE queue = $1 AND {cond})"
                ),
                &[&queue],
            )
            .await?
            .get(0);
        let top = &plan[0];
        parts.push(format!(
            "{name} {:.2} ms / {} buffers",
            top["Execution Time"].as_f64().unwrap_or(f64::NAN),
            top["Plan"]["Shared Hit Blocks"].as_i64().unwrap_or(0)
                + top["Plan"]["Shared Read Blocks"].as_i64().unwrap_or(0)
        ));
    }
    admin
        .batch_execute("RESET enable_seqscan; RESET enable_bitmapscan")
        .await?;
    Ok(parts.join(", "))
}

/// Dead tuples of the system's hot table.
async fn hot_dead(admin: &Client, system: System) -> Result<i64, tokio_postgres::Error> {
    let (schema, table) = match system {
        System::Sheaf => ("sheaf", "ready"),
        System::Textbook => ("textbook", "jobs"),
    };
    let row = admin
        .query_one(
            "SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2), 0)",
            &[&schema, &table],
        )
        .await?;
    Ok(row.get(0))
}

/// For each commit mode, mode and depth, each system, `rounds` times: a
/// free-running window, then a window while another connection holds a
/// REPEATABLE READ snapshot; then, the snapshot gone, cycles go on until
/// the hot table's dead tuples are back under twice their free-running
/// count (up to 60 s). Each round's pair is seconds apart, so its ratio
/// holds up to this machine's drift better than one over the whole run.
async fn run_snapshot(
    url: &str,
    admin: &Client,
    runs: &SnapshotRuns,
    clients: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let window = Duration::from_secs(runs.secs);
    for &commit in &runs.commits {
        for &mode in &runs.modes {
            for &depth in &runs.depths {
                systems::reset(admin, mode, 1).await?;
                systems::fill(admin, mode, depth).await?;
                admin.batch_execute("VACUUM ANALYZE").await?;
                for &system in &runs.systems {
                    let mut pool = Pool::open_with(url, system, mode, clients, commit).await?;
                    pool.window(Duration::from_secs(runs.warmup)).await?;
                    let mut pairs = Vec::new();
                    for _ in 0..runs.rounds.max(1) {
                        let (free, held) =
                            snapshot_round(url, admin, &mut pool, system, mode, window).await?;
                        println!(
                            "{:<8} {:<9} {:>7} {:<9} free {:>7.0} cycles/s (p99 {:>6.2} ms)   held {:>7.0} cycles/s (p99 {:>7.2} ms)   ratio {:.2}   p99 x{:.1}",
                            format!("{commit:?}").to_lowercase(),
                            format!("{mode:?}").to_lowercase(),
                            depth,
                            system.name(),
                            free.rate(),
                            free.percentile_ms(0.99),
                            held.rate(),
                            held.percentile_ms(0.99),
                            held.rate() / free.rate(),
                            held.percentile_ms(0.99) / free.percentile_ms(0.99),
                        );
                        pairs.push((free, held));
                    }
                    if pairs.len() > 1 {
                        let spread = |mut r: Vec<f64>| {
                            r.sort_by(f64::total_cmp);
                            (r[(r.len() - 1) / 2], r[0], r[r.len() - 1])
                        };
                        let (rate, lo, hi) = spread(pairs.iter().map(|(f, h)| h.rate() / f.rate()).collect());
                        let (p99, p99_lo, p99_hi) = spread(
                            pairs
                                .iter()
                                .map(|(f, h)| h.percentile_ms(0.99) / f.percentile_ms(0.99))
                                .collect(),
                        );
                        println!(
                            "{:<8} {:<9} {:>7} {:<9} median of {} rounds: ratio {rate:.2} ({lo:.2}-{hi:.2})   p99 x{p99:.1} ({p99_lo:.1}-{p99_hi:.1})",
                            format!("{commit:?}").to_lowercase(),
                            format!("{mode:?}").to_lowercase(),
                            depth,
                            system.name(),
                            pairs.len()
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

/// One free-running window and one held, then the settling after it;
/// prints what the held window left behind.
async fn snapshot_round(
    url: &str,
    admin: &Client,
    pool: &mut Pool,
    system: System,
    mode: Mode,
    window: Duration,
) -> Result<(Measured, Measured), Box<dyn std::error::Error>> {
    let free = pool.window(window).await?;
    let free_dead = hot_dead(admin, system).await?;
    let holder = connect(url).await?;
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class;")
        .await?;
    let held = pool.window(window).await?;
    let dead = dead_tuples(admin).await?;
    let probe = match system {
        System::Sheaf => Some(sweep_probe_cost(admin, &queue_name(mode, 0)).await?),
        System::Textbook => None,
    };
    holder.batch_execute("ROLLBACK").await?;
    let released = Instant::now();
    let mut settled = None;
    while released.elapsed() < Duration::from_secs(60) {
        pool.window(Duration::from_secs(1)).await?;
        if hot_dead(admin, system).await? <= (2 * free_dead).max(2000) {
            settled = Some(released.elapsed());
            break;
        }
    }
    if let Some(probe) = probe {
        println!("         sweep probe at the end of the held window: {probe}");
    }
    let sixths = |m: &Measured| {
        m.slices(6)
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "         cycles/s by sixths of the window: free {}; held {}",
        sixths(&free),
        sixths(&held)
    );
    println!(
        "         dead tuples at the end of the held window: {dead}; back to steady {}",
        settled.map_or_else(
            || "not within 60 s".to_owned(),
            |d| format!("{:.0} s after", d.as_secs_f64())
        )
    );
    Ok((free, held))
}
