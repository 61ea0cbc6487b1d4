//! The claim: one ordered seek on the ready set, `FOR UPDATE SKIP LOCKED`,
//! batch-sized, in one statement. No gate and no fallback scan: a task whose
//! concurrency key is full is not in the ready set, aging and fairness are
//! static index keys, and future tasks wait outside it.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use pgrx::fcinfo::direct_function_call;
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;

use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;
use crate::base::rows::{Split, row};
use crate::queue::floor;
use crate::queue::hooks::ExecutionHooks;
use crate::queue::{lease, promote};

pub const MAX_BATCH: i32 = 1_000;
/// Due scheduled tasks promoted, and expired leases reaped, per sweep.
const SWEEP_PROMOTE: i64 = 1_000;
const SWEEP_REAP: i64 = 100;
/// A busy queue is swept at least this often per backend; an idle-looking
/// one (the claim came up short) on every claim. A worker cycling over many
/// queues sweeps each of them this often, so it is not much shorter.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// A sweep reads the heads of tasks_scheduled and tasks_running whole at
/// most this often per backend and queue, and no more than once per this
/// many times what that last cost: while a snapshot is held open elsewhere,
/// the heads keep the dead entries of every task promoted, completed or
/// reaped since it began, and a whole read steps over all of them. The
/// sweeps in between read only what came due or expired since the last
/// sweep began, less `SWEEP_SLACK`: a task that came due earlier but was
/// committed after that sweep waits for the next whole read.
const SWEEP_WHOLE_SHARE: u32 = 100;
const SWEEP_SLACK: f64 = 1.0;
/// Queues whose last sweep a backend keeps; past this it starts over.
const COUNTED_SWEEPS: usize = 10_000;

