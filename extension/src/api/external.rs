//! Signals and cancels addressed by business key (workflow name, workflow
//! id) from inside a workflow, through the outbox the relay delivers.

use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use sheaf_core::children::MAX_MESSAGE_BYTES;
use sheaf_core::external::{ExternalOptions, OutboxReport};

use crate::api::executions::check_workflow_id;
use crate::api::signals::{check_payload, check_signal};
use crate::base::args::{self, required};
use crate::base::errors::{bad_argument, require_read_committed};
use crate::base::jsonb::Jsonb;
use crate::workflow::external::{self, Request};
use crate::workflow::lifecycle::{self, Close};
use crate::workflow::policy;

/// The most outbox rows one `outbox_take` leases.
const MAX_TAKE: i32 = 1000;

fn options(opts: Option<Jsonb>) -> ExternalOptions {
    let opts = required(opts, "opts").parse("opts");
    ExternalOptions::parse(&opts).unwrap_or_else(|e| bad_argument(&e.option, e.why))
}

/// Sends `signal` with `payload` from execution `sender` (active, on this
/// shard) to the run of (`name`, `workflow_id`), wherever it lives: an
/// outbox row written in this transaction, delivered by the relay. The
/// sender's history gets `ExternalSignalRequested` now and later one of
/// `ExternalSignalDelivered`, `ExternalSignalFailed` (the run had ended) or
/// `ExternalTargetUnknown`, and is woken. `opts.signal_id` deduplicates a
/// retried handler: the first call's outbox id. Returns the outbox id.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn signal_external(
    sender: Option<pgrx::Uuid>,
    name: Option<&str>,
    workflow_id: Option<&str>,
    signal: Option<&str>,
    payload: Option<Jsonb>,
    opts: default!(Option<Jsonb>, "'{}'"),
) -> pgrx::Uuid {
    require_read_committed("signal_external");
    let sender = required(sender, "sender");
    let name = policy::check_name(name);
    let workflow_id = check_workflow_id(workflow_id);
    let signal = check_signal(signal);
    let payload = check_payload(payload);
    let o = options(opts);
    external::request(sender, name, workflow_id, Request::Signal { signal, payload }, &o)
}

/// Cancels the run of (`name`, `workflow_id`) for execution `sender`,
/// through the outbox (`reason` at most 8 KiB). The sender's history gets
/// `ExternalCancelRequested` now and later `ExternalCancelDelivered`
/// (`cancelled`: whether this cancel ended a run) or
/// `ExternalTargetUnknown`. Returns the outbox id.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn cancel_external(
    sender: Option<pgrx::Uuid>,
    name: Option<&str>,
    workflow_id: Option<&str>,
    reason: default!(Option<&str>, "NULL"),
    opts: default!(Option<Jsonb>, "'{}'"),
) -> pgrx::Uuid {
    require_read_committed("cancel_external");
    let sender = required(sender, "sender");
    let name = policy::check_name(name);
    let workflow_id = check_workflow_id(workflow_id);
    if let Some(r) = reason
        && r.len() > MAX_MESSAGE_BYTES
    {
        bad_argument(
            "reason",
            format!("must be at most {MAX_MESSAGE_BYTES} bytes, got {}", r.len()),
        );
    }
    let o = options(opts);
    let end = |t: pgrx::Uuid| {
        lifecycle::close(
            t,
            Close::Cancelled {
                reason: reason.map(str::to_owned),
            },
        )
    };
    external::request(
        sender,
        name,
        workflow_id,
        Request::Cancel { reason, end: &end },
        &o,
    )
}

/// Leases up to `max_rows` (1..1000) due outbox rows on this shard for
/// `lease`; `lease_token` fences the caller's `outbox_report`.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn outbox_take(
    max_rows: default!(Option<i32>, 100),
    lease: default!(Option<Interval>, "'30 seconds'"),
) -> TableIterator<
    'static,
    (
        name!(outbox_id, pgrx::Uuid),
        name!(sender_id, pgrx::Uuid),
        name!(kind, String),
        name!(state, String),
        name!(workflow_name, String),
        name!(workflow_id, String),
        name!(signal, Option<String>),
        name!(payload, Option<pgrx::JsonB>),
        name!(reason, Option<String>),
        name!(delivered_to, Option<pgrx::Uuid>),
        name!(attempts, i32),
        name!(indeterminate, i32),
        name!(lease_token, i64),
    ),
> {
    let max_rows = args::page_rows(max_rows, MAX_TAKE);
    let lease_secs = args::lease_secs("lease", required(lease, "lease"));
    TableIterator::new(external::take(max_rows, lease_secs).into_iter().map(|t| {
        (
            t.outbox_id,
            t.sender_id,
            t.kind,
            t.state,
            t.workflow_name,
            t.workflow_id,
            t.signal,
            t.payload,
            t.reason,
            t.delivered_to,
            t.attempts,
            t.indeterminate,
            t.lease_token,
        )
    }))
}

/// Records what the relay did for outbox row `outbox_id`, held under
/// `lease_token`. `outcome` has one key: `delivered`, `cancelled` (each
/// {execution_id, shard}), `ended` ({execution_id, shard, state}),
/// `confirmed` or `unknown` (true), `indeterminate` or `failed` (why).
/// Returns `released`, `settled` or `stale` (not the caller's lease:
/// nothing changed).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn outbox_report(
    outbox_id: Option<pgrx::Uuid>,
    lease_token: Option<i64>,
    outcome: Option<Jsonb>,
) -> &'static str {
    let id = required(outbox_id, "outbox_id");
    let token = required(lease_token, "lease_token");
    let outcome = required(outcome, "outcome").parse("outcome");
    let r = OutboxReport::parse(&outcome).unwrap_or_else(|e| bad_argument(&e.option, e.why));
    external::report(id, token, &r)
}

/// This shard's undelivered outbox rows by kind and state: how many, how
/// many failing, how many indeterminate, the oldest, the oldest
/// indeterminate since, the most attempts, the latest error.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn outbox_backlog() -> TableIterator<
    'static,
    (
        name!(kind, String),
        name!(state, String),
        name!(rows, i64),
        name!(failing, i64),
        name!(indeterminate, i64),
        name!(oldest, TimestampWithTimeZone),
        name!(indeterminate_since, Option<TimestampWithTimeZone>),
        name!(max_attempts, i32),
        name!(last_error, Option<String>),
    ),
> {
    TableIterator::new(external::backlog().into_iter().map(|b| {
        (
            b.kind,
            b.state,
            b.rows,
            b.failing,
            b.indeterminate,
            b.oldest,
            b.indeterminate_since,
            b.max_attempts,
            b.last_error,
        )
    }))
}
