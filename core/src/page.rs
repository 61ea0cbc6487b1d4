//! Paged listings across shards: merging per-shard runs and the cursor.
//!
//! Each shard returns its rows sorted by `(created_at, id)` in the listing's
//! order; [`merge_sorted`] merges those runs into one page without sorting
//! everything. The user gets a [`Cursor`] for the next page: the last listed
//! row's key, the order, and a [`filter_hash`] of the filter, so a cursor is
//! refused when replayed with another filter or order.
//!
//! Cursor text, version 1 (at most [`MAX_CURSOR_LEN`] bytes; 75 at most in
//! practice): `v1.<d|a>.<created_micros>.<id>.<filter>`, with
//! `created_micros` in canonical decimal (optional `-`, no `+`, no leading
//! zeros, no `-0`), `id` as 32 and `filter` as 16 lowercase hex digits.
//! Decoding accepts exactly the texts encoding produces.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::collections::binary_heap::PeekMut;
use std::fmt;

use serde_json::Value;
use uuid::Uuid;
use xxhash_rust::xxh64::xxh64;

/// The order of a listing, by (created_at, id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SortOrder {
    /// Newest first: the default for listings.
    #[default]
    Desc,
    /// Oldest first.
    Asc,
}

impl SortOrder {
    /// The order's name as the SQL listing function takes it: `"desc"` or `"asc"`.
    pub fn as_str(self) -> &'static str {
        match self {
            SortOrder::Desc => "desc",
            SortOrder::Asc => "asc",
        }
    }

    /// Reads an order's name, `"desc"` or `"asc"` (case-sensitive).
    pub fn parse(text: &str) -> Option<SortOrder> {
        match text {
            "desc" => Some(SortOrder::Desc),
            "asc" => Some(SortOrder::Asc),
            _ => None,
        }
    }

    /// Orders two keys so that the one listed first is Less.
    pub fn cmp<K: Ord>(self, a: &K, b: &K) -> Ordering {
        match self {
            SortOrder::Desc => b.cmp(a),
            SortOrder::Asc => a.cmp(b),
        }
    }

    fn letter(self) -> char {
        match self {
            SortOrder::Desc => 'd',
            SortOrder::Asc => 'a',
        }
    }
}

/// One run's current head in the merge heap. `BinaryHeap` pops its greatest
/// entry, so the entry listed first (then the lower run) compares greatest.
struct Head<T, K> {
    key: K,
    run: usize,
    item: T,
    order: SortOrder,
}

impl<T, K: Ord> Ord for Head<T, K> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.order
            .cmp(&self.key, &other.key)
            .then(self.run.cmp(&other.run))
            .reverse()
    }
}

impl<T, K: Ord> PartialOrd for Head<T, K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T, K: Ord> PartialEq for Head<T, K> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<T, K: Ord> Eq for Head<T, K> {}

/// Merges per-shard runs, each already sorted in `order` by `key`, into
/// the first `limit` items overall, streaming: a binary heap holding one
/// head per run (memory O(runs) beyond the output), never sorting the whole.
/// Ties on the key between runs keep run order (run index ascending).
pub fn merge_sorted<T, K: Ord>(
    runs: Vec<Vec<T>>,
    order: SortOrder,
    limit: usize,
    key: impl Fn(&T) -> K,
) -> Vec<T> {
    if limit == 0 {
        return Vec::new();
    }
    let total: usize = runs.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(limit.min(total));
    let mut tails: Vec<std::vec::IntoIter<T>> = runs.into_iter().map(Vec::into_iter).collect();
    let mut heap = BinaryHeap::with_capacity(tails.len());
    for (run, tail) in tails.iter_mut().enumerate() {
        if let Some(item) = tail.next() {
            heap.push(Head {
                key: key(&item),
                run,
                item,
                order,
            });
        }
    }
    while out.len() < limit {
        let Some(mut top) = heap.peek_mut() else { break };
        // Replace the head in place (one sift-down) while its run has more.
        match tails[top.run].next() {
            Some(next) => {
                top.key = key(&next);
                out.push(std::mem::replace(&mut top.item, next));
            }
            None => out.push(PeekMut::pop(top).item),
        }
    }
    out
}

/// Where the next page starts: the last listed row's key, the order, and a
/// hash of the filter it was listed with (a cursor is only valid for the
/// same filter and order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// The order of the listing the cursor continues.
    pub order: SortOrder,
    /// The last listed row's `created_at`, in microseconds.
    pub created_micros: i64,
    /// The last listed row's execution id.
    pub id: Uuid,
    /// [`filter_hash`] of the listing's filter and order.
    pub filter: u64,
}

