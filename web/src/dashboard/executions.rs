//! `/executions`: the merged list across shards, filtered by workflow,
//! state, a search attribute and a creation window, a keyset page at a
//! time; `/executions/{id}`: an execution with its history, children (and
//! their shards) and where it lives.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use askama::Template;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::runs::Offered;
use super::{Chrome, Shared, cut, first, link, pairs, read_error, read_error_of, render, status_of, time};
use sheaf_core::state::ExecutionState;
use sheaf_driver::ExecutionId;
use sheaf_driver::{AttrOp, Child, Event, Execution, ExecutionFilter, SortOrder, attr_equality};

/// Executions per page.
const PAGE: usize = 50;
/// History events per page of an execution.
const EVENTS: usize = 100;
/// Why a visitor who is not signed in may not filter by attribute.
const SIGNED_IN: &str = "attr: filtering by a search attribute needs a signed-in session";
/// The most characters of a payload, result or error shown.
const SHOWN: usize = 2000;

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

#[derive(Template)]
#[template(path = "executions.html")]
struct ListPage {
    chrome: Chrome,
    workflow: String,
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
    if !state.is_empty() {
        let s = state
            .parse::<ExecutionState>()
            .map_err(|_| format!("state: unknown state {}", sheaf_core::excerpt::quoted(state)))?;
        f = f.states([s]);
    }
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
        filter: f,
        after,
        before,
    })
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
    let listed = shared
        .client
        .list_executions(&filtered.filter, cursor, PAGE, SortOrder::Desc)
        .await;
    let status = match listed {
        Err(e) => {
            page.error = Some(read_error_of(&e, "cursor", cursor.unwrap_or("")));
            page.chrome.failed(&e);
            status_of(&e)
        }
        Ok(p) => {
            page.chrome.missing(p.unavailable_shards.keys());
            let (after, before) = (exact(filtered.after), exact(filtered.before));
            page.next = p.next_cursor.as_ref().map(|c| {
                link(
                    "/executions",
                    &[
                        ("workflow", &page.workflow),
                        ("state", &page.state),
                        ("attr", &page.attr),
                        ("after", &after),
                        ("before", &before),
                        ("cursor", c),
                    ],
                )
            });
            page.rows = p
                .items
                .iter()
                .map(|e| ExecutionRow {
                    id: e.execution_id.to_string(),
                    shard: e.shard.to_string(),
                    workflow: e.workflow_name.clone(),
                    workflow_id: e.workflow_id.clone(),
                    state: e.state.as_str(),
                    created: time(e.created_at),
                    closed: e.closed_at.map_or_else(|| "-".into(), time),
                    attrs: cut(e.search_attrs.as_str(), 300),
                })
                .collect();
            StatusCode::OK
        }
    };
    render(status, page)
}

struct EventRow {
    seq: i64,
    kind: String,
    at: String,
    payload: String,
}

impl EventRow {
    fn of(e: &Event) -> EventRow {
        EventRow {
            seq: e.seq,
            kind: e.event_type.to_string(),
            at: time(e.created_at),
            payload: cut(e.payload.as_str(), 500),
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
