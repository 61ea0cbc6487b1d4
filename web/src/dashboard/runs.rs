//! The actions on one execution, from its page: cancel, terminate, signal,
//! pause, resume. Each is offered only while it applies to the run's state,
//! confirmed on `/confirm` and done on `/act/{action}` (`actions`) through
//! the session's client; the shard audits each with the session's actor.

use axum::http::StatusCode;

use super::{cut, first, read_error, status_of};
use sheaf_core::excerpt::quoted;
use sheaf_core::state::ExecutionState;
use sheaf_driver::{Client, ClientError, ExecutionId, Json};

/// The longest signal name the shards take (bytes).
const MAX_SIGNAL: usize = 128;

/// What is done to the run.
pub(super) enum Op {
    Cancel {
        reason: String,
    },
    Terminate {
        reason: String,
    },
    Signal {
        name: String,
        payload: Json,
        signal_id: String,
    },
    Pause,
    Resume,
}

/// An action on one execution.
pub(super) struct RunAction {
    id: ExecutionId,
    op: Op,
}

/// Which actions a run in `state` offers (the execution page's buttons).
pub(super) struct Offered {
    pub ended: bool,
    pub cancel: bool,
    pub terminate: bool,
    pub signal: bool,
    pub pause: bool,
    pub resume: bool,
}

impl Offered {
    pub(super) fn of(state: ExecutionState) -> Offered {
        let active = state.is_active();
        Offered {
            ended: !active,
            cancel: active,
            terminate: active,
            signal: active,
            pause: pausable(state),
            resume: state == ExecutionState::Paused,
        }
    }
}

fn pausable(state: ExecutionState) -> bool {
    matches!(state, ExecutionState::Running | ExecutionState::Suspended)
}

/// What an action did, for the done page.
pub(super) struct Acted {
    pub status: StatusCode,
    pub lines: Vec<String>,
    /// Why it no longer applied (the run changed since its page was shown).
    pub stale: Option<String>,
    pub failures: Vec<(String, String)>,
}

impl Acted {
    fn new() -> Acted {
        Acted {
            status: StatusCode::OK,
            lines: Vec::new(),
            stale: None,
            failures: Vec::new(),
        }
    }

    fn failed(id: ExecutionId, e: &ClientError) -> Acted {
        Acted {
            status: status_of(e),
            failures: vec![(format!("execution {id}"), read_error(e))],
            ..Acted::new()
        }
    }

    fn stale(why: String) -> Acted {
        Acted {
            status: StatusCode::CONFLICT,
            stale: Some(why),
            ..Acted::new()
        }
    }
}

impl RunAction {
    /// The action named `action`, read from `form`; `None` if `action` is
    /// no action on an execution.
    pub(super) fn read(action: &str, form: &[(String, String)]) -> Option<Result<RunAction, String>> {
        let op = match action {
            "cancel-execution" => Ok(Op::Cancel {
                reason: cut(first(form, "reason").trim(), 200),
            }),
            "terminate-execution" => Ok(Op::Terminate {
                reason: cut(first(form, "reason").trim(), 200),
            }),
            "signal-execution" => signal(form),
            "pause-execution" => Ok(Op::Pause),
            "resume-execution" => Ok(Op::Resume),
            _ => return None,
        };
        Some(op.and_then(|op| {
            let id = first(form, "execution");
            let id = id
                .parse::<ExecutionId>()
                .map_err(|_| format!("execution: not an execution id: {}", quoted(id)))?;
            Ok(RunAction { id, op })
        }))
    }

