//! Shard readiness; see [`Readiness`].

use std::collections::BTreeMap;

use serde::Serialize;

use crate::client::{Admin, ClientError, Owned, first_column};
use crate::status::{ShardHealth, TopologyStatus};
use crate::topology::{ShardId, Topology};

/// Why a shard is not ready (its code is the snake_case name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum HealthReason {
    /// No connection, or the probe did not answer in time.
    Unreachable,
    /// Not initialized, or initialized as another shard id.
    IdentityMismatch,
    /// A schema this driver does not work with, or no sheaf at all.
    SchemaIncompatible,
    /// Its schema is not the fleet's, or its library is newer than its
    /// schema (`ALTER EXTENSION sheaf UPDATE` has not run).
    SchemaBehindFleet,
    /// No worker has a live registration on it: work there would strand.
    NoLiveWorker,
    /// It has ready tasks on queues no live worker serves.
    StrandedWork,
    /// It published a topology digest this client's is not (the client's
    /// shards, roles, residency map or forwards differ from the fleet's).
    TopologyDigestMismatch,
    /// Its workflow policies, queue options or caps differ from what most
    /// shards hold (`sheaf config diff`).
    ConfigDrift,
    /// It has live runs its published topology places on another shard
    /// (`Admin::misplaced_runs`): reported, but it does not by itself
    /// hold the shard back (rebalancing moves them, and new work is placed
    /// right).
    MisplacedRuns,
}

impl HealthReason {
    /// The machine-readable code.
    pub fn code(self) -> &'static str {
        match self {
            HealthReason::Unreachable => "unreachable",
            HealthReason::IdentityMismatch => "identity_mismatch",
            HealthReason::SchemaIncompatible => "schema_incompatible",
            HealthReason::SchemaBehindFleet => "schema_behind_fleet",
            HealthReason::NoLiveWorker => "no_live_worker",
            HealthReason::StrandedWork => "stranded_work",
            HealthReason::TopologyDigestMismatch => "topology_digest_mismatch",
            HealthReason::ConfigDrift => "config_drift",
            HealthReason::MisplacedRuns => "misplaced_runs",
        }
    }

    /// Whether it makes the shard not ready (every reason but
    /// [`HealthReason::MisplacedRuns`], which is only reported).
    pub fn holds_back(self) -> bool {
        !matches!(self, HealthReason::MisplacedRuns)
    }

    /// Whether a process serving the fleet (a dashboard, an API, a metrics
    /// server) cannot use the shard at all: it does not answer, is another
    /// shard, has a schema this driver does not work with, or works under
    /// another topology. The rest (stranded work, no live worker, drift)
    /// are the shard's trouble, for alerts, not the server's.
    pub fn stops_serving(self) -> bool {
        matches!(
            self,
            HealthReason::Unreachable
                | HealthReason::IdentityMismatch
                | HealthReason::SchemaIncompatible
                | HealthReason::TopologyDigestMismatch
        )
    }
}

/// One shard's verdict.
///
/// Shard readiness: the guide's pre-flip checklist as one verdict per shard
/// (`ready`, or `degraded` with machine-readable reason codes), read from a
/// [`TopologyStatus`] probe. Before a new shard is made writable, it must
/// read `ready`: reachable, the id it was given, on the fleet's schema, a
/// live worker serving it, nothing stranded, and this client's topology
/// digest accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Readiness {
    /// The shard.
    pub shard: ShardId,
    /// `true` when no reason holds it back ([`HealthReason::holds_back`]).
    pub ready: bool,
    /// Every reason it is not ready, at once, and what is only reported.
    pub reason_codes: Vec<HealthReason>,
    /// What the probe said about each, for people.
    pub details: Vec<String>,
}