/// The most bytes a cursor text may have.
pub const MAX_CURSOR_LEN: usize = 128;

impl Cursor {
    /// Text form: `v1.<d|a>.<created_micros decimal, may be negative>.<id as 32 lowercase hex>.<filter as 16 lowercase hex>`
    pub fn encode(&self) -> String {
        format!(
            "v1.{}.{}.{}.{:016x}",
            self.order.letter(),
            self.created_micros,
            self.id.simple(),
            self.filter
        )
    }

    /// Reads a cursor text strictly: exactly the texts [`Cursor::encode`]
    /// produces are accepted; the length is checked before anything else.
    pub fn decode(text: &str) -> Result<Cursor, CursorError> {
        if text.len() > MAX_CURSOR_LEN {
            return Err(CursorError::TooLong { len: text.len() });
        }
        let mut fields = text.split('.');
        if fields.next() != Some("v1") {
            return Err(CursorError::Version);
        }
        let (Some(order), Some(created), Some(id), Some(filter), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return Err(CursorError::Malformed("shape"));
        };
        let order = match order {
            "d" => SortOrder::Desc,
            "a" => SortOrder::Asc,
            _ => return Err(CursorError::Malformed("order")),
        };
        let created_micros = parse_micros(created).ok_or(CursorError::Malformed("created_at"))?;
        let id = parse_hex(id, 32).ok_or(CursorError::Malformed("execution_id"))?;
        let filter = parse_hex(filter, 16)
            .and_then(|f| u64::try_from(f).ok())
            .ok_or(CursorError::Malformed("filter"))?;
        Ok(Cursor {
            order,
            created_micros,
            id: Uuid::from_u128(id),
            filter,
        })
    }
}

/// Canonical decimal i64: optional `-`, digits without leading zeros, no `-0`.
fn parse_micros(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let canonical = match digits.as_bytes() {
        [] => false,
        [b'0'] => digits.len() == text.len(),
        [b'0', ..] => false,
        bytes => bytes.iter().all(u8::is_ascii_digit),
    };
    if canonical { text.parse().ok() } else { None }
}

/// Exactly `len` lowercase hex digits.
fn parse_hex(text: &str, len: usize) -> Option<u128> {
    let lower_hex = |b: &u8| matches!(b, b'0'..=b'9' | b'a'..=b'f');
    if text.len() != len || !text.as_bytes().iter().all(lower_hex) {
        return None;
    }
    u128::from_str_radix(text, 16).ok()
}

/// Why a cursor text was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CursorError {
    /// Longer than [`MAX_CURSOR_LEN`] bytes; `len` is its length.
    TooLong {
        /// The refused text's length in bytes.
        len: usize,
    },
    /// Not a version-1 sheaf cursor.
    Version,
    /// A v1 cursor whose named field (`"order"`, `"created_at"`,
    /// `"execution_id"`, `"filter"`) is malformed, or `"shape"`: not five fields.
    Malformed(&'static str),
}

impl fmt::Display for CursorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never echo the text: cursors come from users and end up in logs.
        match self {
            CursorError::TooLong { len } => write!(f, "cursor is {len} bytes, at most {MAX_CURSOR_LEN}"),
            CursorError::Version => f.write_str("cursor is not a sheaf v1 cursor"),
            CursorError::Malformed("shape") => {
                f.write_str("cursor does not have the 5 fields of a v1 cursor")
            }
            CursorError::Malformed(field) => write!(f, "cursor's {field} field is malformed"),
        }
    }
}

impl std::error::Error for CursorError {}

/// A stable 64-bit hash (xxh64, seed 0) of a filter's canonical JSON text
/// together with the order: the hashed bytes are `<order>\n<json>`, with
/// `<order>` from [`SortOrder::as_str`] and `<json>` serde_json's compact text
/// of the filter with every object's keys sorted (by bytes). The keys are
/// sorted here, so the hash does not change if an application turns on
/// serde_json's `preserve_order`. Numbers are written by serde_json, so a
/// build with `arbitrary_precision` keeps their original spelling.
pub fn filter_hash(filter: &Value, order: SortOrder) -> u64 {
    let mut text = String::with_capacity(64);
    text.push_str(order.as_str());
    text.push('\n');
    write_canonical(filter, &mut text);
    xxh64(text.as_bytes(), 0)
}

