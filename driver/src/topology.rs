//! The set of shards a client routes across, [`Topology`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;
use sheaf_core::id::MAX_SHARD_ID;
use sheaf_core::placement::{Parts, Projection, TenantPlacement};

/// A shard's id: the value its database holds in `sheaf.shard_id()` and the
/// prefix of every id it mints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ShardId(u16);

impl ShardId {
    /// The id, if it is in range (0..=65534; 0xFFFF means "unencoded").
    pub fn new(id: u32) -> Result<Self, TopologyError> {
        if id > MAX_SHARD_ID as u32 {
            return Err(TopologyError::IdOutOfRange(id));
        }
        Ok(ShardId(id as u16))
    }

    /// The id as a number.
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
    /// Its id.
    pub id: ShardId,
    /// Its connection string (credentials included: never logged).
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

/// Why a topology could not be built. Operator-facing: shard ids and
/// residency keys appear here (a boot failure is read by the operator), but
/// connection strings never do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// No shard at all.
    #[error("the topology has no shards")]
    Empty,
    /// A `SHEAF_SHARDS` entry that is not `<id>=<url>` (`index` from 0).
    #[error("shard entry {index} is not of the form <id>=<connection string>")]
    MalformedEntry {
        /// Which entry, from 0.
        index: usize,
    },
    /// A shard id above 65534.
    #[error("shard id {0} is out of range (0..={max})", max = MAX_SHARD_ID)]
    IdOutOfRange(u32),
    /// Two shards with one id.
    #[error("shard id {0} appears more than once")]
    DuplicateId(u16),
    /// `SHEAF_SHARDS` looked like JSON but did not parse.
    #[error("SHEAF_SHARDS is not valid JSON: {0}")]
    Json(String),
    /// A required environment variable is missing.
    #[error("{0} is not set")]
    Missing(&'static str),
    /// An environment variable that does not parse.
    #[error("{0} is malformed: expected comma-separated ids, or key=id pairs for residency and forwards")]
    BadVariable(&'static str),
    /// A role set names a shard the topology does not have.
    #[error("the {set} set names shard {shard}, which is not in the topology")]
    UnknownShard {
        /// Which set (readable, writable, reserved, …).
        set: &'static str,
        /// The shard it names.
        shard: u16,
    },
    /// New work could go where no worker may claim it.
    #[error("writable shard {0} is not readable")]
    WritableNotReadable(u16),
    /// Unencoded ids would route to a shard no one reads.
    #[error("the default shard {0} is not readable")]
    DefaultNotReadable(u16),
    /// Unencoded ids would route to a reserved shard.
    #[error("the default shard {0} is reserved; unpinned work must never land on a reserved shard")]
    ReservedDefault(u16),
    /// No shard would be left for unpinned work.
    #[error("reserved shards cover every writable shard: unpinned starts would have nowhere to go")]
    ReservedCoverWritable,
    /// An empty residency key.
    #[error("a residency key is blank")]
    BlankResidencyKey,
    /// A residency key pointing at a shard no one reads.
    #[error("residency key {key:?} points at shard {shard}, which is not readable")]
    ResidencyNotReadable {
        /// The key.
        key: String,
        /// The shard it points at.
        shard: u16,
    },
    /// A forward to a shard no one reads.
    #[error("shard {from} forwards to shard {to}, which is not readable")]
    ForwardNotReadable {
        /// The forwarded shard.
        from: u16,
        /// Where it forwards.
        to: u16,
    },
    /// Forwards that loop. No longer produced: a forward's `from` must
    /// not be listed ([`TopologyError::ForwardFromListed`]) and its `to`
    /// must be readable, so forwards cannot chain; kept for callers that
    /// match on it.
    #[error("shard {0} forwards to itself, directly or through other forwards")]
    ForwardCycle(u16),
    /// A forward from a shard still in the topology: ids of its live runs
    /// would be sent elsewhere. Forward a shard only once it is retired
    /// (drained, then removed from `SHEAF_SHARDS`).
    #[error(
        "forwards entry {from}={to}: shard {from} is still in the topology; forward a shard only once it is retired"
    )]
    ForwardFromListed {
        /// The forwarded shard.
        from: u16,
        /// Where it forwards.
        to: u16,
    },
    /// The topology's projection was refused by `sheaf_core::placement`
    /// after the driver's own checks passed (a bug: please report it).
    #[error("the topology's projection is invalid: {0}")]
    Projection(String),
    /// A pinned digest (`SHEAF_TOPOLOGY_DIGEST`, [`TopologyBuilder::expect_digest`])
    /// that is not of the form `sha256:<64 hex digits>`.
    #[error("the pinned topology digest is not of the form sha256:<64 lowercase hex digits>")]
    BadDigest,
    /// The topology hashes to another digest than the one pinned: this
    /// client would disagree with the fleet about where work goes.
    #[error(
        "this topology's digest is {actual}, but {expected} is pinned: the configuration differs from the fleet's"
    )]
    DigestMismatch {
        /// The pinned digest.
        expected: String,
        /// This topology's.
        actual: String,
    },
}

