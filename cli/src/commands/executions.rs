//! `sheaf executions get|history|cancel|terminate|pause|resume|signal`: one
//! execution by id, on the shard it routes to (forwards followed); `cancel`
//! and `signal` also by business key (`--workflow NAME --workflow-id WID`).

use serde_json::{Value, json};
use sheaf_driver::{Client, ClientError, ExecutionId, Resolution};

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{cut, print_json, say, time};

/// One execution by id, on the shard it lives on: read it, its
/// history, or act on it; cancel or signal it by business key instead
/// (`--workflow NAME --workflow-id WID`, found on any shard as `sheaf find`
/// finds it; a key with more than one live run is refused, exit 1). Exits
/// 4 when no such execution.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Its state, input, result or error, keys and times.
    Get {
        /// The execution's id.
        execution_id: String,
    },
    /// Its history, a page at a time.
    History {
        /// The execution's id.
        execution_id: String,
        /// Events after this seq (the `more:` of the page before).
        #[arg(long, default_value_t = 0)]
        after: i64,
        /// Events per page (1 to 10000).
        #[arg(long, default_value_t = 100)]
        page_size: usize,
    },
    /// Cancel it (its tasks leave, its children hear of it), by id or by
    /// business key.
    Cancel {
        /// The execution's id (or give its business key).
        #[arg(required_unless_present = "workflow", conflicts_with = "workflow")]
        execution_id: Option<String>,
        #[command(flatten)]
        key: BusinessKey,
        /// Why (kept in its history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Terminate it: end it now, as an operator (written to the audit log).
    Terminate {
        /// The execution's id.
        execution_id: String,
        /// Why (kept in its history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Pause it: its tasks wait, holding no slot, until resumed.
    Pause {
        /// The execution's id.
        execution_id: String,
    },
    /// Resume a paused execution.
    Resume {
        /// The execution's id.
        execution_id: String,
    },
    /// Send it a signal (deduplicated by --signal-id), by id or by
    /// business key.
    #[command(allow_missing_positional = true)]
    Signal {
        /// The execution's id (or give its business key).
        #[arg(required_unless_present = "workflow", conflicts_with = "workflow")]
        execution_id: Option<String>,
        #[command(flatten)]
        key: BusinessKey,
        /// The signal's name.
        #[arg(value_name = "SIGNAL")]
        name: String,
        /// Its payload, as JSON.
        #[arg(long)]
        payload: Option<String>,
        /// Delivered once per id.
        #[arg(long)]
        signal_id: Option<String>,
    },
}

/// An execution by its business key, instead of its id: the one spelling
/// of every action that takes either.
#[derive(clap::Args)]
struct BusinessKey {
    /// By business key: the workflow's name (with --workflow-id).
    #[arg(long, value_name = "NAME", requires = "workflow_id")]
    workflow: Option<String>,
    /// By business key: the workflow id it was started with (with --workflow).
    #[arg(long, value_name = "WORKFLOW_ID", requires = "workflow")]
    workflow_id: Option<String>,
}

/// Which execution an action names.
enum Target<'a> {
    Id(&'a str),
    Key(&'a str, &'a str),
}

impl Action {
    fn target(&self) -> Target<'_> {
        let (id, key) = match self {
            Action::Get { execution_id }
            | Action::History { execution_id, .. }
            | Action::Terminate { execution_id, .. }
            | Action::Pause { execution_id }
            | Action::Resume { execution_id } => return Target::Id(execution_id),
            Action::Cancel {
                execution_id, key, ..
            }
            | Action::Signal {
                execution_id, key, ..
            } => (execution_id, key),
        };
        match (id, &key.workflow, &key.workflow_id) {
            (_, Some(name), Some(workflow_id)) => Target::Key(name, workflow_id),
            // clap requires one or the other; an empty id is refused below.
            (id, ..) => Target::Id(id.as_deref().unwrap_or_default()),
        }
    }
}

/// An unknown execution exits 4 (`exit::failed`), any other failure 1.
pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let id = match args.what.target() {
        Target::Id(text) => match text.parse::<ExecutionId>() {
            Ok(id) => id,
            Err(_) => return exit::bad_input(format!("{:?} is not an execution id", cut(text, 40))),
        },
        Target::Key(name, workflow_id) => match by_key(&client, name, workflow_id).await {
            Ok(id) => id,
            Err(code) => return code,
        },
    };
    let as_json = ctx.json;
    match args.what {
        Action::Get { .. } => get(&client, id, as_json).await,
        Action::History { after, page_size, .. } => history(&client, id, after, page_size, as_json).await,
        Action::Cancel { reason, .. } => changed(
            client.cancel_execution(id, reason.as_deref()).await,
            id,
            "cancelled",
            as_json,
        ),
        Action::Terminate { reason, .. } => changed(
            client.admin().terminate_execution(id, reason.as_deref()).await,
            id,
            "terminated",
            as_json,
        ),
        Action::Pause { .. } => changed(client.admin().pause_execution(id).await, id, "paused", as_json),
        Action::Resume { .. } => changed(client.admin().resume_execution(id).await, id, "resumed", as_json),
        Action::Signal {
            name,
            payload,
            signal_id,
            ..
        } => {
            let payload: Value = match payload.as_deref().map(serde_json::from_str).transpose() {
                Ok(p) => p.unwrap_or(Value::Null),
                Err(e) => return exit::bad_input(format!("--payload is not JSON: {e}")),
            };
            let delivered = client.signal(id, &name, payload, signal_id.as_deref()).await;
            changed(delivered, id, "signalled", as_json)
        }
    }
}

