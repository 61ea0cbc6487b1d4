//! `sheaf schedules list|create|update|pause|resume|trigger|delete|fires`:
//! schedules on the fleet's default shard (listed from every shard).

use std::time::SystemTime;

use serde_json::{Map, Value, json};
use sheaf_driver::{Client, Fire, FireOutcome, Schedule};

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{Column, failures_json, print_json, say, table, time};

/// Schedules: cron timings (or @every) that start a workflow or enqueue
/// a task, created on the fleet's default shard, whose maintain fires
/// them. Exits 4 for an unknown schedule.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Every schedule of every shard: its timing, what it starts, its next
    /// fire and its last outcome. Exits 3 when a shard did not answer.
    List,
    /// Create a schedule: --cron and --workflow or --queue, or a whole
    /// --spec (flags given beside it replace its fields).
    Create(Box<CreateArgs>),
    /// Change the fields of a schedule's spec that a JSON patch names; its
    /// timing starts again from now.
    Update {
        /// The schedule's name.
        name: String,
        /// The fields to change, as JSON (null removes one).
        #[arg(long)]
        spec: String,
    },
    /// Pause a schedule: it fires nothing until resumed.
    Pause {
        /// The schedule's name.
        name: String,
    },
    /// Resume a paused schedule from its next fire time after now.
    Resume {
        /// The schedule's name.
        name: String,
    },
    /// Fire a schedule now (paused or not), under its overlap policy.
    /// Exits 1 when the start failed.
    Trigger {
        /// The schedule's name.
        name: String,
    },
    /// Delete a schedule and its fire records (what it started runs on).
    Delete {
        /// The schedule's name.
        name: String,
    },
    /// A schedule's latest fire records.
    Fires {
        /// The schedule's name.
        name: String,
        /// How many (1 to 1000).
        // Checked here, so that the refusal names --limit (the driver's
        // names its own argument, max_rows).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i32).range(1..=1000))]
        limit: i32,
    },
}

/// An unknown schedule exits 4 (`exit::failed`).
pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (client, as_json) = (&client, ctx.json);
    match args.what {
        Action::List => list(client, as_json).await,
        Action::Create(args) => create(client, &args, as_json).await,
        Action::Update { name, spec } => update(client, &name, &spec, as_json).await,
        Action::Pause { name } => change(client, &name, Change::Pause, as_json).await,
        Action::Resume { name } => change(client, &name, Change::Resume, as_json).await,
        Action::Delete { name } => change(client, &name, Change::Delete, as_json).await,
        Action::Trigger { name } => trigger(client, &name, as_json).await,
        Action::Fires { name, limit } => fires(client, &name, limit, as_json).await,
    }
}

/// What `sheaf schedules create` was given: a whole spec, or the flags
/// that make one.
#[derive(clap::Args)]
struct CreateArgs {
    /// The schedule's name (1 to 256 bytes).
    name: String,
    /// The spec as JSON (see docs/reference/sql/schedules.md).
    #[arg(long)]
    spec: Option<String>,
    /// A cron expression (5 or 6 fields), @hourly, @daily, @weekly,
    /// @monthly, @yearly, or @every <duration>.
    #[arg(long)]
    cron: Option<String>,
    /// The IANA time zone the cron expression is read in (default UTC).
    #[arg(long = "tz")]
    time_zone: Option<String>,
    /// Start this workflow at each fire (its id: NAME@<fire time>).
    #[arg(long)]
    workflow: Option<String>,
    /// The workflow's input, as JSON.
    #[arg(long)]
    input: Option<String>,
    /// Enqueue a task on this queue at each fire.
    #[arg(long)]
    queue: Option<String>,
    /// The task's payload, as JSON.
    #[arg(long)]
    payload: Option<String>,
    /// While the previous fire's work runs: skip (default), allow or
    /// cancel_previous.
    #[arg(long)]
    overlap: Option<String>,
    /// After downtime: once (default: the latest missed time), skip
    /// (none, unless at most a minute late) or all (the latest
    /// --catch-up-max).
    #[arg(long)]
    catch_up: Option<String>,
    /// How many missed times catch-up all fires (1 to 1000, default 10).
    #[arg(long)]
    catch_up_max: Option<u32>,
    /// Spread each fire's start over this much time after it (30s).
    #[arg(long)]
    jitter: Option<String>,
}

fn json_arg(flag: &str, text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("{flag} is not JSON: {e}"))
}

