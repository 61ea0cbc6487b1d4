//! The relay benchmark: how soon a cross-shard child runs after its spawn,
//! how soon its end reaches its parent, with the relay woken by NOTIFY and
//! with the sweep alone (side by side, alternating rounds), and 1,000
//! `Distributed` children of one parent over 3 shards.
//!
//! ```text
//! cargo run --release -p sheaf-benches --bin relay-bench                 # its own 3 shards (scripts/shards, --release)
//! cargo run --release -p sheaf-benches --bin relay-bench -- --spawns 20 --fanout 100   # quicker
//! ```
//! Latencies are read from the shards' own clocks (one host): a spawn is its
//! parent's `ChildStarted` (the `start_child` transaction), the child's
//! start its `created_at` on its shard (the relay's `relay_start_child`
//! transaction), its end its `closed_at`, and its end in the parent the
//! `Child*` event's time. The commit mode printed is the shards'
//! `synchronous_commit`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use clap::Parser;
use serde_json::json;
use sheaf_driver::{
    ChildPlacement, Client, ExecutionId, Placement, PoolOptions, Relay, RelayOptions, ShardId, StartOptions,
    TaskContext, TaskDone, Topology, Worker, WorkerOptions,
};
use tokio_postgres::NoTls;

#[derive(Parser)]
#[command(
    about = "The relay: cross-shard child start and parent wake latency, NOTIFY vs sweep; a 1,000-child fan-out"
)]
struct Cli {
    /// Children spawned per mode and round.
    #[arg(long, default_value_t = 50)]
    spawns: usize,
    /// Rounds (each runs both modes, alternating).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Distributed children of the one fan-out parent.
    #[arg(long, default_value_t = 1000)]
    fanout: usize,
    /// PostgreSQL major of the bench clusters.
    #[arg(long, default_value_t = 15)]
    pg: u32,
    /// The relay's longest sleep between sweeps, in ms (default: the relay's
    /// own): a child's start waits about half of it without NOTIFY.
    #[arg(long)]
    sweep_ms: Option<u64>,
    /// The relay's recheck of a running child, in ms (default: the relay's
    /// own): a parent's wake waits about this long without NOTIFY. A smoke
    /// run shortens both: it proves the harness, not the figures.
    #[arg(long)]
    recheck_ms: Option<u64>,
}

#[path = "../support.rs"]
mod support;
use support::{Error, pct};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn between(a: SystemTime, b: SystemTime) -> f64 {
    b.duration_since(a).map_or(0.0, ms)
}