// The claim, band by band from the queue's floors (`queue::floor`), or, with
// a catalog older than 0.2.0, from the head of the queue's range. Bands of
// priorities come in order and each band's rows in order; the outer LIMIT
// stops the nested loop as soon as it has the batch, so no band past it is
// read and no row it does not take is locked. The bands of an aging queue
// are merged instead: `cand`, the first rows of every band by key, read
// without locks, then locked in that order, skipping the ones other claims
// hold, until the batch is full; only if those run out (other claims hold
// them) are sixteen times as many read, in the same order, past `cand`.
// Every band takes part in the merge, also one of priorities: a task
// readied while configure_queue switched aging on or off keeps the keys of
// the other mode until it is claimed, and is claimed in the order of its
// keys all the same.
// Each row comes back with the band it was taken from: its aging band, or
// the smallest band at or above its k1.
macro_rules! claim {
    ($with:expr, $picked:expr, $gone:expr, $band:expr, $claimed:expr) => {
        concat!(
            "WITH RECURSIVE ",
            $with,
            "picked AS (",
            $picked,
            "), \
             gone AS (\
               DELETE FROM ready WHERE ctid = ANY (ARRAY(SELECT ctid FROM picked)) \
               RETURNING task_id, k1, k2, seq",
            $gone,
            ") \
             UPDATE tasks t SET state = 'running', attempts = t.attempts + 1, token = nextval('fence_token'), \
                    lease_owner = $3, lease_secs = $4, lease_expires_at = now() + make_interval(secs => $4)",
            $claimed,
            " FROM gone g WHERE t.id = g.task_id \
             RETURNING t.id, t.token, t.payload, t.attempts, t.execution_id, t.concurrency_key, t.kind, \
                       g.k1, g.k2, g.seq, ",
            $band
        )
    };
}
/// The first `$limit` rows of all the bands of `fl` from their floors,
/// merged by key, without locks, if `$when`. Band NaN (the upgrade's)
/// covers rows of other bands: one row read twice counts once.
macro_rules! merged {
    ($limit:expr, $when:expr) => {
        concat!(
            "SELECT DISTINCT ON (c.k1, c.k2, c.seq) c.ctid, c.k1, c.k2, c.seq FROM fl CROSS JOIN LATERAL (",
            floor::band_rows!("r.ctid, r.k1, r.k2, r.seq", $limit),
            ") c WHERE ",
            $when,
            " ORDER BY c.k1, c.k2, c.seq LIMIT ",
            $limit
        )
    };
}
/// Whether `fl` has a band of an aging queue.
macro_rules! ages {
    () => {
        concat!("EXISTS (SELECT 1 FROM fl a WHERE ", floor::aging!("a.band"), ")")
    };
}
/// Locks the rows of `$rows` (a FROM item `x` with `ctid`) in its order,
/// skipping the ones others hold.
macro_rules! lock_in_order {
    ($rows:expr) => {
        concat!(
            "SELECT l.ctid FROM ",
            $rows,
            " CROSS JOIN LATERAL (SELECT r.ctid FROM ready r WHERE r.ctid = x.ctid FOR UPDATE SKIP LOCKED) l"
        )
    };
}
/// The rows of the bands of priorities of `fl` from their floors, in
/// order, locked.
macro_rules! band_seeks {
    () => {
        "SELECT p.ctid FROM fl CROSS JOIN LATERAL (\
           SELECT r.ctid FROM ready r \
           WHERE r.queue = $1 AND (r.k1, r.k2, r.seq) >= (fl.k1, fl.k2, fl.seq) AND r.k1 <= fl.band \
           ORDER BY r.k1, r.k2, r.seq LIMIT $2 FOR UPDATE SKIP LOCKED) p"
    };
}
/// `band_seeks!`, unless a band of `fl` is an aging one.
macro_rules! in_bands {
    () => {
        concat!(band_seeks!(), " WHERE NOT ", ages!())
    };
}
/// The band a claimed row `g` was taken from.
macro_rules! band_of {
    () => {
        "coalesce(g.aging_band, (SELECT min(fl.band) FROM fl WHERE fl.band >= g.k1))"
    };
}
const CLAIM_ARGS: &[PgBuiltInOids] = &[
    PgBuiltInOids::TEXTOID,
    PgBuiltInOids::INT8OID,
    PgBuiltInOids::TEXTOID,
    PgBuiltInOids::FLOAT8OID,
];
const CLAIMS: [Stmt; 2] = [
    Stmt::write(
        claim!(
            "",
            "SELECT ctid FROM ready WHERE queue = $1 ORDER BY k1, k2, seq LIMIT $2 FOR UPDATE SKIP LOCKED",
            "",
            "g.k1",
            ""
        ),
        CLAIM_ARGS,
    ),
    Stmt::write(
        claim!(
            concat!(
                floor::floors!(),
                ", cand AS MATERIALIZED (",
                merged!("$2 + 2", ages!()),
                "), "
            ),
            concat!(
                "(",
                lock_in_order!("cand x"),
                ") UNION ALL (",
                lock_in_order!(concat!(
                    "(",
                    merged!("16 * ($2 + 2)", "(SELECT count(*) FROM cand) = $2 + 2"),
                    " OFFSET $2 + 2) x"
                )),
                ") UNION ALL (",
                in_bands!(),
                ") LIMIT $2"
            ),
            ", aging_band",
            band_of!(),
            // A catalog with floors has the claim time too (both 0.2.0).
            ", claimed_at = now()"
        ),
        CLAIM_ARGS,
    ),
];
/// The claim of a queue whose floors have no aging band (every queue but an
/// aging one, and one switched off aging whose old rows are gone): band by
/// band, without the merge, whose plan is most of the full claim's and costs
/// to start even where it reads nothing. With an aging band among the
/// floors it takes nothing, and the full claim runs (`claim_once`).
const IN_BANDS: Stmt = Stmt::write(
    claim!(
        concat!(floor::floors!(), ", "),
        concat!(in_bands!(), " LIMIT $2"),
        ", aging_band",
        band_of!(),
        ", claimed_at = now()"
    ),
    CLAIM_ARGS,
);
/// `IN_BANDS` from the floors this backend keeps (`floor::kept`: $5..$8,
/// their bands and keys), without walking them, as long as
/// `ready_floor_gen` is still at their generation ($9) once the claim's
/// snapshot is taken; else it takes nothing.
const KEPT: Stmt = Stmt::write(
    claim!(
        "fl AS MATERIALIZED (\
           SELECT * FROM unnest($5::float8[], $6::float8[], $7::float8[], $8::bigint[]) AS fl(band, k1, k2, seq) \
           WHERE (SELECT s.last_value FROM ready_floor_gen s) = $9), ",
        concat!(band_seeks!(), " LIMIT $2"),
        ", aging_band",
        band_of!(),
        ", claimed_at = now()"
    ),
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::FLOAT8ARRAYOID,
        PgBuiltInOids::FLOAT8ARRAYOID,
        PgBuiltInOids::FLOAT8ARRAYOID,
        PgBuiltInOids::INT8ARRAYOID,
        PgBuiltInOids::INT8OID,
    ],
);
/// The claim from the head of the queue's range on `ready_claim`, in claim
/// order (every ready row has its key there, aging or not), without reading
/// the floors: while no snapshot holds back the xmin horizon, a claim's
/// seek meets few dead entries (each scan marks the ones it passes once
/// they are dead to everyone), and reading the floors cost more than the
/// seek they save (`seek_from_floors`). The floors are still kept (every
/// claim counts towards an advance), so a claim can start from them at
/// any time. Each row's band is its own (`floor::band!`).
const AT_HEAD: Stmt = Stmt::write(
    claim!(
        "",
        "SELECT ctid FROM ready WHERE queue = $1 ORDER BY k1, k2, seq LIMIT $2 FOR UPDATE SKIP LOCKED",
        ", aging_band",
        "coalesce(g.aging_band, g.k1)",
        ", claimed_at = now()"
    ),
    CLAIM_ARGS,
);
/// `sheaf.claim_floors_at_lag`: how many transactions the xmin horizon may
/// lag behind before claims seek from the floors (0: always).
pub static FLOORS_AT_LAG: GucSetting<i32> = GucSetting::<i32>::new(10_000);
/// `sheaf.claim_floors_at_dead_rows`: how many dead rows `ready` may count
/// before claims seek from the floors (0: always).
pub static FLOORS_AT_DEAD_ROWS: GucSetting<i32> = GucSetting::<i32>::new(100_000);
/// How long after the horizon last lagged a backend still seeks from the
/// floors: the entries a held snapshot kept are in `ready_claim` until a
/// vacuum, or a scan passing each of them, removes or marks them.
const FLOORS_AFTER_LAG: Duration = Duration::from_secs(30);
/// How often a backend reads `ready`'s dead rows from the statistics (a
/// hash lookup; the counts themselves are at most a second old).
const DEAD_ROWS_EVERY: Duration = Duration::from_secs(1);