/// The set of shards a client routes across and their roles, keyed by id;
/// the order of configuration never matters. Validated when it is built:
/// a misconfiguration is an error at boot, never at the first request.
/// Errors name the entry (by position or shard id), never its connection
/// string: connection strings carry credentials.
///
/// From the environment (`SHEAF_SHARDS`, one `id=url` per shard), from a
/// spec, or built:
///
/// ```
/// use sheaf_driver::{ShardId, Topology};
///
/// # fn main() -> Result<(), sheaf_driver::TopologyError> {
/// // In production: Topology::from_env()?, so no password is on a command line.
/// let spec = Topology::parse("0=postgres://app@db0/sheaf,1=postgres://app@db1/sheaf")?;
/// assert_eq!(spec.shards().count(), 2);
///
/// // A third shard joins read-only first: nothing is placed on it yet.
/// let rollout = Topology::builder()
///     .shard(0, "postgres://app@db0/sheaf")
///     .shard(1, "postgres://app@db1/sheaf")
///     .shard(2, "postgres://app@db2/sheaf")
///     .writable([0, 1])
///     .build()?;
/// let new = ShardId::new(2)?;
/// assert!(rollout.is_readable(new) && !rollout.is_writable(new));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// The projection placement is computed over (`sheaf_core::placement`,
    /// shared with the shards' placement functions).
    /// Every role, the residency map and the forwards live there alone.
    pub(crate) placement: Projection,
    shards: BTreeMap<ShardId, Shard>,
}

/// Builds a [`Topology`]; every set defaults to "all shards" (reserved to
/// none, default to the lowest readable unreserved id).
#[derive(Debug, Default, Clone)]
pub struct TopologyBuilder {
    shards: Vec<(u32, String)>,
    readable: Option<Vec<u32>>,
    writable: Option<Vec<u32>>,
    reserved: Vec<u32>,
    default: Option<u32>,
    residency: Vec<(String, u32)>,
    forwards: Vec<(u32, u32)>,
    tenants: TenantPlacement,
    digest: Option<String>,
}

