//! Queues: created implicitly by the first enqueue; `configure` sets their
//! ordering mode and notifications. Each backend keeps what it read.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use pgrx::prelude::*;
use sheaf_core::excerpt::quoted;
use sheaf_core::options::{QueueOptions, check_queue_name};
use sheaf_core::ordering::Mode;

use crate::base::args::required;
use crate::base::errors::{bad_argument, internal, not_ready};
use crate::base::plans::{Stmt, exec, run};
use crate::base::rows;
use crate::queue::ready;

/// A queue's configuration.
#[derive(Debug, Clone, Copy)]
pub struct Queue {
    pub mode: Mode,
    pub notify: bool,
}

const LOAD: Stmt = Stmt::read(
    "SELECT aging_secs, fairness, notify, xmin FROM queues WHERE name = $1",
    &[PgBuiltInOids::TEXTOID],
);
const UPDATE: Stmt = Stmt::write(
    "UPDATE queues SET aging_secs = $2, fairness = $3, notify = $4 WHERE name = $1",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::BOOLOID,
        PgBuiltInOids::BOOLOID,
    ],
);
const NAMES: Stmt = Stmt::read("SELECT name FROM queues ORDER BY name", &[]);
const CREATE: Stmt = Stmt::write(
    "INSERT INTO queues (name) VALUES ($1) ON CONFLICT (name) DO NOTHING",
    &[PgBuiltInOids::TEXTOID],
);

/// Names kept per backend; past this the cache starts over.
const CACHE_ENTRIES: usize = 10_000;

thread_local! {
    // Every enqueue needs its queue's configuration, which changes only
    // through configure_queue: a backend keeps what it read. configure_queue
    // sends a relcache invalidation for the queues table, which every backend
    // processes at its next transaction start (or lock); the callback below
    // marks the cache stale, and the next lookup empties it. Also marked when
    // the table itself goes (DROP EXTENSION invalidates its oid).
    static CACHE: RefCell<HashMap<String, Queue>> = RefCell::new(HashMap::new());
    /// The queues table the entries were read from.
    static TABLE: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
    static STALE: Cell<bool> = const { Cell::new(false) };
    static REGISTERED: Cell<bool> = const { Cell::new(false) };
}

unsafe extern "C-unwind" fn invalidated(_: pg_sys::Datum, relid: pg_sys::Oid) {
    // Runs inside invalidation processing: no catalog access, no errors, and
    // only Cells, which cannot fail to borrow.
    if relid == pg_sys::InvalidOid || relid == TABLE.get() {
        STALE.set(true);
    }
}

/// The queues table's oid (the active search path starts with sheaf's schema).
fn queues_table() -> pg_sys::Oid {
    // SAFETY: a catalog lookup by name, in a transaction.
    unsafe { pg_sys::RelnameGetRelid(c"queues".as_ptr()) }
}

/// Forgets every cached configuration in every backend once this transaction
/// commits, and in this one now.
pub fn invalidate() {
    // SAFETY: registers an invalidation message for a relation that exists.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(queues_table()) };
    STALE.set(true);
}

/// Validates a queue-name argument.
pub fn check_name(queue: Option<&str>) -> &str {
    let queue = required(queue, "queue");
    if let Err(why) = check_queue_name(queue) {
        bad_argument("queue", why);
    }
    queue
}

/// The queue's configuration as stored, and whether this transaction wrote
/// the row (then it may yet roll back, and is not cached).
fn stored(name: &str) -> Option<(Queue, bool)> {
    Spi::connect_mut(|client| {
        let (aging, fairness, notify, xmin): (Option<i32>, bool, bool, pg_sys::TransactionId) =
            rows::first(run(client, &LOAD, &[name.into()]), "reading a queue")?;
        let mode = match (aging, fairness) {
            (Some(secs), _) => Mode::Aging { secs: secs as u32 },
            (None, true) => Mode::Fairness,
            (None, false) => Mode::Priority,
        };
        // SAFETY: a plain lookup in this backend's transaction state.
        let ours = unsafe { pg_sys::TransactionIdIsCurrentTransactionId(xmin) };
        Some((Queue { mode, notify }, ours))
    })
}

/// The queue, created with defaults if this is its first use.
pub fn load_or_create(name: &str) -> Queue {
    // Registered before the first read, so no invalidation can arrive
    // between a read and the callback that would have noticed it.
    if !REGISTERED.replace(true) {
        // SAFETY: a callback with no captured state, registered once per
        // backend (Postgres keeps a small fixed list of them).
        unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(invalidated), pg_sys::Datum::from(0)) };
    }
    if STALE.replace(false) {
        CACHE.with(|c| c.borrow_mut().clear());
    }
    if let Some(q) = CACHE.with(|c| c.borrow().get(name).copied()) {
        return q;
    }
    // Only a miss looks the table up: dropping it invalidates its oid, which
    // marks the cache stale, so a hit never needs to.
    let table = queues_table();
    if TABLE.get() != table {
        CACHE.with(|c| c.borrow_mut().clear());
        TABLE.set(table);
    }
    let (q, ours) = match stored(name) {
        Some(found) => found,
        None => {
            exec(&CREATE, &[name.into()]);
            // Inserted just above (or by a concurrent enqueue, which the
            // insert waited for): the row is there.
            stored(name)
                .unwrap_or_else(|| internal(format_args!("creating queue {name:?}: no row after the insert")))
        }
    };
    if !ours {
        CACHE.with(|c| {
            let mut c = c.borrow_mut();
            if c.len() >= CACHE_ENTRIES {
                c.clear();
            }
            c.insert(name.to_owned(), q);
        });
    }
    q
}

/// Sets a queue's options: `{"aging_secs": 60}` or `{"aging_secs": null}`,
/// `{"fairness": true|false}`, `{"notify": true|false}`. Only the options given
/// change. One ordering mode per queue: aging and fairness together are refused.
/// Switching between priority and aging re-keys the queue's ready tasks in this
/// transaction; switching fairness on or off while the queue has ready tasks
/// is refused (55000), because their fairness tags were never assigned.
/// Returns the resulting configuration.
pub fn configure(name: &str, parsed: &QueueOptions) -> serde_json::Value {
    let current = load_or_create(name);
    let (mut aging, mut fairness) = match current.mode {
        Mode::Aging { secs } => (Some(secs as i32), false),
        Mode::Fairness => (None, true),
        Mode::Priority => (None, false),
    };
    if let Some(a) = parsed.aging_secs {
        aging = a;
    }
    if let Some(f) = parsed.fairness {
        fairness = f;
    }
    if aging.is_some() && fairness {
        bad_argument(
            "opts",
            format!(
                "queue {} would have both aging and fairness: one ordering mode per queue (turn one off in the same call)",
                quoted(name)
            ),
        );
    }
    let notify = parsed.notify.unwrap_or(current.notify);
    let was_fair = current.mode == Mode::Fairness;
    if was_fair != fairness && ready::any(name) {
        not_ready(format!(
            "queue {} has ready tasks: fairness can only be switched on or off while it has none",
            quoted(name)
        ));
    }
    exec(
        &UPDATE,
        &[name.into(), aging.into(), fairness.into(), notify.into()],
    );
    invalidate();
    ready::rekey(name, aging);
    serde_json::json!({
        "queue": name,
        "aging_secs": aging,
        "fairness": fairness,
        "notify": notify,
    })
}

/// Every queue's name.
pub fn names() -> Vec<String> {
    Spi::connect_mut(|client| rows::values(run(client, &NAMES, &[]), "listing queues"))
}
