//! `sheaf list`: executions across every shard, a page at a time.

use serde_json::{Value, json};
use sheaf_driver::{ExecutionFilter, ExecutionState, ListedExecution, SortOrder};

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{Column, cut, print_page, table, time};

/// List executions across every shard, newest first, a page at a time.
/// Filters are and-ed; a partial page (a shard did not answer) exits 3.
#[derive(clap::Args)]
pub struct Args {
    /// Only this workflow (repeatable: any of them).
    #[arg(long = "workflow", value_name = "W")]
    workflows: Vec<String>,
    /// Only this state, e.g. running (repeatable: any of them).
    #[arg(long = "state", value_name = "S")]
    states: Vec<String>,
    /// Only executions whose search attribute K equals V (repeatable).
    /// V is read as JSON when it parses (5 a number, "5" a string,
    /// true a boolean), else as a string.
    #[arg(long = "attr", value_name = "K=V")]
    attrs: Vec<String>,
    /// A filter tree as JSON (and, or, not, attr tests: see docs/reference/sql/executions.md).
    #[arg(long, value_name = "JSON")]
    filter: Option<String>,
    /// Executions per page (1 to 999).
    #[arg(long, default_value_t = 50)]
    page_size: usize,
    /// Where to go on from: the `more:` cursor of the page before.
    #[arg(long)]
    cursor: Option<String>,
    /// desc (newest first) or asc.
    #[arg(long, default_value = "desc")]
    order: String,
}

fn filter(args: &Args) -> Result<ExecutionFilter, String> {
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

/// A filter, cursor or page size a shard or the driver refuses exits 2.
pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let order = match args.order.as_str() {
        "desc" => SortOrder::Desc,
        "asc" => SortOrder::Asc,
        other => return exit::bad_input(format!("--order takes desc or asc, got {other:?}")),
    };
    let f = match filter(&args) {
        Ok(f) => f,
        Err(e) => return exit::bad_input(e),
    };
    let page = match client
        .list_executions(&f, args.cursor.as_deref(), args.page_size, order)
        .await
    {
        Ok(page) => page,
        Err(e) => return exit::failed(&e),
    };
    print_page(&page, ctx.json, listed_json, print_table)
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

fn print_table(items: &[ListedExecution]) {
    const COLUMNS: &[Column] = &[
        Column::left("execution_id", 36),
        Column::left("shard", 5),
        Column::left("workflow", 20),
        Column::left("workflow_id", 20),
        Column::left("state", 16),
        Column::left("created_at", 0),
    ];
    table(
        COLUMNS,
        items.iter().map(|e| {
            vec![
                e.execution_id.to_string(),
                e.shard.to_string(),
                cut(&e.workflow_name, 20),
                cut(&e.workflow_id, 20),
                e.state.as_str().to_owned(),
                time(e.created_at),
            ]
        }),
    );
}
