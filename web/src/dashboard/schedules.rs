//! `/schedules`: every shard's schedules by name (a name filter narrows
//! them), each with its state, fire times and last outcome; one can be
//! paused or resumed (through `/confirm`).

use std::sync::Arc;

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::{Chrome, Shared, cut, first, listed, pairs, render, time};

struct ScheduleRow {
    name: String,
    shard: String,
    paused: bool,
    next_fire: String,
    last_fire: String,
    last_outcome: String,
    last_error: String,
    fires: i64,
    skipped: i64,
    spec: String,
}

#[derive(Template)]
#[template(path = "schedules.html")]
struct SchedulesPage {
    chrome: Chrome,
    name: String,
    state: String,
    error: Option<String>,
    rows: Vec<ScheduleRow>,
    /// Matching schedules not shown (past the page's cap).
    more: usize,
}

pages!(SchedulesPage);

pub(super) async fn page(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = pairs(raw.as_deref().unwrap_or(""));
    let mut page = SchedulesPage {
        chrome: Chrome::new(&shared, &headers, "schedules"),
        name: first(&q, "name").trim().to_owned(),
        state: first(&q, "state").to_owned(),
        error: None,
        rows: Vec::new(),
        more: 0,
    };
    let paused = match page.state.as_str() {
        "" => None,
        "paused" => Some(true),
        "active" => Some(false),
        other => {
            page.error = Some(format!(
                "state: expected paused or active, got {}",
                sheaf_core::excerpt::quoted(other)
            ));
            return render(StatusCode::BAD_REQUEST, page);
        }
    };
    let report = shared.client.admin().list_schedules().await;
    let (shown, more) = listed(
        &mut page.chrome,
        report,
        |s| &s.name,
        |s| s.name.contains(&page.name) && paused.is_none_or(|p| s.paused == p),
    );
    page.more = more;
    page.rows = shown
        .iter()
        .map(|(_, s)| ScheduleRow {
            name: s.name.clone(),
            shard: s.shard.to_string(),
            paused: s.paused,
            next_fire: s.next_fire_at.map(time).unwrap_or_default(),
            last_fire: s.last_fire_at.map(time).unwrap_or_default(),
            last_outcome: s
                .last_outcome
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            last_error: s.last_error.as_deref().map(|e| cut(e, 300)).unwrap_or_default(),
            fires: s.fires,
            skipped: s.skipped,
            spec: cut(&s.spec.to_string(), 300),
        })
        .collect();
    render(StatusCode::OK, page)
}
