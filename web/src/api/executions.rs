//! Executions: start one, read one (by id or business key), list and page
//! them, read a history, and signal, cancel or terminate one by id or by
//! business key.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sheaf_driver::{
    Execution, ExecutionFilter, ExecutionId, ExecutionState, MAX_HISTORY_PAGE, MAX_LIST_PAGE, Placement,
    Resolution, ShardId, SortOrder, StartOptions,
};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::{Act, Read};
use super::error::{ApiError, ErrorBody};
use super::{ApiState, Completeness, Query, body, duration_param, execution_id, ok, time, time_param};

pub(super) fn routes() -> OpenApiRouter<Arc<ApiState>> {
    OpenApiRouter::new()
        .routes(routes!(start, list))
        .routes(routes!(get))
        .routes(routes!(history))
        .routes(routes!(signal))
        .routes(routes!(cancel))
        .routes(routes!(terminate))
        .routes(routes!(find))
        .routes(routes!(signal_by_key))
        .routes(routes!(cancel_by_key))
        .routes(routes!(terminate_by_key))
}

/// Where a start or a task goes: at most one of these (none: placed by
/// its key, as the topology says).
#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct PlacementIn {
    /// Exactly this shard.
    shard: Option<u32>,
    /// The shard the topology's residency map names for this key.
    residency_key: Option<String>,
    /// Every start (or task) with this key lands on one shard.
    routing_key: Option<String>,
}

impl PlacementIn {
    pub(super) fn placement(self) -> Result<Option<Placement>, ApiError> {
        match (self.shard, self.residency_key, self.routing_key) {
            (None, None, None) => Ok(None),
            (Some(s), None, None) => ShardId::new(s)
                .map(|s| Some(Placement::Shard(s)))
                .map_err(|e| ApiError::bad("shard", e)),
            (None, Some(k), None) => Ok(Some(Placement::ResidencyKey(k))),
            (None, None, Some(k)) => Ok(Some(Placement::RoutingKey(k))),
            _ => Err(ApiError::bad(
                "placement",
                "give at most one of shard, residency_key and routing_key",
            )),
        }
    }
}

/// A start: a workflow's name, business key and input.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct StartIn {
    /// The workflow's name.
    workflow_name: String,
    /// Its business key: one active run per (name, workflow id).
    workflow_id: String,
    /// Its input (default null).
    #[serde(default)]
    input: Value,
    /// Where it goes.
    #[serde(default, flatten)]
    placement: Option<PlacementIn>,
    /// On behalf of a tenant: placed by tenant and name unless a placement is given.
    tenant: Option<String>,
    /// The queue of its first workflow task (default: the declared one).
    queue: Option<String>,
    /// The priority of its first workflow task.
    priority: Option<i32>,
    /// When its first workflow task is due (RFC 3339).
    run_at: Option<String>,
    /// Ends TIMED_OUT this long after its start (`90s`, `10m`, `2h`).
    execution_timeout: Option<String>,
}

/// A started (or the key's already active) execution.
#[derive(Serialize, ToSchema)]
struct StartedOut {
    execution_id: String,
    shard: u16,
    /// `false`: the key already had an active run, which is this one.
    created: bool,
    /// Runs this start replaced (a `supersede` policy).
    superseded: Vec<String>,
}

