//! Signals and cancels addressed by business key (`sheaf.signal_external`,
//! `sheaf.cancel_external`): the sender's options, the events they put in
//! the sender's history, and the outcomes a relay reports for an outbox row
//! (`sheaf.outbox_report`).

use serde_json::Value;

use crate::children::{MAX_MESSAGE_BYTES, cut, err, object, one_key};
use crate::excerpt::{excerpt, quoted};
use crate::id::MAX_SHARD_ID;
use crate::options::OptionError;
use crate::state::ExecutionState;

/// The longest `opts.signal_id`.
pub const MAX_SIGNAL_ID_BYTES: usize = 256;

/// What an outbox row carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Signal,
    Cancel,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Signal => "signal",
            Kind::Cancel => "cancel",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        [Kind::Signal, Kind::Cancel].into_iter().find(|k| k.as_str() == s)
    }
}

/// `opts` of `signal_external` and `cancel_external`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExternalOptions {
    /// Deduplicates a sender's retried handler: a second call with it
    /// returns the first call's outbox id and sends nothing.
    pub signal_id: Option<String>,
}

impl ExternalOptions {
    pub fn parse(opts: &Value) -> Result<ExternalOptions, OptionError> {
        let map = object(opts, &["signal_id"])?;
        let mut o = ExternalOptions::default();
        if let Some(v) = map.get("signal_id").filter(|v| !v.is_null()) {
            let s = v
                .as_str()
                .ok_or_else(|| err("opts.signal_id", format!("must be a string, got {}", excerpt(v))))?;
            if s.is_empty() || s.len() > MAX_SIGNAL_ID_BYTES {
                return Err(err(
                    "opts.signal_id",
                    format!("must be 1 to {MAX_SIGNAL_ID_BYTES} bytes, got {}", s.len()),
                ));
            }
            o.signal_id = Some(s.to_owned());
        }
        Ok(o)
    }
}

/// Where a relay found the addressed run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub execution_id: [u8; 16],
    pub shard: u16,
}

/// What a relay reports for an outbox row it holds (`outcome`, an object
/// with exactly one of these keys).
#[derive(Debug, Clone, PartialEq)]
pub enum OutboxReport {
    /// `{"delivered": {"execution_id", "shard"}}`: the signal is in the
    /// target's history (sender: `ExternalSignalDelivered`).
    Delivered(Target),
    /// `{"cancelled": {"execution_id", "shard"}}`: the cancel ended that
    /// live run. Its `ExternalCancelDelivered` waits for a later fan-out to
    /// find no other live run of the key (the row becomes `CONFIRMING`).
    Cancelled(Target),
    /// `{"ended": {"execution_id", "shard", "state"}}`: a complete fan-out
    /// found only this ended run (a signal: `ExternalSignalFailed`; a
    /// cancel: `ExternalCancelDelivered`, nothing to cancel).
    Ended(Target, ExecutionState),
    /// `{"confirmed": true}`: a `CONFIRMING` cancel's later fan-out was
    /// complete and found no live run: `ExternalCancelDelivered`.
    Confirmed,
    /// `{"unknown": true}`: a complete fan-out found no run of the key
    /// (`ExternalTargetUnknown`).
    Unknown,
    /// `{"indeterminate": "<why>"}`: a shard could not be inspected, so
    /// nothing can be concluded; retried, never turned into "unknown".
    Indeterminate(String),
    /// `{"failed": "<error>"}`: the delivery did not get through; backs off.
    Failed(String),
}

const OUTCOMES: &str = "delivered, cancelled, ended, confirmed, unknown, indeterminate, failed";

impl OutboxReport {
    pub fn parse(outcome: &Value) -> Result<OutboxReport, OptionError> {
        let (kind, value) = one_key(outcome, OUTCOMES)?;
        let opt = format!("outcome.{kind}");
        let message = |v: &Value| -> Result<String, OptionError> {
            let s = v
                .as_str()
                .ok_or_else(|| err(&opt, format!("must be a string, got {}", excerpt(v))))?;
            Ok(cut(s, MAX_MESSAGE_BYTES).to_owned())
        };
        let yes = |v: &Value| -> Result<(), OptionError> {
            if v == &Value::Bool(true) {
                Ok(())
            } else {
                Err(err(&opt, format!("must be true, got {}", excerpt(v))))
            }
        };
        Ok(match kind.as_str() {
            "delivered" => OutboxReport::Delivered(target(&opt, value, false)?.0),
            "cancelled" => OutboxReport::Cancelled(target(&opt, value, false)?.0),
            "ended" => {
                let (t, state) = target(&opt, value, true)?;
                OutboxReport::Ended(t, state.unwrap_or(ExecutionState::Completed))
            }
            "confirmed" => yes(value).map(|()| OutboxReport::Confirmed)?,
            "unknown" => yes(value).map(|()| OutboxReport::Unknown)?,
            "indeterminate" => OutboxReport::Indeterminate(message(value)?),
            "failed" => OutboxReport::Failed(message(value)?),
            other => {
                return Err(err(
                    "outcome",
                    format!("unknown outcome {} (accepted: {OUTCOMES})", quoted(other)),
                ));
            }
        })
    }
}

