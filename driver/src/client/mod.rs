//! `Client`: one handle on N shard databases, used as one queue.
//!
//! Starts are placed by the router and get an id minted for the chosen shard,
//! so every later call about that execution (or one of its tasks) goes
//! straight to `id.route()` with no lookup. Nothing ever falls back to
//! another shard: a shard that cannot serve fails the call loudly, naming
//! that one shard and the execution, task or workflow it owns.

mod admin;
mod audit;
mod batch;
mod children;
mod config;
mod debounce;
mod env;
mod error;
mod executions;
mod external;
mod fleet;
mod history;
mod lifecycle;
mod listing;
mod mutex;
mod operations;
mod options;
mod policy;
mod protocol;
mod rate_limits;
mod rebalance;
mod relay;
mod reports;
mod retention;
mod schedules;
mod search;
mod shard;
mod tasks;
mod topology;
mod tx;

use std::fmt;
use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

pub use env::EnvError;
pub use error::{ClientError, MAX_FORWARDS, Owned, QuotaDetail};
pub use executions::{Execution, Started};
pub use options::{DebounceMode, EnqueueOptions, StartOptions};
pub use tasks::{ClaimedTask, Enqueued, FailOutcome};

pub use admin::{Admin, ShardInfo};
pub use audit::AuditEntry;
pub use batch::{EnqueuedBatch, MAX_BATCH};
pub use children::{
    Child, ChildOptions, ChildPlacement, Children, MAX_CHILDREN, Orphan, Orphans, ParentClose, StartedChild,
    Tree, TreeNode,
};
pub use config::{FleetConfig, config_drift};
pub use debounce::PendingStart;
pub use external::{ByKey, ExternalAction, OutboxBacklog, OutboxKind, OutboxOutcome, OutboxRow, OutboxState};
pub use fleet::{
    ConcurrencyStat, FleetError, FleetReport, QueueStats, QuotaUsage, RegisteredWorker, StrandedWork,
};
pub use history::{Event, EventType, HistoryPage, MAX_HISTORY_PAGE};
pub use listing::{
    ListPage, ListedDeadLetter, ListedTask, MAX_TASK_PAGE, QueueCounts, QueueListing, QueueSummary, TaskInfo,
    TaskStatus,
};
pub use mutex::{Acquired, ListedMutex, LockOptions, MutexGuard, MutexKey, MutexStatus};
pub use policy::{QueueConfig, QueueOptions};
pub use protocol::{Protocol, Steps};
pub use rate_limits::{OverrideReport, RateLimitInfo};
pub use rebalance::{
    Blocker, Candidate, Drain, Erasure, MIN_STALL_AFTER, Migration, MoveOutcome, MovePhase, MoveReport,
    Phase, PhaseHook, Progress, RebalanceOptions, STALL_AFTER, StalledMove, Unsettled,
};
pub use relay::{ChildStart, CloseKind, RelayBacklog, RelayOutcome, RelayRow, ReportStatus};
pub use reports::{GroupBy, KeyConcurrency, Report, Usage};
pub use schedules::{Fire, FireOutcome, MAX_FIRES_PAGE, Schedule};
pub use search::{
    AttrOp, ExecutionCounts, ExecutionFilter, ExecutionPage, ListedExecution, MAX_COUNT_CAP, MAX_LIST_PAGE,
    PageStatus, Resolution, SortOrder, StateCount, attr_equality,
};
pub use topology::{MisplacedRun, PublishedTopology};
pub use tx::{OnShard, ShardConnection};

use crate::id::{ExecutionId, TaskId};
use crate::metrics::{Metrics, Outcome};
use crate::pool::{PoolOptions, ShardError, ShardPools};
use crate::status::{TopologyStatus, topology_status};
use crate::topology::{ShardId, Topology};
use error::is_transient;

/// How many times one call runs before a transient conflict is reported.
const MAX_ATTEMPTS: u32 = 5;
/// The first backoff after a transient conflict; it doubles per attempt.
const BACKOFF_BASE: Duration = Duration::from_millis(10);

