//! The durable FIFO mutex: at most one holder per key, a FIFO waiting line,
//! a lease so a crashed holder's lock passes on, and a fencing token so a
//! holder that lost its lease cannot release or renew what is no longer its.
//!
//! Every operation on a key serializes on a transaction-scoped advisory lock
//! of the key, then reads the key's rows with a fresh snapshot. A grant to a
//! waiter sends `NOTIFY sheaf_mutex` with the new holder's id as payload;
//! the waiter learns its token by acquiring again.
//!
//! A waiter holds its place for a third of the lease it asked for, from each
//! acquire: a waiter whose process died stops asking, its place lapses, and
//! each hand-over (and `mutex_reclaim`) deletes lapsed waiters instead of
//! granting them the lock. One that asks again after its place lapsed joins
//! at the back. A hand-over grants the waiter the lock for that third too,
//! and its next acquire picks the grant up and starts the full lease, so a
//! waiter that died just before its turn holds up the line for a third of a
//! lease, not a whole one.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

use crate::base::catalog::{self, Feature};
use crate::base::errors::{internal, not_mutex_holder};
use crate::base::locks::{self, Class};
use crate::base::plans::Stmt;
use crate::base::rows::row;

/// The share of its lease a waiter's place lasts without asking again, and
/// a hand-over's grant lasts until the waiter picks it up: the interval at
/// which the driver renews a held lease.
const PLACE_SHARE: f64 = 1.0 / 3.0;

const HOLDER: Stmt = Stmt::write(
    "SELECT holder, token, lease_expires_at <= now() FROM mutex_locks WHERE key = $1",
    &[PgBuiltInOids::TEXTOID],
);
const GRANT: Stmt = Stmt::write(
    "INSERT INTO mutex_locks (key, holder, token, lease_expires_at) \
     VALUES ($1, $2, nextval('fence_token'), now() + make_interval(secs => $3)) \
     ON CONFLICT (key) DO UPDATE SET holder = EXCLUDED.holder, token = EXCLUDED.token, \
        lease_expires_at = EXCLUDED.lease_expires_at, acquired_at = now() \
     RETURNING token",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::FLOAT8OID,
    ],
);
const FREE: Stmt = Stmt::write(
    "DELETE FROM mutex_locks WHERE key = $1",
    &[PgBuiltInOids::TEXTOID],
);
/// Lapsed waiters leave the line before a hand-over picks the next one.
const PRUNE_LINE: Stmt = Stmt::write(
    "DELETE FROM mutex_waiters WHERE key = $1 AND expires_at <= now()",
    &[PgBuiltInOids::TEXTOID],
);
const POP_WAITER: Stmt = Stmt::write(
    "DELETE FROM mutex_waiters WHERE key = $1 AND position = \
       (SELECT min(position) FROM mutex_waiters WHERE key = $1) \
     RETURNING owner, lease_secs",
    &[PgBuiltInOids::TEXTOID],
);
const LEAVE_LINE: Stmt = Stmt::write(
    "DELETE FROM mutex_waiters WHERE key = $1 AND owner = $2",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::UUIDOID],
);
/// Joins the line, or renews the place ($4 seconds from now): a waiter whose
/// place lapsed (not yet deleted) goes to the back, as if it had been.
const JOIN_LINE: Stmt = Stmt::write(
    "INSERT INTO mutex_waiters (key, owner, position, lease_secs, expires_at) \
     VALUES ($1, $2, nextval('mutex_seq'), $3, now() + make_interval(secs => $4)) \
     ON CONFLICT (key, owner) DO UPDATE SET lease_secs = EXCLUDED.lease_secs, \
        expires_at = EXCLUDED.expires_at, \
        position = CASE WHEN mutex_waiters.expires_at <= now() \
                        THEN EXCLUDED.position ELSE mutex_waiters.position END, \
        enqueued_at = CASE WHEN mutex_waiters.expires_at <= now() \
                           THEN now() ELSE mutex_waiters.enqueued_at END",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::FLOAT8OID,
    ],
);
/// The holder asking again: a grant handed over picked up, the lease starts
/// in full (never shortened).
const PICK_UP: Stmt = Stmt::write(
    "UPDATE mutex_locks SET lease_expires_at = \
       greatest(lease_expires_at, now() + make_interval(secs => $2)) WHERE key = $1",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::FLOAT8OID],
);
/// Lapsed waiters ahead do not count.
const PLACE_IN_LINE: Stmt = Stmt::write(
    "SELECT count(*)::int FROM mutex_waiters WHERE key = $1 AND expires_at > now() AND position <= \
       (SELECT position FROM mutex_waiters WHERE key = $1 AND owner = $2)",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::UUIDOID],
);
/// Keys with lapsed waiters, for `mutex_reclaim`. No index on `expires_at`:
/// every poll updates it, and an index would make each of those updates
/// write every index of the table (no HOT update).
const LAPSED: Stmt = Stmt::write(
    "SELECT DISTINCT key FROM \
       (SELECT key FROM mutex_waiters WHERE expires_at <= now() LIMIT $1) w",
    &[PgBuiltInOids::INT8OID],
);
const RENEW: Stmt = Stmt::write(
    "UPDATE mutex_locks SET lease_expires_at = now() + make_interval(secs => $4) \
     WHERE key = $1 AND holder = $2 AND token = $3 RETURNING lease_expires_at",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::FLOAT8OID,
    ],
);
const EXPIRED: Stmt = Stmt::write(
    "SELECT key FROM mutex_locks WHERE lease_expires_at <= now() ORDER BY lease_expires_at LIMIT $1",
    &[PgBuiltInOids::INT8OID],
);
const HELD_OR_AWAITED_BY: Stmt = Stmt::write(
    "SELECT key FROM mutex_locks WHERE holder = $1 UNION SELECT key FROM mutex_waiters WHERE owner = $1",
    &[PgBuiltInOids::UUIDOID],
);
const NOTIFY: Stmt = Stmt::write("SELECT pg_notify('sheaf_mutex', $1)", &[PgBuiltInOids::TEXTOID]);
const STATUS: Stmt = Stmt::read(
    "SELECT l.holder, l.token, l.lease_expires_at, \
            (SELECT count(*)::int FROM mutex_waiters w WHERE w.key = $1 AND w.expires_at > now()) \
     FROM (SELECT 1) one LEFT JOIN mutex_locks l ON l.key = $1",
    &[PgBuiltInOids::TEXTOID],
);

