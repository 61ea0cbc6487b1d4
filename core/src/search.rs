//! Search attributes (`start_workflow` opts `search_attrs`,
//! `sheaf.upsert_search_attrs`) and the filter of `sheaf.list_executions`.
//!
//! Attributes are a flat JSON object of strings, numbers and booleans. A
//! filter is a tree of `and` / `or` / `not` over leaves; [`Filter::compile`]
//! turns it into a SQL condition over `executions` whose every key and value
//! is a bound parameter. Comparisons are typed by the JSON value: a number is
//! compared as a number, a string byte-wise (`COLLATE "C"`, the same on every
//! shard whatever its collation), and values of different types never match.
//! Every leaf is two-valued (never NULL), so `not` is the exact complement.

use serde_json::{Map, Value};

use crate::excerpt::{excerpt, quoted};
use crate::options::OptionError;
use crate::state::ExecutionState;

/// The most attributes one execution may have.
pub const MAX_ATTRS: usize = 64;
/// The most bytes of compact JSON an execution's attributes may take.
pub const MAX_ATTRS_BYTES: usize = 16 * 1024;
/// The longest attribute key, in bytes.
pub const MAX_ATTR_KEY_BYTES: usize = 256;
/// The most values of one `state`, `workflow_name` or `in` list.
pub const MAX_SET: usize = 1000;
/// The deepest a filter tree may nest.
const MAX_DEPTH: usize = 16;
/// The most leaves a filter may have.
const MAX_LEAVES: usize = 64;

fn err(option: &str, why: impl Into<String>) -> OptionError {
    OptionError {
        option: option.to_owned(),
        why: why.into(),
    }
}

/// An attribute key: 1 to 256 bytes.
pub fn check_attr_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_ATTR_KEY_BYTES {
        return Err(format!(
            "an attribute key must be 1 to {MAX_ATTR_KEY_BYTES} bytes, got {}",
            key.len()
        ));
    }
    Ok(())
}

fn check_attr(option: &str, key: &str, value: &Value) -> Result<(), OptionError> {
    check_attr_key(key).map_err(|why| err(option, why))?;
    match value {
        Value::String(_) | Value::Number(_) | Value::Bool(_) => Ok(()),
        other => Err(err(
            option,
            format!(
                "attribute {} must be a string, a number or a boolean, got {}",
                quoted(key),
                excerpt(other)
            ),
        )),
    }
}

/// A whole set of attributes, as stored: a flat object of at most 64 keys
/// and 16 KB of compact JSON.
pub fn check_attrs(option: &str, attrs: &Value) -> Result<(), OptionError> {
    let Some(map) = attrs.as_object() else {
        return Err(err(
            option,
            format!("must be a flat JSON object, got {}", excerpt(attrs)),
        ));
    };
    if map.len() > MAX_ATTRS {
        return Err(err(
            option,
            format!("at most {MAX_ATTRS} attributes, got {}", map.len()),
        ));
    }
    for (key, value) in map {
        check_attr(option, key, value)?;
    }
    let bytes = attrs.to_string().len();
    if bytes > MAX_ATTRS_BYTES {
        return Err(err(
            option,
            format!("at most {MAX_ATTRS_BYTES} bytes of JSON, got {bytes}"),
        ));
    }
    Ok(())
}

/// `current` with `update` merged in: a key set to null is removed, every
/// other key set. The result must pass [`check_attrs`].
pub fn merge_attrs(option: &str, current: &Value, update: &Value) -> Result<Value, OptionError> {
    let Some(changes) = update.as_object() else {
        return Err(err(
            option,
            format!("must be a flat JSON object, got {}", excerpt(update)),
        ));
    };
    let mut merged: Map<String, Value> = current.as_object().cloned().unwrap_or_default();
    for (key, value) in changes {
        if value.is_null() {
            check_attr_key(key).map_err(|why| err(option, why))?;
            merged.remove(key);
        } else {
            check_attr(option, key, value)?;
            merged.insert(key.clone(), value.clone());
        }
    }
    let merged = Value::Object(merged);
    check_attrs(option, &merged).map_err(|e| err(&e.option, format!("after the merge, {}", e.why)))?;
    Ok(merged)
}

