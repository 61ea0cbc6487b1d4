//! The worker loop; what it does is on [`Worker`].

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::Steps;
use crate::client::{ClaimedTask, Client, ClientError};
use crate::handler::{CancelReason, TaskContext, TaskDone, TaskFailure, lease_lost};
use crate::id::TaskId;
use crate::listen::{self, Heard};
use crate::metrics::{Loop, TaskOutcome};
use crate::pool::ShardError;
use crate::relay::{self, RelayOptions};
use crate::topology::ShardId;
use sheaf_core::sqlstate;

/// The longest worker name the registry takes.
const MAX_NAME_BYTES: usize = 256;

/// Which shards a worker claims from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Coverage {
    /// Every readable shard of the topology. Refused when the topology
    /// reserves shards: an automatic worker would drain every cell too.
    Auto,
    /// Exactly these shards.
    Shards(Vec<ShardId>),
}

/// How a worker runs. [`WorkerOptions::new`] gives the defaults; each
/// setter says what it sets.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerOptions {
    /// Its name in the live-worker registry and in each claim.
    pub(crate) name: String,
    /// The queues it claims from, on every shard it covers.
    pub(crate) queues: Vec<String>,
    pub(crate) coverage: Coverage,
    pub(crate) concurrency: usize,
    pub(crate) batch: i32,
    pub(crate) lease: Duration,
    pub(crate) idle_poll: Duration,
    pub(crate) register_every: Duration,
    pub(crate) maintain_every: Duration,
    pub(crate) drain_timeout: Duration,
    pub(crate) listen: bool,
    pub(crate) relay: Option<RelayOptions>,
    pub(crate) rebalance_resume: Option<Duration>,
    /// Serve `/metrics` here (feature `http`): the client's series and the
    /// queues of every readable shard, sampled at most every 15 s.
    #[cfg(feature = "http")]
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,
}

impl WorkerOptions {
    /// A worker named `name` on `queues`, covering every readable shard,
    /// 16 tasks at once, 30 s leases, a 10 s drain timeout.
    pub fn new(
        name: impl Into<String>,
        queues: impl IntoIterator<Item = impl Into<String>>,
    ) -> WorkerOptions {
        WorkerOptions {
            name: name.into(),
            queues: queues.into_iter().map(Into::into).collect(),
            coverage: Coverage::Auto,
            concurrency: 16,
            batch: 16,
            lease: Duration::from_secs(30),
            idle_poll: Duration::from_secs(1),
            register_every: Duration::from_secs(20),
            maintain_every: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(10),
            listen: true,
            relay: Some(RelayOptions::default()),
            rebalance_resume: Some(crate::client::STALL_AFTER),
            #[cfg(feature = "http")]
            metrics_listen: None,
        }
    }

    /// How often it renews its live-worker registration (live for 60 s).
    pub fn register_every(mut self, register_every: Duration) -> Self {
        self.register_every = register_every;
        self
    }

    /// Sleep on `LISTEN sheaf_ready` between polls.
    pub fn listen(mut self, listen: bool) -> Self {
        self.listen = listen;
        self
    }

    /// Run a relay for the lifecycle rows of its shards (`None`: not). On
    /// a shard where its login lacks `sheaf_relay`, it does not run (warned
    /// once at start; [`Worker::protocol_role`]).
    pub fn relay(mut self, relay: Option<RelayOptions>) -> Self {
        self.relay = relay;
        self
    }

    /// The shards it claims from.
    pub fn coverage(mut self, coverage: Coverage) -> Self {
        self.coverage = coverage;
        self
    }

    /// Serve `/metrics` here (feature `http`): the client's series and the
    /// queues of every readable shard, sampled at most every 15 s.
    #[cfg(feature = "http")]
    pub fn metrics_listen(mut self, addr: std::net::SocketAddr) -> Self {
        self.metrics_listen = Some(addr);
        self
    }

    /// Tasks in hand at once.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// The most tasks one claim asks for (fewer when slots are short).
    pub fn batch(mut self, n: i32) -> Self {
        self.batch = n;
        self
    }

    /// Each claim's lease (1 s..1 day); heartbeated every third of it.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The longest sleep while idle; a notification wakes it sooner.
    pub fn idle_poll(mut self, every: Duration) -> Self {
        self.idle_poll = every;
        self
    }

    /// How often it runs `sheaf.maintain()` on each of its shards.
    pub fn maintain_every(mut self, every: Duration) -> Self {
        self.maintain_every = every;
        self
    }

    /// Auto-resume of rebalancing: with each maintenance pass, activate the
    /// moves off its shards whose cutover committed and then stalled this
    /// long (at least 5 s; default 30 s), each recorded with an audit entry.
    /// `None`: only `sheaf rebalance-resume` settles them. Like the relay, only on shards where its login holds
    /// `sheaf_relay`.
    pub fn rebalance_resume(mut self, grace: Option<Duration>) -> Self {
        self.rebalance_resume = grace;
        self
    }

    /// How long a shutdown waits for the tasks in hand before releasing them.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }
}

/// Why a worker would not start. Each is a configuration mistake, found
/// before anything is claimed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerError {
    /// The name is empty or longer than the registry takes.
    #[error("the worker name must be 1..={MAX_NAME_BYTES} bytes")]
    BadName,
    /// No queue, or a blank queue name.
    #[error("a worker needs at least one queue, and no blank queue name")]
    NoQueues,
    /// An option out of range; the text says which and why.
    #[error("{0}")]
    BadOption(&'static str),
    /// `Coverage::Auto` in a topology that reserves shards.
    #[error(
        "the topology reserves shards, so this worker must name its shards (Coverage::Shards): \
         an automatic worker would also drain every reserved cell"
    )]
    ExplicitCoverageRequired,
    /// A shard of `Coverage::Shards` the topology does not have as readable.
    #[error("shard {0} is assigned to this worker but is not a readable shard of this client's topology")]
    UnknownShard(ShardId),
    /// The coverage comes to no shard at all.
    #[error("this worker covers no shard")]
    NoShards,
    /// `Worker::start` runs its loops on the current tokio runtime.
    #[error("Worker::start must be called from within a tokio runtime (e.g. inside #[tokio::main])")]
    NoRuntime,
    /// `metrics_listen` could not be served (the port is taken, say).
    #[error("cannot serve metrics: {0}")]
    MetricsListen(String),
}

