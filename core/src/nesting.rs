//! One nesting rule for every `jsonb` value sheaf accepts.
//!
//! sheaf reads values back with serde_json (the extension for options,
//! inputs, results and history events; the driver for everything it
//! decodes), whose parser stops at 128 levels. A value sheaf stores must stay
//! readable after sheaf wraps it (a result inside a history event adds two
//! levels), so every `jsonb` argument, task payloads included, may nest at
//! most [`MAX_DEPTH`] levels; deeper values are refused when they arrive.

use serde_json::Value;

/// The deepest nesting of arrays and objects sheaf accepts in a value
/// (`1` is `[]` or `{}`; a scalar is 0).
pub const MAX_DEPTH: usize = 100;

/// How deep `value` nests arrays and objects, walked without recursion.
pub fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, d)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        deepest = deepest.max(d + 1);
        stack.extend(children.map(|c| (c, d + 1)));
    }
    deepest
}

/// The refusal's reason, or `None` when `depth` is within the rule.
pub fn check_depth(depth: usize) -> Result<(), String> {
    if depth > MAX_DEPTH {
        Err(format!(
            "nests {depth} levels of arrays and objects; at most {MAX_DEPTH} are accepted"
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested(levels: usize) -> String {
        format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
    }

    #[test]
    fn counts_levels_of_arrays_and_objects() {
        assert_eq!(depth(&json!(1)), 0);
        assert_eq!(depth(&json!([])), 1);
        assert_eq!(depth(&json!({"a": [1, {"b": {}}]})), 4);
        assert_eq!(depth(&json!([[], [[[]]], 2])), 4);
    }

    #[test]
    fn the_deepest_accepted_value_survives_two_wrappings() {
        let v: Value = serde_json::from_str(&nested(MAX_DEPTH)).unwrap();
        assert_eq!(depth(&v), MAX_DEPTH);
        assert!(check_depth(MAX_DEPTH).is_ok());
        assert!(check_depth(MAX_DEPTH + 1).unwrap_err().contains("at most 100"));
        // What serde_json can parse back once sheaf has wrapped the value
        // (a history event around a result) must include the deepest one.
        let wrapped = json!({"type": "TaskCompleted", "payload": {"result": v}});
        assert!(serde_json::from_str::<Value>(&wrapped.to_string()).is_ok());
    }
}
