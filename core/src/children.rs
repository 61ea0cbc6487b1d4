//! Child workflows and the relay's protocol: `sheaf.start_child`'s options,
//! what a parent's end does to its children (`ParentClose`), the event a
//! child's end puts in its parent's history, and the outcomes a relay
//! reports for a lifecycle row (`sheaf.relay_report`).

use serde_json::{Map, Value};

use crate::excerpt::{excerpt, quoted};
use crate::id::MAX_SHARD_ID;
use crate::options::OptionError;
use crate::state::ExecutionState;

pub(crate) fn err(option: &str, why: impl Into<String>) -> OptionError {
    OptionError {
        option: option.to_owned(),
        why: why.into(),
    }
}

/// What a parent's end does to a child that is still running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ParentClose {
    /// Terminated (the default).
    #[default]
    Terminate,
    /// Cancelled.
    RequestCancel,
    /// Left running, on its own.
    Abandon,
}

impl ParentClose {
    pub const ALL: [ParentClose; 3] = [
        ParentClose::Terminate,
        ParentClose::RequestCancel,
        ParentClose::Abandon,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ParentClose::Terminate => "terminate",
            ParentClose::RequestCancel => "request_cancel",
            ParentClose::Abandon => "abandon",
        }
    }

    pub fn parse(s: &str) -> Option<ParentClose> {
        ParentClose::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The close the relay delivers for it (`cross_shard_children.close_requested`).
    pub fn close(self) -> Option<CloseKind> {
        match self {
            ParentClose::Terminate => Some(CloseKind::Terminate),
            ParentClose::RequestCancel => Some(CloseKind::Cancel),
            ParentClose::Abandon => None,
        }
    }
}

/// How a child is ended from outside: by its parent's cancel or by its
/// parent's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseKind {
    Cancel,
    Terminate,
}

impl CloseKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CloseKind::Cancel => "cancel",
            CloseKind::Terminate => "terminate",
        }
    }

    pub fn parse(s: &str) -> Option<CloseKind> {
        [CloseKind::Cancel, CloseKind::Terminate]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// `sheaf.start_child` options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChildOptions {
    /// The child's id (its prefix must be the target shard).
    pub child_id: Option<[u8; 16]>,
    /// Where the child runs (default: the parent's shard).
    pub target_shard: Option<u16>,
    pub parent_close: ParentClose,
}

impl ChildOptions {
    pub fn parse(opts: &Value) -> Result<Self, OptionError> {
        let map = object(opts, &["child_id", "target_shard", "parent_close"])?;
        let mut o = ChildOptions::default();
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
                "child_id" => {
                    let s = string()?;
                    let id = uuid::Uuid::parse_str(s)
                        .map_err(|_| err(&opt, format!("must be a UUID, got {}", quoted(s))))?;
                    o.child_id = Some(*id.as_bytes());
                }
                "target_shard" => {
                    o.target_shard = Some(
                        value
                            .as_u64()
                            .and_then(|v| u16::try_from(v).ok())
                            .filter(|v| *v <= MAX_SHARD_ID)
                            .ok_or_else(|| {
                                err(
                                    &opt,
                                    format!(
                                        "must be a shard id, 0 to {MAX_SHARD_ID}, got {}",
                                        excerpt(value)
                                    ),
                                )
                            })?,
                    );
                }
                "parent_close" => {
                    let s = string()?;
                    o.parent_close = ParentClose::parse(s).ok_or_else(|| {
                        err(
                            &opt,
                            format!("must be terminate, request_cancel or abandon, got {}", quoted(s)),
                        )
                    })?;
                }
                _ => unreachable!("object() refuses unknown options"),
            }
        }
        if let (Some(id), Some(shard)) = (o.child_id, o.target_shard) {
            let prefix = crate::id::shard_of(&id);
            if prefix != shard {
                return Err(err(
                    "opts.child_id",
                    format!("was minted for shard {prefix}, and opts.target_shard is {shard}"),
                ));
            }
        }
        Ok(o)
    }
}

/// A relay's `outcome`: an object with exactly one key, one of `accepted`.
pub(crate) fn one_key<'a>(
    outcome: &'a Value,
    accepted: &str,
) -> Result<(&'a String, &'a Value), OptionError> {
    let map = outcome.as_object().ok_or_else(|| {
        err(
            "outcome",
            format!("must be a JSON object, got {}", excerpt(outcome)),
        )
    })?;
    let mut entries = map.iter();
    match (entries.next(), entries.next()) {
        (Some(entry), None) => Ok(entry),
        _ => Err(err(
            "outcome",
            format!("must have exactly one of {accepted}; got {} keys", map.len()),
        )),
    }
}

