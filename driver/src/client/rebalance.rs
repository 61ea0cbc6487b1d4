//! Rebalancing: moving quiescent executions from one shard to another
//! (the extension's `workflow::migration`; the phases are in sql/schema.sql,
//! `migrations`). One execution at a time: begin and export on the source,
//! stage on the target, verify (byte identity, proportional to the bytes
//! moved), one cutover transaction on the source, activation on the target,
//! then the origin's seal repointed and the move recorded done. No
//! transaction spans two shards; a crash between two steps leaves a record
//! on the source that `rebalance_resume` (or a worker's auto-resume,
//! `settle_stalled`) finishes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::{Admin, Client, ClientError, Owned, Protocol, Steps, first_column};
use crate::id::ExecutionId;
use crate::json::Json;
use crate::topology::ShardId;
use crate::words::{word, word_list, words};
use sheaf_core::state::ExecutionState;

const CANDIDATES: &str = "SELECT execution_id, workflow_name, workflow_id, state, history_bytes, blockers \
                          FROM sheaf.rebalance_candidates($1, $2)";
const BEGIN: &str = "SELECT sheaf.migration_begin($1, $2, make_interval(secs => $3))";
const STAGE: &str = "SELECT sheaf.migration_stage($1)";
const VERIFY: &str = "SELECT sheaf.migration_verify($1, $2, $3)";
const CUTOVER: &str = "SELECT sheaf.migration_cutover($1, $2)";
const ACTIVATE: &str = "SELECT sheaf.migration_activate($1)";
const DISCARD: &str = "SELECT sheaf.migration_discard($1, $2, $3)";
const REPORT: &str = "SELECT sheaf.migration_report($1, $2, $3, $4)";
const TAKEOVER: &str = "SELECT sheaf.migration_takeover($1, make_interval(secs => $2))";
const STALLED: &str = "SELECT migration_id, execution_id, target_shard, attempts, lease_token \
                       FROM sheaf.migration_stalled(make_interval(secs => $1), $2, $3)";
const REPOINT: &str = "SELECT sheaf.migration_repoint($1, $2)";
const MIGRATIONS: &str = "SELECT migration_id, execution_id, target_shard, phase, attempts, last_error, \
                          verified_event_seq, bytes, actor, login, created_at, updated_at FROM sheaf.migrations($1, $2)";

/// Candidates read per page.
const PAGE: i32 = 500;
/// The default grace of a stalled cutover before a worker settles it.
pub const STALL_AFTER: Duration = Duration::from_secs(30);
/// The shortest grace the shards accept.
pub const MIN_STALL_AFTER: Duration = Duration::from_secs(5);
/// The lease `rebalance_resume` takes on a move it takes over.
const RESUME_LEASE: Duration = Duration::from_secs(60);
/// A move's lease unless its options say otherwise.
const MOVE_LEASE: Duration = Duration::from_secs(60);

/// One move as its mover holds it: every step on the source names the
/// lease token (`sheaf.migration_begin`'s, or a takeover's).
struct Lease {
    from: ShardId,
    to: ShardId,
    id: ExecutionId,
    migration: i64,
    token: i64,
}

/// An unfinished execution of a shard and every reason it cannot move now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Candidate {
    /// The execution.
    pub id: ExecutionId,
    /// Its workflow's name.
    pub workflow_name: String,
    /// Its workflow id.
    pub workflow_id: String,
    /// Its state.
    pub state: ExecutionState,
    /// The bytes of its history.
    pub history_bytes: i64,
    /// Why it cannot move (empty: it can): `not_running`,
    /// `migration_in_progress`, `task_claimed`, `mutex`,
    /// `children_unsettled`, `parent_here`, `outbox_unsettled`,
    /// `dead_letters`, `rate_limited`; and, from the driver,
    /// `target_config_differs`.
    pub blockers: Vec<Blocker>,
}

/// One record of a shard's moves (`sheaf.migrations`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Migration {
    /// The shard it is recorded on (the source).
    pub shard: ShardId,
    /// Its id there.
    pub id: i64,
    /// The execution.
    pub execution_id: ExecutionId,
    /// Where it goes.
    pub target: ShardId,
    /// Where its record stands.
    pub phase: MovePhase,
    /// Failed steps so far.
    pub attempts: i32,
    /// The last failure or refusal.
    pub last_error: Option<String>,
    /// The source history's last event when it was verified.
    pub verified_event_seq: Option<i64>,
    /// History bytes moved.
    pub bytes: i64,
    /// Who started it, as its session declared (`PoolOptions::actor`, else
    /// the login role).
    pub actor: String,
    /// The login role that started it, whatever the session declared.
    pub login: String,
    /// When it started.
    pub created_at: SystemTime,
    /// When it last changed.
    pub updated_at: SystemTime,
}

/// A COMMITTED move claimed for settling (`Protocol::migration_stalled`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StalledMove {
    /// Its id on the source.
    pub id: i64,
    /// The execution.
    pub execution_id: ExecutionId,
    /// Where it is to be activated.
    pub target: ShardId,
    /// Failed steps so far.
    pub attempts: i32,
    /// The lease token the claim gave this settler.
    pub lease_token: i64,
}

