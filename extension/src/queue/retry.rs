//! Failing a claimed task: retry with exponential backoff and jitter until its
//! attempts run out, then the dead letters.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use sheaf_core::backoff::retry_delay_ms;

use crate::base::errors::internal;
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::queue::hooks::{ExecutionHooks, Outcome, TaskEvent};
use crate::queue::tasks::attempt_secs;
use crate::queue::{caps, dead_letters, lease, tasks};

/// The longest explicit `retry_in`.
pub const MAX_RETRY_SECS: f64 = 365.0 * 86_400.0;

macro_rules! running {
    ($catalog:tt) => {
        concat!(
            "SELECT concurrency_key, attempts, max_attempts, execution_id, kind, ",
            attempt_secs!($catalog, "now()"),
            " FROM tasks WHERE id = $1 AND token = $2 AND state = $3 FOR UPDATE"
        )
    };
}
const RUNNING_ARGS: &[PgBuiltInOids] = &[
    PgBuiltInOids::UUIDOID,
    PgBuiltInOids::INT8OID,
    PgBuiltInOids::TEXTOID,
];
const RUNNING: [Stmt; 2] = [
    Stmt::write(running!(0), RUNNING_ARGS),
    Stmt::write(running!(1), RUNNING_ARGS),
];
const BACK_OFF: Stmt = Stmt::write(
    "UPDATE tasks SET state = 'scheduled', run_at = now() + make_interval(secs => $2), last_error = $3, \
            lease_owner = NULL, lease_secs = NULL, lease_expires_at = NULL \
     WHERE id = $1 RETURNING run_at",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::TEXTOID,
    ],
);

// A snooze: scheduled again, the attempt its claim spent refunded.
const SNOOZE: Stmt = Stmt::write(
    "UPDATE tasks SET state = 'scheduled', run_at = now() + make_interval(secs => $2), \
            attempts = attempts - 1, lease_owner = NULL, lease_secs = NULL, lease_expires_at = NULL \
     WHERE id = $1 RETURNING run_at",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::FLOAT8OID],
);

row! {
    /// A running task's row, locked.
    struct Running {
        key: Option<String>,
        attempts: i32,
        max_attempts: i32,
        execution_id: Option<pgrx::Uuid>,
        kind: String,
        secs: Option<f64>,
    }
}

fn lock_running(task_id: pgrx::Uuid, token: i64) -> Running {
    RUNNING[tasks::claim_times()]
        .first(
            &[task_id.into(), token.into(), tasks::RUNNING.into()],
            "failing a task",
        )
        .unwrap_or_else(|| lease::not_running(task_id, token))
}

/// The default delay before attempt `attempts + 1`: exponential, with jitter.
fn backoff_secs(attempts: i32) -> f64 {
    let jitter = (uuid::Uuid::new_v4().as_u64_pair().1 >> 11) as f64 / (1u64 << 53) as f64;
    retry_delay_ms(attempts as u32, jitter) as f64 / 1000.0
}

/// The start of this transaction: `now()` in SQL.
fn transaction_start() -> TimestampWithTimeZone {
    // SAFETY: reads this backend's transaction state; always set inside one.
    let now = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
    TimestampWithTimeZone::try_from(now).unwrap_or_else(|_| internal("reading the transaction's start time"))
}

/// Records a failed attempt of a task claimed under `token` (`error` whole:
/// the entry point refused one over the size limit). Until its attempts run out it is retried after
/// `retry_secs`, or by default after an exponential backoff with jitter;
/// then it moves to the dead letters. Its execution hears of either through
/// `hooks`. Returns when it will run again (`None` once dead-lettered), and
/// whether it was dead-lettered. A stale token raises 55P03 and changes
/// nothing.
pub fn fail(
    task_id: pgrx::Uuid,
    token: i64,
    error: &str,
    retry_secs: Option<f64>,
    hooks: &dyn ExecutionHooks,
) -> (Option<TimestampWithTimeZone>, bool) {
    let task = lock_running(task_id, token);
    if task.attempts >= task.max_attempts {
        dead_letters::bury(task_id, error, hooks);
        return (None, true);
    }
    let delay = retry_secs.unwrap_or_else(|| backoff_secs(task.attempts));
    let retry_at = if delay == 0.0 {
        None
    } else {
        Some(BACK_OFF.one_value::<TimestampWithTimeZone>(
            &[task_id.into(), delay.into(), error.into()],
            "scheduling a retry",
        ))
    };
    // The execution row before the concurrency key (`base::locks`).
    if let Some(execution_id) = task.execution_id {
        hooks.task_outcome(TaskEvent {
            execution_id,
            task_id,
            kind: &task.kind,
            outcome: Outcome::Failed {
                attempt: task.attempts,
                error,
            },
            secs: task.secs,
        });
    }
    match retry_at {
        None => {
            // Straight back in line, keeping its place and its slot.
            lease::put_back(task_id, task.key.as_deref(), false, Some(error));
            (Some(transaction_start()), false)
        }
        Some(at) => {
            // A backing-off task holds no slot: the next waiting task gets it.
            if let Some(key) = &task.key {
                caps::release(key, 1);
            }
            (Some(at), false)
        }
    }
}

