//! `sheaf serve` (alias `sheaf ui`): the fleet dashboard and the HTTP API
//! (`sheaf_web::UiServer`) until SIGINT or SIGTERM. Its tokens come from
//! the environment (`SHEAF_UI_TOKEN`, `SHEAF_API_READ_TOKENS`,
//! `SHEAF_API_ACT_TOKENS`), never the command line; without an admin token
//! the dashboard is read-only, without API tokens the API refuses every call.

use std::net::SocketAddr;
use std::sync::Arc;

use sheaf_web::{UiOptions, UiServer};

use super::Context;
use crate::exit::{self, Exit};
use crate::output::serving;

/// Serve the fleet dashboard in the browser (shards, queues,
/// executions, dead letters, tasks, usage, rebalancing) and the HTTP JSON
/// API under /api/v1, with /health, /ready and /metrics, until SIGINT or SIGTERM;
/// prints its address first. The dashboard's actions (redrive, purge,
/// cancel a task; cancel, terminate, signal, pause or resume an
/// execution) need the admin token in SHEAF_UI_TOKEN (16+ characters);
/// without it the dashboard is read-only. The API takes bearer tokens
/// from SHEAF_API_READ_TOKENS and SHEAF_API_ACT_TOKENS (comma-separated,
/// 16+ characters each; act implies read); without any it refuses every
/// call.
#[derive(clap::Args)]
pub struct Args {
    /// Where to listen (loopback by default).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// A host name (`host` or `host:port`) the dashboard answers to
    /// besides its address (and localhost, when on loopback or every
    /// address); repeatable. Requests naming any other are refused.
    #[arg(long = "public-host", value_name = "HOST")]
    public_hosts: Vec<String>,
    /// Show payloads (inputs, results, errors, history, search
    /// attributes) to visitors who are not signed in; without it they see
    /// ids, counts, states and times only.
    #[arg(long)]
    public_read: bool,
    /// How often the list pages (fleet, queues, executions, tasks, dead
    /// letters) reload themselves; 0s: never. Each browser can also turn
    /// it off with the page's link.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = crate::parse::duration)]
    refresh_every: std::time::Duration,
}

/// The shortest admin token accepted: a guessable one is no protection.
const MIN_TOKEN: usize = 16;

pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let listen = args.listen;
    let admin_token = std::env::var("SHEAF_UI_TOKEN").ok().filter(|t| !t.is_empty());
    if admin_token.as_ref().is_some_and(|t| t.len() < MIN_TOKEN) {
        return exit::bad_input(format!(
            "SHEAF_UI_TOKEN must be at least {MIN_TOKEN} characters (e.g. `openssl rand -hex 16`)"
        ));
    }
    let (read, act) = match (
        api_tokens("SHEAF_API_READ_TOKENS"),
        api_tokens("SHEAF_API_ACT_TOKENS"),
    ) {
        (Ok(read), Ok(act)) => (read, act),
        (Err(why), _) | (_, Err(why)) => return exit::bad_input(why),
    };
    let acting = admin_token.is_some();
    let options = UiOptions::default()
        .admin_token(admin_token)
        .public_hosts(args.public_hosts)
        .api_tokens(read, act)
        .public_read(args.public_read)
        .refresh_every(args.refresh_every);
    let server = match UiServer::start(Arc::new(client), listen, options).await {
        Ok(s) => s,
        Err(e) => {
            return exit::fail(Exit::Failed, format!("cannot listen on {listen}: {e}"));
        }
    };
    // The address first, so a script that asked for port 0 learns it.
    serving(&format!("http://{}/", server.local_addr()), ctx.json);
    if !acting {
        exit::warn("read-only: set SHEAF_UI_TOKEN to allow the dashboard's actions");
    }
    super::stopped().await;
    server.shutdown().await;
    Exit::Done
}

/// The comma-separated tokens of `var`, each at least [`MIN_TOKEN`] long.
fn api_tokens(var: &str) -> Result<Vec<String>, String> {
    let raw = std::env::var(var).unwrap_or_default();
    let tokens: Vec<String> = raw
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect();
    if tokens.iter().any(|t| t.len() < MIN_TOKEN) {
        return Err(format!(
            "each token of {var} must be at least {MIN_TOKEN} characters (e.g. `openssl rand -hex 16`)"
        ));
    }
    Ok(tokens)
}
