//! `sheaf find NAME WORKFLOW_ID`: an execution by its business key.

use serde_json::{Value, json};
use sheaf_driver::{Execution, Resolution};

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{failures_json, print_json, say, time};

/// Find an execution by its business key on whichever shard holds it:
/// its active run, else its latest ended one, and every other live run of
/// the key on another shard (a duplicate, with a warning). Exits 4 when no
/// shard has it, 3 when a shard that may have it did not answer.
#[derive(clap::Args)]
pub struct Args {
    /// The workflow's name.
    name: String,
    /// The workflow id it was started with.
    workflow_id: String,
}

pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (name, workflow_id) = (&args.name, &args.workflow_id);
    let resolution = match client.find_execution(name, workflow_id).await {
        Ok(r) => r,
        Err(e) => return exit::failed(&e),
    };
    match resolution {
        Resolution::Found {
            execution, also_live, ..
        } => {
            if ctx.json {
                print_json(&json!({
                    "status": "found",
                    "execution": execution_json(&execution),
                    "also_live": also_live.iter().map(execution_json).collect::<Vec<_>>(),
                }));
            } else {
                print_execution(&execution);
                for other in &also_live {
                    say!("");
                    say!("also live (another run of the key, on another shard):");
                    print_execution(other);
                }
            }
            if !also_live.is_empty() {
                exit::warn(format!(
                    "{} more live run(s) of {name:?} / {workflow_id:?} on other shards: a key should have one \
                     (see sheaf shard health, misplaced_runs)",
                    also_live.len()
                ));
            }
            Exit::Done
        }
        Resolution::Absent => {
            // The answer (under --json) and, as for every not found, why.
            if ctx.json {
                print_json(&json!({"status": "absent"}));
            }
            exit::fail(
                Exit::NotFound,
                format!("no execution of {name:?} with id {workflow_id:?} on any shard"),
            )
        }
        Resolution::Indeterminate {
            ended,
            unavailable_shards,
        } => {
            if ctx.json {
                print_json(&json!({
                    "status": "indeterminate",
                    "ended": ended.as_deref().map(execution_json),
                    "unavailable_shards": failures_json(&unavailable_shards),
                }));
            } else if let Some(e) = &ended {
                say!("an ended run (a shard that did not answer may hold an active one):");
                print_execution(e);
            } else {
                say!("not found on the shards that answered");
            }
            exit::partial_if(&unavailable_shards, true)
        }
    }
}

fn execution_json(e: &Execution) -> Value {
    json!({
        "execution_id": e.execution_id.to_string(),
        "shard": e.shard.get(),
        "workflow_name": e.workflow_name,
        "workflow_id": e.workflow_id,
        "state": e.state.as_str(),
        "created_at": time(e.created_at),
        "closed_at": e.closed_at.map(time),
        "error": e.error,
    })
}

fn print_execution(e: &Execution) {
    say!("execution_id  {}", e.execution_id);
    say!("shard         {}", e.shard);
    say!("workflow      {} / {}", e.workflow_name, e.workflow_id);
    say!("state         {}", e.state.as_str());
    say!("created_at    {}", time(e.created_at));
    if let Some(at) = e.closed_at {
        say!("closed_at     {}", time(at));
    }
}
