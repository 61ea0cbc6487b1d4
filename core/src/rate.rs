//! Rate limits (`sheaf.declare_rate_limit`) and start throttles (a
//! workflow policy's `throttle`): their specs, and the admission time of each
//! unit of work by the generic cell rate algorithm (GCRA), a token bucket
//! kept as one timestamp.
//!
//! A bucket of `rate` per `period` with room for `burst` is its theoretical
//! arrival time `tat`: a unit may be admitted at `t` once `t >= tat - tau`,
//! where `T = period / rate` is the emission interval and `tau = (burst - 1)
//! × T`; admitting it moves `tat` to `max(tat, t) + T`. So in any window of
//! length `W`, at most `burst + W / T` units are admitted, and a backlog
//! drains at exactly one unit per `T`. Times are microseconds since the Unix
//! epoch.

use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::excerpt::{excerpt, quoted};
use crate::options::{MAX_KEY_BYTES, OptionError};

/// The longest period, and the shortest.
const MAX_PERIOD: Duration = Duration::from_secs(366 * 86_400);
const MIN_PERIOD: Duration = Duration::from_millis(1);
/// The largest burst.
pub const MAX_BURST: i64 = 1_000_000;
/// The most units per second a bucket admits (an interval under 1 µs is
/// not kept).
const MAX_PER_SECOND: f64 = 1_000_000.0;
/// The most path segments a key path may have.
const MAX_PATH_SEGMENTS: usize = 16;

fn err(option: &str, why: impl Into<String>) -> OptionError {
    OptionError {
        option: option.to_owned(),
        why: why.into(),
    }
}

/// A pace: `rate` units per `period`, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    pub rate: f64,
    pub period: Duration,
    pub burst: i64,
}

impl Pace {
    /// Checks a pace read from `option`'s fields (`rate`, `period`, `burst`).
    pub fn new(option: &str, rate: f64, period: Duration, burst: i64) -> Result<Pace, OptionError> {
        if !rate.is_finite() || rate <= 0.0 {
            return Err(err(
                &format!("{option}.rate"),
                format!("must be a positive number, got {rate}"),
            ));
        }
        if !(MIN_PERIOD..=MAX_PERIOD).contains(&period) {
            return Err(err(
                &format!("{option}.period"),
                format!(
                    "must be from {} to {}, got {}",
                    humantime::format_duration(MIN_PERIOD),
                    humantime::format_duration(MAX_PERIOD),
                    humantime::format_duration(period)
                ),
            ));
        }
        if rate / period.as_secs_f64() > MAX_PER_SECOND {
            return Err(err(
                &format!("{option}.rate"),
                format!(
                    "{rate} per {} is over {MAX_PER_SECOND} a second",
                    humantime::format_duration(period)
                ),
            ));
        }
        if !(1..=MAX_BURST).contains(&burst) {
            return Err(err(
                &format!("{option}.burst"),
                format!("must be from 1 to {MAX_BURST}, got {burst}"),
            ));
        }
        Ok(Pace { rate, period, burst })
    }

    /// The emission interval `T`, in microseconds.
    pub fn interval(&self) -> f64 {
        self.period.as_secs_f64() * 1e6 / self.rate
    }

    /// The earliest time a unit may be admitted given the bucket's `tat`,
    /// not before `now`, and the bucket's `tat` after admitting it.
    pub fn admit(&self, tat: i64, now: i64) -> (i64, i64) {
        let t = self.interval();
        let tau = (self.burst - 1) as f64 * t;
        let at = now.max((tat as f64 - tau).ceil() as i64);
        (at, (tat.max(at) as f64 + t).round() as i64)
    }

    /// When the next unit may be admitted given `tat` (maybe in the past).
    pub fn next_at(&self, tat: i64) -> i64 {
        let tau = (self.burst - 1) as f64 * self.interval();
        (tat as f64 - tau).ceil() as i64
    }

    /// Whether a bucket at `tat` is full at `now`: it admits `burst` at
    /// once, as a bucket never used does (so it can be forgotten).
    pub fn is_full(&self, tat: i64, now: i64) -> bool {
        tat <= now
    }

    fn to_json(self) -> Value {
        json!({
            "rate": self.rate,
            "period": humantime::format_duration(self.period).to_string(),
            "burst": self.burst,
        })
    }
}

