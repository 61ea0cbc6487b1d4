//! The `opts jsonb` arguments, parsed and validated. Unknown options are
//! refused, never ignored: a typo must not silently change behaviour.

use std::fmt;

use serde_json::{Map, Value};

use crate::placement::{Pin, placement_from_json};
use crate::state::TaskKind;

use crate::excerpt::{excerpt, quoted};

/// The longest key (concurrency, fairness, idempotency) or queue name, in bytes.
pub const MAX_KEY_BYTES: usize = 256;
/// The longest concurrency key: room for a workflow's derived key,
/// `<workflow name (<= 256)>:<resolved key (<= 256)>`.
pub const MAX_CONCURRENCY_KEY_BYTES: usize = 1024;
pub const MAX_QUEUE_NAME_BYTES: usize = 128;
pub const MAX_ATTEMPTS_LIMIT: i32 = 1_000;
/// Fairness weights are 0.001..=1000. A task's tags advance by `1 / weight`,
/// kept as `float8`: within this range a step (at least 0.001) stays exact
/// while the queue's virtual time is below ~2e12, billions of claims even at
/// the smallest weight. Far smaller weights pushed virtual time to ~1e300 in
/// a few claims, where adding a step changes nothing and every key ties.
pub const MIN_FAIRNESS_WEIGHT: f64 = 0.001;
pub const MAX_FAIRNESS_WEIGHT: f64 = 1_000.0;

/// A refused option: which one, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct OptionError {
    pub option: String,
    pub why: String,
}

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {}: {}", self.option, self.why)
    }
}

fn err(option: &str, why: impl Into<String>) -> OptionError {
    OptionError {
        option: option.to_owned(),
        why: why.into(),
    }
}

/// `sheaf.enqueue` options.
#[derive(Debug, Clone, PartialEq)]
pub struct EnqueueOptions {
    pub priority: i32,
    /// Unparsed: the extension parses it as a timestamptz.
    pub run_at: Option<String>,
    pub concurrency_key: Option<String>,
    pub fairness_key: Option<String>,
    pub fairness_weight: f64,
    pub max_attempts: i32,
    pub execution_id: Option<[u8; 16]>,
    pub kind: TaskKind,
    pub idempotency_key: Option<String>,
    /// A declared rate limit (`sheaf.declare_rate_limit`) the task waits on.
    pub rate_limit: Option<String>,
    /// Its bucket's key, over the limit's key path.
    pub rate_key: Option<String>,
    /// How the caller placed it (`opts.placement`): what a shard with a
    /// published topology checks a keyed or pinned task against.
    pub placement: Pin,
}

impl Default for EnqueueOptions {
    fn default() -> Self {
        EnqueueOptions {
            priority: 0,
            run_at: None,
            concurrency_key: None,
            fairness_key: None,
            fairness_weight: 1.0,
            max_attempts: 25,
            execution_id: None,
            kind: TaskKind::Activity,
            idempotency_key: None,
            rate_limit: None,
            rate_key: None,
            placement: Pin::Auto,
        }
    }
}

const ENQUEUE_OPTIONS: &[&str] = &[
    "priority",
    "run_at",
    "concurrency_key",
    "fairness_key",
    "fairness_weight",
    "max_attempts",
    "execution_id",
    "kind",
    "idempotency_key",
    "rate_limit",
    "rate_key",
    "placement",
];

