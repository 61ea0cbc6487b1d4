//! The dashboard's actions: redrive dead letters, purge a queue's dead
//! letters, cancel a task, pause or resume a schedule, and act on an execution (`runs`). `/confirm` shows what an action will do and
//! asks for it; `/act/{action}` does it, as a POST of a signed-in session
//! with its CSRF token (`session`), through the session's client, so each
//! shard's audit log records the session's actor.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use askama::Template;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::runs::RunAction;
use super::{Chrome, Shared, cut, first, pairs, read_error, render, status_of};
use sheaf_driver::TaskId;
use sheaf_driver::{Client, ClientError, ShardId};

/// The most tasks one action may name.
const MAX_IDS: usize = 1000;

/// An action, read from a query or a form.
enum Action {
    Redrive(Vec<TaskId>),
    Purge { queue: String, older_than: Duration },
    Cancel { task: TaskId, reason: String },
    Run(RunAction),
    Schedule { name: String, pause: bool },
}

impl Action {
    fn read(action: &str, form: &[(String, String)]) -> Result<Action, String> {
        let tasks = || -> Result<Vec<TaskId>, String> {
            let ids: Vec<&str> = form
                .iter()
                .filter(|(k, _)| k == "task")
                .map(|(_, v)| v.as_str())
                .collect();
            if ids.is_empty() {
                return Err("task: no task was selected".into());
            }
            if ids.len() > MAX_IDS {
                return Err(format!(
                    "task: at most {MAX_IDS} tasks at a time, got {}",
                    ids.len()
                ));
            }
            ids.iter()
                .map(|id| {
                    id.parse::<TaskId>()
                        .map_err(|_| format!("task: not a task id: {}", sheaf_core::excerpt::quoted(id)))
                })
                .collect()
        };
        match action {
            "redrive" => Ok(Action::Redrive(tasks()?)),
            "purge" => {
                let queue = first(form, "queue").trim();
                if queue.is_empty() {
                    return Err("queue: purging needs a queue".into());
                }
                let older = first(form, "older_than").trim();
                let older_than = if older.is_empty() {
                    Duration::ZERO
                } else {
                    humantime::parse_duration(older).map_err(|_| {
                        format!(
                            "older_than: expected an age like 1h or 7days, got {}",
                            sheaf_core::excerpt::quoted(older)
                        )
                    })?
                };
                Ok(Action::Purge {
                    queue: queue.to_owned(),
                    older_than,
                })
            }
            "cancel" => {
                let mut ids = tasks()?;
                if ids.len() != 1 {
                    return Err("task: cancel one task at a time".into());
                }
                Ok(Action::Cancel {
                    task: ids.remove(0),
                    reason: cut(first(form, "reason").trim(), 200),
                })
            }
            "pause_schedule" | "resume_schedule" => {
                let name = first(form, "schedule").trim();
                if name.is_empty() {
                    return Err("schedule: no schedule was named".into());
                }
                Ok(Action::Schedule {
                    name: name.to_owned(),
                    pause: action == "pause_schedule",
                })
            }
            other => match RunAction::read(other, form) {
                Some(run) => run.map(Action::Run),
                None => Err(format!(
                    "action: no such action: {}",
                    sheaf_core::excerpt::quoted(other)
                )),
            },
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Action::Redrive(_) => "redrive",
            Action::Purge { .. } => "purge",
            Action::Cancel { .. } => "cancel",
            Action::Schedule { pause: true, .. } => "pause_schedule",
            Action::Schedule { pause: false, .. } => "resume_schedule",
            Action::Run(run) => run.name(),
        }
    }

    /// The page the operator came from, to go back to.
    fn back(&self) -> Option<String> {
        match self {
            Action::Run(run) => Some(run.back()),
            _ => None,
        }
    }

    /// What it will do, in a sentence.
    fn describe(&self) -> String {
        match self {
            Action::Redrive(ids) => {
                const NAMED: usize = 10;
                let named: Vec<String> = ids.iter().take(NAMED).map(ToString::to_string).collect();
                let more = if ids.len() > NAMED {
                    format!(" and {} more", ids.len() - NAMED)
                } else {
                    String::new()
                };
                format!(
                    "Put {} dead letter(s) back in line with fresh attempts: {}{more}.",
                    ids.len(),
                    named.join(", ")
                )
            }
            Action::Purge { queue, older_than } if older_than.is_zero() => format!(
                "Delete every dead letter of queue {} on every shard. This cannot be undone.",
                sheaf_core::excerpt::quoted(queue)
            ),
            Action::Purge { queue, older_than } => format!(
                "Delete the dead letters of queue {} older than {} on every shard. This cannot be undone.",
                sheaf_core::excerpt::quoted(queue),
                humantime::format_duration(*older_than)
            ),
            Action::Cancel { task, .. } => {
                format!("Cancel task {task}: a running attempt is told at its next fenced call.")
            }
            Action::Run(run) => run.describe(),
            Action::Schedule { name, pause: true } => format!(
                "Pause schedule {}: it fires nothing until resumed.",
                sheaf_core::excerpt::quoted(name)
            ),
            Action::Schedule { name, pause: false } => format!(
                "Resume schedule {}: it fires again from its next fire time after now.",
                sheaf_core::excerpt::quoted(name)
            ),
        }
    }

