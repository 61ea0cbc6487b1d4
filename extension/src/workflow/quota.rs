//! Per-tenant quotas: counters per quota key, checked at admission in O(1).
//!
//! `quota_usage` holds, per key, the active executions (RUNNING, SUSPENDED,
//! PAUSED), the history bytes of those executions, and the dead letters of
//! the key's executions. Every transaction that changes one of those rows
//! changes the counter row after it, in the same transaction; so a recount
//! that first locks the counter row sees every change either committed (and
//! counted) or still to be added on top of the recount. `quota_recompute`
//! relies on exactly that.

use pgrx::prelude::*;
use sheaf_core::policy::QuotaPolicy;

use crate::base::errors::quota_exceeded;
use crate::base::plans::Stmt;
use crate::base::rows::row;

const ADD: Stmt = Stmt::write(
    "INSERT INTO quota_usage AS u (key, active_executions, history_bytes, dead_letters) \
     VALUES ($1, $2, $3, $4) \
     ON CONFLICT (key) DO UPDATE SET \
       active_executions = u.active_executions + $2, \
       history_bytes = u.history_bytes + $3, \
       dead_letters = u.dead_letters + $4",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::INT8OID,
    ],
);
const ENSURE: Stmt = Stmt::write(
    "INSERT INTO quota_usage (key) VALUES ($1) ON CONFLICT (key) DO NOTHING",
    &[PgBuiltInOids::TEXTOID],
);
// A write statement, so it reads with a fresh snapshot after the lock wait.
const LOCK: Stmt = Stmt::write(
    "SELECT active_executions, history_bytes, dead_letters FROM quota_usage WHERE key = $1 FOR UPDATE",
    &[PgBuiltInOids::TEXTOID],
);
const READ: Stmt = Stmt::read(
    "SELECT active_executions, history_bytes, dead_letters FROM quota_usage WHERE key = $1",
    &[PgBuiltInOids::TEXTOID],
);
const RECOUNT: Stmt = Stmt::write(
    "SELECT (SELECT count(*) FROM executions \
             WHERE quota_key = $1 AND state IN ('RUNNING', 'SUSPENDED', 'PAUSED')), \
            (SELECT coalesce(sum(history_bytes), 0)::bigint FROM executions \
             WHERE quota_key = $1 AND state IN ('RUNNING', 'SUSPENDED', 'PAUSED')), \
            (SELECT count(*) FROM dead_letters d JOIN executions e ON e.id = d.execution_id \
             WHERE e.quota_key = $1)",
    &[PgBuiltInOids::TEXTOID],
);
const STORE: Stmt = Stmt::write(
    "UPDATE quota_usage SET active_executions = $2, history_bytes = $3, dead_letters = $4 WHERE key = $1",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::INT8OID,
    ],
);

row! {
    /// A key's usage: active executions, their history bytes, dead letters.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Usage {
        pub active: i64,
        pub bytes: i64,
        pub dead: i64,
    }
}

fn usage_row(stmt: &Stmt, key: &str) -> Usage {
    {
        // A key with no counter row yet has used nothing.
        stmt.first(&[key.into()], "reading quota usage")
            .unwrap_or_default()
    }
}

/// Adds to a key's counters (creating its row).
pub fn add(key: &str, active: i64, bytes: i64, dead: i64) {
    ADD.exec(&[key.into(), active.into(), bytes.into(), dead.into()]);
}

/// Locks a key's counter row (creating it) and returns its usage.
fn lock(key: &str) -> Usage {
    ENSURE.exec(&[key.into()]);
    usage_row(&LOCK, key)
}

/// The first limit `usage` has reached, in the documented order.
fn first_reached(policy: &QuotaPolicy, usage: Usage) -> Option<(&'static str, i64, i64)> {
    [
        (
            "max_active_executions",
            policy.max_active_executions,
            usage.active,
        ),
        ("max_history_bytes", policy.max_history_bytes, usage.bytes),
        ("max_dead_letters", policy.max_dead_letters, usage.dead),
    ]
    .into_iter()
    .find_map(|(name, limit, used)| limit.filter(|l| used >= *l).map(|l| (name, l, used)))
}

/// Refuses (53400) a start of `workflow` when `key` has reached a limit,
/// reading the counters without a lock: the early check, so a refusal comes
/// before the concurrency gate does any work.
pub fn precheck(workflow: &str, key: &str, policy: &QuotaPolicy) {
    if let Some((resource, limit, used)) = first_reached(policy, usage_row(&READ, key)) {
        quota_exceeded(workflow, key, resource, limit, used);
    }
}

/// The authoritative check: locks the key's counters, refuses (53400) when a
/// limit is reached, else counts the new execution in.
pub fn admit(workflow: &str, key: &str, policy: &QuotaPolicy) {
    if let Some((resource, limit, used)) = first_reached(policy, lock(key)) {
        quota_exceeded(workflow, key, resource, limit, used);
    }
    add(key, 1, 0, 0);
}

/// A quota key's usage, from its counters (zeros for a key never seen).
pub fn usage(key: &str) -> Usage {
    usage_row(&READ, key)
}

/// Recounts a quota key's usage from the executions and dead letters, stores
/// it in the counters, and returns it.
pub fn recompute(key: &str) -> Usage {
    lock(key);
    let u = usage_row(&RECOUNT, key);
    STORE.exec(&[key.into(), u.active.into(), u.bytes.into(), u.dead.into()]);
    u
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::{claim, declare, init, one, start};
    use pgrx::prelude::*;
    use serde_json::json;

    row! {
        #[derive(Debug, PartialEq)]
        struct Usage {
            active_executions: i64,
            history_bytes: i64,
            dead_letters: i64,
        }
    }

    fn usage(sql: &str) -> Usage {
        one(sql, &[])
    }

    #[pg_test]
    fn counters_follow_starts_events_dead_letters_and_ends() {
        init();
        declare(
            "w",
            json!({"quota": {"key": "input.t", "max_active_executions": 10}}),
        );
        let a = start("w", "a", json!({"t": "acme"})).id;
        let b = start("w", "b", json!({"t": "acme"})).id;
        Spi::run_with_args("SELECT sheaf.append_event($1, 'Note', '{\"x\": 1}')", &[a.into()]).unwrap();
        let id = Spi::get_one_with_args::<pgrx::Uuid>(
            "SELECT sheaf.enqueue('acts', '{}', jsonb_build_object('execution_id', $1::text, 'max_attempts', 1))",
            &[a.into()],
        )
        .unwrap();
        assert!(id.is_some());
        let t = claim("acts", 1);
        Spi::run_with_args(
            "SELECT sheaf.fail($1, $2, 'boom')",
            &[t[0].id.into(), t[0].token.into()],
        )
        .unwrap();
        Spi::run_with_args("SELECT sheaf.cancel_execution($1, 'done')", &[b.into()]).unwrap();
        let counted = usage("SELECT * FROM sheaf.quota_usage('acme')");
        assert_eq!((counted.active_executions, counted.dead_letters), (1, 1));
        assert_eq!(counted, usage("SELECT * FROM sheaf.quota_recompute('acme')"));
    }

    #[pg_test(
        error = "workflow \"w\" refused: quota key \"acme\" has reached max_active_executions (limit 2, usage 2)"
    )]
    fn a_start_over_the_quota_is_refused() {
        init();
        declare(
            "w",
            json!({"quota": {"key": "input.t", "max_active_executions": 2}}),
        );
        start("w", "a", json!({"t": "acme"}));
        start("w", "b", json!({"t": "acme"}));
        start("w", "c", json!({"t": "acme"}));
    }
}
