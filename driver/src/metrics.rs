//! Prometheus metrics per client; the series are listed on [`Metrics`].

use std::time::Duration;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

use tokio_postgres::error::SqlState;

use crate::breaker::BreakerState;
use crate::topology::ShardId;

/// How one call to a shard ended, for `sheaf_shard_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The shard answered.
    Ok,
    /// No connection, a lost connection, an exhausted pool or a timeout.
    ConnectionError,
    /// The shard answered with an error (a refusal or a failure).
    Error,
    /// The shard's breaker was open; nothing was sent.
    ShortCircuited,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ConnectionError => "connection_error",
            Outcome::Error => "error",
            Outcome::ShortCircuited => "short_circuited",
        }
    }
}

/// What a worker did with a task it claimed, for `sheaf_tasks_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TaskOutcome {
    /// Completed (with its execution, when the handler ended that too).
    Completed,
    /// The attempt failed; it runs again later.
    Failed,
    /// Failed for good: moved to the dead letters.
    DeadLettered,
    /// Given back unfinished (a drain or a drop), its attempt not spent.
    Released,
    /// Put off by the handler, its attempt not spent.
    Snoozed,
    /// Its lease was lost, or it was gone, before the outcome was recorded.
    Lost,
    /// An operator cancelled it while it ran (`sheaf.cancel_task`): the
    /// handler was stopped and the task given back, which ended it.
    Cancelled,
}

impl TaskOutcome {
    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            TaskOutcome::Completed => "completed",
            TaskOutcome::Failed => "failed",
            TaskOutcome::DeadLettered => "dead_lettered",
            TaskOutcome::Released => "released",
            TaskOutcome::Snoozed => "snoozed",
            TaskOutcome::Lost => "lost",
            TaskOutcome::Cancelled => "cancelled",
        }
    }
}

/// A relay edge (`sheaf_relay_attempts_total`'s `edge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RelayEdge {
    /// Starting a child on its shard.
    Start,
    /// Delivering a cancel or terminate.
    Close,
    /// Reading a child's end back into its parent's history.
    Pull,
}

impl RelayEdge {
    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            RelayEdge::Start => "start",
            RelayEdge::Close => "close",
            RelayEdge::Pull => "pull",
        }
    }
}

/// Claims are a seek: most take milliseconds.
const CLAIM_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
/// Handlers run from milliseconds to the longest leases.
const TASK_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// The relay's and the outbox's metrics.
struct RelayMetrics {
    taken: IntCounterVec,
    attempts: IntCounterVec,
    in_flight: IntGaugeVec,
    oldest_unsettled: IntGaugeVec,
    deliveries: IntCounterVec,
    indeterminate: IntCounterVec,
    over_incomplete: IntCounterVec,
    outbox_pending: IntGaugeVec,
    oldest_pending: IntGaugeVec,
    oldest_indeterminate: IntGaugeVec,
    protocol_role: IntGaugeVec,
}

impl RelayMetrics {
    fn new(
        counter: &dyn Fn(&str, &str, &[&str]) -> IntCounterVec,
        gauge: &dyn Fn(&str, &str, &[&str]) -> IntGaugeVec,
    ) -> RelayMetrics {
        RelayMetrics {
            taken: counter(
                "sheaf_relay_taken_total",
                "Lifecycle rows a relay took from the shard (parent side)",
                &["shard"],
            ),
            attempts: counter(
                "sheaf_relay_attempts_total",
                "Relay edges run against a child's shard, by edge (start, close, pull) and outcome (ok, failed)",
                &["target_shard", "edge", "outcome"],
            ),
            in_flight: gauge(
                "sheaf_relay_in_flight",
                "Lifecycle rows on the shard by child's shard and state (STARTING, RUNNING)",
                &["shard", "target_shard", "state"],
            ),
            oldest_unsettled: gauge(
                "sheaf_relay_oldest_unsettled_seconds",
                "Age of the oldest lifecycle row on the shard, by child's shard",
                &["shard", "target_shard"],
            ),
            deliveries: counter(
                "sheaf_outbox_deliveries_total",
                "Outbox rows the relay drove, by kind and outcome",
                &["shard", "kind", "outcome"],
            ),
            indeterminate: counter(
                "sheaf_outbox_indeterminate_total",
                "By-key resolutions left indeterminate, by the shard that could not be inspected",
                &["shard", "kind"],
            ),
            over_incomplete: counter(
                "sheaf_outbox_found_over_incomplete_fanout_total",
                "Deliveries to a live run found while some shard could not answer",
                &["kind"],
            ),
            outbox_pending: gauge(
                "sheaf_outbox_pending",
                "Undelivered outbox rows on the shard, by kind",
                &["shard", "kind"],
            ),
            oldest_pending: gauge(
                "sheaf_outbox_oldest_pending_seconds",
                "Age of the shard's oldest undelivered outbox row, by kind",
                &["shard", "kind"],
            ),
            oldest_indeterminate: gauge(
                "sheaf_outbox_oldest_indeterminate_seconds",
                "How long the shard's longest-indeterminate outbox row has been so, by kind",
                &["shard", "kind"],
            ),
            protocol_role: gauge(
                "sheaf_protocol_role",
                "1 if this client's login on the shard holds sheaf_relay (the relay and rebalance auto-resume run), \
                 0 if not (they are off there)",
                &["shard"],
            ),
        }
    }
}

