//! The relay; what it does is on [`Relay`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::client::Steps;
use crate::client::{
    ChildStart, Client, ClientError, OutboxKind, OutboxOutcome, OutboxRow, RelayOutcome, RelayRow,
    ReportStatus,
};
use crate::id::ExecutionId;
use crate::listen::{self, Heard};
use crate::metrics::{Loop, RelayEdge};
use crate::topology::ShardId;

/// How a relay runs. `RelayOptions::new()` takes the defaults; each setter
/// says what it sets.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayOptions {
    pub(crate) batch: i32,
    pub(crate) lease: Duration,
    pub(crate) recheck: Duration,
    pub(crate) sweep_every: Duration,
    pub(crate) concurrency: usize,
    pub(crate) listen: bool,
    pub(crate) gauges_every: Duration,
    pub(crate) seals_every: Duration,
}

impl RelayOptions {
    /// The defaults (as [`Default`]).
    pub fn new() -> RelayOptions {
        RelayOptions::default()
    }

    /// Rows one take leases (1..1000).
    pub fn batch(mut self, batch: i32) -> Self {
        self.batch = batch;
        self
    }

    /// How long a taken row is this relay's.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long a running child waits for its next look when no
    /// notification comes (a child's end notifies at once).
    pub fn recheck(mut self, recheck: Duration) -> Self {
        self.recheck = recheck;
        self
    }

    /// The longest sleep between sweeps of a shard.
    pub fn sweep_every(mut self, sweep_every: Duration) -> Self {
        self.sweep_every = sweep_every;
        self
    }

    /// Rows driven at once per shard.
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// Wake on `LISTEN sheaf_relay`.
    pub fn listen(mut self, listen: bool) -> Self {
        self.listen = listen;
        self
    }

    /// How often the backlog gauges (`sheaf_relay_in_flight` and the
    /// others in [`Metrics`](crate::Metrics)) are read from the shard.
    pub fn gauges_every(mut self, gauges_every: Duration) -> Self {
        self.gauges_every = gauges_every;
        self
    }

    /// How often the shard's seals past their retention window are
    /// checked against where their runs live (`confirm_seals`).
    pub fn seals_every(mut self, seals_every: Duration) -> Self {
        self.seals_every = seals_every;
        self
    }
}

impl Default for RelayOptions {
    fn default() -> RelayOptions {
        RelayOptions {
            batch: 100,
            lease: Duration::from_secs(30),
            recheck: Duration::from_secs(10),
            sweep_every: Duration::from_secs(1),
            concurrency: 16,
            listen: true,
            gauges_every: Duration::from_secs(5),
            seals_every: Duration::from_secs(60),
        }
    }
}

/// What one sweep of a shard did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sweep {
    /// Rows taken.
    pub taken: usize,
    /// Rows settled (deleted: nothing left to do).
    pub settled: usize,
    /// Rows whose edge failed (they back off).
    pub failed: usize,
}

