//! Argument checks shared by every function: NULLs, arrays, keys, leases.
//! Each refusal names the argument (22004 for NULL, 22023 for a bad value).

use pgrx::datum::Interval;
use sheaf_core::hygiene::{check_name, check_size};
use sheaf_core::options::check_key;

use crate::base::errors::{bad_argument, null_argument, too_large};

/// Leases run from 1 second to 1 day; longer work heartbeats.
pub const MIN_LEASE_SECS: f64 = 1.0;
pub const MAX_LEASE_SECS: f64 = 86_400.0;

/// Unwraps an argument that must not be NULL.
pub fn required<T>(value: Option<T>, arg: &str) -> T {
    match value {
        Some(v) => v,
        None => null_argument(arg),
    }
}

/// Unwraps an array argument none of whose elements may be NULL; the
/// refusal names the argument and the (1-based) element.
pub fn no_nulls<T>(values: Vec<Option<T>>, arg: &str) -> Vec<T> {
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| v.unwrap_or_else(|| bad_argument(arg, format!("element {} is NULL", i + 1))))
        .collect()
}

/// A required key-like argument (a worker name, a mutex or quota key): 1 to
/// 256 bytes.
pub fn key<'a>(value: Option<&'a str>, arg: &str) -> &'a str {
    let value = required(value, arg);
    if let Err(why) = check_key(value) {
        bad_argument(arg, why);
    }
    value
}

/// A name where it would first be stored: the name rule
/// (`sheaf_core::hygiene::check_name`: 1 to `max` bytes, no control or
/// format character, NFC), refused with 22023 naming `arg`. `stored` says
/// whether the name is stored already (asked only of a name that breaks the
/// character rule): such a name predates the rule and keeps working; its
/// length was always checked.
pub fn new_name(value: &str, arg: &str, max: usize, stored: impl FnOnce() -> bool) {
    if let Err(why) = check_name(value, max)
        && !(why.is_characters() && stored())
    {
        bad_argument(arg, why);
    }
}

/// A key given anew on each call that carries it (an idempotency,
/// concurrency, fairness, debounce or signal key): the name rule with no
/// exemption. Rows stored under an older key are still found by it; only a
/// new write under a key that breaks the rule is refused.
pub fn new_key(value: Option<&str>, arg: &str, max: usize) {
    if let Some(v) = value {
        new_name(v, arg, max, || false);
    }
}

/// The one size limit (`sheaf_core::hygiene::MAX_VALUE_BYTES`, 1 MiB) on a
/// value of `bytes` bytes: 54000 naming `arg`, never a cut.
pub fn within_size(bytes: usize, arg: &str) {
    if let Err(why) = check_size(bytes) {
        too_large(arg, why);
    }
}

/// A caller's text sheaf stores (an error): at most the one size limit,
/// 54000 naming `arg`, never cut.
pub fn text<'a>(value: &'a str, arg: &str) -> &'a str {
    within_size(value.len(), arg);
    value
}

/// `max_rows` of a page or a take: required, 1 to `max`.
pub fn page_rows(max_rows: Option<i32>, max: i32) -> i64 {
    let n = required(max_rows, "max_rows");
    if !(1..=max).contains(&n) {
        bad_argument("max_rows", format!("must be from 1 to {max}, got {n}"));
    }
    i64::from(n)
}

/// Validates a lease-like interval argument; returns it in seconds.
pub fn lease_secs(arg: &str, lease: Interval) -> f64 {
    let secs = lease.as_micros() as f64 / 1e6;
    if !(MIN_LEASE_SECS..=MAX_LEASE_SECS).contains(&secs) {
        bad_argument(
            arg,
            format!(
                "must be from {MIN_LEASE_SECS} second to {} day, got {secs} seconds",
                MAX_LEASE_SECS / 86_400.0
            ),
        );
    }
    secs
}

/// Validates a delay-like interval argument (a retry, a snooze): 0 to
/// `max_secs`; returns it in seconds.
pub fn delay_secs(arg: &str, delay: Interval, max_secs: f64) -> f64 {
    let secs = delay.as_micros() as f64 / 1e6;
    if !(0.0..=max_secs).contains(&secs) {
        bad_argument(
            arg,
            format!(
                "must be from 0 to {} days, got {secs} seconds",
                max_secs / 86_400.0
            ),
        );
    }
    secs
}

