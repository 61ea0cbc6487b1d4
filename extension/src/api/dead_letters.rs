//! Dead letters: putting them back in line, and purging them.

use pgrx::prelude::*;

use pgrx::datum::Interval;

use crate::base::args::{self, required};
use crate::base::audit;
use crate::base::errors::bad_argument;
use crate::base::list::List;
use crate::queue::{dead_letters, queues};
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

/// The oldest age `older_than` may name: 100 years.
const MAX_AGE_SECS: f64 = 100.0 * 365.0 * 86_400.0;

/// Deletes the dead letters of `queue` dead for longer than `older_than`
/// (0 or more; `'0'` deletes all); returns how many. Their executions'
/// quota counters follow, so a tenant held back by `max_dead_letters` can
/// start again.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn purge_dead_letters(queue: Option<&str>, older_than: Option<Interval>) -> i64 {
    let queue = queues::check_name(queue);
    let older = args::delay_secs("older_than", required(older_than, "older_than"), MAX_AGE_SECS);
    let purged = dead_letters::purge(queue, Some(older), &EXECUTIONS);
    audit::record(
        "purge_dead_letters",
        queue,
        "ok",
        serde_json::json!({"older_than_secs": older, "purged": purged}),
    );
    purged
}

/// Redrives up to `max_rows` (1..100000) dead letters of `queue` dead for
/// longer than `older_than` (default: any age), oldest first, with fresh
/// attempts; returns how many moved. Those that cannot go back now (an
/// unfinished task holds their idempotency key, their execution ended) are
/// left where they are, so calling it until it returns 0 ends.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn redrive_queue(
    queue: Option<&str>,
    older_than: default!(Option<Interval>, "NULL"),
    max_rows: default!(Option<i32>, 1000),
) -> i32 {
    let queue = queues::check_name(queue);
    let older = older_than.map_or(0.0, |o| args::delay_secs("older_than", o, MAX_AGE_SECS));
    let max = args::max_rows(max_rows);
    let moved = dead_letters::redrive_queue(queue, older, max, &EXECUTIONS);
    audit::record(
        "redrive_queue",
        queue,
        "ok",
        serde_json::json!({"older_than_secs": older, "max_rows": max, "moved": moved}),
    );
    moved
}