impl TopologyBuilder {
    /// A builder holding the shards of a `SHEAF_SHARDS` list.
    pub fn from_spec(spec: &str) -> Result<TopologyBuilder, TopologyError> {
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
        let mut builder = Topology::builder();
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
            builder = builder.shard(id, url);
        }
        Ok(builder)
    }

    /// Adds shard `id` at `url` (readable and writable unless the sets say otherwise).
    pub fn shard(mut self, id: u32, url: impl Into<String>) -> Self {
        self.shards.push((id, url.into()));
        self
    }

    /// The shards workers may claim from (default: all).
    pub fn readable(mut self, ids: impl IntoIterator<Item = u32>) -> Self {
        self.readable = Some(ids.into_iter().collect());
        self
    }

    /// The shards new work may go to (default: all; empty: a drained fleet).
    pub fn writable(mut self, ids: impl IntoIterator<Item = u32>) -> Self {
        self.writable = Some(ids.into_iter().collect());
        self
    }

    /// Shards only pinned work goes to (residency cells).
    pub fn reserved(mut self, ids: impl IntoIterator<Item = u32>) -> Self {
        self.reserved = ids.into_iter().collect();
        self
    }

    /// Where ids with no shard prefix route (default: the lowest readable unreserved id).
    pub fn default_shard(mut self, id: u32) -> Self {
        self.default = Some(id);
        self
    }

    /// Pins every start carrying residency key `key` to shard `id`.
    pub fn residency(mut self, key: impl Into<String>, id: u32) -> Self {
        self.residency.push((key.into(), id));
        self
    }

    /// Sends id-routed calls for shard `from` (retired, drained) to `to`.
    pub fn forward(mut self, from: u32, to: u32) -> Self {
        self.forwards.push((from, to));
        self
    }

    /// How a start's tenant places it (default
    /// [`TenantPlacement::PerWorkflow`]); part of the digest when set
    /// otherwise.
    pub fn tenants(mut self, tenants: TenantPlacement) -> Self {
        self.tenants = tenants;
        self
    }

    /// Pins the topology's digest ([`Topology::digest`]): building a
    /// topology that hashes differently fails, so a replica configured
    /// unlike its fleet never starts.
    pub fn expect_digest(mut self, digest: impl Into<String>) -> Self {
        self.digest = Some(digest.into());
        self
    }

    /// Validates everything and builds the topology: a bad map is an error
    /// here, never at the first request.
    pub fn build(self) -> Result<Topology, TopologyError> {
        let pinned = self.digest.clone();
        let topology = self.build_unpinned()?;
        if let Some(expected) = pinned {
            let expected = expected.trim().to_owned();
            if !sheaf_core::digest::is_digest(&expected) {
                return Err(TopologyError::BadDigest);
            }
            let actual = topology.digest();
            if actual != expected {
                return Err(TopologyError::DigestMismatch { expected, actual });
            }
        }
        Ok(topology)
    }

    fn build_unpinned(self) -> Result<Topology, TopologyError> {
        let shards = collect_shards(self.shards)?;
        let all: BTreeSet<ShardId> = shards.keys().copied().collect();
        let readable = match &self.readable {
            Some(ids) => known(&shards, "readable", ids)?,
            None => all,
        };
        let writable = match &self.writable {
            Some(ids) => known(&shards, "writable", ids)?,
            None => readable.clone(),
        };
        if let Some(w) = writable.difference(&readable).next() {
            return Err(TopologyError::WritableNotReadable(w.get()));
        }
        let reserved = known(&shards, "reserved", &self.reserved)?;
        if !writable.is_empty() && writable.is_subset(&reserved) {
            return Err(TopologyError::ReservedCoverWritable);
        }
        let default = pick_default(&shards, self.default, &readable, &reserved)?;
        let residency = collect_residency(self.residency, &readable)?;
        let forwards = collect_forwards(self.forwards, &shards, &readable)?;
        let raw = |set: &BTreeSet<ShardId>| set.iter().map(|s| u64::from(s.get())).collect::<Vec<_>>();
        // Validated above with the driver's own errors; core checks the
        // same rules, so a refusal here would be a bug, reported as one.
        let placement = Projection::build(Parts {
            shards: shards.keys().map(|s| u64::from(s.get())).collect(),
            readable: Some(raw(&readable)),
            writable: Some(raw(&writable)),
            reserved: raw(&reserved),
            default: Some(u64::from(default.get())),
            residency: residency
                .iter()
                .map(|(k, v)| (k.clone(), u64::from(v.get())))
                .collect(),
            forwards: forwards
                .iter()
                .map(|(k, v)| (u64::from(k.get()), u64::from(v.get())))
                .collect(),
            tenants: self.tenants,
        })
        .map_err(|e| TopologyError::Projection(e.to_string()))?;
        Ok(Topology { placement, shards })
    }
}

