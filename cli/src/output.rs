//! What every command prints with: JSON, shard failures, times, cut columns.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde_json::Value;
use sheaf_driver::{ClientError, ShardId};

/// Each failed shard and why: what a fan-out call reports.
pub type Failures = BTreeMap<ShardId, ClientError>;

pub fn print_json(value: &Value) {
    match serde_json::to_string_pretty(value) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("sheaf: cannot encode the answer: {e}"),
    }
}

/// Each failed shard's id and error text.
pub fn failures_json(failures: &Failures) -> Value {
    failures
        .iter()
        .map(|(shard, e)| (shard.to_string(), Value::String(e.to_string())))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A time as RFC 3339, to the microsecond.
pub fn time(at: SystemTime) -> String {
    humantime::format_rfc3339_micros(at).to_string()
}

/// A column's text, cut to `width` characters.
pub fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_owned()
    } else {
        let mut s: String = text.chars().take(width - 1).collect();
        s.push('…');
        s
    }
}
