//! Signals and cancels addressed by business key, from inside a workflow:
//! `signal_external` and `cancel_external` write an outbox row in the
//! sender's transaction; the driver's relay resolves the key over every
//! shard and delivers it, and reports here (`take`, `report`). The edges
//! are in `sql/schema.sql`, at `outbox`. A key whose active run lives here
//! is delivered in the sender's transaction instead (`inline`).
//!
//! Lock order (`base::locks`): the sender's row before its outbox rows; an
//! inline signal locks the sender's and the target's rows in id order, so
//! two runs signalling each other do not deadlock. An inline cancel ends the
//! target (its tasks, then its row) while holding the sender's row, out of
//! the task-first order: a path holding a task of the target that waits for
//! the sender's row (the target is the sender's child and ends now) makes
//! a deadlock Postgres breaks (40P01), and the caller retries.

use pgrx::prelude::*;
use sheaf_core::external::{ExternalOptions, Kind, OutboxReport, Target};
use sheaf_core::state::ExecutionState;

use crate::base::errors::bad_argument;
use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::base::{ids, shard, topology};
use crate::workflow::executions::{self, Locked};
use crate::workflow::{history, signals, wake};

/// The relay's channel (`workflow::family`): `due` wakes it.
const NOTIFY: Stmt = Stmt::write("SELECT pg_notify('sheaf_relay', 'due')", &[]);

const SEEN: Stmt = Stmt::read(
    "SELECT outbox_id FROM outbox WHERE sender_id = $1 AND kind = $2 AND signal_id = $3",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
    ],
);
// A row delivered inline is written DONE (due never) or CONFIRMING (its
// run ended, due now for the confirming fan-out).
const INSERT: Stmt = Stmt::write(
    "INSERT INTO outbox (outbox_id, sender_id, kind, workflow_name, workflow_id, signal, payload, reason, signal_id, \
                         state, delivered_to, delivered_shard, due_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, CASE WHEN $10 = 'DONE' THEN NULL ELSE now() END)",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT4OID,
    ],
);
// The run of a key that holds it here (active or being moved), if any.
const LOCAL_RUN: Stmt = Stmt::write(
    "SELECT id FROM executions WHERE workflow_name = $1 AND workflow_id = $2 \
     AND state IN ('RUNNING', 'SUSPENDED', 'PAUSED', 'MIGRATING', 'MIGRATED')",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::TEXTOID],
);
// A taken row's lease is its due time, as for cross_shard_children.
const TAKE: Stmt = Stmt::write(
    "WITH picked AS (SELECT outbox_id FROM outbox WHERE due_at <= now() \
                     ORDER BY due_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
     UPDATE outbox o SET lease_token = nextval('fence_token'), \
            due_at = now() + make_interval(secs => $2), last_attempt_at = now() \
     FROM picked WHERE o.outbox_id = picked.outbox_id \
     RETURNING o.outbox_id, o.sender_id, o.kind, o.state, o.workflow_name, o.workflow_id, o.signal, \
               o.payload, o.reason, o.delivered_to, o.attempts, o.indeterminate, o.lease_token",
    &[PgBuiltInOids::INT8OID, PgBuiltInOids::FLOAT8OID],
);
const HOLDER: Stmt = Stmt::read(
    "SELECT sender_id FROM outbox WHERE outbox_id = $1 AND lease_token = $2 AND state <> 'DONE'",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::INT8OID],
);
const LOCK_ROW: Stmt = Stmt::write(
    "SELECT kind, state, workflow_name, workflow_id, delivered_to, delivered_shard FROM outbox \
     WHERE outbox_id = $1 AND lease_token = $2 AND state <> 'DONE' FOR UPDATE",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::INT8OID],
);
// Due again now: the confirming fan-out is the next sweep's.
const CONFIRMING: Stmt = Stmt::write(
    "UPDATE outbox SET state = 'CONFIRMING', delivered_to = $2, delivered_shard = $3, lease_token = NULL, \
            attempts = 0, indeterminate = 0, indeterminate_since = NULL, last_error = NULL, due_at = now() \
     WHERE outbox_id = $1",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT4OID,
    ],
);
// Indeterminate: retried, backing off as a failure does, min(n, 6) x 5 s.
const INDETERMINATE: Stmt = Stmt::write(
    "UPDATE outbox SET lease_token = NULL, indeterminate = indeterminate + 1, \
            indeterminate_since = coalesce(indeterminate_since, now()), last_error = $2, \
            due_at = now() + make_interval(secs => 5 * least(indeterminate + 1, 6)) \
     WHERE outbox_id = $1",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::TEXTOID],
);
const FAILED: Stmt = Stmt::write(
    "UPDATE outbox SET lease_token = NULL, attempts = attempts + 1, last_error = $2, \
            due_at = now() + make_interval(secs => 5 * least(attempts + 1, 6)) \
     WHERE outbox_id = $1",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::TEXTOID],
);
const DONE: Stmt = Stmt::write(
    "UPDATE outbox SET state = 'DONE', due_at = NULL, lease_token = NULL, payload = NULL, last_error = NULL \
     WHERE outbox_id = $1",
    &[PgBuiltInOids::UUIDOID],
);
const DELETE: Stmt = Stmt::write(
    "DELETE FROM outbox WHERE outbox_id = $1",
    &[PgBuiltInOids::UUIDOID],
);
// A sender's end: its delivered rows were kept only for opts.signal_id.
const SENDER_ENDED: Stmt = Stmt::write(
    "DELETE FROM outbox WHERE sender_id = $1 AND state = 'DONE'",
    &[PgBuiltInOids::UUIDOID],
);
// What is still to deliver, by kind and state.
const BACKLOG: Stmt = Stmt::read(
    "SELECT kind, state, count(*), count(*) FILTER (WHERE attempts > 0), count(*) FILTER (WHERE indeterminate > 0), \
            min(created_at), min(indeterminate_since), max(attempts), \
            (array_agg(last_error ORDER BY last_attempt_at DESC) FILTER (WHERE last_error IS NOT NULL))[1] \
     FROM outbox WHERE due_at IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2",
    &[],
);

