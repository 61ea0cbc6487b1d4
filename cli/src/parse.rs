//! Argument values the commands share: durations, times and JSON.

use std::io::Read;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::Value;
use sheaf_driver::ShardId;

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

/// A `--run-at` time: a timestamp (`2026-11-01T00:00:00Z`).
pub fn at(text: &str) -> Result<SystemTime, String> {
    humantime::parse_rfc3339_weak(text)
        .map_err(|_| format!("{:?} is not a timestamp like 2026-11-01T00:00:00Z", cut(text, 40)))
}

/// A `--shard` id (0 to the largest a topology may hold).
pub fn shard(text: &str) -> Result<ShardId, String> {
    let n: u32 = text
        .parse()
        .map_err(|_| format!("{:?} is not a shard id", cut(text, 40)))?;
    ShardId::new(n).map_err(|e| e.to_string())
}

/// A JSON value given inline (`--input`) or read from a file (`--input-file`,
/// `-` for stdin); null when neither is given. The error names the flag it
/// came from, so a script knows which argument to fix.
pub fn json_value(flag: &str, inline: Option<&str>, file: Option<&Path>) -> Result<Value, String> {
    let (text, from) = match (inline, file) {
        (Some(text), _) => (text.to_owned(), format!("--{flag}")),
        (None, Some(path)) => {
            let mut text = String::new();
            let read = if path == Path::new("-") {
                std::io::stdin().read_to_string(&mut text).map(drop)
            } else {
                std::fs::read_to_string(path).map(|t| text = t)
            };
            read.map_err(|e| format!("--{flag}-file {}: {e}", path.display()))?;
            (text, format!("--{flag}-file {}", path.display()))
        }
        (None, None) => return Ok(Value::Null),
    };
    serde_json::from_str(&text).map_err(|e| format!("{from} is not JSON: {e}"))
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

    #[test]
    fn json_values_name_the_flag_that_is_not_json() {
        assert_eq!(json_value("input", None, None).unwrap(), Value::Null);
        assert_eq!(json_value("input", Some(r#"{"a":1}"#), None).unwrap()["a"], 1);
        let e = json_value("input", Some("{not json"), None).unwrap_err();
        assert!(e.starts_with("--input is not JSON"), "{e}");
        let e = json_value("payload", None, Some(Path::new("/no/such/file"))).unwrap_err();
        assert!(e.starts_with("--payload-file /no/such/file"), "{e}");
    }

    #[test]
    fn run_at_is_a_timestamp_and_a_shard_an_id_in_range() {
        assert!(at("2026-11-01T00:00:00Z").is_ok());
        assert!(at("tomorrow").is_err());
        assert_eq!(shard("3").unwrap().get(), 3);
        assert!(shard("-1").is_err());
        assert!(shard("99999999").is_err());
    }
}
