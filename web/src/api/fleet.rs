//! The fleet: queues, schedules, rate limits and their overrides, usage
//! (bounded: a few computed at once, a few a minute, each kept a minute),
//! its status, and the probes `/health` (no database call) and `/ready`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sheaf_driver::{GroupBy, OverrideReport};
use tokio::sync::Semaphore;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::{Act, Read};
use super::error::{ApiError, ErrorBody};
use super::{ApiState, Completeness, Query, any_answered, body, duration_param, ok, time};

pub(super) fn routes() -> OpenApiRouter<Arc<ApiState>> {
    OpenApiRouter::new()
        .routes(routes!(queues))
        .routes(routes!(schedules))
        .routes(routes!(rate_limits))
        .routes(routes!(set_override, clear_override))
        .routes(routes!(usage))
        .routes(routes!(fleet))
        .routes(routes!(health))
        .routes(routes!(ready))
}

/// One queue's tasks by state, summed over the shards that answered.
#[derive(Serialize, ToSchema)]
struct QueueOut {
    queue: String,
    ready: i64,
    scheduled: i64,
    running: i64,
    waiting: i64,
    paused: i64,
    dead: i64,
    /// The age of its oldest ready task, in seconds.
    oldest_ready_secs: Option<f64>,
}

/// Every queue.
#[derive(Serialize, ToSchema)]
struct QueuesOut {
    queues: Vec<QueueOut>,
    #[serde(flatten)]
    completeness: Completeness,
}

