//! The claim: validate, claim, return the tasks.

use pgrx::prelude::*;

use crate::base::args::{self, required};
use crate::base::errors::bad_argument;
use crate::base::jsonb::Jsonb;
use crate::queue::{claim, queues};
use crate::workflow::hooks::EXECUTIONS;

/// Claims up to `batch` tasks of `queue` for `worker`, each under a lease of
/// `lease` fenced by the returned `token`. Order: priority descending (or the
/// aging key), then fairness start tag, then enqueue sequence. Also promotes
/// due scheduled tasks and reaps a bounded number of expired leases of this
/// queue, so SQL-only users need no scheduler.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn claim(
    queue: Option<&str>,
    worker: Option<&str>,
    batch: default!(Option<i32>, 1),
    lease: default!(Option<pgrx::datum::Interval>, "'30 seconds'"),
) -> TableIterator<
    'static,
    (
        name!(task_id, pgrx::Uuid),
        name!(token, i64),
        name!(payload, Jsonb),
        name!(attempt, i32),
        name!(execution_id, Option<pgrx::Uuid>),
        name!(concurrency_key, Option<String>),
        name!(kind, String),
    ),
> {
    let name = queues::check_name(queue);
    let worker = args::key(worker, "worker");
    let batch = required(batch, "batch");
    if !(1..=claim::MAX_BATCH).contains(&batch) {
        bad_argument("batch", format!("must be 1 to {}, got {batch}", claim::MAX_BATCH));
    }
    let lease_secs = args::lease_secs("lease", required(lease, "lease"));
    TableIterator::new(claim::claim(name, batch, worker, lease_secs, &EXECUTIONS))
}
