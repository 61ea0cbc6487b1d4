//! Execution history: appending an event, reading a page.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

use crate::base::args::required;
use crate::base::errors::bad_argument;
use crate::base::jsonb::Jsonb;
use crate::workflow::history::{self, MAX_PAGE, is_own_event_type};

/// Appends an event to an active execution's history; returns its seq.
/// A closed history (terminal execution) refuses with 55000.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn append_event(execution_id: Option<pgrx::Uuid>, event_type: Option<&str>, payload: Option<Jsonb>) -> i64 {
    let id = required(execution_id, "execution_id");
    let event_type = required(event_type, "event_type");
    let payload = required(payload, "payload").sized("payload");
    if event_type.is_empty() || event_type.len() > 128 {
        bad_argument(
            "event_type",
            format!("must be 1 to 128 bytes, got {}", event_type.len()),
        );
    }
    if is_own_event_type(event_type) {
        bad_argument(
            "event_type",
            format!("{event_type} is one of sheaf's own event types; name yours otherwise"),
        );
    }
    history::append_to_active(id, event_type, payload)
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
    TableIterator::new(
        history::page(id, after, max_rows)
            .into_iter()
            .map(|e| (e.seq, e.event_type, e.payload, e.created_at)),
    )
}
