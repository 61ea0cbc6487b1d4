//! The usage report and the cost ledger.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

use sheaf_core::usage::{GroupBy, check_metrics, check_window};

use crate::base::args::required;
use crate::base::errors::bad_argument;
use crate::base::jsonb::Jsonb;
use crate::workflow::usage;

/// What this shard's executions used in `[from_ts, to_ts)` (at most 90
/// days), one row per group: `group_by` is `workflow_name` or
/// `search_attr:<key>` (executions without the key are `(unattributed)`).
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn usage_report(
    from_ts: Option<TimestampWithTimeZone>,
    to_ts: Option<TimestampWithTimeZone>,
    group_by: default!(Option<&str>, "'workflow_name'"),
) -> TableIterator<
    'static,
    (
        name!(grp, String),
        name!(workflow_starts, i64),
        name!(completed, i64),
        name!(failed, i64),
        name!(cancelled, i64),
        name!(timed_out, i64),
        name!(activity_executions, i64),
        name!(activity_executions_failed, i64),
        name!(activity_compute_seconds, f64),
        name!(metered, pgrx::JsonB),
    ),
> {
    let from = required(from_ts, "from_ts");
    let to = required(to_ts, "to_ts");
    let group_by = required(group_by, "group_by");
    for (arg, at) in [("from_ts", from), ("to_ts", to)] {
        if !at.is_finite() {
            bad_argument(arg, "must be a finite timestamp");
        }
    }
    let micros = |t: TimestampWithTimeZone| pg_sys::TimestampTz::from(t);
    if let Err(e) = check_window(micros(from), micros(to)) {
        bad_argument(&e.option, e.why);
    }
    let group_by = GroupBy::parse(group_by).unwrap_or_else(|e| bad_argument(&e.option, e.why));
    TableIterator::new(usage::report(from, to, &group_by).into_iter().map(|u| {
        (
            u.grp,
            u.workflow_starts,
            u.completed,
            u.failed,
            u.cancelled,
            u.timed_out,
            u.activity_executions,
            u.activity_executions_failed,
            u.activity_compute_seconds,
            u.metered,
        )
    }))
}

/// Records metered units (a flat object of up to 32 numbers from -1e15 to 1e15, e.g.
/// `{"llm_calls": 1, "input_tokens": 812}`) against an execution of this
/// shard, now; `usage_report` sums them per group in `metered`.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn record_usage(execution_id: Option<pgrx::Uuid>, metrics: Option<Jsonb>) {
    let id = required(execution_id, "execution_id");
    let metrics = required(metrics, "metrics").checked("metrics");
    if let Err(e) = check_metrics(&metrics.clone().parse("metrics")) {
        bad_argument(&e.option, e.why);
    }
    usage::record(id, metrics);
}
