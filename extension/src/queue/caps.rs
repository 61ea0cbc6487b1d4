//! Per-key concurrency caps, enforced by admission into the ready set.
//!
//! For a capped key, `admitted` (its ready plus running tasks) never grows
//! past `max_running`: enqueue and promotion admit only into free slots, the
//! rest wait in the key's waiting line, and every slot release (complete,
//! fail, dead letter, lowered cap) promotes the next waiting task. The claim
//! moves a task from ready to running, which leaves `admitted` unchanged, so
//! the claim never touches a key and claimers never serialize on one.
//!
//! Writers of a key's `admitted` serialize on its row lock. A shared advisory
//! lock per key, taken by every admission and release, lets
//! `set_concurrency_limit` (which takes it exclusively) count a key's tasks
//! while no admission or release of that key is in flight.

use pgrx::prelude::*;

use std::collections::BTreeMap;

use sheaf_core::state::TaskState;

use crate::base::locks::{self, Class};
use crate::base::plans::{Stmt, exec, run};
use crate::base::rows;
use crate::queue::{ready, tasks};

const LIMIT_FOR_UPDATE: Stmt = Stmt::write(
    "SELECT max_running, admitted FROM concurrency_limits WHERE key = $1 FOR NO KEY UPDATE",
    &[PgBuiltInOids::TEXTOID],
);
const ADD_ADMITTED: Stmt = Stmt::write(
    "UPDATE concurrency_limits SET admitted = greatest(admitted + $2, 0) WHERE key = $1 \
     RETURNING max_running, admitted",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::INT4OID],
);
const NEXT_WAITING: Stmt = Stmt::write(
    "SELECT id FROM tasks WHERE concurrency_key = $1 AND state = 'waiting' \
     ORDER BY priority DESC, seq LIMIT $2 FOR UPDATE SKIP LOCKED",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::INT8OID],
);

fn lock(key: &str, exclusive: bool) {
    if exclusive {
        locks::exclusive(Class::ConcurrencyKey, key);
    } else {
        locks::shared(Class::ConcurrencyKey, key);
    }
}

/// `(max_running, admitted)` of a capped key, row-locked; `None` if uncapped.
fn limit_for_update(key: &str) -> Option<(i32, i32)> {
    Spi::connect_mut(|client| {
        rows::first(
            run(client, &LIMIT_FOR_UPDATE, &[key.into()]),
            "reading a concurrency limit",
        )
    })
}

fn add_admitted(key: &str, delta: i32) -> Option<(i32, i32)> {
    Spi::connect_mut(|client| {
        rows::first(
            run(client, &ADD_ADMITTED, &[key.into(), delta.into()]),
            "updating a concurrency limit",
        )
    })
}

/// Admits up to `n` tasks of `key` into free slots; returns how many may
/// become ready now. The rest must wait. Uncapped keys admit everything.
pub fn admit(key: &str, n: i32) -> i32 {
    lock(key, false);
    match limit_for_update(key) {
        None => n,
        Some((max, admitted)) => {
            let k = n.min((max - admitted).max(0));
            if k > 0 {
                add_admitted(key, k);
            }
            k
        }
    }
}

/// Frees `n` slots of `key` and fills free slots from its waiting line.
pub fn release(key: &str, n: i32) {
    lock(key, false);
    if let Some((max, admitted)) = add_admitted(key, -n) {
        promote_waiting(key, max - admitted);
    }
}

/// Whether a running task of `key` going back to ready would exceed the cap
/// (it was lowered while the task ran). If so, its slot is given up here and
/// the caller must make the task wait.
pub fn give_up_slot_if_over_cap(key: &str) -> bool {
    lock(key, false);
    match limit_for_update(key) {
        Some((max, admitted)) if admitted > max => {
            add_admitted(key, -1);
            true
        }
        _ => false,
    }
}

/// Moves up to `room` waiting tasks of `key` into the ready set.
fn promote_waiting(key: &str, room: i32) {
    if room <= 0 {
        return;
    }
    let ids: Vec<pgrx::Uuid> = Spi::connect_mut(|client| {
        rows::values(
            run(client, &NEXT_WAITING, &[key.into(), (room as i64).into()]),
            "reading waiting tasks",
        )
    });
    if ids.is_empty() {
        return;
    }
    add_admitted(key, ids.len() as i32);
    tasks::set_ready(&ids);
    ready::insert(&ids);
}

