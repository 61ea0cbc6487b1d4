//! Advisory lock classes, and the one lock order every path of the extension
//! follows.
//!
//! # Lock order
//!
//! A transaction that takes several of these takes them in this order, and
//! never waits for an earlier one while holding a later one:
//!
//! 1. the start lock of (workflow name, workflow id), then the gate lock of
//!    (workflow name, concurrency key) — a start, and a child started in
//!    its parent's transaction, which takes them before the parent's row
//!    (`workflow::start::lock_ahead`);
//! 2. task rows: a task's `ready` row before its `tasks` row (the claim's
//!    order), several tasks in id order (`ORDER BY id FOR UPDATE`), and
//!    every task of an execution before that execution's row;
//! 3. execution rows (appending history updates the row, so it locks it);
//! 4. quota counter rows (`quota_usage`);
//! 5. concurrency keys: the key's advisory lock, then its
//!    `concurrency_limits` row, several keys in ascending key order. Under a
//!    key, the only task rows touched are waiting tasks locked with
//!    `SKIP LOCKED` (promotion) and new `ready` rows, so nothing waits there;
//! 6. mutex keys: the key's advisory lock, then its rows, several keys in
//!    ascending key order;
//! 7. queue rows (`queues`, locked `SKIP LOCKED` to advance the virtual
//!    time) and `fairness_keys` rows.
//!
//! The floor locks of a queue (`queue::floor`) are outside the order: the
//! floor lock is only ever tried, never waited for, and the late readiers'
//! lock is waited for only while an advance tests it, which takes it and
//! lets it go with nothing in between, so neither can close a cycle.
//!
//! New rows (an execution, a task, an event) are inserted at any point: no
//! one else can hold them yet.
//!
//! Why tasks come before their execution: every queue path (complete, fail,
//! release, reap, dead letter) starts from a task row it locks by id, and
//! learns the execution from it; the workflow paths (close, pause, resume)
//! know the execution and lock its tasks before its row to match.
//!
//! Where a path must take a lock out of this order, the code says so beside
//! it: `workflow::gates` (latest wins holds the gate lock while it closes
//! executions), `workflow::hooks` (a dead-lettered workflow task holds its
//! own row, and a reap every row it reaped, before locking its siblings),
//! `queue::caps::demote_ready` (a lowered cap waits for ready rows while
//! holding its key), `queue::tasks::has_unclaimed_of_execution` (a wake
//! tries its execution's workflow task, `SKIP LOCKED`, after the execution
//! row), and `workflow::external` (an inline cancel ends its target, tasks
//! then row, while holding the sender's row). docs/reference/sql/mutex.md, "Deadlocks", says what a caller sees.

use pgrx::fcinfo::{direct_function_call, direct_function_call_as_datum};
use pgrx::prelude::*;

use crate::base::plans::Stmt;

/// The namespace (first key) of a transaction-scoped advisory lock.
#[derive(Debug, Clone, Copy)]
pub enum Class {
    /// (workflow name, workflow id): active uniqueness of a start ("WF").
    Start = 0x5746,
    /// (workflow name, concurrency key): the start gate ("GT").
    Gate = 0x4754,
    /// A concurrency key: shared by admissions and releases, exclusive while
    /// its cap changes ("SH").
    ConcurrencyKey = 0x5348,
    /// A mutex key ("MX").
    Mutex = 0x4D58,
    /// A queue's claim floor: shared while a transaction readies tasks of
    /// the queue, exclusive while a claim advances its floor ("FL"). Only
    /// ever tried.
    Floor = 0x464C,
    /// A queue's late readiers: held shared by a readying transaction that
    /// could not have the floor lock (an advance held it), so that no later
    /// advance runs before it ends; an advance only tests it, taking it and
    /// letting it go at once, so a wait for it is momentary ("FM").
    FloorLate = 0x464D,
    /// (workflow name, debounce key): a debounced start's pending record,
    /// taken before the start lock ("DB").
    Debounce = 0x4442,
}

