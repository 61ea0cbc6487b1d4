//! The set of shards a client routes across, validated when it is built.
//!
//! A misconfiguration is an error at boot, never at the first request.
//! Errors name the entry (by position or shard id), never its connection
//! string: connection strings carry credentials.

use std::collections::BTreeMap;
use std::fmt;

use sheaf_core::id::MAX_SHARD_ID;

/// A shard's id: the value its database holds in `sheaf.shard_id()` and the
/// prefix of every id it mints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct ShardId(u16);

impl ShardId {
    pub fn new(id: u32) -> Result<Self, TopologyError> {
        if id > MAX_SHARD_ID as u32 {
            return Err(TopologyError::IdOutOfRange(id));
        }
        Ok(ShardId(id as u16))
    }

    pub fn get(self) -> u16 {
        self.0
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One shard database.
#[derive(Clone, PartialEq, Eq)]
pub struct Shard {
    pub id: ShardId,
    pub url: String,
}

// The url carries credentials: Debug shows only the id.
impl fmt::Debug for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shard")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("the topology has no shards")]
    Empty,
    #[error("shard entry {index} is not of the form <id>=<connection string>")]
    MalformedEntry { index: usize },
    #[error("shard id {0} is out of range (0..={max})", max = MAX_SHARD_ID)]
    IdOutOfRange(u32),
    #[error("shard id {0} appears more than once")]
    DuplicateId(u16),
    #[error("SHEAF_SHARDS is not valid JSON: {0}")]
    Json(String),
}

/// The shards, keyed by id. Order of configuration never matters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    shards: BTreeMap<ShardId, Shard>,
}

impl Topology {
    /// Builds a topology from `(id, url)` pairs.
    pub fn new(shards: impl IntoIterator<Item = (u32, String)>) -> Result<Self, TopologyError> {
        let mut map = BTreeMap::new();
        for (id, url) in shards {
            let id = ShardId::new(id)?;
            if map.insert(id, Shard { id, url }).is_some() {
                return Err(TopologyError::DuplicateId(id.get()));
            }
        }
        if map.is_empty() {
            return Err(TopologyError::Empty);
        }
        Ok(Topology { shards: map })
    }

    /// Parses the `SHEAF_SHARDS` format: entries `<id>=<url>`, either
    /// comma- or newline-separated, or as a JSON array of strings.
    pub fn parse(spec: &str) -> Result<Self, TopologyError> {
        let trimmed = spec.trim();
        let entries: Vec<String> = if trimmed.starts_with('[') {
            serde_json::from_str::<Vec<String>>(trimmed).map_err(|e| TopologyError::Json(e.to_string()))?
        } else {
            trimmed
                .split([',', '\n'])
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(str::to_owned)
                .collect()
        };
        let mut pairs = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            let (id, url) = entry
                .split_once('=')
                .ok_or(TopologyError::MalformedEntry { index })?;
            let id: u32 = id
                .trim()
                .parse()
                .map_err(|_| TopologyError::MalformedEntry { index })?;
            let url = url.trim();
            if url.is_empty() {
                return Err(TopologyError::MalformedEntry { index });
            }
            pairs.push((id, url.to_owned()));
        }
        Topology::new(pairs)
    }

    pub fn shards(&self) -> impl Iterator<Item = &Shard> {
        self.shards.values()
    }

    pub fn get(&self, id: ShardId) -> Option<&Shard> {
        self.shards.get(&id)
    }

    pub fn len(&self) -> usize {
        self.shards.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_comma_newline_and_json_lists_alike() {
        let a = Topology::parse("0=postgres://a/x, 1=postgres://b/y").unwrap();
        let b = Topology::parse("1=postgres://b/y\n0=postgres://a/x\n").unwrap();
        let c = Topology::parse(r#"["1=postgres://b/y", "0=postgres://a/x"]"#).unwrap();
        assert_eq!(a, b);
        assert_eq!(a, c);
        let ids: Vec<u16> = a.shards().map(|s| s.id.get()).collect();
        assert_eq!(ids, vec![0, 1]);
        assert_eq!(a.get(ShardId::new(1).unwrap()).unwrap().url, "postgres://b/y");
    }

    #[test]
    fn urls_may_contain_equals_signs() {
        let t = Topology::parse("3=host=127.0.0.1 port=5 dbname=sheaf").unwrap();
        assert_eq!(
            t.get(ShardId::new(3).unwrap()).unwrap().url,
            "host=127.0.0.1 port=5 dbname=sheaf"
        );
    }

    #[test]
    fn refuses_misconfigurations_without_echoing_credentials() {
        let cases = [
            ("", TopologyError::Empty),
            (
                "0=postgres://u:secret@h/d,0=postgres://u:secret@h/e",
                TopologyError::DuplicateId(0),
            ),
            (
                "65535=postgres://u:secret@h/d",
                TopologyError::IdOutOfRange(65535),
            ),
            (
                "postgres://u:secret@h/d",
                TopologyError::MalformedEntry { index: 0 },
            ),
            (
                "0=postgres://h/d,x=postgres://u:secret@h/d",
                TopologyError::MalformedEntry { index: 1 },
            ),
            ("0=", TopologyError::MalformedEntry { index: 0 }),
        ];
        for (spec, want) in cases {
            let err = Topology::parse(spec).unwrap_err();
            assert_eq!(err, want, "{spec}");
            assert!(!err.to_string().contains("secret"), "{err}");
        }
        assert!(matches!(Topology::parse("[1,"), Err(TopologyError::Json(_))));
    }

    #[test]
    fn debug_output_hides_connection_strings() {
        let t = Topology::parse("0=postgres://u:secret@h/d").unwrap();
        assert!(!format!("{t:?}").contains("secret"));
    }
}
