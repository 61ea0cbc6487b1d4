//! `sheaf config apply FILE`, `sheaf config diff` and `sheaf config show`: the fleet's workflow
//! policies, queue options and caps, declared once and held alike by every
//! shard; `sheaf audit`: what operators did to them.

use std::process::ExitCode;

use serde_json::json;
use sheaf_driver::{Client, FleetConfig, config_drift};

use crate::exit;

/// Applies the file to every shard; exits 3 when a shard did not take it.
pub async fn apply(client: &Client, path: &str, as_json: bool) -> ExitCode {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return exit::usage(format!("cannot read {path}: {e}")),
    };
    let config = match FleetConfig::parse(&text) {
        Ok(c) => c,
        Err(e) => return exit::usage(format!("{path}: {e}")),
    };
    let report = client.apply_config(&config).await;
    let applied: Vec<String> = report.ok.keys().map(ToString::to_string).collect();
    if as_json {
        exit::print_json(&json!({"applied": applied, "failed": exit::failures_json(&report.failed)}));
    } else {
        println!(
            "{} workflow(s), {} queue(s), {} cap(s) applied on shard(s) {}",
            config.workflows.len(),
            config.queues.len(),
            config.caps.len(),
            if applied.is_empty() {
                "none".into()
            } else {
                applied.join(", ")
            }
        );
    }
    exit::partial_if(&report.failed, !report.failed.is_empty())
}

/// Prints one shard's configuration as the file `config apply` takes
/// (always JSON): to check a running fleet's configuration into a
/// repository, or to bring a new shard in line with the others.
pub async fn show(client: &Client, shard: u32) -> ExitCode {
    let shard = match sheaf_driver::ShardId::new(shard) {
        Ok(id) if client.topology().get(id).is_some() => id,
        Ok(id) => return exit::usage(format!("--shard {id} is not in the topology (SHEAF_SHARDS)")),
        Err(e) => return exit::usage(format!("--shard: {e}")),
    };
    match client.shard_config(shard).await {
        Ok(config) => match serde_json::to_value(&config) {
            Ok(v) => {
                exit::print_json(&v);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sheaf: cannot encode the configuration: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => exit::failed(&e),
    }
}

/// Shows each shard that differs from most of them; exits 5 when one does,
/// 3 when a shard did not answer.
pub async fn diff(client: &Client, as_json: bool) -> ExitCode {
    let report = client.fleet_config().await;
    let drift = config_drift(&report);
    if as_json {
        let d: serde_json::Map<String, serde_json::Value> = drift
            .iter()
            .map(|(s, lines)| (s.to_string(), json!(lines)))
            .collect();
        exit::print_json(&json!({"drift": d, "failed": exit::failures_json(&report.failed)}));
    } else if drift.is_empty() {
        println!("{} shard(s) hold the same configuration", report.ok.len());
    } else {
        for (shard, lines) in &drift {
            println!("shard {shard} differs from most shards:");
            for l in lines {
                println!("  {l}");
            }
        }
    }
    if !report.failed.is_empty() {
        return exit::partial_if(&report.failed, true);
    }
    if drift.is_empty() {
        ExitCode::SUCCESS
    } else {
        exit::FOUND.into()
    }
}

/// The newest entries of every shard's audit log, merged newest first.
pub async fn audit(client: &Client, limit: i32, as_json: bool) -> ExitCode {
    if !(1..=1000).contains(&limit) {
        return exit::usage(format!("--limit must be from 1 to 1000, got {limit}"));
    }
    let report = client.fleet_audit_log(limit).await;
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
        exit::print_json(&json!({"items": items, "failed": exit::failures_json(&report.failed)}));
    } else {
        println!(
            "{:<27} {:<6} {:<16} {:<16} {:<22} {:<10} target",
            "at", "shard", "actor", "login", "action", "outcome"
        );
        for e in entries {
            println!(
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
