//! `/rebalance`: each shard's moves in progress (as the source) with their
//! phase, the stalled ones marked, and its latest finished ones.

use std::sync::Arc;
use std::time::SystemTime;

use askama::Template;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::{Chrome, Shared, age, cut, render, time};
use sheaf_driver::{Migration, STALL_AFTER};

/// Moves in progress read per shard.
const OPEN: i32 = 200;
/// Latest moves read per shard.
const RECENT: i32 = 20;

struct MoveRow {
    shard: String,
    id: i64,
    execution: String,
    target: String,
    phase: String,
    attempts: i32,
    error: String,
    actor: String,
    updated: String,
    idle: String,
    stalled: bool,
}

impl MoveRow {
    fn of(m: &Migration, now: SystemTime) -> MoveRow {
        let idle = now.duration_since(m.updated_at).unwrap_or_default();
        MoveRow {
            shard: m.shard.to_string(),
            id: m.id,
            execution: m.execution_id.to_string(),
            target: m.target.to_string(),
            phase: m.phase.to_string(),
            attempts: m.attempts,
            error: m.last_error.as_deref().map(|e| cut(e, 300)).unwrap_or_default(),
            actor: cut(&m.actor, 64),
            updated: time(m.updated_at),
            idle: age(idle),
            // An unfinished move nobody advanced for the grace a worker
            // waits before settling it.
            stalled: !matches!(m.phase.as_str(), "DONE" | "ABORTED") && idle > STALL_AFTER,
        }
    }
}

#[derive(Template)]
#[template(path = "rebalance.html")]
struct RebalancePage {
    chrome: Chrome,
    open: Vec<MoveRow>,
    recent: Vec<MoveRow>,
    stalled: usize,
}

pages!(RebalancePage);

pub(super) async fn page(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let mut chrome = Chrome::new(&shared, &headers, "rebalance");
    let client = &shared.client;
    let (open, recent) = tokio::join!(
        client.fan_out(client.readable_shards(), |shard| client
            .admin()
            .migrations(shard, true, OPEN)),
        client.fan_out(client.readable_shards(), |shard| client
            .admin()
            .migrations(shard, false, RECENT)),
    );
    chrome.missing(open.failed.keys());
    chrome.missing(recent.failed.keys());
    let now = SystemTime::now();
    let rows = |moves: Vec<&Migration>| -> Vec<MoveRow> {
        let mut moves = moves;
        moves.sort_by_key(|m| std::cmp::Reverse(m.updated_at));
        moves.iter().map(|m| MoveRow::of(m, now)).collect()
    };
    let open = rows(open.ok.values().flatten().collect());
    let recent = rows(
        recent
            .ok
            .values()
            .flatten()
            .filter(|m| matches!(m.phase.as_str(), "DONE" | "ABORTED"))
            .collect(),
    );
    render(
        StatusCode::OK,
        RebalancePage {
            stalled: open.iter().filter(|m| m.stalled).count(),
            chrome,
            open,
            recent,
        },
    )
}
