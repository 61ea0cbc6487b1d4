//! One module per command: its arguments (clap) and its `run`. `main`
//! parses and dispatches to them.

use sheaf_driver::{Client, PoolOptions};

use crate::exit::Exit;

pub mod audit;
pub mod concurrency;
pub mod config;
pub mod dead_letters;
pub mod enqueue;
pub mod executions;
pub mod find;
pub mod list;
pub mod metrics;
pub mod mutexes;
pub mod orphans;
pub mod placement;
pub mod queues;
pub mod rate_limits;
pub mod rebalance;
pub mod rebalance_resume;
pub mod relay;
pub mod retention;
pub mod schedules;
pub mod serve;
pub mod shard;
pub mod start;
pub mod status;
pub mod tasks;
pub mod topology;
pub mod tree;
pub mod usage;

/// What every command is given besides its own arguments: the global
/// flags, and the fleet to connect to when it needs one.
pub struct Context {
    /// `--json`: print JSON instead of a table.
    pub json: bool,
    actor: Option<String>,
}

impl Context {
    pub fn new(json: bool, actor: Option<String>) -> Context {
        Context { json, actor }
    }

    /// A client for the fleet the environment names. Connection strings
    /// carry credentials: they come from the environment alone, never from
    /// an argument every process on the host can read. A topology that
    /// cannot be read exits 2.
    pub async fn client(&self) -> Result<Client, Exit> {
        let options = PoolOptions::default().actor(self.actor.clone());
        Client::from_env(options).await.map_err(crate::exit::bad_input)
    }
}

/// Resolves on SIGINT or SIGTERM: what the serving commands run until.
pub async fn stopped() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}