/// How one execution's move ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MoveOutcome {
    /// It lives on the target now. `unavailable`: from the cutover's commit
    /// to the activation's (claimable on neither shard in between).
    Moved {
        /// History bytes moved.
        bytes: i64,
        /// The unavailability window.
        unavailable: Duration,
    },
    /// It did not move: it was not quiescent (the blockers), nothing changed.
    Blocked(Vec<Blocker>),
    /// It did not move: the staged copy did not match, or the run changed
    /// after verification (it woke). Nothing moved; a later rebalance moves
    /// its current history.
    Aborted(String),
}

/// One execution a rebalance considered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MoveReport {
    /// The execution.
    pub id: ExecutionId,
    /// Its workflow's name.
    pub workflow_name: String,
    /// What happened (a dry run reports `Moved` with zero window for what
    /// would move).
    pub outcome: Result<MoveOutcome, String>,
}

words! {
    /// Where a move's record stands (`sheaf.migrations`' phase).
    pub enum MovePhase {
        /// Begun: the export was read; nothing is sealed.
        Started = "STARTED",
        /// The staged copy on the target matched the source.
        Verified = "VERIFIED",
        /// The cutover committed: the source is sealed, the copy not yet live.
        Committed = "COMMITTED",
        /// The copy is live on the target.
        Done = "DONE",
        /// Given up; the source kept the run.
        Aborted = "ABORTED",
    }
}

words! {
    /// Why an execution may not move now (`sheaf.rebalance_candidates`):
    /// a move needs it quiescent.
    pub enum Blocker {
        /// It has ended, or is paused.
        NotRunning = "not_running",
        /// Another move of it is under way.
        MigrationInProgress = "migration_in_progress",
        /// A task of it is claimed.
        TaskClaimed = "task_claimed",
        /// It holds or waits for a durable mutex.
        Mutex = "mutex",
        /// A child of it is still running, or its relay rows are unsettled.
        ChildrenUnsettled = "children_unsettled",
        /// Its parent runs on this shard.
        ParentHere = "parent_here",
        /// Its outbox still has rows to deliver.
        OutboxUnsettled = "outbox_unsettled",
        /// It has dead letters.
        DeadLetters = "dead_letters",
        /// A task of it waits on a rate limit.
        RateLimited = "rate_limited",
        /// A debounce window of it is open.
        DebounceOpen = "debounce_open",
        /// The target shard's fleet config differs from the source's.
        TargetConfigDiffers = "target_config_differs",
    }
    other
    /// A refusal in its own words: the shard's message when a step was
    /// refused, or why the driver left the move (held by another mover).
    Other
}

/// A step of one move, committed: what [`RebalanceOptions::after_phase`]
/// hears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Phase {
    /// The record is STARTED and the export read.
    Begun,
    /// The copy is staged on the target.
    Staged,
    /// The record is VERIFIED.
    Verified,
    /// The cutover committed: the source is sealed.
    Committed,
    /// The copy is live on the target.
    Activated,
}

impl Phase {
    /// Its name: begun, staged, verified, committed, activated.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Begun => "begun",
            Phase::Staged => "staged",
            Phase::Verified => "verified",
            Phase::Committed => "committed",
            Phase::Activated => "activated",
        }
    }
}

/// Called after each committed step of each move.
pub type PhaseHook = Arc<dyn Fn(ExecutionId, Phase) + Send + Sync>;

/// What a rebalance is asked to do. `RebalanceOptions::new()` moves every
/// movable execution.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct RebalanceOptions {
    pub(crate) limit: Option<usize>,
    pub(crate) dry_run: bool,
    pub(crate) lease: Option<Duration>,
    pub(crate) after_phase: Option<PhaseHook>,
}

impl std::fmt::Debug for RebalanceOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RebalanceOptions")
            .field("limit", &self.limit)
            .field("dry_run", &self.dry_run)
            .field("lease", &self.lease)
            .field("after_phase", &self.after_phase.is_some())
            .finish()
    }
}

impl RebalanceOptions {
    /// Every movable execution, 60 s move leases, no hook.
    pub fn new() -> RebalanceOptions {
        RebalanceOptions::default()
    }

    /// Called after each step of each move commits (logging, or a crash
    /// test's hook that kills the process right there).
    pub fn after_phase(mut self, after_phase: PhaseHook) -> Self {
        self.after_phase = Some(after_phase);
        self
    }

    /// Moves at most `n` executions (default: every movable one).
    pub fn limit(mut self, n: usize) -> Self {
        self.limit = Some(n);
        self
    }

    /// Reports what would move and why the rest would not; changes nothing.
    pub fn dry_run(mut self, yes: bool) -> Self {
        self.dry_run = yes;
        self
    }

    /// How long each move is this mover's without a step (default 60 s;
    /// 5 s to 1 h): a resume takes a move over only after it lapsed.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }
}

/// A rebalance's progress after each execution: what the CLI's progress
/// bar shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Progress {
    /// Executions considered.
    pub considered: usize,
    /// Executions moved (or, in a dry run, that would move).
    pub moved: usize,
    /// History bytes moved.
    pub bytes: i64,
    /// Executions left where they are.
    pub skipped: usize,
}

fn read_err(shard: ShardId, what: &str, e: impl std::fmt::Display) -> ClientError {
    ClientError::Database {
        shard,
        code: None,
        message: format!("{what}: {e}"),
    }
}