/// A page of keys after `$1`, by the primary key's index: a seek, then
/// `$2` rows, each with its live line counted on the line's index. Only
/// stored locks are listed: a key's line exists only while it has a lock
/// row (a free key is granted at once, and a hand-over that finds nobody
/// frees it), so no key waits unlisted.
const LIST: Stmt = Stmt::read(
    "SELECT l.key, l.holder, l.token, l.acquired_at, l.lease_expires_at, \
            (SELECT count(*)::int FROM mutex_waiters w WHERE w.key = l.key AND w.expires_at > now()) \
     FROM mutex_locks l WHERE l.key > $1 ORDER BY l.key LIMIT $2",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::INT8OID],
);

// The 0.1.0 catalog's lines, whose waiters have no lease: a shard runs this
// library on that catalog between installing the package and `ALTER
// EXTENSION sheaf UPDATE` (docs/operating/upgrading.md), and its calls must work.
const JOIN_LINE_0_1: Stmt = Stmt::write(
    "INSERT INTO mutex_waiters (key, owner, position, lease_secs) \
     VALUES ($1, $2, nextval('mutex_seq'), $3) \
     ON CONFLICT (key, owner) DO UPDATE SET lease_secs = EXCLUDED.lease_secs",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::FLOAT8OID,
    ],
);
const PLACE_IN_LINE_0_1: Stmt = Stmt::write(
    "SELECT count(*)::int FROM mutex_waiters WHERE key = $1 AND position <= \
       (SELECT position FROM mutex_waiters WHERE key = $1 AND owner = $2)",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::UUIDOID],
);
const STATUS_0_1: Stmt = Stmt::read(
    "SELECT l.holder, l.token, l.lease_expires_at, \
            (SELECT count(*)::int FROM mutex_waiters w WHERE w.key = $1) \
     FROM (SELECT 1) one LEFT JOIN mutex_locks l ON l.key = $1",
    &[PgBuiltInOids::TEXTOID],
);