/// A comparison of an attribute with one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    fn parse(op: &str) -> Option<CmpOp> {
        Some(match op {
            "=" => CmpOp::Eq,
            "!=" => CmpOp::Ne,
            "<" => CmpOp::Lt,
            "<=" => CmpOp::Le,
            ">" => CmpOp::Gt,
            ">=" => CmpOp::Ge,
            _ => return None,
        })
    }

    /// The SQL operator.
    pub fn as_str(self) -> &'static str {
        match self {
            CmpOp::Eq => "=",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }
}

/// What an attribute leaf tests.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrTest {
    /// The attribute is present, of the value's JSON type, and compares so.
    Cmp(CmpOp, Value),
    /// The attribute equals one of the values (each typed, as `=`).
    In(Vec<Value>),
    /// The attribute is present, whatever its value.
    Exists,
}

/// A timestamp as the caller wrote it (the extension parses it as a
/// `timestamptz`) and where in the filter, for its error.
#[derive(Debug, Clone, PartialEq)]
pub struct At {
    pub text: String,
    pub option: String,
}

/// A parsed `list_executions` filter.
#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    And(Vec<Filter>),
    Or(Vec<Filter>),
    Not(Box<Filter>),
    State(Vec<ExecutionState>),
    WorkflowName(Vec<String>),
    /// `created_at > at` (exclusive).
    CreatedAfter(At),
    /// `created_at < at` (exclusive).
    CreatedBefore(At),
    Attr {
        key: String,
        test: AttrTest,
    },
}

/// One bound parameter of a compiled filter, in placeholder order.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    Text(String),
    TextArray(Vec<String>),
    Jsonb(Value),
    JsonbArray(Vec<Value>),
    Timestamp(At),
}

const SCANNING_OR: &str = "every branch of an or must use an index (an attribute test with =, in or \
     exists, or a state or workflow_name list, or an and holding one); this one would read every execution";

struct Parser {
    leaves: usize,
}

impl Filter {
    /// Parses and checks a filter (`{}` matches every execution). Refuses,
    /// naming the node by its path (`filter.or[1]`), a malformed node, and an
    /// `or` with a branch that no index serves ([`Filter::uses_index`]).
    pub fn parse(value: &Value) -> Result<Filter, OptionError> {
        if value.as_object().is_some_and(Map::is_empty) {
            return Ok(Filter::And(Vec::new()));
        }
        Parser { leaves: 0 }.node("filter", value, 1)
    }

    /// Whether an index can find this node's rows without reading every
    /// execution: a state or workflow_name list, an attribute `=`, `in` or
    /// `exists` (the GIN index on `search_attrs`), an `and` with such a
    /// part, an `or` of such branches.
    pub fn uses_index(&self) -> bool {
        match self {
            Filter::State(_) | Filter::WorkflowName(_) => true,
            Filter::Attr { test, .. } => !matches!(test, AttrTest::Cmp(op, _) if *op != CmpOp::Eq),
            Filter::And(parts) => parts.iter().any(Filter::uses_index),
            Filter::Or(branches) => branches.iter().all(Filter::uses_index),
            Filter::Not(_) | Filter::CreatedAfter(_) | Filter::CreatedBefore(_) => false,
        }
    }

    /// The filter as a SQL condition over `executions`, its placeholders
    /// numbered from `$first`, and their values in order.
    pub fn compile(&self, first: usize) -> (String, Vec<Param>) {
        let mut params = Vec::new();
        let sql = self.sql(first, &mut params);
        (sql, params)
    }

    fn sql(&self, first: usize, params: &mut Vec<Param>) -> String {
        let mut bind = |p: Param| {
            params.push(p);
            format!("${}", first + params.len() - 1)
        };
        match self {
            Filter::And(parts) if parts.is_empty() => "true".to_owned(),
            Filter::And(parts) => join(parts, " AND ", first, params),
            Filter::Or(branches) => join(branches, " OR ", first, params),
            Filter::Not(inner) => format!("(NOT {})", inner.sql(first, params)),
            Filter::State(states) => format!(
                "state = ANY({}::text[])",
                bind(Param::TextArray(
                    states.iter().map(|s| s.as_str().to_owned()).collect()
                ))
            ),
            Filter::WorkflowName(names) => format!(
                "workflow_name = ANY({}::text[])",
                bind(Param::TextArray(names.clone()))
            ),
            Filter::CreatedAfter(at) => format!("created_at > {}", bind(Param::Timestamp(at.clone()))),
            Filter::CreatedBefore(at) => format!("created_at < {}", bind(Param::Timestamp(at.clone()))),
            Filter::Attr { key, test } => attr_sql(key, test, &mut bind),
        }
    }
}

