//! `sheaf tasks`, `sheaf dead-letters` and `sheaf queues`: the operator's
//! view of tasks across every shard.

use std::process::ExitCode;

use serde_json::{Value, json};
use sheaf_driver::{
    Client, ListPage, ListedDeadLetter, ListedTask, PageStatus, QueueListing, TaskId, TaskState,
};

use crate::executions::{cut, time};
use crate::exit;

fn page_json<T>(page: &ListPage<T>, item: impl Fn(&T) -> Value) -> Value {
    json!({
        "items": page.items.iter().map(item).collect::<Vec<_>>(),
        "next_cursor": page.next_cursor,
        "status": page.status,
        "unavailable_shards": exit::failures_json(&page.unavailable_shards),
    })
}

fn more<T>(page: &ListPage<T>) -> ExitCode {
    if let Some(c) = &page.next_cursor {
        println!("more: --cursor {c}");
    }
    exit::partial_if(&page.unavailable_shards, page.status == PageStatus::Partial)
}

/// `sheaf tasks list QUEUE [--state S]`.
pub async fn list(
    client: &Client,
    queue: &str,
    state: Option<&str>,
    cursor: Option<&str>,
    page_size: usize,
    as_json: bool,
) -> ExitCode {
    let state = match state.map(str::parse::<TaskState>).transpose() {
        Ok(s) => s,
        Err(_) => return exit::usage("--state takes scheduled, waiting, ready, running or paused".into()),
    };
    let page = match client.list_tasks(queue, state, cursor, page_size).await {
        Ok(p) => p,
        Err(e) => return exit::failed(&e),
    };
    if as_json {
        exit::print_json(&page_json(&page, task_json));
        return exit::partial_if(&page.unavailable_shards, page.status == PageStatus::Partial);
    }
    println!(
        "{:<36} {:<5} {:<9} {:>8} {:>8} {:<27} last_error",
        "task_id", "shard", "state", "priority", "attempts", "run_at"
    );
    for t in &page.items {
        println!(
            "{:<36} {:<5} {:<9} {:>8} {:>8} {:<27} {}",
            t.task_id,
            t.shard,
            t.state.as_str(),
            t.priority,
            format!("{}/{}", t.attempts, t.max_attempts),
            time(t.run_at),
            cut(t.last_error.as_deref().unwrap_or(""), 40)
        );
    }
    more(&page)
}

fn task_json(t: &ListedTask) -> Value {
    json!({
        "task_id": t.task_id.to_string(),
        "shard": t.shard.get(),
        "queue": t.queue,
        "kind": t.kind,
        "state": t.state.as_str(),
        "priority": t.priority,
        "attempts": t.attempts,
        "max_attempts": t.max_attempts,
        "run_at": time(t.run_at),
        "enqueued_at": time(t.enqueued_at),
        "concurrency_key": t.concurrency_key,
        "lease_expires_at": t.lease_expires_at.map(time),
        "last_error": t.last_error,
        "execution_id": t.execution_id.map(|id| id.to_string()),
        "progress": t.progress,
    })
}

/// `sheaf tasks get ID`: exits 4 when its shard has no such task.
pub async fn get(client: &Client, id: &str, as_json: bool) -> ExitCode {
    let Ok(task_id) = id.parse::<TaskId>() else {
        return exit::usage(format!("{:?} is not a task id", cut(id, 40)));
    };
    let task = match client.get_task(task_id).await {
        Ok(t) => t,
        Err(e @ sheaf_driver::ClientError::UnknownTask { .. }) => {
            eprintln!("sheaf: {e}");
            return exit::NOT_FOUND.into();
        }
        Err(e) => return exit::failed(&e),
    };
    let value = json!({
        "task_id": task.task_id.to_string(),
        "shard": task.shard.get(),
        "queue": task.queue,
        "kind": task.kind,
        "state": task.state,
        "priority": task.priority,
        "attempts": task.attempts,
        "max_attempts": task.max_attempts,
        "run_at": task.run_at.map(time),
        "enqueued_at": time(task.enqueued_at),
        "concurrency_key": task.concurrency_key,
        "lease_owner": task.lease_owner,
        "lease_expires_at": task.lease_expires_at.map(time),
        "last_error": task.last_error,
        "execution_id": task.execution_id.map(|id| id.to_string()),
        "idempotency_key": task.idempotency_key,
        "fairness_key": task.fairness_key,
        "dead_at": task.dead_at.map(time),
        "progress": task.progress,
        "payload": task.payload,
    });
    if as_json {
        exit::print_json(&value);
    } else if let Value::Object(fields) = value {
        for (k, v) in fields {
            let text = match v {
                Value::Null => continue,
                Value::String(s) => s,
                other => other.to_string(),
            };
            println!("{k:<16} {}", cut(&text, 200));
        }
    }
    ExitCode::SUCCESS
}