/// Gives a task claimed under `token` back to run again in `delay_secs`
/// without spending an attempt (the one its claim spent is refunded): the
/// handler asked to wait, it did not fail. It holds no slot while it waits
/// (a zero delay puts it straight back in line, as `release` does). Its
/// execution hears nothing: no attempt ended. Returns when it runs again.
/// A stale token raises 55P03 and changes nothing.
pub fn snooze(task_id: pgrx::Uuid, token: i64, delay_secs: f64) -> TimestampWithTimeZone {
    let key = lease::lock_running(task_id, token);
    if delay_secs == 0.0 {
        lease::put_back(task_id, key.as_deref(), true, None);
        return transaction_start();
    }
    let at =
        SNOOZE.one_value::<TimestampWithTimeZone>(&[task_id.into(), delay_secs.into()], "snoozing a task");
    if let Some(key) = &key {
        caps::release(key, 1);
    }
    at
}

/// Moves a task claimed under `token` to the dead letters now, whatever
/// attempts it has left (a failure that no retry can fix), exactly as when
/// its last attempt fails: its slot is freed and its execution hears of it
/// through `hooks` (a workflow task's execution fails). A stale token raises
/// 55P03 and changes nothing.
pub fn dead_letter(task_id: pgrx::Uuid, token: i64, error: &str, hooks: &dyn ExecutionHooks) {
    lease::lock_running(task_id, token);
    dead_letters::bury(task_id, error, hooks);
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::{Claimed, claim, count, enqueue, init, ns, one};
    use pgrx::prelude::*;
    use serde_json::json;

    row! {
        #[derive(Debug, PartialEq)]
        struct Failed {
            retrying: bool,
            dead_lettered: bool,
        }
    }

    const RETRYING: Failed = Failed {
        retrying: true,
        dead_lettered: false,
    };

    fn fail(task: &Claimed, retry_in: Option<&str>) -> Failed {
        one(
            "SELECT retry_at IS NOT NULL, dead_lettered FROM sheaf.fail($1, $2, 'boom', $3::interval)",
            &[task.id.into(), task.token.into(), retry_in.into()],
        )
    }

    #[pg_test]
    fn a_failure_backs_off_with_jitter() {
        init();
        enqueue("q", json!({"n": 1}), json!({}));
        let t = claim("q", 1);
        assert_eq!(fail(&t[0], None), RETRYING);
        let delay = Spi::get_one::<f64>(
            "SELECT extract(epoch FROM run_at - now())::float8 FROM sheaf.tasks WHERE state = 'scheduled'",
        )
        .unwrap()
        .unwrap();
        assert!(
            (0.75..=1.25).contains(&delay),
            "first retry after ~1 s, got {delay}"
        );
        assert!(claim("q", 1).is_empty(), "not before its retry time");
        assert_eq!(
            Spi::get_one::<String>("SELECT last_error FROM sheaf.tasks")
                .unwrap()
                .as_deref(),
            Some("boom")
        );
    }

    #[pg_test]
    fn retry_in_zero_puts_it_straight_back() {
        init();
        enqueue("q", json!({"n": 1}), json!({}));
        let t = claim("q", 1);
        assert_eq!(fail(&t[0], Some("0 seconds")), RETRYING);
        let again = claim("q", 1);
        assert_eq!(ns(&again), vec![1]);
        assert_eq!(count("SELECT attempts::bigint FROM sheaf.tasks"), 2);
    }

    #[pg_test]
    fn the_last_attempt_dead_letters_and_redrive_brings_it_back() {
        init();
        let id = enqueue(
            "q",
            json!({"n": 1}),
            json!({"max_attempts": 2, "concurrency_key": "k"}),
        );
        Spi::run("SELECT sheaf.set_concurrency_limit('k', 1)").unwrap();
        let t = claim("q", 1);
        fail(&t[0], Some("0 seconds"));
        let t = claim("q", 1);
        assert_eq!(
            fail(&t[0], None),
            Failed {
                retrying: false,
                dead_lettered: true
            }
        );
        assert_eq!(count("SELECT count(*) FROM sheaf.tasks"), 0);
        assert_eq!(count("SELECT dead FROM sheaf.queue_stats('q')"), 1);
        assert_eq!(
            count("SELECT admitted::bigint FROM sheaf.concurrency_slots"),
            0,
            "its slot was freed"
        );
        let moved = Spi::get_one_with_args::<i32>("SELECT sheaf.redrive(ARRAY[$1])", &[id.into()]).unwrap();
        assert_eq!(moved, Some(1));
        let t = claim("q", 1);
        assert_eq!(t[0].id, id);
        assert_eq!(
            count("SELECT attempts::bigint FROM sheaf.tasks"),
            1,
            "redrive resets attempts"
        );
    }

    #[pg_test]
    fn a_snooze_schedules_it_later_refunds_the_attempt_and_frees_the_slot() {
        init();
        Spi::run("SELECT sheaf.set_concurrency_limit('k', 1)").unwrap();
        enqueue("q", json!({"n": 1}), json!({"concurrency_key": "k"}));
        enqueue("q", json!({"n": 2}), json!({"concurrency_key": "k"}));
        let t = claim("q", 1);
        let secs = Spi::get_one_with_args::<f64>(
            "SELECT extract(epoch FROM sheaf.snooze($1, $2, '1 hour') - now())::float8",
            &[t[0].id.into(), t[0].token.into()],
        )
        .unwrap()
        .unwrap();
        assert!((secs - 3600.0).abs() < 1.0, "runs again in an hour, got {secs}");
        assert_eq!(
            count("SELECT attempts::bigint FROM sheaf.tasks WHERE state = 'scheduled'"),
            0,
            "the attempt its claim spent is refunded"
        );
        assert_eq!(
            ns(&claim("q", 1)),
            vec![2],
            "its slot went to the next task of its key"
        );
        assert_eq!(count("SELECT count(*) FROM sheaf.events"), 0);
    }

    #[pg_test]
    fn a_zero_snooze_puts_it_straight_back_unspent() {
        init();
        enqueue("q", json!({"n": 1}), json!({}));
        let t = claim("q", 1);
        Spi::run_with_args(
            "SELECT sheaf.snooze($1, $2, '0 seconds')",
            &[t[0].id.into(), t[0].token.into()],
        )
        .unwrap();
        assert_eq!(ns(&claim("q", 1)), vec![1]);
        assert_eq!(count("SELECT attempts::bigint FROM sheaf.tasks"), 1);
    }

    #[pg_test(error = "invalid delay: must be from 0 to 365 days, got -1 seconds")]
    fn a_negative_snooze_is_refused() {
        init();
        enqueue("q", json!({"n": 1}), json!({}));
        let t = claim("q", 1);
        Spi::run_with_args(
            "SELECT sheaf.snooze($1, $2, '-1 second')",
            &[t[0].id.into(), t[0].token.into()],
        )
        .unwrap();
    }

    #[pg_test]
    fn dead_letter_skips_the_attempts_left_and_frees_the_slot() {
        init();
        Spi::run("SELECT sheaf.set_concurrency_limit('k', 1)").unwrap();
        enqueue(
            "q",
            json!({"n": 1}),
            json!({"concurrency_key": "k", "max_attempts": 5}),
        );
        enqueue("q", json!({"n": 2}), json!({"concurrency_key": "k"}));
        let t = claim("q", 1);
        Spi::run_with_args(
            "SELECT sheaf.dead_letter($1, $2, 'bad input')",
            &[t[0].id.into(), t[0].token.into()],
        )
        .unwrap();
        assert_eq!(count("SELECT dead FROM sheaf.queue_stats('q')"), 1);
        assert_eq!(
            Spi::get_one::<String>("SELECT last_error FROM sheaf.dead_letters")
                .unwrap()
                .as_deref(),
            Some("bad input")
        );
        assert_eq!(
            ns(&claim("q", 1)),
            vec![2],
            "its slot went to the next task of its key"
        );
    }

    #[pg_test(
        error = "no task 00010000-0000-8000-8000-000000000009 on this shard: it already finished, or never existed"
    )]
    fn dead_lettering_an_unknown_task_is_no_data_found() {
        init();
        Spi::run("SELECT sheaf.dead_letter('00010000-0000-8000-8000-000000000009', 1, 'x')").unwrap();
    }

    #[pg_test(
        error = "no task 00010000-0000-8000-8000-000000000009 on this shard: it already finished, or never existed"
    )]
    fn failing_an_unknown_task_is_no_data_found() {
        init();
        Spi::run("SELECT sheaf.fail('00010000-0000-8000-8000-000000000009', 1, 'x')").unwrap();
    }
}
