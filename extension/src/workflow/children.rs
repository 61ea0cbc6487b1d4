//! Child workflows, on the parent's shard: `start_child` (a child here is
//! started in the parent's transaction; one on another shard gets a
//! lifecycle row in `cross_shard_children` for the relay), a parent's
//! cancel of its child, and the listings of children. What an end does
//! between a parent and its children is `family`, which the end itself
//! (`lifecycle::close`) calls.
//!
//! Lock order (`base::locks`): a child's row before its parent's, and a
//! parent's row before its lifecycle rows (`family`).

use pgrx::prelude::*;
use sheaf_core::children::{ChildOptions, CloseKind};
use sheaf_core::id;
use sheaf_core::policy::StartOptions;

use crate::base::errors::{bad_argument, unknown_execution};
use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::base::{ids, shard};
use crate::workflow::lifecycle::{self, Close};
use crate::workflow::{executions, family, history, start, wake};

const EXISTING: Stmt = Stmt::read(
    "SELECT child_id, target_shard FROM children \
     WHERE parent_id = $1 AND workflow_name = $2 AND workflow_id = $3",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
    ],
);
const RECORD: Stmt = Stmt::write(
    "INSERT INTO children (parent_id, workflow_name, workflow_id, child_id, target_shard, parent_close) \
     VALUES ($1, $2, $3, $4, $5, $6)",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::TEXTOID,
    ],
);
const LIFECYCLE: Stmt = Stmt::write(
    "INSERT INTO cross_shard_children (child_id, parent_id, target_shard, state, input) \
     VALUES ($1, $2, $3, 'STARTING', $4)",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::JSONBOID,
    ],
);
const CHILD_OF: Stmt = Stmt::read(
    "SELECT target_shard FROM children WHERE parent_id = $1 AND child_id = $2",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::UUIDOID],
);
const REQUEST_CLOSE: Stmt = Stmt::write(
    "UPDATE cross_shard_children SET close_requested = coalesce(close_requested, $2), \
            close_reason = coalesce(close_reason, $3), due_at = now() \
     WHERE child_id = $1 AND NOT close_delivered RETURNING true",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
    ],
);
// A parent's children here, and (on its own shard) those still starting
// elsewhere, in id order after `$2`.
const LIST: Stmt = Stmt::read(
    "SELECT * FROM ( \
       SELECT e.id, e.workflow_name, e.workflow_id, e.state, $4::int, e.created_at, e.closed_at \
       FROM executions e WHERE e.parent_id = $1 AND e.id > $2 \
       UNION ALL \
       SELECT c.child_id, ch.workflow_name, ch.workflow_id, 'STARTING', c.target_shard, ch.created_at, NULL \
       FROM cross_shard_children c JOIN children ch ON ch.child_id = c.child_id \
       WHERE c.parent_id = $1 AND c.state = 'STARTING' AND c.child_id > $2) k \
     ORDER BY 1 LIMIT $3",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::INT4OID,
    ],
);

// Executions naming a parent, keyset on (parent_id, id) over executions_parent.
const LINKS: Stmt = Stmt::read(
    "SELECT parent_id, id, workflow_name, workflow_id, state, created_at FROM executions \
     WHERE parent_id IS NOT NULL AND (parent_id, id) > ($1, $2) ORDER BY parent_id, id LIMIT $3",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT8OID,
    ],
);
const KNOWN: Stmt = Stmt::read(
    "SELECT child_id FROM children WHERE child_id = ANY($1)",
    &[PgBuiltInOids::UUIDARRAYOID],
);

row! {
    /// An execution naming its parent, as `list_child_links` returns it.
    pub struct Link {
        pub parent_id: pgrx::Uuid,
        pub child_id: pgrx::Uuid,
        pub workflow_name: String,
        pub workflow_id: String,
        pub state: String,
        pub created_at: pgrx::datum::TimestampWithTimeZone,
    }
}

/// The executions here that name a parent, after `after` (parent, child).
pub fn links(after: Option<(pgrx::Uuid, pgrx::Uuid)>, max: i64) -> Vec<Link> {
    let zero = pgrx::Uuid::from_bytes([0; 16]);
    let (p, c) = after.unwrap_or((zero, zero));
    LINKS.all(&[p.into(), c.into(), max.into()], "listing child links")
}

/// Those of `ids` that a parent here started.
pub fn known(ids: Vec<pgrx::Uuid>) -> Vec<pgrx::Uuid> {
    KNOWN.values(&[ids.into()], "looking up children")
}

