//! The dashboard benchmark: how fast `sheaf serve` (`UiServer`) renders each
//! of its pages over a fleet of 4 × 250K executions by default. Goal: every
//! page within 300 ms (p50).
//!
//! ```text
//! cargo run --release -p sheaf-benches --bin ui-bench                      # its own 4 shards (scripts/shards, --release)
//! SHEAF_SHARDS=0=postgres://...,1=postgres://... cargo run --release -p sheaf-benches --bin ui-bench -- --per-shard 2000 --reps 5   # smoke run
//! ```
//! The executions are written straight into the shards' tables (the fill
//! fanout-bench uses, `support::fill`); each shard also gets `--ready`
//! ready tasks and `--dead` dead letters over 4 queues, through the
//! driver (`enqueue_batch`, `claim`, `dead_letter`). A fleet that already
//! holds exactly those is reused as it is: its own shards (under
//! /tmp/sheaf-bench-ui, ports 26100 up) are recreated by each run that
//! starts them, so a re-run passes them in SHEAF_SHARDS.
//!
//! The pages are found as a browser would: the links of the header's nav
//! on `/`; one level in, the first link of each other route those pages
//! link to (an execution's page, a queue's tasks); the pages only a form
//! asks for (`FORMS`: `/executions` filtered, `/usage` over longer
//! windows); each one's next page (`<a id="next">`) if it has one; and the
//! executions page `--deep` "next"s in. Each page gets warm-up GETs, then
//! `--reps` timed GETs in a row: HTTP/1.1 over a new connection each
//! (`Connection: close`), timed from connect to the last byte. The
//! "server" column is what the page says it took to render. Durable
//! commits (the shard's default).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use sheaf_driver::{Client, EnqueueOptions, Placement, PoolOptions, ShardId, Topology};
use sheaf_web::{UiOptions, UiServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_postgres::NoTls;

#[path = "../support.rs"]
mod support;
use support::{Error, fill, pct};

#[derive(Parser)]
#[command(about = "The dashboard's pages over a filled fleet: p50 / p90 / max of each against 300 ms")]
struct Cli {
    /// Executions per shard.
    #[arg(long, default_value_t = 250_000)]
    per_shard: u32,
    /// Ready tasks per shard (over 4 queues).
    #[arg(long, default_value_t = 2_000)]
    ready: u32,
    /// Dead letters per shard (over the same 4 queues).
    #[arg(long, default_value_t = 2_000)]
    dead: u32,
    /// Timed GETs per page per round.
    #[arg(long, default_value_t = 30)]
    reps: usize,
    /// GETs before the timed ones (at least one is made: the first of the
    /// first round is reported as "first ms").
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Rounds over every page (the table gives each round's p50 too).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// The executions page reached by following "next" this many times, timed too (0: none).
    #[arg(long, default_value_t = 20)]
    deep: usize,
    /// The budget of a page's p50, in ms.
    #[arg(long, default_value_t = 300.0)]
    budget_ms: f64,
    /// Shards started when SHEAF_SHARDS is not set.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// PostgreSQL major of the shards it starts.
    #[arg(long, default_value_t = 15)]
    pg: u32,
}

/// The queues of the ready tasks and dead letters.
const QUEUES: [&str; 4] = [
    "ui-bench-email",
    "ui-bench-render",
    "ui-bench-billing",
    "ui-bench-sync",
];

/// Pages a form asks for (no link leads there), timed too. `/executions`
/// filtered (the fill's workflows are `bench-0` to `bench-4`): by a
/// workflow (20% of the executions), a state (5%), both (every FAILED one
/// is a bench-0), and both where they never meet (no bench-3 fails in the
/// fill): the worst case, a page that matches nothing reads every candidate
/// to say so. `/usage` over its longer windows (the default is 24h) and by
/// a search attribute.
const FORMS: [&str; 7] = [
    "/executions?workflow=bench-0",
    "/executions?state=FAILED",
    "/executions?workflow=bench-0&state=FAILED",
    "/executions?workflow=bench-3&state=FAILED",
    "/usage?window=7d",
    "/usage?window=30d",
    "/usage?window=24h&attr=tenant",
];

/// One page of the dashboard to time.
struct Page {
    label: String,
    path: String,
    /// Its first GET, when discovering the pages read it.
    first_ms: Option<f64>,
}

impl Page {
    fn new(label: impl Into<String>, path: impl Into<String>) -> Page {
        Page {
            label: label.into(),
            path: path.into(),
            first_ms: None,
        }
    }
}

/// One timed GET: wall time, the time the page says it took to render,
/// its size and its table rows.
struct Sample {
    wall_ms: f64,
    server_ms: Option<f64>,
    bytes: usize,
    rows: usize,
}

// ---- the fill ----

/// `n` split over the queues: queue `i`'s share.
fn share(n: u32, i: usize) -> u32 {
    let q = QUEUES.len() as u32;
    n / q + u32::from((i as u32) < n % q)
}

/// Whether every shard holds exactly `ready` tasks and `dead` dead letters
/// of the bench's queues.
async fn tasks_in_place(topology: &Topology, ready: u32, dead: u32) -> Result<bool, Error> {
    for s in topology.shards() {
        let (db, conn) = tokio_postgres::connect(&s.url, NoTls).await?;
        tokio::spawn(conn);
        let row = db
            .query_one(
                "SELECT (SELECT count(*) FROM sheaf.tasks WHERE queue = ANY($1)), \
                        (SELECT count(*) FROM sheaf.dead_letters WHERE queue = ANY($1))",
                &[&QUEUES.as_slice()],
            )
            .await?;
        if (row.get::<_, i64>(0), row.get::<_, i64>(1)) != (i64::from(ready), i64::from(dead)) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Enqueues `n` tasks on `queue` on `shard`, a batch at most 10K.
async fn enqueue(c: &Client, shard: ShardId, queue: &str, n: u32, what: &str) -> Result<(), Error> {
    let mut done = 0;
    while done < n {
        // The most one enqueue_batch takes.
        let k = (n - done).min(10_000);
        let payloads = (done..done + k).map(|i| json!({"bench": what, "n": i}));
        c.enqueue_batch(
            queue,
            payloads,
            EnqueueOptions::new().placement(Placement::Shard(shard)),
        )
        .await?;
        done += k;
    }
    Ok(())
}

/// One shard's tasks: per queue, its share of `dead` enqueued, claimed and
/// dead-lettered, then its share of `ready` left ready.
async fn fill_shard_tasks(c: &Client, shard: ShardId, ready: u32, dead: u32) -> Result<(), Error> {
    for (i, queue) in QUEUES.iter().enumerate() {
        enqueue(c, shard, queue, share(dead, i), "dead").await?;
        loop {
            let claimed = c
                .claim(shard, queue, "ui-bench", 1_000, Duration::from_secs(600))
                .await?;
            if claimed.is_empty() {
                break;
            }
            futures::stream::iter(claimed)
                .map(|t| async move {
                    c.dead_letter(t.task_id, t.token, "ui-bench: dead on purpose")
                        .await
                })
                .buffer_unordered(16)
                .try_collect::<Vec<()>>()
                .await?;
        }
        enqueue(c, shard, queue, share(ready, i), "ready").await?;
    }
    Ok(())
}

/// The ready tasks and dead letters of every shard, unless they are there.
async fn fill_tasks(c: &Client, topology: &Topology, ready: u32, dead: u32) -> Result<(), Error> {
    if tasks_in_place(topology, ready, dead).await? {
        return Ok(());
    }
    for queue in QUEUES {
        c.admin().drop_queue(queue, true).await.into_result()?;
    }
    let fills = topology.shards().map(|s| fill_shard_tasks(c, s.id, ready, dead));
    for r in futures::future::join_all(fills).await {
        r?;
    }
    Ok(())
}

/// Each shard's server version and whether its commits are durable.
async fn describe(topology: &Topology) -> Result<Vec<String>, Error> {
    let mut seen: Vec<String> = Vec::new();
    for s in topology.shards() {
        let (db, conn) = tokio_postgres::connect(&s.url, NoTls).await?;
        tokio::spawn(conn);
        let row = db
            .query_one(
                "SELECT current_setting('server_version'), current_setting('synchronous_commit'), \
                        current_setting('fsync')",
                &[],
            )
            .await?;
        let (version, sync, fsync): (String, String, String) = (row.get(0), row.get(1), row.get(2));
        let durable = if sync == "on" && fsync == "on" {
            "durable commits"
        } else {
            "NOT durable commits"
        };
        let line = format!("PostgreSQL {version}, synchronous_commit={sync}, fsync={fsync}: {durable}");
        if !seen.contains(&line) {
            seen.push(line);
        }
    }
    Ok(seen)
}

// ---- HTTP and HTML ----

/// GET `path` over a new connection; the body of a 200, else an error.
async fn get(addr: SocketAddr, path: &str) -> Result<String, Error> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await?;
    let mut raw = Vec::with_capacity(64 * 1024);
    s.read_to_end(&mut raw).await?;
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("GET {path}: no end of headers"))?;
    let head = std::str::from_utf8(&raw[..end])?;
    let body = &raw[end + 4..];
    let status = head.lines().next().unwrap_or_default();
    if status.split(' ').nth(1) != Some("200") {
        let excerpt: String = String::from_utf8_lossy(body).chars().take(300).collect();
        return Err(format!("GET {path}: {status}: {excerpt}").into());
    }
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked { dechunk(body)? } else { body.to_vec() };
    Ok(String::from_utf8(body)?)
}

/// A chunked body's bytes.
fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>, Error> {
    let mut out = Vec::with_capacity(raw.len());
    loop {
        let eol = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunk without its size line")?;
        let size = std::str::from_utf8(&raw[..eol])?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or_default().trim(), 16)?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = raw.get(eol + 2..eol + 2 + size).ok_or("a chunk cut short")?;
        out.extend_from_slice(chunk);
        raw = raw.get(eol + 4 + size..).ok_or("a chunk cut short")?;
    }
}

/// An attribute value's text: HTML character references resolved (askama
/// writes `&` as `&#38;`).
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let Some(semi) = rest.find(';').filter(|&i| i <= 10) else {
            out.push('&');
            rest = &rest[1..];
            continue;
        };
        let name = &rest[1..semi];
        let c = match name {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => name
                .strip_prefix("#x")
                .or_else(|| name.strip_prefix("#X"))
                .map(|h| u32::from_str_radix(h, 16))
                .or_else(|| name.strip_prefix('#').map(str::parse))
                .and_then(Result::ok)
                .and_then(char::from_u32),
        };
        match c {
            Some(c) => {
                out.push(c);
                rest = &rest[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Every `href` of `html` that is a path on this server, unescaped, in order.
fn hrefs(html: &str) -> Vec<String> {
    html.split("href=\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .map(unescape)
        .filter(|h| h.starts_with('/'))
        .collect()
}

/// The links of the page's `<header>` (its nav), each once.
fn nav_links(html: &str) -> Vec<String> {
    let header = html
        .split_once("<header")
        .and_then(|(_, rest)| rest.split_once("</header>"))
        .map_or("", |(h, _)| h);
    let mut links: Vec<String> = Vec::new();
    for h in hrefs(header) {
        if !links.contains(&h) {
            links.push(h);
        }
    }
    links
}

/// The target of the page's `<a id="next">`, if it has one.
fn next_link(html: &str) -> Option<String> {
    let at = html.find("id=\"next\"")?;
    let start = html[..at].rfind('<')?;
    let end = at + html[at..].find('>')?;
    hrefs(&html[start..=end]).into_iter().next()
}

/// What the page says it took to render ("Rendered in 12.3 ms").
fn server_ms(html: &str) -> Option<f64> {
    let (_, rest) = html.split_once("Rendered in ")?;
    rest.split_once(" ms")?.0.trim().parse().ok()
}

/// The page's table rows (`<tr data-…>`: one per execution, queue row,
/// shard…).
fn rows(html: &str) -> usize {
    html.matches("<tr data-").count()
}

// ---- the pages and their timings ----

/// A link's route: its path with the segments after the first as `<id>`,
/// and its query's keys (`/tasks?queue=a` → `/tasks?queue`).
fn shape(href: &str) -> String {
    let (path, query) = href.split_once('?').unwrap_or((href, ""));
    let mut segments = path.split('/').skip(1);
    let mut shape = format!("/{}", segments.next().unwrap_or_default());
    for _ in segments {
        shape.push_str("/<id>");
    }
    let keys: Vec<&str> = query
        .split('&')
        .filter_map(|kv| kv.split('=').next())
        .filter(|k| !k.is_empty())
        .collect();
    if !keys.is_empty() {
        shape.push('?');
        shape.push_str(&keys.join("&"));
    }
    shape
}

/// `page`, and its next page (`<a id="next">`) if it has one.
async fn with_next(addr: SocketAddr, mut page: Page, pages: &mut Vec<Page>) -> Result<String, Error> {
    let t = Instant::now();
    let html = get(addr, &page.path).await?;
    page.first_ms = Some(t.elapsed().as_secs_f64() * 1000.0);
    let label = page.label.clone();
    pages.push(page);
    if let Some(next) = next_link(&html) {
        pages.push(Page::new(format!("{label} page 2 (next)"), next));
    }
    Ok(html)
}

/// The pages to time, found from `/`: its nav's links; one level in, the
/// first link of each other route they link to (an execution's page, a
/// queue's tasks); the pages of [`FORMS`]; each of those
/// pages' page 2; and the executions page `deep` "next"s in.
async fn discover(addr: SocketAddr, deep: usize) -> Result<Vec<Page>, Error> {
    let nav = nav_links(&get(addr, "/").await?);
    if nav.is_empty() {
        return Err("no links in the <header> of /".into());
    }
    let mut known: Vec<String> = nav.iter().map(|h| shape(h)).collect();
    let mut pages: Vec<Page> = Vec::new();
    for path in &nav {
        let html = match with_next(addr, Page::new(path.as_str(), path.as_str()), &mut pages).await {
            Ok(html) => html,
            Err(e) => {
                println!("NOT timed: {e}");
                continue;
            }
        };
        let next = next_link(&html);
        for href in hrefs(&html) {
            let route = shape(&href);
            if known.contains(&route) || next.as_ref() == Some(&href) {
                continue;
            }
            let label = if route.contains("<id>") {
                format!("{route} (first on {path})")
            } else {
                href.clone()
            };
            known.push(route);
            if let Err(e) = with_next(addr, Page::new(label, href), &mut pages).await {
                println!("NOT timed: {e}");
            }
        }
    }
    if !known.iter().any(|k| k.starts_with("/executions/")) {
        println!("(no execution's page linked from the nav's pages: none timed)");
    }
    for path in FORMS {
        with_next(addr, Page::new(path, path), &mut pages).await?;
    }
    if deep > 0 {
        let mut path = "/executions".to_owned();
        let mut reached = 1;
        while reached <= deep {
            match next_link(&get(addr, &path).await?) {
                Some(next) => path = next,
                None => break,
            }
            reached += 1;
        }
        if reached > 1 {
            pages.push(Page::new(
                format!("/executions page {reached} (next x{})", reached - 1),
                path,
            ));
        }
    }
    Ok(pages)
}

/// `warmup` GETs of `page`, then `reps` timed ones. Also the page's first
/// GET of the run (the one that found it, else the first of these): the
/// page as nobody asked for it yet, e.g. a usage report the dashboard has
/// not kept.
async fn measure(
    addr: SocketAddr,
    page: &Page,
    warmup: usize,
    reps: usize,
) -> Result<(f64, Vec<Sample>), Error> {
    let t = Instant::now();
    get(addr, &page.path).await?;
    let first_ms = page.first_ms.unwrap_or(t.elapsed().as_secs_f64() * 1000.0);
    for _ in 1..warmup {
        get(addr, &page.path).await?;
    }
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        let html = get(addr, &page.path).await?;
        let wall_ms = t.elapsed().as_secs_f64() * 1000.0;
        samples.push(Sample {
            wall_ms,
            server_ms: server_ms(&html),
            bytes: html.len(),
            rows: rows(&html),
        });
    }
    Ok((first_ms, samples))
}

/// The table: per page, its first GET of the run, p50 / p90 / max over every round's samples, the
/// page's own render time (p50), its size and rows, each round's p50, and
/// whether its p50 is within budget. Returns the pages over it.
fn report(pages: &[Page], firsts: &[f64], timings: &[Vec<Vec<Sample>>], budget_ms: f64) -> Vec<String> {
    let width = pages.iter().map(|p| p.label.len()).max().unwrap_or(0).max(4);
    println!(
        "{:<width$}  {:>8}  {:>8} {:>8} {:>8}  {:>10}  {:>7} {:>5}  {:<22} within {budget_ms:.0} ms",
        "page", "first ms", "p50 ms", "p90 ms", "max ms", "server p50", "KB", "rows", "p50 by round"
    );
    let mut over = Vec::new();
    for ((page, rounds), first) in pages.iter().zip(timings).zip(firsts) {
        let all: Vec<&Sample> = rounds.iter().flatten().collect();
        let mut wall: Vec<f64> = all.iter().map(|s| s.wall_ms).collect();
        let mut server: Vec<f64> = all.iter().filter_map(|s| s.server_ms).collect();
        let by_round: Vec<String> = rounds
            .iter()
            .map(|r| {
                let mut v: Vec<f64> = r.iter().map(|s| s.wall_ms).collect();
                format!("{:.1}", pct(&mut v, 0.5))
            })
            .collect();
        let (p50, p90, max) = (pct(&mut wall, 0.5), pct(&mut wall, 0.9), pct(&mut wall, 1.0));
        let server = if server.is_empty() {
            "-".to_owned()
        } else {
            format!("{:.1}", pct(&mut server, 0.5))
        };
        let last = all.last();
        let ok = p50 <= budget_ms;
        if !ok {
            over.push(page.label.clone());
        }
        println!(
            "{:<width$}  {first:>8.1}  {p50:>8.1} {p90:>8.1} {max:>8.1}  {server:>10}  {:>7.1} {:>5}  {:<22} {}",
            page.label,
            last.map_or(0.0, |s| s.bytes as f64 / 1024.0),
            last.map_or(0, |s| s.rows),
            by_round.join(" "),
            if ok { "yes" } else { "NO" }
        );
    }
    over
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let cli = Cli::parse();
    let text = match std::env::var("SHEAF_SHARDS") {
        Ok(t) => t,
        Err(_) => support::release_shards(cli.shards, cli.pg, "/tmp/sheaf-bench-ui", 26100)?,
    };
    let topology = Topology::parse(&text)?;
    let client = Arc::new(Client::new(topology.clone(), PoolOptions::default())?);
    let started = Instant::now();
    let fills = topology.shards().map(|s| fill(&s.url, cli.per_shard));
    for r in futures::future::join_all(fills).await {
        r?;
    }
    fill_tasks(&client, &topology, cli.ready, cli.dead).await?;
    println!(
        "{} shards x {} executions, {} ready tasks and {} dead letters each (over {} queues); ready in {:.0?}",
        topology.shards().count(),
        cli.per_shard,
        cli.ready,
        cli.dead,
        QUEUES.len(),
        started.elapsed()
    );
    for line in describe(&topology).await? {
        println!("{line}");
    }
    let server = UiServer::start(
        Arc::clone(&client),
        SocketAddr::from(([127, 0, 0, 1], 0)),
        // Pages as a signed-in operator sees them, payloads and the
        // attribute grouping included (signed out, those are refused).
        UiOptions::default().public_read(true),
    )
    .await?;
    let addr = server.local_addr();
    let pages = discover(addr, cli.deep).await?;
    println!(
        "{} pages; each: {} warm-up GETs, then {} timed GETs in a row x {} round(s) \
         (HTTP/1.1, a new connection each, timed to the last byte)\n",
        pages.len(),
        cli.warmup,
        cli.reps,
        cli.rounds
    );
    let mut timings: Vec<Vec<Vec<Sample>>> = pages.iter().map(|_| Vec::new()).collect();
    let mut firsts: Vec<f64> = Vec::new();
    for round in 0..cli.rounds {
        for (page, t) in pages.iter().zip(timings.iter_mut()) {
            let (first, samples) = measure(addr, page, cli.warmup, cli.reps).await?;
            if round == 0 {
                firsts.push(first);
            }
            t.push(samples);
        }
    }
    let over = report(&pages, &firsts, &timings, cli.budget_ms);
    if over.is_empty() {
        println!("\nevery page's p50 is within {:.0} ms", cli.budget_ms);
    } else {
        println!("\nover {:.0} ms (p50): {}", cli.budget_ms, over.join(", "));
    }
    server.shutdown().await;
    Ok(())
}
