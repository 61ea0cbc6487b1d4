//! `ClientError`: why a client call failed, typed by what the caller can do
//! about it.

use std::fmt;

use sheaf_core::sqlstate;

use crate::id::{ExecutionId, IdError, TaskId};
use crate::pool::ShardError;
use crate::router::RouteError;
use crate::topology::ShardId;

/// `serialization_failure`: not raised by sheaf itself, but by PostgreSQL
/// when a caller runs the driver's sessions at a stricter isolation level.
pub(crate) const SERIALIZATION_FAILURE: &str = "40001";

/// The work a failed call was about: what the shard owns that is now
/// unavailable. Named in fail-loud errors so an operator knows what is
/// affected, never as a list of shards or residency keys.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Owned {
    /// A start of (workflow name, workflow id).
    Workflow {
        /// The workflow's name.
        name: String,
        /// The caller's id for this run of it.
        workflow_id: String,
    },
    /// One execution.
    Execution(ExecutionId),
    /// One task.
    Task(TaskId),
    /// A queue's tasks on that shard.
    Queue(String),
    /// A named mutex.
    Mutex(String),
    /// A named schedule.
    Schedule(String),
    /// Shard-wide work (worker registry, maintenance, policies, stats).
    Shard,
    /// This shard's part of a read across shards (a listing, a report).
    Listing(&'static str),
}

impl fmt::Display for Owned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owned::Workflow { name, workflow_id } => {
                write!(f, "workflow {name:?} id {workflow_id:?}")
            }
            Owned::Execution(id) => write!(f, "execution {id}"),
            Owned::Task(id) => write!(f, "task {id}"),
            Owned::Queue(name) => write!(f, "queue {name:?}"),
            Owned::Mutex(key) => write!(f, "mutex {key:?}"),
            Owned::Schedule(name) => write!(f, "schedule {name:?}"),
            Owned::Shard => write!(f, "shard maintenance"),
            Owned::Listing(what) => f.write_str(what),
        }
    }
}

/// What a quota refusal was about (from the shard's error detail; a shard
/// whose library predates 0.2.0 sends none).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[non_exhaustive]
pub struct QuotaDetail {
    /// The workflow whose start was refused.
    pub workflow: String,
    /// The quota key the start counts toward.
    pub key: String,
    /// The policy field that was reached: `max_active_executions`,
    /// `max_history_bytes` or `max_dead_letters`.
    pub resource: String,
    /// The declared limit.
    pub limit: i64,
    /// The key's usage when the start was refused.
    pub usage: i64,
}

