//! The topology digest: `sha256:` and the hex SHA-256 of a topology's
//! byte-stable projection (ids, roles, residency map, forwards, reserved,
//! default; never connection strings). Two clients, or a client and a
//! shard, agree on the topology exactly when their digests are equal.

use sha2::{Digest, Sha256};

/// The prefix of every digest.
pub const PREFIX: &str = "sha256:";

/// The digest of `projection`.
pub fn of(projection: &[u8]) -> String {
    let hash = Sha256::digest(projection);
    let mut out = String::with_capacity(PREFIX.len() + 64);
    out.push_str(PREFIX);
    for b in hash.iter() {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Whether `s` has a digest's form: `sha256:` and 64 lowercase hex digits.
pub fn is_digest(s: &str) -> bool {
    s.strip_prefix(PREFIX).is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        assert_eq!(
            of(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            of(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn the_form_is_checked() {
        assert!(is_digest(&of(b"x")));
        assert!(!is_digest("sha256:abc"));
        assert!(!is_digest(&of(b"x").to_uppercase()));
        assert!(!is_digest(&of(b"x").replace("sha256:", "md5:")));
    }
}
