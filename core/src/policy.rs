//! Workflow policies (`sheaf.declare_workflow`), the options of
//! `sheaf.start_workflow`, and resolving a policy's key from a start input.
//!
//! A key is a dot path into the input (`input.tenant_id`). A path that does
//! not resolve means "no key": that gate does not apply to the start. A key
//! that resolves to something that cannot name a tenant (an object, an array,
//! an empty string) or that is too long is refused, never coerced or cut.

use serde_json::{Map, Value};

use crate::excerpt::{excerpt, quoted};
use crate::options::{MAX_KEY_BYTES, OptionError, check_queue_name};
use crate::placement::{Pin, placement_from_json};

/// The queue of a workflow's tasks when its policy names none.
pub const DEFAULT_QUEUE: &str = "default";
/// The most path segments a key path may have.
const MAX_PATH_SEGMENTS: usize = 16;

/// What a start does when its (workflow, key) already has `limit` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnConflict {
    /// Admit it; its workflow tasks wait in the claim engine for a slot.
    Defer,
    /// Admit it and cancel the oldest runs beyond `limit` (latest wins).
    CancelRunning,
    /// Refuse the start.
    Reject,
}

impl OnConflict {
    pub fn as_str(self) -> &'static str {
        match self {
            OnConflict::Defer => "defer",
            OnConflict::CancelRunning => "cancel_running",
            OnConflict::Reject => "reject",
        }
    }
}

/// What an activity's end (completed, dead-lettered, cancelled by an
/// operator) does to its execution, beyond the history event it records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ActivityEnds {
    /// Only the event (`TaskCompleted`, `TaskDeadLettered`, `TaskCancelled`):
    /// the workflow learns of it when something else runs it.
    #[default]
    Record,
    /// The event, then the execution is woken as a child's end wakes it: a
    /// suspended one resumes, a running one without a workflow task waiting
    /// gets one.
    Wake,
}

impl ActivityEnds {
    pub fn as_str(self) -> &'static str {
        match self {
            ActivityEnds::Record => "record",
            ActivityEnds::Wake => "wake",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ConcurrencyPolicy {
    /// Path segments after `input`; empty means the whole input.
    pub key: Vec<String>,
    pub limit: i32,
    pub on_conflict: OnConflict,
}

#[derive(Debug, Clone, PartialEq)]
pub struct QuotaPolicy {
    pub key: Vec<String>,
    pub max_active_executions: Option<i64>,
    pub max_history_bytes: Option<i64>,
    pub max_dead_letters: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowPolicy {
    pub queue: String,
    pub concurrency: Option<ConcurrencyPolicy>,
    pub quota: Option<QuotaPolicy>,
    /// Paces starts: an over-rate start's first workflow task waits.
    pub throttle: Option<crate::rate::Throttle>,
    /// Whether an activity's end wakes its execution.
    pub activity_ends: ActivityEnds,
}

impl Default for WorkflowPolicy {
    fn default() -> Self {
        WorkflowPolicy {
            queue: DEFAULT_QUEUE.to_owned(),
            concurrency: None,
            quota: None,
            throttle: None,
            activity_ends: ActivityEnds::Record,
        }
    }
}

fn err(option: &str, why: impl Into<String>) -> OptionError {
    OptionError {
        option: option.to_owned(),
        why: why.into(),
    }
}

fn object<'a>(
    name: &str,
    value: &'a Value,
    accepted: &[&str],
) -> Result<&'a Map<String, Value>, OptionError> {
    let map = value
        .as_object()
        .ok_or_else(|| err(name, format!("must be a JSON object, got {}", excerpt(value))))?;
    for key in map.keys() {
        if !accepted.contains(&key.as_str()) {
            return Err(err(
                name,
                format!("unknown field {key:?} (accepted: {})", accepted.join(", ")),
            ));
        }
    }
    Ok(map)
}

/// A key path: `input` or `input.a.b`, segments non-empty.
fn path(name: &str, value: &Value) -> Result<Vec<String>, OptionError> {
    let s = value.as_str().ok_or_else(|| {
        err(
            name,
            format!(
                "must be a dot path like \"input.tenant_id\", got {}",
                excerpt(value)
            ),
        )
    })?;
    let mut segments = s.split('.');
    if segments.next() != Some("input") {
        return Err(err(
            name,
            format!(
                "must start with \"input\" (a dot path into the start input), got {}",
                quoted(s)
            ),
        ));
    }
    let rest: Vec<String> = segments.map(str::to_owned).collect();
    if rest.iter().any(|seg| seg.is_empty() || seg.len() > MAX_KEY_BYTES) || rest.len() > MAX_PATH_SEGMENTS {
        return Err(err(
            name,
            format!(
                "must be \"input\" followed by 0 to {MAX_PATH_SEGMENTS} .segments of 1 to {MAX_KEY_BYTES} bytes, got {}",
                quoted(s)
            ),
        ));
    }
    Ok(rest)
}

fn limit(name: &str, value: &Value, min: i64, max: i64) -> Result<i64, OptionError> {
    whole_number(value)
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| {
            err(
                name,
                format!(
                    "must be a whole number from {min} to {max}, got {}",
                    excerpt(value)
                ),
            )
        })
}

