//! `sheaf queues`: every queue, its counts per shard and in total.

use serde_json::{Value, json};
use sheaf_driver::{PageStatus, QueueListing};

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{cut, failures_json, print_json, say};

/// Every queue of every shard: its tasks by state and dead letters,
/// per shard and in total, and its oldest ready task's age. Exits 3
/// when partial.
#[derive(clap::Args)]
pub struct Args {}

pub async fn run(_args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let listing: QueueListing = client.admin().list_queues().await;
    if ctx.json {
        print_json(&listing_json(&listing));
    } else {
        print_table(&listing);
    }
    exit::partial_if(&listing.unavailable_shards, listing.status == PageStatus::Partial)
}

fn listing_json(listing: &QueueListing) -> Value {
    let counts = |c: &sheaf_driver::QueueCounts| {
        json!({
            "ready": c.ready, "scheduled": c.scheduled, "running": c.running,
            "waiting": c.waiting, "paused": c.paused, "dead": c.dead,
            "oldest_ready_secs": c.oldest_ready_age.map(|d| d.as_secs_f64()),
        })
    };
    let queues: Vec<Value> = listing
        .queues
        .iter()
        .map(|q| {
            json!({
                "queue": q.queue,
                "total": counts(&q.total),
                "per_shard": q.per_shard.iter().map(|(s, c)| (s.to_string(), counts(c))).collect::<serde_json::Map<_, _>>(),
            })
        })
        .collect();
    json!({
        "queues": queues,
        "status": listing.status,
        "unavailable_shards": failures_json(&listing.unavailable_shards),
    })
}

fn print_table(listing: &QueueListing) {
    say!(
        "{:<24} {:<6} {:>8} {:>9} {:>8} {:>8} {:>7} {:>7} {:>12}",
        "queue",
        "shard",
        "ready",
        "scheduled",
        "running",
        "waiting",
        "paused",
        "dead",
        "oldest_ready"
    );
    for q in &listing.queues {
        let rows = q.per_shard.iter().map(|(s, c)| (s.to_string(), c));
        for (shard, c) in rows.chain(std::iter::once(("total".to_owned(), &q.total))) {
            say!(
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
