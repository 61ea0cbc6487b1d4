//! Search attributes and listing executions: one page of a shard's
//! executions in `(created_at, id)` order, under a filter
//! (`sheaf_core::search::Filter`), after a keyset anchor.

use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::prelude::*;
use serde_json::{Value, json};

use sheaf_core::excerpt::quoted;
use sheaf_core::page::SortOrder;
use sheaf_core::search::{Filter, MAX_ATTR_KEY_BYTES, Param, merge_attrs};

use crate::base::args;
use crate::base::errors::bad_argument;
use crate::base::jsonb::Jsonb;
use crate::base::plans::{Stmt, select_once};
use crate::base::rows;
use crate::base::rows::row;
use crate::workflow::{executions, history};

/// The most rows one page of `list_executions` holds.
pub const MAX_PAGE: i32 = 1000;

const ATTRS: Stmt = Stmt::read(
    "SELECT search_attrs FROM executions WHERE id = $1",
    &[PgBuiltInOids::UUIDOID],
);
const SET_ATTRS: Stmt = Stmt::write(
    "UPDATE executions SET search_attrs = $2 WHERE id = $1",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::JSONBOID],
);

/// Merges `update` into an active execution's attributes (a null removes a
/// key) and records the change in its history; the merged attributes.
pub fn upsert(id: pgrx::Uuid, update: Value) -> Value {
    executions::lock_active(id, "change its search attributes");
    let current: Jsonb = ATTRS.one_value(&[id.into()], "reading search attributes");
    let current = current.parse("search_attrs");
    // The name rule (`args::new_name`) on a key this adds; one the execution
    // has keeps working.
    if let Some(keys) = update.as_object() {
        for (key, value) in keys {
            if !value.is_null() {
                args::new_name(key, "attrs", MAX_ATTR_KEY_BYTES, || current.get(key).is_some());
            }
        }
    }
    let merged = match merge_attrs("attrs", &current, &update) {
        Ok(merged) => merged,
        Err(e) => bad_argument(&e.option, e.why),
    };
    SET_ATTRS.exec(&[id.into(), Jsonb::from_value(merged.clone()).into()]);
    history::append(id, "SearchAttrsUpserted", json!({ "attrs": update }));
    merged
}

row! {
    /// One listed execution, in `list_executions`' column order.
    pub struct Listed {
        pub execution_id: pgrx::Uuid,
        pub workflow_name: String,
        pub workflow_id: String,
        pub state: String,
        pub created_at: TimestampWithTimeZone,
        pub closed_at: Option<TimestampWithTimeZone>,
        pub parent_id: Option<pgrx::Uuid>,
        pub search_attrs: pgrx::JsonB,
    }
}

/// A keyset anchor: the page starts after this `(created_at, id)`.
pub struct Anchor {
    pub created_at: TimestampWithTimeZone,
    pub id: pgrx::Uuid,
}

/// Up to `max_rows` executions matching `filter`, after `after` in `order`.
/// The statement is built for this call (its shape follows the filter) with
/// every key and value bound, and seeks `executions_created` (or the index
/// its filter names) from the anchor: a deep page costs what the first does.
pub fn list(filter: &Filter, after: Option<Anchor>, max_rows: i32, order: SortOrder) -> Vec<Listed> {
    let (condition, params) = filter.compile(1);
    let mut args: Vec<DatumWithOid<'static>> = params.into_iter().map(datum).collect();
    let (cmp, dir) = match order {
        SortOrder::Desc => ("<", "DESC"),
        SortOrder::Asc => (">", "ASC"),
    };
    // A moved run is listed once, where it lives: never its seal or its
    // staged copy (`workflow::migration`).
    let mut sql = format!(
        "SELECT id, workflow_name, workflow_id, state, created_at, closed_at, parent_id, search_attrs \
         FROM executions WHERE ({condition}) AND state NOT IN ('MIGRATING', 'MIGRATED')"
    );
    if let Some(anchor) = after {
        let n = args.len();
        sql.push_str(&format!(
            " AND (created_at, id) {cmp} (${}::timestamptz, ${}::uuid)",
            n + 1,
            n + 2
        ));
        args.push(anchor.created_at.into());
        args.push(anchor.id.into());
    }
    sql.push_str(&format!(
        " ORDER BY created_at {dir}, id {dir} LIMIT ${}::int8",
        args.len() + 1
    ));
    args.push(i64::from(max_rows).into());
    Spi::connect(|client| rows::all(select_once(client, &sql, &args), "listing executions"))
}

/// The most a state's count of `count_executions` may be bounded to.
pub const MAX_COUNT_CAP: i32 = 1_000_000;

row! {
    /// One state's count: how many matched, read up to one past the cap.
    pub struct Counted {
        pub state: String,
        pub seen: i64,
    }
}

