//! Rate limits and start throttles on this shard: buckets (one timestamp
//! each, `sheaf_core::rate`), their lines, and pacing overrides.
//!
//! A unit of work (a rate-limited task, a throttled start's first workflow
//! task) never waits in the ready set and the claim never looks at a
//! bucket. At enqueue, its bucket gives it an admission time: now (it goes
//! in as usual), or later within `LOOKAHEAD` (it goes in `scheduled` at that
//! time, and the due sweep readies it then, through a cap if it has one).
//! Beyond the lookahead it waits in its bucket's line, `scheduled` at
//! `infinity`, and `sweep` (run by `maintain`) gives the line's head their
//! admission times as they come within the lookahead, in line order. So a
//! pace change (an override, a new declaration) applies to everything more
//! than `LOOKAHEAD` ahead.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use sheaf_core::rate::{Pace, RateLimit};

use crate::base::catalog::{self, Feature};
use crate::base::clock::{self, from_us};
use crate::base::errors::{bad_argument, not_ready};
use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;
use crate::base::rows::row;

/// How far ahead a unit's admission is fixed. `maintain` must run more
/// often than this for a bucket with a line to keep its pace (every worker
/// runs it every 5 s).
pub const LOOKAHEAD_US: i64 = 30_000_000;

/// Whether this catalog has rate limits (not a 0.1.0 catalog).
pub fn enabled() -> bool {
    catalog::has(Feature::RateLimits)
}

fn require_enabled() {
    if !enabled() {
        not_ready("this shard's schema has no rate limits: ALTER EXTENSION sheaf UPDATE first");
    }
}

