//! `sheaf retention get|set`: how long every shard keeps what has ended.

use std::collections::BTreeMap;
use std::process::ExitCode;

use serde_json::{Map, Value, json};
use sheaf_driver::{Client, FleetReport};

use crate::exit;

/// What `sheaf retention set` was given: each a duration (`30days`, `12h`)
/// or `forever`; `workflows` as `NAME=DURATION`, where `default` removes
/// the workflow's own setting.
pub struct SetArgs {
    pub executions: Option<String>,
    pub dead_letters: Option<String>,
    pub seals: Option<String>,
    pub idle_queues: Option<String>,
    pub schedule_fires: Option<String>,
    pub workflows: Vec<String>,
}

/// The `set_retention` document the flags describe.
pub fn policy(args: &SetArgs) -> Result<Value, String> {
    let mut m = Map::new();
    for (k, v) in [
        ("executions", &args.executions),
        ("dead_letters", &args.dead_letters),
        ("seals", &args.seals),
        ("idle_queues", &args.idle_queues),
        ("schedule_fires", &args.schedule_fires),
    ] {
        if let Some(v) = v {
            m.insert(k.into(), json!(v));
        }
    }
    let mut workflows = Map::new();
    for w in &args.workflows {
        let Some((name, keep)) = w.split_once('=') else {
            return Err(format!("--workflow takes NAME=DURATION, got {w:?}"));
        };
        let keep = if keep == "default" {
            Value::Null
        } else {
            json!(keep)
        };
        workflows.insert(name.into(), json!({"executions": keep}));
    }
    if !workflows.is_empty() {
        m.insert("workflows".into(), Value::Object(workflows));
    }
    if m.is_empty() {
        return Err(
            "say what to keep: --executions, --dead-letters, --seals, --idle-queues, --schedule-fires or --workflow"
                .into(),
        );
    }
    Ok(Value::Object(m))
}

/// Each shard's policy, as a table or JSON; exit 3 when a shard failed.
fn show(report: &FleetReport<Value>, as_json: bool) -> ExitCode {
    if as_json {
        exit::print_json(&json!({
            "per_shard": report.ok.iter().map(|(s, p)| (s.to_string(), p.clone())).collect::<Map<_, _>>(),
            "failed_shards": exit::failures_json(&report.failed),
        }));
    } else {
        println!(
            "{:<6} {:<12} {:<12} {:<12} workflows",
            "shard", "executions", "dead_letters", "seals"
        );
        for (shard, p) in &report.ok {
            let text = |k: &str| p[k].as_str().unwrap_or("-").to_owned();
            let workflows: BTreeMap<&str, &str> = p["workflows"]
                .as_object()
                .map(|w| {
                    w.iter()
                        .map(|(k, v)| (k.as_str(), v["executions"].as_str().unwrap_or("-")))
                        .collect()
                })
                .unwrap_or_default();
            let workflows: Vec<String> = workflows.iter().map(|(k, v)| format!("{k}={v}")).collect();
            println!(
                "{:<6} {:<12} {:<12} {:<12} {:<12} {}",
                shard,
                text("executions"),
                text("dead_letters"),
                text("seals"),
                text("idle_queues"),
                workflows.join(" ")
            );
        }
    }
    exit::partial_if(&report.failed, !report.failed.is_empty())
}

/// `sheaf retention get`.
pub async fn get(client: &Client, as_json: bool) -> ExitCode {
    show(&client.retention().await, as_json)
}

/// `sheaf retention set ...`: on every shard; a refused value exits 1.
pub async fn set(client: &Client, args: &SetArgs, as_json: bool) -> ExitCode {
    let policy = match policy(args) {
        Ok(p) => p,
        Err(e) => return exit::usage(e),
    };
    let report = client.set_retention(policy).await;
    if let Some(e) = report
        .failed
        .values()
        .find(|e| matches!(e, sheaf_driver::ClientError::InvalidArgument { .. }))
    {
        return exit::failed(e);
    }
    show(&report, as_json)
}
