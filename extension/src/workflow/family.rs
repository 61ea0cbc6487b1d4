//! What an execution's end does between it and its family, in its terminal
//! transaction (`lifecycle::close` calls it): a child's end is reported to
//! its parent, and a parent's end asks the children its `parent_close`
//! closes to close. Also the relay's channel, which carries both when the
//! other side is not here. Starting and cancelling children is `children`.
//!
//! Lock order (`base::locks`): a child's row before its parent's (a child's
//! end appends to its parent), and a parent's row before its lifecycle rows.
//! Nothing here locks a child's row while holding its parent's, so a
//! parent's end never closes a child itself: it asks the relay to
//! (`cross_shard_children.close_requested`), for local children too.

use pgrx::prelude::*;
use sheaf_core::children::ended_event;
use sheaf_core::state::ExecutionState;

use crate::base::catalog::{self, Feature};
use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::base::shard;
use crate::workflow::{executions, history, wake};

/// The channel the relay listens on. Payloads: `due` (a lifecycle row on
/// this shard is due now) and `ended <parent id> <child id>` (a child here
/// whose parent is on another shard has ended).
const NOTIFY: Stmt = Stmt::write("SELECT pg_notify('sheaf_relay', $1)", &[PgBuiltInOids::TEXTOID]);

// A parent's end: its lifecycle rows learn it, and those its children's
// parent_close closes ask for the close (a terminate wins over a cancel).
const PARENT_ENDED: Stmt = Stmt::write(
    "WITH u AS (UPDATE cross_shard_children c SET parent_ended = true, due_at = now(), \
                close_requested = CASE ch.parent_close WHEN 'terminate' THEN 'terminate' \
                                  WHEN 'request_cancel' THEN coalesce(c.close_requested, 'cancel') \
                                  ELSE c.close_requested END, \
                close_reason = CASE WHEN ch.parent_close = 'abandon' THEN c.close_reason ELSE $2 END \
                FROM children ch WHERE c.parent_id = $1 AND ch.child_id = c.child_id RETURNING 1) \
     SELECT count(*) FROM u",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::TEXTOID],
);
// Its local children still running get a lifecycle row of their own.
const CLOSE_LOCAL: Stmt = Stmt::write(
    "WITH i AS (INSERT INTO cross_shard_children \
                    (child_id, parent_id, target_shard, state, close_requested, close_reason, parent_ended) \
                SELECT ch.child_id, ch.parent_id, ch.target_shard, 'RUNNING', \
                       CASE ch.parent_close WHEN 'terminate' THEN 'terminate' ELSE 'cancel' END, $3, true \
                FROM children ch JOIN executions e ON e.id = ch.child_id \
                WHERE ch.parent_id = $1 AND ch.target_shard = $2 AND ch.parent_close <> 'abandon' \
                  AND e.state IN ('RUNNING', 'SUSPENDED', 'PAUSED', 'MIGRATING') \
                ON CONFLICT (child_id) DO NOTHING RETURNING 1) \
     SELECT count(*) FROM i",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::TEXTOID,
    ],
);
const SETTLE: Stmt = Stmt::write(
    "DELETE FROM cross_shard_children WHERE child_id = $1",
    &[PgBuiltInOids::UUIDOID],
);
// A child whose end its parent here has (or, ended, needs no more).
const DELIVERED: Stmt = Stmt::write(
    "UPDATE executions SET result_pulled_at = now() WHERE id = $1 AND result_pulled_at IS NULL",
    &[PgBuiltInOids::UUIDOID],
);
// A child's end in its parent's history, built around the child's result
// as Postgres stored it.
const ENDED_EVENT: Stmt = Stmt::read(
    "SELECT state, jsonb_build_object('child_id', id, 'state', state, 'result', result, 'error', error) \
     FROM executions WHERE id = $1",
    &[PgBuiltInOids::UUIDOID],
);

/// Whether this shard's catalog has children: between installing a
/// library of 0.2.0 or later and `ALTER EXTENSION sheaf UPDATE` it does
/// not, and no execution can have any.
pub fn enabled() -> bool {
    catalog::has(Feature::CrossShardChildren)
}

/// Tells the relay (`NOTIFY`'s payloads).
pub fn notify(payload: &str) {
    NOTIFY.exec(&[payload.into()]);
}

/// A child has ended (its row is locked and closed, in its terminal
/// transaction). Where its parent *lives* decides, never the shard its id
/// names (a parent born elsewhere may have moved here, one born here may
/// have moved away): a parent whose row is here and is not a seal gets the
/// end in its history and is woken, and the child is marked delivered
/// (retention may delete it); a parent elsewhere (no row here, or a seal)
/// is told through the relay's channel, and the relay pulls the end.
pub fn report_end(child: pgrx::Uuid, parent: pgrx::Uuid) {
    // The child's row, then its parent's (this module's lock order).
    let p = executions::try_lock(parent).filter(|p| p.state != ExecutionState::Migrated);
    let Some(p) = p else {
        notify(&format!("ended {parent} {child}"));
        return;
    };
    SETTLE.exec(&[child.into()]);
    DELIVERED.exec(&[child.into()]);
    if !p.state.is_active() {
        return;
    }
    row! {
        /// A child's end state and the event its parent hears.
        struct Ended {
            state: ExecutionState,
            event: Jsonb,
        }
    }
    let Ended { state, event } = ENDED_EVENT.one(&[child.into()], "reading a child's end");
    let Some(event_type) = ended_event(state) else {
        return;
    };
    history::append_jsonb(parent, event_type, event);
    wake::wake_for_event(&p);
}

/// The parent's end (its row is locked, in its terminal transaction):
/// every child its `parent_close` closes is asked to close, through the
/// relay; the relay settles each lifecycle row.
pub fn parent_ended(parent: pgrx::Uuid, state: ExecutionState) {
    let reason = format!("parent {parent} ended ({state})");
    let (remote, local): (i64, i64) = {
        let remote = PARENT_ENDED.one_value(
            &[parent.into(), reason.as_str().into()],
            "closing a parent's children",
        );
        let local = CLOSE_LOCAL.one_value(
            &[parent.into(), shard::current().into(), reason.as_str().into()],
            "closing a parent's local children",
        );
        (remote, local)
    };
    if remote + local > 0 {
        notify("due");
    }
}
