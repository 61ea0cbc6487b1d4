//! Child workflows: started by a parent (here or on another shard), cancelled
//! by it, and listed.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use sheaf_core::children::{ChildOptions, MAX_MESSAGE_BYTES};

use crate::api::executions::{check_new_workflow, check_workflow_id};
use crate::base::args::{self, required};
use crate::base::errors::{bad_argument, require_read_committed, too_large};
use crate::base::jsonb::Jsonb;
use crate::base::topology;
use crate::workflow::{children, policy};

/// The most children one `list_children` page holds.
const MAX_PAGE: i32 = 1000;

/// Starts child `name`/`workflow_id` of execution `parent_id` with `input`,
/// once per (parent, name, workflow id): a repeated call returns the same
/// child with `created = false`. `opts`: `target_shard` (default: this
/// shard; elsewhere, the relay starts it), `child_id` (minted for the
/// target), `parent_close` (`terminate`, `request_cancel` or `abandon`).
/// The parent's history gets `ChildStarted`; a run of the child's (name,
/// workflow id) already active is not adopted: the parent gets `ChildFailed`.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn start_child(
    parent_id: Option<pgrx::Uuid>,
    name: Option<&str>,
    workflow_id: Option<&str>,
    input: Option<Jsonb>,
    opts: default!(Option<Jsonb>, "'{}'"),
) -> TableIterator<
    'static,
    (
        name!(child_id, pgrx::Uuid),
        name!(target_shard, i32),
        name!(created, bool),
    ),
> {
    require_read_committed("start_child");
    let parent = required(parent_id, "parent_id");
    let name = policy::check_name(name);
    let workflow_id = check_workflow_id(workflow_id);
    let input = required(input, "input").sized("input");
    let opts = required(opts, "opts").parse("opts");
    let o = ChildOptions::parse(&opts).unwrap_or_else(|e| bad_argument(&e.option, e.why));
    check_new_workflow(name, workflow_id);
    topology::check_declared();
    TableIterator::once(children::start_child(parent, name, workflow_id, input, &o))
}

/// Cancels child `child_id` of `parent_id`: at once on this shard, through
/// the relay on another. `false` if it had ended (or its end is on its way).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn cancel_child(
    parent_id: Option<pgrx::Uuid>,
    child_id: Option<pgrx::Uuid>,
    reason: default!(Option<&str>, "NULL"),
) -> bool {
    let parent = required(parent_id, "parent_id");
    let child = required(child_id, "child_id");
    // The relay carries a reason to a child on another shard in a message
    // of at most 8 KiB: a longer one is refused here, never cut there.
    if let Some(r) = reason
        && r.len() > MAX_MESSAGE_BYTES
    {
        too_large(
            "reason",
            format!(
                "is {} bytes; the limit for a child's reason is {MAX_MESSAGE_BYTES} bytes",
                r.len()
            ),
        );
    }
    children::cancel_child(parent, child, reason)
}

/// Children of `parent_id` on this shard, in id order after `after`, at
/// most `max_rows` (1..1000); on the parent's own shard also those still
/// starting on another (state `STARTING`).
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn list_children(
    parent_id: Option<pgrx::Uuid>,
    after: default!(Option<pgrx::Uuid>, "NULL"),
    max_rows: default!(Option<i32>, 1000),
) -> TableIterator<
    'static,
    (
        name!(execution_id, pgrx::Uuid),
        name!(workflow_name, String),
        name!(workflow_id, String),
        name!(state, String),
        name!(shard, i32),
        name!(created_at, TimestampWithTimeZone),
        name!(closed_at, Option<TimestampWithTimeZone>),
    ),
> {
    let parent = required(parent_id, "parent_id");
    let max_rows = args::page_rows(max_rows, MAX_PAGE);
    TableIterator::new(children::list(parent, after, max_rows).into_iter().map(|c| {
        (
            c.execution_id,
            c.workflow_name,
            c.workflow_id,
            c.state,
            c.shard,
            c.created_at,
            c.closed_at,
        )
    }))
}

/// The executions on this shard that name a parent, in (parent, id) order
/// after (`after_parent`, `after_child`), at most `max_rows` (1..1000): one
/// side of the driver's orphan check (`known_children` is the other).
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn list_child_links(
    after_parent: default!(Option<pgrx::Uuid>, "NULL"),
    after_child: default!(Option<pgrx::Uuid>, "NULL"),
    max_rows: default!(Option<i32>, 1000),
) -> TableIterator<
    'static,
    (
        name!(parent_id, pgrx::Uuid),
        name!(child_id, pgrx::Uuid),
        name!(workflow_name, String),
        name!(workflow_id, String),
        name!(state, String),
        name!(created_at, TimestampWithTimeZone),
    ),
> {
    let max_rows = args::page_rows(max_rows, MAX_PAGE);
    if after_parent.is_some() != after_child.is_some() {
        bad_argument(
            "after_child",
            "after_parent and after_child are given together (the last row of a page) or not at all",
        );
    }
    let after = after_parent.zip(after_child);
    TableIterator::new(children::links(after, max_rows).into_iter().map(|l| {
        (
            l.parent_id,
            l.child_id,
            l.workflow_name,
            l.workflow_id,
            l.state,
            l.created_at,
        )
    }))
}

/// Those of `child_ids` (at most 1000) that a parent on this shard started:
/// an id left out is a child whose parent-side record is gone.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn known_children(child_ids: Option<Vec<Option<pgrx::Uuid>>>) -> SetOfIterator<'static, pgrx::Uuid> {
    let ids = args::no_nulls(required(child_ids, "child_ids"), "child_ids");
    if ids.len() > MAX_PAGE as usize {
        bad_argument(
            "child_ids",
            format!("must name at most {MAX_PAGE} children, got {}", ids.len()),
        );
    }
    SetOfIterator::new(children::known(ids))
}