/// Whether the catalog's waiters hold leases (0.2.0 on); a backend follows
/// an `ALTER EXTENSION sheaf UPDATE` from its next transaction on
/// (`base::catalog`).
fn waiter_leases() -> bool {
    catalog::has(Feature::WaiterLeases)
}

fn lock(key: &str) {
    locks::exclusive(Class::Mutex, key);
}

row! {
    /// A key's lock: who holds it, under which token, whether its lease ran out.
    struct Holder {
        holder: pgrx::Uuid,
        token: i64,
        expired: bool,
    }
}

row! {
    /// The first waiter, taken out of line.
    struct Waiter {
        owner: pgrx::Uuid,
        lease_secs: f64,
    }
}

fn holder(key: &str) -> Option<Holder> {
    HOLDER.first(&[key.into()], "reading a mutex")
}

fn grant(key: &str, owner: pgrx::Uuid, lease_secs: f64) -> i64 {
    LEAVE_LINE.exec(&[key.into(), owner.into()]);
    GRANT.one_value(&[key.into(), owner.into(), lease_secs.into()], "granting a mutex")
}

/// The key is free (released, or its lease expired): grants it to the first
/// waiter whose place has not lapsed, until it picks the grant up, or frees
/// it. Returns the new holder. The caller holds the key's lock.
fn hand_off(key: &str) -> Option<pgrx::Uuid> {
    let leases = waiter_leases();
    if leases {
        PRUNE_LINE.exec(&[key.into()]);
    }
    let next = POP_WAITER.first(&[key.into()], "popping a waiter");
    match next {
        Some(Waiter { owner, lease_secs }) => {
            let until_picked_up = if leases {
                lease_secs * PLACE_SHARE
            } else {
                lease_secs
            };
            grant(key, owner, until_picked_up);
            NOTIFY.exec(&[owner.to_string().into()]);
            Some(owner)
        }
        None => {
            FREE.exec(&[key.into()]);
            None
        }
    }
}

/// Acquires `key` for `owner`, or queues it. Granted: the fencing token and
/// position 0. Not granted: position in the FIFO line (1 = next); acquiring
/// again within a third of the lease keeps that place (and renews it) and
/// returns the grant once it comes; later, the place has lapsed and it joins
/// at the back. The holder acquiring again gets its grant back (same token)
/// and a lease of at least `lease_secs` from now. An expired holder's
/// lock passes on here too, as `mutex_reclaim` would pass it.
/// Returns (granted, token, position in line).
pub fn acquire(key: &str, owner: pgrx::Uuid, lease_secs: f64) -> (bool, Option<i64>, i32) {
    lock(key);
    let leases = waiter_leases();
    // At most two rounds: an expired lock passes on once, then is current.
    for _ in 0..2 {
        match holder(key) {
            Some(Holder {
                holder,
                token,
                expired: false,
            }) if holder == owner => {
                if leases {
                    PICK_UP.exec(&[key.into(), lease_secs.into()]);
                }
                return (true, Some(token), 0);
            }
            Some(Holder { expired: true, .. }) => {
                hand_off(key);
            }
            Some(_) => {
                let place = if leases {
                    let place_secs = lease_secs * PLACE_SHARE;
                    JOIN_LINE.exec(&[key.into(), owner.into(), lease_secs.into(), place_secs.into()]);
                    &PLACE_IN_LINE
                } else {
                    JOIN_LINE_0_1.exec(&[key.into(), owner.into(), lease_secs.into()]);
                    &PLACE_IN_LINE_0_1
                };
                let place = place.one_value(&[key.into(), owner.into()], "reading a place in line");
                return (false, None, place);
            }
            None => {
                let token = grant(key, owner, lease_secs);
                return (true, Some(token), 0);
            }
        }
    }
    // Under the key's lock an expired grant passes on once and the new
    // one is current: a third round is a bug.
    internal(format_args!(
        "acquiring mutex {key:?}: it changed hands twice under its lock"
    ))
}

/// Releases `key` held by `owner` under `token` and hands it to the next
/// waiter, returned (NULL if none). A non-holder or a stale token raises
/// 55P03 and changes nothing.
pub fn release(key: &str, owner: pgrx::Uuid, token: i64) -> Option<pgrx::Uuid> {
    lock(key);
    match holder(key) {
        Some(h) if h.holder == owner && h.token == token => hand_off(key),
        _ => not_mutex_holder(key, owner, token),
    }
}

