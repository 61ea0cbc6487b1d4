//! The fleet's topology digest on its shards: [`Admin::publish_topology`](crate::Admin::publish_topology)
//! records this client's digest on every shard, after which a shard refuses
//! placed work from a client whose digest differs
//! ([`super::ClientError::TopologyMismatch`]); [`Admin::published_topology`](crate::Admin::published_topology) reads
//! what each shard holds.

use std::time::SystemTime;

use super::fleet::FleetReport;
use super::{Admin, Owned};

const PUBLISH: &str = "SELECT digest, previous FROM sheaf.publish_topology($1, $2)";
const PUBLISHED: &str = "SELECT digest, previous, published_at FROM sheaf.published_topology()";

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
    /// Publishes this client's topology digest on every shard, keeping the
    /// one each replaces as still accepted (`keep_previous`, for a rolling
    /// change) or not. Each shard's digest and previous one afterwards.
    pub async fn publish_topology(self, keep_previous: bool) -> FleetReport<(String, Option<String>)> {
        let digest = self.client.topology().digest();
        let digest = &digest;
        self.client
            .fan_out(self.client.every_shard(), |shard| async move {
                let (call, rows) = self
                    .client
                    .on_shard(shard, Owned::Shard, PUBLISH, &[digest, &keep_previous])
                    .await?;
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
}