row! {
    /// A child as `list_children` returns it.
    pub struct Listed {
        pub execution_id: pgrx::Uuid,
        pub workflow_name: String,
        pub workflow_id: String,
        pub state: String,
        pub shard: i32,
        pub created_at: pgrx::datum::TimestampWithTimeZone,
        pub closed_at: Option<pgrx::datum::TimestampWithTimeZone>,
    }
}

/// `parent`'s children on this shard after `after`, at most `max`. Not
/// forwarded when the parent moved away: its children stay on the shards
/// they were started on, so a shard holding only the parent's seal still
/// lists its own (those starting elsewhere are listed where it lives).
pub fn list(parent: pgrx::Uuid, after: Option<pgrx::Uuid>, max: i64) -> Vec<Listed> {
    let after = after.unwrap_or(pgrx::Uuid::from_bytes([0; 16]));
    LIST.all(
        &[parent.into(), after.into(), max.into(), shard::current().into()],
        "listing children",
    )
}

/// What `start_child` returns: the child, its shard, and whether this call
/// started it (false: the same (parent, name, workflow id) started it before).
pub type Child = (pgrx::Uuid, i32, bool);

/// Starts child `name`/`workflow_id` of `parent` on `o.target_shard`
/// (default: here), once per (parent, name, workflow id).
pub fn start_child(
    parent: pgrx::Uuid,
    name: &str,
    workflow_id: &str,
    input: Jsonb,
    o: &ChildOptions,
) -> Child {
    // A child started here takes its start and gate locks before the
    // parent's row (`base::locks`: advisory locks before rows), so a start
    // of the child's key that closes runs (latest wins) cannot deadlock
    // against this. Then the parent: concurrent calls for one parent
    // serialize on its row.
    if o.target_shard.is_none_or(|t| i32::from(t) == shard::current()) {
        start::lock_ahead(name, workflow_id, &input);
    }
    executions::lock_active(parent, "start a child");
    row! {
        /// A child the parent started before, and its shard.
        struct Existing {
            child: pgrx::Uuid,
            shard: i32,
        }
    }
    let found: Option<Existing> = EXISTING.first(
        &[parent.into(), name.into(), workflow_id.into()],
        "looking up a child",
    );
    if let Some(Existing { child, shard }) = found {
        return (child, shard, false);
    }
    let here = shard::current();
    let target = o.target_shard.map_or(here, i32::from);
    let child = match o.child_id {
        Some(given) => {
            let prefix = i32::from(id::shard_of(&given));
            if o.target_shard.is_none() && prefix != here {
                bad_argument(
                    "opts.child_id",
                    format!("was minted for shard {prefix}: name it in opts.target_shard too"),
                );
            }
            pgrx::Uuid::from_bytes(given)
        }
        None => ids::mint_for(target),
    };
    RECORD.exec(&[
        parent.into(),
        name.into(),
        workflow_id.into(),
        child.into(),
        target.into(),
        o.parent_close.as_str().into(),
    ]);
    history::append(
        parent,
        "ChildStarted",
        serde_json::json!({"child_id": child.to_string(), "shard": target,
                           "workflow_name": name, "workflow_id": workflow_id}),
    );
    if target == here {
        start_local(parent, child, name, workflow_id, input);
    } else {
        LIFECYCLE.exec(&[child.into(), parent.into(), target.into(), input.into()]);
        family::notify("due");
    }
    (child, target, true)
}

/// A child on the parent's shard: started in the parent's transaction. A
/// run of its (name, workflow id) already active is not adopted.
fn start_local(parent: pgrx::Uuid, child: pgrx::Uuid, name: &str, workflow_id: &str, input: Jsonb) {
    let o = StartOptions {
        execution_id: Some(*child.as_bytes()),
        ..StartOptions::default()
    };
    let (started, created, _) = start::start_as(name, workflow_id, input, &o, Some(parent));
    if !created {
        let reason = conflict_reason(name, workflow_id, started, shard::current());
        append_failed(parent, child, &reason);
        wake::wake_for_event(&executions::lock(parent));
    }
}

/// Why a child was not adopted: its (name, workflow id) already runs.
pub fn conflict_reason(name: &str, workflow_id: &str, existing: pgrx::Uuid, shard: i32) -> String {
    format!(
        "workflow {name:?} id {workflow_id:?} already has an active run, {existing} on shard {shard}: \
         the child was not started"
    )
}