impl Client {
    async fn move_observed(
        &self,
        from: ShardId,
        id: ExecutionId,
        to: ShardId,
        options: &RebalanceOptions,
    ) -> Result<MoveOutcome, ClientError> {
        let hook = options.after_phase.as_ref();
        let after = |phase| {
            if let Some(hook) = hook {
                hook(id, phase);
            }
        };
        let lease = options.lease.unwrap_or(MOVE_LEASE);
        let export = match self.protocol().migration_begin(from, id, to, lease).await {
            Ok(export) => export,
            Err(ClientError::WrongState { message, .. }) => {
                return Ok(MoveOutcome::Blocked(vec![Blocker::Other(message)]));
            }
            Err(e) => return Err(e),
        };
        let value = export.to_value().map_err(|e| read_err(from, "an export", e))?;
        let migration = value["migration_id"]
            .as_i64()
            .ok_or_else(|| read_err(from, "an export", "no migration_id"))?;
        let lease = value["lease_token"]
            .as_i64()
            .ok_or_else(|| read_err(from, "an export", "no lease_token"))?;
        let mv = Lease {
            from,
            to,
            id,
            migration,
            token: lease,
        };
        let bytes = value["execution"]["history_bytes"].as_i64().unwrap_or_default();
        drop(value);
        after(Phase::Begun);
        let staged = match self.protocol().migration_stage(to, &export).await {
            Ok(digest) => digest,
            Err(e) => return self.abort(&mv, &e.to_string()).await,
        };
        drop(export);
        after(Phase::Staged);
        if !self
            .protocol()
            .migration_verify(from, migration, lease, &staged)
            .await?
        {
            return self.abort(&mv, "the staged copy differs from the source").await;
        }
        after(Phase::Verified);
        if !self.protocol().migration_cutover(from, migration, lease).await? {
            // The cutover noted why on the record.
            let why = self
                .admin()
                .migrations(from, true, 10_000)
                .await?
                .into_iter()
                .find(|m| m.id == migration)
                .and_then(|m| m.last_error)
                .unwrap_or_else(|| "the cutover declined".to_owned());
            return self.abort(&mv, &why).await;
        }
        let cut = Instant::now();
        after(Phase::Committed);
        let live = self.settle(&mv, "done", hook).await?;
        Ok(MoveOutcome::Moved {
            bytes,
            unavailable: live.duration_since(cut),
        })
    }

    /// Activates a committed move on its target, repoints the origin's seal
    /// and records it `outcome` (`done`, `resumed`). A failed activation is
    /// recorded (`failed`) and returned: the record stays COMMITTED.
    async fn settle(
        &self,
        mv: &Lease,
        outcome: &str,
        hook: Option<&PhaseHook>,
    ) -> Result<Instant, ClientError> {
        let &Lease {
            from,
            to,
            id,
            migration,
            token,
        } = mv;
        if let Err(e) = self.protocol().migration_activate(to, id).await {
            if let Err(r) = self
                .protocol()
                .migration_report(from, migration, token, "failed", Some(&e.to_string()))
                .await
            {
                tracing::warn!(%id, error = %r, "recording a failed activation failed");
            }
            return Err(e);
        }
        // Claimable on the target from here.
        let live = Instant::now();
        if let Some(hook) = hook {
            hook(id, Phase::Activated);
        }
        let origin = id.route(self.topology());
        if origin != to && origin != from {
            // Best effort: a stale origin pointer is followed, only longer.
            if let Err(e) = self.protocol().migration_repoint(origin, id, to).await {
                tracing::warn!(%id, %origin, error = %e, "repointing the origin's seal failed; the chain is followed");
            }
        }
        self.protocol()
            .migration_report(from, migration, token, outcome, None)
            .await?;
        Ok(live)
    }

    /// A move that will not complete: the record aborted with `why` first
    /// (fenced by the lease: no cutover can follow it), then the copy this
    /// move staged on `to` discarded (only this move's: a later move's copy
    /// is never touched). A copy left by a failed discard is never live and
    /// is replaced by the next stage of the run there.
    async fn abort(&self, mv: &Lease, why: &str) -> Result<MoveOutcome, ClientError> {
        self.protocol()
            .migration_report(mv.from, mv.migration, mv.token, "aborted", Some(why))
            .await?;
        self.protocol()
            .migration_discard(mv.to, mv.id, mv.from, mv.migration)
            .await?;
        Ok(MoveOutcome::Aborted(why.to_owned()))
    }

