//! The relay's primitives, called by the driver's relay (which holds no
//! transaction across shards): on a parent's shard, lease due lifecycle
//! rows (`take`) and record what an edge did (`report`); on a child's shard,
//! start a child by its id (`start_remote`) and close it (`close_remote`).
//! The edges are in `sql/schema.sql`, at `cross_shard_children`.

use pgrx::prelude::*;
use sheaf_core::children::{CloseKind, Report, ended_event};
use sheaf_core::id;
use sheaf_core::policy::StartOptions;
use sheaf_core::state::ExecutionState;

use crate::base::errors::{bad_argument, unknown_execution};
use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::base::shard;
use crate::workflow::children::{append_failed, conflict_reason};
use crate::workflow::lifecycle::{self, Close};
use crate::workflow::{executions, history, start, wake};

/// The columns `take` returns, in `relay_take`'s order.
macro_rules! taken_columns {
    () => {
        " RETURNING c.child_id, c.parent_id, c.target_shard, c.state, ch.workflow_name, ch.workflow_id, c.input, \
          c.close_requested, c.close_reason, c.close_delivered, c.parent_ended, c.attempts, c.lease_token"
    };
}
// A taken row's lease is its due time: it leaves the due range while held,
// and comes back by itself when the lease runs out.
const TAKE_DUE: Stmt = Stmt::write(
    concat!(
        "WITH picked AS (SELECT child_id FROM cross_shard_children WHERE due_at <= now() \
                         ORDER BY due_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
         UPDATE cross_shard_children c SET lease_token = nextval('fence_token'), \
                due_at = now() + make_interval(secs => $2), last_attempt_at = now() \
         FROM picked, children ch WHERE c.child_id = picked.child_id AND ch.child_id = c.child_id",
        taken_columns!()
    ),
    &[PgBuiltInOids::INT8OID, PgBuiltInOids::FLOAT8OID],
);
// Named rows (a notification's), due or not, unless another relay holds them.
const TAKE_NAMED: Stmt = Stmt::write(
    concat!(
        "WITH picked AS (SELECT child_id FROM cross_shard_children \
                         WHERE child_id = ANY($3) AND (lease_token IS NULL OR due_at <= now()) \
                         LIMIT $1 FOR UPDATE SKIP LOCKED) \
         UPDATE cross_shard_children c SET lease_token = nextval('fence_token'), \
                due_at = now() + make_interval(secs => $2), last_attempt_at = now() \
         FROM picked, children ch WHERE c.child_id = picked.child_id AND ch.child_id = c.child_id",
        taken_columns!()
    ),
    &[
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::UUIDARRAYOID,
    ],
);
const HOLDER: Stmt = Stmt::read(
    "SELECT parent_id FROM cross_shard_children WHERE child_id = $1 AND lease_token = $2",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::INT8OID],
);
const LOCK_ROW: Stmt = Stmt::write(
    "SELECT c.state, c.close_requested, c.close_delivered, c.parent_ended, c.target_shard, \
            ch.workflow_name, ch.workflow_id \
     FROM cross_shard_children c JOIN children ch ON ch.child_id = c.child_id \
     WHERE c.child_id = $1 AND c.lease_token = $2 FOR UPDATE OF c",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::INT8OID],
);
const STARTED: Stmt = Stmt::write(
    "UPDATE cross_shard_children SET state = 'RUNNING', input = NULL, attempts = 0, last_error = NULL \
     WHERE child_id = $1",
    &[PgBuiltInOids::UUIDOID],
);
const CLOSED: Stmt = Stmt::write(
    "UPDATE cross_shard_children SET close_delivered = true, attempts = 0, last_error = NULL WHERE child_id = $1",
    &[PgBuiltInOids::UUIDOID],
);
// A close or the parent's end that came while the row was held is due now.
const PENDING: Stmt = Stmt::write(
    "UPDATE cross_shard_children SET lease_token = NULL, attempts = 0, last_error = NULL, \
            due_at = CASE WHEN parent_ended OR (close_requested IS NOT NULL AND NOT close_delivered) THEN now() \
                          ELSE now() + make_interval(secs => $2) END \
     WHERE child_id = $1",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::FLOAT8OID],
);
// min(attempts, 6) x 5 s, counting this failure.
const FAILED: Stmt = Stmt::write(
    "UPDATE cross_shard_children SET lease_token = NULL, attempts = attempts + 1, last_error = $2, \
            due_at = now() + make_interval(secs => 5 * least(attempts + 1, 6)) \
     WHERE child_id = $1",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::TEXTOID],
);
const SETTLE: Stmt = Stmt::write(
    "DELETE FROM cross_shard_children WHERE child_id = $1",
    &[PgBuiltInOids::UUIDOID],
);
// The end of a child on another shard, as the relay read it there: its
// result goes into the parent's history as Postgres stored the report.
const ENDED_EVENT: Stmt = Stmt::read(
    "SELECT jsonb_build_object('child_id', $1::uuid, 'state', $2::text, \
                               'result', $3::jsonb -> 'ended' -> 'result', 'error', $3::jsonb -> 'ended' ->> 'error')",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
    ],
);
const PARENT_OF: Stmt = Stmt::read(
    "SELECT parent_id FROM executions WHERE id = $1",
    &[PgBuiltInOids::UUIDOID],
);

