//! The fleet model test (docs/reliability/fleet-model.md; docs/residence.md):
//! on the suite's own three shards, a seeded random sequence of operations
//! through the driver and the CLI — starts, children with every placement,
//! signals and cancels by id and by key, continue-as-new, completions and
//! failures, moves, rebalances and drains SIGKILLed after a random phase
//! and resumed, drains run through or called off, erasure, tasks (plain,
//! keyed, of runs) worked, failed, snoozed and released, retention sweeps —
//! while a relay process runs and is SIGKILLed and restarted, and one shard
//! is stopped and started again. After quiescence, invariants are checked
//! against a model built only from what the API acknowledged (never re-read
//! from the shards):
//!
//! - every child's end reaches a parent that waited for it exactly once
//!   (any other parent may have it once or not at all, never twice);
//! - no execution is live on two shards, no business key has two live runs;
//! - every signal reported delivered is in exactly one history, once;
//! - an erased payload is gone from every shard;
//! - quota counters equal a recount;
//! - every run the model ended has ended, and every id resolves (but those
//!   a retention sweep may have deleted);
//! - no acknowledged task is lost or done twice, and no keyed enqueue made
//!   a second task while the first held the key.
//!
//! A failure prints the seed and the operation log. `SHEAF_MODEL_SEED`
//! replays a seed's operation sequence (not the interleaving of the relay
//! and the shards with it); `SHEAF_MODEL_OPS` sets the number of operations
//! and `SHEAF_MODEL_SEEDS` (`a..b`) runs a range of seeds: the long form.
//! `the_checks_catch_each_sabotage` breaks each invariant once from outside
//! (out-of-protocol SQL) and requires its check to say so.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sheaf_driver::protocol::Steps;
use sheaf_driver::{
    ByKey, ChildPlacement, ClaimedTask, Client, ClientError, EnqueueOptions, ExecutionId, MoveOutcome,
    Placement, PoolOptions, RebalanceOptions, ShardId, StartOptions, TaskId, Topology, TopologyBuilder,
};
use sheaf_tests::{Rng, connect, until};
use tokio::process::{Child, Command};

const SHARDS: u16 = 3;
const WORKFLOW: &str = "fm-work";
const TENANTS: [&str; 3] = ["t-a", "t-b", "t-c"];
const TASKS: &str = "fm-tasks";

/// A fleet of three shards of the suite's own: the model's, and one the
/// sabotage test damages.
#[derive(Debug, Clone, Copy)]
struct Fleet {
    name: &'static str,
    base_port: u32,
    spec: &'static std::sync::OnceLock<String>,
}

static MODEL_SPEC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
static SABOTAGE_SPEC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
const MODEL: Fleet = Fleet {
    name: "model",
    base_port: 24100,
    spec: &MODEL_SPEC,
};
/// The long form's parallel fleets (`SHEAF_MODEL_FLEET=1..3`): several
/// processes, each over a fleet of its own, overlap their waits for lapsed
/// leases. Their ports (base + 10 × major) stay clear of the benchmarks'
/// clusters (claim 26150, ui from 26100).
const LONG_FORM: [Fleet; 3] = [
    Fleet {
        name: "model-1",
        base_port: 26400,
        spec: &MODEL_SPEC,
    },
    Fleet {
        name: "model-2",
        base_port: 26500,
        spec: &MODEL_SPEC,
    },
    Fleet {
        name: "model-3",
        base_port: 26600,
        spec: &MODEL_SPEC,
    },
];

/// The fleet `the_fleet_keeps_its_promises…` runs on.
fn model_fleet() -> Fleet {
    match std::env::var("SHEAF_MODEL_FLEET") {
        Ok(k) => {
            let k: usize = k.parse().expect("SHEAF_MODEL_FLEET is 1, 2 or 3");
            *LONG_FORM
                .get(k.wrapping_sub(1))
                .expect("SHEAF_MODEL_FLEET is 1, 2 or 3")
        }
        Err(_) => MODEL,
    }
}
const SABOTAGE: Fleet = Fleet {
    name: "model-sabotage",
    base_port: 23900,
    spec: &SABOTAGE_SPEC,
};

impl Fleet {
    fn own(self, args: &[&str]) -> String {
        sheaf_tests::own_shards(self.name, self.base_port, args)
    }

    fn spec(self) -> &'static str {
        self.spec.get_or_init(|| {
            let out = self.own(&["up", "--count", "3", "--no-install"]);
            out.lines().collect::<Vec<_>>().join(",")
        })
    }

    fn topology(self) -> Topology {
        Topology::parse(self.spec()).expect("a topology")
    }

    /// The fleet while `leaving` drains: readable, not writable.
    fn draining(self, leaving: u16) -> Topology {
        TopologyBuilder::from_spec(self.spec())
            .expect("a spec")
            .writable(self.writable_without(leaving))
            .build()
            .expect("a topology")
    }

    fn writable_without(self, leaving: u16) -> Vec<u32> {
        (0..SHARDS).filter(|s| *s != leaving).map(u32::from).collect()
    }
}

fn sid(n: u16) -> ShardId {
    sheaf_tests::sid(n)
}

/// The relay, as its own process, killed and restarted.
struct RelayProcess {
    running: Option<Child>,
}

impl RelayProcess {
    fn spawn(fleet: Fleet) -> RelayProcess {
        let child = Command::new(env!("CARGO_BIN_EXE_relay-process"))
            .env("SHEAF_SHARDS", fleet.spec())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("relay-process starts");
        RelayProcess { running: Some(child) }
    }

    async fn kill(&mut self) {
        if let Some(mut c) = self.running.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }
}

/// A run as the API acknowledged it.
#[derive(Debug, Clone)]
struct Run {
    name: String,
    workflow_id: String,
    parent: Option<ExecutionId>,
    /// The operation that ended it, when one the model made did.
    ended_at: Option<usize>,
}