pub(crate) fn object<'a>(opts: &'a Value, accepted: &[&str]) -> Result<&'a Map<String, Value>, OptionError> {
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

/// The event a child's end appends to its parent's history, by the
/// child's terminal state; `None` for a state that is not an end.
pub fn ended_event(state: ExecutionState) -> Option<&'static str> {
    Some(match state {
        ExecutionState::Completed => "ChildCompleted",
        ExecutionState::Failed => "ChildFailed",
        ExecutionState::Cancelled => "ChildCancelled",
        ExecutionState::Terminated => "ChildTerminated",
        ExecutionState::TimedOut => "ChildTimedOut",
        ExecutionState::ContinuedAsNew => "ChildContinuedAsNew",
        _ => return None,
    })
}

/// The event types of children in a parent's history (sheaf's own).
pub const EVENT_TYPES: &[&str] = &[
    "ChildStarted",
    "ChildCompleted",
    "ChildFailed",
    "ChildCancelled",
    "ChildTerminated",
    "ChildTimedOut",
    "ChildContinuedAsNew",
];

/// What a relay reports for a lifecycle row it holds (`sheaf.relay_report`'s
/// `outcome`, an object with exactly one of these keys).
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// `{"started": true}`: the child runs on its shard (started now or
    /// before, by this id).
    Started,
    /// `{"conflict": "<execution id>"}`: its (name, workflow id) already had
    /// this other active run there; the child is not adopted (ChildFailed).
    Conflict([u8; 16]),
    /// `{"refused": "<message>"}`: its shard refused the start (a gate, a
    /// quota, its input); the parent gets ChildFailed with the message.
    Refused(String),
    /// `{"closed": true | false}`: the requested close was delivered (false:
    /// the child had ended already).
    Closed,
    /// `{"ended": {"state": ..., "result": ..., "error": ...}}`: the child has
    /// ended; its end goes into the parent's history.
    Ended(ExecutionState),
    /// `{"pending": <seconds>}`: the child runs; look again after this long.
    Pending(f64),
    /// `{"failed": "<error>"}`: the edge did not get through; retried later.
    Failed(String),
}

/// The longest message a report keeps (an error, a refusal).
pub const MAX_MESSAGE_BYTES: usize = 8192;
/// The longest a relay may put off looking at a running child again.
pub const MAX_RECHECK_SECS: f64 = 3600.0;

impl Report {
    pub fn parse(outcome: &Value) -> Result<Report, OptionError> {
        let (kind, value) = one_key(
            outcome,
            "started, conflict, refused, closed, ended, pending, failed",
        )?;
        let opt = format!("outcome.{kind}");
        let message = |v: &Value| -> Result<String, OptionError> {
            let s = v
                .as_str()
                .ok_or_else(|| err(&opt, format!("must be a string, got {}", excerpt(v))))?;
            Ok(cut(s, MAX_MESSAGE_BYTES).to_owned())
        };
        Ok(match kind.as_str() {
            "started" if value == &Value::Bool(true) => Report::Started,
            "started" => return Err(err(&opt, format!("must be true, got {}", excerpt(value)))),
            "conflict" => {
                let s = message(value)?;
                let id = uuid::Uuid::parse_str(&s)
                    .map_err(|_| err(&opt, format!("must be an execution id, got {}", quoted(&s))))?;
                Report::Conflict(*id.as_bytes())
            }
            "refused" => Report::Refused(message(value)?),
            "closed" if value.is_boolean() => Report::Closed,
            "closed" => {
                return Err(err(
                    &opt,
                    format!("must be true or false, got {}", excerpt(value)),
                ));
            }
            "ended" => Report::Ended(ended_state(&opt, value)?),
            "pending" => {
                let secs = value
                    .as_f64()
                    .filter(|s| (0.0..=MAX_RECHECK_SECS).contains(s))
                    .ok_or_else(|| {
                        err(
                            &opt,
                            format!("must be seconds, 0 to {MAX_RECHECK_SECS}, got {}", excerpt(value)),
                        )
                    })?;
                Report::Pending(secs)
            }
            "failed" => Report::Failed(message(value)?),
            other => {
                return Err(err(
                    "outcome",
                    format!(
                        "unknown outcome {} (accepted: started, conflict, refused, closed, ended, pending, failed)",
                        quoted(other)
                    ),
                ));
            }
        })
    }
}