const DECLARE: Stmt = Stmt::write(
    "INSERT INTO rate_limits (name, spec) VALUES ($1, $2) \
     ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, updated_at = now()",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::JSONBOID],
);
const SPEC: Stmt = Stmt::read(
    "SELECT spec FROM rate_limits WHERE name = $1",
    &[PgBuiltInOids::TEXTOID],
);
const OVERRIDE: Stmt = Stmt::read(
    "SELECT rate, extract(epoch from period)::float8 FROM rate_overrides WHERE name = $1 AND expires_at > now()",
    &[PgBuiltInOids::TEXTOID],
);
const SET_OVERRIDE: Stmt = Stmt::write(
    "INSERT INTO rate_overrides (name, rate, period, expires_at) VALUES ($1, $2, make_interval(secs => $3), $4) \
     ON CONFLICT (name) DO UPDATE SET rate = excluded.rate, period = excluded.period, \
                                      expires_at = excluded.expires_at, created_at = now()",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::TIMESTAMPTZOID,
    ],
);
const CLEAR_OVERRIDE: Stmt = Stmt::write(
    "DELETE FROM rate_overrides WHERE name = $1 RETURNING expires_at > now()",
    &[PgBuiltInOids::TEXTOID],
);
const NEW_BUCKET: Stmt = Stmt::write(
    "INSERT INTO rate_buckets (name, key, tat) VALUES ($1, $2, '-infinity') ON CONFLICT (name, key) DO NOTHING",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::TEXTOID],
);
const LOCK_BUCKET: Stmt = Stmt::write(
    "SELECT tat, line_at IS NOT NULL FROM rate_buckets WHERE name = $1 AND key = $2 FOR UPDATE",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::TEXTOID],
);
const SET_BUCKET: Stmt = Stmt::write(
    "UPDATE rate_buckets SET tat = $3, line_at = $4 WHERE name = $1 AND key = $2",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TIMESTAMPTZOID,
        PgBuiltInOids::TIMESTAMPTZOID,
    ],
);
const PUSH_LINE: Stmt = Stmt::write(
    "INSERT INTO rate_waiting (name, key, seq, task_id) SELECT $1, $2, nextval('rate_seq'), id \
     FROM unnest($3::uuid[]) WITH ORDINALITY AS u(id, n) ORDER BY n",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::UUIDARRAYOID,
    ],
);
const DUE_BUCKETS: Stmt = Stmt::write(
    "SELECT name, key, tat FROM rate_buckets WHERE line_at <= now() + make_interval(secs => $1) \
     ORDER BY line_at LIMIT $2 FOR UPDATE SKIP LOCKED",
    &[PgBuiltInOids::FLOAT8OID, PgBuiltInOids::INT8OID],
);
const HEAD: Stmt = Stmt::write(
    "SELECT seq, task_id FROM rate_waiting WHERE name = $1 AND key = $2 ORDER BY seq LIMIT $3",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::INT8OID,
    ],
);
// Of a line's head, those still waiting that no one else holds (a task
// being deleted or parked is passed over this time, never waited for).
const TAKE_LIVE: Stmt = Stmt::write(
    "SELECT id FROM tasks WHERE id = ANY($1) AND run_at = 'infinity' ORDER BY id FOR UPDATE SKIP LOCKED",
    &[PgBuiltInOids::UUIDARRAYOID],
);
const EXISTING: Stmt = Stmt::write(
    "SELECT id FROM tasks WHERE id = ANY($1) AND run_at = 'infinity'",
    &[PgBuiltInOids::UUIDARRAYOID],
);
const POP: Stmt = Stmt::write(
    "DELETE FROM rate_waiting WHERE name = $1 AND key = $2 AND seq = ANY($3)",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::INT8ARRAYOID,
    ],
);
const TIME: Stmt = Stmt::write(
    "UPDATE tasks t SET run_at = u.at FROM unnest($1::uuid[], $2::timestamptz[]) AS u(id, at) WHERE t.id = u.id",
    &[PgBuiltInOids::UUIDARRAYOID, PgBuiltInOids::TIMESTAMPTZARRAYOID],
);
const PRUNE_BUCKETS: Stmt = Stmt::write(
    "WITH old AS (SELECT name, key FROM rate_buckets WHERE line_at IS NULL AND tat < now() LIMIT $1), \
          gone AS (DELETE FROM rate_buckets b USING old WHERE b.name = old.name AND b.key = old.key RETURNING 1) \
     SELECT count(*) FROM gone",
    &[PgBuiltInOids::INT8OID],
);
const PRUNE_OVERRIDES: Stmt = Stmt::write(
    "WITH gone AS (DELETE FROM rate_overrides WHERE expires_at <= now() RETURNING 1) SELECT count(*) FROM gone",
    &[],
);
const LIST: Stmt = Stmt::read(
    "SELECT l.name, l.spec, o.rate, o.period, o.expires_at, \
            (SELECT count(*) FROM rate_buckets b WHERE b.name = l.name), \
            (SELECT count(*) FROM rate_waiting w WHERE w.name = l.name) \
     FROM rate_limits l LEFT JOIN rate_overrides o ON o.name = l.name AND o.expires_at > now() ORDER BY l.name",
    &[],
);

/// A rate limit's name: 1 to 256 bytes, not `workflow:` (throttles' names).
pub fn check_name<'a>(name: Option<&'a str>, arg: &str) -> &'a str {
    let name = crate::base::args::required(name, arg);
    if name.is_empty() || name.len() > 256 {
        bad_argument(arg, format!("must be 1 to 256 bytes, got {}", name.len()));
    }
    name
}

/// Declares (or redeclares) rate limit `name`; returns the stored spec.
pub fn declare(name: &str, spec: &serde_json::Value) -> serde_json::Value {
    require_enabled();
    if name.starts_with("workflow:") {
        bad_argument(
            "name",
            "may not start with \"workflow:\" (a start throttle's name: declare_workflow's policy.throttle)",
        );
    }
    let limit = RateLimit::parse(spec).unwrap_or_else(|e| bad_argument(&e.option, e.why));
    DECLARE.exec(&[name.into(), Jsonb::from_value(limit.normalized.clone()).into()]);
    limit.normalized
}

/// Rate limit `name` as declared here, if it is.
pub fn declared(name: &str) -> Option<RateLimit> {
    if !enabled() {
        return None;
    }
    let spec: Option<pgrx::JsonB> = SPEC.value(&[name.into()], "reading a rate limit");
    spec.and_then(|s| RateLimit::parse(&s.0).ok())
}

