//! `sheaf concurrency`: every concurrency key of every shard.

use serde_json::json;
use sheaf_driver::PageStatus;

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{failures_json, print_json, say};

/// Every concurrency key of every shard: running, ready and waiting
/// tasks added up, and each shard's cap. Exits 3 when partial.
#[derive(clap::Args)]
pub struct Args {}

pub async fn run(_args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let report = match client.admin().concurrency_report().await {
        Ok(r) => r,
        Err(e) => return exit::failed(&e),
    };
    if ctx.json {
        print_json(&json!({
            "keys": report.groups,
            "status": report.status,
            "unavailable_shards": failures_json(&report.unavailable_shards),
        }));
    } else {
        say!(
            "{:<32} {:>8} {:>8} {:>8}  caps per shard",
            "key",
            "running",
            "ready",
            "waiting"
        );
        for (key, k) in &report.groups {
            let caps: Vec<String> = k.caps.iter().map(|(s, c)| format!("{s}:{c}")).collect();
            say!(
                "{:<32} {:>8} {:>8} {:>8}  {}",
                key,
                k.running,
                k.ready,
                k.waiting,
                if caps.is_empty() {
                    "-".to_owned()
                } else {
                    caps.join(" ")
                }
            );
        }
    }
    exit::partial_if(&report.unavailable_shards, report.status == PageStatus::Partial)
}
