//! Operator listings of tasks and dead letters: the keyset anchors a shard
//! hands out with each row, and the fleet cursor that keeps one anchor per
//! shard.
//!
//! `sheaf.list_tasks` walks one index per state (running, ready, scheduled,
//! waiting, paused, in that order) and `sheaf.list_dead_letters` walks
//! `(dead_at, id)` newest first; each row carries its `anchor`, and passing
//! the last row's anchor as `after` continues after it. Anchors are JSON
//! objects of exactly the fields [`TaskAnchor::to_json`] writes; times are
//! PostgreSQL microseconds (since 2000-01-01 UTC), exact.
//!
//! Across shards the driver merges the shards' pages and keeps, per shard,
//! the anchor of the last row it listed from that shard ([`ShardCursor`]), so
//! a page takes a prefix of every shard's walk and paging to the end lists
//! every row that stayed put exactly once, whatever order the merge uses.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};
use uuid::Uuid;
use xxhash_rust::xxh64::xxh64;

use crate::excerpt::excerpt;
use crate::state::TaskState;

/// The order `list_tasks` walks the states in when no state is given.
pub const STATE_ORDER: [TaskState; 5] = [
    TaskState::Running,
    TaskState::Ready,
    TaskState::Scheduled,
    TaskState::Waiting,
    TaskState::Paused,
];

/// Where a task listing continues: the last row's place in its state's index.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskAnchor {
    /// `ready_claim`: (k1, k2, seq).
    Ready { k1: f64, k2: f64, seq: i64 },
    /// `tasks_scheduled`: (run_at, id).
    Scheduled { at: i64, id: Uuid },
    /// `tasks_running`: (lease_expires_at, id).
    Running { at: i64, id: Uuid },
    /// `tasks_waiting`: (concurrency_key, priority descending, seq).
    Waiting { key: String, priority: i32, seq: i64 },
    /// Paused executions by (created_at, id), then the task id.
    Paused { at: i64, execution_id: Uuid, id: Uuid },
}

/// Why an anchor or cursor was refused; says what, never echoes a long value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnchorError(pub String);

impl std::fmt::Display for AnchorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AnchorError {}

fn field<'a>(map: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    map.get(name)
}

fn uuid_of(v: Option<&Value>) -> Option<Uuid> {
    v?.as_str().and_then(|s| Uuid::parse_str(s).ok())
}

fn finite(v: Option<&Value>) -> Option<f64> {
    v?.as_f64().filter(|f| f.is_finite())
}

impl TaskAnchor {
    /// The state whose index this anchor is a place in.
    pub fn state(&self) -> TaskState {
        match self {
            TaskAnchor::Ready { .. } => TaskState::Ready,
            TaskAnchor::Scheduled { .. } => TaskState::Scheduled,
            TaskAnchor::Running { .. } => TaskState::Running,
            TaskAnchor::Waiting { .. } => TaskState::Waiting,
            TaskAnchor::Paused { .. } => TaskState::Paused,
        }
    }

    /// The anchor as `list_tasks` hands it out.
    pub fn to_json(&self) -> Value {
        match self {
            TaskAnchor::Ready { k1, k2, seq } => json!({"state": "ready", "k1": k1, "k2": k2, "seq": seq}),
            TaskAnchor::Scheduled { at, id } => json!({"state": "scheduled", "at": at, "id": id.to_string()}),
            TaskAnchor::Running { at, id } => json!({"state": "running", "at": at, "id": id.to_string()}),
            TaskAnchor::Waiting { key, priority, seq } => {
                json!({"state": "waiting", "key": key, "priority": priority, "seq": seq})
            }
            TaskAnchor::Paused { at, execution_id, id } => json!({
                "state": "paused", "at": at, "execution_id": execution_id.to_string(), "id": id.to_string()
            }),
        }
    }

