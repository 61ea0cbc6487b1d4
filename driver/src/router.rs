//! Placement; the rules are on [`Placement`].

use sheaf_core::hrw;
use sheaf_core::placement::{Pin, PlaceError};

use crate::topology::{ShardId, Topology};

/// How a start (or a task with no execution) asks to be placed.
///
/// Placement: which shard a new execution starts on. Pure, no I/O.
///
/// Resolution, strongest first: an explicit shard pin or residency key; else
/// an explicit routing key, used verbatim; else the ambient tenant, as the
/// routing key `tenant__<tenant>__<workflow name>`; else the default key
/// (workflow name, workflow id). Keys are placed by rendezvous hashing over
/// shard ids (`sheaf_core::hrw`); a winner that is not writable, or is
/// reserved, re-hashes among the writable unreserved shards, so unpinned work
/// never lands on a reserved shard.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Placement {
    /// By (workflow name, workflow id), or the ambient tenant if there is one.
    Auto,
    /// Every start with this key lands on one shard (a global per-key cap).
    RoutingKey(String),
    /// Exactly this shard.
    Shard(ShardId),
    /// The shard the topology's residency map names for this key.
    ResidencyKey(String),
}

impl Placement {
    /// Builds a placement from optional request fields, refusing two pins.
    pub fn from_parts(
        shard: Option<ShardId>,
        residency_key: Option<String>,
        routing_key: Option<String>,
    ) -> Result<Placement, RouteError> {
        match (shard, residency_key, routing_key) {
            (Some(_), Some(_), _) => Err(RouteError::TwoPins),
            (Some(s), None, _) => Ok(Placement::Shard(s)),
            (None, Some(k), _) => Ok(Placement::ResidencyKey(k)),
            (None, None, Some(k)) => Ok(Placement::RoutingKey(k)),
            (None, None, None) => Ok(Placement::Auto),
        }
    }
}

/// A refused placement. `Display` is safe for a low-trust caller: it never
/// lists shards or residency keys. [`RouteError::operator_detail`] has the
/// full story for logs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// Both a shard pin and a residency key were given.
    #[error("a start may pin a shard or a residency key, not both")]
    TwoPins,
    /// The pinned shard is not in the topology.
    #[error("the requested shard is not part of this deployment")]
    UnknownShard(ShardId),
    /// The pinned (or resident) shard is drained or read-only.
    #[error("the requested shard does not accept new work")]
    ShardNotWritable(ShardId),
    /// An empty or blank residency key.
    #[error("the residency key is blank")]
    BlankResidencyKey,
    /// A residency key the residency map does not have.
    #[error("the residency key is not declared in this deployment")]
    UndeclaredResidencyKey(String),
    /// An empty or blank routing key.
    #[error("the routing key is blank")]
    BlankRoutingKey,
    /// No shard is writable and unreserved.
    #[error("no shard accepts new work right now; retry later")]
    NoWritableShard,
}

impl RouteError {
    /// The detail an operator needs: which shard or key, and why.
    pub fn operator_detail(&self) -> String {
        match self {
            RouteError::UnknownShard(s) => format!("pinned shard {s} is not in the topology"),
            RouteError::ShardNotWritable(s) => format!("shard {s} is not writable (drained or read-only)"),
            RouteError::UndeclaredResidencyKey(k) => {
                format!("residency key {k:?} is not in the residency map")
            }
            RouteError::NoWritableShard => "the writable set minus the reserved set is empty".into(),
            other => other.to_string(),
        }
    }

    /// Whether retrying the same request later can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, RouteError::NoWritableShard)
    }
}

impl Placement {
    fn pin(&self) -> Pin {
        match self {
            Placement::Auto => Pin::Auto,
            Placement::RoutingKey(k) => Pin::RoutingKey(k.clone()),
            Placement::Shard(s) => Pin::Shard(s.get()),
            Placement::ResidencyKey(k) => Pin::ResidencyKey(k.clone()),
        }
    }
}

