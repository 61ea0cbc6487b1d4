//! `/metrics` over HTTP (feature `http`): the client's series, with the
//! queues, backlogs, snapshots and readiness of every shard sampled when a
//! scrape finds the last sample older than
//! [`MetricsServerOptions::sample_every`], so scraping often costs the
//! shards nothing more; `/health` (the process answers) and `/ready` (every
//! shard is ready) beside it. Used by a [`Worker`] with `metrics_listen` and
//! by `sheaf metrics serve`.
//!
//! [`Worker`]: crate::Worker

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::Client;

/// How the metrics server samples. `MetricsServerOptions::new()` takes
/// the defaults; each setter says what it sets.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MetricsServerOptions {
    pub(crate) sample_every: Duration,
    pub(crate) sample_timeout: Duration,
}

impl MetricsServerOptions {
    /// The defaults (as [`Default`]).
    pub fn new() -> MetricsServerOptions {
        MetricsServerOptions::default()
    }

    /// The shortest time between two samples of the shards' queues
    /// (default 15 s; at least 1 s).
    pub fn sample_every(mut self, sample_every: Duration) -> Self {
        self.sample_every = sample_every;
        self
    }

    /// The longest a sample may take before the scrape is answered with
    /// the last one (default 5 s); also bounds each shard's probe for
    /// `/ready`.
    pub fn sample_timeout(mut self, sample_timeout: Duration) -> Self {
        self.sample_timeout = sample_timeout;
        self
    }
}

impl Default for MetricsServerOptions {
    fn default() -> Self {
        MetricsServerOptions {
            sample_every: Duration::from_secs(15),
            sample_timeout: Duration::from_secs(5),
        }
    }
}

struct Shared {
    client: Arc<Client>,
    options: MetricsServerOptions,
    /// When the last sample was taken; held while one is taken, so
    /// scrapes at once share it.
    last: Mutex<Option<Instant>>,
}

/// A router served on a listener until shut down: the lifecycle the
/// metrics server and the dashboard (`ui`) share.
pub struct Served {
    addr: SocketAddr,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Served {
    /// Serves `app` on `listener`; `what` names it in the log if it stops.
    /// Each request carries its peer's address (`ConnectInfo<SocketAddr>`).
    pub fn spawn(
        listener: tokio::net::TcpListener,
        app: Router,
        what: &'static str,
    ) -> std::io::Result<Served> {
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
                .with_graceful_shutdown(stopped.cancelled_owned());
            if let Err(e) = serve.await {
                tracing::warn!(error = %e, "the {what} stopped");
            }
        });
        Ok(Served {
            addr,
            stop,
            task: Some(task),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and waits until it has.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A running metrics server.
pub struct MetricsServer(Served);

impl MetricsServer {
    /// Serves `GET /metrics`, `GET /health` and `GET /ready` on `listen`
    /// (port 0: any free port, see [`MetricsServer::local_addr`]).
    pub async fn start(
        client: Arc<Client>,
        listen: SocketAddr,
        options: MetricsServerOptions,
    ) -> std::io::Result<MetricsServer> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        MetricsServer::serve(client, listener, options)
    }

    /// [`MetricsServer::start`] on a listener bound already (a [`Worker`]
    /// binds it when it starts, so a taken port fails the start). Must be
    /// called within a tokio runtime.
    ///
    /// [`Worker`]: crate::Worker
    pub fn from_std(
        client: Arc<Client>,
        listener: std::net::TcpListener,
        options: MetricsServerOptions,
    ) -> std::io::Result<MetricsServer> {
        listener.set_nonblocking(true)?;
        MetricsServer::serve(client, tokio::net::TcpListener::from_std(listener)?, options)
    }

    fn serve(
        client: Arc<Client>,
        listener: tokio::net::TcpListener,
        options: MetricsServerOptions,
    ) -> std::io::Result<MetricsServer> {
        let options = MetricsServerOptions {
            sample_every: options.sample_every.max(Duration::from_secs(1)),
            ..options
        };
        let shared = Arc::new(Shared {
            client,
            options,
            last: Mutex::new(None),
        });
        let app = Router::new()
            .route("/metrics", get(metrics))
            .route("/health", get(health))
            .route("/ready", get(ready))
            .with_state(shared);
        Served::spawn(listener, app, "metrics server").map(MetricsServer)
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

async fn metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    {
        let mut last = shared.last.lock().await;
        if last.is_none_or(|at| at.elapsed() >= shared.options.sample_every) {
            let timeout = shared.options.sample_timeout;
            if tokio::time::timeout(timeout, sample(&shared.client, timeout))
                .await
                .is_err()
            {
                tracing::warn!("the sample timed out; the last one is served");
            }
            *last = Some(Instant::now());
        }
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        shared.client.metrics_text(),
    )
}

/// One sample of every shard: its queues, the relay's and the outbox's
/// backlogs, its oldest snapshot, and its readiness (a shard that does not
/// answer keeps its last values, and `sheaf_shard_up` says it is down).
async fn sample(client: &Client, timeout: Duration) {
    let admin = client.admin();
    let backlogs = client.readable_shards().into_iter().map(|shard| async move {
        if let Err(e) = crate::relay::refresh_gauges(client, shard).await {
            tracing::debug!(%shard, error = %e, "backlog sample: shard did not answer");
        }
        match admin.oldest_snapshot(shard).await {
            Ok(age) => client.metrics().oldest_snapshot(shard, age.as_secs_f64()),
            Err(e) => tracing::debug!(%shard, error = %e, "snapshot sample: shard did not answer"),
        }
    });
    let (failed, _, _) = tokio::join!(
        admin.sample_queues(),
        futures::future::join_all(backlogs),
        // Half the sample's bound, so a shard that hangs is found unready
        // within the sample rather than cut off with it.
        admin.fleet_readiness(timeout / 2)
    );
    for (shard, e) in failed {
        tracing::debug!(%shard, error = %e, "queue sample: shard did not answer");
    }
}

/// Liveness: the process answers; no shard is asked.
async fn health() -> impl IntoResponse {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"status":"ok"}"#,
    )
}

/// Readiness: every shard probed now; 503 with each shard's reasons when
/// one is not ready.
async fn ready(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let verdict = shared
        .client
        .admin()
        .fleet_readiness(shared.options.sample_timeout)
        .await;
    let status = StatusCode::from_u16(verdict.http_status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let body = serde_json::to_string(&verdict).unwrap_or_else(|_| r#"{"ready":false}"#.into());
    (status, [(header::CONTENT_TYPE, "application/json")], body)
}
