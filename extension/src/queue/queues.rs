//! Queues: created implicitly by the first enqueue; `configure` sets their
//! ordering mode and notifications. Each backend keeps what it read.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use pgrx::prelude::*;
use sheaf_core::excerpt::quoted;
use sheaf_core::options::{QueueOptions, check_queue_name};
use sheaf_core::ordering::Mode;
use sheaf_core::state::TaskState;

use crate::base::args::required;
use crate::base::catalog::{self, Feature};
use crate::base::errors::{bad_argument, internal, not_found, not_ready};
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::queue::hooks::ExecutionHooks;
use crate::queue::{caps, dead_letters, ready};

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

row! {
    /// A queue's row as `LOAD` reads it.
    struct Loaded {
        aging_secs: Option<i32>,
        fairness: bool,
        notify: bool,
        xmin: pg_sys::TransactionId,
    }
}

/// The queue's configuration as stored, and whether this transaction wrote
/// the row (then it may yet roll back, and is not cached).
fn stored(name: &str) -> Option<(Queue, bool)> {
    {
        let Loaded {
            aging_secs,
            fairness,
            notify,
            xmin,
        } = LOAD.first(&[name.into()], "reading a queue")?;
        let mode = match (aging_secs, fairness) {
            (Some(secs), _) => Mode::Aging { secs: secs as u32 },
            (None, true) => Mode::Fairness,
            (None, false) => Mode::Priority,
        };
        // SAFETY: a plain lookup in this backend's transaction state.
        let ours = unsafe { pg_sys::TransactionIdIsCurrentTransactionId(xmin) };
        Some((Queue { mode, notify }, ours))
    }
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
            CREATE.exec(&[name.into()]);
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
    UPDATE.exec(&[name.into(), aging.into(), fairness.into(), notify.into()]);
    invalidate();
    ready::rekey(name, aging);
    serde_json::json!({
        "queue": name,
        "aging_secs": aging,
        "fairness": fairness,
        "notify": notify,
    })
}

// What a drop would take: the queue's tasks, those of executions, its dead
// letters. `tasks` has no index by queue alone: a drop reads the table
// (an operator's rare call, never on a worker's path).
const CONTENTS: Stmt = Stmt::read(
    "SELECT EXISTS (SELECT 1 FROM queues WHERE name = $1), \
            (SELECT count(*) FROM tasks WHERE queue = $1), \
            (SELECT count(*) FROM tasks WHERE queue = $1 AND execution_id IS NOT NULL), \
            (SELECT count(*) FROM dead_letters WHERE queue = $1)",
    &[PgBuiltInOids::TEXTOID],
);
// Ready rows before task rows, tasks in id order (`base::locks`).
const UNREADY_ALL: Stmt = Stmt::write("DELETE FROM ready WHERE queue = $1", &[PgBuiltInOids::TEXTOID]);
const DELETE_TASKS: Stmt = Stmt::write(
    "WITH mine AS (SELECT id FROM tasks WHERE queue = $1 ORDER BY id FOR UPDATE) \
     DELETE FROM tasks t USING mine WHERE t.id = mine.id \
     RETURNING t.state, t.concurrency_key, t.execution_id IS NOT NULL",
    &[PgBuiltInOids::TEXTOID],
);
const DELETE_QUEUE: Stmt = Stmt::write(
    "WITH f AS (DELETE FROM fairness_keys WHERE queue = $1) DELETE FROM queues WHERE name = $1",
    &[PgBuiltInOids::TEXTOID],
);

/// Drops queue `name`: its row, its fairness keys and, with `force`, its
/// unfinished tasks (their slots pass on) and dead letters (their
/// executions' quota counters follow, through `hooks`); returns how many
/// tasks and dead letters went. Without `force` a queue with either is
/// refused (55000), and with it a queue holding tasks of executions
/// (cancel those executions first). A task enqueued while the drop runs
/// survives it, and its queue's row comes back at the queue's next enqueue.
pub fn drop(name: &str, force: bool, hooks: &dyn ExecutionHooks) -> i64 {
    row! {
        /// Whether the queue's row exists, its tasks, those of executions,
        /// and its dead letters.
        struct Contents {
            exists: bool,
            tasks: i64,
            of_executions: i64,
            dead: i64,
        }
    }
    row! {
        /// A deleted task.
        struct DeletedTask {
            state: TaskState,
            key: Option<String>,
            of_execution: bool,
        }
    }
    let Contents {
        exists,
        tasks,
        of_executions,
        dead,
    } = CONTENTS.one(&[name.into()], "reading a queue");
    if !exists && tasks == 0 && dead == 0 {
        not_found(format!("no queue {} on this shard", quoted(name)));
    }
    if of_executions > 0 {
        not_ready(format!(
            "queue {} holds {of_executions} task(s) of executions: cancel those executions first",
            quoted(name)
        ));
    }
    if !force && (tasks > 0 || dead > 0) {
        not_ready(format!(
            "queue {} holds {tasks} unfinished task(s) and {dead} dead letter(s): drop it with force to delete them",
            quoted(name)
        ));
    }
    UNREADY_ALL.exec(&[name.into()]);
    let gone: Vec<DeletedTask> = DELETE_TASKS.all(&[name.into()], "deleting a queue's tasks");
    if gone.iter().any(|g| g.of_execution) {
        not_ready(format!(
            "queue {} took a task of an execution meanwhile: nothing was dropped",
            quoted(name)
        ));
    }
    let n = gone.len() as i64;
    caps::release_held(gone.into_iter().map(|g| (g.state, g.key)).collect());
    let purged = dead_letters::purge(name, None, hooks);
    DELETE_QUEUE.exec(&[name.into()]);
    invalidate();
    n + purged
}

