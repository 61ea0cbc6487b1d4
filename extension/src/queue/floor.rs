//! Claim floors: where a queue's claim starts its seeks on `ready_claim`, one
//! per band, so it does not step over the dead entries of everything claimed
//! while a snapshot is held open elsewhere. The invariant and the protocol
//! (readying and advancing) are written down once, in `sql/schema.sql`
//! beside `ready_floors`; this module is the only code that follows it, and
//! every path that writes ready rows calls `readied` (the enqueue statement
//! does its step 2 itself, after `try_readying`).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use pgrx::fcinfo::direct_function_call;

use pgrx::prelude::*;

use crate::base::catalog::{self, Feature};
use crate::base::locks::{self, Class};
use crate::base::plans::Stmt;
use crate::base::rows::row;

/// Rows a backend claims from a queue between two tries at advancing its
/// floors. An advance costs one seek per band and leaves two dead row
/// versions per band it moves, both behind the live ones where no lookup
/// goes; in between, a claim walks at most about this many dead entries of
/// `ready_claim` per backend.
const ADVANCE_EVERY: u32 = 128;
/// Queues counted per backend; past this the counts start over.
const COUNTED_QUEUES: usize = 10_000;
/// Bands whose highest claimed key a backend keeps per queue between two
/// advances; past this, the others are forgotten.
const COUNTED_BANDS: usize = 64;

/// The band of a ready row, over its columns `aging_band` and `k1`: the
/// priority without aging (k1; the claim order is priority first, so each
/// priority is a band of its own), the row's aging band with it (each
/// priority is a band there too, which the claim merges by key).
macro_rules! band {
    () => {
        "coalesce(aging_band, k1)"
    };
}
/// Whether band `$band` is an aging queue's (`ready_aging_band`: every one
/// is below -1e14, and every band of priorities is -priority, above it;
/// NaN, the upgrade's, is above everything).
macro_rules! aging {
    ($band:expr) => {
        concat!($band, " < -1e14")
    };
}
pub(crate) use aging;
/// `aging!` in Rust: whether a claimed row's band is an aging one.
pub fn is_aging(band: f64) -> bool {
    band < -1e14
}

/// The ready rows of band `fl.band` of queue `$1` from its floor (`fl`:
/// band, k1, k2, seq), in claim order, at most `$limit`, as `$cols` of
/// `ready r`: on ready_claim (`k1 <= band`) for a band of priorities, on
/// ready_aging for an aging band. Under `LATERAL`. The aging band is bounded
/// by one row comparison from (band, floor) and `aging_band <= band`, not by
/// `aging_band = band`: an equality with the outer row makes ready_claim's
/// order look as good to the planner, which then picked it and walked every
/// priority's rows and dead entries in the band's key range (the interleaving
/// the aging bands exist to avoid).
macro_rules! band_rows {
    ($cols:expr, $limit:expr) => {
        concat!(
            "(SELECT ",
            $cols,
            " FROM ready r WHERE NOT ",
            $crate::queue::floor::aging!("fl.band"),
            " AND r.queue = $1 AND (r.k1, r.k2, r.seq) >= (fl.k1, fl.k2, fl.seq) AND r.k1 <= fl.band \
               ORDER BY r.k1, r.k2, r.seq LIMIT ",
            $limit,
            ") UNION ALL (SELECT ",
            $cols,
            " FROM ready r WHERE ",
            $crate::queue::floor::aging!("fl.band"),
            " AND r.queue = $1 AND r.aging_band IS NOT NULL \
               AND (r.aging_band, r.k1, r.k2, r.seq) >= (fl.band, fl.k1, fl.k2, fl.seq) AND r.aging_band <= fl.band \
             ORDER BY r.aging_band, r.k1, r.k2, r.seq LIMIT ",
            $limit,
            ")"
        )
    };
}
pub(crate) use band;
pub(crate) use band_rows;

/// A recursive CTE `w` (under `WITH RECURSIVE`): the rows of `ready_floors`
/// that make the floors of queue `$1`, each band's from its newest row down
/// to its newest base row (the rows below it are the older floors a held
/// snapshot keeps: one seek jumps over them to the next band). Then `fl`:
/// each band's floor, in band order.
macro_rules! floors {
    () => {
        "w AS (\
           (SELECT f.ctid, f.band, f.ngen, f.base, f.k1, f.k2, f.seq FROM ready_floors f WHERE f.queue = $1 \
            ORDER BY f.band, f.ngen LIMIT 1) \
           UNION ALL \
           SELECT n.* FROM w CROSS JOIN LATERAL (\
             SELECT f.ctid, f.band, f.ngen, f.base, f.k1, f.k2, f.seq FROM ready_floors f \
             WHERE f.queue = $1 \
               AND (f.band, f.ngen) > (w.band, CASE WHEN w.base THEN 9223372036854775807 ELSE w.ngen END) \
             ORDER BY f.band, f.ngen LIMIT 1) n), \
         fl AS MATERIALIZED (SELECT DISTINCT ON (band) band, k1, k2, seq FROM w ORDER BY band, k1, k2, seq)"
    };
}
pub(crate) use floors;

