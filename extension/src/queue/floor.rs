//! Claim floors: where a queue's claim starts its seek on `ready_claim`, so
//! it does not step over the dead entries of everything claimed while a
//! snapshot is held open elsewhere. The invariant and the protocol (readying
//! and advancing) are written down once, in `sql/schema.sql` beside
//! `ready_floors`; this module is the only code that follows it, and every
//! path that writes ready rows calls `readied` (the enqueue statement does
//! its step 2 itself, after `try_readying`).

use std::cell::RefCell;
use std::collections::HashMap;

use pgrx::prelude::*;

use crate::base::locks::{self, Class};
use crate::base::plans::{Stmt, exec};

/// Rows a backend claims from a queue between two tries at advancing its
/// floor. An advance costs one walk over the dead entries left since the
/// last one and leaves one more dead row in `ready_floors` (which every
/// claim's floor lookup steps over while the snapshot is held): a claim
/// walks at most about this many dead entries per backend.
const ADVANCE_EVERY: u32 = 128;
/// Queues counted per backend; past this the counts start over.
const COUNTED_QUEUES: usize = 10_000;

/// The floor of queue `$1` (minus infinity if it has no row) as the three
/// bounds of a row comparison with `(k1, k2, seq)`; `fl` is a CTE naming
/// the floor row: `fl AS (` [`FLOOR_ROW`] `)`.
macro_rules! floor_bounds {
    () => {
        "(coalesce((SELECT k1 FROM fl), '-Infinity'), coalesce((SELECT k2 FROM fl), '-Infinity'), \
          coalesce((SELECT seq FROM fl), -9223372036854775808))"
    };
}
pub(crate) use floor_bounds;

/// The CTE body of the floor row of queue `$1`.
macro_rules! floor_row {
    () => {
        "SELECT k1, k2, seq FROM ready_floors WHERE queue = $1 ORDER BY k1, k2, seq LIMIT 1"
    };
}
pub(crate) use floor_row;

/// Step 2 of readying inside the enqueue statement (`queue::tasks`): a CTE
/// over its CTE `r` of new ready rows (`k1, k2, seq`) of queue `$2`, with
/// `$16` the result of `try_readying`. The same rule as `LOWER`.
macro_rules! lower_in_enqueue {
    () => {
        ", fl AS (INSERT INTO ready_floors (queue, k1, k2, seq) \
           SELECT $2, m.k1, m.k2, m.seq FROM (SELECT k1, k2, seq FROM r ORDER BY k1, k2, seq LIMIT 1) m, \
             (SELECT k1, k2, seq FROM ready_floors WHERE queue = $2 ORDER BY k1, k2, seq LIMIT 1) f \
           WHERE NOT $16 OR (m.k1, m.k2, m.seq) < (f.k1, f.k2, f.seq))"
    };
}
pub(crate) use lower_in_enqueue;

// Step 2 of readying, for several queues: each queue's lowest new key
// becomes a floor row if it is below the floor, or if the lock was not had.
// A queue with no floor row at all is at minus infinity and stays there
// (an advance needs a floor row too): a row inserted there would raise it.
// One seek for the floor: a held snapshot keeps the dead rows of earlier
// advances in front of it.
const LOWER: Stmt = Stmt::write(
    "INSERT INTO ready_floors (queue, k1, k2, seq) \
     SELECT x.q, x.k1, x.k2, x.seq \
     FROM unnest($1::text[], $2::float8[], $3::float8[], $4::bigint[], $5::bool[]) AS x(q, k1, k2, seq, locked) \
     CROSS JOIN LATERAL (SELECT f.k1, f.k2, f.seq FROM ready_floors f WHERE f.queue = x.q \
                         ORDER BY f.k1, f.k2, f.seq LIMIT 1) f \
     WHERE NOT x.locked OR (x.k1, x.k2, x.seq) < (f.k1, f.k2, f.seq)",
    &[
        PgBuiltInOids::TEXTARRAYOID,
        PgBuiltInOids::FLOAT8ARRAYOID,
        PgBuiltInOids::FLOAT8ARRAYOID,
        PgBuiltInOids::INT8ARRAYOID,
        PgBuiltInOids::BOOLARRAYOID,
    ],
);
// A new queue's floor: minus infinity, as a row, so that a floor row a
// readying transaction inserts without the lock can only lower the floor.
const CREATE: Stmt = Stmt::write(
    "INSERT INTO ready_floors (queue, k1, k2, seq) \
     SELECT $1, '-Infinity', '-Infinity', -9223372036854775808 \
     WHERE NOT EXISTS (SELECT 1 FROM ready_floors WHERE queue = $1)",
    &[PgBuiltInOids::TEXTOID],
);
// An advance, in one snapshot: the first ready row at or above the floor
// (or, with none, the highest key the claim took: $2, $3, $4) replaces the
// floor rows this snapshot sees; if it is not above the floor, nothing is
// written (each write leaves a row version every later floor lookup steps
// over while a snapshot is held).
const ADVANCE: Stmt = Stmt::write(
    concat!(
        "WITH fl AS (",
        floor_row!(),
        "), \
         p AS (SELECT r.k1, r.k2, r.seq FROM ready r WHERE r.queue = $1 AND (r.k1, r.k2, r.seq) >= ",
        floor_bounds!(),
        " ORDER BY r.k1, r.k2, r.seq LIMIT 1), \
         n AS (SELECT k1, k2, seq FROM p \
               UNION ALL SELECT $2, $3, $4 WHERE $2 IS NOT NULL AND NOT EXISTS (SELECT 1 FROM p)), \
         m AS (SELECT n.* FROM n, fl WHERE (n.k1, n.k2, n.seq) > (fl.k1, fl.k2, fl.seq)), \
         d AS (DELETE FROM ready_floors WHERE queue = $1 AND EXISTS (SELECT 1 FROM m)) \
         INSERT INTO ready_floors (queue, k1, k2, seq) SELECT $1, k1, k2, seq FROM m"
    ),
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::INT8OID,
    ],
);

