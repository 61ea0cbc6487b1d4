//! The durable FIFO mutex: at most one holder per key, a FIFO waiting line,
//! a lease so a crashed holder's lock passes on, and a fencing token so a
//! holder that lost its lease cannot release or renew what is no longer its.
//!
//! Every operation on a key serializes on a transaction-scoped advisory lock
//! of the key, then reads the key's rows with a fresh snapshot. A grant to a
//! waiter sends `NOTIFY sheaf_mutex` with the new holder's id as payload;
//! the waiter learns its token by acquiring again.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

use crate::base::errors::{internal, not_mutex_holder};
use crate::base::locks::{self, Class};
use crate::base::plans::{Stmt, exec, run};
use crate::base::rows;

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
const JOIN_LINE: Stmt = Stmt::write(
    "INSERT INTO mutex_waiters (key, owner, position, lease_secs) \
     VALUES ($1, $2, nextval('mutex_seq'), $3) \
     ON CONFLICT (key, owner) DO UPDATE SET lease_secs = EXCLUDED.lease_secs",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::FLOAT8OID,
    ],
);
const PLACE_IN_LINE: Stmt = Stmt::write(
    "SELECT count(*)::int FROM mutex_waiters WHERE key = $1 AND position <= \
       (SELECT position FROM mutex_waiters WHERE key = $1 AND owner = $2)",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::UUIDOID],
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
            (SELECT count(*)::int FROM mutex_waiters w WHERE w.key = $1) \
     FROM (SELECT 1) one LEFT JOIN mutex_locks l ON l.key = $1",
    &[PgBuiltInOids::TEXTOID],
);

fn lock(key: &str) {
    locks::exclusive(Class::Mutex, key);
}

/// (holder, token, expired) of a key's lock.
fn holder(key: &str) -> Option<(pgrx::Uuid, i64, bool)> {
    Spi::connect_mut(|client| rows::first(run(client, &HOLDER, &[key.into()]), "reading a mutex"))
}

fn grant(key: &str, owner: pgrx::Uuid, lease_secs: f64) -> i64 {
    exec(&LEAVE_LINE, &[key.into(), owner.into()]);
    Spi::connect_mut(|client| {
        rows::only_value(
            run(client, &GRANT, &[key.into(), owner.into(), lease_secs.into()]),
            "granting a mutex",
        )
    })
}

/// The key is free (released, or its lease expired): grants it to the first
/// waiter, or frees it. Returns the new holder. The caller holds the key's lock.
fn hand_off(key: &str) -> Option<pgrx::Uuid> {
    let next =
        Spi::connect_mut(|client| rows::first(run(client, &POP_WAITER, &[key.into()]), "popping a waiter"));
    match next {
        Some((owner, lease_secs)) => {
            grant(key, owner, lease_secs);
            exec(&NOTIFY, &[owner.to_string().into()]);
            Some(owner)
        }
        None => {
            exec(&FREE, &[key.into()]);
            None
        }
    }
}

