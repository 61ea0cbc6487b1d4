//! Probing shards: is each one reachable, and is it the shard we think it is?

use std::time::Duration;

use serde::Serialize;
use tokio_postgres::error::SqlState;

use crate::breaker::BreakerState;
use crate::pool::ShardPools;
use crate::topology::{Shard, ShardId, Topology};

/// The whole fleet as this client sees it, as `topology_status()` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct TopologyStatus {
    /// Every shard of the topology, by id.
    pub shards: Vec<ShardHealth>,
    /// The schema version most reachable shards run; a shard on another
    /// version has `schema_parity = false`.
    pub schema_version: Option<String>,
}

impl TopologyStatus {
    /// Every shard healthy, on one schema, and no stranded work.
    pub fn healthy(&self) -> bool {
        self.shards
            .iter()
            .all(|s| s.probe.healthy() && s.schema_parity && s.probe.stranded.is_empty())
    }
}

/// One shard: the probe, this client's breaker, and its roles.
#[derive(Debug, Clone, Serialize)]
pub struct ShardHealth {
    /// What the probe found.
    #[serde(flatten)]
    pub probe: ShardStatus,
    /// This client's breaker for the shard.
    pub breaker: BreakerState,
    /// In the topology's readable set (workers may claim there).
    pub readable: bool,
    /// In the writable set (new work may go there).
    pub writable: bool,
    /// Reserved: only pinned work goes there.
    pub reserved: bool,
    /// The shard unencoded ids route to.
    pub default: bool,
    /// Its installed schema is the fleet's and matches its loaded library
    /// (`ALTER EXTENSION sheaf UPDATE` has run after an upgrade).
    pub schema_parity: bool,
}

impl ShardHealth {
    /// The roles in four letters, for tables: `r` readable, `w` writable,
    /// `R` reserved, `d` default, `-` where a role is absent.
    pub fn roles(&self) -> String {
        [
            (self.readable, 'r'),
            (self.writable, 'w'),
            (self.reserved, 'R'),
            (self.default, 'd'),
        ]
        .iter()
        .map(|&(on, letter)| if on { letter } else { '-' })
        .collect()
    }

    /// Ready tasks on this shard that no live worker serves.
    pub fn stranded_ready(&self) -> i64 {
        self.probe.stranded.iter().map(|q| q.ready).sum()
    }
}

/// Probes every shard at once, each bounded by `timeout`.
pub(crate) async fn topology_status(
    topology: &Topology,
    pools: &ShardPools,
    timeout: Duration,
) -> TopologyStatus {
    let probes = topology.shards().map(|s| probe_shard(s, timeout));
    let probes = futures::future::join_all(probes).await;
    let schema_version = majority(probes.iter().filter_map(|p| p.schema_version.clone()));
    let shards = probes
        .into_iter()
        .map(|probe| {
            let id = probe.shard;
            let schema_parity = probe.reachable
                && probe.schema_version.is_some()
                && probe.schema_version == schema_version
                && probe.schema_version == probe.library_version;
            ShardHealth {
                breaker: pools.breaker_state(id).unwrap_or(BreakerState::Closed),
                readable: topology.is_readable(id),
                writable: topology.is_writable(id),
                reserved: topology.is_reserved(id),
                default: topology.default_shard() == id,
                schema_parity,
                probe,
            }
        })
        .collect();
    TopologyStatus {
        shards,
        schema_version,
    }
}

/// The most common value; ties go to the highest, so the answer is stable.
fn majority(values: impl Iterator<Item = String>) -> Option<String> {
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for v in values {
        *counts.entry(v).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)))
        .map(|(v, _)| v)
}

/// What one probe of one shard found.
#[derive(Debug, Clone, Serialize)]
pub struct ShardStatus {
    /// The shard probed.
    pub shard: ShardId,
    /// Whether a connection was made and the probe's queries answered.
    pub reachable: bool,
    /// The id the database reports through `sheaf.shard_id()`.
    pub reported_shard_id: Option<i32>,
    /// The sheaf library serving the database (`sheaf.version()`).
    pub library_version: Option<String>,
    /// The installed schema version (`pg_extension.extversion`).
    pub schema_version: Option<String>,
    /// The schema is one this driver works with ([`crate::COMPATIBLE_SCHEMAS`]).
    pub schema_compatible: bool,
    /// PostgreSQL's `server_version`.
    pub server_version: Option<String>,
    /// The workers with a heartbeat in the last 60 s (`sheaf.live_workers()`).
    pub live_workers: Vec<LiveWorker>,
    /// Queues with ready tasks and no live worker (`sheaf.stranded_work()`).
    pub stranded: Vec<StrandedQueue>,
    /// The relay's backlog on this shard (`None` on a schema without one).
    pub relay: Option<RelayBacklogSummary>,
    /// The topology digests the shard accepts (`sheaf.published_topology()`:
    /// the published one, then the previous one); empty if none was published.
    pub accepted_digests: Vec<String>,
    /// Live runs the shard's published topology places on another shard
    /// (`sheaf.misplaced_runs`), counted up to 1,000;
    /// `None` on a schema before 0.3.0.
    pub misplaced_runs: Option<i64>,
    /// Why the probe failed or what is wrong with the shard, if anything.
    pub problem: Option<String>,
}

