//! The usage report (`sheaf.usage_report`) and the cost ledger
//! (`sheaf.record_usage`): what a report groups by, the window it may span,
//! and the metrics a caller may record.

use serde_json::Value;

use crate::excerpt::{excerpt, quoted};
use crate::options::OptionError;
use crate::search::check_attr_key;

/// The widest window one report may span: its cost follows the rows in the
/// window, and a wider one is a job for a warehouse, not the shard.
pub const MAX_WINDOW_DAYS: i64 = 90;
/// The most metrics one `record_usage` call may carry.
pub const MAX_METRICS: usize = 32;
/// The longest metric name, in bytes.
pub const MAX_METRIC_BYTES: usize = 128;
/// The largest magnitude of one metered value: integers this large are
/// exact in a float8, and a report's sum of millions of them still is a
/// number every client reads (1e308 summed overflowed a float8).
pub const MAX_METRIC_VALUE: f64 = 1e15;
/// The group of executions that lack the search attribute grouped by.
pub const UNATTRIBUTED: &str = "(unattributed)";

fn err(option: &str, why: impl Into<String>) -> OptionError {
    OptionError {
        option: option.to_owned(),
        why: why.into(),
    }
}

/// What a usage report's rows are per.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupBy {
    /// The execution's workflow name.
    WorkflowName,
    /// The value of the execution's search attribute (its text: a string as
    /// it is, a number or boolean as JSON writes it).
    SearchAttr(String),
}

impl GroupBy {
    /// `workflow_name` or `search_attr:<key>`.
    pub fn parse(text: &str) -> Result<GroupBy, OptionError> {
        if text == "workflow_name" {
            return Ok(GroupBy::WorkflowName);
        }
        match text.strip_prefix("search_attr:") {
            Some(key) => {
                check_attr_key(key).map_err(|why| err("group_by", why))?;
                Ok(GroupBy::SearchAttr(key.to_owned()))
            }
            None => Err(err(
                "group_by",
                format!("must be workflow_name or search_attr:<key>, got {}", quoted(text)),
            )),
        }
    }
}

/// A report's window, `[from, to)` in microseconds since the epoch: `from`
/// before `to`, at most [`MAX_WINDOW_DAYS`] wide.
pub fn check_window(from_micros: i64, to_micros: i64) -> Result<(), OptionError> {
    if to_micros <= from_micros {
        return Err(err("to_ts", "must be after from_ts"));
    }
    let max = MAX_WINDOW_DAYS * 86_400 * 1_000_000;
    if to_micros.saturating_sub(from_micros) > max {
        return Err(err(
            "to_ts",
            format!(
                "the window may span at most {MAX_WINDOW_DAYS} days; report longer periods window by window"
            ),
        ));
    }
    Ok(())
}

/// A `record_usage` metrics object: 1 to 32 metrics, each a name of 1 to
/// 128 bytes and a number of magnitude at most [`MAX_METRIC_VALUE`].
pub fn check_metrics(metrics: &Value) -> Result<(), OptionError> {
    let Some(map) = metrics.as_object() else {
        return Err(err(
            "metrics",
            format!("must be a JSON object of numbers, got {}", excerpt(metrics)),
        ));
    };
    if map.is_empty() || map.len() > MAX_METRICS {
        return Err(err(
            "metrics",
            format!("must hold 1 to {MAX_METRICS} metrics, got {}", map.len()),
        ));
    }
    for (name, value) in map {
        if name.is_empty() || name.len() > MAX_METRIC_BYTES {
            return Err(err(
                "metrics",
                format!(
                    "a metric name must be 1 to {MAX_METRIC_BYTES} bytes, got {}",
                    name.len()
                ),
            ));
        }
        let bounded = match value {
            Value::Number(n) => n
                .as_f64()
                .is_some_and(|v| v.is_finite() && v.abs() <= MAX_METRIC_VALUE),
            _ => false,
        };
        if !bounded {
            return Err(err(
                "metrics",
                format!(
                    "metric {} must be a number from -1e15 to 1e15, got {}",
                    quoted(name),
                    excerpt(value)
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn group_by_is_a_workflow_name_or_an_attribute() {
        assert_eq!(GroupBy::parse("workflow_name").unwrap(), GroupBy::WorkflowName);
        assert_eq!(
            GroupBy::parse("search_attr:tenant").unwrap(),
            GroupBy::SearchAttr("tenant".into())
        );
        assert_eq!(GroupBy::parse("search_attr:").unwrap_err().option, "group_by");
        assert!(
            GroupBy::parse("tenant")
                .unwrap_err()
                .why
                .contains("search_attr:<key>")
        );
        let long = format!("search_attr:{}", "k".repeat(300));
        assert!(GroupBy::parse(&long).is_err());
    }

    #[test]
    fn a_window_is_forward_and_at_most_90_days() {
        let day = 86_400 * 1_000_000;
        check_window(0, day).unwrap();
        check_window(0, 90 * day).unwrap();
        assert!(check_window(0, 90 * day + 1).unwrap_err().why.contains("90 days"));
        assert!(check_window(day, day).is_err());
        assert!(check_window(i64::MIN, i64::MAX).is_err());
    }

    #[test]
    fn metrics_are_finite_numbers() {
        check_metrics(&json!({"llm_calls": 1, "cost_usd": 0.25, "max": 1e15, "min": -1e15})).unwrap();
        for bad in [
            json!({}),
            json!([1]),
            json!({"a": "1"}),
            json!({"a": null}),
            json!({"": 1}),
            json!({"a": {"b": 1}}),
            json!({"a": 1e308}),
            json!({"a": -1.000_000_000_000_1e15}),
        ] {
            assert!(check_metrics(&bad).is_err(), "{bad}");
        }
        let many: serde_json::Map<String, Value> = (0..33).map(|i| (format!("m{i}"), json!(i))).collect();
        assert!(check_metrics(&Value::Object(many)).is_err());
    }
}