fn join(parts: &[Filter], op: &str, first: usize, params: &mut Vec<Param>) -> String {
    let parts: Vec<String> = parts.iter().map(|p| p.sql(first, params)).collect();
    format!("({})", parts.join(op))
}

fn single(key: &str, value: &Value) -> Value {
    Value::Object(Map::from_iter([(key.to_owned(), value.clone())]))
}

/// One attribute leaf. `=` and `in` are containment (`@>`, which the GIN
/// index serves and which compares typed: `5` never contains `"5"`);
/// `exists` is `?`; the others read the value only when its JSON type is
/// the operand's, inside a CASE so no cast runs on another type.
fn attr_sql(key: &str, test: &AttrTest, bind: &mut impl FnMut(Param) -> String) -> String {
    match test {
        AttrTest::Exists => format!("search_attrs ? {}", bind(Param::Text(key.to_owned()))),
        AttrTest::In(values) => format!(
            "search_attrs @> ANY({}::jsonb[])",
            bind(Param::JsonbArray(values.iter().map(|v| single(key, v)).collect()))
        ),
        AttrTest::Cmp(CmpOp::Eq, value) => {
            format!(
                "search_attrs @> {}::jsonb",
                bind(Param::Jsonb(single(key, value)))
            )
        }
        AttrTest::Cmp(CmpOp::Ne, value) => {
            let k = bind(Param::Text(key.to_owned()));
            let v = bind(Param::Jsonb(single(key, value)));
            format!(
                "(coalesce(jsonb_typeof(search_attrs -> {k}::text) = '{}', false) AND NOT search_attrs @> {v}::jsonb)",
                json_type(value)
            )
        }
        AttrTest::Cmp(op, value) => {
            let k = bind(Param::Text(key.to_owned()));
            let (kind, read, operand) = match value {
                Value::Number(_) => (
                    "number",
                    format!("(search_attrs -> {k}::text)::numeric"),
                    format!("({}::jsonb)::numeric", bind(Param::Jsonb(value.clone()))),
                ),
                _ => (
                    "string",
                    format!("(search_attrs ->> {k}::text) COLLATE \"C\""),
                    format!(
                        "{}::text COLLATE \"C\"",
                        bind(Param::Text(value.as_str().unwrap_or_default().to_owned()))
                    ),
                ),
            };
            format!(
                "coalesce(CASE WHEN jsonb_typeof(search_attrs -> {k}::text) = '{kind}' \
                 THEN {read} {} {operand} END, false)",
                op.as_str()
            )
        }
    }
}

/// The name `jsonb_typeof` gives a scalar's type.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Number(_) => "number",
        Value::Bool(_) => "boolean",
        _ => "string",
    }
}

