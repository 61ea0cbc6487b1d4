//! `sheaf rebalance-resume --from A`: finish the moves a crash or an
//! interruption left on a shard.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sheaf_driver::{MoveReport, ShardId};

use super::Context;
use crate::exit::{self, Exit};
use crate::moves::{exit_for, print_table, report_json, shard_arg};
use crate::output::{print_json, say};

/// Finish the moves a crash or an interruption left on a shard: before
/// the cutover, discard the staged copy and move it again; after it,
/// activate the copy on its target (a worker does that on its own
/// after 30 s).
#[derive(clap::Args)]
pub struct Args {
    /// The shard the moves are from.
    #[arg(long)]
    from: u32,
}

/// `sheaf rebalance-resume --from A`.
pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (from, as_json) = (args.from, ctx.json);
    let client = &client;
    let from = match shard_arg(client, from, "--from") {
        Ok(f) => f,
        Err(e) => return e,
    };
    let open = match client.admin().migrations(from, true, 10_000).await {
        Ok(m) => m,
        Err(e) => return exit::failed(&e),
    };
    let targets: BTreeMap<_, _> = open.iter().map(|m| (m.execution_id, m.target)).collect();
    let reports = match client.admin().rebalance_resume(from).await {
        Ok(r) => r,
        Err(e) => return exit::failed(&e),
    };
    let reports: Vec<(MoveReport, ShardId)> = reports
        .into_iter()
        .map(|r| {
            let to = targets.get(&r.id).copied().unwrap_or(from);
            (r, to)
        })
        .collect();
    if as_json {
        let rows: Vec<Value> = reports.iter().map(|(r, t)| report_json(r, *t)).collect();
        print_json(&json!({"from": from.get(), "executions": rows}));
    } else if reports.is_empty() {
        say!("no unfinished moves on shard {from}");
    } else {
        print_table(&reports, false);
    }
    exit_for(&reports)
}
