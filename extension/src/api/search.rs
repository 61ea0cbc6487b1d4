//! Search attributes and listing executions.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use serde_json::Value;

use sheaf_core::excerpt::excerpt;
use sheaf_core::page::SortOrder;
use sheaf_core::search::Filter;

use crate::base::args::required;
use crate::base::errors::bad_argument;
use crate::base::jsonb::Jsonb;
use crate::workflow::search::{self, Anchor, MAX_COUNT_CAP, MAX_PAGE};

/// Merges `attrs` into an active execution's search attributes (a null
/// value removes its key); the merged attributes. An ended execution
/// refuses with 55000.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn upsert_search_attrs(execution_id: Option<pgrx::Uuid>, attrs: Option<Jsonb>) -> pgrx::JsonB {
    let id = required(execution_id, "execution_id");
    let attrs = required(attrs, "attrs").parse("attrs");
    pgrx::JsonB(search::upsert(id, attrs))
}

/// A page of this shard's executions in `(created_at, execution_id)` order
/// (`sort_order` `desc` or `asc`), matching `filter`, after the exclusive
/// anchor `after` (`{"created_at": ..., "execution_id": ...}`), at most
/// `max_rows` (1..1000).
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn list_executions(
    filter: default!(Option<Jsonb>, "'{}'"),
    after: default!(Option<Jsonb>, "NULL"),
    max_rows: default!(Option<i32>, 50),
    sort_order: default!(Option<&str>, "'desc'"),
) -> TableIterator<
    'static,
    (
        name!(execution_id, pgrx::Uuid),
        name!(workflow_name, String),
        name!(workflow_id, String),
        name!(state, String),
        name!(created_at, TimestampWithTimeZone),
        name!(closed_at, Option<TimestampWithTimeZone>),
        name!(parent_id, Option<pgrx::Uuid>),
        name!(search_attrs, pgrx::JsonB),
    ),
> {
    let filter = required(filter, "filter").parse("filter");
    let max_rows = required(max_rows, "max_rows");
    let sort_order = required(sort_order, "sort_order");
    if !(1..=MAX_PAGE).contains(&max_rows) {
        bad_argument(
            "max_rows",
            format!("must be from 1 to {MAX_PAGE}, got {max_rows}"),
        );
    }
    let Some(order) = SortOrder::parse(sort_order) else {
        bad_argument(
            "sort_order",
            format!(
                "must be desc or asc, got {}",
                excerpt(format_args!("{sort_order:?}"))
            ),
        );
    };
    let filter = Filter::parse(&filter).unwrap_or_else(|e| bad_argument(&e.option, e.why));
    let after = after.map(|a| anchor(&a.parse("after")));
    TableIterator::new(
        search::list(&filter, after, max_rows, order)
            .into_iter()
            .map(|e| {
                (
                    e.execution_id,
                    e.workflow_name,
                    e.workflow_id,
                    e.state,
                    e.created_at,
                    e.closed_at,
                    e.parent_id,
                    e.search_attrs,
                )
            }),
    )
}

/// This shard's executions matching `filter` (as `list_executions` takes
/// it), counted by state: one row per state `list_executions` lists, in
/// its order, each `count` at most `cap` (1..1000000), `capped` when more
/// matched. A state's count reads at most `cap + 1` entries of the state
/// index when `filter` is empty (a filter is checked on the entries read).
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn count_executions(
    filter: default!(Option<Jsonb>, "'{}'"),
    cap: default!(Option<i32>, 10000),
) -> TableIterator<'static, (name!(state, String), name!(count, i64), name!(capped, bool))> {
    let filter = required(filter, "filter").parse("filter");
    let cap = required(cap, "cap");
    if !(1..=MAX_COUNT_CAP).contains(&cap) {
        bad_argument("cap", format!("must be from 1 to {MAX_COUNT_CAP}, got {cap}"));
    }
    let filter = Filter::parse(&filter).unwrap_or_else(|e| bad_argument(&e.option, e.why));
    let counted = search::count(&filter, cap);
    let cap = i64::from(cap);
    TableIterator::new(
        counted
            .into_iter()
            .map(move |c| (c.state, c.seen.min(cap), c.seen > cap)),
    )
}

/// The keyset anchor: exactly `created_at` (a timestamp) and
/// `execution_id` (a UUID).
fn anchor(value: &Value) -> Anchor {
    let shape = || -> ! {
        bad_argument(
            "after",
            format!(
                "must be {{\"created_at\": <timestamp>, \"execution_id\": <uuid>}}, got {}",
                excerpt(value)
            ),
        )
    };
    let Some(map) = value.as_object() else { shape() };
    if map.len() != 2 {
        shape();
    }
    let (Some(Value::String(at)), Some(Value::String(id))) = (map.get("created_at"), map.get("execution_id"))
    else {
        shape()
    };
    let id = uuid::Uuid::parse_str(id).unwrap_or_else(|_| shape());
    Anchor {
        created_at: search::timestamp("after.created_at", at),
        id: pgrx::Uuid::from_bytes(*id.as_bytes()),
    }
}
