//! The fleet's configuration as one document: workflow policies, queue
//! options and concurrency caps, declared once (a file in the user's
//! repository, `sheaf config apply`) and applied to every shard, and read
//! back from every shard to show drift ([`config_drift`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::fleet::FleetReport;
use super::policy::{CONFIGURE_QUEUE, DECLARE_WORKFLOW, SET_CONCURRENCY_LIMIT};
use super::{Admin, ClientError, Owned, first_column};
use crate::json::Json;
use crate::topology::ShardId;

const SNAPSHOT: &str = "SELECT sheaf.fleet_config()";

/// A fleet's declared configuration. As a file it is JSON:
/// `{"workflows": {name: policy}, "queues": {name: options}, "caps": {key: n}}`,
/// each section optional; a cap of `null` removes it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct FleetConfig {
    /// Workflow name → policy (`sheaf.declare_workflow`).
    #[serde(default)]
    pub workflows: BTreeMap<String, Value>,
    /// Queue → options (`sheaf.configure_queue`).
    #[serde(default)]
    pub queues: BTreeMap<String, Value>,
    /// Concurrency key → max running (`sheaf.set_concurrency_limit`).
    #[serde(default)]
    pub caps: BTreeMap<String, Option<i32>>,
}

impl FleetConfig {
    /// A configuration from its JSON text.
    pub fn parse(text: &str) -> Result<FleetConfig, ClientError> {
        serde_json::from_str(text)
            .map_err(|e| ClientError::BadRequest(format!("not a fleet configuration: {e}")))
    }

    /// Where `other` differs from `self`, one line per entry, naming it
    /// ("missing": in `self` only; "extra": in `other` only).
    pub fn differences(&self, other: &FleetConfig) -> Vec<String> {
        fn section<V: PartialEq + std::fmt::Debug>(
            what: &str,
            a: &BTreeMap<String, V>,
            b: &BTreeMap<String, V>,
            out: &mut Vec<String>,
        ) {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) if x == y => {}
                    (Some(_), Some(_)) => out.push(format!("{what} {k:?} differs")),
                    (Some(_), None) => out.push(format!("{what} {k:?} is missing")),
                    (None, _) => out.push(format!("{what} {k:?} is extra")),
                }
            }
        }
        let mut out = Vec::new();
        section("workflow", &self.workflows, &other.workflows, &mut out);
        section("queue", &self.queues, &other.queues, &mut out);
        section("cap", &self.caps, &other.caps, &mut out);
        out
    }

    /// Where `other`'s configuration of workflow `name` (its policy and its
    /// queue's options) differs from `self`'s; empty if it does not.
    pub fn workflow_differences(&self, other: &FleetConfig, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        let policy = self.workflows.get(name);
        if policy != other.workflows.get(name) {
            out.push(format!("workflow {name:?} differs"));
        }
        let queue = policy.and_then(|p| p.get("queue")).and_then(Value::as_str);
        if let Some(q) = queue
            && self.queues.get(q) != other.queues.get(q)
        {
            out.push(format!("queue {q:?} differs"));
        }
        out
    }
}

/// Each shard whose configuration differs from the one most of the shards
/// that answered hold, with what differs.
pub fn config_drift(report: &FleetReport<FleetConfig>) -> BTreeMap<ShardId, Vec<String>> {
    let configs: Vec<&FleetConfig> = report.ok.values().collect();
    let Some(majority) = configs
        .iter()
        .max_by_key(|c| configs.iter().filter(|o| **o == **c).count())
    else {
        return BTreeMap::new();
    };
    report
        .ok
        .iter()
        .filter(|(_, c)| *c != *majority)
        .map(|(s, c)| (*s, majority.differences(c)))
        .collect()
}

