//! The per-shard circuit breaker, [`Breaker`].

use std::time::{Duration, Instant};

/// Where a shard's breaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Short-circuited: calls fail at once, nothing is sent.
    Open,
    /// The cooldown is over: one probe call goes through.
    HalfOpen,
}

impl BreakerState {
    /// Its name as pages and reports show it: `closed`, `open`, `half-open`.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half-open",
        }
    }

    /// The gauge value exported as `sheaf_shard_breaker_state`.
    pub fn as_gauge(self) -> f64 {
        match self {
            BreakerState::Closed => 0.0,
            BreakerState::HalfOpen => 1.0,
            BreakerState::Open => 2.0,
        }
    }
}

/// One shard's breaker state machine.
///
/// A per-shard circuit breaker: after `threshold` consecutive connection
/// failures the shard is short-circuited for `cooldown`, then one probe is let
/// through (half-open); its success closes the breaker, its failure re-opens it.
/// A probe whose outcome never comes (its caller gave up on it, or it found
/// the pool exhausted) is given up on after another cooldown, and the next
/// call is the probe: the breaker never waits on a lost probe forever.
///
/// Time is passed in, so the state machine is tested without sleeping.
#[derive(Debug, Clone)]
pub struct Breaker {
    threshold: u32,
    cooldown: Duration,
    failures: u32,
    opened_at: Option<Instant>,
    /// When the outstanding half-open probe was let through.
    probing: Option<Instant>,
}

impl Breaker {
    /// Opens after `threshold` consecutive failures (at least 1), for
    /// `cooldown`.
    pub fn new(threshold: u32, cooldown: Duration) -> Breaker {
        Breaker {
            threshold: threshold.max(1),
            cooldown,
            failures: 0,
            opened_at: None,
            probing: None,
        }
    }

    /// Its state at `now`.
    pub fn state(&self, now: Instant) -> BreakerState {
        match self.opened_at {
            None => BreakerState::Closed,
            Some(_) if self.probing.is_some() => BreakerState::HalfOpen,
            Some(at) if now.duration_since(at) >= self.cooldown => BreakerState::HalfOpen,
            Some(_) => BreakerState::Open,
        }
    }

    /// Whether a request may go to the shard now. In half-open, exactly one
    /// request (the probe) is let through until its outcome is recorded, or
    /// until a cooldown has passed without one (the probe was lost).
    pub fn allow(&mut self, now: Instant) -> bool {
        match self.state(now) {
            BreakerState::Closed => true,
            BreakerState::Open => false,
            BreakerState::HalfOpen => match self.probing {
                Some(at) if now.duration_since(at) < self.cooldown => false,
                _ => {
                    self.probing = Some(now);
                    true
                }
            },
        }
    }

    /// Records a call the shard served: closes the breaker.
    pub fn record_success(&mut self) {
        self.failures = 0;
        self.opened_at = None;
        self.probing = None;
    }

    /// Records a connection-level failure (not a SQL error: a refused query
    /// proves the shard is up).
    pub fn record_failure(&mut self, now: Instant) {
        if self.opened_at.is_some() {
            // The half-open probe failed: open again for a full cooldown.
            self.opened_at = Some(now);
            self.probing = None;
            return;
        }
        self.failures += 1;
        if self.failures >= self.threshold {
            self.opened_at = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOL: Duration = Duration::from_secs(5);

    #[test]
    fn opens_after_the_threshold_and_short_circuits() {
        let t0 = Instant::now();
        let mut b = Breaker::new(3, COOL);
        for _ in 0..2 {
            assert!(b.allow(t0));
            b.record_failure(t0);
        }
        assert_eq!(b.state(t0), BreakerState::Closed);
        b.record_failure(t0);
        assert_eq!(b.state(t0), BreakerState::Open);
        assert!(!b.allow(t0 + Duration::from_secs(1)));
    }

    #[test]
    fn a_success_resets_the_count() {
        let t0 = Instant::now();
        let mut b = Breaker::new(2, COOL);
        b.record_failure(t0);
        b.record_success();
        b.record_failure(t0);
        assert_eq!(b.state(t0), BreakerState::Closed);
    }

    #[test]
    fn half_open_lets_one_probe_through() {
        let t0 = Instant::now();
        let mut b = Breaker::new(1, COOL);
        b.record_failure(t0);
        let later = t0 + COOL;
        assert_eq!(b.state(later), BreakerState::HalfOpen);
        assert!(b.allow(later), "the probe");
        assert!(!b.allow(later), "only one probe at a time");
        b.record_success();
        assert_eq!(b.state(later), BreakerState::Closed);
        assert!(b.allow(later));
    }

    #[test]
    fn a_probe_whose_outcome_never_comes_is_given_up_after_a_cooldown() {
        let t0 = Instant::now();
        let mut b = Breaker::new(1, COOL);
        b.record_failure(t0);
        let probe_at = t0 + COOL;
        assert!(b.allow(probe_at), "the probe (then its caller drops it)");
        assert!(!b.allow(probe_at + COOL / 2), "still waiting on it");
        assert!(b.allow(probe_at + COOL), "a lost probe is replaced");
        b.record_success();
        assert_eq!(b.state(probe_at + COOL), BreakerState::Closed);
    }

    #[test]
    fn a_failed_probe_reopens_for_a_full_cooldown() {
        let t0 = Instant::now();
        let mut b = Breaker::new(1, COOL);
        b.record_failure(t0);
        let probe_at = t0 + COOL;
        assert!(b.allow(probe_at));
        b.record_failure(probe_at);
        assert_eq!(b.state(probe_at + Duration::from_secs(4)), BreakerState::Open);
        assert_eq!(b.state(probe_at + COOL), BreakerState::HalfOpen);
        assert_eq!(BreakerState::Open.as_gauge(), 2.0);
    }
}
