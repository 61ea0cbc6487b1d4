//! `sheaf tasks list|get|cancel`: a queue's tasks across every shard, one
//! task by id.

use serde_json::{Value, json};
use sheaf_driver::{Client, ListedTask, TaskId, TaskState};

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{Column, cut, print_json, print_page, say, table, time};

/// A queue's tasks across every shard, state by state (running, ready,
/// scheduled, waiting, paused), a page at a time; one task by id.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// A queue's tasks; exits 3 when a shard did not answer.
    List {
        /// The queue.
        queue: String,
        /// Only this state: scheduled, waiting, ready, running or paused.
        #[arg(long)]
        state: Option<String>,
        /// Tasks per page (1 to 999).
        #[arg(long, default_value_t = 50)]
        page_size: usize,
        /// Where to go on from: the `more:` cursor of the page before.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// One task (or its dead letter) by id, payload included; exits 4 when
    /// its shard has neither (completed tasks are not kept).
    Get {
        /// The task's id.
        task_id: String,
    },
    /// Cancel a task: an unclaimed one leaves at once, a running one when
    /// its worker hears of it (or at its lease's end). A workflow task is
    /// refused (cancel its execution). Exits 4 when its shard has no such
    /// task.
    Cancel {
        /// The task's id.
        task_id: String,
        /// Why, kept with the cancellation and told to its worker.
        #[arg(long)]
        reason: Option<String>,
    },
}

pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    match args.what {
        Action::List {
            queue,
            state,
            page_size,
            cursor,
        } => {
            list(
                &client,
                &queue,
                state.as_deref(),
                cursor.as_deref(),
                page_size,
                ctx.json,
            )
            .await
        }
        Action::Get { task_id } => get(&client, &task_id, ctx.json).await,
        Action::Cancel { task_id, reason } => cancel(&client, &task_id, reason.as_deref(), ctx.json).await,
    }
}

/// A task id argument; bad input (exit 2) if it is not one.
pub fn parse_id(id: &str) -> Result<TaskId, Exit> {
    id.parse::<TaskId>()
        .map_err(|_| exit::bad_input(format!("{:?} is not a task id", cut(id, 40))))
}

/// `sheaf tasks list QUEUE [--state S]`.
async fn list(
    client: &Client,
    queue: &str,
    state: Option<&str>,
    cursor: Option<&str>,
    page_size: usize,
    as_json: bool,
) -> Exit {
    let state = match state.map(str::parse::<TaskState>).transpose() {
        Ok(s) => s,
        Err(_) => return exit::bad_input("--state takes scheduled, waiting, ready, running or paused"),
    };
    let page = match client.admin().list_tasks(queue, state, cursor, page_size).await {
        Ok(p) => p,
        Err(e) => return exit::failed(&e),
    };
    print_page(&page, as_json, task_json, print_table)
}

fn print_table(tasks: &[ListedTask]) {
    const COLUMNS: &[Column] = &[
        Column::left("task_id", 36),
        Column::left("shard", 5),
        Column::left("state", 9),
        Column::right("priority", 8),
        Column::right("attempts", 8),
        Column::left("run_at", 27),
        Column::left("last_error", 0),
    ];
    table(
        COLUMNS,
        tasks.iter().map(|t| {
            vec![
                t.task_id.to_string(),
                t.shard.to_string(),
                t.state.as_str().to_owned(),
                t.priority.to_string(),
                format!("{}/{}", t.attempts, t.max_attempts),
                time(t.run_at),
                cut(t.last_error.as_deref().unwrap_or(""), 40),
            ]
        }),
    );
}

fn task_json(t: &ListedTask) -> Value {
    json!({
        "task_id": t.task_id.to_string(),
        "shard": t.shard.get(),
        "queue": t.queue,
        "kind": t.kind.as_str(),
        "state": t.state.as_str(),
        "priority": t.priority,
        "attempts": t.attempts,
        "max_attempts": t.max_attempts,
        "run_at": time(t.run_at),
        "enqueued_at": time(t.enqueued_at),
        "concurrency_key": t.concurrency_key,
        "lease_expires_at": t.lease_expires_at.map(time),
        "last_error": t.last_error,
        "execution_id": t.execution_id.map(|id| id.to_string()),
        "progress": t.progress,
    })
}

/// `sheaf tasks get ID`: exits 4 when its shard has no such task.
async fn get(client: &Client, id: &str, as_json: bool) -> Exit {
    let task_id = match parse_id(id) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let task = match client.get_task(task_id).await {
        Ok(t) => t,
        Err(e) => return exit::failed(&e),
    };
    let value = json!({
        "task_id": task.task_id.to_string(),
        "shard": task.shard.get(),
        "queue": task.queue,
        "kind": task.kind.as_str(),
        "state": task.state,
        "priority": task.priority,
        "attempts": task.attempts,
        "max_attempts": task.max_attempts,
        "run_at": task.run_at.map(time),
        "enqueued_at": time(task.enqueued_at),
        "concurrency_key": task.concurrency_key,
        "lease_owner": task.lease_owner,
        "lease_expires_at": task.lease_expires_at.map(time),
        "started_at": task.started_at.map(time),
        "last_error": task.last_error,
        "execution_id": task.execution_id.map(|id| id.to_string()),
        "idempotency_key": task.idempotency_key,
        "fairness_key": task.fairness_key,
        "dead_at": task.dead_at.map(time),
        "progress": task.progress,
        "payload": task.payload,
    });
    if as_json {
        print_json(&value);
    } else if let Value::Object(fields) = value {
        for (k, v) in fields {
            let text = match v {
                Value::Null => continue,
                Value::String(s) => s,
                other => other.to_string(),
            };
            say!("{k:<16} {}", cut(&text, 200));
        }
    }
    Exit::Done
}

/// `sheaf tasks cancel ID [--reason R]`: exits 4 when its shard has no such
/// task.
async fn cancel(client: &Client, id: &str, reason: Option<&str>, as_json: bool) -> Exit {
    let task_id = match parse_id(id) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let cancelled = match client.cancel_task(task_id, reason).await {
        Ok(c) => c,
        Err(e) => return exit::failed(&e),
    };
    if as_json {
        print_json(&json!({"task_id": task_id.to_string(), "cancelled": cancelled}));
    } else if cancelled {
        say!(
            "task {task_id} cancelled (a running task ends when its worker hears of it, or at its lease's end)"
        );
    } else {
        say!("task {task_id} was cancelled already");
    }
    Exit::Done
}
