//! Fleet-wide reads: every readable shard asked at once, each shard's answer
//! (or its failure) reported under its id. Nothing is merged away: queues,
//! caps, quota counters and the worker registry are per shard, and a shard
//! that could not answer is in `failed`, never a silent gap.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use super::{Admin, Call, Client, ClientError, Owned, single};
use crate::topology::ShardId;

const QUEUE_STATS: &str = "SELECT ready, scheduled, running, waiting, dead, live_workers, \
     extract(epoch FROM oldest_ready_age)::float8 AS oldest_ready_secs FROM sheaf.queue_stats($1)";
const CONCURRENCY_STATS: &str =
    "SELECT concurrency_key, max_running, running, ready, waiting FROM sheaf.concurrency_stats()";
const TASKS_DELETED: &str = "SELECT pg_stat_get_tuples_deleted('sheaf.tasks'::regclass)";
const LIVE_WORKERS: &str = "SELECT worker, queues, last_seen_at FROM sheaf.live_workers()";
const STRANDED_WORK: &str = "SELECT queue, ready, extract(epoch FROM oldest_ready_age)::float8 AS oldest_ready_secs \
     FROM sheaf.stranded_work()";
const QUOTA_USAGE: &str = "SELECT active_executions, history_bytes, dead_letters FROM sheaf.quota_usage($1)";
const QUOTA_RECOMPUTE: &str =
    "SELECT active_executions, history_bytes, dead_letters FROM sheaf.quota_recompute($1)";

/// One call made on several shards: what each shard answered (or applied),
/// and why each other one failed. Policies, caps and counters are per
/// shard, so a fleet where some shards failed is a fleet that is only
/// partly answered or configured: [`FleetReport::is_complete`] says which.
#[derive(Debug)]
#[non_exhaustive]
pub struct FleetReport<T> {
    /// The shards that answered (for a write: applied it), with their answer.
    pub ok: BTreeMap<ShardId, T>,
    /// The shards that did not, with why. For a write, those shards did not
    /// apply it (or, after a timeout or lost connection, may have).
    pub failed: BTreeMap<ShardId, ClientError>,
}

impl<T> FleetReport<T> {
    /// Every shard asked answered: nothing is missing from `ok`.
    pub fn is_complete(&self) -> bool {
        self.failed.is_empty()
    }

    /// Every shard's answer, or a [`FleetError`] holding the failures (and
    /// dropping the answers) when a shard failed.
    pub fn into_result(self) -> Result<BTreeMap<ShardId, T>, FleetError> {
        if self.failed.is_empty() {
            Ok(self.ok)
        } else {
            Err(FleetError {
                answered: self.ok.len(),
                failed: self.failed,
            })
        }
    }
}

/// A fleet-wide call that some shards failed ([`FleetReport::into_result`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct FleetError {
    /// How many shards answered (or applied it).
    pub answered: usize,
    /// The shards that failed, with why.
    pub failed: BTreeMap<ShardId, ClientError>,
}

impl fmt::Display for FleetError {
    /// Counts, and the first failure (which names its one shard, as every
    /// `ClientError` does); never the shard set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} shards failed",
            self.failed.len(),
            self.failed.len() + self.answered
        )?;
        if let Some(first) = self.failed.values().next() {
            write!(f, " (first: {first})")?;
        }
        Ok(())
    }
}

impl std::error::Error for FleetError {}

/// One queue on one shard, by state (`sheaf.queue_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// Claimable now.
    pub ready: i64,
    /// Due later (a `run_at`, a retry backoff).
    pub scheduled: i64,
    /// Claimed, under a lease.
    pub running: i64,
    /// Beyond their concurrency key's cap.
    pub waiting: i64,
    /// Dead letters.
    pub dead: i64,
    /// Live workers serving the queue.
    pub live_workers: i64,
    /// How long the oldest ready task has waited.
    pub oldest_ready_age: Option<Duration>,
}

