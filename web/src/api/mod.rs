//! The HTTP JSON API under `/api/v1` (docs/operating/api.md): each call a
//! thin layer over a [`Client`] or [`sheaf_driver::Admin`] call, behind a
//! bearer token of the read or the act scope (`auth`), refusing with
//! `{"error": {"code", "sqlstate", "message"}}` (`error`). Its OpenAPI
//! document comes from the same annotations as its routes
//! (`/api/v1/openapi.json`).

mod auth;
mod error;
mod executions;
mod fleet;
mod tasks;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Json;
use axum::body::Bytes;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use sheaf_driver::{Client, ExecutionId, PageStatus, ShardId, TaskId};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;

pub(crate) use auth::Tokens;
use error::ApiError;

/// What every call reads: the clients, the tokens, the report gate.
pub(crate) struct ApiState {
    /// For reads.
    client: Arc<Client>,
    /// For actions: the same shards, recorded as actor `api` in their
    /// audit logs.
    acting: Arc<Client>,
    tokens: Tokens,
    probe_timeout: Duration,
    reports: fleet::Reports,
}

impl ApiState {
    pub(crate) fn new(
        client: Arc<Client>,
        tokens: Tokens,
        probe_timeout: Duration,
    ) -> Result<ApiState, sheaf_driver::ShardError> {
        let options = client
            .admin()
            .pools()
            .options()
            .clone()
            .actor(Some("api".to_owned()));
        let acting = Arc::new(Client::new(client.topology().clone(), options)?);
        Ok(ApiState {
            client,
            acting,
            tokens,
            probe_timeout,
            reports: fleet::Reports::default(),
        })
    }
}

/// The API's routes and its OpenAPI document, from one place.
pub(crate) fn routes(state: Arc<ApiState>) -> (axum::Router, utoipa::openapi::OpenApi) {
    let (router, doc) = OpenApiRouter::new()
        .merge(executions::routes())
        .merge(tasks::routes())
        .merge(fleet::routes())
        .with_state(state)
        .split_for_parts();
    let doc = described(doc);
    let served = Arc::new(doc.clone());
    let router = router.route(
        "/api/v1/openapi.json",
        axum::routing::get(move || {
            let doc = served.clone();
            async move { ok(doc.as_ref()) }
        }),
    );
    (router, doc)
}

/// The document's title, version, description and bearer scheme.
fn described(mut doc: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    doc.info.title = "sheaf API".to_owned();
    doc.info.version = "1".to_owned();
    doc.info.description = Some(
        "The sheaf fleet's HTTP JSON API (docs/operating/api.md). Every /api/v1 call takes \
         `Authorization: Bearer <token>`: a read-scope token reads, an act-scope token also acts."
            .to_owned(),
    );
    doc.components
        .get_or_insert_with(Default::default)
        .add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    doc
}

/// A query string's pairs, each looked up by name; a malformed value is a
/// 400 naming the parameter.
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    fn parse(raw: Option<&str>) -> Query {
        Query(crate::dashboard::pairs(raw.unwrap_or("")))
    }

    /// The parameter's value, if given (an empty value counts as not given).
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| v.as_str())
    }

    /// A page size from 1 to `max` (default `default`).
    fn page_size(&self, default: usize, max: usize) -> Result<usize, ApiError> {
        match self.get("page_size") {
            None => Ok(default),
            Some(text) => match text.parse::<usize>() {
                Ok(n) if (1..=max).contains(&n) => Ok(n),
                _ => Err(ApiError::bad("page_size", format!("must be from 1 to {max}"))),
            },
        }
    }

    /// A timestamp (RFC 3339).
    fn time(&self, name: &str) -> Result<Option<SystemTime>, ApiError> {
        self.get(name).map(|text| time_param(name, text)).transpose()
    }

    /// Any other value that parses.
    fn parsed<T: std::str::FromStr>(&self, name: &str, what: &str) -> Result<Option<T>, ApiError> {
        self.get(name)
            .map(|text| {
                text.parse::<T>()
                    .map_err(|_| ApiError::bad(name, format!("not {what}")))
            })
            .transpose()
    }
}

