//! `/workers`: the workers live on each shard (a heartbeat in the last
//! 60 s) by name (a name filter narrows them), with the queues each serves
//! there and its last heartbeat.

use std::sync::Arc;
use std::time::SystemTime;

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::{Chrome, Shared, age, first, listed, pairs, render, time};

struct WorkerRow {
    name: String,
    shard: String,
    queues: Vec<String>,
    last_seen: String,
    ago: String,
}

#[derive(Template)]
#[template(path = "workers.html")]
struct WorkersPage {
    chrome: Chrome,
    name: String,
    rows: Vec<WorkerRow>,
    more: usize,
}

pages!(WorkersPage);

pub(super) async fn page(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = pairs(raw.as_deref().unwrap_or(""));
    let mut chrome = Chrome::new(&shared, &headers, "workers");
    let name = first(&q, "name").trim().to_owned();
    let report = shared.client.admin().live_workers().await;
    let (shown, more) = listed(&mut chrome, report, |w| &w.worker, |w| w.worker.contains(&name));
    let now = SystemTime::now();
    let rows = shown
        .into_iter()
        .map(|(shard, w)| WorkerRow {
            shard: shard.to_string(),
            last_seen: time(w.last_seen_at),
            // A shard's clock a little ahead of ours reads as just now.
            ago: age(now.duration_since(w.last_seen_at).unwrap_or_default()),
            name: w.worker,
            queues: w.queues,
        })
        .collect();
    render(
        StatusCode::OK,
        WorkersPage {
            chrome,
            name,
            rows,
            more,
        },
    )
}
