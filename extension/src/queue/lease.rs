//! Leases: extending them, giving a task back, and reaping the expired ones
//! of crashed workers.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use sheaf_core::state::TaskState;

use crate::base::errors::{stale_token, unknown_task};
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::queue::hooks::{ExecutionHooks, Outcome, TaskEvent};
use crate::queue::tasks::{RUNNING, attempt_secs, claim_times, queues_with};
use crate::queue::{cancel, caps, dead_letters, ready};

const RUNNING_FOR_UPDATE: Stmt = Stmt::write(
    "SELECT concurrency_key FROM tasks WHERE id = $1 AND token = $2 AND state = $3 FOR UPDATE",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::TEXTOID,
    ],
);
const EXISTS: Stmt = Stmt::read(
    "SELECT EXISTS (SELECT 1 FROM tasks WHERE id = $1)",
    &[PgBuiltInOids::UUIDOID],
);
const PUT_BACK: Stmt = Stmt::write(
    "UPDATE tasks SET state = $2, attempts = attempts - $3, last_error = coalesce($4, last_error), \
            lease_owner = NULL, lease_secs = NULL, lease_expires_at = NULL \
     WHERE id = $1",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::TEXTOID,
    ],
);
const HEARTBEAT: Stmt = Stmt::write(
    "UPDATE tasks SET lease_expires_at = now() + make_interval(secs => coalesce($3, lease_secs)) \
     WHERE id = $1 AND token = $2 AND state = $4 RETURNING lease_expires_at",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::TEXTOID,
    ],
);
const EXPIRED_ARGS: &[PgBuiltInOids] = &[
    PgBuiltInOids::TEXTOID,
    PgBuiltInOids::INT8OID,
    PgBuiltInOids::FLOAT8OID,
];
// Expired leases, oldest first, with what their execution hears of:
// `[catalog (tasks::claim_times)][all of them, those expired since $3]`
// (epoch seconds; `claim::sweep` says when the window is enough).
macro_rules! expired {
    ($catalog:tt, $since:expr) => {
        concat!(
            "SELECT id, concurrency_key, attempts >= max_attempts, execution_id, kind, attempts, token < 0, ",
            attempt_secs!($catalog, "lease_expires_at"),
            " FROM tasks WHERE queue = $1 AND state = 'running' AND lease_expires_at < now()",
            $since,
            " ORDER BY lease_expires_at LIMIT $2 FOR UPDATE SKIP LOCKED"
        )
    };
}
const EXPIRED: [[Stmt; 2]; 2] = [
    [
        Stmt::write(expired!(0, ""), EXPIRED_ARGS),
        Stmt::write(
            expired!(0, " AND lease_expires_at >= to_timestamp($3)"),
            EXPIRED_ARGS,
        ),
    ],
    [
        Stmt::write(expired!(1, ""), EXPIRED_ARGS),
        Stmt::write(
            expired!(1, " AND lease_expires_at >= to_timestamp($3)"),
            EXPIRED_ARGS,
        ),
    ],
];

/// Locks a task that must be running under `token`; its concurrency key.
pub fn lock_running(task_id: pgrx::Uuid, token: i64) -> Option<String> {
    // A row whose key is NULL is a running task without one.
    let row = RUNNING_FOR_UPDATE.value::<Option<String>>(
        &[task_id.into(), token.into(), RUNNING.into()],
        "reading a running task",
    );
    row.unwrap_or_else(|| not_running(task_id, token))
}

/// Refuses a call on a task that is not running under `token`: cancelled
/// (57000) if an operator cancelled it while this token held it, else a
/// lost lease (55P03) if the task is still here, else an unknown task
/// (P0002), so a caller can tell "stop", "someone else has it" and "it is
/// gone" apart.
pub fn not_running(task_id: pgrx::Uuid, token: i64) -> ! {
    cancel::told(task_id, token);
    let exists = EXISTS.value::<bool>(&[task_id.into()], "looking a task up");
    if exists == Some(true) {
        stale_token(task_id, token)
    }
    unknown_task(task_id)
}

/// Puts a running task back in line: ready with its original keys (so it is
/// next), or waiting if its key's cap was lowered below its running count.
/// `refund` gives back the attempt its claim spent.
pub fn put_back(task_id: pgrx::Uuid, key: Option<&str>, refund: bool, error: Option<&str>) {
    let wait = key.is_some_and(caps::give_up_slot_if_over_cap);
    let state = if wait {
        TaskState::Waiting
    } else {
        TaskState::Ready
    };
    PUT_BACK.exec(&[
        task_id.into(),
        state.as_str().into(),
        (refund as i32).into(),
        error.into(),
    ]);
    match key {
        Some(key) if wait => caps::waited(key, &[task_id]),
        _ => ready::insert(&[task_id]),
    }
}

/// Gives a claimed task back without spending an attempt (a draining
/// worker). A task cancelled while `token` held it leaves instead
/// (`cancel::settle`).
pub fn release(task_id: pgrx::Uuid, token: i64) {
    if cancel::settle(task_id, token) {
        return;
    }
    let key = lock_running(task_id, token);
    put_back(task_id, key.as_deref(), true, None);
}

/// Extends a task's lease from now by `extend_secs` (default: the lease it
/// was claimed with); returns the new lease end.
pub fn extend(task_id: pgrx::Uuid, token: i64, extend_secs: Option<f64>) -> TimestampWithTimeZone {
    let end: Option<TimestampWithTimeZone> = HEARTBEAT.value(
        &[task_id.into(), token.into(), extend_secs.into(), RUNNING.into()],
        "reading a lease end",
    );
    end.unwrap_or_else(|| not_running(task_id, token))
}

