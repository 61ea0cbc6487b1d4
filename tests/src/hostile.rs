//! Hostile argument values, per argument type, as SQL expressions: the
//! material of `tests/tests/hostile.rs`. Each value is cast to its type, so
//! a call with it resolves to the one function of that name.
//!
//! `base` is the argument of a valid call (an SQL expression), for values
//! derived from it: the same id under another shard's prefix, the same
//! array one element short, the same options with one field made hostile.

use crate::Rng;

/// 1 MiB: the "huge" text, jsonb string and array element.
pub const HUGE: usize = 1 << 20;

/// Arguments that take a caller's value for sheaf to store, and the most
/// bytes each takes (of compact JSON text, or of text): the one size limit,
/// 1 MiB (`sheaf_core::hygiene::MAX_VALUE_BYTES`), and progress's tighter
/// 64 KiB. Just over is refused with 54000, never cut.
pub const SIZED: &[(&str, usize)] = &[
    ("payload", 1 << 20),
    ("payloads", 1 << 20),
    ("input", 1 << 20),
    ("result", 1 << 20),
    ("error", 1 << 20),
    ("progress", 1 << 16),
];

/// Arguments that carry sheaf's own copy of what an entry point accepted,
/// not judged again (by size or by the name rule): a child the relay starts
/// on its shard (its name, id and input were taken by `start_child`), a
/// move's own error report.
pub const OWN_COPIES: &[(&str, &str)] = &[
    ("sheaf.relay_start_child", "name"),
    ("sheaf.relay_start_child", "workflow_id"),
    ("sheaf.relay_start_child", "input"),
    ("sheaf.migration_report", "error"),
];

/// A value of type `ty` (`jsonb`, `jsonb[]` or `text`) of exactly `bytes`
/// bytes: a JSON string's text is its characters and two quotes.
pub fn sized_value(ty: &str, bytes: usize) -> Option<String> {
    let json = format!("to_jsonb(repeat('x', {}))", bytes - 2);
    match ty {
        "jsonb" => Some(json),
        "jsonb[]" => Some(format!("ARRAY[{json}]")),
        "text" => Some(format!("repeat('e', {bytes})")),
        _ => None,
    }
}

/// Every stored name that breaks the name rule (a control or format
/// character, or not NFC), as `table.column` of each, or NULL: run inside
/// a hostile call's transaction once it went through. The name columns of
/// the kinds the rule covers (queues, workflows and their ids, keys,
/// schedules, rate limits, workers, mutexes, search-attribute keys); the
/// format characters are those the hostile values carry and their kin.
pub const NAMES_BREAKING_THE_RULE: &str = "\
    SELECT string_agg(DISTINCT what, ', ') FROM ( \
        SELECT 'queues.name' AS what, name AS v FROM sheaf.queues \
        UNION ALL SELECT 'tasks.queue', queue FROM sheaf.tasks \
        UNION ALL SELECT 'tasks.idempotency_key', idempotency_key FROM sheaf.tasks \
        UNION ALL SELECT 'tasks.fairness_key', fairness_key FROM sheaf.tasks \
        UNION ALL SELECT 'tasks.concurrency_key', concurrency_key FROM sheaf.tasks \
        UNION ALL SELECT 'executions.workflow_name', workflow_name FROM sheaf.executions \
        UNION ALL SELECT 'executions.workflow_id', workflow_id FROM sheaf.executions \
        UNION ALL SELECT 'executions.queue', queue FROM sheaf.executions \
        UNION ALL SELECT 'executions.search_attrs', k FROM sheaf.executions, jsonb_object_keys(search_attrs) k \
        UNION ALL SELECT 'workflow_policies.workflow_name', workflow_name FROM sheaf.workflow_policies \
        UNION ALL SELECT 'workflow_policies.queue', policy ->> 'queue' FROM sheaf.workflow_policies \
        UNION ALL SELECT 'children.workflow_name', workflow_name FROM sheaf.children \
        UNION ALL SELECT 'children.workflow_id', workflow_id FROM sheaf.children \
        UNION ALL SELECT 'debounces.debounce_key', debounce_key FROM sheaf.debounces \
        UNION ALL SELECT 'schedules.name', name FROM sheaf.schedules \
        UNION ALL SELECT 'rate_limits.name', name FROM sheaf.rate_limits \
        UNION ALL SELECT 'workers.name', name FROM sheaf.workers \
        UNION ALL SELECT 'mutex_locks.key', key FROM sheaf.mutex_locks \
        UNION ALL SELECT 'mutex_waiters.key', key FROM sheaf.mutex_waiters \
        UNION ALL SELECT 'concurrency_limits.key', key FROM sheaf.concurrency_limits \
        UNION ALL SELECT 'tasks.lease_owner', lease_owner FROM sheaf.tasks \
    ) n WHERE v ~ E'[\\u0001-\\u001f\\u007f-\\u009f\\u00ad\\u061c\\u180e\\u200b-\\u200f\\u202a-\\u202e\\u2060-\\u2064\\u2066-\\u206f\\ufeff\\ufff9-\\ufffb]' \
       OR NOT v IS NFC NORMALIZED";

