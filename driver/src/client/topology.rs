//! The fleet's topology digest on its shards: [`Admin::publish_topology`](crate::Admin::publish_topology)
//! records this client's digest on every shard, after which a shard refuses
//! placed work from a client whose digest differs
//! ([`super::ClientError::TopologyMismatch`]); [`Admin::published_topology`](crate::Admin::published_topology) reads
//! what each shard holds.

use std::time::SystemTime;

use super::fleet::FleetReport;
use super::{Admin, Owned};

// Since 0.3.0 a shard takes the projection and computes the digest itself;
// a 0.2.0 shard takes the digest alone.
const PUBLISH: &str = "SELECT digest, previous FROM sheaf.publish_topology($1::jsonb, $2)";
const PUBLISH_DIGEST: &str = "SELECT digest, previous FROM sheaf.publish_topology($1::text, $2)";
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
                let (call, rows) = self
                    .client
                    .on_shard(shard, Owned::Shard, crate::schema::SCHEMA_VERSION, &[])
                    .await?;
                let version: Option<String> = super::first_column(&call, &rows)?;
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
}
