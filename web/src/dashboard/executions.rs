//! `/executions`: the merged list across shards, filtered by workflow,
//! state, a search attribute and a creation window, a keyset page at a
//! time, under the filter's counts by state; a workflow's run found by its
//! workflow id; a jump to an execution by its id. `/executions/{id}`: an
//! execution with its history (each task event linking to the task's
//! page), children (and their shards) and where it lives.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use askama::Template;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

use super::runs::Offered;
use super::{
    Chrome, Count, Counts, Shared, cut, first, link, pairs, read_error, read_error_of, render, status_of,
    time,
};
use sheaf_core::state::ExecutionState;
use sheaf_driver::{AttrOp, Child, Event, Execution, ExecutionFilter, SortOrder, attr_equality};
use sheaf_driver::{ExecutionId, ListedExecution, Resolution, ShardId, TaskId};

/// Executions per page.
const PAGE: usize = 50;
/// History events per page of an execution.
const EVENTS: usize = 100;
/// Why a visitor who is not signed in may not filter by attribute.
const SIGNED_IN: &str = "attr: filtering by a search attribute needs a signed-in session";
/// The most characters of a payload, result or error shown.
const SHOWN: usize = 2000;
/// The most executions a shard counts in one state (`count_executions`
/// reads at most one more entry of its state index).
const COUNTED: u32 = 10_000;

struct ExecutionRow {
    id: String,
    shard: String,
    workflow: String,
    workflow_id: String,
    state: &'static str,
    created: String,
    closed: String,
    attrs: String,
}

/// A row of an execution `$e` (listed, or found by its key: both have
/// these fields under these names) with `$attrs`.
macro_rules! execution_row {
    ($e:expr, $attrs:expr) => {
        ExecutionRow {
            id: $e.execution_id.to_string(),
            shard: $e.shard.to_string(),
            workflow: $e.workflow_name.clone(),
            workflow_id: $e.workflow_id.clone(),
            state: $e.state.as_str(),
            created: time($e.created_at),
            closed: $e.closed_at.map_or_else(|| "-".into(), time),
            attrs: $attrs,
        }
    };
}

impl ExecutionRow {
    fn listed(e: &ListedExecution) -> ExecutionRow {
        execution_row!(e, cut(e.search_attrs.as_str(), 300))
    }

    /// A run found by its key (a find reads no search attributes).
    fn found(e: &Execution) -> ExecutionRow {
        execution_row!(e, "-".into())
    }
}

#[derive(Template)]
#[template(path = "executions.html")]
struct ListPage {
    chrome: Chrome,
    workflow: String,
    workflow_id: String,
    /// What a search by workflow id found, in a sentence.
    found: Option<String>,
    counts: Option<Counts>,
    state: String,
    attr: String,
    after: String,
    before: String,
    states: Vec<&'static str>,
    error: Option<String>,
    rows: Vec<ExecutionRow>,
    next: Option<String>,
}

pages!(ListPage);

/// A time typed in a filter: RFC 3339 (`2026-12-04T10:00:00Z`, the `T`
/// optional) or an age before now (`2h`, `30m`).
fn instant(text: &str, field: &str) -> Result<Option<SystemTime>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    if let Ok(at) = humantime::parse_rfc3339_weak(text) {
        return Ok(Some(at));
    }
    let ago = humantime::parse_duration(text).map_err(|_| {
        format!(
            "{field}: expected a time like 2026-12-04T10:00:00Z or an age like 2h, got {}",
            sheaf_core::excerpt::quoted(text)
        )
    })?;
    // An age reaching before 1970 is no instant a row can have (and the
    // next page's link could not write it).
    SystemTime::now()
        .checked_sub(ago)
        .filter(|at| *at >= UNIX_EPOCH)
        .map(Some)
        .ok_or_else(|| {
            format!(
                "{field}: {} ago is before 1970",
                sheaf_core::excerpt::quoted(text)
            )
        })
}

