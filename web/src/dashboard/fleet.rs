//! `/`: every shard's reachability, breaker, roles, schema, published
//! digests, live workers, stranded work, relay and outbox backlog, and its
//! readiness with the reasons a degraded shard is held back (as `sheaf
//! shard health` gives them).

use std::sync::Arc;

use askama::Template;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::{Chrome, Shared, render};

/// One shard's row.
struct ShardRow {
    id: String,
    reachable: bool,
    breaker: &'static str,
    roles: String,
    schema: String,
    parity: bool,
    server: String,
    digests: Vec<String>,
    workers: usize,
    stranded: i64,
    relay_children: i64,
    outbox: i64,
    ready: bool,
    /// Each reason it is not ready: its code and what the probe said.
    reasons: Vec<(&'static str, String)>,
}

#[derive(Template)]
#[template(path = "fleet.html")]
struct FleetPage {
    chrome: Chrome,
    schema_version: String,
    digest: String,
    shards: Vec<ShardRow>,
}

pages!(FleetPage);

pub(super) async fn page(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let mut chrome = Chrome::new(&shared, &headers, "fleet");
    chrome.refreshing(shared.options.refresh_every, &headers, "/", None);
    let client = &shared.client;
    let digest = client.topology().digest();
    let (status, verdicts) = client.admin().fleet_health(shared.options.probe_timeout).await;
    chrome.missing(
        status
            .shards
            .iter()
            .filter(|s| !s.probe.reachable)
            .map(|s| &s.probe.shard),
    );
    let shards = status
        .shards
        .iter()
        .zip(&verdicts)
        .map(|(s, verdict)| ShardRow {
            id: s.probe.shard.to_string(),
            reachable: s.probe.reachable,
            breaker: s.breaker.as_str(),
            roles: s.roles(),
            schema: s.probe.schema_version.clone().unwrap_or_else(|| "-".into()),
            parity: s.schema_parity,
            server: s.probe.server_version.clone().unwrap_or_else(|| "-".into()),
            digests: s.probe.accepted_digests.clone(),
            workers: s.probe.live_workers.len(),
            stranded: s.stranded_ready(),
            relay_children: s.probe.relay.as_ref().map_or(0, |r| r.children),
            outbox: s.probe.relay.as_ref().map_or(0, |r| r.outbox),
            ready: verdict.ready,
            reasons: verdict
                .reason_codes
                .iter()
                .map(|r| r.code())
                .zip(verdict.details.iter().cloned())
                .collect(),
        })
        .collect();
    render(
        StatusCode::OK,
        FleetPage {
            chrome,
            schema_version: status.schema_version.clone().unwrap_or_else(|| "-".into()),
            digest,
            shards,
        },
    )
}
