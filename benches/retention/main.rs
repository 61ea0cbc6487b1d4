//! Retention at scale: N ended executions with 10 events each, all past
//! their window, deleted by `sheaf.maintain()` in its bounded batches. It
//! reports executions and events deleted per second, the claim and
//! `start_workflow` p50/p99 of a probe running beside it (before pruning,
//! then while it runs), and the tables' and indexes' sizes and dead tuples
//! after. Durable commits (the shard's default).
//!
//! ```text
//! cargo run --release -p sheaf-benches --bin retention-bench                  # its own shard (scripts/shards, --release), 1M runs
//! cargo run --release -p sheaf-benches --bin retention-bench -- --executions 100000
//! SHEAF_SHARDS=0=postgres://... cargo run -p sheaf-benches --bin retention-bench -- --executions 2000 --probe-secs 1   # CI's smoke run
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;
use sheaf_driver::{Client, EnqueueOptions, Placement, PoolOptions, ShardId, StartOptions, Topology};

#[derive(Parser)]
#[command(
    about = "retention: rows deleted per second by maintain(), claim and start p50 meanwhile, sizes after"
)]
struct Cli {
    /// Ended executions to delete (each with 10 events).
    #[arg(long, default_value_t = 1_000_000)]
    executions: i64,
    /// How long the probe measures before pruning starts.
    #[arg(long, default_value_t = 10)]
    probe_secs: u64,
    /// PostgreSQL major of the bench shard.
    #[arg(long, default_value_t = 15)]
    pg: u32,
}

#[path = "../support.rs"]
mod support;
use support::{Error, pct};

const EVENTS: i64 = 10;
const WORKFLOW: &str = "retention-bench";

/// `n` runs ended 40 days ago, each with `EVENTS` events, written inside
/// the database in chunks (the fill is not what is measured).
async fn fill(db: &tokio_postgres::Client, n: i64) -> Result<(), Error> {
    let chunk = 100_000;
    let mut done = 0;
    while done < n {
        let k = chunk.min(n - done);
        db.batch_execute("BEGIN").await?;
        db.execute(
            "CREATE TEMP TABLE IF NOT EXISTS fill_ids (id uuid) ON COMMIT DELETE ROWS",
            &[],
        )
        .await?;
        db.execute(
            "INSERT INTO fill_ids SELECT sheaf.new_id() FROM generate_series(1, $1::bigint)",
            &[&k],
        )
        .await?;
        db.execute(
            "INSERT INTO sheaf.executions (id, workflow_name, workflow_id, state, seq, queue, input, result, \
                                           history_bytes, last_event_seq, created_at, closed_at) \
             SELECT id, $1, id::text, 'COMPLETED', nextval('sheaf.execution_seq'), 'retention-bench', \
                    '{\"order\": 1}', '{\"ok\": true}', 10 * 40, $2, now() - interval '41 days', \
                    now() - interval '40 days' FROM fill_ids",
            &[&WORKFLOW, &EVENTS],
        )
        .await?;
        db.execute(
            "INSERT INTO sheaf.events (execution_id, seq, event_type, payload, bytes, created_at) \
             SELECT f.id, s, 'Step', jsonb_build_object('step', s, 'note', 'a step of forty bytes'), 40, \
                    now() - interval '40 days' FROM fill_ids f, generate_series(1, $1::bigint) s",
            &[&EVENTS],
        )
        .await?;
        db.batch_execute("COMMIT").await?;
        done += k;
        eprintln!("filled {done} of {n}");
    }
    db.batch_execute("VACUUM ANALYZE sheaf.executions, sheaf.events")
        .await?;
    Ok(())
}

/// Claim and start latencies, in ms, sampled while `stop` is unset.
async fn probe(client: Arc<Client>, shard: ShardId, stop: Arc<AtomicBool>) -> (Vec<f64>, Vec<f64>) {
    let (mut claims, mut starts) = (Vec::new(), Vec::new());
    let queue = format!("retention-probe-{}", std::process::id());
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let on = EnqueueOptions::new().placement(Placement::Shard(shard));
        if client.enqueue(&queue, json!({"n": n}), on).await.is_err() {
            continue;
        }
        let at = Instant::now();
        let Ok(tasks) = client
            .claim(shard, &queue, "probe", 1, Duration::from_secs(30))
            .await
        else {
            continue;
        };
        claims.push(at.elapsed().as_secs_f64() * 1000.0);
        for t in tasks {
            let _ = client.complete(t.task_id, t.token, None).await;
        }
        let at = Instant::now();
        let pinned = StartOptions::new().placement(Placement::Shard(shard));
        if let Ok(s) = client
            .start_workflow(
                "retention-probe",
                &format!("p-{}-{n}", std::process::id()),
                json!({}),
                pinned,
            )
            .await
        {
            starts.push(at.elapsed().as_secs_f64() * 1000.0);
            let _ = client.cancel_execution(s.execution_id, None).await;
        }
    }
    (claims, starts)
}