    /// Moves `from`'s quiescent executions, each to `target(candidate)`, in
    /// id order, at most `options.limit`, reporting each: the loop of
    /// `rebalance` and `drain`. A run whose workflow is configured
    /// differently on its target is not moved (`target_config_differs`).
    async fn move_all(
        &self,
        from: ShardId,
        options: &RebalanceOptions,
        target: impl Fn(&Candidate) -> Result<ShardId, ClientError>,
        mut progress: impl FnMut(Progress, &MoveReport),
    ) -> Result<Vec<(MoveReport, ShardId)>, ClientError> {
        let source = self.admin().shard_config(from).await?;
        let mut configs = std::collections::BTreeMap::new();
        let mut after = None;
        let mut state = Progress::default();
        let mut moves = Vec::new();
        'pages: loop {
            let page = self.admin().rebalance_candidates(from, after, PAGE).await?;
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            for c in page {
                if options.limit.is_some_and(|n| state.moved >= n) {
                    break 'pages;
                }
                let to = target(&c)?;
                if let std::collections::btree_map::Entry::Vacant(v) = configs.entry(to) {
                    v.insert(self.admin().shard_config(to).await?);
                }
                let mut blockers = c.blockers.clone();
                if configs
                    .get(&to)
                    .is_some_and(|t| !source.workflow_differences(t, &c.workflow_name).is_empty())
                {
                    blockers.push(Blocker::TargetConfigDiffers);
                }
                let outcome = if !blockers.is_empty() {
                    Ok(MoveOutcome::Blocked(blockers))
                } else if options.dry_run {
                    Ok(MoveOutcome::Moved {
                        bytes: c.history_bytes,
                        unavailable: Duration::ZERO,
                    })
                } else {
                    self.move_observed(from, c.id, to, options)
                        .await
                        .map_err(|e| e.to_string())
                };
                state.considered += 1;
                match &outcome {
                    Ok(MoveOutcome::Moved { bytes, .. }) => {
                        state.moved += 1;
                        state.bytes += bytes;
                    }
                    _ => state.skipped += 1,
                }
                let report = MoveReport {
                    id: c.id,
                    workflow_name: c.workflow_name,
                    outcome,
                };
                progress(state, &report);
                moves.push((report, to));
            }
        }
        Ok(moves)
    }
}

impl Admin<'_> {
    /// A page of `shard`'s unfinished executions after `after`, in id
    /// order, at most `max_rows` (1..10000), with their blockers
    /// (`sheaf.rebalance_candidates`).
    pub async fn rebalance_candidates(
        self,
        shard: ShardId,
        after: Option<ExecutionId>,
        max_rows: i32,
    ) -> Result<Vec<Candidate>, ClientError> {
        let after = after.map(|a| a.as_uuid());
        let (call, rows) = self
            .client
            .on_shard(shard, Owned::Shard, CANDIDATES, &[&after, &max_rows])
            .await?;
        rows.iter()
            .map(|row| {
                let read = || -> Result<Candidate, tokio_postgres::Error> {
                    Ok(Candidate {
                        id: ExecutionId::from_uuid(row.try_get("execution_id")?),
                        workflow_name: row.try_get("workflow_name")?,
                        workflow_id: row.try_get("workflow_id")?,
                        state: word(row, "state")?,
                        history_bytes: row.try_get("history_bytes")?,
                        blockers: word_list(row, "blockers")?,
                    })
                };
                read().map_err(|e| call.error(e, 1))
            })
            .collect()
    }

    /// `shard`'s moves as the source, newest first, at most `max_rows`;
    /// only unfinished ones if `open_only` (`sheaf.migrations`).
    pub async fn migrations(
        self,
        shard: ShardId,
        open_only: bool,
        max_rows: i32,
    ) -> Result<Vec<Migration>, ClientError> {
        let (call, rows) = self
            .client
            .on_shard(shard, Owned::Shard, MIGRATIONS, &[&open_only, &max_rows])
            .await?;
        rows.iter()
            .map(|row| {
                let target: i32 = row.try_get("target_shard").map_err(|e| call.error(e, 1))?;
                let target =
                    ShardId::new(target as u32).map_err(|e| read_err(shard, "a move's target", e))?;
                let read = || -> Result<Migration, tokio_postgres::Error> {
                    Ok(Migration {
                        shard,
                        id: row.try_get("migration_id")?,
                        execution_id: ExecutionId::from_uuid(row.try_get("execution_id")?),
                        target,
                        phase: word(row, "phase")?,
                        attempts: row.try_get("attempts")?,
                        last_error: row.try_get("last_error")?,
                        verified_event_seq: row.try_get("verified_event_seq")?,
                        bytes: row.try_get("bytes")?,
                        actor: row.try_get("actor")?,
                        login: row.try_get("login")?,
                        created_at: row.try_get("created_at")?,
                        updated_at: row.try_get("updated_at")?,
                    })
                };
                read().map_err(|e| call.error(e, 1))
            })
            .collect()
    }

    /// Moves quiescent executions from `from` to `to`, one at a time, in
    /// id order (at most `options.limit`), calling `progress` after each;
    /// every execution it left is reported with why. A run whose workflow
    /// is configured differently on `to` (policy, queue options) is not
    /// moved (`target_config_differs`). A dry run changes nothing and
    /// reports what would move.
    pub async fn rebalance(
        self,
        from: ShardId,
        to: ShardId,
        options: &RebalanceOptions,
        progress: impl FnMut(Progress, &MoveReport),
    ) -> Result<Vec<MoveReport>, ClientError> {
        if from == to {
            return Err(ClientError::BadRequest(format!(
                "a rebalance moves to another shard: --from and --to are both {from}"
            )));
        }
        let moves = self.client.move_all(from, options, |_| Ok(to), progress).await?;
        Ok(moves.into_iter().map(|(r, _)| r).collect())
    }

    /// Finishes `from`'s unfinished moves after a crash, each only once its
    /// mover's lease has lapsed (taken over with a new lease; a move still
    /// held is reported `Blocked` and left to its mover): one before the
    /// cutover is aborted and its staged copy discarded, then moved again
    /// from its current history (if it still may move); one after it is
    /// activated on its target and recorded done.
    pub async fn rebalance_resume(self, from: ShardId) -> Result<Vec<MoveReport>, ClientError> {
        let mut reports = Vec::new();
        for m in self.migrations(from, true, 10_000).await? {
            // Only a move whose mover's lease lapsed is taken over: one
            // still in progress elsewhere is left to it.
            let Some(token) = self
                .client
                .protocol()
                .migration_takeover(from, m.id, RESUME_LEASE)
                .await?
            else {
                reports.push(MoveReport {
                    id: m.execution_id,
                    workflow_name: String::new(),
                    outcome: Ok(MoveOutcome::Blocked(vec![Blocker::Other(format!(
                        "move {} ({}) is held by a mover whose lease has not lapsed",
                        m.id, m.phase
                    ))])),
                });
                continue;
            };
            let mv = Lease {
                from,
                to: m.target,
                id: m.execution_id,
                migration: m.id,
                token,
            };
            let outcome = match m.phase {
                MovePhase::Committed => {
                    self.client
                        .settle(&mv, "done", None)
                        .await
                        .map(|_| MoveOutcome::Moved {
                            bytes: m.bytes,
                            unavailable: Duration::ZERO,
                        })
                }
                _ => {
                    let why = format!("interrupted at {}; resumed", m.phase);
                    match self.client.abort(&mv, &why).await {
                        Ok(_) => {
                            self.client
                                .protocol()
                                .move_execution(from, m.execution_id, m.target)
                                .await
                        }
                        Err(e) => Err(e),
                    }
                }
            };
            reports.push(MoveReport {
                id: m.execution_id,
                workflow_name: String::new(),
                outcome: outcome.map_err(|e| e.to_string()),
            });
        }
        Ok(reports)
    }
}

