//! `sheaf ui`: the fleet dashboard (`sheaf_driver::UiServer`) until SIGINT
//! or SIGTERM. Its admin token comes from the environment
//! (`SHEAF_UI_TOKEN`), never the command line; without one it is read-only.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use sheaf_driver::{Client, UiOptions, UiServer};

/// The shortest admin token accepted: a guessable one is no protection.
const MIN_TOKEN: usize = 16;

pub async fn serve(client: Client, listen: SocketAddr, public_hosts: Vec<String>) -> ExitCode {
    let admin_token = std::env::var("SHEAF_UI_TOKEN").ok().filter(|t| !t.is_empty());
    if admin_token.as_ref().is_some_and(|t| t.len() < MIN_TOKEN) {
        return crate::exit::usage(format!(
            "SHEAF_UI_TOKEN must be at least {MIN_TOKEN} characters (e.g. `openssl rand -hex 16`)"
        ));
    }
    let options = UiOptions {
        admin_token,
        public_hosts,
        ..UiOptions::default()
    };
    let acting = options.admin_token.is_some();
    let server = match UiServer::start(Arc::new(client), listen, options).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sheaf: cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The address first, so a script that asked for port 0 learns it.
    println!("serving http://{}/", server.local_addr());
    if !acting {
        eprintln!("sheaf: read-only: set SHEAF_UI_TOKEN to allow redrive, purge and cancel");
    }
    crate::relay::stopped().await;
    server.shutdown().await;
    ExitCode::SUCCESS
}
