//! Durations in options (`opts.execution_timeout`, and the windows and
//! periods of schedules, rate limits and debounces): a string of
//! `humantime`'s form (`30s`, `2 seconds`, `1 hour`, `1h 30m`) or whole
//! seconds, within the bounds the option states. Never rounded into range.

use std::time::Duration;

use serde_json::Value;

use crate::excerpt::{excerpt, quoted};

/// Reads `value` as a duration from `min` to `max`; `Err` says why, for the
/// option the caller names.
pub fn parse(value: &Value, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = match value {
        Value::String(s) => humantime::parse_duration(s.trim()).map_err(|e| {
            format!(
                "{} is not a duration like \"30s\", \"2 minutes\" or \"1 hour\" ({e})",
                quoted(s)
            )
        })?,
        Value::Number(n) => match n.as_u64() {
            Some(secs) => Duration::from_secs(secs),
            None => return Err(format!("must be whole seconds, got {}", excerpt(value))),
        },
        _ => {
            return Err(format!(
                "must be a duration (\"30s\", \"1 hour\") or whole seconds, got {}",
                excerpt(value)
            ));
        }
    };
    if d < min || d > max {
        return Err(format!(
            "must be from {} to {}, got {}",
            humantime::format_duration(min),
            humantime::format_duration(max),
            humantime::format_duration(d)
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn strings_and_whole_seconds_are_read() {
        let ok = |v: Value| parse(&v, Duration::from_secs(1), DAY).unwrap();
        assert_eq!(ok(json!("2 seconds")), Duration::from_secs(2));
        assert_eq!(ok(json!("1 hour")), Duration::from_secs(3600));
        assert_eq!(ok(json!(" 1h 30m ")), Duration::from_secs(5400));
        assert_eq!(ok(json!(90)), Duration::from_secs(90));
    }

    #[test]
    fn out_of_range_and_malformed_are_refused() {
        for bad in [
            json!("0s"),
            json!("2 days"),
            json!("soon"),
            json!(-1),
            json!(1.5),
            json!(null),
            json!({}),
        ] {
            let e = parse(&bad, Duration::from_secs(1), DAY).unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
        let e = parse(&json!("x".repeat(10_000)), Duration::from_secs(1), DAY).unwrap_err();
        assert!(e.len() < 300, "a huge value is never echoed: {}", e.len());
    }
}
