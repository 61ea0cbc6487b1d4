//! Tasks and dead letters: enqueue one, list a queue's, read and cancel
//! one; list, redrive and purge dead letters.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sheaf_driver::{EnqueueOptions, MAX_TASK_PAGE, TaskId, TaskState};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::{Act, Read};
use super::error::{ApiError, ErrorBody};
use super::executions::PlacementIn;
use super::{
    ApiState, Completeness, Query, any_answered, body, duration_param, ok, task_id, time, time_param,
};

pub(super) fn routes() -> OpenApiRouter<Arc<ApiState>> {
    OpenApiRouter::new()
        .routes(routes!(enqueue, list))
        .routes(routes!(get))
        .routes(routes!(cancel))
        .routes(routes!(dead_letters))
        .routes(routes!(redrive))
        .routes(routes!(purge))
}

/// A task to enqueue.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct EnqueueIn {
    /// The queue.
    queue: String,
    /// Its payload (default null).
    #[serde(default)]
    payload: Value,
    /// Where it goes.
    #[serde(default, flatten)]
    placement: Option<PlacementIn>,
    /// Higher runs first (default 0).
    priority: Option<i32>,
    /// Not claimable before this time (RFC 3339).
    run_at: Option<String>,
    /// While a task with this key is unfinished, enqueueing again returns its id.
    idempotency_key: Option<String>,
    /// Counts toward this key's concurrency cap.
    concurrency_key: Option<String>,
    /// Attempts before it is dead-lettered (default 25).
    max_attempts: Option<i32>,
    /// Waits on this declared rate limit.
    rate_limit: Option<String>,
    /// Its bucket's key under `rate_limit`.
    rate_key: Option<String>,
}

/// An enqueued task.
#[derive(Serialize, ToSchema)]
struct EnqueuedOut {
    task_id: String,
    shard: u16,
}

