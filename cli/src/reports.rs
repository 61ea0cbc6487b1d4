//! `sheaf usage` and `sheaf concurrency`: reports merged across shards.

use std::process::ExitCode;
use std::time::SystemTime;

use serde_json::json;
use sheaf_driver::{Client, GroupBy, PageStatus};

use crate::exit;

/// A `--from`/`--to` time: a duration back from now (`24h`, `7days`,
/// `90min`) or a timestamp (`2026-11-01T00:00:00Z`, `2026-11-01 00:00:00`).
pub fn parse_time(text: &str) -> Result<SystemTime, String> {
    if let Ok(ago) = humantime::parse_duration(text) {
        return SystemTime::now()
            .checked_sub(ago)
            .ok_or_else(|| format!("{text:?} reaches before the epoch"));
    }
    humantime::parse_rfc3339_weak(text).map_err(|_| {
        format!("{text:?} is neither a duration back from now (24h) nor a timestamp (2026-11-01T00:00:00Z)")
    })
}

fn group_by(text: &str) -> Result<GroupBy, String> {
    if text == "workflow_name" || text == "workflow" {
        return Ok(GroupBy::WorkflowName);
    }
    let key = text.strip_prefix("search_attr:").unwrap_or(text);
    if key.is_empty() {
        return Err(
            "--group-by takes workflow_name or a search attribute (tenant, search_attr:tenant)".into(),
        );
    }
    Ok(GroupBy::SearchAttr(key.to_owned()))
}

pub async fn usage(client: &Client, from: &str, to: &str, by: &str, as_json: bool) -> ExitCode {
    let (from, to, by) = match (parse_time(from), parse_time(to), group_by(by)) {
        (Ok(f), Ok(t), Ok(g)) => (f, t, g),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return exit::usage(e),
    };
    let report = match client.usage_report(from, to, &by).await {
        Ok(r) => r,
        Err(e) => return exit::failed(&e),
    };
    if as_json {
        exit::print_json(&json!({
            "groups": report.groups,
            "per_shard": report.per_shard.iter().map(|(s, g)| (s.to_string(), json!(g))).collect::<serde_json::Map<_, _>>(),
            "status": report.status,
            "unavailable_shards": exit::failures_json(&report.unavailable_shards),
        }));
    } else {
        println!(
            "{:<24} {:>7} {:>9} {:>7} {:>9} {:>9} {:>9} {:>8} {:>11}  metered",
            "group",
            "starts",
            "completed",
            "failed",
            "cancelled",
            "timed_out",
            "attempts",
            "a.failed",
            "compute_s"
        );
        for (group, u) in &report.groups {
            let metered: Vec<String> = u.metered.iter().map(|(k, v)| format!("{k}={v}")).collect();
            println!(
                "{:<24} {:>7} {:>9} {:>7} {:>9} {:>9} {:>9} {:>8} {:>11.1}  {}",
                group,
                u.workflow_starts,
                u.completed,
                u.failed,
                u.cancelled,
                u.timed_out,
                u.activity_executions,
                u.activity_executions_failed,
                u.activity_compute_seconds,
                metered.join(" ")
            );
        }
    }
    exit::partial_if(&report.unavailable_shards, report.status == PageStatus::Partial)
}

pub async fn concurrency(client: &Client, as_json: bool) -> ExitCode {
    let report = match client.concurrency_report().await {
        Ok(r) => r,
        Err(e) => return exit::failed(&e),
    };
    if as_json {
        exit::print_json(&json!({
            "keys": report.groups,
            "status": report.status,
            "unavailable_shards": exit::failures_json(&report.unavailable_shards),
        }));
    } else {
        println!(
            "{:<32} {:>8} {:>8} {:>8}  caps per shard",
            "key", "running", "ready", "waiting"
        );
        for (key, k) in &report.groups {
            let caps: Vec<String> = k.caps.iter().map(|(s, c)| format!("{s}:{c}")).collect();
            println!(
                "{:<32} {:>8} {:>8} {:>8}  {}",
                key,
                k.running,
                k.ready,
                k.waiting,
                if caps.is_empty() {
                    "-".to_owned()
                } else {
                    caps.join(" ")
                }
            );
        }
    }
    exit::partial_if(&report.unavailable_shards, report.status == PageStatus::Partial)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_are_durations_back_or_timestamps() {
        let day_ago = parse_time("24h").unwrap();
        let back = SystemTime::now().duration_since(day_ago).unwrap();
        assert!(back >= Duration::from_secs(86_399) && back <= Duration::from_secs(86_460));
        assert_eq!(
            parse_time("1970-01-02T00:00:00Z").unwrap(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(86_400)
        );
        assert!(parse_time("yesterday").is_err());
    }

    #[test]
    fn group_by_takes_a_workflow_or_an_attribute() {
        assert_eq!(group_by("workflow_name").unwrap(), GroupBy::WorkflowName);
        assert_eq!(group_by("tenant").unwrap(), GroupBy::SearchAttr("tenant".into()));
        assert_eq!(
            group_by("search_attr:tenant").unwrap(),
            GroupBy::SearchAttr("tenant".into())
        );
        assert!(group_by("search_attr:").is_err());
    }
}