// The in-flight gauge: rows by target, state and requested close.
const BACKLOG: Stmt = Stmt::read(
    "SELECT target_shard, state, close_requested, count(*), count(*) FILTER (WHERE attempts > 0), \
            min(created_at), max(attempts), \
            (array_agg(last_error ORDER BY last_attempt_at DESC) FILTER (WHERE last_error IS NOT NULL))[1] \
     FROM cross_shard_children GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
    &[],
);

// A drain's check: the lifecycle rows naming one target shard.
const ROWS_TO: Stmt = Stmt::read(
    "SELECT child_id, parent_id, state FROM cross_shard_children \
     WHERE target_shard = $1 AND child_id > $2 ORDER BY child_id LIMIT $3",
    &[
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT8OID,
    ],
);

/// The lifecycle rows here whose child is (or is to be) on shard
/// `target`, after child `after`, at most `max`.
pub fn rows_to(target: i32, after: Option<pgrx::Uuid>, max: i64) -> Vec<RowTo> {
    let after = after.unwrap_or(pgrx::Uuid::from_bytes([0; 16]));
    ROWS_TO.all(
        &[target.into(), after.into(), max.into()],
        "listing lifecycle rows by target",
    )
}

row! {
    /// A lifecycle row whose child is on a given shard.
    pub struct RowTo {
        pub child_id: pgrx::Uuid,
        pub parent_id: pgrx::Uuid,
        pub state: String,
    }
}

row! {
    /// A group of lifecycle rows as `relay_backlog` returns it.
    pub struct Backlog {
        pub target_shard: i32,
        pub state: String,
        pub close_requested: Option<String>,
        pub rows: i64,
        pub failing: i64,
        pub oldest: pgrx::datum::TimestampWithTimeZone,
        pub max_attempts: i32,
        pub last_error: Option<String>,
    }
}

/// This shard's lifecycle rows, grouped.
pub fn backlog() -> Vec<Backlog> {
    BACKLOG.all(&[], "reading the relay's backlog")
}

row! {
    /// A lifecycle row as `relay_take` returns it.
    pub struct Taken {
        pub child_id: pgrx::Uuid,
        pub parent_id: pgrx::Uuid,
        pub target_shard: i32,
        pub state: String,
        pub workflow_name: String,
        pub workflow_id: String,
        pub input: Option<pgrx::JsonB>,
        pub close_requested: Option<String>,
        pub close_reason: Option<String>,
        pub close_delivered: bool,
        pub parent_ended: bool,
        pub attempts: i32,
        pub lease_token: i64,
    }
}

/// Leases up to `max` lifecycle rows for `lease_secs`: the due ones, or
/// those of `named` that no other relay holds.
pub fn take(max: i64, lease_secs: f64, named: Option<Vec<pgrx::Uuid>>) -> Vec<Taken> {
    match named {
        None => TAKE_DUE.all(&[max.into(), lease_secs.into()], "taking lifecycle rows"),
        Some(ids) => TAKE_NAMED.all(
            &[max.into(), lease_secs.into(), ids.into()],
            "taking lifecycle rows",
        ),
    }
}

row! {
    /// A lifecycle row, locked.
    struct Row {
        state: String,
        close_requested: Option<String>,
        close_delivered: bool,
        parent_ended: bool,
        target: i32,
        name: String,
        workflow_id: String,
    }
}

