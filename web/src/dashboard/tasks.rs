//! `/tasks`: a queue's unfinished tasks across shards (optionally of one
//! state), a keyset page at a time, under its counts by state over the
//! fleet (every queue's, before one is chosen); an activity task can be
//! cancelled (through `/confirm`).

use std::sync::Arc;

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use sheaf_core::state::{TaskKind, TaskState};
use sheaf_driver::{PageStatus, QueueCounts, QueueListing};

use super::{Chrome, Count, Counts, Shared, cut, first, link, pairs, read_error_of, render, status_of, time};

const PAGE: usize = 50;

struct TaskRow {
    id: String,
    shard: String,
    kind: String,
    cancellable: bool,
    state: &'static str,
    priority: i32,
    attempts: String,
    run_at: String,
    key: String,
    execution: String,
    error: String,
}

#[derive(Template)]
#[template(path = "tasks.html")]
struct TasksPage {
    chrome: Chrome,
    queue: String,
    state: String,
    states: Vec<&'static str>,
    /// Queues to choose from when none is chosen, with their unfinished
    /// tasks and dead letters.
    queues: Vec<(String, i64, i64)>,
    counts: Option<Counts>,
    error: Option<String>,
    rows: Vec<TaskRow>,
    next: Option<String>,
}

pages!(TasksPage);

/// The tasks by state of `queue` ("": of every queue) over the shards
/// that answered `listing` (one `list_queues` per shard, which counts each
/// state on its index), each linking to its list.
fn counts(listing: &QueueListing, queue: &str) -> Counts {
    let mut total = QueueCounts::default();
    for q in listing
        .queues
        .iter()
        .filter(|q| queue.is_empty() || q.queue == queue)
    {
        total.add(&q.total);
    }
    let tasks_of = |state: &str| {
        if queue.is_empty() {
            String::new()
        } else {
            link("/tasks", &[("queue", queue), ("state", state)])
        }
    };
    let cell = |state: &'static str, n: i64, href: String| Count {
        state,
        shown: n.to_string(),
        href,
    };
    Counts {
        what: if queue.is_empty() {
            "Tasks of every queue, by state".into()
        } else {
            format!("Tasks of queue {queue}, by state")
        },
        cells: vec![
            cell("ready", total.ready, tasks_of("ready")),
            cell("scheduled", total.scheduled, tasks_of("scheduled")),
            cell("running", total.running, tasks_of("running")),
            cell("waiting", total.waiting, tasks_of("waiting")),
            cell("paused", total.paused, tasks_of("paused")),
            cell("dead", total.dead, link("/dead-letters", &[("queue", queue)])),
        ],
        partial: listing.status != PageStatus::Complete,
        bounded: None,
    }
}

/// No queue chosen: every queue, with the fleet's counts.
async fn choose(shared: &Shared, mut page: TasksPage) -> Response {
    let listing = shared.client.admin().list_queues().await;
    page.chrome.missing(listing.unavailable_shards.keys());
    page.counts = Some(counts(&listing, ""));
    page.queues = listing
        .queues
        .into_iter()
        .map(|q| {
            let t = q.total;
            (
                q.queue,
                t.ready + t.scheduled + t.running + t.waiting + t.paused,
                t.dead,
            )
        })
        .collect();
    render(StatusCode::OK, page)
}

pub(super) async fn page(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = pairs(raw.as_deref().unwrap_or(""));
    let mut page = TasksPage {
        chrome: Chrome::new(&shared, &headers, "tasks"),
        queue: first(&q, "queue").trim().to_owned(),
        state: first(&q, "state").to_owned(),
        states: TaskState::ALL.iter().map(|s| s.as_str()).collect(),
        queues: Vec::new(),
        counts: None,
        error: None,
        rows: Vec::new(),
        next: None,
    };
    page.chrome
        .refreshing(shared.options.refresh_every, &headers, "/tasks", raw.as_deref());
    if page.queue.is_empty() {
        return choose(&shared, page).await;
    }
    let state = if page.state.is_empty() {
        None
    } else {
        match page.state.parse::<TaskState>() {
            Ok(s) => Some(s),
            Err(_) => {
                page.error = Some(format!(
                    "state: unknown task state {}",
                    sheaf_core::excerpt::quoted(&page.state)
                ));
                return render(StatusCode::BAD_REQUEST, page);
            }
        }
    };
    let cursor = Some(first(&q, "cursor")).filter(|c| !c.is_empty());
    let admin = shared.client.admin();
    let (listed, listing) = tokio::join!(
        admin.list_tasks(&page.queue, state, cursor, PAGE),
        admin.list_queues()
    );
    page.chrome.missing(listing.unavailable_shards.keys());
    page.counts = Some(counts(&listing, &page.queue));
    match listed {
        Err(e) => {
            page.error = Some(read_error_of(&e, "cursor", cursor.unwrap_or("")));
            page.chrome.failed(&e);
            return render(status_of(&e), page);
        }
        Ok(p) => {
            page.chrome.missing(p.unavailable_shards.keys());
            page.next = p.next_cursor.as_ref().map(|c| {
                link(
                    "/tasks",
                    &[("queue", &page.queue), ("state", &page.state), ("cursor", c)],
                )
            });
            page.rows = p
                .items
                .iter()
                .map(|t| TaskRow {
                    id: t.task_id.to_string(),
                    shard: t.shard.to_string(),
                    cancellable: t.kind == TaskKind::Activity,
                    kind: t.kind.to_string(),
                    state: t.state.as_str(),
                    priority: t.priority,
                    attempts: format!("{}/{}", t.attempts, t.max_attempts),
                    run_at: time(t.run_at),
                    key: t.concurrency_key.clone().unwrap_or_default(),
                    execution: t.execution_id.map(|e| e.to_string()).unwrap_or_default(),
                    error: t.last_error.as_deref().map(|e| cut(e, 300)).unwrap_or_default(),
                })
                .collect();
        }
    }
    render(StatusCode::OK, page)
}