/// Registers the claim's setting (from `_PG_init`).
pub fn define_settings() {
    GucRegistry::define_int_guc(
        c"sheaf.claim_floors_at_lag",
        c"Transactions the xmin horizon may lag behind before claims seek from the claim floors.",
        c"While a snapshot held open keeps the horizon back, every claim would step over the dead entries of \
          everything claimed since; past this lag (and for 30 s after it) claims start their seeks from the \
          claim floors instead. 0: always from the floors.",
        &FLOORS_AT_LAG,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"sheaf.claim_floors_at_dead_rows",
        c"Dead rows the ready table may count before claims seek from the claim floors.",
        c"A claim from the head of a queue steps over the dead entries of everything claimed since the last \
          vacuum: at thousands of claims a second they cost more than reading the floors. While the table's \
          statistics count this many dead rows (read once a second), claims start their seeks from the \
          claim floors instead. 0: always from the floors.",
        &FLOORS_AT_DEAD_ROWS,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::default(),
    );
}

// Whether a queue has a floor of an aging band: the full claim's merge is
// needed (`IN_BANDS` took nothing because of one, or the queue ages).
const AGES: Stmt = Stmt::read(
    concat!(
        "SELECT EXISTS (SELECT 1 FROM ready_floors f WHERE f.queue = $1 AND ",
        floor::aging!("f.band"),
        ")"
    ),
    &[PgBuiltInOids::TEXTOID],
);
// Whether a sweep has anything to do: one read, where promotion and reaping
// would each run a locking scan. `[whole, since $2]` (epoch seconds).
const SWEEP_PROBE: [Stmt; 2] = [
    Stmt::read(
        "SELECT EXISTS (SELECT 1 FROM tasks WHERE queue = $1 AND state = 'scheduled' AND run_at <= now()), \
                EXISTS (SELECT 1 FROM tasks WHERE queue = $1 AND state = 'running' AND lease_expires_at < now())",
        &[PgBuiltInOids::TEXTOID, PgBuiltInOids::FLOAT8OID],
    ),
    Stmt::read(
        "SELECT EXISTS (SELECT 1 FROM tasks WHERE queue = $1 AND state = 'scheduled' AND run_at <= now() \
                          AND run_at >= to_timestamp($2)), \
                EXISTS (SELECT 1 FROM tasks WHERE queue = $1 AND state = 'running' AND lease_expires_at < now() \
                          AND lease_expires_at >= to_timestamp($2))",
        &[PgBuiltInOids::TEXTOID, PgBuiltInOids::FLOAT8OID],
    ),
];
// Moves the fairness virtual time forward, unless another claim is doing it
// right now: a claim never waits on the queue row.
const ADVANCE_VTIME: Stmt = Stmt::write(
    "UPDATE queues SET vtime = $2 WHERE name = $1 AND vtime < $2 \
     AND name = (SELECT name FROM queues WHERE name = $1 AND vtime < $2 FOR NO KEY UPDATE SKIP LOCKED)",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::FLOAT8OID],
);

/// What a backend's last sweep of a queue left for the next one.
#[derive(Debug, Clone, Copy)]
struct Swept {
    /// When it began.
    at: Instant,
    /// When the last whole read of the heads began, and what its probe
    /// cost.
    whole_at: Instant,
    whole_cost: Duration,
    /// Epoch seconds from which the next sweep may read instead of whole:
    /// `None` after a sweep that stopped at its bounds (more is due before
    /// its window's end than it took).
    window_from: Option<f64>,
}

