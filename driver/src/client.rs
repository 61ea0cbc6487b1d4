//! `Client`: one handle on N shard databases, used as one queue.
//!
//! Starts are placed by the router and get an id minted for the chosen shard,
//! so every later call about that execution (or one of its tasks) goes
//! straight to `id.route()` with no lookup. Nothing ever falls back to
//! another shard: a shard that cannot serve fails the call loudly, naming
//! that one shard and the execution, task or workflow it owns.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde_json::Value;
use sheaf_core::sqlstate;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::id::{ExecutionId, IdError};
use crate::metrics::{Metrics, Outcome};
use crate::pool::{PoolOptions, ShardError, ShardPools};
use crate::router::{Placement, RouteError};
use crate::status::{TopologyStatus, topology_status};
use crate::topology::{ShardId, Topology};

/// Task ids share the execution id layout (shard prefix first), so they
/// route exactly like execution ids.
pub type TaskId = ExecutionId;

/// How many times one call runs before a transient conflict is reported.
const MAX_ATTEMPTS: u32 = 5;
/// The first backoff after a transient conflict; it doubles per attempt.
const BACKOFF_BASE: Duration = Duration::from_millis(10);
/// `serialization_failure`: not raised by sheaf itself, but by PostgreSQL
/// when a caller runs the driver's sessions at a stricter isolation level.
const SERIALIZATION_FAILURE: &str = "40001";

const START: &str = "SELECT execution_id, created, superseded FROM sheaf.start_workflow($1, $2, $3, $4)";
const GET_EXECUTION: &str = "SELECT execution_id, workflow_name, workflow_id, state, input, result, error, \
     concurrency_key, quota_key, history_bytes, created_at, closed_at, wake_at \
     FROM sheaf.get_execution($1)";
const CANCEL_EXECUTION: &str = "SELECT sheaf.cancel_execution($1, $2)";
const COMPLETE_EXECUTION: &str = "SELECT sheaf.complete_execution($1, $2)";
const COMPLETE: &str = "SELECT sheaf.complete($1, $2, $3)";
const FAIL: &str = "SELECT retry_at, dead_lettered FROM sheaf.fail($1, $2, $3, make_interval(secs => $4))";
const HEARTBEAT: &str = "SELECT sheaf.heartbeat($1, $2)";
const FAIL_EXECUTION: &str = "SELECT sheaf.fail_execution($1, $2)";
const ENQUEUE: &str = "SELECT sheaf.enqueue($1, $2, $3)";
const CLAIM: &str = "SELECT task_id, token, payload, attempt, execution_id, concurrency_key, kind \
     FROM sheaf.claim($1, $2, $3, make_interval(secs => $4))";
const RELEASE: &str = "SELECT sheaf.release($1, $2)";
const SNOOZE: &str = "SELECT sheaf.snooze($1, $2, make_interval(secs => $3))";
const DEAD_LETTER: &str = "SELECT sheaf.dead_letter($1, $2, $3)";
const COMPLETE_TASK_AND_EXECUTION: &str = "SELECT sheaf.complete_task_and_execution($1, $2, $3)";
const COMPLETE_TASK_AND_FAIL_EXECUTION: &str = "SELECT sheaf.complete_task_and_fail_execution($1, $2, $3)";
const WORKER_HEARTBEAT: &str = "SELECT sheaf.worker_heartbeat($1, $2)";
const WORKER_DEREGISTER: &str = "SELECT sheaf.worker_deregister($1)";
const MAINTAIN: &str = "SELECT sheaf.maintain()";

/// A task enqueued on a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    pub task_id: TaskId,
    pub shard: ShardId,
}

/// A task handed out by `claim`, under a lease fenced by `token`.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedTask {
    pub task_id: TaskId,
    pub token: i64,
    pub payload: Value,
    /// 1 on the first run.
    pub attempt: i32,
    pub execution_id: Option<ExecutionId>,
    pub concurrency_key: Option<String>,
    /// `activity` or `workflow`.
    pub kind: String,
    pub queue: String,
    /// The shard it was claimed from (its id routes there too).
    pub shard: ShardId,
}

/// A start the shard accepted (or attached to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub execution_id: ExecutionId,
    /// The shard that holds the execution.
    pub shard: ShardId,
    /// `false`: (name, workflow id) already had an active execution, and this
    /// is it; nothing was written.
    pub created: bool,
    /// The executions this start cancelled (`cancel_running`, latest wins).
    pub superseded: Vec<ExecutionId>,
}