    /// The hidden fields that carry it to `/act`.
    fn fields(&self) -> Vec<(&'static str, String)> {
        match self {
            Action::Redrive(ids) => ids.iter().map(|id| ("task", id.to_string())).collect(),
            Action::Purge { queue, older_than } => vec![
                ("queue", queue.clone()),
                (
                    "older_than",
                    if older_than.is_zero() {
                        String::new()
                    } else {
                        humantime::format_duration(*older_than).to_string()
                    },
                ),
            ],
            Action::Cancel { task, reason } => vec![("task", task.to_string()), ("reason", reason.clone())],
            Action::Run(run) => run.fields(),
            Action::Schedule { name, .. } => vec![("schedule", name.clone())],
        }
    }
}

#[derive(Template)]
#[template(path = "confirm.html")]
struct ConfirmPage {
    chrome: Chrome,
    action: &'static str,
    error: Option<String>,
    description: String,
    fields: Vec<(&'static str, String)>,
    back: Option<String>,
}

#[derive(Template)]
#[template(path = "done.html")]
struct DonePage {
    chrome: Chrome,
    action: String,
    /// Refused before anything was done.
    refused: Option<String>,
    lines: Vec<String>,
    /// Why the action no longer applied (the run changed meanwhile).
    stale: Option<String>,
    failures: Vec<(String, String)>,
    back: Option<String>,
}

pages!(ConfirmPage, DonePage);

pub(super) async fn confirm(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = pairs(raw.as_deref().unwrap_or(""));
    let mut page = ConfirmPage {
        chrome: Chrome::new(&shared, &headers, "confirm"),
        action: "",
        error: None,
        description: String::new(),
        fields: Vec::new(),
        back: None,
    };
    match Action::read(first(&q, "action"), &q) {
        Ok(action) => {
            page.action = action.name();
            page.description = action.describe();
            page.fields = action.fields();
            page.back = action.back();
            render(StatusCode::OK, page)
        }
        Err(e) => {
            page.error = Some(e);
            render(StatusCode::BAD_REQUEST, page)
        }
    }
}

fn failures<E: Display>(failed: &BTreeMap<ShardId, E>) -> Vec<(String, String)> {
    failed
        .iter()
        .map(|(s, e)| (format!("shard {s}"), cut(&e.to_string(), 300)))
        .collect()
}

pub(super) async fn act(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(action): Path<String>,
    body: Bytes,
) -> Response {
    let form = pairs(&String::from_utf8_lossy(&body));
    let mut page = DonePage {
        chrome: Chrome::new(&shared, &headers, "done"),
        action: cut(&action, 32),
        refused: None,
        lines: Vec::new(),
        stale: None,
        failures: Vec::new(),
        back: None,
    };
    let session = match shared.sessions.authorize(&headers, first(&form, "csrf")) {
        Ok(s) => s,
        Err(refusal) => {
            page.refused = Some(refusal.0.to_owned());
            return render(StatusCode::FORBIDDEN, page);
        }
    };
    let action = match Action::read(&action, &form) {
        Ok(a) => a,
        Err(e) => {
            page.refused = Some(e);
            return render(StatusCode::BAD_REQUEST, page);
        }
    };
    page.back = action.back();
    let mut status = perform(&action, &session.client, &mut page).await;
    page.lines
        .push(format!("Recorded in the audit log as {}.", session.actor));
    if status == StatusCode::OK && !page.failures.is_empty() {
        status = StatusCode::BAD_GATEWAY;
    }
    render(status, page)
}

/// Pauses or resumes schedule `name`: what was done, in a sentence.
/// Does `action` through the session's `client`, writing what happened into
/// `page`; the status to answer with. A refusal of what was asked says so
/// with its own status; a shard that did not do its part makes it 502 (the
/// caller's, from `page.failures`).
async fn perform(action: &Action, client: &Client, page: &mut DonePage) -> StatusCode {
    let mut status = StatusCode::OK;
    match action {
        Action::Redrive(ids) => {
            let report = client.admin().redrive(ids).await;
            let moved: i32 = report.ok.values().sum();
            page.lines.push(format!(
                "{moved} of {} dead letter(s) redriven (an id that is no longer a dead letter is skipped).",
                ids.len()
            ));
            page.failures = failures(&report.failed);
        }
        Action::Purge { queue, older_than } => {
            match client.admin().purge_dead_letters(queue, *older_than).await {
                Ok(report) => {
                    let gone: i64 = report.ok.values().sum();
                    page.lines
                        .push(format!("{gone} dead letter(s) of queue {queue} deleted."));
                    page.failures = failures(&report.failed);
                }
                Err(e) => {
                    status = status_of(&e);
                    page.failures.push(("the purge".into(), read_error(&e)));
                }
            }
        }
        Action::Cancel { task, reason } => {
            let reason = Some(reason.as_str()).filter(|r| !r.is_empty());
            match client.cancel_task(*task, reason).await {
                Ok(true) => page.lines.push(format!("Task {task} cancelled.")),
                Ok(false) => page.lines.push(format!("Task {task} had already finished.")),
                Err(e) => {
                    status = status_of(&e);
                    page.failures.push((format!("task {task}"), read_error(&e)));
                }
            }
        }
        Action::Run(run) => {
            let acted = run.act(client).await;
            status = acted.status;
            page.lines = acted.lines;
            page.stale = acted.stale;
            page.failures = acted.failures;
        }
        Action::Schedule { name, pause } => match pause_or_resume(client, name, *pause).await {
            Ok(line) => page.lines.push(line),
            Err(e) => {
                status = status_of(&e);
                let shown = sheaf_core::excerpt::quoted(name);
                page.failures.push((format!("schedule {shown}"), read_error(&e)));
            }
        },
    }
    status
}

async fn pause_or_resume(client: &Client, name: &str, pause: bool) -> Result<String, ClientError> {
    let shown = sheaf_core::excerpt::quoted(name);
    Ok(if pause {
        if client.admin().pause_schedule(name).await? {
            format!("Schedule {shown} paused.")
        } else {
            format!("Schedule {shown} was paused already.")
        }
    } else if client.admin().resume_schedule(name).await? {
        format!("Schedule {shown} resumed.")
    } else {
        format!("Schedule {shown} was not paused.")
    })
}

#[cfg(test)]
mod tests {
    use super::super::form_of as form;
    use super::*;

