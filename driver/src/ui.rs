//! The fleet dashboard (feature `ui`; `sheaf ui`): pages rendered on the
//! server from the client's bounded fan-out reads, escaped by the templates
//! (`driver/templates`), with no script. A page names a shard that did not
//! answer in its partial banner, and never shows a connection string.
//!
//! Pages: `/` the fleet (every shard's reachability, breaker, roles,
//! schema, published digests, live workers, stranded work, relay and outbox
//! backlog), `/queues` (every queue's counts per shard and in total),
//! `/executions` (the merged list across shards, filtered by workflow and
//! state, a keyset page at a time).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use askama::Template;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;

use crate::breaker::BreakerState;
use crate::client::{Client, ExecutionFilter, QueueCounts, SortOrder};
use crate::metrics_http::Served;
use crate::status::topology_status;

/// How the dashboard reads the fleet.
#[derive(Debug, Clone)]
pub struct UiOptions {
    /// The longest a shard's probe may take on the fleet page (default 3 s).
    pub probe_timeout: Duration,
}

impl Default for UiOptions {
    fn default() -> Self {
        UiOptions {
            probe_timeout: Duration::from_secs(3),
        }
    }
}

struct Shared {
    client: Arc<Client>,
    options: UiOptions,
}

/// A running dashboard.
pub struct UiServer(Served);

impl UiServer {
    /// Serves the dashboard on `listen` (port 0: any free port, see
    /// [`UiServer::local_addr`]).
    pub async fn start(
        client: Arc<Client>,
        listen: SocketAddr,
        options: UiOptions,
    ) -> std::io::Result<UiServer> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let shared = Arc::new(Shared { client, options });
        let app = Router::new()
            .route("/", get(fleet))
            .route("/queues", get(queues))
            .route("/executions", get(executions))
            .with_state(shared);
        Served::spawn(listener, app, "dashboard").map(UiServer)
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.0.local_addr()
    }

    /// Stops serving and waits until it has.
    pub async fn shutdown(self) {
        self.0.shutdown().await;
    }
}

/// A rendered page, or a plain 500 naming the template error (never data).
fn page(rendered: Result<String, askama::Error>) -> Response {
    match rendered {
        Ok(html) => (
            [
                (header::CACHE_CONTROL, "no-store"),
                (
                    header::HeaderName::from_static("x-content-type-options"),
                    "nosniff",
                ),
                (
                    header::CONTENT_SECURITY_POLICY,
                    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'",
                ),
            ],
            Html(html),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the page could not be rendered: {e}"),
        )
            .into_response(),
    }
}

fn ms(since: Instant) -> String {
    format!("{:.1}", since.elapsed().as_secs_f64() * 1000.0)
}

/// One shard's row of the fleet page.
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
    problem: String,
}

#[derive(Template)]
#[template(path = "fleet.html")]
struct FleetPage {
    title: &'static str,
    page: &'static str,
    unavailable: Vec<String>,
    rendered_ms: String,
    schema_version: String,
    digest: String,
    shards: Vec<ShardRow>,
}

async fn fleet(State(shared): State<Arc<Shared>>) -> Response {
    let began = Instant::now();
    let client = &shared.client;
    let status = topology_status(client.topology(), client.pools(), shared.options.probe_timeout).await;
    let unavailable = status
        .shards
        .iter()
        .filter(|s| !s.probe.reachable)
        .map(|s| s.probe.shard.to_string())
        .collect();
    let shards = status
        .shards
        .iter()
        .map(|s| ShardRow {
            id: s.probe.shard.to_string(),
            reachable: s.probe.reachable,
            breaker: match s.breaker {
                BreakerState::Closed => "closed",
                BreakerState::Open => "open",
                BreakerState::HalfOpen => "half-open",
            },
            roles: s.roles(),
            schema: s.probe.schema_version.clone().unwrap_or_else(|| "-".into()),
            parity: s.schema_parity,
            server: s.probe.server_version.clone().unwrap_or_else(|| "-".into()),
            digests: s.probe.accepted_digests.clone(),
            workers: s.probe.live_workers.len(),
            stranded: s.stranded_ready(),
            relay_children: s.probe.relay.as_ref().map_or(0, |r| r.children),
            outbox: s.probe.relay.as_ref().map_or(0, |r| r.outbox),
            problem: s.probe.problem.clone().unwrap_or_default(),
        })
        .collect();
    let mut p = FleetPage {
        title: "fleet",
        page: "fleet",
        unavailable,
        rendered_ms: String::new(),
        schema_version: status.schema_version.clone().unwrap_or_else(|| "-".into()),
        digest: client.topology().digest(),
        shards,
    };
    p.rendered_ms = ms(began);
    page(p.render())
}

/// One row of a queue: a shard's counts, or the total (`shard` "all").
struct CountsRow {
    shard: String,
    ready: i64,
    scheduled: i64,
    running: i64,
    waiting: i64,
    paused: i64,
    dead: i64,
    oldest_ready: String,
}

