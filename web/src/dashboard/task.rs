//! `/tasks/{id}` and `/dead-letters/{id}`: one task (unfinished, or its
//! dead letter) as `Client::get_task` reads it from the shard its id names:
//! its payload, last progress report and last error shown whole, its
//! attempts, lease and times. The dead-letter address shows dead letters
//! only (a task that is not one is a 404 pointing at its task page).

use std::sync::Arc;

use askama::Template;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::Value;
use sheaf_core::state::TaskKind;
use sheaf_driver::{TaskId, TaskInfo, TaskStatus};

use super::{Chrome, Shared, cut, inert, read_error, render, status_of, time};

/// The task's fields, as shown.
struct Shown {
    shard: String,
    queue: String,
    kind: String,
    state: String,
    dead: bool,
    cancellable: bool,
    priority: i32,
    attempts: i32,
    max_attempts: i32,
    concurrency_key: String,
    fairness_key: String,
    idempotency_key: String,
    execution: String,
    lease_owner: String,
    lease_expires: String,
    started: String,
    enqueued: String,
    run_at: String,
    dead_at: String,
    payload: String,
    progress: String,
    error: String,
}

/// JSON as shown: indented, then [`inert`].
fn json(value: &Value) -> String {
    inert(&serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string()))
}

impl Shown {
    fn of(t: &TaskInfo) -> Shown {
        let dead = t.state == TaskStatus::Dead;
        let or_dash = |at: Option<std::time::SystemTime>| at.map_or_else(|| "-".into(), time);
        Shown {
            shard: t.shard.to_string(),
            queue: t.queue.clone(),
            kind: t.kind.to_string(),
            state: t.state.to_string(),
            dead,
            cancellable: !dead && t.kind == TaskKind::Activity,
            priority: t.priority,
            attempts: t.attempts,
            max_attempts: t.max_attempts,
            concurrency_key: t.concurrency_key.clone().unwrap_or_default(),
            fairness_key: t.fairness_key.clone().unwrap_or_default(),
            idempotency_key: t.idempotency_key.clone().unwrap_or_default(),
            execution: t.execution_id.map(|e| e.to_string()).unwrap_or_default(),
            lease_owner: t.lease_owner.clone().unwrap_or_default(),
            lease_expires: or_dash(t.lease_expires_at),
            started: or_dash(t.started_at),
            enqueued: time(t.enqueued_at),
            run_at: or_dash(t.run_at),
            dead_at: or_dash(t.dead_at),
            payload: json(&t.payload),
            progress: t.progress.as_ref().map(json).unwrap_or_default(),
            error: t.last_error.as_deref().map(inert).unwrap_or_default(),
        }
    }
}

#[derive(Template)]
#[template(path = "task.html")]
struct TaskPage {
    chrome: Chrome,
    /// "Task" or "Dead letter".
    heading: &'static str,
    id: String,
    error: Option<String>,
    task: Option<Shown>,
    /// The task page of a task that is not a dead letter.
    see: Option<String>,
}

pages!(TaskPage);

pub(super) async fn task(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(raw_id): Path<String>,
) -> Response {
    let chrome = Chrome::new(&shared, &headers, "tasks");
    show(&shared, chrome, "Task", &raw_id).await
}

pub(super) async fn dead_letter(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(raw_id): Path<String>,
) -> Response {
    let chrome = Chrome::new(&shared, &headers, "dead letters");
    show(&shared, chrome, "Dead letter", &raw_id).await
}

async fn show(shared: &Shared, chrome: Chrome, heading: &'static str, raw_id: &str) -> Response {
    let mut page = TaskPage {
        chrome,
        heading,
        id: cut(&inert(raw_id), 64),
        error: None,
        task: None,
        see: None,
    };
    let Ok(id) = raw_id.parse::<TaskId>() else {
        page.error = Some(format!(
            "id: not a task id: {}",
            sheaf_core::excerpt::quoted(raw_id)
        ));
        return render(StatusCode::BAD_REQUEST, page);
    };
    match shared.client.get_task(id).await {
        Err(e) => {
            page.error = Some(read_error(&e));
            page.chrome.failed(&e);
            render(status_of(&e), page)
        }
        Ok(t) if heading == "Dead letter" && t.state != TaskStatus::Dead => {
            page.error = Some(format!("task {id} is not a dead letter: it is {}", t.state));
            page.see = Some(format!("/tasks/{id}"));
            render(StatusCode::NOT_FOUND, page)
        }
        Ok(t) => {
            page.task = Some(Shown::of(&t));
            render(StatusCode::OK, page)
        }
    }
}
