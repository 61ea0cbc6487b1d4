//! `sheaf list` and `sheaf find`: executions across every shard.

use std::process::ExitCode;
use std::time::SystemTime;

use serde_json::{Value, json};
use sheaf_driver::{
    Client, ClientError, Execution, ExecutionFilter, ExecutionPage, ExecutionState, ListedExecution,
    PageStatus, Resolution, ShardId, SortOrder,
};

use crate::exit;

/// What `sheaf list` was asked for.
pub struct ListArgs {
    pub workflows: Vec<String>,
    pub states: Vec<String>,
    pub attrs: Vec<String>,
    pub filter: Option<String>,
    pub page_size: usize,
    pub cursor: Option<String>,
    pub order: String,
}

fn filter(args: &ListArgs) -> Result<ExecutionFilter, String> {
    let mut f = match &args.filter {
        Some(text) => ExecutionFilter::from_json(
            serde_json::from_str(text).map_err(|e| format!("--filter is not JSON: {e}"))?,
        ),
        None => ExecutionFilter::new(),
    };
    if !args.workflows.is_empty() {
        f = f.workflows(args.workflows.iter().cloned());
    }
    if !args.states.is_empty() {
        let states = args
            .states
            .iter()
            .map(|s| {
                s.to_uppercase()
                    .parse::<ExecutionState>()
                    .map_err(|_| format!("--state {s:?} is not an execution state"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        f = f.states(states);
    }
    for arg in &args.attrs {
        let (key, value) =
            sheaf_driver::attr_equality(arg).ok_or_else(|| format!("--attr takes KEY=VALUE, got {arg:?}"))?;
        f = f.attr(&key, sheaf_driver::AttrOp::Eq, value);
    }
    Ok(f)
}

pub async fn list(client: &Client, args: ListArgs, as_json: bool) -> ExitCode {
    let order = match args.order.as_str() {
        "desc" => SortOrder::Desc,
        "asc" => SortOrder::Asc,
        other => return exit::usage(format!("--order takes desc or asc, got {other:?}")),
    };
    let f = match filter(&args) {
        Ok(f) => f,
        Err(e) => return exit::usage(e),
    };
    let page = match client
        .list_executions(&f, args.cursor.as_deref(), args.page_size, order)
        .await
    {
        Ok(page) => page,
        Err(e) => return exit::failed(&e),
    };
    if as_json {
        exit::print_json(&page_json(&page));
    } else {
        print_table(&page.items);
        if let Some(c) = &page.next_cursor {
            println!("more: --cursor {c}");
        }
    }
    exit::partial_if(&page.unavailable_shards, page.status == PageStatus::Partial)
}

pub async fn find(client: &Client, name: &str, workflow_id: &str, as_json: bool) -> ExitCode {
    let resolution = match client.find_execution(name, workflow_id).await {
        Ok(r) => r,
        Err(e) => return exit::failed(&e),
    };
    match resolution {
        Resolution::Found { execution, .. } => {
            if as_json {
                exit::print_json(&json!({"status": "found", "execution": execution_json(&execution)}));
            } else {
                print_execution(&execution);
            }
            ExitCode::SUCCESS
        }
        Resolution::Absent => {
            if as_json {
                exit::print_json(&json!({"status": "absent"}));
            } else {
                println!("no execution of {name:?} with id {workflow_id:?} on any shard");
            }
            exit::NOT_FOUND.into()
        }
        Resolution::Indeterminate {
            ended,
            unavailable_shards,
        } => {
            if as_json {
                exit::print_json(&json!({
                    "status": "indeterminate",
                    "ended": ended.as_deref().map(execution_json),
                    "unavailable_shards": exit::failures_json(&unavailable_shards),
                }));
            } else if let Some(e) = &ended {
                println!("an ended run (a shard that did not answer may hold an active one):");
                print_execution(e);
            } else {
                println!("not found on the shards that answered");
            }
            exit::partial_if(&unavailable_shards, true)
        }
    }
}

fn page_json(page: &ExecutionPage) -> Value {
    json!({
        "items": page.items.iter().map(listed_json).collect::<Vec<_>>(),
        "next_cursor": page.next_cursor,
        "status": page.status,
        "unavailable_shards": exit::failures_json(&page.unavailable_shards),
    })
}

pub fn time(at: SystemTime) -> String {
    humantime::format_rfc3339_micros(at).to_string()
}

fn listed_json(e: &ListedExecution) -> Value {
    json!({
        "execution_id": e.execution_id.to_string(),
        "shard": e.shard.get(),
        "workflow_name": e.workflow_name,
        "workflow_id": e.workflow_id,
        "state": e.state.as_str(),
        "created_at": time(e.created_at),
        "closed_at": e.closed_at.map(time),
        "parent_id": e.parent_id.map(|id| id.to_string()),
        "search_attrs": e.search_attrs,
    })
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

fn print_table(items: &[ListedExecution]) {
    println!(
        "{:<36} {:<5} {:<20} {:<20} {:<16} created_at",
        "execution_id", "shard", "workflow", "workflow_id", "state"
    );
    for e in items {
        println!(
            "{:<36} {:<5} {:<20} {:<20} {:<16} {}",
            e.execution_id,
            e.shard,
            cut(&e.workflow_name, 20),
            cut(&e.workflow_id, 20),
            e.state.as_str(),
            time(e.created_at)
        );
    }
}

fn print_execution(e: &Execution) {
    println!("execution_id  {}", e.execution_id);
    println!("shard         {}", e.shard);
    println!("workflow      {} / {}", e.workflow_name, e.workflow_id);
    println!("state         {}", e.state.as_str());
    println!("created_at    {}", time(e.created_at));
    if let Some(at) = e.closed_at {
        println!("closed_at     {}", time(at));
    }
}

/// A column's text, cut to `width` characters.
pub fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_owned()
    } else {
        let mut s: String = text.chars().take(width - 1).collect();
        s.push('…');
        s
    }
}

/// For `exit::failures_json`: a shard and why it failed.
pub type Failures = std::collections::BTreeMap<ShardId, ClientError>;
