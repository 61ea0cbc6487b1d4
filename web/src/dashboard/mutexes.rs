//! `/mutexes`: the held mutexes of every shard by key (a keyset page at a
//! time), each with its holder, fencing token, lease and waiters.

use std::sync::Arc;

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::{Chrome, Shared, first, link, pairs, read_error_of, render, status_of, time};

const PAGE: usize = 50;

struct MutexRow {
    key: String,
    shard: String,
    holder: String,
    token: i64,
    acquired: String,
    lease_ends: String,
    expired: bool,
    waiters: i32,
}

#[derive(Template)]
#[template(path = "mutexes.html")]
struct MutexesPage {
    chrome: Chrome,
    error: Option<String>,
    rows: Vec<MutexRow>,
    next: Option<String>,
}

pages!(MutexesPage);

pub(super) async fn page(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = pairs(raw.as_deref().unwrap_or(""));
    let cursor = Some(first(&q, "cursor")).filter(|c| !c.is_empty());
    let mut page = MutexesPage {
        chrome: Chrome::new(&shared, &headers, "mutexes"),
        error: None,
        rows: Vec::new(),
        next: None,
    };
    match shared.client.admin().list_mutexes(cursor, PAGE).await {
        Err(e) => {
            page.error = Some(read_error_of(&e, "cursor", cursor.unwrap_or("")));
            page.chrome.failed(&e);
            render(status_of(&e), page)
        }
        Ok(p) => {
            page.chrome.missing(p.unavailable_shards.keys());
            page.next = p.next_cursor.as_ref().map(|c| link("/mutexes", &[("cursor", c)]));
            let now = std::time::SystemTime::now();
            page.rows = p
                .items
                .into_iter()
                .map(|m| MutexRow {
                    shard: m.shard.to_string(),
                    holder: m.holder.to_string(),
                    token: m.token,
                    acquired: time(m.acquired_at),
                    lease_ends: time(m.lease_expires_at),
                    expired: m.lease_expires_at <= now,
                    waiters: m.waiters,
                    key: m.key,
                })
                .collect();
            render(StatusCode::OK, page)
        }
    }
}