/// What the sender asks for.
pub enum Request<'a> {
    Signal {
        signal: &'a str,
        payload: Jsonb,
    },
    Cancel {
        reason: Option<&'a str>,
        /// Cancels a run of this shard for an inline delivery (`lifecycle`,
        /// which ends a sender through this module, is the api layer's to
        /// call); whether it ended it.
        end: &'a dyn Fn(pgrx::Uuid) -> bool,
    },
}

/// Writes an outbox row for `sender` (active, on this shard) addressed to
/// (`name`, `workflow_id`), once per `opts.signal_id`; its id. Delivered
/// here and now when the key's active run lives on this shard (`inline`).
pub fn request(
    sender: pgrx::Uuid,
    name: &str,
    workflow_id: &str,
    what: Request<'_>,
    o: &ExternalOptions,
) -> pgrx::Uuid {
    let kind = match what {
        Request::Signal { .. } => Kind::Signal,
        Request::Cancel { .. } => Kind::Cancel,
    };
    let here: Option<pgrx::Uuid> = LOCAL_RUN
        .value::<pgrx::Uuid>(&[name.into(), workflow_id.into()], "looking up a run of a key")
        .filter(|t| *t != sender);
    // Two rows in id order (an inline signal): the target first if it sorts first.
    if kind == Kind::Signal
        && let Some(t) = here.filter(|t| t.as_bytes() < sender.as_bytes())
    {
        executions::try_lock(t);
    }
    executions::lock_active(sender, &format!("send an external {}", kind.as_str()));
    if let Some(signal_id) = &o.signal_id {
        let seen: Option<pgrx::Uuid> = SEEN.value(
            &[sender.into(), kind.as_str().into(), signal_id.as_str().into()],
            "looking up an outbox row",
        );
        if let Some(id) = seen {
            return id;
        }
    }
    let id = ids::mint_for(shard::current());
    let (signal, payload, reason, end) = match what {
        Request::Signal { signal, payload } => (Some(signal), Some(payload), None, None),
        Request::Cancel { reason, end } => (None, None, reason, Some(end)),
    };
    let mut event = serde_json::json!({"outbox_id": id.to_string(), "workflow_name": name,
                                       "workflow_id": workflow_id, "signal_id": o.signal_id});
    let event_type = match (signal, reason) {
        (Some(signal), _) => {
            event["signal"] = signal.into();
            "ExternalSignalRequested"
        }
        (None, reason) => {
            event["reason"] = reason.into();
            "ExternalCancelRequested"
        }
    };
    let insert = |payload: Option<Jsonb>, state: &str, to: Option<pgrx::Uuid>| {
        INSERT.exec(&[
            id.into(),
            sender.into(),
            kind.as_str().into(),
            name.into(),
            workflow_id.into(),
            signal.into(),
            payload.into(),
            reason.into(),
            o.signal_id.as_deref().into(),
            state.into(),
            to.into(),
            to.map(|_| shard::current()).into(),
        ]);
    };
    history::append(sender, event_type, event);
    let Some(outcome) = here.and_then(|t| inline(id, t, signal, payload.as_ref(), end)) else {
        insert(payload, "PENDING", None);
        NOTIFY.exec(&[]);
        return id;
    };
    match outcome {
        Inline::Settled(event_type, event) => {
            // A cancelled parent may have ended the sender with it: then,
            // as for a relayed result after its end, nothing is kept.
            if let Some(s) = executions::try_lock(sender).filter(|s| s.state.is_active()) {
                insert(None, "DONE", None);
                history::append(sender, event_type, event);
                wake::wake_for_event(&s);
            }
        }
        Inline::Confirming(ended) => {
            insert(None, "CONFIRMING", Some(ended));
            NOTIFY.exec(&[]);
        }
    }
    id
}