/// A running relay. [`Relay::shutdown`] stops it.
///
/// The relay: carries the effects of child workflows across shards, without
/// a two-database transaction. Each lifecycle row (`cross_shard_children`,
/// on the parent's shard) goes through its edges (sql/schema.sql): start
/// the child on its shard, deliver a close, and pull the child's end back
/// into the parent's history. Each edge is one call to one shard, committed
/// before the next shard is called; a row is held by a short lease, so
/// several relays may run at once, and one that dies leaves its rows due
/// again when the lease runs out. Every edge is idempotent and its report is
/// fenced by the lease, so at-least-once delivery ends in exactly-once
/// effects.
///
/// The same loops deliver the shard's outbox (`sheaf.signal_external`,
/// `sheaf.cancel_external`): each row's (name, workflow id) is resolved over
/// every readable shard ([`Client::find_execution`]'s rules), delivered to
/// the live run it names, and reported; a resolution a shard could not
/// answer is reported indeterminate and retried, and only a complete
/// fan-out that found nothing reports the target unknown.
///
/// [`Relay::start`] runs a sweep loop per shard. It wakes on `LISTEN
/// sheaf_relay` (a `start_child` or a close on the parent's shard sends
/// `due`; a child's end on its own shard sends `ended <parent> <child>`,
/// and the row is taken at once by name) and sweeps every
/// [`RelayOptions::sweep_every`] anyway: a lost notification costs one sweep
/// interval, never a child.
///
/// The relay's steps are granted to `sheaf_relay`, not to `sheaf_worker`
/// (docs/reference/roles.md): before it sweeps a shard, a relay asks whether its
/// login there holds that role, and on a shard where it does not it says so
/// once (a warning, and `sheaf_protocol_role{shard}` 0) and leaves the
/// shard alone, rather than failing every sweep.
pub struct Relay {
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

/// What the loops of one relay share: a wake per shard, and the children
/// named by notifications, per parent shard.
pub(crate) struct Shared {
    wake: BTreeMap<ShardId, Notify>,
    named: Mutex<BTreeMap<ShardId, BTreeSet<ExecutionId>>>,
}

impl Shared {
    pub(crate) fn new(shards: &[ShardId]) -> Arc<Shared> {
        Arc::new(Shared {
            wake: shards.iter().map(|s| (*s, Notify::new())).collect(),
            named: Mutex::new(BTreeMap::new()),
        })
    }

    /// A notification heard on `shard`'s `sheaf_relay` channel (or a
    /// reconnect: `None`, sweep now).
    pub(crate) fn heard(&self, shard: ShardId, payload: Option<&str>) {
        let Some(rest) = payload.and_then(|p| p.strip_prefix("ended ")) else {
            if let Some(w) = self.wake.get(&shard) {
                w.notify_one();
            }
            return;
        };
        let mut parts = rest.split(' ');
        let (Some(parent), Some(child)) = (parts.next(), parts.next()) else {
            return;
        };
        let (Ok(_), Ok(child)) = (parent.parse::<ExecutionId>(), child.parse::<ExecutionId>()) else {
            return;
        };
        // The child's lifecycle row is where its parent lives, which the
        // parent's id does not say (it names where the parent was born):
        // every shard looks for it by name, a lookup by key that finds
        // nothing on all but one.
        let mut named = self.named.lock().unwrap_or_else(|e| e.into_inner());
        for (s, w) in &self.wake {
            named.entry(*s).or_default().insert(child);
            w.notify_one();
        }
    }

    fn take_named(&self, shard: ShardId) -> Vec<ExecutionId> {
        let mut named = self.named.lock().unwrap_or_else(|e| e.into_inner());
        named
            .remove(&shard)
            .map(|s| s.into_iter().collect())
            .unwrap_or_default()
    }
}

impl Relay {
    /// Starts a relay for the lifecycle rows of `shards` (each of them must
    /// be in the client's topology). It calls any shard a child is on. A
    /// shard where the client's login lacks `sheaf_relay` is left alone
    /// (logged once; `check_protocol_role` asks beforehand).
    pub fn start(client: Arc<Client>, shards: Vec<ShardId>, options: RelayOptions) -> Relay {
        let stop = CancellationToken::new();
        let shared = Shared::new(&shards);
        let mut tasks = Vec::new();
        for &shard in &shards {
            let (client, options, shared, stop) =
                (client.clone(), options.clone(), shared.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                if protocol_role(&client, shard, "the relay is", &stop).await != Some(true) {
                    return;
                }
                let url = client.topology().get(shard).map(|s| s.url.clone());
                let listening = async {
                    if let (true, Some(url)) = (options.listen, url) {
                        listen::listen(
                            &client,
                            shard,
                            &url,
                            &["sheaf_relay"],
                            &stop,
                            |heard| match heard {
                                Heard::Connected => shared.heard(shard, None),
                                Heard::Notification { payload, .. } => shared.heard(shard, Some(payload)),
                            },
                        )
                        .await;
                    }
                };
                tokio::join!(
                    run_shard(
                        client.clone(),
                        shard,
                        options.clone(),
                        shared.clone(),
                        stop.clone()
                    ),
                    listening
                );
            }));
        }
        Relay { stop, tasks }
    }

    /// Stops every loop and waits for them (a row in hand is left to its
    /// lease, and taken again after it).
    pub async fn shutdown(self) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Whether this client's login on `shard` holds `sheaf_relay`, asked until