/// What the API acknowledged.
#[derive(Debug, Default)]
struct Model {
    runs: BTreeMap<ExecutionId, Run>,
    /// Signal ids reported delivered, and the run each went to.
    signals: BTreeMap<String, ExecutionId>,
    /// Runs whose erasure was reported complete.
    erased: BTreeSet<ExecutionId>,
    /// Runs an erasure was tried on (one that failed may have erased some
    /// shards: their payloads are no evidence either way).
    erasing: BTreeSet<ExecutionId>,
    log: Vec<String>,
    next: u64,
    /// How many of each operation ran (moves: completed moves).
    stats: BTreeMap<&'static str, usize>,
    /// A shard is stopped.
    outage: bool,
    /// The shard being drained (out of the writable set), if one is.
    draining: Option<u16>,
    /// The operation of the last retention sweep: a run ended before it
    /// may be gone (retention keeps ended runs a minute).
    last_sweep: Option<usize>,
    /// Parents ended after every child's end had settled: each ended
    /// child's end is in their history exactly once.
    settled_parents: BTreeSet<ExecutionId>,
    /// Tasks acknowledged enqueued, by payload marker.
    tasks: BTreeMap<String, TaskRec>,
    /// Completions acknowledged, by marker.
    completed: BTreeMap<String, usize>,
    /// Markers whose finishing call failed: done or not, unknown.
    uncertain: BTreeSet<String>,
    /// Idempotency keys the model knows held by an unfinished task.
    held: BTreeMap<String, (TaskId, String)>,
    /// Keyed enqueues that made a second task while the first held the key.
    doubled: Vec<String>,
}

/// A task as the API acknowledged it.
#[derive(Debug, Clone)]
struct TaskRec {
    /// Its execution's (such a task ends with it).
    execution: Option<ExecutionId>,
}

impl Model {
    fn live(&self) -> Vec<ExecutionId> {
        self.runs
            .iter()
            .filter(|(_, r)| r.ended_at.is_none())
            .map(|(id, _)| *id)
            .collect()
    }

    fn pick(&self, rng: &mut Rng, from: &[ExecutionId]) -> Option<ExecutionId> {
        (!from.is_empty()).then(|| from[rng.below(from.len() as u64) as usize])
    }

    fn fresh(&mut self, prefix: &str, seed: u64) -> String {
        self.next += 1;
        format!("{prefix}-{seed:x}-{}", self.next)
    }

    /// Ends `id` at operation `op` (and, for a parent that ends, the model
    /// does not guess what its parent_close did to its children).
    fn ended(&mut self, id: ExecutionId, op: usize) {
        if let Some(r) = self.runs.get_mut(&id) {
            r.ended_at.get_or_insert(op);
        }
    }

    /// Whether retention may have deleted `id`: it ended before a sweep,
    /// or its parent did (whose close may have ended it unseen).
    fn maybe_swept(&self, id: &ExecutionId) -> bool {
        let (Some(sweep), Some(run)) = (self.last_sweep, self.runs.get(id)) else {
            return false;
        };
        let parent_ended = || {
            run.parent
                .and_then(|p| self.runs.get(&p))
                .and_then(|p| p.ended_at)
        };
        run.ended_at.or_else(parent_ended).is_some_and(|e| e <= sweep)
    }

    /// A finishing call on `marker`'s task failed: its outcome is unknown,
    /// and so is whether its key is still held.
    fn unsure(&mut self, marker: &str) {
        self.uncertain.insert(marker.to_owned());
        self.held.retain(|_, (_, m)| m != marker);
    }

    /// `marker`'s task finished (completed or dead-lettered): its key is free.
    fn finished(&mut self, marker: &str) {
        self.held.retain(|_, (_, m)| m != marker);
    }
}

/// One seeded run of the model: `ops` operations, then quiescence.
async fn run_model(fleet: Fleet, seed: u64, ops: usize) -> (Arc<Client>, Model) {
    let mut c = Arc::new(Client::new(fleet.topology(), PoolOptions::default()).expect("a client"));
    let declared = c
        .admin()
        .declare_workflow(
            WORKFLOW,
            json!({"quota": {"key": "input.tenant", "max_active_executions": 1_000_000}}),
        )
        .await;
    assert!(declared.is_complete(), "{:?}", declared.failed);
    // Ended runs are kept a minute: the sweeps (op_sweep) delete those of
    // earlier seeds and, in the long form, of this one.
    let retention = c.admin().set_retention(json!({"executions": "1m"})).await;
    assert!(retention.is_complete(), "{:?}", retention.failed);
    let mut relay = RelayProcess::spawn(fleet);
    let mut rng = Rng::new(seed);
    let mut m = Model::default();
    // One shard stopped for a stretch of operations, once per run.
    let outage_at = ops / 3 + rng.below((ops / 3).max(1) as u64) as usize;
    let outage_shard = rng.below(u64::from(SHARDS)) as u16;
    let mut down: Option<(u16, usize)> = None;
    for op in 0..ops {
        if op == outage_at {
            fleet.own(&["stop-one", &outage_shard.to_string()]);
            down = Some((outage_shard, op + 8));
            m.outage = true;
            m.log.push(format!("{op}: stop shard {outage_shard}"));
        }
        if let Some((shard, until_op)) = down
            && op == until_op
        {
            fleet.own(&["start-one", &shard.to_string()]);
            down = None;
            m.outage = false;
            m.log.push(format!("{op}: start shard {shard}"));
        }
        step(&mut c, &mut rng, &mut m, op, seed, &mut relay, fleet).await;
    }
    if let Some((shard, _)) = down {
        fleet.own(&["start-one", &shard.to_string()]);
    }
    relay.kill().await;
    let mut relay = RelayProcess::spawn(fleet);
    end_everything(fleet, &c, &mut m, ops).await;
    finish_tasks(&c, &mut m).await;
    quiesce(fleet, &c, &m).await;
    relay.kill().await;
    (c, m)
}

/// Ends every run still live, children first; once every child's end has
/// settled (the relay's backlog is empty), the parents, each end
/// acknowledged. A child the relay has yet to start is waited for.
async fn end_everything(fleet: Fleet, c: &Client, m: &mut Model, op: usize) {
    let (children, roots): (Vec<_>, Vec<_>) =
        m.live().into_iter().partition(|id| m.runs[id].parent.is_some());
    end_runs(c, m, op, children).await;
    settle(fleet).await;
    for id in end_runs(c, m, op, roots).await {
        m.settled_parents.insert(id);
    }
}

