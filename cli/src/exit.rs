//! The exit codes every command follows: one enum, documented as one table
//! in docs/operating/cli.md (a test keeps the two alike).

use std::fmt::Display;
use std::process::ExitCode;

use sheaf_driver::ClientError;

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

    /// When a command exits with it: the table's text, word for word.
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Done => "done",
            Exit::Failed => {
                "the call failed: a shard could not serve it or refused it (other than for bad input), \
                 a move failed (`rebalance`, `rebalance-resume`, `shard drain`), a scheduled start \
                 failed (`schedules trigger`), `status` found a shard unreachable, misidentified or \
                 behind the fleet's schema, a server could not listen"
            }
            Exit::BadInput => {
                "bad input: an argument the command line or a shard refuses (a usage error, a value \
                 out of range, a filter, cursor or spec a shard rejects), a file that cannot be read, \
                 a shard not in the topology, or no valid topology in the environment"
            }
            Exit::Partial => {
                "a partial answer: a shard did not answer, or did not take a change; stderr names \
                 each (it wins over 5: what a silent shard holds is unknown)"
            }
            Exit::NotFound => {
                "not found: no such execution, task, schedule or queue where its id routes \
                 (`find`: on any shard)"
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
            ClientError::UnknownExecution { .. }
            | ClientError::UnknownTask { .. }
            | ClientError::UnknownSchedule { .. }
            | ClientError::UnknownQueue { .. } => Exit::NotFound,
            ClientError::MissingRole { .. } => Exit::NoRole,
            _ => Exit::Failed,
        }
    }

    /// 0 when `ok`, else `otherwise`.
    pub fn unless(ok: bool, otherwise: Exit) -> Exit {
        if ok { Exit::Done } else { otherwise }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

/// Says why on stderr; exits 2.
pub fn bad_input(why: impl Display) -> Exit {
    eprintln!("sheaf: {why}");
    Exit::BadInput
}

/// Says what failed on stderr; exits with the code [`Exit::of`] gives it.
pub fn failed(e: &ClientError) -> Exit {
    eprintln!("sheaf: {e}");
    Exit::of(e)
}

/// clap's own errors (a usage error: exit 2) and its help and version
/// output (exit 0), printed where clap prints them.
pub fn clap(e: &clap::Error) -> Exit {
    let _ = e.print();
    if e.use_stderr() {
        Exit::BadInput
    } else {
        Exit::Done
    }
}

/// Exit 3 (saying so on stderr, naming each shard) when the answer is
/// partial, else 0.
pub fn partial_if(failures: &crate::output::Failures, partial: bool) -> Exit {
    if !partial {
        return Exit::Done;
    }
    eprintln!(
        "sheaf: partial answer: {} shard(s) did not answer",
        failures.len()
    );
    for (shard, e) in failures {
        eprintln!("  shard {shard}: {e}");
    }
    Exit::Partial
}