/// A `max_rows` argument of a bounded sweep: 1 to 100,000.
pub fn max_rows(value: Option<i32>) -> i64 {
    page_rows(value, 100_000)
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::base::subxact;
    use crate::testing::{claim, count, enqueue, init, one, start};
    use pgrx::prelude::*;
    use serde_json::json;

    /// `sql` with `args`: its SQLSTATE and message, or "ok".
    fn outcome(sql: &str, args: &[pgrx::datum::DatumWithOid<'_>]) -> (String, String) {
        match subxact::attempt(|| Spi::run_with_args(sql, args).expect(sql)) {
            Ok(()) => ("ok".into(), String::new()),
            Err(f) => (f.sqlstate, f.message),
        }
    }

    row! {
        struct Kept {
            last_error: String,
        }
    }

    /// One size limit, 1 MiB of compact JSON text (or of error text), at
    /// every entry point: refused with 54000 naming the argument and
    /// nothing written, never cut; exactly 1 MiB is taken.
    #[pg_test]
    fn values_over_one_mib_are_refused_never_cut() {
        init();
        let exec = start("w", "big", json!({})).id;
        enqueue("q", json!({}), json!({}));
        let task = claim("q", 1).remove(0);
        // A JSON string of n bytes of text: n - 2 characters and its quotes.
        let over = "to_jsonb(repeat('x', 1048575))";
        let calls = [
            format!("SELECT sheaf.enqueue('q', {over})"),
            format!("SELECT sheaf.enqueue_batch('q', ARRAY['{{}}'::jsonb, {over}])"),
            format!("SELECT sheaf.start_workflow('w', 'x', {over})"),
            format!("SELECT sheaf.signal_with_start('w', 'y', {over}, 's', '{{}}')"),
            format!("SELECT sheaf.signal_with_start('w', 'y', '{{}}', 's', {over})"),
            format!("SELECT sheaf.signal('{exec}', 's', {over})"),
            format!("SELECT sheaf.append_event('{exec}', 'Mine', {over})"),
            format!("SELECT sheaf.continue_as_new('{exec}', {over})"),
            format!("SELECT sheaf.complete_execution('{exec}', {over})"),
            format!("SELECT sheaf.fail_execution('{exec}', repeat('e', 1048577))"),
            format!("SELECT sheaf.complete('{}', {}, {over})", task.id, task.token),
            format!(
                "SELECT sheaf.fail('{}', {}, repeat('e', 1048577))",
                task.id, task.token
            ),
            format!(
                "SELECT sheaf.dead_letter('{}', {}, repeat('e', 1048577))",
                task.id, task.token
            ),
            format!(
                "SELECT sheaf.set_progress('{}', {}, to_jsonb(repeat('p', 65535)))",
                task.id, task.token
            ),
            format!("SELECT sheaf.cancel_task('{}', repeat('r', 1048577))", task.id),
            format!("SELECT sheaf.cancel_execution('{exec}', repeat('r', 1048577))"),
            format!("SELECT sheaf.terminate_execution('{exec}', repeat('r', 1048577))"),
            "SELECT sheaf.cancel_pending_start('w', 'k', repeat('r', 1048577))".to_owned(),
            // A child's reason crosses shards in the relay's 8 KiB message.
            format!("SELECT sheaf.cancel_child('{exec}', '{exec}', repeat('r', 8193))"),
        ];
        let written = "SELECT (SELECT count(*) FROM sheaf.tasks) + (SELECT count(*) FROM sheaf.events) \
                       + (SELECT count(*) FROM sheaf.executions) + (SELECT count(*) FROM sheaf.dead_letters) \
                       + (SELECT count(*) FROM sheaf.task_cancellations)";
        for sql in &calls {
            let before = count(written);
            let (code, message) = outcome(sql, &[]);
            assert_eq!(code, "54000", "{sql}: {message}");
            assert!(message.contains(" is too large: is "), "{message}");
            assert!(message.len() < 200, "the value is not echoed: {message}");
            assert_eq!(count(written), before, "{sql} wrote nothing");
        }
        // Exactly at the limit is taken, whole.
        let at = "to_jsonb(repeat('x', 1048574))";
        assert_eq!(outcome(&format!("SELECT sheaf.enqueue('q', {at})"), &[]).0, "ok");
        assert_eq!(
            outcome(&format!("SELECT sheaf.signal('{exec}', 's', {at})"), &[]).0,
            "ok"
        );
        // An error under the limit is kept whole (it used to be cut at 8 KB).
        Spi::run_with_args(
            "SELECT sheaf.fail($1, $2, repeat('e', 100000), '1 hour')",
            &[task.id.into(), task.token.into()],
        )
        .expect("fail");
        let kept: Kept = one(
            "SELECT last_error FROM sheaf.tasks WHERE id = $1",
            &[task.id.into()],
        );
        assert_eq!(kept.last_error, "e".repeat(100_000));
    }

    /// `run_at` is from the Unix epoch to the end of year 9999 UTC.
    #[pg_test]
    fn run_at_is_bounded() {
        init();
        for (at, code) in [
            ("1969-12-31T23:59:59.999999Z", "22023"),
            ("1970-01-01T00:00:00Z", "ok"),
            ("9999-12-31T23:59:59.999999Z", "ok"),
            ("10000-01-01T00:00:00Z", "22023"),
            ("4714-11-24 00:00:00+00 BC", "22023"),
            ("294276-12-31 23:59:59+00", "22023"),
        ] {
            for sql in [
                "SELECT sheaf.enqueue('q', '{}', jsonb_build_object('run_at', $1::text))",
                "SELECT sheaf.start_workflow('w', 'r' || md5($1), '{}', jsonb_build_object('run_at', $1::text))",
            ] {
                let (got, message) = outcome(sql, &[at.into()]);
                assert_eq!(got, code, "{sql} at {at}: {message}");
                if code != "ok" {
                    assert!(
                        message.starts_with("invalid opts.run_at: must be a timestamp"),
                        "{message}"
                    );
                }
            }
        }
    }

    /// A metered value is a number of magnitude at most 1e15.
    #[pg_test]
    fn metered_values_are_bounded() {
        init();
        let exec = start("w", "m", json!({})).id;
        let record = "SELECT sheaf.record_usage($1, jsonb_build_object('m', $2::numeric))";
        for (value, code) in [
            ("1e15", "ok"),
            ("-1e15", "ok"),
            ("1000000000000001", "22023"),
            ("1e308", "22023"),
        ] {
            let (got, message) = outcome(record, &[exec.into(), value.into()]);
            assert_eq!(got, code, "{value}: {message}");
        }
    }
}
