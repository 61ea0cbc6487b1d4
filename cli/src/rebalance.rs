//! `sheaf rebalance`, `sheaf rebalance-resume` and `sheaf shard drain`:
//! moving quiescent executions between shards, with a progress bar (or
//! JSON), then a table of what moved and what stayed, with why.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use sheaf_driver::{Client, MoveOutcome, MoveReport, Progress, RebalanceOptions, ShardId};

use crate::exit;

fn shard_arg(client: &Client, n: u32, flag: &str) -> Result<ShardId, ExitCode> {
    match ShardId::new(n) {
        Ok(id) if client.topology().get(id).is_some() => Ok(id),
        Ok(id) => Err(exit::usage(format!(
            "{flag} {id} is not in the topology (SHEAF_SHARDS)"
        ))),
        Err(e) => Err(exit::usage(format!("{flag}: {e}"))),
    }
}

fn bar(as_json: bool) -> ProgressBar {
    if as_json {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    let style = ProgressStyle::with_template("{spinner} {elapsed_precise} {msg} ({per_sec})")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

fn show(bar: &ProgressBar, p: Progress, limit: Option<usize>) {
    let of = limit.map_or(String::new(), |n| format!(" of {n}"));
    bar.set_message(format!(
        "{} moved{of}, {} KiB, {} left in place",
        p.moved,
        p.bytes / 1024,
        p.skipped
    ));
    bar.set_position(p.moved as u64);
}

/// A report as JSON.
fn report_json(r: &MoveReport, to: ShardId) -> Value {
    let (outcome, detail) = match &r.outcome {
        Ok(MoveOutcome::Moved { bytes, unavailable }) => (
            "moved",
            json!({"bytes": bytes, "unavailable_ms": unavailable.as_secs_f64() * 1000.0, "to": to.get()}),
        ),
        Ok(MoveOutcome::Blocked(b)) => ("blocked", json!({"blockers": b})),
        Ok(MoveOutcome::Aborted(why)) => ("aborted", json!({"reason": why})),
        Ok(_) => ("other", Value::Null),
        Err(e) => ("failed", json!({"error": e})),
    };
    json!({"execution_id": r.id.to_string(), "workflow_name": r.workflow_name, "outcome": outcome, "detail": detail})
}

/// Rows of the final table per kind (moved, stayed).
const TABLE_ROWS: usize = 10;

/// The final table: what moved, then what stayed and why.
fn print_table(reports: &[(MoveReport, ShardId)], dry_run: bool) {
    let moved = reports
        .iter()
        .filter(|(r, _)| matches!(r.outcome, Ok(MoveOutcome::Moved { .. })))
        .count();
    println!(
        "{} {moved} execution(s); {} left in place",
        if dry_run { "would move" } else { "moved" },
        reports.len() - moved
    );
    let mut why: BTreeMap<String, usize> = BTreeMap::new();
    for (r, _) in reports {
        match &r.outcome {
            Ok(MoveOutcome::Blocked(b)) => {
                for code in b {
                    *why.entry(code.clone()).or_default() += 1;
                }
            }
            Ok(MoveOutcome::Aborted(_)) => *why.entry("aborted".into()).or_default() += 1,
            Err(_) => *why.entry("failed".into()).or_default() += 1,
            Ok(_) => {}
        }
    }
    if !why.is_empty() {
        println!("{:<24} executions", "left because");
        for (code, n) in &why {
            println!("{code:<24} {n}");
        }
    }
    println!("{:<38} {:<24} {:<8} detail", "execution", "workflow", "outcome");
    // The first rows of each kind; --json lists every one.
    let mut shown = [0usize; 2];
    let mut hidden = 0;
    for (r, to) in reports {
        let kind = usize::from(!matches!(r.outcome, Ok(MoveOutcome::Moved { .. })));
        if shown[kind] == TABLE_ROWS {
            hidden += 1;
            continue;
        }
        shown[kind] += 1;
        let (outcome, detail) = match &r.outcome {
            Ok(MoveOutcome::Moved { bytes, unavailable }) => (
                if dry_run { "movable" } else { "moved" },
                format!(
                    "to {to}, {bytes} bytes, {:.1} ms",
                    unavailable.as_secs_f64() * 1000.0
                ),
            ),
            Ok(MoveOutcome::Blocked(b)) => ("blocked", b.join(", ")),
            Ok(MoveOutcome::Aborted(why)) => ("aborted", why.clone()),
            Ok(_) => ("other", String::new()),
            Err(e) => ("FAILED", e.clone()),
        };
        println!(
            "{:<38} {:<24} {outcome:<8} {detail}",
            r.id.to_string(),
            r.workflow_name
        );
    }
    if hidden > 0 {
        println!("... and {hidden} more (--json lists every one)");
    }
}

fn exit_for(reports: &[(MoveReport, ShardId)]) -> ExitCode {
    if reports.iter().any(|(r, _)| r.outcome.is_err()) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The crash tests' hook (tests/tests/rebalance_crash.rs): with
/// `SHEAF_TEST_KILL_AFTER` set to a phase (begun, staged, verified,
/// committed, activated), the process kills itself with SIGKILL right
/// after that step of its first move commits.
fn kill_hook() -> Option<sheaf_driver::PhaseHook> {
    let at = std::env::var("SHEAF_TEST_KILL_AFTER").ok()?;
    Some(std::sync::Arc::new(move |_id, phase: sheaf_driver::Phase| {
        if phase.as_str() == at {
            let pid = std::process::id().to_string();
            let _ = std::process::Command::new("kill").args(["-KILL", &pid]).status();
            std::thread::sleep(Duration::from_secs(60));
        }
    }))
}

/// `sheaf rebalance --from A --to B`.
pub async fn rebalance(
    client: &Client,
    from: u32,
    to: u32,
    limit: Option<usize>,
    dry_run: bool,
    lease_secs: u64,
    as_json: bool,
) -> ExitCode {
    let (from, to) = match (shard_arg(client, from, "--from"), shard_arg(client, to, "--to")) {
        (Ok(f), Ok(t)) => (f, t),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let mut options = RebalanceOptions::default()
        .dry_run(dry_run)
        .lease(std::time::Duration::from_secs(lease_secs));
    options.limit = limit;
    options.after_phase = kill_hook();
    let bar = bar(as_json);
    let result = client
        .rebalance(from, to, &options, |p, _| show(&bar, p, limit))
        .await;
    bar.finish_and_clear();
    let reports: Vec<(MoveReport, ShardId)> = match result {
        Ok(r) => r.into_iter().map(|r| (r, to)).collect(),
        Err(e) => return exit::failed(&e),
    };
    if as_json {
        let rows: Vec<Value> = reports.iter().map(|(r, t)| report_json(r, *t)).collect();
        exit::print_json(
            &json!({"from": from.get(), "to": to.get(), "dry_run": dry_run, "executions": rows}),
        );
    } else {
        print_table(&reports, dry_run);
    }
    exit_for(&reports)
}

/// `sheaf rebalance-resume --from A`.
pub async fn resume(client: &Client, from: u32, as_json: bool) -> ExitCode {
    let from = match shard_arg(client, from, "--from") {
        Ok(f) => f,
        Err(e) => return e,
    };
    let open = match client.migrations(from, true, 10_000).await {
        Ok(m) => m,
        Err(e) => return exit::failed(&e),
    };
    let targets: BTreeMap<_, _> = open.iter().map(|m| (m.execution_id, m.target)).collect();
    let reports = match client.rebalance_resume(from).await {
        Ok(r) => r,
        Err(e) => return exit::failed(&e),
    };
    let reports: Vec<(MoveReport, ShardId)> = reports
        .into_iter()
        .map(|r| {
            let to = targets.get(&r.id).copied().unwrap_or(from);
            (r, to)
        })
        .collect();
    if as_json {
        let rows: Vec<Value> = reports.iter().map(|(r, t)| report_json(r, *t)).collect();
        exit::print_json(&json!({"from": from.get(), "executions": rows}));
    } else if reports.is_empty() {
        println!("no unfinished moves on shard {from}");
    } else {
        print_table(&reports, false);
    }
    exit_for(&reports)
}

/// `sheaf shard drain SHARD`: every quiescent execution to its rendezvous
/// winner among the other writable shards, then the stragglers with their
/// blockers, the relay's work still owed on or to it, and the forwards
/// entry to add when the shard is retired. Exits 5 while executions stay
/// or relay work is owed (the shard cannot be retired yet).
pub async fn drain(
    client: &Client,
    shard: u32,
    limit: Option<usize>,
    dry_run: bool,
    lease_secs: u64,
    as_json: bool,
) -> ExitCode {
    let leaving = match shard_arg(client, shard, "SHARD") {
        Ok(s) => s,
        Err(e) => return e,
    };
    let mut options = RebalanceOptions::default()
        .dry_run(dry_run)
        .lease(std::time::Duration::from_secs(lease_secs));
    options.limit = limit;
    options.after_phase = kill_hook();
    let bar = bar(as_json);
    let result = client.drain(leaving, &options, |p, _| show(&bar, p, limit)).await;
    bar.finish_and_clear();
    let drain = match result {
        Ok(d) => d,
        Err(e) => return exit::failed(&e),
    };
    let stragglers = drain.stragglers().count();
    let unsettled = drain.unsettled.len();
    let forwards = format!("{leaving}={}", drain.forward_to);
    if as_json {
        let rows: Vec<Value> = drain.moves.iter().map(|(r, t)| report_json(r, *t)).collect();
        exit::print_json(&json!({
            "shard": leaving.get(), "dry_run": dry_run, "executions": rows, "stragglers": stragglers,
            "forward_to": drain.forward_to.get(), "seals_adopted": drain.seals_adopted,
            "forwards_entry": forwards,
            "unsettled": drain.unsettled.iter().map(|u| json!({
                "shard": u.shard.get(), "execution_id": u.execution_id.map(|id| id.to_string()), "reason": u.reason,
            })).collect::<Vec<_>>(),
        }));
    } else {
        print_table(&drain.moves, dry_run);
        for u in &drain.unsettled {
            println!("unsettled (shard {}): {}", u.shard, u.reason);
        }
        if unsettled > 0 {
            println!(
                "{unsettled} relay obligation(s) on or to shard {leaving} would be lost with it: let the relay run, then \
                 drain again"
            );
        }
        if stragglers == 0 && unsettled == 0 {
            println!(
                "shard {leaving} holds no unfinished execution{}; to retire it, remove {leaving} from SHEAF_SHARDS (and \
                 SHEAF_WRITABLE) and add SHEAF_FORWARDS entry {forwards} in the same change ({} seal(s) handed to shard {})",
                if dry_run { " that could not move" } else { "" },
                drain.seals_adopted,
                drain.forward_to
            );
        } else if stragglers > 0 {
            println!(
                "{stragglers} execution(s) stay on shard {leaving} (see their blockers); drain again once they are \
                 quiescent or ended. The forwards entry to add when it leaves SHEAF_SHARDS: {forwards}"
            );
        }
    }
    if drain.moves.iter().any(|(r, _)| r.outcome.is_err()) {
        ExitCode::FAILURE
    } else if stragglers > 0 || unsettled > 0 {
        exit::FOUND.into()
    } else {
        ExitCode::SUCCESS
    }
}