/// The verdict of one probed shard, against the fleet's schema, this
/// client's topology digest and what drifts in its configuration.
pub(crate) fn readiness(shard: &ShardHealth, client_digest: &str, drift: Option<&Vec<String>>) -> Readiness {
    let p = &shard.probe;
    let mut reasons = Vec::new();
    let mut details = Vec::new();
    let mut because = |r: HealthReason, why: String| {
        reasons.push(r);
        details.push(why);
    };
    if !p.reachable {
        because(
            HealthReason::Unreachable,
            p.problem.clone().unwrap_or_else(|| "not reachable".into()),
        );
    } else if !p.schema_compatible {
        because(
            HealthReason::SchemaIncompatible,
            p.problem.clone().unwrap_or_else(|| "incompatible schema".into()),
        );
    } else {
        if p.reported_shard_id != Some(i32::from(p.shard.get())) {
            because(
                HealthReason::IdentityMismatch,
                p.problem.clone().unwrap_or_else(|| "not this shard id".into()),
            );
        }
        if !shard.schema_parity {
            because(
                HealthReason::SchemaBehindFleet,
                format!(
                    "schema {} with library {}: not the fleet's, or not updated",
                    p.schema_version.as_deref().unwrap_or("-"),
                    p.library_version.as_deref().unwrap_or("-")
                ),
            );
        }
        if p.live_workers.is_empty() {
            because(
                HealthReason::NoLiveWorker,
                "no live worker is registered on it".into(),
            );
        }
        if !p.stranded.is_empty() {
            because(
                HealthReason::StrandedWork,
                format!(
                    "{} ready task(s) on {} queue(s) no live worker serves",
                    shard.stranded_ready(),
                    p.stranded.len()
                ),
            );
        }
        if !p.accepted_digests.is_empty() && !p.accepted_digests.iter().any(|d| d == client_digest) {
            because(
                HealthReason::TopologyDigestMismatch,
                format!(
                    "it accepts {}, this client is {client_digest}",
                    p.accepted_digests.join(" or ")
                ),
            );
        }
        if let Some(d) = drift.filter(|d| !d.is_empty()) {
            because(
                HealthReason::ConfigDrift,
                format!("against most shards: {}", d.join("; ")),
            );
        }
        if let Some(n) = p.misplaced_runs.filter(|n| *n > 0) {
            because(HealthReason::MisplacedRuns, misplaced(n));
        }
    }
    Readiness {
        shard: p.shard,
        ready: reasons.iter().all(|r| !r.holds_back()),
        reason_codes: reasons,
        details,
    }
}

/// What `n` misplaced runs read as (the probe counts up to a bound).
fn misplaced(n: i64) -> String {
    let at_least = if n >= i64::from(crate::status::MISPLACED_COUNTED) {
        "at least "
    } else {
        ""
    };
    format!(
        "{at_least}{n} live run(s) the published topology places on another shard \
         (reported only: sheaf.misplaced_runs lists them)"
    )
}

/// Every shard's verdict (or only `candidate`'s); `drift` as
/// [`crate::config_drift`] gives it.
pub(crate) fn fleet_readiness(
    status: &TopologyStatus,
    client_digest: &str,
    drift: &BTreeMap<ShardId, Vec<String>>,
    candidate: Option<ShardId>,
) -> Vec<Readiness> {
    status
        .shards
        .iter()
        .filter(|s| candidate.is_none_or(|c| c == s.probe.shard))
        .map(|s| readiness(s, client_digest, drift.get(&s.probe.shard)))
        .collect()
}

/// The whole fleet's readiness, as a served process's `/ready` probe
/// answers it: every shard's verdict, and whether the process can serve
/// every shard ([`HealthReason::stops_serving`]). A shard that is only not
/// ready (stranded work, no live worker, drift) keeps the process ready:
/// taking a dashboard or a metrics server out of service would hide the
/// very trouble it reports (`sheaf_shard_ready` and the alert rules carry
/// it). Safe to serve: it names shards by id and never carries their
/// connection strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct FleetReadiness {
    /// Every shard can be served.
    pub ready: bool,
    /// Each shard's verdict.
    pub shards: Vec<Readiness>,
}

impl FleetReadiness {
    /// The fleet's verdict from its shards'.
    fn of(shards: Vec<Readiness>) -> FleetReadiness {
        let mut verdict = FleetReadiness { ready: false, shards };
        verdict.ready = !verdict.shards.is_empty() && verdict.serving() == verdict.shards.len();
        verdict
    }

    /// How many shards can be served.
    pub fn serving(&self) -> usize {
        self.shards
            .iter()
            .filter(|r| !r.reason_codes.iter().any(|c| c.stops_serving()))
            .count()
    }

