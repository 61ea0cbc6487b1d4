//! `sheaf rate-limits list|declare|override|clear`: rate limits and pacing
//! overrides on every shard.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use sheaf_driver::{Client, ClientError, OverrideReport, RateLimitInfo};

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{Column, failures_json, print_json, say, table, time};

/// Rate limits on every shard (each shard paces its own buckets) and
/// pacing overrides, fanned out to every readable shard. Exits 3 when
/// a shard did not answer or take it.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Every shard's rate limits, overrides, buckets and waiting units.
    List,
    /// Declare (or change) a rate limit on every shard.
    Declare {
        /// The limit's name.
        name: String,
        /// Units per period.
        #[arg(long)]
        rate: f64,
        /// The period (default 1s).
        #[arg(long)]
        period: Option<String>,
        /// Units at once (default: the rate, rounded up).
        #[arg(long)]
        burst: Option<i64>,
        /// A bucket per value of this payload path (payload.tenant).
        #[arg(long)]
        key: Option<String>,
    },
    /// Pace a limit (or workflow:NAME, a start throttle) at --rate per
    /// --period for --ttl, on every readable shard.
    Override {
        /// The limit's name, or workflow:NAME.
        name: String,
        /// Units per period.
        #[arg(long)]
        rate: f64,
        /// The period (1s, 1m).
        #[arg(long, value_parser = crate::parse::human_duration)]
        period: Duration,
        /// How long the override lasts (10m, 2h; each shard reads its end
        /// on its own clock).
        #[arg(long, value_parser = crate::parse::human_duration)]
        ttl: Duration,
    },
    /// Remove a pacing override on every readable shard.
    Clear {
        /// The limit's name, or workflow:NAME.
        name: String,
    },
}

pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let as_json = ctx.json;
    match args.what {
        Action::List => list(&client, as_json).await,
        Action::Declare {
            name,
            rate,
            period,
            burst,
            key,
        } => declare(&client, &name, rate, period, burst, key, as_json).await,
        Action::Override {
            name,
            rate,
            period,
            ttl,
        } => override_pace(&client, &name, rate, period, ttl, as_json).await,
        Action::Clear { name } => clear(&client, &name, as_json).await,
    }
}

/// Every shard's limits; exit 3 when a shard failed.
async fn list(client: &Client, as_json: bool) -> Exit {
    let report = client.admin().rate_limits().await;
    let rows: Vec<(String, &RateLimitInfo)> = report
        .ok
        .iter()
        .flat_map(|(shard, limits)| limits.iter().map(move |l| (shard.to_string(), l)))
        .collect();
    if as_json {
        print_json(&json!({
            "rate_limits": rows.iter().map(|(shard, l)| json!({
                "shard": shard,
                "name": l.name,
                "spec": l.spec.to_value().unwrap_or(Value::Null),
                "override": l.override_pace.map(|(rate, period, until)| json!({
                    "rate": rate, "period_secs": period.as_secs_f64(), "expires_at": time(until),
                })),
                "buckets": l.buckets,
                "waiting": l.waiting,
            })).collect::<Vec<_>>(),
            "failed_shards": failures_json(&report.failed),
        }));
    } else {
        const COLUMNS: &[Column] = &[
            Column::left("shard", 5),
            Column::left("name", 24),
            Column::left("pace", 28),
            Column::left("override", 34),
            Column::right("buckets", 8),
            Column::right("waiting", 8),
        ];
        table(COLUMNS, rows.iter().map(|(shard, l)| limit_row(shard, l)));
    }
    exit::partial_if(&report.failed, !report.failed.is_empty())
}

/// A limit's line of `sheaf rate-limits list`.
fn limit_row(shard: &str, l: &RateLimitInfo) -> Vec<String> {
    let spec = l.spec.to_value().unwrap_or(Value::Null);
    let pace = format!(
        "{}/{} burst {}{}",
        spec["rate"],
        spec["period"].as_str().unwrap_or("?"),
        spec["burst"],
        spec["key"]
            .as_str()
            .map(|k| format!(" by {k}"))
            .unwrap_or_default()
    );
    let o = l
        .override_pace
        .map(|(rate, period, until)| format!("{rate}/{}s until {}", period.as_secs_f64(), time(until)))
        .unwrap_or_else(|| "-".into());
    vec![
        shard.to_owned(),
        l.name.clone(),
        pace,
        o,
        l.buckets.to_string(),
        l.waiting.to_string(),
    ]
}

