//! Reports merged across shards: usage per workflow or per search
//! attribute, and concurrency per key. Every readable shard is asked at
//! once; each group's totals add the shards that answered, each shard's own
//! rows stay available, and a shard that could not answer is named.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::{Number, Value};

use super::search::{PageStatus, refused_argument};
use super::{Admin, Call, Client, ClientError, Owned};
use crate::id::ExecutionId;
use crate::json::Json;
use crate::topology::ShardId;

const USAGE_REPORT: &str = "SELECT grp, workflow_starts, completed, failed, cancelled, timed_out, \
     activity_executions, activity_executions_failed, activity_compute_seconds, metered \
     FROM sheaf.usage_report($1, $2, $3)";
const RECORD_USAGE: &str = "SELECT sheaf.record_usage($1, $2)";
const CONCURRENCY_STATS: &str =
    "SELECT concurrency_key, max_running, running, ready, waiting FROM sheaf.concurrency_stats()";

/// What a usage report's groups are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupBy {
    /// Per workflow name.
    WorkflowName,
    /// Per value of this search attribute; executions without it are
    /// `(unattributed)`.
    SearchAttr(String),
}

impl GroupBy {
    fn as_sql(&self) -> String {
        match self {
            GroupBy::WorkflowName => "workflow_name".to_owned(),
            GroupBy::SearchAttr(key) => format!("search_attr:{key}"),
        }
    }
}

/// What one group used in a window (`sheaf.usage_report`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct Usage {
    /// Executions started in the window.
    pub workflow_starts: i64,
    /// Executions that completed in the window (their `WorkflowCompleted`).
    pub completed: i64,
    /// … failed.
    pub failed: i64,
    /// … were cancelled (a terminated execution is none of these).
    pub cancelled: i64,
    /// … timed out.
    pub timed_out: i64,
    /// Activity attempts that ended in the window (completed, failed,
    /// dead-lettered, reaped after a lease expiry).
    pub activity_executions: i64,
    /// Those of them that did not complete.
    pub activity_executions_failed: i64,
    /// Their seconds from claim to end.
    pub activity_compute_seconds: f64,
    /// The metered units recorded in the window (`record_usage`), per metric.
    pub metered: BTreeMap<String, Number>,
}

impl Usage {
    fn add(&mut self, other: &Usage) {
        self.workflow_starts += other.workflow_starts;
        self.completed += other.completed;
        self.failed += other.failed;
        self.cancelled += other.cancelled;
        self.timed_out += other.timed_out;
        self.activity_executions += other.activity_executions;
        self.activity_executions_failed += other.activity_executions_failed;
        self.activity_compute_seconds += other.activity_compute_seconds;
        for (metric, n) in &other.metered {
            let sum = match self.metered.get(metric) {
                Some(have) => add_numbers(have, n),
                None => n.clone(),
            };
            self.metered.insert(metric.clone(), sum);
        }
    }
}

/// Integers add exactly (while they fit); anything else as `f64`.
fn add_numbers(a: &Number, b: &Number) -> Number {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64())
        && let Some(sum) = x.checked_add(y)
    {
        return sum.into();
    }
    let sum = a.as_f64().unwrap_or(0.0) + b.as_f64().unwrap_or(0.0);
    Number::from_f64(sum).unwrap_or_else(|| 0.into())
}

/// One concurrency key across the shards (`sheaf.concurrency_stats`). A
/// key's cap is per shard: the same key on two shards is two caps.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct KeyConcurrency {
    /// Its tasks running now, on every shard that answered.
    pub running: i64,
    /// Its tasks claimable now (within the cap).
    pub ready: i64,
    /// Its tasks waiting for a slot.
    pub waiting: i64,
    /// Each shard's cap, where the key has one.
    pub caps: BTreeMap<ShardId, i32>,
}

impl KeyConcurrency {
    fn add(&mut self, shard: ShardId, other: &KeyConcurrency) {
        self.running += other.running;
        self.ready += other.ready;
        self.waiting += other.waiting;
        if let Some(cap) = other.caps.get(&shard) {
            self.caps.insert(shard, *cap);
        }
    }
}

/// A report merged across shards.
#[derive(Debug)]
#[non_exhaustive]
pub struct Report<T> {
    /// Every group (or key) with its totals over the shards that answered,
    /// in order; none is folded into an "other".
    pub groups: BTreeMap<String, T>,
    /// Each answering shard's own rows.
    pub per_shard: BTreeMap<ShardId, BTreeMap<String, T>>,
    /// `Partial` when a shard is missing from the totals.
    pub status: PageStatus,
    /// Each shard that could not answer, and why.
    pub unavailable_shards: BTreeMap<ShardId, ClientError>,
}

impl Client {
    /// Records metered units (up to 32 finite numbers, e.g.
    /// `{"llm_calls": 1, "input_tokens": 812}`) against an execution, now;
    /// [`Admin::usage_report`](crate::Admin::usage_report) sums them per group.
    pub async fn record_usage(&self, id: ExecutionId, metrics: impl Into<Json>) -> Result<(), ClientError> {
        let call = self.by_execution(id);
        let metrics = metrics.into();
        self.query(&call, RECORD_USAGE, &[&id.as_uuid(), &metrics])
            .await
            .map(drop)
    }
}