/// A filter as read from the form, with its creation window resolved to
/// instants (an age is relative to now: the next page's link carries the
/// instant, or its cursor would belong to another filter).
#[derive(Debug)]
struct Filtered {
    filter: ExecutionFilter,
    /// The filter without its state: what the counts by state count.
    unstated: ExecutionFilter,
    after: Option<SystemTime>,
    before: Option<SystemTime>,
}

fn filter(q: &[(String, String)]) -> Result<Filtered, String> {
    let mut f = ExecutionFilter::new();
    let workflow = first(q, "workflow").trim();
    if !workflow.is_empty() {
        f = f.workflows([workflow]);
    }
    let state = first(q, "state");
    let state = if state.is_empty() {
        None
    } else {
        Some(
            state
                .parse::<ExecutionState>()
                .map_err(|_| format!("state: unknown state {}", sheaf_core::excerpt::quoted(state)))?,
        )
    };
    let attr = first(q, "attr").trim();
    if !attr.is_empty() {
        let (key, value) = attr_equality(attr).ok_or_else(|| {
            format!(
                "attr: expected KEY=VALUE, got {}",
                sheaf_core::excerpt::quoted(attr)
            )
        })?;
        f = f.attr(&key, AttrOp::Eq, value);
    }
    let after = instant(first(q, "after"), "after")?;
    if let Some(at) = after {
        f = f.created_after(at);
    }
    let before = instant(first(q, "before"), "before")?;
    if let Some(at) = before {
        f = f.created_before(at);
    }
    Ok(Filtered {
        filter: state.map_or_else(|| f.clone(), |s| f.clone().states([s])),
        unstated: f,
        after,
        before,
    })
}

/// The executions `unstated` matches, counted by state (one
/// `count_executions` call per shard, each state up to [`COUNTED`] a
/// shard), each linking to the list of that state. Also the shards that
/// did not answer. The states a listing never shows (a move's) count 0,
/// as their lists do.
async fn counts(
    shared: &Shared,
    unstated: &ExecutionFilter,
    link_of: impl Fn(&str) -> String,
) -> (Counts, BTreeSet<ShardId>) {
    let mut missing = BTreeSet::new();
    let mut counts = Counts {
        what: "Executions by state".into(),
        cells: Vec::new(),
        partial: false,
        bounded: Some(COUNTED as usize),
    };
    let counted = match shared.client.count_executions(unstated, COUNTED).await {
        Ok(c) => {
            counts.partial = !c.unavailable_shards.is_empty();
            missing.extend(c.unavailable_shards.keys());
            Some(c.counts)
        }
        Err(e) => {
            counts.partial = true;
            missing.extend(Chrome::shard_of(&e));
            None
        }
    };
    for state in ExecutionState::ALL {
        let shown = match &counted {
            None => "?".into(),
            Some(c) => match c.iter().find(|c| c.state == state) {
                Some(c) if c.capped => format!("{}+", c.count),
                Some(c) => c.count.to_string(),
                None => "0".into(),
            },
        };
        counts.cells.push(Count {
            state: state.as_str(),
            shown,
            href: link_of(state.as_str()),
        });
    }
    (counts, missing)
}

/// An instant as the next page's link carries it (to the nanosecond, so it
/// reads back as the same filter).
fn exact(at: Option<SystemTime>) -> String {
    at.map(|t| humantime::format_rfc3339_nanos(t).to_string())
        .unwrap_or_default()
}