    pub(super) fn name(&self) -> &'static str {
        match self.op {
            Op::Cancel { .. } => "cancel-execution",
            Op::Terminate { .. } => "terminate-execution",
            Op::Signal { .. } => "signal-execution",
            Op::Pause => "pause-execution",
            Op::Resume => "resume-execution",
        }
    }

    /// Where the operator goes back to.
    pub(super) fn back(&self) -> String {
        format!("/executions/{}", self.id)
    }

    pub(super) fn describe(&self) -> String {
        let id = self.id;
        let because = |reason: &str| {
            if reason.is_empty() {
                String::new()
            } else {
                format!(" Reason, kept in its history: {}.", quoted(reason))
            }
        };
        match &self.op {
            Op::Cancel { reason } => format!(
                "Cancel execution {id}: it ends CANCELLED and its tasks are cancelled.{}",
                because(reason)
            ),
            Op::Terminate { reason } => format!(
                "Terminate execution {id}: it ends TERMINATED at once (an operator's stop), \
                 its tasks cancelled and its locks released.{}",
                because(reason)
            ),
            Op::Signal { name, payload, .. } => format!(
                "Send signal {} to execution {id} with payload {}.",
                quoted(name),
                cut(payload.as_str(), 300)
            ),
            Op::Pause => format!(
                "Pause execution {id}: its waiting tasks are parked, holding no slot, \
                 until it is resumed (running ones finish)."
            ),
            Op::Resume => format!("Resume execution {id}: its parked tasks go back in line."),
        }
    }

    pub(super) fn fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = vec![("execution", self.id.to_string())];
        match &self.op {
            Op::Cancel { reason } | Op::Terminate { reason } => fields.push(("reason", reason.clone())),
            Op::Signal {
                name,
                payload,
                signal_id,
            } => fields.extend([
                ("signal", name.clone()),
                ("payload", payload.as_str().to_owned()),
                ("signal_id", signal_id.clone()),
            ]),
            Op::Pause | Op::Resume => {}
        }
        fields
    }

    fn applies(&self, state: ExecutionState) -> bool {
        match self.op {
            Op::Pause => pausable(state),
            Op::Resume => state == ExecutionState::Paused,
            _ => state.is_active(),
        }
    }

    /// Does it with `client` (the session's, so the shard's audit log names
    /// the session's actor), unless the run no longer allows it.
    pub(super) async fn act(&self, client: &Client) -> Acted {
        let id = self.id;
        let run = match client.get_execution(id).await {
            Ok(Some(run)) => run,
            Ok(None) => {
                let mut acted = Acted::new();
                acted.status = StatusCode::NOT_FOUND;
                acted.failures.push((
                    format!("execution {id}"),
                    "no such execution on the shard its id routes to".into(),
                ));
                return acted;
            }
            Err(e) => return Acted::failed(id, &e),
        };
        if !self.applies(run.state) {
            return Acted::stale(format!(
                "this no longer applies: execution {id} is {} now",
                run.state.as_str()
            ));
        }
        let reason = |r: &str| Some(r.to_owned()).filter(|r| !r.is_empty());
        let done = match &self.op {
            Op::Cancel { reason: r } => client.cancel_execution(id, reason(r).as_deref()).await,
            Op::Terminate { reason: r } => client.admin().terminate_execution(id, reason(r).as_deref()).await,
            Op::Signal {
                name,
                payload,
                signal_id,
            } => client.signal(id, name, payload.clone(), Some(signal_id)).await,
            Op::Pause => client.admin().pause_execution(id).await,
            Op::Resume => client.admin().resume_execution(id).await,
        };
        let changed = match done {
            Ok(changed) => changed,
            // It ended between the read and the action.
            Err(ClientError::WrongState { message, .. }) => {
                return Acted::stale(format!("this no longer applies: {}", cut(&message, 300)));
            }
            Err(e) => return Acted::failed(id, &e),
        };
        if changed {
            let mut acted = Acted::new();
            acted.lines.push(self.done_line());
            acted
        } else {
            Acted::stale(format!("this no longer applies: {}", self.unchanged()))
        }
    }

    fn done_line(&self) -> String {
        let id = self.id;
        match &self.op {
            Op::Cancel { .. } => format!("Execution {id} cancelled."),
            Op::Terminate { .. } => format!("Execution {id} terminated."),
            Op::Signal { name, .. } => format!("Signal {} delivered to execution {id}.", quoted(name)),
            Op::Pause => format!("Execution {id} paused."),
            Op::Resume => format!("Execution {id} resumed."),
        }
    }

    /// Why the shard changed nothing.
    fn unchanged(&self) -> String {
        let id = self.id;
        match self.op {
            Op::Cancel { .. } | Op::Terminate { .. } | Op::Signal { .. } => {
                format!("execution {id} had already ended")
            }
            Op::Pause => format!("execution {id} was already paused"),
            Op::Resume => format!("execution {id} was not paused"),
        }
    }
}

