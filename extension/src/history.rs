//! Execution history: append-only events, one sequence per execution.

use pgrx::prelude::*;

use crate::plans::{Stmt, run};

// Locking the execution row (by updating its byte count) serializes appends
// to one execution, so `seq` is gap-free and never reused.
const APPEND: Stmt = Stmt::write(
    "WITH e AS (UPDATE executions SET history_bytes = history_bytes + $4 WHERE id = $1 RETURNING id) \
     INSERT INTO events (execution_id, seq, event_type, payload, bytes) \
     SELECT e.id, coalesce((SELECT max(seq) FROM events WHERE execution_id = $1), 0) + 1, $2, $3, $4 \
     FROM e",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::INT4OID,
    ],
);

/// Appends an event to an execution's history. Does nothing if the execution
/// is not on this shard (a task may outlive it).
pub fn append(execution_id: pgrx::Uuid, event_type: &str, payload: serde_json::Value) {
    let bytes = payload.to_string().len() as i32;
    Spi::connect_mut(|client| {
        run(
            client,
            &APPEND,
            &[
                execution_id.into(),
                event_type.into(),
                pgrx::JsonB(payload).into(),
                bytes.into(),
            ],
        );
    })
}
