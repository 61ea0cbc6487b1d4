//! `sheaf executions get|history|cancel|terminate|pause|resume|signal`: one
//! execution by id, on the shard it routes to (forwards followed).

use std::process::ExitCode;

use serde_json::{Value, json};
use sheaf_driver::{Client, ClientError, ExecutionId};

use crate::executions::{cut, time};
use crate::exit;

/// What `sheaf executions` does to one execution.
pub enum Action {
    Get,
    History {
        after: i64,
        page_size: usize,
    },
    Cancel {
        reason: Option<String>,
    },
    Terminate {
        reason: Option<String>,
    },
    Pause,
    Resume,
    Signal {
        name: String,
        payload: Option<String>,
        signal_id: Option<String>,
    },
}

fn parse_id(id: &str) -> Result<ExecutionId, ExitCode> {
    id.parse::<ExecutionId>()
        .map_err(|_| exit::usage(format!("{:?} is not an execution id", cut(id, 40))))
}

/// An unknown execution exits 4, any other failure 1.
fn failed(e: &ClientError) -> ExitCode {
    match e {
        ClientError::UnknownExecution { .. } => {
            eprintln!("sheaf: {e}");
            exit::NOT_FOUND.into()
        }
        _ => exit::failed(e),
    }
}

/// Runs `action` on execution `id`.
pub async fn run(client: &Client, id: &str, action: Action, as_json: bool) -> ExitCode {
    let id = match parse_id(id) {
        Ok(id) => id,
        Err(code) => return code,
    };
    match action {
        Action::Get => get(client, id, as_json).await,
        Action::History { after, page_size } => history(client, id, after, page_size, as_json).await,
        Action::Cancel { reason } => changed(
            client.cancel_execution(id, reason.as_deref()).await,
            id,
            "cancelled",
            as_json,
        ),
        Action::Terminate { reason } => changed(
            client.terminate_execution(id, reason.as_deref()).await,
            id,
            "terminated",
            as_json,
        ),
        Action::Pause => changed(client.pause_execution(id).await, id, "paused", as_json),
        Action::Resume => changed(client.resume_execution(id).await, id, "resumed", as_json),
        Action::Signal {
            name,
            payload,
            signal_id,
        } => {
            let payload: Value = match payload.as_deref().map(serde_json::from_str).transpose() {
                Ok(p) => p.unwrap_or(Value::Null),
                Err(e) => return exit::usage(format!("--payload is not JSON: {e}")),
            };
            let delivered = client.signal(id, &name, payload, signal_id.as_deref()).await;
            changed(delivered, id, "signalled", as_json)
        }
    }
}

/// A yes/no action's answer: `false` means it changed nothing (already
/// ended, not paused, a signal already delivered).
fn changed(result: Result<bool, ClientError>, id: ExecutionId, what: &str, as_json: bool) -> ExitCode {
    let done = match result {
        Ok(d) => d,
        Err(e) => return failed(&e),
    };
    if as_json {
        exit::print_json(&json!({"execution_id": id.to_string(), what: done}));
    } else if done {
        println!("execution {id} {what}");
    } else {
        println!("execution {id}: nothing to do (not {what}: see `sheaf executions get`)");
    }
    ExitCode::SUCCESS
}

async fn get(client: &Client, id: ExecutionId, as_json: bool) -> ExitCode {
    let e = match client.get_execution(id).await {
        Ok(Some(e)) => e,
        Ok(None) => {
            eprintln!("sheaf: no execution {id} on the shard it routes to");
            return exit::NOT_FOUND.into();
        }
        Err(e) => return failed(&e),
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
        exit::print_json(&value);
        return ExitCode::SUCCESS;
    }
    if let Value::Object(fields) = &value {
        for (k, v) in fields {
            let text = match v {
                Value::Null => continue,
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            println!("{k:<16} {}", cut(&text, 100));
        }
    }
    ExitCode::SUCCESS
}

async fn history(client: &Client, id: ExecutionId, after: i64, page_size: usize, as_json: bool) -> ExitCode {
    let page = match client.history(id, after, page_size).await {
        Ok(p) => p,
        Err(e) => return failed(&e),
    };
    if as_json {
        exit::print_json(&json!({
            "events": page.events.iter().map(|e| json!({
                "seq": e.seq,
                "event_type": e.event_type,
                "payload": e.payload.to_value().unwrap_or(Value::Null),
                "created_at": time(e.created_at),
            })).collect::<Vec<_>>(),
            "next_after": page.next_after,
        }));
        return ExitCode::SUCCESS;
    }
    println!("{:>6} {:<28} {:<28} payload", "seq", "event", "at");
    for e in &page.events {
        let payload = e.payload.to_value().map(|v| v.to_string()).unwrap_or_default();
        println!(
            "{:>6} {:<28} {:<28} {}",
            e.seq,
            cut(&e.event_type, 28),
            time(e.created_at),
            cut(&payload, 80)
        );
    }
    if let Some(next) = page.next_after {
        println!("more: --after {next}");
    }
    ExitCode::SUCCESS
}
