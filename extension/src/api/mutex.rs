//! The durable mutex: validate, call, return. Every function runs at READ
//! COMMITTED (the key's lock must be followed by a fresh snapshot).

use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use sheaf_core::options::MAX_KEY_BYTES;

use crate::base::args::{self, required};
use crate::base::errors::require_read_committed;
use crate::base::names::{self, Kind};
use crate::base::topology;
use crate::mutex;

/// Acquires `key` for `owner`, or queues it. Granted: the fencing token and
/// position 0. Not granted: position in the FIFO line (1 = next); acquiring
/// again keeps that place and returns the grant once it comes. The holder
/// acquiring again gets its grant back (same token). An expired holder's
/// lock passes on here too, as `mutex_reclaim` would pass it.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn mutex_acquire(
    key: Option<&str>,
    owner: Option<pgrx::Uuid>,
    lease: default!(Option<Interval>, "'60 seconds'"),
) -> TableIterator<
    'static,
    (
        name!(granted, bool),
        name!(token, Option<i64>),
        name!(queue_position, i32),
    ),
> {
    require_read_committed("mutex_acquire");
    let key = args::key(key, "key");
    // The name rule (`args::new_name`): a key held or waited on keeps working.
    args::new_name(key, "key", MAX_KEY_BYTES, || names::stored(Kind::Mutex, key));
    let owner = required(owner, "owner");
    let lease_secs = args::lease_secs("lease", required(lease, "lease"));
    // A key's home is placed like a start: a client this shard's fleet no
    // longer accepts may have placed it elsewhere. Renew, release and leave
    // act on a lock wherever it is, so they are not checked.
    topology::check_declared();
    TableIterator::once(mutex::acquire(key, owner, lease_secs))
}

/// Releases `key` held by `owner` under `token` and hands it to the next
/// waiter, returned (NULL if none). A non-holder or a stale token raises
/// 55P03 and changes nothing.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn mutex_release(key: Option<&str>, owner: Option<pgrx::Uuid>, token: Option<i64>) -> Option<pgrx::Uuid> {
    require_read_committed("mutex_release");
    let key = args::key(key, "key");
    let owner = required(owner, "owner");
    let token = required(token, "token");
    mutex::release(key, owner, token)
}

/// `owner` gives up waiting for `key`: leaves the line, and a lock it holds
/// (a grant it had not picked up) goes to the next waiter, returned (NULL
/// if none, or if `owner` held nothing).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn mutex_leave(key: Option<&str>, owner: Option<pgrx::Uuid>) -> Option<pgrx::Uuid> {
    require_read_committed("mutex_leave");
    let key = args::key(key, "key");
    let owner = required(owner, "owner");
    mutex::leave(key, owner)
}

/// Extends the lease of `key` held by `owner` under `token` to now + `lease`;
/// returns the new lease end. A non-holder or a stale token raises 55P03.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn mutex_renew(
    key: Option<&str>,
    owner: Option<pgrx::Uuid>,
    token: Option<i64>,
    lease: default!(Option<Interval>, "'60 seconds'"),
) -> TimestampWithTimeZone {
    require_read_committed("mutex_renew");
    let key = args::key(key, "key");
    let owner = required(owner, "owner");
    let token = required(token, "token");
    let lease_secs = args::lease_secs("lease", required(lease, "lease"));
    mutex::renew(key, owner, token, lease_secs)
}

/// Passes up to `max_rows` expired locks to their next waiters (or frees
/// them); returns how many. Part of `sheaf.maintain()`.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn mutex_reclaim(max_rows: default!(Option<i32>, 1000)) -> i32 {
    require_read_committed("mutex_reclaim");
    mutex::reclaim(args::max_rows(max_rows)) as i32
}

/// A key's holder, token and lease end (NULL when free), and how many wait.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn mutex_status(
    key: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(holder, Option<pgrx::Uuid>),
        name!(token, Option<i64>),
        name!(lease_expires_at, Option<TimestampWithTimeZone>),
        name!(waiters, i32),
    ),
> {
    TableIterator::new(
        mutex::status(args::key(key, "key")).map(|s| (s.holder, s.token, s.lease_expires_at, s.waiters)),
    )
}

/// The most mutexes one `list_mutexes` page holds.
const MAX_PAGE: i32 = 1000;

/// This shard's mutexes by key: the stored locks with a key after `after`
/// (NULL: from the first), at most `max_rows` (1..1000), each with its
/// holder, token, when it was acquired (granted to its holder), its lease
/// end (past: expired, passed on at the key's next acquire or reclaim) and
/// how many wait (lapsed places not counted). A free key has no row.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn list_mutexes(
    after: default!(Option<&str>, "NULL"),
    max_rows: default!(Option<i32>, 100),
) -> TableIterator<
    'static,
    (
        name!(key, String),
        name!(holder, pgrx::Uuid),
        name!(token, i64),
        name!(acquired_at, TimestampWithTimeZone),
        name!(lease_expires_at, TimestampWithTimeZone),
        name!(waiters, i32),
    ),
> {
    let max_rows = args::page_rows(max_rows, MAX_PAGE);
    TableIterator::new(mutex::list(after, max_rows).into_iter().map(|m| {
        (
            m.key,
            m.holder,
            m.token,
            m.acquired_at,
            m.lease_expires_at,
            m.waiters,
        )
    }))
}
