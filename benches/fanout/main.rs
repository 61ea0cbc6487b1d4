//! The fan-out read benchmark: listing, finding and usage reports across
//! shards, on a fleet of 4 × 250K executions by default.
//!
//! ```text
//! cargo run --release -p sheaf-benches --bin fanout-bench                  # its own 4 shards (scripts/shards, --release)
//! cargo run --release -p sheaf-benches --bin fanout-bench -- --per-shard 20000 --reps 50   # quicker
//! ```
//! The executions (and their usage events) are written straight into the
//! shards' tables with one `INSERT … SELECT` each, created over the last 60
//! days: a start through `start_workflow` would take hours here, and the
//! reads measured are the same either way. Each comparison is measured
//! side by side, alternating, so the noise of the machine hits both; the
//! figures are p50 and p99 over `--reps` calls.

use std::time::{Duration, Instant, SystemTime};

use clap::Parser;
use serde_json::{Value, json};
use sheaf_driver::{Client, ExecutionFilter, GroupBy, PoolOptions, Resolution, SortOrder, Topology};
use tokio_postgres::NoTls;

#[derive(Parser)]
#[command(about = "Fan-out reads across shards: list pages deep and shallow, find, usage reports")]
struct Cli {
    /// Executions per shard.
    #[arg(long, default_value_t = 250_000)]
    per_shard: u32,
    /// Calls per measured figure.
    #[arg(long, default_value_t = 200)]
    reps: usize,
    /// Rows per listed page.
    #[arg(long, default_value_t = 50)]
    page_size: usize,
    /// The deep page measured against page 1.
    #[arg(long, default_value_t = 2_000)]
    deep_page: usize,
    /// PostgreSQL major of the bench cluster.
    #[arg(long, default_value_t = 15)]
    pg: u32,
}

#[path = "../support.rs"]
mod support;
use support::{Error, fill, pct};

/// Latencies of one figure.
struct Timings(Vec<Duration>);

impl Timings {
    fn ms(&self, p: f64) -> f64 {
        let mut v: Vec<f64> = self.0.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        pct(&mut v, p)
    }
}

/// Runs `a` and `b` alternately `reps` times each.
async fn side_by_side<A, B, FA, FB>(reps: usize, mut a: A, mut b: B) -> Result<(Timings, Timings), Error>
where
    A: FnMut() -> FA,
    B: FnMut() -> FB,
    FA: Future<Output = Result<(), Error>>,
    FB: Future<Output = Result<(), Error>>,
{
    let (mut ta, mut tb) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps {
        let t = Instant::now();
        a().await?;
        ta.push(t.elapsed());
        let t = Instant::now();
        b().await?;
        tb.push(t.elapsed());
    }
    Ok((Timings(ta), Timings(tb)))
}

fn report(what: &str, a: &str, ta: &Timings, b: &str, tb: &Timings) {
    println!(
        "{what:<34} {a:<12} p50 {:>7.2} ms  p99 {:>7.2} ms | {b:<14} p50 {:>7.2} ms  p99 {:>7.2} ms | ratio p50 {:.2}x  p99 {:.2}x",
        ta.ms(0.5),
        ta.ms(0.99),
        tb.ms(0.5),
        tb.ms(0.99),
        tb.ms(0.5) / ta.ms(0.5),
        tb.ms(0.99) / ta.ms(0.99)
    );
}

/// The cursor of page `page` (1-based) under `filter`, and how many pages
/// there are if fewer.
async fn cursor_at(
    c: &Client,
    filter: &ExecutionFilter,
    page_size: usize,
    page: usize,
) -> Result<(Option<String>, usize), Error> {
    let mut cursor: Option<String> = None;
    for n in 1..page {
        let p = c
            .list_executions(filter, cursor.as_deref(), page_size, SortOrder::Desc)
            .await?;
        match p.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok((cursor, n)),
        }
    }
    Ok((cursor, page))
}

async fn list_deep_vs_first(
    c: &Client,
    cli: &Cli,
    what: &str,
    filter: Value,
    deep: usize,
) -> Result<(), Error> {
    let filter = ExecutionFilter::from_json(filter);
    let (cursor, reached) = cursor_at(c, &filter, cli.page_size, deep).await?;
    let label = format!("page {reached}");
    let (first, last) = side_by_side(
        cli.reps,
        || async {
            c.list_executions(&filter, None, cli.page_size, SortOrder::Desc)
                .await?;
            Ok(())
        },
        || async {
            c.list_executions(&filter, cursor.as_deref(), cli.page_size, SortOrder::Desc)
                .await?;
            Ok(())
        },
    )
    .await?;
    report(what, "page 1", &first, &label, &last);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let cli = Cli::parse();
    let text = match std::env::var("SHEAF_SHARDS") {
        Ok(t) => t,
        Err(_) => support::release_shards(4, cli.pg, "/tmp/sheaf-bench-fanout", 25950)?,
    };
    let topology = Topology::parse(&text)?;
    let started = Instant::now();
    let fills = topology.shards().map(|s| fill(&s.url, cli.per_shard));
    for r in futures::future::join_all(fills).await {
        r?;
    }
    println!(
        "{} shards x {} executions, ready in {:.0?}; {} calls per figure, page size {}",
        topology.shards().count(),
        cli.per_shard,
        started.elapsed(),
        cli.reps,
        cli.page_size
    );
    let c = Client::new(topology.clone(), PoolOptions::default())?;

    list_deep_vs_first(&c, &cli, "list, no filter", json!({}), cli.deep_page).await?;
    list_deep_vs_first(
        &c,
        &cli,
        "list, 1% attribute",
        json!({"attr": "rare", "op": "=", "value": true}),
        usize::MAX,
    )
    .await?;
    list_deep_vs_first(
        &c,
        &cli,
        "list, or (1% attribute | 5% state)",
        json!({"or": [{"attr": "rare", "op": "=", "value": true}, {"state": ["FAILED"]}]}),
        usize::MAX,
    )
    .await?;

    // find: fanned out to every shard vs one direct call on the shard that
    // holds it.
    let shard = topology.shards().next().ok_or("no shard")?;
    let (direct, conn) = tokio_postgres::connect(&shard.url, NoTls).await?;
    tokio::spawn(conn);
    let find = direct
        .prepare("SELECT * FROM sheaf.find_execution($1, $2)")
        .await?;
    let (fanned, one) = side_by_side(
        cli.reps,
        || async {
            match c.find_execution("bench-3", "b-1003").await? {
                Resolution::Found { .. } => Ok(()),
                other => Err(format!("find: {other:?}").into()),
            }
        },
        || async {
            direct.query(&find, &[&"bench-3", &"b-1003"]).await?;
            Ok(())
        },
    )
    .await?;
    report("find_execution", "fan-out", &fanned, "one shard, SQL", &one);

    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    let by = GroupBy::SearchAttr("tenant".into());
    let (d1, d30) = side_by_side(
        cli.reps.min(40),
        || async {
            c.admin().usage_report(now - day * 2, now - day, &by).await?;
            Ok(())
        },
        || async {
            c.admin().usage_report(now - day * 31, now - day, &by).await?;
            Ok(())
        },
    )
    .await?;
    report("usage_report by tenant", "1 day", &d1, "30 days", &d30);
    Ok(())
}
