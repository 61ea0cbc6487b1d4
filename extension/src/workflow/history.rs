//! Execution history: append-only events, one gap-free sequence per execution.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

use sheaf_core::state::ExecutionState;

use crate::base::errors::unknown_execution;
use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::workflow::{executions, quota};

/// The most events one page of history holds.
pub const MAX_PAGE: i32 = 10_000;
/// The event types sheaf itself appends: a caller's `append_event` may not
/// use them, so what the usage report counts (`workflow::usage`) and what
/// a history says happened are sheaf's own record.
pub const OWN_EVENT_TYPES: &[&str] = &[
    "WorkflowStarted",
    "WorkflowCompleted",
    "WorkflowFailed",
    "WorkflowCancelled",
    "WorkflowTerminated",
    "WorkflowTimedOut",
    "WorkflowContinuedAsNew",
    "StartDebounced",
    "WorkflowPaused",
    "WorkflowResumed",
    "WorkflowSuspended",
    "WorkflowWoken",
    "TaskCompleted",
    "TaskFailed",
    "TaskDeadLettered",
    "TaskReaped",
    "SearchAttrsUpserted",
    "SignalReceived",
];

/// Whether sheaf itself appends events of this type (`OWN_EVENT_TYPES`, its
/// children's, `sheaf_core::children::EVENT_TYPES`, and its external
/// signals' and cancels', `sheaf_core::external::EVENT_TYPES`).
pub fn is_own_event_type(event_type: &str) -> bool {
    OWN_EVENT_TYPES.contains(&event_type)
        || sheaf_core::children::EVENT_TYPES.contains(&event_type)
        || sheaf_core::external::EVENT_TYPES.contains(&event_type)
}

// Updating the execution row serializes appends to one execution, and the
// update reads the row's latest version after any wait: `seq` is gap-free
// and never reused.
const APPEND: Stmt = Stmt::write(
    "WITH e AS (UPDATE executions SET history_bytes = history_bytes + $4, last_event_seq = last_event_seq + 1 \
                WHERE id = $1 RETURNING id, last_event_seq, quota_key, state), \
          i AS (INSERT INTO events (execution_id, seq, event_type, payload, bytes) \
                SELECT e.id, e.last_event_seq, $2, $3, $4 FROM e RETURNING seq) \
     SELECT i.seq, e.quota_key, e.state FROM i, e",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::INT4OID,
    ],
);
const PAGE: Stmt = Stmt::read(
    "SELECT seq, event_type, payload, created_at FROM events \
     WHERE execution_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::INT8OID,
    ],
);

/// Appends an event to an execution's history and returns its seq; `None`
/// if the execution is not on this shard. The bytes (of its JSON text
/// without whitespace) count toward the execution's quota key while it is
/// active.
pub fn append(execution_id: pgrx::Uuid, event_type: &str, payload: serde_json::Value) -> Option<i64> {
    let bytes = payload.to_string().len();
    write(execution_id, event_type, pgrx::JsonB(payload).into(), bytes)
}

/// `append` for a payload held as Postgres stored it (a caller's data, maybe
/// large): it goes into the history as it is, and its bytes are counted
/// without a serde pass (`Jsonb::compact_len`).
pub fn append_jsonb(execution_id: pgrx::Uuid, event_type: &str, payload: Jsonb) -> Option<i64> {
    let bytes = payload.compact_len();
    write(execution_id, event_type, payload.into(), bytes)
}

fn write(
    execution_id: pgrx::Uuid,
    event_type: &str,
    payload: pgrx::datum::DatumWithOid<'_>,
    bytes: usize,
) -> Option<i64> {
    let bytes = i32::try_from(bytes).unwrap_or(i32::MAX);
    row! {
        /// The appended event's seq, and its execution's quota key and state.
        struct Appended {
            seq: i64,
            quota_key: Option<String>,
            state: ExecutionState,
        }
    }
    let Appended {
        seq,
        quota_key,
        state,
    } = APPEND.first(
        &[execution_id.into(), event_type.into(), payload, bytes.into()],
        "appending an event",
    )?;
    if let Some(key) = quota_key
        && state.is_active()
    {
        quota::add(&key, 0, bytes as i64, 0);
    }
    Some(seq)
}

/// Appends a caller's event to an active execution's history; returns its
/// seq. A closed history (terminal execution) refuses with 55000.
pub fn append_to_active(id: pgrx::Uuid, event_type: &str, payload: Jsonb) -> i64 {
    // Locked, so no terminal transition slips in between the check and the append.
    executions::lock_active(id, "append to its history");
    match append_jsonb(id, event_type, payload) {
        Some(seq) => seq,
        None => unknown_execution(id),
    }
}

row! {
    /// An event as `history` returns it.
    pub struct Event {
        pub seq: i64,
        pub event_type: String,
        pub payload: pgrx::JsonB,
        pub created_at: TimestampWithTimeZone,
    }
}

/// Events of execution `id` after `after`, in order, at most `max_rows`;
/// P0002 if the execution is not on this shard.
pub fn page(id: pgrx::Uuid, after: i64, max_rows: i32) -> Vec<Event> {
    match executions::state_of(id) {
        None => unknown_execution(id),
        // A seal's history is frozen at its move: read the live copy's.
        Some(state) => executions::forward(id, state),
    }
    PAGE.all(
        &[id.into(), after.into(), (max_rows as i64).into()],
        "reading history",
    )
}
