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
//!   worker, as the last `topology_status()` found them.

use prometheus::{Encoder, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

use crate::breaker::BreakerState;
use crate::topology::ShardId;

/// How one call to a shard ended, for `sheaf_shard_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// One client's metrics.
pub struct Metrics {
    registry: Registry,
    up: IntGaugeVec,
    requests: IntCounterVec,
    breaker: IntGaugeVec,
    claimed: IntCounterVec,
    completed: IntCounterVec,
    stranded: IntGaugeVec,
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
        Metrics {
            registry,
            up,
            requests,
            breaker,
            claimed,
            completed,
            stranded,
        }
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
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert_eq!(m.requests_total(s1, Outcome::Ok), 2);
    }
}
