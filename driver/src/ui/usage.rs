//! `/usage`: the usage report (`Client::usage_report`) for a chosen window
//! and grouping, merged across shards.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::{Chrome, Shared, cut, first, pairs, read_error, render};
use crate::client::GroupBy;

/// The windows offered, ending now.
const WINDOWS: [(&str, u64); 4] = [
    ("1h", 3600),
    ("24h", 86_400),
    ("7d", 7 * 86_400),
    ("30d", 30 * 86_400),
];

struct UsageRow {
    group: String,
    starts: i64,
    completed: i64,
    failed: i64,
    cancelled: i64,
    timed_out: i64,
    activities: i64,
    activities_failed: i64,
    compute: String,
    metered: String,
}

#[derive(Template)]
#[template(path = "usage.html")]
struct UsagePage {
    chrome: Chrome,
    window: String,
    windows: Vec<&'static str>,
    attr: String,
    error: Option<String>,
    rows: Vec<UsageRow>,
}

pages!(UsagePage);

pub(super) async fn page(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = pairs(raw.as_deref().unwrap_or(""));
    let chosen = first(&q, "window");
    let (window, secs) = WINDOWS
        .iter()
        .find(|(w, _)| *w == chosen)
        .copied()
        .unwrap_or(WINDOWS[1]);
    let mut page = UsagePage {
        chrome: Chrome::new(&shared, &headers, "usage"),
        window: window.to_owned(),
        windows: WINDOWS.iter().map(|(w, _)| *w).collect(),
        attr: first(&q, "attr").trim().to_owned(),
        error: None,
        rows: Vec::new(),
    };
    let group = if page.attr.is_empty() {
        GroupBy::WorkflowName
    } else {
        GroupBy::SearchAttr(page.attr.clone())
    };
    let to = SystemTime::now();
    let from = to - Duration::from_secs(secs);
    match shared.client.usage_report(from, to, &group).await {
        Err(e) => {
            page.error = Some(read_error(&e));
            render(StatusCode::BAD_REQUEST, page)
        }
        Ok(report) => {
            page.chrome.missing(report.unavailable_shards.keys());
            page.rows = report
                .groups
                .iter()
                .map(|(g, u)| UsageRow {
                    group: cut(g, 200),
                    starts: u.workflow_starts,
                    completed: u.completed,
                    failed: u.failed,
                    cancelled: u.cancelled,
                    timed_out: u.timed_out,
                    activities: u.activity_executions,
                    activities_failed: u.activity_executions_failed,
                    compute: format!("{:.1}", u.activity_compute_seconds),
                    metered: cut(
                        &u.metered
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(", "),
                        300,
                    ),
                })
                .collect();
            render(StatusCode::OK, page)
        }
    }
}