async fn db(url: &str) -> Result<tokio_postgres::Client, Error> {
    let (db, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(conn);
    Ok(db)
}

/// A parent's spawns and ends, from its history: child → (ChildStarted, end event).
async fn parent_side(
    url: &str,
    parent: ExecutionId,
) -> Result<BTreeMap<String, (Option<SystemTime>, Option<SystemTime>)>, Error> {
    let rows = db(url)
        .await?
        .query(
            "SELECT payload->>'child_id', event_type, created_at FROM sheaf.events \
             WHERE execution_id = $1 AND event_type LIKE 'Child%'",
            &[&parent.as_uuid()],
        )
        .await?;
    let mut out: BTreeMap<String, (Option<SystemTime>, Option<SystemTime>)> = BTreeMap::new();
    for r in rows {
        let (child, kind, at): (String, String, SystemTime) = (r.get(0), r.get(1), r.get(2));
        let e = out.entry(child).or_default();
        if kind == "ChildStarted" {
            e.0 = Some(at);
        } else {
            e.1 = Some(at);
        }
    }
    Ok(out)
}

/// Children's own side: child → (created_at, closed_at), from every shard.
async fn child_side(
    topology: &Topology,
    parent: ExecutionId,
) -> Result<BTreeMap<String, (ShardId, SystemTime, Option<SystemTime>)>, Error> {
    let mut out = BTreeMap::new();
    for s in topology.shards() {
        let rows = db(&s.url)
            .await?
            .query(
                "SELECT id::text, created_at, closed_at FROM sheaf.executions WHERE parent_id = $1",
                &[&parent.as_uuid()],
            )
            .await?;
        for r in rows {
            out.insert(r.get::<_, String>(0), (s.id, r.get(1), r.get(2)));
        }
    }
    Ok(out)
}

async fn wait_for<F, Fut>(what: &str, secs: u64, mut done: F) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done().await? {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting until {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// One round of one mode: `n` children of a new parent on shard 0, spawned
/// 20 ms apart onto shard 1, each completed as soon as it runs. Returns
/// (spawn → running, child end → parent) in ms.
async fn round(
    c: &Arc<Client>,
    topology: &Topology,
    options: RelayOptions,
    n: usize,
    tag: &str,
) -> Result<(Vec<f64>, Vec<f64>), Error> {
    let shards: Vec<ShardId> = topology.shards().map(|s| s.id).collect();
    let relay = Relay::start(c.clone(), shards.clone(), options);
    let parent = c
        .start_workflow(
            "bench-parent",
            tag,
            json!({}),
            StartOptions::new().placement(Placement::Shard(shards[0])),
        )
        .await?
        .execution_id;
    let mut kids = Vec::new();
    for k in 0..n {
        let child = c
            .start_child(
                parent,
                "bench-child",
                &format!("{tag}-{k}"),
                json!({}),
                ChildPlacement::Shard(shards[1]),
            )
            .await?
            .child_id;
        kids.push(child);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Each child ends as soon as it runs, as a worker would end it.
    let mut open = kids.clone();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !open.is_empty() {
        if Instant::now() > deadline {
            return Err(format!("{} children never ran", open.len()).into());
        }
        let mut still = Vec::new();
        for id in open {
            match c.get_execution(id).await? {
                Some(e) if e.state.is_active() => {
                    c.complete_execution(id, json!(null)).await?;
                }
                Some(_) => {}
                None => still.push(id),
            }
        }
        open = still;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let parent_url = &topology.get(shards[0]).ok_or("shard 0")?.url;
    wait_for("every end is in the parent", 120, || async {
        Ok(parent_side(parent_url, parent)
            .await?
            .values()
            .all(|(_, end)| end.is_some()))
    })
    .await?;
    relay.shutdown().await;
    let spawns = parent_side(parent_url, parent).await?;
    let own = child_side(topology, parent).await?;
    let (mut start, mut wake) = (Vec::new(), Vec::new());
    for (id, (spawned, back)) in &spawns {
        if let (Some(spawned), Some(back), Some((_, created, Some(closed)))) = (spawned, back, own.get(id)) {
            start.push(between(*spawned, *created));
            wake.push(between(*closed, *back));
        }
    }
    Ok((start, wake))
}

/// 1,000 Distributed children of one parent, spawned back to back, run by a
/// worker (with its relay) that completes each child's workflow task.
async fn fanout(c: &Arc<Client>, topology: &Topology, n: usize, tag: &str) -> Result<(), Error> {
    let queue = format!("bench-fanout-{}", std::process::id());
    let report = c
        .admin()
        .declare_workflow("bench-fanout-child", json!({"queue": queue}))
        .await;
    if !report.is_complete() {
        return Err("declare_workflow failed on a shard".into());
    }
    let worker = Worker::start(
        c.clone(),
        WorkerOptions::new(format!("bench-fanout-{}", std::process::id()), [queue])
            .concurrency(32)
            .batch(32)
            .idle_poll(Duration::from_millis(100)),
        |_t: TaskContext| async { Ok(TaskDone::CompleteExecution(json!({"ok": true}).into())) },
    )?;
    let home = topology.shards().next().ok_or("a shard")?;
    let parent = c
        .start_workflow(
            "bench-parent",
            tag,
            json!({}),
            StartOptions::new().placement(Placement::Shard(home.id)),
        )
        .await?
        .execution_id;
    let t0 = Instant::now();
    for k in 0..n {
        c.start_child(
            parent,
            "bench-fanout-child",
            &format!("{tag}-{k}"),
            json!({}),
            ChildPlacement::Distributed,
        )
        .await?;
    }
    let spawned = t0.elapsed();
    wait_for("every result is back in the parent", 300, || async {
        let side = parent_side(&home.url, parent).await?;
        Ok(side.len() == n && side.values().all(|(_, end)| end.is_some()))
    })
    .await?;
    let back = t0.elapsed();
    worker.shutdown().await;
    let own = child_side(topology, parent).await?;
    let side = parent_side(&home.url, parent).await?;
    let first = side.values().filter_map(|(s, _)| *s).min().ok_or("no spawn")?;
    let last_start = own
        .values()
        .map(|(_, created, _)| *created)
        .max()
        .ok_or("no child")?;
    let last_back = side.values().filter_map(|(_, e)| *e).max().ok_or("no end")?;
    let mut per_shard: BTreeMap<ShardId, usize> = BTreeMap::new();
    for (shard, ..) in own.values() {
        *per_shard.entry(*shard).or_default() += 1;
    }
    println!(
        "{n} Distributed children of one parent: spawned in {:.0} ms; all started {:.0} ms and all results back {:.0} ms after the first spawn (wall clock to all back: {:.0} ms)",
        ms(spawned),
        between(first, last_start),
        between(first, last_back),
        ms(back)
    );
    let spread: Vec<String> = per_shard.iter().map(|(s, k)| format!("shard {s}: {k}")).collect();
    println!("  spread: {}", spread.join(", "));
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let cli = Cli::parse();
    let text = match std::env::var("SHEAF_SHARDS") {
        Ok(t) => t,
        Err(_) => support::release_shards(3, cli.pg, "/tmp/sheaf-bench-relay", 25970)?,
    };
    let topology = Topology::parse(&text)?;
    if topology.len() < 2 {
        return Err("the relay benchmark needs at least 2 shards".into());
    }
    let c = Arc::new(Client::new(topology.clone(), PoolOptions::default())?);
    let first = topology.shards().next().ok_or("a shard")?;
    let commit: String = db(&first.url)
        .await?
        .query_one("SHOW synchronous_commit", &[])
        .await?
        .get(0);
    println!(
        "{} shards; synchronous_commit = {commit}; {} rounds x {} spawns per mode, 20 ms apart; relay sweep/recheck {}/{}",
        topology.len(),
        cli.rounds,
        cli.spawns,
        cli.sweep_ms.map_or("default".to_owned(), |ms| format!("{ms} ms")),
        cli.recheck_ms
            .map_or("default".to_owned(), |ms| format!("{ms} ms")),
    );
    let run = std::process::id();
    let (mut notify, mut sweep) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for r in 0..cli.rounds {
        for (listen, into) in [(true, &mut notify), (false, &mut sweep)] {
            let tag = format!("{run}-{r}-{}", if listen { "notify" } else { "sweep" });
            let mut options = RelayOptions::new().listen(listen);
            if let Some(ms) = cli.sweep_ms {
                options = options.sweep_every(Duration::from_millis(ms));
            }
            if let Some(ms) = cli.recheck_ms {
                options = options.recheck(Duration::from_millis(ms));
            }
            let (s, w) = round(&c, &topology, options, cli.spawns, &tag).await?;
            into.0.extend(s);
            into.1.extend(w);
        }
    }
    for (name, (mut s, mut w)) in [("NOTIFY + sweep", notify), ("sweep only", sweep)] {
        println!(
            "{name:<15} spawn -> child running: p50 {:.1} ms, p99 {:.1} ms; child end -> parent: p50 {:.1} ms, p99 {:.1} ms ({} children)",
            pct(&mut s, 0.5),
            pct(&mut s, 0.99),
            pct(&mut w, 0.5),
            pct(&mut w, 0.99),
            s.len()
        );
    }
    fanout(&c, &topology, cli.fanout, &format!("{run}-fanout")).await?;
    Ok(())
}