thread_local! {
    static SINCE_ADVANCE: RefCell<HashMap<String, u32>> = RefCell::new(HashMap::new());
}

/// A position in a queue's claim order: `(k1, k2, seq)` of `ready_claim`.
pub type Key = (f64, f64, i64);

/// Whether this transaction takes a new snapshot for each statement: an
/// older snapshot may predate an advance, so it cannot compare with the
/// floor.
fn read_committed() -> bool {
    // SAFETY: a plain read of the GUC's variable in a single-threaded backend.
    unsafe { pg_sys::XactIsoLevel == pg_sys::XACT_READ_COMMITTED as std::ffi::c_int }
}

/// Whether this shard's catalog has claim floors: between installing a
/// library of 0.2.0 or later and `ALTER EXTENSION sheaf UPDATE`, the
/// catalog is older, and every claim seeks from the head as before. A
/// catalog lookup, a few hundred nanoseconds.
pub fn enabled() -> bool {
    // SAFETY: a catalog lookup by name, in a transaction (the search path
    // starts with sheaf's schema).
    unsafe { pg_sys::RelnameGetRelid(c"ready_floors".as_ptr()) != pg_sys::InvalidOid }
}

/// Gives a new queue its floor row (minus infinity).
pub fn create(queue: &str) {
    if enabled() {
        exec(&CREATE, &[queue.into()]);
    }
}

/// What step 1 of readying found out for a queue.
#[derive(Debug, Clone, Copy)]
pub struct Readying {
    /// Whether the catalog has claim floors (step 2 runs).
    pub floors: bool,
    /// Whether step 2 may compare with the floor: the lock was had, and
    /// the transaction takes a snapshot per statement.
    pub compare: bool,
}

/// Step 1 of readying for `queue`; step 2 must run in a later statement.
/// The lock is tried even without floors in the catalog: a transaction
/// open across `ALTER EXTENSION sheaf UPDATE` that readied tasks before it
/// then still keeps the first advances out until it ends.
pub fn try_readying(queue: &str) -> Readying {
    let locked = locks::try_shared(Class::Floor, queue);
    let mut floors = enabled();
    if !locked && !floors {
        // Only an advance holds the lock exclusively, so floors exist now
        // and this transaction has not seen the catalog change yet.
        // SAFETY: processes pending catalog invalidations, in a transaction.
        unsafe { pg_sys::AcceptInvalidationMessages() };
        floors = enabled();
    }
    Readying {
        floors,
        compare: locked && read_committed(),
    }
}

