//! Signals and cancels addressed by business key (workflow name, workflow
//! id): from inside a workflow through its shard's outbox
//! ([`Client::signal_external`], [`Client::cancel_external`], delivered by
//! the relay), or directly for a caller outside one
//! ([`Client::signal_by_key`], [`Client::cancel_by_key`]). Either way the
//! key is resolved over every readable shard ([`Client::find_execution`]'s
//! rules): an answer a shard could not give is `Indeterminate`, never
//! "unknown".

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use sheaf_core::state::ExecutionState;

use super::relay::ReportStatus;
use super::{Admin, Client, ClientError, Owned, Protocol, first_column};
use crate::id::ExecutionId;
use crate::json::Json;
use crate::topology::ShardId;
use crate::words::{word, words};

const SIGNAL_EXTERNAL: &str = "SELECT sheaf.signal_external($1, $2, $3, $4, $5, \
     jsonb_strip_nulls(jsonb_build_object('signal_id', $6::text)))";
const CANCEL_EXTERNAL: &str = "SELECT sheaf.cancel_external($1, $2, $3, $4, \
     jsonb_strip_nulls(jsonb_build_object('signal_id', $5::text)))";
const TAKE: &str = "SELECT outbox_id, sender_id, kind, state, workflow_name, workflow_id, signal, payload, reason, \
     delivered_to, attempts, indeterminate, lease_token \
     FROM sheaf.outbox_take($1, make_interval(secs => $2))";
const REPORT: &str = "SELECT sheaf.outbox_report($1, $2, $3)";
const BACKLOG: &str = "SELECT kind, state, rows, failing, indeterminate, oldest, indeterminate_since, \
     max_attempts, last_error FROM sheaf.outbox_backlog()";

/// What an outbox row carries.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum OutboxKind {
    /// A signal: its name and payload.
    Signal {
        /// The signal's name.
        signal: String,
        /// Its payload.
        payload: Json,
    },
    /// A cancel, and why.
    Cancel {
        /// The reason the cancel records.
        reason: Option<String>,
    },
}

impl OutboxKind {
    /// `signal` or `cancel`.
    pub fn as_str(&self) -> &'static str {
        match self {
            OutboxKind::Signal { .. } => "signal",
            OutboxKind::Cancel { .. } => "cancel",
        }
    }
}

/// An outbox row a relay holds (`sheaf.outbox_take`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct OutboxRow {
    /// The row's id (the signal id its delivery carries).
    pub outbox_id: uuid::Uuid,
    /// The execution that sent it.
    pub sender: ExecutionId,
    /// What it carries.
    pub kind: OutboxKind,
    /// The addressed workflow.
    pub workflow_name: String,
    /// The addressed workflow id.
    pub workflow_id: String,
    /// The run a cancel ended, while a later fan-out is to confirm it.
    pub confirming: Option<ExecutionId>,
    /// Failed deliveries in a row.
    pub attempts: i32,
    /// Resolutions in a row that a shard could not answer.
    pub indeterminate: i32,
    /// Fences this relay's report.
    pub lease_token: i64,
}

/// What a relay did with an outbox row, for `outbox_report`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum OutboxOutcome {
    /// The signal is in this run's history, on this shard (where the run
    /// lives, not the shard its id names).
    Delivered(ExecutionId, ShardId),
    /// The cancel ended this live run, on this shard; a later fan-out confirms.
    Cancelled(ExecutionId, ShardId),
    /// A complete fan-out found only this ended run, on this shard.
    Ended(ExecutionId, ShardId, ExecutionState),
    /// A confirming cancel's later fan-out was complete and found no live run.
    Confirmed,
    /// A complete fan-out found no run of the key.
    Unknown,
    /// A shard could not be inspected: retried, never "unknown".
    Indeterminate(String),
    /// The delivery did not get through (backs off).
    Failed(String),
}

#[derive(Serialize)]
struct At<'a> {
    execution_id: String,
    shard: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