/// Enqueue a task.
#[utoipa::path(post, path = "/api/v1/tasks", tag = "tasks",
    request_body = EnqueueIn,
    responses(
        (status = 200, body = EnqueuedOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn enqueue(_: Act, State(api): State<Arc<ApiState>>, raw: Bytes) -> Result<Response, ApiError> {
    let t: EnqueueIn = body(&raw)?;
    let mut options = EnqueueOptions::new();
    if let Some(p) = t.placement.unwrap_or_default().placement()? {
        options = options.placement(p);
    }
    if let Some(priority) = t.priority {
        options = options.priority(priority);
    }
    if let Some(at) = t.run_at {
        options = options.run_at(time_param("run_at", &at)?);
    }
    if let Some(key) = t.idempotency_key {
        options = options.idempotency_key(key);
    }
    if let Some(key) = t.concurrency_key {
        options = options.concurrency_key(key);
    }
    if let Some(n) = t.max_attempts {
        options = options.max_attempts(n);
    }
    if let Some(limit) = t.rate_limit {
        options = options.rate_limit(limit);
    }
    if let Some(key) = t.rate_key {
        options = options.rate_key(key);
    }
    let enqueued = api.acting.enqueue(&t.queue, t.payload, options).await?;
    Ok(ok(EnqueuedOut {
        task_id: enqueued.task_id.to_string(),
        shard: enqueued.shard.get(),
    }))
}

/// One unfinished task of a listing.
#[derive(Serialize, ToSchema)]
struct ListedTaskOut {
    task_id: String,
    shard: u16,
    queue: String,
    kind: String,
    state: String,
    priority: i32,
    attempts: i32,
    max_attempts: i32,
    run_at: String,
    enqueued_at: String,
    concurrency_key: Option<String>,
    lease_expires_at: Option<String>,
    last_error: Option<String>,
    execution_id: Option<String>,
    progress: Option<Value>,
}

/// A page of tasks.
#[derive(Serialize, ToSchema)]
struct TaskPageOut {
    items: Vec<ListedTaskOut>,
    /// The cursor of the next page; absent on the last.
    next_cursor: Option<String>,
    #[serde(flatten)]
    completeness: Completeness,
}

/// List a queue's unfinished tasks, a page at a time.
#[utoipa::path(get, path = "/api/v1/tasks", tag = "tasks",
    params(
        ("queue" = String, Query, description = "The queue (required)"),
        ("state" = Option<String>, Query, description = "Only tasks in this state (ready, scheduled, running, waiting, paused)"),
        ("cursor" = Option<String>, Query, description = "The next_cursor of the page before"),
        ("page_size" = Option<usize>, Query, description = "Items per page (default 50)")),
    responses(
        (status = 200, body = TaskPageOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn list(
    _: Read,
    State(api): State<Arc<ApiState>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref());
    let queue = q
        .get("queue")
        .ok_or_else(|| ApiError::bad("queue", "is required"))?;
    let state = q.parsed::<TaskState>("state", "a task state")?;
    let page_size = q.page_size(50, MAX_TASK_PAGE)?;
    let page = api
        .client
        .admin()
        .list_tasks(queue, state, q.get("cursor"), page_size)
        .await?;
    Ok(ok(TaskPageOut {
        items: page
            .items
            .iter()
            .map(|t| ListedTaskOut {
                task_id: t.task_id.to_string(),
                shard: t.shard.get(),
                queue: t.queue.clone(),
                kind: t.kind.as_str().to_owned(),
                state: t.state.as_str().to_owned(),
                priority: t.priority,
                attempts: t.attempts,
                max_attempts: t.max_attempts,
                run_at: time(t.run_at),
                enqueued_at: time(t.enqueued_at),
                concurrency_key: t.concurrency_key.clone(),
                lease_expires_at: t.lease_expires_at.map(time),
                last_error: t.last_error.clone(),
                execution_id: t.execution_id.map(|e| e.to_string()),
                progress: t.progress.clone(),
            })
            .collect(),
        next_cursor: page.next_cursor.clone(),
        completeness: Completeness::of_page(page.status, &page.unavailable_shards),
    }))
}

/// One task, with its payload.
#[derive(Serialize, ToSchema)]
struct TaskOut {
    task_id: String,
    shard: u16,
    queue: String,
    kind: String,
    state: String,
    priority: i32,
    attempts: i32,
    max_attempts: i32,
    run_at: Option<String>,
    enqueued_at: String,
    concurrency_key: Option<String>,
    lease_expires_at: Option<String>,
    last_error: Option<String>,
    execution_id: Option<String>,
    payload: Value,
}

/// Read one task (unfinished or dead-lettered) by id.
#[utoipa::path(get, path = "/api/v1/tasks/{id}", tag = "tasks",
    params(("id" = String, Path, description = "The task's id")),
    responses(
        (status = 200, body = TaskOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn get(
    _: Read,
    State(api): State<Arc<ApiState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let t = api.client.get_task(task_id(&id)?).await?;
    Ok(ok(TaskOut {
        task_id: t.task_id.to_string(),
        shard: t.shard.get(),
        queue: t.queue,
        kind: t.kind.as_str().to_owned(),
        state: t.state.as_str().to_owned(),
        priority: t.priority,
        attempts: t.attempts,
        max_attempts: t.max_attempts,
        run_at: t.run_at.map(time),
        enqueued_at: time(t.enqueued_at),
        concurrency_key: t.concurrency_key,
        lease_expires_at: t.lease_expires_at.map(time),
        last_error: t.last_error,
        execution_id: t.execution_id.map(|e| e.to_string()),
        payload: t.payload,
    }))
}

/// Why a task is cancelled.
#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
struct CancelIn {
    reason: Option<String>,
}

/// Whether a task was cancelled (`false`: it had already finished).
#[derive(Serialize, ToSchema)]
struct CancelledOut {
    task_id: String,
    cancelled: bool,
}

/// Cancel an unfinished task.
#[utoipa::path(post, path = "/api/v1/tasks/{id}/cancel", tag = "tasks",
    params(("id" = String, Path, description = "The task's id")),
    request_body(content = CancelIn, description = "optional"),
    responses(
        (status = 200, body = CancelledOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn cancel(
    _: Act,
    State(api): State<Arc<ApiState>>,
    Path(id): Path<String>,
    raw: Bytes,
) -> Result<Response, ApiError> {
    let id = task_id(&id)?;
    let c: CancelIn = body(&raw)?;
    let cancelled = api.acting.cancel_task(id, c.reason.as_deref()).await?;
    Ok(ok(CancelledOut {
        task_id: id.to_string(),
        cancelled,
    }))
}

/// One dead letter.
#[derive(Serialize, ToSchema)]
struct DeadLetterOut {
    task_id: String,
    shard: u16,
    queue: String,
    kind: String,
    priority: i32,
    attempts: i32,
    max_attempts: i32,
    execution_id: Option<String>,
    concurrency_key: Option<String>,
    last_error: Option<String>,
    enqueued_at: String,
    dead_at: String,
}

/// A page of dead letters.
#[derive(Serialize, ToSchema)]
struct DeadLetterPageOut {
    items: Vec<DeadLetterOut>,
    /// The cursor of the next page; absent on the last.
    next_cursor: Option<String>,
    #[serde(flatten)]
    completeness: Completeness,
}

/// List dead letters, newest first, a page at a time.
#[utoipa::path(get, path = "/api/v1/dead-letters", tag = "dead letters",
    params(
        ("queue" = Option<String>, Query, description = "Only this queue's"),
        ("cursor" = Option<String>, Query, description = "The next_cursor of the page before"),
        ("page_size" = Option<usize>, Query, description = "Items per page (default 50)")),
    responses(
        (status = 200, body = DeadLetterPageOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn dead_letters(
    _: Read,
    State(api): State<Arc<ApiState>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref());
    let page_size = q.page_size(50, MAX_TASK_PAGE)?;
    let page = api
        .client
        .admin()
        .list_dead_letters(q.get("queue"), q.get("cursor"), page_size)
        .await?;
    Ok(ok(DeadLetterPageOut {
        items: page
            .items
            .iter()
            .map(|d| DeadLetterOut {
                task_id: d.task_id.to_string(),
                shard: d.shard.get(),
                queue: d.queue.clone(),
                kind: d.kind.as_str().to_owned(),
                priority: d.priority,
                attempts: d.attempts,
                max_attempts: d.max_attempts,
                execution_id: d.execution_id.map(|e| e.to_string()),
                concurrency_key: d.concurrency_key.clone(),
                last_error: d.last_error.clone(),
                enqueued_at: time(d.enqueued_at),
                dead_at: time(d.dead_at),
            })
            .collect(),
        next_cursor: page.next_cursor.clone(),
        completeness: Completeness::of_page(page.status, &page.unavailable_shards),
    }))
}

/// Dead letters to put back on their queues.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RedriveIn {
    /// Their task ids (1 to 1000).
    task_ids: Vec<String>,
}

/// How many rows a fleet-wide action changed.
#[derive(Serialize, ToSchema)]
struct CountOut {
    /// Rows changed, over the shards that answered.
    count: i64,
    #[serde(flatten)]
    completeness: Completeness,
}

/// Redrive dead letters by id: each goes back to its queue, ready.
#[utoipa::path(post, path = "/api/v1/dead-letters/redrive", tag = "dead letters",
    request_body = RedriveIn,
    responses(
        (status = 200, body = CountOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn redrive(_: Act, State(api): State<Arc<ApiState>>, raw: Bytes) -> Result<Response, ApiError> {
    let r: RedriveIn = body(&raw)?;
    if r.task_ids.is_empty() || r.task_ids.len() > 1000 {
        return Err(ApiError::bad("task_ids", "give 1 to 1000 task ids"));
    }
    let ids = r
        .task_ids
        .iter()
        .map(|t| {
            t.parse::<TaskId>()
                .map_err(|_| ApiError::bad("task_ids", format!("not a task id: {t:?}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let report = api.acting.admin().redrive(&ids).await;
    any_answered(&report)?;
    Ok(ok(CountOut {
        count: report.ok.values().map(|&n| i64::from(n)).sum(),
        completeness: Completeness::of(&report.failed),
    }))
}

/// Which dead letters to delete for good.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct PurgeIn {
    /// The queue whose dead letters go.
    queue: String,
    /// Only those dead longer than this (`1h`, `7d`; default: all).
    older_than: Option<String>,
}

/// Purge a queue's dead letters (optionally only the older ones).
#[utoipa::path(post, path = "/api/v1/dead-letters/purge", tag = "dead letters",
    request_body = PurgeIn,
    responses(
        (status = 200, body = CountOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn purge(_: Act, State(api): State<Arc<ApiState>>, raw: Bytes) -> Result<Response, ApiError> {
    let p: PurgeIn = body(&raw)?;
    let older_than = match p.older_than {
        Some(text) => duration_param("older_than", &text)?,
        None => std::time::Duration::ZERO,
    };
    let report = api
        .acting
        .admin()
        .purge_dead_letters(&p.queue, older_than)
        .await?;
    any_answered(&report)?;
    Ok(ok(CountOut {
        count: report.ok.values().sum(),
        completeness: Completeness::of(&report.failed),
    }))
}
