//! Per-key concurrency caps, enforced by admission into the ready set.
//!
//! For a capped key, `admitted` (its ready plus running tasks) never grows
//! past `max_running`: enqueue and promotion admit only into free slots, the
//! rest wait in the key's waiting line, and every slot release (complete,
//! fail, dead letter, lowered cap) promotes the next waiting task. The claim
//! moves a task from ready to running, which leaves `admitted` unchanged, so
//! the claim never touches a key and claimers never serialize on one.
//!
//! A key's count lives in `concurrency_slots`, rotated (a new row per
//! change, `sql/schema.sql`), and its `concurrency_limits` row is written
//! only when the cap or the wait floor changes: a snapshot held open
//! elsewhere then keeps no version of it per admission or release.
//!
//! Writers of a key's count serialize on its limit row's lock. A shared advisory
//! lock per key, taken by every admission and release, lets
//! `set_concurrency_limit` (which takes it exclusively) count a key's tasks
//! while no admission or release of that key is in flight.
//!
//! Every write to a key's waiting line is made under that row lock, which is
//! what keeps its wait floor (the protocol is in `sql/schema.sql` beside
//! `concurrency_limits`) true: a path that puts tasks in the line calls
//! `waited`, and only a promotion moves the floor up.

use pgrx::prelude::*;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use sheaf_core::state::TaskState;

use crate::base::errors::internal;
use crate::base::locks::{self, Class};
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::queue::{floor, ready, tasks};

