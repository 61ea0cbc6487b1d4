//! Placement: which shard owns a start, a keyed task, a mutex key or an id,
//! under a topology's projection. One implementation, used by the driver's
//! router (locally, no round trip) and by the extension's placement
//! functions and its check of misplaced work; `core/testdata/
//! placement_vectors.json` pins both, and `docs/reference/placement.md`
//! writes the rules and the key bytes down for other languages.
//!
//! A [`Projection`] is what routing depends on and nothing else: shard ids,
//! the readable, writable and reserved sets, the default shard, the
//! residency map and the forwards of retired shards; never connection
//! strings. Its canonical form ([`Projection::canonical`]) hashes to the
//! topology digest ([`Projection::digest`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::Value;

use crate::hrw;
use crate::id::{MAX_SHARD_ID, UNENCODED_SHARD};

/// Why a projection is refused. Names the field or shard, never a URL (a
/// projection has none).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProjectionError {
    /// Not a JSON object.
    NotAnObject,
    /// A field a projection does not have.
    UnknownField(String),
    /// A field of the wrong shape.
    BadField {
        /// The field.
        field: &'static str,
        /// What it must be.
        why: &'static str,
    },
    /// No shard at all.
    Empty,
    /// A shard id above 65534.
    IdOutOfRange(u64),
    /// Two shards with one id.
    DuplicateId(u16),
    /// A set, the default, the residency map or a forward names a shard the
    /// projection does not list.
    UnknownShard {
        /// Which set.
        set: &'static str,
        /// The shard.
        shard: u16,
    },
    /// A writable shard no worker reads.
    WritableNotReadable(u16),
    /// The default shard is not readable.
    DefaultNotReadable(u16),
    /// The default shard is reserved.
    ReservedDefault(u16),
    /// Reserved shards cover every writable shard.
    ReservedCoverWritable,
    /// A blank residency key.
    BlankResidencyKey,
    /// A residency key pointing at a shard no one reads.
    ResidencyNotReadable {
        /// The key.
        key: String,
        /// Its shard.
        shard: u16,
    },
    /// A forward to a shard no one reads.
    ForwardNotReadable {
        /// The retired shard.
        from: u16,
        /// Where it forwards.
        to: u16,
    },
    /// A forward from a shard still listed.
    ForwardFromListed {
        /// The forwarded shard.
        from: u16,
        /// Where it forwards.
        to: u16,
    },
}

impl fmt::Display for ProjectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ProjectionError::*;
        match self {
            NotAnObject => write!(f, "a projection is a JSON object"),
            UnknownField(name) => write!(
                f,
                "unknown field {}: a projection has shards, readable, writable, reserved, default, residency and forwards",
                crate::excerpt::quoted(name)
            ),
            BadField { field, why } => write!(f, "{field} must be {why}"),
            Empty => write!(f, "shards lists no shard"),
            IdOutOfRange(id) => write!(f, "shard id {id} is out of range (0..={MAX_SHARD_ID})"),
            DuplicateId(id) => write!(f, "shard id {id} appears more than once"),
            UnknownShard { set, shard } => write!(f, "{set} names shard {shard}, which shards does not list"),
            WritableNotReadable(id) => write!(f, "writable shard {id} is not readable"),
            DefaultNotReadable(id) => write!(f, "the default shard {id} is not readable"),
            ReservedDefault(id) => write!(f, "the default shard {id} is reserved"),
            ReservedCoverWritable => write!(f, "reserved shards cover every writable shard"),
            BlankResidencyKey => write!(f, "a residency key is blank"),
            ResidencyNotReadable { key, shard } => write!(
                f,
                "residency key {} points at shard {shard}, which is not readable",
                crate::excerpt::quoted(key)
            ),
            ForwardNotReadable { from, to } => {
                write!(f, "shard {from} forwards to shard {to}, which is not readable")
            }
            ForwardFromListed { from, to } => write!(
                f,
                "forward {from}={to}: shard {from} is still listed; forward a shard only once it is retired"
            ),
        }
    }
}

