//! `sheaf metrics serve`: the fleet's `/metrics` for a Prometheus to scrape.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sheaf_driver::{MetricsServer, MetricsServerOptions};

use super::Context;
use crate::exit::{self, Exit};
use crate::output::serving;

/// Serve the fleet's metrics over HTTP (`/metrics`, Prometheus text):
/// per shard reachability, readiness, breaker, requests, backlogs and
/// oldest snapshot, and per shard and queue its tasks by state and oldest
/// ready age, sampled at most every --sample-every. Also `/health` (200
/// while it runs) and `/ready` (200 when every shard is ready, else 503
/// with the reasons as JSON). Runs until SIGINT or SIGTERM.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Listen on ADDR (127.0.0.1:9464; port 0 takes any free port, printed).
    Serve {
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1:9464")]
        listen: SocketAddr,
        /// The shortest time between two samples of the shards' queues.
        #[arg(long, default_value = "15s", value_parser = crate::parse::duration)]
        sample_every: Duration,
    },
}

/// Serves `/metrics` on `listen` until SIGINT or SIGTERM.
pub async fn run(args: Args, ctx: &Context) -> Exit {
    let Action::Serve { listen, sample_every } = args.what;
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let options = MetricsServerOptions::default().sample_every(sample_every);
    let server = match MetricsServer::start(Arc::new(client), listen, options).await {
        Ok(s) => s,
        Err(e) => {
            return exit::fail(Exit::Failed, format!("cannot listen on {listen}: {e}"));
        }
    };
    // The address first, so a script that asked for port 0 learns it.
    serving(&format!("http://{}/metrics", server.local_addr()), ctx.json);
    super::stopped().await;
    server.shutdown().await;
    Exit::Done
}