/// Why a client call failed. The SQL refusals carry the shard's message
/// (sheaf's messages never list shards or residency keys) and keep the shard
/// that refused as a field, for logs. `Display` never lists the shard set or
/// residency keys; [`RouteError::operator_detail`] has the routing detail.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The start could not be placed (a bad pin, a drained fleet).
    #[error(transparent)]
    Route(#[from] RouteError),
    /// The one shard that owns the work cannot serve it; nothing was tried
    /// elsewhere. `error` names the shard and what to do.
    #[error("cannot serve {owned}: {error}")]
    Shard {
        /// What that shard owns that the call was about.
        owned: Owned,
        /// Why the shard could not serve.
        error: ShardError,
    },
    /// 53400: a quota refused the start; nothing was written.
    #[error("quota exceeded: {message}")]
    QuotaExceeded {
        /// The shard that refused.
        shard: ShardId,
        /// The shard's message.
        message: String,
        /// What was exceeded, when the shard says.
        detail: Option<QuotaDetail>,
    },
    /// 55006: the concurrency gate (`on_conflict: reject`) refused the start.
    #[error("the concurrency gate refused the start: {message}")]
    GateRejected {
        /// The shard that refused.
        shard: ShardId,
        /// The shard's message.
        message: String,
    },
    /// 55P03: the task is not running under this token (its lease expired
    /// and it was claimed again); for a mutex, the owner is not the holder.
    /// Nothing changed.
    #[error("stale token: {message}")]
    StaleToken {
        /// The shard that refused.
        shard: ShardId,
        /// The shard's message.
        message: String,
    },
    /// P0002 on an execution: no execution with this id on the shard it
    /// routes to.
    #[error("unknown execution: {message}")]
    UnknownExecution {
        /// The shard that refused.
        shard: ShardId,
        /// The shard's message.
        message: String,
    },
    /// P0002 on a task: no task with this id on the shard it routes to. It
    /// finished (or was cancelled with its execution), or never existed.
    #[error("unknown task: {message}")]
    UnknownTask {
        /// The shard that refused.
        shard: ShardId,
        /// The shard's message.
        message: String,
    },
    /// 57000 on a task: an operator cancelled it (`sheaf.cancel_task`)
    /// while this token held it. Stop the work and give the task back
    /// ([`Client::release`](crate::Client::release)), which ends it; a
    /// [`Worker`](crate::Worker) does both.
    #[error("task cancelled: {message}")]
    TaskCancelled {
        /// The shard that refused.
        shard: ShardId,
        /// The shard's message (with the operator's reason, cut).
        message: String,
    },
    /// P0002 on a queue: the shard has no such queue.
    #[error("unknown queue: {message}")]
    UnknownQueue {
        /// The shard that refused.
        shard: ShardId,
        /// The shard's message.
        message: String,
    },
    /// P0002 on a schedule: the shard has no schedule of that name.
    #[error("unknown schedule: {message}")]
    UnknownSchedule {
        /// The shard that refused.
        shard: ShardId,
        /// The shard's message.
        message: String,
    },
    /// 22023 / 22004: an argument is malformed, out of range, or NULL.
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// The shard that refused.
        shard: ShardId,
        /// Which of the two (22004: a required argument was NULL).
        code: String,
        /// The shard's message, naming the argument.
        message: String,
    },
    /// 55000: the execution or shard is not in a state that allows the call.
    #[error("not allowed in the current state: {message}")]
    WrongState {
        /// The shard that refused.
        shard: ShardId,
        /// The shard's message.
        message: String,
    },
    /// 55000 on placed work: the shard published another topology digest
    /// than this client's (`sheaf topology publish`): this client's shards,
    /// roles, residency map or forwards differ from the fleet's. Nothing was
    /// written; fix the configuration (`sheaf topology diff`).
    #[error("topology mismatch: {message}")]
    TopologyMismatch {
        /// The shard that refused.
        shard: ShardId,
        /// The shard's message.
        message: String,
        /// This client's digest, as the shard read it.
        client_digest: String,
        /// The digests the shard accepts.
        accepted_digests: Vec<String>,
    },
    /// 23514: the topology published on `shard` places the start or keyed
    /// task on shard `owner`; nothing was written. The driver places work
    /// by the topology it declares, which the shard accepts, so this means
    /// a placement the two disagree on (an older shard library, or work
    /// sent to one shard by hand): it is not re-sent anywhere.
    #[error("misplaced: {message}")]
    Misplaced {
        /// The shard that refused.
        shard: ShardId,
        /// The shard the published topology places the work on.
        owner: ShardId,
        /// The shard's message.
        message: String,
    },
    /// The execution was rebalanced off `shard`, which keeps its seal; it
    /// lives on `to` now. `Client` calls about an execution follow this
    /// themselves (up to [`MAX_FORWARDS`] hops); a caller sees it only from
    /// a call pinned to one shard (a transaction on `shard`).
    #[error("moved: {message}")]
    Moved {
        /// The shard that holds the seal.
        shard: ShardId,
        /// The shard the seal points to.
        to: ShardId,
        /// The shard's message.
        message: String,
    },
    /// A chain of forwards longer than [`MAX_FORWARDS`] (a move in progress
    /// on every hop, or a loop): retry later.
    #[error(
        "execution {id} is forwarded more than {MAX_FORWARDS} times; retry later (a move may be in progress)"
    )]
    TooManyForwards {
        /// The execution.
        id: crate::id::ExecutionId,
        /// The last shard reached.
        shard: ShardId,
    },
    /// 40P01 / 40001 on every attempt. Each attempt rolled back whole, so
    /// nothing changed and the caller may retry later.
    #[error(
        "gave up after {attempts} attempts that each hit a transient conflict ({message}); nothing changed, retry later"
    )]
    Conflict {
        /// The shard where the conflicts happened.
        shard: ShardId,
        /// How many times the call ran.
        attempts: u32,
        /// The last attempt's message.
        message: String,
    },
    /// Anything else the shard raised (`code` is its SQLSTATE), or a reply
    /// the driver could not read (`code` is `None`).
    #[error("database error{}: {message}", code_suffix(.code))]
    Database {
        /// The shard that answered.
        shard: ShardId,
        /// Its SQLSTATE, if it raised one.
        code: Option<String>,
        /// What went wrong.
        message: String,
    },
    /// No writable shard could take a task that may go anywhere; `last` is
    /// why the last one tried could not (it names that shard only).
    #[error("no writable shard can take the task now (the last one tried: {last})")]
    NoShardAvailable {
        /// The task's queue.
        queue: String,
        /// Why the last shard tried could not take it.
        last: String,
    },
    /// The local clock cannot be encoded in an id.
    #[error("cannot mint an execution id: {0}")]
    Id(#[from] IdError),
    /// The driver refused the request before sending it anywhere.
    #[error("invalid request: {0}")]
    BadRequest(String),
    /// This client's login on `shard` lacks `role`, which what it was asked
    /// to run needs (`sheaf_relay`: the relay and rebalance auto-resume).
    /// `defined` is false when the shard has no such role at all: its sheaf
    /// predates the role (`ALTER EXTENSION sheaf UPDATE`).
    #[error("{}", missing_role(*.shard, .role, .login, *.defined))]
    MissingRole {
        /// The shard whose login lacks it.
        shard: ShardId,
        /// The role, e.g. `sheaf_relay`.
        role: &'static str,
        /// The login role (the connection's user; never its connection string).
        login: String,
        /// Whether the role exists on that shard's cluster.
        defined: bool,
    },
}