// Retention's idle-queue sweep (`expire_idle`): a batch of queue rows after
// `$1` by name, each with whether it is of the default configuration and
// whether it has work now, by index (ready rows, scheduled and running
// tasks, dead letters); waiting and paused tasks are looked for only before
// a drop (`STILL_IDLE`).
const IDLE_BATCH: Stmt = Stmt::read(
    "SELECT q.name, q.idle_since IS NOT NULL AND q.idle_since < now() - make_interval(secs => $3), \
            q.aging_secs IS NULL AND NOT q.fairness AND q.notify, \
            EXISTS (SELECT 1 FROM ready r WHERE r.queue = q.name) \
            OR EXISTS (SELECT 1 FROM tasks t WHERE t.state = 'scheduled' AND t.queue = q.name) \
            OR EXISTS (SELECT 1 FROM tasks t WHERE t.state = 'running' AND t.queue = q.name) \
            OR EXISTS (SELECT 1 FROM dead_letters d WHERE d.queue = q.name) \
     FROM queues q WHERE q.name > $1 ORDER BY q.name LIMIT $2",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::FLOAT8OID,
    ],
);
const MARK_IDLE: Stmt = Stmt::write(
    "UPDATE queues SET idle_since = now() WHERE name = ANY($1) AND idle_since IS NULL",
    &[PgBuiltInOids::TEXTARRAYOID],
);
const MARK_BUSY: Stmt = Stmt::write(
    "UPDATE queues SET idle_since = NULL WHERE name = ANY($1) AND idle_since IS NOT NULL",
    &[PgBuiltInOids::TEXTARRAYOID],
);
// Before a drop: no waiting task (its index has no queue: this walks the
// waiting lines of every key, so it runs for one queue a pass at most), no
// paused one (through the paused executions), and still nothing else.
const STILL_IDLE: Stmt = Stmt::read(
    "SELECT NOT EXISTS (SELECT 1 FROM tasks t WHERE t.state = 'waiting' AND t.queue = $1 \
                        ORDER BY t.concurrency_key, t.priority DESC, t.seq LIMIT 1) \
        AND NOT EXISTS (SELECT 1 FROM executions e JOIN tasks t ON t.execution_id = e.id \
                        WHERE e.state = 'PAUSED' AND t.state = 'paused' AND t.queue = $1) \
        AND NOT EXISTS (SELECT 1 FROM ready r WHERE r.queue = $1) \
        AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.state IN ('scheduled', 'running') AND t.queue = $1) \
        AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.queue = $1)",
    &[PgBuiltInOids::TEXTOID],
);
const DROP_IDLE: Stmt = Stmt::write(
    "DELETE FROM queues WHERE name = $1 AND idle_since IS NOT NULL \
       AND aging_secs IS NULL AND NOT fairness AND notify",
    &[PgBuiltInOids::TEXTOID],
);

/// Queue rows the idle sweep looks at per call.
const IDLE_BATCH_ROWS: i64 = 100;

