//! Retry delays: exponential backoff with jitter.

/// The first retry waits about this long.
pub const BASE_MS: u64 = 1_000;
/// No retry waits longer than this (before jitter).
pub const CAP_MS: u64 = 3_600_000;

/// The delay before retrying after failed attempt number `attempt` (1-based).
/// `jitter` in `[0, 1)` spreads the delay over ±25% so a burst of failures
/// does not retry in lockstep.
pub fn retry_delay_ms(attempt: u32, jitter: f64) -> u64 {
    let exp = attempt.saturating_sub(1).min(32);
    let base = BASE_MS.saturating_mul(1u64 << exp).min(CAP_MS);
    let factor = 0.75 + 0.5 * jitter.clamp(0.0, 1.0);
    (base as f64 * factor) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_then_caps() {
        assert_eq!(retry_delay_ms(1, 0.5), 1_000);
        assert_eq!(retry_delay_ms(2, 0.5), 2_000);
        assert_eq!(retry_delay_ms(5, 0.5), 16_000);
        assert_eq!(retry_delay_ms(30, 0.5), CAP_MS);
        assert_eq!(retry_delay_ms(u32::MAX, 0.5), CAP_MS);
    }

    #[test]
    fn jitter_stays_within_a_quarter() {
        assert_eq!(retry_delay_ms(3, 0.0), 3_000);
        assert_eq!(retry_delay_ms(3, 0.999_999), 4_999);
        assert_eq!(retry_delay_ms(0, 0.5), 1_000);
    }
}