fn collect_shards(entries: Vec<(u32, String)>) -> Result<BTreeMap<ShardId, Shard>, TopologyError> {
    let mut shards = BTreeMap::new();
    for (id, url) in entries {
        let id = ShardId::new(id)?;
        if shards.insert(id, Shard { id, url }).is_some() {
            return Err(TopologyError::DuplicateId(id.get()));
        }
    }
    if shards.is_empty() {
        return Err(TopologyError::Empty);
    }
    Ok(shards)
}

/// The ids of one set (named `set` in the error), each a shard of the map.
fn known(
    shards: &BTreeMap<ShardId, Shard>,
    set: &'static str,
    ids: &[u32],
) -> Result<BTreeSet<ShardId>, TopologyError> {
    ids.iter()
        .map(|&id| {
            let sid = ShardId::new(id)?;
            if shards.contains_key(&sid) {
                Ok(sid)
            } else {
                Err(TopologyError::UnknownShard {
                    set,
                    shard: id as u16,
                })
            }
        })
        .collect()
}

/// The default shard: the given one (readable, unreserved), else the lowest
/// readable unreserved id.
fn pick_default(
    shards: &BTreeMap<ShardId, Shard>,
    given: Option<u32>,
    readable: &BTreeSet<ShardId>,
    reserved: &BTreeSet<ShardId>,
) -> Result<ShardId, TopologyError> {
    let default = match given {
        Some(raw) => {
            known(shards, "default", &[raw])?;
            let id = ShardId::new(raw)?;
            if !readable.contains(&id) {
                return Err(TopologyError::DefaultNotReadable(id.get()));
            }
            id
        }
        None => match readable.iter().find(|id| !reserved.contains(id)) {
            Some(id) => *id,
            None => *readable
                .iter()
                .next()
                .ok_or(TopologyError::ReservedCoverWritable)?,
        },
    };
    if reserved.contains(&default) {
        return Err(TopologyError::ReservedDefault(default.get()));
    }
    Ok(default)
}

fn collect_residency(
    entries: Vec<(String, u32)>,
    readable: &BTreeSet<ShardId>,
) -> Result<BTreeMap<String, ShardId>, TopologyError> {
    let mut residency = BTreeMap::new();
    for (key, id) in entries {
        if key.trim().is_empty() {
            return Err(TopologyError::BlankResidencyKey);
        }
        let sid = ShardId::new(id)?;
        if !readable.contains(&sid) {
            return Err(TopologyError::ResidencyNotReadable {
                key,
                shard: id as u16,
            });
        }
        residency.insert(key, sid);
    }
    Ok(residency)
}

/// Forwards from retired shards (not listed) to readable ones. Such
/// forwards cannot chain, so none loops.
fn collect_forwards(
    entries: Vec<(u32, u32)>,
    shards: &BTreeMap<ShardId, Shard>,
    readable: &BTreeSet<ShardId>,
) -> Result<BTreeMap<ShardId, ShardId>, TopologyError> {
    let mut forwards = BTreeMap::new();
    for (from, to) in entries {
        let (from_id, to_id) = (ShardId::new(from)?, ShardId::new(to)?);
        // A listed shard may still hold live runs: its ids must reach it.
        if shards.contains_key(&from_id) {
            return Err(TopologyError::ForwardFromListed {
                from: from as u16,
                to: to as u16,
            });
        }
        if !readable.contains(&to_id) {
            return Err(TopologyError::ForwardNotReadable {
                from: from as u16,
                to: to as u16,
            });
        }
        forwards.insert(from_id, to_id);
    }
    Ok(forwards)
}