impl std::error::Error for ProjectionError {}

/// A refused placement. `Display` never lists shards or residency keys
/// (safe for a low-trust caller); [`PlaceError::operator_detail`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlaceError {
    /// Both a shard pin and a residency key.
    TwoPins,
    /// A pinned shard the projection does not list.
    UnknownShard(u16),
    /// A pinned or resident shard that takes no new work.
    ShardNotWritable(u16),
    /// A blank residency key.
    BlankResidencyKey,
    /// A residency key the map does not have.
    UndeclaredResidencyKey(String),
    /// A blank routing key.
    BlankRoutingKey,
    /// No shard is writable and unreserved.
    NoWritableShard,
    /// A debounced start with a pin, routing key or tenant: the debounce
    /// key places it.
    DebounceTakesNoPlacement,
}

impl fmt::Display for PlaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PlaceError::TwoPins => "a start may pin a shard or a residency key, not both",
            PlaceError::UnknownShard(_) => "the requested shard is not part of this deployment",
            PlaceError::ShardNotWritable(_) => "the requested shard does not accept new work",
            PlaceError::BlankResidencyKey => "the residency key is blank",
            PlaceError::UndeclaredResidencyKey(_) => "the residency key is not declared in this deployment",
            PlaceError::BlankRoutingKey => "the routing key is blank",
            PlaceError::NoWritableShard => "no shard accepts new work right now; retry later",
            PlaceError::DebounceTakesNoPlacement => {
                "a debounced start is placed by its debounce key: it takes no placement or tenant"
            }
        })
    }
}

impl std::error::Error for PlaceError {}

impl PlaceError {
    /// A stable name for the refusal (the vectors' `error`).
    pub fn code(&self) -> &'static str {
        match self {
            PlaceError::TwoPins => "two_pins",
            PlaceError::UnknownShard(_) => "unknown_shard",
            PlaceError::ShardNotWritable(_) => "shard_not_writable",
            PlaceError::BlankResidencyKey => "blank_residency_key",
            PlaceError::UndeclaredResidencyKey(_) => "undeclared_residency_key",
            PlaceError::BlankRoutingKey => "blank_routing_key",
            PlaceError::NoWritableShard => "no_writable_shard",
            PlaceError::DebounceTakesNoPlacement => "debounce_takes_no_placement",
        }
    }

    /// The detail an operator needs: which shard or key, and why.
    pub fn operator_detail(&self) -> String {
        match self {
            PlaceError::UnknownShard(s) => format!("pinned shard {s} is not in the topology"),
            PlaceError::ShardNotWritable(s) => format!("shard {s} is not writable (drained or read-only)"),
            PlaceError::UndeclaredResidencyKey(k) => {
                format!("residency key {k:?} is not in the residency map")
            }
            PlaceError::NoWritableShard => "the writable set minus the reserved set is empty".into(),
            other => other.to_string(),
        }
    }
}

/// How a start (or a task) asks to be placed, strongest first: a shard or
/// residency pin, else a routing key used verbatim, else automatic (the
/// tenant's routing key for a start with a tenant, else the default key).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pin {
    /// By the default key (or the tenant, for a start).
    #[default]
    Auto,
    /// Exactly this shard.
    Shard(u16),
    /// The shard the residency map names for this key.
    ResidencyKey(String),
    /// Every start or task with this key on one shard.
    RoutingKey(String),
}

impl Pin {
    /// A pin from optional fields: a shard and a residency key together are
    /// refused; either wins over a routing key.
    pub fn from_parts(
        shard: Option<u16>,
        residency_key: Option<String>,
        routing_key: Option<String>,
    ) -> Result<Pin, PlaceError> {
        match (shard, residency_key, routing_key) {
            (Some(_), Some(_), _) => Err(PlaceError::TwoPins),
            (Some(s), None, _) => Ok(Pin::Shard(s)),
            (None, Some(k), _) => Ok(Pin::ResidencyKey(k)),
            (None, None, Some(k)) => Ok(Pin::RoutingKey(k)),
            (None, None, None) => Ok(Pin::Auto),
        }
    }
}

