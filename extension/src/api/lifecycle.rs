//! Execution state changes: validate, call the transition, return whether it
//! happened.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

use crate::base::args::{self, required};
use crate::base::audit;
use crate::base::errors::{bad_argument, require_read_committed};
use crate::base::jsonb::Jsonb;
use crate::workflow::continuation;
use crate::workflow::lifecycle::{self, Close};
use crate::workflow::wake;

fn execution_arg(id: Option<pgrx::Uuid>) -> pgrx::Uuid {
    required(id, "execution_id")
}

/// Continue-as-new: ends active execution `execution_id`
/// `CONTINUED_AS_NEW` and starts its successor with `input` and the same
/// (name, workflow id), queue, keys, search attributes and deadline, in one
/// transaction; returns the successor's id. 55000 for a run that ended, is
/// moving or is a child; a run that moved raises the forwarding error.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn continue_as_new(execution_id: Option<pgrx::Uuid>, input: Option<Jsonb>) -> pgrx::Uuid {
    require_read_committed("continue_as_new");
    let id = execution_arg(execution_id);
    let input = required(input, "input").sized("input");
    continuation::continue_as_new(id, input)
}

/// Completes an execution with `result`; `false` if it had already ended.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn complete_execution(execution_id: Option<pgrx::Uuid>, result: Option<Jsonb>) -> bool {
    let result = result.map(|r| r.sized("result").parse("result"));
    lifecycle::close(execution_arg(execution_id), Close::Completed { result })
}

/// Fails an execution with `error`; `false` if it had already ended.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn fail_execution(execution_id: Option<pgrx::Uuid>, error: Option<&str>) -> bool {
    let id = execution_arg(execution_id);
    let error = args::text(required(error, "error"), "error").to_owned();
    lifecycle::close(id, Close::Failed { error })
}

/// Cancels an execution (`reason` may be NULL); `false` if it had already
/// ended. Audited (a workflow's own `cancel_external` is not: it goes
/// through the relay, not this call).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn cancel_execution(execution_id: Option<pgrx::Uuid>, reason: Option<&str>) -> bool {
    let id = execution_arg(execution_id);
    let ended = lifecycle::close(
        id,
        Close::Cancelled {
            reason: reason.map(|r| args::text(r, "reason").to_owned()),
        },
    );
    audit_end("cancel_execution", id, ended, reason);
    ended
}

/// Terminates an execution (`reason` may be NULL); `false` if it had
/// already ended. Audited.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn terminate_execution(execution_id: Option<pgrx::Uuid>, reason: Option<&str>) -> bool {
    let id = execution_arg(execution_id);
    let ended = lifecycle::close(
        id,
        Close::Terminated {
            reason: reason.map(|r| args::text(r, "reason").to_owned()),
        },
    );
    audit_end("terminate_execution", id, ended, reason);
    ended
}

/// The audit entry of an operator's cancel or terminate.
fn audit_end(action: &str, id: pgrx::Uuid, ended: bool, reason: Option<&str>) {
    audit::record(
        action,
        &id.to_string(),
        if ended { "ok" } else { "already ended" },
        serde_json::json!({"reason": reason.map(|r| sheaf_core::children::cut(r, 256))}),
    );
}

/// Pauses a running or suspended execution: its ready, waiting and scheduled
/// tasks are parked (holding no slot) until it resumes; running tasks
/// finish. `false` if it was already paused; 55000 if it has ended.
/// Audited.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn pause_execution(execution_id: Option<pgrx::Uuid>) -> bool {
    let id = execution_arg(execution_id);
    let paused = lifecycle::pause(id);
    let outcome = if paused { "ok" } else { "already paused" };
    audit::record("pause_execution", &id.to_string(), outcome, serde_json::json!({}));
    paused
}

/// Resumes a paused execution in the state it was paused from; its parked
/// tasks go back in line. `false` if it was not paused; 55000 if it has
/// ended. Audited.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn resume_execution(execution_id: Option<pgrx::Uuid>) -> bool {
    let id = execution_arg(execution_id);
    let resumed = lifecycle::resume(id);
    let outcome = if resumed { "ok" } else { "not paused" };
    audit::record(
        "resume_execution",
        &id.to_string(),
        outcome,
        serde_json::json!({}),
    );
    resumed
}