impl From<PlaceError> for RouteError {
    fn from(e: PlaceError) -> RouteError {
        match e {
            PlaceError::TwoPins => RouteError::TwoPins,
            PlaceError::UnknownShard(s) => {
                ShardId::new(u32::from(s)).map_or(RouteError::NoWritableShard, RouteError::UnknownShard)
            }
            PlaceError::ShardNotWritable(s) => {
                ShardId::new(u32::from(s)).map_or(RouteError::NoWritableShard, RouteError::ShardNotWritable)
            }
            PlaceError::BlankResidencyKey => RouteError::BlankResidencyKey,
            PlaceError::UndeclaredResidencyKey(k) => RouteError::UndeclaredResidencyKey(k),
            PlaceError::BlankRoutingKey => RouteError::BlankRoutingKey,
            // The driver refuses a debounced start's placement before
            // placing it; any other refusal means no shard takes work.
            _ => RouteError::NoWritableShard,
        }
    }
}

fn shard(id: u16) -> Result<ShardId, RouteError> {
    ShardId::new(u32::from(id)).map_err(|_| RouteError::NoWritableShard)
}

impl Topology {
    /// The shard a new execution of (`workflow_name`, `workflow_id`) starts on.
    pub fn place(
        &self,
        workflow_name: &str,
        workflow_id: &str,
        placement: &Placement,
        tenant: Option<&str>,
    ) -> Result<ShardId, RouteError> {
        let result = self.place_inner(workflow_name, workflow_id, placement, tenant);
        if let Err(e) = &result {
            tracing::warn!(workflow_name, detail = %e.operator_detail(), "placement refused");
        }
        result
    }

    fn place_inner(
        &self,
        workflow_name: &str,
        workflow_id: &str,
        placement: &Placement,
        tenant: Option<&str>,
    ) -> Result<ShardId, RouteError> {
        shard(
            self.placement
                .place(workflow_name, workflow_id, &placement.pin(), tenant)?,
        )
    }

    /// Where a hashed key lived before its home stopped taking work: its
    /// rendezvous winner over every shard, when that is not the shard
    /// [`place`](Self::place) picks now and is still readable (a shard being
    /// drained, or read-only). What a key's record there (an unfinished
    /// task holding an idempotency key, an open debounce window) still
    /// answers for, the new home cannot: the caller asks it first. `None`
    /// for a pinned placement or a key that did not move.
    pub(crate) fn former_home(
        &self,
        workflow_name: &str,
        workflow_id: &str,
        placement: &Placement,
        tenant: Option<&str>,
    ) -> Option<ShardId> {
        let former = self
            .placement
            .former_home(workflow_name, workflow_id, &placement.pin(), tenant)?;
        shard(former).ok()
    }

    /// Where a drain of `leaving` sends an execution of (`workflow_name`,
    /// `workflow_id`): its rendezvous winner among the placeable shards
    /// other than `leaving`, where a new start of its key would go once
    /// `leaving` is retired.
    pub fn drain_target(
        &self,
        workflow_name: &str,
        workflow_id: &str,
        leaving: ShardId,
    ) -> Result<ShardId, RouteError> {
        self.winner_without(&hrw::workflow_key(workflow_name, workflow_id), leaving)
    }

    /// The shard a retired `leaving` forwards its ids to: the rendezvous
    /// winner of `drain:<id>` among the placeable shards other than it.
    pub fn drain_forward(&self, leaving: ShardId) -> Result<ShardId, RouteError> {
        self.winner_without(&hrw::routing_key(&format!("drain:{leaving}")), leaving)
    }

    fn winner_without(&self, key: &[u8], leaving: ShardId) -> Result<ShardId, RouteError> {
        let h = hrw::key_hash(key);
        let winner = hrw::pick(h, self.placeable().filter(|s| *s != leaving).map(|s| s.get()))
            .ok_or(RouteError::NoWritableShard)?;
        ShardId::new(u32::from(winner)).map_err(|_| RouteError::NoWritableShard)
    }