/// The executions matching `filter` in each state `list` lists (a moved
/// run is counted once, where it lives), in `ExecutionState::ALL`'s order,
/// each counted up to `cap + 1`: a state's count is one `executions_state`
/// seek with a LIMIT, so it reads at most `cap + 1` of that state's index
/// entries when the filter is empty (a filter is checked on the entries
/// read, so a narrow one may read more before the count fills).
pub fn count(filter: &Filter, cap: i32) -> Vec<Counted> {
    let (condition, params) = filter.compile(1);
    let mut args: Vec<DatumWithOid<'static>> = params.into_iter().map(datum).collect();
    let states: Vec<String> = sheaf_core::state::ExecutionState::ALL
        .iter()
        .filter(|s| !s.is_migrating())
        .map(|s| s.as_str().to_owned())
        .collect();
    let sql = format!(
        "SELECT s.state, (SELECT count(*) FROM (SELECT 1 FROM executions \
                                               WHERE state = s.state AND ({condition}) LIMIT ${}::int8) c) AS seen \
         FROM unnest(${}::text[]) WITH ORDINALITY AS s(state, o) ORDER BY s.o",
        args.len() + 1,
        args.len() + 2
    );
    args.push((i64::from(cap) + 1).into());
    args.push(states.into());
    Spi::connect(|client| rows::all(select_once(client, &sql, &args), "counting executions"))
}

fn datum(param: Param) -> DatumWithOid<'static> {
    match param {
        Param::Text(s) => s.into(),
        Param::TextArray(items) => items.into(),
        Param::Jsonb(v) => Jsonb::from_value(v).into(),
        Param::JsonbArray(items) => items.into_iter().map(pgrx::JsonB).collect::<Vec<_>>().into(),
        Param::Timestamp(at) => timestamp(&at.option, &at.text).into(),
    }
}

