//! Fleet-wide writes: workflow policies, concurrency caps and queue
//! configuration live on each shard, so each is applied to every shard of
//! the topology at once, with a per-shard report; redrive goes to the shard
//! each dead letter's id routes to.
//!
//! Nothing here is atomic across shards (sheaf never runs a two-database
//! transaction): a report with failures is a fleet that applied the change
//! on some shards only. Each of these calls is idempotent, so the remedy is
//! to call again once the failed shards are back.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::fleet::FleetReport;
use super::{Admin, Client, ClientError, Owned, first_column};
use crate::id::TaskId;
use crate::json::Json;
use crate::topology::ShardId;

pub(crate) const DECLARE_WORKFLOW: &str = "SELECT sheaf.declare_workflow($1, $2)";
pub(crate) const SET_CONCURRENCY_LIMIT: &str = "SELECT sheaf.set_concurrency_limit($1, $2)";
pub(crate) const CONFIGURE_QUEUE: &str = "SELECT sheaf.configure_queue($1, $2)";
const REDRIVE: &str = "SELECT sheaf.redrive($1)";

/// A change to a queue's configuration (`sheaf.configure_queue`): only the
/// settings given change. `QueueOptions::new()` changes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueOptions {
    aging_secs: Option<Option<i32>>,
    fairness: Option<bool>,
    notify: Option<bool>,
}

impl QueueOptions {
    /// No change: the call returns the current configuration.
    pub fn new() -> QueueOptions {
        QueueOptions::default()
    }

    /// Priority grows by one every `secs` of waiting; `None` turns aging off.
    pub fn aging_secs(mut self, secs: Option<i32>) -> Self {
        self.aging_secs = Some(secs);
        self
    }

    /// Fairness keys share the queue by weight (only while it has no ready task).
    pub fn fairness(mut self, on: bool) -> Self {
        self.fairness = Some(on);
        self
    }

    /// `NOTIFY sheaf_ready` when the queue goes from no ready task to some.
    pub fn notify(mut self, on: bool) -> Self {
        self.notify = Some(on);
        self
    }

    fn to_sql_opts(&self) -> Value {
        let mut m = Map::new();
        if let Some(aging) = self.aging_secs {
            m.insert("aging_secs".into(), aging.into());
        }
        if let Some(f) = self.fairness {
            m.insert("fairness".into(), f.into());
        }
        if let Some(n) = self.notify {
            m.insert("notify".into(), n.into());
        }
        Value::Object(m)
    }
}

/// A queue's configuration on one shard, after `configure_queue`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[non_exhaustive]
pub struct QueueConfig {
    /// The queue.
    pub queue: String,
    /// Aging step in seconds; `None` when aging is off.
    pub aging_secs: Option<i32>,
    /// Whether fairness keys share the queue.
    pub fairness: bool,
    /// Whether the queue sends `NOTIFY sheaf_ready`.
    pub notify: bool,
}

impl Client {
    /// Every shard of the topology, for writes: a policy must be on every
    /// shard a start may reach, drained or reserved ones included (they may
    /// take work again, or pinned work now).
    pub(crate) fn every_shard(&self) -> Vec<ShardId> {
        self.topology.shards().map(|s| s.id).collect()
    }
}

impl Admin<'_> {
    /// Declares (or replaces) workflow `name`'s policy (the JSON form of
    /// docs/reference/sql/executions.md: queue, concurrency, quota,
    /// activity_ends) on every shard. Later starts on a shard use that shard's policy, so check
    /// [`FleetReport::is_complete`]: a shard in `failed` keeps its old one.
    pub async fn declare_workflow(self, name: &str, policy: impl Into<Json>) -> FleetReport<()> {
        let policy = policy.into();
        let policy = &policy;
        self.client
            .fan_out(self.client.every_shard(), |shard| async move {
                self.client
                    .on_shard(shard, Owned::Shard, DECLARE_WORKFLOW, &[&name, policy])
                    .await
                    .map(drop)
            })
            .await
    }

    /// Caps concurrency key `key` at `max_running` on every shard (`None`
    /// removes the cap). Keys are one namespace per shard, so this is a cap
    /// of `max_running` per shard, not for the fleet.
    pub async fn set_concurrency_limit(self, key: &str, max_running: Option<i32>) -> FleetReport<()> {
        self.client
            .fan_out(self.client.every_shard(), |shard| async move {
                self.client
                    .on_shard(shard, Owned::Shard, SET_CONCURRENCY_LIMIT, &[&key, &max_running])
                    .await
                    .map(drop)
            })
            .await
    }

    /// Changes `queue`'s configuration on every shard; each shard's
    /// resulting configuration.
    pub async fn configure_queue(self, queue: &str, options: &QueueOptions) -> FleetReport<QueueConfig> {
        let opts = options.to_sql_opts();
        let opts = &opts;
        self.client
            .fan_out(self.client.every_shard(), |shard| async move {
                let (call, rows) = self
                    .client
                    .on_shard(
                        shard,
                        Owned::Queue(queue.to_owned()),
                        CONFIGURE_QUEUE,
                        &[&queue, opts],
                    )
                    .await?;
                let value: Value = first_column(&call, &rows)?;
                serde_json::from_value(value).map_err(|e| ClientError::Database {
                    shard,
                    code: None,
                    message: format!("configure_queue returned a configuration this driver cannot read: {e}"),
                })
            })
            .await
    }

    /// Puts dead letters back in line with fresh attempts. The ids are
    /// grouped by the shard each routes to, one call per shard; each shard
    /// moves all of its ids or none (55000 names the one that cannot go
    /// back) and reports how many moved (ids that are not dead letters are
    /// skipped). At most 10,000 ids per shard.
    pub async fn redrive(self, task_ids: &[TaskId]) -> FleetReport<i32> {
        let mut by_shard: BTreeMap<ShardId, Vec<uuid::Uuid>> = BTreeMap::new();
        for id in task_ids {
            by_shard
                .entry(id.route(&self.client.topology))
                .or_default()
                .push(id.as_uuid());
        }
        let by_shard = &by_shard;
        self.client
            .fan_out(by_shard.keys().copied().collect(), |shard| async move {
                let ids = by_shard.get(&shard).map(Vec::as_slice).unwrap_or_default();
                let (call, rows) = self
                    .client
                    .on_shard(shard, Owned::Shard, REDRIVE, &[&ids])
                    .await?;
                first_column(&call, &rows)
            })
            .await
    }
}

impl FleetReport<i32> {
    /// The sum over the shards that answered (how many dead letters moved).
    pub fn total(&self) -> i64 {
        self.ok.values().map(|&n| n as i64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_options_send_only_what_changes() {
        assert_eq!(QueueOptions::new().to_sql_opts(), serde_json::json!({}));
        let o = QueueOptions::new().aging_secs(None).notify(false);
        assert_eq!(
            o.to_sql_opts(),
            serde_json::json!({"aging_secs": null, "notify": false})
        );
        let o = QueueOptions::new().aging_secs(Some(30)).fairness(false);
        assert_eq!(
            o.to_sql_opts(),
            serde_json::json!({"aging_secs": 30, "fairness": false})
        );
    }

    #[test]
    fn a_returned_configuration_reads() {
        let c: QueueConfig =
            serde_json::from_str(r#"{"queue":"q","aging_secs":null,"fairness":true,"notify":false}"#)
                .unwrap();
        assert_eq!((c.aging_secs, c.fairness, c.notify), (None, true, false));
    }
}
