//! Placement; the rules are on [`Placement`].

use sheaf_core::hrw;

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

/// The bytes a hashed placement scores shards by; `None` for a pin.
fn hashed_key(
    workflow_name: &str,
    workflow_id: &str,
    placement: &Placement,
    tenant: Option<&str>,
) -> Option<Vec<u8>> {
    match placement {
        Placement::RoutingKey(key) => Some(hrw::routing_key(key)),
        Placement::Auto => Some(match tenant.filter(|t| !t.trim().is_empty()) {
            Some(t) => hrw::routing_key(&tenant_routing_key(t, workflow_name)),
            None => hrw::workflow_key(workflow_name, workflow_id),
        }),
        Placement::Shard(_) | Placement::ResidencyKey(_) => None,
    }
}

/// The routing key an ambient tenant implies (the second seed's convention).
pub(crate) fn tenant_routing_key(tenant: &str, workflow_name: &str) -> String {
    format!("tenant__{tenant}__{workflow_name}")
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
        match placement {
            Placement::Shard(id) => {
                if self.get(*id).is_none() {
                    return Err(RouteError::UnknownShard(*id));
                }
                self.writable_or_refuse(*id)
            }
            Placement::ResidencyKey(key) => {
                if key.trim().is_empty() {
                    return Err(RouteError::BlankResidencyKey);
                }
                let id = self
                    .residency(key)
                    .ok_or_else(|| RouteError::UndeclaredResidencyKey(key.clone()))?;
                self.writable_or_refuse(id)
            }
            Placement::RoutingKey(key) if key.trim().is_empty() => Err(RouteError::BlankRoutingKey),
            Placement::RoutingKey(_) | Placement::Auto => {
                let key = hashed_key(workflow_name, workflow_id, placement, tenant)
                    .ok_or(RouteError::BlankRoutingKey)?;
                self.hash(&key)
            }
        }
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
        let key = hashed_key(workflow_name, workflow_id, placement, tenant)?;
        let winner = hrw::pick(hrw::key_hash(&key), self.shards().map(|s| s.id.get()))?;
        let winner = ShardId::new(u32::from(winner)).ok()?;
        let now = self.hash(&key).ok()?;
        (winner != now && !self.is_writable(winner) && self.is_readable(winner)).then_some(winner)
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

    fn writable_or_refuse(&self, id: ShardId) -> Result<ShardId, RouteError> {
        if self.is_writable(id) {
            Ok(id)
        } else {
            Err(RouteError::ShardNotWritable(id))
        }
    }

    /// HRW over every shard; a winner that is not placeable re-hashes among
    /// the placeable ones, so adding a read-only shard moves nothing. Starts
    /// and hashed mutex keys are placed by it.
    pub(crate) fn hash(&self, key: &[u8]) -> Result<ShardId, RouteError> {
        let h = hrw::key_hash(key);
        let winner = hrw::pick(h, self.shards().map(|s| s.id.get())).ok_or(RouteError::NoWritableShard)?;
        let winner = ShardId::new(winner as u32).map_err(|_| RouteError::NoWritableShard)?;
        if self.is_writable(winner) && !self.is_reserved(winner) {
            return Ok(winner);
        }
        let fallback = hrw::pick(h, self.placeable().map(|s| s.get())).ok_or(RouteError::NoWritableShard)?;
        ShardId::new(fallback as u32).map_err(|_| RouteError::NoWritableShard)
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
                &Placement::RoutingKey(tenant_routing_key("acme", "wf")),
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
