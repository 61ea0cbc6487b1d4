//! Retention: how long a shard keeps what has ended (`sheaf.set_retention`,
//! applied by `sheaf.maintain`). Parsed, merged and printed here.
//!
//! The policy, as `set_retention` takes and returns it:
//!
//! ```json
//! {"executions": "30days", "dead_letters": "14days", "seals": "90days",
//!  "idle_queues": "7days", "schedule_fires": "30days", "workflows": {"billing": {"executions": "365days"}}}
//! ```
//!
//! A duration is a string of `humantime`'s form (`30days`, `12h`, `90 days`,
//! `1h 30min`), whole seconds as a number, or `"forever"`. Each field not
//! given is kept as it was; `null` puts it back to its default, which is
//! forever: a fresh shard deletes nothing. `workflows` overrides
//! `executions` per workflow name (`null` for a name removes its override).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::excerpt::quoted;

/// The shortest retention: anything shorter would delete what a worker,
/// the relay or an operator is about to read.
pub const MIN_SECS: u64 = 60;
/// The longest: 100 years (longer is "forever").
pub const MAX_SECS: u64 = 100 * 365 * 86_400;
/// The longest workflow name (as `declare_workflow` takes it).
const MAX_NAME_BYTES: usize = 256;
/// The most per-workflow overrides one shard keeps.
pub const MAX_WORKFLOWS: usize = 1_000;

/// How long something is kept after it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Keep {
    /// Never deleted (the default).
    #[default]
    Forever,
    /// Deleted once it has been over for this long.
    For(Duration),
}

impl Keep {
    /// Seconds, or `None` for forever.
    pub fn secs(self) -> Option<f64> {
        match self {
            Keep::Forever => None,
            Keep::For(d) => Some(d.as_secs_f64()),
        }
    }

    fn to_json(self) -> Value {
        match self {
            Keep::Forever => json!("forever"),
            Keep::For(d) => json!(compact(d.as_secs())),
        }
    }
}

/// Whole seconds in their largest whole unit (`60days`, `36h`, `90m`,
/// `45s`), as humantime reads them back.
fn compact(secs: u64) -> String {
    match secs {
        86_400 => "1day".to_owned(),
        s if s % 86_400 == 0 => format!("{}days", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// A shard's retention policy.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Retention {
    /// Ended executions, with their history, children links, usage records
    /// and dead letters (by when they ended).
    pub executions: Keep,
    /// Dead letters (by when they died).
    pub dead_letters: Keep,
    /// `MIGRATED` seals, by when their move was done: ids held outside may
    /// still route through them.
    pub seals: Keep,
    /// Queues of the default configuration seen with nothing in them (no
    /// task in any state, no dead letter) for this long.
    pub idle_queues: Keep,
    /// Schedules' fire records (`schedule_fires`), by when they fired.
    pub schedule_fires: Keep,
    /// Per workflow name, `executions` for that workflow's runs.
    pub workflows: BTreeMap<String, Keep>,
}

/// A refused policy: the field, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionError {
    pub field: String,
    pub why: String,
}

impl std::fmt::Display for RetentionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid {}: {}", self.field, self.why)
    }
}

fn err(field: &str, why: impl Into<String>) -> RetentionError {
    RetentionError {
        field: field.to_owned(),
        why: why.into(),
    }
}

fn object<'a>(field: &str, v: &'a Value, keys: &[&str]) -> Result<&'a Map<String, Value>, RetentionError> {
    let Value::Object(m) = v else {
        return Err(err(field, "must be a JSON object"));
    };
    if let Some(k) = m.keys().find(|k| !keys.contains(&k.as_str())) {
        return Err(err(
            field,
            format!("has no field {} (it takes {})", quoted(k), keys.join(", ")),
        ));
    }
    Ok(m)
}

/// A duration field: `"forever"`, a humantime string, or whole seconds.
fn keep(field: &str, v: &Value) -> Result<Keep, RetentionError> {
    let secs = match v {
        Value::String(s) if s.trim() == "forever" => return Ok(Keep::Forever),
        Value::String(s) => humantime::parse_duration(s.trim())
            .map_err(|e| {
                err(
                    field,
                    format!("{} is not a duration like 30days or 12h ({e})", quoted(s)),
                )
            })?
            .as_secs_f64(),
        Value::Number(n) => match n.as_u64() {
            Some(s) => s as f64,
            None => {
                return Err(err(
                    field,
                    format!("must be whole seconds, got {}", quoted(&n.to_string())),
                ));
            }
        },
        _ => {
            return Err(err(
                field,
                "must be a duration (30days, 12h), whole seconds, or \"forever\"",
            ));
        }
    };
    if secs < MIN_SECS as f64 || secs > MAX_SECS as f64 {
        return Err(err(
            field,
            format!("must be from 1 minute to 100 years (or \"forever\"), got {secs} seconds"),
        ));
    }
    Ok(Keep::For(Duration::from_secs_f64(secs.floor())))
}

impl Retention {
    /// The policy as stored (its own `to_json`); anything unreadable is the
    /// default, so a shard never deletes on a policy it cannot read.
    pub fn stored(v: &Value) -> Retention {
        let mut r = Retention::default();
        match r.merge(v) {
            Ok(()) => r,
            Err(_) => Retention::default(),
        }
    }