// Statements that name the wait floor's columns or `concurrency_slots`
// come in two forms, indexed by `floor::enabled()`: a 0.1.0 catalog (a
// 0.2.0 library before `ALTER EXTENSION sheaf UPDATE`) keeps a key's count
// in `concurrency_limits.admitted` and has no wait floor, and its lines are
// read from their heads.
const LIMIT_FOR_UPDATE: [Stmt; 2] = [
    Stmt::write(
        "SELECT max_running, admitted, NULL::integer, NULL::bigint FROM concurrency_limits \
         WHERE key = $1 FOR NO KEY UPDATE",
        &[PgBuiltInOids::TEXTOID],
    ),
    Stmt::write(
        "SELECT max_running, NULL::integer, wait_priority, wait_seq FROM concurrency_limits \
         WHERE key = $1 FOR NO KEY UPDATE",
        &[PgBuiltInOids::TEXTOID],
    ),
];
/// A key's live count, newest first; `[locked, unlocked]`. A transaction
/// that takes a snapshot per statement reads it after taking the key, so it
/// sees the last writer's row. One with an older snapshot locks the row it
/// sees: one another transaction replaced since is a serialization failure
/// (40001), as the update in place of a 0.1.0 catalog is.
const SLOTS: [Stmt; 2] = [
    Stmt::write(
        "SELECT gen, admitted FROM concurrency_slots WHERE key = $1 ORDER BY gen DESC LIMIT 1 FOR KEY SHARE",
        &[PgBuiltInOids::TEXTOID],
    ),
    Stmt::write(
        "SELECT gen, admitted FROM concurrency_slots WHERE key = $1 ORDER BY gen DESC LIMIT 1",
        &[PgBuiltInOids::TEXTOID],
    ),
];
/// Writes a key's count `$2`, replacing its row of generation `$3`.
const SET_SLOTS: [Stmt; 2] = [
    Stmt::write(
        "UPDATE concurrency_limits SET admitted = $2 WHERE key = $1",
        &[
            PgBuiltInOids::TEXTOID,
            PgBuiltInOids::INT4OID,
            PgBuiltInOids::INT8OID,
        ],
    ),
    Stmt::write(
        "WITH gone AS (DELETE FROM concurrency_slots WHERE key = $1 AND gen = $3) \
         INSERT INTO concurrency_slots (key, gen, admitted) VALUES ($1, nextval('concurrency_slot_gen'), $2)",
        &[
            PgBuiltInOids::TEXTOID,
            PgBuiltInOids::INT4OID,
            PgBuiltInOids::INT8OID,
        ],
    ),
];
const SET_WAIT_FLOOR: Stmt = Stmt::write(
    "UPDATE concurrency_limits SET wait_priority = $2, wait_seq = $3 WHERE key = $1",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::INT8OID,
    ],
);
// A key's waiting line in promotion order (priority descending, then
// enqueue sequence), from its head or from its wait floor ($3, $4): from
// the floor, two seeks on tasks_waiting, the floor's priority from its
// sequence, then the lower priorities, so the promoted tasks' dead entries
// a held snapshot keeps are stepped over, not walked.
macro_rules! line_from {
    (head) => {
        "FROM tasks WHERE concurrency_key = $1 AND state = 'waiting' ORDER BY priority DESC, seq"
    };
    (floor) => {
        "FROM tasks WHERE concurrency_key = $1 AND state = 'waiting' AND priority = $3 AND seq >= $4 \
         ORDER BY priority DESC, seq"
    };
    (below) => {
        "FROM tasks WHERE concurrency_key = $1 AND state = 'waiting' AND priority < $3 \
         ORDER BY priority DESC, seq"
    };
}
const LINE_ARGS: &[PgBuiltInOids] = &[
    PgBuiltInOids::TEXTOID,
    PgBuiltInOids::INT8OID,
    PgBuiltInOids::INT4OID,
    PgBuiltInOids::INT8OID,
];
/// The next `$2` waiting tasks to promote, locked, skipping those other
/// transactions hold; `[from the head, from the floor]`.
const NEXT_WAITING: [Stmt; 2] = [
    Stmt::write(
        concat!(
            "SELECT id, priority, seq ",
            line_from!(head),
            " LIMIT $2 FOR UPDATE SKIP LOCKED"
        ),
        LINE_ARGS,
    ),
    Stmt::write(
        concat!(
            "WITH a AS (SELECT id, priority, seq ",
            line_from!(floor),
            " LIMIT $2 FOR UPDATE SKIP LOCKED), \
             b AS (SELECT id, priority, seq ",
            line_from!(below),
            " LIMIT $2 - (SELECT count(*) FROM a) FOR UPDATE SKIP LOCKED) \
             SELECT * FROM a UNION ALL SELECT * FROM b"
        ),
        LINE_ARGS,
    ),
];
/// The first task still waiting, whether another transaction holds it or
/// not (a promotion skips it, and it stays in the line if that transaction
/// rolls back); `[from the head, from the floor]`.
const FIRST_WAITING: [Stmt; 2] = [
    Stmt::write(
        concat!("SELECT id, priority, seq ", line_from!(head), " LIMIT 1"),
        LINE_ARGS,
    ),
    Stmt::write(
        concat!(
            "SELECT * FROM ((SELECT id, priority, seq ",
            line_from!(floor),
            " LIMIT 1) UNION ALL (SELECT id, priority, seq ",
            line_from!(below),
            " LIMIT 1)) w LIMIT 1"
        ),
        LINE_ARGS,
    ),
];
// Lowers the wait floor to the first of tasks `$2` just put in the line, if
// they sort before it: (their highest priority, their lowest sequence) is at
// or before each of them.
const LOWER_WAIT_FLOOR: Stmt = Stmt::write(
    "UPDATE concurrency_limits c SET wait_priority = n.p, wait_seq = n.s \
     FROM (SELECT max(priority) AS p, min(seq) AS s FROM tasks WHERE id = ANY($2)) n \
     WHERE c.key = $1 AND c.wait_priority IS NOT NULL AND n.p IS NOT NULL \
       AND (n.p > c.wait_priority OR (n.p = c.wait_priority AND n.s < c.wait_seq))",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::UUIDARRAYOID],
);

/// Tasks a backend promotes from a key between two moves of its wait floor:
/// a move writes the key's row, whose versions every lookup of the key
/// walks while a snapshot is held (a saturated key's release writes nothing
/// else: its slot goes to the promoted task), and in between a promotion
/// steps over at most about this many dead entries per backend.
const WAIT_FLOOR_EVERY: u32 = 64;
/// Keys counted per backend; past this the counts start over.
const COUNTED_KEYS: usize = 10_000;

thread_local! {
    static SINCE_FLOOR_MOVE: RefCell<HashMap<String, u32>> = RefCell::new(HashMap::new());
}

/// Counts `n` promotions of `key` by this backend; whether its floor is due
/// to move.
fn floor_move_due(key: &str, n: u32) -> bool {
    SINCE_FLOOR_MOVE.with(|since| {
        let mut since = since.borrow_mut();
        if since.len() >= COUNTED_KEYS && !since.contains_key(key) {
            since.clear();
        }
        let count = since.entry(key.to_owned()).or_default();
        *count = count.saturating_add(n);
        if *count >= WAIT_FLOOR_EVERY {
            *count = 0;
            true
        } else {
            false
        }
    })
}