/// The spec the arguments describe (the shard checks it).
fn spec(a: &CreateArgs) -> Result<Value, String> {
    let mut m = match &a.spec {
        Some(text) => match json_arg("--spec", text)? {
            Value::Object(m) => m,
            _ => return Err("--spec must be a JSON object".into()),
        },
        None => Map::new(),
    };
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            m.insert(k.to_owned(), v);
        }
    };
    put("cron", a.cron.clone().map(Value::from));
    put("time_zone", a.time_zone.clone().map(Value::from));
    put("overlap", a.overlap.clone().map(Value::from));
    put("catch_up", a.catch_up.clone().map(Value::from));
    put("catch_up_max", a.catch_up_max.map(Value::from));
    put("jitter", a.jitter.clone().map(Value::from));
    match (&a.workflow, &a.queue) {
        (Some(_), Some(_)) => return Err("give --workflow or --queue, not both".into()),
        (Some(w), None) => {
            let input = a.input.as_deref().map(|t| json_arg("--input", t)).transpose()?;
            m.insert(
                "workflow".into(),
                json!({"name": w, "input": input.unwrap_or(json!({}))}),
            );
        }
        (None, Some(q)) => {
            let payload = a
                .payload
                .as_deref()
                .map(|t| json_arg("--payload", t))
                .transpose()?;
            m.insert(
                "task".into(),
                json!({"queue": q, "payload": payload.unwrap_or(json!({}))}),
            );
        }
        (None, None) => {}
    }
    if !m.contains_key("cron") {
        return Err("say when: --cron '0 3 * * *' (or @hourly, @every 30s), or --spec".into());
    }
    Ok(Value::Object(m))
}

fn maybe_time(t: Option<SystemTime>) -> String {
    t.map_or_else(|| "-".to_owned(), time)
}

fn schedule_json(s: &Schedule) -> Value {
    json!({
        "shard": s.shard.get(),
        "name": s.name,
        "spec": s.spec.to_value().unwrap_or(Value::Null),
        "paused": s.paused,
        "next_fire_at": s.next_fire_at.map(time),
        "last_fire_at": s.last_fire_at.map(time),
        "last_outcome": s.last_outcome,
        "last_error": s.last_error,
        "fires": s.fires,
        "skipped": s.skipped,
        "created_at": time(s.created_at),
        "updated_at": time(s.updated_at),
    })
}

fn fire_json(f: &Fire) -> Value {
    json!({
        "fire_at": time(f.fire_at),
        "fired_at": f.fired_at.map(time),
        "outcome": f.outcome,
        "execution_id": f.execution_id.map(|id| id.to_string()),
        "task_id": f.task_id.map(|id| id.to_string()),
        "error": f.error,
        "manual": f.manual,
    })
}

/// What a schedule starts, in a few words.
fn action(spec: &Value) -> String {
    if let Some(w) = spec.get("workflow") {
        format!("workflow {}", w["name"].as_str().unwrap_or("?"))
    } else if let Some(t) = spec.get("task") {
        format!("task on {}", t["queue"].as_str().unwrap_or("?"))
    } else {
        "-".into()
    }
}

/// `sheaf schedules list`: every shard's; exit 3 when a shard failed.
async fn list(client: &Client, as_json: bool) -> Exit {
    let report = client.admin().list_schedules().await;
    let all: Vec<&Schedule> = report.ok.values().flatten().collect();
    if as_json {
        print_json(&json!({
            "schedules": all.iter().map(|s| schedule_json(s)).collect::<Vec<_>>(),
            "failed_shards": failures_json(&report.failed),
        }));
    } else {
        const COLUMNS: &[Column] = &[
            Column::left("shard", 5),
            Column::left("name", 24),
            Column::left("cron", 18),
            Column::left("starts", 20),
            Column::left("state", 7),
            Column::left("next fire", 27),
            Column::left("last", 16),
            Column::left("fires", 0),
        ];
        table(
            COLUMNS,
            all.iter().map(|s| {
                let spec = s.spec.to_value().unwrap_or(Value::Null);
                vec![
                    s.shard.to_string(),
                    s.name.clone(),
                    spec["cron"].as_str().unwrap_or("-").to_owned(),
                    action(&spec),
                    if s.paused { "paused" } else { "active" }.to_owned(),
                    maybe_time(s.next_fire_at),
                    s.last_outcome
                        .as_ref()
                        .map_or("-", FireOutcome::as_str)
                        .to_owned(),
                    s.fires.to_string(),
                ]
            }),
        );
    }
    exit::partial_if(&report.failed, !report.failed.is_empty())
}

/// `sheaf schedules create NAME ...`.
async fn create(client: &Client, args: &CreateArgs, as_json: bool) -> Exit {
    let name = args.name.as_str();
    let spec = match spec(args) {
        Ok(s) => s,
        Err(e) => return exit::bad_input(e),
    };
    match client.admin().create_schedule(name, spec).await {
        Ok(next) => {
            if as_json {
                print_json(&json!({"name": name, "next_fire_at": time(next)}));
            } else {
                say!("created schedule {name}: next fire at {}", time(next));
            }
            Exit::Done
        }
        Err(e) => exit::failed(&e),
    }
}

