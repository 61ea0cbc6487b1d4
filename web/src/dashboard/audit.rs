//! `/audit`: one shard's audit log (what operators did, and who), newest
//! first, a keyset page at a time, optionally only one actor's or one
//! action's entries. A filtered page reads at most [`SCAN`] entries: when
//! that many hold fewer than a page of matches, its *next* link goes on
//! from the last entry read.

use std::sync::Arc;

use askama::Template;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use sheaf_driver::{ShardId, Topology};

use super::{Chrome, Shared, cut, first, link, pairs, read_error, render, status_of, time};

const PAGE: usize = 50;
/// The most entries a filtered page reads.
const SCAN: usize = 1000;

struct EntryRow {
    id: i64,
    at: String,
    actor: String,
    login: String,
    action: String,
    target: String,
    outcome: String,
    detail: String,
}

#[derive(Template)]
#[template(path = "audit.html")]
struct AuditPage {
    chrome: Chrome,
    shard: String,
    shards: Vec<String>,
    actor: String,
    action: String,
    error: Option<String>,
    rows: Vec<EntryRow>,
    next: Option<String>,
}

pages!(AuditPage);

/// The shard (default: the fleet's default shard) and the entry to read
/// before, from the query; or the 400's message.
fn where_to_read(topology: &Topology, shard: &str, before: &str) -> Result<(ShardId, Option<i64>), String> {
    let shard = if shard.is_empty() {
        topology.default_shard()
    } else {
        match shard.parse::<u32>().ok().and_then(|n| ShardId::new(n).ok()) {
            Some(id) if topology.get(id).is_some() => id,
            _ => {
                return Err(format!(
                    "shard: not a shard of this fleet: {}",
                    sheaf_core::excerpt::quoted(shard)
                ));
            }
        }
    };
    let before = match before {
        "" => None,
        text => match text.parse::<i64>() {
            Ok(id) if id > 0 => Some(id),
            _ => {
                return Err(format!(
                    "before: expected an entry id (a positive number), got {}",
                    sheaf_core::excerpt::quoted(text)
                ));
            }
        },
    };
    Ok((shard, before))
}

pub(super) async fn page(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = pairs(raw.as_deref().unwrap_or(""));
    let topology = shared.client.topology();
    let mut page = AuditPage {
        chrome: Chrome::new(&shared, &headers, "audit log"),
        shard: first(&q, "shard").trim().to_owned(),
        shards: topology.shards().map(|s| s.id.to_string()).collect(),
        actor: first(&q, "actor").trim().to_owned(),
        action: first(&q, "action").trim().to_owned(),
        error: None,
        rows: Vec::new(),
        next: None,
    };
    let (shard, before) = match where_to_read(topology, &page.shard, first(&q, "before")) {
        Ok(at) => at,
        Err(e) => {
            page.error = Some(e);
            return render(StatusCode::BAD_REQUEST, page);
        }
    };
    page.shard = shard.to_string();
    let filtered = !page.actor.is_empty() || !page.action.is_empty();
    let read = if filtered { SCAN } else { PAGE };
    let entries = match shared
        .client
        .admin()
        .audit_log(shard, before, i32::try_from(read).unwrap_or(i32::MAX))
        .await
    {
        Ok(entries) => entries,
        Err(e) => {
            page.error = Some(read_error(&e));
            page.chrome.failed(&e);
            return render(status_of(&e), page);
        }
    };
    let mut last_read = None;
    for e in &entries {
        if page.rows.len() == PAGE {
            break;
        }
        last_read = Some(e.id);
        if (!page.actor.is_empty() && e.actor != page.actor)
            || (!page.action.is_empty() && e.action != page.action)
        {
            continue;
        }
        page.rows.push(EntryRow {
            id: e.id,
            at: time(e.at),
            actor: e.actor.clone(),
            login: e.login.clone(),
            action: e.action.clone(),
            target: e.target.clone().unwrap_or_default(),
            outcome: e.outcome.clone(),
            detail: e
                .detail
                .as_ref()
                .map(|d| cut(&d.to_string(), 300))
                .unwrap_or_default(),
        });
    }
    // More may follow: a full page of matches, or every entry read was
    // looked at.
    let more = page.rows.len() == PAGE || entries.len() == read;
    page.next = last_read.filter(|_| more).map(|id| {
        link(
            "/audit",
            &[
                ("shard", &page.shard),
                ("actor", &page.actor),
                ("action", &page.action),
                ("before", &id.to_string()),
            ],
        )
    });
    render(StatusCode::OK, page)
}