pub(super) async fn list(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = pairs(raw.as_deref().unwrap_or(""));
    let cursor = Some(first(&q, "cursor")).filter(|c| !c.is_empty());
    let mut page = ListPage {
        chrome: Chrome::new(&shared, &headers, "executions"),
        workflow: first(&q, "workflow").to_owned(),
        workflow_id: first(&q, "workflow_id").to_owned(),
        found: None,
        counts: None,
        state: first(&q, "state").to_owned(),
        attr: first(&q, "attr").to_owned(),
        after: first(&q, "after").to_owned(),
        before: first(&q, "before").to_owned(),
        states: ExecutionState::ALL.iter().map(|s| s.as_str()).collect(),
        error: None,
        rows: Vec::new(),
        next: None,
    };
    page.chrome.refreshing(
        shared.options.refresh_every,
        &headers,
        "/executions",
        raw.as_deref(),
    );
    let jump = first(&q, "id").trim();
    if !jump.is_empty() {
        return jump_to(page, jump);
    }
    if !page.workflow_id.is_empty() {
        return by_workflow_id(&shared, page, &q).await;
    }
    let filtered = match filter(&q) {
        Ok(f) => f,
        Err(e) => {
            page.error = Some(e);
            return render(StatusCode::BAD_REQUEST, page);
        }
    };
    if !page.attr.trim().is_empty() && !page.chrome.payloads {
        // Matching on values would read them out one guess at a time.
        page.error = Some(SIGNED_IN.into());
        return render(StatusCode::FORBIDDEN, page);
    }
    let (after, before) = (exact(filtered.after), exact(filtered.before));
    let link_to = |state: &str, cursor: &str| {
        link(
            "/executions",
            &[
                ("workflow", &page.workflow),
                ("state", state),
                ("attr", &page.attr),
                ("after", &after),
                ("before", &before),
                ("cursor", cursor),
            ],
        )
    };
    let (listed, (counted, missing)) = tokio::join!(
        shared
            .client
            .list_executions(&filtered.filter, cursor, PAGE, SortOrder::Desc),
        counts(&shared, &filtered.unstated, |s| link_to(s, ""))
    );
    let status = match listed {
        Err(e) => {
            page.error = Some(read_error_of(&e, "cursor", cursor.unwrap_or("")));
            page.chrome.failed(&e);
            status_of(&e)
        }
        Ok(p) => {
            page.chrome.missing(p.unavailable_shards.keys());
            page.chrome.missing(&missing);
            page.next = p.next_cursor.as_ref().map(|c| link_to(&page.state, c));
            page.counts = Some(counted);
            page.rows = p.items.iter().map(ExecutionRow::listed).collect();
            StatusCode::OK
        }
    };
    render(status, page)
}

/// `/executions?id=ID`: to that execution's page (303).
fn jump_to(mut page: ListPage, id: &str) -> Response {
    match id.parse::<ExecutionId>() {
        Ok(id) => Redirect::to(&format!("/executions/{id}")).into_response(),
        Err(_) => {
            page.error = Some(format!(
                "id: not an execution id: {}",
                sheaf_core::excerpt::quoted(id)
            ));
            render(StatusCode::BAD_REQUEST, page)
        }
    }
}

/// `/executions?workflow=NAME&workflow_id=ID`: the run of that key
/// (`Client::find_execution`: the active one, else the latest that ended)
/// and any other live run of it elsewhere. A workflow id is unique per
/// workflow name, and no shard can list executions by workflow id alone.
async fn by_workflow_id(shared: &Shared, mut page: ListPage, q: &[(String, String)]) -> Response {
    let name = page.workflow.trim().to_owned();
    if name.is_empty() {
        page.error = Some(
            "workflow_id: a search by workflow id needs the workflow's name too (a workflow id is unique per workflow)"
                .into(),
        );
        return render(StatusCode::BAD_REQUEST, page);
    }
    if let Some(other) = ["state", "attr", "after", "before", "cursor"]
        .into_iter()
        .find(|k| !first(q, k).trim().is_empty())
    {
        page.error = Some(format!(
            "workflow_id: a search by workflow id takes the workflow's name and no other filter (got {other})"
        ));
        return render(StatusCode::BAD_REQUEST, page);
    }
    let key = format!(
        "workflow {} with workflow id {}",
        sheaf_core::excerpt::quoted(&name),
        sheaf_core::excerpt::quoted(&page.workflow_id)
    );
    match shared.client.find_execution(&name, &page.workflow_id).await {
        Err(e) => {
            page.error = Some(read_error_of(&e, "workflow_id", &page.workflow_id));
            page.chrome.failed(&e);
            let status = status_of(&e);
            render(status, page)
        }
        Ok(Resolution::Found {
            execution, also_live, ..
        }) => {
            page.found = Some(if also_live.is_empty() {
                format!("The run of {key}: its active run, else the latest that ended.")
            } else {
                format!(
                    "The run of {key}, and {} other live run(s) of the same key on other shards (a misplaced start).",
                    also_live.len()
                )
            });
            page.rows = std::iter::once(execution.as_ref())
                .chain(also_live.iter())
                .map(ExecutionRow::found)
                .collect();
            render(StatusCode::OK, page)
        }
        Ok(Resolution::Absent) => {
            page.found = Some(format!("No shard holds a run of {key}."));
            render(StatusCode::OK, page)
        }
        Ok(Resolution::Indeterminate {
            ended,
            unavailable_shards,
        }) => {
            page.chrome.missing(unavailable_shards.keys());
            page.found = Some(format!(
                "The shards that answered hold {} of {key}; a shard that did not answer may hold its active run.",
                if ended.is_some() { "an ended run" } else { "no run" }
            ));
            page.rows = ended.iter().map(|e| ExecutionRow::found(e)).collect();
            render(StatusCode::OK, page)
        }
    }
}

