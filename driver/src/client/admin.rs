//! [`Admin`]: the fleet's and the operator's calls, apart from what an
//! application calls on [`Client`].
//!
//! `client.admin()` borrows the client (no new pools, no state of its
//! own), so an operator tool and an application share one `Client`. Its
//! families: policies and queue configuration (`declare_workflow`,
//! `configure_queue`, `set_concurrency_limit`, rate limits, schedules,
//! fleet config), dead letters (`list_dead_letters`, `redrive`,
//! `purge_dead_letters`, `drop_queue`), retention and erasure, rebalancing
//! and draining, topology and shard lifecycle (`init_shard`,
//! `publish_topology`, `topology_status`, `shard_health`, `maintain`),
//! reports and fleet listings (`queue_stats`, `usage_report`,
//! `list_tasks`, `list_mutexes`, backlogs), the audit log, and an
//! operator's stop of an execution (`terminate_execution`,
//! `pause_execution`, `resume_execution`).
//!
//! This file also holds per-shard housekeeping: reaping expired leases,
//! the shard's identity and library version, and initializing a new shard.
//! The id functions (`sheaf.new_id`, `sheaf.id_shard`, `sheaf.id_timestamp`)
//! have local equivalents with no round trip: [`ExecutionId::mint`],
//! [`ExecutionId::shard`] and [`ExecutionId::timestamp`] (and the same on
//! [`TaskId`]), pinned to the extension's by the shared id vectors.
//!
//! [`ExecutionId::mint`]: crate::ExecutionId::mint
//! [`ExecutionId::shard`]: crate::ExecutionId::shard
//! [`ExecutionId::timestamp`]: crate::ExecutionId::timestamp
//! [`TaskId`]: crate::TaskId

use super::{Client, ClientError, Owned, first_column};
use crate::topology::ShardId;

/// The fleet's and the operator's calls on a [`Client`]'s shards: see
/// [`Client::admin`].
///
/// ```no_run
/// # async fn example(client: &sheaf_driver::Client) {
/// let admin = client.admin();
/// // Fleet-wide calls answer per shard: a shard down is named, not fatal.
/// let declared = admin
///     .declare_workflow("invoice", serde_json::json!({ "queue": "billing" }))
///     .await;
/// if !declared.is_complete() {
///     eprintln!("declare again once these shards are back: {:?}", declared.failed);
/// }
/// let stats = admin.queue_stats("billing").await;
/// println!("ready across the fleet: {}", stats.total().ready);
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Admin<'c> {
    pub(crate) client: &'c Client,
}

impl Client {
    /// The fleet's and the operator's calls: policies, dead letters,
    /// retention, rebalancing and draining, topology and shard lifecycle,
    /// reports and the audit log ([`Admin`]). What an application calls
    /// stays here on `Client`.
    pub fn admin(&self) -> Admin<'_> {
        Admin { client: self }
    }
}

const REAP_EXPIRED: &str = "SELECT sheaf.reap_expired($1)";
const SHARD_INFO: &str = "SELECT sheaf.shard_id(), sheaf.version()";
const INIT_SHARD: &str = "SELECT sheaf.init_shard($1)";

/// What a shard database says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardInfo {
    /// The topology's id for the shard asked.
    pub shard: ShardId,
    /// The id the database holds (`sheaf.shard_id()`); not `shard` means
    /// the topology points at the wrong database.
    pub reported_id: i32,
    /// The sheaf library serving it (`sheaf.version()`).
    pub version: String,
}

impl ShardInfo {
    /// The database is the shard the topology says it is.
    pub fn matches(&self) -> bool {
        self.reported_id == i32::from(self.shard.get())
    }
}

impl Admin<'_> {
    /// Puts back up to `max_rows` (1..) tasks on `shard` whose lease expired
    /// (a crashed worker), or dead-letters those on their last attempt; how
    /// many. Claims and `maintain` do this too; this is the explicit sweep.
    pub async fn reap_expired(self, shard: ShardId, max_rows: i32) -> Result<i32, ClientError> {
        let (call, rows) = self
            .client
            .on_shard(shard, Owned::Shard, REAP_EXPIRED, &[&max_rows])
            .await?;
        first_column(&call, &rows)
    }

    /// The shard's own id and library version. An uninitialized database
    /// is [`ClientError::WrongState`].
    pub async fn shard_info(self, shard: ShardId) -> Result<ShardInfo, ClientError> {
        let (call, rows) = self.client.on_shard(shard, Owned::Shard, SHARD_INFO, &[]).await?;
        let row = super::single(&call, &rows)?;
        let read = || -> Result<ShardInfo, tokio_postgres::Error> {
            Ok(ShardInfo {
                shard,
                reported_id: row.try_get(0)?,
                version: row.try_get(1)?,
            })
        };
        read().map_err(|e| call.error(e, 1))
    }

    /// Initializes the database the topology names `shard` as that shard
    /// (`sheaf.init_shard`, after `CREATE EXTENSION sheaf`): the step that
    /// makes a new database part of the fleet, with the id the topology
    /// gives it, so the two cannot disagree. Idempotent; a database already
    /// initialized as another id is refused ([`ClientError::WrongState`]):
    /// the topology points at the wrong database. Needs `sheaf_admin`.
    pub async fn init_shard(self, shard: ShardId) -> Result<(), ClientError> {
        let id = i32::from(shard.get());
        self.client
            .on_shard(shard, Owned::Shard, INIT_SHARD, &[&id])
            .await?;
        Ok(())
    }
}