/// [`ClientError::MissingRole`]'s message, with the statement that fixes it.
fn missing_role(shard: ShardId, role: &str, login: &str, defined: bool) -> String {
    let grant = format!("GRANT {role} TO \"{}\"", login.replace('"', "\"\""));
    if defined {
        format!("the login role {login:?} on shard {shard} lacks role {role} ({grant})")
    } else {
        format!(
            "shard {shard} has no role {role}: its sheaf predates it (ALTER EXTENSION sheaf UPDATE there, then {grant})"
        )
    }
}

/// The most forwards a call about one execution follows
/// ([`ClientError::Moved`]) before it gives up.
pub const MAX_FORWARDS: usize = 4;

/// A misplacement's DETAIL (`{"owner_shard"}`).
fn owner_detail(detail: &str) -> Option<ShardId> {
    #[derive(serde::Deserialize)]
    struct Detail {
        owner_shard: u32,
    }
    let d: Detail = serde_json::from_str(detail).ok()?;
    ShardId::new(d.owner_shard).ok()
}

/// A forwarding refusal's DETAIL (`{"execution_id", "moved_to"}`).
fn moved_detail(detail: &str) -> Option<ShardId> {
    #[derive(serde::Deserialize)]
    struct Detail {
        moved_to: u32,
    }
    let d: Detail = serde_json::from_str(detail).ok()?;
    ShardId::new(d.moved_to).ok()
}

/// A topology refusal's DETAIL (`{"client_digest", "accepted_digests"}`).
fn topology_detail(detail: &str) -> Option<(String, Vec<String>)> {
    #[derive(serde::Deserialize)]
    struct Detail {
        client_digest: String,
        accepted_digests: Vec<String>,
    }
    let d: Detail = serde_json::from_str(detail).ok()?;
    Some((d.client_digest, d.accepted_digests))
}