/// `sheaf schedules update NAME --spec PATCH`.
async fn update(client: &Client, name: &str, patch: &str, as_json: bool) -> Exit {
    let patch = match json_arg("--spec", patch) {
        Ok(p) => p,
        Err(e) => return exit::bad_input(e),
    };
    match client.admin().update_schedule(name, patch).await {
        Ok(next) => {
            if as_json {
                print_json(&json!({"name": name, "next_fire_at": time(next)}));
            } else {
                say!("updated schedule {name}: next fire at {}", time(next));
            }
            Exit::Done
        }
        Err(e) => exit::failed(&e),
    }
}

/// What a pause, resume or delete did.
enum Change {
    Pause,
    Resume,
    Delete,
}

/// `sheaf schedules pause|resume|delete NAME`.
async fn change(client: &Client, name: &str, what: Change, as_json: bool) -> Exit {
    let (done, verb) = match what {
        Change::Pause => (client.admin().pause_schedule(name).await, "paused"),
        Change::Resume => (client.admin().resume_schedule(name).await, "resumed"),
        Change::Delete => (client.admin().delete_schedule(name).await, "deleted"),
    };
    match done {
        // Deleting returns false only when there was none to delete.
        Ok(false) if matches!(what, Change::Delete) => exit::fail(
            Exit::NotFound,
            format!("no schedule {name:?} on the default shard (deleted already, or never made)"),
        ),
        Ok(changed) => {
            if as_json {
                print_json(&json!({"name": name, "changed": changed}));
            } else if changed {
                say!("{verb} schedule {name}");
            } else {
                say!("schedule {name}: nothing to do (already {verb})");
            }
            Exit::Done
        }
        Err(e) => exit::failed(&e),
    }
}

/// `sheaf schedules trigger NAME`: fires it now; exit 1 if its start failed.
async fn trigger(client: &Client, name: &str, as_json: bool) -> Exit {
    match client.admin().trigger_schedule(name).await {
        Ok(f) => {
            if as_json {
                print_json(&fire_json(&f));
            } else {
                let what = f
                    .execution_id
                    .map(|id| format!(" execution {id}"))
                    .or_else(|| f.task_id.map(|id| format!(" task {id}")))
                    .unwrap_or_default();
                say!(
                    "schedule {name} fired at {}: {}{what}",
                    time(f.fire_at),
                    f.outcome
                );
                if let Some(e) = &f.error {
                    say!("  {e}");
                }
            }
            if f.outcome == "failed" {
                let why = f.error.as_deref().unwrap_or("no reason given");
                exit::fail(Exit::Failed, format!("schedule {name}: its start failed: {why}"))
            } else {
                Exit::Done
            }
        }
        Err(e) => exit::failed(&e),
    }
}

/// `sheaf schedules fires NAME`: its latest fire records; exit 4 for an
/// unknown schedule.
async fn fires(client: &Client, name: &str, limit: i32, as_json: bool) -> Exit {
    let fires = client.admin().schedule_fires(name, None, limit).await;
    // A shard answers an unknown name as a schedule that never fired: with
    // no fires. Its list of schedules tells the two apart.
    if let Ok([]) = fires.as_deref() {
        let home = client.topology().default_shard();
        let mut listed = client.admin().list_schedules().await;
        if let Some(e) = listed.failed.remove(&home) {
            return exit::failed(&e);
        }
        if listed
            .ok
            .get(&home)
            .is_some_and(|all| all.iter().all(|s| s.name != name))
        {
            return exit::fail(
                Exit::NotFound,
                format!("no schedule {name:?} on the default shard ({home})"),
            );
        }
    }
    match fires {
        Ok(fires) => {
            if as_json {
                print_json(&json!({"fires": fires.iter().map(fire_json).collect::<Vec<_>>()}));
            } else {
                say!("{:<27} {:<16} {:<6} started", "fire time", "outcome", "manual");
                for f in &fires {
                    let started = f
                        .execution_id
                        .map(|id| id.to_string())
                        .or_else(|| f.task_id.map(|id| id.to_string()))
                        .or_else(|| f.error.clone())
                        .unwrap_or_else(|| "-".into());
                    say!(
                        "{:<27} {:<16} {:<6} {}",
                        time(f.fire_at),
                        f.outcome,
                        if f.manual { "yes" } else { "no" },
                        started
                    );
                }
            }
            Exit::Done
        }
        Err(e) => exit::failed(&e),
    }
}