/// Step 2 of readying, as the tail of a statement with a CTE `x` (`q, band,
/// k1, k2, seq, locked`) of each band's lowest new key: each becomes a
/// lowering row unless the lock was had and the band's newest row is at or
/// below it. One seek per band: the newest row is the band's base row when
/// nothing was readied below the floor since the last advance; when it is a
/// lowering row above the new key, the rows under it are not looked at, and
/// one more lowering row is written (harmless: the floor is the smallest).
/// Rows take their generation from `ready_floor_gen`, so a band's newest
/// rows come first.
macro_rules! lower {
    () => {
        "INSERT INTO ready_floors (queue, band, ngen, base, k1, k2, seq) \
         SELECT x.q, x.band, -nextval('ready_floor_gen'), false, x.k1, x.k2, x.seq FROM x \
         WHERE NOT x.locked OR NOT EXISTS (\
           SELECT 1 FROM (SELECT f.k1, f.k2, f.seq FROM ready_floors f WHERE f.queue = x.q AND f.band = x.band \
                          ORDER BY f.band, f.ngen LIMIT 1) top \
           WHERE (top.k1, top.k2, top.seq) <= (x.k1, x.k2, x.seq))"
    };
}
pub(crate) use lower;

/// Step 2 of readying inside the enqueue statement (`queue::enqueue`): CTEs
/// over its CTE `r` of new ready rows (`k1, k2, seq, aging_band`) of queue
/// `$2` (one priority, so one band), with `$16` the result of
/// `try_readying`. The same rule as `LOWER`.
macro_rules! lower_in_enqueue {
    () => {
        concat!(
            ", x AS (SELECT $2::text AS q, ",
            $crate::queue::floor::band!(),
            " AS band, k1, k2, seq, $16 AS locked FROM r ORDER BY k1, k2, seq LIMIT 1), fl AS (",
            $crate::queue::floor::lower!(),
            ")"
        )
    };
}
pub(crate) use lower_in_enqueue;

// Step 2 of readying, for several bands.
const LOWER: Stmt = Stmt::write(
    concat!(
        "WITH x AS (\
           SELECT * FROM unnest($1::text[], $2::float8[], $3::float8[], $4::float8[], $5::bigint[], $6::bool[]) \
             AS x(q, band, k1, k2, seq, locked)) ",
        lower!()
    ),
    &[
        PgBuiltInOids::TEXTARRAYOID,
        PgBuiltInOids::FLOAT8ARRAYOID,
        PgBuiltInOids::FLOAT8ARRAYOID,
        PgBuiltInOids::FLOAT8ARRAYOID,
        PgBuiltInOids::INT8ARRAYOID,
        PgBuiltInOids::BOOLARRAYOID,
    ],
);
// An advance's generation, taken before its lock: a readying transaction
// that finds the lock taken writes its rows after this, so they sort
// before the advance's and every lookup sees them.
const GENERATION: Stmt = Stmt::write("SELECT nextval('ready_floor_gen')", &[]);
// An advance, in one snapshot, band by band: the first ready row of the
// band at or above its floor (on ready_claim, or ready_aging for an aging
// band) (or, with none, the highest key this backend
// claimed in it: $2..$5) is the band's new floor, a base row of generation
// $6, and the rows that made the old floor go. Only a floor that moves up,
// or that has lowering rows, is written: those become one base row (else
// they would pile up in a band nobody claims from, and every lookup would
// read them all). An empty band with neither stays as it is (its dead rows
// would be in the way of every lookup until the snapshot ends, so bands
// are not dropped lightly), unless the queue has more than 16 bands, or it
// is band NaN (the upgrade's, which covers every row: see
// sql/sheaf--0.1.0--0.2.0.sql), or a band of the other mode than the
// queue's (aging or not) since configure_queue switched it: an aging band
// left in a queue of priorities would keep its claims merging.
const ADVANCE: Stmt = Stmt::write(
    concat!(
        "WITH RECURSIVE ",
        floors!(),
        ", \
         h AS (SELECT * FROM unnest($2::float8[], $3::float8[], $4::float8[], $5::bigint[]) AS h(band, k1, k2, seq)), \
         n AS (SELECT fl.band, fl.k1 AS fk1, fl.k2 AS fk2, fl.seq AS fseq, \
                      coalesce(p.k1, h.k1) AS k1, coalesce(p.k2, h.k2) AS k2, coalesce(p.seq, h.seq) AS seq, \
                      EXISTS (SELECT 1 FROM w WHERE w.band = fl.band AND NOT w.base) AS lowered, \
                      p.k1 IS NULL AND h.k1 IS NULL \
                        AND (fl.band = 'NaN' OR (SELECT count(*) FROM fl) > 16 \
                             OR (",
        aging!("fl.band"),
        ") <> (SELECT q.aging_secs IS NOT NULL FROM queues q WHERE q.name = $1)) AS dropped \
               FROM fl \
               LEFT JOIN LATERAL (",
        band_rows!("r.k1, r.k2, r.seq", "1"),
        ") p ON true \
               LEFT JOIN h ON h.band = fl.band AND p.k1 IS NULL), \
         up AS (SELECT *, (k1, k2, seq) > (fk1, fk2, fseq) AS moved FROM n), \
         m AS (SELECT band, \
                      CASE WHEN dropped THEN NULL WHEN moved THEN k1 ELSE fk1 END AS k1, \
                      CASE WHEN dropped THEN NULL WHEN moved THEN k2 ELSE fk2 END AS k2, \
                      CASE WHEN dropped THEN NULL WHEN moved THEN seq ELSE fseq END AS seq \
               FROM up WHERE dropped OR moved OR lowered), \
         gone AS (DELETE FROM ready_floors \
                  WHERE ctid = ANY (ARRAY(SELECT w.ctid FROM w WHERE w.band IN (SELECT band FROM m)))) \
         INSERT INTO ready_floors (queue, band, ngen, base, k1, k2, seq) \
         SELECT $1, m.band, -$6, true, m.k1, m.k2, m.seq FROM m WHERE m.k1 IS NOT NULL"
    ),
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::FLOAT8ARRAYOID,
        PgBuiltInOids::FLOAT8ARRAYOID,
        PgBuiltInOids::FLOAT8ARRAYOID,
        PgBuiltInOids::INT8ARRAYOID,
        PgBuiltInOids::INT8OID,
    ],
);

