//! `/dead-letters`: the merged list of dead letters (newest first, a
//! keyset page at a time) with their errors; the selected ones can be
//! redriven, a queue's purged (both through `/confirm`).

use std::sync::Arc;

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::{Chrome, Shared, cut, first, link, pairs, read_error_of, render, status_of, time};

const PAGE: usize = 50;

struct DeadRow {
    id: String,
    shard: String,
    queue: String,
    kind: String,
    attempts: String,
    execution: String,
    error: String,
    dead_at: String,
}

#[derive(Template)]
#[template(path = "dead_letters.html")]
struct DeadLettersPage {
    chrome: Chrome,
    queue: String,
    error: Option<String>,
    rows: Vec<DeadRow>,
    next: Option<String>,
}

pages!(DeadLettersPage);

pub(super) async fn page(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = pairs(raw.as_deref().unwrap_or(""));
    let queue = first(&q, "queue").trim().to_owned();
    let cursor = Some(first(&q, "cursor")).filter(|c| !c.is_empty());
    let mut page = DeadLettersPage {
        chrome: Chrome::new(&shared, &headers, "dead letters"),
        queue,
        error: None,
        rows: Vec::new(),
        next: None,
    };
    page.chrome.refreshing(
        shared.options.refresh_every,
        &headers,
        "/dead-letters",
        raw.as_deref(),
    );
    let listed = shared
        .client
        .admin()
        .list_dead_letters(Some(page.queue.as_str()).filter(|q| !q.is_empty()), cursor, PAGE)
        .await;
    match listed {
        Err(e) => {
            page.error = Some(read_error_of(&e, "cursor", cursor.unwrap_or("")));
            page.chrome.failed(&e);
            return render(status_of(&e), page);
        }
        Ok(p) => {
            page.chrome.missing(p.unavailable_shards.keys());
            page.next = p
                .next_cursor
                .as_ref()
                .map(|c| link("/dead-letters", &[("queue", &page.queue), ("cursor", c)]));
            page.rows = p
                .items
                .iter()
                .map(|d| DeadRow {
                    id: d.task_id.to_string(),
                    shard: d.shard.to_string(),
                    queue: d.queue.clone(),
                    kind: d.kind.to_string(),
                    attempts: format!("{}/{}", d.attempts, d.max_attempts),
                    execution: d.execution_id.map(|e| e.to_string()).unwrap_or_default(),
                    error: d.last_error.as_deref().map(|e| cut(e, 400)).unwrap_or_default(),
                    dead_at: time(d.dead_at),
                })
                .collect();
        }
    }
    render(StatusCode::OK, page)
}
