//! Throughput in the field's shape (the cross-system job-queue benchmark
//! hardbyte/postgresql-job-queue-benchmarking): a producer keeps a backlog
//! at a target depth, W in-process workers take tasks, work 1 ms each and
//! acknowledge them; 256 B payloads carrying their enqueue time, from which
//! each pickup's latency is taken. Side by side in one cluster: pgmq (its
//! install SQL from the `pgmq` crate, pinned), the textbook `FOR UPDATE SKIP
//! LOCKED` queue, sheaf through its SQL API (`complete_and_claim`) and
//! sheaf through the Rust `Worker`, all with the same commit mode; the SQL
//! loops with the same connections and batch size, the `Worker` with its
//! own (one claim loop per shard, claiming up to every free slot).
//!
//! ```text
//! cargo run --release -p sheaf-benches --bin harness-bench -- run                          # W = 4,16,64,256, 15 s + 60 s, durable and async
//! cargo run --release -p sheaf-benches --bin harness-bench -- run --widths 16,64 --rounds 3
//! cargo run --release -p sheaf-benches --bin harness-bench -- drift --minutes 10 --rate 2000
//! cargo run --release -p sheaf-benches --bin harness-bench -- smoke                        # seconds, for CI
//! ```
//! Without `--url` it starts its own one-shard cluster with `scripts/shards`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};
use sheaf_driver::{Client, PoolOptions, TaskContext, TaskDone, Topology, Worker, WorkerOptions};
use tokio::sync::Mutex;
use tokio_postgres::{Client as Db, NoTls};

#[path = "../support.rs"]
mod support;
use support::{Error, pct};

const QUEUE: &str = "bench";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum System {
    Pgmq,
    Textbook,
    /// sheaf's SQL API from the same loop as the others.
    Sheaf,
    /// sheaf's Rust `Worker` (concurrency W, its own connections).
    SheafWorker,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Commit {
    Durable,
    Async,
}

#[derive(Parser)]
#[command(about = "Job-queue throughput in the field's shape: sheaf, pgmq and the textbook queue")]
struct Cli {
    /// A database to use (it is wiped). Default: a cluster of its own.
    #[arg(long, env = "SHEAF_BENCH_URL")]
    url: Option<String>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(clap::Args, Clone)]
struct Shape {
    /// Workers (tasks in flight at most).
    #[arg(long, value_delimiter = ',', default_value = "4,16,64,256")]
    widths: Vec<usize>,
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "pgmq,textbook,sheaf,sheaf-worker"
    )]
    systems: Vec<System>,
    #[arg(long, value_delimiter = ',', value_enum, default_value = "durable,async")]
    commits: Vec<Commit>,
    /// Rounds per width, system and commit mode.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Seconds of warm-up, then of the measured window.
    #[arg(long, default_value_t = 15)]
    warmup: u64,
    #[arg(long, default_value_t = 60)]
    window: u64,
    /// The backlog the producer keeps.
    #[arg(long, default_value_t = 4000)]
    backlog: u64,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every width, system and commit mode.
    Run(Shape),
    /// A fixed enqueue rate for minutes: completions/s and pickup latency
    /// each minute, table size and dead tuples at the end.
    Drift {
        #[arg(long, default_value_t = 10)]
        minutes: u64,
        /// Tasks enqueued per second.
        #[arg(long, default_value_t = 2000)]
        rate: u64,
        #[arg(long, default_value_t = 16)]
        width: usize,
        #[arg(long, value_enum, default_value = "sheaf-worker")]
        system: System,
        #[arg(long, value_enum, default_value = "async")]
        commit: Commit,
    },
    /// Every system at W=4 for 1 + 2 s: proves the harness runs (CI).
    Smoke,
}

/// Connections and batch size of the SQL loops for `width` workers: up to
/// 16 connections, each taking `width / 16` tasks at a time.
fn loops(width: usize) -> (usize, usize) {
    let conns = width.clamp(1, 16);
    (conns, width.div_ceil(conns))
}