/// The pause before attempt `attempt + 1`: doubling from
/// [`BACKOFF_BASE`], with jitter in its upper half so two sides of a
/// deadlock do not collide again in lockstep.
fn backoff(attempt: u32) -> Duration {
    let full = backoff_cap(attempt).as_micros() as u64;
    let random = uuid::Uuid::new_v4().as_u64_pair().1;
    Duration::from_micros(full / 2 + random % (full / 2 + 1))
}

/// The longest pause [`backoff`] may take before attempt `attempt + 1`.
fn backoff_cap(attempt: u32) -> Duration {
    BACKOFF_BASE * (1 << attempt.saturating_sub(1).min(10))
}

/// One call's destination and what it is about, for its errors.
#[derive(Clone)]
pub(crate) struct Call {
    pub(crate) shard: ShardId,
    pub(crate) owned: Owned,
}

impl Call {
    /// A failed statement or an unreadable reply, as a typed error. A
    /// connection lost mid-call is the shard being unreachable.
    pub(crate) fn error(&self, e: tokio_postgres::Error, attempts: u32) -> ClientError {
        if let Some(db) = e.as_db_error() {
            return ClientError::refusal(
                self.shard,
                &self.owned,
                db.code().code(),
                db.message().to_owned(),
                db.detail(),
                attempts,
            );
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

    pub(crate) fn unavailable(&self, error: ShardError) -> ClientError {
        ClientError::Shard {
            owned: self.owned.clone(),
            error,
        }
    }
}

/// Closed, or failed on the socket: the shard went away, not the query.
pub(crate) fn lost_connection(e: &tokio_postgres::Error) -> bool {
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
///
/// Its methods are what an application calls, by family:
///
/// - tasks: [`enqueue`](Client::enqueue) (and `enqueue_batch`, or in your
///   own transaction through [`shard_connection`](Client::shard_connection)),
///   [`claim`](Client::claim), [`complete`](Client::complete),
///   [`fail`](Client::fail), [`heartbeat`](Client::heartbeat),
///   [`snooze`](Client::snooze), `release`, `dead_letter`,
///   [`set_progress`](Client::set_progress), `cancel_task`, `get_task`
///   (a [`Worker`](crate::Worker) makes these calls for you);
/// - executions: [`start_workflow`](Client::start_workflow),
///   [`signal`](Client::signal), [`cancel_execution`](Client::cancel_execution),
///   [`get_execution`](Client::get_execution), [`history`](Client::history),
///   [`list_executions`](Client::list_executions),
///   [`find_execution`](Client::find_execution),
///   [`children`](Client::children) and [`start_child`](Client::start_child),
///   signals and cancels by key or from another execution, debounced starts,
///   suspend and wake, usage records;
/// - the durable mutex: [`lock`](Client::lock), `try_lock` and its steps.
///
/// The fleet's and the operator's calls (policies, dead letters,
/// retention, rebalancing and draining, topology and shard lifecycle,
/// reports, the audit log) are on [`Client::admin`].
///
/// ```no_run
/// use serde_json::json;
/// use sheaf_driver::{Client, EnqueueOptions, PoolOptions, StartOptions, Topology};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Client::new(Topology::from_env()?, PoolOptions::default())?;
///
/// // A workflow run, placed on one shard; its id names that shard.
/// let started = client
///     .start_workflow("invoice", "inv-42", json!({ "amount": "12.50" }), StartOptions::new())
///     .await?;
/// let run = client.get_execution(started.execution_id).await?;
/// println!("{:?}", run.map(|e| e.state));
///
/// // A plain task, at most once per key while unfinished.
/// let task = client
///     .enqueue("emails", json!({ "to": "a@example.com" }), EnqueueOptions::new().idempotency_key("welcome-a"))
///     .await?;
/// println!("task {} on shard {}", task.task_id, task.shard);
/// # Ok(())
/// # }
/// ```
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

    /// `opts` with `placement` (`options::placement_opt`) added when
    /// `shard` takes it (schema 0.3.0 on), so a shard with a published
    /// topology checks the work against what the router did.
    pub(crate) async fn with_placement(
        &self,
        shard: ShardId,
        mut opts: serde_json::Value,
        placement: Option<serde_json::Value>,
    ) -> serde_json::Value {
        let Some(placement) = placement else {
            return opts;
        };
        if self.pools.schema_version(shard).is_none() {
            // The first call to the shard: a connection's checkout reads its
            // schema. A shard that cannot give one fails the call itself next.
            drop(self.pools.get(shard).await);
        }
        let takes =
            matches!(self.pools.schema_version(shard), Some(Some(v)) if crate::schema::takes_placement(&v));
        if let (true, serde_json::Value::Object(m)) = (takes, &mut opts) {
            m.insert("placement".into(), placement);
        }
        opts
    }

    /// This client's metrics (also rendered by [`Client::metrics_text`]).
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

    /// The topology this client routes by.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The shard that serves `id`: its prefix (unencoded: the default
    /// shard), following forwards. No lookup.
    pub(crate) fn by_execution(&self, id: ExecutionId) -> Call {
        Call {
            shard: id.route(&self.topology),
            owned: Owned::Execution(id),
        }
    }

    /// The shard that serves task `id`, likewise.
    pub(crate) fn by_task(&self, id: TaskId) -> Call {
        Call {
            shard: id.route(&self.topology),
            owned: Owned::Task(id),
        }
    }

    /// Runs one statement on the call's shard, again after a transient
    /// conflict (bounded, with backoff). Never on another shard. Counted in
    /// `sheaf_shard_requests_total` by outcome.
    ///
    /// A call about an execution that was rebalanced away follows its
    /// seal's pointer ([`ClientError::Moved`]) to where it lives, at most
    /// [`MAX_FORWARDS`] hops; a call about an execution that never moved
    /// makes no extra round trip.
    pub(crate) async fn query(
        &self,
        call: &Call,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, ClientError> {
        self.query_followed(call, sql, params).await.map(|(_, rows)| rows)
    }

    /// `query`, with the shard that answered (another than the call's when
    /// the execution moved).
    pub(crate) async fn query_followed(
        &self,
        call: &Call,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(ShardId, Vec<Row>), ClientError> {
        let mut call = call.clone();
        let mut hops = 0;
        loop {
            let result = self.query_on_shard(&call, sql, params).await;
            let outcome = match &result {
                Ok(_) => Outcome::Ok,
                Err(ClientError::Shard { error, .. }) => unavailable_outcome(error),
                Err(ClientError::Moved { .. }) => Outcome::Ok,
                Err(_) => Outcome::Error,
            };
            self.metrics.request(call.shard, outcome);
            match (result, &call.owned) {
                (Err(ClientError::Moved { to, shard, .. }), Owned::Execution(id)) => {
                    if hops == MAX_FORWARDS {
                        return Err(ClientError::TooManyForwards { id: *id, shard });
                    }
                    hops += 1;
                    tracing::debug!(execution = %id, from = %shard, to = %to, "following a moved execution");
                    // A seal may point at a shard since retired: its
                    // forwards entry names the shard holding its seals now.
                    call.shard = self.topology.serving(to);
                }
                (result, _) => return result.map(|rows| (call.shard, rows)),
            }
        }
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
        // One budget for the statement, every retry and pause included: a
        // call answers within its query timeout however many conflicts it
        // meets.
        let deadline = tokio::time::Instant::now() + limit;
        let mut attempt = 1;
        loop {
            let run = async {
                let statement = conn.prepare_cached(sql).await?;
                conn.query(&statement, params).await
            };
            match tokio::time::timeout_at(deadline, run).await {
                Ok(Ok(rows)) => {
                    self.pools.record_success(call.shard);
                    return Ok(rows);
                }
                Ok(Err(e))
                    if attempt < MAX_ATTEMPTS
                        && e.code().is_some_and(|c| is_transient(c.code()))
                        && tokio::time::Instant::now() + backoff_cap(attempt) < deadline =>
                {
                    tracing::debug!(shard = %call.shard, attempt, error = %e, "transient conflict; retrying");
                    self.metrics.retried(call.shard, e.code());
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                Ok(Err(e)) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_FUNCTION) => {
                    // The shard's schema changed under this client (an
                    // upgrade mid-flight): say so, not "function does not exist".
                    self.pools.record_success(call.shard);
                    self.pools.recheck_schema(call.shard);
                    let schema =
                        tokio::time::timeout(limit, conn.query_one(crate::schema::SCHEMA_VERSION, &[]))
                            .await
                            .ok()
                            .map(|r| r.and_then(|row| row.try_get::<_, Option<String>>(0)));
                    if schema.is_none() {
                        // No answer in time: a reply may still come.
                        drop(deadpool_postgres::Object::take(conn));
                    }
                    return Err(match schema {
                        Some(Ok(schema)) if !schema.as_deref().is_some_and(crate::schema::is_compatible) => {
                            call.unavailable(ShardError::IncompatibleSchema {
                                shard: call.shard,
                                schema,
                            })
                        }
                        _ => call.error(e, attempt),
                    });
                }
                Ok(Err(e)) => {
                    if e.as_db_error().is_some() {
                        self.pools.record_success(call.shard);
                    } else if lost_connection(&e) {
                        self.pools.record_failure(call.shard);
                    }
                    return Err(call.error(e, attempt));
                }
                Err(_) => {
                    // The server may still be running it: cancel it, and
                    // never reuse a connection with a reply still in flight.
                    let cancel = conn.cancel_token();
                    if let Some(tls) = self.pools.tls(call.shard) {
                        tokio::spawn(async move {
                            if let Err(e) = cancel.cancel_query(tls).await {
                                tracing::debug!(error = %e, "cancelling a timed-out statement failed");
                            }
                        });
                    }
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

impl<'c> Admin<'c> {
    /// Probes every shard at once (a fresh connection each, bounded by
    /// `timeout`): reachability, identity, versions, roles, breaker, live
    /// workers, stranded work and misplaced runs. Also refreshes
    /// `sheaf_shard_up`, `sheaf_shard_stranded_ready` and
    /// `sheaf_shard_misplaced_runs`.
    pub async fn topology_status(self, timeout: Duration) -> TopologyStatus {
        let status = topology_status(&self.client.topology, &self.client.pools, timeout).await;
        for shard in &status.shards {
            self.client.metrics.probed(
                shard.probe.shard,
                shard.probe.reachable,
                shard.probe.reachable.then(|| shard.stranded_ready()),
            );
            self.client.metrics.breaker(shard.probe.shard, shard.breaker);
            if let Some(n) = shard.probe.misplaced_runs {
                self.client.metrics.misplaced(shard.probe.shard, n);
            }
        }
        status
    }

    /// The pools, for breaker states and status probes.
    pub fn pools(self) -> &'c ShardPools {
        &self.client.pools
    }
}

impl fmt::Debug for Client {
    /// The shard ids only: connection strings carry credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field(
                "shards",
                &self.topology.shards().map(|s| s.id).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// How a call that a shard could not serve counts in the request metrics.
pub(crate) fn unavailable_outcome(error: &ShardError) -> Outcome {
    match error {
        ShardError::ShortCircuited { .. } => Outcome::ShortCircuited,
        _ => Outcome::ConnectionError,
    }
}

/// The one row a scalar or single-row function returns.
pub(crate) fn single<'a>(call: &Call, rows: &'a [Row]) -> Result<&'a Row, ClientError> {
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
pub(crate) fn first_column<T>(call: &Call, rows: &[Row]) -> Result<T, ClientError>
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    single(call, rows)?.try_get(0).map_err(|e| call.error(e, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(n: u32) -> ShardId {
        ShardId::new(n).unwrap()
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
    fn debug_shows_shard_ids_not_connection_strings() {
        let t = Topology::builder()
            .shard(0, "postgres://u:secret@localhost/a")
            .build()
            .unwrap();
        let c = Client::new(t, PoolOptions::default()).unwrap();
        let text = format!("{c:?}");
        assert!(text.contains("Client"), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }
}
