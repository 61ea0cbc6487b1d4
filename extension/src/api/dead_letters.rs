//! Dead letters: putting them back in line.

use pgrx::prelude::*;

use crate::base::args::required;
use crate::base::audit;
use crate::base::errors::bad_argument;
use crate::base::list::List;
use crate::queue::dead_letters;
use crate::workflow::hooks::EXECUTIONS;

/// Puts dead letters back in line with fresh attempts; returns how many
/// moved. Ids that are not dead letters are skipped; a dead letter that
/// cannot go back (its idempotency key is taken, or its execution ended)
/// refuses the whole call with 55000.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn redrive(task_ids: Option<List<pgrx::Uuid>>) -> i32 {
    let ids = required(task_ids, "task_ids");
    if ids.len() > 10_000 {
        bad_argument(
            "task_ids",
            format!("must hold at most 10000 ids, got {}", ids.len()),
        );
    }
    let ids = ids.into_items("task_ids");
    let asked = ids.len();
    let moved = dead_letters::redrive(ids, &EXECUTIONS);
    audit::record(
        "redrive",
        &format!("{asked} task id(s)"),
        "ok",
        serde_json::json!({"asked": asked, "moved": moved}),
    );
    moved
}
