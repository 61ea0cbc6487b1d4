//! Executions: starting one (the admission transaction) and reading them.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use sheaf_core::options::{MAX_KEY_BYTES, MAX_QUEUE_NAME_BYTES};
use sheaf_core::placement::{Admission, Projection};
use sheaf_core::policy::StartOptions;
use sheaf_core::search::MAX_ATTR_KEY_BYTES;

use crate::base::args::{self, required};
use crate::base::clock;
use crate::base::errors::{bad_argument, misplaced, require_read_committed};
use crate::base::jsonb::Jsonb;
use crate::base::names::{self, Kind};
use crate::base::topology;
use crate::workflow::{debounce, executions, policy, start};

pub(crate) fn check_workflow_id(workflow_id: Option<&str>) -> &str {
    let workflow_id = required(workflow_id, "workflow_id");
    if workflow_id.is_empty() || workflow_id.len() > 256 {
        bad_argument(
            "workflow_id",
            format!("must be 1 to 256 bytes, got {}", workflow_id.len()),
        );
    }
    workflow_id
}

/// Starts an execution of workflow `name` with `workflow_id` unless one is
/// active (then returns it with `created = false`, changing nothing).
/// `opts`: `execution_id` (an id minted for this shard by a router),
/// `queue` (overrides the policy's), `priority` and `run_at` of the first
/// workflow task, `execution_timeout` (the run ends `TIMED_OUT` this long
/// after its start, by `maintain`), `debounce` (`{"key", "window",
/// "mode"}`: a burst of starts with one key makes one run,
/// `workflow::debounce`). `superseded`: the executions this start cancelled (latest
/// wins). Refusals: 53400 (quota), 55006 (concurrency gate `reject`).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn start_workflow(
    name: Option<&str>,
    workflow_id: Option<&str>,
    input: Option<Jsonb>,
    opts: default!(Option<Jsonb>, "'{}'"),
) -> TableIterator<
    'static,
    (
        name!(execution_id, pgrx::Uuid),
        name!(created, bool),
        name!(superseded, Vec<pgrx::Uuid>),
    ),
> {
    require_read_committed("start_workflow");
    let name = policy::check_name(name);
    let workflow_id = check_workflow_id(workflow_id);
    let input = required(input, "input").sized("input");
    let opts = required(opts, "opts").parse("opts");
    let mut o = start_options(&opts);
    // A debounced start is placed by its key, and not listed as misplaced.
    o.record_placement = o.debounce.is_none();
    check_new_start(name, workflow_id, &o);
    topology::check_declared();
    let owner = owner_elsewhere(name, workflow_id, &o);
    TableIterator::once(match &o.debounce {
        // A debounced start sent where its window is open joins it, even
        // when its key's home has moved on (the driver sends it there).
        Some(d) => debounce::start(name, workflow_id, input, &o, d, || {
            if let Some(owner) = owner {
                misplaced("this debounced start", owner);
            }
        }),
        None => {
            if let Some(owner) = owner {
                misplaced("this start", owner);
            }
            start::start(name, workflow_id, input, &o)
        }
    })
}

/// The shard that owns a start, when the topology published here places it
/// on another one; 22023 for a placement it refuses. `None` with no
/// projection published.
pub(crate) fn owner_elsewhere(name: &str, workflow_id: &str, o: &StartOptions) -> Option<u16> {
    let debounce_key = o.debounce.as_ref().map(|d| d.key.as_str());
    let place = |p: &Projection| {
        p.place_start(name, workflow_id, &o.placement, o.tenant.as_deref(), debounce_key)
            .map(Some)
    };
    match topology::admit(place) {
        Admission::Here => None,
        Admission::Elsewhere(owner) => Some(owner),
        Admission::Refused(e) => bad_argument("opts.placement", e),
    }
}

/// The name rule (`args::new_name`) on what a start stores: the workflow's
/// name and id (stored ones keep working: a name with a policy or an
/// execution here, an id with an execution of that name), and from `o`
/// the queue (one that exists keeps working), the debounce key and the
/// search-attribute keys.
pub(crate) fn check_new_start(name: &str, workflow_id: &str, o: &StartOptions) {
    check_new_workflow(name, workflow_id);
    if let Some(q) = &o.queue {
        args::new_name(q, "opts.queue", MAX_QUEUE_NAME_BYTES, || {
            names::stored(Kind::Queue, q)
        });
    }
    args::new_key(
        o.debounce.as_ref().map(|d| d.key.as_str()),
        "opts.debounce.key",
        MAX_KEY_BYTES,
    );
    if let Some(serde_json::Value::Object(attrs)) = &o.search_attrs {
        for key in attrs.keys() {
            args::new_key(Some(key), "opts.search_attrs", MAX_ATTR_KEY_BYTES);
        }
    }
}

/// The name rule on a new execution's workflow name and id.
pub(crate) fn check_new_workflow(name: &str, workflow_id: &str) {
    args::new_name(name, "name", MAX_KEY_BYTES, || {
        names::stored(Kind::Workflow, name)
    });
    args::new_name(workflow_id, "workflow_id", MAX_KEY_BYTES, || {
        names::stored(Kind::WorkflowId(name), workflow_id)
    });
}