/// `sheaf rate-limits declare NAME --rate R [--period P] [--burst B] [--key K]`.
async fn declare(
    client: &Client,
    name: &str,
    rate: f64,
    period: Option<String>,
    burst: Option<i64>,
    key: Option<String>,
    as_json: bool,
) -> Exit {
    let mut spec = json!({"rate": rate});
    if let Some(p) = period {
        spec["period"] = json!(p);
    }
    if let Some(b) = burst {
        spec["burst"] = json!(b);
    }
    if let Some(k) = key {
        spec["key"] = json!(k);
    }
    let report = client.admin().declare_rate_limit(name, spec).await;
    if let Some(e) = report
        .failed
        .values()
        .find(|e| matches!(e, ClientError::InvalidArgument { .. }))
    {
        return exit::failed(e);
    }
    if as_json {
        print_json(&json!({
            "declared_on": report.ok.keys().map(|s| s.get()).collect::<Vec<_>>(),
            "spec": report.ok.values().next().and_then(|s| s.to_value().ok()),
            "failed_shards": failures_json(&report.failed),
        }));
    } else {
        say!("declared rate limit {name} on {} shard(s)", report.ok.len());
    }
    exit::partial_if(&report.failed, !report.failed.is_empty())
}

/// Prints what a set or clear did: `changed` the shards it changed
/// (`applied` those that answered); exit 3 when a shard did not.
fn settled(what: &str, name: &str, r: &OverrideReport, as_json: bool) -> Exit {
    if as_json {
        print_json(&json!({
            "applied": r.applied.iter().map(|s| s.get()).collect::<Vec<_>>(),
            "changed": r.changed.iter().map(|s| s.get()).collect::<Vec<_>>(),
            "shard_errors": failures_json(&r.shard_errors),
        }));
    } else {
        say!("{what} {name} on {} shard(s)", r.changed.len());
    }
    exit::partial_if(&r.shard_errors, !r.is_complete())
}

/// `sheaf rate-limits override NAME --rate R --period P --ttl D`: on every
/// readable shard; exit 3 (naming them) when a shard did not take it.
async fn override_pace(
    client: &Client,
    name: &str,
    rate: f64,
    period: Duration,
    ttl: Duration,
    as_json: bool,
) -> Exit {
    let until = SystemTime::now() + ttl;
    match client.admin().set_rate_override(name, rate, period, until).await {
        Ok(r) => settled("overrode", name, &r, as_json),
        Err(e) => exit::failed(&e),
    }
}

/// `sheaf rate-limits clear NAME`: exit 4 when no shard had a live
/// override of it (3 wins when a shard did not answer: it may have one).
async fn clear(client: &Client, name: &str, as_json: bool) -> Exit {
    let none = || {
        exit::fail(
            Exit::NotFound,
            format!("no shard has a live override of {name}: nothing to clear"),
        )
    };
    // A limit's live override is listed: when every shard answers that it
    // has none, the clear is not sent, so no shard audits a no-op. A start
    // throttle's (`workflow:NAME`) is not listed: its clear is sent, and
    // each shard's audit entry says whether it cleared one.
    if !name.starts_with("workflow:") {
        let limits = client.admin().rate_limits().await;
        let live = limits
            .ok
            .values()
            .flatten()
            .any(|l| l.name == name && l.override_pace.is_some());
        if limits.failed.is_empty() && !live {
            return none();
        }
    }
    match client.admin().clear_rate_override(name).await {
        Ok(r) if r.changed.is_empty() && r.is_complete() => none(),
        Ok(r) => settled("cleared the override of", name, &r, as_json),
        Err(e) => exit::failed(&e),
    }
}