/// A loop whose last tick `sheaf_loop_last_tick_timestamp_seconds` gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Loop {
    /// A worker's claim loop of one shard (the guide's scanner: it polls
    /// the shard for due work).
    Claim,
    /// A worker's registration and `sheaf.maintain()` pass.
    Maintenance,
    /// A relay's sweep of one shard (a worker's or a standalone [`Relay`](crate::Relay)).
    Relay,
}

impl Loop {
    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            Loop::Claim => "claim",
            Loop::Maintenance => "maintenance",
            Loop::Relay => "relay",
        }
    }
}

/// The series alerts read beyond the shards' traffic: readiness, vacuum
/// horizons, conflicts retried, superseded runs, tasks in hand and each
/// loop's last tick.
struct HealthMetrics {
    ready: IntGaugeVec,
    oldest_snapshot: GaugeVec,
    retries: IntCounterVec,
    superseded: IntCounterVec,
    in_flight: IntGaugeVec,
    last_tick: GaugeVec,
}

impl HealthMetrics {
    fn new(
        registry: &Registry,
        counter: &dyn Fn(&str, &str, &[&str]) -> IntCounterVec,
        gauge: &dyn Fn(&str, &str, &[&str]) -> IntGaugeVec,
    ) -> HealthMetrics {
        let float = |name: &str, help: &str, labels: &[&str]| {
            let g = GaugeVec::new(Opts::new(name, help), labels).expect("a valid metric definition");
            registry.register(Box::new(g.clone())).expect("registered once");
            g
        };
        HealthMetrics {
            ready: gauge(
                "sheaf_shard_ready",
                "1 if the shard's last readiness probe found nothing holding it back (sheaf shard health), else 0",
                &["shard"],
            ),
            oldest_snapshot: float(
                "sheaf_shard_oldest_snapshot_seconds",
                "Age of the oldest transaction holding a snapshot on the shard's server (vacuum cannot clean behind it), at the last sample",
                &["shard"],
            ),
            retries: counter(
                "sheaf_transaction_retries_total",
                "Statements run again after a transient conflict, by reason (deadlock, serialization)",
                &["shard", "reason"],
            ),
            superseded: counter(
                "sheaf_executions_superseded_total",
                "Executions a start through this client cancelled (on_conflict cancel_running, latest wins)",
                &["shard", "workflow"],
            ),
            in_flight: gauge(
                "sheaf_tasks_in_flight",
                "Tasks this process's workers hold now: claimed, their outcome not yet recorded",
                &["shard", "queue"],
            ),
            last_tick: float(
                "sheaf_loop_last_tick_timestamp_seconds",
                "When a loop of this process last went round, in seconds since the epoch, by loop (claim, maintenance, relay)",
                &["loop", "shard"],
            ),
        }
    }
}