impl Protocol<'_> {
    /// Begins moving `id` from `from` to `to` (`sheaf.migration_begin`),
    /// held for `lease` (5 s to 1 h) without a step: the export to stage,
    /// with its `lease_token`. [`ClientError::WrongState`] names every
    /// blocker if it is not quiescent.
    pub async fn migration_begin(
        self,
        from: ShardId,
        id: ExecutionId,
        to: ShardId,
        lease: Duration,
    ) -> Result<Json, ClientError> {
        let target = to.get() as i32;
        let secs = lease.as_secs_f64();
        let (call, rows) = self
            .client
            .on_shard(
                from,
                Owned::Execution(id),
                BEGIN,
                &[&id.as_uuid(), &target, &secs],
            )
            .await?;
        first_column(&call, &rows)
    }

    /// Stages an export on `to` (`sheaf.migration_stage`); the digest of
    /// what it stored.
    pub async fn migration_stage(self, to: ShardId, export: &Json) -> Result<String, ClientError> {
        let (call, rows) = self.client.on_shard(to, Owned::Shard, STAGE, &[export]).await?;
        first_column(&call, &rows)
    }

    /// Verifies move `migration` on its source against the staged digest
    /// (`sheaf.migration_verify`), as the holder of `lease_token` (the
    /// export's, or a takeover's).
    pub async fn migration_verify(
        self,
        from: ShardId,
        migration: i64,
        lease_token: i64,
        digest: &str,
    ) -> Result<bool, ClientError> {
        let (call, rows) = self
            .client
            .on_shard(from, Owned::Shard, VERIFY, &[&migration, &lease_token, &digest])
            .await?;
        first_column(&call, &rows)
    }

    /// The cutover of move `migration` on its source
    /// (`sheaf.migration_cutover`), as the holder of `lease_token`: `false`
    /// if it declined.
    pub async fn migration_cutover(
        self,
        from: ShardId,
        migration: i64,
        lease_token: i64,
    ) -> Result<bool, ClientError> {
        let (call, rows) = self
            .client
            .on_shard(from, Owned::Shard, CUTOVER, &[&migration, &lease_token])
            .await?;
        first_column(&call, &rows)
    }

    /// Takes move `migration` over when its mover's lease has lapsed
    /// (`sheaf.migration_takeover`): the new lease token, or `None` while
    /// its mover still holds it or the move is over.
    pub async fn migration_takeover(
        self,
        from: ShardId,
        migration: i64,
        lease: Duration,
    ) -> Result<Option<i64>, ClientError> {
        let secs = lease.as_secs_f64();
        let (call, rows) = self
            .client
            .on_shard(from, Owned::Shard, TAKEOVER, &[&migration, &secs])
            .await?;
        first_column(&call, &rows)
    }

    /// Activates the staged copy of `id` on `to` (`sheaf.migration_activate`).
    pub async fn migration_activate(self, to: ShardId, id: ExecutionId) -> Result<bool, ClientError> {
        let (call, rows) = self
            .client
            .on_shard(to, Owned::Execution(id), ACTIVATE, &[&id.as_uuid()])
            .await?;
        first_column(&call, &rows)
    }

    /// Discards the copy of `id` that move `migration` of `from` staged on
    /// `to` (`sheaf.migration_discard`); `false` if nothing is staged there
    /// or the copy is another move's.
    pub async fn migration_discard(
        self,
        to: ShardId,
        id: ExecutionId,
        from: ShardId,
        migration: i64,
    ) -> Result<bool, ClientError> {
        let source = from.get() as i32;
        let (call, rows) = self
            .client
            .on_shard(
                to,
                Owned::Execution(id),
                DISCARD,
                &[&id.as_uuid(), &source, &migration],
            )
            .await?;
        first_column(&call, &rows)
    }

    /// Records how move `migration` ended on its source
    /// (`sheaf.migration_report`: `done`, `resumed`, `aborted`, `failed`),
    /// as the holder of `lease_token`; its phase after.
    pub async fn migration_report(
        self,
        from: ShardId,
        migration: i64,
        lease_token: i64,
        outcome: &str,
        error: Option<&str>,
    ) -> Result<String, ClientError> {
        let (call, rows) = self
            .client
            .on_shard(
                from,
                Owned::Shard,
                REPORT,
                &[&migration, &lease_token, &outcome, &error],
            )
            .await?;
        first_column(&call, &rows)
    }

    /// Claims `shard`'s COMMITTED moves stalled longer than `grace` whose
    /// target this client reaches (`sheaf.migration_stalled`).
    pub async fn migration_stalled(
        self,
        shard: ShardId,
        grace: Duration,
        max_rows: i32,
    ) -> Result<Vec<StalledMove>, ClientError> {
        let targets: Vec<i32> = self
            .client
            .topology()
            .shards()
            .map(|s| s.id.get() as i32)
            .collect();
        let secs = grace.as_secs_f64();
        let (call, rows) = self
            .client
            .on_shard(shard, Owned::Shard, STALLED, &[&secs, &max_rows, &targets])
            .await?;
        rows.iter()
            .map(|row| {
                let read = || -> Result<(i64, uuid::Uuid, i32, i32, i64), tokio_postgres::Error> {
                    Ok((
                        row.try_get(0)?,
                        row.try_get(1)?,
                        row.try_get(2)?,
                        row.try_get(3)?,
                        row.try_get(4)?,
                    ))
                };
                let (id, execution, target, attempts, lease_token) = read().map_err(|e| call.error(e, 1))?;
                Ok(StalledMove {
                    id,
                    execution_id: ExecutionId::from_uuid(execution),
                    target: ShardId::new(target as u32).map_err(|e| read_err(shard, "a move's target", e))?,
                    attempts,
                    lease_token,
                })
            })
            .collect()
    }

    /// Points `origin`'s seal of `id` at `home` (`sheaf.migration_repoint`).
    pub async fn migration_repoint(
        self,
        origin: ShardId,
        id: ExecutionId,
        home: ShardId,
    ) -> Result<bool, ClientError> {
        let home = home.get() as i32;
        let (call, rows) = self
            .client
            .on_shard(origin, Owned::Execution(id), REPOINT, &[&id.as_uuid(), &home])
            .await?;
        first_column(&call, &rows)
    }

    /// Moves one quiescent execution from `from` to `to`, every phase in
    /// order. A failure before the cutover discards the staged copy and
    /// records the move aborted; one after it leaves the record COMMITTED
    /// for `rebalance_resume` or a worker's auto-resume, and is returned.
    pub async fn move_execution(
        self,
        from: ShardId,
        id: ExecutionId,
        to: ShardId,
    ) -> Result<MoveOutcome, ClientError> {
        self.client
            .move_observed(from, id, to, &RebalanceOptions::default())
            .await
    }

    /// Auto-resume, as a worker runs it for `shard`: activates every
    /// COMMITTED move recorded there that stalled longer than `grace` (at
    /// least 5 s), each claimed by one settler and recorded `resumed` with
    /// an audit entry. How many it settled.
    pub async fn settle_stalled(self, shard: ShardId, grace: Duration) -> Result<usize, ClientError> {
        let mut settled = 0;
        for m in self
            .migration_stalled(shard, grace.max(MIN_STALL_AFTER), 10)
            .await?
        {
            let mv = Lease {
                from: shard,
                to: m.target,
                id: m.execution_id,
                migration: m.id,
                token: m.lease_token,
            };
            match self.client.settle(&mv, "resumed", None).await {
                Ok(_) => settled += 1,
                Err(e) => {
                    tracing::error!(execution = %m.execution_id, %shard, target = %m.target, error = %e,
                                          "settling a stalled move failed; retried after the grace period")
                }
            }
        }
        Ok(settled)
    }
}