impl Parser {
    fn node(&mut self, path: &str, value: &Value, depth: usize) -> Result<Filter, OptionError> {
        if depth > MAX_DEPTH {
            return Err(err(
                path,
                format!("the filter nests deeper than {MAX_DEPTH} levels"),
            ));
        }
        let Some(map) = value.as_object() else {
            return Err(err(
                path,
                format!("must be a JSON object, got {}", excerpt(value)),
            ));
        };
        if map.contains_key("attr") {
            return self.attr(path, map);
        }
        let mut keys = map.keys();
        let (Some(kind), None) = (keys.next(), keys.next()) else {
            return Err(err(
                path,
                format!(
                    "must have exactly one of and, or, not, state, workflow_name, created_after, \
                     created_before, or be an attribute test (attr, op, value); got {} fields",
                    map.len()
                ),
            ));
        };
        let inner = &map[kind];
        let here = format!("{path}.{kind}");
        match kind.as_str() {
            "and" => Ok(Filter::And(self.branches(&here, inner, depth)?)),
            "or" => {
                let branches = self.branches(&here, inner, depth)?;
                if let Some(i) = branches.iter().position(|b| !b.uses_index()) {
                    return Err(err(&format!("{here}[{i}]"), SCANNING_OR));
                }
                Ok(Filter::Or(branches))
            }
            "not" => Ok(Filter::Not(Box::new(self.node(&here, inner, depth + 1)?))),
            "state" => {
                self.leaf(&here)?;
                let names = strings(&here, inner)?;
                let states = names
                    .iter()
                    .map(|n| {
                        ExecutionState::ALL
                            .into_iter()
                            .find(|s| s.as_str() == n)
                            .ok_or_else(|| err(&here, format!("{} is not an execution state", quoted(n))))
                    })
                    .collect::<Result<_, _>>()?;
                Ok(Filter::State(states))
            }
            "workflow_name" => {
                self.leaf(&here)?;
                Ok(Filter::WorkflowName(strings(&here, inner)?))
            }
            "created_after" | "created_before" => {
                self.leaf(&here)?;
                let Some(text) = inner.as_str() else {
                    return Err(err(
                        &here,
                        format!("must be a timestamp string, got {}", excerpt(inner)),
                    ));
                };
                let at = At {
                    text: text.to_owned(),
                    option: here.clone(),
                };
                Ok(if kind == "created_after" {
                    Filter::CreatedAfter(at)
                } else {
                    Filter::CreatedBefore(at)
                })
            }
            other => Err(err(path, format!("unknown filter {}", quoted(other)))),
        }
    }

    fn branches(&mut self, path: &str, value: &Value, depth: usize) -> Result<Vec<Filter>, OptionError> {
        let Some(items) = value.as_array() else {
            return Err(err(
                path,
                format!("must be an array of filters, got {}", excerpt(value)),
            ));
        };
        if items.is_empty() {
            return Err(err(path, "must hold at least one filter"));
        }
        items
            .iter()
            .enumerate()
            .map(|(i, item)| self.node(&format!("{path}[{i}]"), item, depth + 1))
            .collect()
    }

    fn leaf(&mut self, path: &str) -> Result<(), OptionError> {
        self.leaves += 1;
        if self.leaves > MAX_LEAVES {
            return Err(err(path, format!("a filter has at most {MAX_LEAVES} tests")));
        }
        Ok(())
    }

    fn attr(&mut self, path: &str, map: &Map<String, Value>) -> Result<Filter, OptionError> {
        self.leaf(path)?;
        if let Some(extra) = map
            .keys()
            .find(|k| !["attr", "op", "value"].contains(&k.as_str()))
        {
            return Err(err(
                path,
                format!("unknown field {} (accepted: attr, op, value)", quoted(extra)),
            ));
        }
        let key = match &map["attr"] {
            Value::String(key) => key,
            other => {
                return Err(err(
                    &format!("{path}.attr"),
                    format!("must be a string, got {}", excerpt(other)),
                ));
            }
        };
        check_attr_key(key).map_err(|why| err(&format!("{path}.attr"), why))?;
        let op_path = format!("{path}.op");
        let op = match map.get("op") {
            Some(Value::String(op)) => op.as_str(),
            Some(other) => return Err(err(&op_path, format!("must be a string, got {}", excerpt(other)))),
            None => return Err(err(&op_path, "is missing (=, !=, <, <=, >, >=, in or exists)")),
        };
        let value_path = format!("{path}.value");
        let value = map.get("value");
        let test = match (op, value) {
            ("exists", None) => AttrTest::Exists,
            ("exists", Some(_)) => return Err(err(&value_path, "exists takes no value")),
            (_, None) => return Err(err(&value_path, format!("is missing (op {op} takes one)"))),
            ("in", Some(v)) => {
                let items = v.as_array().ok_or_else(|| {
                    err(
                        &value_path,
                        format!("in takes an array of values, got {}", excerpt(v)),
                    )
                })?;
                if items.is_empty() || items.len() > MAX_SET {
                    return Err(err(
                        &value_path,
                        format!("in takes 1 to {MAX_SET} values, got {}", items.len()),
                    ));
                }
                for item in items {
                    scalar(&value_path, item)?;
                }
                AttrTest::In(items.clone())
            }
            (op, Some(v)) => {
                let Some(cmp) = CmpOp::parse(op) else {
                    return Err(err(
                        &op_path,
                        format!(
                            "must be one of =, !=, <, <=, >, >=, in, exists; got {}",
                            quoted(op)
                        ),
                    ));
                };
                scalar(&value_path, v)?;
                if v.is_boolean() && !matches!(cmp, CmpOp::Eq | CmpOp::Ne) {
                    return Err(err(
                        &value_path,
                        format!("{op} compares numbers or strings, got a boolean"),
                    ));
                }
                AttrTest::Cmp(cmp, v.clone())
            }
        };
        Ok(Filter::Attr {
            key: key.clone(),
            test,
        })
    }
}