/// A JSON number that is exactly a whole number in i64 range, read from its
/// decimal text: `1e9` and `1000.0` are whole, `1e-400` is not (as a float it
/// rounds to 0, which would have passed for a whole number).
pub(crate) fn whole_number(value: &Value) -> Option<i64> {
    let n = value.as_number()?;
    if let Some(i) = n.as_i64() {
        return Some(i);
    }
    let text = n.to_string();
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.as_str()),
    };
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(i) => (&text[..i], text[i + 1..].parse::<i64>().ok()?),
        None => (text, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mut digits = format!("{int_part}{frac_part}");
    let mut exponent = exponent.checked_sub(i64::try_from(frac_part.len()).ok()?)?;
    while digits.len() > 1 && digits.ends_with('0') {
        digits.pop();
        exponent += 1;
    }
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0);
    }
    // Whole only if no digit is left of the decimal point's right; at most 19
    // digits fit an i64.
    if exponent < 0 || digits.len() as i64 + exponent > 19 {
        return None;
    }
    let magnitude: i128 = format!("{digits}{}", "0".repeat(exponent as usize))
        .parse()
        .ok()?;
    i64::try_from(if negative { -magnitude } else { magnitude }).ok()
}

impl ConcurrencyPolicy {
    /// `policy.concurrency`: `{"key", "limit", "on_conflict"}`.
    fn parse(c: &Value) -> Result<Self, OptionError> {
        let c = object("policy.concurrency", c, &["key", "limit", "on_conflict"])?;
        let key = path(
            "policy.concurrency.key",
            c.get("key")
                .ok_or_else(|| err("policy.concurrency.key", "is required"))?,
        )?;
        let limit = limit(
            "policy.concurrency.limit",
            c.get("limit")
                .ok_or_else(|| err("policy.concurrency.limit", "is required"))?,
            1,
            1_000_000,
        )? as i32;
        let on_conflict = match c.get("on_conflict").and_then(|v| (!v.is_null()).then_some(v)) {
            None => OnConflict::Defer,
            Some(v) => match v.as_str() {
                Some("defer") => OnConflict::Defer,
                Some("cancel_running") => OnConflict::CancelRunning,
                Some("reject") => OnConflict::Reject,
                _ => {
                    return Err(err(
                        "policy.concurrency.on_conflict",
                        format!(
                            "must be \"defer\", \"cancel_running\" or \"reject\", got {}",
                            excerpt(v)
                        ),
                    ));
                }
            },
        };
        Ok(ConcurrencyPolicy {
            key,
            limit,
            on_conflict,
        })
    }
}