impl Admin<'_> {
    /// What the executions of every readable shard used in `[from, to)`
    /// (at most 90 days), per `group_by`, merged per group.
    pub async fn usage_report(
        self,
        from: SystemTime,
        to: SystemTime,
        group_by: &GroupBy,
    ) -> Result<Report<Usage>, ClientError> {
        let group = group_by.as_sql();
        let report = self
            .client
            .fan_out(self.client.readable_shards(), |shard| {
                let group = &group;
                async move {
                    let call = Call {
                        shard,
                        owned: Owned::Listing("the usage report"),
                    };
                    let rows = self
                        .client
                        .query(&call, USAGE_REPORT, &[&from, &to, group])
                        .await?;
                    rows.iter()
                        .map(|row| usage_from_row(&call, row))
                        .collect::<Result<BTreeMap<_, _>, _>>()
                }
            })
            .await;
        merged(report, |total: &mut Usage, _, u| total.add(u))
    }

    /// Every concurrency key of every readable shard, merged per key
    /// (running, ready and waiting add up; caps stay per shard).
    pub async fn concurrency_report(self) -> Result<Report<KeyConcurrency>, ClientError> {
        let report = self
            .client
            .fan_out(self.client.readable_shards(), |shard| async move {
                let call = Call {
                    shard,
                    owned: Owned::Listing("the concurrency report"),
                };
                let rows = self.client.query(&call, CONCURRENCY_STATS, &[]).await?;
                rows.iter()
                    .map(|row| key_from_row(&call, row))
                    .collect::<Result<BTreeMap<_, _>, _>>()
            })
            .await;
        merged(report, |total: &mut KeyConcurrency, shard, k| total.add(shard, k))
    }
}

/// Totals per group over the shards that answered; a refused argument is
/// the caller's error, not a missing shard.
fn merged<T: Default + Clone>(
    report: super::FleetReport<BTreeMap<String, T>>,
    add: impl Fn(&mut T, ShardId, &T),
) -> Result<Report<T>, ClientError> {
    refused_argument(&report.failed)?;
    let mut groups: BTreeMap<String, T> = BTreeMap::new();
    for (shard, rows) in &report.ok {
        for (group, value) in rows {
            add(groups.entry(group.clone()).or_default(), *shard, value);
        }
    }
    let status = if report.failed.is_empty() {
        PageStatus::Complete
    } else {
        PageStatus::Partial
    };
    Ok(Report {
        groups,
        per_shard: report.ok,
        status,
        unavailable_shards: report.failed,
    })
}

fn usage_from_row(call: &Call, row: &tokio_postgres::Row) -> Result<(String, Usage), ClientError> {
    let read = || -> Result<(String, Usage), tokio_postgres::Error> {
        let metered: Value = row.try_get("metered")?;
        let metered = match metered {
            Value::Object(m) => m
                .into_iter()
                .filter_map(|(k, v)| match v {
                    Value::Number(n) => Some((k, n)),
                    _ => None,
                })
                .collect(),
            _ => BTreeMap::new(),
        };
        Ok((
            row.try_get("grp")?,
            Usage {
                workflow_starts: row.try_get("workflow_starts")?,
                completed: row.try_get("completed")?,
                failed: row.try_get("failed")?,
                cancelled: row.try_get("cancelled")?,
                timed_out: row.try_get("timed_out")?,
                activity_executions: row.try_get("activity_executions")?,
                activity_executions_failed: row.try_get("activity_executions_failed")?,
                activity_compute_seconds: row.try_get("activity_compute_seconds")?,
                metered,
            },
        ))
    };
    read().map_err(|e| call.error(e, 1))
}

fn key_from_row(call: &Call, row: &tokio_postgres::Row) -> Result<(String, KeyConcurrency), ClientError> {
    let read = || -> Result<(String, KeyConcurrency), tokio_postgres::Error> {
        let cap: Option<i32> = row.try_get("max_running")?;
        Ok((
            row.try_get("concurrency_key")?,
            KeyConcurrency {
                running: row.try_get("running")?,
                ready: row.try_get("ready")?,
                waiting: row.try_get("waiting")?,
                caps: cap.map(|c| (call.shard, c)).into_iter().collect(),
            },
        ))
    };
    read().map_err(|e| call.error(e, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metered_integers_add_exactly_and_others_as_floats() {
        let n = |v: Value| match v {
            Value::Number(n) => n,
            _ => unreachable!(),
        };
        assert_eq!(add_numbers(&n(2.into()), &n(3.into())), n(5.into()));
        assert_eq!(
            add_numbers(&n(serde_json::json!(0.5)), &n(1.into())).as_f64(),
            Some(1.5)
        );
        let big = add_numbers(&n(i64::MAX.into()), &n(1.into()));
        assert!(big.as_f64().is_some_and(|f| f > 9.2e18));
    }

    #[test]
    fn usage_adds_up_per_field() {
        let mut a = Usage {
            workflow_starts: 1,
            activity_compute_seconds: 1.5,
            metered: BTreeMap::from([("tokens".to_owned(), 10.into())]),
            ..Usage::default()
        };
        let b = Usage {
            workflow_starts: 2,
            cancelled: 1,
            activity_compute_seconds: 0.5,
            metered: BTreeMap::from([("tokens".to_owned(), 5.into()), ("calls".to_owned(), 1.into())]),
            ..Usage::default()
        };
        a.add(&b);
        assert_eq!(
            (a.workflow_starts, a.cancelled, a.activity_compute_seconds),
            (3, 1, 2.0)
        );
        assert_eq!(a.metered["tokens"], Number::from(15));
        assert_eq!(a.metered["calls"], Number::from(1));
    }
}