enum Wire<'a> {
    Delivered(At<'a>),
    Cancelled(At<'a>),
    Ended(At<'a>),
    Confirmed(bool),
    Unknown(bool),
    Indeterminate(&'a str),
    Failed(&'a str),
}

/// The run as a report names it: its id and the shard where it was found
/// (its residence; the id's shard is only where it was born).
fn at(id: ExecutionId, shard: ShardId, state: Option<&str>) -> At<'_> {
    At {
        execution_id: id.as_uuid().to_string(),
        shard: shard.get(),
        state,
    }
}

impl OutboxOutcome {
    fn to_json(&self) -> Result<Json, ClientError> {
        let wire = match self {
            OutboxOutcome::Delivered(id, shard) => Wire::Delivered(at(*id, *shard, None)),
            OutboxOutcome::Cancelled(id, shard) => Wire::Cancelled(at(*id, *shard, None)),
            OutboxOutcome::Ended(id, shard, state) => Wire::Ended(at(*id, *shard, Some(state.as_str()))),
            OutboxOutcome::Confirmed => Wire::Confirmed(true),
            OutboxOutcome::Unknown => Wire::Unknown(true),
            OutboxOutcome::Indeterminate(why) => Wire::Indeterminate(why),
            OutboxOutcome::Failed(why) => Wire::Failed(why),
        };
        Json::from_serialize(&wire).map_err(|e| ClientError::BadRequest(e.to_string()))
    }

    /// Its name (`sheaf_outbox_deliveries_total`'s `outcome`).
    pub fn label(&self) -> &'static str {
        match self {
            OutboxOutcome::Delivered(..) => "delivered",
            OutboxOutcome::Cancelled(..) => "cancelled",
            OutboxOutcome::Ended(..) => "ended",
            OutboxOutcome::Confirmed => "confirmed",
            OutboxOutcome::Unknown => "unknown",
            OutboxOutcome::Indeterminate(_) => "indeterminate",
            OutboxOutcome::Failed(_) => "failed",
        }
    }
}

words! {
    /// What an outbox row sends to another execution.
    pub enum ExternalAction {
        /// A signal (`sheaf.signal_external`).
        Signal = "signal",
        /// A cancel (`sheaf.cancel_external`).
        Cancel = "cancel",
    }
}

words! {
    /// Where an undelivered outbox row stands.
    pub enum OutboxState {
        /// Not delivered yet.
        Pending = "PENDING",
        /// A cancel delivered, waiting for a later complete fan-out to
        /// find no live run of the key before it is recorded.
        Confirming = "CONFIRMING",
    }
}

/// One group of a shard's undelivered outbox rows (`sheaf.outbox_backlog`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxBacklog {
    /// What the rows send.
    pub kind: ExternalAction,
    /// Where they stand.
    pub state: OutboxState,
    /// How many rows.
    pub rows: i64,
    /// How many failed their last delivery.
    pub failing: i64,
    /// How many a shard could not be inspected for, last time.
    pub indeterminate: i64,
    /// The oldest one's creation.
    pub oldest: SystemTime,
    /// Since when the longest-indeterminate row has been so.
    pub indeterminate_since: Option<SystemTime>,
    /// The most failed deliveries in a row.
    pub max_attempts: i32,
    /// The latest error.
    pub last_error: Option<String>,
}

/// What a signal or cancel addressed by business key did
/// ([`Client::signal_by_key`], [`Client::cancel_by_key`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum ByKey {
    /// Delivered to (a signal) or ended (a cancel) the key's live run.
    /// `complete` is `false` when a shard could not answer: the run found
    /// is live, but that shard might hold a second live run of the key.
    Delivered {
        /// The run.
        execution_id: ExecutionId,
        /// Its shard.
        shard: ShardId,
        /// Whether every readable shard answered.
        complete: bool,
    },
    /// Every readable shard answered, and the key's latest run had ended:
    /// nothing was delivered.
    Ended {
        /// That run.
        execution_id: ExecutionId,
        /// How it ended.
        state: ExecutionState,
    },
    /// Every readable shard answered, and none has a run of the key.
    Unknown,
    /// No live run was found and some shard could not answer: it may hold
    /// one. Nothing was delivered; ask again.
    Indeterminate {
        /// The shards that could not answer, and why.
        unavailable_shards: BTreeMap<ShardId, ClientError>,
    },
}

fn read_kind(
    kind: &str,
    signal: Option<String>,
    payload: Option<Json>,
    reason: Option<String>,
) -> Option<OutboxKind> {
    match kind {
        "signal" => Some(OutboxKind::Signal {
            signal: signal?,
            payload: payload.unwrap_or_else(Json::null),
        }),
        "cancel" => Some(OutboxKind::Cancel { reason }),
        _ => None,
    }
}