// The floors of queue $1 in band order (`kept`).
const WALK: Stmt = Stmt::write(
    concat!(
        "WITH RECURSIVE ",
        floors!(),
        " SELECT band, k1, k2, seq FROM fl ORDER BY band"
    ),
    &[PgBuiltInOids::TEXTOID],
);
/// Bands of floors a backend keeps for a queue; a queue with more is
/// walked on every claim.
const KEPT_BANDS: usize = 64;

/// A queue's floors as a backend read them, kept between its claims so a
/// claim need not walk them (`kept`): each band (ascending) with its floor.
pub struct Kept {
    /// `ready_floor_gen`'s last value before they were read: they hold as
    /// long as it has not moved.
    pub generation: i64,
    pub bands: Vec<f64>,
    pub k1: Vec<f64>,
    pub k2: Vec<f64>,
    pub seq: Vec<i64>,
}

struct KeptEntry {
    /// The sequence they were read against (a sheaf dropped and created
    /// again starts its generations over).
    sequence: pg_sys::Oid,
    /// `ABORTS` when they were read.
    aborts: u64,
    kept: Rc<Kept>,
}

/// What a backend claimed from a queue since its last advance there: how
/// many rows, and the highest key per band.
#[derive(Default)]
struct Since {
    count: u32,
    highs: Vec<(f64, Key)>,
}

thread_local! {
    static SINCE_ADVANCE: RefCell<HashMap<String, Since>> = RefCell::new(HashMap::new());
    static KEPT: RefCell<HashMap<String, KeptEntry>> = RefCell::new(HashMap::new());
    static BELOW: RefCell<HashMap<(String, u64), Below>> = RefCell::new(HashMap::new());
    /// (Sub)transactions this backend rolled back or prepared since it
    /// first kept floors: floors read in one that rolled back may include
    /// its own advance, undone since (`on_abort`).
    static ABORTS: Cell<u64> = const { Cell::new(0) };
    static WATCHING_ABORTS: Cell<bool> = const { Cell::new(false) };
}

/// A position in a queue's claim order: `(k1, k2, seq)` of `ready_claim`.
pub type Key = (f64, f64, i64);

/// Whether this transaction takes a new snapshot for each statement: an
/// older snapshot may predate an advance, so it cannot compare with the
/// floor.
pub fn read_committed() -> bool {
    // SAFETY: a plain read of the GUC's variable in a single-threaded backend.
    unsafe { pg_sys::XactIsoLevel == pg_sys::XACT_READ_COMMITTED as std::ffi::c_int }
}

/// Whether this shard's catalog has claim floors: between installing a
/// library of 0.2.0 or later and `ALTER EXTENSION sheaf UPDATE`, the
/// catalog is older, and every claim seeks from the head as before.
pub fn enabled() -> bool {
    catalog::has(Feature::ClaimFloors)
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
/// then still keeps the first advances out until it ends (the upgrade
/// gives every queue a floor row at minus infinity, which covers its rows).
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
    if !locked && floors {
        // A late readier: the advance under way writes its rows before
        // ours (its generation is older), and no later one runs until this
        // transaction ends.
        locks::shared_of_tried(Class::FloorLate, queue);
    }
    Readying {
        floors,
        compare: locked && read_committed(),
    }
}