    /// The HTTP status a `/ready` endpoint answers with: 200 when ready,
    /// 503 when not.
    pub fn http_status(&self) -> u16 {
        if self.ready { 200 } else { 503 }
    }
}

/// The oldest open snapshot on the server: a session's transaction holding
/// one (autovacuum's own aside), or a prepared transaction. Other roles'
/// sessions show only to a login with `pg_read_all_stats` (or `pg_monitor`).
const OLDEST_SNAPSHOT: &str = "SELECT coalesce(extract(epoch FROM now() - least(\
       (SELECT min(xact_start) FROM pg_catalog.pg_stat_activity \
         WHERE backend_xmin IS NOT NULL AND pid <> pg_catalog.pg_backend_pid() \
           AND backend_type <> 'autovacuum worker'), \
       (SELECT min(prepared) FROM pg_catalog.pg_prepared_xacts))), 0)::float8";

impl Admin<'_> {
    /// Probes the fleet and gives each shard's readiness (only
    /// `candidate`'s when named), each probe bounded by `timeout`.
    pub async fn shard_health(
        self,
        candidate: Option<ShardId>,
        timeout: std::time::Duration,
    ) -> Vec<Readiness> {
        let (status, configs) = tokio::join!(self.topology_status(timeout), self.fleet_config());
        let drift = crate::client::config_drift(&configs);
        fleet_readiness(&status, &self.client.topology().digest(), &drift, candidate)
    }

    /// [`Admin::topology_status`] and every shard's readiness from it, for
    /// a page or a report that shows both.
    pub async fn fleet_health(self, timeout: std::time::Duration) -> (TopologyStatus, Vec<Readiness>) {
        let (status, configs) = tokio::join!(self.topology_status(timeout), self.fleet_config());
        let drift = crate::client::config_drift(&configs);
        let verdicts = fleet_readiness(&status, &self.client.topology().digest(), &drift, None);
        (status, verdicts)
    }

    /// Every shard's readiness ([`Admin::shard_health`]) as one verdict, for
    /// a `/ready` endpoint (the metrics server's, the dashboard's): sets
    /// `sheaf_shard_ready{shard}`, and takes any shard's connection string
    /// out of what the probes said, so the answer may be served.
    pub async fn fleet_readiness(self, timeout: std::time::Duration) -> FleetReadiness {
        let mut shards = self.shard_health(None, timeout).await;
        for r in &mut shards {
            self.client.metrics().ready(r.shard, r.ready);
            for detail in &mut r.details {
                *detail = redact(self.client.topology(), detail);
            }
        }
        FleetReadiness::of(shards)
    }

    /// How long the oldest snapshot open on `shard`'s server has been held,
    /// which vacuum cannot clean behind (zero when none is). Counts other
    /// roles' sessions only with `pg_read_all_stats`.
    pub async fn oldest_snapshot(self, shard: ShardId) -> Result<std::time::Duration, ClientError> {
        let (call, rows) = self
            .client
            .on_shard(shard, Owned::Shard, OLDEST_SNAPSHOT, &[])
            .await?;
        let secs: f64 = first_column(&call, &rows)?;
        Ok(std::time::Duration::from_secs_f64(secs.max(0.0)))
    }
}