/// A placement as JSON: an object with at most `shard` (a shard id),
/// `residency_key`, `routing_key` and `tenant` (strings); `null` or `{}` is
/// automatic. The pin and the tenant, or what is wrong (naming the field).
pub fn placement_from_json(value: &Value) -> Result<(Pin, Option<String>), String> {
    let object = match value {
        Value::Null => return Ok((Pin::Auto, None)),
        Value::Object(o) => o,
        _ => return Err("must be an object of shard, residency_key, routing_key and tenant".into()),
    };
    let text = |name: &str| -> Result<Option<String>, String> {
        match object.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("{name} must be a string")),
        }
    };
    for name in object.keys() {
        if !["shard", "residency_key", "routing_key", "tenant"].contains(&name.as_str()) {
            return Err(format!(
                "unknown field {}: a placement has shard, residency_key, routing_key and tenant",
                crate::excerpt::quoted(name)
            ));
        }
    }
    let shard = match object.get("shard") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(id) if id <= u64::from(MAX_SHARD_ID) => Some(id as u16),
            _ => return Err(format!("shard must be a shard id (0..={MAX_SHARD_ID})")),
        },
    };
    let pin =
        Pin::from_parts(shard, text("residency_key")?, text("routing_key")?).map_err(|e| e.to_string())?;
    Ok((pin, text("tenant")?))
}

/// A placement as [`placement_from_json`] reads it: `{}` for an automatic
/// one without a tenant.
pub fn placement_to_json(pin: &Pin, tenant: Option<&str>) -> Value {
    let mut m = serde_json::Map::new();
    match pin {
        Pin::Auto => {}
        Pin::Shard(id) => {
            m.insert("shard".into(), (*id).into());
        }
        Pin::ResidencyKey(k) => {
            m.insert("residency_key".into(), k.as_str().into());
        }
        Pin::RoutingKey(k) => {
            m.insert("routing_key".into(), k.as_str().into());
        }
    }
    if let Some(t) = tenant {
        m.insert("tenant".into(), t.into());
    }
    Value::Object(m)
}

/// The key bytes of every placement (see `docs/reference/placement.md`).
pub mod keys {
    use crate::hrw;

    /// A start's default key: [`hrw::workflow_key`] of (name, workflow id).
    pub fn start(workflow_name: &str, workflow_id: &str) -> Vec<u8> {
        hrw::workflow_key(workflow_name, workflow_id)
    }

    /// The routing key a start's tenant implies: `tenant__<tenant>__<workflow name>`.
    pub fn tenant_routing_key(tenant: &str, workflow_name: &str) -> String {
        format!("tenant__{tenant}__{workflow_name}")
    }

    /// The routing key a start's tenant implies when a topology keeps a
    /// tenant's runs together (`tenants: together`): `tenant__<tenant>`.
    pub fn tenant_key(tenant: &str) -> String {
        format!("tenant__{tenant}")
    }

    /// A debounced start's key: the workflow key of (`debounce:<name>`, key).
    pub fn debounce(workflow_name: &str, key: &str) -> Vec<u8> {
        hrw::workflow_key(&format!("debounce:{workflow_name}"), key)
    }

    /// A task's idempotency key: the workflow key of (queue, key).
    pub fn idempotency(queue: &str, key: &str) -> Vec<u8> {
        hrw::workflow_key(queue, key)
    }

    /// A task's rate key: the workflow key of (`rate:<rate limit>`, key).
    pub fn rate(rate_limit: &str, key: &str) -> Vec<u8> {
        hrw::workflow_key(&format!("rate:{rate_limit}"), key)
    }

    /// A mutex key: the routing key `mutex__<key>`.
    pub fn mutex(key: &str) -> Vec<u8> {
        hrw::routing_key(&format!("mutex__{key}"))
    }
}