/// `pace` with `name`'s live override applied (its rate and period; the
/// burst stays).
pub fn effective(name: &str, pace: Pace) -> Pace {
    row! {
        /// A live override: its rate, and its period in seconds.
        struct Override {
            rate: f64,
            secs: f64,
        }
    }
    let o: Option<Override> = OVERRIDE.first(&[name.into()], "reading an override");
    match o {
        Some(Override { rate, secs }) => Pace::new(
            "override",
            rate,
            std::time::Duration::from_secs_f64(secs),
            pace.burst,
        )
        .unwrap_or(pace),
        None => pace,
    }
}

/// Sets `name`'s override until `expires_at`. The caller checked that
/// `name` names one bucket (an unkeyed limit or throttle).
pub fn set_override(name: &str, pace: Pace, expires_at: TimestampWithTimeZone) {
    require_enabled();
    SET_OVERRIDE.exec(&[
        name.into(),
        pace.rate.into(),
        pace.period.as_secs_f64().into(),
        expires_at.into(),
    ]);
}

/// Removes `name`'s override; whether a live one was removed.
pub fn clear_override(name: &str) -> bool {
    require_enabled();
    CLEAR_OVERRIDE
        .value::<bool>(&[name.into()], "clearing an override")
        .unwrap_or(false)
}

/// When a unit is admitted: at this time (maybe now), or later, from the
/// bucket's line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    At(i64),
    Line,
}

fn lock_bucket(name: &str, key: &str) -> (i64, bool) {
    row! {
        /// A bucket's theoretical arrival time, and whether it has a line.
        struct Bucket {
            tat: TimestampWithTimeZone,
            lined: bool,
        }
    }
    // A full bucket `prune` deletes between the insert and the lock is
    // inserted again (a full bucket and a fresh one are the same).
    for _ in 0..3 {
        NEW_BUCKET.exec(&[name.into(), key.into()]);
        let row: Option<Bucket> = LOCK_BUCKET.first(&[name.into(), key.into()], "locking a bucket");
        if let Some(Bucket { tat, lined }) = row {
            return (clock::to_us(tat), lined);
        }
    }
    crate::base::errors::internal("a bucket row kept vanishing under its lock")
}

/// Admission times for `arrivals` (each unit's earliest time, in order) in
/// bucket (`name`, `key`) paced `pace`, taking the bucket's tokens. Once a
/// unit goes to the line, every later one does: order within a bucket is
/// kept.
pub fn reserve(name: &str, key: &str, pace: Pace, arrivals: &[i64]) -> Vec<Admission> {
    require_enabled();
    let (mut tat, mut lined) = lock_bucket(name, key);
    let now = clock::now_us();
    let out = arrivals
        .iter()
        .map(|&arrival| {
            if lined {
                return Admission::Line;
            }
            let (at, next) = pace.admit(tat, arrival.max(now));
            if at > now + LOOKAHEAD_US {
                lined = true;
                Admission::Line
            } else {
                tat = next;
                Admission::At(at)
            }
        })
        .collect();
    let line_at = lined.then(|| from_us(pace.next_at(tat)));
    SET_BUCKET.exec(&[name.into(), key.into(), from_us(tat).into(), line_at.into()]);
    out
}

/// Puts tasks at the end of bucket (`name`, `key`)'s line, in order (the
/// caller reserved them `Line`, so the bucket is locked and marked lined).
pub fn line(name: &str, key: &str, task_ids: &[pgrx::Uuid]) {
    if !task_ids.is_empty() {
        PUSH_LINE.exec(&[name.into(), key.into(), task_ids.to_vec().into()]);
    }
}

/// Gives the heads of up to `max_buckets` lines whose next admission is
/// within the lookahead their admission times (up to `max_units` units in
/// all); returns how many were timed. `pace_of` is each bucket's current
/// pace (`None`: no longer declared, so its line is let through now).
pub fn sweep(max_buckets: i64, max_units: i64, pace_of: &dyn Fn(&str) -> Option<Pace>) -> i64 {
    if !enabled() {
        return 0;
    }
    row! {
        /// A bucket whose line is due.
        struct DueBucket {
            name: String,
            key: String,
            tat: TimestampWithTimeZone,
        }
    }
    let due: Vec<DueBucket> = DUE_BUCKETS.all(
        &[(LOOKAHEAD_US as f64 / 1e6).into(), max_buckets.into()],
        "reading due lines",
    );
    let now = clock::now_us();
    let mut timed = 0;
    for DueBucket { name, key, tat } in due {
        if timed >= max_units {
            break;
        }
        let pace = pace_of(&name);
        timed += drain(&name, &key, clock::to_us(tat), pace, now, max_units - timed);
    }
    timed
}

