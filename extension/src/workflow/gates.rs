//! The concurrency gate of a start: `reject` and `cancel_running` (latest
//! wins). `defer` needs no gate here: its workflow tasks carry the key
//! `<workflow>:<key>` capped at the policy's limit, and wait in the claim
//! engine for a slot.
//!
//! Both strategies serialize on a transaction-scoped advisory lock of
//! (workflow name, key), then read that pair's active executions with a
//! fresh snapshot. They never look at another workflow name, even one whose
//! key resolves to the same string.

use pgrx::prelude::*;
use sheaf_core::excerpt::quoted;
use sheaf_core::policy::{ConcurrencyPolicy, OnConflict};

use crate::base::errors::gate_rejected;
use crate::base::locks::{self, Class};
use crate::base::plans::Stmt;
use crate::workflow::lifecycle;

/// The most executions one admission cancels; the rest go on later ones.
pub const SUPERSEDE_MAX: i64 = 32;
const ACTIVE_NEWEST_FIRST: Stmt = Stmt::write(
    "SELECT id FROM executions \
     WHERE workflow_name = $1 AND concurrency_key = $2 AND state IN ('RUNNING', 'SUSPENDED', 'PAUSED') \
     ORDER BY seq DESC LIMIT $3",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::INT8OID,
    ],
);

fn active_newest_first(workflow: &str, key: &str, max: i64) -> Vec<pgrx::Uuid> {
    ACTIVE_NEWEST_FIRST.values(
        &[workflow.into(), key.into(), max.into()],
        "reading a key's executions",
    )
}

/// Applies the gate to a start of `workflow` with resolved `key`, which will
/// become execution `new_id`; returns the executions it cancelled. `reject`
/// refuses (55006) when the pair already has `limit` active executions.
pub fn admit(workflow: &str, key: &str, policy: &ConcurrencyPolicy, new_id: pgrx::Uuid) -> Vec<pgrx::Uuid> {
    if policy.on_conflict == OnConflict::Defer {
        return Vec::new();
    }
    locks::exclusive_pair(Class::Gate, workflow, key);
    let limit = policy.limit as i64;
    match policy.on_conflict {
        OnConflict::Defer => Vec::new(),
        OnConflict::Reject => {
            if active_newest_first(workflow, key, limit).len() as i64 >= limit {
                gate_rejected(workflow, key, policy.limit);
            }
            Vec::new()
        }
        OnConflict::CancelRunning => {
            // Keep the newest limit - 1 (the new one makes limit) and cancel
            // the next 32, oldest first. The scan reads limit + 31 rows, so
            // a long backlog is shed over several admissions, from its
            // newest end: the newest runs are always the ones kept.
            let active = active_newest_first(workflow, key, limit - 1 + SUPERSEDE_MAX);
            let mut victims: Vec<pgrx::Uuid> = active.into_iter().skip(policy.limit as usize - 1).collect();
            victims.reverse();
            let reason = format!(
                "superseded by execution {}: workflow {} keeps the newest {} active execution(s) per concurrency key (on_conflict cancel_running)",
                new_id,
                quoted(workflow),
                limit
            );
            // Out of the lock order (`base::locks`): each close takes the
            // victim's tasks, row, keys and mutexes while this start holds
            // the gate lock. A transaction that ends a mutex holder and then
            // starts a cancel_running workflow takes them the other way
            // round; the two can deadlock (40P01, docs/reference/sql/mutex.md), one
            // rolls back whole, and the driver retries the start.
            for id in &victims {
                lifecycle::close(
                    *id,
                    lifecycle::Close::Cancelled {
                        reason: Some(reason.clone()),
                    },
                );
            }
            victims
        }
    }
}