/// A bound on a band's floor this backend learnt by readying a row there:
/// the floor is at or below `(k1, k2, s)` for every seq `s` this backend
/// takes from now on, as long as `ready_floor_gen` stays at `generation`
/// and no (sub)transaction of this backend rolls back (`ABORTS`).
#[derive(Clone, Copy)]
struct Below {
    sequence: pg_sys::Oid,
    aborts: u64,
    generation: i64,
    k2: f64,
}

/// Whether rows readied now in band `band` of `queue`, a band of priorities
/// (so `k1 = band`), the lowest of them at `k2` and a seq this backend is
/// about to take, need no lowering row (step 2 of readying): the band's
/// floor is known to be at or below them. Asked after step 1 (`readying`).
///
/// Why it holds (`note_readied` made the bound): once a transaction that
/// readied key m in band b commits, a floor row of b at or below m is
/// committed (the newest row it compared with, or its own lowering row), and
/// it stays a floor row until an advance writes a newer base row. Every
/// advance that writes takes a generation under its exclusive lock, so
/// after the bound's transaction held its own floor lock; this
/// transaction holds the shared lock now (`compare`), so no advance is
/// under way, and one that wrote since moved the generation. Lowering rows
/// only lower floors. Every seq this backend takes later is higher, so
/// a new row at `(band, k2 >= bound's k2, seq)` is at or above that floor
/// row. A bound made in a (sub)transaction that rolled back is dropped: its
/// rows may have gone with it.
pub fn known_below(queue: &str, band: f64, k2: f64, readying: Readying) -> bool {
    if !readying.floors
        || !readying.compare
        || is_aging(band)
        || band.is_nan()
        || !catalog::has(Feature::FloorBounds)
    {
        return false;
    }
    let Some(sequence) = generation_sequence() else {
        return false;
    };
    let aborts = ABORTS.get();
    let bound = BELOW.with(|b| {
        b.borrow()
            .get(&(queue.to_owned(), band.to_bits()))
            .filter(|e| e.sequence == sequence && e.aborts == aborts)
            .map(|e| (e.generation, e.k2))
    });
    match bound {
        Some((generation, below)) => k2 >= below && last_generation(sequence) == generation,
        None => false,
    }
}

/// After step 2 of readying rows in band `band` (a band of priorities) of
/// `queue`, the lowest of them at `k2`: the bound `known_below` reads.
pub fn note_readied(queue: &str, band: f64, k2: f64) {
    if is_aging(band) || band.is_nan() {
        return;
    }
    let Some(sequence) = generation_sequence() else {
        return;
    };
    watch_aborts();
    let aborts = ABORTS.get();
    let generation = last_generation(sequence);
    BELOW.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() >= COUNTED_QUEUES {
            b.clear();
        }
        let fresh = Below {
            sequence,
            aborts,
            generation,
            k2,
        };
        let e = b.entry((queue.to_owned(), band.to_bits())).or_insert(fresh);
        if e.sequence == sequence && e.aborts == aborts && e.generation == generation {
            e.k2 = e.k2.min(k2);
        } else {
            *e = fresh;
        }
    });
}

/// A band's lowest new key, for `readied`.
pub struct Lowest {
    pub queue: String,
    pub band: f64,
    pub key: Key,
}

/// Both steps of readying, after writing ready rows: `lowest` holds the
/// lowest new key of each band written (one entry per queue and band).
pub fn readied(lowest: &[Lowest]) {
    let mut steps: HashMap<&str, Readying> = HashMap::new();
    for l in lowest {
        steps
            .entry(l.queue.as_str())
            .or_insert_with(|| try_readying(&l.queue));
    }
    if !steps.values().any(|r| r.floors) {
        return;
    }
    let args = [
        lowest
            .iter()
            .map(|l| l.queue.clone())
            .collect::<Vec<String>>()
            .into(),
        lowest.iter().map(|l| l.band).collect::<Vec<f64>>().into(),
        lowest.iter().map(|l| l.key.0).collect::<Vec<f64>>().into(),
        lowest.iter().map(|l| l.key.1).collect::<Vec<f64>>().into(),
        lowest.iter().map(|l| l.key.2).collect::<Vec<i64>>().into(),
        lowest
            .iter()
            .map(|l| steps.get(l.queue.as_str()).is_some_and(|r| r.compare))
            .collect::<Vec<bool>>()
            .into(),
    ];
    LOWER.exec(&args);
}

