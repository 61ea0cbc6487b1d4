//! The relay's primitives, one typed method per SQL function. The relay
//! ([`crate::relay`]) is built on them; an operator tool may read
//! [`Admin::relay_backlog`](crate::Admin::relay_backlog).

use std::time::{Duration, SystemTime};

use serde::Serialize;
use sheaf_core::state::ExecutionState;

use super::{Admin, Call, ClientError, Owned, Protocol, first_column, single};
use crate::id::ExecutionId;
use crate::json::Json;
use crate::topology::ShardId;

const TAKE: &str = "SELECT child_id, parent_id, target_shard, state, workflow_name, workflow_id, input, \
     close_requested, close_reason, close_delivered, parent_ended, attempts, lease_token \
     FROM sheaf.relay_take($1, make_interval(secs => $2), $3)";
const REPORT: &str = "SELECT sheaf.relay_report($1, $2, $3)";
const START: &str = "SELECT outcome, execution_id FROM sheaf.relay_start_child($1, $2, $3, $4, $5)";
const CLOSE: &str = "SELECT sheaf.relay_close_child($1, $2, $3, $4)";
const BACKLOG: &str = "SELECT target_shard, state, close_requested, rows, failing, oldest, max_attempts, last_error \
     FROM sheaf.relay_backlog()";
/// Whether the login holds the protocol's role. `to_regrole`, not a cast:
/// a shard whose sheaf predates the role answers rather than failing.
const PROTOCOL_ROLE: &str = "SELECT current_user::text, r IS NOT NULL, \
     coalesce(pg_catalog.pg_has_role(current_user, r, 'USAGE'), false) \
     FROM (SELECT pg_catalog.to_regrole('sheaf_relay') AS r) AS role";

/// The role the relay's and rebalancing's steps are granted to.
pub(crate) const PROTOCOL_ROLE_NAME: &str = "sheaf_relay";

/// How a child is closed from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CloseKind {
    /// Cancelled (`CANCELLED`).
    Cancel,
    /// Terminated (`TERMINATED`).
    Terminate,
}

impl CloseKind {
    /// Its name in SQL.
    pub fn as_str(self) -> &'static str {
        match self {
            CloseKind::Cancel => "cancel",
            CloseKind::Terminate => "terminate",
        }
    }
}

/// A lifecycle row a relay holds (`sheaf.relay_take`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RelayRow {
    /// The child.
    pub child_id: ExecutionId,
    /// Its parent, on the shard the row is on.
    pub parent_id: ExecutionId,
    /// The child's shard.
    pub target_shard: ShardId,
    /// `false` until the child runs on its shard.
    pub started: bool,
    /// The child's workflow.
    pub workflow_name: String,
    /// Its workflow id.
    pub workflow_id: String,
    /// Its input, until it is started.
    pub input: Option<Json>,
    /// A close the child is to get.
    pub close_requested: Option<CloseKind>,
    /// Why.
    pub close_reason: Option<String>,
    /// Whether that close has been delivered.
    pub close_delivered: bool,
    /// Whether the parent has ended (the row settles once started and closed).
    pub parent_ended: bool,
    /// Failed edges in a row.
    pub attempts: i32,
    /// Fences this relay's report.
    pub lease_token: i64,
}

/// What an edge did, for `relay_report`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RelayOutcome {
    /// The child runs on its shard.
    Started,
    /// Its (name, workflow id) had this other active run there: not adopted.
    Conflict(ExecutionId),
    /// Its shard refused its start; the parent gets `ChildFailed` with this.
    Refused(String),
    /// The close was delivered (`false`: the child had ended).
    Closed(bool),
    /// The child has ended.
    Ended {
        /// Its terminal state.
        state: ExecutionState,
        /// Its result.
        result: Option<Json>,
        /// Its error.
        error: Option<String>,
    },
    /// The child runs: look again after this long.
    Pending(Duration),
    /// The edge did not get through (backs off and counts an attempt).
    Failed(String),
}

