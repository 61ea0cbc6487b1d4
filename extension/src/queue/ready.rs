//! The ready set: the only place the claim looks. A task enters it once it is
//! due and its concurrency key has a free slot.

use std::collections::BTreeMap;

use pgrx::prelude::*;
use sheaf_core::ordering::fair_tags;

use crate::base::errors::internal;
use crate::base::plans::Stmt;
use crate::base::rows::{Split, row};
use crate::queue::floor;

// Returns the lowest new key of each band (`queue::floor`): [a catalog
// without claim floors, one with them, whose rows carry their aging band].
const INSERTS: [Stmt; 2] = [
    Stmt::write(
        "WITH r AS (\
           INSERT INTO ready (task_id, queue, k1, k2, seq) \
           SELECT t.id, t.queue, ready_k1(t.priority, t.enqueued_at, q.aging_secs), coalesce(t.fair_start, 0), t.seq \
           FROM tasks t JOIN queues q ON q.name = t.queue \
           WHERE t.id = ANY($1) AND t.state = 'ready' \
           RETURNING queue, k1, k2, seq) \
         SELECT DISTINCT ON (queue, k1) queue, k1 AS band, k1, k2, seq FROM r ORDER BY queue, k1, k2, seq",
        &[PgBuiltInOids::UUIDARRAYOID],
    ),
    Stmt::write(
        concat!(
            "WITH r AS (\
               INSERT INTO ready (task_id, queue, k1, k2, seq, aging_band) \
               SELECT t.id, t.queue, ready_k1(t.priority, t.enqueued_at, q.aging_secs), coalesce(t.fair_start, 0), \
                      t.seq, ready_aging_band(t.priority, q.aging_secs) \
               FROM tasks t JOIN queues q ON q.name = t.queue \
               WHERE t.id = ANY($1) AND t.state = 'ready' \
               RETURNING queue, k1, k2, seq, aging_band), \
             b AS (SELECT queue, ",
            floor::band!(),
            " AS band, k1, k2, seq FROM r) \
             SELECT DISTINCT ON (queue, band) queue, band, k1, k2, seq FROM b ORDER BY queue, band, k1, k2, seq"
        ),
        &[PgBuiltInOids::UUIDARRAYOID],
    ),
];
// Wakes listeners of queues that had no other ready task: only an idle
// queue has workers asleep on LISTEN; a busy one has workers coming back for
// more anyway. So under load nothing is sent, and NOTIFY, which serializes
// the commits of every notifying transaction, costs nothing. NOTIFY also
// folds equal (channel, payload) pairs within a transaction: one per queue.
// A LIMIT 1 subquery, not NOT EXISTS: the generic plan of an anti-join reads
// the whole ready set. From the tail of the queue's range: the head is where
// claims leave dead entries until the next vacuum.
const NOTIFY_IF_IDLE: Stmt = Stmt::write(
    "SELECT pg_notify('sheaf_ready', q.name) FROM queues q \
     WHERE q.name = ANY($1) AND q.notify \
       AND (SELECT r.task_id FROM ready r WHERE r.queue = q.name AND r.task_id <> ALL($2) \
                ORDER BY r.k1 DESC, r.k2 DESC, r.seq DESC LIMIT 1) IS NULL",
    &[PgBuiltInOids::TEXTARRAYOID, PgBuiltInOids::UUIDARRAYOID],
);
const VTIME: Stmt = Stmt::read(
    "SELECT vtime FROM queues WHERE name = $1",
    &[PgBuiltInOids::TEXTOID],
);
// Advances a key's finish tag by `$4` (the sum of 1/weight of its new tasks)
// from max(finish, vtime), returning the new finish tag.
const ADVANCE_KEY: Stmt = Stmt::write(
    "INSERT INTO fairness_keys AS f (queue, key, finish) VALUES ($1, $2, $3 + $4) \
     ON CONFLICT (queue, key) DO UPDATE SET finish = greatest(f.finish, $3) + $4 \
     RETURNING finish",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::FLOAT8OID,
    ],
);