/// After a claim from `queue` of `rows` (band and key of each): every
/// `ADVANCE_EVERY` rows, tries to move the floors up (READ COMMITTED only;
/// skipped while any transaction readying tasks of the queue is open, and
/// tried again at the next claim).
pub fn claimed(queue: &str, rows: impl Iterator<Item = (f64, Key)>) {
    let due = SINCE_ADVANCE.with(|since| {
        let mut since = since.borrow_mut();
        if since.len() >= COUNTED_QUEUES && !since.contains_key(queue) {
            since.clear();
        }
        let s = since.entry(queue.to_owned()).or_default();
        for (band, key) in rows {
            s.count = s.count.saturating_add(1);
            note_high(&mut s.highs, band, key);
        }
        s.count >= ADVANCE_EVERY
    });
    // A late readier is open: no advance may run before it ends, and taking
    // the floor lock now would only make more of them.
    if !due || !read_committed() || !enabled() || !locks::free(Class::FloorLate, queue) {
        return;
    }
    let generation: i64 = GENERATION.one_value(&[], "taking a floor generation");
    // Tested again under the lock: one may have come since (it was late for
    // an advance that has ended since).
    if !locks::try_exclusive(Class::Floor, queue) || !locks::free(Class::FloorLate, queue) {
        return;
    }
    // Once more under the lock: a readier's bound (`known_below`) read
    // before it holds only until an advance writes.
    GENERATION.one_value::<i64>(&[], "taking a floor generation");
    let highs = SINCE_ADVANCE.with(|since| {
        since
            .borrow_mut()
            .remove(queue)
            .map(|s| s.highs)
            .unwrap_or_default()
    });
    let args = [
        queue.into(),
        highs.iter().map(|h| h.0).collect::<Vec<f64>>().into(),
        highs.iter().map(|h| h.1.0).collect::<Vec<f64>>().into(),
        highs.iter().map(|h| h.1.1).collect::<Vec<f64>>().into(),
        highs.iter().map(|h| h.1.2).collect::<Vec<i64>>().into(),
        generation.into(),
    ];
    ADVANCE.exec(&args);
    // Its generation is past the kept floors': the next claim reads them.
    forget(queue);
}
row! {
    /// A band's floor: the band, and the key `(k1, k2, seq)` its claims
    /// seek from.
    struct Floor {
        band: f64,
        k1: f64,
        k2: f64,
        seq: i64,
    }
}

/// The floors of `queue` this backend keeps, or reads now and keeps; `None`
/// where a claim must walk them (not READ COMMITTED, a readying
/// transaction of the queue is open, or a band is an aging one or the
/// upgrade's).
///
/// Kept floors are at or below the floors in every later snapshot, until
/// `ready_floor_gen` moves past `Kept::generation` (the claim checks that
/// in its own statement, after its snapshot, and `confirm` after a claim
/// that came back empty): every write to `ready_floors` takes a generation
/// first. A lowering row, the only write that lowers a floor, is written
/// by a readying transaction holding a floor lock from before its
/// generation to its end; so one with a generation up to the one read here
/// has ended before the locks were found free (and is in the walk's
/// snapshot, taken after), and a later one moves the generation. An
/// advance with an earlier generation that locks after the check only
/// raises floors: the kept ones are lower, which costs seeks over dead
/// entries, never a row. Floors read in a (sub)transaction that rolls back
/// are dropped (`ABORTS`): they may include its own advance.
pub fn kept(queue: &str) -> Option<Rc<Kept>> {
    if !read_committed() {
        return None;
    }
    let sequence = generation_sequence()?;
    let aborts = ABORTS.get();
    let hit = KEPT.with(|k| {
        k.borrow()
            .get(queue)
            .filter(|e| e.sequence == sequence && e.aborts == aborts)
            .map(|e| e.kept.clone())
    });
    if hit.is_some() {
        return hit;
    }
    watch_aborts();
    let generation = last_generation(sequence);
    if !locks::free(Class::Floor, queue) || !locks::free(Class::FloorLate, queue) {
        return None;
    }
    let floors: Vec<Floor> = WALK.all(&[queue.into()], "reading a queue's floors");
    if floors.is_empty()
        || floors.len() > KEPT_BANDS
        || floors.iter().any(|f| is_aging(f.band) || f.band.is_nan())
    {
        return None;
    }
    let kept = Rc::new(Kept {
        generation,
        bands: floors.iter().map(|f| f.band).collect(),
        k1: floors.iter().map(|f| f.k1).collect(),
        k2: floors.iter().map(|f| f.k2).collect(),
        seq: floors.iter().map(|f| f.seq).collect(),
    });
    KEPT.with(|k| {
        let mut k = k.borrow_mut();
        if k.len() >= COUNTED_QUEUES {
            k.clear();
        }
        k.insert(
            queue.to_owned(),
            KeptEntry {
                sequence,
                aborts,
                kept: kept.clone(),
            },
        );
    });
    Some(kept)
}

/// Whether `kept` still holds (after a claim from them came back empty:
/// the claim's own check may have failed); forgets them if not.
pub fn confirm(queue: &str, kept: &Kept) -> bool {
    let holds = generation_sequence().is_some_and(|s| last_generation(s) == kept.generation);
    if !holds {
        forget(queue);
    }
    holds
}

fn forget(queue: &str) {
    KEPT.with(|k| k.borrow_mut().remove(queue));
}