/// Reaps up to `max` expired leases of `queue`: each task goes back in line
/// (its attempt spent), or to the dead letters if that was its last attempt,
/// which its execution hears of (`hooks`: a dead-lettered workflow task
/// fails its execution). With `since` (epoch seconds), only leases that
/// expired since then.
pub fn reap_queue(queue: &str, max: i64, hooks: &dyn ExecutionHooks, since: Option<f64>) -> i64 {
    let expired: Vec<Expired> = EXPIRED[claim_times()][since.is_some() as usize].all(
        &[queue.into(), max.into(), since.into()],
        "reading expired leases",
    );
    let n = expired.len() as i64;
    // Keys in a fixed order: two reapers never take two keys' slot rows in
    // opposite orders.
    let mut expired = expired;
    expired.sort_by(|a, b| a.key.cmp(&b.key));
    let error = "lease expired before the task was completed (worker crashed or stalled)";
    for Expired {
        id,
        key,
        last_attempt,
        execution_id,
        kind,
        attempt,
        cancelled,
        secs,
    } in expired
    {
        // Cancelled while it ran, and its holder never gave it back.
        if cancelled {
            cancel::settle_expired(id);
            caps::release_held(vec![(TaskState::Running, key)]);
            continue;
        }
        if last_attempt {
            dead_letters::bury(id, error, hooks);
            continue;
        }
        // The execution row before the concurrency key (`base::locks`).
        if let Some(execution_id) = execution_id {
            hooks.task_outcome(TaskEvent {
                execution_id,
                task_id: id,
                kind: &kind,
                outcome: Outcome::Reaped { attempt },
                secs,
            });
        }
        put_back(id, key.as_deref(), false, Some(error));
    }
    n
}

row! {
    /// An expired lease.
    struct Expired {
        id: pgrx::Uuid,
        key: Option<String>,
        /// Whether it was the task's last attempt.
        last_attempt: bool,
        execution_id: Option<pgrx::Uuid>,
        kind: String,
        attempt: i32,
        /// Whether the task was cancelled while it ran.
        cancelled: bool,
        /// The attempt's seconds since its claim.
        secs: Option<f64>,
    }
}

const EXPIRED_QUEUES: Stmt = Stmt::read(queues_with!("running", "t.lease_expires_at < now()"), &[]);

/// Reaps up to `max` expired leases across all queues (visiting only those
/// with one); returns how many.
pub fn reap_all(max: i64, hooks: &dyn ExecutionHooks) -> i64 {
    let mut left = max;
    let queues: Vec<String> = EXPIRED_QUEUES.values(&[], "finding queues with expired leases");
    for queue in queues {
        if left <= 0 {
            break;
        }
        left -= reap_queue(&queue, left, hooks, None);
    }
    max - left
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{claim, complete, count, enqueue, init, ns};
    use pgrx::prelude::*;
    use serde_json::json;

    #[pg_test]
    fn release_returns_a_task_to_the_front_without_spending_an_attempt() {
        init();
        for n in 0..3 {
            enqueue("q", json!({"n": n}), json!({}));
        }
        let t = claim("q", 1);
        Spi::run_with_args(
            "SELECT sheaf.release($1, $2)",
            &[t[0].id.into(), t[0].token.into()],
        )
        .unwrap();
        assert_eq!(
            count("SELECT attempts::bigint FROM sheaf.tasks WHERE id IS NOT NULL ORDER BY seq LIMIT 1"),
            0
        );
        assert_eq!(ns(&claim("q", 3)), vec![0, 1, 2]);
    }

    #[pg_test]
    fn expired_leases_are_reaped_and_the_old_token_is_refused() {
        init();
        enqueue("q", json!({"n": 1}), json!({"max_attempts": 2}));
        let first = claim("q", 1);
        Spi::run("UPDATE sheaf.tasks SET lease_expires_at = now() - interval '1 second'").unwrap();
        assert_eq!(
            Spi::get_one::<i32>("SELECT sheaf.reap_expired()").unwrap(),
            Some(1)
        );
        let second = claim("q", 1);
        assert_eq!(second[0].id, first[0].id);
        assert_ne!(second[0].token, first[0].token, "a new claim, a new token");
        let stale = Spi::get_one_with_args::<bool>(
            "SELECT completed FROM sheaf.complete_batch(ARRAY[$1], ARRAY[$2])",
            &[first[0].id.into(), first[0].token.into()],
        )
        .unwrap();
        assert_eq!(stale, Some(false));
        // The second claim was its last attempt: expiry dead-letters it.
        Spi::run("UPDATE sheaf.tasks SET lease_expires_at = now() - interval '1 second'").unwrap();
        assert_eq!(
            Spi::get_one::<i32>("SELECT sheaf.reap_expired()").unwrap(),
            Some(1)
        );
        assert_eq!(count("SELECT count(*) FROM sheaf.dead_letters"), 1);
    }

    #[pg_test]
    fn heartbeat_extends_the_lease() {
        init();
        enqueue("q", json!({"n": 1}), json!({}));
        let t = claim("q", 1);
        let secs = Spi::get_one_with_args::<f64>(
            "SELECT extract(epoch FROM sheaf.heartbeat($1, $2, '1 hour') - now())::float8",
            &[t[0].id.into(), t[0].token.into()],
        )
        .unwrap()
        .unwrap();
        assert!((secs - 3600.0).abs() < 1.0);
        complete(&t[0]);
    }

    #[pg_test(error = "invalid lease: must be from 1 second to 1 day, got 0 seconds")]
    fn a_zero_lease_is_refused() {
        init();
        Spi::run("SELECT * FROM sheaf.claim('q', 'w', 1, '0 seconds')").unwrap();
    }
}