fn url_with(url: &str, commit: Commit) -> String {
    let setting = match commit {
        Commit::Durable => "on",
        Commit::Async => "off",
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20synchronous_commit%3D{setting}")
}

async fn connect(url: &str) -> Result<Db, Error> {
    let (db, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(conn);
    Ok(db)
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// A 256-byte payload carrying its enqueue time.
fn payload() -> Value {
    let t = now_micros();
    let base = json!({ "t": t, "pad": "" }).to_string().len();
    json!({ "t": t, "pad": "x".repeat(256 - base) })
}

/// Drops what the last measurement left and makes `system`'s queue empty.
async fn reset(db: &Db, system: System) -> Result<(), Error> {
    db.batch_execute("SET client_min_messages = warning").await?;
    match system {
        System::Pgmq => {
            db.batch_execute(
                "SELECT pgmq.drop_queue(queue_name) FROM pgmq.list_queues(); SELECT pgmq.create('bench')",
            )
            .await?
        }
        System::Textbook => {
            db.batch_execute(
                "DROP SCHEMA IF EXISTS textbook CASCADE; CREATE SCHEMA textbook; \
                 CREATE TABLE textbook.jobs (id bigserial PRIMARY KEY, state text NOT NULL DEFAULT 'pending', \
                                             payload jsonb NOT NULL, locked_at timestamptz); \
                 CREATE INDEX jobs_pending ON textbook.jobs (id) WHERE state = 'pending'",
            )
            .await?
        }
        System::Sheaf | System::SheafWorker => {
            db.batch_execute(
                "DROP EXTENSION IF EXISTS sheaf CASCADE; CREATE EXTENSION sheaf; SELECT sheaf.init_shard(0)",
            )
            .await?
        }
    }
    Ok(())
}

async fn install(url: &str) -> Result<(), Error> {
    let db = connect(url).await?;
    db.batch_execute("DROP SCHEMA IF EXISTS pgmq CASCADE; DROP TABLE IF EXISTS public._sqlx_pgmq_migrations")
        .await
        .ok();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await?;
    pgmq::install::install_sql_from_embedded(&pool).await?;
    pool.close().await;
    Ok(())
}

async fn enqueue(db: &Db, system: System, n: usize) -> Result<(), Error> {
    let payloads: Vec<Value> = (0..n).map(|_| payload()).collect();
    let sql = match system {
        System::Pgmq => "SELECT count(*) FROM pgmq.send_batch('bench', $1::jsonb[])",
        System::Textbook => "INSERT INTO textbook.jobs (payload) SELECT unnest($1::jsonb[])",
        System::Sheaf | System::SheafWorker => {
            "SELECT count(*) FROM sheaf.enqueue_batch('bench', $1::jsonb[])"
        }
    };
    db.execute(sql, &[&payloads]).await?;
    Ok(())
}

/// What every loop shares: completions so far, pickup latencies (µs) of
/// the measured window, and whether to record them.
#[derive(Default)]
struct Tally {
    done: AtomicU64,
    enqueued: AtomicU64,
    measuring: AtomicBool,
    stop: AtomicBool,
    pickups: Mutex<Vec<f64>>,
}

impl Tally {
    async fn picked(&self, enqueued_micros: &[i64]) {
        if self.measuring.load(Ordering::Relaxed) {
            let now = now_micros();
            let mut p = self.pickups.lock().await;
            p.extend(enqueued_micros.iter().map(|t| (now - t) as f64));
        }
    }
}

/// Keeps `backlog` tasks waiting (or, with `rate`, enqueues that many a
/// second).
async fn producer(
    url: String,
    system: System,
    backlog: u64,
    rate: Option<u64>,
    tally: Arc<Tally>,
) -> Result<(), Error> {
    let db = connect(&url).await?;
    let started = Instant::now();
    while !tally.stop.load(Ordering::Relaxed) {
        let want = match rate {
            Some(rate) => (started.elapsed().as_secs_f64() * rate as f64) as u64,
            None => tally.done.load(Ordering::Relaxed) + backlog,
        };
        let behind = want.saturating_sub(tally.enqueued.load(Ordering::Relaxed));
        if behind == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        let n = behind.min(500) as usize;
        enqueue(&db, system, n).await?;
        tally.enqueued.fetch_add(n as u64, Ordering::Relaxed);
    }
    Ok(())
}

/// One SQL loop: take up to `batch`, work 1 ms (the batch at once, as
/// `batch` workers would), acknowledge, again. sheaf acknowledges with its
/// next claim (`complete_and_claim`); pgmq and the textbook queue with a
/// statement of their own.
async fn sql_loop(url: String, system: System, batch: usize, tally: Arc<Tally>) -> Result<(), Error> {
    let db = connect(&url).await?;
    let batch = batch as i32;
    let (take, ack) = match system {
        System::Pgmq => (
            "SELECT msg_id, (message->>'t')::bigint FROM pgmq.read('bench', 30, $1)",
            "SELECT count(*) FROM pgmq.delete('bench', $1::bigint[])",
        ),
        System::Textbook => (
            "UPDATE textbook.jobs SET state = 'running', locked_at = now() WHERE id IN (\
               SELECT id FROM textbook.jobs WHERE state = 'pending' ORDER BY id LIMIT $1::int FOR UPDATE SKIP LOCKED) \
             RETURNING id, (payload->>'t')::bigint",
            "DELETE FROM textbook.jobs WHERE id = ANY($1)",
        ),
        System::Sheaf | System::SheafWorker => (
            "SELECT task_id, completed, token, (payload->>'t')::bigint \
             FROM sheaf.complete_and_claim('bench', 'w', $1, $2, $3)",
            "",
        ),
    };
    let take = db.prepare(take).await?;
    let ack = if ack.is_empty() {
        None
    } else {
        Some(db.prepare(ack).await?)
    };
    // sheaf: the tasks to complete with the next claim.
    let (mut ids, mut tokens): (Vec<uuid::Uuid>, Vec<i64>) = (Vec::new(), Vec::new());
    while !tally.stop.load(Ordering::Relaxed) {
        let times: Vec<i64> = match &ack {
            None => {
                let rows = db.query(&take, &[&ids, &tokens, &batch]).await?;
                let done = rows
                    .iter()
                    .filter(|r| r.get::<_, Option<bool>>(1) == Some(true))
                    .count();
                tally.done.fetch_add(done as u64, Ordering::Relaxed);
                let claimed: Vec<_> = rows
                    .iter()
                    .filter(|r| r.get::<_, Option<bool>>(1).is_none())
                    .collect();
                ids = claimed.iter().map(|r| r.get(0)).collect();
                tokens = claimed
                    .iter()
                    .map(|r| r.get::<_, Option<i64>>(2).unwrap_or(0))
                    .collect();
                let times: Vec<i64> = claimed.iter().map(|r| r.get(3)).collect();
                tally.picked(&times).await;
                times
            }
            Some(ack) => {
                let rows = db.query(&take, &[&batch]).await?;
                let taken: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
                let times: Vec<i64> = rows.iter().map(|r| r.get(1)).collect();
                tally.picked(&times).await;
                if !taken.is_empty() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    db.execute(ack, &[&taken]).await?;
                    tally.done.fetch_add(taken.len() as u64, Ordering::Relaxed);
                }
                times
            }
        };
        // sheaf's work, before the call that acknowledges it; or a poll's pause.
        if ack.is_none() || times.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    Ok(())
}

/// sheaf's `Worker` over the one shard, `width` tasks in flight.
fn start_worker(url: &str, width: usize, tally: Arc<Tally>) -> Result<Worker, Error> {
    let topology = Topology::parse(&format!("0={url}"))?;
    let pool = PoolOptions::default().max_size(16);
    let client = Arc::new(Client::new(topology, pool)?);
    // One claim loop per shard: its claims take up to every free slot.
    let options = WorkerOptions::new("harness", [QUEUE.to_owned()])
        .concurrency(width)
        .batch(width.min(1000) as i32);
    Ok(Worker::start(client, options, move |ctx: TaskContext| {
        let tally = tally.clone();
        async move {
            let t = ctx
                .task()
                .payload
                .to_value()
                .ok()
                .and_then(|v| v["t"].as_i64())
                .unwrap_or(0);
            tally.picked(&[t]).await;
            tokio::time::sleep(Duration::from_millis(1)).await;
            tally.done.fetch_add(1, Ordering::Relaxed);
            Ok(TaskDone::Complete(None))
        }
    })?)
}

/// What one measurement saw.
struct Seen {
    per_sec: Vec<f64>,
    pickups: Vec<f64>,
    size_mb: f64,
    dead: i64,
}

/// The tables each system churns.
fn tables(system: System) -> &'static str {
    match system {
        System::Pgmq => "'pgmq.q_bench', 'pgmq.a_bench'",
        System::Textbook => "'textbook.jobs'",
        System::Sheaf | System::SheafWorker => "'sheaf.tasks', 'sheaf.ready', 'sheaf.ready_floors'",
    }
}

async fn sizes(db: &Db, system: System) -> Result<(f64, i64), Error> {
    db.batch_execute("SELECT pg_stat_force_next_flush()").await.ok();
    let sql = format!(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::float8 / 1048576, \
                coalesce(sum(s.n_dead_tup), 0)::bigint \
         FROM unnest(ARRAY[{}]::text[]) t(name) JOIN pg_class c ON c.oid = to_regclass(t.name) \
         LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid",
        tables(system)
    );
    let row = db.query_one(&sql, &[]).await?;
    Ok((row.get(0), row.get(1)))
}

/// One measurement: fill the backlog, run for `warmup`, sample completions
/// each second for `window`.
async fn measure(
    url: &str,
    system: System,
    width: usize,
    backlog: u64,
    rate: Option<u64>,
    warmup: Duration,
    window: Duration,
) -> Result<Seen, Error> {
    let admin = connect(url).await?;
    reset(&admin, system).await?;
    let tally = Arc::new(Tally::default());
    if rate.is_none() {
        let mut left = backlog;
        while left > 0 {
            let n = left.min(500);
            enqueue(&admin, system, n as usize).await?;
            left -= n;
        }
        tally.enqueued.store(backlog, Ordering::Relaxed);
    }
    let mut tasks = vec![tokio::spawn(producer(
        url.to_owned(),
        system,
        backlog,
        rate,
        tally.clone(),
    ))];
    let worker = if system == System::SheafWorker {
        Some(start_worker(url, width, tally.clone())?)
    } else {
        let (conns, batch) = loops(width);
        for _ in 0..conns {
            tasks.push(tokio::spawn(sql_loop(
                url.to_owned(),
                system,
                batch,
                tally.clone(),
            )));
        }
        None
    };
    tokio::time::sleep(warmup).await;
    tally.measuring.store(true, Ordering::Relaxed);
    let mut per_sec = Vec::new();
    let mut last = tally.done.load(Ordering::Relaxed);
    let mut at = Instant::now();
    let end = at + window;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_secs(1).min(end - Instant::now())).await;
        let now = tally.done.load(Ordering::Relaxed);
        per_sec.push((now - last) as f64 / at.elapsed().as_secs_f64());
        (last, at) = (now, Instant::now());
    }
    tally.measuring.store(false, Ordering::Relaxed);
    tally.stop.store(true, Ordering::Relaxed);
    if let Some(worker) = worker {
        worker.shutdown().await;
    }
    for t in tasks {
        t.await??;
    }
    let (size_mb, dead) = sizes(&admin, system).await?;
    let pickups = std::mem::take(&mut *tally.pickups.lock().await);
    Ok(Seen {
        per_sec,
        pickups,
        size_mb,
        dead,
    })
}

