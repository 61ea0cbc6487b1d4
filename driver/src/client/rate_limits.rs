//! Rate limits and pacing overrides across the fleet. A bucket is
//! shard-local (the guide: "Per-key activity rate limits are shard-local"),
//! so a limit is declared on every shard, and an override is written to
//! every readable shard (a draining shard still runs rate-limited work):
//! one call, effective everywhere. A fan-out that misses a shard says so
//! (`shard_errors`) and records `failed` in the audit log of the shards it
//! reached; one that reaches none is an error.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::fleet::FleetReport;
use super::{Admin, Client, ClientError, Owned, first_column};
use crate::json::Json;
use crate::topology::ShardId;

const DECLARE: &str = "SELECT sheaf.declare_rate_limit($1, $2)";
const SET_OVERRIDE: &str = "SELECT sheaf.set_rate_override($1, $2, make_interval(secs => $3), $4)";
const CLEAR_OVERRIDE: &str = "SELECT sheaf.clear_rate_override($1)";
const LIST: &str = "SELECT name, spec, override_rate, extract(epoch from override_period)::float8 AS override_secs, \
     override_expires_at, buckets, waiting FROM sheaf.rate_limits()";

/// A rate limit on one shard, as `sheaf.rate_limits` lists it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RateLimitInfo {
    /// Its name.
    pub name: String,
    /// Its spec, every default spelled out.
    pub spec: Json,
    /// A live pacing override: rate per period, until when.
    pub override_pace: Option<(f64, Duration, SystemTime)>,
    /// Its buckets on this shard.
    pub buckets: i64,
    /// Units waiting in its buckets' lines on this shard.
    pub waiting: i64,
}

/// What an override's fan-out did.
#[derive(Debug)]
#[non_exhaustive]
pub struct OverrideReport {
    /// The shards that took it.
    pub applied: Vec<ShardId>,
    /// The shards that did not, with why: they keep their pace.
    pub shard_errors: BTreeMap<ShardId, ClientError>,
    /// For a clear, the shards of `applied` that had a live override and
    /// ended it (the others had none to end); for a set, every one of them.
    pub changed: Vec<ShardId>,
}

impl OverrideReport {
    /// Every readable shard took it.
    pub fn is_complete(&self) -> bool {
        self.shard_errors.is_empty()
    }
}

impl Client {
    /// A fan-out's report: an error if no shard took it, else every shard's
    /// outcome, with a `failed` audit entry on the shards that took a
    /// partial one.
    async fn settle_fan_out(
        &self,
        action: &str,
        name: &str,
        report: FleetReport<bool>,
    ) -> Result<OverrideReport, ClientError> {
        let FleetReport { ok, mut failed } = report;
        let changed: Vec<ShardId> = ok.iter().filter(|(_, c)| **c).map(|(s, _)| *s).collect();
        let applied: Vec<ShardId> = ok.into_keys().collect();
        if applied.is_empty()
            && let Some((_, first)) = failed.pop_first()
        {
            return Err(first);
        }
        if !failed.is_empty() {
            let detail = Json::from(serde_json::json!({
                "fan_out": action,
                "shards_applied": applied.len(),
                "shards_failed": failed.len(),
            }));
            let detail = &detail;
            let noted = self
                .fan_out(applied.clone(), |shard| async move {
                    self.admin()
                        .audit_note(shard, action, name, "failed", detail)
                        .await
                })
                .await;
            for (shard, e) in &noted.failed {
                tracing::warn!(%shard, error = %e, "could not record a partial fan-out in the audit log");
            }
        }
        Ok(OverrideReport {
            applied,
            shard_errors: failed,
            changed,
        })
    }
}

impl Admin<'_> {
    /// Declares (or redeclares) rate limit `name` on every shard:
    /// `{"rate": 10, "period": "1s", "burst": 10, "key": "payload.tenant"}`.
    /// Each shard's answer is its stored spec; check
    /// [`FleetReport::is_complete`].
    pub async fn declare_rate_limit(self, name: &str, spec: impl Into<Json>) -> FleetReport<Json> {
        let spec = spec.into();
        let spec = &spec;
        self.client
            .fan_out(self.client.every_shard(), |shard| async move {
                let (call, rows) = self
                    .client
                    .on_shard(shard, Owned::Shard, DECLARE, &[&name, spec])
                    .await?;
                first_column(&call, &rows)
            })
            .await
    }

    /// Paces `name` (a rate limit, or `workflow:<name>` for a start
    /// throttle) at `rate` per `period` until `expires_at` (each shard reads
    /// it on its own clock), on every readable shard. A keyed limit is
    /// refused ([`ClientError::WrongState`]); so is a fan-out that reached
    /// no shard (the first shard's error). A partial one is reported in
    /// `shard_errors` and recorded `failed` in the audit log of the shards
    /// it reached.
    pub async fn set_rate_override(
        self,
        name: &str,
        rate: f64,
        period: Duration,
        expires_at: SystemTime,
    ) -> Result<OverrideReport, ClientError> {
        let secs = period.as_secs_f64();
        let report = self
            .client
            .fan_out(self.client.readable_shards(), |shard| async move {
                self.client
                    .on_shard(
                        shard,
                        Owned::Shard,
                        SET_OVERRIDE,
                        &[&name, &rate, &secs, &expires_at],
                    )
                    .await
                    .map(|_| true)
            })
            .await;
        self.client
            .settle_fan_out("set_rate_override", name, report)
            .await
    }

    /// Removes `name`'s pacing override on every readable shard (those
    /// without one answer as well); reported as
    /// [`set_rate_override`](Self::set_rate_override) is, with the shards
    /// that had a live one in [`OverrideReport::changed`].
    pub async fn clear_rate_override(self, name: &str) -> Result<OverrideReport, ClientError> {
        let report = self
            .client
            .fan_out(self.client.readable_shards(), |shard| async move {
                let (call, rows) = self
                    .client
                    .on_shard(shard, Owned::Shard, CLEAR_OVERRIDE, &[&name])
                    .await?;
                first_column(&call, &rows)
            })
            .await;
        self.client
            .settle_fan_out("clear_rate_override", name, report)
            .await
    }

    /// Every readable shard's rate limits.
    pub async fn rate_limits(self) -> FleetReport<Vec<RateLimitInfo>> {
        self.client
            .fan_out(self.client.readable_shards(), |shard| async move {
                let (call, rows) = self
                    .client
                    .on_shard(shard, Owned::Listing("rate limits"), LIST, &[])
                    .await?;
                rows.iter()
                    .map(|row| {
                        let read = || -> Result<RateLimitInfo, tokio_postgres::Error> {
                            let rate: Option<f64> = row.try_get("override_rate")?;
                            let secs: Option<f64> = row.try_get("override_secs")?;
                            let until: Option<SystemTime> = row.try_get("override_expires_at")?;
                            Ok(RateLimitInfo {
                                name: row.try_get("name")?,
                                spec: row.try_get("spec")?,
                                override_pace: match (rate, secs, until) {
                                    (Some(r), Some(s), Some(u)) => {
                                        Some((r, Duration::from_secs_f64(s.max(0.0)), u))
                                    }
                                    _ => None,
                                },
                                buckets: row.try_get("buckets")?,
                                waiting: row.try_get("waiting")?,
                            })
                        };
                        read().map_err(|e| call.error(e, 1))
                    })
                    .collect()
            })
            .await
    }
}
