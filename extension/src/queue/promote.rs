//! Moving tasks that are due into the ready set (or their key's waiting line).

use std::collections::BTreeMap;

use pgrx::prelude::*;

use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::queue::tasks::queues_with;
use crate::queue::{caps, ready, tasks};

// Due tasks in promotion order: `[all of them, those due since $3]` (epoch
// seconds; `claim::sweep` says when the window is enough).
const DUE: [Stmt; 2] = [
    Stmt::write(
        "SELECT id, concurrency_key FROM tasks \
         WHERE queue = $1 AND state = 'scheduled' AND run_at <= now() \
         ORDER BY run_at, priority DESC, seq LIMIT $2 FOR UPDATE SKIP LOCKED",
        &[
            PgBuiltInOids::TEXTOID,
            PgBuiltInOids::INT8OID,
            PgBuiltInOids::FLOAT8OID,
        ],
    ),
    Stmt::write(
        "SELECT id, concurrency_key FROM tasks \
         WHERE queue = $1 AND state = 'scheduled' AND run_at <= now() AND run_at >= to_timestamp($3) \
         ORDER BY run_at, priority DESC, seq LIMIT $2 FOR UPDATE SKIP LOCKED",
        &[
            PgBuiltInOids::TEXTOID,
            PgBuiltInOids::INT8OID,
            PgBuiltInOids::FLOAT8OID,
        ],
    ),
];
const SET_WAITING: Stmt = Stmt::write(
    "UPDATE tasks SET state = 'waiting' WHERE id = ANY($1)",
    &[PgBuiltInOids::UUIDARRAYOID],
);

const DUE_QUEUES: Stmt = Stmt::read(queues_with!("scheduled", "t.run_at <= now()"), &[]);

/// The queues with a scheduled task due now.
pub fn due_queues() -> Vec<String> {
    DUE_QUEUES.values(&[], "finding queues with due tasks")
}

row! {
    /// A due task, locked.
    struct Due {
        id: pgrx::Uuid,
        key: Option<String>,
    }
}

/// Promotes up to `max` due scheduled tasks of `queue`, of those due since
/// `since` (epoch seconds) if given; returns how many.
pub fn due(queue: &str, max: i64, since: Option<f64>) -> i64 {
    let rows: Vec<Due> =
        DUE[since.is_some() as usize].all(&[queue.into(), max.into(), since.into()], "reading due tasks");
    let n = rows.len() as i64;
    place(rows.into_iter().map(|r| (r.id, r.key)).collect());
    n
}

/// Admits tasks that are due: into the ready set where their key has a free
/// slot, into its waiting line where not. Takes `(id, concurrency key)` in
/// the order the tasks should be admitted.
pub fn place(tasks: Vec<(pgrx::Uuid, Option<String>)>) {
    if tasks.is_empty() {
        return;
    }
    let mut ready_ids = Vec::new();
    let mut waiting: Vec<(String, Vec<pgrx::Uuid>)> = Vec::new();
    // Keys in a fixed order, so two transactions never lock two keys'
    // rows in opposite orders.
    let mut by_key: BTreeMap<String, Vec<pgrx::Uuid>> = BTreeMap::new();
    for (id, key) in tasks {
        match key {
            None => ready_ids.push(id),
            Some(k) => by_key.entry(k).or_default().push(id),
        }
    }
    for (key, mut ids) in by_key {
        let admitted = caps::admit(&key, ids.len() as i32) as usize;
        let rest = ids.split_off(admitted);
        ready_ids.extend(ids);
        if !rest.is_empty() {
            waiting.push((key, rest));
        }
    }
    if !waiting.is_empty() {
        let all: Vec<pgrx::Uuid> = waiting.iter().flat_map(|w| w.1.iter().copied()).collect();
        SET_WAITING.exec(&[all.into()]);
        for (key, ids) in &waiting {
            caps::waited(key, ids);
        }
    }
    tasks::set_ready(&ready_ids);
    ready::insert(&ready_ids);
}