/// Ends `runs`; those it ended.
async fn end_runs(c: &Client, m: &mut Model, op: usize, runs: Vec<ExecutionId>) -> Vec<ExecutionId> {
    let mut out = Vec::new();
    for id in runs {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while c.get_execution(id).await.ok().flatten().is_none() {
            if m.maybe_swept(&id) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{id} never resolved\noperations:\n{}",
                m.log.join("\n")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A shard just restarted may still be short-circuited: retryable
        // refusals are asked again (conditions, not sleeps, end the wait).
        let mut outcome = None;
        until("a run's final end", Duration::from_secs(60), async || {
            match c.complete_execution(id, json!({"final": true})).await {
                Err(e) if e.is_retryable() => false,
                other => {
                    outcome = Some(other);
                    true
                }
            }
        })
        .await;
        // `false`: it ended meanwhile (its parent's parent_close); unknown:
        // retention deleted it, which the model allows.
        let ended = match outcome {
            Some(Ok(ended)) => ended,
            Some(Err(ClientError::UnknownExecution { .. })) if m.maybe_swept(&id) => false,
            Some(Err(e)) => panic!("completing {id}: {e}\noperations:\n{}", m.log.join("\n")),
            None => false,
        };
        if ended {
            m.ended(id, op);
            out.push(id);
        }
        m.log.push(format!("{op}: final end {id}: {ended}"));
    }
    out
}

/// One operation; what the API acknowledged goes into the model.
async fn step(
    c: &mut Arc<Client>,
    rng: &mut Rng,
    m: &mut Model,
    op: usize,
    seed: u64,
    relay: &mut RelayProcess,
    fleet: Fleet,
) {
    let live = m.live();
    let roots: Vec<ExecutionId> = live
        .iter()
        .copied()
        .filter(|id| m.runs[id].parent.is_none())
        .collect();
    let kind = rng.below(120);
    *m.stats
        .entry(match kind {
            0..=17 => "starts",
            18..=31 => "children",
            32..=45 => "ends",
            46..=52 => "cancels",
            53..=67 => "signals",
            68..=73 => "continues",
            74..=87 => "move attempts",
            88..=93 => "erasures",
            94 => "cli moves killed",
            95..=96 => "relay kills",
            97..=104 => "enqueues",
            105..=114 => "work",
            115..=116 => "sweeps",
            _ => "drain steps",
        })
        .or_default() += 1;
    let line = match kind {
        0..=17 => Some(op_start(c, rng, m, seed).await),
        18..=31 => op_child(c, rng, m, &roots, seed).await,
        32..=45 => op_end(c, rng, m, &live, op).await,
        46..=52 => op_cancel(c, rng, m, &live, op).await,
        53..=67 => op_signal(c, rng, m, &live, op, seed).await,
        68..=73 => op_continue(c, rng, m, &roots, op).await,
        74..=87 => op_move(c, rng, m, &live).await,
        88..=93 => op_erase(c, rng, m).await,
        94 => op_cli_move_killed(c, rng, m, fleet).await,
        97..=104 => Some(op_enqueue(c, rng, m, &live, seed).await),
        105..=114 => Some(op_work(c, rng, m).await),
        115..=116 => Some(op_sweep(c, m, op).await),
        117.. => op_drain(c, rng, m, fleet, seed).await,
        _ => {
            relay.kill().await;
            *relay = RelayProcess::spawn(fleet);
            Some("relay killed and restarted".to_owned())
        }
    };
    if let Some(line) = line {
        m.log.push(format!("{op}: {line}"));
    }
}

async fn op_start(c: &Client, rng: &mut Rng, m: &mut Model, seed: u64) -> String {
    let wid = m.fresh("w", seed);
    let tenant = TENANTS[rng.below(3) as usize];
    let input = json!({"tenant": tenant, "card": format!("secret-{wid}")});
    match c
        .start_workflow(
            WORKFLOW,
            &wid,
            input,
            StartOptions::new().placement(Placement::Auto),
        )
        .await
    {
        Ok(s) => {
            m.runs.insert(
                s.execution_id,
                Run {
                    name: WORKFLOW.into(),
                    workflow_id: wid.clone(),
                    parent: None,
                    ended_at: None,
                },
            );
            format!("start {wid} -> {} on {}", s.execution_id, s.shard)
        }
        Err(e) => format!("start {wid}: {e}"),
    }
}

async fn op_child(
    c: &Client,
    rng: &mut Rng,
    m: &mut Model,
    roots: &[ExecutionId],
    seed: u64,
) -> Option<String> {
    let parent = m.pick(rng, roots)?;
    let wid = m.fresh("c", seed);
    let placement = match rng.below(3) {
        0 => ChildPlacement::ParentShard,
        1 => ChildPlacement::Shard(sid(rng.below(u64::from(SHARDS)) as u16)),
        _ => ChildPlacement::Distributed,
    };
    let input = json!({"tenant": "t-a", "card": format!("secret-{wid}")});
    Some(
        match c
            .start_child(parent, WORKFLOW, &wid, input, placement.clone())
            .await
        {
            Ok(s) => {
                m.runs.insert(
                    s.child_id,
                    Run {
                        name: WORKFLOW.into(),
                        workflow_id: wid.clone(),
                        parent: Some(parent),
                        ended_at: None,
                    },
                );
                format!(
                    "child {wid} of {parent} ({placement:?}) -> {} on {}",
                    s.child_id, s.shard
                )
            }
            Err(e) => format!("child {wid} of {parent}: {e}"),
        },
    )
}

async fn op_end(c: &Client, rng: &mut Rng, m: &mut Model, live: &[ExecutionId], op: usize) -> Option<String> {
    let id = m.pick(rng, live)?;
    let result = if rng.below(4) == 0 {
        c.fail_execution(id, "model failure").await
    } else {
        c.complete_execution(id, json!({"op": op})).await
    };
    if let Ok(true) = result {
        m.ended(id, op);
    }
    Some(format!("end {id}: {result:?}"))
}

async fn op_cancel(
    c: &Client,
    rng: &mut Rng,
    m: &mut Model,
    live: &[ExecutionId],
    op: usize,
) -> Option<String> {
    let id = m.pick(rng, live)?;
    let r = m.runs[&id].clone();
    if rng.below(2) == 0 || r.parent.is_some() {
        let result = c.cancel_execution(id, Some("model")).await;
        if let Ok(true) = result {
            m.ended(id, op);
        }
        return Some(format!("cancel {id}: {result:?}"));
    }
    let result = c.cancel_by_key(&r.name, &r.workflow_id, Some("model")).await;
    if let Ok(ByKey::Delivered { execution_id, .. }) = &result {
        m.ended(*execution_id, op);
    }
    Some(format!("cancel by key {}: {result:?}", r.workflow_id))
}

async fn op_signal(
    c: &Client,
    rng: &mut Rng,
    m: &mut Model,
    live: &[ExecutionId],
    op: usize,
    seed: u64,
) -> Option<String> {
    let id = m.pick(rng, live)?;
    let r = m.runs[&id].clone();
    let signal_id = m.fresh("s", seed);
    if rng.below(2) == 0 || r.parent.is_some() {
        let result = c.signal(id, "poke", json!({"op": op}), Some(&signal_id)).await;
        if let Ok(true) = result {
            m.signals.insert(signal_id.clone(), id);
        }
        return Some(format!("signal {id} {signal_id}: {result:?}"));
    }
    let result = c
        .signal_by_key(
            &r.name,
            &r.workflow_id,
            "poke",
            json!({"op": op}),
            Some(&signal_id),
        )
        .await;
    if let Ok(ByKey::Delivered { execution_id, .. }) = result {
        m.signals.insert(signal_id.clone(), execution_id);
    }
    Some(format!("signal by key {} {signal_id}: {result:?}", r.workflow_id))
}

async fn op_continue(
    c: &Client,
    rng: &mut Rng,
    m: &mut Model,
    roots: &[ExecutionId],
    op: usize,
) -> Option<String> {
    let id = m.pick(rng, roots)?;
    Some(
        match c
            .continue_as_new(id, json!({"tenant": "t-b", "card": "secret-next"}))
            .await
        {
            Ok(next) => {
                let r = m.runs[&id].clone();
                m.ended(id, op);
                m.runs.insert(next, Run { ended_at: None, ..r });
                format!("continue {id} -> {next}")
            }
            Err(e) => format!("continue {id}: {e}"),
        },
    )
}

async fn op_move(c: &Client, rng: &mut Rng, m: &mut Model, live: &[ExecutionId]) -> Option<String> {
    let id = m.pick(rng, live)?;
    let to = sid(rng.below(u64::from(SHARDS)) as u16);
    Some(match c.get_execution(id).await {
        Ok(Some(e)) if e.shard != to => {
            let outcome = c.protocol().move_execution(e.shard, id, to).await;
            let brief = match &outcome {
                Ok(MoveOutcome::Moved { .. }) => {
                    *m.stats.entry("moves").or_default() += 1;
                    "moved".to_owned()
                }
                other => format!("{other:?}"),
            };
            format!("move {id} {} -> {to}: {brief}", e.shard)
        }
        other => format!("move {id}: not moved ({:?})", other.map(|e| e.map(|e| e.shard))),
    })
}

/// `sheaf rebalance --limit 1` SIGKILLed after a random phase of its move,
/// then `rebalance_resume` until nothing is open (it takes the move over
/// once the killed mover's 5 s lease lapses). Not while a shard is down.
async fn op_cli_move_killed(c: &Client, rng: &mut Rng, m: &mut Model, fleet: Fleet) -> Option<String> {
    if m.outage {
        return None;
    }
    let from = rng.below(u64::from(SHARDS)) as u16;
    let to = (from + 1 + rng.below(u64::from(SHARDS) - 1) as u16) % SHARDS;
    let (from_s, to_s) = (from.to_string(), to.to_string());
    let args = ["rebalance", "--from", &from_s, "--to", &to_s, "--limit", "1"];
    let (phase, status) = killed_cli(rng, fleet, m, &args);
    let resumed = resume(c, from).await;
    Some(format!(
        "cli move {from} -> {to} killed after {phase} ({status}); resumed after {resumed} looks"
    ))
}

/// Runs the CLI (`args`, a 5 s lease) under the model's topology,
/// SIGKILLed right after a random phase of its first move commits: that
/// phase, and how it ended.
fn killed_cli(
    rng: &mut Rng,
    fleet: Fleet,
    m: &Model,
    args: &[&str],
) -> (&'static str, std::process::ExitStatus) {
    let phase = ["begun", "staged", "verified", "committed", "activated"][rng.below(5) as usize];
    let status = std::process::Command::new(sheaf_tests::cli_binary())
        .args(["--actor", "fleet-model"])
        .args(args)
        .args(["--lease", "5"])
        .envs(writable_env(fleet, m))
        .env("SHEAF_SHARDS", fleet.spec())
        .env_remove("SHEAF_TOPOLOGY_DIGEST")
        .env("SHEAF_TEST_KILL_AFTER", phase)
        .output()
        .expect("the CLI runs")
        .status;
    (phase, status)
}

/// `SHEAF_WRITABLE` as the model's topology has it.
fn writable_env(fleet: Fleet, m: &Model) -> Vec<(&'static str, String)> {
    m.draining
        .map(|d| {
            let ids: Vec<String> = fleet.writable_without(d).iter().map(u32::to_string).collect();
            ("SHEAF_WRITABLE", ids.join(","))
        })
        .into_iter()
        .collect()
}

/// `rebalance_resume` until nothing is open on `from` (it takes a killed
/// mover's move over once its 5 s lease lapses); how many looks it took.
async fn resume(c: &Client, from: u16) -> usize {
    let mut resumed = 0;
    until(
        "the killed move to be resumed",
        Duration::from_secs(60),
        async || match c.admin().migrations(sid(from), true, 100).await {
            Ok(open) if open.is_empty() => true,
            _ => {
                resumed += 1;
                let _ = c.admin().rebalance_resume(sid(from)).await;
                false
            }
        },
    )
    .await;
    resumed
}

/// A task: standalone, keyed (a small pool of idempotency keys, so keys
/// are met again, across drains too) or of a live run.
async fn op_enqueue(c: &Client, rng: &mut Rng, m: &mut Model, live: &[ExecutionId], seed: u64) -> String {
    let (mut execution, mut key) = (None, None);
    match rng.below(10) {
        0..=2 => execution = m.pick(rng, live),
        3..=5 => {
            // Half the time a key the model knows held: a producer's retry.
            let held: Vec<&String> = m.held.keys().collect();
            key = Some(match rng.below(2) {
                0 if !held.is_empty() => held[rng.below(held.len() as u64) as usize].clone(),
                _ => format!("k-{seed:x}-{}", rng.below(6)),
            });
        }
        _ => {}
    }
    enqueue_task(c, m, seed, execution, key).await
}

/// Enqueues a task (of `execution`, or with idempotency `key`): a keyed
/// one the model knows held must come back as its holder.
async fn enqueue_task(
    c: &Client,
    m: &mut Model,
    seed: u64,
    execution: Option<ExecutionId>,
    key: Option<String>,
) -> String {
    let marker = m.fresh("t", seed);
    let mut options = EnqueueOptions::new().max_attempts(3);
    if let Some(id) = execution {
        options = options.execution(id);
    }
    if let Some(k) = &key {
        options = options.idempotency_key(k.clone());
    }
    let e = match c.enqueue(TASKS, json!({ "t": marker }), options).await {
        Ok(e) => e,
        Err(err) => {
            // It may exist: whatever becomes of it is no evidence.
            m.unsure(&marker);
            m.tasks.insert(marker.clone(), TaskRec { execution });
            return format!("enqueue {marker}: {err}");
        }
    };
    if let Some(k) = &key
        && let Some((held, _)) = m.held.get(k)
    {
        if *held == e.task_id {
            return format!("enqueue {marker} with key {k}: held by {held} on {}", e.shard);
        }
        m.doubled.push(format!(
            "key {k} held by unfinished {held} made {} on {}",
            e.task_id, e.shard
        ));
    }
    if let Some(k) = key {
        m.held.insert(k, (e.task_id, marker.clone()));
    }
    m.tasks.insert(marker.clone(), TaskRec { execution });
    format!("enqueue {marker} -> {} on {}", e.task_id, e.shard)
}

fn marker_of(t: &ClaimedTask) -> String {
    t.payload
        .to_value()
        .ok()
        .and_then(|v| v.get("t").and_then(|t| t.as_str().map(str::to_owned)))
        .unwrap_or_default()
}

/// A worker's turn on one shard: claims a few tasks and completes, fails
/// (at once, three attempts then a dead letter), snoozes or releases each.
async fn op_work(c: &Client, rng: &mut Rng, m: &mut Model) -> String {
    let shard = sid(rng.below(u64::from(SHARDS)) as u16);
    let claimed = match c
        .claim(shard, TASKS, "fm-worker", 4, Duration::from_secs(20))
        .await
    {
        Ok(t) => t,
        Err(e) => return format!("claim on {shard}: {e}"),
    };
    let mut line = format!("work on {shard}:");
    for t in claimed {
        let marker = marker_of(&t);
        let outcome = match rng.below(10) {
            0..=5 => finish_one(c, m, &t, &marker).await,
            6..=7 => match c
                .fail(t.task_id, t.token, "model failure", Some(Duration::ZERO))
                .await
            {
                Ok(out) if out.dead_lettered => {
                    m.finished(&marker);
                    "dead".to_owned()
                }
                Ok(_) => "failed".to_owned(),
                Err(e) => {
                    m.unsure(&marker);
                    format!("fail: {e}")
                }
            },
            8 => format!(
                "{:?}",
                c.snooze(t.task_id, t.token, Duration::ZERO)
                    .await
                    .map(|_| "snoozed")
            ),
            _ => format!("{:?}", c.release(t.task_id, t.token).await.map(|_| "released")),
        };
        line.push_str(&format!(" {marker} {outcome};"));
    }
    line
}

/// Completes a claimed task; what the model learned.
async fn finish_one(c: &Client, m: &mut Model, t: &ClaimedTask, marker: &str) -> String {
    match c.complete(t.task_id, t.token, None).await {
        Ok(()) => {
            *m.completed.entry(marker.to_owned()).or_default() += 1;
            m.finished(marker);
            "completed".to_owned()
        }
        Err(e) => {
            m.unsure(marker);
            format!("complete: {e}")
        }
    }
}

/// A retention sweep (`maintain`) on every shard that answers.
async fn op_sweep(c: &Client, m: &mut Model, op: usize) -> String {
    m.last_sweep = Some(op);
    let mut line = "sweep:".to_owned();
    for shard in 0..SHARDS {
        let swept = c.admin().maintain(sid(shard)).await;
        let n = swept.map(|v| v.get("executions_deleted").cloned().unwrap_or_default());
        line.push_str(&format!(" {shard} {n:?};"));
    }
    line
}

/// A drain, step by step: the first step takes a shard out of the
/// writable set (the model's client follows) and runs `sheaf shard drain`
/// SIGKILLed after a random phase of its first move, then resumes that
/// move; a later step either runs the drain through again or calls it
/// off (the shard takes work again). Not while a shard is down.
async fn op_drain(
    c: &mut Arc<Client>,
    rng: &mut Rng,
    m: &mut Model,
    fleet: Fleet,
    seed: u64,
) -> Option<String> {
    if m.outage {
        return None;
    }
    let Some(leaving) = m.draining else {
        let leaving = rng.below(u64::from(SHARDS)) as u16;
        m.draining = Some(leaving);
        *c = Arc::new(Client::new(fleet.draining(leaving), PoolOptions::default()).expect("a client"));
        let (phase, status) = killed_cli(rng, fleet, m, &["shard", "drain", &leaving.to_string()]);
        let resumed = resume(c, leaving).await;
        // Producers retry the keys they hold: some are homed on the shard
        // that just stopped taking work.
        let mut line = format!(
            "drain {leaving}: taken out; cli drain killed after {phase} ({status}); resumed after {resumed} looks;"
        );
        for k in m.held.keys().cloned().collect::<Vec<_>>() {
            line.push_str(&format!(" {};", enqueue_task(c, m, seed, None, Some(k)).await));
        }
        return Some(line);
    };
    if rng.below(2) == 0 {
        // Calling a drain off gives the shard its keys back, as adding a
        // shard does: the runbook waits until no keyed task is held
        // (docs/residence.md, "The former home").
        if !m.held.is_empty() {
            return Some(format!(
                "drain {leaving}: not called off, {} keys held",
                m.held.len()
            ));
        }
        *c = Arc::new(Client::new(fleet.topology(), PoolOptions::default()).expect("a client"));
        m.draining = None;
        return Some(format!("drain {leaving}: called off"));
    }
    Some(
        match c
            .admin()
            .drain(sid(leaving), &RebalanceOptions::default(), |_, _| {})
            .await
        {
            Ok(d) => {
                let stragglers = d.stragglers().count();
                *m.stats.entry("drained runs").or_default() += d.moves.len() - stragglers;
                format!("drain {leaving}: {} considered, {stragglers} stay", d.moves.len())
            }
            Err(e) => format!("drain {leaving}: {e}"),
        },
    )
}

async fn op_erase(c: &Client, rng: &mut Rng, m: &mut Model) -> Option<String> {
    let ended: Vec<ExecutionId> = m
        .runs
        .iter()
        .filter(|(id, r)| r.ended_at.is_some() && !m.erased.contains(id))
        .map(|(id, _)| *id)
        .collect();
    let id = m.pick(rng, &ended)?;
    m.erasing.insert(id);
    let result = c.admin().erase_payloads(id).await;
    if result.is_ok() {
        m.erased.insert(id);
    }
    Some(format!(
        "erase {id}: {}",
        result.map(|_| "ok".to_owned()).unwrap_or_else(|e| e.to_string())
    ))
}

/// Every shard, as a superuser connection.
async fn dbs(fleet: Fleet) -> Vec<(ShardId, tokio_postgres::Client)> {
    let t = fleet.topology();
    let mut out = Vec::new();
    for shard in t.shards() {
        out.push((shard.id, connect(shard).await));
    }
    out
}

/// Claims and completes every task left, on every shard, until none is
/// left anywhere (a failed one is due at once; a lease lost in a crash
/// lapses in 20 s).
async fn finish_tasks(c: &Client, m: &mut Model) {
    until("every task to finish", Duration::from_secs(120), async || {
        for shard in 0..SHARDS {
            let Ok(claimed) = c
                .claim(sid(shard), TASKS, "fm-final", 100, Duration::from_secs(20))
                .await
            else {
                return false;
            };
            for t in &claimed {
                let marker = marker_of(t);
                let line = finish_one(c, m, t, &marker).await;
                m.log.push(format!("final: {marker} {line}"));
            }
        }
        c.admin()
            .queue_stats(TASKS)
            .await
            .into_result()
            .is_ok_and(|stats| {
                stats
                    .values()
                    .all(|s| s.ready + s.scheduled + s.running + s.waiting == 0)
            })
    })
    .await;
}

/// Waits until nothing is left in flight: every relay row and outbox row
/// settled, no move open.
async fn settle(fleet: Fleet) {
    until("the fleet to settle", Duration::from_secs(120), async || {
        for (_, db) in dbs(fleet).await {
            let busy: i64 = db
                .query_one(
                    "SELECT (SELECT count(*) FROM sheaf.cross_shard_children) \
                          + (SELECT count(*) FROM sheaf.outbox WHERE state <> 'DONE') \
                          + (SELECT count(*) FROM sheaf.migrations WHERE phase NOT IN ('DONE', 'ABORTED'))",
                    &[],
                )
                .await
                .expect("the backlog")
                .get(0);
            if busy > 0 {
                return false;
            }
        }
        true
    })
    .await;
}

/// Settles the fleet; then every id resolves (but those retention may
/// have swept).
async fn quiesce(fleet: Fleet, c: &Client, m: &Model) {
    settle(fleet).await;
    for id in m.runs.keys().filter(|id| !m.maybe_swept(id)) {
        assert!(
            c.get_execution(*id).await.expect("a read").is_some(),
            "{id} does not resolve"
        );
    }
}

/// Live copies (not seals, not staged) of every execution, per shard.
async fn live_copies(fleet: Fleet) -> Copies {
    let mut out: Copies = BTreeMap::new();
    for (shard, db) in dbs(fleet).await {
        for row in db
            .query(
                "SELECT id, state, workflow_name, workflow_id FROM sheaf.executions \
                 WHERE state NOT IN ('MIGRATED', 'MIGRATING')",
                &[],
            )
            .await
            .expect("executions")
        {
            out.entry(row.get(0))
                .or_default()
                .push((shard, row.get(1), row.get(2), row.get(3)));
        }
    }
    out
}

/// Each invariant's violations (empty: it holds).
struct Checks {
    children: Vec<String>,
    copies: Vec<String>,
    signals: Vec<String>,
    erasure: Vec<String>,
    quota: Vec<String>,
    ends: Vec<String>,
    tasks: Vec<String>,
}

impl Checks {
    fn all(&self) -> Vec<String> {
        [
            &self.children,
            &self.copies,
            &self.signals,
            &self.erasure,
            &self.quota,
            &self.ends,
            &self.tasks,
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect()
    }
}

type Copies = BTreeMap<uuid::Uuid, Vec<(ShardId, String, String, String)>>;
type Dbs = [(ShardId, tokio_postgres::Client)];

fn active(state: &str) -> bool {
    matches!(state, "RUNNING" | "SUSPENDED" | "PAUSED")
}

async fn check(fleet: Fleet, m: &Model) -> Checks {
    let copies = live_copies(fleet).await;
    let dbs = dbs(fleet).await;
    Checks {
        children: check_children(m, &copies, &dbs).await,
        copies: check_copies(&copies),
        signals: check_signals(m, &dbs).await,
        erasure: check_erasure(m, &dbs).await,
        quota: check_quota(&dbs).await,
        ends: check_ends(m, &copies),
        tasks: check_tasks(m, &dbs).await,
    }
}

/// Counts of `sql`'s (key, count) rows over every shard.
async fn counts(dbs: &Dbs, sql: &str) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for (_, db) in dbs {
        for row in db.query(sql, &[]).await.expect("counting events") {
            // An erased run's events keep their types, not their payloads.
            if let Some(key) = row.get::<_, Option<String>>(0) {
                *out.entry(key).or_default() += row.get::<_, i64>(1);
            }
        }
    }
    out
}

/// Every child's end reaches a running parent exactly once (a parent that
/// ended: at most once).
async fn check_children(m: &Model, copies: &Copies, dbs: &Dbs) -> Vec<String> {
    let ends = counts(
        dbs,
        "SELECT v.execution_id::text || ' ' || (v.payload->>'child_id'), count(*) FROM sheaf.events v \
         JOIN sheaf.executions e ON e.id = v.execution_id AND e.state NOT IN ('MIGRATED', 'MIGRATING') \
         WHERE v.event_type IN ('ChildCompleted', 'ChildFailed', 'ChildCancelled', 'ChildTerminated', \
                                'ChildTimedOut', 'ChildContinuedAsNew') GROUP BY 1",
    )
    .await;
    let mut out = Vec::new();
    for (id, run) in &m.runs {
        let Some(parent) = run.parent else { continue };
        let n = ends
            .get(&format!("{} {id}", parent.as_uuid()))
            .copied()
            .unwrap_or(0);
        // A parent still running, or ended only after every child's end
        // had settled, has each ended child's end; a child retention swept
        // had ended.
        let parent_waited = m.settled_parents.contains(&parent)
            || copies
                .get(&parent.as_uuid())
                .is_some_and(|c| c.iter().any(|(_, state, ..)| active(state)));
        let child_ended = copies.get(&id.as_uuid()).map_or(m.maybe_swept(id), |c| {
            c.iter().all(|(_, state, ..)| !active(state))
        });
        if n > 1 || (parent_waited && child_ended && n != 1) {
            out.push(format!(
                "child {id} of {parent}: {n} end events (parent waited: {parent_waited})"
            ));
        }
    }
    out
}

/// No execution live on two shards; no business key with two live runs.
fn check_copies(copies: &Copies) -> Vec<String> {
    let mut out = Vec::new();
    let mut keys: BTreeMap<(String, String), Vec<uuid::Uuid>> = BTreeMap::new();
    for (id, held) in copies {
        if held.len() > 1 {
            out.push(format!(
                "{id} is live on {:?}",
                held.iter().map(|h| h.0).collect::<Vec<_>>()
            ));
        }
        for (_, state, name, wid) in held {
            if active(state) {
                keys.entry((name.clone(), wid.clone())).or_default().push(*id);
            }
        }
    }
    for (key, ids) in keys {
        if ids.len() > 1 {
            out.push(format!("business key {key:?} has live runs {ids:?}"));
        }
    }
    out
}

/// Every signal reported delivered is in exactly one history, once.
async fn check_signals(m: &Model, dbs: &Dbs) -> Vec<String> {
    let seen = counts(
        dbs,
        "SELECT v.payload->>'signal_id', count(*) FROM sheaf.events v \
         JOIN sheaf.executions e ON e.id = v.execution_id AND e.state NOT IN ('MIGRATED', 'MIGRATING') \
         WHERE v.event_type = 'SignalReceived' AND v.payload ? 'signal_id' GROUP BY 1",
    )
    .await;
    m.signals
        .iter()
        .filter_map(|(id, to)| {
            let n = seen.get(id).copied().unwrap_or(0);
            // An erased run's signal events no longer name their ids; a
            // swept run's are gone.
            (n != 1 && !(n == 0 && (m.erasing.contains(to) || m.maybe_swept(to))))
                .then(|| format!("signal {id} is in {n} histories"))
        })
        .collect()
}

/// An erased payload is gone from every shard.
async fn check_erasure(m: &Model, dbs: &Dbs) -> Vec<String> {
    let mut out = Vec::new();
    for id in &m.erased {
        let marker = format!("%secret-{}%", m.runs[id].workflow_id);
        for (shard, db) in dbs {
            let left: bool = db
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM sheaf.executions WHERE id = $1 AND input::text LIKE $2) \
                        OR EXISTS (SELECT 1 FROM sheaf.events WHERE execution_id = $1 AND payload::text LIKE $2)",
                    &[&id.as_uuid(), &marker],
                )
                .await
                .expect("payloads")
                .get(0);
            if left {
                out.push(format!("erased {id} still on shard {shard}"));
            }
        }
    }
    out
}