impl FleetReport<QueueStats> {
    /// The queue over the shards that answered: counts add up (live
    /// workers too: one process counts once per shard it serves), the
    /// oldest age is the oldest of all.
    pub fn total(&self) -> QueueStats {
        self.ok.values().fold(QueueStats::default(), |t, s| QueueStats {
            ready: t.ready + s.ready,
            scheduled: t.scheduled + s.scheduled,
            running: t.running + s.running,
            waiting: t.waiting + s.waiting,
            dead: t.dead + s.dead,
            live_workers: t.live_workers + s.live_workers,
            oldest_ready_age: t.oldest_ready_age.max(s.oldest_ready_age),
        })
    }
}

/// One concurrency key on one shard (`sheaf.concurrency_stats`). Keys are
/// one namespace per shard: the same key on two shards is two caps.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConcurrencyStat {
    /// The key.
    pub concurrency_key: String,
    /// Its cap on this shard; `None` when it has none.
    pub max_running: Option<i32>,
    /// Its tasks running now.
    pub running: i64,
    /// Its tasks claimable now (within the cap).
    pub ready: i64,
    /// Its tasks waiting for a slot.
    pub waiting: i64,
}

/// A worker in one shard's live-worker registry (`sheaf.live_workers`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegisteredWorker {
    /// The name it registered with.
    pub worker: String,
    /// The queues it serves on that shard.
    pub queues: Vec<String>,
    /// Its last heartbeat; it counts as live for 60 s after.
    pub last_seen_at: SystemTime,
}

/// Claimable work on one shard that no live worker serves (`sheaf.stranded_work`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StrandedWork {
    /// The queue.
    pub queue: String,
    /// Its ready tasks.
    pub ready: i64,
    /// How long the oldest has waited.
    pub oldest_ready_age: Option<Duration>,
}

/// A quota key's counters on one shard (`sheaf.quota_usage`). A quota is
/// enforced per shard: each shard counts the executions it holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuotaUsage {
    /// `RUNNING`, `SUSPENDED` and `PAUSED` executions of the key.
    pub active_executions: i64,
    /// The history bytes of those executions.
    pub history_bytes: i64,
    /// Dead letters of the key's executions.
    pub dead_letters: i64,
}

impl FleetReport<QuotaUsage> {
    /// The key's usage summed over the shards that answered.
    pub fn total(&self) -> QuotaUsage {
        self.ok.values().fold(QuotaUsage::default(), |t, u| QuotaUsage {
            active_executions: t.active_executions + u.active_executions,
            history_bytes: t.history_bytes + u.history_bytes,
            dead_letters: t.dead_letters + u.dead_letters,
        })
    }
}

/// Seconds as read from `extract(epoch ...)`, as a duration (a negative
/// age, from clock skew between statements, reads as zero).
fn secs(value: Option<f64>) -> Option<Duration> {
    value.map(|s| Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX))
}