struct EventRow {
    seq: i64,
    kind: String,
    at: String,
    payload: String,
    /// The task a task event is about, and its page ("" for other events).
    task: String,
    task_page: String,
}

/// The task a task event's payload names.
#[derive(serde::Deserialize)]
struct AboutTask {
    task_id: String,
}

impl EventRow {
    fn of(e: &Event) -> EventRow {
        let kind = e.event_type.to_string();
        let task = kind
            .starts_with("Task")
            .then(|| e.payload.deserialize::<AboutTask>().ok())
            .flatten()
            .and_then(|t| t.task_id.parse::<TaskId>().ok());
        let task_page = match task {
            Some(id) if kind == "TaskDeadLettered" => format!("/dead-letters/{id}"),
            Some(id) => format!("/tasks/{id}"),
            None => String::new(),
        };
        EventRow {
            seq: e.seq,
            at: time(e.created_at),
            payload: cut(e.payload.as_str(), 500),
            task: task.map(|id| id.to_string()).unwrap_or_default(),
            task_page,
            kind,
        }
    }
}

struct ChildRow {
    id: String,
    shard: String,
    workflow: String,
    workflow_id: String,
    state: String,
    created: String,
}

impl ChildRow {
    fn of(c: &Child) -> ChildRow {
        ChildRow {
            id: c.execution_id.to_string(),
            shard: c.shard.to_string(),
            workflow: c.workflow_name.clone(),
            workflow_id: c.workflow_id.clone(),
            state: c.state.map_or("STARTING (relay)", |s| s.as_str()).to_owned(),
            created: time(c.created_at),
        }
    }
}

/// The execution's own fields, as shown.
struct Shown {
    workflow: String,
    workflow_id: String,
    state: &'static str,
    active: bool,
    created: String,
    closed: String,
    input: String,
    result: String,
    error: String,
    concurrency_key: String,
    quota_key: String,
    history_bytes: i64,
}

impl Shown {
    fn of(e: &Execution) -> Shown {
        Shown {
            workflow: e.workflow_name.clone(),
            workflow_id: e.workflow_id.clone(),
            state: e.state.as_str(),
            active: e.state.is_active(),
            created: time(e.created_at),
            closed: e.closed_at.map_or_else(|| "-".into(), time),
            input: cut(e.input.as_str(), SHOWN),
            result: e
                .result
                .as_ref()
                .map_or_else(String::new, |r| cut(r.as_str(), SHOWN)),
            error: e.error.as_deref().map_or_else(String::new, |x| cut(x, SHOWN)),
            concurrency_key: e.concurrency_key.clone().unwrap_or_default(),
            quota_key: e.quota_key.clone().unwrap_or_default(),
            history_bytes: e.history_bytes,
        }
    }
}

/// Where the execution lives: the shard its id names, the one the topology
/// routes it to (after forwards), the one that answered (after moves).
struct Residence {
    origin: String,
    routed: String,
    lives: String,
    moved: bool,
}

#[derive(Template)]
#[template(path = "execution.html")]
struct OnePage {
    chrome: Chrome,
    id: String,
    error: Option<String>,
    execution: Option<Shown>,
    residence: Option<Residence>,
    events: Vec<EventRow>,
    more_events: Option<String>,
    children: Vec<ChildRow>,
    /// The actions its state allows (shown when the dashboard can act).
    offered: Option<Offered>,
}