const ERASE: &str = "SELECT sheaf.erase_payloads($1)";

/// What `Admin::erase_payloads` did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Erasure {
    /// Where the run lives.
    pub live: ShardId,
    /// Every other shard of the topology that held a copy (a seal of a
    /// residence, or one a drain handed over), each erased too.
    pub prior_residences: Vec<ShardId>,
    /// Events erased where it lives.
    pub events: i64,
    /// Its history's bytes there, before and after.
    pub bytes_before: i64,
    /// After.
    pub bytes_after: i64,
}

impl Client {
    async fn erase_on(&self, shard: ShardId, id: ExecutionId) -> Result<serde_json::Value, ClientError> {
        let (call, rows) = self
            .on_shard(shard, Owned::Execution(id), ERASE, &[&id.as_uuid()])
            .await?;
        first_column(&call, &rows)
    }
}

impl Admin<'_> {
    /// Erases an ended execution's payloads on every shard that holds a
    /// copy: where it lives (gated there: it must have ended), then every
    /// other shard of the topology (a shard it lived on keeps a seal, and a
    /// drain hands its seals to another). Fails, after trying them all, if
    /// one could not be reached: an erasure is never reported complete
    /// unless it is (run it again; it is idempotent).
    pub async fn erase_payloads(self, id: ExecutionId) -> Result<Erasure, ClientError> {
        let Some(live) = self.client.get_execution(id).await? else {
            return Err(ClientError::UnknownExecution {
                shard: id.route(self.client.topology()),
                message: format!("no execution {id}"),
            });
        };
        let report = self.client.erase_on(live.shard, id).await?;
        // Every other shard is asked, not only those the run's row names
        // (`migrated_from_shards`): a drain hands its seals, input and all,
        // to a shard the run never lived on. A shard holding no copy says
        // so; one that cannot answer makes the erasure incomplete.
        let mut prior = Vec::new();
        let mut failed = None;
        for shard in self
            .client
            .topology()
            .shards()
            .map(|s| s.id)
            .filter(|s| *s != live.shard)
        {
            match self.client.erase_on(shard, id).await {
                Ok(r) if r["found"] == serde_json::Value::Bool(true) => prior.push(shard),
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(%id, %shard, error = %e, "erasing a copy failed");
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        Ok(Erasure {
            live: live.shard,
            prior_residences: prior,
            events: report["events"].as_i64().unwrap_or_default(),
            bytes_before: report["bytes_before"].as_i64().unwrap_or_default(),
            bytes_after: report["bytes_after"].as_i64().unwrap_or_default(),
        })
    }
}

const SEALS: &str = "SELECT execution_id, moved_to, seal FROM sheaf.migration_seals($1, $2)";
const ROWS_TO: &str = "SELECT child_id, parent_id, state FROM sheaf.relay_rows_to($1, $2, $3)";
const ADOPT: &str = "SELECT sheaf.migration_adopt_seal($1)";

/// What `Admin::drain` did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Drain {
    /// Each execution considered, with the shard it went to (or would go to).
    pub moves: Vec<(MoveReport, ShardId)>,
    /// Where the retired shard's ids are to forward (`SHEAF_FORWARDS`
    /// entry `leaving=forward_to`).
    pub forward_to: ShardId,
    /// Seals handed to `forward_to`, so the ids it will receive keep
    /// resolving (none in a dry run).
    pub seals_adopted: usize,
    /// What the relay still has to do on or for the shard, which its
    /// retirement would lose: retire it only once this is empty too.
    pub unsettled: Vec<Unsettled>,
}

