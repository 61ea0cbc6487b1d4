//! `/rate-limits`: each shard's declared rate limits by name (a name
//! filter narrows them), with their pace, any live pacing override, and
//! their buckets and waiting units on that shard (a bucket is shard-local).

use std::sync::Arc;

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::{Chrome, Shared, first, listed, pairs, render, time};

struct LimitRow {
    name: String,
    shard: String,
    rate: String,
    period: String,
    burst: String,
    key: String,
    /// `rate per period until when`, or "".
    pace_override: String,
    buckets: i64,
    waiting: i64,
}

#[derive(Template)]
#[template(path = "rate_limits.html")]
struct RateLimitsPage {
    chrome: Chrome,
    name: String,
    rows: Vec<LimitRow>,
    more: usize,
}

pages!(RateLimitsPage);

pub(super) async fn page(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = pairs(raw.as_deref().unwrap_or(""));
    let mut chrome = Chrome::new(&shared, &headers, "rate limits");
    let name = first(&q, "name").trim().to_owned();
    let report = shared.client.admin().rate_limits().await;
    let (shown, more) = listed(&mut chrome, report, |l| &l.name, |l| l.name.contains(&name));
    let rows = shown
        .iter()
        .map(|(shard, l)| {
            let spec = l.spec.to_value().unwrap_or_default();
            let field = |k: &str| match &spec[k] {
                serde_json::Value::Null => String::new(),
                serde_json::Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            LimitRow {
                name: l.name.clone(),
                shard: shard.to_string(),
                rate: field("rate"),
                period: field("period"),
                burst: field("burst"),
                key: field("key"),
                pace_override: l
                    .override_pace
                    .map(|(rate, period, until)| {
                        format!("{rate} per {} until {}", super::age(period), time(until))
                    })
                    .unwrap_or_default(),
                buckets: l.buckets,
                waiting: l.waiting,
            }
        })
        .collect();
    render(
        StatusCode::OK,
        RateLimitsPage {
            chrome,
            name,
            rows,
            more,
        },
    )
}