/// Suspends a running execution until `wake_execution`, or until `wake_at`
/// (then `maintain()` wakes it). `false` if it was already suspended;
/// 55000 if it is paused or has ended.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn suspend_execution(
    execution_id: Option<pgrx::Uuid>,
    wake_at: default!(Option<TimestampWithTimeZone>, "NULL"),
) -> bool {
    let id = execution_arg(execution_id);
    if let Some(t) = wake_at
        && !t.is_finite()
    {
        bad_argument("wake_at", "must be a finite timestamp (or NULL for no timer)");
    }
    wake::suspend(id, wake_at)
}

/// Wakes a suspended execution: RUNNING again, with a new workflow task.
/// A paused execution that was suspended wakes into paused-from-running
/// (its task waits for the resume). `false` if it was not suspended.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn wake_execution(execution_id: Option<pgrx::Uuid>) -> bool {
    wake::wake(execution_arg(execution_id))
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::{init, rows, start};
    use pgrx::prelude::*;
    use serde_json::json;

    row! {
        #[derive(Debug, PartialEq)]
        struct Entry {
            actor: String,
            action: String,
            target: String,
            outcome: String,
            detail: String,
        }
    }

    #[pg_test]
    fn operators_cancel_signal_pause_and_resume_are_audited_without_payloads() {
        init();
        let a = start("w", "a", json!({})).id;
        let b = start("w", "b", json!({})).id;
        // An application's signal, from a session that names no actor, is
        // not an operator's action.
        Spi::run_with_args("SELECT sheaf.signal($1, 'app', '{}')", &[a.into()]).unwrap();
        Spi::run("SELECT set_config('sheaf.actor', 'ann', true)").unwrap();
        let run = |sql: &str, id: pgrx::Uuid| Spi::run_with_args(sql, &[id.into()]).unwrap();
        run("SELECT sheaf.pause_execution($1)", a);
        run("SELECT sheaf.pause_execution($1)", a);
        run("SELECT sheaf.resume_execution($1)", a);
        run("SELECT sheaf.resume_execution($1)", a);
        run(
            "SELECT sheaf.signal($1, 'go', '{\"secret\": 1}', '{\"signal_id\": \"s-1\"}')",
            a,
        );
        run("SELECT sheaf.cancel_execution($1, 'no longer needed')", a);
        run("SELECT sheaf.signal($1, 'go', '{\"secret\": 2}')", a);
        run("SELECT sheaf.terminate_execution($1, NULL)", b);
        // A start's signal is the application's, as its start is.
        Spi::run("SELECT sheaf.signal_with_start('w', 'c', '{}', 'go', '{\"secret\": 3}')").unwrap();
        let logged: Vec<Entry> = rows(
            "SELECT actor, action, target, outcome, detail::text AS detail FROM sheaf.audit_log(NULL, 20) ORDER BY id",
            &[],
        );
        let entry = |action: &str, id: pgrx::Uuid, outcome: &str, detail: &str| Entry {
            actor: "ann".into(),
            action: action.into(),
            target: id.to_string(),
            outcome: outcome.into(),
            detail: detail.into(),
        };
        assert_eq!(
            logged,
            [
                entry("pause_execution", a, "ok", "{}"),
                entry("pause_execution", a, "already paused", "{}"),
                entry("resume_execution", a, "ok", "{}"),
                entry("resume_execution", a, "not paused", "{}"),
                entry("signal", a, "ok", r#"{"signal": "go", "signal_id": "s-1"}"#),
                entry("cancel_execution", a, "ok", r#"{"reason": "no longer needed"}"#),
                entry(
                    "signal",
                    a,
                    "already ended",
                    r#"{"signal": "go", "signal_id": null}"#
                ),
                entry("terminate_execution", b, "ok", r#"{"reason": null}"#),
            ]
        );
    }
}
