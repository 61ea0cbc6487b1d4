//! Argument values the commands share: durations and times.

use std::time::{Duration, SystemTime};

use crate::output::cut;

/// A duration as `500ms` or `5s` (a bare number is seconds).
pub fn duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 500ms or 5s"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        _ => Err(format!("`{s}` is not a duration like 500ms or 5s")),
    }
}

/// A duration as humantime reads it (`90s`, `10m`, `2h 30m`).
pub fn human_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("`{s}` is not a duration like 30s, 10m or 2h: {e}"))
}

/// `--older-than` as a duration (`7days`, `1h`, `0s`).
pub fn age(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("`{}` is not a duration like 1h or 7days: {e}", cut(s, 40)))
}

/// A `--from`/`--to` time: a duration back from now (`24h`, `7days`,
/// `90min`) or a timestamp (`2026-11-01T00:00:00Z`, `2026-11-01 00:00:00`).
pub fn time(text: &str) -> Result<SystemTime, String> {
    if let Ok(ago) = humantime::parse_duration(text) {
        return SystemTime::now()
            .checked_sub(ago)
            .ok_or_else(|| format!("{text:?} reaches before the epoch"));
    }
    humantime::parse_rfc3339_weak(text).map_err(|_| {
        format!("{text:?} is neither a duration back from now (24h) nor a timestamp (2026-11-01T00:00:00Z)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_durations_back_or_timestamps() {
        let day_ago = time("24h").unwrap();
        let back = SystemTime::now().duration_since(day_ago).unwrap();
        assert!(back >= Duration::from_secs(86_399) && back <= Duration::from_secs(86_460));
        assert_eq!(
            time("1970-01-02T00:00:00Z").unwrap(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(86_400)
        );
        assert!(time("yesterday").is_err());
    }
}
