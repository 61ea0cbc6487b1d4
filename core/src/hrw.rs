//! Rendezvous (highest-random-weight) hashing over shard ids.
//!
//! The score of shard `s` for placement key `k` is
//! `fmix64(xxh64(k, seed 0) ^ fmix64(s + 0x9E37_79B9_7F4A_7C15))`, with
//! `fmix64` the MurmurHash3 64-bit finalizer. The highest score wins; equal
//! scores go to the lower shard id. Scores depend only on the shard id and
//! the key — never on connection strings, configuration order or platform —
//! so placement is order-independent and stable across processes, releases
//! and languages. `core/testdata/hrw_vectors.json` pins it for other clients.
//!
//! Placement keys are domain-separated bytes: [`workflow_key`] for the
//! default (workflow name, workflow id) placement, [`routing_key`] for an
//! explicit routing key, which hashes the key alone.

use xxhash_rust::xxh64::xxh64;

const SHARD_SALT: u64 = 0x9E37_79B9_7F4A_7C15;

/// MurmurHash3's 64-bit finalizer: a bijective avalanche mix.
pub fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// The key bytes of the default placement: `0x00`, the workflow name's
/// length (u32 little-endian), the name, the workflow id.
pub fn workflow_key(workflow_name: &str, workflow_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(5 + workflow_name.len() + workflow_id.len());
    key.push(0);
    key.extend_from_slice(&(workflow_name.len() as u32).to_le_bytes());
    key.extend_from_slice(workflow_name.as_bytes());
    key.extend_from_slice(workflow_id.as_bytes());
    key
}

/// The key bytes of an explicit routing key: `0x01`, then the key.
pub fn routing_key(key: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(1 + key.len());
    bytes.push(1);
    bytes.extend_from_slice(key.as_bytes());
    bytes
}

/// The hash of a placement key, computed once per placement.
pub fn key_hash(key: &[u8]) -> u64 {
    xxh64(key, 0)
}

/// A shard's score for a key hash.
pub fn score(shard: u16, key_hash: u64) -> u64 {
    fmix64(key_hash ^ fmix64(shard as u64 + SHARD_SALT))
}

/// The winning shard among `candidates` (any order); `None` if there are none.
pub fn pick(key_hash: u64, candidates: impl IntoIterator<Item = u16>) -> Option<u16> {
    candidates
        .into_iter()
        .map(|s| (score(s, key_hash), s))
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        .map(|(_, s)| s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct Vector {
        shards: Vec<u16>,
        workflow_name: Option<String>,
        workflow_id: Option<String>,
        routing_key: Option<String>,
        key_hash: String,
        winner: u16,
    }

    #[test]
    fn fmix64_matches_murmur3() {
        assert_eq!(fmix64(0), 0);
        assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
    }

    #[test]
    fn xxh64_is_the_reference_xxhash() {
        // The published xxHash64 of the empty input with seed 0.
        assert_eq!(key_hash(b""), 0xef46_db37_51d8_e999);
    }

    #[test]
    fn matches_the_shared_vectors() {
        let vectors: Vec<Vector> =
            serde_json::from_str(include_str!("../testdata/hrw_vectors.json")).expect("vectors parse");
        assert!(vectors.len() >= 6);
        for v in vectors {
            let key = match (&v.workflow_name, &v.workflow_id, &v.routing_key) {
                (Some(n), Some(i), None) => workflow_key(n, i),
                (None, None, Some(k)) => routing_key(k),
                _ => panic!("a vector is a workflow key or a routing key"),
            };
            assert_eq!(format!("{:016x}", key_hash(&key)), v.key_hash);
            assert_eq!(pick(key_hash(&key), v.shards.iter().copied()), Some(v.winner));
        }
    }

    #[test]
    fn order_never_matters() {
        let h = key_hash(&workflow_key("order_flow", "order-42"));
        let forward: Vec<u16> = (0..16).collect();
        let backward: Vec<u16> = (0..16).rev().collect();
        assert_eq!(pick(h, forward), pick(h, backward));
    }

    #[test]
    fn adding_a_fifth_shard_moves_about_a_fifth_of_the_keys() {
        let n = 100_000;
        let mut moved = 0;
        let mut to_new = 0;
        for i in 0..n {
            let h = key_hash(&workflow_key("wf", &format!("id-{i}")));
            let before = pick(h, 0..4).unwrap();
            let after = pick(h, 0..5).unwrap();
            if before != after {
                moved += 1;
                if after == 4 {
                    to_new += 1;
                }
            }
        }
        // Ideal 20%; tolerance ±1 point. Every moved key moves to the new shard.
        let share = moved as f64 / n as f64;
        assert!((0.19..=0.21).contains(&share), "moved {share}");
        assert_eq!(moved, to_new);
    }

    #[test]
    fn keys_spread_evenly() {
        let mut counts = [0u32; 8];
        for i in 0..80_000 {
            let h = key_hash(&workflow_key("wf", &format!("{i}")));
            counts[pick(h, 0..8).unwrap() as usize] += 1;
        }
        for c in counts {
            assert!((9_400..=10_600).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn workflow_and_routing_keys_are_distinct_domains() {
        assert_ne!(workflow_key("a", "b"), routing_key("ab"));
        assert_ne!(workflow_key("ab", ""), workflow_key("a", "b"));
    }
}
