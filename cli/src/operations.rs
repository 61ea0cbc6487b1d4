//! `sheaf tasks cancel`, `sheaf dead-letters redrive` and `purge`: the
//! operator's actions on tasks and dead letters across every shard.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use sheaf_driver::{Client, ClientError, ShardId, TaskId};

use crate::executions::cut;
use crate::exit;

/// Dead letters redriven per shard and call: each call is one transaction
/// per shard, so a long redrive holds no lock for long.
const REDRIVE_BATCH: i32 = 1000;

/// `--older-than` as a duration (`7days`, `1h`, `0s`).
pub fn parse_age(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("`{}` is not a duration like 1h or 7days: {e}", cut(s, 40)))
}

/// `sheaf tasks cancel ID [--reason R]`: exits 4 when its shard has no such
/// task.
pub async fn cancel(client: &Client, id: &str, reason: Option<&str>, as_json: bool) -> ExitCode {
    let Ok(task_id) = id.parse::<TaskId>() else {
        return exit::usage(format!("{:?} is not a task id", cut(id, 40)));
    };
    let cancelled = match client.cancel_task(task_id, reason).await {
        Ok(c) => c,
        Err(e @ ClientError::UnknownTask { .. }) => {
            eprintln!("sheaf: {e}");
            return exit::NOT_FOUND.into();
        }
        Err(e) => return exit::failed(&e),
    };
    if as_json {
        exit::print_json(&json!({"task_id": task_id.to_string(), "cancelled": cancelled}));
    } else if cancelled {
        println!(
            "task {task_id} cancelled (a running task ends when its worker hears of it, or at its lease's end)"
        );
    } else {
        println!("task {task_id} was cancelled already");
    }
    ExitCode::SUCCESS
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
) -> ExitCode {
    let total: i64 = counts.values().sum();
    if as_json {
        exit::print_json(&json!({
            what: total,
            "per_shard": counts.iter().map(|(s, n)| (s.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "failed_shards": exit::failures_json(failed),
        }));
    } else {
        println!("{:<6} {:>10}", "shard", what);
        for (shard, n) in counts {
            println!("{:<6} {:>10}", shard, n);
        }
        println!("{:<6} {:>10}", "total", total);
    }
    exit::partial_if(failed, !failed.is_empty())
}

/// `sheaf dead-letters redrive --queue Q [--older-than D]`: redrives in
/// batches until no shard has one left to move, with a progress bar.
pub async fn redrive_queue(client: &Client, queue: &str, older_than: Duration, as_json: bool) -> ExitCode {
    let bar = bar(as_json, "redriven");
    let mut counts: BTreeMap<ShardId, i64> = BTreeMap::new();
    let mut failed = BTreeMap::new();
    loop {
        let report = match client.redrive_queue(queue, older_than, REDRIVE_BATCH).await {
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
pub async fn redrive_ids(client: &Client, ids: &[String], as_json: bool) -> ExitCode {
    let mut task_ids = Vec::with_capacity(ids.len());
    for id in ids {
        match id.parse::<TaskId>() {
            Ok(t) => task_ids.push(t),
            Err(_) => return exit::usage(format!("{:?} is not a task id", cut(id, 40))),
        }
    }
    let report = client.redrive(&task_ids).await;
    let counts = report.ok.iter().map(|(s, n)| (*s, i64::from(*n))).collect();
    per_shard(&counts, &report.failed, "redriven", as_json)
}

/// `sheaf dead-letters purge --queue Q --older-than D`.
pub async fn purge(client: &Client, queue: &str, older_than: Duration, as_json: bool) -> ExitCode {
    match client.purge_dead_letters(queue, older_than).await {
        Ok(report) => per_shard(&report.ok, &report.failed, "purged", as_json),
        Err(e) => exit::failed(&e),
    }
}
