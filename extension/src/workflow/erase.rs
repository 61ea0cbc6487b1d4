//! Erasing an execution's payloads on this shard (`sheaf.erase_payloads`):
//! the one exception to append-only history. Its input, result and error,
//! every event's payload, and the payloads of its tasks, dead letters,
//! outbox rows and unstarted cross-shard children become `{"erased":true}`
//! (an error, `erased`); event types, sequence numbers and times stay, so
//! the history still reads in order. Each event's `bytes` becomes 15 (the
//! marker's) and the execution's `history_bytes` their sum. Quota counters
//! do not change: only an ended run (or a seal) is erased, and neither
//! counts in them. The driver's `Client::erase_payloads` runs it on every
//! shard (a residence keeps a seal; a drain hands seals to another shard).

use pgrx::prelude::*;
use sheaf_core::state::ExecutionState;

use crate::base::audit;
use crate::base::errors::not_ready;
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::workflow::executions;

/// What an erased payload becomes, and its bytes as compact JSON.
const MARKER_BYTES: i32 = 15;

const ERASE_EVENTS: Stmt = Stmt::write(
    "WITH v AS (UPDATE events SET payload = '{\"erased\": true}', bytes = $2 \
                WHERE execution_id = $1 AND payload <> '{\"erased\": true}' RETURNING 1) \
     SELECT count(*) FROM v",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::INT4OID],
);
const ERASE_ROW: Stmt = Stmt::write(
    "UPDATE executions SET input = '{\"erased\": true}', \
       result = CASE WHEN result IS NULL THEN NULL ELSE '{\"erased\": true}'::jsonb END, \
       error = CASE WHEN error IS NULL THEN NULL ELSE 'erased' END, \
       history_bytes = (SELECT coalesce(sum(bytes), 0) FROM events WHERE execution_id = $1) \
     WHERE id = $1 RETURNING history_bytes, coalesce(migrated_from_shards, '{}')",
    &[PgBuiltInOids::UUIDOID],
);
const ERASE_ROW_010: Stmt = Stmt::write(
    "UPDATE executions SET input = '{\"erased\": true}', \
       result = CASE WHEN result IS NULL THEN NULL ELSE '{\"erased\": true}'::jsonb END, \
       error = CASE WHEN error IS NULL THEN NULL ELSE 'erased' END, \
       history_bytes = (SELECT coalesce(sum(bytes), 0) FROM events WHERE execution_id = $1) \
     WHERE id = $1 RETURNING history_bytes, '{}'::int[]",
    &[PgBuiltInOids::UUIDOID],
);
const BYTES: Stmt = Stmt::write(
    "SELECT history_bytes FROM executions WHERE id = $1",
    &[PgBuiltInOids::UUIDOID],
);
const ERASE_RELATED: Stmt = Stmt::write(
    "WITH t AS (UPDATE tasks SET payload = '{\"erased\": true}' WHERE execution_id = $1 RETURNING 1), \
          d AS (UPDATE dead_letters SET payload = '{\"erased\": true}' WHERE execution_id = $1 RETURNING 1) \
     SELECT (SELECT count(*) FROM t) + (SELECT count(*) FROM d)",
    &[PgBuiltInOids::UUIDOID],
);
const ERASE_RELAY: Stmt = Stmt::write(
    "WITH o AS (UPDATE outbox SET payload = CASE WHEN payload IS NULL THEN NULL ELSE '{\"erased\": true}'::jsonb END, \
                                  reason = CASE WHEN reason IS NULL THEN NULL ELSE 'erased' END \
                WHERE sender_id = $1 RETURNING 1), \
          c AS (UPDATE cross_shard_children SET input = CASE WHEN input IS NULL THEN NULL \
                                                            ELSE '{\"erased\": true}'::jsonb END, \
                                                close_reason = CASE WHEN close_reason IS NULL THEN NULL ELSE 'erased' END \
                WHERE parent_id = $1 RETURNING 1) \
     SELECT (SELECT count(*) FROM o) + (SELECT count(*) FROM c)",
    &[PgBuiltInOids::UUIDOID],
);

