//! Retention: the policy on every shard (`sheaf.set_retention`,
//! `sheaf.retention`), and the relay's mark on a child whose end its parent
//! pulled (`sheaf.relay_pulled`).

use serde_json::Value;

use super::fleet::FleetReport;
use super::{Client, ClientError, Owned, first_column};
use crate::id::ExecutionId;
use crate::json::Json;

const SET_RETENTION: &str = "SELECT sheaf.set_retention($1)";
const RETENTION: &str = "SELECT sheaf.retention()";
const RELAY_PULLED: &str = "SELECT sheaf.relay_pulled($1)";

impl Client {
    /// Sets how long every shard keeps what has ended (the fields given;
    /// see README "Retention"), and returns each shard's whole policy. A
    /// shard in `failed` kept its old one: apply it again.
    pub async fn set_retention(&self, policy: impl Into<Json>) -> FleetReport<Value> {
        let policy = policy.into();
        let policy = &policy;
        self.fan_out(self.every_shard(), |shard| async move {
            let (call, rows) = self
                .on_shard(shard, Owned::Shard, SET_RETENTION, &[policy])
                .await?;
            first_column(&call, &rows)
        })
        .await
    }

    /// Each readable shard's retention policy.
    pub async fn retention(&self) -> FleetReport<Value> {
        self.fan_out(self.readable_shards(), |shard| async move {
            let (call, rows) = self.on_shard(shard, Owned::Shard, RETENTION, &[]).await?;
            first_column(&call, &rows)
        })
        .await
    }

    /// Marks ended child `child` (routed by its id, forwards followed): its
    /// parent on another shard has its end, so retention may delete it.
    /// `false` if it had not ended or was marked already. The relay calls
    /// it after each pull.
    pub async fn relay_pulled(&self, child: ExecutionId) -> Result<bool, ClientError> {
        let call = self.by_execution(child);
        let rows = self.query(&call, RELAY_PULLED, &[&child.as_uuid()]).await?;
        first_column(&call, &rows)
    }
}