/// One execution, as `sheaf.get_execution` returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    pub execution_id: ExecutionId,
    /// The shard that answered (the one `execution_id` routes to).
    pub shard: ShardId,
    pub workflow_name: String,
    pub workflow_id: String,
    /// `RUNNING`, `SUSPENDED`, `PAUSED`, `COMPLETED`, … (see the README).
    pub state: String,
    pub input: Value,
    pub result: Option<Value>,
    pub error: Option<String>,
    pub concurrency_key: Option<String>,
    pub quota_key: Option<String>,
    pub history_bytes: i64,
    pub created_at: SystemTime,
    pub closed_at: Option<SystemTime>,
    pub wake_at: Option<SystemTime>,
}

/// What `fail` did with a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailOutcome {
    /// When the task runs again; `None` once it is dead-lettered.
    pub retry_at: Option<SystemTime>,
    pub dead_lettered: bool,
}

/// The work a failed call was about: what the shard owns that is now
/// unavailable. Named in fail-loud errors so an operator knows what is
/// affected, never as a list of shards or residency keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owned {
    Workflow {
        name: String,
        workflow_id: String,
    },
    Execution(ExecutionId),
    Task(TaskId),
    Queue(String),
    /// Shard-wide housekeeping (worker registry, maintenance).
    Shard,
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
            Owned::Shard => write!(f, "shard maintenance"),
        }
    }
}

/// Why a client call failed. The SQL refusals carry the shard's message
/// (sheaf's messages never list shards or residency keys) and keep the shard
/// that refused as a field, for logs. `Display` never lists the shard set or
/// residency keys; [`RouteError::operator_detail`] has the routing detail.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The start could not be placed (a bad pin, a drained fleet).
    #[error(transparent)]
    Route(#[from] RouteError),
    /// The one shard that owns the work cannot serve it; nothing was tried
    /// elsewhere. `error` names the shard and what to do.
    #[error("cannot serve {owned}: {error}")]
    Shard { owned: Owned, error: ShardError },
    /// 53400: a quota refused the start; nothing was written.
    #[error("quota exceeded: {message}")]
    QuotaExceeded { shard: ShardId, message: String },
    /// 55006: the concurrency gate (`on_conflict: reject`) refused the start.
    #[error("the concurrency gate refused the start: {message}")]
    GateRejected { shard: ShardId, message: String },
    /// 55P03: the fencing token is no longer current (the lease was lost, or
    /// the task already finished; for a mutex, the owner is not the holder).
    /// Nothing changed.
    #[error("stale token: {message}")]
    StaleToken { shard: ShardId, message: String },
    /// P0002: no execution with this id on the shard it routes to.
    #[error("unknown execution: {message}")]
    UnknownExecution { shard: ShardId, message: String },
    /// 22023 / 22004: an argument is malformed, out of range, or NULL.
    #[error("invalid argument: {message}")]
    InvalidArgument { shard: ShardId, message: String },
    /// 55000: the execution or shard is not in a state that allows the call.
    #[error("not allowed in the current state: {message}")]
    WrongState { shard: ShardId, message: String },
    /// 40P01 / 40001 on every attempt. Each attempt rolled back whole, so
    /// nothing changed and the caller may retry later.
    #[error(
        "gave up after {attempts} attempts that each hit a transient conflict ({message}); nothing changed, retry later"
    )]
    Conflict {
        shard: ShardId,
        attempts: u32,
        message: String,
    },
    /// Anything else the shard raised (`code` is its SQLSTATE), or a reply
    /// the driver could not read (`code` is `None`).
    #[error("database error{}: {message}", code_suffix(.code))]
    Database {
        shard: ShardId,
        code: Option<String>,
        message: String,
    },
    /// No writable shard could take a task that may go anywhere; `last` is
    /// why the last one tried could not (it names that shard only).
    #[error("no writable shard can take the task now (the last one tried: {last})")]
    NoShardAvailable { queue: String, last: String },
    /// The local clock cannot be encoded in an id.
    #[error("cannot mint an execution id: {0}")]
    Id(#[from] IdError),
    /// The driver refused the request before sending it anywhere.
    #[error("invalid request: {0}")]
    BadRequest(String),
}