/// How a start's tenant places it when nothing else does: a topology
/// option, in the projection (and so in the digest).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TenantPlacement {
    /// By `tenant__<tenant>__<workflow name>`: a tenant's runs of one
    /// workflow share a shard, its workflows spread over shards (a
    /// per-tenant quota counts per workflow). The default.
    #[default]
    PerWorkflow,
    /// By `tenant__<tenant>`: all of a tenant's runs, of every workflow,
    /// on one shard (a per-tenant quota counts the tenant's whole load).
    Together,
}

impl TenantPlacement {
    /// Its name in a projection (`tenants`).
    pub fn as_str(self) -> &'static str {
        match self {
            TenantPlacement::PerWorkflow => "per_workflow",
            TenantPlacement::Together => "together",
        }
    }

    /// The option named `name`.
    pub fn parse(name: &str) -> Option<TenantPlacement> {
        match name {
            "per_workflow" => Some(TenantPlacement::PerWorkflow),
            "together" => Some(TenantPlacement::Together),
            _ => None,
        }
    }
}

/// A topology's projection: what placement depends on. Built validated
/// ([`Projection::build`], [`Projection::from_json`]); sets are sorted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Projection {
    shards: BTreeSet<u16>,
    readable: BTreeSet<u16>,
    writable: BTreeSet<u16>,
    reserved: BTreeSet<u16>,
    default: u16,
    residency: BTreeMap<String, u16>,
    forwards: BTreeMap<u16, u16>,
    tenants: TenantPlacement,
}

/// The parts of a projection, before validation. `None` sets take their
/// defaults: readable every shard, writable every readable shard, reserved
/// none, default the lowest readable unreserved shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parts {
    /// Every shard id (order and repeats are checked, not kept).
    pub shards: Vec<u64>,
    /// Where workers claim.
    pub readable: Option<Vec<u64>>,
    /// Where new work may go.
    pub writable: Option<Vec<u64>>,
    /// Shards only pinned work goes to.
    pub reserved: Vec<u64>,
    /// Where unencoded ids route.
    pub default: Option<u64>,
    /// Residency key → shard.
    pub residency: Vec<(String, u64)>,
    /// Retired shard → the shard serving its ids.
    pub forwards: Vec<(u64, u64)>,
    /// How a start's tenant places it.
    pub tenants: TenantPlacement,
}

fn shard_id(raw: u64) -> Result<u16, ProjectionError> {
    if raw > u64::from(MAX_SHARD_ID) {
        return Err(ProjectionError::IdOutOfRange(raw));
    }
    Ok(raw as u16)
}

fn known(shards: &BTreeSet<u16>, set: &'static str, ids: &[u64]) -> Result<BTreeSet<u16>, ProjectionError> {
    ids.iter()
        .map(|&raw| {
            let id = shard_id(raw)?;
            if shards.contains(&id) {
                Ok(id)
            } else {
                Err(ProjectionError::UnknownShard { set, shard: id })
            }
        })
        .collect()
}