/// List every queue with its tasks by state.
#[utoipa::path(get, path = "/api/v1/queues", tag = "fleet",
    responses((status = 200, body = QueuesOut), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn queues(_: Read, State(api): State<Arc<ApiState>>) -> Result<Response, ApiError> {
    let listing = api.client.admin().list_queues().await;
    api.some_answered(listing.unavailable_shards.len())?;
    Ok(ok(QueuesOut {
        queues: listing
            .queues
            .iter()
            .map(|q| QueueOut {
                queue: q.queue.clone(),
                ready: q.total.ready,
                scheduled: q.total.scheduled,
                running: q.total.running,
                waiting: q.total.waiting,
                paused: q.total.paused,
                dead: q.total.dead,
                oldest_ready_secs: q.total.oldest_ready_age.map(|d| d.as_secs_f64()),
            })
            .collect(),
        completeness: Completeness::of_page(listing.status, &listing.unavailable_shards),
    }))
}

/// A schedule on one shard.
#[derive(Serialize, ToSchema)]
struct ScheduleOut {
    shard: u16,
    name: String,
    spec: Value,
    paused: bool,
    next_fire_at: Option<String>,
    last_fire_at: Option<String>,
    last_error: Option<String>,
    fires: i64,
    skipped: i64,
}

/// Every schedule.
#[derive(Serialize, ToSchema)]
struct SchedulesOut {
    schedules: Vec<ScheduleOut>,
    #[serde(flatten)]
    completeness: Completeness,
}

/// List every schedule.
#[utoipa::path(get, path = "/api/v1/schedules", tag = "fleet",
    responses((status = 200, body = SchedulesOut), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn schedules(_: Read, State(api): State<Arc<ApiState>>) -> Result<Response, ApiError> {
    let report = api.client.admin().list_schedules().await;
    any_answered(&report)?;
    Ok(ok(SchedulesOut {
        schedules: report
            .ok
            .values()
            .flatten()
            .map(|s| ScheduleOut {
                shard: s.shard.get(),
                name: s.name.clone(),
                spec: s.spec.to_value().unwrap_or(Value::Null),
                paused: s.paused,
                next_fire_at: s.next_fire_at.map(time),
                last_fire_at: s.last_fire_at.map(time),
                last_error: s.last_error.clone(),
                fires: s.fires,
                skipped: s.skipped,
            })
            .collect(),
        completeness: Completeness::of(&report.failed),
    }))
}

/// A live pacing override.
#[derive(Serialize, ToSchema)]
struct PaceOut {
    rate: f64,
    period_secs: f64,
    until: String,
}

/// A rate limit on one shard.
#[derive(Serialize, ToSchema)]
struct RateLimitOut {
    shard: u16,
    name: String,
    spec: Value,
    #[serde(rename = "override")]
    pace: Option<PaceOut>,
    buckets: i64,
    waiting: i64,
}

/// Every rate limit.
#[derive(Serialize, ToSchema)]
struct RateLimitsOut {
    rate_limits: Vec<RateLimitOut>,
    #[serde(flatten)]
    completeness: Completeness,
}

/// List every rate limit with its override, per shard.
#[utoipa::path(get, path = "/api/v1/rate-limits", tag = "fleet",
    responses((status = 200, body = RateLimitsOut), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn rate_limits(_: Read, State(api): State<Arc<ApiState>>) -> Result<Response, ApiError> {
    let report = api.client.admin().rate_limits().await;
    any_answered(&report)?;
    let mut limits = Vec::new();
    for (shard, list) in &report.ok {
        for r in list {
            limits.push(RateLimitOut {
                shard: shard.get(),
                name: r.name.clone(),
                spec: r.spec.to_value().unwrap_or(Value::Null),
                pace: r.override_pace.map(|(rate, period, until)| PaceOut {
                    rate,
                    period_secs: period.as_secs_f64(),
                    until: time(until),
                }),
                buckets: r.buckets,
                waiting: r.waiting,
            });
        }
    }
    Ok(ok(RateLimitsOut {
        rate_limits: limits,
        completeness: Completeness::of(&report.failed),
    }))
}

/// A pacing override: `rate` per `period`, for `ttl`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct OverrideIn {
    /// Units per period (more than 0).
    rate: f64,
    /// The period (`1s`, `1m`).
    period: String,
    /// How long the override lasts (`10m`, `2h`).
    ttl: String,
}

/// What an override's fan-out did.
#[derive(Serialize, ToSchema)]
struct OverrideOut {
    /// How many shards took it.
    applied: usize,
    /// How many of them changed (for a clear: had a live override).
    changed: usize,
    #[serde(flatten)]
    completeness: Completeness,
}

fn override_out(report: &OverrideReport) -> Result<Response, ApiError> {
    if report.applied.is_empty() && !report.shard_errors.is_empty() {
        return Err(ApiError::unavailable("no shard took it; retry later"));
    }
    Ok(ok(OverrideOut {
        applied: report.applied.len(),
        changed: report.changed.len(),
        completeness: Completeness::of(&report.shard_errors),
    }))
}

/// Override a rate limit's pace on every readable shard, for a while.
#[utoipa::path(put, path = "/api/v1/rate-limits/{name}/override", tag = "fleet",
    params(("name" = String, Path, description = "The rate limit")),
    request_body = OverrideIn,
    responses(
        (status = 200, body = OverrideOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn set_override(
    _: Act,
    State(api): State<Arc<ApiState>>,
    Path(name): Path<String>,
    raw: Bytes,
) -> Result<Response, ApiError> {
    let o: OverrideIn = body(&raw)?;
    let period = duration_param("period", &o.period)?;
    let ttl = duration_param("ttl", &o.ttl)?;
    let until = SystemTime::now()
        .checked_add(ttl)
        .ok_or_else(|| ApiError::bad("ttl", "too long"))?;
    let report = api
        .acting
        .admin()
        .set_rate_override(&name, o.rate, period, until)
        .await?;
    override_out(&report)
}

/// End a rate limit's override on every readable shard: 404 when no shard
/// had a live one.
#[utoipa::path(delete, path = "/api/v1/rate-limits/{name}/override", tag = "fleet",
    params(("name" = String, Path, description = "The rate limit")),
    responses(
        (status = 200, body = OverrideOut),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn clear_override(
    _: Act,
    State(api): State<Arc<ApiState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let report = api.acting.admin().clear_rate_override(&name).await?;
    if report.changed.is_empty() && report.shard_errors.is_empty() {
        return Err(ApiError::not_found(format!("no live override of {name:?}")));
    }
    override_out(&report)
}

/// Reports computed at once, at most; more wait for none (429).
const REPORTS_AT_ONCE: usize = 2;
/// Fresh reports computed per minute, at most.
const REPORTS_PER_MINUTE: usize = 10;
/// How long a report is kept for the same parameters.
const KEEP_REPORT: Duration = Duration::from_secs(60);
/// Reports kept, at most.
const KEPT_REPORTS: usize = 32;

/// (from, to, group by) of a usage report.
type ReportKey = (u64, u64, String);

/// The usage reports lately computed, and what bounds computing more.
pub(crate) struct Reports {
    kept: Mutex<HashMap<ReportKey, (Instant, Arc<Value>)>>,
    computed: Mutex<VecDeque<Instant>>,
    at_once: Semaphore,
}

impl Default for Reports {
    fn default() -> Self {
        Reports {
            kept: Mutex::default(),
            computed: Mutex::default(),
            at_once: Semaphore::new(REPORTS_AT_ONCE),
        }
    }
}

impl Reports {
    fn kept(&self, key: &ReportKey) -> Option<Arc<Value>> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.get(key)
            .filter(|(at, _)| at.elapsed() < KEEP_REPORT)
            .map(|(_, v)| v.clone())
    }

    fn keep(&self, key: ReportKey, value: Arc<Value>) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain(|_, (at, _)| at.elapsed() < KEEP_REPORT);
        if kept.len() >= KEPT_REPORTS
            && let Some(oldest) = kept.iter().min_by_key(|(_, (at, _))| *at).map(|(k, _)| k.clone())
        {
            kept.remove(&oldest);
        }
        kept.insert(key, (Instant::now(), value));
    }

    /// Counts a fresh report against the minute's budget, or refuses it.
    fn budget(&self) -> Result<(), ApiError> {
        let mut computed = self.computed.lock().unwrap_or_else(|e| e.into_inner());
        while computed
            .front()
            .is_some_and(|at| at.elapsed() >= Duration::from_secs(60))
        {
            computed.pop_front();
        }
        if computed.len() >= REPORTS_PER_MINUTE {
            return Err(ApiError::too_many(
                "too many usage reports this minute; retry later (the same parameters are kept a minute)",
            ));
        }
        computed.push_back(Instant::now());
        Ok(())
    }
}

/// Seconds since 1970, for a report's key.
fn epoch(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What each group used in a window.
#[derive(Serialize, ToSchema)]
struct UsageOut {
    from: String,
    to: String,
    /// Per group: starts, completions, failures, activity counts and compute seconds, metered values.
    #[schema(value_type = Object)]
    groups: Value,
    #[serde(flatten)]
    completeness: Completeness,
}

/// The usage report of a window, per workflow or per value of a search
/// attribute (bounded: the same parameters are answered from the last
/// minute's report; a few are computed at once and a minute, else 429).
#[utoipa::path(get, path = "/api/v1/usage", tag = "fleet",
    params(
        ("from" = Option<String>, Query, description = "The window's start (RFC 3339; default: a day before `to`)"),
        ("to" = Option<String>, Query, description = "The window's end (RFC 3339; default: now, to the minute)"),
        ("group_by" = Option<String>, Query, description = "`workflow` (the default) or `attr:KEY`")),
    responses(
        (status = 200, body = UsageOut),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
async fn usage(
    _: Read,
    State(api): State<Arc<ApiState>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref());
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(epoch(SystemTime::now()) / 60 * 60);
    let to = q.time("to")?.unwrap_or(now);
    let from = match q.time("from")? {
        Some(at) => at,
        None => to
            .checked_sub(Duration::from_secs(86_400))
            .unwrap_or(SystemTime::UNIX_EPOCH),
    };
    if from >= to {
        return Err(ApiError::bad("from", "must be before to"));
    }
    let (group, by) = match q.get("group_by") {
        None | Some("workflow") => ("workflow".to_owned(), GroupBy::WorkflowName),
        Some(g) => match g.strip_prefix("attr:") {
            Some(key) if !key.is_empty() && key.len() <= 128 => {
                (g.to_owned(), GroupBy::SearchAttr(key.to_owned()))
            }
            _ => return Err(ApiError::bad("group_by", "must be workflow or attr:KEY")),
        },
    };
    let key = (epoch(from), epoch(to), group);
    if let Some(kept) = api.reports.kept(&key) {
        return Ok(ok(kept.as_ref()));
    }
    let Ok(_permit) = api.reports.at_once.try_acquire() else {
        return Err(ApiError::too_many(
            "usage reports are being computed; retry later",
        ));
    };
    api.reports.budget()?;
    let report = api.client.admin().usage_report(from, to, &by).await?;
    api.some_answered(report.unavailable_shards.len())?;
    let value = serde_json::to_value(UsageOut {
        from: time(from),
        to: time(to),
        groups: serde_json::to_value(&report.groups).unwrap_or(Value::Null),
        completeness: Completeness::of_page(report.status, &report.unavailable_shards),
    })
    .map_err(|e| ApiError::unavailable(&format!("the report could not be written: {e}")))?;
    let value = Arc::new(value);
    // A partial report is not kept: the next ask may find every shard.
    if report.unavailable_shards.is_empty() {
        api.reports.keep(key, value.clone());
    }
    Ok(ok(value.as_ref()))
}

/// One shard's readiness (act scope only: a read token learns counts).
#[derive(Serialize, ToSchema)]
struct ShardOut {
    shard: u16,
    reachable: bool,
    ready: bool,
    breaker: &'static str,
    /// Each reason it is not ready (or only reported), by code.
    reasons: Vec<&'static str>,
}

/// The fleet at a glance.
#[derive(Serialize, ToSchema)]
struct FleetOut {
    /// Shards in this server's topology.
    shards: usize,
    /// Of those, how many are ready.
    ready: usize,
    /// The schema version most shards run.
    schema_version: Option<String>,
    /// This server's topology digest.
    digest: String,
    /// Per shard (act-scope tokens only).
    #[serde(skip_serializing_if = "Option::is_none")]
    per_shard: Option<Vec<ShardOut>>,
}

/// The fleet's status: how many shards are ready; per shard with an act token.
#[utoipa::path(get, path = "/api/v1/fleet", tag = "fleet",
    responses((status = 200, body = FleetOut), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
async fn fleet(read: Read, State(api): State<Arc<ApiState>>) -> Result<Response, ApiError> {
    let (status, verdicts) = api.client.admin().fleet_health(api.probe_timeout).await;
    let per_shard = read.act.then(|| {
        status
            .shards
            .iter()
            .zip(&verdicts)
            .map(|(s, v)| ShardOut {
                shard: s.probe.shard.get(),
                reachable: s.probe.reachable,
                ready: v.ready,
                breaker: s.breaker.as_str(),
                reasons: v.reason_codes.iter().map(|r| r.code()).collect(),
            })
            .collect()
    });
    Ok(ok(FleetOut {
        shards: status.shards.len(),
        ready: verdicts.iter().filter(|v| v.ready).count(),
        schema_version: status.schema_version.clone(),
        digest: api.client.topology().digest(),
        per_shard,
    }))
}

/// A probe's answer.
#[derive(Serialize, ToSchema)]
struct ProbeOut {
    /// `ok`, `ready` or `not ready`.
    status: &'static str,
    /// Shards ready, of how many (`/ready` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    ready_shards: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shards: Option<usize>,
}

/// Liveness: the process answers (no database call, no token).
#[utoipa::path(get, path = "/health", tag = "probes",
    responses((status = 200, body = ProbeOut)))]
async fn health() -> Response {
    ok(ProbeOut {
        status: "ok",
        ready_shards: None,
        shards: None,
    })
}

/// Readiness: every shard answers its probe as the shard this server
/// expects, on a schema it works with, under the topology it declares
/// (200), else 503 (no token). Stranded work or a missing worker does not
/// hold this server back: `/api/v1/fleet` reports those.
#[utoipa::path(get, path = "/ready", tag = "probes",
    responses((status = 200, body = ProbeOut), (status = 503, body = ProbeOut)))]
async fn ready(State(api): State<Arc<ApiState>>) -> Response {
    let verdict = api.client.admin().fleet_readiness(api.probe_timeout).await;
    let (all, serving) = (verdict.ready, verdict.serving());
    let body = ProbeOut {
        status: if all { "ready" } else { "not ready" },
        ready_shards: Some(serving),
        shards: Some(verdict.shards.len()),
    };
    let status = if all {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, ok(body)).into_response()
}