/// `text` without any shard's connection string (an error may quote one).
fn redact(topology: &Topology, text: &str) -> String {
    topology.shards().fold(text.to_owned(), |text, s| {
        text.replace(&s.url, &format!("<shard {} connection string>", s.id))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::BreakerState;
    use crate::status::{LiveWorker, ShardStatus, StrandedQueue};

    fn shard(n: u32) -> ShardHealth {
        ShardHealth {
            probe: ShardStatus {
                shard: ShardId::new(n).unwrap(),
                reachable: true,
                reported_shard_id: Some(n as i32),
                library_version: Some("0.2.0".into()),
                schema_version: Some("0.2.0".into()),
                schema_compatible: true,
                server_version: None,
                live_workers: vec![LiveWorker {
                    name: "w".into(),
                    queues: vec!["q".into()],
                }],
                stranded: Vec::new(),
                relay: None,
                accepted_digests: vec!["sha256:me".into()],
                misplaced_runs: Some(0),
                problem: None,
            },
            breaker: BreakerState::Closed,
            readable: true,
            writable: false,
            reserved: false,
            default: false,
            schema_parity: true,
        }
    }

    #[test]
    fn a_served_process_is_ready_unless_a_shard_cannot_be_served() {
        let verdict = FleetReadiness::of;
        let mut stranded = shard(1);
        stranded.probe.live_workers.clear();
        let fleet = vec![
            readiness(&shard(0), "sha256:me", None),
            readiness(&stranded, "sha256:me", None),
        ];
        assert!(!fleet[1].ready, "the shard itself is not ready");
        let v = verdict(fleet.clone());
        assert_eq!((v.ready, v.serving(), v.http_status()), (true, 2, 200));
        let mut down = shard(2);
        down.probe.reachable = false;
        let mut with_down = fleet;
        with_down.push(readiness(&down, "sha256:me", None));
        let v = verdict(with_down);
        assert_eq!((v.ready, v.serving(), v.http_status()), (false, 2, 503));
    }

    #[test]
    fn a_healthy_shard_is_ready_and_each_gap_has_its_code() {
        assert!(readiness(&shard(1), "sha256:me", None).ready);
        let mut s = shard(1);
        s.probe.live_workers.clear();
        s.probe.stranded.push(StrandedQueue {
            queue: "q".into(),
            ready: 3,
        });
        s.schema_parity = false;
        s.probe.reported_shard_id = Some(2);
        let drift = vec!["cap \"t\" differs".to_owned()];
        let r = readiness(&s, "sha256:other", Some(&drift));
        assert!(!r.ready);
        let codes: Vec<&str> = r.reason_codes.iter().map(|c| c.code()).collect();
        assert_eq!(
            codes,
            [
                "identity_mismatch",
                "schema_behind_fleet",
                "no_live_worker",
                "stranded_work",
                "topology_digest_mismatch",
                "config_drift"
            ]
        );
        assert_eq!(r.details.len(), codes.len());
        let mut down = shard(1);
        down.probe.reachable = false;
        assert_eq!(
            readiness(&down, "sha256:me", None).reason_codes,
            [HealthReason::Unreachable]
        );
        let mut unpublished = shard(1);
        unpublished.probe.accepted_digests.clear();
        assert!(
            readiness(&unpublished, "sha256:any", None).ready,
            "nothing published: no mismatch"
        );
        let status = TopologyStatus {
            shards: vec![shard(0), shard(1)],
            schema_version: Some("0.2.0".into()),
        };
        let only = fleet_readiness(
            &status,
            "sha256:me",
            &BTreeMap::new(),
            Some(ShardId::new(1).unwrap()),
        );
        assert_eq!((only.len(), only[0].shard.get()), (1, 1));
    }

    #[test]
    fn served_verdicts_carry_no_connection_string() {
        let topology = Topology::parse("0=postgres://u:secret@h/a,1=postgres://u:secret@h/b").unwrap();
        let said = "cannot reach postgres://u:secret@h/b: refused";
        assert_eq!(
            redact(&topology, said),
            "cannot reach <shard 1 connection string>: refused"
        );
        let fleet = FleetReadiness {
            ready: false,
            shards: Vec::new(),
        };
        assert_eq!(fleet.http_status(), 503);
        assert_eq!(FleetReadiness { ready: true, ..fleet }.http_status(), 200);
    }

    #[test]
    fn misplaced_runs_are_reported_but_hold_no_shard_back() {
        let mut s = shard(1);
        s.probe.misplaced_runs = Some(3);
        let r = readiness(&s, "sha256:me", None);
        assert!(r.ready);
        assert_eq!(r.reason_codes, [HealthReason::MisplacedRuns]);
        assert!(r.details[0].starts_with("3 live run(s)"), "{:?}", r.details);
        s.probe.misplaced_runs = Some(i64::from(crate::status::MISPLACED_COUNTED));
        assert!(readiness(&s, "sha256:me", None).details[0].starts_with("at least"));
        s.probe.live_workers.clear();
        assert!(!readiness(&s, "sha256:me", None).ready, "other reasons still do");
    }
}
