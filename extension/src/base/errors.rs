//! The SQLSTATEs sheaf raises (docs/reference/errors.md lists the same codes).
//!
//! Every refusal goes through one of these, so a code and the shape of its
//! message stay consistent across functions.

use pgrx::prelude::*;
use sheaf_core::excerpt::quoted;

/// Every code this module raises (and so the extension: every refusal goes
/// through here; pgrx's `error!` raises XX000). A test checks the list is
/// complete and each code is documented in `sheaf_core::sqlstate::ALL`.
pub const RAISED: &[PgSqlErrorCode] = &[
    PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
    PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
    PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
    PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
    PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
    PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
    PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
    PgSqlErrorCode::ERRCODE_OBJECT_IN_USE,
    PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
    PgSqlErrorCode::ERRCODE_OPERATOR_INTERVENTION,
    PgSqlErrorCode::ERRCODE_CHECK_VIOLATION,
    PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
];

/// 22023: an argument has a value sheaf cannot accept. `arg` names it.
pub fn bad_argument(arg: &str, why: impl std::fmt::Display) -> ! {
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("invalid {arg}: {why}")
    );
}

/// 54000: a value is larger than sheaf stores (`sheaf_core::hygiene`'s one
/// size limit); `arg` names it, `why` its size and the limit.
pub fn too_large(arg: &str, why: impl std::fmt::Display) -> ! {
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        format!("{arg} is too large: {why}")
    );
}

/// 22004: a required argument is NULL.
pub fn null_argument(arg: &str) -> ! {
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
        format!("{arg} must not be null")
    );
}

/// 55000: the shard or an execution is not in a state that allows the call.
pub fn not_ready(what: impl std::fmt::Display) -> ! {
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        what.to_string()
    );
}

/// An SPI failure is a bug in sheaf's own SQL, never a caller's mistake:
/// report it as an internal error that names the statement's purpose.
pub trait SpiResultExt<T> {
    fn or_internal(self, doing: &str) -> T;
}

impl<T> SpiResultExt<T> for Result<T, pgrx::spi::SpiError> {
    fn or_internal(self, doing: &str) -> T {
        match self {
            Ok(v) => v,
            Err(e) => internal(format!("{doing}: {e}")),
        }
    }
}

/// XX000: a bug in sheaf itself (a statement that cannot fail did, a row
/// that must exist does not), never a caller's mistake. `what` says what
/// sheaf was doing, for the report.
pub fn internal(what: impl std::fmt::Display) -> ! {
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("sheaf internal error while {what}")
    );
}

/// 55P03: the task is here but not running under this token (its lease
/// expired and it was put back or claimed again). Nothing was changed.
pub fn stale_token(task_id: pgrx::Uuid, token: i64) -> ! {
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
        format!(
            "task {task_id} is not running under token {token}: its lease was lost (it expired, and the task was put back or claimed again)"
        )
    );
}

/// P0002: no task with this id is on this shard: it finished (completed,
/// dead-lettered, or cancelled with its execution), or never existed.
pub fn unknown_task(task_id: pgrx::Uuid) -> ! {
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
        format!("no task {task_id} on this shard: it already finished, or never existed")
    );
}

/// 57000: an operator cancelled the task (`sheaf.cancel_task`) while its
/// holder ran it: the holder should stop its work and give the task back
/// (`sheaf.release`), which ends it. Nothing was changed.
pub fn task_cancelled(task_id: pgrx::Uuid, reason: Option<&str>) -> ! {
    let why = reason.map_or(String::new(), |r| format!(" ({})", quoted(r)));
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_OPERATOR_INTERVENTION,
        format!("task {task_id} was cancelled{why}: stop its work and give it back with sheaf.release")
    );
}

/// P0002: what the call names (`what` says what) is not on this shard.
pub fn not_found(what: impl std::fmt::Display) -> ! {
    ereport!(ERROR, PgSqlErrorCode::ERRCODE_NO_DATA_FOUND, what.to_string());
}

/// P0002: no execution with this id lives on this shard.
pub fn unknown_execution(id: pgrx::Uuid) -> ! {
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
        format!("no execution {id} on this shard")
    );
}

/// 55000: the execution was rebalanced off this shard, which keeps only its
/// seal. The DETAIL is JSON (`execution_id`, `moved_to`: the shard it moved
/// to), for the driver to follow at once; the message names no shard.
pub fn moved(id: pgrx::Uuid, to: i32) -> ! {
    let detail = serde_json::json!({"execution_id": id.to_string(), "moved_to": to});
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("execution {id} has moved to another shard: the driver follows it there"),
        detail.to_string()
    );
}

/// 23514: `what` (a start, a task) belongs to shard `owner` under the
/// topology published here, as a row outside a partition's bounds does.
/// The DETAIL names the owner as JSON (`{"owner_shard"}`), so a client
/// can send it there; never a connection string.
pub fn misplaced(what: &str, owner: u16) -> ! {
    let detail = serde_json::json!({ "owner_shard": owner });
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_CHECK_VIOLATION,
        format!(
            "{what} belongs to shard {owner} under the published topology, not this one: send it there \
             (sheaf.place_start and sheaf.place_task name the owner), or say its placement in opts.placement"
        ),
        detail.to_string()
    );
}

