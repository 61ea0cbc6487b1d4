//! Failing a claimed task: validate, record the attempt, say what comes next.

use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;

use crate::base::args::required;
use crate::base::errors::bad_argument;
use crate::queue::retry;
use crate::workflow::hooks::EXECUTIONS;

/// Records a failed attempt of a task claimed under `token`. Until its
/// attempts run out it is retried after `retry_in`, or by default after an
/// exponential backoff with jitter (1 s, 2 s, 4 s … capped at 1 h, ±25%);
/// then it moves to the dead letters. Returns when it will run again (NULL
/// once dead-lettered). A stale token raises 55P03 and changes nothing.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn fail(
    task_id: Option<pgrx::Uuid>,
    token: Option<i64>,
    error: Option<&str>,
    retry_in: default!(Option<Interval>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(retry_at, Option<TimestampWithTimeZone>),
        name!(dead_lettered, bool),
    ),
> {
    let task_id = required(task_id, "task_id");
    let token = required(token, "token");
    let error = retry::cut_error(required(error, "error"));
    let retry_secs = retry_in.map(|r| {
        let secs = r.as_micros() as f64 / 1e6;
        if !(0.0..=retry::MAX_RETRY_SECS).contains(&secs) {
            bad_argument(
                "retry_in",
                format!("must be from 0 to 365 days, got {secs} seconds"),
            );
        }
        secs
    });
    TableIterator::new(vec![retry::fail(task_id, token, &error, retry_secs, &EXECUTIONS)])
}