/// Whether a worker runs the protocol (its relay, rebalance auto-resume) on
/// a shard: that needs its login there to hold `sheaf_relay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolRole {
    /// Not known yet: the shard has not answered.
    Unknown,
    /// The login holds it: they run.
    Held,
    /// It does not: they are off on that shard (warned once, at start).
    Missing,
}

impl ProtocolRole {
    fn from_u8(n: u8) -> ProtocolRole {
        match n {
            1 => ProtocolRole::Held,
            2 => ProtocolRole::Missing,
            _ => ProtocolRole::Unknown,
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            ProtocolRole::Unknown => 0,
            ProtocolRole::Held => 1,
            ProtocolRole::Missing => 2,
        }
    }
}

/// Counts of what a worker did, so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Tasks claimed, per shard.
    pub claimed: BTreeMap<ShardId, u64>,
    /// Tasks completed ([`TaskDone::Complete`], and those that ended their
    /// execution too).
    pub completed: u64,
    /// Failed attempts (a [`TaskFailure`] or a panic), retried or not.
    pub failed: u64,
    /// Of the failed attempts, those that sent their task to the dead
    /// letters (a permanent failure, or the last attempt).
    pub dead_lettered: u64,
    /// Tasks snoozed ([`TaskDone::Snooze`]).
    pub snoozed: u64,
    /// Tasks given back unfinished (a shutdown past its drain timeout).
    pub released: u64,
    /// Tasks whose lease was lost (a stale token) before they finished.
    pub lost: u64,
    /// Tasks an operator cancelled while their handler ran
    /// ([`Client::cancel_task`]): the handler was stopped, the task given back.
    pub cancelled: u64,
}

/// What a shutdown did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainReport {
    /// Tasks in hand when claiming stopped.
    pub in_hand: usize,
    /// Of those, how many were released because the drain timed out.
    pub released: u64,
    /// Whether the drain timeout passed with tasks still in hand.
    pub timed_out: bool,
}

#[derive(Default)]
struct Counters {
    claimed: Mutex<BTreeMap<ShardId, u64>>,
    completed: AtomicU64,
    failed: AtomicU64,
    dead_lettered: AtomicU64,
    snoozed: AtomicU64,
    released: AtomicU64,
    lost: AtomicU64,
    cancelled: AtomicU64,
}

/// A shard's completed tasks not yet recorded (`Ctx::finished`).
#[derive(Default)]
struct Finished {
    tasks: Vec<(ClaimedTask, Instant)>,
    /// The claim loop has stopped: a runner completes its task itself.
    closed: bool,
}

struct Ctx {
    client: Arc<Client>,
    options: WorkerOptions,
    shards: Vec<ShardId>,
    counters: Counters,
    slots: Arc<Semaphore>,
    /// Per shard: its listener wakes that shard's claim loop.
    wake: BTreeMap<ShardId, Notify>,
    /// Per shard: tasks whose handler completed them, waiting for that
    /// shard's claim loop to complete them with its next claim, and the
    /// signal that one is waiting (`flush_due`).
    finished: BTreeMap<ShardId, Mutex<Finished>>,
    flush: BTreeMap<ShardId, Notify>,
    /// Its relay's wakes, when it runs one.
    relay: Option<Arc<relay::Shared>>,
    /// Per shard, a [`ProtocolRole`]; empty when it runs neither a relay
    /// nor auto-resume.
    protocol: BTreeMap<ShardId, AtomicU8>,
    stop: CancellationToken,
    abandon: CancellationToken,
    /// The task runners. Not a `JoinSet`: dropping the worker must not
    /// abort a runner, which is what gives its task back.
    runners: TaskTracker,
}

/// A running worker. Stop it with [`Worker::shutdown`]. Dropping it
/// instead stops claiming, stops every handler at once (aborted at its next
/// `.await`) and releases their tasks without spending an attempt, on the
/// runtime it was started on (`Drop` cannot wait for that). If that runtime
/// has shut down, nothing more can be sent: the tasks stay running until
/// their leases expire, and are then claimed again (the attempt spent).
///
/// The worker loop: claims from its shards round-robin (so a deep backlog on
/// one shard cannot starve another), runs a handler per task with bounded
/// concurrency, heartbeats each lease, registers itself in every shard's
/// live-worker registry, runs `sheaf.maintain()` periodically, and drains
/// gracefully: on shutdown it stops claiming, waits a bounded time for the
/// tasks in hand, and releases the rest without spending their attempts.
///
/// It sleeps on `LISTEN sheaf_ready` (one dedicated connection per shard,
/// outside the pools) when idle, and polls anyway, so a lost notification
/// costs at most one poll interval.
///
/// Its relay and rebalance auto-resume run the protocol's steps, granted to
/// `sheaf_relay` only: on each shard it asks once whether its login holds
/// that role, and where it does not, it warns once and runs neither there
/// ([`Worker::protocol_role`], `sheaf_protocol_role{shard}`); claiming is
/// unaffected.
///
/// ```no_run
/// use std::sync::Arc;
///
/// use sheaf_driver::{Client, PoolOptions, TaskContext, TaskDone, TaskFailure, Topology, Worker, WorkerOptions};
///
/// async fn send_email(ctx: TaskContext) -> Result<TaskDone, TaskFailure> {
///     let to: String = ctx
///         .task()
///         .payload
///         .deserialize()
///         .map_err(|e| TaskFailure::permanent(format!("bad payload: {e}")))?;
///     println!("mailing {to}");
///     Ok(TaskDone::Complete(None))
/// }
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Arc::new(Client::new(Topology::from_env()?, PoolOptions::default())?);
/// let options = WorkerOptions::new("mailer-1", ["emails"]);
/// let worker = Worker::start(client, options, send_email)?;
///
/// // ... until the process is told to stop; then:
/// tokio::time::sleep(std::time::Duration::from_secs(60)).await;
/// // Stops claiming, lets the tasks in hand finish (or releases them),
/// // and leaves every shard's live-worker registry.
/// let report = worker.shutdown().await;
/// println!("{report:?}");
/// # Ok(())
/// # }
/// ```
pub struct Worker {
    ctx: Arc<Ctx>,
    /// Where `Drop` sends the releases and the deregistration.
    runtime: tokio::runtime::Handle,
    /// Whether a shutdown ran to its end (then `Drop` has nothing left to do).
    shut_down: bool,
    coordinator: Option<JoinHandle<()>>,
    /// The listeners.
    background: Vec<JoinHandle<()>>,
    /// Registration and maintenance; awaited at shutdown so no heartbeat
    /// lands after the worker deregistered.
    housekeeping: Option<JoinHandle<()>>,
    uncovered: Vec<ShardId>,
    /// `/metrics`, when `metrics_listen` is set; stops when the worker goes.
    #[cfg(feature = "http")]
    metrics: Option<crate::metrics_http::MetricsServer>,
    warnings: Vec<String>,
}