/// The most misplaced runs a status probe counts on one shard.
pub const MISPLACED_COUNTED: i32 = 1_000;

/// What the relay has yet to carry from one shard (`sheaf.relay_backlog()`
/// and `sheaf.outbox_backlog()`, added up).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RelayBacklogSummary {
    /// Lifecycle rows: children elsewhere not yet settled.
    pub children: i64,
    /// Of them, those whose last edge failed.
    pub children_failing: i64,
    /// The oldest one's age, in seconds.
    pub oldest_child_secs: Option<f64>,
    /// Outbox rows not yet delivered.
    pub outbox: i64,
    /// Of them, those a shard could not be inspected for, last time.
    pub outbox_indeterminate: i64,
    /// How long the longest-indeterminate one has been so, in seconds.
    pub oldest_indeterminate_secs: Option<f64>,
}

/// A live worker and the queues it serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LiveWorker {
    /// Its registered name.
    pub name: String,
    /// The queues it serves.
    pub queues: Vec<String>,
}

/// Claimable work no live worker serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StrandedQueue {
    /// The queue.
    pub queue: String,
    /// Its claimable tasks.
    pub ready: i64,
}

impl ShardStatus {
    /// Reachable, initialized, and holding the id the topology gives it.
    pub fn healthy(&self) -> bool {
        self.reachable && self.problem.is_none()
    }
}

/// Connects to one shard with a bounded timeout and reads its identity.
pub async fn probe_shard(shard: &Shard, timeout: Duration) -> ShardStatus {
    let mut status = ShardStatus {
        shard: shard.id,
        reachable: false,
        reported_shard_id: None,
        library_version: None,
        schema_version: None,
        schema_compatible: false,
        server_version: None,
        live_workers: Vec::new(),
        stranded: Vec::new(),
        relay: None,
        accepted_digests: Vec::new(),
        misplaced_runs: None,
        problem: None,
    };
    match tokio::time::timeout(timeout, read_identity(&shard.url, timeout)).await {
        Err(_) => status.problem = Some(format!("no answer within {timeout:?}")),
        Ok(Err(e)) => status.problem = Some(e),
        Ok(Ok(identity)) => {
            status.reachable = true;
            status.server_version = Some(identity.server_version);
            status.schema_version = identity.schema_version;
            status.library_version = identity.library_version;
            status.reported_shard_id = identity.shard_id;
            status.live_workers = identity.live_workers;
            status.stranded = identity.stranded;
            status.relay = identity.relay;
            status.accepted_digests = identity.accepted_digests;
            status.misplaced_runs = identity.misplaced_runs;
            status.schema_compatible = status
                .schema_version
                .as_deref()
                .is_some_and(crate::schema::is_compatible);
            status.problem = match (status.schema_version.as_ref(), identity.shard_id) {
                _ if !status.schema_compatible => {
                    Some(crate::schema::incompatibility(status.schema_version.as_deref()))
                }
                (Some(_), None) => Some("the shard is not initialized (sheaf.init_shard)".into()),
                (Some(_), Some(id)) if id != shard.id.get() as i32 => Some(format!(
                    "the database is shard {id}, but the topology calls it shard {}",
                    shard.id
                )),
                _ => None,
            };
        }
    }
    status
}

struct Identity {
    server_version: String,
    schema_version: Option<String>,
    library_version: Option<String>,
    shard_id: Option<i32>,
    live_workers: Vec<LiveWorker>,
    stranded: Vec<StrandedQueue>,
    relay: Option<RelayBacklogSummary>,
    accepted_digests: Vec<String>,
    misplaced_runs: Option<i64>,
}

/// The relay's backlog, added up; nothing before schema 0.2.0.
const RELAY_BACKLOG: &str = "SELECT c.rows, c.failing, c.oldest, o.rows, o.indeterminate, o.since \
     FROM (SELECT coalesce(sum(rows), 0)::bigint AS rows, coalesce(sum(failing), 0)::bigint AS failing, \
                  extract(epoch FROM now() - min(oldest))::float8 AS oldest FROM sheaf.relay_backlog()) c, \
          (SELECT coalesce(sum(rows), 0)::bigint AS rows, coalesce(sum(indeterminate), 0)::bigint AS indeterminate, \
                  extract(epoch FROM now() - min(indeterminate_since))::float8 AS since FROM sheaf.outbox_backlog()) o";