    /// Applies `patch` (see the module): fields it names change, `null`
    /// puts one back to forever. Nothing changes when it is refused.
    pub fn merge(&mut self, patch: &Value) -> Result<(), RetentionError> {
        let m = object(
            "opts",
            patch,
            &[
                "executions",
                "dead_letters",
                "seals",
                "idle_queues",
                "schedule_fires",
                "workflows",
            ],
        )?;
        let mut next = self.clone();
        for (name, slot) in [
            ("executions", &mut next.executions),
            ("dead_letters", &mut next.dead_letters),
            ("seals", &mut next.seals),
            ("idle_queues", &mut next.idle_queues),
            ("schedule_fires", &mut next.schedule_fires),
        ] {
            match m.get(name) {
                None => {}
                Some(Value::Null) => *slot = Keep::Forever,
                Some(v) => *slot = keep(&format!("opts.{name}"), v)?,
            }
        }
        if let Some(w) = m.get("workflows") {
            let w = object_any("opts.workflows", w)?;
            for (name, v) in w {
                if name.is_empty() || name.len() > MAX_NAME_BYTES {
                    return Err(err(
                        "opts.workflows",
                        format!(
                            "a workflow name must be 1 to {MAX_NAME_BYTES} bytes, got {}",
                            name.len()
                        ),
                    ));
                }
                let field = format!("opts.workflows.{}", quoted(name));
                match v {
                    Value::Null => {
                        next.workflows.remove(name);
                    }
                    v => {
                        let o = object(&field, v, &["executions"])?;
                        match o.get("executions") {
                            None | Some(Value::Null) => {
                                next.workflows.remove(name);
                            }
                            Some(d) => {
                                next.workflows
                                    .insert(name.clone(), keep(&format!("{field}.executions"), d)?);
                            }
                        }
                    }
                }
            }
            if next.workflows.len() > MAX_WORKFLOWS {
                return Err(err(
                    "opts.workflows",
                    format!("at most {MAX_WORKFLOWS} workflows may have their own retention"),
                ));
            }
        }
        *self = next;
        Ok(())
    }

    /// The policy as JSON: every field, durations in humantime's form.
    pub fn to_json(&self) -> Value {
        json!({
            "executions": self.executions.to_json(),
            "dead_letters": self.dead_letters.to_json(),
            "seals": self.seals.to_json(),
            "idle_queues": self.idle_queues.to_json(),
            "schedule_fires": self.schedule_fires.to_json(),
            "workflows": self.workflows.iter()
                .map(|(k, v)| (k.clone(), json!({"executions": v.to_json()})))
                .collect::<Map<_, _>>(),
        })
    }
}

fn object_any<'a>(field: &str, v: &'a Value) -> Result<&'a Map<String, Value>, RetentionError> {
    match v {
        Value::Object(m) => Ok(m),
        _ => Err(err(
            field,
            "must be a JSON object of workflow name to {\"executions\": duration}",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_policy_keeps_everything_and_a_patch_changes_only_what_it_names() {
        let mut r = Retention::default();
        assert_eq!(r.executions, Keep::Forever);
        r.merge(&json!({"executions": "30days", "dead_letters": 86_400}))
            .unwrap();
        assert_eq!(r.executions, Keep::For(Duration::from_secs(30 * 86_400)));
        assert_eq!(r.dead_letters, Keep::For(Duration::from_secs(86_400)));
        r.merge(&json!({"seals": "90 days", "idle_queues": "7days", "workflows": {"billing": {"executions": "365days"}}}))
            .unwrap();
        assert_eq!(r.idle_queues, Keep::For(Duration::from_secs(7 * 86_400)));
        assert_eq!(r.executions.secs(), Some(30.0 * 86_400.0), "untouched");
        assert_eq!(
            r.workflows["billing"],
            Keep::For(Duration::from_secs(365 * 86_400))
        );
        r.merge(&json!({"executions": null, "workflows": {"billing": null}}))
            .unwrap();
        assert_eq!(r.executions, Keep::Forever);
        assert!(r.workflows.is_empty());
    }

    #[test]
    fn its_json_reads_back_as_the_same_policy() {
        let mut r = Retention::default();
        r.merge(&json!({"executions": "1h 30min", "workflows": {"w": {"executions": "forever"}}}))
            .unwrap();
        assert_eq!(Retention::stored(&r.to_json()), r);
        assert_eq!(r.to_json()["executions"], json!("90m"));
    }

    #[test]
    fn bad_fields_are_refused_and_change_nothing() {
        let mut r = Retention::default();
        r.merge(&json!({"executions": "30days"})).unwrap();
        let before = r.clone();
        for (patch, field) in [
            (json!([]), "opts"),
            (json!({"execution": "1d"}), "opts"),
            (json!({"executions": "soon"}), "opts.executions"),
            (json!({"executions": "30s"}), "opts.executions"),
            (json!({"executions": 1.5}), "opts.executions"),
            (json!({"executions": -5}), "opts.executions"),
            (json!({"executions": "1000years"}), "opts.executions"),
            (json!({"dead_letters": true}), "opts.dead_letters"),
            (json!({"workflows": []}), "opts.workflows"),
            (json!({"workflows": {"": {"executions": "1d"}}}), "opts.workflows"),
            (
                json!({"workflows": {"w": {"history": "1d"}}}),
                "opts.workflows.\"w\"",
            ),
        ] {
            let e = r.merge(&patch).unwrap_err();
            assert_eq!(e.field, field, "{patch}: {e}");
            assert_eq!(r, before, "{patch} changed nothing");
        }
        let long = "x".repeat(100_000);
        let e = r.merge(&json!({"executions": long})).unwrap_err();
        assert!(e.to_string().len() < 1_000, "never echoes a huge value");
    }

    #[test]
    fn an_unreadable_stored_policy_deletes_nothing() {
        assert_eq!(
            Retention::stored(&json!({"executions": "bogus"})),
            Retention::default()
        );
    }
}
