//! Retention: the policy on every shard (`sheaf.set_retention`,
//! `sheaf.retention`), the relay's mark on a child whose end its parent
//! pulled (`sheaf.relay_pulled`), and on a seal whose run ended where it
//! lives (`sheaf.seals_due`, `sheaf.seal_run_ended`).

use serde_json::Value;

use super::fleet::FleetReport;
use super::{Admin, Call, ClientError, Owned, Protocol, first_column};
use crate::id::ExecutionId;
use crate::json::Json;
use crate::topology::ShardId;

const SET_RETENTION: &str = "SELECT sheaf.set_retention($1)";
const RETENTION: &str = "SELECT sheaf.retention()";
const RELAY_PULLED: &str = "SELECT sheaf.relay_pulled($1)";
const SEALS_DUE: &str = "SELECT execution_id FROM sheaf.seals_due($1)";
const SEAL_RUN_ENDED: &str = "SELECT sheaf.seal_run_ended($1)";
const STATE: &str = "SELECT state FROM sheaf.get_execution($1)";

impl Admin<'_> {
    /// Sets how long every shard keeps what has ended (the fields given;
    /// see docs/operating/retention.md), and returns each shard's whole policy. A
    /// shard in `failed` kept its old one: apply it again.
    pub async fn set_retention(self, policy: impl Into<Json>) -> FleetReport<Value> {
        let policy = policy.into();
        let policy = &policy;
        self.client
            .fan_out(self.client.every_shard(), |shard| async move {
                let (call, rows) = self
                    .client
                    .on_shard(shard, Owned::Shard, SET_RETENTION, &[policy])
                    .await?;
                first_column(&call, &rows)
            })
            .await
    }

    /// Each readable shard's retention policy.
    pub async fn retention(self) -> FleetReport<Value> {
        self.client
            .fan_out(self.client.readable_shards(), |shard| async move {
                let (call, rows) = self.client.on_shard(shard, Owned::Shard, RETENTION, &[]).await?;
                first_column(&call, &rows)
            })
            .await
    }
}

impl Protocol<'_> {
    /// Marks ended child `child` (routed by its id, forwards followed): its
    /// parent on another shard has its end, so retention may delete it.
    /// `false` if it had not ended or was marked already. The relay calls
    /// it after each pull.
    pub async fn relay_pulled(self, child: ExecutionId) -> Result<bool, ClientError> {
        let call = self.client.by_execution(child);
        let rows = self
            .client
            .query(&call, RELAY_PULLED, &[&child.as_uuid()])
            .await?;
        first_column(&call, &rows)
    }

    /// Checks up to `max` of `shard`'s seals past their retention window
    /// (`sheaf.seals_due`): each is followed from `shard` through its
    /// forwards to where its run lives, and marked (`sheaf.seal_run_ended`)
    /// when the run has ended there or is gone; only then may retention
    /// delete it (a seal is the only forward for ids of its shard). A seal
    /// whose run lives, is moving, or cannot be reached now stays unmarked,
    /// and is checked again later. How many it marked. The relay runs it.
    pub async fn confirm_seals(self, shard: ShardId, max: i32) -> Result<usize, ClientError> {
        let (call, rows) = self
            .client
            .on_shard(shard, Owned::Shard, SEALS_DUE, &[&max])
            .await?;
        let due = rows
            .iter()
            .map(|r| r.try_get::<_, uuid::Uuid>(0))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| call.error(e, 1))?;
        let mut marked = 0;
        for id in due {
            let at = Call {
                shard,
                owned: Owned::Execution(ExecutionId::from_uuid(id)),
            };
            let ended = match self.client.query_followed(&at, STATE, &[&id]).await {
                Ok((answered, rows)) => match rows.first() {
                    None => true,
                    Some(row) => {
                        let at = Call {
                            shard: answered,
                            ..at
                        };
                        let state: String = row.try_get(0).map_err(|e| at.error(e, 1))?;
                        let state: crate::ExecutionState =
                            state.parse().map_err(|e| ClientError::Database {
                                shard: answered,
                                code: None,
                                message: format!("get_execution returned {e}"),
                            })?;
                        !state.is_active() && !state.is_migrating()
                    }
                },
                Err(e) => {
                    tracing::debug!(%shard, execution = %id, error = %e, "could not follow a seal; checked again later");
                    false
                }
            };
            if ended {
                let (call, rows) = self
                    .client
                    .on_shard(shard, Owned::Shard, SEAL_RUN_ENDED, &[&id])
                    .await?;
                if first_column::<bool>(&call, &rows)? {
                    marked += 1;
                }
            }
        }
        Ok(marked)
    }
}
