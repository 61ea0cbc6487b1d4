//! The claim: validate, claim, return the tasks.

use pgrx::prelude::*;
use sheaf_core::options::MAX_KEY_BYTES;

use crate::base::args::{self, required};
use crate::base::errors::bad_argument;
use crate::base::jsonb::Jsonb;
use crate::base::list::List;
use crate::base::names::{self, Kind};
use crate::queue::complete as queue_complete;
use crate::queue::{claim, queues};

use super::complete;
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
    let (name, worker, batch, lease_secs) = claim_args(queue, worker, batch, lease);
    TableIterator::new(
        claim::claim(name, batch, worker, lease_secs, &EXECUTIONS)
            .into_iter()
            .map(|c| {
                (
                    c.id,
                    c.token,
                    c.payload,
                    c.attempt,
                    c.execution_id,
                    c.concurrency_key,
                    c.kind,
                )
            }),
    )
}

/// Completes the tasks of `task_ids` claimed under `tokens` (paired by
/// position, up to 10,000, none at all for a worker's first call), then
/// claims up to `batch` tasks of `queue` as `claim` does, in one call and
/// one transaction: a worker's steady state, one round trip and one commit
/// per batch. First a row per entry of `task_ids`, in input order, with
/// `completed` (false for a stale token: that task is left as it is and
/// the rest go on) and the other columns NULL; then a row per task claimed,
/// with `completed` NULL. A task's result is not recorded here: complete a
/// task of a workflow with `complete`.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn complete_and_claim(
    queue: Option<&str>,
    worker: Option<&str>,
    task_ids: Option<List<pgrx::Uuid>>,
    tokens: Option<List<i64>>,
    batch: default!(Option<i32>, 1),
    lease: default!(Option<pgrx::datum::Interval>, "'30 seconds'"),
) -> TableIterator<
    'static,
    (
        name!(task_id, pgrx::Uuid),
        name!(completed, Option<bool>),
        name!(token, Option<i64>),
        name!(payload, Option<Jsonb>),
        name!(attempt, Option<i32>),
        name!(execution_id, Option<pgrx::Uuid>),
        name!(concurrency_key, Option<String>),
        name!(kind, Option<String>),
    ),
> {
    let (name, worker, batch, lease_secs) = claim_args(queue, worker, batch, lease);
    let (ids, tokens) = complete::finished(task_ids, tokens, 0);
    let done = if ids.is_empty() {
        Vec::new()
    } else {
        queue_complete::complete_batch(ids, tokens, &EXECUTIONS)
    };
    let claimed = claim::claim(name, batch, worker, lease_secs, &EXECUTIONS);
    let rows = done
        .into_iter()
        .map(|(id, completed)| (id, Some(completed), None, None, None, None, None, None))
        .chain(claimed.into_iter().map(|c| {
            (
                c.id,
                None,
                Some(c.token),
                Some(c.payload),
                Some(c.attempt),
                c.execution_id,
                c.concurrency_key,
                Some(c.kind),
            )
        }))
        .collect::<Vec<_>>();
    TableIterator::new(rows)
}

/// Validates a claim's arguments: queue, worker, batch size, lease (s).
fn claim_args<'a>(
    queue: Option<&'a str>,
    worker: Option<&'a str>,
    batch: Option<i32>,
    lease: Option<pgrx::datum::Interval>,
) -> (&'a str, &'a str, i32, f64) {
    let name = queues::check_name(queue);
    let worker = args::key(worker, "worker");
    // The name rule (`args::new_name`): the worker's name goes on each task
    // it leases; one in the registry keeps working.
    args::new_name(worker, "worker", MAX_KEY_BYTES, || {
        names::stored(Kind::Worker, worker)
    });
    let batch = required(batch, "batch");
    if !(1..=claim::MAX_BATCH).contains(&batch) {
        bad_argument("batch", format!("must be 1 to {}, got {batch}", claim::MAX_BATCH));
    }
    let lease_secs = args::lease_secs("lease", required(lease, "lease"));
    (name, worker, batch, lease_secs)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::{claim, count, enqueue, init, rows};
    use pgrx::prelude::*;
    use serde_json::json;

    row! {
        /// A row of `complete_and_claim`: a finished task (`completed`
        /// set) or a claimed one (`token` set).
        struct Outcome {
            task_id: pgrx::Uuid,
            completed: Option<bool>,
            token: Option<i64>,
        }
    }

    /// `done`: the tasks to complete, by id and token.
    fn complete_and_claim(queue: &str, done: &[(pgrx::Uuid, i64)], batch: i32) -> Vec<Outcome> {
        let (ids, tokens): (Vec<pgrx::Uuid>, Vec<i64>) = done.iter().copied().unzip();
        rows(
            "SELECT task_id, completed, token FROM sheaf.complete_and_claim($1, 'w', $2, $3, $4)",
            &[queue.into(), ids.into(), tokens.into(), batch.into()],
        )
    }

    #[pg_test]
    fn the_first_call_only_claims() {
        init();
        let a = enqueue("q", json!({}), json!({}));
        let rows = complete_and_claim("q", &[], 5);
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].task_id, rows[0].completed), (a, None));
        assert!(rows[0].token.is_some(), "a claimed row carries its token");
    }

    /// Each finished task gets a row in input order, a stale one `false`
    /// (left running), and the claim goes on after them.
    #[pg_test]
    fn completions_come_first_and_a_stale_token_does_not_stop_the_claim() {
        init();
        let (a, b) = (
            enqueue("q", json!({}), json!({})),
            enqueue("q", json!({}), json!({})),
        );
        let first = claim("q", 2);
        let c = enqueue("q", json!({}), json!({}));
        let done = [(first[1].id, first[1].token), (first[0].id, first[0].token + 1)];
        let rows = complete_and_claim("q", &done, 5);
        assert_eq!(
            rows.iter().map(|r| (r.task_id, r.completed)).collect::<Vec<_>>(),
            vec![(b, Some(true)), (a, Some(false)), (c, None)]
        );
        assert_eq!(
            count("SELECT count(*) FROM sheaf.tasks WHERE state = 'running'"),
            2,
            "a and c"
        );
    }

    #[pg_test(error = "invalid tokens: must pair up with task_ids: 1 ids, 0 tokens")]
    fn unpaired_tokens_are_refused() {
        init();
        Spi::run("SELECT * FROM sheaf.complete_and_claim('q', 'w', ARRAY[gen_random_uuid()], '{}')").unwrap();
    }

    #[pg_test(error = "invalid batch: must be 1 to 1000, got 0")]
    fn a_zero_batch_is_refused() {
        init();
        Spi::run("SELECT * FROM sheaf.complete_and_claim('q', 'w', '{}', '{}', 0)").unwrap();
    }
}