/// A timestamp argument of a filter or an anchor, refused (naming where it
/// was) unless it reads as a `timestamptz`.
pub fn timestamp(option: &str, text: &str) -> TimestampWithTimeZone {
    text.parse::<TimestampWithTimeZone>().unwrap_or_else(|_| {
        bad_argument(
            option,
            format!("must be a timestamp with time zone, got {}", quoted(text)),
        )
    })
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::{init, rows, start};
    use pgrx::prelude::*;
    use serde_json::{Value, json};

    row! {
        struct Listed {
            execution_id: pgrx::Uuid,
            search_attrs: pgrx::JsonB,
        }
    }

    fn list(filter: Value, after: Option<Value>, max_rows: i32, order: &str) -> Vec<Listed> {
        rows(
            "SELECT execution_id, search_attrs FROM sheaf.list_executions($1, $2, $3, $4)",
            &[
                pgrx::JsonB(filter).into(),
                after.map(pgrx::JsonB).into(),
                max_rows.into(),
                order.into(),
            ],
        )
    }

    /// The ids `list` returns, in its order.
    fn listed_ids(filter: Value, after: Option<Value>, max_rows: i32, order: &str) -> Vec<pgrx::Uuid> {
        list(filter, after, max_rows, order)
            .into_iter()
            .map(|r| r.execution_id)
            .collect()
    }

    fn start_with(name: &str, key: &str, attrs: Value) -> pgrx::Uuid {
        Spi::get_one_with_args::<pgrx::Uuid>(
            "SELECT execution_id FROM sheaf.start_workflow($1, $2, '{}', $3)",
            &[
                name.into(),
                key.into(),
                pgrx::JsonB(json!({"search_attrs": attrs})).into(),
            ],
        )
        .expect("start")
        .expect("an id")
    }

    #[pg_test]
    fn attrs_set_at_start_are_listed_and_merged_by_upsert() {
        init();
        let id = start_with("w", "a", json!({"tenant": "acme", "n": 1}));
        let listed = list(json!({}), None, 10, "desc");
        assert_eq!(
            listed
                .iter()
                .map(|r| (r.execution_id, &r.search_attrs.0))
                .collect::<Vec<_>>(),
            vec![(id, &json!({"tenant": "acme", "n": 1}))]
        );
        let merged = Spi::get_one_with_args::<pgrx::JsonB>(
            "SELECT sheaf.upsert_search_attrs($1, $2)",
            &[id.into(), pgrx::JsonB(json!({"n": null, "vip": true})).into()],
        )
        .expect("upsert")
        .expect("merged");
        assert_eq!(merged.0, json!({"tenant": "acme", "vip": true}));
        let events = Spi::get_one_with_args::<i64>(
            "SELECT count(*) FROM sheaf.history($1) WHERE event_type = 'SearchAttrsUpserted'",
            &[id.into()],
        )
        .expect("history");
        assert_eq!(events, Some(1));
    }

    #[pg_test]
    fn pages_follow_the_keyset_in_both_orders() {
        init();
        let ids: Vec<pgrx::Uuid> = (0..5)
            .map(|i| start("w", &format!("k{i}"), json!({})).id)
            .collect();
        let all = listed_ids(json!({}), None, 10, "asc");
        assert_eq!(all.len(), 5);
        let mut sorted = ids.clone();
        sorted.sort_by_key(|id| all.iter().position(|x| x == id));
        assert_eq!(sorted, all, "every start listed once");
        let anchor = |id: pgrx::Uuid| {
            let at = Spi::get_one_with_args::<String>(
                "SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') \
                 FROM sheaf.executions WHERE id = $1",
                &[id.into()],
            )
            .expect("created_at")
            .expect("a time");
            json!({"created_at": at, "execution_id": id.to_string()})
        };
        let next = listed_ids(json!({}), Some(anchor(all[1])), 2, "asc");
        assert_eq!(next, all[2..4].to_vec());
        let back = listed_ids(json!({}), Some(anchor(all[3])), 10, "desc");
        assert_eq!(back, vec![all[2], all[1], all[0]]);
    }

    #[pg_test]
    fn filters_are_typed() {
        init();
        let five = start_with("w", "a", json!({"n": 5, "s": "5"}));
        let text = start_with("w", "b", json!({"n": "5", "s": "b"}));
        let ids = |filter: Value| -> Vec<pgrx::Uuid> {
            let mut ids = listed_ids(filter, None, 10, "desc");
            ids.sort_by_key(|id| *id.as_bytes());
            ids
        };
        assert_eq!(ids(json!({"attr": "n", "op": "=", "value": 5})), vec![five]);
        assert_eq!(ids(json!({"attr": "n", "op": "=", "value": "5"})), vec![text]);
        assert_eq!(ids(json!({"attr": "n", "op": ">", "value": 4.5})), vec![five]);
        assert_eq!(ids(json!({"attr": "s", "op": ">", "value": "a"})), vec![text]);
        assert_eq!(ids(json!({"attr": "n", "op": "!=", "value": 4})), vec![five]);
        assert_eq!(
            ids(json!({"not": {"attr": "n", "op": "<", "value": 9}})),
            vec![text]
        );
        assert_eq!(
            ids(json!({"attr": "n", "op": "in", "value": [1, "5"]})),
            vec![text]
        );
    }

    #[pg_test]
    #[should_panic(expected = "invalid filter.or[1]")]
    fn an_or_that_would_scan_is_refused() {
        init();
        list(
            json!({"or": [{"state": ["RUNNING"]}, {"created_after": "2026-01-01"}]}),
            None,
            10,
            "desc",
        );
    }

    #[pg_test]
    #[should_panic(expected = "invalid filter.created_after")]
    fn a_bad_timestamp_is_named() {
        init();
        list(json!({"created_after": "yesterday-ish"}), None, 10, "desc");
    }

    #[pg_test]
    #[should_panic(expected = "invalid opts.search_attrs")]
    fn nested_attrs_are_refused_at_start() {
        init();
        start_with("w", "a", json!({"deep": {"x": 1}}));
    }

    row! {
        #[derive(Debug, PartialEq)]
        struct Counted {
            state: String,
            count: i64,
            capped: bool,
        }
    }

    #[pg_test]
    fn executions_are_counted_by_state_up_to_the_cap() {
        init();
        for n in 0..3 {
            start("w", &format!("r{n}"), json!({}));
        }
        start("other", "r", json!({}));
        Spi::run("SELECT sheaf.cancel_execution(execution_id, NULL) FROM sheaf.find_execution('w', 'r0')")
            .unwrap();
        let counted = |filter: Value, cap: i32| -> Vec<(String, i64, bool)> {
            rows::<Counted>(
                "SELECT state, count, capped FROM sheaf.count_executions($1, $2) WHERE count > 0",
                &[pgrx::JsonB(filter).into(), cap.into()],
            )
            .into_iter()
            .map(|c| (c.state, c.count, c.capped))
            .collect()
        };
        let row = |s: &str, n: i64, capped: bool| (s.to_owned(), n, capped);
        assert_eq!(
            counted(json!({}), 10),
            [row("RUNNING", 3, false), row("CANCELLED", 1, false)]
        );
        assert_eq!(
            counted(json!({"workflow_name": ["w"]}), 2),
            [row("RUNNING", 2, false), row("CANCELLED", 1, false)],
            "two of two is not capped"
        );
        assert_eq!(
            counted(json!({}), 2),
            [row("RUNNING", 2, true), row("CANCELLED", 1, false)]
        );
        let states: i64 = Spi::get_one("SELECT count(*) FROM sheaf.count_executions()")
            .unwrap()
            .unwrap();
        assert_eq!(states, 9, "every state but a move's");
    }

    #[pg_test(error = "invalid cap: must be from 1 to 1000000, got 0")]
    fn a_count_needs_a_cap() {
        init();
        Spi::run("SELECT * FROM sheaf.count_executions('{}', 0)").unwrap();
    }
}