fn name(system: System) -> &'static str {
    match system {
        System::Pgmq => "pgmq",
        System::Textbook => "textbook",
        System::Sheaf => "sheaf (SQL)",
        System::SheafWorker => "sheaf Worker",
    }
}

async fn run(url: &str, shape: &Shape) -> Result<(), Error> {
    if shape.systems.contains(&System::Pgmq) {
        install(url).await?;
    }
    println!(
        "{:<8} {:>4} {:<13} {:>5}  {:>10} {:>9}  {:>9} {:>9}  {:>8} {:>8}",
        "commit", "W", "system", "round", "done/s", "(q1-q3)", "pickup50", "pickup99", "MB", "dead"
    );
    for &commit in &shape.commits {
        let url = url_with(url, commit);
        for &width in &shape.widths {
            for round in 0..shape.rounds {
                for &system in &shape.systems {
                    let mut seen = measure(
                        &url,
                        system,
                        width,
                        shape.backlog,
                        None,
                        Duration::from_secs(shape.warmup),
                        Duration::from_secs(shape.window),
                    )
                    .await?;
                    println!(
                        "{:<8} {:>4} {:<13} {:>5}  {:>10.0} {:>4.0}-{:<4.0}  {:>7.1}ms {:>7.1}ms  {:>8.1} {:>8}",
                        format!("{commit:?}").to_lowercase(),
                        width,
                        name(system),
                        round + 1,
                        pct(&mut seen.per_sec, 0.5),
                        pct(&mut seen.per_sec, 0.25),
                        pct(&mut seen.per_sec, 0.75),
                        pct(&mut seen.pickups, 0.5) / 1000.0,
                        pct(&mut seen.pickups, 0.99) / 1000.0,
                        seen.size_mb,
                        seen.dead
                    );
                }
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let cli = Cli::parse();
    let url = match cli.url.clone() {
        Some(url) => url,
        None => {
            let line = support::release_shards(1, 15, "/tmp/sheaf-bench/harness", 26170)?;
            line.trim()
                .split_once('=')
                .map(|(_, u)| u.to_owned())
                .ok_or("no shard printed")?
        }
    };
    match cli.command {
        Cmd::Run(shape) => run(&url, &shape).await,
        Cmd::Smoke => {
            let shape = Shape {
                widths: vec![4],
                systems: System::value_variants().to_vec(),
                commits: vec![Commit::Async],
                rounds: 1,
                warmup: 1,
                window: 2,
                backlog: 200,
            };
            run(&url, &shape).await
        }
        Cmd::Drift {
            minutes,
            rate,
            width,
            system,
            commit,
        } => {
            if system == System::Pgmq {
                install(&url).await?;
            }
            let url = url_with(&url, commit);
            let mut seen = measure(
                &url,
                system,
                width,
                0,
                Some(rate),
                Duration::from_secs(10),
                Duration::from_secs(minutes * 60),
            )
            .await?;
            for (minute, chunk) in seen.per_sec.chunks(60).enumerate() {
                let mean = chunk.iter().sum::<f64>() / chunk.len() as f64;
                println!("minute {:>3}: {:>8.0} done/s", minute + 1, mean);
            }
            println!(
                "pickup p50 {:.1} ms, p99 {:.1} ms; {:.1} MB, {} dead tuples at the end",
                pct(&mut seen.pickups, 0.5) / 1000.0,
                pct(&mut seen.pickups, 0.99) / 1000.0,
                seen.size_mb,
                seen.dead
            );
            Ok(())
        }
    }
}
