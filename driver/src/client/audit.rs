//! The shards' audit logs: what operators did, and who (`sheaf.audit_log`).

use std::time::SystemTime;

use super::fleet::FleetReport;
use super::{Admin, ClientError, Owned};
use crate::json::Json;
use crate::topology::ShardId;

const PAGE: &str =
    "SELECT id, at, actor, login, action, target, outcome, detail FROM sheaf.audit_log($1, $2)";
const NOTE: &str = "SELECT sheaf.audit_note($1, $2, $3, $4)";

/// One operator action on one shard.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AuditEntry {
    /// The shard it was done to.
    pub shard: ShardId,
    /// Its id on that shard (pages go before it).
    pub id: i64,
    /// When.
    pub at: SystemTime,
    /// Who, as the session declared it (`PoolOptions::actor`, else the
    /// login role).
    pub actor: String,
    /// The login role whose session did it (`session_user`), whatever actor
    /// it declared.
    pub login: String,
    /// What, e.g. `set_concurrency_limit`, `publish_topology`.
    pub action: String,
    /// To what.
    pub target: Option<String>,
    /// How it ended.
    pub outcome: String,
    /// The action's parameters.
    pub detail: Option<Json>,
}

impl Admin<'_> {
    /// `shard`'s audit entries before `before_id` (`None`: the newest),
    /// newest first, at most `max_rows` (1..1000).
    pub async fn audit_log(
        self,
        shard: ShardId,
        before_id: Option<i64>,
        max_rows: i32,
    ) -> Result<Vec<AuditEntry>, ClientError> {
        let (call, rows) = self
            .client
            .on_shard(shard, Owned::Shard, PAGE, &[&before_id, &max_rows])
            .await?;
        rows.iter()
            .map(|row| {
                let read = || -> Result<AuditEntry, tokio_postgres::Error> {
                    Ok(AuditEntry {
                        shard,
                        id: row.try_get("id")?,
                        at: row.try_get("at")?,
                        actor: row.try_get("actor")?,
                        login: row.try_get("login")?,
                        action: row.try_get("action")?,
                        target: row.try_get("target")?,
                        outcome: row.try_get("outcome")?,
                        detail: row.try_get("detail")?,
                    })
                };
                read().map_err(|e| call.error(e, 1))
            })
            .collect()
    }

    /// The newest `max_rows` entries of every shard's audit log, each
    /// shard's newest first.
    pub async fn fleet_audit_log(self, max_rows: i32) -> FleetReport<Vec<AuditEntry>> {
        self.client
            .fan_out(self.client.every_shard(), |shard| {
                self.audit_log(shard, None, max_rows)
            })
            .await
    }

    /// Adds an entry to `shard`'s audit log, with this client's actor, for
    /// an action done across shards (`sheaf.audit_note`): a fan-out that
    /// did not reach every shard. `action` and `outcome` 1 to 64 bytes,
    /// `target` up to 256, `detail` a JSON object up to 8 KiB.
    pub(crate) async fn audit_note(
        self,
        shard: ShardId,
        action: &str,
        target: &str,
        outcome: &str,
        detail: &Json,
    ) -> Result<(), ClientError> {
        self.client
            .on_shard(shard, Owned::Shard, NOTE, &[&action, &target, &outcome, detail])
            .await
            .map(drop)
    }
}