/// 53400: a start would exceed a declared quota. Nothing was written. The
/// DETAIL is the same as JSON (`workflow`, `key`, `resource`, `limit`,
/// `usage`), for clients that act on it; names and keys are bounded (256
/// bytes), so the detail stays small.
pub fn quota_exceeded(workflow: &str, key: &str, resource: &str, limit: i64, usage: i64) -> ! {
    let detail = serde_json::json!({
        "workflow": workflow, "key": key, "resource": resource, "limit": limit, "usage": usage,
    });
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        format!(
            "workflow {} refused: quota key {} has reached {} (limit {}, usage {})",
            quoted(workflow),
            quoted(key),
            resource,
            limit,
            usage
        ),
        detail.to_string()
    );
}

/// 55000: the client's topology digest is not one this shard accepts
/// (`base::topology`). The DETAIL is JSON: `client_digest`,
/// `accepted_digests`. Digests name no shard and no residency key.
pub fn topology_mismatch(client: &str, accepted: &[String]) -> ! {
    // The setting is the caller's: a long one is cut, never echoed whole.
    let client = sheaf_core::children::cut(client, 80);
    let detail = serde_json::json!({"client_digest": client, "accepted_digests": accepted});
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "placed work refused: this client's topology digest {} is not the fleet's published {}: \
             its shards, roles, residency map or forwards differ (compare them with sheaf topology diff)",
            quoted(client),
            accepted.join(" or ")
        ),
        detail.to_string()
    );
}

/// 55006: the concurrency gate (`on_conflict = reject`) refused a start.
pub fn gate_rejected(workflow: &str, key: &str, limit: i32) -> ! {
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_OBJECT_IN_USE,
        format!(
            "workflow {} refused: concurrency key {} already has {} active execution(s) (limit {}, on_conflict reject)",
            quoted(workflow),
            quoted(key),
            limit,
            limit
        )
    );
}

/// 55P03: a mutex call by an owner that does not hold the lock under this token.
pub fn not_mutex_holder(key: &str, owner: pgrx::Uuid, token: i64) -> ! {
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
        format!(
            "{} does not hold mutex {} under token {}: its lease was lost (reclaimed and granted again), or it never held it; nothing changed",
            owner,
            quoted(key),
            token
        )
    );
}

/// 55P03: a step of a move by a mover whose lease on its record was taken
/// over (it lapsed). Nothing was changed.
pub fn lease_lost(what: impl std::fmt::Display) -> ! {
    ereport!(
        ERROR,
        PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
        format!("{what}; nothing changed")
    );
}

/// 0A000 unless the transaction runs at READ COMMITTED. The gates serialize
/// on locks and then must see what the previous lock holder committed; a
/// REPEATABLE READ or SERIALIZABLE snapshot is older than the lock.
pub fn require_read_committed(function: &str) {
    // SAFETY: a backend is single-threaded; this is the GUC's own variable.
    let level = unsafe { pg_sys::XactIsoLevel };
    if level > pg_sys::XACT_READ_COMMITTED as std::ffi::c_int {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "sheaf.{function} runs only at READ COMMITTED isolation: it serializes on a lock and must then see what was committed before it got the lock"
            )
        );
    }
}

/// The five characters of a code, as PostgreSQL packs them (six bits each,
/// first character lowest).
pub fn sqlstate_text(code: PgSqlErrorCode) -> String {
    let packed = code as i32;
    (0..5)
        .map(|i| char::from(((packed >> (6 * i)) & 0x3F) as u8 + b'0'))
        .collect()
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::{RAISED, sqlstate_text};
    use pgrx::prelude::*;

    /// Every code sheaf raises is documented in `sheaf_core::sqlstate::ALL`
    /// (the list docs/reference/errors.md shows).
    #[pg_test]
    fn every_code_sheaf_raises_is_documented() {
        assert_eq!(sqlstate_text(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR), "XX000");
        for code in RAISED {
            let text = sqlstate_text(*code);
            assert!(
                sheaf_core::sqlstate::ALL.iter().any(|c| c.code == text),
                "{text} ({code:?}) is raised but not in sheaf_core::sqlstate::ALL"
            );
        }
    }

    /// `RAISED` lists every code this module names (a new refusal must be
    /// added there, and so checked above).
    #[pg_test]
    fn raised_lists_every_code_of_this_module() {
        let source = include_str!("errors.rs");
        let listed_end = source.find("];").expect("RAISED is a slice");
        let (listed, rest) = source.split_at(listed_end);
        for token in rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if token.starts_with("ERRCODE_") {
                assert!(listed.contains(token), "{token} is raised but not in RAISED");
            }
        }
    }
}