/// Erases execution `id`'s payloads here. `None` if this shard holds no
/// row of it (a residence retention already collected). A live run must
/// have ended (55000): a seal (MIGRATED) always may be erased, its live
/// copy is gated where it lives.
pub fn erase(id: pgrx::Uuid) -> Option<serde_json::Value> {
    let e = executions::try_lock(id)?;
    match e.state {
        ExecutionState::Migrating => not_ready(format!(
            "execution {id} is being moved onto this shard: erase it once the move is done"
        )),
        s if s.is_active() => not_ready(format!(
            "execution {id} is {s}: erase its payloads once it has ended (cancel or terminate it first)"
        )),
        _ => {}
    }
    let before: i64 = BYTES.one_value(&[id.into()], "reading bytes");
    let events: i64 = ERASE_EVENTS.one_value(&[id.into(), MARKER_BYTES.into()], "erasing event payloads");
    let stmt = if crate::workflow::migration::enabled() {
        &ERASE_ROW
    } else {
        &ERASE_ROW_010
    };
    row! {
        /// The erased execution's history bytes, and the shards it lived on.
        struct Erased {
            after: i64,
            residences: Vec<i32>,
        }
    }
    let Erased { after, residences } = stmt.one(&[id.into()], "erasing an execution");
    let related: i64 = ERASE_RELATED.one_value(&[id.into()], "erasing task payloads");
    let relayed: i64 = if crate::workflow::family::enabled() {
        ERASE_RELAY.one_value(&[id.into()], "erasing outbox payloads")
    } else {
        0
    };
    let report = serde_json::json!({
        "state": e.state.as_str(), "events": events, "rows": related + relayed,
        "bytes_before": before, "bytes_after": after, "migrated_from_shards": residences,
    });
    audit::record("erase_payloads", &id.to_string(), "ok", report.clone());
    Some(report)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{declare, init, start};
    use pgrx::prelude::*;
    use serde_json::json;

    /// A running run's payloads stay: it still reads them.
    #[pg_test]
    #[should_panic(expected = "erase its payloads once it has ended")]
    fn a_running_run_is_not_erased() {
        init();
        declare("er0", json!({"queue": "er0q"}));
        let id = start("er0", "one", json!({"secret": "s3cret"})).id;
        Spi::run_with_args("SELECT sheaf.erase_payloads($1)", &[id.into()]).unwrap();
    }

    /// An ended run's payloads go, its history's shape stays, and its
    /// byte count is what is left.
    #[pg_test]
    fn an_ended_run_is_erased() {
        init();
        declare("er", json!({"queue": "erq"}));
        let id = start("er", "one", json!({"secret": "s3cret"})).id;
        Spi::run_with_args(
            "SELECT sheaf.append_event($1, 'Note', '{\"secret\": 1}')",
            &[id.into()],
        )
        .unwrap();
        Spi::run_with_args("SELECT sheaf.cancel_execution($1, 'done')", &[id.into()]).unwrap();
        let report = Spi::get_one_with_args::<pgrx::JsonB>("SELECT sheaf.erase_payloads($1)", &[id.into()])
            .unwrap()
            .unwrap()
            .0;
        assert_eq!(report["found"], json!(true));
        let count = |sql: &str| Spi::get_one_with_args::<i64>(sql, &[id.into()]).unwrap().unwrap();
        assert_eq!(
            count(
                "SELECT count(*) FROM sheaf.events WHERE execution_id = $1 AND payload::text LIKE '%secret%'"
            ),
            0
        );
        assert_eq!(
            count("SELECT count(*) FROM sheaf.executions WHERE id = $1 AND input = '{\"erased\": true}'"),
            1
        );
        assert!(count("SELECT count(*) FROM sheaf.events WHERE execution_id = $1") >= 3);
        assert_eq!(
            count(
                "SELECT history_bytes - (SELECT sum(bytes) FROM sheaf.events WHERE execution_id = $1) \
                 FROM sheaf.executions WHERE id = $1"
            ),
            0,
            "history_bytes is the erased events' sum"
        );
    }
}