fn ended_state(opt: &str, value: &Value) -> Result<ExecutionState, OptionError> {
    let map = value
        .as_object()
        .ok_or_else(|| err(opt, format!("must be an object, got {}", excerpt(value))))?;
    for k in map.keys() {
        if !["state", "result", "error"].contains(&k.as_str()) {
            return Err(err(
                opt,
                format!("unknown field {} (accepted: state, result, error)", quoted(k)),
            ));
        }
    }
    let state = map
        .get("state")
        .and_then(Value::as_str)
        .ok_or_else(|| err(&format!("{opt}.state"), "must be the child's terminal state"))?;
    let parsed: Option<ExecutionState> = state.parse().ok();
    match parsed {
        Some(s) if ended_event(s).is_some() => Ok(s),
        _ => Err(err(
            &format!("{opt}.state"),
            format!("must be a terminal state, got {}", quoted(state)),
        )),
    }
    .and_then(|s| match map.get("error") {
        Some(e) if !e.is_null() && !e.is_string() => Err(err(
            &format!("{opt}.error"),
            format!("must be a string or null, got {}", excerpt(e)),
        )),
        _ => Ok(s),
    })
}

/// `s` cut at a char boundary to at most `max` bytes.
pub fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn child_options_parse_and_refuse() {
        assert_eq!(ChildOptions::parse(&json!({})).unwrap(), ChildOptions::default());
        let o = ChildOptions::parse(&json!({"target_shard": 2, "parent_close": "abandon"})).unwrap();
        assert_eq!(o.target_shard, Some(2));
        assert_eq!(o.parent_close, ParentClose::Abandon);
        let refused = |v: Value| ChildOptions::parse(&v).unwrap_err().to_string();
        assert!(refused(json!({"target_shard": -1})).contains("must be a shard id"));
        assert!(refused(json!({"target_shard": 65535})).contains("must be a shard id"));
        assert!(refused(json!({"parent_close": "explode"})).contains("terminate, request_cancel or abandon"));
        assert!(refused(json!({"child": 1})).contains("unknown option"));
        let id = "00070000-0000-8000-8000-000000000001";
        assert!(refused(json!({"child_id": id, "target_shard": 2})).contains("minted for shard 7"));
        assert_eq!(
            ChildOptions::parse(&json!({"child_id": id}))
                .unwrap()
                .child_id
                .unwrap()[0..2],
            [0, 7]
        );
    }

    #[test]
    fn reports_parse_and_refuse() {
        assert_eq!(Report::parse(&json!({"started": true})).unwrap(), Report::Started);
        assert_eq!(Report::parse(&json!({"closed": false})).unwrap(), Report::Closed);
        assert_eq!(
            Report::parse(&json!({"ended": {"state": "COMPLETED", "result": {"x": 1}}})).unwrap(),
            Report::Ended(ExecutionState::Completed)
        );
        assert_eq!(
            Report::parse(&json!({"pending": 5})).unwrap(),
            Report::Pending(5.0)
        );
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        match Report::parse(&json!({ "failed": long })).unwrap() {
            Report::Failed(m) => assert!(m.len() <= MAX_MESSAGE_BYTES),
            other => panic!("{other:?}"),
        }
        let refused = |v: Value| Report::parse(&v).unwrap_err().to_string();
        assert!(refused(json!({})).contains("exactly one"));
        assert!(refused(json!({"started": true, "closed": true})).contains("exactly one"));
        assert!(refused(json!({"started": false})).contains("must be true"));
        assert!(refused(json!({"ended": {"state": "RUNNING"}})).contains("terminal state"));
        assert!(refused(json!({"ended": {"state": "FAILED", "error": 3}})).contains("string or null"));
        assert!(refused(json!({"pending": 1e9})).contains("seconds"));
        assert!(refused(json!({"conflict": "x"})).contains("execution id"));
        assert!(refused(json!({"boom": 1})).contains("unknown outcome"));
    }

    #[test]
    fn every_end_has_its_event() {
        for s in ExecutionState::ALL {
            assert_eq!(
                ended_event(s).is_some(),
                !s.is_active() && !s.is_migrating(),
                "{s:?}"
            );
        }
        assert!(EVENT_TYPES.iter().all(|t| t.starts_with("Child")));
    }
}