impl CountsRow {
    fn new(shard: String, c: &QueueCounts) -> CountsRow {
        CountsRow {
            shard,
            ready: c.ready,
            scheduled: c.scheduled,
            running: c.running,
            waiting: c.waiting,
            paused: c.paused,
            dead: c.dead,
            oldest_ready: c.oldest_ready_age.map_or_else(
                || "-".into(),
                |d| humantime::format_duration(Duration::from_secs(d.as_secs())).to_string(),
            ),
        }
    }
}

struct QueueRows {
    name: String,
    rows: Vec<CountsRow>,
}

#[derive(Template)]
#[template(path = "queues.html")]
struct QueuesPage {
    title: &'static str,
    page: &'static str,
    unavailable: Vec<String>,
    rendered_ms: String,
    queues: Vec<QueueRows>,
}

async fn queues(State(shared): State<Arc<Shared>>) -> Response {
    let began = Instant::now();
    let listing = shared.client.list_queues().await;
    let queues = listing
        .queues
        .iter()
        .map(|q| {
            let mut rows: Vec<CountsRow> = q
                .per_shard
                .iter()
                .map(|(shard, c)| CountsRow::new(shard.to_string(), c))
                .collect();
            rows.push(CountsRow::new("all".into(), &q.total));
            QueueRows {
                name: q.queue.clone(),
                rows,
            }
        })
        .collect();
    let mut p = QueuesPage {
        title: "queues",
        page: "queues",
        unavailable: listing
            .unavailable_shards
            .keys()
            .map(ToString::to_string)
            .collect(),
        rendered_ms: String::new(),
        queues,
    };
    p.rendered_ms = ms(began);
    page(p.render())
}

/// Executions per page.
const EXECUTIONS_PAGE: usize = 50;

/// The executions page's query: its filter and where to go on from.
#[derive(Debug, Default, serde::Deserialize)]
struct ExecutionsQuery {
    #[serde(default)]
    workflow: String,
    #[serde(default)]
    state: String,
    cursor: Option<String>,
}

struct ExecutionRow {
    id: String,
    shard: String,
    workflow: String,
    workflow_id: String,
    state: &'static str,
    created: String,
    closed: String,
    attrs: String,
}

#[derive(Template)]
#[template(path = "executions.html")]
struct ExecutionsPage {
    title: &'static str,
    page: &'static str,
    unavailable: Vec<String>,
    rendered_ms: String,
    workflow: String,
    state: String,
    states: Vec<String>,
    error: Option<String>,
    rows: Vec<ExecutionRow>,
    next: Option<String>,
}

fn time(at: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

async fn executions(State(shared): State<Arc<Shared>>, Query(q): Query<ExecutionsQuery>) -> Response {
    let began = Instant::now();
    let mut filter = ExecutionFilter::new();
    if !q.workflow.is_empty() {
        filter = filter.workflows([q.workflow.clone()]);
    }
    let mut error = None;
    if !q.state.is_empty() {
        match q.state.parse::<sheaf_core::state::ExecutionState>() {
            Ok(s) => filter = filter.states([s]),
            Err(_) => error = Some(format!("unknown state {}", sheaf_core::excerpt::quoted(&q.state))),
        }
    }
    let listed = match error {
        Some(_) => None,
        None => match shared
            .client
            .list_executions(&filter, q.cursor.as_deref(), EXECUTIONS_PAGE, SortOrder::Desc)
            .await
        {
            Ok(p) => Some(p),
            Err(e) => {
                error = Some(e.to_string());
                None
            }
        },
    };
    let (rows, next, unavailable) = match listed {
        None => (Vec::new(), None, Vec::new()),
        Some(p) => {
            let next = p.next_cursor.as_ref().map(|c| {
                let query = form_urlencoded::Serializer::new(String::new())
                    .append_pair("workflow", &q.workflow)
                    .append_pair("state", &q.state)
                    .append_pair("cursor", c)
                    .finish();
                format!("/executions?{query}")
            });
            let rows = p
                .items
                .iter()
                .map(|e| ExecutionRow {
                    id: e.execution_id.to_string(),
                    shard: e.shard.to_string(),
                    workflow: e.workflow_name.clone(),
                    workflow_id: e.workflow_id.clone(),
                    state: e.state.as_str(),
                    created: time(e.created_at),
                    closed: e.closed_at.map_or_else(|| "-".into(), time),
                    attrs: e.search_attrs.as_str().to_owned(),
                })
                .collect();
            let unavailable = p.unavailable_shards.keys().map(ToString::to_string).collect();
            (rows, next, unavailable)
        }
    };
    let mut p = ExecutionsPage {
        title: "executions",
        page: "executions",
        unavailable,
        rendered_ms: String::new(),
        workflow: q.workflow,
        state: q.state,
        states: sheaf_core::state::ExecutionState::ALL
            .iter()
            .map(|s| s.as_str().to_owned())
            .collect(),
        error,
        rows,
        next,
    };
    p.rendered_ms = ms(began);
    page(p.render())
}