impl Admin<'_> {
    /// Applies `config` to every shard: each workflow's policy, each
    /// queue's options, each cap (null removes it). Entries the file does
    /// not name are left as they are. Idempotent: after a partial report,
    /// apply again once the failed shards are back.
    pub async fn apply_config(self, config: &FleetConfig) -> FleetReport<()> {
        self.client
            .fan_out(self.client.every_shard(), |shard| async move {
                for (name, policy) in &config.workflows {
                    let policy =
                        Json::from_serialize(policy).map_err(|e| ClientError::BadRequest(e.to_string()))?;
                    self.client
                        .on_shard(shard, Owned::Shard, DECLARE_WORKFLOW, &[name, &policy])
                        .await?;
                }
                for (queue, options) in &config.queues {
                    let options =
                        Json::from_serialize(options).map_err(|e| ClientError::BadRequest(e.to_string()))?;
                    self.client
                        .on_shard(
                            shard,
                            Owned::Queue(queue.clone()),
                            CONFIGURE_QUEUE,
                            &[queue, &options],
                        )
                        .await?;
                }
                for (key, cap) in &config.caps {
                    self.client
                        .on_shard(shard, Owned::Shard, SET_CONCURRENCY_LIMIT, &[key, cap])
                        .await?;
                }
                Ok(())
            })
            .await
    }

    /// Every shard's configuration (`sheaf.fleet_config()`).
    pub async fn fleet_config(self) -> FleetReport<FleetConfig> {
        self.client
            .fan_out(self.client.every_shard(), |shard| self.shard_config(shard))
            .await
    }

    /// One shard's configuration (`sheaf.fleet_config()`).
    pub async fn shard_config(self, shard: ShardId) -> Result<FleetConfig, ClientError> {
        let (call, rows) = self.client.on_shard(shard, Owned::Shard, SNAPSHOT, &[]).await?;
        let value: Value = first_column(&call, &rows)?;
        let config: FleetConfig = serde_json::from_value(value).map_err(|e| ClientError::Database {
            shard,
            code: None,
            message: format!("the shard returned a configuration this driver cannot read: {e}"),
        })?;
        Ok(config.without_derived_caps())
    }
}

impl FleetConfig {
    /// Without the caps a workflow's concurrency policy derives: a start
    /// makes `WORKFLOW:KEY` at the policy's limit on its own shard, so they
    /// differ from shard to shard with where runs started. They follow from
    /// the policy, which is compared; they are no configuration of their own.
    fn without_derived_caps(mut self) -> FleetConfig {
        let limits: Vec<(String, i64)> = self
            .workflows
            .iter()
            .filter_map(|(name, policy)| Some((format!("{name}:"), policy["concurrency"]["limit"].as_i64()?)))
            .collect();
        self.caps.retain(|key, cap| {
            !limits
                .iter()
                .any(|(prefix, limit)| key.starts_with(prefix.as_str()) && cap.map(i64::from) == Some(*limit))
        });
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn caps_a_concurrency_policy_derives_are_not_configuration() {
        let config: FleetConfig = serde_json::from_value(json!({
            "workflows": {"sync": {"concurrency": {"key": "input.tenant", "limit": 2, "on_conflict": "cancel_running"}}},
            "caps": {"sync:acme": 2, "sync:other": 5, "tenant-a": 2, "report:x": 2}
        }))
        .unwrap();
        let kept: Vec<String> = config.without_derived_caps().caps.into_keys().collect();
        assert_eq!(kept, ["report:x", "sync:other", "tenant-a"]);
    }

    #[test]
    fn drift_is_measured_against_the_majority() {
        let a = FleetConfig::parse(r#"{"caps": {"t": 4}, "workflows": {"w": {"queue": "q"}}}"#).unwrap();
        let mut b = a.clone();
        b.caps.insert("t".into(), Some(8));
        b.queues.insert("q".into(), json!({"aging_secs": 5}));
        let id = |n| ShardId::new(n).unwrap();
        let report = FleetReport {
            ok: [(id(0), a.clone()), (id(1), a.clone()), (id(2), b)].into(),
            failed: BTreeMap::new(),
        };
        let drift = config_drift(&report);
        assert_eq!(drift.keys().copied().collect::<Vec<_>>(), [id(2)]);
        assert_eq!(drift[&id(2)], ["queue \"q\" is extra", "cap \"t\" differs"]);
        assert!(
            FleetConfig::parse(r#"{"limits": {}}"#).is_err(),
            "unknown sections are refused"
        );
        assert!(a.differences(&a).is_empty());
    }
}
