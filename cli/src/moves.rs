//! What `sheaf rebalance`, `sheaf rebalance-resume` and `sheaf shard
//! drain` share: moving quiescent executions between shards, with a
//! progress bar (or JSON), then a table of what moved and what stayed,
//! with why.

use std::collections::BTreeMap;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use sheaf_driver::{Blocker, Client, MoveOutcome, MoveReport, Progress, RebalanceOptions, ShardId};

use crate::exit::{self, Exit};
use crate::output::say;

pub fn shard_arg(client: &Client, n: u32, flag: &str) -> Result<ShardId, Exit> {
    match ShardId::new(n) {
        Ok(id) if client.topology().get(id).is_some() => Ok(id),
        Ok(id) => Err(exit::bad_input(format!(
            "{flag} {id} is not in the topology (SHEAF_SHARDS)"
        ))),
        Err(e) => Err(exit::bad_input(format!("{flag}: {e}"))),
    }
}

pub fn bar(as_json: bool) -> ProgressBar {
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

pub fn show(bar: &ProgressBar, p: Progress, limit: Option<usize>) {
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
pub fn report_json(r: &MoveReport, to: ShardId) -> Value {
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
pub fn print_table(reports: &[(MoveReport, ShardId)], dry_run: bool) {
    let moved = reports
        .iter()
        .filter(|(r, _)| matches!(r.outcome, Ok(MoveOutcome::Moved { .. })))
        .count();
    say!(
        "{} {moved} execution(s); {} left in place",
        if dry_run { "would move" } else { "moved" },
        reports.len() - moved
    );
    let mut why: BTreeMap<String, usize> = BTreeMap::new();
    for (r, _) in reports {
        match &r.outcome {
            Ok(MoveOutcome::Blocked(b)) => {
                for code in b {
                    *why.entry(code.to_string()).or_default() += 1;
                }
            }
            Ok(MoveOutcome::Aborted(_)) => *why.entry("aborted".into()).or_default() += 1,
            Err(_) => *why.entry("failed".into()).or_default() += 1,
            Ok(_) => {}
        }
    }
    if !why.is_empty() {
        say!("{:<24} executions", "left because");
        for (code, n) in &why {
            say!("{code:<24} {n}");
        }
    }
    say!("{:<38} {:<24} {:<8} detail", "execution", "workflow", "outcome");
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
            Ok(MoveOutcome::Blocked(b)) => (
                "blocked",
                b.iter().map(Blocker::as_str).collect::<Vec<_>>().join(", "),
            ),
            Ok(MoveOutcome::Aborted(why)) => ("aborted", why.clone()),
            Ok(_) => ("other", String::new()),
            Err(e) => ("FAILED", e.clone()),
        };
        say!(
            "{:<38} {:<24} {outcome:<8} {detail}",
            r.id.to_string(),
            r.workflow_name
        );
    }
    if hidden > 0 {
        say!("... and {hidden} more (--json lists every one)");
    }
}

pub fn exit_for(reports: &[(MoveReport, ShardId)]) -> Exit {
    let failed = reports.iter().filter(|(r, _)| r.outcome.is_err()).count();
    if failed > 0 {
        exit::fail(Exit::Failed, format!("{failed} move(s) failed: see the report"))
    } else {
        Exit::Done
    }
}

/// The options of a rebalance or a drain, from their flags: `--dry-run`,
/// `--lease` (seconds) and `--limit`, and the crash tests' hook.
pub fn options(dry_run: bool, lease_secs: u64, limit: Option<usize>) -> RebalanceOptions {
    let mut options = RebalanceOptions::default()
        .dry_run(dry_run)
        .lease(Duration::from_secs(lease_secs));
    if let Some(n) = limit {
        options = options.limit(n);
    }
    if let Some(hook) = kill_hook() {
        options = options.after_phase(hook);
    }
    options
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