impl ClientError {
    /// The shard's refusal for `code`, after `attempts` runs of a call
    /// about `owned`; `detail` is the error's DETAIL field.
    pub(crate) fn refusal(
        shard: ShardId,
        owned: &Owned,
        code: &str,
        message: String,
        detail: Option<&str>,
        attempts: u32,
    ) -> ClientError {
        match code {
            sqlstate::CONFIGURATION_LIMIT_EXCEEDED => ClientError::QuotaExceeded {
                shard,
                message,
                detail: detail.and_then(|d| serde_json::from_str(d).ok()),
            },
            sqlstate::OBJECT_IN_USE => ClientError::GateRejected { shard, message },
            sqlstate::LOCK_NOT_AVAILABLE => ClientError::StaleToken { shard, message },
            sqlstate::NO_DATA_FOUND if matches!(owned, Owned::Task(_)) => {
                ClientError::UnknownTask { shard, message }
            }
            sqlstate::NO_DATA_FOUND if matches!(owned, Owned::Queue(_)) => {
                ClientError::UnknownQueue { shard, message }
            }
            sqlstate::NO_DATA_FOUND if matches!(owned, Owned::Schedule(_)) => {
                ClientError::UnknownSchedule { shard, message }
            }
            sqlstate::NO_DATA_FOUND => ClientError::UnknownExecution { shard, message },
            sqlstate::OPERATOR_INTERVENTION => ClientError::TaskCancelled { shard, message },
            sqlstate::INVALID_PARAMETER_VALUE | sqlstate::NULL_VALUE_NOT_ALLOWED => {
                ClientError::InvalidArgument {
                    shard,
                    code: code.to_owned(),
                    message,
                }
            }
            sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE => {
                if let Some(to) = detail.and_then(moved_detail) {
                    return ClientError::Moved { shard, to, message };
                }
                match detail.and_then(topology_detail) {
                    Some((client_digest, accepted_digests)) => ClientError::TopologyMismatch {
                        shard,
                        message,
                        client_digest,
                        accepted_digests,
                    },
                    None => ClientError::WrongState { shard, message },
                }
            }
            sqlstate::CHECK_VIOLATION if let Some(owner) = detail.and_then(owner_detail) => {
                ClientError::Misplaced {
                    shard,
                    owner,
                    message,
                }
            }
            c if is_transient(c) => ClientError::Conflict {
                shard,
                attempts,
                message,
            },
            c => ClientError::Database {
                shard,
                code: Some(c.to_owned()),
                message,
            },
        }
    }

    /// Whether the same call may succeed if made again later, unchanged: a
    /// shard that could not serve, a conflict, a full gate or quota, no
    /// writable shard. After a timeout or a connection lost mid-call the
    /// first attempt may have taken effect; sheaf's calls are safe to
    /// repeat when they carry their identity (a start's workflow id, a
    /// token, an idempotency key).
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Route(e) => e.is_retryable(),
            ClientError::Shard { error, .. } => !matches!(
                error,
                ShardError::NoPool { .. } | ShardError::IncompatibleSchema { .. }
            ),
            ClientError::QuotaExceeded { .. }
            | ClientError::GateRejected { .. }
            | ClientError::Conflict { .. }
            | ClientError::TooManyForwards { .. }
            | ClientError::NoShardAvailable { .. } => true,
            _ => false,
        }
    }

    /// The SQLSTATE the shard raised, when this error keeps it
    /// (docs/reference/errors.md): `None` for an error the driver found
    /// itself, a shard it could not reach, and a conflict (40P01 and 40001
    /// are one variant).
    pub fn sqlstate(&self) -> Option<&str> {
        Some(match self {
            ClientError::Database { code, .. } => return code.as_deref(),
            ClientError::InvalidArgument { code, .. } => code,
            ClientError::QuotaExceeded { .. } => sqlstate::CONFIGURATION_LIMIT_EXCEEDED,
            ClientError::GateRejected { .. } => sqlstate::OBJECT_IN_USE,
            ClientError::StaleToken { .. } => sqlstate::LOCK_NOT_AVAILABLE,
            ClientError::UnknownExecution { .. }
            | ClientError::UnknownTask { .. }
            | ClientError::UnknownQueue { .. }
            | ClientError::UnknownSchedule { .. } => sqlstate::NO_DATA_FOUND,
            ClientError::TaskCancelled { .. } => sqlstate::OPERATOR_INTERVENTION,
            ClientError::WrongState { .. }
            | ClientError::TopologyMismatch { .. }
            | ClientError::Moved { .. } => sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
            ClientError::Misplaced { .. } => sqlstate::CHECK_VIOLATION,
            _ => return None,
        })
    }

    /// The shard that refused or could not serve, when one did.
    pub fn shard(&self) -> Option<ShardId> {
        match self {
            ClientError::Shard { error, .. } => Some(error.shard()),
            ClientError::QuotaExceeded { shard, .. }
            | ClientError::GateRejected { shard, .. }
            | ClientError::StaleToken { shard, .. }
            | ClientError::UnknownExecution { shard, .. }
            | ClientError::UnknownTask { shard, .. }
            | ClientError::TaskCancelled { shard, .. }
            | ClientError::UnknownQueue { shard, .. }
            | ClientError::UnknownSchedule { shard, .. }
            | ClientError::InvalidArgument { shard, .. }
            | ClientError::WrongState { shard, .. }
            | ClientError::Conflict { shard, .. }
            | ClientError::Moved { shard, .. }
            | ClientError::Misplaced { shard, .. }
            | ClientError::TooManyForwards { shard, .. }
            | ClientError::Database { shard, .. }
            | ClientError::MissingRole { shard, .. } => Some(*shard),
            _ => None,
        }
    }
}

