//! The fleet's topology digest on its shards: [`Admin::publish_topology`](crate::Admin::publish_topology)
//! records this client's digest on every shard, after which a shard refuses
//! placed work from a client whose digest differs
//! ([`super::ClientError::TopologyMismatch`]); [`Admin::published_topology`](crate::Admin::published_topology) reads
//! what each shard holds.

use std::time::SystemTime;

use super::fleet::FleetReport;
use super::{Admin, Call, ClientError, Owned};
use crate::id::ExecutionId;
use crate::topology::ShardId;

// Since 0.3.0 a shard takes the projection and computes the digest itself;
// a 0.2.0 shard takes the digest alone.
const PUBLISH: &str = "SELECT digest, previous FROM sheaf.publish_topology($1::jsonb, $2)";
const PUBLISH_DIGEST: &str = "SELECT digest, previous FROM sheaf.publish_topology($1::text, $2)";
const PUBLISHED: &str = "SELECT digest, previous, published_at FROM sheaf.published_topology()";
const MISPLACED: &str = "SELECT execution_id, workflow_name, workflow_id, owner_shard, placement, created_at \
     FROM sheaf.misplaced_runs($1)";

/// A live run whose shard's published topology places it on another
/// shard ([`Admin::misplaced_runs`](crate::Admin::misplaced_runs)).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct MisplacedRun {
    /// The run.
    pub execution_id: ExecutionId,
    /// The shard it lives on.
    pub shard: ShardId,
    /// Its workflow.
    pub workflow_name: String,
    /// Its workflow id.
    pub workflow_id: String,
    /// The shard the published topology places it on; `None` when the
    /// topology refuses its placement (e.g. a residency key no longer
    /// declared).
    pub owner: Option<ShardId>,
    /// How its caller placed it (`{}`: automatically).
    pub placement: serde_json::Value,
    /// When it started.
    pub created_at: SystemTime,
}

/// What one shard has published.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublishedTopology {
    /// The fleet's digest, as published.
    pub digest: String,
    /// The one it replaced, still accepted while a change rolls out.
    pub previous: Option<String>,
    /// When it was published.
    pub published_at: SystemTime,
}

impl Admin<'_> {
    /// Publishes this client's topology on every shard, as its projection
    /// ([`Topology::projection`](crate::Topology::projection): ids, roles,
    /// residency, forwards; never connection strings), from which the
    /// shard computes the digest and answers placement; a shard on schema
    /// 0.2.0 takes the digest alone. Keeps the one each replaces as still
    /// accepted (`keep_previous`, for a rolling change) or not. Each
    /// shard's digest and previous one afterwards.
    pub async fn publish_topology(self, keep_previous: bool) -> FleetReport<(String, Option<String>)> {
        let digest = self.client.topology().digest();
        let projection = crate::json::Json::parse(self.client.topology().projection())
            .unwrap_or_else(|_| crate::json::Json::null());
        let (digest, projection) = (&digest, &projection);
        self.client
            .fan_out(self.client.every_shard(), |shard| async move {
                let version = self.schema_of(shard).await?;
                let (call, rows) = match version.as_deref() {
                    Some("0.1.0" | "0.2.0") => {
                        self.client
                            .on_shard(shard, Owned::Shard, PUBLISH_DIGEST, &[digest, &keep_previous])
                            .await?
                    }
                    _ => {
                        self.client
                            .on_shard(shard, Owned::Shard, PUBLISH, &[projection, &keep_previous])
                            .await?
                    }
                };
                let row = super::single(&call, &rows)?;
                let read = || -> Result<(String, Option<String>), tokio_postgres::Error> {
                    Ok((row.try_get("digest")?, row.try_get("previous")?))
                };
                read().map_err(|e| call.error(e, 1))
            })
            .await
    }

    /// What every shard has published (`None`: nothing; it checks no client).
    pub async fn published_topology(self) -> FleetReport<Option<PublishedTopology>> {
        self.client
            .fan_out(self.client.every_shard(), |shard| async move {
                let (call, rows) = self.client.on_shard(shard, Owned::Shard, PUBLISHED, &[]).await?;
                rows.first()
                    .map(|row| {
                        let read = || -> Result<PublishedTopology, tokio_postgres::Error> {
                            Ok(PublishedTopology {
                                digest: row.try_get("digest")?,
                                previous: row.try_get("previous")?,
                                published_at: row.try_get("published_at")?,
                            })
                        };
                        read().map_err(|e| call.error(e, 1))
                    })
                    .transpose()
            })
            .await
    }

    /// Each shard's live runs that its published topology places on
    /// another shard, at most `max_rows` (1 to 10,000) per shard
    /// (`sheaf.misplaced_runs`): made before the topology was published or
    /// changed, or sent to a shard by hand. Moved runs, children, schedule
    /// and debounced runs, and runs pinned to a shard are never listed; a
    /// shard before 0.3.0 lists none.
    pub async fn misplaced_runs(self, max_rows: i32) -> FleetReport<Vec<MisplacedRun>> {
        self.client
            .fan_out(self.client.every_shard(), |shard| async move {
                if matches!(self.schema_of(shard).await?.as_deref(), Some("0.1.0" | "0.2.0")) {
                    return Ok(Vec::new());
                }
                let (call, rows) = self
                    .client
                    .on_shard(shard, Owned::Shard, MISPLACED, &[&max_rows])
                    .await?;
                rows.iter().map(|row| misplaced_from_row(&call, row)).collect()
            })
            .await
    }

    /// The schema version `shard` runs.
    async fn schema_of(self, shard: ShardId) -> Result<Option<String>, ClientError> {
        let (call, rows) = self
            .client
            .on_shard(shard, Owned::Shard, crate::schema::SCHEMA_VERSION, &[])
            .await?;
        super::first_column(&call, &rows)
    }
}

fn misplaced_from_row(call: &Call, row: &tokio_postgres::Row) -> Result<MisplacedRun, ClientError> {
    let owner: Option<i32> = row.try_get("owner_shard").map_err(|e| call.error(e, 1))?;
    let owner = match owner {
        None => None,
        Some(o) => Some(
            u32::try_from(o)
                .ok()
                .and_then(|o| ShardId::new(o).ok())
                .ok_or_else(|| ClientError::Database {
                    shard: call.shard,
                    code: None,
                    message: format!("misplaced_runs named owner {o}, which is not a shard id"),
                })?,
        ),
    };
    let read = || -> Result<MisplacedRun, tokio_postgres::Error> {
        Ok(MisplacedRun {
            execution_id: ExecutionId::from_uuid(row.try_get("execution_id")?),
            shard: call.shard,
            workflow_name: row.try_get("workflow_name")?,
            workflow_id: row.try_get("workflow_id")?,
            owner,
            placement: row.try_get("placement")?,
            created_at: row.try_get("created_at")?,
        })
    };
    read().map_err(|e| call.error(e, 1))
}