    /// The shard a hashed mutex key lives on: its rendezvous placement
    /// (the default shard when none is placeable), followed through forwards.
    pub(crate) fn mutex_home(&self, key: &str) -> ShardId {
        shard(self.placement.place_mutex(key)).unwrap_or_else(|_| self.default_shard())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sid(n: u32) -> ShardId {
        ShardId::new(n).unwrap()
    }
    use crate::topology::TopologyBuilder;

    fn fleet(n: u32) -> TopologyBuilder {
        (0..n).fold(Topology::builder(), |b, i| {
            b.shard(i, format!("postgres://h{i}/d"))
        })
    }

    #[test]
    fn placement_is_order_independent_and_restart_stable() {
        let a = fleet(8).build().unwrap();
        let b = (0..8).rev().fold(Topology::builder(), |b, i| {
            b.shard(i, format!("postgres://rotated:creds@h{i}/d"))
        });
        let b = b.build().unwrap();
        for i in 0..1000 {
            let id = format!("w-{i}");
            assert_eq!(
                a.place("wf", &id, &Placement::Auto, None),
                b.place("wf", &id, &Placement::Auto, None)
            );
        }
    }

    #[test]
    fn reserved_shards_are_never_picked_unpinned() {
        let t = fleet(4).reserved([1]).build().unwrap();
        for i in 0..5000 {
            let s = t.place("wf", &i.to_string(), &Placement::Auto, None).unwrap();
            assert_ne!(s.get(), 1);
            let s = t
                .place("wf", "x", &Placement::RoutingKey(format!("k{i}")), None)
                .unwrap();
            assert_ne!(s.get(), 1);
        }
        assert_eq!(
            t.place("wf", "x", &Placement::Shard(sid(1)), None).unwrap().get(),
            1,
            "a pin may"
        );
    }

    #[test]
    fn a_non_writable_winner_rehashes_and_nothing_else_moves() {
        let all = fleet(4).build().unwrap();
        let drained = fleet(4).writable([0, 1, 2]).build().unwrap();
        for i in 0..5000 {
            let id = i.to_string();
            let before = all.place("wf", &id, &Placement::Auto, None).unwrap();
            let after = drained.place("wf", &id, &Placement::Auto, None).unwrap();
            if before.get() == 3 {
                assert_ne!(after.get(), 3);
            } else {
                assert_eq!(before, after, "only the drained shard's keys move");
            }
        }
    }

    #[test]
    fn a_drained_keys_former_home_is_where_it_was_placed_before() {
        let all = fleet(4).build().unwrap();
        let drained = fleet(4).writable([0, 1, 2]).build().unwrap();
        let mut moved = 0;
        for i in 0..2000 {
            let id = i.to_string();
            for placement in [Placement::Auto, Placement::RoutingKey(format!("k{i}"))] {
                let before = all.place("wf", &id, &placement, None).unwrap();
                let former = drained.former_home("wf", &id, &placement, None);
                assert_eq!(
                    all.former_home("wf", &id, &placement, None),
                    None,
                    "nothing moved"
                );
                if before.get() == 3 {
                    moved += 1;
                    assert_eq!(former, Some(before), "asked where it was");
                } else {
                    assert_eq!(former, None, "a key that stayed asks nobody else");
                }
            }
            let pinned = Placement::Shard(sid(3));
            assert_eq!(drained.former_home("wf", &id, &pinned, None), None);
        }
        assert!(
            moved > 500,
            "a quarter of the keys lived on the drained shard: {moved}"
        );
        let retired = fleet(3).build().unwrap();
        assert_eq!(
            retired.former_home("wf", "1", &Placement::Auto, None),
            None,
            "a retired shard is no home"
        );
    }

    #[test]
    fn residency_keys_never_move_when_writable_widens() {
        let narrow = fleet(4).writable([2]).residency("eu", 2).build().unwrap();
        let wide = fleet(6).residency("eu", 2).build().unwrap();
        let eu = Placement::ResidencyKey("eu".into());
        assert_eq!(narrow.place("wf", "a", &eu, None).unwrap().get(), 2);
        assert_eq!(wide.place("wf", "a", &eu, None).unwrap().get(), 2);
    }

    #[test]
    fn a_routing_key_puts_every_start_on_one_shard() {
        let t = fleet(8).build().unwrap();
        let key = Placement::RoutingKey("acme".into());
        let first = t.place("wf", "0", &key, None).unwrap();
        for i in 0..200 {
            assert_eq!(
                t.place(&format!("wf{i}"), &i.to_string(), &key, None).unwrap(),
                first
            );
        }
    }

    #[test]
    fn tenant_routing_resolution_order() {
        let t = fleet(8).build().unwrap();
        // An ambient tenant routes like its tenant routing key...
        let by_tenant = t.place("wf", "1", &Placement::Auto, Some("acme")).unwrap();
        let by_key = t
            .place(
                "wf",
                "2",
                &Placement::RoutingKey(sheaf_core::placement::keys::tenant_routing_key("acme", "wf")),
                None,
            )
            .unwrap();
        assert_eq!(by_tenant, by_key);
        // ...an explicit routing key wins over the tenant...
        let explicit = Placement::RoutingKey("other".into());
        assert_eq!(
            t.place("wf", "1", &explicit, Some("acme")).unwrap(),
            t.place("wf", "1", &explicit, None).unwrap()
        );
        // ...and a pin wins over both.
        assert_eq!(
            t.place("wf", "1", &Placement::Shard(sid(5)), Some("acme"))
                .unwrap()
                .get(),
            5
        );
    }

    #[test]
    fn refusals_are_typed_and_never_list_shards_or_keys() {
        let t = fleet(3)
            .writable([0, 1])
            .residency("eu-secret-region", 2)
            .build()
            .unwrap();
        let cases = [
            (Placement::Shard(sid(9)), RouteError::UnknownShard(sid(9))),
            (Placement::Shard(sid(2)), RouteError::ShardNotWritable(sid(2))),
            (Placement::ResidencyKey(" ".into()), RouteError::BlankResidencyKey),
            (
                Placement::ResidencyKey("mars".into()),
                RouteError::UndeclaredResidencyKey("mars".into()),
            ),
            (
                Placement::ResidencyKey("eu-secret-region".into()),
                RouteError::ShardNotWritable(sid(2)),
            ),
            (Placement::RoutingKey("".into()), RouteError::BlankRoutingKey),
        ];
        for (placement, want) in cases {
            let got = t.place("wf", "1", &placement, None).unwrap_err();
            assert_eq!(got, want);
            let shown = got.to_string();
            for leak in ["0", "1", "2", "9", "eu-secret-region", "mars"] {
                assert!(!shown.contains(leak), "{shown:?} leaks {leak}");
            }
            assert!(!got.operator_detail().is_empty());
        }
        assert_eq!(
            Placement::from_parts(Some(sid(1)), Some("eu".into()), None),
            Err(RouteError::TwoPins)
        );
        assert_eq!(
            Placement::from_parts(None, None, Some("k".into())),
            Ok(Placement::RoutingKey("k".into()))
        );
    }

    #[test]
    fn a_drained_fleet_refuses_unpinned_starts_as_retryable() {
        let t = fleet(3).writable([]).build().unwrap();
        let e = t.place("wf", "1", &Placement::Auto, None).unwrap_err();
        assert_eq!(e, RouteError::NoWritableShard);
        assert!(e.is_retryable());
    }
}

/// The shared placement vectors (`core/testdata/placement_vectors.json`),
/// answered by this router: what the shards' placement functions answer
/// (`tests/tests/placement.rs`) is the same.
#[cfg(test)]
mod vectors {
    use serde_json::Value;