#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
enum Wire<'a> {
    Started(bool),
    Conflict(String),
    Refused(&'a str),
    Closed(bool),
    Ended {
        state: &'a str,
        result: &'a Option<Json>,
        error: &'a Option<String>,
    },
    Pending(f64),
    Failed(&'a str),
}

impl RelayOutcome {
    fn to_json(&self) -> Result<Json, ClientError> {
        let wire = match self {
            RelayOutcome::Started => Wire::Started(true),
            RelayOutcome::Conflict(id) => Wire::Conflict(id.as_uuid().to_string()),
            RelayOutcome::Refused(why) => Wire::Refused(why),
            RelayOutcome::Closed(delivered) => Wire::Closed(*delivered),
            RelayOutcome::Ended { state, result, error } => Wire::Ended {
                state: state.as_str(),
                result,
                error,
            },
            RelayOutcome::Pending(after) => Wire::Pending(after.as_secs_f64()),
            RelayOutcome::Failed(error) => Wire::Failed(error),
        };
        Json::from_serialize(&wire).map_err(|e| ClientError::BadRequest(e.to_string()))
    }
}

/// What the shard did with a reported row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReportStatus {
    /// Still this relay's: go on with its next edge.
    Held,
    /// It waits for its due time.
    Released,
    /// Nothing is left to do: the row is gone.
    Settled,
    /// Not this relay's any more (its lease ran out), or gone; nothing changed.
    Stale,
}

/// What `relay_start_child` found on the child's shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChildStart {
    /// Started now.
    Started,
    /// Started before (a relay's retry).
    Exists,
    /// Its (name, workflow id) has this other active run: not adopted.
    Conflict(ExecutionId),
}

/// One group of a shard's lifecycle rows (`sheaf.relay_backlog`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayBacklog {
    /// The children's shard.
    pub target_shard: ShardId,
    /// `false` for rows whose child has yet to be started.
    pub started: bool,
    /// The close they are to deliver.
    pub close_requested: Option<CloseKind>,
    /// How many rows.
    pub rows: i64,
    /// How many of them failed their last edge.
    pub failing: i64,
    /// The oldest one's creation.
    pub oldest: SystemTime,
    /// The most failed edges in a row.
    pub max_attempts: i32,
    /// The latest error.
    pub last_error: Option<String>,
}

fn close_kind(s: Option<String>) -> Option<CloseKind> {
    match s.as_deref() {
        Some("cancel") => Some(CloseKind::Cancel),
        Some("terminate") => Some(CloseKind::Terminate),
        _ => None,
    }
}

fn shard_of(call: &Call, n: i32) -> Result<ShardId, ClientError> {
    u32::try_from(n)
        .ok()
        .and_then(|n| ShardId::new(n).ok())
        .ok_or_else(|| ClientError::Database {
            shard: call.shard,
            code: None,
            message: format!("the shard returned shard id {n}"),
        })
}

impl Admin<'_> {
    /// `shard`'s lifecycle rows, grouped by target, state and close.
    pub async fn relay_backlog(self, shard: ShardId) -> Result<Vec<RelayBacklog>, ClientError> {
        let (call, rows) = self.client.on_shard(shard, Owned::Shard, BACKLOG, &[]).await?;
        rows.iter()
            .map(|row| {
                let read = || -> Result<(RelayBacklog, i32), tokio_postgres::Error> {
                    let state: String = row.try_get("state")?;
                    Ok((
                        RelayBacklog {
                            target_shard: shard,
                            started: state != "STARTING",
                            close_requested: close_kind(row.try_get("close_requested")?),
                            rows: row.try_get("rows")?,
                            failing: row.try_get("failing")?,
                            oldest: row.try_get("oldest")?,
                            max_attempts: row.try_get("max_attempts")?,
                            last_error: row.try_get("last_error")?,
                        },
                        row.try_get("target_shard")?,
                    ))
                };
                let (mut b, target) = read().map_err(|e| call.error(e, 1))?;
                b.target_shard = shard_of(&call, target)?;
                Ok(b)
            })
            .collect()
    }
}

