//! Signals to one execution, routed by its id.

use pgrx::prelude::*;

use sheaf_core::options::SignalOptions;

use crate::base::args::required;
use crate::base::errors::bad_argument;
use crate::base::jsonb::Jsonb;
use crate::workflow::history::MAX_EVENT_BYTES;
use crate::workflow::signals;

/// Delivers `signal` (1 to 128 bytes) with `payload` (at most 1 MiB of
/// JSON) to an execution: `SignalReceived` in its history, and a wake if it
/// is suspended. `opts.signal_id` makes a retry deliver nothing more.
/// `false` if the execution has ended.
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
    signals::signal(id, name, payload, o.signal_id.as_deref())
}

/// A signal's name: 1 to 128 bytes.
pub(crate) fn check_signal(signal: Option<&str>) -> &str {
    let name = required(signal, "signal");
    if name.is_empty() || name.len() > 128 {
        bad_argument("signal", format!("must be 1 to 128 bytes, got {}", name.len()));
    }
    name
}

/// A signal's payload: at most 1 MiB of JSON.
pub(crate) fn check_payload(payload: Option<Jsonb>) -> Jsonb {
    let payload = required(payload, "payload").checked("payload");
    let size = payload.compact_len();
    if size > MAX_EVENT_BYTES {
        bad_argument(
            "payload",
            format!("must be at most {MAX_EVENT_BYTES} bytes of JSON, got {size}"),
        );
    }
    payload
}