thread_local! {
    /// When this backend last saw the xmin horizon lag (`seek_from_floors`).
    static LAGGED_AT: Cell<Option<Instant>> = const { Cell::new(None) };
    /// When this backend last read `ready`'s dead rows, and whether they
    /// were at the threshold (`seek_from_floors`).
    static DEAD_ROWS: Cell<Option<(Instant, bool)>> = const { Cell::new(None) };
    /// Queues whose claims merge aging bands, as this backend last saw.
    static MERGING: RefCell<HashSet<String>> = RefCell::new(HashSet::new());
    static LAST_SWEEP: RefCell<HashMap<String, Swept>> = RefCell::new(HashMap::new());
}

row! {
    /// A claimed task, as `claim` returns it.
    pub struct Claimed {
        pub id: pgrx::Uuid,
        pub token: i64,
        pub payload: Jsonb,
        pub attempt: i32,
        pub execution_id: Option<pgrx::Uuid>,
        pub concurrency_key: Option<String>,
        pub kind: String,
    }
}

row! {
    /// Where a claimed task was in line: its key `(k1, k2, seq)` and band
    /// (`queue::floor`).
    struct Place {
        k1: f64,
        k2: f64,
        seq: i64,
        band: f64,
    }
}

/// Claims up to `batch` tasks of `queue` for `worker`, each under a lease of
/// `lease_secs` fenced by its token. Order: priority descending (or the
/// aging key), then fairness start tag, then enqueue sequence. Also promotes
/// due scheduled tasks and reaps a bounded number of expired leases of this
/// queue (whose executions hear of a dead letter through `hooks`), so
/// SQL-only users need no scheduler.
pub fn claim(
    name: &str,
    batch: i32,
    worker: &str,
    lease_secs: f64,
    hooks: &dyn ExecutionHooks,
) -> Vec<Claimed> {
    let mut swept = false;
    if sweep_due(name) {
        sweep(name, hooks);
        swept = true;
    }
    let mut rows = claim_once(name, batch, worker, lease_secs);
    if (rows.len() as i32) < batch && !swept && sweep(name, hooks) > 0 {
        rows.extend(claim_once(name, batch - rows.len() as i32, worker, lease_secs));
    }
    rows.sort_by(|a, b| {
        let (a, b) = (&a.tail, &b.tail);
        a.k1.total_cmp(&b.k1)
            .then(a.k2.total_cmp(&b.k2))
            .then(a.seq.cmp(&b.seq))
    });
    floor::claimed(
        name,
        rows.iter()
            .map(|r| (r.tail.band, (r.tail.k1, r.tail.k2, r.tail.seq))),
    );
    // Only fairness queues have start tags above 0; for them, move the
    // virtual time up to what was just claimed.
    if let Some(max_k2) = rows.iter().map(|r| r.tail.k2).reduce(f64::max)
        && max_k2 > 0.0
    {
        ADVANCE_VTIME.exec(&[name.into(), max_k2.into()]);
    }
    rows.into_iter().map(|r| r.head).collect()
}

/// A claimed task and its place in line.
type ClaimedRow = Split<Claimed, Place>;

fn claim_once(queue: &str, batch: i32, worker: &str, lease_secs: f64) -> Vec<ClaimedRow> {
    if !floor::enabled() {
        return claim_with(&CLAIMS[0], queue, batch, worker, lease_secs);
    }
    if !seek_from_floors() {
        return claim_with(&AT_HEAD, queue, batch, worker, lease_secs);
    }
    if !MERGING.with(|m| m.borrow().contains(queue)) {
        if let Some(rows) = claim_kept(queue, batch, worker, lease_secs) {
            return rows;
        }
        let mut rows = claim_with(&IN_BANDS, queue, batch, worker, lease_secs);
        if rows.len() as i32 == batch || !ages(queue) {
            return rows;
        }
        MERGING.with(|m| {
            let mut m = m.borrow_mut();
            if m.len() >= COUNTED_SWEEPS {
                m.clear();
            }
            m.insert(queue.to_owned());
        });
        rows.extend(claim_with(
            &CLAIMS[1],
            queue,
            batch - rows.len() as i32,
            worker,
            lease_secs,
        ));
        return rows;
    }
    let rows = claim_with(&CLAIMS[1], queue, batch, worker, lease_secs);
    // Rows, none of an aging band: the merge is likely over (a queue
    // switched off aging has claimed its old rows); the next claim tries
    // without it, and comes back here if it was not.
    if !rows.is_empty() && !rows.iter().any(|r| floor::is_aging(r.tail.band)) {
        MERGING.with(|m| m.borrow_mut().remove(queue));
    }
    rows
}