thread_local! {
    /// Where this backend's idle sweep goes on from (by queue name).
    static IDLE_CURSOR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Retention of idle queues, one bounded step: looks at the next 100 queue
/// rows (round robin by name), marks those with nothing in them idle and
/// those with work busy, and drops at most one of the default
/// configuration seen idle for longer than `older_secs` once a last look
/// finds no task of it in any state; returns how many it dropped. A
/// configured queue is never dropped (its configuration would be lost).
pub fn expire_idle(older_secs: f64) -> i64 {
    row! {
        /// A queue of `IDLE_BATCH`.
        struct IdleRow {
            name: String,
            /// Idle for longer than `older_secs`.
            idle_long: bool,
            /// Of the default configuration.
            default_config: bool,
            /// Has work now.
            busy: bool,
        }
    }
    if !idle_enabled() {
        return 0;
    }
    let after = IDLE_CURSOR.with(|c| c.borrow().clone());
    let batch: Vec<IdleRow> = IDLE_BATCH.all(
        &[after.as_str().into(), IDLE_BATCH_ROWS.into(), older_secs.into()],
        "sweeping idle queues",
    );
    let next = if (batch.len() as i64) < IDLE_BATCH_ROWS {
        String::new()
    } else {
        batch.last().map(|b| b.name.clone()).unwrap_or_default()
    };
    IDLE_CURSOR.with(|c| *c.borrow_mut() = next);
    let (busy, idle): (Vec<_>, Vec<_>) = batch.iter().partition(|b| b.busy);
    let names = |v: &[&IdleRow]| v.iter().map(|b| b.name.clone()).collect::<Vec<String>>();
    MARK_BUSY.exec(&[names(&busy).into()]);
    MARK_IDLE.exec(&[names(&idle).into()]);
    let Some(IdleRow { name, .. }) = idle.iter().find(|b| b.idle_long && b.default_config) else {
        return 0;
    };
    let still: bool = STILL_IDLE.one_value(&[name.as_str().into()], "checking an idle queue");
    if !still {
        MARK_BUSY.exec(&[vec![name.clone()].into()]);
        return 0;
    }
    let dropped = DROP_IDLE.count(&[name.as_str().into()]) as i64;
    if dropped > 0 {
        invalidate();
    }
    dropped
}

/// Whether this catalog keeps `queues.idle_since` (not a 0.1.0 catalog):
/// the column came with the `retention` table, whose presence answers.
fn idle_enabled() -> bool {
    catalog::has(Feature::Retention)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{claim, count, enqueue, init, ns, start, values};

    /// `maintain()` a few times (each looks at the next 100 queue rows);
    /// how many idle queues it dropped.
    fn sweep() -> i64 {
        (0..5)
            .map(|_| {
                Spi::get_one::<i64>("SELECT (sheaf.maintain()->>'idle_queues_dropped')::bigint")
                    .unwrap()
                    .unwrap()
            })
            .sum()
    }

    #[pg_test]
    fn only_a_plain_queue_idle_for_its_window_is_dropped() {
        init();
        Spi::run("SELECT sheaf.set_retention('{\"idle_queues\": \"1day\"}')").unwrap();
        enqueue("idle-plain", json!({}), json!({}));
        Spi::run("DELETE FROM sheaf.ready WHERE queue = 'idle-plain'").unwrap();
        Spi::run("DELETE FROM sheaf.tasks WHERE queue = 'idle-plain'").unwrap();
        enqueue("idle-aging", json!({}), json!({}));
        Spi::run("SELECT sheaf.configure_queue('idle-aging', '{\"aging_secs\": 60}')").unwrap();
        Spi::run("DELETE FROM sheaf.ready WHERE queue = 'idle-aging'").unwrap();
        Spi::run("DELETE FROM sheaf.tasks WHERE queue = 'idle-aging'").unwrap();
        Spi::run("SELECT sheaf.set_concurrency_limit('idle-k', 1)").unwrap();
        enqueue("idle-busy", json!({}), json!({"concurrency_key": "idle-k"}));
        enqueue("idle-waiting", json!({}), json!({"concurrency_key": "idle-k"}));
        // The holder of the key's slot is elsewhere: idle-waiting has only a waiting task.
        Spi::run("DELETE FROM sheaf.ready WHERE queue = 'idle-busy'").unwrap();
        Spi::run("UPDATE sheaf.tasks SET state = 'running', lease_expires_at = now() + interval '1 hour' WHERE queue = 'idle-busy'")
            .unwrap();
        assert_eq!(sweep(), 0, "first seen idle now");
        assert_eq!(
            count("SELECT count(*) FROM sheaf.queues WHERE idle_since IS NOT NULL"),
            3
        );
        Spi::run(
            "UPDATE sheaf.queues SET idle_since = now() - interval '2 days' WHERE idle_since IS NOT NULL",
        )
        .unwrap();
        assert_eq!(sweep(), 1);
        let left: Vec<String> = values(
            "SELECT name FROM sheaf.queues WHERE name LIKE 'idle-%' ORDER BY name",
            &[],
        );
        assert_eq!(
            left,
            ["idle-aging", "idle-busy", "idle-waiting"],
            "configured, busy and waiting ones stay"
        );
        assert_eq!(
            count(
                "SELECT count(*) FROM sheaf.queues WHERE name = 'idle-waiting' \
                 AND (idle_since IS NULL OR idle_since > now() - interval '1 day')"
            ),
            1,
            "its last look found the waiting task: its window starts again"
        );
    }
    use pgrx::prelude::*;
    use serde_json::json;

    fn fail_all(queue: &str) {
        Spi::run_with_args(
            "SELECT f.* FROM sheaf.claim($1, 'w', 100) c, LATERAL sheaf.fail(c.task_id, c.token, 'boom') f",
            &[queue.into()],
        )
        .unwrap();
    }

    #[pg_test]
    fn purge_and_redrive_a_queue_by_age() {
        init();
        for i in 0..4 {
            enqueue("pq", json!({"n": i}), json!({"max_attempts": 1}));
        }
        enqueue("other", json!({"n": 9}), json!({"max_attempts": 1}));
        fail_all("pq");
        fail_all("other");
        Spi::run(
            "UPDATE sheaf.dead_letters SET dead_at = now() - make_interval(hours => (payload->>'n')::int)",
        )
        .unwrap();
        let purged = Spi::get_one::<i64>("SELECT sheaf.purge_dead_letters('pq', '150 minutes')").unwrap();
        assert_eq!(purged, Some(1), "only n = 3 is older than 2.5 hours");
        let moved = Spi::get_one::<i32>("SELECT sheaf.redrive_queue('pq', '30 minutes', 1)").unwrap();
        assert_eq!(moved, Some(1), "one at a time, oldest first");
        assert_eq!(ns(&claim("pq", 5)), vec![2]);
        let moved = Spi::get_one::<i32>("SELECT sheaf.redrive_queue('pq')").unwrap();
        assert_eq!(moved, Some(2));
        assert_eq!(
            count("SELECT count(*) FROM sheaf.dead_letters"),
            1,
            "the other queue's"
        );
        assert_eq!(
            Spi::get_one::<i32>("SELECT sheaf.redrive_queue('pq')").unwrap(),
            Some(0)
        );
        assert_eq!(
            count(
                "SELECT count(*) FROM sheaf.audit_log WHERE action IN ('purge_dead_letters', 'redrive_queue')"
            ),
            4
        );
    }

    #[pg_test]
    fn purging_an_executions_dead_letters_gives_its_quota_back() {
        init();
        Spi::run(
            r#"SELECT sheaf.declare_workflow('qw', '{"quota": {"key": "input.tenant", "max_dead_letters": 5}}')"#,
        )
        .unwrap();
        let execution = start("qw", "a", json!({"tenant": "t1"})).id;
        Spi::run_with_args(
            "SELECT sheaf.enqueue('acts', '{}', jsonb_build_object('execution_id', $1::text, 'max_attempts', 1))",
            &[execution.into()],
        )
        .unwrap();
        fail_all("acts");
        let dead = || {
            Spi::get_one::<i64>("SELECT dead_letters FROM sheaf.quota_usage('t1')")
                .unwrap()
                .unwrap()
        };
        assert_eq!(dead(), 1);
        Spi::get_one::<i64>("SELECT sheaf.purge_dead_letters('acts', '0')").unwrap();
        assert_eq!(dead(), 0);
        let recount = Spi::get_one::<i64>("SELECT dead_letters FROM sheaf.quota_recompute('t1')")
            .unwrap()
            .unwrap();
        assert_eq!(recount, 0, "the counter agrees with a recount");
    }

    #[pg_test]
    fn a_queue_with_tasks_drops_only_with_force_and_never_with_an_executions_task() {
        init();
        Spi::run("SELECT sheaf.set_concurrency_limit('dk', 1)").unwrap();
        enqueue("dq", json!({"n": 1}), json!({"concurrency_key": "dk"}));
        enqueue("keep", json!({"n": 2}), json!({"concurrency_key": "dk"}));
        enqueue("dq", json!({"n": 3}), json!({"max_attempts": 1}));
        let refused = PgTryBuilder::new(|| {
            Spi::run("SELECT sheaf.drop_queue('dq')").unwrap();
            false
        })
        .catch_others(|_| true)
        .execute();
        assert!(refused, "it has tasks");
        assert_eq!(
            Spi::get_one::<i64>("SELECT sheaf.drop_queue('dq', true)").unwrap(),
            Some(2)
        );
        assert_eq!(count("SELECT count(*) FROM sheaf.queues WHERE name = 'dq'"), 0);
        assert_eq!(
            ns(&claim("keep", 5)),
            vec![2],
            "the key's slot passed to the other queue"
        );
        let execution = start("dw", "a", json!({})).id;
        Spi::run_with_args(
            "SELECT sheaf.enqueue('eq', '{}', jsonb_build_object('execution_id', $1::text))",
            &[execution.into()],
        )
        .unwrap();
        let refused = PgTryBuilder::new(|| {
            Spi::run("SELECT sheaf.drop_queue('eq', true)").unwrap();
            false
        })
        .catch_others(|_| true)
        .execute();
        assert!(refused, "an active execution's task");
    }
}