/// `sheaf dead-letters list [--queue Q]`, newest first.
pub async fn dead_letters(
    client: &Client,
    queue: Option<&str>,
    cursor: Option<&str>,
    page_size: usize,
    as_json: bool,
) -> ExitCode {
    let page = match client.list_dead_letters(queue, cursor, page_size).await {
        Ok(p) => p,
        Err(e) => return exit::failed(&e),
    };
    if as_json {
        exit::print_json(&page_json(&page, dead_json));
        return exit::partial_if(&page.unavailable_shards, page.status == PageStatus::Partial);
    }
    println!(
        "{:<36} {:<5} {:<20} {:>8} {:<27} last_error",
        "task_id", "shard", "queue", "attempts", "dead_at"
    );
    for d in &page.items {
        println!(
            "{:<36} {:<5} {:<20} {:>8} {:<27} {}",
            d.task_id,
            d.shard,
            cut(&d.queue, 20),
            d.attempts,
            time(d.dead_at),
            cut(d.last_error.as_deref().unwrap_or(""), 60)
        );
    }
    more(&page)
}

fn dead_json(d: &ListedDeadLetter) -> Value {
    json!({
        "task_id": d.task_id.to_string(),
        "shard": d.shard.get(),
        "queue": d.queue,
        "kind": d.kind,
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

/// `sheaf queues`: every queue, its counts per shard and in total.
pub async fn queues(client: &Client, as_json: bool) -> ExitCode {
    let listing: QueueListing = client.list_queues().await;
    if as_json {
        let queues: Vec<Value> = listing
            .queues
            .iter()
            .map(|q| {
                let counts = |c: &sheaf_driver::QueueCounts| {
                    json!({
                        "ready": c.ready, "scheduled": c.scheduled, "running": c.running,
                        "waiting": c.waiting, "paused": c.paused, "dead": c.dead,
                        "oldest_ready_secs": c.oldest_ready_age.map(|d| d.as_secs_f64()),
                    })
                };
                json!({
                    "queue": q.queue,
                    "total": counts(&q.total),
                    "per_shard": q.per_shard.iter().map(|(s, c)| (s.to_string(), counts(c))).collect::<serde_json::Map<_, _>>(),
                })
            })
            .collect();
        exit::print_json(&json!({
            "queues": queues,
            "status": listing.status,
            "unavailable_shards": exit::failures_json(&listing.unavailable_shards),
        }));
    } else {
        println!(
            "{:<24} {:<6} {:>8} {:>9} {:>8} {:>8} {:>7} {:>7} {:>12}",
            "queue", "shard", "ready", "scheduled", "running", "waiting", "paused", "dead", "oldest_ready"
        );
        for q in &listing.queues {
            let rows = q.per_shard.iter().map(|(s, c)| (s.to_string(), c));
            for (shard, c) in rows.chain(std::iter::once(("total".to_owned(), &q.total))) {
                println!(
                    "{:<24} {:<6} {:>8} {:>9} {:>8} {:>8} {:>7} {:>7} {:>12}",
                    cut(&q.queue, 24),
                    shard,
                    c.ready,
                    c.scheduled,
                    c.running,
                    c.waiting,
                    c.paused,
                    c.dead,
                    c.oldest_ready_age
                        .map_or("-".to_owned(), |d| format!("{:.1}s", d.as_secs_f64()))
                );
            }
        }
    }
    exit::partial_if(&listing.unavailable_shards, listing.status == PageStatus::Partial)
}