/// Acquires `key` for `owner`, or queues it. Granted: the fencing token and
/// position 0. Not granted: position in the FIFO line (1 = next); acquiring
/// again keeps that place and returns the grant once it comes. The holder
/// acquiring again gets its grant back (same token). An expired holder's
/// lock passes on here too, as `mutex_reclaim` would pass it.
/// Returns (granted, token, position in line).
pub fn acquire(key: &str, owner: pgrx::Uuid, lease_secs: f64) -> (bool, Option<i64>, i32) {
    lock(key);
    // At most two rounds: an expired lock passes on once, then is current.
    for _ in 0..2 {
        match holder(key) {
            Some((h, token, false)) if h == owner => return (true, Some(token), 0),
            Some((_, _, true)) => {
                hand_off(key);
            }
            Some(_) => {
                exec(&JOIN_LINE, &[key.into(), owner.into(), lease_secs.into()]);
                let place = Spi::connect_mut(|client| {
                    rows::only_value(
                        run(client, &PLACE_IN_LINE, &[key.into(), owner.into()]),
                        "reading a place in line",
                    )
                });
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
        Some((h, t, _)) if h == owner && t == token => hand_off(key),
        _ => not_mutex_holder(key, owner, token),
    }
}

/// Extends the lease of `key` held by `owner` under `token` to now + `lease`;
/// returns the new lease end. A non-holder or a stale token raises 55P03.
pub fn renew(key: &str, owner: pgrx::Uuid, token: i64, lease_secs: f64) -> TimestampWithTimeZone {
    lock(key);
    let renewed = Spi::connect_mut(|client| {
        let table = run(
            client,
            &RENEW,
            &[key.into(), owner.into(), token.into(), lease_secs.into()],
        );
        rows::value(table, "renewing a mutex")
    });
    renewed.unwrap_or_else(|| not_mutex_holder(key, owner, token))
}

/// Reclaims up to `max` expired locks; keys in order, so two sweeps never
/// take two keys' locks in opposite orders.
pub fn reclaim(max: i64) -> i64 {
    let mut keys: Vec<String> = Spi::connect_mut(|client| {
        rows::values(run(client, &EXPIRED, &[max.into()]), "reading expired mutexes")
    });
    keys.sort();
    let mut n = 0;
    for key in keys {
        lock(&key);
        if matches!(holder(&key), Some((_, _, true))) {
            hand_off(&key);
            n += 1;
        }
    }
    n
}

/// Releases every lock `owner` holds and removes it from every waiting line
/// (an execution reaching a terminal state). Each key under its lock, keys
/// in order.
pub fn release_all(owner: pgrx::Uuid) {
    let mut keys: Vec<String> = Spi::connect_mut(|client| {
        rows::values(
            run(client, &HELD_OR_AWAITED_BY, &[owner.into()]),
            "reading an owner's mutexes",
        )
    });
    keys.sort();
    for key in keys {
        lock(&key);
        exec(&LEAVE_LINE, &[key.as_str().into(), owner.into()]);
        if matches!(holder(&key), Some((h, _, _)) if h == owner) {
            hand_off(&key);
        }
    }
}

/// A key's lock as `mutex_status` shows it: holder, token and lease end
/// (all `None` when free), and how many wait.
pub type Status = (
    Option<pgrx::Uuid>,
    Option<i64>,
    Option<TimestampWithTimeZone>,
    i32,
);

/// A key's holder, token and lease end (NULL when free), and how many wait.
pub fn status(key: &str) -> Option<Status> {
    Spi::connect_mut(|client| rows::first(run(client, &STATUS, &[key.into()]), "reading a mutex"))
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::init;
    use pgrx::prelude::*;

    fn acquire(owner: &str) -> (bool, Option<i64>, i32) {
        Spi::connect(|client| {
            let row = client
                .select(
                    "SELECT granted, token, queue_position FROM sheaf.mutex_acquire('k', $1::uuid)",
                    None,
                    &[owner.into()],
                )
                .unwrap()
                .first();
            (
                row.get::<bool>(1).unwrap().unwrap(),
                row.get::<i64>(2).unwrap(),
                row.get::<i32>(3).unwrap().unwrap(),
            )
        })
    }

    const A: &str = "00000000-0000-8000-8000-00000000000a";
    const B: &str = "00000000-0000-8000-8000-00000000000b";
    const C: &str = "00000000-0000-8000-8000-00000000000c";

    #[pg_test]
    fn grants_go_in_fifo_order_and_a_waiter_keeps_its_place() {
        init();
        let (granted, token, _) = acquire(A);
        assert!(granted);
        assert_eq!(acquire(A).1, token, "the holder gets its grant back");
        assert_eq!(acquire(B), (false, None, 1));
        assert_eq!(acquire(C), (false, None, 2));
        assert_eq!(acquire(B), (false, None, 1), "acquiring again keeps the place");
        let next = Spi::get_one_with_args::<pgrx::Uuid>(
            "SELECT sheaf.mutex_release('k', $1::uuid, $2)",
            &[A.into(), token.into()],
        )
        .unwrap();
        assert_eq!(next.map(|u| u.to_string()).as_deref(), Some(B));
        let (granted, b_token, _) = acquire(B);
        assert!(granted && b_token > token);
        assert_eq!(acquire(C), (false, None, 1));
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
}