/// Times the head of one locked bucket's line; returns how many it timed.
fn drain(name: &str, key: &str, mut tat: i64, pace: Option<Pace>, now: i64, max: i64) -> i64 {
    // How many the lookahead has room for (all of them for a limit gone).
    let room = match pace {
        None => max,
        Some(p) => {
            let (mut t, mut n) = (tat, 0);
            while n < max {
                let (at, next) = p.admit(t, now);
                if at > now + LOOKAHEAD_US {
                    break;
                }
                (t, n) = (next, n + 1);
            }
            n
        }
    };
    let head: Vec<Waiting> = HEAD.all(&[name.into(), key.into(), room.into()], "reading a line");
    let ids: Vec<pgrx::Uuid> = head.iter().map(|h| h.task_id).collect();
    let take =
        |stmt: &Stmt| -> Vec<pgrx::Uuid> { stmt.values(&[ids.clone().into()], "reading a line's tasks") };
    let live = take(&TAKE_LIVE);
    let existing = take(&EXISTING);
    let (mut popped, mut timed_ids, mut times) = (Vec::new(), Vec::new(), Vec::new());
    for Waiting { seq, task_id: id } in &head {
        if live.contains(id) {
            let at = match pace {
                Some(p) => {
                    let (at, next) = p.admit(tat, now);
                    tat = next;
                    at
                }
                None => now,
            };
            timed_ids.push(*id);
            times.push(from_us(at));
        } else if existing.contains(id) {
            // Held by someone else: the line waits for it, in order.
            break;
        }
        // Gone (done, cancelled, its run ended) or timed: off the line.
        popped.push(*seq);
    }
    POP.exec(&[name.into(), key.into(), popped.into()]);
    let n = timed_ids.len() as i64;
    if n > 0 {
        // Rows in id order (`base::locks`): they are locked already.
        let mut pairs: Vec<(pgrx::Uuid, TimestampWithTimeZone)> = timed_ids.into_iter().zip(times).collect();
        pairs.sort_by_key(|p| *p.0.as_bytes());
        let (ids, ats): (Vec<pgrx::Uuid>, Vec<TimestampWithTimeZone>) = pairs.into_iter().unzip();
        TIME.exec(&[ids.into(), ats.into()]);
    }
    // The bucket's `tat`, and when its line (if any is left) is next due.
    let left = HEAD
        .first::<Waiting>(&[name.into(), key.into(), 1i64.into()], "reading a line")
        .is_some();
    let line_at = left.then(|| from_us(pace.map_or(now, |p| p.next_at(tat))));
    SET_BUCKET.exec(&[name.into(), key.into(), from_us(tat).into(), line_at.into()]);
    n
}

/// Deletes up to `max` buckets that are full and have no line (a fresh
/// bucket is the same), and expired overrides; returns how many buckets.
pub fn prune(max: i64) -> i64 {
    if !enabled() {
        return 0;
    }
    PRUNE_OVERRIDES.exec(&[]);
    PRUNE_BUCKETS.one_value(&[max.into()], "pruning buckets")
}

row! {
    /// A unit waiting in a bucket's line.
    struct Waiting {
        seq: i64,
        task_id: pgrx::Uuid,
    }
}

row! {
    /// A rate limit as `rate_limits()` lists it: its spec, its live
    /// override, its buckets and waiting units.
    pub struct Listed {
        pub name: String,
        pub spec: pgrx::JsonB,
        pub override_rate: Option<f64>,
        pub override_period: Option<pgrx::datum::Interval>,
        pub override_expires_at: Option<TimestampWithTimeZone>,
        pub buckets: i64,
        pub waiting: i64,
    }
}

/// This shard's rate limits, with their live overrides, buckets and
/// waiting units.
pub fn list() -> Vec<Listed> {
    require_enabled();
    LIST.all(&[], "listing rate limits")
}