impl Worker {
    /// Validates the options against the client's topology, then starts
    /// claiming. `handler` runs once per claimed task, with its
    /// [`TaskContext`]; its [`TaskDone`] says how the task ends (complete,
    /// also ending its execution, or snoozed), a [`TaskFailure`] fails the
    /// attempt (retried, or dead-lettered at once when permanent), and a
    /// panic fails it too (retried).
    pub fn start<H, F>(client: Arc<Client>, options: WorkerOptions, handler: H) -> Result<Worker, WorkerError>
    where
        H: Fn(TaskContext) -> F + Send + Sync + 'static,
        F: Future<Output = Result<TaskDone, TaskFailure>> + Send + 'static,
    {
        // Before anything is counted or registered: without a runtime the
        // loops below could not be spawned.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(WorkerError::NoRuntime);
        };
        let shards = check(&client, &options)?;
        #[cfg(feature = "http")]
        let metrics = serve_metrics(&client, &options)?;
        let topology = client.topology();
        let uncovered: Vec<ShardId> = topology
            .shards()
            .map(|s| s.id)
            .filter(|id| topology.is_writable(*id) && !shards.contains(id))
            .collect();
        if !uncovered.is_empty() {
            tracing::warn!(
                worker = %options.name,
                shards = ?uncovered,
                "writable shards that this worker does not cover: make sure another worker does"
            );
        }
        let warnings = count_scanners(&client, &shards, &options.name);
        let relay = options.relay.as_ref().map(|_| relay::Shared::new(&shards));
        let runs_protocol = options.relay.is_some() || options.rebalance_resume.is_some();
        let protocol = if runs_protocol {
            shards.iter().map(|&s| (s, AtomicU8::new(0))).collect()
        } else {
            BTreeMap::new()
        };
        let ctx = Arc::new(Ctx {
            relay,
            protocol,
            slots: Arc::new(Semaphore::new(options.concurrency)),
            client,
            options,
            wake: shards.iter().map(|&s| (s, Notify::new())).collect(),
            finished: shards.iter().map(|&s| (s, Mutex::default())).collect(),
            flush: shards.iter().map(|&s| (s, Notify::new())).collect(),
            shards,
            counters: Counters::default(),
            stop: CancellationToken::new(),
            abandon: CancellationToken::new(),
            runners: TaskTracker::new(),
        });
        let listeners = if ctx.options.listen {
            ctx.shards
                .iter()
                .filter_map(|&shard| {
                    let url = ctx.client.topology().get(shard)?.url.clone();
                    Some(tokio::spawn(listen(ctx.clone(), shard, url)))
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut background: Vec<JoinHandle<()>> = listeners;
        for &shard in ctx.protocol.keys() {
            background.push(tokio::spawn(run_protocol(ctx.clone(), shard)));
        }
        let housekeeping = Some(tokio::spawn(housekeep(ctx.clone())));
        let coordinator = tokio::spawn(coordinate(ctx.clone(), Arc::new(handler)));
        Ok(Worker {
            ctx,
            runtime,
            shut_down: false,
            coordinator: Some(coordinator),
            background,
            housekeeping,
            uncovered,
            warnings,
            #[cfg(feature = "http")]
            metrics,
        })
    }

    /// Where its `/metrics` is served (`metrics_listen`), if it is.
    #[cfg(feature = "http")]
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics
            .as_ref()
            .map(crate::metrics_http::MetricsServer::local_addr)
    }

    /// The shards this worker claims from, in its round-robin order.
    pub fn shards(&self) -> &[ShardId] {
        &self.ctx.shards
    }

    /// Writable shards this worker does not cover (also logged at start).
    pub fn uncovered_writable(&self) -> &[ShardId] {
        &self.uncovered
    }

    /// Under-sized pools found at start (also logged).
    pub fn startup_warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Whether its relay and rebalance auto-resume run on `shard`; `None`
    /// when it runs neither or does not cover `shard`.
    pub fn protocol_role(&self, shard: ShardId) -> Option<ProtocolRole> {
        self.ctx.protocol_role(shard)
    }

    /// What it did so far.
    pub fn stats(&self) -> WorkerStats {
        let c = &self.ctx.counters;
        WorkerStats {
            claimed: c.claimed.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            completed: c.completed.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            dead_lettered: c.dead_lettered.load(Ordering::Relaxed),
            snoozed: c.snoozed.load(Ordering::Relaxed),
            released: c.released.load(Ordering::Relaxed),
            lost: c.lost.load(Ordering::Relaxed),
            cancelled: c.cancelled.load(Ordering::Relaxed),
        }
    }

    /// Stops claiming, waits up to the drain timeout for the tasks in hand,
    /// then releases what is left (their attempts are not spent), and
    /// deregisters from every shard it covers.
    pub async fn shutdown(mut self) -> DrainReport {
        self.ctx.stop.cancel();
        if let Some(coordinator) = self.coordinator.take()
            && let Err(e) = coordinator.await
        {
            tracing::error!(error = %e, "the worker loop panicked");
        }
        // The loop has stopped: no runner starts after this count.
        self.ctx.runners.close();
        let in_hand = self.ctx.runners.len();
        let released_before = self.ctx.counters.released.load(Ordering::Relaxed);
        let drained = tokio::time::timeout(self.ctx.options.drain_timeout, self.ctx.runners.wait())
            .await
            .is_ok();
        if !drained {
            self.ctx.abandon.cancel();
            self.ctx.runners.wait().await;
        }
        leave(&self.ctx, self.housekeeping.take()).await;
        self.shut_down = true;
        DrainReport {
            in_hand,
            released: self.ctx.counters.released.load(Ordering::Relaxed) - released_before,
            timed_out: !drained,
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.ctx.stop.cancel();
        for task in &self.background {
            task.abort();
        }
        for &shard in &self.ctx.shards {
            self.ctx.client.remove_scanner(shard);
        }
        if self.shut_down {
            return;
        }
        // Dropped without a shutdown (or in the middle of one): every
        // runner aborts its handler and releases its task now.
        self.ctx.abandon.cancel();
        self.ctx.runners.close();
        let ctx = self.ctx.clone();
        let (coordinator, housekeeping) = (self.coordinator.take(), self.housekeeping.take());
        // On a runtime that has shut down this task never runs (and neither
        // do the runners): the leases expire.
        self.runtime.spawn(async move {
            if let Some(coordinator) = coordinator {
                let _ = coordinator.await;
            }
            ctx.runners.wait().await;
            leave(&ctx, housekeeping).await;
        });
    }
}

/// Waits for the housekeeping to stop (it does once the worker stops), so no
/// registration lands after the deregistration, then leaves the live-worker
/// registry: the worker's queues show as stranded at once, not when its last
/// heartbeat turns 60 s old.
async fn leave(ctx: &Ctx, housekeeping: Option<JoinHandle<()>>) {
    if let Some(housekeeping) = housekeeping
        && let Err(e) = housekeeping.await
    {
        tracing::error!(error = %e, "the worker's housekeeping panicked");
    }
    deregister(ctx).await;
}

/// The options, checked; the shards to cover, in order, without repeats.
fn check(client: &Client, options: &WorkerOptions) -> Result<Vec<ShardId>, WorkerError> {
    if options.name.is_empty() || options.name.len() > MAX_NAME_BYTES {
        return Err(WorkerError::BadName);
    }
    if options.queues.is_empty() || options.queues.iter().any(|q| q.trim().is_empty()) {
        return Err(WorkerError::NoQueues);
    }
    if options.concurrency == 0 {
        return Err(WorkerError::BadOption("concurrency must be at least 1"));
    }
    if !(1..=1000).contains(&options.batch) {
        return Err(WorkerError::BadOption("batch must be 1..=1000"));
    }
    if options.lease < Duration::from_secs(1) {
        return Err(WorkerError::BadOption("the lease must be at least 1 second"));
    }
    if options.idle_poll.is_zero() || options.maintain_every.is_zero() || options.register_every.is_zero() {
        return Err(WorkerError::BadOption(
            "poll, register and maintain intervals must be above zero",
        ));
    }
    if options.register_every >= Duration::from_secs(60) {
        return Err(WorkerError::BadOption(
            "register_every must be under 60 s, or the worker drops out of the live registry",
        ));
    }
    if options
        .rebalance_resume
        .is_some_and(|g| !(crate::client::MIN_STALL_AFTER..=Duration::from_secs(86_400)).contains(&g))
    {
        return Err(WorkerError::BadOption(
            "rebalance_resume's grace must be from 5 s to 1 day",
        ));
    }
    let topology = client.topology();
    let shards: Vec<ShardId> = match &options.coverage {
        Coverage::Auto => {
            if topology.shards().any(|s| topology.is_reserved(s.id)) {
                return Err(WorkerError::ExplicitCoverageRequired);
            }
            topology
                .shards()
                .map(|s| s.id)
                .filter(|id| topology.is_readable(*id))
                .collect()
        }
        Coverage::Shards(ids) => {
            let mut seen = BTreeSet::new();
            let mut shards = Vec::new();
            for &id in ids {
                if topology.get(id).is_none() || !topology.is_readable(id) {
                    return Err(WorkerError::UnknownShard(id));
                }
                if seen.insert(id) {
                    shards.push(id);
                }
            }
            shards
        }
    };
    if shards.is_empty() {
        return Err(WorkerError::NoShards);
    }
    Ok(shards)
}

/// Counts this worker's claim loops against each shard's pool; the pools
/// too small for every claim loop of the process, as warnings (also logged).
fn count_scanners(client: &Client, shards: &[ShardId], name: &str) -> Vec<String> {
    let max_size = client.admin().pools().options().max_size;
    let mut warnings = Vec::new();
    for &shard in shards {
        let scanners = client.add_scanner(shard);
        if max_size < scanners + 1 {
            let text = format!(
                "the pool of shard {shard} holds {max_size} connections but {scanners} claim loop(s) \
                 of this process use it: size it at {} or more",
                scanners + 1
            );
            tracing::warn!(worker = %name, "{text}");
            warnings.push(text);
        }
    }
    warnings
}

/// `/metrics` on `metrics_listen`, bound now so a taken port fails the start.
#[cfg(feature = "http")]
fn serve_metrics(
    client: &Arc<Client>,
    options: &WorkerOptions,
) -> Result<Option<crate::metrics_http::MetricsServer>, WorkerError> {
    let Some(addr) = options.metrics_listen else {
        return Ok(None);
    };
    std::net::TcpListener::bind(addr)
        .and_then(|l| crate::metrics_http::MetricsServer::from_std(client.clone(), l, Default::default()))
        .map(Some)
        .map_err(|e| WorkerError::MetricsListen(e.to_string()))
}

/// The claim loops, one per shard, all at once: a shard that does not
/// answer (half-open, overloaded) holds up only its own claims, never the
/// others' for a query timeout per round. They share the worker's slots.
/// The task runners go to `ctx.runners`.
async fn coordinate<H, F>(ctx: Arc<Ctx>, handler: Arc<H>)
where
    H: Fn(TaskContext) -> F + Send + Sync + 'static,
    F: Future<Output = Result<TaskDone, TaskFailure>> + Send + 'static,
{
    let loops = ctx.shards.iter().map(|&shard| claim_loop(&ctx, &handler, shard));
    futures::future::join_all(loops).await;
}

async fn claim_loop<H, F>(ctx: &Arc<Ctx>, handler: &Arc<H>, shard: ShardId)
where
    H: Fn(TaskContext) -> F + Send + Sync + 'static,
    F: Future<Output = Result<TaskDone, TaskFailure>> + Send + 'static,
{
    let (Some(wake), Some(flush)) = (ctx.wake.get(&shard), ctx.flush.get(&shard)) else {
        return;
    };
    // A slot this loop waited for, kept for its next claim. Waiting for a
    // slot and dropping it at once (as this loop once did) hands it to the
    // next loop waiting, and so on: with fewer free slots than loops, the
    // slot circled among their waits and no claim ever saw it free (a
    // worker of concurrency 2 over 3 shards claimed nothing more).
    let mut held: Option<OwnedSemaphorePermit> = None;
    while !ctx.stop.is_cancelled() {
        let claimed = claim_from(ctx, handler, shard, held.take()).await;
        ctx.client.metrics().tick(Loop::Claim, shard);
        let until = Instant::now() + ctx.options.idle_poll;
        if ctx.slots.available_permits() == 0 {
            // Every slot busy: wait for one to free up (the semaphore
            // serves waiters in order, so the shards take turns).
            tokio::select! {
                _ = ctx.stop.cancelled() => {}
                slot = ctx.slots.clone().acquire_owned() => held = slot.ok(),
                _ = flush_due(flush) => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        } else if claimed == 0 {
            tokio::select! {
                _ = ctx.stop.cancelled() => {}
                _ = wake.notified() => {}
                _ = flush_due(flush) => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }
    // From now on each runner completes its own task.
    let left = take_finished(ctx, shard, true);
    complete_finished(ctx, shard, left).await;
}

/// How long a completed task may wait for its shard's next claim before
/// the claim loop completes it alone: a busy loop claims again sooner and
/// takes every completion waiting with it.
const FLUSH_AFTER: Duration = Duration::from_millis(10);

/// Resolves `FLUSH_AFTER` after a runner handed its claim loop a completion.
async fn flush_due(flush: &Notify) {
    flush.notified().await;
    tokio::time::sleep(FLUSH_AFTER).await;
}

/// The completed tasks waiting on `shard`; `close`: for good.
fn take_finished(ctx: &Ctx, shard: ShardId, close: bool) -> Vec<(ClaimedTask, Instant)> {
    let Some(finished) = ctx.finished.get(&shard) else {
        return Vec::new();
    };
    let mut finished = finished.lock().unwrap_or_else(|p| p.into_inner());
    finished.closed |= close;
    std::mem::take(&mut finished.tasks)
}

/// Hands a completed task of no execution to its shard's claim loop, which
/// completes it with its next claim (`complete_and_claim`: one round trip
/// and one commit for a batch of completions and the next claim); false
/// once that loop has stopped.
fn defer_completion(ctx: &Ctx, task: &ClaimedTask, claimed_at: Instant) -> bool {
    let Some(finished) = ctx.finished.get(&task.shard) else {
        return false;
    };
    {
        let mut finished = finished.lock().unwrap_or_else(|p| p.into_inner());
        if finished.closed {
            return false;
        }
        finished.tasks.push((task.clone(), claimed_at));
    }
    if let Some(flush) = ctx.flush.get(&task.shard) {
        flush.notify_one();
    }
    true
}

/// Records what one completion call said of each finished task: completed,
/// or (a stale token, a cancellation, a task gone) completed again alone,
/// which says which, as a task that finished on its own would be.
async fn settle(ctx: &Ctx, tasks: Vec<(ClaimedTask, Instant)>, completed: &BTreeMap<TaskId, bool>) {
    for (task, claimed_at) in tasks {
        if completed.get(&task.task_id) == Some(&true) {
            count(ctx, &task, TaskOutcome::Completed);
            ctx.client
                .metrics()
                .task_took(task.shard, &task.queue, claimed_at.elapsed());
        } else {
            finish(ctx, &task, Ok(Ok(TaskDone::Complete(None))), claimed_at, false).await;
        }
    }
}

/// Completes `tasks` on `shard` without claiming.
async fn complete_finished(ctx: &Ctx, shard: ShardId, tasks: Vec<(ClaimedTask, Instant)>) {
    if tasks.is_empty() {
        return;
    }
    let pairs: Vec<(TaskId, i64)> = tasks.iter().map(|(t, _)| (t.task_id, t.token)).collect();
    match ctx.client.complete_batch_on(shard, &pairs).await {
        Ok(completed) => settle(ctx, tasks, &completed).await,
        Err(e) => {
            log_failure(ctx, shard, "complete", &e);
            settle(ctx, tasks, &BTreeMap::new()).await;
        }
    }
}

/// One batch per queue from `shard`, each claim asking for no more tasks
/// than the slots it reserved first (claims in flight on several shards at
/// once never take more tasks than there are slots), `held` among them;
/// how many it claimed.
async fn claim_from<H, F>(
    ctx: &Arc<Ctx>,
    handler: &Arc<H>,
    shard: ShardId,
    mut held: Option<OwnedSemaphorePermit>,
) -> usize
where
    H: Fn(TaskContext) -> F + Send + Sync + 'static,
    F: Future<Output = Result<TaskDone, TaskFailure>> + Send + 'static,
{
    let mut claimed = 0;
    let mut finished = take_finished(ctx, shard, false);
    for queue in &ctx.options.queues {
        if ctx.stop.is_cancelled() {
            break;
        }
        // At most this shard's share of the slots per claim: a claim that
        // hangs (a half-open shard) holds its reservation until it times
        // out, and must not hold every slot meanwhile.
        let share = ctx.options.concurrency.div_ceil(ctx.shards.len());
        let mine = usize::from(held.is_some());
        let free = (ctx.slots.available_permits() + mine).min(share);
        let want = ctx.options.batch.min(i32::try_from(free).unwrap_or(i32::MAX));
        if want <= 0 {
            break;
        }
        // No await between the count and the reservation: no other claim
        // loop of this worker runs in between.
        let more = want as u32 - mine as u32;
        let mut reserved = match (held.take(), more) {
            (Some(slot), 0) => slot,
            (held, _) => {
                let Ok(mut slots) = ctx.slots.clone().try_acquire_many_owned(more) else {
                    break;
                };
                if let Some(slot) = held {
                    slots.merge(slot);
                }
                slots
            }
        };
        // Taken before the claim is sent: the lease ends later than this.
        let deadline = SystemTime::now() + ctx.options.lease;
        let tasks = if finished.is_empty() {
            ctx.client
                .claim(shard, queue, &ctx.options.name, want, ctx.options.lease)
                .await
        } else {
            let done = std::mem::take(&mut finished);
            let pairs: Vec<(TaskId, i64)> = done.iter().map(|(t, _)| (t.task_id, t.token)).collect();
            match ctx
                .client
                .complete_and_claim(shard, queue, &ctx.options.name, &pairs, want, ctx.options.lease)
                .await
            {
                Ok((completed, tasks)) => {
                    settle(ctx, done, &completed.into_iter().collect()).await;
                    Ok(tasks)
                }
                Err(e) => {
                    settle(ctx, done, &BTreeMap::new()).await;
                    Err(e)
                }
            }
        };
        let tasks = match tasks {
            Ok(tasks) => tasks,
            Err(e) => {
                log_failure(ctx, shard, "claim", &e);
                continue;
            }
        };
        claimed += tasks.len();
        if !tasks.is_empty() {
            let mut by_shard = ctx.counters.claimed.lock().unwrap_or_else(|p| p.into_inner());
            *by_shard.entry(shard).or_default() += tasks.len() as u64;
        }
        for task in tasks {
            // The claim asked for no more tasks than it reserved slots.
            let Some(slot) = reserved.split(1) else {
                release(ctx, &task).await;
                continue;
            };
            ctx.runners
                .spawn(run_task(ctx.clone(), handler.clone(), task, deadline, slot));
        }
        // The slots the claim did not fill go back when `reserved` drops.
    }
    // No claim ran (no slot free): the completions go alone.
    complete_finished(ctx, shard, finished).await;
    claimed
}

impl Ctx {
    fn protocol_role(&self, shard: ShardId) -> Option<ProtocolRole> {
        self.protocol
            .get(&shard)
            .map(|p| ProtocolRole::from_u8(p.load(Ordering::Acquire)))
    }
}

/// Asks `shard` whether this worker's login holds `sheaf_relay`, then runs
/// its relay there if it does (auto-resume, in `maintain`, reads the answer).
async fn run_protocol(ctx: Arc<Ctx>, shard: ShardId) {
    let off = match (&ctx.options.relay, &ctx.options.rebalance_resume) {
        (Some(_), Some(_)) => "the relay and rebalance auto-resume are",
        (Some(_), None) => "the relay is",
        (None, _) => "rebalance auto-resume is",
    };
    let role = match relay::protocol_role(&ctx.client, shard, off, &ctx.stop).await {
        Some(true) => ProtocolRole::Held,
        Some(false) => ProtocolRole::Missing,
        None => return,
    };
    if let Some(p) = ctx.protocol.get(&shard) {
        p.store(role.as_u8(), Ordering::Release);
    }
    if let (ProtocolRole::Held, Some(shared), Some(options)) = (role, &ctx.relay, &ctx.options.relay) {
        relay::run_shard(
            ctx.client.clone(),
            shard,
            options.clone(),
            shared.clone(),
            ctx.stop.clone(),
        )
        .await;
    }
}

/// Registration and maintenance, on their own task so a slow or
/// unreachable shard never holds up the claim loop.
async fn housekeep(ctx: Arc<Ctx>) {
    let mut next_register = Instant::now();
    let mut next_maintain = Instant::now();
    while !ctx.stop.is_cancelled() {
        let now = Instant::now();
        if now >= next_register {
            register(&ctx).await;
            next_register = now + ctx.options.register_every;
        }
        if now >= next_maintain {
            maintain(&ctx).await;
            next_maintain = now + ctx.options.maintain_every;
        }
        for &shard in &ctx.shards {
            ctx.client.metrics().tick(Loop::Maintenance, shard);
        }
        tokio::select! {
            _ = ctx.stop.cancelled() => {}
            _ = tokio::time::sleep_until(next_register.min(next_maintain)) => {}
        }
    }
}

/// Takes this worker out of the registry of every shard it covers.
async fn deregister(ctx: &Ctx) {
    let calls = ctx.shards.iter().map(|&shard| async move {
        if let Err(e) = ctx
            .client
            .protocol()
            .worker_deregister(shard, &ctx.options.name)
            .await
        {
            log_failure(ctx, shard, "worker deregistration", &e);
        }
    });
    futures::future::join_all(calls).await;
}

/// Renews this worker's registration on every shard it covers, and with
/// it the client's `sheaf_shard_up` and `sheaf_shard_stranded_ready` for
/// those shards, so they are current without a `topology_status()` call.
async fn register(ctx: &Ctx) {
    let calls = ctx.shards.iter().map(|&shard| async move {
        let metrics = ctx.client.metrics();
        match ctx
            .client
            .protocol()
            .worker_heartbeat(shard, &ctx.options.name, &ctx.options.queues)
            .await
        {
            Ok(()) => {
                let stranded = match ctx.client.stranded_ready(shard).await {
                    Ok(n) => Some(n),
                    Err(e) => {
                        log_failure(ctx, shard, "reading stranded work", &e);
                        None
                    }
                };
                metrics.probed(shard, true, stranded);
            }
            Err(e) => {
                // A refusal means the shard answered; only an unreachable
                // shard is down.
                metrics.probed(shard, !matches!(e, ClientError::Shard { .. }), None);
                log_failure(ctx, shard, "worker registration", &e);
            }
        }
    });
    futures::future::join_all(calls).await;
}

async fn maintain(ctx: &Ctx) {
    let calls = ctx.shards.iter().map(|&shard| async move {
        if let Err(e) = ctx.client.admin().maintain(shard).await {
            // A shard that cannot be maintained now is not asked for more:
            // every call to it would hold a connection until its timeout.
            log_failure(ctx, shard, "maintenance", &e);
            return;
        }
        // Not before the shard said this login may (`run_protocol`).
        if let Some(grace) = ctx.options.rebalance_resume
            && ctx.protocol_role(shard) == Some(ProtocolRole::Held)
        {
            match ctx.client.protocol().settle_stalled(shard, grace).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(%shard, settled = n, "auto-resume activated stalled moves"),
                Err(e) => log_failure(ctx, shard, "rebalance auto-resume", &e),
            }
        }
    });
    futures::future::join_all(calls).await;
}

/// A failed call on one shard. While the shard's breaker is open every call
/// fails the same way, and the failure that opened it was logged as a
/// warning already: repeating it each poll would only flood the log.
fn log_failure(ctx: &Ctx, shard: ShardId, what: &str, e: &ClientError) {
    if matches!(
        e,
        ClientError::Shard {
            error: ShardError::ShortCircuited { .. },
            ..
        }
    ) {
        tracing::debug!(worker = %ctx.options.name, %shard, error = %e, "{what} short-circuited");
    } else {
        tracing::warn!(worker = %ctx.options.name, %shard, error = %e, "{what} failed");
    }
}

/// Runs one task: the handler in its own task (a panic fails the attempt),
/// a heartbeat every third of the lease, then the outcome the handler chose.
/// A lost lease or a shutdown fires the task's cancellation signal and
/// aborts the handler.
async fn run_task<H, F>(
    ctx: Arc<Ctx>,
    handler: Arc<H>,
    task: ClaimedTask,
    deadline: SystemTime,
    _slot: OwnedSemaphorePermit,
) where
    H: Fn(TaskContext) -> F + Send + Sync + 'static,
    F: Future<Output = Result<TaskDone, TaskFailure>> + Send + 'static,
{
    let claimed_at = Instant::now();
    let _in_flight = ctx.client.metrics().in_flight(task.shard, &task.queue);
    let task_ctx = TaskContext::new(task.clone(), ctx.client.clone(), deadline);
    let mut work = AbortOnDrop(tokio::spawn(handler(task_ctx.clone())));
    let mut beat = tokio::time::interval_at(Instant::now() + ctx.options.lease / 3, ctx.options.lease / 3);
    let outcome = loop {
        tokio::select! {
            done = &mut work.0 => break done,
            _ = ctx.abandon.cancelled() => {
                task_ctx.cancel(CancelReason::Shutdown);
                work.0.abort();
                release(&ctx, &task).await;
                return;
            }
            // A stale token or a cancellation seen by a fenced call, the
            // worker's heartbeat or the handler's own.
            _ = task_ctx.cancelled() => {
                work.0.abort();
                if task_ctx.cancel_reason() == Some(CancelReason::Cancelled) {
                    give_back_cancelled(&ctx, &task).await;
                    return;
                }
                count(&ctx, &task, TaskOutcome::Lost);
                tracing::warn!(task = %task.task_id, "lease lost; the task was abandoned");
                return;
            }
            _ = beat.tick() => {
                if let Err(e) = task_ctx.heartbeat().await
                    && !lease_lost(&e)
                    && !matches!(e, ClientError::TaskCancelled { .. })
                {
                    tracing::warn!(task = %task.task_id, error = %e, "heartbeat failed");
                }
            }
        }
    };
    finish(&ctx, &task, outcome, claimed_at, true).await;
}

/// Records what the handler chose (or its panic) on the task's shard.
/// `may_defer`: a plain completion may go with the shard's next claim.
async fn finish(
    ctx: &Ctx,
    task: &ClaimedTask,
    outcome: Result<Result<TaskDone, TaskFailure>, tokio::task::JoinError>,
    claimed_at: Instant,
    may_defer: bool,
) {
    let client = &ctx.client;
    let (id, token) = (task.task_id, task.token);
    let failed = |dead: bool| {
        if dead {
            TaskOutcome::DeadLettered
        } else {
            TaskOutcome::Failed
        }
    };
    let result = match outcome {
        // A task of no execution has no history for a result to go to.
        Ok(Ok(TaskDone::Complete(_)))
            if may_defer && task.execution_id.is_none() && defer_completion(ctx, task, claimed_at) =>
        {
            return;
        }
        Ok(Ok(TaskDone::Complete(result))) => client
            .complete(id, token, result)
            .await
            .map(|()| TaskOutcome::Completed),
        Ok(Ok(TaskDone::CompleteExecution(result))) => client
            .complete_task_and_execution(id, token, result)
            .await
            .map(|()| TaskOutcome::Completed),
        Ok(Ok(TaskDone::FailExecution(error))) => client
            .complete_task_and_fail_execution(id, token, &error)
            .await
            .map(|()| TaskOutcome::Completed),
        Ok(Ok(TaskDone::ContinueAsNew(input))) => client
            .complete_task_and_continue_as_new(id, token, input)
            .await
            .map(|_| TaskOutcome::Completed),
        Ok(Ok(TaskDone::Snooze(delay))) => client
            .snooze(id, token, delay)
            .await
            .map(|_| TaskOutcome::Snoozed),
        Ok(Err(failure)) if failure.permanent => client
            .dead_letter(id, token, &failure.message)
            .await
            .map(|()| TaskOutcome::DeadLettered),
        Ok(Err(failure)) => client
            .fail(id, token, &failure.message, failure.retry_in)
            .await
            .map(|o| failed(o.dead_lettered)),
        Err(panic) => client
            .fail(id, token, &format!("the handler panicked: {panic}"), None)
            .await
            .map(|o| failed(o.dead_lettered)),
    };
    match result {
        Ok(outcome) => {
            count(ctx, task, outcome);
            client
                .metrics()
                .task_took(task.shard, &task.queue, claimed_at.elapsed());
        }
        // Cancelled while the handler ran: its outcome does not count.
        Err(ClientError::TaskCancelled { .. }) => give_back_cancelled(ctx, task).await,
        Err(e) if lease_lost(&e) => {
            count(ctx, task, TaskOutcome::Lost);
            tracing::warn!(task = %task.task_id, "lease lost before the task finished");
        }
        // Larger than the shard stores: the same handler would give the
        // same outcome again, so it is recorded as a short failure instead
        // of expiring the lease over and over.
        Err(e) if too_large(&e) => record_refused(ctx, task, &e, claimed_at).await,
        // The lease expires and the task runs again: nothing is lost.
        Err(e) => tracing::warn!(task = %task.task_id, error = %e, "could not record the task's outcome"),
    }
}

/// Whether the shard refused a value as larger than it stores (54000).
fn too_large(e: &ClientError) -> bool {
    matches!(e, ClientError::Database { code: Some(code), .. } if code == sqlstate::PROGRAM_LIMIT_EXCEEDED)
}

/// Dead-letters a task whose handler's outcome (a result, an input, an
/// error) the shard refused as too large: the shard's message names the
/// value and its size, never the value itself.
async fn record_refused(ctx: &Ctx, task: &ClaimedTask, refusal: &ClientError, claimed_at: Instant) {
    let message = format!("the handler's outcome could not be recorded: {refusal}");
    tracing::warn!(task = %task.task_id, error = %refusal, "the handler's outcome is too large; dead-lettering the task");
    match ctx.client.dead_letter(task.task_id, task.token, &message).await {
        Ok(()) => {
            count(ctx, task, TaskOutcome::DeadLettered);
            ctx.client
                .metrics()
                .task_took(task.shard, &task.queue, claimed_at.elapsed());
        }
        Err(e) => {
            tracing::warn!(task = %task.task_id, error = %e, "could not dead-letter the task; the lease will expire")
        }
    }
}

/// Counts what became of a task: in this worker's stats and in the client's
/// `sheaf_tasks_total{shard,queue,outcome}`. A dead letter is a failure too.
fn count(ctx: &Ctx, task: &ClaimedTask, outcome: TaskOutcome) {
    let c = &ctx.counters;
    let counter = match outcome {
        TaskOutcome::Completed => &c.completed,
        TaskOutcome::DeadLettered => {
            c.dead_lettered.fetch_add(1, Ordering::Relaxed);
            &c.failed
        }
        TaskOutcome::Released => &c.released,
        TaskOutcome::Snoozed => &c.snoozed,
        TaskOutcome::Lost => &c.lost,
        TaskOutcome::Cancelled => &c.cancelled,
        // Failed, and any outcome added later.
        _ => &c.failed,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    ctx.client.metrics().task(task.shard, &task.queue, outcome);
}

/// A spawned handler, aborted when its runner goes away (the runner was
/// aborted, or the runtime is shutting down): no handler outlives the runner
/// that owns its task.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn release(ctx: &Ctx, task: &ClaimedTask) {
    match ctx.client.release(task.task_id, task.token).await {
        Ok(()) => count(ctx, task, TaskOutcome::Released),
        Err(e) => tracing::warn!(task = %task.task_id, error = %e, "release failed; the lease will expire"),
    }
}

/// Gives back a task an operator cancelled while it ran: the shard ends it
/// then and its concurrency slot passes on (else at its lease's end).
async fn give_back_cancelled(ctx: &Ctx, task: &ClaimedTask) {
    tracing::info!(task = %task.task_id, "the task was cancelled; its handler was stopped");
    match ctx.client.release(task.task_id, task.token).await {
        Ok(()) => count(ctx, task, TaskOutcome::Cancelled),
        Err(e) => {
            count(ctx, task, TaskOutcome::Cancelled);
            tracing::warn!(task = %task.task_id, error = %e, "could not give back a cancelled task; it ends at its lease's end");
        }
    }
}

/// Wakes the claim loop when one of its queues gets work on `shard`, and
/// hands `sheaf_relay` notifications to the worker's relay (on the same
/// connection). Polling covers the gaps.
async fn listen(ctx: Arc<Ctx>, shard: ShardId, url: String) {
    let queues: HashSet<String> = ctx.options.queues.iter().cloned().collect();
    let wake = || {
        if let Some(w) = ctx.wake.get(&shard) {
            w.notify_one();
        }
    };
    let channels: &[&str] = if ctx.relay.is_some() {
        &["sheaf_ready", "sheaf_relay"]
    } else {
        &["sheaf_ready"]
    };
    listen::listen(
        &ctx.client,
        shard,
        &url,
        channels,
        &ctx.stop,
        |heard| match heard {
            Heard::Connected => {
                wake();
                if let Some(relay) = &ctx.relay {
                    relay.heard(shard, None);
                }
            }
            Heard::Notification {
                channel: "sheaf_relay",
                payload,
            } => {
                if let Some(relay) = &ctx.relay {
                    relay.heard(shard, Some(payload));
                }
            }
            Heard::Notification { payload, .. } => {
                if queues.contains(payload) {
                    wake();
                }
            }
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolOptions;
    use crate::topology::Topology;

    fn client(reserved: bool) -> Client {
        let mut b = Topology::builder()
            .shard(0, "postgres://localhost/a")
            .shard(1, "postgres://localhost/b")
            .shard(2, "postgres://localhost/c");
        if reserved {
            b = b.reserved([2]).residency("cell", 2);
        }
        Client::new(b.build().unwrap(), PoolOptions::default()).unwrap()
    }

    fn id(n: u32) -> ShardId {
        ShardId::new(n).unwrap()
    }

    #[test]
    fn auto_covers_every_readable_shard() {
        let c = client(false);
        assert_eq!(
            check(&c, &WorkerOptions::new("w", ["q"])).unwrap(),
            vec![id(0), id(1), id(2)]
        );
    }

    #[test]
    fn reserved_shards_require_explicit_coverage() {
        let c = client(true);
        assert_eq!(
            check(&c, &WorkerOptions::new("w", ["q"])),
            Err(WorkerError::ExplicitCoverageRequired)
        );
        let explicit = WorkerOptions::new("w", ["q"]).coverage(Coverage::Shards(vec![id(2), id(0), id(2)]));
        assert_eq!(check(&c, &explicit).unwrap(), vec![id(2), id(0)]);
    }

    #[test]
    fn bad_options_are_refused_before_anything_runs() {
        let c = client(false);
        let refused = |o: WorkerOptions| check(&c, &o).unwrap_err();
        assert_eq!(refused(WorkerOptions::new("", ["q"])), WorkerError::BadName);
        assert_eq!(
            refused(WorkerOptions::new("x".repeat(257), ["q"])),
            WorkerError::BadName
        );
        assert_eq!(
            refused(WorkerOptions::new("w", Vec::<String>::new())),
            WorkerError::NoQueues
        );
        assert_eq!(refused(WorkerOptions::new("w", [" "])), WorkerError::NoQueues);
        assert!(matches!(
            refused(WorkerOptions::new("w", ["q"]).concurrency(0)),
            WorkerError::BadOption(_)
        ));
        assert!(matches!(
            refused(WorkerOptions::new("w", ["q"]).batch(0)),
            WorkerError::BadOption(_)
        ));
        assert!(matches!(
            refused(WorkerOptions::new("w", ["q"]).batch(1001)),
            WorkerError::BadOption(_)
        ));
        assert!(matches!(
            refused(WorkerOptions::new("w", ["q"]).lease(Duration::from_millis(500))),
            WorkerError::BadOption(_)
        ));
        assert!(matches!(
            refused(WorkerOptions::new("w", ["q"]).idle_poll(Duration::ZERO)),
            WorkerError::BadOption(_)
        ));
        assert_eq!(
            refused(WorkerOptions::new("w", ["q"]).coverage(Coverage::Shards(vec![id(9)]))),
            WorkerError::UnknownShard(id(9))
        );
        assert_eq!(
            refused(WorkerOptions::new("w", ["q"]).coverage(Coverage::Shards(vec![]))),
            WorkerError::NoShards
        );
    }
}
