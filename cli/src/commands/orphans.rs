//! `sheaf orphans`: children whose parent's shard has no record of them.

use serde_json::{Value, json};

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{failures_json, print_json, say};

/// Children whose parent's shard has no record of them (shards restored
/// to different instants: see docs/concepts/across-shards.md). Exits 5 when it finds any,
/// 3 when partial.
#[derive(clap::Args)]
pub struct Args {}

/// `sheaf orphans`: children whose parent's shard has no record of them.
pub async fn run(_args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let as_json = ctx.json;
    let found = match client.admin().orphan_children().await {
        Ok(o) => o,
        Err(e) => return exit::failed(&e),
    };
    if as_json {
        let items: Vec<Value> = found
            .items
            .iter()
            .map(|o| {
                json!({
                    "execution_id": o.execution_id.to_string(),
                    "shard": o.shard.get(),
                    "parent_id": o.parent_id.to_string(),
                    "workflow_name": o.workflow_name,
                    "workflow_id": o.workflow_id,
                    "state": o.state.as_str(),
                })
            })
            .collect();
        print_json(&json!({
            "items": items,
            "status": found.status,
            "unavailable_shards": failures_json(&found.unavailable_shards),
        }));
    } else if found.items.is_empty() {
        say!("no orphaned children");
    } else {
        say!(
            "{:<38} {:<6} {:<38} {:<10} workflow",
            "child",
            "shard",
            "parent",
            "state"
        );
        for o in &found.items {
            say!(
                "{:<38} {:<6} {:<38} {:<10} {}/{}",
                o.execution_id.to_string(),
                o.shard,
                o.parent_id.to_string(),
                o.state.as_str(),
                o.workflow_name,
                o.workflow_id
            );
        }
    }
    if !found.unavailable_shards.is_empty() {
        return exit::partial_if(&found.unavailable_shards, true);
    }
    if found.items.is_empty() {
        Exit::Done
    } else {
        Exit::Found
    }
}