/// Where a key's waiting line starts: every task in it sorts at or after
/// `(priority, seq)` in promotion order; `None`, from its head.
type WaitFloor = Option<(i32, i64)>;

/// A capped key's row: its cap, its slots held (and the generation of the
/// row they were read from), its wait floor.
#[derive(Debug, Clone, Copy)]
struct Limit {
    max: i32,
    admitted: i32,
    generation: Option<i64>,
    floor: WaitFloor,
}

fn lock(key: &str, exclusive: bool) {
    if exclusive {
        locks::exclusive(Class::ConcurrencyKey, key);
    } else {
        locks::shared(Class::ConcurrencyKey, key);
    }
}

row! {
    /// A capped key's row as `LIMIT_FOR_UPDATE` reads it: its admitted
    /// count on a 0.1.0 catalog, its wait floor on a later one.
    struct LimitRow {
        max_running: i32,
        admitted: Option<i32>,
        wait_priority: Option<i32>,
        wait_seq: Option<i64>,
    }
}

row! {
    /// A key's newest slots row.
    struct Slots {
        generation: i64,
        admitted: i32,
    }
}

row! {
    /// A waiting task, in line order.
    struct Waiting {
        id: pgrx::Uuid,
        priority: i32,
        seq: i64,
    }
}

/// A capped key's row, locked, and its count; `None` if uncapped.
fn limit_for_update(key: &str) -> Option<Limit> {
    let enabled = floor::enabled();
    let LimitRow {
        max_running: max,
        admitted,
        wait_priority: p,
        wait_seq: s,
    } = LIMIT_FOR_UPDATE[enabled as usize].first(&[key.into()], "reading a concurrency limit")?;
    let (generation, admitted) = if enabled {
        let slots: Option<Slots> =
            SLOTS[floor::read_committed() as usize].first(&[key.into()], "reading a key's slots held");
        (
            slots.as_ref().map(|s| s.generation),
            slots.map_or(0, |s| s.admitted),
        )
    } else {
        (None, admitted.unwrap_or(0))
    };
    Some(Limit {
        max,
        admitted,
        generation,
        floor: p.zip(s),
    })
}

/// Writes a key's slots held (never below 0), replacing the count `l` was
/// read with.
fn set_slots(key: &str, l: &Limit, admitted: i32) {
    SET_SLOTS[floor::enabled() as usize].exec(&[key.into(), admitted.max(0).into(), l.generation.into()]);
}

/// Writes a key's wait floor if it changed (a 0.1.0 catalog has none).
fn set_wait_floor(key: &str, l: &Limit, floor: WaitFloor) {
    if floor != l.floor && floor::enabled() {
        SET_WAIT_FLOOR.exec(&[key.into(), floor.map(|f| f.0).into(), floor.map(|f| f.1).into()]);
    }
}

/// Admits up to `n` tasks of `key` into free slots; returns how many may
/// become ready now. The rest must wait, and the caller says so with
/// `waited` once they are in the line. Uncapped keys admit everything.
pub fn admit(key: &str, n: i32) -> i32 {
    lock(key, false);
    match limit_for_update(key) {
        None => n,
        Some(l) => {
            let k = n.min((l.max - l.admitted).max(0));
            if k > 0 {
                set_slots(key, &l, l.admitted + k);
            }
            k
        }
    }
}

/// Tasks `ids` of `key` were just put in its waiting line (by a caller
/// holding the key since `admit` or `give_up_slot_if_over_cap`): lowers the
/// wait floor to them if they sort before it.
pub fn waited(key: &str, ids: &[pgrx::Uuid]) {
    if !ids.is_empty() && floor::enabled() {
        LOWER_WAIT_FLOOR.exec(&[key.into(), ids.to_vec().into()]);
    }
}

/// Frees `n` slots of `key` and fills free slots from its waiting line.
pub fn release(key: &str, n: i32) {
    lock(key, false);
    if let Some(l) = limit_for_update(key) {
        let admitted = (l.admitted - n).max(0);
        let (promoted, floor) = promote_waiting(key, l.floor, l.max - admitted);
        if admitted + promoted != l.admitted {
            set_slots(key, &l, admitted + promoted);
        }
        set_wait_floor(key, &l, floor);
    }
}

/// Whether a running task of `key` going back to ready would exceed the cap
/// (it was lowered while the task ran). If so, its slot is given up here and
/// the caller must make the task wait (and call `waited`).
pub fn give_up_slot_if_over_cap(key: &str) -> bool {
    lock(key, false);
    match limit_for_update(key) {
        Some(l) if l.admitted > l.max => {
            set_slots(key, &l, l.admitted - 1);
            true
        }
        _ => false,
    }
}