    use super::*;
    use crate::id::ExecutionId;

    fn topology(projection: &Value) -> Topology {
        let ids = |name: &str| -> Vec<u32> {
            projection[name]
                .as_array()
                .map(|a| a.iter().map(|v| v.as_u64().unwrap() as u32).collect())
                .unwrap_or_default()
        };
        let mut b = ids("shards").into_iter().fold(Topology::builder(), |b, i| {
            b.shard(i, format!("postgres://h{i}/d"))
        });
        if projection.get("readable").is_some() {
            b = b.readable(ids("readable"));
        }
        if projection.get("writable").is_some() {
            b = b.writable(ids("writable"));
        }
        b = b.reserved(ids("reserved"));
        if let Some(d) = projection["default"].as_u64() {
            b = b.default_shard(d as u32);
        }
        for (k, v) in projection["residency"].as_object().into_iter().flatten() {
            b = b.residency(k.clone(), v.as_u64().unwrap() as u32);
        }
        for (k, v) in projection["forwards"].as_object().into_iter().flatten() {
            b = b.forward(k.parse().unwrap(), v.as_u64().unwrap() as u32);
        }
        if let Some(t) = projection["tenants"].as_str() {
            b = b.tenants(sheaf_core::placement::TenantPlacement::parse(t).unwrap());
        }
        b.build().unwrap()
    }

    fn placement(v: &Value) -> Result<(Placement, Option<String>), RouteError> {
        let text = |name: &str| v.get(name).and_then(Value::as_str).map(str::to_owned);
        let shard = v
            .get("shard")
            .and_then(Value::as_u64)
            .map(|s| ShardId::new(s as u32).unwrap());
        Ok((
            Placement::from_parts(shard, text("residency_key"), text("routing_key"))?,
            text("tenant"),
        ))
    }