    #[test]
    fn an_action_is_read_or_refused_with_a_reason() {
        let id = "0190a6b2-7c1e-7000-8000-000000000001";
        match Action::read("redrive", &form(&[("task", id), ("task", id)])) {
            Ok(Action::Redrive(ids)) => assert_eq!(ids.len(), 2),
            _ => panic!("a redrive of two"),
        }
        assert!(Action::read("redrive", &form(&[])).is_err());
        let e = Action::read("redrive", &form(&[("task", "<script>")]))
            .err()
            .expect("refused");
        assert!(e.starts_with("task: not a task id"), "{e}");
        match Action::read("purge", &form(&[("queue", "q"), ("older_than", "2h")])) {
            Ok(Action::Purge { queue, older_than }) => {
                assert_eq!((queue.as_str(), older_than), ("q", Duration::from_secs(7200)));
            }
            _ => panic!("a purge"),
        }
        assert!(Action::read("purge", &form(&[("queue", " ")])).is_err());
        assert!(Action::read("purge", &form(&[("queue", "q"), ("older_than", "soon")])).is_err());
        assert!(Action::read("cancel", &form(&[("task", id), ("task", id)])).is_err());
        assert!(Action::read("drop", &form(&[])).is_err());
        match Action::read("resume_schedule", &form(&[("schedule", " nightly ")])) {
            Ok(a @ Action::Schedule { pause: false, .. }) => {
                assert_eq!(a.fields(), [("schedule", "nightly".to_owned())]);
            }
            _ => panic!("a resume"),
        }
        let e = Action::read("pause_schedule", &form(&[])).err().expect("refused");
        assert!(e.starts_with("schedule:"), "{e}");
        // What the confirmation carries reads back as the same action.
        let purge = Action::read("purge", &form(&[("queue", "q"), ("older_than", "90m")])).expect("a purge");
        let carried: Vec<(String, String)> = purge
            .fields()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        match Action::read("purge", &carried) {
            Ok(Action::Purge { older_than, .. }) => assert_eq!(older_than, Duration::from_secs(5400)),
            _ => panic!("the same purge"),
        }
    }
}