/// Hostile values of a text argument (also the elements of `text[]`).
const TEXTS: &[&str] = &[
    "NULL",
    "''",
    "' '",
    "repeat('x', 1048576)",
    "repeat('x', 256)",
    "repeat('x', 257)",
    "repeat('x', 1025)",
    "repeat('é', 300)",
    r"E'\u00e9\u4e2d\U0001F600\u202e\u200b'",
    r"E'a\u0301\ufeff'",
    r"E'\t\n\r'",
    "'''; DROP TABLE sheaf.tasks; --'",
    r"'$1 %s %n \x00 $$'",
    "'x'' OR ''1''=''1'",
    r"E'\\'",
    "'{\"a\": 1}'",
    "'null'",
    "'input'",
    "'input.a.b'",
];

/// Hostile JSON values, as jsonb expressions: used whole, and as the value
/// of one field of a valid argument.
const JSON_VALUES: &[&str] = &[
    "'null'",
    "'\"\"'",
    "'0'",
    "'-1'",
    "'1.5'",
    "'-0'",
    "'2147483647'",
    "'2147483648'",
    "'-2147483649'",
    "'9223372036854775808'",
    "'1e308'",
    "'-1e308'",
    "'1e-320'",
    "'1e400'",
    "'123456789012345678901234567890.123456789'",
    "'\"NaN\"'",
    "'\"infinity\"'",
    "'\"-infinity\"'",
    "'\"Infinity\"'",
    "'true'",
    "'[]'",
    "'{}'",
    "'\"00000000-0000-0000-0000-000000000000\"'",
    "'\"ffffffff-ffff-8fff-bfff-ffffffffffff\"'",
    "'\"294277-01-01T00:00:00Z\"'",
    "'\"4714-11-24 00:00:00+00 BC\"'",
    "'\"100000 years\"'",
    "to_jsonb(repeat('x', 1048576))",
    r#"to_jsonb(E'\u00e9\U0001F600\u202e')"#,
    // Names that break the name rule one way each: not NFC (e + a
    // combining accent), a zero-width space, a control character; and an
    // object whose key has a bidi override (search attributes).
    r#"to_jsonb(E'cafe\u0301')"#,
    r#"to_jsonb(E'q\u200b')"#,
    r#"to_jsonb(E'a\tb')"#,
    r#"jsonb_build_object(E'k\u202e', 1)"#,
    "to_jsonb('''; DROP TABLE sheaf.tasks; --'::text)",
    "(repeat('[', 10000) || repeat(']', 10000))::jsonb",
    "(repeat('{\"a\": ', 101) || '1' || repeat('}', 101))::jsonb",
];

/// Whole jsonb arguments beyond [`JSON_VALUES`].
const JSONB_WHOLE: &[&str] = &[
    "NULL",
    "(repeat('[', 100) || repeat(']', 100))::jsonb",
    "(repeat('[', 101) || repeat(']', 101))::jsonb",
    "(SELECT jsonb_agg(g) FROM generate_series(1, 10000) g)",
    "jsonb_build_object('k', repeat('x', 1048576))",
    "(SELECT jsonb_object_agg('k' || g, g) FROM generate_series(1, 10000) g)",
];

/// Long form only: a 100,000-key object (~1.5 MB), which would add a call
/// per jsonb argument to the CI form. It found that a start with it as
/// input took 1-3 s on a debug build (the input went through serde_json
/// text several times); since 0.2.0 a start stores and wraps the jsonb as
/// it came (0.4 s there, building the object included).
pub const LONG_ONLY: &[&str] =
    &["(SELECT jsonb_object_agg('k' || g, g) FROM generate_series(1, 100000) g)::jsonb"];

/// Option fields: every field any sheaf function reads from a jsonb
/// argument (opts, policies, inputs), and two no function knows.
pub const FIELDS: &[&str] = &[
    "priority",
    "run_at",
    "concurrency_key",
    "fairness_key",
    "fairness_weight",
    "max_attempts",
    "execution_id",
    "kind",
    "idempotency_key",
    "queue",
    "aging_secs",
    "fairness",
    "notify",
    "concurrency",
    "quota",
    "tenant",
    "search_attrs",
    "",
    "é",
];