async fn read_relay_backlog(client: &tokio_postgres::Client) -> Result<RelayBacklogSummary, String> {
    let r = client
        .query_one(RELAY_BACKLOG, &[])
        .await
        .map_err(|e| format!("the relay's backlog failed: {e}"))?;
    let read = || -> Result<RelayBacklogSummary, tokio_postgres::Error> {
        Ok(RelayBacklogSummary {
            children: r.try_get(0)?,
            children_failing: r.try_get(1)?,
            oldest_child_secs: r.try_get(2)?,
            outbox: r.try_get(3)?,
            outbox_indeterminate: r.try_get(4)?,
            oldest_indeterminate_secs: r.try_get(5)?,
        })
    };
    read().map_err(|e| format!("unexpected reply: {e}"))
}

async fn read_accepted_digests(client: &tokio_postgres::Client) -> Result<Vec<String>, String> {
    let rows = client
        .query("SELECT digest, previous FROM sheaf.published_topology()", &[])
        .await
        .map_err(|e| format!("sheaf.published_topology() failed: {e}"))?;
    let mut accepted = Vec::new();
    for r in &rows {
        let (digest, previous): (String, Option<String>) = (
            r.try_get(0).map_err(|e| format!("unexpected reply: {e}"))?,
            r.try_get(1).map_err(|e| format!("unexpected reply: {e}"))?,
        );
        accepted.push(digest);
        accepted.extend(previous);
    }
    Ok(accepted)
}

/// What an initialized shard reports beyond its identity: live workers,
/// stranded work, and (from schema 0.2.0) the relay's backlog and the
/// topology digests it accepts.
async fn read_work(client: &tokio_postgres::Client, identity: &mut Identity) -> Result<(), String> {
    let unreadable = |e: tokio_postgres::Error| format!("unexpected reply: {e}");
    let workers = client
        .query("SELECT worker, queues FROM sheaf.live_workers()", &[])
        .await
        .map_err(|e| format!("sheaf.live_workers() failed: {e}"))?;
    identity.live_workers = workers
        .iter()
        .map(|r| {
            Ok(LiveWorker {
                name: r.try_get(0)?,
                queues: r.try_get(1)?,
            })
        })
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(unreadable)?;
    let stranded = client
        .query("SELECT queue, ready FROM sheaf.stranded_work()", &[])
        .await
        .map_err(|e| format!("sheaf.stranded_work() failed: {e}"))?;
    identity.stranded = stranded
        .iter()
        .map(|r| {
            Ok(StrandedQueue {
                queue: r.try_get(0)?,
                ready: r.try_get(1)?,
            })
        })
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(unreadable)?;
    if identity.schema_version.as_deref() != Some("0.1.0") {
        identity.relay = Some(read_relay_backlog(client).await?);
        identity.accepted_digests = read_accepted_digests(client).await?;
    }
    if identity
        .schema_version
        .as_deref()
        .is_some_and(crate::schema::takes_placement)
    {
        let row = client
            .query_one(
                "SELECT count(*) FROM sheaf.misplaced_runs($1)",
                &[&MISPLACED_COUNTED],
            )
            .await
            .map_err(|e| format!("sheaf.misplaced_runs() failed: {e}"))?;
        identity.misplaced_runs = Some(row.try_get(0).map_err(unreadable)?);
    }
    Ok(())
}