impl EnqueueOptions {
    pub fn parse(opts: &Value) -> Result<Self, OptionError> {
        let map = object(opts, ENQUEUE_OPTIONS)?;
        let mut o = EnqueueOptions::default();
        for (name, value) in map {
            let opt = format!("opts.{name}");
            if value.is_null() {
                continue;
            }
            match name.as_str() {
                "priority" => o.priority = int(&opt, value, i32::MIN, i32::MAX)?,
                "run_at" => o.run_at = Some(string(&opt, value, 64)?),
                "concurrency_key" => {
                    let s = string(&opt, value, MAX_CONCURRENCY_KEY_BYTES)?;
                    o.concurrency_key = Some(s);
                }
                "fairness_key" => o.fairness_key = Some(key(&opt, value)?),
                "fairness_weight" => {
                    let w = value
                        .as_f64()
                        .ok_or_else(|| err(&opt, format!("must be a number, got {}", excerpt(value))))?;
                    if !(MIN_FAIRNESS_WEIGHT..=MAX_FAIRNESS_WEIGHT).contains(&w) {
                        return Err(err(
                            &opt,
                            format!(
                                "must be from {MIN_FAIRNESS_WEIGHT} to {MAX_FAIRNESS_WEIGHT}, got {}",
                                excerpt(value)
                            ),
                        ));
                    }
                    o.fairness_weight = w;
                }
                "max_attempts" => o.max_attempts = int(&opt, value, 1, MAX_ATTEMPTS_LIMIT)?,
                "execution_id" => {
                    let s = string(&opt, value, 36)?;
                    let id = uuid::Uuid::parse_str(&s)
                        .map_err(|_| err(&opt, format!("must be a UUID, got {}", quoted(&s))))?;
                    o.execution_id = Some(*id.as_bytes());
                }
                "kind" => {
                    o.kind = match value.as_str() {
                        Some("activity") => TaskKind::Activity,
                        Some("workflow") => TaskKind::Workflow,
                        _ => {
                            return Err(err(
                                &opt,
                                format!("must be \"activity\" or \"workflow\", got {}", excerpt(value)),
                            ));
                        }
                    }
                }
                "idempotency_key" => o.idempotency_key = Some(key(&opt, value)?),
                "rate_limit" => o.rate_limit = Some(string(&opt, value, MAX_KEY_BYTES)?),
                "rate_key" => o.rate_key = Some(key(&opt, value)?),
                "placement" => {
                    let (pin, tenant) = placement_from_json(value).map_err(|why| err(&opt, why))?;
                    if tenant.is_some() {
                        return Err(err(&opt, "a task takes no tenant (only a start does)"));
                    }
                    o.placement = pin;
                }
                _ => unreachable!("object() refuses unknown options"),
            }
        }
        if o.execution_id.is_some() && o.placement != Pin::Auto {
            return Err(err(
                "opts.placement",
                "a task of an execution goes where its execution lives: it takes no placement",
            ));
        }
        if o.rate_key.is_some() && o.rate_limit.is_none() {
            return Err(err(
                "opts.rate_key",
                "names a bucket of a rate limit: give opts.rate_limit too",
            ));
        }
        Ok(o)
    }
}

/// `sheaf.configure_queue` options: only the ones present are changed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueOptions {
    /// `Some(None)` turns aging off.
    pub aging_secs: Option<Option<i32>>,
    pub fairness: Option<bool>,
    pub notify: Option<bool>,
}

impl QueueOptions {
    pub fn parse(opts: &Value) -> Result<Self, OptionError> {
        let map = object(opts, &["aging_secs", "fairness", "notify"])?;
        let mut o = QueueOptions::default();
        for (name, value) in map {
            let opt = format!("opts.{name}");
            match name.as_str() {
                "aging_secs" if value.is_null() => o.aging_secs = Some(None),
                "aging_secs" => o.aging_secs = Some(Some(int(&opt, value, 1, 31_536_000)?)),
                "fairness" => o.fairness = Some(boolean(&opt, value)?),
                "notify" => o.notify = Some(boolean(&opt, value)?),
                _ => unreachable!("object() refuses unknown options"),
            }
        }
        if matches!(o.aging_secs, Some(Some(_))) && o.fairness == Some(true) {
            return Err(err(
                "opts",
                "aging_secs and fairness cannot both be on: one ordering mode per queue",
            ));
        }
        Ok(o)
    }
}

/// A queue name: 1..=128 bytes, no control characters.
pub fn check_queue_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_QUEUE_NAME_BYTES {
        return Err(format!(
            "must be 1 to {MAX_QUEUE_NAME_BYTES} bytes, got {}",
            name.len()
        ));
    }
    if name.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

/// A concurrency key: 1..=1024 bytes, refused rather than truncated.
pub fn check_concurrency_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_CONCURRENCY_KEY_BYTES {
        return Err(format!(
            "must be 1 to {MAX_CONCURRENCY_KEY_BYTES} bytes, got {}",
            key.len()
        ));
    }
    Ok(())
}