/// Fields nested one level down (policies).
pub const NESTED: &[(&str, &str)] = &[
    ("concurrency", "key"),
    ("concurrency", "limit"),
    ("concurrency", "on_conflict"),
    ("quota", "key"),
    ("quota", "max_active_executions"),
    ("quota", "max_history_bytes"),
    ("quota", "max_dead_letters"),
];

const INTEGERS: &[&str] = &[
    "NULL",
    "0",
    "-1",
    "1",
    "-2147483648",
    "2147483647",
    "1000",
    "1001",
    "10000",
    "10001",
    "65534",
    "65535",
    "65536",
];
const BIGINTS: &[&str] = &[
    "NULL",
    "0",
    "-1",
    "-9223372036854775808",
    "9223372036854775807",
    "2147483648",
];
const SMALLINTS: &[&str] = &["NULL", "0", "-1", "-32768", "32767"];
const FLOATS: &[&str] = &[
    "NULL",
    "'NaN'",
    "'Infinity'",
    "'-Infinity'",
    "0",
    "'-0'",
    "1e308",
    "-1e308",
    "1e-320",
];
const BOOLEANS: &[&str] = &["NULL", "true", "false"];
const INTERVALS: &[&str] = &[
    "NULL",
    "'0'",
    "'-1 second'",
    "'-1 microsecond'",
    "'1 microsecond'",
    "'-100000 years'",
    "'100000 years'",
    "'178000000 years'",
    "'-178000000 years'",
    "'1 mon'",
    "'-1 day 48 hours'",
    "'1 day -86399 seconds'",
    "'365 days'",
    "'366 days'",
    "'24:00:00.000001'",
    "'infinity'",
    "'-infinity'",
];
const TIMESTAMPS: &[&str] = &[
    "NULL",
    "'infinity'",
    "'-infinity'",
    "'4714-11-24 00:00:00+00 BC'",
    "'294276-12-31 23:59:59+00'",
    "'epoch'",
    "now() + '100 years'",
];
const UUIDS: &[&str] = &[
    "NULL",
    "'00000000-0000-0000-0000-000000000000'",
    "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
    "gen_random_uuid()",
    "sheaf.new_id()",
];
/// Shards other than the valid calls' (7), for ids re-prefixed.
const OTHER_SHARDS: &[u16] = &[0, 1, 2, 65534, 65535];

/// The hostile values of one argument, each a complete SQL expression of
/// type `ty`, in a fixed order (the CI form).
pub fn values(ty: &str, name: &str, base: &str) -> Vec<String> {
    if let Some(elem) = ty.strip_suffix("[]") {
        return arrays(ty, elem, base);
    }
    let plain = |list: &[&str]| list.iter().map(|v| format!("({v})::{ty}")).collect::<Vec<_>>();
    match ty {
        "text" | "character varying" | "name" => plain(TEXTS),
        "jsonb" | "json" => jsonb(ty, name, base),
        "integer" => plain(INTEGERS),
        "bigint" => plain(BIGINTS),
        "smallint" => plain(SMALLINTS),
        "double precision" | "real" | "numeric" => plain(FLOATS),
        "boolean" => plain(BOOLEANS),
        "interval" => plain(INTERVALS),
        "timestamp with time zone" | "timestamp without time zone" | "date" => plain(TIMESTAMPS),
        "uuid" => {
            let mut v = plain(UUIDS);
            v.extend(OTHER_SHARDS.iter().map(|s| reprefixed(base, *s)));
            v
        }
        _ => vec![format!("NULL::{ty}")],
    }
}

/// `base`, an id, with another shard's prefix: the same row, asked of the
/// wrong shard.
fn reprefixed(base: &str, shard: u16) -> String {
    format!("('{shard:04x}' || substr(({base})::text, 5))::uuid")
}

fn jsonb(ty: &str, name: &str, base: &str) -> Vec<String> {
    let mut v: Vec<String> = JSON_VALUES
        .iter()
        .chain(JSONB_WHOLE)
        .map(|x| format!("({x})::{ty}"))
        .collect();
    // One field of the valid argument made hostile: every known field for
    // options and policies, the policy's key field for inputs, one field
    // for payloads and results (sheaf stores those as they are).
    let fields: Vec<&str> = match name {
        "opts" | "policy" => FIELDS.to_vec(),
        "input" => vec!["tenant"],
        _ => vec!["n"],
    };
    for field in &fields {
        for value in JSON_VALUES {
            v.push(with_field(base, field, value));
        }
    }
    if name == "policy" {
        for (outer, inner) in NESTED {
            for value in JSON_VALUES {
                v.push(with_nested(base, outer, inner, value));
            }
        }
    }
    v
}