/// Moves up to `room` waiting tasks of `key` into the ready set, from its
/// wait floor; returns how many, and the floor to keep. The floor moves up
/// to the first task still waiting (or to the last one promoted) when it
/// reads the line from its head, or every `WAIT_FLOOR_EVERY` promotions;
/// and only in a transaction that takes a snapshot per statement: it then
/// sees every task put in the line before it took the key, where an older
/// snapshot could miss one and leave it behind the floor.
fn promote_waiting(key: &str, floor: WaitFloor, room: i32) -> (i32, WaitFloor) {
    if room <= 0 {
        return (0, floor);
    }
    let args = |from: WaitFloor, n: i64| {
        [
            key.into(),
            n.into(),
            from.map(|f| f.0).into(),
            from.map(|f| f.1).into(),
        ]
    };
    let promoted: Vec<Waiting> =
        NEXT_WAITING[floor.is_some() as usize].all(&args(floor, room as i64), "reading waiting tasks");
    let ids: Vec<pgrx::Uuid> = promoted.iter().map(|p| p.id).collect();
    if !ids.is_empty() {
        tasks::set_ready(&ids);
        ready::insert(&ids);
    }
    let Some(last) = promoted.last().map(|p| (p.priority, p.seq)) else {
        return (0, floor);
    };
    let due = floor_move_due(key, ids.len() as u32) || floor.is_none();
    if !due || !floor::enabled() || !floor::read_committed() {
        return (ids.len() as i32, floor);
    }
    // From the old floor again: a task the promotion skipped (another
    // transaction holds it) may come before the ones it took.
    let still: Option<Waiting> =
        FIRST_WAITING[floor.is_some() as usize].first(&args(floor, 1), "reading the waiting line");
    (
        ids.len() as i32,
        Some(still.map_or(last, |s| (s.priority, s.seq))),
    )
}

// A key's ready rows, locked as a claim locks them (ready row first).
const LOCK_READY: Stmt = Stmt::write(
    "SELECT r.task_id FROM tasks t JOIN ready r ON r.task_id = t.id \
     WHERE t.concurrency_key = $1 AND t.state = 'ready' FOR UPDATE OF r",
    &[PgBuiltInOids::TEXTOID],
);
const REMOVE: [Stmt; 2] = [
    Stmt::write(
        "DELETE FROM concurrency_limits WHERE key = $1",
        &[PgBuiltInOids::TEXTOID],
    ),
    Stmt::write(
        "WITH s AS (DELETE FROM concurrency_slots WHERE key = $1) DELETE FROM concurrency_limits WHERE key = $1",
        &[PgBuiltInOids::TEXTOID],
    ),
];
const CHANGE: Stmt = Stmt::write(
    "UPDATE concurrency_limits SET max_running = $2 WHERE key = $1",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::INT4OID],
);
const HELD: Stmt = Stmt::write(
    "SELECT count(*)::int FROM tasks WHERE concurrency_key = $1 AND state IN ('ready', 'running')",
    &[PgBuiltInOids::TEXTOID],
);
const ADD_ARGS: &[PgBuiltInOids] = &[
    PgBuiltInOids::TEXTOID,
    PgBuiltInOids::INT4OID,
    PgBuiltInOids::INT4OID,
];
const ADD: [Stmt; 2] = [
    Stmt::write(
        "INSERT INTO concurrency_limits (key, max_running, admitted) VALUES ($1, $2, $3)",
        ADD_ARGS,
    ),
    Stmt::write(
        "WITH l AS (INSERT INTO concurrency_limits (key, max_running) VALUES ($1, $2)) \
         INSERT INTO concurrency_slots (key, gen, admitted) VALUES ($1, nextval('concurrency_slot_gen'), $3)",
        ADD_ARGS,
    ),
];
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
    let current = CURRENT_LIMIT.value::<i32>(&[key.into()], "reading a concurrency limit");
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
        LOCK_READY.exec(&[key.into()]);
    }
    // No admission or release of this key runs while we count and re-cap.
    lock(key, true);
    let current = limit_for_update(key);
    match (max_running, current) {
        (None, None) => {}
        (None, Some(_)) => {
            REMOVE[floor::enabled() as usize].exec(&[key.into()]);
            let ids: Vec<pgrx::Uuid> = NEXT_WAITING[0].values(
                &[
                    key.into(),
                    i64::MAX.into(),
                    None::<i32>.into(),
                    None::<i64>.into(),
                ],
                "reading waiting tasks",
            );
            tasks::set_ready(&ids);
            ready::insert(&ids);
        }
        (Some(max), current) => {
            if current.is_some() {
                CHANGE.exec(&[key.into(), max.into()]);
            } else {
                let held: i32 = HELD.one_value(&[key.into()], "counting a key's tasks");
                ADD[floor::enabled() as usize].exec(&[key.into(), max.into(), held.into()]);
            }
            // Read again: the count's row is new after ADD.
            let Some(l) = limit_for_update(key) else {
                internal("reading a concurrency limit just written");
            };
            if l.admitted < max {
                let (promoted, floor) = promote_waiting(key, l.floor, max - l.admitted);
                if promoted > 0 {
                    set_slots(key, &l, l.admitted + promoted);
                }
                set_wait_floor(key, &l, floor);
            } else if l.admitted > max {
                let demoted = demote_ready(key, l.admitted - max);
                if demoted > 0 {
                    set_slots(key, &l, l.admitted - demoted);
                    // They go back at their old places, maybe before the
                    // floor: the line is read from its head again.
                    set_wait_floor(key, &l, None);
                }
            }
        }
    }
}

