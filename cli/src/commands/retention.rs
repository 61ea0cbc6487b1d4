//! `sheaf retention get|set`: how long every shard keeps what has ended.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};
use sheaf_driver::{Client, FleetReport};

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{failures_json, print_json, say};

/// How long every shard keeps what has ended (ended executions with
/// their history, dead letters, seals of moved runs); `sheaf.maintain`,
/// which every worker runs, deletes what is past it.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Each shard's policy; exits 3 when a shard did not answer.
    Get,
    /// Change the fields given on every shard (the rest stay as they are).
    /// Each is a duration from 1 minute to 100 years (30days, 12h) or
    /// `forever`. Exits 3 when a shard did not take it.
    Set(Set),
}

/// What `sheaf retention set` was given: each a duration (`30days`, `12h`)
/// or `forever`; `workflows` as `NAME=DURATION`, where `default` removes
/// the workflow's own setting.
#[derive(clap::Args)]
struct Set {
    /// Ended executions, with their history.
    #[arg(long)]
    executions: Option<String>,
    /// Dead letters.
    #[arg(long)]
    dead_letters: Option<String>,
    /// Seals of executions moved to another shard (their old ids route
    /// through them).
    #[arg(long)]
    seals: Option<String>,
    /// Queues of the default configuration with nothing in them.
    #[arg(long)]
    idle_queues: Option<String>,
    /// Schedules' fire records.
    #[arg(long)]
    schedule_fires: Option<String>,
    /// One workflow's ended executions: NAME=DURATION (repeatable;
    /// NAME=default removes its own setting).
    #[arg(long = "workflow", value_name = "NAME=DURATION")]
    workflows: Vec<String>,
}

pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    match args.what {
        Action::Get => get(&client, ctx.json).await,
        Action::Set(set_args) => set(&client, &set_args, ctx.json).await,
    }
}

/// The `set_retention` document the flags describe.
fn policy(args: &Set) -> Result<Value, String> {
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
fn show(report: &FleetReport<Value>, as_json: bool) -> Exit {
    if as_json {
        print_json(&json!({
            "per_shard": report.ok.iter().map(|(s, p)| (s.to_string(), p.clone())).collect::<Map<_, _>>(),
            "failed_shards": failures_json(&report.failed),
        }));
    } else {
        say!(
            "{:<6} {:<12} {:<12} {:<12} workflows",
            "shard",
            "executions",
            "dead_letters",
            "seals"
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
            say!(
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
async fn get(client: &Client, as_json: bool) -> Exit {
    show(&client.admin().retention().await, as_json)
}

/// `sheaf retention set ...`: on every shard; a value a shard refuses exits 2.
async fn set(client: &Client, args: &Set, as_json: bool) -> Exit {
    let policy = match policy(args) {
        Ok(p) => p,
        Err(e) => return exit::bad_input(e),
    };
    let report = client.admin().set_retention(policy).await;
    if let Some(e) = report
        .failed
        .values()
        .find(|e| matches!(e, sheaf_driver::ClientError::InvalidArgument { .. }))
    {
        return exit::failed(e);
    }
    show(&report, as_json)
}
