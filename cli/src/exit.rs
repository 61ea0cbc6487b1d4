//! The exit codes every command follows: one enum, documented as one table
//! in docs/operating/cli.md (a test keeps the two alike).

use std::fmt::Display;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use sheaf_driver::{ClientError, RouteError, ShardId};

use crate::output::{escape, json_line};

/// How a command ended. The values are fixed: scripts test them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    Done = 0,
    Failed = 1,
    BadInput = 2,
    Partial = 3,
    NotFound = 4,
    Found = 5,
    NotReady = 6,
    NoRole = 7,
}

impl Exit {
    /// Every code, in order: the rows of the documented table.
    pub const ALL: [Exit; 8] = [
        Exit::Done,
        Exit::Failed,
        Exit::BadInput,
        Exit::Partial,
        Exit::NotFound,
        Exit::Found,
        Exit::NotReady,
        Exit::NoRole,
    ];

    pub fn code(self) -> u8 {
        self as u8
    }

    /// Its name in a JSON error's `code`: the table's name in snake case.
    pub fn name(self) -> &'static str {
        match self {
            Exit::Done => "done",
            Exit::Failed => "failed",
            Exit::BadInput => "bad_input",
            Exit::Partial => "partial",
            Exit::NotFound => "not_found",
            Exit::Found => "found",
            Exit::NotReady => "not_ready",
            Exit::NoRole => "no_role",
        }
    }

    /// When a command exits with it: the table's text, word for word.
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Done => "done",
            Exit::Failed => {
                "the call failed: a shard could not serve it or refused it (other than for bad input), \
                 a move failed (`rebalance`, `rebalance-resume`, `shard drain`), a scheduled start \
                 failed (`schedules trigger`), `status` found a shard unreachable, misidentified or \
                 behind the fleet's schema, a business key had more than one live run (`executions \
                 signal|cancel` by key, which does not guess), a server could not listen"
            }
            Exit::BadInput => {
                "bad input: an argument the command line or a shard refuses (a usage error, a value \
                 out of range, a filter, cursor or spec a shard rejects), a file that cannot be read, \
                 a shard or residency key not in the topology, or no valid topology in the environment"
            }
            Exit::Partial => {
                "a partial answer: a shard did not answer, or did not take a change; stderr names \
                 each (it wins over 5: what a silent shard holds is unknown)"
            }
            Exit::NotFound => {
                "not found: no such execution, task, schedule or queue where its id routes \
                 (`find` and an action by business key: on any shard), or no live override to clear (`rate-limits clear`)"
            }
            Exit::Found => {
                "an audit found what it looks for: `orphans` some, `topology diff` or `config diff` \
                 a difference, `shard drain` executions left on the shard or relay work owed on or to it"
            }
            Exit::NotReady => "`shard health` found a shard that is not ready",
            Exit::NoRole => {
                "the login lacks a role the command needs (`relay` without `sheaf_relay`): a fix for \
                 the operator, not a fault to retry"
            }
        }
    }

    /// The code for a call that failed: the caller's mistake (refused by
    /// the driver, or by a shard as SQLSTATE 22023/22004) is bad input, an
    /// unknown id or name is not found, a missing role is 7, anything else
    /// a failure.
    pub fn of(e: &ClientError) -> Exit {
        match e {
            ClientError::BadRequest(_) | ClientError::InvalidArgument { .. } => Exit::BadInput,
            // A placement the caller got wrong; a shard that takes no work
            // now, or none that does, is a failure to retry.
            ClientError::Route(
                RouteError::TwoPins
                | RouteError::UnknownShard(_)
                | RouteError::BlankResidencyKey
                | RouteError::UndeclaredResidencyKey(_)
                | RouteError::BlankRoutingKey,
            ) => Exit::BadInput,
            ClientError::UnknownExecution { .. }
            | ClientError::UnknownTask { .. }
            | ClientError::UnknownSchedule { .. }
            | ClientError::UnknownQueue { .. } => Exit::NotFound,
            ClientError::MissingRole { .. } => Exit::NoRole,
            _ => Exit::Failed,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

/// `--json`: set once, before any command runs, so that every complaint
/// (from any depth of any command) takes the same form.
static JSON: AtomicBool = AtomicBool::new(false);

/// Complaints as JSON from now on (`--json`).
pub fn set_json(on: bool) {
    JSON.store(on, Ordering::Relaxed);
}

/// One complaint on stderr: `sheaf: MESSAGE` ([`escape`]d), or under
/// `--json` one line holding `{"error": {"code", "exit", "message",
/// "sqlstate", "shard"}}` (`warning` instead of `error` for a note that
/// does not decide the exit code; `extra`'s fields beside them).
fn complain(kind: &str, exit: Option<Exit>, message: &str, extra: Value) {
    if JSON.load(Ordering::Relaxed) {
        let mut body = json!({"message": message});
        if let Some(exit) = exit {
            body["code"] = json!(exit.name());
            body["exit"] = json!(exit.code());
        }
        if let (Value::Object(body), Value::Object(extra)) = (&mut body, extra) {
            body.extend(extra);
        }
        match json_line(&json!({ kind: body })) {
            Ok(line) => eprintln!("{line}"),
            Err(_) => eprintln!("sheaf: {}", escape(message)),
        }
    } else {
        eprintln!("sheaf: {}", escape(message));
    }
}

/// Says why on stderr; exits 2.
pub fn bad_input(why: impl Display) -> Exit {
    fail(Exit::BadInput, why)
}

/// Says why on stderr; exits with `exit`.
pub fn fail(exit: Exit, why: impl Display) -> Exit {
    complain(
        "error",
        Some(exit),
        &why.to_string(),
        json!({"sqlstate": null, "shard": null}),
    );
    exit
}

/// Says what failed on stderr; exits with the code [`Exit::of`] gives it.
pub fn failed(e: &ClientError) -> Exit {
    let exit = Exit::of(e);
    // The operator may see which shard or key a placement named (its
    // `Display` is for low-trust callers and leaves them out).
    let message = match e {
        ClientError::Route(route) => route.operator_detail(),
        _ => e.to_string(),
    };
    complain(
        "error",
        Some(exit),
        &message,
        json!({"sqlstate": e.sqlstate(), "shard": e.shard().map(ShardId::get)}),
    );
    exit
}

/// A note on stderr that does not change the exit code.
pub fn warn(why: impl Display) {
    complain("warning", None, &why.to_string(), json!({}));
}

/// clap's own errors (a usage error: exit 2, its text as the message under
/// `--json`) and its help and version output (exit 0), printed where clap
/// prints them. Parsing failed, so `--json` is looked for in the arguments.
pub fn clap(e: &clap::Error) -> Exit {
    if !e.use_stderr() {
        let _ = e.print();
        return Exit::Done;
    }
    if std::env::args_os().skip(1).any(|a| a == "--json") {
        set_json(true);
        let text = e.render().to_string();
        let message = text.trim().strip_prefix("error: ").unwrap_or(text.trim());
        return fail(Exit::BadInput, message);
    }
    let _ = e.print();
    Exit::BadInput
}

/// Exit 3 (saying so on stderr, naming each shard) when the answer is
/// partial, else 0.
pub fn partial_if(failures: &crate::output::Failures, partial: bool) -> Exit {
    if !partial {
        return Exit::Done;
    }
    let message = format!("partial answer: {} shard(s) did not answer", failures.len());
    if JSON.load(Ordering::Relaxed) {
        let shards: serde_json::Map<String, Value> = failures
            .iter()
            .map(|(shard, e)| (shard.to_string(), json!(e.to_string())))
            .collect();
        complain(
            "error",
            Some(Exit::Partial),
            &message,
            json!({ "shards": shards }),
        );
    } else {
        complain("error", Some(Exit::Partial), &message, json!({}));
        for (shard, e) in failures {
            eprintln!("  shard {shard}: {}", escape(&e.to_string()));
        }
    }
    Exit::Partial
}