/// the shard answers: `Some(true)` if it does; `Some(false)` if not, after
/// a warning that `off` (what will not run there: "the relay is") off on
/// that shard and why; `None` if `stop` came first. Sets
/// `sheaf_protocol_role{shard}` either way.
pub(crate) async fn protocol_role(
    client: &Client,
    shard: ShardId,
    off: &str,
    stop: &CancellationToken,
) -> Option<bool> {
    const FIRST_WAIT: Duration = Duration::from_millis(250);
    const MAX_WAIT: Duration = Duration::from_secs(30);
    let mut wait = FIRST_WAIT;
    loop {
        match client.protocol().check_protocol_role(shard).await {
            Ok(()) => {
                client.metrics().protocol_role(shard, true);
                return Some(true);
            }
            Err(e @ ClientError::MissingRole { .. }) => {
                client.metrics().protocol_role(shard, false);
                tracing::warn!(%shard, "{off} off on shard {shard}: {e}; restart after the grant");
                return Some(false);
            }
            Err(e) => {
                // Said once: the shard's other calls report its trouble too.
                if wait == FIRST_WAIT {
                    tracing::warn!(%shard, error = %e, "cannot ask shard {shard} whether this login holds sheaf_relay yet; {off} waiting for it");
                } else {
                    tracing::debug!(%shard, error = %e, "asking again whether this login holds sheaf_relay");
                }
                tokio::select! {
                    _ = stop.cancelled() => return None,
                    _ = tokio::time::sleep(wait) => {}
                }
                wait = (wait * 2).min(MAX_WAIT);
            }
        }
    }
}

/// The sweep loop of one shard.
pub(crate) async fn run_shard(
    client: Arc<Client>,
    shard: ShardId,
    options: RelayOptions,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let Some(wake) = shared.wake.get(&shard) else {
        return;
    };
    let mut gauges_at = tokio::time::Instant::now();
    let mut seals_at = tokio::time::Instant::now();
    loop {
        let named = shared.take_named(shard);
        if !named.is_empty() {
            log_sweep(shard, sweep(&client, shard, &options, Some(&named)).await);
        }
        // Drain what is due, a batch at a time: lifecycle rows, then the outbox.
        loop {
            if stop.is_cancelled() {
                return;
            }
            match sweep(&client, shard, &options, None).await {
                Ok(s) if s.taken as i32 >= options.batch => continue,
                other => {
                    log_sweep(shard, other);
                    break;
                }
            }
        }
        loop {
            if stop.is_cancelled() {
                return;
            }
            match sweep_outbox(&client, shard, &options).await {
                Ok(s) if s.taken as i32 >= options.batch => continue,
                other => {
                    log_sweep(shard, other);
                    break;
                }
            }
        }
        if gauges_at.elapsed() >= options.gauges_every {
            gauges_at = tokio::time::Instant::now();
            if let Err(e) = refresh_gauges(&client, shard).await {
                tracing::debug!(%shard, error = %e, "reading the relay's backlog failed");
            }
        }
        if seals_at.elapsed() >= options.seals_every {
            seals_at = tokio::time::Instant::now();
            if let Err(e) = client.protocol().confirm_seals(shard, 100).await {
                tracing::debug!(%shard, error = %e, "checking seals failed; retried later");
            }
        }
        client.metrics().tick(Loop::Relay, shard);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = wake.notified() => {}
            _ = tokio::time::sleep(options.sweep_every) => {}
        }
    }
}