impl Projection {
    /// Validates `parts` as the driver's topology builder does.
    pub fn build(parts: Parts) -> Result<Projection, ProjectionError> {
        let mut shards = BTreeSet::new();
        for &raw in &parts.shards {
            let id = shard_id(raw)?;
            if !shards.insert(id) {
                return Err(ProjectionError::DuplicateId(id));
            }
        }
        if shards.is_empty() {
            return Err(ProjectionError::Empty);
        }
        let readable = match &parts.readable {
            Some(ids) => known(&shards, "readable", ids)?,
            None => shards.clone(),
        };
        let writable = match &parts.writable {
            Some(ids) => known(&shards, "writable", ids)?,
            None => readable.clone(),
        };
        if let Some(w) = writable.difference(&readable).next() {
            return Err(ProjectionError::WritableNotReadable(*w));
        }
        let reserved = known(&shards, "reserved", &parts.reserved)?;
        if !writable.is_empty() && writable.is_subset(&reserved) {
            return Err(ProjectionError::ReservedCoverWritable);
        }
        let default = match parts.default {
            Some(raw) => {
                let id = *known(&shards, "default", &[raw])?
                    .iter()
                    .next()
                    .ok_or(ProjectionError::Empty)?;
                if !readable.contains(&id) {
                    return Err(ProjectionError::DefaultNotReadable(id));
                }
                id
            }
            None => match readable.iter().find(|id| !reserved.contains(id)) {
                Some(id) => *id,
                None => *readable
                    .iter()
                    .next()
                    .ok_or(ProjectionError::ReservedCoverWritable)?,
            },
        };
        if reserved.contains(&default) {
            return Err(ProjectionError::ReservedDefault(default));
        }
        let mut residency = BTreeMap::new();
        for (key, raw) in parts.residency {
            if key.trim().is_empty() {
                return Err(ProjectionError::BlankResidencyKey);
            }
            let id = shard_id(raw)?;
            if !readable.contains(&id) {
                return Err(ProjectionError::ResidencyNotReadable { key, shard: id });
            }
            residency.insert(key, id);
        }
        let mut forwards = BTreeMap::new();
        for (from, to) in parts.forwards {
            let (from, to) = (shard_id(from)?, shard_id(to)?);
            if !readable.contains(&to) {
                return Err(ProjectionError::ForwardNotReadable { from, to });
            }
            if shards.contains(&from) {
                return Err(ProjectionError::ForwardFromListed { from, to });
            }
            forwards.insert(from, to);
        }
        Ok(Projection {
            shards,
            readable,
            writable,
            reserved,
            default,
            residency,
            forwards,
            tenants: parts.tenants,
        })
    }

    /// Reads a projection as JSON (its canonical form, or one that leaves
    /// out the sets that take their defaults, see [`Parts`]) and validates it.
    pub fn from_json(value: &Value) -> Result<Projection, ProjectionError> {
        let object = value.as_object().ok_or(ProjectionError::NotAnObject)?;
        let mut parts = Parts::default();
        for (name, v) in object {
            match name.as_str() {
                "shards" => parts.shards = ids(v, "shards")?,
                "readable" => parts.readable = Some(ids(v, "readable")?),
                "writable" => parts.writable = Some(ids(v, "writable")?),
                "reserved" => parts.reserved = ids(v, "reserved")?,
                "default" if v.is_null() => {}
                "default" => parts.default = Some(id_value(v, "default")?),
                "residency" => {
                    parts.residency = pairs(v, "residency")?
                        .into_iter()
                        .map(|(k, id)| (k.to_owned(), id))
                        .collect();
                }
                "forwards" => {
                    parts.forwards = pairs(v, "forwards")?
                        .into_iter()
                        .map(|(k, id)| {
                            k.parse::<u64>()
                                .map(|from| (from, id))
                                .map_err(|_| ProjectionError::BadField {
                                    field: "forwards",
                                    why: "an object of \"<retired shard id>\": <shard id>",
                                })
                        })
                        .collect::<Result<_, _>>()?;
                }
                "tenants" => {
                    parts.tenants =
                        v.as_str()
                            .and_then(TenantPlacement::parse)
                            .ok_or(ProjectionError::BadField {
                                field: "tenants",
                                why: "\"per_workflow\" or \"together\"",
                            })?;
                }
                other => return Err(ProjectionError::UnknownField(other.to_owned())),
            }
        }
        Projection::build(parts)
    }

