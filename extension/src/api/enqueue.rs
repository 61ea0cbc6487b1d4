//! Enqueueing: validate, insert, return the ids.

use pgrx::prelude::*;
use sheaf_core::options::{EnqueueOptions, MAX_CONCURRENCY_KEY_BYTES, MAX_KEY_BYTES, MAX_QUEUE_NAME_BYTES};
use sheaf_core::placement::{Admission, Pin, Projection};

use crate::base::args::{self, required};
use crate::base::errors::{bad_argument, internal, misplaced};
use crate::base::jsonb::Jsonb;
use crate::base::list::List;
use crate::base::names::{self, Kind};
use crate::base::topology;
use crate::queue::{enqueue, queues};
use crate::workflow::executions::INTAKE;

/// Enqueues one task and returns its id. `opts` (all optional): `priority`
/// (higher first), `run_at`, `concurrency_key`, `fairness_key`,
/// `fairness_weight`, `max_attempts` (default 25), `execution_id`, `kind`
/// (`activity` | `workflow`), `idempotency_key` (while a task with the key is
/// unfinished, enqueueing again returns its id and writes nothing).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn enqueue(queue: Option<&str>, payload: Option<Jsonb>, opts: default!(Option<Jsonb>, "'{}'")) -> pgrx::Uuid {
    let payload = required(payload, "payload").sized("payload");
    let ids = enqueue_many(queue, vec![payload], opts);
    // One payload, one id: `insert` answers with an id per payload.
    ids.into_iter()
        .next()
        .unwrap_or_else(|| internal("enqueueing: no id came back for the payload"))
}

/// Enqueues several payloads with the same `opts`, in order; returns their ids
/// in the same order. At most 10,000 payloads per call.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn enqueue_batch(
    queue: Option<&str>,
    payloads: Option<List<Jsonb>>,
    opts: default!(Option<Jsonb>, "'{}'"),
) -> SetOfIterator<'static, pgrx::Uuid> {
    let payloads = required(payloads, "payloads");
    if payloads.is_empty() || payloads.len() > enqueue::MAX_BATCH {
        bad_argument(
            "payloads",
            format!(
                "must hold 1 to {} payloads, got {}",
                enqueue::MAX_BATCH,
                payloads.len()
            ),
        );
    }
    let payloads = payloads
        .into_items("payloads")
        .into_iter()
        .enumerate()
        .map(|(i, p)| p.sized(&format!("payloads[{}]", i + 1)))
        .collect();
    SetOfIterator::new(enqueue_many(queue, payloads, opts))
}

/// The name rule (`args::new_name`) on what an enqueue stores: its queue
/// (a queue that exists keeps working) and its keys.
fn check_new_names(queue: &str, o: &EnqueueOptions) {
    args::new_name(queue, "queue", MAX_QUEUE_NAME_BYTES, || {
        names::stored(Kind::Queue, queue)
    });
    args::new_key(
        o.idempotency_key.as_deref(),
        "opts.idempotency_key",
        MAX_KEY_BYTES,
    );
    args::new_key(
        o.concurrency_key.as_deref(),
        "opts.concurrency_key",
        MAX_CONCURRENCY_KEY_BYTES,
    );
    args::new_key(o.fairness_key.as_deref(), "opts.fairness_key", MAX_KEY_BYTES);
    args::new_key(o.rate_key.as_deref(), "opts.rate_key", MAX_KEY_BYTES);
}

fn enqueue_many(queue: Option<&str>, payloads: Vec<Jsonb>, opts: Option<Jsonb>) -> Vec<pgrx::Uuid> {
    let name = queues::check_name(queue);
    let opts = required(opts, "opts").parse("opts");
    let o = match EnqueueOptions::parse(&opts) {
        Ok(o) => o,
        Err(e) => bad_argument(&e.option, e.why),
    };
    check_new_names(name, &o);
    // A task of an execution goes where its execution is: routed by id.
    if o.execution_id.is_none() {
        topology::check_declared();
        check_placement(name, &o);
    }
    enqueue::insert(name, payloads, &o, &INTAKE)
}

/// Refuses (23514) a task with an idempotency or rate key, or a placement,
/// that the topology published here places on another shard; one with none
/// of them goes anywhere, unchecked (and unread: the hot path).
fn check_placement(queue: &str, o: &EnqueueOptions) {
    let keyed = o.idempotency_key.is_some() || o.rate_key.is_some();
    if !keyed && o.placement == Pin::Auto {
        return;
    }
    let place = |p: &Projection| {
        p.place_task(
            queue,
            o.idempotency_key.as_deref(),
            o.rate_limit.as_deref(),
            o.rate_key.as_deref(),
            &o.placement,
        )
    };
    match topology::admit(place) {
        Admission::Here => {}
        Admission::Elsewhere(owner) => misplaced("this task", owner),
        Admission::Refused(e) => bad_argument("opts.placement", e),
    }
}