/// A signal's name and payload, as typed; a retry of the same confirmed
/// form (a second click) delivers nothing more: its `signal_id` is made
/// once, on the confirmation.
fn signal(form: &[(String, String)]) -> Result<Op, String> {
    let name = first(form, "signal").trim();
    if name.is_empty() || name.len() > MAX_SIGNAL {
        return Err(format!(
            "signal: a signal's name is 1 to {MAX_SIGNAL} bytes, got {}",
            name.len()
        ));
    }
    let text = first(form, "payload").trim();
    let payload = if text.is_empty() {
        Json::from(serde_json::Value::Null)
    } else {
        Json::parse(text).map_err(|e| format!("payload: not JSON: {e}"))?
    };
    let signal_id = match first(form, "signal_id").trim() {
        "" => format!("ui-{}", uuid::Uuid::new_v4()),
        given => cut(given, MAX_SIGNAL),
    };
    Ok(Op::Signal {
        name: name.to_owned(),
        payload,
        signal_id,
    })
}

#[cfg(test)]
mod tests {
    use super::super::form_of as form;
    use super::*;

    const ID: &str = "0190a6b2-7c1e-7000-8000-000000000001";

    #[test]
    fn a_run_action_is_read_or_refused_naming_the_field() {
        assert!(RunAction::read("redrive", &form(&[])).is_none());
        let e = RunAction::read("pause-execution", &form(&[("execution", "<b>")]))
            .expect("a run action")
            .err()
            .expect("refused");
        assert!(e.starts_with("execution: not an execution id"), "{e}");
        let e = RunAction::read(
            "signal-execution",
            &form(&[("execution", ID), ("signal", "go"), ("payload", "{nope")]),
        )
        .expect("a run action")
        .err()
        .expect("refused");
        assert!(e.starts_with("payload: not JSON"), "{e}");
        let e = RunAction::read("signal-execution", &form(&[("execution", ID)]))
            .expect("a run action")
            .err()
            .expect("refused");
        assert!(e.starts_with("signal: "), "{e}");
        // What the confirmation carries reads back as the same signal,
        // with the same id (a second click delivers nothing more).
        let signal = RunAction::read(
            "signal-execution",
            &form(&[("execution", ID), ("signal", "go"), ("payload", r#"{"n": 1}"#)]),
        )
        .expect("a run action")
        .expect("a signal");
        let carried: Vec<(String, String)> = signal
            .fields()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        let again = RunAction::read("signal-execution", &carried)
            .expect("a run action")
            .expect("the same signal");
        assert_eq!(signal.fields(), again.fields());
        assert!(again.describe().contains(r#"{"n": 1}"#));
    }

    #[test]
    fn a_run_offers_only_what_its_state_allows() {
        let running = Offered::of(ExecutionState::Running);
        assert!(running.pause && !running.resume && running.signal && !running.ended);
        let paused = Offered::of(ExecutionState::Paused);
        assert!(!paused.pause && paused.resume && paused.cancel);
        let done = Offered::of(ExecutionState::Completed);
        assert!(done.ended && !done.cancel && !done.terminate && !done.signal && !done.pause && !done.resume);
    }
}
