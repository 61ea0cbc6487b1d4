//! `sheaf rebalance --from A --to B`: move quiescent executions between
//! shards.

use serde_json::{Value, json};
use sheaf_driver::{MoveReport, ShardId};

use super::Context;
use crate::exit::{self, Exit};
use crate::moves::{bar, exit_for, options, print_table, report_json, shard_arg, show};
use crate::output::print_json;

/// Move quiescent executions from one shard to another, one at a time
/// (copy, byte-for-byte verify, one cutover transaction, activation),
/// with a progress bar, then a table of what moved and what stayed with
/// its blockers. Ids keep working: the source keeps a seal that points
/// at the new home. Every move writes an audit entry (--actor). Exits 1
/// when a move failed (run rebalance-resume).
#[derive(clap::Args)]
pub struct Args {
    /// The shard to move from.
    #[arg(long)]
    from: u32,
    /// The shard to move to.
    #[arg(long)]
    to: u32,
    /// Move at most this many executions.
    #[arg(long)]
    limit: Option<usize>,
    /// Report what would move and why the rest would not; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// How long each move is this process's without a step, in seconds
    /// (5..3600): `rebalance-resume` takes a move over only after it
    /// lapsed.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(5..=3600))]
    lease: u64,
}

/// `sheaf rebalance --from A --to B`.
pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let client = &client;
    let Args {
        from,
        to,
        limit,
        dry_run,
        lease: lease_secs,
    } = args;
    let as_json = ctx.json;
    let (from, to) = match (shard_arg(client, from, "--from"), shard_arg(client, to, "--to")) {
        (Ok(f), Ok(t)) => (f, t),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let options = options(dry_run, lease_secs, limit);
    let bar = bar(as_json);
    let result = client
        .admin()
        .rebalance(from, to, &options, |p, _| show(&bar, p, limit))
        .await;
    bar.finish_and_clear();
    let reports: Vec<(MoveReport, ShardId)> = match result {
        Ok(r) => r.into_iter().map(|r| (r, to)).collect(),
        Err(e) => return exit::failed(&e),
    };
    if as_json {
        let rows: Vec<Value> = reports.iter().map(|(r, t)| report_json(r, *t)).collect();
        print_json(&json!({"from": from.get(), "to": to.get(), "dry_run": dry_run, "executions": rows}));
    } else {
        print_table(&reports, dry_run);
    }
    exit_for(&reports)
}