    /// The canonical form: JSON with no whitespace, the fields in this
    /// order, sets as ascending arrays, the residency map by key (byte
    /// order), forwards by retired shard id (numeric order, keys as decimal
    /// text); strings escaped as serde_json writes them; `tenants` last,
    /// and only when it is not the default (so a fleet that never set it
    /// keeps its digest).
    pub fn canonical(&self) -> String {
        fn set(out: &mut String, name: &str, ids: &BTreeSet<u16>) {
            let list: Vec<String> = ids.iter().map(u16::to_string).collect();
            out.push_str(&format!("\"{name}\":[{}],", list.join(",")));
        }
        let mut out = String::from("{");
        set(&mut out, "shards", &self.shards);
        set(&mut out, "readable", &self.readable);
        set(&mut out, "writable", &self.writable);
        set(&mut out, "reserved", &self.reserved);
        out.push_str(&format!("\"default\":{},", self.default));
        let residency: Vec<String> = self
            .residency
            .iter()
            .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
            .collect();
        out.push_str(&format!("\"residency\":{{{}}},", residency.join(",")));
        let forwards: Vec<String> = self
            .forwards
            .iter()
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect();
        out.push_str(&format!("\"forwards\":{{{}}}", forwards.join(",")));
        if self.tenants != TenantPlacement::PerWorkflow {
            out.push_str(&format!(",\"tenants\":\"{}\"", self.tenants.as_str()));
        }
        out.push('}');
        out
    }

    /// How a start's tenant places it.
    pub fn tenants(&self) -> TenantPlacement {
        self.tenants
    }

    /// The topology digest: `sha256:` and the hex SHA-256 of [`Self::canonical`].
    pub fn digest(&self) -> String {
        crate::digest::of(self.canonical().as_bytes())
    }

