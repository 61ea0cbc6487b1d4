//! Argument checks shared by every function: NULLs, arrays, keys, leases.
//! Each refusal names the argument (22004 for NULL, 22023 for a bad value).

use pgrx::datum::Interval;
use sheaf_core::options::check_key;

use crate::base::errors::{bad_argument, null_argument};

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
