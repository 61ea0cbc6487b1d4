//! Dead letters: putting them back in line.

use pgrx::prelude::*;

use crate::base::args::{no_nulls, required};
use crate::base::errors::bad_argument;
use crate::queue::dead_letters;
use crate::workflow::hooks::EXECUTIONS;

/// Puts dead letters back in line with fresh attempts; returns how many moved.
/// Ids that are not dead letters are ignored, and so are (they stay dead
/// letters) one whose idempotency key an unfinished task holds again, and
/// one whose execution is not running or suspended.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn redrive(task_ids: Option<Vec<Option<pgrx::Uuid>>>) -> i32 {
    let ids = required(task_ids, "task_ids");
    if ids.len() > 10_000 {
        bad_argument(
            "task_ids",
            format!("must hold at most 10000 ids, got {}", ids.len()),
        );
    }
    dead_letters::redrive(no_nulls(ids, "task_ids"), &EXECUTIONS)
}