fn log_sweep(shard: ShardId, result: Result<Sweep, ClientError>) {
    if let Err(e) = result {
        tracing::debug!(%shard, error = %e, "relay sweep failed; retried on the next one");
    }
}

/// One sweep of `shard`'s lifecycle rows: the due ones, or those `named`.
/// Every row taken is driven through its edges, at most
/// [`RelayOptions::concurrency`] at once.
pub(crate) async fn sweep(
    client: &Client,
    shard: ShardId,
    options: &RelayOptions,
    named: Option<&[ExecutionId]>,
) -> Result<Sweep, ClientError> {
    use futures::StreamExt;
    let rows = client
        .protocol()
        .relay_take(shard, options.batch, options.lease, named)
        .await?;
    let taken = rows.len();
    client.metrics().relay_taken(shard, taken);
    let outcomes: Vec<Drove> = futures::stream::iter(rows)
        .map(|row| drive(client, shard, options, row))
        .buffer_unordered(options.concurrency.max(1))
        .collect()
        .await;
    Ok(Sweep::of(taken, &outcomes))
}

impl Sweep {
    fn of(taken: usize, outcomes: &[Drove]) -> Sweep {
        Sweep {
            taken,
            settled: outcomes.iter().filter(|d| **d == Drove::Settled).count(),
            failed: outcomes.iter().filter(|d| **d == Drove::Failed).count(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drove {
    Settled,
    Released,
    Failed,
    Lost,
}

/// Whether a refusal of a child's start is the child's shard deciding
/// (its gates, its quotas, its checks of the input): the parent gets
/// `ChildFailed`. Anything else (a shard unreachable, a conflict, a
/// migration) is retried.
fn refuses_start(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::QuotaExceeded { .. }
            | ClientError::GateRejected { .. }
            | ClientError::InvalidArgument { .. }
    )
}

/// Drives one row through its edges, in order, until one releases or
/// settles it.
async fn drive(client: &Client, shard: ShardId, options: &RelayOptions, row: RelayRow) -> Drove {
    let report = |outcome: RelayOutcome, edge: RelayEdge| async move {
        let failed = matches!(outcome, RelayOutcome::Failed(_));
        let status = client
            .protocol()
            .relay_report(shard, row.child_id, row.lease_token, &outcome)
            .await;
        client.metrics().relay_attempt(row.target_shard, edge, failed);
        match status {
            Ok(ReportStatus::Held) => None,
            Ok(ReportStatus::Settled) => Some(Drove::Settled),
            Ok(ReportStatus::Released) if failed => Some(Drove::Failed),
            Ok(ReportStatus::Released) => Some(Drove::Released),
            Ok(ReportStatus::Stale) => Some(Drove::Lost),
            Err(e) => {
                tracing::debug!(%shard, child = %row.child_id, error = %e, "relay report failed; the lease will run out");
                Some(Drove::Lost)
            }
        }
    };
    if !row.started {
        let input = row.input.clone().unwrap_or_else(crate::json::Json::null);
        let started = client
            .protocol()
            .relay_start_child(
                row.child_id,
                row.parent_id,
                &row.workflow_name,
                &row.workflow_id,
                &input,
            )
            .await;
        let outcome = match started {
            Ok(ChildStart::Started | ChildStart::Exists) => RelayOutcome::Started,
            Ok(ChildStart::Conflict(existing)) => RelayOutcome::Conflict(existing),
            Err(e) if refuses_start(&e) => RelayOutcome::Refused(e.to_string()),
            Err(e) => RelayOutcome::Failed(e.to_string()),
        };
        if let Some(done) = report(outcome, RelayEdge::Start).await {
            return done;
        }
    }
    if let (Some(how), false) = (row.close_requested, row.close_delivered) {
        let closed = client
            .protocol()
            .relay_close_child(row.child_id, row.parent_id, how, row.close_reason.as_deref())
            .await;
        let outcome = match closed {
            Ok(delivered) => RelayOutcome::Closed(delivered),
            Err(e) => RelayOutcome::Failed(e.to_string()),
        };
        if let Some(done) = report(outcome, RelayEdge::Close).await {
            return done;
        }
    }
    let outcome = match client.get_execution(row.child_id).await {
        Ok(Some(child)) if child.state.is_active() || child.state.is_migrating() => {
            RelayOutcome::Pending(options.recheck)
        }
        Ok(Some(child)) => RelayOutcome::Ended {
            state: child.state,
            result: child.result,
            error: child.error,
        },
        Ok(None) => RelayOutcome::Failed(format!(
            "child {} is not on shard {}: restored to another instant than its parent's shard?",
            row.child_id, row.target_shard
        )),
        Err(e) => RelayOutcome::Failed(e.to_string()),
    };
    let ended = matches!(outcome, RelayOutcome::Ended { .. });
    let drove = report(outcome, RelayEdge::Pull).await.unwrap_or(Drove::Lost);
    // The parent has the child's end now: the child's shard may let
    // retention delete it. A mark lost here keeps the child (never deletes
    // one too early); docs/operating/retention.md.
    if ended
        && drove == Drove::Settled
        && let Err(e) = client.protocol().relay_pulled(row.child_id).await
    {
        tracing::warn!(%shard, child = %row.child_id, error = %e, "could not mark a pulled child for retention");
    }
    drove
}

/// Sets `shard`'s backlog gauges from `relay_backlog()` and `outbox_backlog()`.
pub(crate) async fn refresh_gauges(client: &Client, shard: ShardId) -> Result<(), ClientError> {
    let children = client.admin().relay_backlog(shard).await?;
    let outbox = client.admin().outbox_backlog(shard).await?;
    let targets: Vec<ShardId> = client.topology().shards().map(|s| s.id).collect();
    client
        .metrics()
        .relay_backlog(shard, &targets, &children, &outbox, std::time::SystemTime::now());
    Ok(())
}

/// One sweep of `shard`'s due outbox rows, at most
/// [`RelayOptions::concurrency`] delivered at once.
pub(crate) async fn sweep_outbox(
    client: &Client,
    shard: ShardId,
    options: &RelayOptions,
) -> Result<Sweep, ClientError> {
    use futures::StreamExt;
    let rows = client
        .protocol()
        .outbox_take(shard, options.batch, options.lease)
        .await?;
    let taken = rows.len();
    let outcomes: Vec<Drove> = futures::stream::iter(rows)
        .map(|row| deliver(client, shard, row))
        .buffer_unordered(options.concurrency.max(1))
        .collect()
        .await;
    Ok(Sweep::of(taken, &outcomes))
}

/// Delivers one outbox row and reports what happened.
async fn deliver(client: &Client, shard: ShardId, row: OutboxRow) -> Drove {
    let outcome = outbox_outcome(client, &row).await;
    let kind = row.kind.as_str();
    client.metrics().outbox_delivery(shard, kind, outcome.label());
    let failed = matches!(
        outcome,
        OutboxOutcome::Failed(_) | OutboxOutcome::Indeterminate(_)
    );
    match client
        .protocol()
        .outbox_report(shard, row.outbox_id, row.lease_token, &outcome)
        .await
    {
        Ok(ReportStatus::Settled) => Drove::Settled,
        Ok(ReportStatus::Released | ReportStatus::Held) if failed => Drove::Failed,
        Ok(ReportStatus::Released | ReportStatus::Held) => Drove::Released,
        Ok(ReportStatus::Stale) => Drove::Lost,
        Err(e) => {
            tracing::debug!(%shard, outbox = %row.outbox_id, error = %e, "outbox report failed; the lease will run out");
            Drove::Lost
        }
    }
}

/// Resolves an outbox row's key over every readable shard and delivers it
/// to the live run found. A run that ends between the resolution and the
/// delivery is resolved again.
async fn outbox_outcome(client: &Client, row: &OutboxRow) -> OutboxOutcome {
    const TRIES: usize = 3;
    let kind = row.kind.as_str();
    for _ in 0..TRIES {
        let (best, failed) = match client.resolve_key(&row.workflow_name, &row.workflow_id).await {
            Ok((best, failed)) => (best.map(|(run, _)| run), failed),
            Err(e) => return OutboxOutcome::Failed(e.to_string()),
        };
        for uninspected in failed.keys() {
            client.metrics().outbox_indeterminate(*uninspected, kind);
        }
        match best {
            Some(run) if run.state.is_active() => {
                if !failed.is_empty() {
                    client.metrics().outbox_over_incomplete(kind);
                }
                let id = run.execution_id;
                // Sent where the run was found (its residence), following
                // forwards if it moved since; the report names the shard
                // that took it, never the one its id names.
                let delivered = match &row.kind {
                    // The row's id is the signal id: a redelivery after a
                    // crash is recognised by the run and adds nothing.
                    OutboxKind::Signal { signal, payload } => {
                        let signal_id = row.outbox_id.to_string();
                        client
                            .signal_from(run.shard, id, signal, payload.clone(), Some(&signal_id))
                            .await
                    }
                    OutboxKind::Cancel { reason } => {
                        client.cancel_from(run.shard, id, reason.as_deref()).await
                    }
                };
                match (delivered, &row.kind) {
                    (Ok((at, true)), OutboxKind::Signal { .. }) => return OutboxOutcome::Delivered(id, at),
                    (Ok((at, true)), OutboxKind::Cancel { .. }) => return OutboxOutcome::Cancelled(id, at),
                    (Ok((_, false)), _) => continue,
                    (Err(e), _) => return OutboxOutcome::Failed(e.to_string()),
                }
            }
            // Between a move's cutover and its activation the run's only
            // copies are a seal and a staged copy: it lives, and is
            // delivered once activated (the row backs off and comes again).
            Some(run) if run.state.is_migrating() => {
                return OutboxOutcome::Failed(format!(
                    "the run of {:?} id {:?} is moving between shards",
                    row.workflow_name, row.workflow_id
                ));
            }
            _ if !failed.is_empty() => {
                let why: Vec<String> = failed.iter().map(|(s, e)| format!("shard {s}: {e}")).collect();
                return OutboxOutcome::Indeterminate(format!(
                    "could not inspect every shard for {:?} id {:?}: {}",
                    row.workflow_name,
                    row.workflow_id,
                    why.join("; ")
                ));
            }
            // A confirming cancel's later fan-out, complete: no live run.
            _ if row.confirming.is_some() => return OutboxOutcome::Confirmed,
            // A signal whose run ended: it may have got it before it ended
            // (a relay that died after delivering and before reporting),
            // which the run's signal ids say.
            Some(run) => {
                if let OutboxKind::Signal { signal, payload } = &row.kind {
                    let signal_id = row.outbox_id.to_string();
                    match client
                        .signal_from(
                            run.shard,
                            run.execution_id,
                            signal,
                            payload.clone(),
                            Some(&signal_id),
                        )
                        .await
                    {
                        Ok((at, true)) => return OutboxOutcome::Delivered(run.execution_id, at),
                        Ok((_, false)) => {}
                        Err(e) => return OutboxOutcome::Failed(e.to_string()),
                    }
                }
                return OutboxOutcome::Ended(run.execution_id, run.shard, run.state);
            }
            None => return OutboxOutcome::Unknown,
        }
    }
    OutboxOutcome::Failed(format!(
        "the run of {:?} id {:?} had ended each time it was found",
        row.workflow_name, row.workflow_id
    ))
}
