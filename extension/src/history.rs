//! Execution history: append-only events, one gap-free sequence per execution.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

use crate::errors::{SpiResultExt, bad_argument, required, unknown_execution};
use crate::plans::{Stmt, run};
use crate::{executions, quota};

/// The largest event payload, in bytes of its JSON text.
const MAX_EVENT_BYTES: usize = 1 << 20;
const MAX_PAGE: i32 = 10_000;

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
/// if the execution is not on this shard. The bytes count toward the
/// execution's quota key while it is active.
pub fn append(execution_id: pgrx::Uuid, event_type: &str, payload: serde_json::Value) -> Option<i64> {
    let bytes = payload.to_string().len();
    let bytes = i32::try_from(bytes).unwrap_or(i32::MAX);
    let (seq, quota_key, state) = Spi::connect_mut(|client| {
        let row = run(
            client,
            &APPEND,
            &[
                execution_id.into(),
                event_type.into(),
                pgrx::JsonB(payload).into(),
                bytes.into(),
            ],
        )
        .next()?;
        Some((
            row.get::<i64>(1).or_internal("appending an event")?,
            row.get::<String>(2).or_internal("appending an event"),
            row.get::<String>(3).or_internal("appending an event")?,
        ))
    })?;
    if let Some(key) = quota_key
        && executions::is_active(&state)
    {
        quota::add(&key, 0, bytes as i64, 0);
    }
    Some(seq)
}

/// Appends an event to an active execution's history; returns its seq.
/// A closed history (terminal execution) refuses with 55000.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn append_event(
    execution_id: Option<pgrx::Uuid>,
    event_type: Option<&str>,
    payload: Option<pgrx::JsonB>,
) -> i64 {
    let id = required(execution_id, "execution_id");
    let event_type = required(event_type, "event_type");
    let payload = required(payload, "payload").0;
    if event_type.is_empty() || event_type.len() > 128 {
        bad_argument(
            "event_type",
            format!("must be 1 to 128 bytes, got {}", event_type.len()),
        );
    }
    let size = payload.to_string().len();
    if size > MAX_EVENT_BYTES {
        bad_argument(
            "payload",
            format!("must be at most {MAX_EVENT_BYTES} bytes of JSON, got {size}"),
        );
    }
    // Locked, so no terminal transition slips in between the check and the append.
    executions::lock_active(id, "append to its history");
    match append(id, event_type, payload) {
        Some(seq) => seq,
        None => unknown_execution(id),
    }
}

/// A page of an execution's history: events after `after_seq`, in order, at
/// most `max_rows` (1..10000).
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn history(
    execution_id: Option<pgrx::Uuid>,
    after_seq: default!(Option<i64>, 0),
    max_rows: default!(Option<i32>, 1000),
) -> TableIterator<
    'static,
    (
        name!(seq, i64),
        name!(event_type, String),
        name!(payload, pgrx::JsonB),
        name!(created_at, TimestampWithTimeZone),
    ),
> {
    let id = required(execution_id, "execution_id");
    let after = required(after_seq, "after_seq");
    let max_rows = required(max_rows, "max_rows");
    if after < 0 {
        bad_argument("after_seq", format!("must be >= 0, got {after}"));
    }
    if !(1..=MAX_PAGE).contains(&max_rows) {
        bad_argument(
            "max_rows",
            format!("must be from 1 to {MAX_PAGE}, got {max_rows}"),
        );
    }
    if executions::state_of(id).is_none() {
        unknown_execution(id);
    }
    let rows = Spi::connect_mut(|client| {
        run(
            client,
            &PAGE,
            &[id.into(), after.into(), (max_rows as i64).into()],
        )
        .filter_map(|row| {
            Some((
                row.get::<i64>(1).or_internal("reading history")?,
                row.get::<String>(2).or_internal("reading history")?,
                row.get::<pgrx::JsonB>(3).or_internal("reading history")?,
                row.get::<TimestampWithTimeZone>(4)
                    .or_internal("reading history")?,
            ))
        })
        .collect::<Vec<_>>()
    });
    TableIterator::new(rows)
}