const ANY: Stmt = Stmt::read(
    "SELECT EXISTS (SELECT 1 FROM ready WHERE queue = $1)",
    &[PgBuiltInOids::TEXTOID],
);
// The same expressions every insertion into `ready` uses. New keys are a
// readying: each band's lowest goes to `floor::readied`. [Without claim
// floors, with them.]
const REKEYS: [Stmt; 2] = [
    Stmt::write(
        "WITH r AS (UPDATE ready r SET k1 = ready_k1(t.priority, t.enqueued_at, $2) \
           FROM tasks t WHERE r.queue = $1 AND t.id = r.task_id RETURNING r.k1, r.k2, r.seq) \
         SELECT DISTINCT ON (k1) k1 AS band, k1, k2, seq FROM r ORDER BY k1, k2, seq",
        &[PgBuiltInOids::TEXTOID, PgBuiltInOids::INT4OID],
    ),
    Stmt::write(
        concat!(
            "WITH r AS (UPDATE ready r SET k1 = ready_k1(t.priority, t.enqueued_at, $2), \
                                      aging_band = ready_aging_band(t.priority, $2) \
               FROM tasks t WHERE r.queue = $1 AND t.id = r.task_id RETURNING r.k1, r.k2, r.seq, r.aging_band), \
             b AS (SELECT ",
            floor::band!(),
            " AS band, k1, k2, seq FROM r) \
             SELECT DISTINCT ON (band) band, k1, k2, seq FROM b ORDER BY band, k1, k2, seq"
        ),
        &[PgBuiltInOids::TEXTOID, PgBuiltInOids::INT4OID],
    ),
];
// A key whose finish tag is behind the virtual time behaves exactly like a
// key never seen, so its row can go.
const PRUNE_KEYS: Stmt = Stmt::write(
    "WITH d AS (DELETE FROM fairness_keys f WHERE (f.queue, f.key) IN (\
       SELECT f2.queue, f2.key FROM fairness_keys f2 JOIN queues q ON q.name = f2.queue \
       WHERE f2.finish <= q.vtime LIMIT $1) RETURNING 1) \
     SELECT count(*) FROM d",
    &[PgBuiltInOids::INT8OID],
);

/// Whether `queue` has a ready task.
pub fn any(queue: &str) -> bool {
    ANY.one_value(&[queue.into()], "checking for ready tasks")
}

row! {
    /// A band's lowest ready key: the band, and the key `(k1, k2, seq)`.
    struct Lowest {
        band: f64,
        k1: f64,
        k2: f64,
        seq: i64,
    }
}

row! {
    /// The queue a row of `INSERTS` is of, before its `Lowest`.
    struct QueueName {
        queue: String,
    }
}

/// Re-keys a queue's ready tasks for its new aging (`None`: priority order).
pub fn rekey(queue: &str, aging_secs: Option<i32>) {
    let lowest: Vec<Lowest> =
        REKEYS[floor::enabled() as usize].all(&[queue.into(), aging_secs.into()], "re-keying ready tasks");
    let lowest: Vec<floor::Lowest> = lowest
        .into_iter()
        .map(|l| floor::Lowest {
            queue: queue.to_owned(),
            band: l.band,
            key: (l.k1, l.k2, l.seq),
        })
        .collect();
    if !lowest.is_empty() {
        floor::readied(&lowest);
    }
}

/// Deletes up to `max` fairness keys that no longer matter; returns how many.
pub fn prune_fairness_keys(max: i64) -> i64 {
    PRUNE_KEYS.one_value(&[max.into()], "pruning fairness keys")
}

/// Inserts ready rows for tasks whose state is already `ready`, and wakes
/// the listeners of queues that were idle.
pub fn insert(ids: &[pgrx::Uuid]) {
    if ids.is_empty() {
        return;
    }
    let lowest: Vec<Split<QueueName, Lowest>> =
        INSERTS[floor::enabled() as usize].all(&[ids.to_vec().into()], "reading ready queues");
    if lowest.is_empty() {
        return;
    }
    let lowest: Vec<floor::Lowest> = lowest
        .into_iter()
        .map(|Split { head, tail: l }| floor::Lowest {
            queue: head.queue,
            band: l.band,
            key: (l.k1, l.k2, l.seq),
        })
        .collect();
    floor::readied(&lowest);
    let mut queues: Vec<String> = lowest.into_iter().map(|l| l.queue).collect();
    queues.dedup();
    NOTIFY_IF_IDLE.exec(&[queues.into(), ids.to_vec().into()])
}

/// Fairness start tags for tasks about to become ready in a fairness queue,
/// given in claim order as `(fairness key, weight)`. Keyless tasks start at
/// the queue's virtual time; a key's tasks follow one another by 1/weight.
pub fn fair_starts(queue: &str, tasks: &[(Option<String>, f64)]) -> Vec<f64> {
    {
        // The queue exists: the enqueue loaded (or created) it first.
        let vtime: f64 = VTIME.one_value(&[queue.into()], "reading vtime");
        let mut per_key: BTreeMap<&str, f64> = BTreeMap::new();
        for (key, weight) in tasks {
            if let Some(key) = key {
                *per_key.entry(key.as_str()).or_insert(0.0) += 1.0 / weight;
            }
        }
        // Each key's finish tag moves once, by the sum of its tasks' 1/weight;
        // the tasks take the starts in between, in order.
        let mut next_start: BTreeMap<&str, f64> = BTreeMap::new();
        for (key, total) in &per_key {
            let finish: f64 = ADVANCE_KEY.one_value(
                &[queue.into(), (*key).into(), vtime.into(), (*total).into()],
                "advancing a fairness key",
            );
            next_start.insert(key, finish - total);
        }
        tasks
            .iter()
            .map(|(key, weight)| match key {
                None => fair_tags(vtime, None, *weight).0,
                Some(key) => {
                    let Some(start) = next_start.get_mut(key.as_str()) else {
                        internal(format_args!(
                            "tagging tasks of fairness key {key:?}: the key was not advanced"
                        ))
                    };
                    let this = *start;
                    *start += 1.0 / weight;
                    this
                }
            })
            .collect()
    }
}
