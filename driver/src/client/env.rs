//! A client from the environment: the fleet of `SHEAF_SHARDS`, or, with
//! none, the one database of `SHEAF_DATABASE_URL` as its only shard (the
//! zero-infrastructure start every single-database queue offers), under the
//! id it was initialized with (`sheaf.init_shard`).

use super::Client;
use crate::pool::{PoolOptions, ShardError};
use crate::topology::{Topology, TopologyError};

/// Why [`Client::from_env`] could not build a client. Never names a
/// connection string (it carries credentials).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// Neither `SHEAF_SHARDS` nor `SHEAF_DATABASE_URL` is set.
    #[error("set SHEAF_SHARDS (a fleet of shards) or SHEAF_DATABASE_URL (one database)")]
    Unset,
    /// The topology the variables describe is not valid.
    #[error("bad topology: {0}")]
    Topology(#[from] TopologyError),
    /// `SHEAF_DATABASE_URL`'s database could not say which shard it is.
    #[error(
        "SHEAF_DATABASE_URL: cannot read the shard id ({0}); is sheaf installed and sheaf.init_shard run in that database?"
    )]
    Database(String),
    /// A connection string a pool cannot use.
    #[error(transparent)]
    Shard(#[from] ShardError),
}

impl Client {
    /// A client for the fleet the environment names
    /// ([`Topology::from_env`]), or, without `SHEAF_SHARDS`, for the one
    /// database of `SHEAF_DATABASE_URL` as a single shard: its id is read
    /// from the database, and the other `SHEAF_*` variables apply as usual.
    pub async fn from_env(options: PoolOptions) -> Result<Client, EnvError> {
        Client::from_vars(|name| std::env::var(name).ok(), options).await
    }

    /// [`Client::from_env`] over any source of variables.
    pub async fn from_vars(
        var: impl Fn(&str) -> Option<String>,
        options: PoolOptions,
    ) -> Result<Client, EnvError> {
        let topology = match (var("SHEAF_SHARDS"), var("SHEAF_DATABASE_URL")) {
            (Some(_), _) => Topology::from_vars(&var)?,
            (None, Some(url)) => {
                let id = shard_id(&url, &options).await?;
                let spec = format!("{id}={url}");
                Topology::from_vars(|name| {
                    if name == "SHEAF_SHARDS" {
                        Some(spec.clone())
                    } else {
                        var(name)
                    }
                })?
            }
            (None, None) => return Err(EnvError::Unset),
        };
        Ok(Client::new(topology, options)?)
    }
}

/// The shard id the database at `url` was initialized with.
async fn shard_id(url: &str, options: &PoolOptions) -> Result<i32, EnvError> {
    let (mut config, tls) = crate::tls::shard_config(url).map_err(EnvError::Database)?;
    config.connect_timeout(options.connect_timeout);
    let (db, connection) = tokio::time::timeout(options.connect_timeout, config.connect(tls))
        .await
        .map_err(|_| EnvError::Database("the connection timed out".into()))?
        .map_err(|e| EnvError::Database(e.to_string()))?;
    let running = tokio::spawn(connection);
    let id = tokio::time::timeout(
        options.query_timeout,
        db.query_one("SELECT sheaf.shard_id()", &[]),
    )
    .await
    .map_err(|_| EnvError::Database("the query timed out".into()))?
    .map_err(|e| EnvError::Database(e.to_string()))?
    .try_get::<_, Option<i32>>(0)
    .map_err(|e| EnvError::Database(e.to_string()))?;
    drop(db);
    running.abort();
    id.ok_or_else(|| EnvError::Database("the database is not initialized as a shard".into()))
}