fn object<'a>(option: &str, v: &'a Value, accepted: &[&str]) -> Result<&'a Map<String, Value>, OptionError> {
    let map = v
        .as_object()
        .ok_or_else(|| err(option, format!("must be a JSON object, got {}", excerpt(v))))?;
    if let Some(k) = map.keys().find(|k| !accepted.contains(&k.as_str())) {
        return Err(err(
            option,
            format!("unknown field {} (accepted: {})", quoted(k), accepted.join(", ")),
        ));
    }
    Ok(map)
}

/// A dot path `root` or `root.a.b`; the segments after the root.
pub fn key_path(option: &str, v: &Value, root: &str) -> Result<Vec<String>, OptionError> {
    let s = v.as_str().ok_or_else(|| {
        err(
            option,
            format!("must be a dot path like \"{root}.tenant_id\", got {}", excerpt(v)),
        )
    })?;
    let mut segments = s.split('.');
    if segments.next() != Some(root) {
        return Err(err(
            option,
            format!("must start with \"{root}\", got {}", quoted(s)),
        ));
    }
    let rest: Vec<String> = segments.map(str::to_owned).collect();
    if rest.iter().any(|seg| seg.is_empty() || seg.len() > MAX_KEY_BYTES) || rest.len() > MAX_PATH_SEGMENTS {
        return Err(err(
            option,
            format!(
                "must be \"{root}\" followed by 0 to {MAX_PATH_SEGMENTS} .segments of 1 to {MAX_KEY_BYTES} bytes, got {}",
                quoted(s)
            ),
        ));
    }
    Ok(rest)
}

/// A pace's fields in `m`: `rate` (a positive number), `period` (a
/// duration, default 1 second), `burst` (default: `rate` rounded up).
fn pace(option: &str, m: &Map<String, Value>) -> Result<Pace, OptionError> {
    let rate = match m.get("rate") {
        Some(v) => v.as_f64().ok_or_else(|| {
            err(
                &format!("{option}.rate"),
                format!("must be a number, got {}", excerpt(v)),
            )
        })?,
        None => return Err(err(&format!("{option}.rate"), "is required")),
    };
    let period = match m.get("period") {
        None | Some(Value::Null) => Duration::from_secs(1),
        Some(v) => crate::duration::parse(v, MIN_PERIOD, MAX_PERIOD)
            .map_err(|why| err(&format!("{option}.period"), why))?,
    };
    let burst = match m.get("burst") {
        None | Some(Value::Null) => (rate.ceil() as i64).clamp(1, MAX_BURST),
        Some(v) => crate::policy::whole_number(v).ok_or_else(|| {
            err(
                &format!("{option}.burst"),
                format!("must be a whole number, got {}", excerpt(v)),
            )
        })?,
    };
    Pace::new(option, rate, period, burst)
}

/// A declared rate limit: its pace and, if keyed, where each task's key is.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimit {
    pub pace: Pace,
    /// Path segments after `payload`; `None`: one bucket for every task.
    pub key: Option<Vec<String>>,
    /// The spec with every default spelled out.
    pub normalized: Value,
}

impl RateLimit {
    /// `{"rate": 10, "period": "1s", "burst": 10, "key": "payload.tenant"}`.
    pub fn parse(spec: &Value) -> Result<RateLimit, OptionError> {
        let m = object("spec", spec, &["rate", "period", "burst", "key"])?;
        let pace = pace("spec", m)?;
        let key = match m.get("key") {
            None | Some(Value::Null) => None,
            Some(v) => Some(key_path("spec.key", v, "payload")?),
        };
        let mut normalized = pace.to_json();
        if let Some(k) = &key {
            normalized["key"] = json!(
                std::iter::once("payload".to_owned())
                    .chain(k.iter().cloned())
                    .collect::<Vec<_>>()
                    .join(".")
            );
        }
        Ok(RateLimit {
            pace,
            key,
            normalized,
        })
    }
}

/// A start throttle (`declare_workflow` policy `throttle`): its pace and,
/// if keyed, where each start's key is in its input.
#[derive(Debug, Clone, PartialEq)]
pub struct Throttle {
    pub pace: Pace,
    /// Path segments after `input`; `None`: one bucket for the workflow.
    pub key: Option<Vec<String>>,
}