    /// Reads an anchor strictly: exactly the fields of its state, each of
    /// its type.
    pub fn parse(value: &Value) -> Result<TaskAnchor, AnchorError> {
        let refuse = || {
            AnchorError(format!(
                "is not an anchor list_tasks returned: {}",
                excerpt(value)
            ))
        };
        let map = value.as_object().ok_or_else(refuse)?;
        let state = field(map, "state").and_then(Value::as_str).ok_or_else(refuse)?;
        let (anchor, fields) = match state {
            "ready" => (
                finite(field(map, "k1"))
                    .zip(finite(field(map, "k2")))
                    .zip(field(map, "seq").and_then(Value::as_i64))
                    .map(|((k1, k2), seq)| TaskAnchor::Ready { k1, k2, seq }),
                4,
            ),
            "scheduled" | "running" => (
                field(map, "at")
                    .and_then(Value::as_i64)
                    .zip(uuid_of(field(map, "id")))
                    .map(|(at, id)| {
                        if state == "scheduled" {
                            TaskAnchor::Scheduled { at, id }
                        } else {
                            TaskAnchor::Running { at, id }
                        }
                    }),
                3,
            ),
            "waiting" => (
                field(map, "key")
                    .and_then(Value::as_str)
                    .zip(
                        field(map, "priority")
                            .and_then(Value::as_i64)
                            .and_then(|p| i32::try_from(p).ok()),
                    )
                    .zip(field(map, "seq").and_then(Value::as_i64))
                    .map(|((key, priority), seq)| TaskAnchor::Waiting {
                        key: key.to_owned(),
                        priority,
                        seq,
                    }),
                4,
            ),
            "paused" => (
                field(map, "at")
                    .and_then(Value::as_i64)
                    .zip(uuid_of(field(map, "execution_id")))
                    .zip(uuid_of(field(map, "id")))
                    .map(|((at, execution_id), id)| TaskAnchor::Paused { at, execution_id, id }),
                4,
            ),
            _ => (None, 0),
        };
        match anchor {
            Some(a) if map.len() == fields => Ok(a),
            _ => Err(refuse()),
        }
    }
}

/// Where a dead-letter listing continues: the last row's (dead_at, id),
/// newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadAnchor {
    pub at: i64,
    pub id: Uuid,
}

impl DeadAnchor {
    pub fn to_json(&self) -> Value {
        json!({"dead_at": self.at, "id": self.id.to_string()})
    }

    pub fn parse(value: &Value) -> Result<DeadAnchor, AnchorError> {
        let refuse = || {
            AnchorError(format!(
                "is not an anchor list_dead_letters returned: {}",
                excerpt(value)
            ))
        };
        let map = value.as_object().filter(|m| m.len() == 2).ok_or_else(refuse)?;
        let at = field(map, "dead_at").and_then(Value::as_i64).ok_or_else(refuse)?;
        let id = uuid_of(field(map, "id")).ok_or_else(refuse)?;
        Ok(DeadAnchor { at, id })
    }
}

/// The most bytes a fleet cursor may have (about 60 shards deep into a
/// waiting line with a 1 KiB key; a few hundred otherwise).
pub const MAX_SHARD_CURSOR_LEN: usize = 65_536;

/// A fleet listing's cursor: per shard, the anchor of the last row listed
/// from it (a shard with none yet is absent), and a hash of what is listed,
/// so a cursor replayed with another queue or state is refused.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ShardCursor {
    pub anchors: BTreeMap<u16, Value>,
    pub listing: u64,
}

/// The hash that binds a cursor to its listing (its kind and filters).
pub fn listing_hash(parts: &[&str]) -> u64 {
    let text = serde_json::to_string(parts).unwrap_or_default();
    xxh64(text.as_bytes(), 0x5eaf)
}