/// Extends the lease of `key` held by `owner` under `token` to now + `lease`;
/// returns the new lease end. A non-holder or a stale token raises 55P03.
pub fn renew(key: &str, owner: pgrx::Uuid, token: i64, lease_secs: f64) -> TimestampWithTimeZone {
    lock(key);
    let renewed = RENEW.value(
        &[key.into(), owner.into(), token.into(), lease_secs.into()],
        "renewing a mutex",
    );
    renewed.unwrap_or_else(|| not_mutex_holder(key, owner, token))
}

/// Reclaims up to `max` expired locks, and deletes the lapsed waiters of up
/// to `max` lines; returns how many locks. Keys in order, so two sweeps never
/// take two keys' locks in opposite orders.
pub fn reclaim(max: i64) -> i64 {
    let leases = waiter_leases();
    let mut keys: Vec<String> = {
        let mut keys: Vec<String> = EXPIRED.values(&[max.into()], "reading expired mutexes");
        if leases {
            keys.extend(LAPSED.values::<String>(&[max.into()], "reading lapsed mutex waiters"));
        }
        keys
    };
    keys.sort();
    keys.dedup();
    let mut n = 0;
    for key in keys {
        lock(&key);
        if matches!(holder(&key), Some(Holder { expired: true, .. })) {
            hand_off(&key);
            n += 1;
        } else if leases {
            PRUNE_LINE.exec(&[key.as_str().into()]);
        }
    }
    n
}

/// `owner` gives up waiting for `key`: it leaves the line, and a lock it
/// holds (a grant handed to it that it never saw, as a rule) goes to the
/// next waiter, returned (NULL if none). Without it, a waiter that gave up
/// had to keep asking until its grant came, to hand it on at once.
pub fn leave(key: &str, owner: pgrx::Uuid) -> Option<pgrx::Uuid> {
    lock(key);
    LEAVE_LINE.exec(&[key.into(), owner.into()]);
    match holder(key) {
        Some(h) if h.holder == owner => hand_off(key),
        _ => None,
    }
}

/// Releases every lock `owner` holds and removes it from every waiting line
/// (an execution reaching a terminal state). Each key under its lock, keys
/// in order.
pub fn release_all(owner: pgrx::Uuid) {
    let mut keys: Vec<String> = HELD_OR_AWAITED_BY.values(&[owner.into()], "reading an owner's mutexes");
    keys.sort();
    for key in keys {
        lock(&key);
        LEAVE_LINE.exec(&[key.as_str().into(), owner.into()]);
        if matches!(holder(&key), Some(h) if h.holder == owner) {
            hand_off(&key);
        }
    }
}

row! {
    /// A key's lock as `mutex_status` shows it: holder, token and lease end
    /// (all `None` when free), and how many wait.
    pub struct Status {
        pub holder: Option<pgrx::Uuid>,
        pub token: Option<i64>,
        pub lease_expires_at: Option<TimestampWithTimeZone>,
        pub waiters: i32,
    }
}

/// A key's holder, token and lease end (NULL when free), and how many wait
/// (lapsed places not counted).
pub fn status(key: &str) -> Option<Status> {
    let stmt = if waiter_leases() { &STATUS } else { &STATUS_0_1 };
    stmt.first(&[key.into()], "reading a mutex")
}

row! {
    /// A stored lock as `list_mutexes` shows it. An expired lease not yet
    /// passed on still shows its holder (the next acquire of the key or
    /// `mutex_reclaim` passes it on).
    pub struct Listed {
        pub key: String,
        pub holder: pgrx::Uuid,
        pub token: i64,
        pub acquired_at: TimestampWithTimeZone,
        pub lease_expires_at: TimestampWithTimeZone,
        pub waiters: i32,
    }
}