impl Throttle {
    /// `{"rate": 5, "period": "1s", "burst": 5, "key": "input.tenant"}`.
    pub fn parse(v: &Value) -> Result<Throttle, OptionError> {
        let m = object("policy.throttle", v, &["rate", "period", "burst", "key"])?;
        let pace = pace("policy.throttle", m)?;
        let key = match m.get("key") {
            None | Some(Value::Null) => None,
            Some(k) => Some(key_path("policy.throttle.key", k, "input")?),
        };
        Ok(Throttle { pace, key })
    }

    pub fn to_json(&self) -> Value {
        let mut v = self.pace.to_json();
        if let Some(k) = &self.key {
            v["key"] = json!(
                std::iter::once("input".to_owned())
                    .chain(k.iter().cloned())
                    .collect::<Vec<_>>()
                    .join(".")
            );
        }
        v
    }
}

/// The name a throttle's buckets and overrides go by.
pub fn throttle_name(workflow: &str) -> String {
    format!("workflow:{workflow}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    fn pace(rate: f64, period_ms: u64, burst: i64) -> Pace {
        Pace::new("spec", rate, Duration::from_millis(period_ms), burst).unwrap()
    }

    #[test]
    fn a_fresh_bucket_admits_its_burst_then_one_per_interval() {
        let p = pace(10.0, 1000, 3);
        let now = 100 * S;
        let mut tat = 0;
        let mut at = Vec::new();
        for _ in 0..6 {
            let (a, next) = p.admit(tat, now);
            at.push(a - now);
            tat = next;
        }
        assert_eq!(at, [0, 0, 0, 100_000, 200_000, 300_000]);
    }

    #[test]
    fn no_window_admits_more_than_burst_plus_its_length_over_the_interval() {
        // Arrivals at random times; admissions checked over every window.
        let p = pace(50.0, 1000, 5);
        let t = p.interval();
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut now = 0i64;
        let mut tat = 0i64;
        let mut admitted = Vec::new();
        for _ in 0..5_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            now += (rng % 40_000) as i64;
            let (a, next) = p.admit(tat, now);
            admitted.push(a);
            tat = next;
        }
        admitted.sort_unstable();
        for (i, &start) in admitted.iter().enumerate() {
            for w in [10_000i64, 100_000, 1_000_000, 10_000_000] {
                let n = admitted[i..].iter().take_while(|&&a| a < start + w).count() as f64;
                assert!(n <= p.burst as f64 + w as f64 / t + 1e-9, "{n} in {w} µs");
            }
        }
    }

    #[test]
    fn a_backlog_drains_at_the_rate() {
        let p = pace(100.0, 1000, 10);
        let now = 0;
        let mut tat = 0;
        let mut last = 0;
        for _ in 0..6_010 {
            let (a, next) = p.admit(tat, now);
            last = a;
            tat = next;
        }
        // 10 at once, then 6,000 more at 100 a second: 60 s.
        assert_eq!(last, 60 * S);
    }

    #[test]
    fn specs_parse_with_defaults_and_refuse_what_is_wrong() {
        let r = RateLimit::parse(&json!({"rate": 10, "key": "payload.tenant"})).unwrap();
        assert_eq!(r.pace.burst, 10);
        assert_eq!(
            RateLimit::parse(&json!({"rate": 1, "burst": 5.0}))
                .unwrap()
                .pace
                .burst,
            5
        );
        assert_eq!(r.pace.period, Duration::from_secs(1));
        assert_eq!(r.key.as_deref(), Some(&["tenant".to_owned()][..]));
        assert_eq!(RateLimit::parse(&r.normalized).unwrap(), r);
        let t = Throttle::parse(&json!({"rate": 0.5, "period": "1 minute"})).unwrap();
        assert_eq!((t.pace.burst, t.key), (1, None));
        for bad in [
            json!({}),
            json!({"rate": 0}),
            json!({"rate": -1}),
            json!({"rate": "fast"}),
            json!({"rate": 1, "period": "0s"}),
            json!({"rate": 1, "burst": 0}),
            json!({"rate": 1, "burst": 1.5}),
            json!({"rate": 2_000_000}),
            json!({"rate": 1, "key": "input.tenant"}),
            json!({"rate": 1, "key": "payload..x"}),
            json!({"rate": 1, "color": "red"}),
        ] {
            assert!(RateLimit::parse(&bad).is_err(), "{bad}");
        }
        assert!(Throttle::parse(&json!({"rate": 1, "key": "payload.t"})).is_err());
    }
}