/// What an inline delivery did.
enum Inline {
    /// Its result, for the sender's history: the row is done.
    Settled(&'static str, serde_json::Value),
    /// A cancel ended this run, and another shard may hold a live run of
    /// the key: the relay's confirming fan-out reports it, as for a cancel
    /// it delivered.
    Confirming(pgrx::Uuid),
}

/// Delivers outbox row `id` to run `t` of this shard if it is active (not
/// ended, not being moved: those take the relay's way, which resolves the
/// key over every shard); `None` if it did not. A signal carries the row's
/// id as its signal id, as the relay's does. A cancel reports at once only
/// where the published topology lists this shard alone: no other shard can
/// hold a run of the key.
fn inline(
    id: pgrx::Uuid,
    t: pgrx::Uuid,
    signal: Option<&str>,
    payload: Option<&Jsonb>,
    end: Option<&dyn Fn(pgrx::Uuid) -> bool>,
) -> Option<Inline> {
    let here = u16::try_from(shard::current()).ok()?;
    let at = Target {
        execution_id: *t.as_bytes(),
        shard: here,
    };
    match (signal, payload) {
        (Some(signal), Some(payload)) => {
            if !executions::try_lock(t).is_some_and(|e| e.state.is_active()) {
                return None;
            }
            signals::signal(t, signal, payload.clone(), Some(&id.to_string()));
            Some(Inline::Settled("ExternalSignalDelivered", target(id, &at)))
        }
        _ => {
            let end = end?;
            if !executions::state_of(t).is_some_and(ExecutionState::is_active) || !end(t) {
                return None;
            }
            let alone = topology::fleet().is_some_and(|f| {
                f.current.shards().eq([here]) && f.previous.is_none_or(|p| p.shards().eq([here]))
            });
            Some(if alone {
                Inline::Settled(
                    "ExternalCancelDelivered",
                    confirmed(id, Some(t), Some(here.into())),
                )
            } else {
                Inline::Confirming(t)
            })
        }
    }
}

row! {
    /// An outbox row as `outbox_take` returns it.
    pub struct Taken {
        pub outbox_id: pgrx::Uuid,
        pub sender_id: pgrx::Uuid,
        pub kind: String,
        pub state: String,
        pub workflow_name: String,
        pub workflow_id: String,
        pub signal: Option<String>,
        pub payload: Option<pgrx::JsonB>,
        pub reason: Option<String>,
        pub delivered_to: Option<pgrx::Uuid>,
        pub attempts: i32,
        pub indeterminate: i32,
        pub lease_token: i64,
    }
}

/// Leases up to `max` due outbox rows for `lease_secs`.
pub fn take(max: i64, lease_secs: f64) -> Vec<Taken> {
    TAKE.all(&[max.into(), lease_secs.into()], "taking outbox rows")
}

row! {
    /// A group of outbox rows as `outbox_backlog` returns it.
    pub struct Backlog {
        pub kind: String,
        pub state: String,
        pub rows: i64,
        pub failing: i64,
        pub indeterminate: i64,
        pub oldest: pgrx::datum::TimestampWithTimeZone,
        pub indeterminate_since: Option<pgrx::datum::TimestampWithTimeZone>,
        pub max_attempts: i32,
        pub last_error: Option<String>,
    }
}

/// This shard's undelivered outbox rows, grouped.
pub fn backlog() -> Vec<Backlog> {
    BACKLOG.all(&[], "reading the outbox's backlog")
}

/// A sender's end (its row locked, in its terminal transaction): its
/// delivered rows go; those still to deliver stay, and are delivered.
pub fn sender_ended(sender: pgrx::Uuid) {
    SENDER_ENDED.exec(&[sender.into()]);
}

/// Records what the relay did for outbox row `id`, held under `token`:
/// `released` (it waits for its due time), `settled` (its result is in the
/// sender's history) or `stale` (the lease is not the caller's any more, or
/// the row is done; nothing changed).
pub fn report(id: pgrx::Uuid, token: i64, r: &OutboxReport) -> &'static str {
    let Some((sender, s, row)) = hold(id, token) else {
        return "stale";
    };
    let Held {
        kind,
        state,
        workflow_name: name,
        workflow_id,
        delivered_to,
        delivered_shard,
    } = row;
    let kind = Kind::parse(&kind).unwrap_or(Kind::Signal);
    let confirming = state == "CONFIRMING";
    let finish = |event_type: &str, event: serde_json::Value| {
        match s.as_ref().filter(|s| s.state.is_active()) {
            Some(s) => {
                history::append(sender, event_type, event);
                DONE.exec(&[id.into()]);
                wake::wake_for_event(s);
            }
            // Its end has passed: nothing keeps the row.
            None => DELETE.exec(&[id.into()]),
        }
        "settled"
    };
    match r {
        OutboxReport::Delivered(t) => {
            only(
                kind == Kind::Signal && !confirming,
                "delivered",
                "a pending signal",
            );
            finish("ExternalSignalDelivered", target(id, t))
        }
        OutboxReport::Cancelled(t) => {
            only(kind == Kind::Cancel, "cancelled", "a cancel");
            CONFIRMING.exec(&[
                id.into(),
                pgrx::Uuid::from_bytes(t.execution_id).into(),
                i32::from(t.shard).into(),
            ]);
            "released"
        }
        OutboxReport::Ended(t, ended) => {
            only(!confirming, "ended", "a pending row");
            let mut event = target(id, t);
            event["state"] = ended.as_str().into();
            if kind == Kind::Signal {
                event["error"] = format!("the run of {name:?} id {workflow_id:?} had ended ({ended})").into();
                finish("ExternalSignalFailed", event)
            } else {
                event["cancelled"] = false.into();
                finish("ExternalCancelDelivered", event)
            }
        }
        // A confirming cancel's run gone from its shard confirms it too.
        OutboxReport::Confirmed | OutboxReport::Unknown if confirming => finish(
            "ExternalCancelDelivered",
            confirmed(id, delivered_to, delivered_shard),
        ),
        OutboxReport::Confirmed => {
            bad_argument("outcome", "confirmed is an outcome only for a confirming cancel")
        }
        OutboxReport::Unknown => finish(
            "ExternalTargetUnknown",
            serde_json::json!({"outbox_id": id.to_string(), "kind": kind.as_str(),
                               "workflow_name": name, "workflow_id": workflow_id}),
        ),
        OutboxReport::Indeterminate(why) => {
            INDETERMINATE.exec(&[id.into(), why.as_str().into()]);
            "released"
        }
        OutboxReport::Failed(error) => {
            FAILED.exec(&[id.into(), error.as_str().into()]);
            "released"
        }
    }
}