const LOCK: Stmt = Stmt::write(
    "SELECT pg_advisory_xact_lock($1, hashtext($2))",
    &[PgBuiltInOids::INT4OID, PgBuiltInOids::TEXTOID],
);
const LOCK_SHARED: Stmt = Stmt::write(
    "SELECT pg_advisory_xact_lock_shared($1, hashtext($2))",
    &[PgBuiltInOids::INT4OID, PgBuiltInOids::TEXTOID],
);
const LOCK_PAIR: Stmt = Stmt::write(
    "SELECT pg_advisory_xact_lock($1, hashtext($2 || E'\\x1f' || $3))",
    &[
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
    ],
);

/// Takes the exclusive transaction lock of `key` in `class`.
pub fn exclusive(class: Class, key: &str) {
    LOCK.exec(&[(class as i32).into(), key.into()]);
}

/// Takes the shared transaction lock of `key` in `class`.
pub fn shared(class: Class, key: &str) {
    LOCK_SHARED.exec(&[(class as i32).into(), key.into()]);
}

/// Tries the exclusive transaction lock of `key` in `class`, without
/// waiting; whether it was taken. A direct call, not a statement: the
/// enqueue path tries a lock on every call.
pub fn try_exclusive(class: Class, key: &str) -> bool {
    try_lock(pg_sys::pg_try_advisory_xact_lock_int4, class, key)
}

/// Tries the shared transaction lock of `key` in `class`, without waiting;
/// whether it was taken.
pub fn try_shared(class: Class, key: &str) -> bool {
    try_lock(pg_sys::pg_try_advisory_xact_lock_shared_int4, class, key)
}

/// Takes the shared transaction lock of `key` in `class`, waiting: the key
/// of the tried locks (a direct call too), for a class whose exclusive
/// holders only ever hold it for a moment (`free`).
pub fn shared_of_tried(class: Class, key: &str) {
    let (class, folded) = tried_key(class, key);
    // SAFETY: a builtin taking two int4 arguments and returning void,
    // called in a transaction.
    unsafe {
        direct_function_call_as_datum(
            pg_sys::pg_advisory_xact_lock_shared_int4,
            &[class.into_datum(), folded.into_datum()],
        )
    };
}

/// Whether no one holds the tried lock of `key` in `class`: takes it
/// exclusively at session level, without waiting, and lets it go at once.
pub fn free(class: Class, key: &str) -> bool {
    let (class, folded) = tried_key(class, key);
    let args = [class.into_datum(), folded.into_datum()];
    // SAFETY: builtins taking two int4 arguments and returning a bool,
    // called in a transaction; the unlock releases the lock just taken.
    unsafe {
        let taken = direct_function_call::<bool>(pg_sys::pg_try_advisory_lock_int4, &args).unwrap_or(false);
        if taken {
            direct_function_call::<bool>(pg_sys::pg_advisory_unlock_int4, &args);
        }
        taken
    }
}

/// The tried locks' key: (class, a hash of `key`), the two-int4 form the
/// statements above use too (with `hashtext` there: a tried lock is never
/// taken by a statement, so the hashes need not agree).
fn try_lock(f: unsafe fn(pg_sys::FunctionCallInfo) -> pg_sys::Datum, class: Class, key: &str) -> bool {
    let (class, folded) = tried_key(class, key);
    // SAFETY: a builtin taking two int4 arguments and returning a bool,
    // called in a transaction.
    unsafe { direct_function_call::<bool>(f, &[class.into_datum(), folded.into_datum()]) }.unwrap_or(false)
}

fn tried_key(class: Class, key: &str) -> (i32, i32) {
    let h = sheaf_core::hrw::key_hash(key.as_bytes());
    (class as i32, ((h >> 32) ^ h) as u32 as i32)
}

/// Takes the exclusive transaction lock of the pair (`a`, `b`) in `class`
/// (joined by a unit separator).
pub fn exclusive_pair(class: Class, a: &str, b: &str) {
    LOCK_PAIR.exec(&[(class as i32).into(), a.into(), b.into()]);
}