/// Whether claims seek from the floors: while the xmin horizon lags
/// `sheaf.claim_floors_at_lag` transactions or more behind, and for
/// `FLOORS_AFTER_LAG` after; and while `ready` counts
/// `sheaf.claim_floors_at_dead_rows` dead rows (read every
/// `DEAD_ROWS_EVERY`): at thousands of claims a second the entries between
/// two vacuums cost a seek from the head more than reading the floors does.
fn seek_from_floors() -> bool {
    let (at, at_dead) = (FLOORS_AT_LAG.get(), FLOORS_AT_DEAD_ROWS.get());
    if at == 0 || at_dead == 0 {
        return true;
    }
    // SAFETY: both read shared transaction state under its own locks. The
    // horizon is the one for shared catalogs, the oldest of all: a
    // snapshot held in another database counts too, which only makes the
    // floors come sooner.
    let lag = unsafe {
        let next = pg_sys::ReadNextFullTransactionId().value as u32;
        let horizon = pg_sys::GetOldestNonRemovableTransactionId(std::ptr::null_mut());
        next.wrapping_sub(horizon.into_inner())
    };
    if lag >= at as u32 {
        LAGGED_AT.set(Some(Instant::now()));
        return true;
    }
    if LAGGED_AT.get().is_some_and(|t| t.elapsed() < FLOORS_AFTER_LAG) {
        return true;
    }
    match DEAD_ROWS.get() {
        Some((read, many)) if read.elapsed() < DEAD_ROWS_EVERY => many,
        _ => {
            let many = ready_dead_rows() >= i64::from(at_dead);
            DEAD_ROWS.set(Some((Instant::now(), many)));
            many
        }
    }
}

/// `ready`'s dead rows as the cumulative statistics count them (0 if it
/// has no entry yet).
fn ready_dead_rows() -> i64 {
    // SAFETY: a catalog lookup by name in a transaction (the function's
    // search_path starts with sheaf's schema), then a builtin taking an oid
    // and returning an int8.
    unsafe {
        let ready = pg_sys::RelnameGetRelid(c"ready".as_ptr());
        if ready == pg_sys::InvalidOid {
            return 0;
        }
        direct_function_call::<i64>(pg_sys::pg_stat_get_dead_tuples, &[ready.into_datum()]).unwrap_or(0)
    }
}

/// Whether `queue` has a floor of an aging band.
fn ages(queue: &str) -> bool {
    AGES.one_value(&[queue.into()], "reading a queue's floors")
}

/// The claim from the floors this backend keeps (`KEPT`), if it keeps
/// them or can read them now; `None` where the floors must be walked.
/// A claim from floors that no longer held takes nothing: it is tried
/// once more from floors read now, and if those moved too before it ran,
/// the floors are walked in the claim's own statement (an empty answer
/// would tell the worker the queue is empty).
fn claim_kept(queue: &str, batch: i32, worker: &str, lease_secs: f64) -> Option<Vec<ClaimedRow>> {
    for _ in 0..2 {
        let kept = floor::kept(queue)?;
        let rows = claim_kept_with(&kept, queue, batch, worker, lease_secs);
        if !rows.is_empty() || floor::confirm(queue, &kept) {
            return Some(rows);
        }
    }
    None
}

fn claim_kept_with(
    kept: &floor::Kept,
    queue: &str,
    batch: i32,
    worker: &str,
    lease_secs: f64,
) -> Vec<ClaimedRow> {
    claim_rows(
        &KEPT,
        &[
            queue.into(),
            (batch as i64).into(),
            worker.into(),
            lease_secs.into(),
            kept.bands.as_slice().into(),
            kept.k1.as_slice().into(),
            kept.k2.as_slice().into(),
            kept.seq.as_slice().into(),
            kept.generation.into(),
        ],
    )
}

fn claim_with(stmt: &Stmt, queue: &str, batch: i32, worker: &str, lease_secs: f64) -> Vec<ClaimedRow> {
    claim_rows(
        stmt,
        &[
            queue.into(),
            (batch as i64).into(),
            worker.into(),
            lease_secs.into(),
        ],
    )
}

