//! Signals: a message to one execution, appended to its history as
//! `SignalReceived`, waking it when it is suspended. A sender's retries
//! carry the same `signal_id` and are delivered once (`signals_seen`): once
//! per (workflow, workflow id) on this shard, so a retry that resolves the
//! key again finds the signal in a continue-as-new predecessor, or in the
//! run that got it and ended since, and reads as delivered.

use pgrx::prelude::*;

use crate::base::errors::not_ready;
use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;
use crate::workflow::{executions, history, wake};

use sheaf_core::state::ExecutionState;

// The event is built around the caller's payload as Postgres stored it.
const EVENT: Stmt = Stmt::read(
    "SELECT jsonb_build_object('signal', $1::text, 'signal_id', $2::text, 'payload', $3::jsonb)",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
    ],
);
// Some run of the key got this signal id (`signals_seen_id`).
const SEEN_BY_KEY: Stmt = Stmt::write(
    "SELECT EXISTS (SELECT 1 FROM signals_seen s JOIN executions x ON x.id = s.execution_id \
                    WHERE s.signal_id = $1 AND x.workflow_name = $2 AND x.workflow_id = $3)",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
    ],
);
const FIRST_SEEN: Stmt = Stmt::write(
    "INSERT INTO signals_seen (execution_id, signal_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING true",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::TEXTOID],
);

/// Delivers `signal` to execution `id`: `SignalReceived` in its history, and
/// a wake (a new workflow task) if it is suspended. `true` if delivered now
/// or before (the same `signal_id`, to this run or another run of its key
/// here, even one that has ended since); `false` if the execution has
/// ended without it. An
/// unknown id raises P0002; a run being moved to another shard 55000.
pub fn signal(id: pgrx::Uuid, signal: &str, payload: Jsonb, signal_id: Option<&str>) -> bool {
    // Locked: no end slips in between the check and the append, and two
    // deliveries of one signal id serialize on the row.
    let e = executions::lock(id);
    if e.state.is_migrating() {
        not_ready(format!(
            "execution {id} is {}: signal it where it now lives (its id's forward)",
            e.state
        ));
    }
    if let Some(signal_id) = signal_id {
        let seen = SEEN_BY_KEY.one_value::<bool>(
            &[
                signal_id.into(),
                e.workflow_name.as_str().into(),
                e.workflow_id.as_str().into(),
            ],
            "looking up a signal id",
        );
        if seen {
            return true;
        }
    }
    if !e.state.is_active() {
        return false;
    }
    if let Some(signal_id) = signal_id {
        let first = FIRST_SEEN.value::<bool>(&[id.into(), signal_id.into()], "recording a signal id");
        if first.is_none() {
            return true;
        }
    }
    let event: Jsonb = EVENT.one_value(
        &[signal.into(), signal_id.into(), payload.into()],
        "building a signal's event",
    );
    history::append_jsonb(id, "SignalReceived", event);
    let suspended = e.state == ExecutionState::Suspended
        || (e.state == ExecutionState::Paused && e.paused_from == Some(ExecutionState::Suspended));
    if suspended {
        wake::wake(id);
    }
    true
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{init, start};
    use pgrx::prelude::*;
    use serde_json::json;

    fn signal(id: pgrx::Uuid, opts: serde_json::Value) -> bool {
        Spi::get_one_with_args::<bool>(
            "SELECT sheaf.signal($1, 'approve', '{\"by\": \"ann\"}', $2)",
            &[id.into(), pgrx::JsonB(opts).into()],
        )
        .expect("signal")
        .expect("a result")
    }

    fn events(id: pgrx::Uuid, kind: &str) -> i64 {
        Spi::get_one_with_args::<i64>(
            "SELECT count(*) FROM sheaf.history($1) WHERE event_type = $2",
            &[id.into(), kind.into()],
        )
        .expect("history")
        .unwrap_or(0)
    }

    #[pg_test]
    fn a_signal_id_is_seen_across_a_continue_as_new_chain_and_an_end() {
        init();
        let first = start("w", "chain", json!({})).id;
        assert!(signal(first, json!({"signal_id": "once"})));
        let next =
            Spi::get_one_with_args::<pgrx::Uuid>("SELECT sheaf.continue_as_new($1, '{}')", &[first.into()])
                .unwrap()
                .unwrap();
        assert!(
            signal(next, json!({"signal_id": "once"})),
            "a redelivery to the successor reads as delivered"
        );
        assert_eq!(events(next, "SignalReceived"), 0, "and appends nothing");
        Spi::run_with_args("SELECT sheaf.complete_execution($1, '{}')", &[next.into()]).unwrap();
        let other = start("w", "ended", json!({})).id;
        assert!(signal(other, json!({"signal_id": "got-it"})));
        Spi::run_with_args("SELECT sheaf.complete_execution($1, '{}')", &[other.into()]).unwrap();
        assert!(
            signal(other, json!({"signal_id": "got-it"})),
            "a run that got it and ended: delivered, not failed"
        );
        assert!(
            !signal(other, json!({"signal_id": "never"})),
            "an ended run that never got it"
        );
    }

    #[pg_test]
    fn a_signal_is_delivered_once_per_id_and_wakes_a_suspended_run() {
        init();
        let id = start("w", "a", json!({})).id;
        Spi::run_with_args("SELECT sheaf.suspend_execution($1)", &[id.into()]).expect("suspend");
        assert!(signal(id, json!({"signal_id": "s-1"})));
        assert!(
            signal(id, json!({"signal_id": "s-1"})),
            "a retry reads as delivered"
        );
        assert_eq!(events(id, "SignalReceived"), 1);
        assert_eq!(events(id, "WorkflowWoken"), 1);
        let state =
            Spi::get_one_with_args::<String>("SELECT state FROM sheaf.get_execution($1)", &[id.into()])
                .expect("state");
        assert_eq!(state.as_deref(), Some("RUNNING"));
        assert!(signal(id, json!({})), "no id: always delivered");
        assert_eq!(events(id, "SignalReceived"), 2);
        assert_eq!(events(id, "WorkflowWoken"), 1, "a running run is not woken again");
        let payload = Spi::get_one_with_args::<pgrx::JsonB>(
            "SELECT payload FROM sheaf.history($1) WHERE event_type = 'SignalReceived' ORDER BY seq LIMIT 1",
            &[id.into()],
        )
        .expect("payload")
        .expect("one");
        assert_eq!(
            payload.0,
            json!({"signal": "approve", "signal_id": "s-1", "payload": {"by": "ann"}})
        );
    }

    #[pg_test]
    fn an_ended_run_takes_no_signal() {
        init();
        let id = start("w", "a", json!({})).id;
        Spi::run_with_args("SELECT sheaf.cancel_execution($1, 'x')", &[id.into()]).expect("cancel");
        assert!(!signal(id, json!({"signal_id": "late"})));
        assert_eq!(events(id, "SignalReceived"), 0);
    }

    #[pg_test]
    #[should_panic(expected = "invalid opts")]
    fn unknown_options_are_refused() {
        init();
        let id = start("w", "a", json!({})).id;
        signal(id, json!({"dedupe": "x"}));
    }
}