impl QuotaPolicy {
    /// `policy.quota`: `{"key", "max_active_executions", "max_history_bytes",
    /// "max_dead_letters"}`, at least one limit.
    fn parse(q: &Value) -> Result<Self, OptionError> {
        let q = object(
            "policy.quota",
            q,
            &[
                "key",
                "max_active_executions",
                "max_history_bytes",
                "max_dead_letters",
            ],
        )?;
        let key = path(
            "policy.quota.key",
            q.get("key")
                .ok_or_else(|| err("policy.quota.key", "is required"))?,
        )?;
        let get = |field: &str| -> Result<Option<i64>, OptionError> {
            match q.get(field).filter(|v| !v.is_null()) {
                None => Ok(None),
                Some(v) => limit(&format!("policy.quota.{field}"), v, 0, i64::MAX / 2).map(Some),
            }
        };
        let quota = QuotaPolicy {
            key,
            max_active_executions: get("max_active_executions")?,
            max_history_bytes: get("max_history_bytes")?,
            max_dead_letters: get("max_dead_letters")?,
        };
        if quota.max_active_executions.is_none()
            && quota.max_history_bytes.is_none()
            && quota.max_dead_letters.is_none()
        {
            return Err(err(
                "policy.quota",
                "must set at least one of max_active_executions, max_history_bytes, max_dead_letters",
            ));
        }
        Ok(quota)
    }
}

impl WorkflowPolicy {
    pub fn parse(policy: &Value) -> Result<Self, OptionError> {
        let map = object(
            "policy",
            policy,
            &["queue", "concurrency", "quota", "throttle", "activity_ends"],
        )?;
        let mut p = WorkflowPolicy::default();
        if let Some(q) = map.get("queue").filter(|v| !v.is_null()) {
            let name = q
                .as_str()
                .ok_or_else(|| err("policy.queue", format!("must be a string, got {}", excerpt(q))))?;
            check_queue_name(name).map_err(|why| err("policy.queue", why))?;
            p.queue = name.to_owned();
        }
        if let Some(c) = map.get("concurrency").filter(|v| !v.is_null()) {
            p.concurrency = Some(ConcurrencyPolicy::parse(c)?);
        }
        if let Some(q) = map.get("quota").filter(|v| !v.is_null()) {
            p.quota = Some(QuotaPolicy::parse(q)?);
        }
        if let Some(t) = map.get("throttle").filter(|v| !v.is_null()) {
            p.throttle = Some(crate::rate::Throttle::parse(t)?);
        }
        if let Some(a) = map.get("activity_ends").filter(|v| !v.is_null()) {
            p.activity_ends = match a.as_str() {
                Some("record") => ActivityEnds::Record,
                Some("wake") => ActivityEnds::Wake,
                _ => {
                    return Err(err(
                        "policy.activity_ends",
                        format!("must be \"record\" or \"wake\", got {}", excerpt(a)),
                    ));
                }
            };
        }
        Ok(p)
    }

