//! The layout of execution and task ids.
//!
//! An id is an RFC 9562 version-8 UUID laid out so that its shard is readable
//! without a directory lookup and ids minted on one shard sort by time:
//!
//! | bits (0 = most significant) | content                                   |
//! |-----------------------------|-------------------------------------------|
//! | 0..16                       | origin shard, big-endian u16 (0xFFFF = unencoded) |
//! | 16..48                      | unix milliseconds, bits 43..12            |
//! | 48..52                      | version `8`                               |
//! | 52..64                      | unix milliseconds, bits 11..0             |
//! | 64..66                      | variant `0b10`                            |
//! | 66..128                     | 62 random bits                            |
//!
//! 44 bits of milliseconds last until the year 2527. Both the extension and the
//! driver mint ids through [`compose`]; `core/testdata/id_vectors.json` pins the
//! layout byte for byte for any other client.

use std::fmt;

/// The shard value meaning "not encoded": such ids route to the default shard.
pub const UNENCODED_SHARD: u16 = 0xFFFF;

/// The largest shard id a topology may use (0xFFFF is reserved for "unencoded").
pub const MAX_SHARD_ID: u16 = 0xFFFE;

/// The largest timestamp the layout can carry (44 bits of milliseconds).
pub const MAX_UNIX_MS: u64 = (1 << 44) - 1;

/// Why an id could not be composed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdError {
    /// The clock reads beyond what 44 bits of milliseconds can carry.
    TimestampOutOfRange(u64),
}

impl fmt::Display for IdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdError::TimestampOutOfRange(ms) => write!(
                f,
                "timestamp {ms} ms since the unix epoch does not fit the 44-bit id layout"
            ),
        }
    }
}

impl std::error::Error for IdError {}

/// Lays out an id from its parts. Only the low 62 bits of `random` are used.
pub fn compose(shard: u16, unix_ms: u64, random: u64) -> Result<[u8; 16], IdError> {
    if unix_ms > MAX_UNIX_MS {
        return Err(IdError::TimestampOutOfRange(unix_ms));
    }
    let mut b = [0u8; 16];
    b[0..2].copy_from_slice(&shard.to_be_bytes());
    let high = (unix_ms >> 12) as u32;
    b[2..6].copy_from_slice(&high.to_be_bytes());
    let low = (unix_ms & 0xFFF) as u16;
    b[6] = 0x80 | (low >> 8) as u8;
    b[7] = (low & 0xFF) as u8;
    let tail = (random & ((1 << 62) - 1)) | (0b10 << 62);
    b[8..16].copy_from_slice(&tail.to_be_bytes());
    Ok(b)
}

/// The origin shard of an id. Ids that are not sheaf's layout (another
/// version or variant) report [`UNENCODED_SHARD`], so they route to the
/// default shard rather than to whatever their first bytes happen to be.
pub fn shard_of(id: &[u8; 16]) -> u16 {
    if !is_sheaf_layout(id) {
        return UNENCODED_SHARD;
    }
    u16::from_be_bytes([id[0], id[1]])
}

/// The mint time of an id, in unix milliseconds; `None` for foreign ids.
pub fn unix_ms_of(id: &[u8; 16]) -> Option<u64> {
    if !is_sheaf_layout(id) {
        return None;
    }
    let high = u32::from_be_bytes([id[2], id[3], id[4], id[5]]) as u64;
    let low = (((id[6] & 0x0F) as u64) << 8) | id[7] as u64;
    Some((high << 12) | low)
}

/// True when the version nibble is 8 and the variant is RFC 9562's.
pub fn is_sheaf_layout(id: &[u8; 16]) -> bool {
    id[6] >> 4 == 8 && id[8] >> 6 == 0b10
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct Vector {
        shard: u16,
        unix_ms: u64,
        random: String,
        id: String,
    }

    fn vectors() -> Vec<Vector> {
        serde_json::from_str(include_str!("../testdata/id_vectors.json")).expect("vectors parse")
    }

    fn hex(b: &[u8; 16]) -> String {
        uuid::Uuid::from_bytes(*b).hyphenated().to_string()
    }

    #[test]
    fn matches_the_shared_vectors() {
        let vs = vectors();
        assert!(vs.len() >= 5);
        for v in vs {
            let random = u64::from_str_radix(&v.random, 16).expect("hex random");
            let id = compose(v.shard, v.unix_ms, random).expect("in range");
            assert_eq!(hex(&id), v.id, "shard {} ms {}", v.shard, v.unix_ms);
            assert_eq!(shard_of(&id), v.shard);
            assert_eq!(unix_ms_of(&id), Some(v.unix_ms));
        }
    }

    #[test]
    fn is_a_version_8_rfc_uuid() {
        let id = uuid::Uuid::from_bytes(compose(7, 1_700_000_000_000, u64::MAX).unwrap());
        assert_eq!(id.get_version_num(), 8);
        assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
    }

    #[test]
    fn sorts_by_time_within_a_shard() {
        let a = compose(3, 1_000, u64::MAX).unwrap();
        let b = compose(3, 1_001, 0).unwrap();
        let c = compose(3, 1 << 12, 0).unwrap();
        assert!(a < b && b < c);
    }

    #[test]
    fn refuses_timestamps_beyond_44_bits() {
        assert_eq!(
            compose(0, MAX_UNIX_MS + 1, 0),
            Err(IdError::TimestampOutOfRange(MAX_UNIX_MS + 1))
        );
        assert!(compose(0, MAX_UNIX_MS, 0).is_ok());
    }

    #[test]
    fn foreign_uuids_are_unencoded() {
        let v4 = *uuid::Uuid::parse_str("0001a2b3-c4d5-4e6f-8a0b-1c2d3e4f5a6b")
            .unwrap()
            .as_bytes();
        assert_eq!(shard_of(&v4), UNENCODED_SHARD);
        assert_eq!(unix_ms_of(&v4), None);
    }
}
