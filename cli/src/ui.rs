//! `sheaf ui`: the fleet dashboard (`sheaf_driver::UiServer`) until SIGINT
//! or SIGTERM.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use sheaf_driver::{Client, UiOptions, UiServer};

pub async fn serve(client: Client, listen: SocketAddr) -> ExitCode {
    let server = match UiServer::start(Arc::new(client), listen, UiOptions::default()).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sheaf: cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The address first, so a script that asked for port 0 learns it.
    println!("serving http://{}/", server.local_addr());
    crate::relay::stopped().await;
    server.shutdown().await;
    ExitCode::SUCCESS
}