row! {
    /// A row as `report` locks it.
    struct Held {
        kind: String,
        state: String,
        workflow_name: String,
        workflow_id: String,
        /// The run it was delivered to, and the shard it lived on.
        delivered_to: Option<pgrx::Uuid>,
        delivered_shard: Option<i32>,
    }
}

/// Locks outbox row `id` if `token` is its lease (its sender's row first):
/// the sender, its row if it still exists, and the outbox row.
fn hold(id: pgrx::Uuid, token: i64) -> Option<(pgrx::Uuid, Option<Locked>, Held)> {
    let sender: pgrx::Uuid = HOLDER.value(&[id.into(), token.into()], "reading an outbox row")?;
    let s = executions::try_lock(sender);
    let row: Held = LOCK_ROW.first(&[id.into(), token.into()], "locking an outbox row")?;
    Some((sender, s, row))
}

/// The event payload naming where a row was delivered.
fn target(id: pgrx::Uuid, t: &Target) -> serde_json::Value {
    serde_json::json!({"outbox_id": id.to_string(),
                       "execution_id": pgrx::Uuid::from_bytes(t.execution_id).to_string(),
                       "shard": t.shard})
}

/// A confirmed cancel's `ExternalCancelDelivered`: the run it ended, on
/// the shard the relay's `cancelled` report named (where it lived; its
/// id's shard only where it was born, the fallback for a row without one).
fn confirmed(id: pgrx::Uuid, ended: Option<pgrx::Uuid>, shard: Option<i32>) -> serde_json::Value {
    let ended = ended.unwrap_or(pgrx::Uuid::from_bytes([0; 16]));
    let shard = shard
        .and_then(|s| u16::try_from(s).ok())
        .unwrap_or_else(|| sheaf_core::id::shard_of(ended.as_bytes()));
    let mut event = target(
        id,
        &Target {
            execution_id: *ended.as_bytes(),
            shard,
        },
    );
    event["state"] = ExecutionState::Cancelled.as_str().into();
    event["cancelled"] = true.into();
    event
}

