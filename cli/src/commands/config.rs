//! `sheaf config apply FILE`, `sheaf config diff` and `sheaf config show`:
//! the fleet's workflow policies, queue options and caps, declared once and
//! held alike by every shard.

use serde_json::json;
use sheaf_driver::{Client, FleetConfig, config_drift};

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{failures_json, print_json, say};

/// The fleet's workflow policies, queue options and caps, declared once
/// in a JSON file ({"workflows": {...}, "queues": {...}, "caps": {...}}).
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Apply the file to every shard (entries it does not name stay as they
    /// are; a cap of null removes it). Exits 3 when a shard did not take it.
    Apply {
        /// The configuration file.
        file: String,
    },
    /// Show each shard whose configuration differs from most shards'.
    /// Exits 5 when one does.
    Diff,
    /// Print one shard's configuration as the file `apply` takes (JSON).
    Show {
        /// The shard to read.
        #[arg(long, default_value_t = 0)]
        shard: u32,
    },
}

pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    match args.what {
        Action::Apply { file } => apply(&client, &file, ctx.json).await,
        Action::Diff => diff(&client, ctx.json).await,
        Action::Show { shard } => show(&client, shard).await,
    }
}

/// Applies the file to every shard; exits 3 when a shard did not take it.
async fn apply(client: &Client, path: &str, as_json: bool) -> Exit {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return exit::bad_input(format!("cannot read {path}: {e}")),
    };
    let config = match FleetConfig::parse(&text) {
        Ok(c) => c,
        Err(e) => return exit::bad_input(format!("{path}: {e}")),
    };
    let report = client.admin().apply_config(&config).await;
    let applied: Vec<String> = report.ok.keys().map(ToString::to_string).collect();
    if as_json {
        print_json(&json!({"applied": applied, "failed": failures_json(&report.failed)}));
    } else {
        say!(
            "{} workflow(s), {} queue(s), {} cap(s) applied on shard(s) {}",
            config.workflows.len(),
            config.queues.len(),
            config.caps.len(),
            if applied.is_empty() {
                "none".into()
            } else {
                applied.join(", ")
            }
        );
    }
    exit::partial_if(&report.failed, !report.failed.is_empty())
}

/// Prints one shard's configuration as the file `config apply` takes
/// (always JSON): to check a running fleet's configuration into a
/// repository, or to bring a new shard in line with the others.
async fn show(client: &Client, shard: u32) -> Exit {
    let shard = match sheaf_driver::ShardId::new(shard) {
        Ok(id) if client.topology().get(id).is_some() => id,
        Ok(id) => return exit::bad_input(format!("--shard {id} is not in the topology (SHEAF_SHARDS)")),
        Err(e) => return exit::bad_input(format!("--shard: {e}")),
    };
    match client.admin().shard_config(shard).await {
        Ok(config) => match serde_json::to_value(&config) {
            Ok(v) => {
                print_json(&v);
                Exit::Done
            }
            Err(e) => exit::fail(Exit::Failed, format!("cannot encode the configuration: {e}")),
        },
        Err(e) => exit::failed(&e),
    }
}

/// Shows each shard that differs from most of them; exits 5 when one does,
/// 3 when a shard did not answer.
async fn diff(client: &Client, as_json: bool) -> Exit {
    let report = client.admin().fleet_config().await;
    let drift = config_drift(&report);
    if as_json {
        let d: serde_json::Map<String, serde_json::Value> = drift
            .iter()
            .map(|(s, lines)| (s.to_string(), json!(lines)))
            .collect();
        print_json(&json!({"drift": d, "failed": failures_json(&report.failed)}));
    } else if drift.is_empty() {
        say!("{} shard(s) hold the same configuration", report.ok.len());
    } else {
        for (shard, lines) in &drift {
            say!("shard {shard} differs from most shards:");
            for l in lines {
                say!("  {l}");
            }
        }
    }
    if !report.failed.is_empty() {
        return exit::partial_if(&report.failed, true);
    }
    if drift.is_empty() { Exit::Done } else { Exit::Found }
}
