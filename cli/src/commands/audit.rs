//! `sheaf audit`: what operators did, from every shard's audit log.

use serde_json::json;

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{failures_json, print_json, say};

/// What operators did, newest first, from every shard's audit log
/// (configuration, topology digests, redrives, terminations), each with
/// the actor its session declared (--actor) and its login role.
#[derive(clap::Args)]
pub struct Args {
    /// Entries per shard.
    #[arg(long, default_value_t = 50)]
    limit: i32,
}

/// The newest entries of every shard's audit log, merged newest first.
pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (limit, as_json) = (args.limit, ctx.json);
    if !(1..=1000).contains(&limit) {
        return exit::bad_input(format!("--limit must be from 1 to 1000, got {limit}"));
    }
    let report = client.admin().fleet_audit_log(limit).await;
    let mut entries: Vec<&sheaf_driver::AuditEntry> = report.ok.values().flatten().collect();
    entries.sort_by(|a, b| b.at.cmp(&a.at).then(b.id.cmp(&a.id)));
    if as_json {
        let items: Vec<serde_json::Value> = entries
            .iter()
            .map(|e| {
                json!({
                    "shard": e.shard.get(), "id": e.id,
                    "at": humantime::format_rfc3339_micros(e.at).to_string(),
                    "actor": e.actor, "login": e.login, "action": e.action, "target": e.target, "outcome": e.outcome,
                    "detail": e.detail.as_ref().and_then(|d| d.to_value().ok()),
                })
            })
            .collect();
        print_json(&json!({"items": items, "failed": failures_json(&report.failed)}));
    } else {
        say!(
            "{:<27} {:<6} {:<16} {:<16} {:<22} {:<10} target",
            "at",
            "shard",
            "actor",
            "login",
            "action",
            "outcome"
        );
        for e in entries {
            say!(
                "{:<27} {:<6} {:<16} {:<16} {:<22} {:<10} {}",
                humantime::format_rfc3339_seconds(e.at).to_string(),
                e.shard,
                e.actor,
                e.login,
                e.action,
                e.outcome,
                e.target.as_deref().unwrap_or("")
            );
        }
    }
    exit::partial_if(&report.failed, !report.failed.is_empty())
}