/// The valid argument with `field` set to `value`.
pub fn with_field(base: &str, field: &str, value: &str) -> String {
    format!("(({base})::jsonb || jsonb_build_object('{field}', ({value})::jsonb))")
}

/// The valid argument with `outer.inner` set to `value` (`outer` made an
/// object first if it is not one).
pub fn with_nested(base: &str, outer: &str, inner: &str, value: &str) -> String {
    format!(
        "jsonb_set(CASE WHEN jsonb_typeof(({base})::jsonb -> '{outer}') = 'object' THEN ({base})::jsonb \
         ELSE ({base})::jsonb || '{{\"{outer}\": {{}}}}' END, '{{{outer},{inner}}}', ({value})::jsonb)"
    )
}

/// An element of type `elem` made from the series number `g`.
fn element(elem: &str) -> &'static str {
    match elem {
        "uuid" => "sheaf.new_id()",
        "jsonb" | "json" => "jsonb_build_object('n', g)",
        "text" => "'x' || g",
        _ => "g",
    }
}

fn arrays(ty: &str, elem: &str, base: &str) -> Vec<String> {
    let e = element(elem);
    let one = format!("(SELECT {e} FROM generate_series(1, 1) g)");
    let mut v = vec![
        format!("NULL::{ty}"),
        format!("'{{}}'::{ty}"),
        format!("ARRAY[NULL]::{ty}"),
        format!("array_append(({base})::{ty}, NULL)"),
        format!("(({base})::{ty} || ({base})::{ty})"),
        format!("(({base})::{ty})[1:1]"),
        format!("array_fill({one}, ARRAY[2, 2])::{ty}"),
        format!("array_fill({one}, ARRAY[2], ARRAY[0])::{ty}"),
        format!("ARRAY(SELECT {e} FROM generate_series(1, 100000) g)::{ty}"),
        format!("ARRAY(SELECT {e} FROM generate_series(1, 10001) g)::{ty}"),
        format!("ARRAY(SELECT {e} FROM generate_series(1, 1001) g)::{ty}"),
    ];
    // Hostile elements.
    let singles: Vec<String> = match elem {
        "text" => TEXTS.iter().skip(1).map(|t| format!("({t})::text")).collect(),
        "jsonb" => ["'null'", "(repeat('[', 10000) || repeat(']', 10000))", "'[]'"]
            .iter()
            .map(|j| format!("({j})::jsonb"))
            .chain([format!("to_jsonb(repeat('x', {HUGE}))")])
            .collect(),
        "uuid" => UUIDS.iter().skip(1).map(|u| format!("({u})::uuid")).collect(),
        "bigint" => BIGINTS.iter().skip(1).map(|b| format!("({b})::bigint")).collect(),
        _ => Vec::new(),
    };
    v.extend(singles.iter().map(|s| format!("ARRAY[{s}]::{ty}")));
    v
}

/// One random hostile value for the long form: a value of the fixed list,
/// or (for jsonb) a valid argument with several fields made hostile at once.
pub fn random_value(rng: &mut Rng, ty: &str, name: &str, base: &str) -> String {
    if (ty == "jsonb") && rng.below(2) == 0 {
        let mut expr = base.to_string();
        for _ in 0..=rng.below(4) {
            let value = JSON_VALUES[rng.below(JSON_VALUES.len() as u64) as usize];
            expr = if rng.below(3) == 0 {
                let (outer, inner) = NESTED[rng.below(NESTED.len() as u64) as usize];
                with_nested(&expr, outer, inner, value)
            } else {
                let field = FIELDS[rng.below(FIELDS.len() as u64) as usize];
                with_field(&expr, field, value)
            };
        }
        return expr;
    }
    let mut all = values(ty, name, base);
    if ty == "jsonb" {
        all.extend(LONG_ONLY.iter().map(|v| (*v).to_owned()));
    }
    all[rng.below(all.len() as u64) as usize].clone()
}

/// A valid-looking argument of type `ty` for a function with no valid call
/// (a new one): the test still calls it, one hostile argument at a time.
pub fn default_arg(ty: &str) -> String {
    let v = match ty {
        "text" => "'hostile'",
        "jsonb" => "'{}'",
        "integer" | "bigint" | "smallint" => "1",
        "uuid" => "sheaf.new_id()",
        "interval" => "'1 minute'",
        "timestamp with time zone" => "now()",
        "boolean" => "true",
        t if t.ends_with("[]") => "'{}'",
        _ => "NULL",
    };
    format!("({v})::{ty}")
}
