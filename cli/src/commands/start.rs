//! `sheaf start NAME WORKFLOW_ID`: start a workflow from a script.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use serde_json::json;
use sheaf_driver::StartOptions;

use super::Context;
use super::placement::PlacementArgs;
use crate::exit::{self, Exit};
use crate::output::{print_json, say};
use crate::parse;

/// Start a workflow: its execution id and shard (`created: false` when the
/// key already had an active run, which is then the answer). Placed by
/// (NAME, WORKFLOW_ID) unless a flag says otherwise. Exits 2 for input
/// that is not JSON, a shard not in the topology or an undeclared
/// residency key.
#[derive(clap::Args)]
pub struct Args {
    /// The workflow's name.
    name: String,
    /// Its business key: one active run per (NAME, WORKFLOW_ID).
    workflow_id: String,
    /// Its input, as JSON (default null).
    #[arg(long, conflicts_with = "input_file")]
    input: Option<String>,
    /// Its input, read from a JSON file (`-`: stdin).
    #[arg(long, value_name = "PATH")]
    input_file: Option<PathBuf>,
    #[command(flatten)]
    placement: PlacementArgs,
    /// On behalf of a tenant: placed by tenant and NAME unless a placement
    /// flag is given.
    #[arg(long)]
    tenant: Option<String>,
    /// The queue of its first workflow task (default: the declared one).
    #[arg(long)]
    queue: Option<String>,
    /// The priority of its first workflow task.
    #[arg(long, allow_hyphen_values = true)]
    priority: Option<i32>,
    /// When its first workflow task is due (a timestamp).
    #[arg(long, value_parser = parse::at, value_name = "TIME")]
    run_at: Option<SystemTime>,
    /// Ends TIMED_OUT this long after its start (`90s`, `10m`, `2h`).
    #[arg(long, value_parser = parse::human_duration, value_name = "DURATION")]
    execution_timeout: Option<Duration>,
}

pub async fn run(args: Args, ctx: &Context) -> Exit {
    let input = match parse::json_value("input", args.input.as_deref(), args.input_file.as_deref()) {
        Ok(v) => v,
        Err(why) => return exit::bad_input(why),
    };
    let mut options = StartOptions::new();
    if let Some(placement) = args.placement.placement() {
        options = options.placement(placement);
    }
    if let Some(tenant) = args.tenant {
        options = options.tenant(tenant);
    }
    if let Some(queue) = args.queue {
        options = options.queue(queue);
    }
    if let Some(priority) = args.priority {
        options = options.priority(priority);
    }
    if let Some(at) = args.run_at {
        options = options.run_at(at);
    }
    if let Some(timeout) = args.execution_timeout {
        options = options.execution_timeout(timeout);
    }
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let started = match client
        .start_workflow(&args.name, &args.workflow_id, input, options)
        .await
    {
        Ok(s) => s,
        Err(e) => return exit::failed(&e),
    };
    let superseded: Vec<String> = started.superseded.iter().map(ToString::to_string).collect();
    if ctx.json {
        print_json(&json!({
            "execution_id": started.execution_id.to_string(),
            "shard": started.shard.get(),
            "created": started.created,
            "superseded": superseded,
        }));
    } else {
        say!("execution_id  {}", started.execution_id);
        say!("shard         {}", started.shard);
        say!(
            "created       {}",
            if started.created {
                "yes"
            } else {
                "no: the key's active run"
            }
        );
        for id in &superseded {
            say!("superseded    {id}");
        }
    }
    Exit::Done
}
