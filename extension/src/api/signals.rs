//! Signals to one execution, routed by its id.

use pgrx::prelude::*;

use sheaf_core::options::SignalOptions;

use crate::api::executions::{check_new_start, check_workflow_id, owner_elsewhere, start_options};
use crate::base::args::required;
use crate::base::audit;
use crate::base::errors::{bad_argument, misplaced, require_read_committed};
use crate::base::jsonb::Jsonb;
use crate::base::topology;
use crate::workflow::{policy, signals, start};

/// Delivers `signal` (1 to 128 bytes) with `payload` (at most 1 MiB of
/// JSON) to an execution: `SignalReceived` in its history, and a wake if it
/// is suspended. `opts.signal_id` makes a retry deliver nothing more.
/// `false` if the execution has ended. Audited with the signal's name and
/// id, never its payload, when the session names its actor (operator
/// tools do; an application signalling its runs would otherwise write one
/// entry per signal, burying the operators' actions in an unbounded log);
/// a workflow's own signals (`signal_external`, delivered by the relay)
/// and `signal_with_start` (a start, as `start_workflow`) are not.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn signal(
    execution_id: Option<pgrx::Uuid>,
    signal: Option<&str>,
    payload: Option<Jsonb>,
    opts: default!(Option<Jsonb>, "'{}'"),
) -> bool {
    let id = required(execution_id, "execution_id");
    let name = check_signal(signal);
    let payload = check_payload(payload);
    let opts = required(opts, "opts").parse("opts");
    let o = SignalOptions::parse(&opts).unwrap_or_else(|e| bad_argument(&e.option, e.why));
    let delivered = signals::signal(id, name, payload, o.signal_id.as_deref());
    if audit::actor_named() {
        audit::record(
            "signal",
            &id.to_string(),
            if delivered { "ok" } else { "already ended" },
            serde_json::json!({
                "signal": name,
                "signal_id": o.signal_id,
            }),
        );
    }
    delivered
}

/// Signal-with-start: starts workflow `name` with `workflow_id` unless one
/// is active (as `start_workflow`, whose options `opts` takes), then
/// delivers `signal` with `payload` to that execution, in one transaction:
/// a concurrent start or signal-with-start of the same workflow id makes or
/// finds the same run, and the signal is never lost between them.
/// `opts.signal_id` deduplicates the signal as in `signal`.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn signal_with_start(
    name: Option<&str>,
    workflow_id: Option<&str>,
    input: Option<Jsonb>,
    signal: Option<&str>,
    payload: Option<Jsonb>,
    opts: default!(Option<Jsonb>, "'{}'"),
) -> TableIterator<
    'static,
    (
        name!(execution_id, pgrx::Uuid),
        name!(created, bool),
        name!(superseded, Vec<pgrx::Uuid>),
    ),
> {
    require_read_committed("signal_with_start");
    let name = policy::check_name(name);
    let workflow_id = check_workflow_id(workflow_id);
    let input = required(input, "input").sized("input");
    let signal = check_signal(signal);
    let payload = check_payload(payload);
    let mut opts = required(opts, "opts").parse("opts");
    // The signal's own option; the rest are the start's.
    let signal_id = match opts.as_object_mut().and_then(|m| m.remove("signal_id")) {
        Some(v) => {
            SignalOptions::parse(&serde_json::json!({ "signal_id": v }))
                .unwrap_or_else(|e| bad_argument(&e.option, e.why))
                .signal_id
        }
        None => None,
    };
    let mut o = start_options(&opts);
    o.record_placement = true;
    check_new_start(name, workflow_id, &o);
    if o.debounce.is_some() {
        bad_argument(
            "opts.debounce",
            "a signal-with-start is not debounced: its signal needs the run now",
        );
    }
    topology::check_declared();
    if let Some(owner) = owner_elsewhere(name, workflow_id, &o) {
        misplaced("this signal-with-start", owner);
    }
    let (id, created, superseded) = start::start(name, workflow_id, input, &o);
    signals::signal(id, signal, payload, signal_id.as_deref());
    TableIterator::once((id, created, superseded))
}

/// A signal's name: 1 to 128 bytes.
pub(crate) fn check_signal(signal: Option<&str>) -> &str {
    let name = required(signal, "signal");
    if name.is_empty() || name.len() > 128 {
        bad_argument("signal", format!("must be 1 to 128 bytes, got {}", name.len()));
    }
    name
}

/// A signal's payload: at most the one size limit (1 MiB of JSON).
pub(crate) fn check_payload(payload: Option<Jsonb>) -> Jsonb {
    required(payload, "payload").sized("payload")
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::{count, init, one};
    use pgrx::prelude::*;

    row! {
        struct Started {
            id: pgrx::Uuid,
            created: bool,
        }
    }

    #[pg_test]
    fn signal_with_start_starts_once_and_delivers_every_signal() {
        init();
        let call = |payload: i64| {
            one::<Started>(
                "SELECT execution_id, created FROM sheaf.signal_with_start('w', 'one', '{}', 'go', \
                        jsonb_build_object('n', $1), '{\"signal_id\": null, \"queue\": \"wq\"}')",
                &[payload.into()],
            )
        };
        let (first, second) = (call(1), call(2));
        assert_eq!(
            (first.id, first.created, second.created),
            (second.id, true, false)
        );
        assert_eq!(
            count("SELECT count(*) FROM sheaf.events WHERE event_type = 'SignalReceived'"),
            2
        );
        Spi::run(
            "SELECT sheaf.signal_with_start('w', 'one', '{}', 'go', '{}', '{\"signal_id\": \"s\"}'), \
                    sheaf.signal_with_start('w', 'one', '{}', 'go', '{}', '{\"signal_id\": \"s\"}')",
        )
        .unwrap();
        assert_eq!(
            count("SELECT count(*) FROM sheaf.events WHERE event_type = 'SignalReceived'"),
            3,
            "a signal id is delivered once"
        );
    }

    #[pg_test(
        error = "invalid opts: unknown field \"shard\" (accepted: execution_id, queue, priority, run_at, search_attrs, execution_timeout, debounce, placement)"
    )]
    fn signal_with_start_refuses_an_unknown_option() {
        init();
        Spi::run("SELECT sheaf.signal_with_start('w', 'one', '{}', 'go', '{}', '{\"shard\": 1}')").unwrap();
    }
}