/// serde_json's compact text of `value`, with objects' keys sorted.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (name, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(name.clone()).to_string());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn cursor(order: SortOrder, created_micros: i64, id: u128, filter: u64) -> Cursor {
        Cursor {
            order,
            created_micros,
            id: Uuid::from_u128(id),
            filter,
        }
    }

    #[test]
    fn sort_order_names() {
        assert_eq!(SortOrder::default(), SortOrder::Desc);
        for order in [SortOrder::Desc, SortOrder::Asc] {
            assert_eq!(SortOrder::parse(order.as_str()), Some(order));
        }
        assert_eq!(SortOrder::parse("DESC"), None);
        assert_eq!(SortOrder::parse(""), None);
        assert_eq!(SortOrder::Desc.cmp(&2, &1), Ordering::Less);
        assert_eq!(SortOrder::Asc.cmp(&1, &2), Ordering::Less);
        assert_eq!(SortOrder::Asc.cmp(&1, &1), Ordering::Equal);
    }

    #[test]
    fn encode_form_and_round_trip() {
        let c = cursor(
            SortOrder::Desc,
            1_764_450_000_123_456,
            0x0123_4567_89ab_cdef,
            0xabc,
        );
        assert_eq!(
            c.encode(),
            "v1.d.1764450000123456.00000000000000000123456789abcdef.0000000000000abc"
        );
        for (micros, id, filter) in [
            (0, 0, 0),
            (-1, 1, 1),
            (-1_000_000, u128::MAX, u64::MAX),
            (i64::MIN, u128::MAX, 0),
            (i64::MAX, 0, u64::MAX),
        ] {
            for order in [SortOrder::Desc, SortOrder::Asc] {
                let c = cursor(order, micros, id, filter);
                let text = c.encode();
                assert!(text.len() <= MAX_CURSOR_LEN);
                assert_eq!(Cursor::decode(&text), Ok(c), "{text}");
            }
        }
        let longest = cursor(SortOrder::Asc, i64::MIN, u128::MAX, u64::MAX).encode();
        assert_eq!(longest.len(), 75);
    }

    const ID: &str = "0123456789abcdef0123456789abcdef";
    const FILTER: &str = "00000000deadbeef";

    fn malformed() -> Vec<(String, CursorError)> {
        let m = CursorError::Malformed;
        let ok =
            |order: &str, micros: &str, id: &str, filter: &str| format!("v1.{order}.{micros}.{id}.{filter}");
        vec![
            (ok("d", "5", &ID.to_uppercase(), FILTER), m("execution_id")),
            (ok("d", "5", ID, "00000000DEADBEEF"), m("filter")),
            (ok("d", "5", &ID[1..], FILTER), m("execution_id")),
            (ok("d", "5", &format!("{ID}0"), FILTER), m("execution_id")),
            (ok("d", "5", ID, &FILTER[1..]), m("filter")),
            (ok("d", "5", ID, &format!("+{}", &FILTER[1..])), m("filter")),
            (ok("d", "5", &format!("+{}", &ID[1..]), FILTER), m("execution_id")),
            (ok("D", "5", ID, FILTER), m("order")),
            (ok("desc", "5", ID, FILTER), m("order")),
            (ok("", "5", ID, FILTER), m("order")),
            (ok("d", "", ID, FILTER), m("created_at")),
            (ok("d", "+5", ID, FILTER), m("created_at")),
            (ok("d", "-", ID, FILTER), m("created_at")),
            (ok("d", "-0", ID, FILTER), m("created_at")),
            (ok("d", "05", ID, FILTER), m("created_at")),
            (ok("d", " 5", ID, FILTER), m("created_at")),
            (ok("d", "9223372036854775808", ID, FILTER), m("created_at")),
            (ok("d", "-9223372036854775809", ID, FILTER), m("created_at")),
            (format!("v1.d.5.{ID}"), m("shape")),
            (format!("v1.d.5.{ID}.{FILTER}."), m("shape")),
            (format!("v1.d.5.{ID}.{FILTER}.x"), m("shape")),
            ("v1".to_owned(), m("shape")),
            (format!("v2.d.5.{ID}.{FILTER}"), CursorError::Version),
            (format!("V1.d.5.{ID}.{FILTER}"), CursorError::Version),
            (format!(".v1.d.5.{ID}.{FILTER}"), CursorError::Version),
            (String::new(), CursorError::Version),
            ("x".repeat(5000), CursorError::TooLong { len: 5000 }),
            (
                format!("v1.d.5.{ID}.{FILTER}{}", "0".repeat(100)),
                CursorError::TooLong { len: 156 },
            ),
        ]
    }

    #[test]
    fn decode_refuses_malformed_without_echoing() {
        assert!(Cursor::decode(&format!("v1.a.-5.{ID}.{FILTER}")).is_ok());
        assert!(Cursor::decode(&format!("v1.d.0.{ID}.{FILTER}")).is_ok());
        for (text, expected) in malformed() {
            let err = Cursor::decode(&text).expect_err(&text);
            assert_eq!(err, expected, "{text}");
            let message = err.to_string();
            assert!(message.starts_with("cursor"), "{message}");
            // Too short to tell an echo from the message's own words ("v1").
            if text.len() > 3 {
                assert!(!message.contains(&text), "{message}");
            }
            assert!(
                !message.contains(ID) && !message.contains("deadbeef"),
                "{message}"
            );
        }
    }

    #[test]
    fn error_messages() {
        assert_eq!(
            CursorError::TooLong { len: 5000 }.to_string(),
            "cursor is 5000 bytes, at most 128"
        );
        assert_eq!(
            CursorError::Version.to_string(),
            "cursor is not a sheaf v1 cursor"
        );
        assert_eq!(
            CursorError::Malformed("created_at").to_string(),
            "cursor's created_at field is malformed"
        );
        let boxed: Box<dyn std::error::Error> = Box::new(CursorError::Version);
        assert!(boxed.source().is_none());
    }

    #[test]
    fn filter_hash_is_stable_and_separates_orders() {
        let a = json!({"status": ["running", "failed"], "workflow": "order_flow", "n": 1});
        let b: Value =
            serde_json::from_str(r#"{"workflow":"order_flow","n":1,"status":["running","failed"]}"#).unwrap();
        assert_eq!(filter_hash(&a, SortOrder::Desc), filter_hash(&b, SortOrder::Desc));
        assert_ne!(filter_hash(&a, SortOrder::Desc), filter_hash(&a, SortOrder::Asc));
        let reordered = json!({"status": ["failed", "running"], "workflow": "order_flow", "n": 1});
        assert_ne!(
            filter_hash(&a, SortOrder::Desc),
            filter_hash(&reordered, SortOrder::Desc)
        );
        // Pinned: the hashed bytes are `<order>\n<canonical json>`.
        let text = r#"desc
{"n":1,"status":["running","failed"],"workflow":"order_flow"}"#;
        assert_eq!(filter_hash(&a, SortOrder::Desc), xxh64(text.as_bytes(), 0));
        assert_eq!(filter_hash(&Value::Null, SortOrder::Asc), xxh64(b"asc\nnull", 0));
    }

    #[test]
    fn canonical_text_sorts_keys_and_escapes() {
        let mut map = serde_json::Map::new();
        map.insert("z\"\n\u{1}".to_owned(), json!([1.5, -2, null, true, "é\\"]));
        map.insert("a".to_owned(), json!({"y": {}, "x": []}));
        let value = Value::Object(map);
        let mut text = String::new();
        write_canonical(&value, &mut text);
        assert_eq!(
            text,
            r#"{"a":{"x":[],"y":{}},"z\"\n\u0001":[1.5,-2,null,true,"é\\"]}"#
        );
    }

    #[test]
    fn merge_edge_cases() {
        let key = |t: &(i64, u32)| t.0;
        assert!(merge_sorted(Vec::<Vec<(i64, u32)>>::new(), SortOrder::Desc, 10, key).is_empty());
        assert!(merge_sorted(vec![vec![], vec![]], SortOrder::Asc, 10, key).is_empty());
        assert!(merge_sorted(vec![vec![(1, 0)], vec![(2, 1)]], SortOrder::Asc, 0, key).is_empty());
        let one = merge_sorted(
            vec![vec![], vec![(3, 0), (2, 1)], vec![]],
            SortOrder::Desc,
            10,
            key,
        );
        assert_eq!(one, vec![(3, 0), (2, 1)]);
    }

    #[test]
    fn merge_ties_keep_run_order_in_both_orders() {
        let key = |t: &(i64, &str)| t.0;
        let desc = vec![
            vec![(5, "a0"), (3, "a1")],
            vec![(5, "b0"), (5, "b1"), (3, "b2")],
            vec![(5, "c0")],
        ];
        let merged = merge_sorted(desc, SortOrder::Desc, 5, key);
        assert_eq!(
            merged,
            vec![(5, "a0"), (5, "b0"), (5, "b1"), (5, "c0"), (3, "a1")]
        );
        let asc = vec![
            vec![(1, "a0"), (4, "a1")],
            vec![(1, "b0"), (2, "b1")],
            vec![(0, "c0"), (4, "c1")],
        ];
        let merged = merge_sorted(asc, SortOrder::Asc, 100, key);
        assert_eq!(
            merged,
            vec![(0, "c0"), (1, "a0"), (1, "b0"), (2, "b1"), (4, "a1"), (4, "c1")]
        );
    }

    /// Item: (created, id, tag); the key is (created, id) and the tag names
    /// (run, position) so ties are checked by identity.
    type Item = (i64, u128, (usize, usize));

    fn runs_strategy() -> impl Strategy<Value = (Vec<Vec<(i64, u128)>>, bool, usize)> {
        let id = prop_oneof![0u128..3, any::<u128>()];
        let runs = prop::collection::vec(prop::collection::vec((-5i64..5, id), 0..60), 0..8);
        (runs, any::<bool>(), 0usize..500)
    }

    fn sorted_runs(raw: Vec<Vec<(i64, u128)>>, order: SortOrder) -> Vec<Vec<Item>> {
        raw.into_iter()
            .enumerate()
            .map(|(r, mut run)| {
                run.sort_by(|a, b| order.cmp(&(a.0, Uuid::from_u128(a.1)), &(b.0, Uuid::from_u128(b.1))));
                run.into_iter()
                    .enumerate()
                    .map(|(p, (c, id))| (c, id, (r, p)))
                    .collect()
            })
            .collect()
    }

    fn json_strategy() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            "[a-z\"\\\\\n\u{1}é]{0,6}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec(("[a-d]{0,2}", inner), 0..5)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    fn reinsert_reversed(value: &Value) -> Value {
        match value {
            Value::Array(items) => Value::Array(items.iter().map(reinsert_reversed).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .rev()
                    .map(|(k, v)| (k.clone(), reinsert_reversed(v)))
                    .collect(),
            ),
            scalar => scalar.clone(),
        }
    }

    fn keys_sorted_by_serde_json() -> bool {
        let mut map = serde_json::Map::new();
        map.insert("b".to_owned(), Value::Null);
        map.insert("a".to_owned(), Value::Null);
        let text = Value::Object(map).to_string();
        text == r#"{"a":null,"b":null}"#
    }

    proptest! {
        #[test]
        fn merge_equals_stable_sort_of_concatenation((raw, asc, limit) in runs_strategy()) {
            let order = if asc { SortOrder::Asc } else { SortOrder::Desc };
            let runs = sorted_runs(raw, order);
            let key = |t: &Item| (t.0, Uuid::from_u128(t.1));
            let mut expected: Vec<Item> = runs.concat();
            expected.sort_by(|a, b| order.cmp(&key(a), &key(b)));
            expected.truncate(limit);
            prop_assert_eq!(merge_sorted(runs, order, limit, key), expected);
        }

        #[test]
        fn cursor_round_trips(asc in any::<bool>(), micros in any::<i64>(), id in any::<u128>(), filter in any::<u64>()) {
            let c = cursor(if asc { SortOrder::Asc } else { SortOrder::Desc }, micros, id, filter);
            let text = c.encode();
            prop_assert!(text.len() <= MAX_CURSOR_LEN);
            prop_assert_eq!(Cursor::decode(&text), Ok(c));
        }

        #[test]
        fn decode_never_panics(text in "\\PC{0,140}") {
            let _ = Cursor::decode(&text);
        }

        #[test]
        fn decode_accepts_only_encoded_texts(
            text in "v[12]\\.[adD]\\.[-+]?[0-9]{0,20}\\.[0-9a-fA-F+]{31,33}\\.[0-9a-fA-F]{15,17}(\\.)?",
        ) {
            if let Ok(c) = Cursor::decode(&text) {
                prop_assert_eq!(c.encode(), text);
            }
        }

        #[test]
        fn filter_hash_ignores_key_insertion_order(value in json_strategy(), asc in any::<bool>()) {
            let order = if asc { SortOrder::Asc } else { SortOrder::Desc };
            let reversed = reinsert_reversed(&value);
            prop_assert_eq!(filter_hash(&value, order), filter_hash(&reversed, order));
            if keys_sorted_by_serde_json() {
                let mut text = String::new();
                write_canonical(&value, &mut text);
                prop_assert_eq!(text, value.to_string());
            }
        }
    }
}
