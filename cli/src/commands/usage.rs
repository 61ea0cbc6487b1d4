//! `sheaf usage`: what the executions of every shard used in a window.

use serde_json::json;
use sheaf_driver::{GroupBy, PageStatus};

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{failures_json, print_json, say};

/// What the executions of every shard used in a window (at most 90
/// days), per workflow or per search attribute: starts, ends, activity
/// attempts and compute seconds, metered units. Exits 3 when partial.
#[derive(clap::Args)]
pub struct Args {
    /// Where the window starts: a duration back from now (24h, 7days)
    /// or a timestamp (2026-11-01T00:00:00Z).
    #[arg(long)]
    from: String,
    /// Where it ends (exclusive), the same forms.
    #[arg(long, default_value = "0s")]
    to: String,
    /// workflow_name, or a search attribute (tenant or search_attr:tenant).
    #[arg(long, default_value = "workflow_name")]
    group_by: String,
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

pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let parsed = (
        crate::parse::time(&args.from),
        crate::parse::time(&args.to),
        group_by(&args.group_by),
    );
    let (from, to, by) = match parsed {
        (Ok(f), Ok(t), Ok(g)) => (f, t, g),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return exit::bad_input(e),
    };
    let report = match client.admin().usage_report(from, to, &by).await {
        Ok(r) => r,
        Err(e) => return exit::failed(&e),
    };
    if ctx.json {
        print_json(&json!({
            "groups": report.groups,
            "per_shard": report.per_shard.iter().map(|(s, g)| (s.to_string(), json!(g))).collect::<serde_json::Map<_, _>>(),
            "status": report.status,
            "unavailable_shards": failures_json(&report.unavailable_shards),
        }));
    } else {
        say!(
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
            say!(
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

#[cfg(test)]
mod tests {
    use super::*;

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