/// Quota counters equal a recount, on every shard.
async fn check_quota(dbs: &Dbs) -> Vec<String> {
    let mut out = Vec::new();
    for (shard, db) in dbs {
        for tenant in TENANTS {
            let read = async |sql: &str| -> (i64, i64) {
                db.query_opt(sql, &[&tenant])
                    .await
                    .expect("quota usage")
                    .map_or((0, 0), |r| (r.get(0), r.get(1)))
            };
            let a = read("SELECT active_executions, history_bytes FROM sheaf.quota_usage($1)").await;
            let b = read("SELECT active_executions, history_bytes FROM sheaf.quota_recompute($1)").await;
            if a != b {
                out.push(format!(
                    "shard {shard} tenant {tenant}: counted {a:?}, recounted {b:?}"
                ));
            }
        }
    }
    out
}

/// Every run the model ended has ended.
fn check_ends(m: &Model, copies: &Copies) -> Vec<String> {
    m.runs
        .iter()
        .filter(|(id, run)| {
            run.ended_at.is_some()
                && copies
                    .get(&id.as_uuid())
                    .is_some_and(|c| c.iter().any(|(_, state, ..)| active(state)))
        })
        .map(|(id, _)| format!("{id} was ended and is live"))
        .collect()
}

/// No acknowledged task lost or done twice: a standalone task the model
/// is sure of was completed once or is one dead letter; a run's task
/// (which ends with its run) at most that; no keyed enqueue made a second
/// task while the first held the key; none is left unfinished.
async fn check_tasks(m: &Model, dbs: &Dbs) -> Vec<String> {
    let dead = counts(
        dbs,
        "SELECT payload->>'t', count(*) FROM sheaf.dead_letters WHERE queue = 'fm-tasks' GROUP BY 1",
    )
    .await;
    let left = counts(
        dbs,
        "SELECT payload->>'t', count(*) FROM sheaf.tasks WHERE queue = 'fm-tasks' GROUP BY 1",
    )
    .await;
    let mut out = m.doubled.clone();
    for (marker, task) in &m.tasks {
        let done = m.completed.get(marker).copied().unwrap_or(0);
        let dead = dead.get(marker).copied().unwrap_or(0);
        let kept = done + usize::try_from(dead).unwrap_or(usize::MAX);
        if kept > 1 || (task.execution.is_none() && !m.uncertain.contains(marker) && kept != 1) {
            out.push(format!(
                "task {marker}: completed {done} times, {dead} dead letters"
            ));
        }
    }
    out.extend(left.keys().map(|marker| format!("task {marker} left unfinished")));
    out
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("SHEAF_MODEL_SEED") {
        return vec![seed.parse().expect("SHEAF_MODEL_SEED is a number")];
    }
    if let Ok(range) = std::env::var("SHEAF_MODEL_SEEDS") {
        let (a, b) = range.split_once("..").expect("SHEAF_MODEL_SEEDS is a..b");
        return (a.parse().expect("a number")..b.parse().expect("a number")).collect();
    }
    vec![11, 12, 13]
}