// A key's ready rows, locked as a claim locks them (ready row first).
const LOCK_READY: Stmt = Stmt::write(
    "SELECT r.task_id FROM tasks t JOIN ready r ON r.task_id = t.id \
     WHERE t.concurrency_key = $1 AND t.state = 'ready' FOR UPDATE OF r",
    &[PgBuiltInOids::TEXTOID],
);
const REMOVE: Stmt = Stmt::write(
    "DELETE FROM concurrency_limits WHERE key = $1",
    &[PgBuiltInOids::TEXTOID],
);
const CHANGE: Stmt = Stmt::write(
    "UPDATE concurrency_limits SET max_running = $2 WHERE key = $1",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::INT4OID],
);
const HELD: Stmt = Stmt::write(
    "SELECT count(*)::int FROM tasks WHERE concurrency_key = $1 AND state IN ('ready', 'running')",
    &[PgBuiltInOids::TEXTOID],
);
const ADD: Stmt = Stmt::write(
    "INSERT INTO concurrency_limits (key, max_running, admitted) VALUES ($1, $2, $3)",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::INT4OID,
    ],
);
const DEMOTE: Stmt = Stmt::write(
    "WITH d AS (\
       SELECT t.id FROM tasks t JOIN ready r ON r.task_id = t.id \
       WHERE t.concurrency_key = $1 AND t.state = 'ready' \
       ORDER BY r.k1 DESC, r.k2 DESC, r.seq DESC LIMIT $2 FOR UPDATE OF r), \
     gone AS (DELETE FROM ready r USING d WHERE r.task_id = d.id RETURNING r.task_id), \
     w AS (UPDATE tasks t SET state = 'waiting' FROM gone WHERE t.id = gone.task_id RETURNING 1) \
     SELECT count(*)::int FROM w",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::INT8OID],
);
const CURRENT_LIMIT: Stmt = Stmt::read(
    "SELECT max_running FROM concurrency_limits WHERE key = $1",
    &[PgBuiltInOids::TEXTOID],
);

/// Makes `key`'s cap `max` unless it already is (a workflow's derived key,
/// capped by its policy's limit): the common case is one index read.
pub fn ensure_limit(key: &str, max: i32) {
    let current = Spi::connect_mut(|client| {
        rows::value::<i32>(
            run(client, &CURRENT_LIMIT, &[key.into()]),
            "reading a concurrency limit",
        )
    });
    if current != Some(max) {
        set_limit(key, Some(max));
    }
}

/// Sets or removes (`None`) a validated key's cap. Lowering a cap never lets
/// running exceed it: ready tasks beyond the new cap go back to waiting;
/// running tasks finish. Raising or removing it promotes waiting tasks
/// (removing promotes all of them, in this transaction).
pub fn set_limit(key: &str, max_running: Option<i32>) {
    // Ready rows before the key (`base::locks`): a cap may come down and
    // send ready tasks back to waiting, and a terminal transition holds its
    // tasks' ready rows while it waits to release this key.
    if max_running.is_some() {
        Spi::connect_mut(|client| {
            run(client, &LOCK_READY, &[key.into()]);
        });
    }
    // No admission or release of this key runs while we count and re-cap.
    lock(key, true);
    let current = limit_for_update(key);
    match (max_running, current) {
        (None, None) => {}
        (None, Some(_)) => {
            exec(&REMOVE, &[key.into()]);
            let ids: Vec<pgrx::Uuid> = Spi::connect_mut(|client| {
                rows::values(
                    run(client, &NEXT_WAITING, &[key.into(), i64::MAX.into()]),
                    "reading waiting tasks",
                )
            });
            tasks::set_ready(&ids);
            ready::insert(&ids);
        }
        (Some(max), current) => {
            let admitted = match current {
                Some((_, admitted)) => {
                    exec(&CHANGE, &[key.into(), max.into()]);
                    admitted
                }
                None => {
                    let held: i32 = Spi::connect_mut(|client| {
                        rows::only_value(run(client, &HELD, &[key.into()]), "counting a key's tasks")
                    });
                    exec(&ADD, &[key.into(), max.into(), held.into()]);
                    held
                }
            };
            if admitted < max {
                promote_waiting(key, max - admitted);
            } else if admitted > max {
                demote_ready(key, admitted - max);
            }
        }
    }
}

/// Sends up to `excess` of a key's ready tasks back to waiting, the ones that
/// would be claimed last first, and frees their slots. Locks their ready rows
/// first, as a claim does, and waits for a claim in flight: skipping it would
/// let that claim commit after the lowered cap and run over it. A task a
/// claim took meanwhile is running (it was claimed before the cap changed)
/// and is left alone. No task row is locked before its ready row, so this
/// cannot deadlock with a claim.
///
/// Out of the lock order (`base::locks`): this waits for ready rows while
/// holding the key. `set_limit` locked the key's ready rows before the key,
/// so the only rows it can wait for here became ready in between; if a
/// terminal transition of their execution holds them and waits for this
/// key, PostgreSQL aborts one of the two (40P01, retry).
fn demote_ready(key: &str, excess: i32) {
    let demoted: i32 = Spi::connect_mut(|client| {
        rows::only_value(
            run(client, &DEMOTE, &[key.into(), (excess as i64).into()]),
            "demoting ready tasks",
        )
    });
    if demoted > 0 {
        add_admitted(key, -demoted);
    }
}

