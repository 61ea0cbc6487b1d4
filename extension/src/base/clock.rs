//! Times as microseconds since the Unix epoch, the unit `sheaf_core`
//! computes in (schedules, rate limits), and back.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use sheaf_core::excerpt::quoted;
use sheaf_core::hygiene::check_run_at;

use crate::base::errors::bad_argument;

/// PostgreSQL counts from 2000-01-01; Unix from 1970-01-01.
const PG_EPOCH_US: i64 = 946_684_800_000_000;

/// The transaction's start (`now()`).
pub fn now_us() -> i64 {
    // SAFETY: reads the transaction's start time, in a transaction.
    unsafe { pg_sys::GetCurrentTransactionStartTimestamp() + PG_EPOCH_US }
}

/// `t` in microseconds since the Unix epoch (an infinity saturates).
pub fn to_us(t: TimestampWithTimeZone) -> i64 {
    let pg: i64 = t.into();
    pg.saturating_add(PG_EPOCH_US)
}

/// Microseconds since the Unix epoch as a timestamp; out of range is
/// `infinity` (or `-infinity`), never an error.
pub fn from_us(us: i64) -> TimestampWithTimeZone {
    TimestampWithTimeZone::try_from(us.saturating_sub(PG_EPOCH_US)).unwrap_or_else(|_| {
        if us > 0 {
            TimestampWithTimeZone::positive_infinity()
        } else {
            TimestampWithTimeZone::negative_infinity()
        }
    })
}

/// A caller's `run_at`: a timestamp with time zone from the Unix epoch to
/// the end of year 9999 UTC (`sheaf_core::hygiene::check_run_at`), else
/// 22023 naming `arg`.
pub fn run_at(text: &str, arg: &str) -> TimestampWithTimeZone {
    match text.parse::<TimestampWithTimeZone>() {
        Ok(t) if t.is_finite() && check_run_at(to_us(t)).is_ok() => t,
        _ => bad_argument(
            arg,
            format!(
                "must be a timestamp with time zone from 1970-01-01 00:00:00 UTC to 9999-12-31 23:59:59.999999 UTC, got {}",
                quoted(text)
            ),
        ),
    }
}