impl ShardCursor {
    /// `s1.<listing as 16 lowercase hex>.<anchors as lowercase hex of compact JSON>`.
    pub fn encode(&self) -> String {
        let map: Map<String, Value> = self
            .anchors
            .iter()
            .map(|(shard, anchor)| (shard.to_string(), anchor.clone()))
            .collect();
        let json = Value::Object(map).to_string();
        let mut out = format!("s1.{:016x}.", self.listing);
        for b in json.as_bytes() {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }

    /// Reads a cursor strictly: exactly the texts [`ShardCursor::encode`]
    /// produces; the length is checked before anything else.
    pub fn decode(text: &str) -> Result<ShardCursor, AnchorError> {
        let bad = |why: &str| AnchorError(format!("cursor: {why}"));
        if text.len() > MAX_SHARD_CURSOR_LEN {
            return Err(bad(&format!(
                "{} bytes, at most {MAX_SHARD_CURSOR_LEN}",
                text.len()
            )));
        }
        let mut parts = text.splitn(3, '.');
        let (Some("s1"), Some(listing), Some(hex)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad(
                "not a cursor a listing of tasks, dead letters or mutexes returned",
            ));
        };
        let listing = (listing.len() == 16
            && listing.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| u64::from_str_radix(listing, 16).ok())
        .flatten()
        .ok_or_else(|| bad("malformed listing hash"))?;
        if hex.len() % 2 != 0 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(bad("malformed anchors"));
        }
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .filter_map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
            .collect();
        let map: Map<String, Value> = serde_json::from_slice(&bytes).map_err(|_| bad("malformed anchors"))?;
        let mut anchors = BTreeMap::new();
        for (shard, anchor) in map {
            let id: u16 = shard.parse().map_err(|_| bad("malformed shard id"))?;
            anchors.insert(id, anchor);
        }
        let cursor = ShardCursor { anchors, listing };
        if cursor.encode() != text {
            return Err(bad("not in the form a listing writes"));
        }
        Ok(cursor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    #[test]
    fn every_anchor_round_trips() {
        let anchors = [
            TaskAnchor::Ready {
                k1: -5.0,
                k2: 0.25,
                seq: 7,
            },
            TaskAnchor::Ready {
                k1: -1.0e15 - 3.0,
                k2: 1.0 / 3.0,
                seq: i64::MAX,
            },
            TaskAnchor::Scheduled { at: -1, id: id(1) },
            TaskAnchor::Running {
                at: 846_000_000_000_000,
                id: id(2),
            },
            TaskAnchor::Waiting {
                key: "k \"1\"".into(),
                priority: i32::MIN,
                seq: 0,
            },
            TaskAnchor::Paused {
                at: 5,
                execution_id: id(3),
                id: id(4),
            },
        ];
        for a in anchors {
            assert_eq!(TaskAnchor::parse(&a.to_json()), Ok(a.clone()), "{a:?}");
        }
        let d = DeadAnchor { at: 12, id: id(9) };
        assert_eq!(DeadAnchor::parse(&d.to_json()), Ok(d));
    }

    #[test]
    fn anchors_are_read_strictly() {
        for bad in [
            json!(null),
            json!([]),
            json!({}),
            json!({"state": "ready", "k1": 1, "k2": 2}),
            json!({"state": "ready", "k1": 1, "k2": 2, "seq": 3, "x": 1}),
            json!({"state": "ready", "k1": "1", "k2": 2, "seq": 3}),
            json!({"state": "scheduled", "at": 1.5, "id": id(1).to_string()}),
            json!({"state": "running", "at": 1, "id": "nope"}),
            json!({"state": "waiting", "key": "k", "priority": 1_i64 << 40, "seq": 1}),
            json!({"state": "done", "at": 1}),
            json!({"state": "paused", "at": 1, "id": id(1).to_string()}),
        ] {
            assert!(TaskAnchor::parse(&bad).is_err(), "{bad}");
        }
        assert!(DeadAnchor::parse(&json!({"dead_at": 1, "id": id(1).to_string(), "x": 0})).is_err());
        let long = json!({"state": "x".repeat(10_000)});
        let e = TaskAnchor::parse(&long).unwrap_err();
        assert!(e.0.len() < 400, "a long value is not echoed: {} bytes", e.0.len());
    }

    #[test]
    fn cursors_round_trip_and_refuse_anything_else() {
        let mut c = ShardCursor {
            anchors: BTreeMap::new(),
            listing: listing_hash(&["tasks", "q", ""]),
        };
        assert_eq!(ShardCursor::decode(&c.encode()), Ok(c.clone()));
        c.anchors.insert(
            0,
            TaskAnchor::Ready {
                k1: -1.0,
                k2: 0.0,
                seq: 3,
            }
            .to_json(),
        );
        c.anchors.insert(12, DeadAnchor { at: 1, id: id(5) }.to_json());
        let text = c.encode();
        assert_eq!(ShardCursor::decode(&text), Ok(c.clone()));
        for bad in [
            "",
            "v1.d.1.x.y",
            "s1.zz.00",
            &text.to_uppercase(),
            &format!("{text}0"),
            &text.replace("s1.", "s2."),
            "s1.0000000000000000.7b2278223a317d",
        ] {
            assert!(ShardCursor::decode(bad).is_err(), "{bad}");
        }
        assert!(ShardCursor::decode(&"s".repeat(MAX_SHARD_CURSOR_LEN + 1)).is_err());
        assert_ne!(
            listing_hash(&["tasks", "a", "b"]),
            listing_hash(&["tasks", "ab", ""])
        );
    }
}