    /// Every listed shard, ascending.
    pub fn shards(&self) -> impl Iterator<Item = u16> + '_ {
        self.shards.iter().copied()
    }

    /// Whether `id` is listed.
    pub fn contains(&self, id: u16) -> bool {
        self.shards.contains(&id)
    }

    /// Whether workers claim from `id`.
    pub fn is_readable(&self, id: u16) -> bool {
        self.readable.contains(&id)
    }

    /// Whether new work may go to `id`.
    pub fn is_writable(&self, id: u16) -> bool {
        self.writable.contains(&id)
    }

    /// Whether `id` takes pinned work only.
    pub fn is_reserved(&self, id: u16) -> bool {
        self.reserved.contains(&id)
    }

    /// Where unencoded ids route.
    pub fn default_shard(&self) -> u16 {
        self.default
    }

    /// The shard a residency key names.
    pub fn residency(&self, key: &str) -> Option<u16> {
        self.residency.get(key).copied()
    }

    /// Where unpinned work may land: writable and not reserved.
    pub fn placeable(&self) -> impl Iterator<Item = u16> + '_ {
        self.writable
            .iter()
            .copied()
            .filter(|id| !self.reserved.contains(id))
    }

    /// The shard serving id-routed calls for shard `id`: its forward, if
    /// it is retired (a forward never leads to another forward).
    pub fn serving(&self, id: u16) -> u16 {
        self.forwards.get(&id).copied().unwrap_or(id)
    }

    /// Where an id whose first two bytes say `origin` is looked up first:
    /// the default shard for an unencoded id, then the forward of a
    /// retired shard. (Where the run lives after a move is the seal's
    /// forward on that shard: only that shard knows it.)
    pub fn route_origin(&self, origin: u16) -> u16 {
        let first = if origin == UNENCODED_SHARD {
            self.default
        } else {
            origin
        };
        self.serving(first)
    }

    /// HRW over every listed shard; a winner that is not placeable (not
    /// writable, or reserved) re-hashes among the placeable shards, so a
    /// read-only shard joining moves nothing.
    pub fn hash(&self, key: &[u8]) -> Result<u16, PlaceError> {
        let h = hrw::key_hash(key);
        let winner = hrw::pick(h, self.shards()).ok_or(PlaceError::NoWritableShard)?;
        if self.is_writable(winner) && !self.is_reserved(winner) {
            return Ok(winner);
        }
        hrw::pick(h, self.placeable()).ok_or(PlaceError::NoWritableShard)
    }

    /// The key bytes a hashed start is scored by; `None` for a pin.
    fn start_key(
        &self,
        workflow_name: &str,
        workflow_id: &str,
        pin: &Pin,
        tenant: Option<&str>,
    ) -> Option<Vec<u8>> {
        match pin {
            Pin::RoutingKey(key) => Some(hrw::routing_key(key)),
            Pin::Auto => Some(match tenant.filter(|t| !t.trim().is_empty()) {
                Some(t) => hrw::routing_key(&match self.tenants {
                    TenantPlacement::PerWorkflow => keys::tenant_routing_key(t, workflow_name),
                    TenantPlacement::Together => keys::tenant_key(t),
                }),
                None => keys::start(workflow_name, workflow_id),
            }),
            Pin::Shard(_) | Pin::ResidencyKey(_) => None,
        }
    }

    /// The shard a start of (`workflow_name`, `workflow_id`) goes to,
    /// placed by `pin` and `tenant` (a debounced start: [`Self::place_debounced`]).
    pub fn place(
        &self,
        workflow_name: &str,
        workflow_id: &str,
        pin: &Pin,
        tenant: Option<&str>,
    ) -> Result<u16, PlaceError> {
        match pin {
            Pin::Shard(id) => {
                if !self.contains(*id) {
                    return Err(PlaceError::UnknownShard(*id));
                }
                self.writable_or_refuse(*id)
            }
            Pin::ResidencyKey(key) => {
                if key.trim().is_empty() {
                    return Err(PlaceError::BlankResidencyKey);
                }
                let id = self
                    .residency(key)
                    .ok_or_else(|| PlaceError::UndeclaredResidencyKey(key.clone()))?;
                self.writable_or_refuse(id)
            }
            Pin::RoutingKey(key) if key.trim().is_empty() => Err(PlaceError::BlankRoutingKey),
            Pin::RoutingKey(_) | Pin::Auto => {
                let key = self
                    .start_key(workflow_name, workflow_id, pin, tenant)
                    .ok_or(PlaceError::BlankRoutingKey)?;
                self.hash(&key)
            }
        }
    }

    /// The shard a debounced start of `workflow_name` with debounce key
    /// `key` goes to: by the key alone (no pin, routing key or tenant).
    pub fn place_debounced(&self, workflow_name: &str, key: &str) -> Result<u16, PlaceError> {
        self.hash(&keys::debounce(workflow_name, key))
    }

    /// A start's owner: debounced by its debounce key, else by `pin` and `tenant`.
    pub fn place_start(
        &self,
        workflow_name: &str,
        workflow_id: &str,
        pin: &Pin,
        tenant: Option<&str>,
        debounce_key: Option<&str>,
    ) -> Result<u16, PlaceError> {
        match debounce_key {
            Some(_) if *pin != Pin::Auto || tenant.is_some() => Err(PlaceError::DebounceTakesNoPlacement),
            Some(key) => self.place_debounced(workflow_name, key),
            None => self.place(workflow_name, workflow_id, pin, tenant),
        }
    }

    /// A task's affinity, the (name, key) its placement hashes: its
    /// idempotency key in its queue, else its rate key under its rate limit.
    pub fn task_affinity(
        queue: &str,
        idempotency_key: Option<&str>,
        rate_limit: Option<&str>,
        rate_key: Option<&str>,
    ) -> Option<(String, String)> {
        match (idempotency_key, rate_limit, rate_key) {
            (Some(k), _, _) => Some((queue.to_owned(), k.to_owned())),
            (None, Some(limit), Some(k)) => Some((format!("rate:{limit}"), k.to_owned())),
            _ => None,
        }
    }

    /// A task's owner (a task with no execution): by its affinity and
    /// `pin`; `None` when neither places it (any placeable shard takes it).
    pub fn place_task(
        &self,
        queue: &str,
        idempotency_key: Option<&str>,
        rate_limit: Option<&str>,
        rate_key: Option<&str>,
        pin: &Pin,
    ) -> Result<Option<u16>, PlaceError> {
        match Self::task_affinity(queue, idempotency_key, rate_limit, rate_key) {
            Some((name, key)) => self.place(&name, &key, pin, None).map(Some),
            None if *pin == Pin::Auto => Ok(None),
            // A pin, residency key or routing key places it alone.
            None => self.place(queue, "", pin, None).map(Some),
        }
    }

    /// The shard a hashed mutex key lives on: its rendezvous placement,
    /// followed through forwards; the default shard when no shard is
    /// placeable.
    pub fn place_mutex(&self, key: &str) -> u16 {
        let winner = self.hash(&keys::mutex(key)).unwrap_or(self.default);
        self.serving(winner)
    }

    /// Where a hashed start or keyed task lived before its home stopped
    /// taking work: its winner over every shard, when that is not where it
    /// is placed now and is still readable. `None` for a pin or a key that
    /// did not move.
    pub fn former_home(
        &self,
        workflow_name: &str,
        workflow_id: &str,
        pin: &Pin,
        tenant: Option<&str>,
    ) -> Option<u16> {
        let key = self.start_key(workflow_name, workflow_id, pin, tenant)?;
        self.former_home_of(&key)
    }

    /// [`Self::former_home`] of a key's bytes.
    pub fn former_home_of(&self, key: &[u8]) -> Option<u16> {
        let winner = hrw::pick(hrw::key_hash(key), self.shards())?;
        let now = self.hash(key).ok()?;
        (winner != now && !self.is_writable(winner) && self.is_readable(winner)).then_some(winner)
    }

    fn writable_or_refuse(&self, id: u16) -> Result<u16, PlaceError> {
        if self.is_writable(id) {
            Ok(id)
        } else {
            Err(PlaceError::ShardNotWritable(id))
        }
    }
}