/// Frees the slots of tasks that held one (ready or running), given as
/// `(state, key)`; keys in ascending order (the lock order, `base::locks`).
pub fn release_held(tasks: Vec<(TaskState, Option<String>)>) {
    let mut per_key: BTreeMap<String, i32> = BTreeMap::new();
    for (state, key) in tasks {
        if let Some(key) = key
            && state.holds_slot()
        {
            *per_key.entry(key).or_default() += 1;
        }
    }
    for (key, n) in per_key {
        release(&key, n);
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{claim, complete, count, enqueue, init, ns};
    use pgrx::prelude::*;
    use serde_json::json;

    fn stats(key: &str) -> (Option<i32>, i64, i64, i64) {
        Spi::connect(|client| {
            let row = client
                .select(
                    "SELECT max_running, running, ready, waiting FROM sheaf.concurrency_stats() \
                     WHERE concurrency_key = $1",
                    None,
                    &[key.into()],
                )
                .expect("stats")
                .first();
            (
                row.get::<i32>(1).unwrap(),
                row.get::<i64>(2).unwrap().unwrap_or(0),
                row.get::<i64>(3).unwrap().unwrap_or(0),
                row.get::<i64>(4).unwrap().unwrap_or(0),
            )
        })
    }

    fn cap(key: &str, max: Option<i32>) {
        Spi::run_with_args(
            "SELECT sheaf.set_concurrency_limit($1, $2)",
            &[key.into(), max.into()],
        )
        .expect("cap");
    }

    #[pg_test]
    fn a_cap_admits_only_into_free_slots_and_promotes_on_release() {
        init();
        cap("k", Some(2));
        for n in 0..5 {
            enqueue("q", json!({"n": n}), json!({"concurrency_key": "k"}));
        }
        assert_eq!(stats("k"), (Some(2), 0, 2, 3));
        let first = claim("q", 10);
        assert_eq!(ns(&first), vec![0, 1], "only admitted tasks are claimable");
        assert_eq!(stats("k"), (Some(2), 2, 0, 3));
        complete(&first[0]);
        assert_eq!(stats("k"), (Some(2), 1, 1, 2));
        assert_eq!(ns(&claim("q", 10)), vec![2]);
    }

    #[pg_test]
    fn a_saturated_key_does_not_block_other_work() {
        init();
        cap("hot", Some(1));
        for n in 0..100 {
            enqueue(
                "q",
                json!({"n": n}),
                json!({"concurrency_key": "hot", "priority": 9}),
            );
        }
        enqueue("q", json!({"n": 1000}), json!({}));
        assert_eq!(ns(&claim("q", 10)), vec![0, 1000]);
    }

    #[pg_test]
    fn lowering_a_cap_sends_ready_tasks_back_to_waiting() {
        init();
        cap("k", Some(3));
        for n in 0..5 {
            enqueue("q", json!({"n": n}), json!({"concurrency_key": "k"}));
        }
        let running = claim("q", 1);
        assert_eq!(stats("k"), (Some(3), 1, 2, 2));
        cap("k", Some(1));
        assert_eq!(stats("k"), (Some(1), 1, 0, 4));
        assert!(claim("q", 10).is_empty(), "running already fills the lowered cap");
        complete(&running[0]);
        assert_eq!(stats("k"), (Some(1), 0, 1, 3));
        assert_eq!(ns(&claim("q", 10)), vec![1]);
    }

    #[pg_test]
    fn a_new_cap_counts_the_tasks_already_admitted() {
        init();
        for n in 0..4 {
            enqueue("q", json!({"n": n}), json!({"concurrency_key": "k"}));
        }
        let running = claim("q", 2);
        cap("k", Some(2));
        assert_eq!(stats("k"), (Some(2), 2, 0, 2));
        assert_eq!(
            count("SELECT admitted::bigint FROM sheaf.concurrency_limits WHERE key = 'k'"),
            2
        );
        complete(&running[0]);
        assert_eq!(stats("k"), (Some(2), 1, 1, 1));
    }

    #[pg_test]
    fn removing_a_cap_promotes_every_waiting_task() {
        init();
        cap("k", Some(0));
        for n in 0..3 {
            enqueue("q", json!({"n": n}), json!({"concurrency_key": "k"}));
        }
        assert!(claim("q", 10).is_empty(), "a zero cap holds everything");
        cap("k", None);
        assert_eq!(ns(&claim("q", 10)), vec![0, 1, 2]);
        assert_eq!(count("SELECT count(*) FROM sheaf.concurrency_limits"), 0);
    }

    #[pg_test]
    fn raising_a_cap_promotes_waiting_tasks_in_priority_order() {
        init();
        cap("k", Some(0));
        enqueue("q", json!({"n": 0}), json!({"concurrency_key": "k"}));
        enqueue(
            "q",
            json!({"n": 1}),
            json!({"concurrency_key": "k", "priority": 5}),
        );
        enqueue("q", json!({"n": 2}), json!({"concurrency_key": "k"}));
        cap("k", Some(2));
        assert_eq!(ns(&claim("q", 10)), vec![1, 0]);
    }

    #[pg_test(error = "invalid max_running: must be >= 0 (or NULL to remove the cap), got -1")]
    fn a_negative_cap_is_refused() {
        init();
        cap("k", Some(-1));
    }
}