impl Client {
    /// Sends `signal` with `payload` from execution `sender` (active) to
    /// the run of (`name`, `workflow_id`) wherever it lives: an outbox row
    /// on the sender's shard, delivered by the relay; the outcome reaches
    /// the sender's history (`ExternalSignalDelivered`,
    /// `ExternalSignalFailed`, `ExternalTargetUnknown`) and wakes it. A
    /// `signal_id` deduplicates a retried handler. The outbox row's id.
    pub async fn signal_external(
        &self,
        sender: ExecutionId,
        name: &str,
        workflow_id: &str,
        signal: &str,
        payload: impl Into<Json>,
        signal_id: Option<&str>,
    ) -> Result<uuid::Uuid, ClientError> {
        let call = self.by_execution(sender);
        let payload = payload.into();
        let rows = self
            .query(
                &call,
                SIGNAL_EXTERNAL,
                &[
                    &sender.as_uuid(),
                    &name,
                    &workflow_id,
                    &signal,
                    &payload,
                    &signal_id,
                ],
            )
            .await?;
        first_column(&call, &rows)
    }

    /// Cancels the run of (`name`, `workflow_id`) for execution `sender`,
    /// through its shard's outbox: `ExternalCancelDelivered` (or
    /// `ExternalTargetUnknown`) reaches the sender's history. A cancel that
    /// ended a live run reports after a later fan-out finds no other live
    /// run of the key. The outbox row's id.
    pub async fn cancel_external(
        &self,
        sender: ExecutionId,
        name: &str,
        workflow_id: &str,
        reason: Option<&str>,
        signal_id: Option<&str>,
    ) -> Result<uuid::Uuid, ClientError> {
        let call = self.by_execution(sender);
        let rows = self
            .query(
                &call,
                CANCEL_EXTERNAL,
                &[&sender.as_uuid(), &name, &workflow_id, &reason, &signal_id],
            )
            .await?;
        first_column(&call, &rows)
    }

    /// Delivers `signal` to the live run of (`name`, `workflow_id`),
    /// wherever it lives, resolving the key over every readable shard (no
    /// first hit wins). `signal_id` deduplicates a retry at the run.
    /// `Indeterminate` when no live run was found and a shard could not
    /// answer: nothing is guessed.
    pub async fn signal_by_key(
        &self,
        name: &str,
        workflow_id: &str,
        signal: &str,
        payload: impl Into<Json>,
        signal_id: Option<&str>,
    ) -> Result<ByKey, ClientError> {
        let payload = payload.into();
        self.by_key(name, workflow_id, |id| {
            let payload = payload.clone();
            async move { self.signal(id, signal, payload, signal_id).await }
        })
        .await
    }

    /// Cancels the live run of (`name`, `workflow_id`), wherever it lives,
    /// resolved as [`Client::signal_by_key`] resolves it. A fan-out is not
    /// a snapshot: a run of the key started on a shard already read is not
    /// seen (the relay's `cancel_external` confirms with a later fan-out; a
    /// caller here asks again).
    pub async fn cancel_by_key(
        &self,
        name: &str,
        workflow_id: &str,
        reason: Option<&str>,
    ) -> Result<ByKey, ClientError> {
        self.by_key(name, workflow_id, |id| async move {
            self.cancel_execution(id, reason).await
        })
        .await
    }

    /// Resolves the key and applies `deliver` to its live run (`false`:
    /// it ended meanwhile, and the key is resolved again, a few times).
    async fn by_key<F, Fut>(&self, name: &str, workflow_id: &str, deliver: F) -> Result<ByKey, ClientError>
    where
        F: Fn(ExecutionId) -> Fut,
        Fut: std::future::Future<Output = Result<bool, ClientError>>,
    {
        const TRIES: u32 = 3;
        // A run in the middle of a move (a seal and a staged copy, no live
        // copy yet) is alive: wait for its activation, a few times.
        const MOVING_TRIES: u32 = 6;
        let mut attempt = 0;
        let mut moving = 0;
        loop {
            attempt += 1;
            let (best, failed) = self.resolve_key(name, workflow_id).await?;
            let best = best.map(|(run, _)| run);
            match best {
                Some(e) if e.state.is_migrating() => {
                    moving += 1;
                    if moving == MOVING_TRIES {
                        return Err(ClientError::Conflict {
                            shard: e.shard,
                            attempts: MOVING_TRIES,
                            message: format!(
                                "the run {} is moving between shards and was not live yet",
                                e.execution_id
                            ),
                        });
                    }
                    attempt -= 1;
                    tokio::time::sleep(std::time::Duration::from_millis(50 << moving)).await;
                }
                Some(e) if e.state.is_active() => {
                    if deliver(e.execution_id).await? {
                        return Ok(ByKey::Delivered {
                            execution_id: e.execution_id,
                            shard: e.shard,
                            complete: failed.is_empty(),
                        });
                    }
                    if attempt == TRIES {
                        return Err(ClientError::Conflict {
                            shard: e.shard,
                            attempts: TRIES,
                            message: format!("the run {} had ended each time it was found", e.execution_id),
                        });
                    }
                }
                _ if !failed.is_empty() => {
                    return Ok(ByKey::Indeterminate {
                        unavailable_shards: failed,
                    });
                }
                // An ended run may have got this delivery before it ended
                // (a retry with the same signal id reads as delivered).
                Some(e) => {
                    if deliver(e.execution_id).await? {
                        return Ok(ByKey::Delivered {
                            execution_id: e.execution_id,
                            shard: e.shard,
                            complete: true,
                        });
                    }
                    return Ok(ByKey::Ended {
                        execution_id: e.execution_id,
                        state: e.state,
                    });
                }
                None => return Ok(ByKey::Unknown),
            }
        }
    }
}

