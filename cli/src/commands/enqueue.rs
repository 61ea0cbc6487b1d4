//! `sheaf enqueue QUEUE`: enqueue a task from a script.

use std::path::PathBuf;
use std::time::SystemTime;

use serde_json::json;
use sheaf_driver::EnqueueOptions;

use super::Context;
use super::placement::PlacementArgs;
use crate::exit::{self, Exit};
use crate::output::{print_json, say};
use crate::parse;

/// Enqueue a task: its id and shard (with an idempotency key held by an
/// unfinished task, that task's). Placed on any writable shard, by its
/// idempotency key or rate key, or as a flag says. Exits 2 for a payload
/// that is not JSON or a shard not in the topology.
#[derive(clap::Args)]
pub struct Args {
    /// The queue.
    queue: String,
    /// Its payload, as JSON (default null).
    #[arg(long, conflicts_with = "payload_file")]
    payload: Option<String>,
    /// Its payload, read from a JSON file (`-`: stdin).
    #[arg(long, value_name = "PATH")]
    payload_file: Option<PathBuf>,
    /// Higher runs first (default 0).
    #[arg(long, allow_hyphen_values = true)]
    priority: Option<i32>,
    /// Not claimable before this time (a timestamp).
    #[arg(long, value_parser = parse::at, value_name = "TIME")]
    run_at: Option<SystemTime>,
    /// While a task with this key is unfinished, enqueueing again returns
    /// its id and writes nothing.
    #[arg(long, value_name = "KEY")]
    idempotency_key: Option<String>,
    /// Counts toward this key's concurrency cap.
    #[arg(long, value_name = "KEY")]
    concurrency_key: Option<String>,
    /// Attempts before it is dead-lettered (default 25).
    #[arg(long, value_name = "N")]
    max_attempts: Option<i32>,
    /// Waits on this declared rate limit.
    #[arg(long, value_name = "LIMIT")]
    rate_limit: Option<String>,
    /// Its bucket's key under --rate-limit.
    #[arg(long, value_name = "KEY", requires = "rate_limit")]
    rate_key: Option<String>,
    #[command(flatten)]
    placement: PlacementArgs,
}

pub async fn run(args: Args, ctx: &Context) -> Exit {
    let payload = match parse::json_value("payload", args.payload.as_deref(), args.payload_file.as_deref()) {
        Ok(v) => v,
        Err(why) => return exit::bad_input(why),
    };
    let mut options = EnqueueOptions::new();
    if let Some(placement) = args.placement.placement() {
        options = options.placement(placement);
    }
    if let Some(priority) = args.priority {
        options = options.priority(priority);
    }
    if let Some(at) = args.run_at {
        options = options.run_at(at);
    }
    if let Some(key) = args.idempotency_key {
        options = options.idempotency_key(key);
    }
    if let Some(key) = args.concurrency_key {
        options = options.concurrency_key(key);
    }
    if let Some(n) = args.max_attempts {
        options = options.max_attempts(n);
    }
    if let Some(limit) = args.rate_limit {
        options = options.rate_limit(limit);
    }
    if let Some(key) = args.rate_key {
        options = options.rate_key(key);
    }
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let enqueued = match client.enqueue(&args.queue, payload, options).await {
        Ok(e) => e,
        Err(e) => return exit::failed(&e),
    };
    if ctx.json {
        print_json(&json!({"task_id": enqueued.task_id.to_string(), "shard": enqueued.shard.get()}));
    } else {
        say!("task_id  {}", enqueued.task_id);
        say!("shard    {}", enqueued.shard);
    }
    Exit::Done
}
