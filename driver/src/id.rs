//! `ExecutionId` and `TaskId`: ids that name their shard.
//!
//! The layout is `sheaf_core::id` — the same code the extension mints with —
//! so an id minted here for shard 7 is byte-for-byte what shard 7 would mint.
//! Every id-routed call goes to `id.shard()` with no directory lookup.

use std::fmt;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use sheaf_core::id;

use crate::topology::{ShardId, Topology};

/// Why a string or the clock could not give an id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// The text is not a UUID; an excerpt of it.
    #[error("not a UUID: {0:?}")]
    NotAUuid(String),
    /// The system clock is before 1970 or beyond what an id can carry.
    #[error("the system clock is outside what an id can carry")]
    Clock,
}

/// An id type that routes by its shard prefix. Execution and task ids share
/// the layout but are distinct types, so one never type-checks as the other.
macro_rules! shard_id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(uuid::Uuid);

        impl $name {
            /// Mints an id for `shard` now (what that shard would mint).
            pub fn mint(shard: ShardId) -> Result<$name, IdError> {
                mint(shard).map($name)
            }

            /// The id this UUID is (any UUID is an id; one with no shard
            /// prefix routes to the default shard).
            pub fn from_uuid(u: uuid::Uuid) -> $name {
                $name(u)
            }

            /// The id as a UUID, for SQL parameters.
            pub fn as_uuid(&self) -> uuid::Uuid {
                self.0
            }

            /// The shard encoded in the id; `None` for ids that carry none
            /// (`0xFFFF` or a foreign UUID), which route to the default shard.
            pub fn shard(&self) -> Option<ShardId> {
                shard_of(&self.0)
            }

            /// When the id was minted (millisecond precision); `None` for
            /// ids that carry no time (a foreign UUID). The local
            /// equivalent of `sheaf.id_timestamp`.
            pub fn timestamp(&self) -> Option<SystemTime> {
                timestamp_of(&self.0)
            }

            /// The shard that serves calls for this id: its own, or the
            /// default for unencoded ids, following forwards.
            pub fn route(&self, topology: &Topology) -> ShardId {
                topology.serving(self.shard().unwrap_or_else(|| topology.default_shard()))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.hyphenated().fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = IdError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                uuid::Uuid::parse_str(s)
                    .map($name)
                    .map_err(|_| IdError::NotAUuid(sheaf_core::excerpt::excerpt(s)))
            }
        }
    };
}

shard_id_type!(
    /// An execution's id; its prefix names the shard that holds it.
    ExecutionId
);

shard_id_type!(
    /// A task's id, minted by the shard that holds the task.
    TaskId
);

fn mint(shard: ShardId) -> Result<uuid::Uuid, IdError> {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|_| IdError::Clock)?
        .as_millis() as u64;
    let random = uuid::Uuid::new_v4().as_u64_pair().1;
    let bytes = id::compose(shard.get(), ms, random).map_err(|_| IdError::Clock)?;
    Ok(uuid::Uuid::from_bytes(bytes))
}

fn timestamp_of(u: &uuid::Uuid) -> Option<SystemTime> {
    id::unix_ms_of(u.as_bytes()).and_then(|ms| UNIX_EPOCH.checked_add(std::time::Duration::from_millis(ms)))
}

fn shard_of(u: &uuid::Uuid) -> Option<ShardId> {
    match id::shard_of(u.as_bytes()) {
        id::UNENCODED_SHARD => None,
        s => ShardId::new(s as u32).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_ids_name_their_shard_and_round_trip() {
        for s in [0u32, 1, 513, 65534] {
            let shard = ShardId::new(s).unwrap();
            let id = ExecutionId::mint(shard).unwrap();
            assert_eq!(id.shard(), Some(shard));
            assert_eq!(id.to_string().parse::<ExecutionId>().unwrap(), id);
        }
    }

    #[test]
    fn routes_by_prefix_default_and_forwards() {
        let t = Topology::builder()
            .shard(0, "postgres://a")
            .shard(1, "postgres://b")
            .default_shard(1)
            // Shard 2 is retired: forwarded, no longer listed.
            .forward(2, 0)
            .build()
            .unwrap();
        // From the shared vectors: shard 2's id, and an unencoded one.
        let on_two: ExecutionId = "000219ad-16a5-8cfb-bfff-ffffffffffff".parse().unwrap();
        let unencoded: ExecutionId = "ffff19ad-16a5-8cfb-8000-000badc0ffee".parse().unwrap();
        let foreign: ExecutionId = "0001a2b3-c4d5-4e6f-8a0b-1c2d3e4f5a6b".parse().unwrap();
        assert_eq!(on_two.route(&t).get(), 0, "shard 2 forwards to 0");
        assert_eq!(unencoded.shard(), None);
        assert_eq!(unencoded.route(&t).get(), 1);
        assert_eq!(foreign.route(&t).get(), 1);
        assert!("nope".parse::<ExecutionId>().is_err());
    }

    #[test]
    fn the_timestamp_is_the_mint_time() {
        // From the shared vectors: shard 2, unix ms 0x19ad16a5cfb.
        let on_two: ExecutionId = "000219ad-16a5-8cfb-bfff-ffffffffffff".parse().unwrap();
        let ms = on_two
            .timestamp()
            .unwrap()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis();
        assert_eq!(ms, 0x19ad16a5cfb);
        let foreign: TaskId = "0001a2b3-c4d5-4e6f-8a0b-1c2d3e4f5a6b".parse().unwrap();
        assert_eq!(foreign.timestamp(), None);
        let now = SystemTime::now();
        let minted = TaskId::mint(ShardId::new(1).unwrap())
            .unwrap()
            .timestamp()
            .unwrap();
        assert!(now.duration_since(minted).unwrap_or_default().as_millis() < 1000);
    }
}