    /// The policy in its canonical form (every default spelled out), as stored.
    pub fn to_json(&self) -> Value {
        let path = |segments: &[String]| {
            std::iter::once("input")
                .chain(segments.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(".")
        };
        let mut out = serde_json::json!({ "queue": self.queue });
        if let Some(c) = &self.concurrency {
            out["concurrency"] = serde_json::json!({
                "key": path(&c.key), "limit": c.limit, "on_conflict": c.on_conflict.as_str(),
            });
        }
        if let Some(q) = &self.quota {
            out["quota"] = serde_json::json!({
                "key": path(&q.key),
                "max_active_executions": q.max_active_executions,
                "max_history_bytes": q.max_history_bytes,
                "max_dead_letters": q.max_dead_letters,
            });
        }
        if let Some(t) = &self.throttle {
            out["throttle"] = t.to_json();
        }
        // Spelled out only when it wakes: a policy declared before the
        // option existed reads back as it was stored.
        if self.activity_ends != ActivityEnds::Record {
            out["activity_ends"] = self.activity_ends.as_str().into();
        }
        out
    }
}

/// Resolves a key path against a start input. `Ok(None)`: the path is
/// missing (or JSON null), so the gate does not apply.
pub fn resolve_key(input: &Value, segments: &[String], option: &str) -> Result<Option<String>, OptionError> {
    let mut at = input;
    for segment in segments {
        let next = match at {
            Value::Object(map) => map.get(segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        };
        match next {
            Some(v) => at = v,
            None => return Ok(None),
        }
    }
    let key = match at {
        Value::Null => return Ok(None),
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Object(_) | Value::Array(_) => {
            return Err(err(
                option,
                "resolves to an object or array in the input; a key must be a string, number or boolean",
            ));
        }
    };
    if key.is_empty() {
        return Err(err(option, "resolves to an empty string in the input"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(err(
            option,
            format!(
                "resolves to {} bytes in the input; a key is at most {MAX_KEY_BYTES} bytes (never truncated)",
                key.len()
            ),
        ));
    }
    Ok(Some(key))
}

/// `sheaf.start_workflow` options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StartOptions {
    pub execution_id: Option<[u8; 16]>,
    pub queue: Option<String>,
    pub priority: i32,
    /// Unparsed: the extension parses it as a timestamptz.
    pub run_at: Option<String>,
    /// Checked by `search::check_attrs`.
    pub search_attrs: Option<Value>,
    /// The run ends `TIMED_OUT` this long after its start (a successor of
    /// continue-as-new keeps its predecessor's deadline).
    pub execution_timeout: Option<std::time::Duration>,
    /// Collapses a burst of starts with one key into one run.
    pub debounce: Option<Debounce>,
    /// How the caller placed it (`opts.placement`, a tenant included):
    /// what a shard with a published topology checks the start against.
    pub placement: Pin,
    pub tenant: Option<String>,
    /// Set by the SQL entry points, never by `parse`: the run keeps how
    /// its caller placed it (`executions.placement`), so its shard can
    /// tell when the topology places it elsewhere. sheaf's own starts
    /// (children, schedule fires, continue-as-new) and debounced ones keep
    /// none.
    pub record_placement: bool,
}

/// Which start of a burst a debounce keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DebounceMode {
    /// The run starts once the burst is over, with the last start's input.
    Trailing,
    /// The run starts at the first start; later ones in the window join it.
    Leading,
}

impl DebounceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            DebounceMode::Trailing => "trailing",
            DebounceMode::Leading => "leading",
        }
    }
}

/// `opts.debounce`: `{"key": "...", "window": "2 seconds", "mode": "trailing"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Debounce {
    pub key: String,
    pub window: std::time::Duration,
    pub mode: DebounceMode,
}

/// The shortest and longest debounce window.
pub const MIN_DEBOUNCE_WINDOW: std::time::Duration = std::time::Duration::from_millis(10);
pub const MAX_DEBOUNCE_WINDOW: std::time::Duration = std::time::Duration::from_secs(86_400);

impl Debounce {
    fn parse(v: &Value) -> Result<Debounce, OptionError> {
        let m = object("opts.debounce", v, &["key", "window", "mode"])?;
        let key = match m.get("key") {
            Some(Value::String(k)) if !k.is_empty() && k.len() <= MAX_KEY_BYTES => k.clone(),
            Some(Value::String(k)) => {
                return Err(err(
                    "opts.debounce.key",
                    format!("must be 1 to {MAX_KEY_BYTES} bytes, got {}", k.len()),
                ));
            }
            Some(other) => {
                return Err(err(
                    "opts.debounce.key",
                    format!("must be a string, got {}", excerpt(other)),
                ));
            }
            None => return Err(err("opts.debounce.key", "is required")),
        };
        let window = match m.get("window") {
            Some(w) => crate::duration::parse(w, MIN_DEBOUNCE_WINDOW, MAX_DEBOUNCE_WINDOW)
                .map_err(|why| err("opts.debounce.window", why))?,
            None => return Err(err("opts.debounce.window", "is required")),
        };
        let mode = match m.get("mode") {
            None | Some(Value::Null) => DebounceMode::Trailing,
            Some(Value::String(s)) if s == "trailing" => DebounceMode::Trailing,
            Some(Value::String(s)) if s == "leading" => DebounceMode::Leading,
            Some(other) => {
                return Err(err(
                    "opts.debounce.mode",
                    format!("must be \"trailing\" or \"leading\", got {}", excerpt(other)),
                ));
            }
        };
        Ok(Debounce { key, window, mode })
    }
}