impl Protocol<'_> {
    /// Leases up to `max_rows` lifecycle rows of `shard` for `lease`: the
    /// due ones, or those of `named` no other relay holds.
    pub async fn relay_take(
        self,
        shard: ShardId,
        max_rows: i32,
        lease: Duration,
        named: Option<&[ExecutionId]>,
    ) -> Result<Vec<RelayRow>, ClientError> {
        let call = Call {
            shard,
            owned: Owned::Shard,
        };
        let named: Option<Vec<uuid::Uuid>> = named.map(|ids| ids.iter().map(ExecutionId::as_uuid).collect());
        let rows = self
            .client
            .query(&call, TAKE, &[&max_rows, &lease.as_secs_f64(), &named])
            .await?;
        rows.iter()
            .map(|row| {
                let read = || -> Result<(RelayRow, i32), tokio_postgres::Error> {
                    let state: String = row.try_get("state")?;
                    Ok((
                        RelayRow {
                            child_id: ExecutionId::from_uuid(row.try_get("child_id")?),
                            parent_id: ExecutionId::from_uuid(row.try_get("parent_id")?),
                            target_shard: shard,
                            started: state != "STARTING",
                            workflow_name: row.try_get("workflow_name")?,
                            workflow_id: row.try_get("workflow_id")?,
                            input: row.try_get("input")?,
                            close_requested: close_kind(row.try_get("close_requested")?),
                            close_reason: row.try_get("close_reason")?,
                            close_delivered: row.try_get("close_delivered")?,
                            parent_ended: row.try_get("parent_ended")?,
                            attempts: row.try_get("attempts")?,
                            lease_token: row.try_get("lease_token")?,
                        },
                        row.try_get("target_shard")?,
                    ))
                };
                let (mut r, target) = read().map_err(|e| call.error(e, 1))?;
                r.target_shard = shard_of(&call, target)?;
                Ok(r)
            })
            .collect()
    }

    /// Records what an edge did for a row of `shard` held under `lease_token`.
    pub async fn relay_report(
        self,
        shard: ShardId,
        child: ExecutionId,
        lease_token: i64,
        outcome: &RelayOutcome,
    ) -> Result<ReportStatus, ClientError> {
        let call = Call {
            shard,
            owned: Owned::Execution(child),
        };
        let outcome = outcome.to_json()?;
        let rows = self
            .client
            .query(&call, REPORT, &[&child.as_uuid(), &lease_token, &outcome])
            .await?;
        let status: String = first_column(&call, &rows)?;
        Ok(match status.as_str() {
            "held" => ReportStatus::Held,
            "released" => ReportStatus::Released,
            "settled" => ReportStatus::Settled,
            _ => ReportStatus::Stale,
        })
    }

    /// Starts `child` of `parent` on the child's shard (its id routes
    /// there), idempotent on the child's id.
    pub async fn relay_start_child(
        self,
        child: ExecutionId,
        parent: ExecutionId,
        name: &str,
        workflow_id: &str,
        input: &Json,
    ) -> Result<ChildStart, ClientError> {
        let call = self.client.by_execution(child);
        let rows = self
            .client
            .query(
                &call,
                START,
                &[&child.as_uuid(), &parent.as_uuid(), &name, &workflow_id, input],
            )
            .await?;
        let row = single(&call, &rows)?;
        let read = || -> Result<(String, uuid::Uuid), tokio_postgres::Error> {
            Ok((row.try_get("outcome")?, row.try_get("execution_id")?))
        };
        let (outcome, id) = read().map_err(|e| call.error(e, 1))?;
        Ok(match outcome.as_str() {
            "started" => ChildStart::Started,
            "exists" => ChildStart::Exists,
            _ => ChildStart::Conflict(ExecutionId::from_uuid(id)),
        })
    }

    /// Cancels or terminates `child` of `parent` on the child's shard;
    /// `false` if it had ended.
    pub async fn relay_close_child(
        self,
        child: ExecutionId,
        parent: ExecutionId,
        how: CloseKind,
        reason: Option<&str>,
    ) -> Result<bool, ClientError> {
        let call = self.client.by_execution(child);
        let rows = self
            .client
            .query(
                &call,
                CLOSE,
                &[&child.as_uuid(), &parent.as_uuid(), &how.as_str(), &reason],
            )
            .await?;
        first_column(&call, &rows)
    }

    /// Whether this client's login on `shard` may run the protocol: the
    /// relay and rebalance auto-resume need `sheaf_relay` (directly or
    /// through a role that has it, as `sheaf_admin` does; a superuser has
    /// every role). [`ClientError::MissingRole`] when it does not.
    pub async fn check_protocol_role(self, shard: ShardId) -> Result<(), ClientError> {
        let (call, rows) = self
            .client
            .on_shard(shard, Owned::Shard, PROTOCOL_ROLE, &[])
            .await?;
        let row = single(&call, &rows)?;
        let read = || -> Result<(String, bool, bool), tokio_postgres::Error> {
            Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
        };
        let (login, defined, held) = read().map_err(|e| call.error(e, 1))?;
        if held {
            return Ok(());
        }
        Err(ClientError::MissingRole {
            shard,
            role: PROTOCOL_ROLE_NAME,
            login,
            defined,
        })
    }
}
