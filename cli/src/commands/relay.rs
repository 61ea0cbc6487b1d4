//! `sheaf relay`: the relay alone, the cross-shard half of every Worker.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sheaf_driver::protocol::Steps;
use sheaf_driver::{Client, ClientError, Relay, RelayOptions, ShardId};

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{print_json_line, say};

/// Run the relay alone (every Worker runs one for its shards): child
/// workflows across shards and the outbox of signals and cancels by
/// key. Runs until SIGINT or SIGTERM, printing each shard's backlog.
/// Its login needs role sheaf_relay on every shard it relays (exits 7
/// naming the shard and the fix when one lacks it).
#[derive(clap::Args)]
pub struct Args {
    /// Only this shard's rows (repeatable; default: every shard).
    #[arg(long = "shard", value_name = "N")]
    shards: Vec<u32>,
    /// How often the backlog is printed.
    #[arg(long, default_value = "10s", value_parser = crate::parse::duration)]
    report_every: Duration,
}

/// `sheaf relay`: the relay alone, for `shards` (all when empty), until
/// SIGINT or SIGTERM; every `report_every` a line per shard with its backlog.
/// Exits 7 at once when the login lacks `sheaf_relay` on one of them; a
/// shard that does not answer yet is relayed once it does.
pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (shards, report_every, as_json) = (args.shards, args.report_every, ctx.json);
    let all: Vec<ShardId> = client.topology().shards().map(|s| s.id).collect();
    let mut chosen = Vec::new();
    for n in shards {
        match all.iter().find(|s| s.get() as u32 == n) {
            Some(s) => chosen.push(*s),
            None => return exit::bad_input(format!("--shard {n} is not in the topology")),
        }
    }
    if chosen.is_empty() {
        chosen = all;
    }
    for &shard in &chosen {
        match client.protocol().check_protocol_role(shard).await {
            Ok(()) => {}
            Err(e @ ClientError::MissingRole { .. }) => {
                return exit::fail(Exit::NoRole, format!("the relay needs role sheaf_relay: {e}"));
            }
            Err(e) => exit::warn(format!(
                "shard {shard} did not answer ({e}); relayed once it does"
            )),
        }
    }
    let client = Arc::new(client);
    let relay = Relay::start(client.clone(), chosen.clone(), RelayOptions::default());
    if !as_json {
        let names: Vec<String> = chosen.iter().map(ToString::to_string).collect();
        say!("relay running for shard(s) {}; Ctrl-C stops it", names.join(", "));
    }
    let stop = super::stopped();
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(report_every);
    tick.tick().await;
    loop {
        tokio::select! {
            () = &mut stop => break,
            _ = tick.tick() => report(&client, &chosen, as_json).await,
        }
    }
    relay.shutdown().await;
    if !as_json {
        say!("relay stopped");
    }
    Exit::Done
}

async fn report(client: &Client, shards: &[ShardId], as_json: bool) {
    for &shard in shards {
        let children = client.admin().relay_backlog(shard).await;
        let outbox = client.admin().outbox_backlog(shard).await;
        match (children, outbox) {
            (Ok(c), Ok(o)) => {
                let (rows, failing): (i64, i64) =
                    c.iter().fold((0, 0), |a, b| (a.0 + b.rows, a.1 + b.failing));
                let (pending, stuck): (i64, i64) = o
                    .iter()
                    .fold((0, 0), |a, b| (a.0 + b.rows, a.1 + b.indeterminate));
                if as_json {
                    print_json_line(
                        &json!({"shard": shard.get(), "children": rows, "children_failing": failing,
                               "outbox": pending, "outbox_indeterminate": stuck}),
                    );
                } else {
                    say!(
                        "shard {shard}: {rows} child row(s) ({failing} failing), {pending} outbox row(s) ({stuck} indeterminate)"
                    );
                }
            }
            (Err(e), _) | (_, Err(e)) => exit::warn(format!("shard {shard}: {e}")),
        }
    }
}