/// The stored locks with a key after `after` (`None`: from the first), by
/// key, at most `max`; each with its live waiters counted (lapsed places
/// not counted, as `status`). Only a catalog with waiter leases has this
/// function.
pub fn list(after: Option<&str>, max: i64) -> Vec<Listed> {
    // Every key has at least one byte, so "" is before them all.
    LIST.all(&[after.unwrap_or("").into(), max.into()], "listing mutexes")
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::{init, one, values};
    use pgrx::prelude::*;

    row! {
        #[derive(Debug, PartialEq)]
        struct Acquired {
            granted: bool,
            token: Option<i64>,
            queue_position: i32,
        }
    }

    /// Not granted: waiting at `position` in the line.
    fn waiting_at(position: i32) -> Acquired {
        Acquired {
            granted: false,
            token: None,
            queue_position: position,
        }
    }

    fn acquire(owner: &str) -> Acquired {
        one(
            "SELECT granted, token, queue_position FROM sheaf.mutex_acquire('k', $1::uuid)",
            &[owner.into()],
        )
    }

    const A: &str = "00000000-0000-8000-8000-00000000000a";
    const B: &str = "00000000-0000-8000-8000-00000000000b";
    const C: &str = "00000000-0000-8000-8000-00000000000c";
    const D: &str = "00000000-0000-8000-8000-00000000000d";

    /// Lets `owner`'s place in line lapse, as if it stopped asking a lease ago.
    fn lapse(owner: &str) {
        Spi::run_with_args(
            "UPDATE sheaf.mutex_waiters SET expires_at = now() - interval '1 second' WHERE owner = $1::uuid",
            &[owner.into()],
        )
        .unwrap();
    }

    /// The line's owners, first to last, lapsed or not.
    fn line() -> Vec<String> {
        values(
            "SELECT owner::text FROM sheaf.mutex_waiters WHERE key = 'k' ORDER BY position",
            &[],
        )
    }

    fn waiting() -> Option<i32> {
        Spi::get_one::<i32>("SELECT waiters FROM sheaf.mutex_status('k')").unwrap()
    }

    #[pg_test]
    fn grants_go_in_fifo_order_and_a_waiter_keeps_its_place() {
        init();
        let a = acquire(A);
        assert!(a.granted);
        let token = a.token;
        assert_eq!(acquire(A).token, token, "the holder gets its grant back");
        assert_eq!(acquire(B), waiting_at(1));
        assert_eq!(acquire(C), waiting_at(2));
        assert_eq!(acquire(B), waiting_at(1), "acquiring again keeps the place");
        let next = Spi::get_one_with_args::<pgrx::Uuid>(
            "SELECT sheaf.mutex_release('k', $1::uuid, $2)",
            &[A.into(), token.into()],
        )
        .unwrap();
        assert_eq!(next.map(|u| u.to_string()).as_deref(), Some(B));
        let b = acquire(B);
        assert!(b.granted && b.token > token);
        assert_eq!(acquire(C), waiting_at(1));
    }

    #[pg_test]
    fn a_waiter_that_leaves_gives_up_its_place_and_an_unseen_grant() {
        init();
        let leave = |owner: &str| {
            Spi::get_one_with_args::<pgrx::Uuid>("SELECT sheaf.mutex_leave('k', $1::uuid)", &[owner.into()])
                .unwrap()
                .map(|u| u.to_string())
        };
        let token = acquire(A).token;
        acquire(B);
        acquire(C);
        acquire(D);
        assert_eq!(leave(C), None, "a waiter in the middle only leaves");
        assert_eq!(line(), [B, D]);
        Spi::run_with_args(
            "SELECT sheaf.mutex_release('k', $1::uuid, $2)",
            &[A.into(), token.into()],
        )
        .unwrap();
        assert_eq!(
            leave(B).as_deref(),
            Some(D),
            "the grant B never picked up goes straight to D"
        );
        assert!(acquire(D).granted);
        assert_eq!(
            leave(A),
            None,
            "an owner neither waiting nor holding changes nothing"
        );
        assert_eq!(waiting(), Some(0));
        assert_eq!(leave(D), None, "the last holder leaving frees the key");
        assert_eq!(
            Spi::get_one::<pgrx::Uuid>("SELECT holder FROM sheaf.mutex_status('k')").unwrap(),
            None
        );
    }

    #[pg_test(
        error = "00000000-0000-8000-8000-00000000000a does not hold mutex \"k\" under token 1: its lease was lost (reclaimed and granted again), or it never held it; nothing changed"
    )]
    fn a_release_by_a_non_holder_is_refused() {
        init();
        Spi::run("SELECT sheaf.mutex_release('k', '00000000-0000-8000-8000-00000000000a', 1)").unwrap();
    }

    #[pg_test]
    fn an_expired_lease_passes_to_the_next_waiter() {
        init();
        acquire(A);
        acquire(B);
        Spi::run("UPDATE sheaf.mutex_locks SET lease_expires_at = now() - interval '1 second'").unwrap();
        assert_eq!(
            Spi::get_one::<i32>("SELECT sheaf.mutex_reclaim()").unwrap(),
            Some(1)
        );
        assert_eq!(
            Spi::get_one::<String>("SELECT holder::text FROM sheaf.mutex_status('k')")
                .unwrap()
                .as_deref(),
            Some(B)
        );
    }

    #[pg_test]
    fn a_lapsed_waiter_is_skipped_at_the_hand_over_and_comes_back_at_the_end_of_the_line() {
        init();
        let token = acquire(A).token;
        for owner in [B, C, D] {
            acquire(owner);
        }
        // Asking again renews the place for a third of the lease asked (60 s).
        Spi::run("UPDATE sheaf.mutex_waiters SET expires_at = now() + interval '1 second'").unwrap();
        acquire(C);
        assert_eq!(
            Spi::get_one_with_args::<bool>(
                "SELECT expires_at = now() + interval '20 seconds' FROM sheaf.mutex_waiters WHERE owner = $1::uuid",
                &[C.into()],
            )
            .unwrap(),
            Some(true)
        );
        lapse(B);
        assert_eq!(acquire(C), waiting_at(1), "a lapsed place ahead does not count");
        assert_eq!(waiting(), Some(2), "nor in the status");
        let next = Spi::get_one_with_args::<pgrx::Uuid>(
            "SELECT sheaf.mutex_release('k', $1::uuid, $2)",
            &[A.into(), token.into()],
        )
        .unwrap();
        assert_eq!(next.map(|u| u.to_string()).as_deref(), Some(C), "B is skipped");
        assert_eq!(line(), [D], "and deleted");
        assert_eq!(acquire(B), waiting_at(2), "B comes back behind D");
        // A lapsed place not deleted yet goes to the back as well.
        lapse(D);
        assert_eq!(acquire(D), waiting_at(2));
        assert_eq!(line(), [B, D]);
    }

    #[pg_test]
    fn reclaim_deletes_lapsed_waiters_and_keeps_the_live_ones_in_order() {
        init();
        acquire(A);
        for owner in [B, C, D] {
            acquire(owner);
        }
        lapse(C);
        assert_eq!(
            Spi::get_one::<i32>("SELECT sheaf.mutex_reclaim()").unwrap(),
            Some(0),
            "no lock expired"
        );
        assert_eq!(line(), [B, D]);
        assert_eq!(
            Spi::get_one::<String>("SELECT holder::text FROM sheaf.mutex_status('k')")
                .unwrap()
                .as_deref(),
            Some(A)
        );
        // An expired holder whose whole line lapsed: the key is freed.
        lapse(B);
        lapse(D);
        Spi::run("UPDATE sheaf.mutex_locks SET lease_expires_at = now() - interval '1 second'").unwrap();
        assert_eq!(
            Spi::get_one::<i32>("SELECT sheaf.mutex_reclaim()").unwrap(),
            Some(1)
        );
        assert!(line().is_empty());
        assert_eq!(
            Spi::get_one::<String>("SELECT holder::text FROM sheaf.mutex_status('k')").unwrap(),
            None
        );
    }

    row! {
        #[derive(Debug, PartialEq)]
        struct Listed {
            key: String,
            holder: String,
            waiters: i32,
            expired: bool,
        }
    }

    /// A page of `list_mutexes`.
    fn listed(after: Option<&str>, max_rows: i32) -> Vec<Listed> {
        crate::testing::rows(
            "SELECT key, holder::text, waiters, lease_expires_at <= now() \
             FROM sheaf.list_mutexes($1, $2)",
            &[after.into(), max_rows.into()],
        )
    }

    fn listed_row(key: &str, holder: &str, waiters: i32, expired: bool) -> Listed {
        Listed {
            key: key.into(),
            holder: holder.into(),
            waiters,
            expired,
        }
    }

    fn acquire_key(key: &str, owner: &str) -> bool {
        one::<Acquired>(
            "SELECT granted, token, queue_position FROM sheaf.mutex_acquire($1, $2::uuid)",
            &[key.into(), owner.into()],
        )
        .granted
    }

    #[pg_test]
    fn list_mutexes_pages_by_key_from_after() {
        init();
        for key in ["m3", "m1", "m4", "m2"] {
            assert!(acquire_key(key, A));
        }
        let keys = |page: Vec<Listed>| page.into_iter().map(|m| m.key).collect::<Vec<_>>();
        assert_eq!(keys(listed(None, 2)), ["m1", "m2"]);
        assert_eq!(keys(listed(Some("m2"), 2)), ["m3", "m4"]);
        assert_eq!(
            keys(listed(Some("m1x"), 1000)),
            ["m2", "m3", "m4"],
            "any text is a place"
        );
        assert!(listed(Some("m4"), 2).is_empty());
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM sheaf.list_mutexes()").unwrap(),
            Some(4),
            "the defaults list from the first key"
        );
        // A released key with nobody waiting is free: it has no row.
        let token = Spi::get_one::<i64>("SELECT token FROM sheaf.mutex_status('m2')").unwrap();
        Spi::run_with_args(
            "SELECT sheaf.mutex_release('m2', $1::uuid, $2)",
            &[A.into(), token.into()],
        )
        .unwrap();
        assert_eq!(keys(listed(Some("m1"), 2)), ["m3", "m4"]);
    }

    #[pg_test]
    fn list_mutexes_counts_the_live_waiters_and_shows_an_expired_holder() {
        init();
        acquire(A);
        acquire(B);
        acquire(C);
        acquire(D);
        lapse(C);
        acquire_key("other", D);
        assert_eq!(
            listed(None, 10),
            [listed_row("k", A, 2, false), listed_row("other", D, 0, false)],
            "C's lapsed place is not counted"
        );
        Spi::run(
            "UPDATE sheaf.mutex_locks SET lease_expires_at = now() - interval '1 second' WHERE key = 'k'",
        )
        .unwrap();
        assert_eq!(
            listed(None, 1),
            [listed_row("k", A, 2, true)],
            "listed until passed on"
        );
    }

    #[pg_test]
    fn list_mutexes_refuses_a_bad_page_size() {
        init();
        for (max_rows, code, message) in [
            (
                Some(0),
                "22023",
                "invalid max_rows: must be from 1 to 1000, got 0",
            ),
            (
                Some(1001),
                "22023",
                "invalid max_rows: must be from 1 to 1000, got 1001",
            ),
            (None, "22004", "max_rows must not be null"),
        ] {
            let failed = crate::base::subxact::attempt(|| {
                Spi::run_with_args("SELECT * FROM sheaf.list_mutexes(NULL, $1)", &[max_rows.into()])
            })
            .expect_err("refused");
            assert_eq!(failed.sqlstate, code, "{max_rows:?}: {}", failed.message);
            assert!(failed.message.contains(message), "{}", failed.message);
        }
    }

    /// Seconds from now to the key's lease end.
    fn lease_left() -> f64 {
        Spi::get_one::<f64>(
            "SELECT extract(epoch FROM lease_expires_at - now())::float8 FROM sheaf.mutex_status('k')",
        )
        .unwrap()
        .unwrap()
    }

    #[pg_test]
    fn a_hand_over_grants_until_the_waiter_picks_the_grant_up_then_the_lease_runs_in_full() {
        init();
        let token = acquire(A).token;
        acquire(B);
        Spi::run_with_args(
            "SELECT sheaf.mutex_release('k', $1::uuid, $2)",
            &[A.into(), token.into()],
        )
        .unwrap();
        assert!(
            (lease_left() - 20.0).abs() < 1e-3,
            "a third of B's 60 s lease to pick it up"
        );
        assert!(acquire(B).granted);
        assert!((lease_left() - 60.0).abs() < 1e-3, "picked up: the whole lease");
        // A holder asking again with a shorter lease keeps the longer one.
        Spi::run(
            "SELECT * FROM sheaf.mutex_acquire('k', '00000000-0000-8000-8000-00000000000b', '1 second')",
        )
        .unwrap();
        assert!((lease_left() - 60.0).abs() < 1e-3);
    }
}