impl Admin<'_> {
    /// `shard`'s undelivered outbox rows, grouped by kind and state.
    pub async fn outbox_backlog(self, shard: ShardId) -> Result<Vec<OutboxBacklog>, ClientError> {
        let (call, rows) = self.client.on_shard(shard, Owned::Shard, BACKLOG, &[]).await?;
        rows.iter()
            .map(|row| {
                let read = || -> Result<OutboxBacklog, tokio_postgres::Error> {
                    Ok(OutboxBacklog {
                        kind: word(row, "kind")?,
                        state: word(row, "state")?,
                        rows: row.try_get("rows")?,
                        failing: row.try_get("failing")?,
                        indeterminate: row.try_get("indeterminate")?,
                        oldest: row.try_get("oldest")?,
                        indeterminate_since: row.try_get("indeterminate_since")?,
                        max_attempts: row.try_get("max_attempts")?,
                        last_error: row.try_get("last_error")?,
                    })
                };
                read().map_err(|e| call.error(e, 1))
            })
            .collect()
    }
}

impl Protocol<'_> {
    /// Leases up to `max_rows` due outbox rows of `shard` for `lease`.
    pub async fn outbox_take(
        self,
        shard: ShardId,
        max_rows: i32,
        lease: Duration,
    ) -> Result<Vec<OutboxRow>, ClientError> {
        let (call, rows) = self
            .client
            .on_shard(shard, Owned::Shard, TAKE, &[&max_rows, &lease.as_secs_f64()])
            .await?;
        rows.iter()
            .map(|row| {
                let read = || -> Result<(Option<OutboxRow>, String), tokio_postgres::Error> {
                    let kind: String = row.try_get("kind")?;
                    let carried = read_kind(
                        &kind,
                        row.try_get("signal")?,
                        row.try_get("payload")?,
                        row.try_get("reason")?,
                    );
                    let state: String = row.try_get("state")?;
                    let delivered: Option<uuid::Uuid> = row.try_get("delivered_to")?;
                    let Some(carried) = carried else {
                        return Ok((None, kind));
                    };
                    Ok((
                        Some(OutboxRow {
                            outbox_id: row.try_get("outbox_id")?,
                            sender: ExecutionId::from_uuid(row.try_get("sender_id")?),
                            kind: carried,
                            workflow_name: row.try_get("workflow_name")?,
                            workflow_id: row.try_get("workflow_id")?,
                            confirming: delivered
                                .filter(|_| state == "CONFIRMING")
                                .map(ExecutionId::from_uuid),
                            attempts: row.try_get("attempts")?,
                            indeterminate: row.try_get("indeterminate")?,
                            lease_token: row.try_get("lease_token")?,
                        }),
                        kind,
                    ))
                };
                match read().map_err(|e| call.error(e, 1))? {
                    (Some(r), _) => Ok(r),
                    (None, kind) => Err(ClientError::Database {
                        shard,
                        code: None,
                        message: format!(
                            "the shard returned an outbox row of kind {kind:?} without its signal"
                        ),
                    }),
                }
            })
            .collect()
    }

    /// Records what the relay did for outbox row `outbox_id` of `shard`,
    /// held under `lease_token`.
    pub async fn outbox_report(
        self,
        shard: ShardId,
        outbox_id: uuid::Uuid,
        lease_token: i64,
        outcome: &OutboxOutcome,
    ) -> Result<ReportStatus, ClientError> {
        let outcome = outcome.to_json()?;
        let (call, rows) = self
            .client
            .on_shard(shard, Owned::Shard, REPORT, &[&outbox_id, &lease_token, &outcome])
            .await?;
        let status: String = first_column(&call, &rows)?;
        Ok(match status.as_str() {
            "released" => ReportStatus::Released,
            "settled" => ReportStatus::Settled,
            _ => ReportStatus::Stale,
        })
    }
}