impl ClientError {
    /// The shard's refusal for `code`, after `attempts` runs of the call.
    fn refusal(shard: ShardId, code: &str, message: String, attempts: u32) -> ClientError {
        match code {
            sqlstate::CONFIGURATION_LIMIT_EXCEEDED => ClientError::QuotaExceeded { shard, message },
            sqlstate::OBJECT_IN_USE => ClientError::GateRejected { shard, message },
            sqlstate::LOCK_NOT_AVAILABLE => ClientError::StaleToken { shard, message },
            sqlstate::NO_DATA_FOUND => ClientError::UnknownExecution { shard, message },
            sqlstate::INVALID_PARAMETER_VALUE | sqlstate::NULL_VALUE_NOT_ALLOWED => {
                ClientError::InvalidArgument { shard, message }
            }
            sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE => ClientError::WrongState { shard, message },
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
}

/// " <code>" when there is one, for [`ClientError::Database`]'s message.
fn code_suffix(code: &Option<String>) -> String {
    code.as_deref().map(|c| format!(" {c}")).unwrap_or_default()
}

/// Whether a SQLSTATE means "rolled back whole, run it again": every client
/// call is one statement in its own transaction, so a retry is the same
/// request, not a second one (a retried start attaches, with the same id).
fn is_transient(code: &str) -> bool {
    code == sqlstate::DEADLOCK_DETECTED || code == SERIALIZATION_FAILURE
}

/// The pause before attempt `attempt + 1`: doubling from
/// [`BACKOFF_BASE`], with jitter in its upper half so two sides of a
/// deadlock do not collide again in lockstep.
fn backoff(attempt: u32) -> Duration {
    let full = BACKOFF_BASE.as_micros() as u64 * (1 << attempt.saturating_sub(1).min(10));
    let random = uuid::Uuid::new_v4().as_u64_pair().1;
    Duration::from_micros(full / 2 + random % (full / 2 + 1))
}

/// One call's destination and what it is about, for its errors.
struct Call {
    shard: ShardId,
    owned: Owned,
}

impl Call {
    /// A failed statement or an unreadable reply, as a typed error. A
    /// connection lost mid-call is the shard being unreachable.
    fn error(&self, e: tokio_postgres::Error, attempts: u32) -> ClientError {
        if let Some(db) = e.as_db_error() {
            return ClientError::refusal(self.shard, db.code().code(), db.message().to_owned(), attempts);
        }
        if lost_connection(&e) {
            return self.unavailable(ShardError::Unreachable {
                shard: self.shard,
                cause: e.to_string(),
            });
        }
        ClientError::Database {
            shard: self.shard,
            code: None,
            message: e.to_string(),
        }
    }

    fn unavailable(&self, error: ShardError) -> ClientError {
        ClientError::Shard {
            owned: self.owned.clone(),
            error,
        }
    }
}

/// Closed, or failed on the socket: the shard went away, not the query.
fn lost_connection(e: &tokio_postgres::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if cause.is::<std::io::Error>() {
            return true;
        }
        source = cause.source();
    }
    e.is_closed()
}

/// N shard databases as one queue: routes, mints ids, and maps refusals to
/// [`ClientError`]. Share it (it is `Send + Sync`) behind an `Arc`.
pub struct Client {
    topology: Topology,
    pools: ShardPools,
    metrics: Metrics,
    /// Claim loops running per shard in this process, for the pool-size check.
    scanners: std::sync::Mutex<std::collections::BTreeMap<ShardId, usize>>,
}

impl Client {
    /// One pool per shard of `topology`. No connection is opened yet; a bad
    /// connection string is an error now, naming its shard.
    pub fn new(topology: Topology, options: PoolOptions) -> Result<Client, ShardError> {
        let pools = ShardPools::new(&topology, options)?;
        Ok(Client {
            topology,
            pools,
            metrics: Metrics::new(),
            scanners: Default::default(),
        })
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The Prometheus text exposition of this client's metrics, with the
    /// breaker states read now.
    pub fn metrics_text(&self) -> String {
        for shard in self.topology.shards() {
            if let Some(state) = self.pools.breaker_state(shard.id) {
                self.metrics.breaker(shard.id, state);
            }
        }
        self.metrics.render()
    }

    /// Probes every shard at once (a fresh connection each, bounded by
    /// `timeout`): reachability, identity, versions, roles, breaker, live
    /// workers and stranded work. Also refreshes `sheaf_shard_up`.
    pub async fn topology_status(&self, timeout: Duration) -> TopologyStatus {
        let status = topology_status(&self.topology, &self.pools, timeout).await;
        for shard in &status.shards {
            self.metrics.probed(
                shard.probe.shard,
                shard.probe.reachable,
                shard.probe.reachable.then(|| shard.stranded_ready()),
            );
            self.metrics.breaker(shard.probe.shard, shard.breaker);
        }
        status
    }

    /// Counts one more claim loop on `shard`; returns how many there are now.
    pub(crate) fn add_scanner(&self, shard: ShardId) -> usize {
        let mut scanners = self.scanners.lock().unwrap_or_else(|p| p.into_inner());
        let n = scanners.entry(shard).or_default();
        *n += 1;
        *n
    }

    pub(crate) fn remove_scanner(&self, shard: ShardId) {
        let mut scanners = self.scanners.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = scanners.get_mut(&shard) {
            *n = n.saturating_sub(1);
        }
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The pools, for breaker states and status probes.
    pub fn pools(&self) -> &ShardPools {
        &self.pools
    }

    /// Starts `name` with `workflow_id`, or attaches to its active execution
    /// (`created = false`). The id is minted here for the placed shard, so
    /// later calls route by id alone.
    pub async fn start_workflow(
        &self,
        name: &str,
        workflow_id: &str,
        input: Value,
        placement: Placement,
    ) -> Result<Started, ClientError> {
        self.start(name, workflow_id, input, placement, None).await
    }

    /// [`Client::start_workflow`] on behalf of an ambient `tenant`: an
    /// `Auto` placement then routes by `tenant__<tenant>__<name>`, so all of
    /// a tenant's executions of one workflow share a shard; explicit routing
    /// keys and pins still win.
    pub async fn start_workflow_for_tenant(
        &self,
        tenant: &str,
        name: &str,
        workflow_id: &str,
        input: Value,
        placement: Placement,
    ) -> Result<Started, ClientError> {
        self.start(name, workflow_id, input, placement, Some(tenant))
            .await
    }

    async fn start(
        &self,
        name: &str,
        workflow_id: &str,
        input: Value,
        placement: Placement,
        tenant: Option<&str>,
    ) -> Result<Started, ClientError> {
        let shard = self.topology.place(name, workflow_id, &placement, tenant)?;
        // Minted once: a retried attempt carries the same id.
        let execution_id = ExecutionId::mint(shard)?;
        let opts = serde_json::json!({ "execution_id": execution_id.to_string() });
        let call = Call {
            shard,
            owned: Owned::Workflow {
                name: name.to_owned(),
                workflow_id: workflow_id.to_owned(),
            },
        };
        let rows = self
            .query(&call, START, &[&name, &workflow_id, &input, &opts])
            .await?;
        let row = single(&call, &rows)?;
        let read = || -> Result<Started, tokio_postgres::Error> {
            Ok(Started {
                execution_id: ExecutionId::from_uuid(row.try_get("execution_id")?),
                shard,
                created: row.try_get("created")?,
                superseded: row
                    .try_get::<_, Vec<uuid::Uuid>>("superseded")?
                    .into_iter()
                    .map(ExecutionId::from_uuid)
                    .collect(),
            })
        };
        read().map_err(|e| call.error(e, 1))
    }

    /// The execution, from the shard its id routes to; `None` if that shard
    /// has no such execution.
    pub async fn get_execution(&self, id: ExecutionId) -> Result<Option<Execution>, ClientError> {
        let call = self.by_id(id, Owned::Execution(id));
        let rows = self.query(&call, GET_EXECUTION, &[&id.as_uuid()]).await?;
        rows.first()
            .map(|row| execution_from_row(row, call.shard))
            .transpose()
            .map_err(|e| call.error(e, 1))
    }

    /// Cancels an execution; `false` if it had already ended.
    pub async fn cancel_execution(&self, id: ExecutionId, reason: Option<&str>) -> Result<bool, ClientError> {
        let call = self.by_id(id, Owned::Execution(id));
        let rows = self
            .query(&call, CANCEL_EXECUTION, &[&id.as_uuid(), &reason])
            .await?;
        first_column(&call, &rows)
    }

    /// Completes an execution with `result`; `false` if it had already ended.
    pub async fn complete_execution(&self, id: ExecutionId, result: Value) -> Result<bool, ClientError> {
        let call = self.by_id(id, Owned::Execution(id));
        let rows = self
            .query(&call, COMPLETE_EXECUTION, &[&id.as_uuid(), &result])
            .await?;
        first_column(&call, &rows)
    }

    /// Completes a task claimed under `token`; its result (if any) goes to
    /// its execution's history. A stale token is [`ClientError::StaleToken`].
    pub async fn complete(
        &self,
        task_id: TaskId,
        token: i64,
        result: Option<Value>,
    ) -> Result<(), ClientError> {
        let call = self.by_id(task_id, Owned::Task(task_id));
        self.query(&call, COMPLETE, &[&task_id.as_uuid(), &token, &result])
            .await?;
        self.metrics.completed(call.shard, 1);
        Ok(())
    }

    /// Records a failed attempt: retried after `retry_in` (default: the
    /// shard's exponential backoff) until its attempts run out, then
    /// dead-lettered.
    pub async fn fail(
        &self,
        task_id: TaskId,
        token: i64,
        error: &str,
        retry_in: Option<Duration>,
    ) -> Result<FailOutcome, ClientError> {
        let call = self.by_id(task_id, Owned::Task(task_id));
        let retry_secs = retry_in.map(|d| d.as_secs_f64());
        let rows = self
            .query(&call, FAIL, &[&task_id.as_uuid(), &token, &error, &retry_secs])
            .await?;
        let row = single(&call, &rows)?;
        let read = || -> Result<FailOutcome, tokio_postgres::Error> {
            Ok(FailOutcome {
                retry_at: row.try_get("retry_at")?,
                dead_lettered: row.try_get("dead_lettered")?,
            })
        };
        read().map_err(|e| call.error(e, 1))
    }

    /// Extends a task's lease by the lease it was claimed with, from now;
    /// returns the new end.
    pub async fn heartbeat(&self, task_id: TaskId, token: i64) -> Result<SystemTime, ClientError> {
        let call = self.by_id(task_id, Owned::Task(task_id));
        let rows = self
            .query(&call, HEARTBEAT, &[&task_id.as_uuid(), &token])
            .await?;
        first_column(&call, &rows)
    }

    /// Fails an execution with `error`; `false` if it had already ended.
    pub async fn fail_execution(&self, id: ExecutionId, error: &str) -> Result<bool, ClientError> {
        let call = self.by_id(id, Owned::Execution(id));
        let rows = self
            .query(&call, FAIL_EXECUTION, &[&id.as_uuid(), &error])
            .await?;
        first_column(&call, &rows)
    }

    /// Enqueues a task (options as `sheaf.enqueue` takes them). A task of an
    /// execution (`opts.execution_id`) goes to that execution's shard. Else
    /// `Auto` hashes (queue, `idempotency_key`) when there is one, so a
    /// duplicate meets its first copy on the same shard, and spreads the rest
    /// at random; a routing key or pin places it like a start.
    pub async fn enqueue(
        &self,
        queue: &str,
        payload: Value,
        opts: Value,
        placement: Placement,
    ) -> Result<Enqueued, ClientError> {
        let shard = match opts.get("execution_id") {
            Some(Value::String(id)) => {
                let id = uuid::Uuid::parse_str(id).map_err(|_| {
                    ClientError::BadRequest(format!("opts.execution_id {id:?} is not a uuid"))
                })?;
                if placement != Placement::Auto {
                    return Err(ClientError::BadRequest(
                        "a task of an execution goes to its execution's shard; it takes no placement".into(),
                    ));
                }
                ExecutionId::from_uuid(id).route(&self.topology)
            }
            Some(Value::Null) | None => match opts.get("idempotency_key") {
                Some(Value::String(k)) => self.topology.place(queue, k, &placement, None)?,
                _ if placement == Placement::Auto => {
                    return self.enqueue_anywhere(queue, &payload, &opts).await;
                }
                _ => {
                    let key = uuid::Uuid::new_v4().to_string();
                    self.topology.place(queue, &key, &placement, None)?
                }
            },
            Some(_) => {
                return Err(ClientError::BadRequest(
                    "opts.execution_id must be a uuid string".into(),
                ));
            }
        };
        let call = Call {
            shard,
            owned: Owned::Queue(queue.to_owned()),
        };
        let rows = self.query(&call, ENQUEUE, &[&queue, &payload, &opts]).await?;
        let id: uuid::Uuid = first_column(&call, &rows)?;
        Ok(Enqueued {
            task_id: TaskId::from_uuid(id),
            shard,
        })
    }

    /// A task with no affinity (no execution, idempotency key or placement)
    /// may go to any writable shard: the placeable shards are tried in a
    /// random order, passing over one that cannot give a connection now
    /// (unreachable, short-circuited, exhausted, on another schema), which
    /// was sent nothing. A failure after the statement was sent is returned
    /// as it is: the task may exist. Fails only when no shard can take it.
    async fn enqueue_anywhere(
        &self,
        queue: &str,
        payload: &Value,
        opts: &Value,
    ) -> Result<Enqueued, ClientError> {
        let mut shards: Vec<ShardId> = self.topology.placeable().collect();
        if shards.is_empty() {
            // No writable shard: the router's refusal says so.
            let key = uuid::Uuid::new_v4().to_string();
            self.topology.place(queue, &key, &Placement::Auto, None)?;
        }
        let start = (uuid::Uuid::new_v4().as_u64_pair().0 % shards.len().max(1) as u64) as usize;
        shards.rotate_left(start);
        let mut last = None;
        for shard in shards {
            if let Err(e) = self.pools.get(shard).await {
                self.metrics.request(shard, unavailable_outcome(&e));
                tracing::debug!(%shard, error = %e, "enqueue passes over a shard that cannot take work now");
                last = Some(e);
                continue;
            }
            let call = Call {
                shard,
                owned: Owned::Queue(queue.to_owned()),
            };
            let rows = self.query(&call, ENQUEUE, &[&queue, payload, opts]).await?;
            let id: uuid::Uuid = first_column(&call, &rows)?;
            return Ok(Enqueued {
                task_id: TaskId::from_uuid(id),
                shard,
            });
        }
        Err(ClientError::NoShardAvailable {
            queue: queue.to_owned(),
            last: last.map(|e| e.to_string()).unwrap_or_default(),
        })
    }

    /// Claims up to `batch` tasks of `queue` on one shard under `lease`.
    pub async fn claim(
        &self,
        shard: ShardId,
        queue: &str,
        worker: &str,
        batch: i32,
        lease: Duration,
    ) -> Result<Vec<ClaimedTask>, ClientError> {
        let call = Call {
            shard,
            owned: Owned::Queue(queue.to_owned()),
        };
        let rows = self
            .query(&call, CLAIM, &[&queue, &worker, &batch, &lease.as_secs_f64()])
            .await?;
        let tasks = rows
            .iter()
            .map(|row| {
                Ok(ClaimedTask {
                    task_id: TaskId::from_uuid(row.try_get("task_id")?),
                    token: row.try_get("token")?,
                    payload: row.try_get("payload")?,
                    attempt: row.try_get("attempt")?,
                    execution_id: row
                        .try_get::<_, Option<uuid::Uuid>>("execution_id")?
                        .map(ExecutionId::from_uuid),
                    concurrency_key: row.try_get("concurrency_key")?,
                    kind: row.try_get("kind")?,
                    queue: queue.to_owned(),
                    shard,
                })
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| call.error(e, 1))?;
        self.metrics.claimed(shard, tasks.len());
        Ok(tasks)
    }

    /// Gives a claimed task back without spending an attempt.
    pub async fn release(&self, task_id: TaskId, token: i64) -> Result<(), ClientError> {
        let call = self.by_id(task_id, Owned::Task(task_id));
        self.query(&call, RELEASE, &[&task_id.as_uuid(), &token]).await?;
        Ok(())
    }

    /// Gives a claimed task back to run again after `delay` (up to 365
    /// days) without spending an attempt (`sheaf.snooze`); returns when it
    /// runs again. It holds no concurrency slot meanwhile.
    pub async fn snooze(
        &self,
        task_id: TaskId,
        token: i64,
        delay: Duration,
    ) -> Result<SystemTime, ClientError> {
        let call = self.by_id(task_id, Owned::Task(task_id));
        let rows = self
            .query(&call, SNOOZE, &[&task_id.as_uuid(), &token, &delay.as_secs_f64()])
            .await?;
        first_column(&call, &rows)
    }

    /// Moves a claimed task to the dead letters now, whatever attempts it
    /// has left (`sheaf.dead_letter`): a failure no retry can fix. A
    /// workflow task's execution fails, as when its last attempt fails.
    pub async fn dead_letter(&self, task_id: TaskId, token: i64, error: &str) -> Result<(), ClientError> {
        let call = self.by_id(task_id, Owned::Task(task_id));
        self.query(&call, DEAD_LETTER, &[&task_id.as_uuid(), &token, &error])
            .await?;
        Ok(())
    }

    /// Completes a claimed task of an execution and completes the execution
    /// with `result`, in one transaction on its shard
    /// (`sheaf.complete_task_and_execution`): the history gets the task's
    /// `TaskCompleted`, then `WorkflowCompleted`. (Completing the execution
    /// first would cancel the task, and its `complete` would then be a
    /// [`ClientError::StaleToken`].) A task of no execution is
    /// [`ClientError::WrongState`].
    pub async fn complete_task_and_execution(
        &self,
        task_id: TaskId,
        token: i64,
        result: Value,
    ) -> Result<(), ClientError> {
        let call = self.by_id(task_id, Owned::Task(task_id));
        self.query(
            &call,
            COMPLETE_TASK_AND_EXECUTION,
            &[&task_id.as_uuid(), &token, &result],
        )
        .await?;
        self.metrics.completed(call.shard, 1);
        Ok(())
    }

    /// Completes a claimed task of an execution and fails the execution with
    /// `error`, in one transaction on its shard
    /// (`sheaf.complete_task_and_fail_execution`).
    pub async fn complete_task_and_fail_execution(
        &self,
        task_id: TaskId,
        token: i64,
        error: &str,
    ) -> Result<(), ClientError> {
        let call = self.by_id(task_id, Owned::Task(task_id));
        self.query(
            &call,
            COMPLETE_TASK_AND_FAIL_EXECUTION,
            &[&task_id.as_uuid(), &token, &error],
        )
        .await?;
        self.metrics.completed(call.shard, 1);
        Ok(())
    }

    /// Registers `worker` as live on `shard`, serving `queues`.
    pub async fn worker_heartbeat(
        &self,
        shard: ShardId,
        worker: &str,
        queues: &[String],
    ) -> Result<(), ClientError> {
        let call = Call {
            shard,
            owned: Owned::Shard,
        };
        self.query(&call, WORKER_HEARTBEAT, &[&worker, &queues]).await?;
        Ok(())
    }

    /// Takes `worker` out of one shard's live-worker registry
    /// (`sheaf.worker_deregister`); whether it was registered there.
    pub async fn worker_deregister(&self, shard: ShardId, worker: &str) -> Result<bool, ClientError> {
        let call = Call {
            shard,
            owned: Owned::Shard,
        };
        let rows = self.query(&call, WORKER_DEREGISTER, &[&worker]).await?;
        first_column(&call, &rows)
    }

    /// Runs `sheaf.maintain()` on one shard; returns its report.
    pub async fn maintain(&self, shard: ShardId) -> Result<Value, ClientError> {
        let call = Call {
            shard,
            owned: Owned::Shard,
        };
        let rows = self.query(&call, MAINTAIN, &[]).await?;
        first_column(&call, &rows)
    }

    /// The shard that serves `id`: its prefix (unencoded: the default
    /// shard), following forwards. No lookup.
    fn by_id(&self, id: ExecutionId, owned: Owned) -> Call {
        Call {
            shard: id.route(&self.topology),
            owned,
        }
    }

    /// Runs one statement on the call's shard, again after a transient
    /// conflict (bounded, with backoff). Never on another shard. Counted in
    /// `sheaf_shard_requests_total` by outcome.
    async fn query(
        &self,
        call: &Call,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, ClientError> {
        let result = self.query_on_shard(call, sql, params).await;
        let outcome = match &result {
            Ok(_) => Outcome::Ok,
            Err(ClientError::Shard { error, .. }) => unavailable_outcome(error),
            Err(_) => Outcome::Error,
        };
        self.metrics.request(call.shard, outcome);
        result
    }

    async fn query_on_shard(
        &self,
        call: &Call,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, ClientError> {
        let conn = self
            .pools
            .get(call.shard)
            .await
            .map_err(|e| call.unavailable(e))?;
        let limit = self.pools.options().query_timeout;
        let mut attempt = 1;
        loop {
            let run = async {
                let statement = conn.prepare_cached(sql).await?;
                conn.query(&statement, params).await
            };
            match tokio::time::timeout(limit, run).await {
                Ok(Ok(rows)) => return Ok(rows),
                Ok(Err(e)) if attempt < MAX_ATTEMPTS && e.code().is_some_and(|c| is_transient(c.code())) => {
                    tracing::debug!(shard = %call.shard, attempt, error = %e, "transient conflict; retrying");
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                Ok(Err(e)) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_FUNCTION) => {
                    // The shard's schema changed under this client (an
                    // upgrade mid-flight): say so, not "function does not exist".
                    self.pools.recheck_schema(call.shard);
                    let schema = conn.query_one(crate::schema::SCHEMA_VERSION, &[]).await;
                    return Err(match schema.and_then(|row| row.try_get::<_, Option<String>>(0)) {
                        Ok(schema) if !schema.as_deref().is_some_and(crate::schema::is_compatible) => call
                            .unavailable(ShardError::IncompatibleSchema {
                                shard: call.shard,
                                schema,
                            }),
                        _ => call.error(e, attempt),
                    });
                }
                Ok(Err(e)) => {
                    if e.as_db_error().is_none() && lost_connection(&e) {
                        self.pools.record_failure(call.shard);
                    }
                    return Err(call.error(e, attempt));
                }
                Err(_) => {
                    // The server may still be running it: cancel it, and
                    // never reuse a connection with a reply still in flight.
                    let cancel = conn.cancel_token();
                    tokio::spawn(async move {
                        if let Err(e) = cancel.cancel_query(tokio_postgres::NoTls).await {
                            tracing::debug!(error = %e, "cancelling a timed-out statement failed");
                        }
                    });
                    drop(deadpool_postgres::Object::take(conn));
                    self.pools.record_failure(call.shard);
                    tracing::warn!(shard = %call.shard, waited = ?limit, "statement timed out");
                    return Err(call.unavailable(ShardError::Timeout {
                        shard: call.shard,
                        waited: limit,
                    }));
                }
            }
        }
    }
}

/// How a call that a shard could not serve counts in the request metrics.
fn unavailable_outcome(error: &ShardError) -> Outcome {
    match error {
        ShardError::ShortCircuited { .. } => Outcome::ShortCircuited,
        _ => Outcome::ConnectionError,
    }
}

/// The one row a scalar or single-row function returns.
fn single<'a>(call: &Call, rows: &'a [Row]) -> Result<&'a Row, ClientError> {
    match rows {
        [row] => Ok(row),
        _ => Err(ClientError::Database {
            shard: call.shard,
            code: None,
            message: format!("expected one row, the shard returned {}", rows.len()),
        }),
    }
}

/// The value of a scalar function call.
fn first_column<T>(call: &Call, rows: &[Row]) -> Result<T, ClientError>
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    single(call, rows)?.try_get(0).map_err(|e| call.error(e, 1))
}

fn execution_from_row(row: &Row, shard: ShardId) -> Result<Execution, tokio_postgres::Error> {
    Ok(Execution {
        execution_id: ExecutionId::from_uuid(row.try_get("execution_id")?),
        shard,
        workflow_name: row.try_get("workflow_name")?,
        workflow_id: row.try_get("workflow_id")?,
        state: row.try_get("state")?,
        input: row.try_get("input")?,
        result: row.try_get("result")?,
        error: row.try_get("error")?,
        concurrency_key: row.try_get("concurrency_key")?,
        quota_key: row.try_get("quota_key")?,
        history_bytes: row.try_get("history_bytes")?,
        created_at: row.try_get("created_at")?,
        closed_at: row.try_get("closed_at")?,
        wake_at: row.try_get("wake_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(n: u32) -> ShardId {
        ShardId::new(n).unwrap()
    }

    /// Compile-time: the client can be shared across tasks and its calls
    /// spawned on a multi-threaded runtime.
    #[allow(dead_code)]
    fn the_client_and_its_calls_are_send(c: &Client, id: ExecutionId) {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>(_: T) {}
        send_sync::<Client>();
        send(c.start_workflow("wf", "1", Value::Null, Placement::Auto));
        send(c.get_execution(id));
        send(c.fail(id, 1, "e", None));
    }

    #[test]
    fn sqlstates_map_to_their_variants() {
        let refusal = |code: &str| ClientError::refusal(shard(1), code, "m".into(), 1);
        assert!(matches!(refusal("53400"), ClientError::QuotaExceeded { .. }));
        assert!(matches!(refusal("55006"), ClientError::GateRejected { .. }));
        assert!(matches!(refusal("55P03"), ClientError::StaleToken { .. }));
        assert!(matches!(refusal("P0002"), ClientError::UnknownExecution { .. }));
        assert!(matches!(refusal("22023"), ClientError::InvalidArgument { .. }));
        assert!(matches!(refusal("22004"), ClientError::InvalidArgument { .. }));
        assert!(matches!(refusal("55000"), ClientError::WrongState { .. }));
        for code in ["0A000", "42501", "XX000", "23505"] {
            match refusal(code) {
                ClientError::Database { code: Some(c), .. } => assert_eq!(c, code),
                other => panic!("{code}: {other:?}"),
            }
        }
    }

    #[test]
    fn transient_conflicts_report_their_attempts() {
        for code in ["40P01", "40001"] {
            assert!(is_transient(code));
            match ClientError::refusal(shard(2), code, "deadlock detected".into(), MAX_ATTEMPTS) {
                ClientError::Conflict { attempts, .. } => assert_eq!(attempts, MAX_ATTEMPTS),
                other => panic!("{code}: {other:?}"),
            }
        }
        assert!(!is_transient("55P03"));
    }

    #[test]
    fn backoff_is_small_and_bounded() {
        let mut total = Duration::ZERO;
        for attempt in 1..MAX_ATTEMPTS {
            let full = BACKOFF_BASE * (1 << (attempt - 1));
            let pause = backoff(attempt);
            assert!(pause >= full / 2 && pause <= full, "{attempt}: {pause:?}");
            total += pause;
        }
        assert!(total <= Duration::from_millis(150), "{total:?}");
        assert!(backoff(u32::MAX) <= BACKOFF_BASE * 1024);
    }

    #[test]
    fn an_unavailable_shard_names_itself_and_the_work_it_owns() {
        let id = ExecutionId::mint(shard(2)).unwrap();
        let call = Call {
            shard: shard(2),
            owned: Owned::Execution(id),
        };
        let e = call.unavailable(ShardError::Unreachable {
            shard: shard(2),
            cause: "connection refused".into(),
        });
        let text = e.to_string();
        assert!(text.contains("shard 2"), "{text}");
        assert!(text.contains(&id.to_string()), "{text}");
        assert!(text.contains("check that database"), "{text}");
        let work = Owned::Workflow {
            name: "billing".into(),
            workflow_id: "inv-7".into(),
        };
        assert_eq!(work.to_string(), r#"workflow "billing" id "inv-7""#);
    }

    #[test]
    fn refusal_display_carries_the_message_not_the_shard() {
        let e = ClientError::refusal(shard(7), "53400", "quota for wf".into(), 1);
        assert_eq!(e.to_string(), "quota exceeded: quota for wf");
        let e = ClientError::refusal(shard(7), "XX000", "bug".into(), 1);
        assert_eq!(e.to_string(), "database error XX000: bug");
    }
}