/// What `report` did with the row: `held` (the lease is still the
/// caller's: go on with the next edge), `released` (it waits for its due
/// time), `settled` (deleted: nothing is left to do), `stale` (the lease is
/// not the caller's any more, or the row is gone; nothing changed).
pub fn report(child: pgrx::Uuid, token: i64, r: &Report, outcome: Jsonb) -> &'static str {
    let parent: Option<pgrx::Uuid> = HOLDER.value(&[child.into(), token.into()], "reading a lifecycle row");
    let Some(parent) = parent else {
        return "stale";
    };
    // The parent's row before its lifecycle rows (`workflow::family`).
    let p = executions::try_lock(parent);
    let row: Option<Row> = LOCK_ROW.first(&[child.into(), token.into()], "locking a lifecycle row");
    let Some(Row {
        state,
        close_requested,
        close_delivered,
        parent_ended,
        target,
        name,
        workflow_id,
    }) = row
    else {
        return "stale";
    };
    let parent_live = p.as_ref().filter(|p| p.state.is_active());
    let settle = || {
        SETTLE.exec(&[child.into()]);
        "settled"
    };
    match r {
        Report::Started => {
            STARTED.exec(&[child.into()]);
            if parent_ended && (close_requested.is_none() || close_delivered) {
                return settle();
            }
            "held"
        }
        Report::Closed => {
            CLOSED.exec(&[child.into()]);
            if parent_ended && state == "RUNNING" {
                return settle();
            }
            "held"
        }
        Report::Conflict(existing) => {
            if let Some(p) = parent_live {
                let reason = conflict_reason(&name, &workflow_id, pgrx::Uuid::from_bytes(*existing), target);
                append_failed(parent, child, &reason);
                wake::wake_for_event(p);
            }
            settle()
        }
        Report::Refused(why) => {
            if let Some(p) = parent_live {
                append_failed(
                    parent,
                    child,
                    &format!("shard {target} refused the child's start: {why}"),
                );
                wake::wake_for_event(p);
            }
            settle()
        }
        Report::Ended(ended) => {
            if let Some(p) = parent_live {
                append_ended(parent, child, *ended, outcome);
                wake::wake_for_event(p);
            }
            settle()
        }
        // A parent that ended with nothing left to deliver (abandon, or a
        // close already delivered) needs no more of a running child.
        Report::Pending(_) if parent_ended && (close_requested.is_none() || close_delivered) => settle(),
        Report::Pending(secs) => {
            PENDING.exec(&[child.into(), (*secs).into()]);
            "released"
        }
        Report::Failed(error) => {
            FAILED.exec(&[child.into(), error.as_str().into()]);
            "released"
        }
    }
}

fn append_ended(parent: pgrx::Uuid, child: pgrx::Uuid, state: ExecutionState, outcome: Jsonb) {
    let Some(event_type) = ended_event(state) else {
        return;
    };
    let event: Jsonb = ENDED_EVENT.one_value(
        &[child.into(), state.as_str().into(), outcome.into()],
        "building a child's end",
    );
    history::append_jsonb(parent, event_type, event);
}

/// Starts child `child` of `parent` (on another shard) here, by its id:
/// `started` now, `exists` (started before: the relay's retry), or
/// `conflict` with the active run of its (name, workflow id), which is not
/// adopted. Gates and quotas refuse as for any start.
pub fn start_remote(
    child: pgrx::Uuid,
    parent: pgrx::Uuid,
    name: &str,
    workflow_id: &str,
    input: Jsonb,
) -> (&'static str, pgrx::Uuid) {
    let here = shard::current();
    let prefix = i32::from(id::shard_of(child.as_bytes()));
    if prefix != here {
        bad_argument(
            "child_id",
            format!("{child} was minted for shard {prefix}, and this is shard {here}"),
        );
    }
    if let Some(existing_parent) = parent_of(child) {
        if existing_parent != Some(parent) {
            bad_argument(
                "child_id",
                format!("{child} already names an execution here that is not a child of {parent}"),
            );
        }
        return ("exists", child);
    }
    let o = StartOptions {
        execution_id: Some(*child.as_bytes()),
        ..StartOptions::default()
    };
    match start::start_as(name, workflow_id, input, &o, Some(parent)) {
        (id, true, _) => ("started", id),
        // Another relay's start of this same child (its lease lapsed while
        // it ran) committed while this one waited for the start lock: the
        // child runs, it is not a conflict.
        (existing, false, _) if existing == child => ("exists", child),
        (existing, false, _) => ("conflict", existing),
    }
}

/// `Some(parent_id)` of an execution here, `None` if there is none.
fn parent_of(id: pgrx::Uuid) -> Option<Option<pgrx::Uuid>> {
    PARENT_OF.value::<Option<pgrx::Uuid>>(&[id.into()], "reading a parent")
}

/// Cancels or terminates child `child` of `parent` here; `false` if it
/// had ended. An execution that is not `parent`'s child is refused (22023).
pub fn close_remote(child: pgrx::Uuid, parent: pgrx::Uuid, how: CloseKind, reason: Option<String>) -> bool {
    match parent_of(child) {
        None => unknown_execution(child),
        Some(p) if p != Some(parent) => {
            bad_argument("child_id", format!("{child} is not a child of {parent}"));
        }
        Some(_) => {}
    }
    lifecycle::close(
        child,
        match how {
            CloseKind::Cancel => Close::Cancelled { reason },
            CloseKind::Terminate => Close::Terminated { reason },
        },
    )
}