impl Client {
    /// Runs `f` on every shard of `shards` at once and reports each (a
    /// fleet-wide read of its own: e.g. `f` calls an [`Admin`] method that
    /// takes a shard).
    pub async fn fan_out<T, F, Fut>(&self, shards: Vec<ShardId>, f: F) -> FleetReport<T>
    where
        F: Fn(ShardId) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let calls = shards.into_iter().map(|shard| {
            let call = f(shard);
            async move { (shard, call.await) }
        });
        let mut report = FleetReport {
            ok: BTreeMap::new(),
            failed: BTreeMap::new(),
        };
        for (shard, result) in futures::future::join_all(calls).await {
            match result {
                Ok(v) => {
                    report.ok.insert(shard, v);
                }
                Err(e) => {
                    report.failed.insert(shard, e);
                }
            }
        }
        report
    }

    /// The shards a fleet-wide read asks: every readable one.
    pub fn readable_shards(&self) -> Vec<ShardId> {
        self.topology
            .shards()
            .map(|s| s.id)
            .filter(|&id| self.topology.is_readable(id))
            .collect()
    }

    /// One statement on one shard about shard-wide state.
    pub(crate) async fn on_shard(
        &self,
        shard: ShardId,
        owned: Owned,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<(Call, Vec<tokio_postgres::Row>), ClientError> {
        let call = Call { shard, owned };
        let rows = self.query(&call, sql, params).await?;
        Ok((call, rows))
    }

    async fn quota_on(&self, shard: ShardId, sql: &str, key: &str) -> Result<QuotaUsage, ClientError> {
        let (call, rows) = self.on_shard(shard, Owned::Shard, sql, &[&key]).await?;
        let row = single(&call, &rows)?;
        let read = || -> Result<QuotaUsage, tokio_postgres::Error> {
            Ok(QuotaUsage {
                active_executions: row.try_get("active_executions")?,
                history_bytes: row.try_get("history_bytes")?,
                dead_letters: row.try_get("dead_letters")?,
            })
        };
        read().map_err(|e| call.error(e, 1))
    }
}