fn scalar(path: &str, value: &Value) -> Result<(), OptionError> {
    match value {
        Value::String(_) | Value::Number(_) | Value::Bool(_) => Ok(()),
        other => Err(err(
            path,
            format!("must be a string, a number or a boolean, got {}", excerpt(other)),
        )),
    }
}

/// A `state` or `workflow_name` list: 1 to 1000 strings of 1 to 256 bytes.
fn strings(path: &str, value: &Value) -> Result<Vec<String>, OptionError> {
    let Some(items) = value.as_array() else {
        return Err(err(
            path,
            format!("must be an array of strings, got {}", excerpt(value)),
        ));
    };
    if items.is_empty() || items.len() > MAX_SET {
        return Err(err(
            path,
            format!("must hold 1 to {MAX_SET} strings, got {}", items.len()),
        ));
    }
    items
        .iter()
        .map(|item| match item {
            Value::String(s) if !s.is_empty() && s.len() <= 256 => Ok(s.clone()),
            Value::String(s) => Err(err(path, format!("each must be 1 to 256 bytes, got {}", s.len()))),
            other => Err(err(
                path,
                format!("each must be a string, got {}", excerpt(other)),
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(filter: Value) -> OptionError {
        Filter::parse(&filter).expect_err("refused")
    }

    #[test]
    fn attrs_are_flat_bounded_scalars() {
        check_attrs(
            "opts.search_attrs",
            &json!({"tenant": "acme", "n": 5, "vip": true}),
        )
        .unwrap();
        let e = check_attrs("opts.search_attrs", &json!({"a": {"b": 1}})).unwrap_err();
        assert_eq!(e.option, "opts.search_attrs");
        assert!(e.why.contains("\"a\""), "{}", e.why);
        assert!(check_attrs("x", &json!({"a": null})).is_err());
        assert!(check_attrs("x", &json!([1])).is_err());
        assert!(check_attrs("x", &json!({"": 1})).is_err());
        let many: Map<String, Value> = (0..65).map(|i| (format!("k{i}"), json!(i))).collect();
        assert!(
            check_attrs("x", &Value::Object(many))
                .unwrap_err()
                .why
                .contains("64")
        );
        let big = json!({"a": "x".repeat(MAX_ATTRS_BYTES)});
        let e = check_attrs("x", &big).unwrap_err();
        assert!(e.why.len() < 200, "never echoes the value: {}", e.why);
    }

    #[test]
    fn a_merge_sets_and_a_null_removes() {
        let merged = merge_attrs(
            "attrs",
            &json!({"a": 1, "b": "x"}),
            &json!({"b": null, "c": true}),
        )
        .unwrap();
        assert_eq!(merged, json!({"a": 1, "c": true}));
        assert_eq!(
            merge_attrs("attrs", &json!({}), &json!({"gone": null})).unwrap(),
            json!({})
        );
        let full: Map<String, Value> = (0..64).map(|i| (format!("k{i}"), json!(i))).collect();
        let e = merge_attrs("attrs", &Value::Object(full), &json!({"one_more": 1})).unwrap_err();
        assert!(e.why.starts_with("after the merge"), "{}", e.why);
    }

    #[test]
    fn the_empty_filter_matches_everything() {
        let f = Filter::parse(&json!({})).unwrap();
        assert_eq!(f.compile(1), ("true".to_owned(), vec![]));
    }

    #[test]
    fn a_tree_compiles_to_bound_parameters_only() {
        let f = Filter::parse(&json!({"and": [
            {"state": ["RUNNING"]},
            {"attr": "tenant'; DROP TABLE executions; --", "op": "=", "value": "a'b"},
            {"not": {"attr": "n", "op": "<", "value": 5}},
            {"created_after": "2026-01-01T00:00:00Z"}
        ]}))
        .unwrap();
        let (sql, params) = f.compile(3);
        assert!(!sql.contains("DROP") && !sql.contains("a'b"), "{sql}");
        assert!(sql.contains("$3::text[]") && sql.contains("$7"), "{sql}");
        assert_eq!(params.len(), 5, "{params:?}");
        assert_eq!(params[0], Param::TextArray(vec!["RUNNING".into()]));
        assert!(matches!(&params[4], Param::Timestamp(at) if at.option == "filter.and[3].created_after"));
    }

    #[test]
    fn strings_compare_bytewise_and_numbers_as_numbers() {
        let (sql, params) = Filter::parse(&json!({"attr": "k", "op": ">=", "value": "m"}))
            .unwrap()
            .compile(1);
        assert!(sql.contains("COLLATE \"C\"") && sql.contains("'string'"), "{sql}");
        assert_eq!(params, vec![Param::Text("k".into()), Param::Text("m".into())]);
        let (sql, _) = Filter::parse(&json!({"attr": "k", "op": "<", "value": 1.5}))
            .unwrap()
            .compile(1);
        assert!(sql.contains("::numeric") && sql.contains("'number'"), "{sql}");
    }

    #[test]
    fn an_or_needs_an_index_on_every_branch() {
        Filter::parse(&json!({"or": [
            {"attr": "a", "op": "=", "value": 1},
            {"and": [{"state": ["FAILED"]}, {"attr": "n", "op": ">", "value": 3}]},
            {"attr": "b", "op": "exists"}
        ]}))
        .unwrap();
        let e = refused(json!({"or": [{"state": ["FAILED"]}, {"attr": "n", "op": ">", "value": 3}]}));
        assert_eq!(e.option, "filter.or[1]");
        let e =
            refused(json!({"and": [{"or": [{"workflow_name": ["w"]}, {"not": {"state": ["RUNNING"]}}]}]}));
        assert_eq!(e.option, "filter.and[0].or[1]");
        assert_eq!(
            refused(json!({"or": [{"created_after": "2026-01-01"}]})).option,
            "filter.or[0]"
        );
    }

    #[test]
    fn malformed_nodes_are_named() {
        let cases = [
            (json!({"state": ["NOPE"]}), "filter.state"),
            (json!({"state": []}), "filter.state"),
            (json!({"workflow_name": [1]}), "filter.workflow_name"),
            (json!({"and": []}), "filter.and"),
            (json!({"and": [{"x": 1}]}), "filter.and[0]"),
            (json!({"state": ["RUNNING"], "workflow_name": ["w"]}), "filter"),
            (json!({"attr": "a", "op": "~", "value": 1}), "filter.op"),
            (json!({"attr": "a", "op": "="}), "filter.value"),
            (json!({"attr": "a", "op": "exists", "value": 1}), "filter.value"),
            (json!({"attr": "a", "op": "<", "value": true}), "filter.value"),
            (json!({"attr": "a", "op": "=", "value": null}), "filter.value"),
            (json!({"attr": "a", "op": "in", "value": []}), "filter.value"),
            (json!({"attr": "a", "op": "in", "value": [[1]]}), "filter.value"),
            (json!({"attr": "", "op": "exists"}), "filter.attr"),
            (json!({"attr": 7, "op": "exists"}), "filter.attr"),
            (json!({"attr": "a", "op": "exists", "extra": 1}), "filter"),
            (json!({"created_before": 5}), "filter.created_before"),
            (json!([]), "filter"),
            (json!({"not": {"not": "x"}}), "filter.not.not"),
        ];
        for (filter, path) in cases {
            let e = refused(filter.clone());
            assert_eq!(e.option, path, "{filter}: {}", e.why);
        }
    }

    #[test]
    fn depth_and_size_are_bounded() {
        let mut deep = json!({"state": ["RUNNING"]});
        for _ in 0..MAX_DEPTH {
            deep = json!({"not": deep});
        }
        assert!(refused(deep).why.contains("deeper"));
        let wide: Vec<Value> = (0..=MAX_LEAVES).map(|_| json!({"state": ["RUNNING"]})).collect();
        assert!(refused(json!({"and": wide})).why.contains("at most 64"));
        let huge = json!({"attr": "a", "op": "=", "value": {"x": "y".repeat(10_000)}});
        assert!(refused(huge).why.len() < 300);
    }
}
