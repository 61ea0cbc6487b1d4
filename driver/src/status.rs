//! Probing shards: is each one reachable, and is it the shard we think it is?

use std::time::Duration;

use serde::Serialize;
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

use crate::topology::{Shard, ShardId};

/// What one probe of one shard found.
#[derive(Debug, Clone, Serialize)]
pub struct ShardStatus {
    pub shard: ShardId,
    pub reachable: bool,
    /// The id the database reports through `sheaf.shard_id()`.
    pub reported_shard_id: Option<i32>,
    /// The sheaf library serving the database (`sheaf.version()`).
    pub library_version: Option<String>,
    /// The installed schema version (`pg_extension.extversion`).
    pub schema_version: Option<String>,
    pub server_version: Option<String>,
    /// Why the probe failed or what is wrong with the shard, if anything.
    pub problem: Option<String>,
}

impl ShardStatus {
    /// Reachable, initialized, and holding the id the topology gives it.
    pub fn healthy(&self) -> bool {
        self.reachable && self.problem.is_none()
    }
}

/// Connects to one shard with a bounded timeout and reads its identity.
pub async fn probe_shard(shard: &Shard, timeout: Duration) -> ShardStatus {
    let mut status = ShardStatus {
        shard: shard.id,
        reachable: false,
        reported_shard_id: None,
        library_version: None,
        schema_version: None,
        server_version: None,
        problem: None,
    };
    match tokio::time::timeout(timeout, read_identity(&shard.url, timeout)).await {
        Err(_) => status.problem = Some(format!("no answer within {timeout:?}")),
        Ok(Err(e)) => status.problem = Some(e),
        Ok(Ok(identity)) => {
            status.reachable = true;
            status.server_version = Some(identity.server_version);
            status.schema_version = identity.schema_version;
            status.library_version = identity.library_version;
            status.reported_shard_id = identity.shard_id;
            status.problem = match (status.schema_version.as_ref(), identity.shard_id) {
                (None, _) => Some("the sheaf extension is not installed".into()),
                (Some(_), None) => Some("the shard is not initialized (sheaf.init_shard)".into()),
                (Some(_), Some(id)) if id != shard.id.get() as i32 => Some(format!(
                    "the database is shard {id}, but the topology calls it shard {}",
                    shard.id
                )),
                _ => None,
            };
        }
    }
    status
}

struct Identity {
    server_version: String,
    schema_version: Option<String>,
    library_version: Option<String>,
    shard_id: Option<i32>,
}

async fn read_identity(url: &str, timeout: Duration) -> Result<Identity, String> {
    let mut config: tokio_postgres::Config =
        url.parse().map_err(|e| format!("bad connection string: {e}"))?;
    config.connect_timeout(timeout);
    let (client, connection) = config
        .connect(NoTls)
        .await
        .map_err(|e| format!("cannot connect: {}", with_causes(&e)))?;
    let driver = tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT current_setting('server_version'), \
                    (SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'sheaf')",
            &[],
        )
        .await
        .map_err(|e| format!("identity query failed: {e}"))?;
    let mut identity = Identity {
        server_version: row.get(0),
        schema_version: row.get(1),
        library_version: None,
        shard_id: None,
    };
    if identity.schema_version.is_some() {
        let row = client
            .query_one("SELECT sheaf.version()", &[])
            .await
            .map_err(|e| format!("sheaf.version() failed: {e}"))?;
        identity.library_version = Some(row.get(0));
        identity.shard_id = match client.query_one("SELECT sheaf.shard_id()", &[]).await {
            Ok(row) => Some(row.get(0)),
            // 55000: the shard has not been initialized yet.
            Err(e) if e.code() == Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE) => None,
            Err(e) => return Err(format!("sheaf.shard_id() failed: {e}")),
        };
    }
    drop(client);
    // The connection task ends once the client is dropped.
    let _ = driver.await;
    Ok(identity)
}

/// An error and its chain of causes: tokio-postgres puts the useful part
/// ("connection refused") in the source.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