/// Counts a task in `sheaf_tasks_in_flight` until dropped.
pub(crate) struct InFlight(prometheus::IntGauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One client's Prometheus metrics (no global registry, so two clients in
/// one process, or two tests, never share counters).
///
/// - `sheaf_shard_up{shard}`: 1 if the last probe reached the shard, else 0.
/// - `sheaf_shard_requests_total{shard,outcome}`: every call, by outcome
///   (`ok`, `connection_error`, `error`, `short_circuited`).
/// - `sheaf_shard_breaker_state{shard}`: 0 closed, 1 half-open, 2 open.
/// - `sheaf_shard_claimed_total{shard}`, `sheaf_shard_completed_total{shard}`:
///   tasks claimed and completed through this client.
/// - `sheaf_shard_stranded_ready{shard}`: ready tasks on queues with no live
///   worker, as the last `topology_status()` or worker refresh found them.
/// - `sheaf_shard_misplaced_runs{shard}`: live runs the shard's published
///   topology places on another shard (counted up to 1,000), as the last
///   `topology_status()` found them.
/// - `sheaf_tasks_total{shard,queue,outcome}`: what this process's workers
///   did with the tasks they claimed (`completed`, `failed`, `dead_lettered`,
///   `released`, `snoozed`, `lost`, `cancelled`).
/// - `sheaf_claim_duration_seconds{shard,queue}`: how long one claim call took.
/// - `sheaf_task_duration_seconds{shard,queue}`: from a worker's claim to the
///   task's outcome being recorded.
/// - The relay's ([`Relay`](crate::Relay)), `shard` being the shard whose rows it
///   drives: `sheaf_relay_taken_total{shard}`,
///   `sheaf_relay_attempts_total{target_shard,edge,outcome}`, and, refreshed
///   from `relay_backlog()`, `sheaf_relay_in_flight{shard,target_shard,state}`
///   (lifecycle rows: `STARTING`, `RUNNING`) and
///   `sheaf_relay_oldest_unsettled_seconds{shard,target_shard}`.
/// - The outbox's: `sheaf_outbox_deliveries_total{shard,kind,outcome}`,
///   `sheaf_outbox_indeterminate_total{shard,kind}` (`shard`: the one that
///   could not be inspected), `sheaf_outbox_found_over_incomplete_fanout_total{kind}`,
///   and, from `outbox_backlog()`, `sheaf_outbox_pending{shard,kind}`,
///   `sheaf_outbox_oldest_pending_seconds{shard,kind}` and
///   `sheaf_outbox_oldest_indeterminate_seconds{shard,kind}` (how long a row
///   has waited on a shard that cannot be read: what to alert on).
/// - `sheaf_protocol_role{shard}`: 1 when this client's login on the shard
///   holds `sheaf_relay`, so the relay and rebalance auto-resume run there;
///   0 when it does not and they are off (a `Worker` running either, or a
///   [`Relay`](crate::Relay), asks each shard once at start).
/// - Sampled by [`Admin::sample_queues`](crate::Admin::sample_queues)
///   (the metrics server does it at most every 15 s per scrape):
///   `sheaf_queue_tasks{shard,queue,state}` (`ready`, `scheduled`,
///   `waiting`, `running`, `paused`, `dead`) and
///   `sheaf_queue_oldest_ready_seconds{shard,queue}`; a queue gone from a
///   shard is dropped at the next sample, at most 1,000 queues per shard.
/// - Also sampled by the metrics server: `sheaf_shard_ready{shard}` (1 when
///   [`Admin::fleet_readiness`](crate::Admin::fleet_readiness) finds nothing
///   holding the shard back) and `sheaf_shard_oldest_snapshot_seconds{shard}`
///   (the oldest open snapshot on the shard's server, which vacuum cannot
///   clean behind).
/// - `sheaf_transaction_retries_total{shard,reason}`: statements run again
///   after a `deadlock` or `serialization` conflict.
/// - `sheaf_executions_superseded_total{shard,workflow}`: executions a start
///   through this client cancelled (`cancel_running`).
/// - `sheaf_tasks_in_flight{shard,queue}`: tasks this process's workers hold.
/// - `sheaf_loop_last_tick_timestamp_seconds{loop,shard}`: when each loop
///   ([`Loop`]) last went round; `time() -` it is the loop's silence.
pub struct Metrics {
    registry: Registry,
    up: IntGaugeVec,
    requests: IntCounterVec,
    breaker: IntGaugeVec,
    claimed: IntCounterVec,
    completed: IntCounterVec,
    stranded: IntGaugeVec,
    misplaced: IntGaugeVec,
    tasks: IntCounterVec,
    claim_seconds: HistogramVec,
    task_seconds: HistogramVec,
    relay: RelayMetrics,
    queue_tasks: IntGaugeVec,
    queue_oldest: GaugeVec,
    health: HealthMetrics,
    /// The queues each shard's last sample exported.
    sampled: Mutex<BTreeMap<ShardId, BTreeSet<String>>>,
}

/// The most queues of one shard a sample exports (by name): the series a
/// scrape carries stay bounded however many queues a shard has.
pub(crate) const MAX_SAMPLED_QUEUES: usize = 1_000;

/// The states `sheaf_queue_tasks` counts.
pub(crate) const QUEUE_STATES: [&str; 6] = ["ready", "scheduled", "waiting", "running", "paused", "dead"];

/// One queue of one shard as a sample sees it: its count per
/// [`QUEUE_STATES`] state, and its oldest ready task's age in seconds.
pub(crate) struct QueueSample {
    pub(crate) queue: String,
    pub(crate) counts: [i64; 6],
    pub(crate) oldest_ready_secs: Option<f64>,
}

/// `sheaf_queue_oldest_ready_seconds`, registered in `registry`.
fn oldest_ready_gauge(registry: &Registry) -> GaugeVec {
    let g = GaugeVec::new(
        Opts::new(
            "sheaf_queue_oldest_ready_seconds",
            "The age of a queue's oldest ready task on a shard, at the last sample (0 when none is ready)",
        ),
        &["shard", "queue"],
    )
    .expect("a valid metric definition");
    registry.register(Box::new(g.clone())).expect("registered once");
    g
}

impl Metrics {
    // One definition per family, in the order the module lists them.
    #[allow(clippy::too_many_lines)]
    pub(crate) fn new() -> Metrics {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid metric definition");
            registry.register(Box::new(g.clone())).expect("registered once");
            g
        };
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("a valid metric definition");
            registry.register(Box::new(c.clone())).expect("registered once");
            c
        };
        let up = gauge(
            "sheaf_shard_up",
            "1 if the last probe reached the shard, else 0",
            &["shard"],
        );
        let requests = counter(
            "sheaf_shard_requests_total",
            "Calls to a shard by outcome: ok, connection_error, error, short_circuited",
            &["shard", "outcome"],
        );
        let breaker = gauge(
            "sheaf_shard_breaker_state",
            "The shard's circuit breaker: 0 closed, 1 half-open, 2 open",
            &["shard"],
        );
        let claimed = counter(
            "sheaf_shard_claimed_total",
            "Tasks claimed from the shard",
            &["shard"],
        );
        let completed = counter(
            "sheaf_shard_completed_total",
            "Tasks completed on the shard",
            &["shard"],
        );
        let stranded = gauge(
            "sheaf_shard_stranded_ready",
            "Ready tasks on queues no live worker serves, at the last status probe",
            &["shard"],
        );
        let misplaced = gauge(
            "sheaf_shard_misplaced_runs",
            "Live runs the shard's published topology places on another shard, at the last status probe (counted up to 1000)",
            &["shard"],
        );
        let tasks = counter(
            "sheaf_tasks_total",
            "Claimed tasks by what became of them: completed, failed, dead_lettered, released, snoozed, lost, cancelled",
            &["shard", "queue", "outcome"],
        );
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
            let h = HistogramVec::new(opts, &["shard", "queue"]).expect("a valid metric definition");
            registry.register(Box::new(h.clone())).expect("registered once");
            h
        };
        let claim_seconds = histogram(
            "sheaf_claim_duration_seconds",
            "How long one claim call took",
            CLAIM_BUCKETS,
        );
        let task_seconds = histogram(
            "sheaf_task_duration_seconds",
            "From a worker's claim of a task to its outcome being recorded",
            TASK_BUCKETS,
        );
        let relay = RelayMetrics::new(&counter, &gauge);
        let queue_tasks = gauge(
            "sheaf_queue_tasks",
            "A queue's tasks on a shard by state (ready, scheduled, waiting, running, paused, dead), at the last sample",
            &["shard", "queue", "state"],
        );
        let queue_oldest = oldest_ready_gauge(&registry);
        let health = HealthMetrics::new(&registry, &counter, &gauge);
        Metrics {
            health,
            queue_tasks,
            queue_oldest,
            sampled: Mutex::new(BTreeMap::new()),
            registry,
            relay,
            up,
            requests,
            breaker,
            claimed,
            completed,
            stranded,
            misplaced,
            tasks,
            claim_seconds,
            task_seconds,
        }
    }

    pub(crate) fn task(&self, shard: ShardId, queue: &str, outcome: TaskOutcome) {
        self.tasks
            .with_label_values(&[&shard.to_string(), queue, outcome.label()])
            .inc();
    }

    pub(crate) fn claim_took(&self, shard: ShardId, queue: &str, took: Duration) {
        self.claim_seconds
            .with_label_values(&[&shard.to_string(), queue])
            .observe(took.as_secs_f64());
    }

    pub(crate) fn task_took(&self, shard: ShardId, queue: &str, took: Duration) {
        self.task_seconds
            .with_label_values(&[&shard.to_string(), queue])
            .observe(took.as_secs_f64());
    }

    /// How many claimed tasks of `queue` on `shard` ended with `outcome`.
    pub fn tasks_total(&self, shard: ShardId, queue: &str, outcome: TaskOutcome) -> u64 {
        self.tasks
            .with_label_values(&[&shard.to_string(), queue, outcome.label()])
            .get()
    }

    /// How many claim calls on `shard` for `queue` were timed.
    pub fn claims_timed(&self, shard: ShardId, queue: &str) -> u64 {
        self.claim_seconds
            .with_label_values(&[&shard.to_string(), queue])
            .get_sample_count()
    }

    /// The last `sheaf_shard_up` value for `shard`.
    pub fn shard_up(&self, shard: ShardId) -> bool {
        self.up.with_label_values(&[&shard.to_string()]).get() == 1
    }

    /// The last `sheaf_shard_stranded_ready` value for `shard`.
    pub fn stranded_ready(&self, shard: ShardId) -> i64 {
        self.stranded.with_label_values(&[&shard.to_string()]).get()
    }

    pub(crate) fn request(&self, shard: ShardId, outcome: Outcome) {
        self.requests
            .with_label_values(&[&shard.to_string(), outcome.label()])
            .inc();
    }

    pub(crate) fn relay_taken(&self, shard: ShardId, n: usize) {
        self.relay
            .taken
            .with_label_values(&[&shard.to_string()])
            .inc_by(n as u64);
    }

    pub(crate) fn relay_attempt(&self, target: ShardId, edge: RelayEdge, failed: bool) {
        let outcome = if failed { "failed" } else { "ok" };
        self.relay
            .attempts
            .with_label_values(&[&target.to_string(), edge.label(), outcome])
            .inc();
    }

    /// Relay edges run against `target` by edge and outcome.
    pub fn relay_attempts_total(&self, target: ShardId, edge: RelayEdge, failed: bool) -> u64 {
        let outcome = if failed { "failed" } else { "ok" };
        self.relay
            .attempts
            .with_label_values(&[&target.to_string(), edge.label(), outcome])
            .get()
    }

    /// Sets `shard`'s relay gauges from its backlogs (every shard of the
    /// topology as a child's shard, so a group that emptied reads 0).
    pub(crate) fn relay_backlog(
        &self,
        shard: ShardId,
        targets: &[ShardId],
        children: &[crate::client::RelayBacklog],
        outbox: &[crate::client::OutboxBacklog],
        now: std::time::SystemTime,
    ) {
        let age = |t: std::time::SystemTime| now.duration_since(t).map_or(0, |d| d.as_secs() as i64);
        let s = shard.to_string();
        for target in targets {
            let t = target.to_string();
            let of = |started: Option<bool>| {
                children
                    .iter()
                    .filter(move |b| b.target_shard == *target && started.is_none_or(|s| b.started == s))
            };
            for (state, started) in [("STARTING", false), ("RUNNING", true)] {
                let n: i64 = of(Some(started)).map(|b| b.rows).sum();
                self.relay.in_flight.with_label_values(&[&s, &t, state]).set(n);
            }
            let oldest = of(None).map(|b| b.oldest).min().map_or(0, age);
            self.relay
                .oldest_unsettled
                .with_label_values(&[&s, &t])
                .set(oldest);
        }
        for kind in ["signal", "cancel"] {
            let of = || outbox.iter().filter(|b| b.kind == kind);
            self.relay
                .outbox_pending
                .with_label_values(&[&s, kind])
                .set(of().map(|b| b.rows).sum());
            self.relay
                .oldest_pending
                .with_label_values(&[&s, kind])
                .set(of().map(|b| b.oldest).min().map_or(0, age));
            let stuck = of().filter_map(|b| b.indeterminate_since).min().map_or(0, age);
            self.relay
                .oldest_indeterminate
                .with_label_values(&[&s, kind])
                .set(stuck);
        }
    }

    pub(crate) fn ready(&self, shard: ShardId, ready: bool) {
        self.health
            .ready
            .with_label_values(&[&shard.to_string()])
            .set(i64::from(ready));
    }

    /// The last `sheaf_shard_ready` of `shard` (false until it is known).
    pub fn shard_ready(&self, shard: ShardId) -> bool {
        self.health.ready.with_label_values(&[&shard.to_string()]).get() == 1
    }

    pub(crate) fn oldest_snapshot(&self, shard: ShardId, secs: f64) {
        self.health
            .oldest_snapshot
            .with_label_values(&[&shard.to_string()])
            .set(secs);
    }

    /// A statement on `shard` run again after the transient conflict
    /// `code`: a serialization failure, or else a deadlock.
    pub(crate) fn retried(&self, shard: ShardId, code: Option<&SqlState>) {
        let reason = if code == Some(&SqlState::T_R_SERIALIZATION_FAILURE) {
            "serialization"
        } else {
            "deadlock"
        };
        self.health
            .retries
            .with_label_values(&[&shard.to_string(), reason])
            .inc();
    }

    pub(crate) fn superseded(&self, shard: ShardId, workflow: &str, n: usize) {
        if n > 0 {
            self.health
                .superseded
                .with_label_values(&[&shard.to_string(), workflow])
                .inc_by(n as u64);
        }
    }

    /// Executions of `workflow` on `shard` superseded by starts through this client.
    pub fn superseded_total(&self, shard: ShardId, workflow: &str) -> u64 {
        self.health
            .superseded
            .with_label_values(&[&shard.to_string(), workflow])
            .get()
    }

    /// Counts a task of `queue` on `shard` in hand until the guard drops.
    pub(crate) fn in_flight(&self, shard: ShardId, queue: &str) -> InFlight {
        let g = self
            .health
            .in_flight
            .with_label_values(&[&shard.to_string(), queue]);
        g.inc();
        InFlight(g)
    }

    /// The tasks of `queue` on `shard` this process's workers hold now.
    pub fn tasks_in_flight(&self, shard: ShardId, queue: &str) -> i64 {
        self.health
            .in_flight
            .with_label_values(&[&shard.to_string(), queue])
            .get()
    }

    /// `what` went round for `shard` now.
    pub(crate) fn tick(&self, what: Loop, shard: ShardId) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.health
            .last_tick
            .with_label_values(&[what.label(), &shard.to_string()])
            .set(now);
    }

    pub(crate) fn protocol_role(&self, shard: ShardId, held: bool) {
        self.relay
            .protocol_role
            .with_label_values(&[&shard.to_string()])
            .set(i64::from(held));
    }

    /// The last `sheaf_protocol_role` of `shard` (false until it is known).
    pub fn protocol_role_held(&self, shard: ShardId) -> bool {
        self.relay
            .protocol_role
            .with_label_values(&[&shard.to_string()])
            .get()
            == 1
    }

    pub(crate) fn outbox_delivery(&self, shard: ShardId, kind: &str, outcome: &str) {
        self.relay
            .deliveries
            .with_label_values(&[&shard.to_string(), kind, outcome])
            .inc();
    }

    pub(crate) fn outbox_indeterminate(&self, uninspected: ShardId, kind: &str) {
        self.relay
            .indeterminate
            .with_label_values(&[&uninspected.to_string(), kind])
            .inc();
    }

    pub(crate) fn outbox_over_incomplete(&self, kind: &str) {
        self.relay.over_incomplete.with_label_values(&[kind]).inc();
    }

    /// Outbox rows of `shard` the relay drove to `outcome`.
    pub fn outbox_deliveries_total(&self, shard: ShardId, kind: &str, outcome: &str) -> u64 {
        self.relay
            .deliveries
            .with_label_values(&[&shard.to_string(), kind, outcome])
            .get()
    }

    /// By-key resolutions of `kind` left indeterminate because `shard`
    /// could not be inspected.
    pub fn outbox_indeterminate_total(&self, shard: ShardId, kind: &str) -> u64 {
        self.relay
            .indeterminate
            .with_label_values(&[&shard.to_string(), kind])
            .get()
    }

    /// The last `sheaf_outbox_pending` of `shard` for `kind`.
    pub fn outbox_pending(&self, shard: ShardId, kind: &str) -> i64 {
        self.relay
            .outbox_pending
            .with_label_values(&[&shard.to_string(), kind])
            .get()
    }

    /// The last `sheaf_relay_in_flight` of `shard`'s rows for `target`.
    pub fn relay_in_flight(&self, shard: ShardId, target: ShardId, state: &str) -> i64 {
        self.relay
            .in_flight
            .with_label_values(&[&shard.to_string(), &target.to_string(), state])
            .get()
    }

    pub(crate) fn claimed(&self, shard: ShardId, n: usize) {
        self.claimed
            .with_label_values(&[&shard.to_string()])
            .inc_by(n as u64);
    }

    pub(crate) fn completed(&self, shard: ShardId, n: usize) {
        self.completed
            .with_label_values(&[&shard.to_string()])
            .inc_by(n as u64);
    }

    pub(crate) fn probed(&self, shard: ShardId, up: bool, stranded_ready: Option<i64>) {
        let label = shard.to_string();
        self.up.with_label_values(&[&label]).set(i64::from(up));
        if let Some(n) = stranded_ready {
            self.stranded.with_label_values(&[&label]).set(n);
        }
    }

    pub(crate) fn misplaced(&self, shard: ShardId, runs: i64) {
        self.misplaced.with_label_values(&[&shard.to_string()]).set(runs);
    }

    pub(crate) fn breaker(&self, shard: ShardId, state: BreakerState) {
        self.breaker
            .with_label_values(&[&shard.to_string()])
            .set(state.as_gauge() as i64);
    }

    /// A counter's current value, for tests and reports.
    pub fn requests_total(&self, shard: ShardId, outcome: Outcome) -> u64 {
        self.requests
            .with_label_values(&[&shard.to_string(), outcome.label()])
            .get()
    }

    /// A shard's queues as sampled now: their series replace the last
    /// sample's, and a queue no longer there is dropped.
    pub(crate) fn queues(&self, shard: ShardId, sample: &[QueueSample]) {
        let id = shard.to_string();
        let mut sampled = self.sampled.lock().unwrap_or_else(|p| p.into_inner());
        let before = sampled.remove(&shard).unwrap_or_default();
        let mut now = BTreeSet::new();
        for q in sample.iter().take(MAX_SAMPLED_QUEUES) {
            for (state, n) in QUEUE_STATES.iter().zip(q.counts) {
                self.queue_tasks
                    .with_label_values(&[id.as_str(), &q.queue, state])
                    .set(n);
            }
            self.queue_oldest
                .with_label_values(&[id.as_str(), &q.queue])
                .set(q.oldest_ready_secs.unwrap_or(0.0));
            now.insert(q.queue.clone());
        }
        for gone in before.difference(&now) {
            for state in QUEUE_STATES {
                let _ = self.queue_tasks.remove_label_values(&[id.as_str(), gone, state]);
            }
            let _ = self.queue_oldest.remove_label_values(&[id.as_str(), gone]);
        }
        sampled.insert(shard, now);
    }

    /// A queue's sampled count of tasks in `state` on `shard`.
    pub fn queue_tasks(&self, shard: ShardId, queue: &str, state: &str) -> i64 {
        self.queue_tasks
            .with_label_values(&[&shard.to_string(), queue, state])
            .get()
    }

    /// The text exposition format.
    pub(crate) fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail on I/O; a failure would be a
        // malformed family, which the fixed definitions above rule out.
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_carries_each_family_with_its_labels() {
        let m = Metrics::new();
        let s1 = ShardId::new(1).unwrap();
        m.request(s1, Outcome::Ok);
        m.request(s1, Outcome::Ok);
        m.request(s1, Outcome::ShortCircuited);
        m.claimed(s1, 5);
        m.completed(s1, 4);
        m.probed(s1, true, Some(3));
        m.breaker(s1, BreakerState::Open);
        m.task(s1, "q", TaskOutcome::DeadLettered);
        m.claim_took(s1, "q", Duration::from_millis(3));
        m.task_took(s1, "q", Duration::from_secs(2));
        m.protocol_role(s1, false);
        let text = m.render();
        for line in [
            r#"sheaf_shard_requests_total{outcome="ok",shard="1"} 2"#,
            r#"sheaf_shard_requests_total{outcome="short_circuited",shard="1"} 1"#,
            r#"sheaf_shard_claimed_total{shard="1"} 5"#,
            r#"sheaf_shard_completed_total{shard="1"} 4"#,
            r#"sheaf_shard_up{shard="1"} 1"#,
            r#"sheaf_shard_breaker_state{shard="1"} 2"#,
            r#"sheaf_shard_stranded_ready{shard="1"} 3"#,
            "# TYPE sheaf_shard_requests_total counter",
            "# TYPE sheaf_shard_up gauge",
            r#"sheaf_tasks_total{outcome="dead_lettered",queue="q",shard="1"} 1"#,
            r#"sheaf_claim_duration_seconds_bucket{queue="q",shard="1",le="0.005"} 1"#,
            r#"sheaf_task_duration_seconds_bucket{queue="q",shard="1",le="1"} 0"#,
            r#"sheaf_task_duration_seconds_count{queue="q",shard="1"} 1"#,
            "# TYPE sheaf_claim_duration_seconds histogram",
            r#"sheaf_protocol_role{shard="1"} 0"#,
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert_eq!(m.requests_total(s1, Outcome::Ok), 2);
        assert_eq!(m.tasks_total(s1, "q", TaskOutcome::DeadLettered), 1);
        assert_eq!(m.claims_timed(s1, "q"), 1);
        assert!(m.shard_up(s1));
        assert_eq!(m.stranded_ready(s1), 3);
        assert!(!m.protocol_role_held(s1));
        m.protocol_role(s1, true);
        assert!(m.protocol_role_held(s1));
    }

    #[test]
    fn health_series_count_what_happened_and_in_flight_tasks_come_back_down() {
        let m = Metrics::new();
        let s1 = ShardId::new(1).unwrap();
        m.ready(s1, false);
        m.oldest_snapshot(s1, 12.5);
        m.retried(s1, Some(&SqlState::T_R_DEADLOCK_DETECTED));
        m.retried(s1, Some(&SqlState::T_R_SERIALIZATION_FAILURE));
        m.superseded(s1, "invoice", 2);
        m.superseded(s1, "quiet", 0);
        m.tick(Loop::Relay, s1);
        let held = [m.in_flight(s1, "q"), m.in_flight(s1, "q")];
        let text = m.render();
        for line in [
            r#"sheaf_shard_ready{shard="1"} 0"#,
            r#"sheaf_shard_oldest_snapshot_seconds{shard="1"} 12.5"#,
            r#"sheaf_transaction_retries_total{reason="deadlock",shard="1"} 1"#,
            r#"sheaf_transaction_retries_total{reason="serialization",shard="1"} 1"#,
            r#"sheaf_executions_superseded_total{shard="1",workflow="invoice"} 2"#,
            r#"sheaf_tasks_in_flight{queue="q",shard="1"} 2"#,
            r#"sheaf_loop_last_tick_timestamp_seconds{loop="relay",shard="1"} "#,
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("quiet"), "no series for nothing superseded");
        assert!(
            !text.contains(r#"loop="claim""#),
            "no tick before a loop goes round"
        );
        drop(held);
        assert_eq!(m.tasks_in_flight(s1, "q"), 0);
        assert!(!m.shard_ready(s1));
    }
}