/// `{"execution_id", "shard"}`, and `"state"` (an end) when `ended`.
fn target(opt: &str, value: &Value, ended: bool) -> Result<(Target, Option<ExecutionState>), OptionError> {
    let accepted: &[&str] = if ended {
        &["execution_id", "shard", "state"]
    } else {
        &["execution_id", "shard"]
    };
    let map = value
        .as_object()
        .ok_or_else(|| err(opt, format!("must be an object, got {}", excerpt(value))))?;
    for k in map.keys() {
        if !accepted.contains(&k.as_str()) {
            return Err(err(
                opt,
                format!("unknown field {} (accepted: {})", quoted(k), accepted.join(", ")),
            ));
        }
    }
    let id = map
        .get("execution_id")
        .and_then(Value::as_str)
        .and_then(|s| uuid::Uuid::parse_str(s).ok())
        .ok_or_else(|| err(&format!("{opt}.execution_id"), "must be an execution id"))?;
    let shard = map
        .get("shard")
        .and_then(Value::as_u64)
        .and_then(|v| u16::try_from(v).ok())
        .filter(|v| *v <= MAX_SHARD_ID)
        .ok_or_else(|| {
            err(
                &format!("{opt}.shard"),
                format!("must be a shard id, 0 to {MAX_SHARD_ID}"),
            )
        })?;
    let state = if ended {
        let s = map
            .get("state")
            .and_then(Value::as_str)
            .ok_or_else(|| err(&format!("{opt}.state"), "must be the run's terminal state"))?;
        match s.parse::<ExecutionState>() {
            Ok(st) if !st.is_active() && !st.is_migrating() => Some(st),
            _ => {
                return Err(err(
                    &format!("{opt}.state"),
                    format!("must be a terminal state, got {}", quoted(s)),
                ));
            }
        }
    } else {
        None
    };
    Ok((
        Target {
            execution_id: *id.as_bytes(),
            shard,
        },
        state,
    ))
}

/// The event types of external signals and cancels in a sender's history
/// (sheaf's own).
pub const EVENT_TYPES: &[&str] = &[
    "ExternalSignalRequested",
    "ExternalSignalDelivered",
    "ExternalSignalFailed",
    "ExternalCancelRequested",
    "ExternalCancelDelivered",
    "ExternalTargetUnknown",
];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ID: &str = "00020000-0000-8000-8000-000000000001";

    #[test]
    fn options_parse_and_refuse() {
        assert_eq!(
            ExternalOptions::parse(&json!({})).unwrap(),
            ExternalOptions::default()
        );
        assert_eq!(
            ExternalOptions::parse(&json!({"signal_id": "a"}))
                .unwrap()
                .signal_id
                .as_deref(),
            Some("a")
        );
        let refused = |v: Value| ExternalOptions::parse(&v).unwrap_err().to_string();
        assert!(refused(json!({"signal_id": ""})).contains("1 to 256 bytes"));
        assert!(refused(json!({"signal_id": "x".repeat(257)})).contains("got 257"));
        assert!(refused(json!({"signal_id": 3})).contains("must be a string"));
        assert!(refused(json!({"dedupe": "x"})).contains("unknown option"));
        assert!(refused(json!([])).contains("JSON object"));
    }

    #[test]
    fn reports_parse_and_refuse() {
        let t = Target {
            execution_id: *uuid::Uuid::parse_str(ID).unwrap().as_bytes(),
            shard: 2,
        };
        assert_eq!(
            OutboxReport::parse(&json!({"delivered": {"execution_id": ID, "shard": 2}})).unwrap(),
            OutboxReport::Delivered(t)
        );
        assert_eq!(
            OutboxReport::parse(&json!({"cancelled": {"execution_id": ID, "shard": 2}})).unwrap(),
            OutboxReport::Cancelled(t)
        );
        assert_eq!(
            OutboxReport::parse(&json!({"ended": {"execution_id": ID, "shard": 2, "state": "FAILED"}}))
                .unwrap(),
            OutboxReport::Ended(t, ExecutionState::Failed)
        );
        assert_eq!(
            OutboxReport::parse(&json!({"unknown": true})).unwrap(),
            OutboxReport::Unknown
        );
        assert_eq!(
            OutboxReport::parse(&json!({"confirmed": true})).unwrap(),
            OutboxReport::Confirmed
        );
        let refused = |v: Value| OutboxReport::parse(&v).unwrap_err().to_string();
        assert!(refused(json!({})).contains("exactly one"));
        assert!(refused(json!({"unknown": false})).contains("must be true"));
        assert!(refused(json!({"delivered": {"execution_id": "x", "shard": 2}})).contains("execution id"));
        assert!(refused(json!({"delivered": {"execution_id": ID, "shard": 70000}})).contains("shard id"));
        assert!(
            refused(json!({"delivered": {"execution_id": ID, "shard": 1, "state": "FAILED"}}))
                .contains("unknown field")
        );
        assert!(
            refused(json!({"ended": {"execution_id": ID, "shard": 1, "state": "RUNNING"}}))
                .contains("terminal state")
        );
        assert!(refused(json!({"boom": 1})).contains("unknown outcome"));
        match OutboxReport::parse(&json!({"indeterminate": "é".repeat(MAX_MESSAGE_BYTES)})).unwrap() {
            OutboxReport::Indeterminate(m) => assert!(m.len() <= MAX_MESSAGE_BYTES),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn event_types_are_external() {
        assert!(EVENT_TYPES.iter().all(|t| t.starts_with("External")));
        assert_eq!(Kind::parse("cancel"), Some(Kind::Cancel));
        assert_eq!(Kind::parse("x"), None);
    }
}