/// `ready_floor_gen`, if the catalog has it.
fn generation_sequence() -> Option<pg_sys::Oid> {
    // SAFETY: a catalog lookup by name, in a transaction (the search path
    // starts with sheaf's schema).
    let oid = unsafe { pg_sys::RelnameGetRelid(c"ready_floor_gen".as_ptr()) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// The last generation any backend took (0 before the first): a
/// sequence's last value is shared and moves at `nextval`, not at commit.
fn last_generation(sequence: pg_sys::Oid) -> i64 {
    // SAFETY: a builtin taking a regclass and returning an int8 or NULL,
    // called in a transaction as the function's owner, who owns the
    // sequence.
    unsafe { direct_function_call::<i64>(pg_sys::pg_sequence_last_value, &[sequence.into_datum()]) }
        .unwrap_or(0)
}

/// Counts this backend's rollbacks from now on (once per backend).
fn watch_aborts() {
    if WATCHING_ABORTS.replace(true) {
        return;
    }
    // SAFETY: registers plain functions that only bump a counter; they
    // stay registered for the backend's life.
    unsafe {
        pg_sys::RegisterXactCallback(Some(on_abort), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(on_subabort), std::ptr::null_mut());
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn on_abort(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    // A prepared transaction may be rolled back by any session, and this
    // one would not hear of it: counted as if rolled back.
    if event == pg_sys::XactEvent::XACT_EVENT_ABORT
        || event == pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT
        || event == pg_sys::XactEvent::XACT_EVENT_PREPARE
    {
        ABORTS.set(ABORTS.get().wrapping_add(1));
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn on_subabort(
    event: pg_sys::SubXactEvent::Type,
    _sub: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        ABORTS.set(ABORTS.get().wrapping_add(1));
    }
}

/// Keeps the highest key claimed in each band.
fn note_high(highs: &mut Vec<(f64, Key)>, band: f64, key: Key) {
    let above = |a: Key, b: Key| {
        a.0.total_cmp(&b.0)
            .then(a.1.total_cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .is_gt()
    };
    let same = |b: f64| b == band || b.is_nan() && band.is_nan();
    if let Some(h) = highs.iter_mut().find(|h| same(h.0)) {
        if above(key, h.1) {
            h.1 = key;
        }
    } else if highs.len() < COUNTED_BANDS {
        highs.push((band, key));
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{claim, count, enqueue, init, ns};
    use pgrx::prelude::*;
    use serde_json::json;

    /// The floor of band `band` of queue `q` as its `seq`, if it has one.
    fn floor_seq(queue: &str, band: f64) -> Option<i64> {
        Spi::get_one_with_args::<i64>(
            "SELECT seq FROM sheaf.ready_floors WHERE queue = $1 AND band = $2 ORDER BY k1, k2, seq LIMIT 1",
            &[queue.into(), band.into()],
        )
        .expect("floor")
    }

    #[pg_test]
    fn each_band_floor_follows_the_claims_and_drops_for_what_is_readied_below_it() {
        init();
        // Claims from the floors, which the backend keeps between claims:
        // a task readied below them must still come next.
        Spi::run("SET LOCAL sheaf.claim_floors_at_lag = 0").expect("set");
        for n in 0..300 {
            enqueue("fl-1", json!({"n": n}), json!({}));
        }
        let head = count("SELECT min(seq) FROM sheaf.ready WHERE queue = 'fl-1'");
        assert_eq!(
            floor_seq("fl-1", 0.0),
            Some(head),
            "the first ready row makes its band"
        );
        assert_eq!(
            count("SELECT count(*) FROM sheaf.ready_floors WHERE queue = 'fl-1'"),
            1,
            "rows readied above the floor write nothing"
        );
        let mut first = Vec::new();
        for _ in 0..super::ADVANCE_EVERY {
            first.extend(claim("fl-1", 1));
        }
        let head = count("SELECT min(seq) FROM sheaf.ready WHERE queue = 'fl-1'");
        assert_eq!(
            floor_seq("fl-1", 0.0),
            Some(head),
            "the floor is the first ready row left"
        );
        // A higher priority is a band of its own, claimed first.
        enqueue("fl-1", json!({"n": 1000}), json!({"priority": 5}));
        assert!(floor_seq("fl-1", -5.0).is_some(), "priority 5 has its band");
        assert_eq!(ns(&claim("fl-1", 1)), vec![1000]);
        // A released task goes back to its old place below its band's
        // floor, and is next again.
        Spi::run_with_args(
            "SELECT sheaf.release($1, $2)",
            &[first[0].id.into(), first[0].token.into()],
        )
        .expect("release");
        assert!(
            floor_seq("fl-1", 0.0) < Some(head),
            "the release lowers the floor"
        );
        assert_eq!(ns(&claim("fl-1", 1)), vec![0]);
        // The rest in order.
        let rest = ns(&claim("fl-1", 1000));
        assert_eq!(rest, (super::ADVANCE_EVERY as i64..300).collect::<Vec<_>>());
    }

    /// A band left empty keeps its floor at the last key this backend
    /// claimed from it (new rows land above it, writing nothing); an empty
    /// band nobody here claimed from stays too, until the queue has more
    /// than 16 bands.
    #[pg_test]
    fn an_empty_band_stays_at_its_last_claim_and_dormant_ones_go_past_16_bands() {
        init();
        let every = super::ADVANCE_EVERY as i64;
        let bands = || count("SELECT count(DISTINCT band) FROM sheaf.ready_floors WHERE queue = 'fl-2'");
        for n in 0..(2 * every - 1) {
            enqueue("fl-2", json!({"n": n}), json!({"priority": 1}));
        }
        enqueue("fl-2", json!({"n": -1}), json!({"priority": 9}));
        assert_eq!(ns(&claim("fl-2", 1)), vec![-1]);
        for _ in 1..(2 * every) {
            claim("fl-2", 1);
        }
        assert_eq!(count("SELECT count(*) FROM sheaf.ready WHERE queue = 'fl-2'"), 0);
        assert!(floor_seq("fl-2", -9.0).is_some(), "an empty band stays");
        let last = count("SELECT max(seq) FROM sheaf.tasks WHERE priority = 1");
        assert_eq!(floor_seq("fl-2", -1.0), Some(last), "empty, at its last claim");
        enqueue("fl-2", json!({"n": 7}), json!({"priority": 9}));
        enqueue("fl-2", json!({"n": 8}), json!({"priority": 1}));
        assert_eq!(
            count("SELECT count(*) FROM sheaf.ready_floors WHERE queue = 'fl-2'"),
            2,
            "rows readied above the floors write nothing"
        );
        assert_eq!(ns(&claim("fl-2", 5)), vec![7, 8]);
        // 17 more bands, emptied, then two advances without claims there.
        for p in 10..27 {
            enqueue("fl-2", json!({"n": p}), json!({"priority": p}));
        }
        for n in 0..(4 * every) {
            enqueue("fl-2", json!({"n": 100 + n}), json!({"priority": 0}));
        }
        assert_eq!(bands(), 20);
        for _ in 0..(3 * every) {
            claim("fl-2", 1);
        }
        assert_eq!(bands(), 1, "past 16 bands, the empty ones nobody claims from go");
        assert_eq!(claim("fl-2", 1000).len() as i64, 4 * every - (3 * every - 17));
    }

    /// Lowering rows above a floor (a late readier writes one whatever the
    /// floor) become one base row at the next advance, also in a band
    /// nobody claims from, so lookups do not read more and more of them.
    #[pg_test]
    fn an_advance_folds_a_bands_lowering_rows_into_one() {
        // A queue of its own: pg_tests run side by side, and another test's
        // transaction holding queue 'fl-3''s floor lock would skip the advance.
        init();
        for n in 0..5 {
            enqueue("q-fold", json!({"n": n}), json!({}));
        }
        let head = count("SELECT min(seq) FROM sheaf.ready WHERE queue = 'q-fold'");
        Spi::run_with_args(
            "INSERT INTO sheaf.ready_floors (queue, band, ngen, base, k1, k2, seq) \
             SELECT 'q-fold', 0, -nextval('sheaf.ready_floor_gen'), false, 0, 0, $1 + i FROM generate_series(1, 4) i",
            &[head.into()],
        )
        .expect("late readiers' rows");
        let rows = || count("SELECT count(*) FROM sheaf.ready_floors WHERE queue = 'q-fold' AND band = 0");
        assert_eq!(rows(), 5);
        for n in 0..super::ADVANCE_EVERY {
            enqueue("q-fold", json!({"n": 100 + n}), json!({"priority": 1}));
        }
        for _ in 0..super::ADVANCE_EVERY {
            claim("q-fold", 1);
        }
        assert_eq!(rows(), 1, "one row left in band 0");
        assert_eq!(
            count("SELECT count(*) FROM sheaf.ready_floors WHERE queue = 'q-fold' AND band = 0 AND base"),
            1
        );
        assert_eq!(floor_seq("q-fold", 0.0), Some(head), "at the same floor");
        assert_eq!(ns(&claim("q-fold", 10)), vec![0, 1, 2, 3, 4]);
    }

    /// In an aging queue each priority is a band of its own (its aging
    /// band), and the claim merges the bands by key: an old task of a low
    /// priority comes before new ones of higher priorities. A task left
    /// with the keys of the other mode (readied while a switch of aging
    /// committed) is claimed in the order of its keys all the same. Once the
    /// queue no longer ages, its empty aging bands go at the next advance.
    #[pg_test]
    fn an_aging_queue_has_a_band_per_priority_which_the_claim_merges() {
        init();
        let aging = |secs: &str| {
            Spi::run(&format!(
                "SELECT sheaf.configure_queue('fl-4', '{{\"aging_secs\": {secs}}}')"
            ))
            .expect("configure")
        };
        let aging_bands = || {
            count("SELECT count(DISTINCT band) FROM sheaf.ready_floors WHERE queue = 'fl-4' AND band < -1e14")
        };
        aging("60");
        for n in 0..8 {
            enqueue("fl-4", json!({"n": n}), json!({"priority": n % 4}));
        }
        assert_eq!(aging_bands(), 4, "a band per priority");
        // Task 4 (priority 0) 150 s older: ahead of priorities 2 and 1 at
        // 60 s per step, behind priority 3. The re-key lowers its band.
        Spi::run("UPDATE sheaf.tasks SET enqueued_at = enqueued_at - interval '150 seconds' WHERE payload->>'n' = '4'")
            .expect("age task 4");
        aging("60");
        // Task 5 as a readier that had not seen aging yet would have left
        // it: k1 = -priority, no aging band, a lowering row in band -1.
        Spi::run(
            "WITH r AS (UPDATE sheaf.ready r SET k1 = -1, aging_band = NULL FROM sheaf.tasks t \
                        WHERE t.id = r.task_id AND t.payload->>'n' = '5' RETURNING r.k2, r.seq) \
             INSERT INTO sheaf.ready_floors (queue, band, ngen, base, k1, k2, seq) \
             SELECT 'fl-4', -1, -nextval('sheaf.ready_floor_gen'), false, -1, k2, seq FROM r",
        )
        .expect("a task with the other mode's keys");
        let mut order = ns(&claim("fl-4", 3));
        order.extend(ns(&claim("fl-4", 2)));
        order.extend(ns(&claim("fl-4", 10)));
        assert_eq!(order, vec![5, 3, 7, 4, 2, 6, 1, 0]);
        aging("null");
        let every = super::ADVANCE_EVERY as i64;
        for n in 0..(2 * every) {
            enqueue("fl-4", json!({"n": n}), json!({}));
        }
        // Two advances: the first still has this backend's claims from the
        // aging bands, the second finds them empty with none.
        for _ in 0..2 {
            assert_eq!(claim("fl-4", every as i32).len() as i64, every);
        }
        assert_eq!(aging_bands(), 0, "the empty aging bands went");
    }

    /// Once this backend readied a row in a band of priorities, a row it
    /// readies there later (same or higher key) needs no step 2: the band's
    /// floor is known to be below it, until a generation is taken (every
    /// advance takes one under its lock) or a (sub)transaction rolls back.
    /// The rows here are taken away behind the protocol's back (no
    /// generation taken) to see which enqueues compare with the floor.
    #[pg_test]
    fn a_floor_known_below_skips_step_2_until_a_generation_or_a_rollback() {
        init();
        let rows = || count("SELECT count(*) FROM sheaf.ready_floors WHERE queue = 'fl-6'");
        let behind_its_back =
            || Spi::run("DELETE FROM sheaf.ready_floors WHERE queue = 'fl-6'").expect("delete");
        enqueue("fl-6", json!({"n": 0}), json!({}));
        assert_eq!(rows(), 1, "a new band gets its row");
        behind_its_back();
        enqueue("fl-6", json!({"n": 1}), json!({}));
        assert_eq!(rows(), 0, "known below: no step 2");
        Spi::run("SELECT nextval('sheaf.ready_floor_gen')").expect("a generation");
        enqueue("fl-6", json!({"n": 2}), json!({}));
        assert_eq!(rows(), 1, "a generation ends what was known");
        behind_its_back();
        enqueue("fl-6", json!({"n": 3}), json!({"priority": 1}));
        assert_eq!(rows(), 1, "another band is not known");
        behind_its_back();
        Spi::run(
            "DO $$ BEGIN PERFORM sheaf.enqueue('fl-6', '{}'); RAISE EXCEPTION 'undo'; \
             EXCEPTION WHEN raise_exception THEN NULL; END $$",
        )
        .expect("a rolled back subtransaction");
        assert_eq!(rows(), 0, "still known inside it");
        enqueue("fl-6", json!({"n": 4}), json!({}));
        assert_eq!(rows(), 1, "a rollback ends what was known");
    }

    #[pg_test]
    fn a_rekey_brings_the_floor_down_to_the_new_keys() {
        init();
        for n in 0..200 {
            enqueue("fl-5", json!({"n": n}), json!({"priority": n % 2}));
        }
        Spi::run("SELECT sheaf.configure_queue('fl-5', '{\"aging_secs\": 60}')").expect("aging");
        for _ in 0..super::ADVANCE_EVERY {
            claim("fl-5", 1);
        }
        // Back to priorities: k1 = -priority, far below the aging keys.
        Spi::run("SELECT sheaf.configure_queue('fl-5', '{\"aging_secs\": null}')").expect("no aging");
        let left = count("SELECT count(*) FROM sheaf.ready WHERE queue = 'fl-5'");
        assert_eq!(
            claim("fl-5", 1000).len() as i64,
            left,
            "every ready task is still claimable"
        );
    }
}