/// A key (fairness, idempotency, worker name): 1..=256 bytes,
/// refused rather than truncated.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(format!("must be 1 to {MAX_KEY_BYTES} bytes, got {}", key.len()));
    }
    Ok(())
}

/// `sheaf.signal` options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SignalOptions {
    /// Deduplicates a sender's retries: a second signal with the same id to
    /// the same execution is not delivered again.
    pub signal_id: Option<String>,
}

impl SignalOptions {
    pub fn parse(opts: &Value) -> Result<Self, OptionError> {
        let map = object(opts, &["signal_id"])?;
        let mut o = SignalOptions::default();
        for (name, value) in map {
            if value.is_null() {
                continue;
            }
            let opt = format!("opts.{name}");
            match name.as_str() {
                "signal_id" => o.signal_id = Some(key(&opt, value)?),
                _ => unreachable!("object() refuses unknown options"),
            }
        }
        Ok(o)
    }
}

fn object<'a>(opts: &'a Value, accepted: &[&str]) -> Result<&'a Map<String, Value>, OptionError> {
    let map = opts
        .as_object()
        .ok_or_else(|| err("opts", format!("must be a JSON object, got {}", excerpt(opts))))?;
    for name in map.keys() {
        if !accepted.contains(&name.as_str()) {
            return Err(err(
                "opts",
                format!(
                    "unknown option {} (accepted: {})",
                    quoted(name),
                    accepted.join(", ")
                ),
            ));
        }
    }
    Ok(map)
}

fn int(opt: &str, value: &Value, min: i32, max: i32) -> Result<i32, OptionError> {
    value
        .as_i64()
        .filter(|v| (min as i64..=max as i64).contains(v))
        .map(|v| v as i32)
        .ok_or_else(|| {
            err(
                opt,
                format!("must be an integer from {min} to {max}, got {}", excerpt(value)),
            )
        })
}

fn boolean(opt: &str, value: &Value) -> Result<bool, OptionError> {
    value
        .as_bool()
        .ok_or_else(|| err(opt, format!("must be true or false, got {}", excerpt(value))))
}

fn string(opt: &str, value: &Value, max_bytes: usize) -> Result<String, OptionError> {
    match value.as_str() {
        Some(s) if !s.is_empty() && s.len() <= max_bytes => Ok(s.to_owned()),
        Some(s) => Err(err(
            opt,
            format!("must be 1 to {max_bytes} bytes, got {}", s.len()),
        )),
        None => Err(err(opt, format!("must be a string, got {}", excerpt(value)))),
    }
}