/// An RFC 3339 timestamp from 1970 on, or a 400 naming `name`.
fn time_param(name: &str, text: &str) -> Result<SystemTime, ApiError> {
    humantime::parse_rfc3339_weak(text)
        .map_err(|_| ApiError::bad(name, "not an RFC 3339 timestamp (e.g. 2026-01-31T12:00:00Z)"))
}

/// A duration (`90s`, `10m`, `2h`), or a 400 naming `name`.
fn duration_param(name: &str, text: &str) -> Result<Duration, ApiError> {
    humantime::parse_duration(text).map_err(|_| ApiError::bad(name, "not a duration (e.g. 90s, 10m, 2h)"))
}

/// A JSON body read as `T`; unreadable JSON is a 400 naming `body`, a
/// missing or mistyped field one naming the field.
fn body<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, ApiError> {
    let raw: &[u8] = if bytes.is_empty() { b"{}" } else { bytes };
    serde_json::from_slice(raw).map_err(|e| ApiError::bad("body", e))
}

fn execution_id(text: &str) -> Result<ExecutionId, ApiError> {
    text.parse()
        .map_err(|_| ApiError::bad("id", "not an execution id"))
}

fn task_id(text: &str) -> Result<TaskId, ApiError> {
    text.parse().map_err(|_| ApiError::bad("id", "not a task id"))
}

/// A time as the API writes it: RFC 3339, UTC, to the millisecond.
fn time(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// Whether a fleet-wide answer is whole: `partial` with the number of
/// shards that did not answer (which ones is the fleet page's business).
#[derive(serde::Serialize, utoipa::ToSchema)]
pub(crate) struct Completeness {
    /// Some shard did not answer: the answer lacks what it holds.
    partial: bool,
    /// How many shards did not answer.
    unavailable_shards: usize,
}

impl Completeness {
    fn of<T>(failed: &std::collections::BTreeMap<ShardId, T>) -> Completeness {
        Completeness {
            partial: !failed.is_empty(),
            unavailable_shards: failed.len(),
        }
    }

    fn of_page<T>(status: PageStatus, failed: &std::collections::BTreeMap<ShardId, T>) -> Completeness {
        Completeness {
            partial: status != PageStatus::Complete,
            unavailable_shards: failed.len(),
        }
    }
}

/// A JSON answer, never cached.
fn ok<T: serde::Serialize>(value: T) -> Response {
    ([(header::CACHE_CONTROL, "no-store")], Json(value)).into_response()
}

impl ApiState {
    /// A fleet-wide read of which `unavailable` shards did not answer is a
    /// 503 when none did (an empty page from the shards that did answer is
    /// an answer).
    fn some_answered(&self, unavailable: usize) -> Result<(), ApiError> {
        if unavailable >= self.client.readable_shards().len() {
            return Err(ApiError::unavailable("no shard answered; retry later"));
        }
        Ok(())
    }
}

/// A fleet-wide read that no shard answered is a 503, not an empty answer.
fn any_answered<T>(report: &sheaf_driver::FleetReport<T>) -> Result<(), ApiError> {
    if report.ok.is_empty() && !report.failed.is_empty() {
        return Err(ApiError::unavailable("no shard answered; retry later"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// A route added with `routes!` is in the document by construction; one
    /// added with a plain `.route(` is not: only the document's own may be.
    #[test]
    fn every_route_is_documented() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/api");
        let mut plain = Vec::new();
        for entry in std::fs::read_dir(dir).expect("the api sources") {
            let path = entry.expect("an entry").path();
            let text = std::fs::read_to_string(&path).expect("a source file");
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for (i, _) in code.match_indices(".route(") {
                let call = code[i..].split(',').next().unwrap_or_default();
                plain.push(call.split_whitespace().collect::<String>());
            }
        }
        assert_eq!(plain, [".route(\"/api/v1/openapi.json\""], "undocumented routes");
    }
}