/// Relay work a drained shard's retirement would lose (see
/// [`Drain::unsettled`]): drain again once the relay has done it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unsettled {
    /// The shard holding the record of it (a lifecycle or outbox row).
    pub shard: ShardId,
    /// The child it is about, if it is about one.
    pub execution_id: Option<ExecutionId>,
    /// What is still to happen.
    pub reason: String,
}

impl Drain {
    /// Whether the shard may be retired: no execution stayed and the
    /// relay owes it nothing ([`Drain::unsettled`]).
    pub fn is_complete(&self) -> bool {
        self.stragglers().next().is_none() && self.unsettled.is_empty()
    }

    /// The executions left on the shard (their reports say why).
    pub fn stragglers(&self) -> impl Iterator<Item = &MoveReport> {
        self.moves
            .iter()
            .map(|(r, _)| r)
            .filter(|r| !matches!(r.outcome, Ok(MoveOutcome::Moved { .. })))
    }
}

impl Client {
    /// Lifecycle rows on the other shards that still need `leaving`: a
    /// child start to happen there (a parent elsewhere asked for it), or
    /// a child that ended there whose end its parent has not pulled yet.
    /// A child that moved away is reached through the seals handed over;
    /// one still live there is a straggler already.
    async fn relay_rows_owed_to(&self, leaving: ShardId) -> Result<Vec<Unsettled>, ClientError> {
        let ended_here: BTreeMap<ExecutionId, ExecutionState> = self
            .links_on(leaving)
            .await?
            .into_iter()
            .filter(|l| !l.state.is_active() && !l.state.is_migrating())
            .map(|l| (l.execution_id, l.state))
            .collect();
        let mut owed = Vec::new();
        let others: Vec<ShardId> = self
            .topology()
            .shards()
            .map(|s| s.id)
            .filter(|s| *s != leaving)
            .collect();
        for shard in others {
            let mut after: Option<uuid::Uuid> = None;
            loop {
                let target = i32::from(leaving.get());
                let (call, rows) = self
                    .on_shard(shard, Owned::Shard, ROWS_TO, &[&target, &after, &PAGE])
                    .await?;
                for row in &rows {
                    let read = || -> Result<(uuid::Uuid, uuid::Uuid, String), tokio_postgres::Error> {
                        Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
                    };
                    let (child, parent, state) = read().map_err(|e| call.error(e, 1))?;
                    after = Some(child);
                    let child = ExecutionId::from_uuid(child);
                    let reason = if state == "STARTING" {
                        format!(
                            "child {child} of {parent} is still to be started on shard {leaving} (the relay of shard {shard} starts it)"
                        )
                    } else if let Some(ended) = ended_here.get(&child) {
                        format!(
                            "child {child} ended {ended} on shard {leaving}; its parent {parent} has not had its end yet (the relay of shard {shard} pulls it)"
                        )
                    } else {
                        continue;
                    };
                    owed.push(Unsettled {
                        shard,
                        execution_id: Some(child),
                        reason,
                    });
                }
                if rows.len() < PAGE as usize {
                    break;
                }
            }
        }
        Ok(owed)
    }