fn key(opt: &str, value: &Value) -> Result<String, OptionError> {
    let s = value
        .as_str()
        .ok_or_else(|| err(opt, format!("must be a string, got {}", excerpt(value))))?;
    check_key(s).map_err(|why| err(opt, why))?;
    Ok(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn empty_opts_are_the_defaults() {
        assert_eq!(
            EnqueueOptions::parse(&json!({})).unwrap(),
            EnqueueOptions::default()
        );
        assert_eq!(EnqueueOptions::default().max_attempts, 25);
    }

    #[test]
    fn parses_every_option() {
        let o = EnqueueOptions::parse(&json!({
            "priority": -3, "run_at": "2030-01-01T00:00:00Z", "concurrency_key": "tenant:a",
            "fairness_key": "f", "fairness_weight": 2.5, "max_attempts": 3,
            "execution_id": "000118bc-fe56-8800-9234-56789abcdef0", "kind": "workflow",
            "idempotency_key": "once"
        }))
        .unwrap();
        assert_eq!(o.priority, -3);
        assert_eq!(o.run_at.as_deref(), Some("2030-01-01T00:00:00Z"));
        assert_eq!(o.concurrency_key.as_deref(), Some("tenant:a"));
        assert_eq!(o.fairness_weight, 2.5);
        assert_eq!(o.max_attempts, 3);
        assert_eq!(o.kind, TaskKind::Workflow);
        assert_eq!(o.execution_id.unwrap()[0..2], [0, 1]);
        assert_eq!(o.idempotency_key.as_deref(), Some("once"));
        let o = EnqueueOptions::parse(&json!({"placement": {"routing_key": "acme"}})).unwrap();
        assert_eq!(o.placement, Pin::RoutingKey("acme".into()));
    }

    #[test]
    fn refuses_bad_options_naming_them() {
        let cases = [
            (json!([]), "opts"),
            (json!({"priorty": 1}), "opts"),
            (json!({"priority": 1.5}), "opts.priority"),
            (json!({"priority": 3_000_000_000i64}), "opts.priority"),
            (json!({"max_attempts": 0}), "opts.max_attempts"),
            (json!({"max_attempts": 1001}), "opts.max_attempts"),
            (json!({"fairness_weight": 0}), "opts.fairness_weight"),
            (json!({"fairness_weight": "2"}), "opts.fairness_weight"),
            (json!({"fairness_weight": 1e-300}), "opts.fairness_weight"),
            (json!({"fairness_weight": 0.0009}), "opts.fairness_weight"),
            (json!({"fairness_weight": 1000.5}), "opts.fairness_weight"),
            (json!({"concurrency_key": ""}), "opts.concurrency_key"),
            (
                json!({"concurrency_key": "x".repeat(1025)}),
                "opts.concurrency_key",
            ),
            (json!({"kind": "job"}), "opts.kind"),
            (json!({"execution_id": "nope"}), "opts.execution_id"),
            (json!({"run_at": 5}), "opts.run_at"),
            (json!({"placement": {"tenant": "acme"}}), "opts.placement"),
            (
                json!({"placement": {"shard": 1, "residency_key": "eu"}}),
                "opts.placement",
            ),
            (json!({"placement": "shard 1"}), "opts.placement"),
            (
                json!({"placement": {"shard": 1}, "execution_id": "000118bc-fe56-8800-9234-56789abcdef0"}),
                "opts.placement",
            ),
        ];
        for (opts, option) in cases {
            let e = EnqueueOptions::parse(&opts).unwrap_err();
            assert_eq!(e.option, option, "{opts}: {e}");
        }
        let e = EnqueueOptions::parse(&json!({"priorty": 1})).unwrap_err();
        assert!(e.to_string().contains("unknown option \"priorty\""), "{e}");
    }

    #[test]
    fn a_256_byte_key_is_accepted_and_257_refused() {
        assert!(EnqueueOptions::parse(&json!({"fairness_key": "é".repeat(128)})).is_ok());
        assert!(EnqueueOptions::parse(&json!({"fairness_key": format!("{}x", "é".repeat(128))})).is_err());
    }

    #[test]
    fn queue_options() {
        assert_eq!(
            QueueOptions::parse(&json!({"aging_secs": 60}))
                .unwrap()
                .aging_secs,
            Some(Some(60))
        );
        assert_eq!(
            QueueOptions::parse(&json!({"aging_secs": null}))
                .unwrap()
                .aging_secs,
            Some(None)
        );
        assert_eq!(
            QueueOptions::parse(&json!({"notify": false})).unwrap().notify,
            Some(false)
        );
        assert!(QueueOptions::parse(&json!({"aging_secs": 60, "fairness": true})).is_err());
        assert!(QueueOptions::parse(&json!({"aging_secs": 0})).is_err());
        assert!(QueueOptions::parse(&json!({"fairness": "yes"})).is_err());
        assert!(QueueOptions::parse(&json!({"mode": "fifo"})).is_err());
    }

    #[test]
    fn names() {
        assert!(check_queue_name("default").is_ok());
        assert!(check_queue_name("").is_err());
        assert!(check_queue_name(&"q".repeat(129)).is_err());
        assert!(check_queue_name("a\nb").is_err());
        assert!(check_key(&"k".repeat(256)).is_ok());
        assert!(check_key(&"k".repeat(257)).is_err());
    }

    #[test]
    fn a_signal_takes_only_a_signal_id() {
        let o = SignalOptions::parse(&json!({"signal_id": "s-1"})).unwrap();
        assert_eq!(o.signal_id.as_deref(), Some("s-1"));
        assert_eq!(
            SignalOptions::parse(&json!({})).unwrap(),
            SignalOptions::default()
        );
        for bad in [
            json!({"signal_id": ""}),
            json!({"signal_id": 5}),
            json!({"signal_id": "x".repeat(257)}),
            json!({"other": 1}),
            json!([]),
        ] {
            assert!(SignalOptions::parse(&bad).is_err(), "{bad}");
        }
    }
}
