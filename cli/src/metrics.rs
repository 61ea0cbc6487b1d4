//! `sheaf metrics serve`: the fleet's `/metrics` for a Prometheus to scrape.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use sheaf_driver::{Client, MetricsServer, MetricsServerOptions};

/// Serves `/metrics` on `listen` until SIGINT or SIGTERM.
pub async fn serve(client: Client, listen: SocketAddr, sample_every: Duration) -> ExitCode {
    let options = MetricsServerOptions {
        sample_every,
        ..MetricsServerOptions::default()
    };
    let server = match MetricsServer::start(Arc::new(client), listen, options).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sheaf: cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The address first, so a script that asked for port 0 learns it.
    println!("serving http://{}/metrics", server.local_addr());
    crate::relay::stopped().await;
    server.shutdown().await;
    ExitCode::SUCCESS
}