    fn code(e: &RouteError) -> &'static str {
        match e {
            RouteError::TwoPins => "two_pins",
            RouteError::UnknownShard(_) => "unknown_shard",
            RouteError::ShardNotWritable(_) => "shard_not_writable",
            RouteError::BlankResidencyKey => "blank_residency_key",
            RouteError::UndeclaredResidencyKey(_) => "undeclared_residency_key",
            RouteError::BlankRoutingKey => "blank_routing_key",
            RouteError::NoWritableShard => "no_writable_shard",
        }
    }

    fn answer(result: Result<Option<ShardId>, &'static str>) -> Value {
        match result {
            Ok(owner) => serde_json::json!({"owner": owner.map(ShardId::get)}),
            Err(e) => serde_json::json!({"error": e}),
        }
    }

    fn expected(v: &Value) -> Value {
        match v.get("error") {
            Some(e) => serde_json::json!({"error": e}),
            None => serde_json::json!({"owner": v["owner"]}),
        }
    }

    #[test]
    fn the_router_answers_every_vector() {
        let vectors: Value =
            serde_json::from_str(include_str!("../../core/testdata/placement_vectors.json")).unwrap();
        let mut tops = std::collections::BTreeMap::new();
        for t in vectors["topologies"].as_array().unwrap() {
            let top = topology(&t["projection"]);
            assert_eq!(top.projection(), t["canonical"].as_str().unwrap());
            assert_eq!(top.digest(), t["digest"].as_str().unwrap());
            tops.insert(t["name"].as_str().unwrap().to_owned(), top);
        }
        let text = |v: &Value, name: &str| v.get(name).and_then(Value::as_str).map(str::to_owned);
        for v in vectors["starts"].as_array().unwrap() {
            let top = &tops[v["topology"].as_str().unwrap()];
            let (name, id) = (text(v, "workflow_name").unwrap(), text(v, "workflow_id").unwrap());
            let got = match placement(&v["placement"]) {
                Err(e) => Err(code(&e)),
                Ok((p, tenant)) => match text(v, "debounce_key") {
                    // As Client::start_workflow refuses it.
                    Some(_) if p != Placement::Auto || tenant.is_some() => Err("debounce_takes_no_placement"),
                    Some(key) => top
                        .place(&format!("debounce:{name}"), &key, &Placement::Auto, None)
                        .map_err(|e| code(&e)),
                    None => top.place(&name, &id, &p, tenant.as_deref()).map_err(|e| code(&e)),
                },
            };
            assert_eq!(answer(got.map(Some)), expected(v), "{v}");
        }
        for v in vectors["tasks"].as_array().unwrap() {
            let top = &tops[v["topology"].as_str().unwrap()];
            let queue = text(v, "queue").unwrap();
            let got = placement(&v["placement"])
                .map_err(|e| code(&e))
                .and_then(|(p, _)| {
                    let affinity = match (
                        text(v, "idempotency_key"),
                        text(v, "rate_limit"),
                        text(v, "rate_key"),
                    ) {
                        (Some(k), _, _) => Some((queue.clone(), k)),
                        (None, Some(l), Some(k)) => Some((format!("rate:{l}"), k)),
                        _ => None,
                    };
                    let placed = match affinity {
                        Some((name, key)) => top.place(&name, &key, &p, None).map(Some),
                        None if p == Placement::Auto => Ok(None),
                        None => top.place(&queue, "", &p, None).map(Some),
                    };
                    placed.map_err(|e| code(&e))
                });
            assert_eq!(answer(got), expected(v), "{v}");
        }
        for v in vectors["mutexes"].as_array().unwrap() {
            let top = &tops[v["topology"].as_str().unwrap()];
            let shard = top.mutex_home(&text(v, "mutex_key").unwrap());
            assert_eq!(Some(u64::from(shard.get())), v["owner"].as_u64(), "{v}");
        }
        for v in vectors["ids"].as_array().unwrap() {
            let top = &tops[v["topology"].as_str().unwrap()];
            let id: ExecutionId = text(v, "id").unwrap().parse().unwrap();
            assert_eq!(Some(u64::from(id.route(top).get())), v["owner"].as_u64(), "{v}");
        }
    }
}
