//! Prometheus metrics, per client (no global registry, so two clients in one
//! process, or two tests, never share counters).
//!
//! - `sheaf_shard_up{shard}`: 1 if the last probe reached the shard, else 0.
//! - `sheaf_shard_requests_total{shard,outcome}`: every call, by outcome
//!   (`ok`, `connection_error`, `error`, `short_circuited`).
//! - `sheaf_shard_breaker_state{shard}`: 0 closed, 1 half-open, 2 open.
//! - `sheaf_shard_claimed_total{shard}`, `sheaf_shard_completed_total{shard}`:
//!   tasks claimed and completed through this client.
//! - `sheaf_shard_stranded_ready{shard}`: ready tasks on queues with no live
//!   worker, as the last `topology_status()` or worker refresh found them.
//! - `sheaf_tasks_total{shard,queue,outcome}`: what this process's workers
//!   did with the tasks they claimed (`completed`, `failed`, `dead_lettered`,
//!   `released`, `snoozed`, `lost`).
//! - `sheaf_claim_duration_seconds{shard,queue}`: how long one claim call took.
//! - `sheaf_task_duration_seconds{shard,queue}`: from a worker's claim to the
//!   task's outcome being recorded.

use std::time::Duration;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

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
        }
    }
}

/// Claims are a seek: most take milliseconds.
const CLAIM_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
/// Handlers run from milliseconds to the longest leases.
const TASK_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// One client's metrics.
pub struct Metrics {
    registry: Registry,
    up: IntGaugeVec,
    requests: IntCounterVec,
    breaker: IntGaugeVec,
    claimed: IntCounterVec,
    completed: IntCounterVec,
    stranded: IntGaugeVec,
    tasks: IntCounterVec,
    claim_seconds: HistogramVec,
    task_seconds: HistogramVec,
}

impl Metrics {
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
        let tasks = counter(
            "sheaf_tasks_total",
            "Claimed tasks by what became of them: completed, failed, dead_lettered, released, snoozed, lost",
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
        Metrics {
            registry,
            up,
            requests,
            breaker,
            claimed,
            completed,
            stranded,
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
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert_eq!(m.requests_total(s1, Outcome::Ok), 2);
        assert_eq!(m.tasks_total(s1, "q", TaskOutcome::DeadLettered), 1);
        assert_eq!(m.claims_timed(s1, "q"), 1);
        assert!(m.shard_up(s1));
        assert_eq!(m.stranded_ready(s1), 3);
    }
}