/// Start a workflow.
#[utoipa::path(post, path = "/api/v1/executions", tag = "executions",
    request_body = StartIn,
    responses(
        (status = 200, description = "started, or the key's active run", body = StartedOut),
        (status = 400, description = "a bad parameter, named", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, description = "a quota, gate or placement refused it", body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn start(_: Act, State(api): State<Arc<ApiState>>, raw: Bytes) -> Result<Response, ApiError> {
    let input: StartIn = body(&raw)?;
    let mut options = StartOptions::new();
    if let Some(p) = input.placement.unwrap_or_default().placement()? {
        options = options.placement(p);
    }
    if let Some(tenant) = input.tenant {
        options = options.tenant(tenant);
    }
    if let Some(queue) = input.queue {
        options = options.queue(queue);
    }
    if let Some(priority) = input.priority {
        options = options.priority(priority);
    }
    if let Some(at) = input.run_at {
        options = options.run_at(time_param("run_at", &at)?);
    }
    if let Some(timeout) = input.execution_timeout {
        options = options.execution_timeout(duration_param("execution_timeout", &timeout)?);
    }
    let started = api
        .acting
        .start_workflow(&input.workflow_name, &input.workflow_id, input.input, options)
        .await?;
    Ok(ok(StartedOut {
        execution_id: started.execution_id.to_string(),
        shard: started.shard.get(),
        created: started.created,
        superseded: started.superseded.iter().map(ToString::to_string).collect(),
    }))
}

/// One execution, whole.
#[derive(Serialize, ToSchema)]
struct ExecutionOut {
    execution_id: String,
    shard: u16,
    workflow_name: String,
    workflow_id: String,
    state: String,
    input: Value,
    result: Option<Value>,
    error: Option<String>,
    concurrency_key: Option<String>,
    quota_key: Option<String>,
    history_bytes: i64,
    created_at: String,
    closed_at: Option<String>,
    wake_at: Option<String>,
}

impl ExecutionOut {
    fn of(e: &Execution) -> ExecutionOut {
        ExecutionOut {
            execution_id: e.execution_id.to_string(),
            shard: e.shard.get(),
            workflow_name: e.workflow_name.clone(),
            workflow_id: e.workflow_id.clone(),
            state: e.state.as_str().to_owned(),
            input: e.input.to_value().unwrap_or(Value::Null),
            result: e.result.as_ref().and_then(|r| r.to_value().ok()),
            error: e.error.clone(),
            concurrency_key: e.concurrency_key.clone(),
            quota_key: e.quota_key.clone(),
            history_bytes: e.history_bytes,
            created_at: time(e.created_at),
            closed_at: e.closed_at.map(time),
            wake_at: e.wake_at.map(time),
        }
    }
}

/// Read one execution by id.
#[utoipa::path(get, path = "/api/v1/executions/{id}", tag = "executions",
    params(("id" = String, Path, description = "The execution's id")),
    responses(
        (status = 200, body = ExecutionOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn get(
    _: Read,
    State(api): State<Arc<ApiState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = execution_id(&id)?;
    match api.client.get_execution(id).await? {
        Some(e) => Ok(ok(ExecutionOut::of(&e))),
        None => Err(ApiError::not_found(format!("no execution {id}"))),
    }
}

/// One execution of a listing.
#[derive(Serialize, ToSchema)]
struct ListedOut {
    execution_id: String,
    shard: u16,
    workflow_name: String,
    workflow_id: String,
    state: String,
    created_at: String,
    closed_at: Option<String>,
    parent_id: Option<String>,
    search_attrs: Value,
}

/// A page of executions.
#[derive(Serialize, ToSchema)]
struct ExecutionPageOut {
    items: Vec<ListedOut>,
    /// The cursor of the next page (`cursor=`); absent on the last.
    next_cursor: Option<String>,
    #[serde(flatten)]
    completeness: Completeness,
}

/// List executions, newest first, a page at a time.
#[utoipa::path(get, path = "/api/v1/executions", tag = "executions",
    params(
        ("workflow" = Option<String>, Query, description = "Only executions of this workflow"),
        ("state" = Option<String>, Query, description = "Only executions in this state (RUNNING, COMPLETED, ...)"),
        ("created_after" = Option<String>, Query, description = "Created after this time (RFC 3339)"),
        ("created_before" = Option<String>, Query, description = "Created before this time (RFC 3339)"),
        ("filter" = Option<String>, Query, description = "A filter tree as JSON (docs/reference/sql/executions.md), and-ed with the rest"),
        ("order" = Option<String>, Query, description = "desc (newest first, the default) or asc"),
        ("cursor" = Option<String>, Query, description = "The next_cursor of the page before"),
        ("page_size" = Option<usize>, Query, description = "Items per page (1 to 1000, default 50)")),
    responses(
        (status = 200, body = ExecutionPageOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn list(
    _: Read,
    State(api): State<Arc<ApiState>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref());
    let mut filter = ExecutionFilter::new();
    if let Some(name) = q.get("workflow") {
        filter = filter.workflows([name]);
    }
    if let Some(state) = q.parsed::<ExecutionState>("state", "an execution state")? {
        filter = filter.states([state]);
    }
    if let Some(at) = q.time("created_after")? {
        filter = filter.created_after(at);
    }
    if let Some(at) = q.time("created_before")? {
        filter = filter.created_before(at);
    }
    if let Some(tree) = q.get("filter") {
        let tree: Value = serde_json::from_str(tree).map_err(|e| ApiError::bad("filter", e))?;
        filter = filter.and(tree);
    }
    let order = match q.get("order") {
        None | Some("desc") => SortOrder::Desc,
        Some("asc") => SortOrder::Asc,
        Some(_) => return Err(ApiError::bad("order", "must be asc or desc")),
    };
    let page_size = q.page_size(50, MAX_LIST_PAGE)?;
    let page = api
        .client
        .list_executions(&filter, q.get("cursor"), page_size, order)
        .await?;
    api.some_answered(page.unavailable_shards.len())?;
    Ok(ok(ExecutionPageOut {
        items: page
            .items
            .iter()
            .map(|e| ListedOut {
                execution_id: e.execution_id.to_string(),
                shard: e.shard.get(),
                workflow_name: e.workflow_name.clone(),
                workflow_id: e.workflow_id.clone(),
                state: e.state.as_str().to_owned(),
                created_at: time(e.created_at),
                closed_at: e.closed_at.map(time),
                parent_id: e.parent_id.map(|p| p.to_string()),
                search_attrs: e.search_attrs.to_value().unwrap_or(Value::Null),
            })
            .collect(),
        next_cursor: page.next_cursor.clone(),
        completeness: Completeness::of_page(page.status, &page.unavailable_shards),
    }))
}

/// One event of a history.
#[derive(Serialize, ToSchema)]
struct EventOut {
    seq: i64,
    event_type: String,
    payload: Value,
    created_at: String,
}

/// A page of a history.
#[derive(Serialize, ToSchema)]
struct HistoryOut {
    events: Vec<EventOut>,
    /// The `after` of the next page; absent on the last.
    next_after: Option<i64>,
}

/// Read an execution's history, a page at a time.
#[utoipa::path(get, path = "/api/v1/executions/{id}/history", tag = "executions",
    params(
        ("id" = String, Path, description = "The execution's id"),
        ("after" = Option<i64>, Query, description = "Events after this seq (the `next_after` of the page before)"),
        ("page_size" = Option<usize>, Query, description = "Events per page (1 to 10000, default 100)")),
    responses(
        (status = 200, body = HistoryOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn history(
    _: Read,
    State(api): State<Arc<ApiState>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let id = execution_id(&id)?;
    let q = Query::parse(raw.as_deref());
    let after = q.parsed::<i64>("after", "a sequence number")?.unwrap_or(0);
    let page_size = q.page_size(100, MAX_HISTORY_PAGE)?;
    let page = api.client.history(id, after, page_size).await?;
    Ok(ok(HistoryOut {
        events: page
            .events
            .iter()
            .map(|e| EventOut {
                seq: e.seq,
                event_type: e.event_type.as_str().to_owned(),
                payload: e.payload.to_value().unwrap_or(Value::Null),
                created_at: time(e.created_at),
            })
            .collect(),
        next_after: page.next_after,
    }))
}

/// A signal.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct SignalIn {
    /// The signal's name.
    name: String,
    /// Its payload (default null).
    #[serde(default)]
    payload: Value,
    /// Delivered once per id.
    signal_id: Option<String>,
}

/// Why an execution is cancelled or terminated (kept in its history).
#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
struct ReasonIn {
    reason: Option<String>,
}

/// What an action did: `changed: false` means nothing to do (already
/// ended, a signal already delivered).
#[derive(Serialize, ToSchema)]
struct ChangedOut {
    execution_id: String,
    changed: bool,
}

fn changed(id: ExecutionId, changed: bool) -> Response {
    ok(ChangedOut {
        execution_id: id.to_string(),
        changed,
    })
}

async fn do_signal(api: &ApiState, id: ExecutionId, raw: &Bytes) -> Result<Response, ApiError> {
    let s: SignalIn = body(raw)?;
    let done = api
        .acting
        .signal(id, &s.name, s.payload, s.signal_id.as_deref())
        .await?;
    Ok(changed(id, done))
}

async fn do_cancel(api: &ApiState, id: ExecutionId, raw: &Bytes) -> Result<Response, ApiError> {
    let r: ReasonIn = body(raw)?;
    Ok(changed(
        id,
        api.acting.cancel_execution(id, r.reason.as_deref()).await?,
    ))
}

async fn do_terminate(api: &ApiState, id: ExecutionId, raw: &Bytes) -> Result<Response, ApiError> {
    let r: ReasonIn = body(raw)?;
    let done = api
        .acting
        .admin()
        .terminate_execution(id, r.reason.as_deref())
        .await?;
    Ok(changed(id, done))
}

/// Send an execution a signal.
#[utoipa::path(post, path = "/api/v1/executions/{id}/signal", tag = "executions",
    params(("id" = String, Path, description = "The execution's id")),
    request_body = SignalIn,
    responses(
        (status = 200, body = ChangedOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn signal(
    _: Act,
    State(api): State<Arc<ApiState>>,
    Path(id): Path<String>,
    raw: Bytes,
) -> Result<Response, ApiError> {
    do_signal(&api, execution_id(&id)?, &raw).await
}

/// Cancel an execution (its tasks leave, its children hear of it).
#[utoipa::path(post, path = "/api/v1/executions/{id}/cancel", tag = "executions",
    params(("id" = String, Path, description = "The execution's id")),
    request_body(content = ReasonIn, description = "optional"),
    responses(
        (status = 200, body = ChangedOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn cancel(
    _: Act,
    State(api): State<Arc<ApiState>>,
    Path(id): Path<String>,
    raw: Bytes,
) -> Result<Response, ApiError> {
    do_cancel(&api, execution_id(&id)?, &raw).await
}

/// Terminate an execution: end it now, as an operator (audited).
#[utoipa::path(post, path = "/api/v1/executions/{id}/terminate", tag = "executions",
    params(("id" = String, Path, description = "The execution's id")),
    request_body(content = ReasonIn, description = "optional"),
    responses(
        (status = 200, body = ChangedOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn terminate(
    _: Act,
    State(api): State<Arc<ApiState>>,
    Path(id): Path<String>,
    raw: Bytes,
) -> Result<Response, ApiError> {
    do_terminate(&api, execution_id(&id)?, &raw).await
}

/// The one live (else latest) run of a business key: a key with more
/// than one live run is a 409 (act on one by id), none a 404, a shard
/// that did not answer and may hold it a 503.
async fn by_key(api: &ApiState, name: &str, workflow_id: &str) -> Result<Execution, ApiError> {
    match api.client.find_execution(name, workflow_id).await? {
        Resolution::Found {
            execution, also_live, ..
        } if also_live.is_empty() => Ok(*execution),
        Resolution::Found { also_live, .. } => Err(ApiError::conflict(format!(
            "{name:?} / {workflow_id:?} has {} live runs, not one: act on one by id",
            also_live.len() + 1
        ))),
        Resolution::Absent => Err(ApiError::not_found(format!(
            "no execution of {name:?} with id {workflow_id:?}"
        ))),
        _ => Err(ApiError::unavailable(
            "a shard that did not answer may hold the key's active run; retry later",
        )),
    }
}

/// Find an execution by business key: its one live run, else its latest.
#[utoipa::path(get, path = "/api/v1/workflows/{name}/{workflow_id}", tag = "executions",
    params(
        ("name" = String, Path, description = "The workflow's name"),
        ("workflow_id" = String, Path, description = "Its business key")),
    responses(
        (status = 200, body = ExecutionOut),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "more than one live run", body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn find(
    _: Read,
    State(api): State<Arc<ApiState>>,
    Path((name, workflow_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    Ok(ok(ExecutionOut::of(&by_key(&api, &name, &workflow_id).await?)))
}

/// Send a signal to a business key's live run.
#[utoipa::path(post, path = "/api/v1/workflows/{name}/{workflow_id}/signal", tag = "executions",
    params(
        ("name" = String, Path, description = "The workflow's name"),
        ("workflow_id" = String, Path, description = "Its business key")),
    request_body = SignalIn,
    responses(
        (status = 200, body = ChangedOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn signal_by_key(
    _: Act,
    State(api): State<Arc<ApiState>>,
    Path((name, workflow_id)): Path<(String, String)>,
    raw: Bytes,
) -> Result<Response, ApiError> {
    let e = by_key(&api, &name, &workflow_id).await?;
    do_signal(&api, e.execution_id, &raw).await
}

/// Cancel a business key's live run.
#[utoipa::path(post, path = "/api/v1/workflows/{name}/{workflow_id}/cancel", tag = "executions",
    params(
        ("name" = String, Path, description = "The workflow's name"),
        ("workflow_id" = String, Path, description = "Its business key")),
    request_body(content = ReasonIn, description = "optional"),
    responses(
        (status = 200, body = ChangedOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn cancel_by_key(
    _: Act,
    State(api): State<Arc<ApiState>>,
    Path((name, workflow_id)): Path<(String, String)>,
    raw: Bytes,
) -> Result<Response, ApiError> {
    let e = by_key(&api, &name, &workflow_id).await?;
    do_cancel(&api, e.execution_id, &raw).await
}

/// Terminate a business key's live run (audited).
#[utoipa::path(post, path = "/api/v1/workflows/{name}/{workflow_id}/terminate", tag = "executions",
    params(
        ("name" = String, Path, description = "The workflow's name"),
        ("workflow_id" = String, Path, description = "Its business key")),
    request_body(content = ReasonIn, description = "optional"),
    responses(
        (status = 200, body = ChangedOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn terminate_by_key(
    _: Act,
    State(api): State<Arc<ApiState>>,
    Path((name, workflow_id)): Path<(String, String)>,
    raw: Bytes,
) -> Result<Response, ApiError> {
    let e = by_key(&api, &name, &workflow_id).await?;
    do_terminate(&api, e.execution_id, &raw).await
}