    /// What the relay still has to do from `leaving` itself: lifecycle
    /// rows of its parents (starts, closes, ends to deliver) and outbox
    /// rows (signals and cancels by key) not yet delivered.
    async fn relay_rows_owed_by(&self, leaving: ShardId) -> Result<Vec<Unsettled>, ClientError> {
        let mut owed = Vec::new();
        let rows: i64 = self
            .admin()
            .relay_backlog(leaving)
            .await?
            .iter()
            .map(|b| b.rows)
            .sum();
        if rows > 0 {
            owed.push(Unsettled {
                shard: leaving,
                execution_id: None,
                reason: format!(
                    "{rows} lifecycle row(s) of parents on shard {leaving} still to drive (child starts, closes or ends)"
                ),
            });
        }
        let rows: i64 = self
            .admin()
            .outbox_backlog(leaving)
            .await?
            .iter()
            .map(|b| b.rows)
            .sum();
        if rows > 0 {
            owed.push(Unsettled {
                shard: leaving,
                execution_id: None,
                reason: format!(
                    "{rows} outbox row(s) on shard {leaving} still to deliver (signals or cancels by key)"
                ),
            });
        }
        Ok(owed)
    }

    /// Copies `leaving`'s seals that point elsewhere than `forward_to` onto
    /// it; how many it took.
    async fn hand_over_seals(&self, leaving: ShardId, forward_to: ShardId) -> Result<usize, ClientError> {
        let mut after = None;
        let mut adopted = 0;
        loop {
            let page = self.protocol().migration_seals(leaving, after, PAGE).await?;
            let Some(last) = page.last() else {
                return Ok(adopted);
            };
            after = Some(last.0);
            for (_, to, seal) in &page {
                if *to != Some(forward_to) && self.protocol().migration_adopt_seal(forward_to, seal).await? {
                    adopted += 1;
                }
            }
        }
    }
}

impl Admin<'_> {
    /// Drains `leaving`: every quiescent execution moves to its rendezvous
    /// winner among the other placeable shards (where a start of its key
    /// goes once `leaving` is retired), then every seal on `leaving` is
    /// handed to the shard its ids will forward to ([`Drain::forward_to`]),
    /// so they keep resolving after the forwards entry replaces it.
    pub async fn drain(
        self,
        leaving: ShardId,
        options: &RebalanceOptions,
        progress: impl FnMut(Progress, &MoveReport),
    ) -> Result<Drain, ClientError> {
        let forward_to = self.client.topology().drain_forward(leaving)?;
        let topology = self.client.topology();
        let moves = self
            .client
            .move_all(
                leaving,
                options,
                |c| Ok(topology.drain_target(&c.workflow_name, &c.workflow_id, leaving)?),
                progress,
            )
            .await?;
        let seals_adopted = if options.dry_run {
            0
        } else {
            self.client.hand_over_seals(leaving, forward_to).await?
        };
        let mut unsettled = self.client.relay_rows_owed_to(leaving).await?;
        unsettled.extend(self.client.relay_rows_owed_by(leaving).await?);
        Ok(Drain {
            moves,
            forward_to,
            seals_adopted,
            unsettled,
        })
    }
}

impl Protocol<'_> {
    /// A page of `shard`'s seals after `after` (`sheaf.migration_seals`):
    /// (execution, where it moved, the seal's row).
    pub async fn migration_seals(
        self,
        shard: ShardId,
        after: Option<ExecutionId>,
        max_rows: i32,
    ) -> Result<Vec<(ExecutionId, Option<ShardId>, Json)>, ClientError> {
        let after = after.map(|a| a.as_uuid());
        let (call, rows) = self
            .client
            .on_shard(shard, Owned::Shard, SEALS, &[&after, &max_rows])
            .await?;
        rows.iter()
            .map(|row| {
                let read = || -> Result<(uuid::Uuid, Option<i32>, Json), tokio_postgres::Error> {
                    Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
                };
                let (id, to, seal) = read().map_err(|e| call.error(e, 1))?;
                let to = to.and_then(|t| ShardId::new(t as u32).ok());
                Ok((ExecutionId::from_uuid(id), to, seal))
            })
            .collect()
    }

    /// Keeps a seal on `shard` (`sheaf.migration_adopt_seal`).
    pub async fn migration_adopt_seal(self, shard: ShardId, seal: &Json) -> Result<bool, ClientError> {
        let (call, rows) = self.client.on_shard(shard, Owned::Shard, ADOPT, &[seal]).await?;
        first_column(&call, &rows)
    }
}