fn ops() -> usize {
    std::env::var("SHEAF_MODEL_OPS").map_or(250, |n| n.parse().expect("SHEAF_MODEL_OPS is a number"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fleet_keeps_its_promises_under_random_operations() {
    for seed in seeds() {
        let fleet = model_fleet();
        let (_, m) = run_model(fleet, seed, ops()).await;
        let violations = check(fleet, &m).await.all();
        assert!(
            violations.is_empty(),
            "seed {seed} (replay: SHEAF_MODEL_SEED={seed}): {} violation(s):\n{}\noperations:\n{}",
            violations.len(),
            violations.join("\n"),
            m.log.join("\n")
        );
        eprintln!(
            "fleet model: seed {seed}, {} runs, {} signals delivered, {} erased, one shard stopped and started; \
             {:?}: every invariant holds",
            m.runs.len(),
            m.signals.len(),
            m.erased.len(),
            m.stats
        );
    }
}

/// Each check, shown to fail: a violation injected from outside
/// (out-of-protocol SQL as the shards' owner), on a fleet of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_checks_catch_each_sabotage() {
    let f = SABOTAGE;
    let (_, m) = run_model(f, 7, 80).await;
    let held = check(f, &m).await.all();
    assert!(held.is_empty(), "the run itself holds: {held:?}");
    let dbs = dbs(f).await;
    let on = |shard: ShardId| &dbs.iter().find(|(s, _)| *s == shard).expect("a shard").1;
    let copies = live_copies(f).await;
    let where_live = |id: &ExecutionId| copies.get(&id.as_uuid()).map(|c| c[0].0);

    // A child's end delivered twice.
    copy_child_end(&dbs, &m).await;
    let caught = check(f, &m).await.children;
    assert!(!caught.is_empty(), "a doubled child end is caught");

    // A second live copy of a run, on another shard.
    let (id, _) = m
        .runs
        .iter()
        .find(|(id, _)| where_live(id).is_some())
        .expect("a run with a live copy");
    let home = where_live(id).expect("its shard");
    copy_run(on(home), on(sid((home.get() + 1) % SHARDS)), *id).await;
    assert!(
        !check(f, &m).await.copies.is_empty(),
        "a second live copy is caught"
    );

    // A delivered signal appended again.
    let (signal, _) = m
        .signals
        .iter()
        .find(|(_, to)| !m.erasing.contains(to) && !m.maybe_swept(to))
        .expect("a delivered signal");
    copy_event(
        &dbs,
        &format!("v.event_type = 'SignalReceived' AND v.payload->>'signal_id' = '{signal}'"),
    )
    .await;
    let caught = check(f, &m).await.signals;
    assert!(!caught.is_empty(), "a doubled signal is caught");

    // An erased payload put back, a quota counter off by one, an ended run
    // live again.
    let erased = m.erased.iter().next().expect("an erased run");
    let marker = format!("secret-{}", m.runs[erased].workflow_id);
    let put = on(where_live(erased).unwrap_or(sid(0)))
        .execute(
            "UPDATE sheaf.executions SET input = jsonb_build_object('card', $2::text) WHERE id = $1",
            &[&erased.as_uuid(), &marker],
        )
        .await
        .expect("a payload put back from outside");
    assert_eq!(put, 1, "the erased run's shard holds it");
    assert!(
        !check(f, &m).await.erasure.is_empty(),
        "an unerased payload is caught"
    );
    bump_quota(on(sid(0))).await;
    assert!(
        !check(f, &m).await.quota.is_empty(),
        "a drifted counter is caught"
    );
    let (ended, _) = m
        .runs
        .iter()
        .find(|(id, r)| r.ended_at.is_some() && where_live(id).is_some() && !m.erasing.contains(id))
        .expect("an ended run");
    on(where_live(ended).expect("its shard"))
        .execute(
            "UPDATE sheaf.executions SET state = 'SUSPENDED', closed_at = NULL WHERE id = $1",
            &[&ended.as_uuid()],
        )
        .await
        .expect("a run revived from outside");
    assert!(!check(f, &m).await.ends.is_empty(), "a revived run is caught");

    // A completed task dead-lettered too, from outside: done twice.
    dead_letter_a_completed_task(on(sid(0)), &m).await;
    assert!(
        !check(f, &m).await.tasks.is_empty(),
        "a task done twice is caught"
    );
    retire(f);
}

/// Puts a dead letter of a task the model saw completed, from outside.
async fn dead_letter_a_completed_task(db: &tokio_postgres::Client, m: &Model) {
    let (marker, _) = m
        .completed
        .iter()
        .find(|(marker, n)| **n == 1 && m.tasks.get(*marker).is_some_and(|t| t.execution.is_none()))
        .expect("a completed task");
    db.execute(
        "INSERT INTO sheaf.dead_letters (id, queue, kind, payload, priority, attempts, max_attempts, \
                                         fairness_weight, last_error, enqueued_at) \
         VALUES (gen_random_uuid(), 'fm-tasks', 'activity', jsonb_build_object('t', $1::text), 0, 1, 3, 1, \
                 'sabotage', now())",
        &[marker],
    )
    .await
    .expect("a dead letter put in from outside");
}

/// Bumps a quota counter from outside.
async fn bump_quota(db: &tokio_postgres::Client) {
    db.execute(
        "INSERT INTO sheaf.quota_usage (key, active_executions) VALUES ('t-a', 1) \
         ON CONFLICT (key) DO UPDATE SET active_executions = sheaf.quota_usage.active_executions + 1",
        &[],
    )
    .await
    .expect("a counter bumped from outside");
}

/// A damaged fleet goes: the next run starts it afresh.
fn retire(f: Fleet) {
    f.own(&["down"]);
    std::fs::remove_dir_all(format!("/tmp/sheaf-test-{}/pg{}", f.name, sheaf_tests::test_pg())).ok();
}

/// Copies run `id`'s row from one shard to another, live, from outside.
async fn copy_run(from: &tokio_postgres::Client, to: &tokio_postgres::Client, id: ExecutionId) {
    let row: serde_json::Value = from
        .query_one(
            "SELECT to_jsonb(e) FROM sheaf.executions e WHERE id = $1",
            &[&id.as_uuid()],
        )
        .await
        .expect("its row")
        .get(0);
    to.execute(
        "INSERT INTO sheaf.executions SELECT * FROM jsonb_populate_record(NULL::sheaf.executions, \
         $1::jsonb || jsonb_build_object('seq', nextval('sheaf.execution_seq'), 'state', 'RUNNING'))",
        &[&row],
    )
    .await
    .expect("a copy inserted from outside");
}

/// Copies the end of a child the model started (a start that failed during
/// the outage may have made a child the model does not know, whose ends the
/// check cannot judge).
async fn copy_child_end(dbs: &Dbs, m: &Model) {
    let known = m
        .runs
        .iter()
        .filter_map(|(id, r)| Some(format!("'{} {id}'", r.parent?.as_uuid())))
        .collect::<Vec<_>>()
        .join(", ");
    assert!(!known.is_empty(), "the model started a child");
    copy_event(
        dbs,
        &format!(
            "v.event_type = 'ChildCompleted' \
             AND v.execution_id::text || ' ' || (v.payload->>'child_id') IN ({known})"
        ),
    )
    .await;
}

/// Copies an event of a live run (not a seal's, not a staged copy's) that
/// matches `condition` (on `v`, the events) under the next seq of its
/// execution, from outside.
async fn copy_event(dbs: &Dbs, condition: &str) {
    let sql = format!(
        "SELECT v.execution_id, v.seq FROM sheaf.events v JOIN sheaf.executions e ON e.id = v.execution_id \
         AND e.state NOT IN ('MIGRATED', 'MIGRATING') WHERE {condition} LIMIT 1"
    );
    let (shard, execution, seq) = on_any(dbs, &sql).await.expect("an event to copy");
    let db = &dbs.iter().find(|(s, _)| *s == shard).expect("its shard").1;
    db.execute(
        "INSERT INTO sheaf.events (execution_id, seq, event_type, payload, bytes) \
         SELECT execution_id, (SELECT max(seq) + 1 FROM sheaf.events WHERE execution_id = $1), \
                event_type, payload, bytes FROM sheaf.events WHERE execution_id = $1 AND seq = $2",
        &[&execution, &seq],
    )
    .await
    .expect("an event copied from outside");
}

/// The first row `sql` (execution id, seq) finds on any shard.
async fn on_any(dbs: &Dbs, sql: &str) -> Option<(ShardId, uuid::Uuid, i64)> {
    for (shard, db) in dbs {
        if let Some(r) = db.query_opt(sql, &[]).await.expect("a lookup") {
            return Some((*shard, r.get(0), r.get(1)));
        }
    }
    None
}