/// A start's `opts`, checked (`run_at` within `clock::run_at`'s bounds).
pub(crate) fn start_options(opts: &serde_json::Value) -> StartOptions {
    let o = match StartOptions::parse(opts) {
        Ok(o) => o,
        Err(e) => bad_argument(&e.option, e.why),
    };
    if o.debounce.is_some() && o.run_at.is_some() {
        bad_argument(
            "opts.run_at",
            "a debounced start is due when its window ends: give run_at or debounce, not both",
        );
    }
    if let Some(s) = &o.run_at {
        clock::run_at(s, "opts.run_at");
    }
    o
}

/// An execution by id: one row, or none if it is not on this shard.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn get_execution(
    execution_id: Option<pgrx::Uuid>,
) -> TableIterator<
    'static,
    (
        name!(execution_id, pgrx::Uuid),
        name!(workflow_name, String),
        name!(workflow_id, String),
        name!(state, String),
        name!(input, pgrx::JsonB),
        name!(result, Option<pgrx::JsonB>),
        name!(error, Option<String>),
        name!(concurrency_key, Option<String>),
        name!(quota_key, Option<String>),
        name!(history_bytes, i64),
        name!(created_at, TimestampWithTimeZone),
        name!(closed_at, Option<TimestampWithTimeZone>),
        name!(wake_at, Option<TimestampWithTimeZone>),
    ),
> {
    let id = required(execution_id, "execution_id");
    TableIterator::new(executions::get(id).into_iter().map(columns))
}

/// The columns of `get_execution` and `find_execution`, in the order their
/// signatures name them (pgrx reads the names from each signature, so only
/// the filling is shared).
type ExecutionColumns = (
    pgrx::Uuid,
    String,
    String,
    String,
    pgrx::JsonB,
    Option<pgrx::JsonB>,
    Option<String>,
    Option<String>,
    Option<String>,
    i64,
    TimestampWithTimeZone,
    Option<TimestampWithTimeZone>,
    Option<TimestampWithTimeZone>,
);

fn columns(e: executions::Row) -> ExecutionColumns {
    (
        e.id,
        e.workflow_name,
        e.workflow_id,
        e.state,
        e.input,
        e.result,
        e.error,
        e.concurrency_key,
        e.quota_key,
        e.history_bytes,
        e.created_at,
        e.closed_at,
        e.wake_at,
    )
}

/// The execution of (name, workflow_id) on this shard: the active one, else
/// the most recent terminal one; no row if there is none.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn find_execution(
    name: Option<&str>,
    workflow_id: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(execution_id, pgrx::Uuid),
        name!(workflow_name, String),
        name!(workflow_id, String),
        name!(state, String),
        name!(input, pgrx::JsonB),
        name!(result, Option<pgrx::JsonB>),
        name!(error, Option<String>),
        name!(concurrency_key, Option<String>),
        name!(quota_key, Option<String>),
        name!(history_bytes, i64),
        name!(created_at, TimestampWithTimeZone),
        name!(closed_at, Option<TimestampWithTimeZone>),
        name!(wake_at, Option<TimestampWithTimeZone>),
    ),
> {
    let name = policy::check_name(name);
    let workflow_id = check_workflow_id(workflow_id);
    TableIterator::new(executions::find(name, workflow_id).into_iter().map(columns))
}

/// The pending debounced starts of workflow `name` (every workflow's if
/// NULL; of one `debounce_key` if given) whose window is open: the run each
/// burst joins, its mode, when the window ends and how many starts it took.
/// At most `max_rows` (1..10000).
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn pending_starts(
    name: default!(Option<&str>, "NULL"),
    max_rows: default!(Option<i32>, 1000),
    debounce_key: default!(Option<&str>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(workflow_name, String),
        name!(debounce_key, String),
        name!(execution_id, pgrx::Uuid),
        name!(mode, String),
        name!(window_ends_at, TimestampWithTimeZone),
        name!(starts, i64),
        name!(created_at, TimestampWithTimeZone),
    ),
> {
    let name = name.map(|n| policy::check_name(Some(n)));
    let max = crate::base::args::page_rows(max_rows, 10_000);
    if let Some(key) = debounce_key {
        check_debounce_key(key);
    }
    TableIterator::new(debounce::pending(name, debounce_key, max).into_iter().map(|p| {
        (
            p.workflow_name,
            p.debounce_key,
            p.execution_id,
            p.mode,
            p.window_ends_at,
            p.starts,
            p.created_at,
        )
    }))
}

/// Cancels the pending debounced start of (`name`, `debounce_key`): a
/// trailing one's run is cancelled before it ran (`reason` in its
/// history); a leading one's run goes on, and the next start makes a new
/// one. `false` if no window was open. Audited.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn cancel_pending_start(
    name: Option<&str>,
    debounce_key: Option<&str>,
    reason: default!(Option<&str>, "NULL"),
) -> bool {
    let name = policy::check_name(name);
    let key = required(debounce_key, "debounce_key");
    check_debounce_key(key);
    let reason = reason.map(|r| args::text(r, "reason"));
    let cancelled = debounce::cancel(name, key, reason);
    crate::base::audit::record(
        "cancel_pending_start",
        name,
        "ok",
        serde_json::json!({"debounce_key": sheaf_core::children::cut(key, 64), "cancelled": cancelled}),
    );
    cancelled
}

fn check_debounce_key(key: &str) {
    if key.is_empty() || key.len() > 256 {
        bad_argument(
            "debounce_key",
            format!("must be 1 to 256 bytes, got {}", key.len()),
        );
    }
}