fn line(what: &str, v: &mut [f64]) {
    let n = v.len();
    println!(
        "{what:<28} p50 {:>7.2} ms   p99 {:>7.2} ms   ({n} samples)",
        pct(v, 0.5),
        pct(v, 0.99)
    );
}

/// Runs the probe for `secs` (or until `until` finishes) and prints it.
async fn measured<F: std::future::Future<Output = Result<(i64, i64, f64), Error>>>(
    client: &Arc<Client>,
    shard: ShardId,
    label: &str,
    until: F,
) -> Result<(i64, i64, f64), Error> {
    let stop = Arc::new(AtomicBool::new(false));
    let probe = tokio::spawn(probe(client.clone(), shard, stop.clone()));
    let out = until.await;
    stop.store(true, Ordering::Relaxed);
    let (mut claims, mut starts) = probe.await?;
    line(&format!("claim, {label}"), &mut claims);
    line(&format!("start_workflow, {label}"), &mut starts);
    out
}

/// `maintain()` until retention has nothing left: executions and events
/// deleted, and the seconds it took.
async fn prune(db: &tokio_postgres::Client) -> Result<(i64, i64, f64), Error> {
    let at = Instant::now();
    let (mut executions, mut events) = (0i64, 0i64);
    loop {
        let row = db.query_one("SELECT sheaf.maintain()", &[]).await?;
        let report: serde_json::Value = row.get(0);
        let gone = report["retention"]["executions"].as_i64().unwrap_or(0);
        executions += gone;
        events += report["retention"]["events"].as_i64().unwrap_or(0);
        if gone == 0 {
            return Ok((executions, events, at.elapsed().as_secs_f64()));
        }
    }
}

async fn sizes(db: &tokio_postgres::Client) -> Result<(), Error> {
    db.batch_execute("ANALYZE sheaf.executions, sheaf.events").await?;
    for table in ["executions", "events"] {
        let row = db
            .query_one(
                "SELECT pg_size_pretty(pg_table_size(c.oid)), pg_size_pretty(pg_indexes_size(c.oid)), \
                        s.n_live_tup, s.n_dead_tup \
                 FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid \
                 WHERE c.oid = ('sheaf.' || $1)::regclass",
                &[&table],
            )
            .await?;
        let (heap, index, live, dead): (String, String, i64, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        println!("{table:<11} heap {heap:>9}  indexes {index:>9}  live {live:>9}  dead tuples {dead:>9}");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let cli = Cli::parse();
    let spec = match std::env::var("SHEAF_SHARDS") {
        Ok(s) => s,
        Err(_) => support::release_shards(1, cli.pg, "/tmp/sheaf-bench-retention", 25985)?,
    };
    let topology = Topology::parse(&spec)?;
    let shard = topology.shards().next().ok_or("a shard")?;
    let (db, conn) = tokio_postgres::connect(&shard.url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let shard = shard.id;
    let client = Arc::new(Client::new(topology.clone(), PoolOptions::default())?);
    // Nothing to delete before the fill is measured: no policy yet.
    db.execute("SELECT sheaf.set_retention('{\"executions\": null}')", &[])
        .await?;
    let filled = Instant::now();
    fill(&db, cli.executions).await?;
    println!(
        "filled {} ended runs with {} events each in {:.0} s",
        cli.executions,
        EVENTS,
        filled.elapsed().as_secs_f64()
    );
    sizes(&db).await?;
    let probe_secs = cli.probe_secs;
    measured(&client, shard, "before pruning", async {
        tokio::time::sleep(Duration::from_secs(probe_secs)).await;
        Ok((0, 0, 0.0))
    })
    .await?;
    db.execute("SELECT sheaf.set_retention('{\"executions\": \"30days\"}')", &[])
        .await?;
    let (executions, events, secs) = measured(&client, shard, "while pruning", prune(&db)).await?;
    println!(
        "deleted {executions} runs and {events} events in {secs:.1} s: {:.0} runs/s, {:.0} events/s \
         (maintain() batches of 1,000 runs, durable commits)",
        executions as f64 / secs.max(1e-9),
        events as f64 / secs.max(1e-9)
    );
    sizes(&db).await?;
    db.execute("SELECT sheaf.set_retention('{\"executions\": null}')", &[])
        .await?;
    Ok(())
}