/// What a shard does with work that `place` places under the projections
/// it accepts: the published one first, then the previous one kept while
/// a change rolls out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// An accepted projection places it here, or nothing places it.
    Here,
    /// The published projection places it on this other shard.
    Elsewhere(u16),
    /// The published projection refuses the placement itself.
    Refused(PlaceError),
}

/// Whether shard `here` takes work placed by `place` (`Ok(None)`: any
/// shard takes it) under `current` or `previous`: the first that places
/// it here wins; else the published projection's answer is the refusal.
pub fn admit(
    here: u16,
    current: &Projection,
    previous: Option<&Projection>,
    place: impl Fn(&Projection) -> Result<Option<u16>, PlaceError>,
) -> Admission {
    let verdict = place(current);
    let here_under = |v: &Result<Option<u16>, PlaceError>| matches!(v, Ok(None)) || *v == Ok(Some(here));
    if here_under(&verdict) || previous.is_some_and(|p| here_under(&place(p))) {
        return Admission::Here;
    }
    match verdict {
        Ok(Some(owner)) => Admission::Elsewhere(owner),
        Ok(None) => Admission::Here,
        Err(e) => Admission::Refused(e),
    }
}

fn id_value(v: &Value, field: &'static str) -> Result<u64, ProjectionError> {
    v.as_u64().ok_or(ProjectionError::BadField {
        field,
        why: "a shard id (an integer 0..=65534)",
    })
}

fn ids(v: &Value, field: &'static str) -> Result<Vec<u64>, ProjectionError> {
    let bad = ProjectionError::BadField {
        field,
        why: "an array of shard ids (integers 0..=65534)",
    };
    v.as_array()
        .ok_or_else(|| bad.clone())?
        .iter()
        .map(|x| x.as_u64().ok_or_else(|| bad.clone()))
        .collect()
}

fn pairs<'a>(v: &'a Value, field: &'static str) -> Result<Vec<(&'a str, u64)>, ProjectionError> {
    let bad = ProjectionError::BadField {
        field,
        why: "an object whose values are shard ids",
    };
    v.as_object()
        .ok_or_else(|| bad.clone())?
        .iter()
        .map(|(k, x)| x.as_u64().map(|id| (k.as_str(), id)).ok_or_else(|| bad.clone()))
        .collect()
}

#[cfg(test)]
mod tests;