/// " <code>" when there is one, for [`ClientError::Database`]'s message.
fn code_suffix(code: &Option<String>) -> String {
    code.as_deref().map(|c| format!(" {c}")).unwrap_or_default()
}

/// Whether a SQLSTATE means "rolled back whole, run it again": every client
/// call is one statement in its own transaction, so a retry is the same
/// request, not a second one (a retried start attaches, with the same id).
pub(crate) fn is_transient(code: &str) -> bool {
    code == sqlstate::DEADLOCK_DETECTED || code == SERIALIZATION_FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(n: u32) -> ShardId {
        ShardId::new(n).unwrap()
    }

    fn refusal(code: &str) -> ClientError {
        ClientError::refusal(shard(1), &Owned::Shard, code, "m".into(), None, 1)
    }

    #[test]
    fn sqlstates_map_to_their_variants() {
        assert!(matches!(
            refusal("53400"),
            ClientError::QuotaExceeded { detail: None, .. }
        ));
        assert!(matches!(refusal("55006"), ClientError::GateRejected { .. }));
        assert!(matches!(refusal("55P03"), ClientError::StaleToken { .. }));
        assert!(matches!(refusal("P0002"), ClientError::UnknownExecution { .. }));
        assert!(matches!(refusal("22023"), ClientError::InvalidArgument { .. }));
        assert!(matches!(refusal("22004"), ClientError::InvalidArgument { .. }));
        assert!(matches!(refusal("55000"), ClientError::WrongState { .. }));
        assert!(matches!(refusal("57000"), ClientError::TaskCancelled { .. }));
        for code in ["0A000", "42501", "XX000", "23505"] {
            match refusal(code) {
                ClientError::Database { code: Some(c), .. } => assert_eq!(c, code),
                other => panic!("{code}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_refusal_keeps_its_sqlstate_except_a_conflict() {
        for code in [
            "53400", "55006", "55P03", "P0002", "22023", "22004", "55000", "57000", "0A000", "42501", "54000",
        ] {
            assert_eq!(refusal(code).sqlstate(), Some(code), "{code}");
        }
        assert_eq!(refusal("40P01").sqlstate(), None);
    }

    #[test]
    fn no_data_on_a_task_is_an_unknown_task() {
        let id = TaskId::mint(shard(1)).unwrap();
        let e = ClientError::refusal(shard(1), &Owned::Task(id), "P0002", "no task".into(), None, 1);
        assert!(matches!(e, ClientError::UnknownTask { .. }), "{e:?}");
    }

    #[test]
    fn a_topology_refusal_is_typed_and_another_55000_is_not() {
        let moved = r#"{"execution_id": "x", "moved_to": 3}"#;
        assert!(matches!(
            ClientError::refusal(shard(1), &Owned::Shard, "55000", "m".into(), Some(moved), 1),
            ClientError::Moved { to, .. } if to == shard(3)
        ));
        let detail = r#"{"client_digest": "sha256:aa", "accepted_digests": ["sha256:bb"]}"#;
        let e = ClientError::refusal(shard(1), &Owned::Shard, "55000", "m".into(), Some(detail), 1);
        match e {
            ClientError::TopologyMismatch {
                client_digest,
                accepted_digests,
                ..
            } => assert_eq!(
                (client_digest.as_str(), accepted_digests),
                ("sha256:aa", vec!["sha256:bb".to_owned()])
            ),
            other => panic!("{other:?}"),
        }
        assert!(
            !ClientError::refusal(shard(1), &Owned::Shard, "55000", "m".into(), Some(detail), 1)
                .is_retryable()
        );
        assert!(matches!(
            ClientError::refusal(shard(1), &Owned::Shard, "55000", "m".into(), None, 1),
            ClientError::WrongState { .. }
        ));
    }

    #[test]
    fn a_misplacement_names_its_owner_and_another_23514_is_not_one() {
        let detail = r#"{"owner_shard": 2}"#;
        let e = ClientError::refusal(shard(1), &Owned::Shard, "23514", "m".into(), Some(detail), 1);
        assert!(
            matches!(e, ClientError::Misplaced { shard: s, owner, .. } if s == shard(1) && owner == shard(2)),
            "{e:?}"
        );
        assert!(!e.is_retryable());
        assert!(matches!(
            ClientError::refusal(shard(1), &Owned::Shard, "23514", "m".into(), None, 1),
            ClientError::Database { .. }
        ));
    }

    #[test]
    fn a_quota_refusal_reads_its_detail() {
        let detail =
            r#"{"workflow":"wf","key":"acme","resource":"max_active_executions","limit":2,"usage":2}"#;
        let e = ClientError::refusal(shard(1), &Owned::Shard, "53400", "m".into(), Some(detail), 1);
        match e {
            ClientError::QuotaExceeded { detail: Some(d), .. } => {
                assert_eq!((d.key.as_str(), d.limit, d.usage), ("acme", 2, 2));
                assert_eq!(d.resource, "max_active_executions");
            }
            other => panic!("{other:?}"),
        }
        let e = ClientError::refusal(shard(1), &Owned::Shard, "53400", "m".into(), Some("not json"), 1);
        assert!(matches!(e, ClientError::QuotaExceeded { detail: None, .. }));
    }

    #[test]
    fn transient_conflicts_report_their_attempts() {
        for code in ["40P01", "40001"] {
            assert!(is_transient(code));
            match ClientError::refusal(shard(2), &Owned::Shard, code, "deadlock".into(), None, 5) {
                ClientError::Conflict { attempts, .. } => assert_eq!(attempts, 5),
                other => panic!("{code}: {other:?}"),
            }
        }
        assert!(!is_transient("55P03"));
    }

    #[test]
    fn retryable_is_what_may_succeed_unchanged_later() {
        assert!(refusal("40P01").is_retryable());
        assert!(refusal("53400").is_retryable());
        assert!(refusal("55006").is_retryable());
        for code in ["55P03", "P0002", "22023", "55000", "XX000"] {
            assert!(!refusal(code).is_retryable(), "{code}");
        }
        let down = ClientError::Shard {
            owned: Owned::Shard,
            error: ShardError::ShortCircuited { shard: shard(3) },
        };
        assert!(down.is_retryable());
        assert_eq!(down.shard(), Some(shard(3)));
        let schema = ClientError::Shard {
            owned: Owned::Shard,
            error: ShardError::IncompatibleSchema {
                shard: shard(3),
                schema: None,
            },
        };
        assert!(!schema.is_retryable());
        assert!(!ClientError::BadRequest("x".into()).is_retryable());
    }

    #[test]
    fn a_missing_role_names_the_role_the_login_and_the_fix() {
        let e = ClientError::MissingRole {
            shard: shard(2),
            role: "sheaf_relay",
            login: "app".into(),
            defined: true,
        };
        assert_eq!(
            e.to_string(),
            "the login role \"app\" on shard 2 lacks role sheaf_relay (GRANT sheaf_relay TO \"app\")"
        );
        assert_eq!(e.shard(), Some(shard(2)));
        assert!(!e.is_retryable());
        let e = ClientError::MissingRole {
            shard: shard(2),
            role: "sheaf_relay",
            login: "a\"b".into(),
            defined: false,
        };
        assert!(
            e.to_string().ends_with("then GRANT sheaf_relay TO \"a\"\"b\")"),
            "{e}"
        );
    }

    #[test]
    fn refusal_display_carries_the_message_not_the_shard() {
        let e = ClientError::refusal(shard(7), &Owned::Shard, "53400", "quota for wf".into(), None, 1);
        assert_eq!(e.to_string(), "quota exceeded: quota for wf");
        let e = ClientError::refusal(shard(7), &Owned::Shard, "XX000", "bug".into(), None, 1);
        assert_eq!(e.to_string(), "database error XX000: bug");
    }
}