impl Admin<'_> {
    /// `queue`'s tasks by state on every readable shard (a shard that has
    /// never seen the queue reports zeros); [`FleetReport::total`] sums them.
    pub async fn queue_stats(self, queue: &str) -> FleetReport<QueueStats> {
        self.client
            .fan_out(self.client.readable_shards(), |shard| async move {
                let (call, rows) = self
                    .client
                    .on_shard(shard, Owned::Queue(queue.to_owned()), QUEUE_STATS, &[&queue])
                    .await?;
                let row = single(&call, &rows)?;
                let read = || -> Result<QueueStats, tokio_postgres::Error> {
                    Ok(QueueStats {
                        ready: row.try_get("ready")?,
                        scheduled: row.try_get("scheduled")?,
                        running: row.try_get("running")?,
                        waiting: row.try_get("waiting")?,
                        dead: row.try_get("dead")?,
                        live_workers: row.try_get("live_workers")?,
                        oldest_ready_age: secs(row.try_get("oldest_ready_secs")?),
                    })
                };
                read().map_err(|e| call.error(e, 1))
            })
            .await
    }

    /// Every concurrency key of every readable shard: its cap and its tasks
    /// by state, per shard.
    pub async fn concurrency_stats(self) -> FleetReport<Vec<ConcurrencyStat>> {
        self.client
            .fan_out(self.client.readable_shards(), |shard| async move {
                let (call, rows) = self
                    .client
                    .on_shard(shard, Owned::Shard, CONCURRENCY_STATS, &[])
                    .await?;
                rows.iter()
                    .map(|row| {
                        let read = || -> Result<ConcurrencyStat, tokio_postgres::Error> {
                            Ok(ConcurrencyStat {
                                concurrency_key: row.try_get("concurrency_key")?,
                                max_running: row.try_get("max_running")?,
                                running: row.try_get("running")?,
                                ready: row.try_get("ready")?,
                                waiting: row.try_get("waiting")?,
                            })
                        };
                        read().map_err(|e| call.error(e, 1))
                    })
                    .collect()
            })
            .await
    }

    /// The rows PostgreSQL counted as deleted from `sheaf.tasks` since its
    /// statistics were last reset, per readable shard: a shard keeps no
    /// count of the tasks it finished, so two samples of this give the
    /// fleet's throughput (the dashboard's queues page charts it).
    pub async fn tasks_deleted(self) -> FleetReport<i64> {
        self.client
            .fan_out(self.client.readable_shards(), |shard| async move {
                let (call, rows) = self
                    .client
                    .on_shard(shard, Owned::Shard, TASKS_DELETED, &[])
                    .await?;
                single(&call, &rows)?
                    .try_get::<_, i64>(0)
                    .map_err(|e| call.error(e, 1))
            })
            .await
    }

    /// The workers live on each readable shard (a heartbeat in the last 60 s).
    pub async fn live_workers(self) -> FleetReport<Vec<RegisteredWorker>> {
        self.client
            .fan_out(self.client.readable_shards(), |shard| async move {
                let (call, rows) = self
                    .client
                    .on_shard(shard, Owned::Shard, LIVE_WORKERS, &[])
                    .await?;
                rows.iter()
                    .map(|row| {
                        let read = || -> Result<RegisteredWorker, tokio_postgres::Error> {
                            Ok(RegisteredWorker {
                                worker: row.try_get("worker")?,
                                queues: row.try_get("queues")?,
                                last_seen_at: row.try_get("last_seen_at")?,
                            })
                        };
                        read().map_err(|e| call.error(e, 1))
                    })
                    .collect()
            })
            .await
    }

    /// The queues of each readable shard with claimable tasks and no live
    /// worker serving them.
    pub async fn stranded_work(self) -> FleetReport<Vec<StrandedWork>> {
        self.client
            .fan_out(self.client.readable_shards(), |shard| async move {
                let (call, rows) = self
                    .client
                    .on_shard(shard, Owned::Shard, STRANDED_WORK, &[])
                    .await?;
                rows.iter()
                    .map(|row| {
                        let read = || -> Result<StrandedWork, tokio_postgres::Error> {
                            Ok(StrandedWork {
                                queue: row.try_get("queue")?,
                                ready: row.try_get("ready")?,
                                oldest_ready_age: secs(row.try_get("oldest_ready_secs")?),
                            })
                        };
                        read().map_err(|e| call.error(e, 1))
                    })
                    .collect()
            })
            .await
    }

    /// A quota key's counters on every readable shard (quotas count per
    /// shard); [`FleetReport::total`] sums them.
    pub async fn quota_usage(self, key: &str) -> FleetReport<QuotaUsage> {
        self.client
            .fan_out(self.client.readable_shards(), |shard| {
                self.client.quota_on(shard, QUOTA_USAGE, key)
            })
            .await
    }

    /// Recounts a quota key from the raw rows on every readable shard,
    /// stores and returns each recount.
    pub async fn quota_recompute(self, key: &str) -> FleetReport<QuotaUsage> {
        self.client
            .fan_out(self.client.readable_shards(), |shard| {
                self.client.quota_on(shard, QUOTA_RECOMPUTE, key)
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(n: u32) -> ShardId {
        ShardId::new(n).unwrap()
    }

    #[test]
    fn a_report_with_a_failed_shard_is_incomplete_and_says_how_many() {
        let mut report = FleetReport {
            ok: BTreeMap::from([(shard(0), 3u32)]),
            failed: BTreeMap::new(),
        };
        assert!(report.is_complete());
        report
            .failed
            .insert(shard(1), ClientError::BadRequest("down".into()));
        assert!(!report.is_complete());
        let e = report.into_result().unwrap_err();
        assert_eq!(
            e.to_string(),
            "1 of 2 shards failed (first: invalid request: down)"
        );
    }

    #[test]
    fn totals_add_counts_and_keep_the_oldest_age() {
        let a = QueueStats {
            ready: 2,
            dead: 1,
            oldest_ready_age: Some(Duration::from_secs(3)),
            ..QueueStats::default()
        };
        let b = QueueStats {
            ready: 5,
            running: 4,
            oldest_ready_age: None,
            ..QueueStats::default()
        };
        let report = FleetReport {
            ok: BTreeMap::from([(shard(0), a), (shard(1), b)]),
            failed: BTreeMap::new(),
        };
        let t = report.total();
        assert_eq!((t.ready, t.running, t.dead), (7, 4, 1));
        assert_eq!(t.oldest_ready_age, Some(Duration::from_secs(3)));
        assert_eq!(secs(Some(-1.0)), Some(Duration::ZERO));
    }
}
