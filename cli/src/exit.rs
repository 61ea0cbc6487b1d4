//! Exit codes and the output helpers every subcommand shares.
//!
//! 0: done. 1: the call failed. 2: bad arguments or topology. 3: a partial
//! answer (a shard did not answer; the output names it). 4: `find` found
//! nothing on any shard. 5: an audit found what it looks for (`orphans`,
//! `topology diff`, `config diff`; `shard drain`: executions stayed).
//! 6: `shard health` found a shard that is not ready. 7: the login lacks a
//! role the command needs (`relay` without `sheaf_relay`): a fix for the
//! operator, not a fault to retry.

use std::process::ExitCode;

use serde_json::Value;

use crate::executions::Failures;

pub const PARTIAL: u8 = 3;
pub const NOT_FOUND: u8 = 4;
pub const FOUND: u8 = 5;
pub const NOT_READY: u8 = 6;
pub const NO_ROLE: u8 = 7;

pub fn usage(why: String) -> ExitCode {
    eprintln!("sheaf: {why}");
    ExitCode::from(2)
}

pub fn failed(e: &sheaf_driver::ClientError) -> ExitCode {
    eprintln!("sheaf: {e}");
    ExitCode::FAILURE
}

pub fn print_json(value: &Value) {
    match serde_json::to_string_pretty(value) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("sheaf: cannot encode the answer: {e}"),
    }
}

/// Each failed shard's id and error text.
pub fn failures_json(failures: &Failures) -> Value {
    failures
        .iter()
        .map(|(shard, e)| (shard.to_string(), Value::String(e.to_string())))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Exit 3 (saying so on stderr, naming each shard) when the answer is
/// partial, else 0.
pub fn partial_if(failures: &Failures, partial: bool) -> ExitCode {
    if !partial {
        return ExitCode::SUCCESS;
    }
    eprintln!(
        "sheaf: partial answer: {} shard(s) did not answer",
        failures.len()
    );
    for (shard, e) in failures {
        eprintln!("  shard {shard}: {e}");
    }
    ExitCode::from(PARTIAL)
}