fn claim_rows(stmt: &Stmt, args: &[pgrx::datum::DatumWithOid<'_>]) -> Vec<ClaimedRow> {
    stmt.all(args, "reading a claimed task")
}

fn sweep_due(queue: &str) -> bool {
    LAST_SWEEP.with(|last| {
        last.borrow()
            .get(queue)
            .is_none_or(|s| now().saturating_duration_since(s.at) >= SWEEP_EVERY)
    })
}

/// The sweeps' clock: the monotonic one, which a test may stop and move
/// (`tests::StoppedClock`) so that what it checks does not hang on how
/// fast the machine is.
fn now() -> Instant {
    #[cfg(any(test, feature = "pg_test"))]
    if let Some(t) = tests::STOPPED_AT.get() {
        return t;
    }
    Instant::now()
}

/// Seconds since the epoch, by this host's clock (the server's: the
/// extension runs in it).
fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

row! {
    /// Whether a queue has due scheduled tasks, and expired leases.
    struct Probe {
        due: bool,
        expired: bool,
    }
}

/// Promotes due scheduled tasks and reaps expired leases of one queue;
/// returns how many tasks became claimable or waiting. Reads the heads
/// whole or from the last sweep's window (`SWEEP_WHOLE_SHARE`).
fn sweep(queue: &str, hooks: &dyn ExecutionHooks) -> i64 {
    let began = now();
    let began_wall = epoch_now();
    let last = LAST_SWEEP.with(|l| l.borrow().get(queue).copied());
    let since = last.and_then(|s| {
        let whole_due =
            now().saturating_duration_since(s.whole_at) >= SWEEP_EVERY.max(s.whole_cost * SWEEP_WHOLE_SHARE);
        s.window_from.filter(|_| !whole_due)
    });
    let Probe { due, expired } =
        SWEEP_PROBE[since.is_some() as usize].one(&[queue.into(), since.into()], "probing for due tasks");
    let probe_cost = now().saturating_duration_since(began);
    let promoted = if due {
        promote::due(queue, SWEEP_PROMOTE, since)
    } else {
        0
    };
    let reaped = if expired {
        lease::reap_queue(queue, SWEEP_REAP, hooks, since)
    } else {
        0
    };
    let stopped_at_bounds = promoted >= SWEEP_PROMOTE || reaped >= SWEEP_REAP;
    let swept = Swept {
        at: began,
        whole_at: if since.is_none() {
            began
        } else {
            last.map_or(began, |s| s.whole_at)
        },
        whole_cost: if since.is_none() {
            probe_cost
        } else {
            last.map_or(probe_cost, |s| s.whole_cost)
        },
        window_from: match (stopped_at_bounds, since) {
            (false, _) => Some(began_wall - SWEEP_SLACK),
            (true, since) => since,
        },
    };
    LAST_SWEEP.with(|l| {
        let mut l = l.borrow_mut();
        if l.len() >= COUNTED_SWEEPS && !l.contains_key(queue) {
            l.clear();
        }
        l.insert(queue.to_owned(), swept);
    });
    promoted + reaped
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use std::cell::Cell;
    use std::time::{Duration, Instant};

    use crate::base::rows::row;
    use crate::testing::{claim, complete, count, enqueue, init, ns, one};
    use pgrx::prelude::*;
    use serde_json::json;

    thread_local! {
        /// Where the sweeps' clock stands while a test holds it (`now`).
        pub static STOPPED_AT: Cell<Option<Instant>> = const { Cell::new(None) };
    }

    /// Stops the sweeps' clock until dropped; `advance` moves it.
    struct StoppedClock;

    impl StoppedClock {
        fn stop() -> StoppedClock {
            STOPPED_AT.set(Some(Instant::now()));
            StoppedClock
        }

        fn advance(&self, by: Duration) {
            STOPPED_AT.set(STOPPED_AT.get().map(|t| t + by));
        }
    }

    impl Drop for StoppedClock {
        fn drop(&mut self) {
            STOPPED_AT.set(None);
        }
    }

    #[pg_test]
    fn priority_first_then_enqueue_order() {
        init();
        for (n, p) in [(0, 0), (1, 5), (2, 0), (3, 5), (4, 1)] {
            enqueue("q", json!({"n": n}), json!({"priority": p}));
        }
        assert_eq!(ns(&claim("q", 10)), vec![1, 3, 4, 0, 2]);
        assert!(claim("q", 10).is_empty());
    }

    #[pg_test]
    fn a_batch_keeps_its_order_across_claims() {
        init();
        Spi::run(
            "SELECT sheaf.enqueue_batch('q', array_agg(jsonb_build_object('n', i) ORDER BY i)) \
             FROM generate_series(1, 50) i",
        )
        .expect("batch");
        let first = claim("q", 20);
        let rest = claim("q", 100);
        let all: Vec<i64> = ns(&first).into_iter().chain(ns(&rest)).collect();
        assert_eq!(all, (1..=50).collect::<Vec<_>>());
        let attempts = count("SELECT min(attempts)::bigint FROM sheaf.tasks WHERE state = 'running'");
        assert_eq!(attempts, 1);
    }

    /// Payloads are the caller's data: they come back exactly as stored, with
    /// no float rounding of numbers and no change of scale.
    #[pg_test]
    fn payloads_come_back_exactly() {
        init();
        let doc = r#"{"n": 12345678901234567890123.000000000001, "x": 1.50, "e": 1e-20, "s": "é\t"}"#;
        Spi::run_with_args("SELECT sheaf.enqueue('q', $1::jsonb)", &[doc.into()]).expect("enqueue");
        Spi::run_with_args(
            "SELECT sheaf.enqueue_batch('q', ARRAY[$1::jsonb, '[]'])",
            &[doc.into()],
        )
        .expect("enqueue_batch");
        let same = Spi::get_one_with_args::<i64>(
            "SELECT count(*) FILTER (WHERE payload::text = $1::jsonb::text) FROM sheaf.claim('q', 'w', 10)",
            &[doc.into()],
        )
        .expect("claim");
        assert_eq!(same, Some(2));
    }

    #[pg_test]
    fn an_unknown_queue_claims_nothing() {
        init();
        assert!(claim("nobody-enqueued-here", 5).is_empty());
    }

    #[pg_test]
    fn a_future_task_is_never_claimed_early() {
        init();
        let clock = StoppedClock::stop();
        enqueue("q", json!({"n": 1}), json!({"run_at": "2999-01-01T00:00:00Z"}));
        enqueue("q", json!({"n": 2}), json!({}));
        assert_eq!(ns(&claim("q", 10)), vec![2]);
        assert!(claim("q", 10).is_empty());
        assert_eq!(count("SELECT scheduled FROM sheaf.queue_stats('q')"), 1);
        // Time passes: the task comes due, and a later claim promotes it.
        // Due by this transaction's now(), which due-ness reads; and a
        // second later on the sweeps' clock, so that the claim's sweep reads
        // the heads whole: a windowed sweep follows the wall clock, which a
        // loaded machine leaves seconds ahead of a test transaction's now().
        Spi::run("UPDATE sheaf.tasks SET run_at = now() - interval '1 second'").expect("time passes");
        clock.advance(Duration::from_millis(1100));
        let got = claim("q", 10);
        assert_eq!(ns(&got), vec![1]);
    }

    /// Between two whole reads of the heads (`SWEEP_WHOLE_SHARE`), a sweep
    /// reads only what came due or expired since the last sweep; what came
    /// due earlier but was written later waits for the next whole read.
    #[pg_test]
    fn a_sweep_reads_its_window_and_the_whole_heads_every_second() {
        init();
        // A whole read costs nothing on a stopped clock, so the next one
        // is due a second later however slow the machine is.
        let clock = StoppedClock::stop();
        enqueue(
            "q",
            json!({"n": 1}),
            json!({"run_at": "2999-01-01T00:00:00Z", "max_attempts": 5}),
        );
        assert!(claim("q", 10).is_empty(), "a whole read: nothing due");
        // Due an hour ago, but written only now (a late writer).
        Spi::run("UPDATE sheaf.tasks SET run_at = now() - interval '1 hour'").expect("due");
        assert!(claim("q", 10).is_empty(), "before the window");
        clock.advance(Duration::from_millis(1100));
        let first = claim("q", 10);
        assert_eq!(ns(&first), vec![1], "the next whole read");
        // The same for a lease that expired an hour ago.
        Spi::run("UPDATE sheaf.tasks SET lease_expires_at = now() - interval '1 hour'").expect("expired");
        assert!(claim("q", 10).is_empty(), "before the window");
        clock.advance(Duration::from_millis(1100));
        let again = claim("q", 10);
        assert_eq!(ns(&again), vec![1], "reaped by the next whole read");
        assert_ne!(again[0].token, first[0].token, "under a new token");
    }

    #[pg_test]
    fn aging_lets_an_old_low_priority_task_overtake() {
        init();
        let old = enqueue("q", json!({"n": 1}), json!({"priority": 0}));
        enqueue("q", json!({"n": 2}), json!({"priority": 1}));
        Spi::run_with_args(
            "UPDATE sheaf.tasks SET enqueued_at = now() - interval '2 minutes' WHERE id = $1",
            &[old.into()],
        )
        .expect("age it");
        // Re-keying on the switch to aging: 120 s of age beats 1 priority at 60 s per step.
        Spi::run("SELECT sheaf.configure_queue('q', '{\"aging_secs\": 60}')").expect("configure");
        assert_eq!(ns(&claim("q", 10)), vec![1, 2]);
    }

    #[pg_test]
    fn aging_off_restores_priority_order() {
        init();
        Spi::run("SELECT sheaf.configure_queue('q', '{\"aging_secs\": 60}')").expect("configure");
        let old = enqueue("q", json!({"n": 1}), json!({"priority": 0}));
        enqueue("q", json!({"n": 2}), json!({"priority": 1}));
        Spi::run_with_args(
            "UPDATE sheaf.tasks SET enqueued_at = now() - interval '2 minutes' WHERE id = $1",
            &[old.into()],
        )
        .expect("age it");
        Spi::run("SELECT sheaf.configure_queue('q', '{\"aging_secs\": null}')").expect("configure");
        assert_eq!(ns(&claim("q", 10)), vec![2, 1]);
    }

    /// The SQL aging key is the formula sheaf-core proves orders correctly.
    #[pg_test]
    fn ready_k1_is_the_core_ordering_key() {
        use sheaf_core::ordering::{Mode, primary_key};
        for (priority, secs, aging) in [
            (0, 0.0, None),
            (7, 10.5, None),
            (-3, 1e9, Some(60)),
            (4, 1.7e9, Some(3600)),
        ] {
            let got = Spi::get_one_with_args::<f64>(
                "SELECT sheaf.ready_k1($1, to_timestamp($2), $3)",
                &[priority.into(), secs.into(), aging.into()],
            )
            .expect("k1")
            .expect("not null");
            let mode = match aging {
                None => Mode::Priority,
                Some(s) => Mode::Aging { secs: s as u32 },
            };
            let want = primary_key(mode, priority, secs);
            assert!(
                (got - want).abs() < 1e-6,
                "priority {priority} secs {secs}: {got} vs {want}"
            );
        }
    }

    /// Weights 1 and 3, both backlogged: every window of 8 claims gives
    /// each key its share within one task.
    #[pg_test]
    fn fairness_gives_each_key_its_weighted_share() {
        init();
        Spi::run("SELECT sheaf.configure_queue('q', '{\"fairness\": true}')").expect("configure");
        Spi::run(
            "SELECT sheaf.enqueue_batch('q', array_agg(jsonb_build_object('n', 0) ORDER BY i), \
                                         '{\"fairness_key\": \"a\", \"fairness_weight\": 1}') \
             FROM generate_series(1, 40) i",
        )
        .expect("a");
        Spi::run(
            "SELECT sheaf.enqueue_batch('q', array_agg(jsonb_build_object('n', 1) ORDER BY i), \
                                         '{\"fairness_key\": \"b\", \"fairness_weight\": 3}') \
             FROM generate_series(1, 40) i",
        )
        .expect("b");
        let order = ns(&claim("q", 40));
        assert_eq!(order.len(), 40);
        for window in order.windows(8) {
            let b = window.iter().filter(|&&k| k == 1).count() as i64;
            assert!((b - 6).abs() <= 1, "window {window:?} gives b {b} of 8, share 6");
        }
    }

    #[pg_test(
        error = "queue \"q\" has ready tasks: fairness can only be switched on or off while it has none"
    )]
    fn fairness_cannot_be_switched_with_ready_tasks() {
        init();
        enqueue("q", json!({"n": 1}), json!({}));
        Spi::run("SELECT sheaf.configure_queue('q', '{\"fairness\": true}')").expect("refused");
    }

    #[pg_test]
    fn idempotency_key_returns_the_unfinished_task() {
        init();
        let a = enqueue("q", json!({"n": 1}), json!({"idempotency_key": "once"}));
        let b = enqueue("q", json!({"n": 2}), json!({"idempotency_key": "once"}));
        assert_eq!(a, b);
        assert_eq!(count("SELECT count(*) FROM sheaf.tasks"), 1);
        let holder = || Spi::get_one::<pgrx::Uuid>("SELECT sheaf.find_task('q', 'once')").expect("find_task");
        assert_eq!(holder(), Some(a), "find_task names the holder");
        let claimed = claim("q", 1);
        complete(&claimed[0]);
        assert_eq!(holder(), None, "a completed task holds no key");
        let c = enqueue("q", json!({"n": 3}), json!({"idempotency_key": "once"}));
        assert_ne!(a, c);
    }

    #[pg_test]
    fn ids_are_shard_prefixed() {
        init();
        let id = enqueue("q", json!({}), json!({}));
        assert_eq!(sheaf_core::id::shard_of(id.as_bytes()), 1);
    }

    #[pg_test]
    fn claimed_tasks_carry_their_fields() {
        init();
        Spi::run(
            "INSERT INTO sheaf.executions (id, workflow_name, workflow_id, state, seq, queue, input) \
             VALUES ('00010000-0000-8000-8000-000000000001', 'wf', 'w1', 'RUNNING', 1, 'q', '{}')",
        )
        .expect("execution");
        enqueue(
            "q",
            json!({"n": 1}),
            json!({"kind": "workflow", "concurrency_key": "k", "execution_id": "00010000-0000-8000-8000-000000000001"}),
        );
        row! {
            struct Fields {
                attempt: i32,
                execution_id: Option<pgrx::Uuid>,
                concurrency_key: Option<String>,
                kind: String,
            }
        }
        let task: Fields = one(
            "SELECT attempt, execution_id, concurrency_key, kind FROM sheaf.claim('q', 'w')",
            &[],
        );
        assert_eq!(task.attempt, 1);
        assert_eq!(
            task.execution_id.map(|e| e.to_string()),
            Some("00010000-0000-8000-8000-000000000001".into())
        );
        assert_eq!(task.concurrency_key.as_deref(), Some("k"));
        assert_eq!(task.kind, "workflow");
    }
}