/// `ChildFailed` for a child that never ran.
pub fn append_failed(parent: pgrx::Uuid, child: pgrx::Uuid, error: &str) {
    history::append(
        parent,
        "ChildFailed",
        serde_json::json!({"child_id": child.to_string(), "state": null, "result": null, "error": error}),
    );
}

/// Cancels child `child` of `parent`: here at once (its end reaches the
/// parent in the same transaction), elsewhere through the relay. `false`
/// if the child had ended, or its end is already being delivered.
pub fn cancel_child(parent: pgrx::Uuid, child: pgrx::Uuid, reason: Option<&str>) -> bool {
    // A parent that moved: its children are known where it lives.
    executions::forward_if_moved(parent);
    let target: Option<i32> = CHILD_OF.value(&[parent.into(), child.into()], "looking up a child");
    let Some(target) = target else {
        if executions::state_of(parent).is_none() {
            unknown_execution(parent);
        }
        bad_argument(
            "child_id",
            format!("{child} is not a child of execution {parent}"),
        );
    };
    if target == shard::current() {
        return lifecycle::close(
            child,
            Close::Cancelled {
                reason: reason.map(str::to_owned),
            },
        );
    }
    let requested = REQUEST_CLOSE
        .value::<bool>(
            &[child.into(), CloseKind::Cancel.as_str().into(), reason.into()],
            "requesting a child's cancel",
        )
        .is_some();
    if requested {
        family::notify("due");
    }
    requested
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::{claim, complete, count, init, one, start, state, values};
    use pgrx::prelude::*;
    use serde_json::json;

    row! {
        #[derive(Debug, PartialEq)]
        struct Child {
            child_id: pgrx::Uuid,
            target_shard: i32,
            created: bool,
        }
    }

    fn start_child(parent: pgrx::Uuid, wf: &str, opts: serde_json::Value) -> Child {
        one(
            "SELECT child_id, target_shard, created FROM sheaf.start_child($1, 'child', $2, '{\"n\": 1}', $3)",
            &[parent.into(), wf.into(), pgrx::JsonB(opts).into()],
        )
    }

    fn events(id: pgrx::Uuid) -> Vec<String> {
        values(
            "SELECT event_type FROM sheaf.events WHERE execution_id = $1 ORDER BY seq",
            &[id.into()],
        )
    }

    #[pg_test]
    fn a_local_child_starts_once_and_reports_its_end_to_its_parent() {
        init();
        let parent = start("p", "p-1", json!({})).id;
        // The parent's workflow task runs, and ends its attempt.
        complete(&claim("default", 1)[0]);
        let first = start_child(parent, "c-1", json!({}));
        assert!(first.created && first.target_shard == 1);
        let child = first.child_id;
        assert_eq!(
            start_child(parent, "c-1", json!({})),
            Child {
                created: false,
                ..first
            },
            "a repeat is the same child"
        );
        assert_eq!(state(child), "RUNNING");
        Spi::run_with_args(
            "SELECT sheaf.complete_execution($1, '{\"ok\": 7}')",
            &[child.into()],
        )
        .unwrap();
        let evs = events(parent);
        assert_eq!(evs.iter().filter(|e| *e == "ChildStarted").count(), 1);
        assert_eq!(evs.last().map(String::as_str), Some("ChildCompleted"), "{evs:?}");
        let result = Spi::get_one_with_args::<i64>(
            "SELECT (payload -> 'result' ->> 'ok')::bigint FROM sheaf.events WHERE execution_id = $1 AND event_type = 'ChildCompleted'",
            &[parent.into()],
        )
        .unwrap();
        assert_eq!(result, Some(7));
        assert_eq!(
            count(
                "SELECT count(*) FROM sheaf.tasks WHERE kind = 'workflow' AND payload->>'workflow_name' = 'p'"
            ),
            1,
            "the parent, with no workflow task waiting, got one"
        );
    }

    #[pg_test]
    fn an_active_run_of_the_childs_key_is_not_adopted() {
        init();
        let parent = start("p", "p-1", json!({})).id;
        let other = start("child", "taken", json!({})).id;
        let child = start_child(parent, "taken", json!({}));
        assert!(child.created && child.child_id != other);
        let reason = Spi::get_one_with_args::<String>(
            "SELECT payload->>'error' FROM sheaf.events WHERE execution_id = $1 AND event_type = 'ChildFailed'",
            &[parent.into()],
        )
        .unwrap()
        .unwrap();
        assert!(reason.contains(&other.to_string()), "{reason}");
        assert_eq!(
            count("SELECT count(*) FROM sheaf.executions WHERE workflow_name = 'child'"),
            1
        );
    }

    #[pg_test]
    fn a_child_elsewhere_gets_a_lifecycle_row_the_relay_drives() {
        init();
        let parent = start("p", "p-1", json!({})).id;
        let started = start_child(parent, "c-1", json!({"target_shard": 2}));
        let child = started.child_id;
        assert_eq!(
            (started.target_shard, sheaf_core::id::shard_of(child.as_bytes())),
            (2, 2)
        );
        row! {
            struct Taken {
                lease_token: i64,
                state: String,
            }
        }
        let take = || -> Taken {
            one(
                "SELECT lease_token, state FROM sheaf.relay_take(10, '30 seconds')",
                &[],
            )
        };
        let taken = take();
        assert_eq!(taken.state, "STARTING");
        let token = taken.lease_token;
        let report = |t: i64, outcome: serde_json::Value| {
            Spi::get_one_with_args::<String>(
                "SELECT sheaf.relay_report($1, $2, $3)",
                &[child.into(), t.into(), pgrx::JsonB(outcome).into()],
            )
            .unwrap()
            .unwrap()
        };
        assert_eq!(report(token + 1, json!({"started": true})), "stale");
        assert_eq!(report(token, json!({"started": true})), "held");
        assert_eq!(report(token, json!({"pending": 0})), "released");
        let taken = take();
        assert_eq!(taken.state, "RUNNING");
        let ended = json!({"ended": {"state": "FAILED", "result": null, "error": "boom"}});
        assert_eq!(report(taken.lease_token, ended.clone()), "settled");
        assert_eq!(report(taken.lease_token, ended), "stale", "exactly once");
        let evs = events(parent);
        assert_eq!(evs.iter().filter(|e| *e == "ChildFailed").count(), 1, "{evs:?}");
        assert_eq!(count("SELECT count(*) FROM sheaf.cross_shard_children"), 0);
    }

    #[pg_test]
    fn a_parents_end_asks_the_relay_to_close_its_children() {
        init();
        let parent = start("p", "p-1", json!({})).id;
        let local = start_child(parent, "here", json!({})).child_id;
        start_child(
            parent,
            "gone",
            json!({"target_shard": 3, "parent_close": "abandon"}),
        );
        start_child(
            parent,
            "there",
            json!({"target_shard": 3, "parent_close": "request_cancel"}),
        );
        Spi::run_with_args("SELECT sheaf.complete_execution($1, NULL)", &[parent.into()]).unwrap();
        assert_eq!(state(local), "RUNNING", "the parent's end closes no child itself");
        assert_eq!(
            count("SELECT count(*) FROM sheaf.cross_shard_children WHERE parent_ended"),
            3
        );
        assert_eq!(
            count(
                "SELECT count(*) FROM sheaf.cross_shard_children WHERE close_requested = 'terminate' AND target_shard = 1"
            ),
            1
        );
        assert_eq!(
            count("SELECT count(*) FROM sheaf.cross_shard_children WHERE close_requested IS NULL"),
            1,
            "abandon asks for nothing"
        );
        // The relay's close of the local child settles its row.
        Spi::run_with_args(
            "SELECT sheaf.relay_close_child($1, $2, 'terminate')",
            &[local.into(), parent.into()],
        )
        .unwrap();
        assert_eq!(state(local), "TERMINATED");
        assert_eq!(
            count("SELECT count(*) FROM sheaf.cross_shard_children WHERE target_shard = 1"),
            0
        );
    }

    #[pg_test]
    fn a_shard_holding_only_its_parents_seal_lists_its_children() {
        init();
        let parent = start("p", "p-1", json!({})).id;
        complete(&claim("default", 1)[0]);
        let child = start_child(parent, "c-1", json!({})).child_id;
        // The parent moved away (its seal forwards to shard 2); the child
        // it started here stays here.
        Spi::run_with_args(
            "UPDATE sheaf.executions SET state = 'MIGRATED', migrated_to_shard = 2, closed_at = now() WHERE id = $1",
            &[parent.into()],
        )
        .unwrap();
        let listed = Spi::get_one_with_args::<pgrx::Uuid>(
            "SELECT execution_id FROM sheaf.list_children($1)",
            &[parent.into()],
        )
        .unwrap();
        assert_eq!(listed, Some(child));
    }
}
