//! `sheaf shard drain` and `sheaf shard health`: a shard's lifecycle.

use std::time::Duration;

use serde_json::{Value, json};
use sheaf_driver::Client;

use super::Context;
use crate::exit::{self, Exit};
use crate::moves::{bar, options, print_table, report_json, shard_arg, show};
use crate::output::{print_json, say};

/// A shard's lifecycle: its readiness (the pre-flip checklist).
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Move every quiescent execution off SHARD, each to its rendezvous
    /// winner among the other writable shards, hand its seals to the shard
    /// its ids will forward to, then list what stayed (with blockers) and
    /// the SHEAF_FORWARDS entry to add when the shard leaves SHEAF_SHARDS
    /// (a forward from a listed shard is refused). Take
    /// SHARD out of SHEAF_WRITABLE first. Exits 5 while executions stay.
    Drain {
        /// The shard to drain.
        shard: u32,
        /// Move at most this many.
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
    },
    /// Each shard `ready` or `degraded` with reason codes (unreachable,
    /// identity_mismatch, schema_incompatible, schema_behind_fleet,
    /// no_live_worker, stranded_work, topology_digest_mismatch): run it
    /// before a new shard is made writable. Exits 6 unless every shard
    /// reported is ready.
    Health {
        /// Only this shard (the one about to be made writable).
        #[arg(long, value_name = "SHARD")]
        candidate: Option<u32>,
        /// How long one probe may take.
        #[arg(long, default_value = "5s", value_parser = crate::parse::duration)]
        timeout: Duration,
    },
}

pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    match args.what {
        Action::Drain {
            shard,
            limit,
            dry_run,
            lease,
        } => drain(&client, shard, limit, dry_run, lease, ctx.json).await,
        Action::Health { candidate, timeout } => health(&client, candidate, timeout, ctx.json).await,
    }
}

/// `sheaf shard drain SHARD`: every quiescent execution to its rendezvous
/// winner among the other writable shards, then the stragglers with their
/// blockers, the relay's work still owed on or to it, and the forwards
/// entry to add when the shard is retired. Exits 5 while executions stay
/// or relay work is owed (the shard cannot be retired yet).
async fn drain(
    client: &Client,
    shard: u32,
    limit: Option<usize>,
    dry_run: bool,
    lease_secs: u64,
    as_json: bool,
) -> Exit {
    let leaving = match shard_arg(client, shard, "SHARD") {
        Ok(s) => s,
        Err(e) => return e,
    };
    let options = options(dry_run, lease_secs, limit);
    let bar = bar(as_json);
    let result = client
        .admin()
        .drain(leaving, &options, |p, _| show(&bar, p, limit))
        .await;
    bar.finish_and_clear();
    let drain = match result {
        Ok(d) => d,
        Err(e) => return exit::failed(&e),
    };
    let stragglers = drain.stragglers().count();
    let unsettled = drain.unsettled.len();
    let forwards = format!("{leaving}={}", drain.forward_to);
    if as_json {
        let rows: Vec<Value> = drain.moves.iter().map(|(r, t)| report_json(r, *t)).collect();
        print_json(&json!({
            "shard": leaving.get(), "dry_run": dry_run, "executions": rows, "stragglers": stragglers,
            "forward_to": drain.forward_to.get(), "seals_adopted": drain.seals_adopted,
            "forwards_entry": forwards,
            "unsettled": drain.unsettled.iter().map(|u| json!({
                "shard": u.shard.get(), "execution_id": u.execution_id.map(|id| id.to_string()), "reason": u.reason,
            })).collect::<Vec<_>>(),
        }));
    } else {
        print_table(&drain.moves, dry_run);
        for u in &drain.unsettled {
            say!("unsettled (shard {}): {}", u.shard, u.reason);
        }
        if unsettled > 0 {
            say!(
                "{unsettled} relay obligation(s) on or to shard {leaving} would be lost with it: let the relay run, then \
                 drain again"
            );
        }
        if stragglers == 0 && unsettled == 0 {
            say!(
                "shard {leaving} holds no unfinished execution{}; to retire it, remove {leaving} from SHEAF_SHARDS (and \
                 SHEAF_WRITABLE) and add SHEAF_FORWARDS entry {forwards} in the same change ({} seal(s) handed to shard {})",
                if dry_run { " that could not move" } else { "" },
                drain.seals_adopted,
                drain.forward_to
            );
        } else if stragglers > 0 {
            say!(
                "{stragglers} execution(s) stay on shard {leaving} (see their blockers); drain again once they are \
                 quiescent or ended. The forwards entry to add when it leaves SHEAF_SHARDS: {forwards}"
            );
        }
    }
    let failed = drain.moves.iter().filter(|(r, _)| r.outcome.is_err()).count();
    if failed > 0 {
        exit::fail(Exit::Failed, format!("{failed} move(s) failed: see the report"))
    } else if stragglers > 0 || unsettled > 0 {
        Exit::Found
    } else {
        Exit::Done
    }
}

/// `sheaf shard health`: each shard's readiness; exit 6 unless all ready.
async fn health(
    client: &sheaf_driver::Client,
    candidate: Option<u32>,
    timeout: std::time::Duration,
    as_json: bool,
) -> Exit {
    let candidate = match candidate.map(sheaf_driver::ShardId::new).transpose() {
        Ok(Some(id)) if client.topology().get(id).is_none() => {
            return exit::bad_input(format!(
                "--candidate {id} is not in the topology (add it to SHEAF_SHARDS)"
            ));
        }
        Ok(c) => c,
        Err(e) => return exit::bad_input(format!("--candidate: {e}")),
    };
    let verdicts = client.admin().shard_health(candidate, timeout).await;
    if as_json {
        let shards: Vec<Value> = verdicts
            .iter()
            .map(|r| {
                json!({
                    "shard": r.shard.get(),
                    "readiness": if r.ready { "ready" } else { "degraded" },
                    "reason_codes": r.reason_codes.iter().map(|c| c.code()).collect::<Vec<_>>(),
                    "details": r.details,
                })
            })
            .collect();
        print_json(&json!({"shards": shards}));
    } else {
        say!("{:<6} {:<9} reasons", "shard", "readiness");
        for r in &verdicts {
            let codes: Vec<&str> = r.reason_codes.iter().map(|c| c.code()).collect();
            say!(
                "{:<6} {:<9} {}",
                r.shard,
                if r.ready { "ready" } else { "degraded" },
                codes.join(", ")
            );
            for d in &r.details {
                say!("         {d}");
            }
        }
    }
    if verdicts.iter().all(|r| r.ready) {
        Exit::Done
    } else {
        Exit::NotReady
    }
}