/// Refuses (22023) an outcome that does not fit the row.
fn only(fits: bool, outcome: &str, what: &str) {
    if !fits {
        bad_argument("outcome", format!("{outcome} is an outcome only for {what}"));
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::{count, init, one, rows, start};
    use pgrx::prelude::*;
    use serde_json::json;

    row! {
        /// A row `outbox_take` leased.
        struct Taken {
            outbox_id: pgrx::Uuid,
            state: String,
            lease_token: i64,
        }
    }

    fn signal(sender: pgrx::Uuid, opts: serde_json::Value) -> pgrx::Uuid {
        Spi::get_one_with_args::<pgrx::Uuid>(
            "SELECT sheaf.signal_external($1, 'target', 't-1', 'go', '{\"n\": 1}', $2)",
            &[sender.into(), pgrx::JsonB(opts).into()],
        )
        .unwrap()
        .unwrap()
    }

    fn take() -> Vec<Taken> {
        rows(
            "SELECT outbox_id, state, lease_token FROM sheaf.outbox_take(10, '30 seconds')",
            &[],
        )
    }

    fn report(id: pgrx::Uuid, token: i64, outcome: serde_json::Value) -> String {
        Spi::get_one_with_args::<String>(
            "SELECT sheaf.outbox_report($1, $2, $3)",
            &[id.into(), token.into(), pgrx::JsonB(outcome).into()],
        )
        .unwrap()
        .unwrap()
    }

    fn events(id: pgrx::Uuid, kind: &str) -> i64 {
        Spi::get_one_with_args::<i64>(
            "SELECT count(*) FROM sheaf.events WHERE execution_id = $1 AND event_type = $2",
            &[id.into(), kind.into()],
        )
        .unwrap()
        .unwrap_or(0)
    }

    fn make_due() {
        Spi::run("UPDATE sheaf.outbox SET due_at = now() WHERE due_at IS NOT NULL").unwrap();
    }

    #[pg_test]
    fn a_signal_is_requested_once_per_signal_id_and_delivered_once() {
        init();
        let sender = start("s", "s-1", json!({})).id;
        // The key's run lives elsewhere: the relay's way.
        let target = pgrx::Uuid::from_bytes([7; 16]);
        let id = signal(sender, json!({"signal_id": "a"}));
        assert_eq!(
            signal(sender, json!({"signal_id": "a"})),
            id,
            "a retry is the same row"
        );
        assert_ne!(signal(sender, json!({})), id);
        assert_eq!(events(sender, "ExternalSignalRequested"), 2);
        let taken = take();
        assert_eq!(taken.len(), 2);
        assert!(take().is_empty(), "leased rows are not taken again");
        let row = taken.into_iter().find(|t| t.outbox_id == id).unwrap();
        let token = row.lease_token;
        assert_eq!(row.state, "PENDING");
        let at = json!({"execution_id": target.to_string(), "shard": 1});
        assert_eq!(report(id, token + 1, json!({"delivered": at})), "stale");
        assert_eq!(report(id, token, json!({"delivered": at})), "settled");
        assert_eq!(
            report(id, token, json!({"delivered": at})),
            "stale",
            "done: a repeat changes nothing"
        );
        assert_eq!(events(sender, "ExternalSignalDelivered"), 1);
        assert_eq!(
            signal(sender, json!({"signal_id": "a"})),
            id,
            "a delivered row still deduplicates"
        );
        // The sender's end drops what was delivered, keeps what was not.
        Spi::run_with_args("SELECT sheaf.cancel_execution($1, 'x')", &[sender.into()]).unwrap();
        assert_eq!(count("SELECT count(*) FROM sheaf.outbox"), 1);
    }

    #[pg_test]
    fn indeterminate_and_failed_back_off_and_unknown_is_final() {
        init();
        let sender = start("s", "s-1", json!({})).id;
        let id = signal(sender, json!({}));
        let token = take()[0].lease_token;
        assert_eq!(
            report(id, token, json!({"indeterminate": "shard 2: down"})),
            "released"
        );
        assert!(take().is_empty(), "it backs off");
        assert_eq!(
            count(
                "SELECT count(*) FROM sheaf.outbox_backlog() WHERE indeterminate = 1 AND indeterminate_since IS NOT NULL"
            ),
            1
        );
        make_due();
        let token = take()[0].lease_token;
        assert_eq!(report(id, token, json!({"failed": "boom"})), "released");
        assert_eq!(count("SELECT attempts::bigint FROM sheaf.outbox"), 1);
        make_due();
        let token = take()[0].lease_token;
        assert_eq!(report(id, token, json!({"unknown": true})), "settled");
        assert_eq!(events(sender, "ExternalTargetUnknown"), 1);
        assert_eq!(count("SELECT count(*) FROM sheaf.outbox_backlog()"), 0);
    }

    #[pg_test]
    fn a_cancel_that_ends_a_run_is_confirmed_by_a_later_sweep() {
        init();
        let sender = start("s", "s-1", json!({})).id;
        let target = pgrx::Uuid::from_bytes([7; 16]);
        let id = Spi::get_one_with_args::<pgrx::Uuid>(
            "SELECT sheaf.cancel_external($1, 'target', 't-1', 'enough')",
            &[sender.into()],
        )
        .unwrap()
        .unwrap();
        assert_eq!(events(sender, "ExternalCancelRequested"), 1);
        let token = take()[0].lease_token;
        // The relay names where the run lives (here: as if it had moved to
        // shard 7), which its id does not say.
        let at = json!({"execution_id": target.to_string(), "shard": 7});
        assert_eq!(report(id, token, json!({"cancelled": at})), "released");
        assert_eq!(events(sender, "ExternalCancelDelivered"), 0, "withheld");
        let row = take().remove(0);
        let token = row.lease_token;
        assert_eq!(row.state, "CONFIRMING");
        assert_eq!(report(id, token, json!({"confirmed": true})), "settled");
        row! {
            struct Delivered {
                cancelled: Option<bool>,
                shard: Option<i32>,
            }
        }
        let delivered: Delivered = one(
            "SELECT (payload->>'cancelled')::boolean, (payload->>'shard')::int FROM sheaf.events \
             WHERE execution_id = $1 AND event_type = 'ExternalCancelDelivered'",
            &[sender.into()],
        );
        assert_eq!(delivered.cancelled, Some(true));
        assert_eq!(
            delivered.shard,
            Some(7),
            "the shard the run lived on, not its id's"
        );
    }

    fn json_of(sql: &str, id: pgrx::Uuid) -> pgrx::JsonB {
        Spi::get_one_with_args::<pgrx::JsonB>(sql, &[id.into()])
            .unwrap()
            .unwrap()
    }

    fn outbox_state(id: pgrx::Uuid) -> String {
        Spi::get_one_with_args::<String>(
            "SELECT state || CASE WHEN due_at IS NULL THEN '' ELSE ' due' END FROM sheaf.outbox WHERE outbox_id = $1",
            &[id.into()],
        )
        .unwrap()
        .unwrap()
    }

    #[pg_test]
    fn a_signal_to_a_run_here_is_delivered_in_the_senders_transaction() {
        init();
        let sender = start("s", "s-1", json!({})).id;
        let target = start("target", "t-1", json!({})).id;
        let id = signal(sender, json!({"signal_id": "a"}));
        assert_eq!(outbox_state(id), "DONE", "nothing for the relay");
        assert!(take().is_empty());
        let kinds = crate::testing::values::<String>(
            "SELECT event_type FROM sheaf.events WHERE execution_id = $1 AND event_type LIKE 'External%' ORDER BY seq",
            &[sender.into()],
        );
        assert_eq!(kinds, ["ExternalSignalRequested", "ExternalSignalDelivered"]);
        let got = json_of(
            "SELECT payload FROM sheaf.events WHERE execution_id = $1 AND event_type = 'SignalReceived'",
            target,
        );
        assert_eq!(
            got.0["signal_id"],
            json!(id.to_string()),
            "the row's id, as the relay sends"
        );
        // A retried handler: the same row, nothing delivered again.
        assert_eq!(signal(sender, json!({"signal_id": "a"})), id);
        assert_eq!(events(target, "SignalReceived"), 1);
        assert_eq!(events(sender, "ExternalSignalDelivered"), 1);
        // Its first workflow task still waits and will read the delivery:
        // the wake adds no second.
        assert_eq!(
            count(&format!(
                "SELECT count(*) FROM sheaf.tasks WHERE execution_id = '{sender}' AND kind = 'workflow'"
            )),
            1
        );
    }

    #[pg_test]
    fn an_ended_or_moving_run_here_takes_the_relays_way() {
        init();
        let sender = start("s", "s-1", json!({})).id;
        let target = start("target", "t-1", json!({})).id;
        Spi::run_with_args("SELECT sheaf.complete_execution($1, '{}')", &[target.into()]).unwrap();
        let ended = signal(sender, json!({}));
        assert_eq!(outbox_state(ended), "PENDING due");
        assert_eq!(events(target, "SignalReceived"), 0);
        let moving = start("target", "t-1", json!({})).id;
        Spi::run_with_args(
            "UPDATE sheaf.executions SET state = 'MIGRATING' WHERE id = $1",
            &[moving.into()],
        )
        .unwrap();
        let sealed = signal(sender, json!({}));
        assert_eq!(outbox_state(sealed), "PENDING due");
        assert_eq!(events(moving, "SignalReceived"), 0);
        let cancel = Spi::get_one_with_args::<pgrx::Uuid>(
            "SELECT sheaf.cancel_external($1, 'target', 't-1')",
            &[sender.into()],
        )
        .unwrap()
        .unwrap();
        assert_eq!(outbox_state(cancel), "PENDING due");
        assert_eq!(events(sender, "ExternalSignalDelivered"), 0);
    }

    #[pg_test]
    fn a_cancel_here_reports_at_once_only_on_a_one_shard_topology() {
        init();
        let sender = start("s", "s-1", json!({})).id;
        let cancel = |wid: &str| {
            Spi::get_one_with_args::<pgrx::Uuid>(
                "SELECT sheaf.cancel_external($1, 'target', $2, 'enough')",
                &[sender.into(), wid.into()],
            )
            .unwrap()
            .unwrap()
        };
        // No topology published: another shard may hold a run of the key.
        let first = start("target", "t-1", json!({})).id;
        let id = cancel("t-1");
        assert_eq!(
            crate::testing::state(first),
            "CANCELLED",
            "ended in this transaction"
        );
        assert_eq!(outbox_state(id), "CONFIRMING due");
        assert_eq!(events(sender, "ExternalCancelDelivered"), 0, "withheld");
        let row = take().remove(0);
        assert_eq!(report(id, row.lease_token, json!({"confirmed": true})), "settled");
        assert_eq!(events(sender, "ExternalCancelDelivered"), 1);
        // This shard alone in the published topology: no one else can hold one.
        Spi::run("SELECT sheaf.publish_topology('{\"shards\": [1]}', false)").unwrap();
        let second = start("target", "t-2", json!({})).id;
        let id = cancel("t-2");
        assert_eq!(crate::testing::state(second), "CANCELLED");
        assert_eq!(outbox_state(id), "DONE");
        let delivered = json_of(
            "SELECT payload FROM sheaf.events WHERE execution_id = $1 AND event_type = 'ExternalCancelDelivered' \
             ORDER BY seq DESC LIMIT 1",
            sender,
        );
        assert_eq!(
            delivered.0,
            json!({"outbox_id": id.to_string(), "execution_id": second.to_string(), "shard": 1,
                   "state": "CANCELLED", "cancelled": true})
        );
    }

    #[pg_test]
    #[should_panic(expected = "only for a confirming cancel")]
    fn an_outcome_that_does_not_fit_is_refused() {
        init();
        let sender = start("s", "s-1", json!({})).id;
        let id = signal(sender, json!({}));
        let token = take()[0].lease_token;
        report(id, token, json!({"confirmed": true}));
    }

    #[pg_test]
    #[should_panic(expected = "cannot send an external signal")]
    fn an_ended_sender_sends_nothing() {
        init();
        let sender = start("s", "s-1", json!({})).id;
        Spi::run_with_args("SELECT sheaf.cancel_execution($1, 'x')", &[sender.into()]).unwrap();
        signal(sender, json!({}));
    }
}