async fn read_identity(url: &str, timeout: Duration) -> Result<Identity, String> {
    let (mut config, tls) = crate::tls::shard_config(url)?;
    config.connect_timeout(timeout);
    let (client, connection) = config
        .connect(tls)
        .await
        .map_err(|e| format!("cannot connect: {}", with_causes(&e)))?;
    let driver = tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT current_setting('server_version'), \
                    (SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'sheaf')",
            &[],
        )
        .await
        .map_err(|e| format!("identity query failed: {e}"))?;
    let unreadable = |e: tokio_postgres::Error| format!("unexpected reply: {e}");
    let mut identity = Identity {
        server_version: row.try_get(0).map_err(unreadable)?,
        schema_version: row.try_get(1).map_err(unreadable)?,
        library_version: None,
        shard_id: None,
        live_workers: Vec::new(),
        stranded: Vec::new(),
        relay: None,
        accepted_digests: Vec::new(),
        misplaced_runs: None,
    };
    // sheaf's functions are called only on a schema this driver knows has them.
    if identity
        .schema_version
        .as_deref()
        .is_some_and(crate::schema::is_compatible)
    {
        let row = client
            .query_one("SELECT sheaf.version()", &[])
            .await
            .map_err(|e| format!("sheaf.version() failed: {e}"))?;
        identity.library_version = Some(row.try_get(0).map_err(unreadable)?);
        identity.shard_id = match client.query_one("SELECT sheaf.shard_id()", &[]).await {
            Ok(row) => Some(row.try_get(0).map_err(unreadable)?),
            // 55000: the shard has not been initialized yet.
            Err(e) if e.code() == Some(&SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE) => None,
            Err(e) => return Err(format!("sheaf.shard_id() failed: {e}")),
        };
        if identity.shard_id.is_some() {
            read_work(&client, &mut identity).await?;
        }
    }
    drop(client);
    // The connection task ends once the client is dropped.
    let _ = driver.await;
    Ok(identity)
}

/// An error and its chain of causes, each said once: tokio-postgres puts
/// the useful part ("connection refused") in the source, and an error that
/// already shows its source (deadpool's, tokio-postgres' own) is not made
/// to repeat it ("error connecting to server: error connecting to server").
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        let text = err.to_string();
        next = err.source();
        // What this error says of its own: its text less the source's,
        // when it ends with it.
        let own = match next.map(|s| s.to_string()) {
            Some(source) => text
                .strip_suffix(source.as_str())
                .map(|head| head.trim_end_matches([':', ' ']).to_owned())
                .unwrap_or(text),
            None => text,
        };
        // A part already said, whole (an error that shows its source's
        // text), or a repeat of the one before, is not said again.
        let said = parts.join(": ");
        if !own.is_empty() && !said.contains(own.as_str()) {
            parts.push(own);
        }
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error whose text may show its source's, as deadpool's and
    /// tokio-postgres' do.
    #[derive(Debug)]
    struct Chained(&'static str, bool, Option<Box<Chained>>);

    impl std::fmt::Display for Chained {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)?;
            match &self.2 {
                Some(source) if self.1 => write!(f, ": {source}"),
                _ => Ok(()),
            }
        }
    }

    impl std::error::Error for Chained {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.2.as_deref().map(|s| s as _)
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let refused = Chained("Connection refused (os error 111)", false, None);
        let inner = Chained("error connecting to server", true, Some(Box::new(refused)));
        let outer = Chained("error connecting to server", true, Some(Box::new(inner)));
        let pool = Chained(
            "Error occurred while creating a new object",
            true,
            Some(Box::new(outer)),
        );
        assert_eq!(
            with_causes(&pool),
            "Error occurred while creating a new object: error connecting to server: \
             Connection refused (os error 111)"
        );
        // A source its error does not show is still said.
        let quiet = Chained(
            "TLS handshake failed",
            false,
            Some(Box::new(Chained("bad certificate", false, None))),
        );
        assert_eq!(with_causes(&quiet), "TLS handshake failed: bad certificate");
    }

    #[test]
    fn roles_and_stranded_work_summarize_a_shard() {
        let probe = ShardStatus {
            shard: ShardId::new(3).unwrap(),
            reachable: true,
            reported_shard_id: Some(3),
            library_version: None,
            schema_version: None,
            schema_compatible: true,
            server_version: None,
            live_workers: Vec::new(),
            relay: None,
            accepted_digests: Vec::new(),
            misplaced_runs: None,
            stranded: vec![
                StrandedQueue {
                    queue: "a".into(),
                    ready: 2,
                },
                StrandedQueue {
                    queue: "b".into(),
                    ready: 5,
                },
            ],
            problem: None,
        };
        let health = ShardHealth {
            probe,
            breaker: BreakerState::Closed,
            readable: true,
            writable: false,
            reserved: true,
            default: false,
            schema_parity: true,
        };
        assert_eq!(health.roles(), "r-R-");
        assert_eq!(health.stranded_ready(), 7);
    }

    #[test]
    fn the_fleet_schema_is_the_most_common_and_ties_are_stable() {
        let v = |xs: &[&str]| majority(xs.iter().map(|s| s.to_string()));
        assert_eq!(v(&["0.1.0", "0.2.0", "0.1.0"]).as_deref(), Some("0.1.0"));
        assert_eq!(v(&["0.1.0", "0.2.0"]).as_deref(), Some("0.2.0"));
        assert_eq!(v(&["0.2.0", "0.1.0"]).as_deref(), Some("0.2.0"));
        assert_eq!(v(&[]), None);
    }
}