/// A comma-separated list of shard ids; blank is the empty list.
fn ids(var: &'static str, value: &str) -> Result<Vec<u32>, TopologyError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| TopologyError::BadVariable(var)))
        .collect()
}

/// Comma-separated `left=right` pairs, split at the last `=` (so a key may
/// contain one).
fn pairs(var: &'static str, value: &str) -> Result<Vec<(String, String)>, TopologyError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|pair| {
            pair.rsplit_once('=')
                .map(|(l, r)| (l.trim().to_owned(), r.trim().to_owned()))
                .ok_or(TopologyError::BadVariable(var))
        })
        .collect()
}

impl Topology {
    /// A topology built shard by shard.
    pub fn builder() -> TopologyBuilder {
        TopologyBuilder::default()
    }

    /// Parses the `SHEAF_SHARDS` format: entries `<id>=<url>`, either
    /// comma- or newline-separated, or as a JSON array of strings. Every
    /// shard is readable and writable; none reserved.
    pub fn parse(spec: &str) -> Result<Self, TopologyError> {
        TopologyBuilder::from_spec(spec)?.build()
    }

    /// The topology the environment describes: `SHEAF_SHARDS` (required, as
    /// [`Topology::parse`] reads it) and, optionally, `SHEAF_READABLE`,
    /// `SHEAF_WRITABLE` and `SHEAF_RESERVED` (comma-separated ids; an empty
    /// `SHEAF_WRITABLE` is a drained fleet), `SHEAF_DEFAULT_SHARD` (an id),
    /// `SHEAF_RESIDENCY` (`key=id` pairs) and `SHEAF_FORWARDS` (`from=to`
    /// pairs), `SHEAF_TENANTS` (`per_workflow` or `together`,
    /// [`TenantPlacement`]), and `SHEAF_TOPOLOGY_DIGEST` (the fleet's digest: a topology
    /// that hashes otherwise fails). Checked like a built topology, now.
    pub fn from_env() -> Result<Self, TopologyError> {
        Topology::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Topology::from_env`] over any source of variables.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, TopologyError> {
        let spec = var("SHEAF_SHARDS").ok_or(TopologyError::Missing("SHEAF_SHARDS"))?;
        let mut builder = TopologyBuilder::from_spec(&spec)?;
        if let Some(v) = var("SHEAF_READABLE") {
            builder = builder.readable(ids("SHEAF_READABLE", &v)?);
        }
        if let Some(v) = var("SHEAF_WRITABLE") {
            builder = builder.writable(ids("SHEAF_WRITABLE", &v)?);
        }
        if let Some(v) = var("SHEAF_RESERVED") {
            builder = builder.reserved(ids("SHEAF_RESERVED", &v)?);
        }
        if let Some(v) = var("SHEAF_DEFAULT_SHARD") {
            let id = v
                .trim()
                .parse()
                .map_err(|_| TopologyError::BadVariable("SHEAF_DEFAULT_SHARD"))?;
            builder = builder.default_shard(id);
        }
        if let Some(v) = var("SHEAF_RESIDENCY") {
            for (key, id) in pairs("SHEAF_RESIDENCY", &v)? {
                let id = id
                    .parse()
                    .map_err(|_| TopologyError::BadVariable("SHEAF_RESIDENCY"))?;
                builder = builder.residency(key, id);
            }
        }
        if let Some(v) = var("SHEAF_FORWARDS") {
            for (from, to) in pairs("SHEAF_FORWARDS", &v)? {
                let parse = |s: &str| {
                    s.parse()
                        .map_err(|_| TopologyError::BadVariable("SHEAF_FORWARDS"))
                };
                builder = builder.forward(parse(&from)?, parse(&to)?);
            }
        }
        if let Some(v) = var("SHEAF_TENANTS") {
            let tenants =
                TenantPlacement::parse(v.trim()).ok_or(TopologyError::BadVariable("SHEAF_TENANTS"))?;
            builder = builder.tenants(tenants);
        }
        if let Some(v) = var("SHEAF_TOPOLOGY_DIGEST") {
            builder = builder.expect_digest(v);
        }
        builder.build()
    }

    /// Every shard, by id.
    pub fn shards(&self) -> impl Iterator<Item = &Shard> {
        self.shards.values()
    }

    /// One shard, if the topology has it.
    pub fn get(&self, id: ShardId) -> Option<&Shard> {
        self.shards.get(&id)
    }

    /// How many shards.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// Whether there are none (a built topology always has one).
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// Whether workers may claim from `id`.
    pub fn is_readable(&self, id: ShardId) -> bool {
        self.placement.is_readable(id.get())
    }

    /// Whether new work may go to `id`.
    pub fn is_writable(&self, id: ShardId) -> bool {
        self.placement.is_writable(id.get())
    }

    /// Whether `id` takes pinned work only.
    pub fn is_reserved(&self, id: ShardId) -> bool {
        self.placement.is_reserved(id.get())
    }

    /// Where unencoded ids route.
    pub fn default_shard(&self) -> ShardId {
        ShardId(self.placement.default_shard())
    }

    /// The shard a residency key names.
    pub fn residency(&self, key: &str) -> Option<ShardId> {
        self.placement.residency(key).map(ShardId)
    }

    /// Where unpinned starts may land: writable and not reserved.
    pub fn placeable(&self) -> impl Iterator<Item = ShardId> + '_ {
        self.placement.placeable().map(ShardId)
    }

    /// The shard that serves id-routed calls for `id`: its forward chain's end.
    pub fn serving(&self, id: ShardId) -> ShardId {
        ShardId(self.placement.serving(id.get()))
    }

    /// The admin projection: sorted, byte-stable JSON without connection
    /// strings, so two replicas' topologies can be diffed: the canonical
    /// form of `sheaf_core::placement::Projection`, what
    /// `sheaf.publish_topology` takes and hashes.
    pub fn projection(&self) -> String {
        self.placement.canonical()
    }

    /// `sha256:` and the hex SHA-256 of [`Topology::projection`]: equal
    /// exactly when two topologies route alike (connection strings and the
    /// order of configuration play no part).
    pub fn digest(&self) -> String {
        self.placement.digest()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn four() -> TopologyBuilder {
        (0..4).fold(Topology::builder(), |b, i| {
            b.shard(i, format!("postgres://u:secret@h{i}/d"))
        })
    }

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
    fn the_environment_describes_every_set() {
        let env = |pairs: &[(&str, &str)]| {
            let vars: std::collections::HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Topology::from_vars(move |name| vars.get(name).cloned())
        };
        let shards = "0=postgres://a/x,1=postgres://b/x,2=postgres://c/x,3=postgres://d/x";
        let t = env(&[
            ("SHEAF_SHARDS", shards),
            ("SHEAF_WRITABLE", "0, 1,3"),
            ("SHEAF_RESERVED", "3"),
            ("SHEAF_DEFAULT_SHARD", "1"),
            ("SHEAF_RESIDENCY", "cell-a=3, eu=1"),
            ("SHEAF_FORWARDS", "7=0"),
        ])
        .unwrap();
        let id = |n| ShardId::new(n).unwrap();
        assert!(t.is_writable(id(0)) && !t.is_writable(id(2)) && t.is_reserved(id(3)));
        assert_eq!(t.default_shard(), id(1));
        assert_eq!(t.residency("cell-a"), Some(id(3)));
        assert_eq!(t.serving(id(7)), id(0));
        assert_eq!(t.serving(id(2)), id(2), "a listed shard serves its own ids");
        // A drained fleet: nothing writable.
        let drained = env(&[("SHEAF_SHARDS", shards), ("SHEAF_WRITABLE", "")]).unwrap();
        assert_eq!(drained.placeable().count(), 0);
        assert_eq!(env(&[]), Err(TopologyError::Missing("SHEAF_SHARDS")));
        for (var, value) in [
            ("SHEAF_WRITABLE", "0,x"),
            ("SHEAF_DEFAULT_SHARD", "one"),
            ("SHEAF_RESIDENCY", "cell-a"),
            ("SHEAF_FORWARDS", "2=zero"),
            ("SHEAF_TENANTS", "apart"),
        ] {
            assert_eq!(
                env(&[("SHEAF_SHARDS", shards), (var, value)]),
                Err(TopologyError::BadVariable(var))
            );
        }
        // Tenants together: in the projection, so in the digest.
        let plain = env(&[("SHEAF_SHARDS", shards)]).unwrap();
        let together = env(&[("SHEAF_SHARDS", shards), ("SHEAF_TENANTS", "together")]).unwrap();
        assert!(together.projection().ends_with(r#","tenants":"together"}"#));
        assert_ne!(together.digest(), plain.digest());
        // Misconfigurations are caught as in the builder.
        assert_eq!(
            env(&[("SHEAF_SHARDS", shards), ("SHEAF_FORWARDS", "2=0")]),
            Err(TopologyError::ForwardFromListed { from: 2, to: 0 })
        );
        assert_eq!(
            env(&[("SHEAF_SHARDS", shards), ("SHEAF_RESERVED", "0,1,2,3")]),
            Err(TopologyError::ReservedCoverWritable)
        );
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
    fn refuses_malformed_lists_without_echoing_credentials() {
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
    fn every_misconfiguration_is_a_typed_error_at_build() {
        use TopologyError::*;
        let cases: Vec<(TopologyBuilder, TopologyError)> = vec![
            (four().residency("  ", 1), BlankResidencyKey),
            (
                four().readable([0, 1, 2]).writable([0, 1]).residency("eu", 3),
                ResidencyNotReadable {
                    key: "eu".into(),
                    shard: 3,
                },
            ),
            (four().reserved([0]).default_shard(0), ReservedDefault(0)),
            (four().writable([1, 2]).reserved([1, 2]), ReservedCoverWritable),
            (
                four().readable([0, 1, 2]).writable([0, 1]).forward(5, 3),
                ForwardNotReadable { from: 5, to: 3 },
            ),
            (four().forward(5, 5), ForwardNotReadable { from: 5, to: 5 }),
            // A listed shard may hold live runs: its ids are its own. This
            // also rules out chains and loops (1=2 with 2=1).
            (
                four().readable([0, 1, 2]).writable([0, 1]).forward(3, 0),
                ForwardFromListed { from: 3, to: 0 },
            ),
            (
                four().forward(1, 2).forward(2, 1),
                ForwardFromListed { from: 1, to: 2 },
            ),
            (four().shard(2, "postgres://again"), DuplicateId(2)),
            (four().shard(70_000, "postgres://x"), IdOutOfRange(70_000)),
            (
                four().writable([0, 9]),
                UnknownShard {
                    set: "writable",
                    shard: 9,
                },
            ),
            (four().readable([0, 1]).writable([0, 2]), WritableNotReadable(2)),
            (four().readable([0, 1]).default_shard(3), DefaultNotReadable(3)),
        ];
        for (builder, want) in cases {
            let got = builder.build().unwrap_err();
            assert_eq!(got, want);
            assert!(!got.to_string().contains("secret"), "{got}");
        }
    }

    #[test]
    fn an_empty_writable_set_is_a_valid_drained_fleet() {
        let t = four().writable([]).build().unwrap();
        assert_eq!(t.placeable().count(), 0);
    }

    #[test]
    fn defaults_and_forwards() {
        let t = four().reserved([0]).forward(7, 1).build().unwrap();
        assert_eq!(t.default_shard().get(), 1, "the lowest readable unreserved shard");
        assert_eq!(t.serving(ShardId::new(7).unwrap()).get(), 1);
        assert_eq!(t.serving(ShardId::new(3).unwrap()).get(), 3);
        assert_eq!(t.serving(ShardId::new(2).unwrap()).get(), 2);
        assert_eq!(t.placeable().map(|s| s.get()).collect::<Vec<_>>(), vec![1, 2, 3]);
    }

    #[test]
    fn the_projection_is_byte_stable_and_has_no_credentials() {
        let a = four()
            .reserved([3])
            .residency("eu", 1)
            .residency("us", 2)
            .build()
            .unwrap();
        let b = (0..4)
            .rev()
            .fold(Topology::builder(), |b, i| {
                b.shard(i, format!("postgres://other:creds@h{i}/d"))
            })
            .residency("us", 2)
            .residency("eu", 1)
            .reserved([3])
            .build()
            .unwrap();
        assert_eq!(a.projection(), b.projection());
        assert!(!a.projection().contains("secret"));
        assert_eq!(
            a.projection(),
            r#"{"shards":[0,1,2,3],"readable":[0,1,2,3],"writable":[0,1,2,3],"reserved":[3],"default":0,"residency":{"eu":1,"us":2},"forwards":{}}"#
        );
    }

    #[test]
    fn debug_output_hides_connection_strings() {
        let t = Topology::parse("0=postgres://u:secret@h/d").unwrap();
        assert!(!format!("{t:?}").contains("secret"));
    }

    #[test]
    fn the_digest_follows_routing_and_nothing_else() {
        let base = four().residency("eu", 1).build().unwrap();
        let reordered = (0..4)
            .rev()
            .fold(Topology::builder(), |b, i| {
                b.shard(i, format!("postgres://other@h{i}/d"))
            })
            .residency("eu", 1)
            .build()
            .unwrap();
        assert_eq!(base.digest(), reordered.digest(), "order and urls play no part");
        assert!(sheaf_core::digest::is_digest(&base.digest()));
        for other in [
            four().residency("eu", 2).build().unwrap(),
            four().build().unwrap(),
            four().residency("eu", 1).reserved([3]).build().unwrap(),
            four().residency("eu", 1).forward(9, 0).build().unwrap(),
            four().residency("eu", 1).writable([0, 1]).build().unwrap(),
        ] {
            assert_ne!(base.digest(), other.digest(), "{}", other.projection());
        }
        let pinned = four().residency("eu", 1).expect_digest(base.digest()).build();
        assert_eq!(pinned.unwrap().digest(), base.digest());
        match four().residency("eu", 2).expect_digest(base.digest()).build() {
            Err(TopologyError::DigestMismatch { expected, actual }) => {
                assert_eq!(expected, base.digest());
                assert_ne!(actual, expected);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            four().expect_digest("sha256:nope").build().unwrap_err(),
            TopologyError::BadDigest
        );
        let text = four()
            .residency("eu", 2)
            .expect_digest(base.digest())
            .build()
            .unwrap_err()
            .to_string();
        assert!(!text.contains("secret"), "{text}");
        // From the environment: SHEAF_TOPOLOGY_DIGEST pins it.
        let vars = |digest: String| {
            move |name: &str| match name {
                "SHEAF_SHARDS" => Some("0=postgres://a/x,1=postgres://b/y".to_owned()),
                "SHEAF_TOPOLOGY_DIGEST" => Some(digest.clone()),
                _ => None,
            }
        };
        let plain = Topology::parse("0=postgres://a/x,1=postgres://b/y").unwrap();
        assert_eq!(Topology::from_vars(vars(plain.digest())).unwrap(), plain);
        assert!(matches!(
            Topology::from_vars(vars(base.digest())),
            Err(TopologyError::DigestMismatch { .. })
        ));
    }
}
