//! Every SQLSTATE the sheaf extension raises, and what each means.
//!
//! sheaf uses standard codes only: pgrx cannot raise custom ones from Rust, and
//! a standard code lets any client's error handling work unchanged. The error
//! table of docs/reference/errors.md is checked against this list by a test.

/// One documented code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Code {
    pub code: &'static str,
    pub name: &'static str,
    pub meaning: &'static str,
}

/// A required argument is NULL. The message names the argument.
pub const NULL_VALUE_NOT_ALLOWED: &str = "22004";
/// An argument's value is out of range or malformed. The message names it.
pub const INVALID_PARAMETER_VALUE: &str = "22023";
/// A value is larger than sheaf stores (`hygiene::MAX_VALUE_BYTES`): refused,
/// never cut. The message names the argument, its size and the limit.
pub const PROGRAM_LIMIT_EXCEEDED: &str = "54000";
/// The shard is not in a state that allows the call (not initialized, or
/// already initialized as another shard).
pub const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
/// The task is not running under the given token: its lease was lost
/// (expired and claimed again) or it already finished. Nothing changed.
pub const LOCK_NOT_AVAILABLE: &str = "55P03";
/// A start would exceed a declared quota; the message names workflow, key,
/// resource, limit and usage. Nothing was written.
pub const CONFIGURATION_LIMIT_EXCEEDED: &str = "53400";
/// The concurrency gate (`on_conflict = reject`) refused a start.
pub const OBJECT_IN_USE: &str = "55006";
/// No execution with this id on this shard.
pub const NO_DATA_FOUND: &str = "P0002";
/// A gate function was called above READ COMMITTED isolation.
pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
/// An operator cancelled the task while its holder ran it
/// (`sheaf.cancel_task`): stop the work and give the task back.
pub const OPERATOR_INTERVENTION: &str = "57000";
/// A deadlock between two transactions (raised by Postgres); retry.
pub const DEADLOCK_DETECTED: &str = "40P01";
/// The caller's role may not call this function (raised by Postgres).
pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
/// The start or keyed task belongs to another shard under the topology
/// published here (the partition-constraint code); the DETAIL names it.
pub const CHECK_VIOLATION: &str = "23514";
/// A bug in sheaf's own SQL; never a caller's mistake. Please report it.
pub const INTERNAL_ERROR: &str = "XX000";

pub const ALL: &[Code] = &[
    Code {
        code: FEATURE_NOT_SUPPORTED,
        name: "feature_not_supported",
        meaning: "start_workflow or a mutex function ran above READ COMMITTED isolation: its gate must see what was committed before it got its lock",
    },
    Code {
        code: NULL_VALUE_NOT_ALLOWED,
        name: "null_value_not_allowed",
        meaning: "a required argument is NULL; the message names it",
    },
    Code {
        code: INVALID_PARAMETER_VALUE,
        name: "invalid_parameter_value",
        meaning: "an argument is out of range or malformed; the message names it and the accepted range",
    },
    Code {
        code: CHECK_VIOLATION,
        name: "check_violation",
        meaning: "a start, or a task with an idempotency key, rate key or placement, belongs to another shard under the topology published here: the message and the DETAIL ({\"owner_shard\"}) name it; nothing was written",
    },
    Code {
        code: PROGRAM_LIMIT_EXCEEDED,
        name: "program_limit_exceeded",
        meaning: "a payload, input, result, progress, signal payload or error text is larger than 1 MiB; the message names the argument, its size and the limit; nothing was written",
    },
    Code {
        code: DEADLOCK_DETECTED,
        name: "deadlock_detected",
        meaning: "two transactions waited on each other (e.g. a latest-wins start and a mutex release on one terminal path); the transaction rolled back whole and is safe to retry",
    },
    Code {
        code: INSUFFICIENT_PRIVILEGE,
        name: "insufficient_privilege",
        meaning: "the caller's role is not granted this function (see Roles)",
    },
    Code {
        code: CONFIGURATION_LIMIT_EXCEEDED,
        name: "configuration_limit_exceeded",
        meaning: "quota refused a start: the message names workflow, quota key, resource, limit and usage; nothing was written",
    },
    Code {
        code: OBJECT_NOT_IN_PREREQUISITE_STATE,
        name: "object_not_in_prerequisite_state",
        meaning: "the shard, execution or task is not in a state that allows the call (shard not initialized or initialized as another id; execution ended or paused; history closed; a dead letter that cannot be redriven)",
    },
    Code {
        code: OBJECT_IN_USE,
        name: "object_in_use",
        meaning: "the concurrency gate refused a start (on_conflict reject): the (workflow, key) already has its limit of active executions",
    },
    Code {
        code: LOCK_NOT_AVAILABLE,
        name: "lock_not_available",
        meaning: "stale fencing token: the task is not running under this token, or the owner does not hold the mutex under this token (lease lost, or already finished); nothing changed",
    },
    Code {
        code: OPERATOR_INTERVENTION,
        name: "operator_intervention",
        meaning: "an operator cancelled the task (cancel_task) while its holder ran it: the holder stops its work and gives the task back with release, which ends it; nothing changed",
    },
    Code {
        code: NO_DATA_FOUND,
        name: "no_data_found",
        meaning: "no execution with this id on this shard",
    },
    Code {
        code: INTERNAL_ERROR,
        name: "internal_error",
        meaning: "a bug in sheaf itself, never a caller's mistake; please report it with the message",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The error table of docs/reference/errors.md lists exactly these codes.
    #[test]
    fn errors_doc_documents_every_code() {
        let doc = include_str!("../../docs/reference/errors.md");
        let table: Vec<&str> = doc
            .lines()
            .skip_while(|l| !l.starts_with("# Errors"))
            .filter(|l| l.starts_with("| `"))
            .collect();
        for c in ALL {
            assert!(
                table
                    .iter()
                    .any(|l| l.starts_with(&format!("| `{}` | {} |", c.code, c.name))),
                "docs/reference/errors.md is missing {} {}",
                c.code,
                c.name
            );
        }
        assert_eq!(
            table.len(),
            ALL.len(),
            "docs/reference/errors.md lists codes sheaf does not raise"
        );
    }
}