/// The one live (else latest) run of a business key, on whichever shard
/// holds it. A key with more than one live run is refused rather than
/// guessed at (exit 1); none on any shard exits 4, a shard that did not
/// answer 3 (it may hold the active run).
async fn by_key(client: &Client, name: &str, workflow_id: &str) -> Result<ExecutionId, Exit> {
    match client.find_execution(name, workflow_id).await {
        Err(e) => Err(exit::failed(&e)),
        Ok(Resolution::Found {
            execution, also_live, ..
        }) => {
            if also_live.is_empty() {
                return Ok(execution.execution_id);
            }
            let ids: Vec<String> = std::iter::once(&*execution)
                .chain(&also_live)
                .map(|e| format!("{} (shard {})", e.execution_id, e.shard))
                .collect();
            Err(exit::fail(
                Exit::Failed,
                format!(
                    "{name:?} / {workflow_id:?} has {} live runs, not one: act on one by id ({}; see sheaf find)",
                    ids.len(),
                    ids.join(", ")
                ),
            ))
        }
        Ok(Resolution::Absent) => Err(exit::fail(
            Exit::NotFound,
            format!("no execution of {name:?} with id {workflow_id:?} on any shard"),
        )),
        Ok(Resolution::Indeterminate {
            unavailable_shards, ..
        }) => {
            exit::warn(format!(
                "not acted on: a shard that did not answer may hold the active run of {name:?} / {workflow_id:?}"
            ));
            Err(exit::partial_if(&unavailable_shards, true))
        }
    }
}

/// A yes/no action's answer: `false` means it changed nothing (already
/// ended, not paused, a signal already delivered).
fn changed(result: Result<bool, ClientError>, id: ExecutionId, what: &str, as_json: bool) -> Exit {
    let done = match result {
        Ok(d) => d,
        Err(e) => return exit::failed(&e),
    };
    if as_json {
        print_json(&json!({"execution_id": id.to_string(), what: done}));
    } else if done {
        say!("execution {id} {what}");
    } else {
        say!("execution {id}: nothing to do (not {what}: see `sheaf executions get`)");
    }
    Exit::Done
}

async fn get(client: &Client, id: ExecutionId, as_json: bool) -> Exit {
    let e = match client.get_execution(id).await {
        Ok(Some(e)) => e,
        Ok(None) => {
            return exit::fail(
                Exit::NotFound,
                format!("no execution {id} on the shard it routes to"),
            );
        }
        Err(e) => return exit::failed(&e),
    };
    let value = json!({
        "execution_id": e.execution_id.to_string(),
        "shard": e.shard.get(),
        "workflow_name": e.workflow_name,
        "workflow_id": e.workflow_id,
        "state": e.state.as_str(),
        "input": e.input.to_value().unwrap_or(Value::Null),
        "result": e.result.as_ref().and_then(|r| r.to_value().ok()),
        "error": e.error,
        "concurrency_key": e.concurrency_key,
        "quota_key": e.quota_key,
        "history_bytes": e.history_bytes,
        "created_at": time(e.created_at),
        "closed_at": e.closed_at.map(time),
        "wake_at": e.wake_at.map(time),
    });
    if as_json {
        print_json(&value);
        return Exit::Done;
    }
    if let Value::Object(fields) = &value {
        for (k, v) in fields {
            let text = match v {
                Value::Null => continue,
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            say!("{k:<16} {}", cut(&text, 100));
        }
    }
    Exit::Done
}

async fn history(client: &Client, id: ExecutionId, after: i64, page_size: usize, as_json: bool) -> Exit {
    let page = match client.history(id, after, page_size).await {
        Ok(p) => p,
        Err(e) => return exit::failed(&e),
    };
    if as_json {
        print_json(&json!({
            "events": page.events.iter().map(|e| json!({
                "seq": e.seq,
                "event_type": e.event_type,
                "payload": e.payload.to_value().unwrap_or(Value::Null),
                "created_at": time(e.created_at),
            })).collect::<Vec<_>>(),
            "next_after": page.next_after,
        }));
        return Exit::Done;
    }
    say!("{:>6} {:<28} {:<28} payload", "seq", "event", "at");
    for e in &page.events {
        let payload = e.payload.to_value().map(|v| v.to_string()).unwrap_or_default();
        say!(
            "{:>6} {:<28} {:<28} {}",
            e.seq,
            cut(e.event_type.as_str(), 28),
            time(e.created_at),
            cut(&payload, 80)
        );
    }
    if let Some(next) = page.next_after {
        say!("more: --after {next}");
    }
    Exit::Done
}