/// The longest `opts.execution_timeout`: ten years.
pub const MAX_EXECUTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3650 * 86_400);

impl StartOptions {
    pub fn parse(opts: &Value) -> Result<Self, OptionError> {
        let map = object(
            "opts",
            opts,
            &[
                "execution_id",
                "queue",
                "priority",
                "run_at",
                "search_attrs",
                "execution_timeout",
                "debounce",
                "placement",
            ],
        )?;
        let mut o = StartOptions::default();
        for (name, value) in map {
            if value.is_null() {
                continue;
            }
            let opt = format!("opts.{name}");
            let string = || {
                value
                    .as_str()
                    .ok_or_else(|| err(&opt, format!("must be a string, got {}", excerpt(value))))
            };
            match name.as_str() {
                "execution_id" => {
                    let s = string()?;
                    let id = uuid::Uuid::parse_str(s)
                        .map_err(|_| err(&opt, format!("must be a UUID, got {}", quoted(s))))?;
                    o.execution_id = Some(*id.as_bytes());
                }
                "queue" => {
                    let s = string()?;
                    check_queue_name(s).map_err(|why| err(&opt, why))?;
                    o.queue = Some(s.to_owned());
                }
                "priority" => {
                    o.priority = value
                        .as_i64()
                        .and_then(|v| i32::try_from(v).ok())
                        .ok_or_else(|| {
                            err(&opt, format!("must be a 32-bit integer, got {}", excerpt(value)))
                        })?;
                }
                "run_at" => o.run_at = Some(string()?.to_owned()),
                "search_attrs" => {
                    crate::search::check_attrs(&opt, value)?;
                    o.search_attrs = Some(value.clone());
                }
                "execution_timeout" => {
                    let d = crate::duration::parse(
                        value,
                        std::time::Duration::from_secs(1),
                        MAX_EXECUTION_TIMEOUT,
                    )
                    .map_err(|why| err(&opt, why))?;
                    o.execution_timeout = Some(d);
                }
                "debounce" => o.debounce = Some(Debounce::parse(value)?),
                "placement" => {
                    (o.placement, o.tenant) = placement_from_json(value).map_err(|why| err(&opt, why))?;
                }
                _ => unreachable!("object() refuses unknown options"),
            }
        }
        if o.debounce.is_some() && (o.placement != Pin::Auto || o.tenant.is_some()) {
            return Err(err(
                "opts.placement",
                "a debounced start is placed by its debounce key: it takes no placement or tenant",
            ));
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn segs(p: &str) -> Vec<String> {
        p.split('.').skip(1).map(str::to_owned).collect()
    }

    #[test]
    fn the_empty_policy_is_the_default() {
        assert_eq!(
            WorkflowPolicy::parse(&json!({})).unwrap(),
            WorkflowPolicy::default()
        );
        // The default spells no `activity_ends`: older policies read back unchanged.
        assert_eq!(WorkflowPolicy::default().to_json(), json!({"queue": "default"}));
    }

    #[test]
    fn parses_the_full_policy_and_round_trips() {
        let p = WorkflowPolicy::parse(&json!({
            "queue": "docs",
            "concurrency": {"key": "input.tenant_id", "limit": 10, "on_conflict": "cancel_running"},
            "quota": {"key": "input.tenant_id", "max_active_executions": 100, "max_history_bytes": 1e9, "max_dead_letters": 50},
            "activity_ends": "wake"
        }))
        .unwrap();
        assert_eq!(p.queue, "docs");
        assert_eq!(p.activity_ends, ActivityEnds::Wake);
        let c = p.concurrency.clone().unwrap();
        assert_eq!(
            (c.key, c.limit, c.on_conflict),
            (segs("input.tenant_id"), 10, OnConflict::CancelRunning)
        );
        let q = p.quota.clone().unwrap();
        assert_eq!(q.max_history_bytes, Some(1_000_000_000));
        assert_eq!(WorkflowPolicy::parse(&p.to_json()).unwrap(), p);
    }

    #[test]
    fn on_conflict_defaults_to_defer() {
        let p = WorkflowPolicy::parse(&json!({"concurrency": {"key": "input", "limit": 1}})).unwrap();
        assert_eq!(p.concurrency.unwrap().on_conflict, OnConflict::Defer);
    }

    #[test]
    fn whole_numbers_are_read_from_their_decimal_text() {
        let n = |text: &str| whole_number(&serde_json::from_str::<Value>(text).unwrap());
        assert_eq!(n("5"), Some(5));
        assert_eq!(n("1e9"), Some(1_000_000_000));
        assert_eq!(n("1E+3"), Some(1000));
        assert_eq!(n("1000.0"), Some(1000));
        assert_eq!(n("12.5e1"), Some(125));
        assert_eq!(n("-2.0"), Some(-2));
        assert_eq!(n("0.0"), Some(0));
        assert_eq!(n("0e-5"), Some(0));
        assert_eq!(n("1e-400"), None);
        assert_eq!(n("1.5"), None);
        assert_eq!(n("0.001e3"), Some(1));
        assert_eq!(n("9223372036854775807"), Some(i64::MAX));
        assert_eq!(n("1e19"), None);
        assert_eq!(n("1e400"), None);
        assert_eq!(n("\"5\""), None);
    }

    #[test]
    fn tiny_quota_limits_are_refused_not_stored_as_zero() {
        for limit in ["1e-400", "0.5", "1e-5"] {
            let policy: Value = serde_json::from_str(&format!(
                r#"{{"quota": {{"key": "input.a", "max_active_executions": {limit}}}}}"#
            ))
            .unwrap();
            let e = WorkflowPolicy::parse(&policy).unwrap_err();
            assert_eq!(e.option, "policy.quota.max_active_executions", "{limit}: {e}");
        }
    }

    #[test]
    fn refuses_bad_policies_naming_the_field() {
        let cases = [
            (json!([]), "policy"),
            (json!({"queues": "x"}), "policy"),
            (json!({"queue": ""}), "policy.queue"),
            (json!({"activity_ends": "resume"}), "policy.activity_ends"),
            (json!({"activity_ends": true}), "policy.activity_ends"),
            (json!({"concurrency": {"limit": 1}}), "policy.concurrency.key"),
            (
                json!({"concurrency": {"key": "tenant", "limit": 1}}),
                "policy.concurrency.key",
            ),
            (
                json!({"concurrency": {"key": "input..a", "limit": 1}}),
                "policy.concurrency.key",
            ),
            (
                json!({"concurrency": {"key": format!("input.{}", "a".repeat(257)), "limit": 1}}),
                "policy.concurrency.key",
            ),
            (
                json!({"concurrency": {"key": "input.a", "limit": 0}}),
                "policy.concurrency.limit",
            ),
            (
                json!({"concurrency": {"key": "input.a", "limit": 1.5}}),
                "policy.concurrency.limit",
            ),
            (
                json!({"concurrency": {"key": "input.a"}}),
                "policy.concurrency.limit",
            ),
            (
                json!({"concurrency": {"key": "input.a", "limit": 1, "on_conflict": "queue"}}),
                "policy.concurrency.on_conflict",
            ),
            (json!({"quota": {"key": "input.a"}}), "policy.quota"),
            (
                json!({"quota": {"key": "input.a", "max_active_executions": -1}}),
                "policy.quota.max_active_executions",
            ),
            (
                json!({"quota": {"key": "input.a", "max_dead_letters": "5"}}),
                "policy.quota.max_dead_letters",
            ),
            (
                json!({"quota": {"key": "input.a", "max_threads": 5}}),
                "policy.quota",
            ),
        ];
        for (policy, field) in cases {
            let e = WorkflowPolicy::parse(&policy).unwrap_err();
            assert_eq!(e.option, field, "{policy}: {e}");
        }
    }

    #[test]
    fn resolves_keys_and_treats_missing_paths_as_no_key() {
        let input = json!({"tenant": {"id": "acme", "n": 7, "ok": true, "list": ["a", "b"], "none": null}});
        let r = |p: &str| resolve_key(&input, &segs(p), "k");
        assert_eq!(r("input.tenant.id").unwrap().as_deref(), Some("acme"));
        assert_eq!(r("input.tenant.n").unwrap().as_deref(), Some("7"));
        assert_eq!(r("input.tenant.ok").unwrap().as_deref(), Some("true"));
        assert_eq!(r("input.tenant.list.1").unwrap().as_deref(), Some("b"));
        assert_eq!(r("input.tenant.missing").unwrap(), None);
        assert_eq!(r("input.tenant.none").unwrap(), None);
        assert_eq!(r("input.tenant.id.deeper").unwrap(), None);
        assert!(r("input.tenant").is_err(), "an object is not a key");
        assert!(r("input.tenant.list").is_err(), "an array is not a key");
        assert_eq!(
            resolve_key(&json!("whole"), &[], "k").unwrap().as_deref(),
            Some("whole")
        );
    }

    #[test]
    fn a_key_over_256_bytes_is_refused_not_truncated() {
        let ok = json!({"k": "é".repeat(128)});
        assert!(resolve_key(&ok, &segs("input.k"), "k").unwrap().is_some());
        let long = json!({"k": format!("{}x", "é".repeat(128))});
        let e = resolve_key(&long, &segs("input.k"), "policy.quota.key").unwrap_err();
        assert!(e.why.contains("257 bytes"), "{e}");
        assert!(resolve_key(&json!({"k": ""}), &segs("input.k"), "k").is_err());
    }

    #[test]
    fn start_options() {
        let o = StartOptions::parse(&json!({
            "execution_id": "000118bc-fe56-8800-9234-56789abcdef0", "queue": "q", "priority": 5,
            "run_at": "2030-01-01T00:00:00Z"
        }))
        .unwrap();
        assert_eq!(o.execution_id.unwrap()[..2], [0, 1]);
        assert_eq!((o.queue.as_deref(), o.priority), (Some("q"), 5));
        let o = StartOptions::parse(&json!({"debounce": {"key": "doc-1", "window": "2 seconds"}})).unwrap();
        assert_eq!(
            o.debounce,
            Some(Debounce {
                key: "doc-1".into(),
                window: std::time::Duration::from_secs(2),
                mode: DebounceMode::Trailing
            })
        );
        for bad in [
            json!({"debounce": {"window": "2s"}}),
            json!({"debounce": {"key": "", "window": "2s"}}),
            json!({"debounce": {"key": "k", "window": "0s"}}),
            json!({"debounce": {"key": "k", "window": "2s", "mode": "middle"}}),
            json!({"debounce": {"key": "k", "window": "2s", "mode": 1}}),
            json!({"debounce": "k"}),
            json!({"debounce": {"key": "k", "window": "2s"}, "placement": {"tenant": "acme"}}),
            json!({"debounce": {"key": "k", "window": "2s"}, "placement": {"shard": 1}}),
        ] {
            assert!(StartOptions::parse(&bad).is_err(), "{bad}");
        }
        let o =
            StartOptions::parse(&json!({"placement": {"residency_key": "eu", "tenant": "acme"}})).unwrap();
        assert_eq!(
            (o.placement, o.tenant.as_deref()),
            (Pin::ResidencyKey("eu".into()), Some("acme"))
        );
        let o = StartOptions::parse(&json!({"execution_timeout": "1 hour"})).unwrap();
        assert_eq!(o.execution_timeout, Some(std::time::Duration::from_secs(3600)));
        for bad in [
            json!({"execution_id": "x"}),
            json!({"queue": ""}),
            json!({"priority": 1.5}),
            json!({"shard": 1}),
            json!({"placement": {"shard": "one"}}),
            json!({"placement": {"zone": "eu"}}),
            json!({"run_at": 1}),
            json!({"execution_timeout": "0s"}),
            json!({"execution_timeout": "forever"}),
            json!(1),
        ] {
            assert!(StartOptions::parse(&bad).is_err(), "{bad}");
        }
    }
}