/// Both steps of readying, after writing ready rows: `lowest` holds each
/// queue's lowest new key (one entry per queue).
pub fn readied(lowest: &[(String, Key)]) {
    let steps: Vec<Readying> = lowest.iter().map(|(q, _)| try_readying(q)).collect();
    if !steps.iter().any(|r| r.floors) {
        return;
    }
    let args = [
        lowest
            .iter()
            .map(|(q, _)| q.clone())
            .collect::<Vec<String>>()
            .into(),
        lowest.iter().map(|(_, k)| k.0).collect::<Vec<f64>>().into(),
        lowest.iter().map(|(_, k)| k.1).collect::<Vec<f64>>().into(),
        lowest.iter().map(|(_, k)| k.2).collect::<Vec<i64>>().into(),
        steps.iter().map(|r| r.compare).collect::<Vec<bool>>().into(),
    ];
    exec(&LOWER, &args);
}

/// After a claim of `n` rows from `queue`, the highest at `highest`: every
/// `ADVANCE_EVERY` rows, tries to move the floor up (READ COMMITTED only;
/// skipped while any transaction readying tasks of the queue is open, and
/// tried again at the next claim).
pub fn claimed(queue: &str, n: usize, highest: Option<Key>) {
    if n == 0 {
        return;
    }
    let due = SINCE_ADVANCE.with(|since| {
        let mut since = since.borrow_mut();
        if since.len() >= COUNTED_QUEUES && !since.contains_key(queue) {
            since.clear();
        }
        let count = since.entry(queue.to_owned()).or_insert(0);
        *count = count.saturating_add(n as u32);
        *count >= ADVANCE_EVERY
    });
    if !due || !read_committed() || !enabled() || !locks::try_exclusive(Class::Floor, queue) {
        return;
    }
    let (k1, k2, seq) = match highest {
        Some((k1, k2, seq)) => (Some(k1), Some(k2), Some(seq)),
        None => (None, None, None),
    };
    exec(&ADVANCE, &[queue.into(), k1.into(), k2.into(), seq.into()]);
    SINCE_ADVANCE.with(|since| {
        since.borrow_mut().insert(queue.to_owned(), 0);
    });
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{claim, count, enqueue, init, ns};
    use pgrx::prelude::*;
    use serde_json::json;

    fn floor_seq(queue: &str) -> i64 {
        Spi::get_one_with_args::<i64>(
            "SELECT seq FROM sheaf.ready_floors WHERE queue = $1 ORDER BY k1, k2, seq LIMIT 1",
            &[queue.into()],
        )
        .expect("floor")
        .expect("a floor row")
    }

    #[pg_test]
    fn the_floor_follows_the_claims_and_drops_for_what_is_readied_below_it() {
        init();
        for n in 0..300 {
            enqueue("q", json!({"n": n}), json!({}));
        }
        assert_eq!(floor_seq("q"), i64::MIN, "a new queue starts at minus infinity");
        let mut first = Vec::new();
        for _ in 0..super::ADVANCE_EVERY {
            first.extend(claim("q", 1));
        }
        let advanced = floor_seq("q");
        let head = count("SELECT min(seq) FROM sheaf.ready WHERE queue = 'q'");
        assert_eq!(advanced, head, "the floor is the first ready row left");
        // A higher priority lands below the floor, and is next.
        enqueue("q", json!({"n": 1000}), json!({"priority": 5}));
        assert!(
            floor_seq("q") > head,
            "k1 of priority 5 is lower: the floor row is that task's"
        );
        assert_eq!(ns(&claim("q", 1)), vec![1000]);
        // A released task goes back to its old place below the floor, and is
        // next again.
        let (id, token, _) = &first[0];
        Spi::run_with_args("SELECT sheaf.release($1, $2)", &[(*id).into(), (*token).into()])
            .expect("release");
        assert_eq!(ns(&claim("q", 1)), vec![0]);
        // The rest in order.
        let rest = ns(&claim("q", 1000));
        assert_eq!(rest, (super::ADVANCE_EVERY as i64..300).collect::<Vec<_>>());
    }

    #[pg_test]
    fn a_rekey_brings_the_floor_down_to_the_new_keys() {
        init();
        for n in 0..200 {
            enqueue("q", json!({"n": n}), json!({"priority": n % 2}));
        }
        Spi::run("SELECT sheaf.configure_queue('q', '{\"aging_secs\": 60}')").expect("aging");
        for _ in 0..super::ADVANCE_EVERY {
            claim("q", 1);
        }
        // Back to priorities: k1 = -priority, far below the aging keys.
        Spi::run("SELECT sheaf.configure_queue('q', '{\"aging_secs\": null}')").expect("no aging");
        let left = count("SELECT count(*) FROM sheaf.ready WHERE queue = 'q'");
        assert_eq!(
            claim("q", 1000).len() as i64,
            left,
            "every ready task is still claimable"
        );
    }
}