/// Sends up to `excess` of a key's ready tasks back to waiting, the ones that
/// would be claimed last first; returns how many (the caller frees their
/// slots). Locks their ready rows
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
fn demote_ready(key: &str, excess: i32) -> i32 {
    DEMOTE.one_value(&[key.into(), (excess as i64).into()], "demoting ready tasks")
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
    use crate::base::rows::row;
    use crate::testing::{claim, complete, count, enqueue, init, ns, one, rows};
    use pgrx::prelude::*;
    use serde_json::json;

    row! {
        #[derive(Debug, PartialEq)]
        struct Stats {
            max_running: Option<i32>,
            running: i64,
            ready: i64,
            waiting: i64,
        }
    }

    fn stats(key: &str) -> Stats {
        one(
            "SELECT max_running, running, ready, waiting FROM sheaf.concurrency_stats() \
             WHERE concurrency_key = $1",
            &[key.into()],
        )
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
        assert_eq!(
            stats("k"),
            Stats {
                max_running: Some(2),
                running: 0,
                ready: 2,
                waiting: 3
            }
        );
        let first = claim("q", 10);
        assert_eq!(ns(&first), vec![0, 1], "only admitted tasks are claimable");
        assert_eq!(
            stats("k"),
            Stats {
                max_running: Some(2),
                running: 2,
                ready: 0,
                waiting: 3
            }
        );
        complete(&first[0]);
        assert_eq!(
            stats("k"),
            Stats {
                max_running: Some(2),
                running: 1,
                ready: 1,
                waiting: 2
            }
        );
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
        assert_eq!(
            stats("k"),
            Stats {
                max_running: Some(3),
                running: 1,
                ready: 2,
                waiting: 2
            }
        );
        cap("k", Some(1));
        assert_eq!(
            stats("k"),
            Stats {
                max_running: Some(1),
                running: 1,
                ready: 0,
                waiting: 4
            }
        );
        assert!(claim("q", 10).is_empty(), "running already fills the lowered cap");
        complete(&running[0]);
        assert_eq!(
            stats("k"),
            Stats {
                max_running: Some(1),
                running: 0,
                ready: 1,
                waiting: 3
            }
        );
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
        assert_eq!(
            stats("k"),
            Stats {
                max_running: Some(2),
                running: 2,
                ready: 0,
                waiting: 2
            }
        );
        assert_eq!(
            count("SELECT admitted::bigint FROM sheaf.concurrency_slots WHERE key = 'k'"),
            2
        );
        complete(&running[0]);
        assert_eq!(
            stats("k"),
            Stats {
                max_running: Some(2),
                running: 1,
                ready: 1,
                waiting: 1
            }
        );
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
        assert_eq!(count("SELECT count(*) FROM sheaf.concurrency_slots"), 0);
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

    row! {
        /// A key's wait floor: its priority and the `n` of the task it is
        /// at (both NULL while unset).
        #[derive(Debug, PartialEq)]
        struct Floor {
            priority: Option<i32>,
            at_n: Option<i64>,
        }
    }

    const UNSET: Floor = Floor {
        priority: None,
        at_n: None,
    };

    fn floor_at(priority: i32, at_n: i64) -> Floor {
        Floor {
            priority: Some(priority),
            at_n: Some(at_n),
        }
    }

    fn wait_floor(key: &str) -> Floor {
        one(
            "SELECT c.wait_priority, (SELECT (t.payload->>'n')::bigint FROM sheaf.tasks t \
                                      WHERE t.concurrency_key = c.key AND t.seq = c.wait_seq) \
             FROM sheaf.concurrency_limits c WHERE c.key = $1",
            &[key.into()],
        )
    }

    #[pg_test]
    fn the_wait_floor_moves_up_with_promotions_and_down_for_tasks_put_before_it() {
        init();
        cap("k", Some(1));
        for n in 0..4 {
            enqueue("q", json!({"n": n}), json!({"concurrency_key": "k"}));
        }
        assert_eq!(wait_floor("k"), UNSET, "read from the head until a promotion");
        complete(&claim("q", 1)[0]);
        assert_eq!(wait_floor("k"), floor_at(0, 2), "at the first task still waiting");
        // A task of a higher priority goes before the floor: it lowers it.
        enqueue(
            "q",
            json!({"n": 10}),
            json!({"concurrency_key": "k", "priority": 5}),
        );
        assert_eq!(wait_floor("k").priority, Some(5));
        let running = claim("q", 1);
        assert_eq!(ns(&running), vec![1]);
        complete(&running[0]);
        let ten = claim("q", 1);
        assert_eq!(ns(&ten), vec![10], "promoted before the floor it had");
        // The floor moves again after WAIT_FLOOR_EVERY promotions; until
        // then the next promotion steps over task 10, running now.
        assert_eq!(wait_floor("k"), floor_at(5, 10));
        complete(&ten[0]);
        assert_eq!(ns(&claim("q", 1)), vec![2]);
    }

    #[pg_test]
    fn a_task_put_back_over_a_lowered_cap_lowers_the_wait_floor() {
        init();
        cap("k", Some(2));
        for n in 0..5 {
            enqueue("q", json!({"n": n}), json!({"concurrency_key": "k"}));
        }
        let running = claim("q", 2);
        complete(&running[0]);
        assert_eq!(wait_floor("k"), floor_at(0, 3));
        let second = claim("q", 1);
        assert_eq!(ns(&second), vec![2]);
        cap("k", Some(1));
        // Over the lowered cap, task 2 goes back to the line, before task 3.
        Spi::run_with_args(
            "SELECT sheaf.release($1, $2)",
            &[second[0].id.into(), second[0].token.into()],
        )
        .expect("release");
        assert_eq!(wait_floor("k"), floor_at(0, 2));
        complete(&running[1]);
        assert_eq!(ns(&claim("q", 1)), vec![2]);
    }

    row! {
        /// One of a key's count rows.
        #[derive(Debug, PartialEq)]
        struct Slot {
            generation: i64,
            admitted: i32,
        }
    }

    /// The key's count rows, oldest first.
    fn slots(key: &str) -> Vec<Slot> {
        rows(
            "SELECT gen, admitted FROM sheaf.concurrency_slots WHERE key = $1 ORDER BY gen",
            &[key.into()],
        )
    }

    #[pg_test]
    fn a_keys_count_is_one_row_replaced_by_a_newer_one_on_each_change() {
        init();
        cap("k", Some(2));
        let first = slots("k");
        assert_eq!(first.iter().map(|s| s.admitted).collect::<Vec<_>>(), vec![0]);
        enqueue("q", json!({"n": 0}), json!({"concurrency_key": "k"}));
        let admitted = slots("k");
        assert_eq!(admitted.len(), 1, "the row it replaced is deleted");
        assert!(admitted[0].generation > first[0].generation, "a newer generation");
        assert_eq!(admitted[0].admitted, 1);
        // A change of the cap alone, or a claim, leaves the count's row.
        cap("k", Some(3));
        let t = claim("q", 1);
        assert_eq!(slots("k"), admitted);
        complete(&t[0]);
        let freed = slots("k");
        assert!(freed[0].generation > admitted[0].generation);
        assert_eq!(freed.iter().map(|s| s.admitted).collect::<Vec<_>>(), vec![0]);
    }

    #[pg_test(error = "invalid max_running: must be >= 0 (or NULL to remove the cap), got -1")]
    fn a_negative_cap_is_refused() {
        init();
        cap("k", Some(-1));
    }
}
