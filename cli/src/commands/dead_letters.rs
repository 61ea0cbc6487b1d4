//! `sheaf dead-letters list|redrive|purge`: dead letters across every
//! shard, and the operator's actions on them.

use std::collections::BTreeMap;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use sheaf_driver::{Client, ClientError, ListedDeadLetter, ShardId};

use super::Context;
use super::tasks::parse_id;
use crate::exit::{self, Exit};
use crate::output::{Column, cut, failures_json, print_json, print_page, say, table, time};

/// Dead letters across every shard, newest first, a page at a time.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Dead letters, newest first; exits 3 when a shard did not answer.
    List {
        /// Only this queue's.
        #[arg(long)]
        queue: Option<String>,
        /// Dead letters per page (1 to 999).
        #[arg(long, default_value_t = 50)]
        page_size: usize,
        /// Where to go on from: the `more:` cursor of the page before.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Put dead letters back in line with fresh attempts: a queue's on
    /// every shard (in batches, with a progress bar, until none is left to
    /// move: those that cannot go back stay), or the ones named. Prints a
    /// count per shard; exits 3 when a shard did not answer.
    Redrive {
        /// Every dead letter of this queue.
        #[arg(long, conflicts_with = "task_ids", required_unless_present = "task_ids")]
        queue: Option<String>,
        /// Only those dead longer than this (1h, 7days).
        #[arg(long, requires = "queue", value_parser = crate::parse::age)]
        older_than: Option<Duration>,
        /// These dead letters (each shard moves its ids or none).
        task_ids: Vec<String>,
    },
    /// Delete a queue's dead letters older than --older-than on every
    /// shard (their tenants' quota counters follow). Prints a count per
    /// shard; exits 3 when a shard did not answer.
    Purge {
        /// The queue.
        #[arg(long)]
        queue: String,
        /// Only those dead longer than this (1h, 7days; 0s: all of them).
        #[arg(long, value_parser = crate::parse::age)]
        older_than: Duration,
    },
}

/// Dead letters redriven per shard and call: each call is one transaction
/// per shard, so a long redrive holds no lock for long.
const REDRIVE_BATCH: i32 = 1000;

pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let as_json = ctx.json;
    match args.what {
        Action::List {
            queue,
            page_size,
            cursor,
        } => list(&client, queue.as_deref(), cursor.as_deref(), page_size, as_json).await,
        Action::Redrive {
            queue: Some(queue),
            older_than,
            ..
        } => redrive_queue(&client, &queue, older_than.unwrap_or_default(), as_json).await,
        Action::Redrive { task_ids, .. } => redrive_ids(&client, &task_ids, as_json).await,
        Action::Purge { queue, older_than } => {
            match client.admin().purge_dead_letters(&queue, older_than).await {
                Ok(report) => per_shard(&report.ok, &report.failed, "purged", as_json),
                Err(e) => exit::failed(&e),
            }
        }
    }
}

/// `sheaf dead-letters list [--queue Q]`, newest first.
async fn list(
    client: &Client,
    queue: Option<&str>,
    cursor: Option<&str>,
    page_size: usize,
    as_json: bool,
) -> Exit {
    let page = match client.admin().list_dead_letters(queue, cursor, page_size).await {
        Ok(p) => p,
        Err(e) => return exit::failed(&e),
    };
    print_page(&page, as_json, dead_json, print_table)
}

fn print_table(dead: &[ListedDeadLetter]) {
    const COLUMNS: &[Column] = &[
        Column::left("task_id", 36),
        Column::left("shard", 5),
        Column::left("queue", 20),
        Column::right("attempts", 8),
        Column::left("dead_at", 27),
        Column::left("last_error", 0),
    ];
    table(
        COLUMNS,
        dead.iter().map(|d| {
            vec![
                d.task_id.to_string(),
                d.shard.to_string(),
                cut(&d.queue, 20),
                d.attempts.to_string(),
                time(d.dead_at),
                cut(d.last_error.as_deref().unwrap_or(""), 60),
            ]
        }),
    );
}

fn dead_json(d: &ListedDeadLetter) -> Value {
    json!({
        "task_id": d.task_id.to_string(),
        "shard": d.shard.get(),
        "queue": d.queue,
        "kind": d.kind.as_str(),
        "priority": d.priority,
        "attempts": d.attempts,
        "max_attempts": d.max_attempts,
        "execution_id": d.execution_id.map(|id| id.to_string()),
        "concurrency_key": d.concurrency_key,
        "last_error": d.last_error,
        "enqueued_at": time(d.enqueued_at),
        "dead_at": time(d.dead_at),
    })
}

fn bar(as_json: bool, what: &str) -> ProgressBar {
    if as_json {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    let style = ProgressStyle::with_template(&format!(
        "{{spinner}} {{elapsed_precise}} {{pos}} {what} ({{per_sec}})"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_spinner());
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Per shard counts, and the shards that failed, as a table or JSON; exit
/// 3 when a shard failed.
fn per_shard(
    counts: &BTreeMap<ShardId, i64>,
    failed: &BTreeMap<ShardId, ClientError>,
    what: &str,
    as_json: bool,
) -> Exit {
    let total: i64 = counts.values().sum();
    if as_json {
        print_json(&json!({
            what: total,
            "per_shard": counts.iter().map(|(s, n)| (s.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "failed_shards": failures_json(failed),
        }));
    } else {
        say!("{:<6} {:>10}", "shard", what);
        for (shard, n) in counts {
            say!("{:<6} {:>10}", shard, n);
        }
        say!("{:<6} {:>10}", "total", total);
    }
    exit::partial_if(failed, !failed.is_empty())
}

/// `sheaf dead-letters redrive --queue Q [--older-than D]`: redrives in
/// batches until no shard has one left to move, with a progress bar.
async fn redrive_queue(client: &Client, queue: &str, older_than: Duration, as_json: bool) -> Exit {
    let bar = bar(as_json, "redriven");
    let mut counts: BTreeMap<ShardId, i64> = BTreeMap::new();
    let mut failed = BTreeMap::new();
    loop {
        let report = match client
            .admin()
            .redrive_queue(queue, older_than, REDRIVE_BATCH)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                bar.finish_and_clear();
                return exit::failed(&e);
            }
        };
        let mut moved = 0;
        for (shard, n) in report.ok {
            *counts.entry(shard).or_default() += i64::from(n);
            moved += i64::from(n);
            failed.remove(&shard);
        }
        bar.inc(moved as u64);
        // A shard that failed is asked again while others still move; it
        // stays reported if it never answers.
        failed.extend(report.failed);
        if moved == 0 {
            break;
        }
    }
    bar.finish_and_clear();
    per_shard(&counts, &failed, "redriven", as_json)
}

/// `sheaf dead-letters redrive IDS...`: each shard moves its ids or none.
async fn redrive_ids(client: &Client, ids: &[String], as_json: bool) -> Exit {
    let task_ids = match ids.iter().map(|id| parse_id(id)).collect::<Result<Vec<_>, _>>() {
        Ok(t) => t,
        Err(code) => return code,
    };
    let report = client.admin().redrive(&task_ids).await;
    let counts = report.ok.iter().map(|(s, n)| (*s, i64::from(*n))).collect();
    per_shard(&counts, &report.failed, "redriven", as_json)
}
