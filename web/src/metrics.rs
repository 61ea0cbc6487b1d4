//! `/metrics` of `sheaf serve`: the client's metrics in the Prometheus text
//! format, the queues sampled at a scrape when the last sample is older
//! than [`SAMPLE_EVERY`] (as `sheaf metrics serve` does), so the dashboard's
//! process is scraped like the others.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use sheaf_driver::Client;
use tokio::sync::Mutex;

/// The oldest queue sample a scrape is answered with.
const SAMPLE_EVERY: Duration = Duration::from_secs(15);
/// The longest a scrape waits for a fresh sample.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(10);

struct Sampled {
    client: Arc<Client>,
    /// When the last sample was taken; held while one is taken.
    last: Mutex<Option<Instant>>,
}

pub(crate) fn routes(client: Arc<Client>) -> Router {
    let sampled = Arc::new(Sampled {
        client,
        last: Mutex::new(None),
    });
    Router::new().route(
        "/metrics",
        get(move || {
            let sampled = sampled.clone();
            async move { scrape(&sampled).await }
        }),
    )
}

async fn scrape(sampled: &Sampled) -> axum::response::Response {
    {
        let mut last = sampled.last.lock().await;
        if last.is_none_or(|at| at.elapsed() >= SAMPLE_EVERY) {
            // A shard that does not answer keeps its last sample (and
            // `sheaf_shard_up` says so); a slow one is not waited for.
            let _ = tokio::time::timeout(SAMPLE_TIMEOUT, sampled.client.admin().sample_queues()).await;
            *last = Some(Instant::now());
        }
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        sampled.client.metrics_text(),
    )
        .into_response()
}