pages!(OnePage);

pub(super) async fn one(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(raw_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let mut page = OnePage {
        chrome: Chrome::new(&shared, &headers, "executions"),
        id: cut(&raw_id, 64),
        error: None,
        execution: None,
        residence: None,
        events: Vec::new(),
        more_events: None,
        children: Vec::new(),
        offered: None,
    };
    let Ok(id) = raw_id.parse::<ExecutionId>() else {
        page.error = Some("not an execution id".into());
        return render(StatusCode::BAD_REQUEST, page);
    };
    let q = pairs(raw.as_deref().unwrap_or(""));
    let after = match first(&q, "after") {
        "" => 0,
        text => match text.parse::<i64>() {
            Ok(n) if n >= 0 => n,
            _ => {
                page.error = Some("after: expected an event's number".into());
                return render(StatusCode::BAD_REQUEST, page);
            }
        },
    };
    let client = &shared.client;
    let (execution, history, children) = tokio::join!(
        client.get_execution(id),
        client.history(id, after, EVENTS),
        client.children(id)
    );
    let execution = match execution {
        Ok(Some(e)) => e,
        Ok(None) => {
            page.error = Some("no such execution on the shard its id routes to".into());
            return render(StatusCode::NOT_FOUND, page);
        }
        Err(e) => {
            page.error = Some(read_error(&e));
            page.chrome.failed(&e);
            return render(status_of(&e), page);
        }
    };
    let routed = id.route(client.topology());
    page.residence = Some(Residence {
        origin: id.shard().map_or_else(|| "-".into(), |s| s.to_string()),
        routed: routed.to_string(),
        lives: execution.shard.to_string(),
        moved: execution.shard != routed,
    });
    page.execution = Some(Shown::of(&execution));
    page.offered = Some(Offered::of(execution.state));
    match history {
        Ok(h) => {
            page.more_events = h
                .next_after
                .map(|after| format!("/executions/{id}?after={after}"));
            page.events = h.events.iter().map(EventRow::of).collect();
        }
        Err(e) => {
            page.chrome.failed(&e);
            page.error = Some(format!("history: {}", read_error(&e)));
        }
    }
    match children {
        Ok(c) => {
            page.chrome.missing(c.unavailable_shards.keys());
            page.children = c.items.iter().map(ChildRow::of).collect();
        }
        Err(e) => {
            page.chrome.failed(&e);
            page.error = Some(format!("children: {}", read_error(&e)));
        }
    }
    render(StatusCode::OK, page)
}

#[cfg(test)]
mod tests {
    use super::super::form_of as q;
    use super::*;

    #[test]
    fn a_filter_is_read_from_the_form_or_refused_naming_the_field() {
        let f = filter(&q(&[
            ("workflow", "w"),
            ("state", "RUNNING"),
            ("attr", "tenant=acme"),
            ("after", "2026-12-01T00:00:00Z"),
            ("before", "1h"),
        ]))
        .expect("a filter");
        let text = f.filter.to_json().to_string();
        assert!(f.after.is_some() && f.before.is_some());
        assert!(text.contains("\"tenant\"") && text.contains("acme"), "{text}");
        let e = filter(&q(&[("state", "<b>")])).expect_err("refused");
        assert!(e.starts_with("state:"), "{e}");
        let e = filter(&q(&[("attr", "no equals")])).expect_err("refused");
        assert!(e.starts_with("attr:"), "{e}");
        let e = filter(&q(&[("after", "yesterday-ish")])).expect_err("refused");
        assert!(e.starts_with("after:"), "{e}");
        let e = filter(&q(&[("after", "100y")])).expect_err("before 1970");
        assert!(e.starts_with("after:"), "{e}");
        let e = filter(&q(&[("before", "1900-01-01T00:00:00Z")])).expect_err("before 1970");
        assert!(e.starts_with("before:"), "{e}");
        assert!(filter(&q(&[])).is_ok());
    }
}
