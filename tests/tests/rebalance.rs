//! Rebalancing quiescent executions between real shards (the suite's own
//! three: a whole-shard rebalance would move the other suites' runs). One
//! test at a time. A dry run names every blocker and changes nothing; a
//! rebalance moves the rest with their histories byte for byte, ids keep
//! resolving (and calls follow the seal), a timer due during the move fires
//! once on the new shard, signals and cancels reach the live copy, usage
//! and listings count each run once. A move back and a chain of moves; a
//! run that changes after verification is not cut over; and the `sheaf`
//! CLI killed with SIGKILL after each phase, then resumed (by
//! `rebalance-resume`, or by a worker's auto-resume after the cutover):
//! exactly one authoritative copy each time.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;
use sheaf_driver::protocol::Steps;
use sheaf_driver::{
    Client, ExecutionFilter, ExecutionId, ExecutionState, GroupBy, MoveOutcome, MutexKey, Placement,
    PoolOptions, RebalanceOptions, Resolution, ShardId, SortOrder, StartOptions, TaskContext, TaskDone,
    Topology, Worker, WorkerOptions,
};
use sheaf_tests::unique;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn spec() -> &'static str {
    static SPEC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SPEC.get_or_init(|| {
        let out = sheaf_tests::own_shards("rebalance", 24600, &["up", "--count", "3", "--no-install"]);
        out.lines().collect::<Vec<_>>().join(",")
    })
}

fn client(actor: &str) -> Arc<Client> {
    let topology = Topology::parse(spec()).expect("a topology");
    let options = PoolOptions::default().actor(Some(actor.to_owned()));
    Arc::new(Client::new(topology, options).expect("a client"))
}

fn sid(n: u16) -> ShardId {
    sheaf_tests::sid(n)
}

async fn sql(shard: ShardId) -> tokio_postgres::Client {
    let topology = Topology::parse(spec()).expect("a topology");
    sheaf_tests::connect(topology.get(shard).expect("a shard")).await
}

async fn declare(c: &Client, name: &str, queue: &str) {
    let r = c.admin().declare_workflow(name, json!({ "queue": queue })).await;
    assert!(r.failed.is_empty(), "{:?}", r.failed);
}

async fn start_on(c: &Client, shard: ShardId, name: &str) -> ExecutionId {
    c.start_workflow(
        name,
        &unique("rb"),
        json!({"big": "x".repeat(1024)}),
        StartOptions::new().placement(Placement::Shard(shard)),
    )
    .await
    .expect("a start")
    .execution_id
}

/// Every event of `id` as (seq, type, payload text).
async fn history(c: &Client, id: ExecutionId) -> Vec<(i64, String, String)> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = c.history(id, after, 1000).await.expect("a history page");
        out.extend(
            page.events
                .iter()
                .map(|e| (e.seq, e.event_type.to_string(), e.payload.as_str().to_owned())),
        );
        match page.next_after {
            Some(n) => after = n,
            None => return out,
        }
    }
}

/// What `shard` holds of `id`: (state, forwarding pointer, former shards).
async fn held(shard: ShardId, id: ExecutionId) -> Option<(String, Option<i32>, Vec<i32>)> {
    let db = sql(shard).await;
    db.query_opt(
        "SELECT state, migrated_to_shard, migrated_from_shards FROM sheaf.executions WHERE id = $1",
        &[&id.as_uuid()],
    )
    .await
    .expect("reading an execution")
    .map(|r| (r.get(0), r.get(1), r.get(2)))
}

/// Rows of `id`'s events on `shard` itself (a seal's frozen history).
async fn events_on(shard: ShardId, id: ExecutionId, kind: &str) -> i64 {
    sql(shard)
        .await
        .query_one(
            "SELECT count(*) FROM sheaf.events WHERE execution_id = $1 AND event_type LIKE $2",
            &[&id.as_uuid(), &kind],
        )
        .await
        .expect("counting events")
        .get(0)
}

/// The shards where `id` is authoritative (RUNNING, SUSPENDED, PAUSED or ended).
async fn live_on(id: ExecutionId) -> Vec<ShardId> {
    let mut out = Vec::new();
    for n in 0..3 {
        if let Some((state, ..)) = held(sid(n), id).await
            && state != "MIGRATED"
            && state != "MIGRATING"
        {
            out.push(sid(n));
        }
    }
    out
}

async fn moved(c: &Client, from: ShardId, id: ExecutionId, to: ShardId) {
    match c.protocol().move_execution(from, id, to).await {
        Ok(MoveOutcome::Moved { .. }) => {}
        other => panic!("moving {id} {from} -> {to}: {other:?}"),
    }
}

/// Runs on shard 0, movable and not: three that may move (one with a
/// 20-event 1 KB history, one parked on a timer an hour away, one on a
/// timer due in 3 s) and four blocked.
struct Fleet {
    name: String,
    queue: String,
    plain: ExecutionId,
    parked: ExecutionId,
    timer: ExecutionId,
    paused: ExecutionId,
    claimed: ExecutionId,
    locking: ExecutionId,
    drifted: ExecutionId,
    held_task: sheaf_driver::ClaimedTask,
}

impl Fleet {
    fn movable(&self) -> [ExecutionId; 3] {
        [self.plain, self.parked, self.timer]
    }
}

async fn suspended_on(c: &Client, a: ShardId, name: &str, secs: u64) -> ExecutionId {
    let id = start_on(c, a, name).await;
    c.suspend_execution(id, Some(SystemTime::now() + Duration::from_secs(secs)))
        .await
        .expect("suspended");
    id
}

async fn fleet_on_a(c: &Client, a: ShardId) -> Fleet {
    let name = unique("rb-wf");
    let queue = unique("rb-q");
    declare(c, &name, &queue).await;
    let busy = unique("rb-busy");
    let busy_q = unique("rb-busy-q");
    declare(c, &busy, &busy_q).await;
    let drift = unique("rb-drift");
    sql(a)
        .await
        .execute(
            "SELECT sheaf.declare_workflow($1, '{\"queue\": \"rb-drift-q\"}')",
            &[&drift],
        )
        .await
        .expect("a policy on one shard");
    let plain = start_on(c, a, &name).await;
    for n in 0..20 {
        c.append_event(plain, "Note", json!({"n": n, "pad": "y".repeat(1024)}))
            .await
            .expect("an event");
    }
    let parked = suspended_on(c, a, &name, 3600).await;
    let timer = suspended_on(c, a, &name, 3).await;
    let paused = start_on(c, a, &name).await;
    c.admin().pause_execution(paused).await.expect("paused");
    let claimed = start_on(c, a, &busy).await;
    let mut held_task = c
        .claim(a, &busy_q, "rb", 1, Duration::from_secs(60))
        .await
        .expect("a claim");
    let locking = start_on(c, a, &name).await;
    c.mutex_acquire(
        &MutexKey::on_shard("rb-lock", a),
        locking.as_uuid(),
        Duration::from_secs(60),
    )
    .await
    .expect("a mutex");
    let drifted = start_on(c, a, &drift).await;
    Fleet {
        name,
        queue,
        plain,
        parked,
        timer,
        paused,
        claimed,
        locking,
        drifted,
        held_task: held_task.pop().expect("a claimed task"),
    }
}

/// The dry run names every blocker and records nothing.
async fn dry_run_explains_everything(c: &Client, f: &Fleet, a: ShardId, b: ShardId) {
    let dry = c
        .admin()
        .rebalance(a, b, &RebalanceOptions::default().dry_run(true), |_, _| {})
        .await
        .expect("a dry run");
    let outcome = |id: ExecutionId| {
        dry.iter()
            .find(|r| r.id == id)
            .map(|r| r.outcome.clone())
            .unwrap_or_else(|| panic!("{id} is not in the dry run"))
    };
    for id in f.movable() {
        assert!(
            matches!(outcome(id), Ok(MoveOutcome::Moved { .. })),
            "{id}: {:?}",
            outcome(id)
        );
    }
    for (id, blocker) in [
        (f.paused, "not_running"),
        (f.claimed, "task_claimed"),
        (f.locking, "mutex"),
        (f.drifted, "target_config_differs"),
    ] {
        match outcome(id) {
            Ok(MoveOutcome::Blocked(b)) => assert!(b.iter().any(|x| x == blocker), "{id}: {b:?}"),
            other => panic!("{id} should be blocked by {blocker}: {other:?}"),
        }
    }
    let mine = [
        f.plain, f.parked, f.timer, f.paused, f.claimed, f.locking, f.drifted,
    ];
    assert!(
        !c.admin()
            .migrations(a, false, 1000)
            .await
            .expect("moves")
            .iter()
            .any(|m| mine.contains(&m.execution_id)),
        "a dry run records nothing"
    );
    assert_eq!(held(a, f.plain).await.map(|h| h.0).as_deref(), Some("RUNNING"));
}

type Snapshot = (ExecutionId, Vec<(i64, String, String)>);

/// After the move: seals point at b, histories are byte-identical, ids
/// resolve to b, tasks are claimable on b only.
async fn moved_whole(c: &Client, f: &Fleet, snapshots: &[Snapshot], a: ShardId, b: ShardId) {
    for (id, snapshot) in snapshots {
        let (state, pointer, _) = held(a, *id).await.expect("a seal");
        assert_eq!((state.as_str(), pointer), ("MIGRATED", Some(1)));
        let (_, pointer, from) = held(b, *id).await.expect("the live copy");
        assert_eq!((pointer, from), (None, vec![0]));
        let e = c.get_execution(*id).await.expect("a read").expect("found");
        assert_eq!(e.shard, b, "the id resolves to its new home");
        assert_eq!(
            &history(c, *id).await,
            snapshot,
            "{id}'s history moved byte for byte"
        );
    }
    let left = c
        .claim(a, &f.queue, "rb", 10, Duration::from_secs(30))
        .await
        .expect("claim");
    assert!(
        left.iter().all(|t| t.execution_id == Some(f.locking)),
        "only the run that stayed has a task here: {:?}",
        left.iter().map(|t| t.execution_id).collect::<Vec<_>>()
    );
    let tasks = c
        .claim(b, &f.queue, "rb", 10, Duration::from_secs(30))
        .await
        .expect("claim");
    assert!(
        tasks.iter().any(|t| t.execution_id == Some(f.plain)),
        "{:?}",
        tasks.iter().map(|t| t.execution_id).collect::<Vec<_>>()
    );
}

/// The timer was due during the move: it fires once, on the new shard.
async fn timer_fires_once_on(c: &Client, id: ExecutionId, a: ShardId, b: ShardId) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while events_on(b, id, "WorkflowWoken").await == 0 {
        assert!(Instant::now() < deadline, "the moved timer never fired");
        c.admin().maintain(b).await.expect("maintenance");
        c.admin().maintain(a).await.expect("maintenance");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.admin().maintain(a).await.expect("maintenance");
    assert_eq!(events_on(b, id, "WorkflowWoken").await, 1);
    assert_eq!(events_on(a, id, "WorkflowWoken").await, 0, "the seal never wakes");
}

/// Each run counted and listed once; the key finds the live copy.
async fn counted_once(c: &Client, f: &Fleet, b: ShardId) {
    let usage = c
        .admin()
        .usage_report(
            SystemTime::now() - Duration::from_secs(3600),
            SystemTime::now() + Duration::from_secs(60),
            &GroupBy::WorkflowName,
        )
        .await
        .expect("usage");
    let starts = usage.groups.get(&f.name).map_or(0, |u| u.workflow_starts);
    assert_eq!(starts, 5, "each run's start counted once");
    let page = c
        .list_executions(
            &ExecutionFilter::new().workflows([f.name.as_str()]),
            None,
            100,
            SortOrder::Desc,
        )
        .await
        .expect("a listing");
    let mut ids: Vec<ExecutionId> = page.items.iter().map(|e| e.execution_id).collect();
    ids.sort_by_key(|i| i.as_uuid());
    ids.dedup();
    assert_eq!((ids.len(), page.items.len()), (5, 5), "listed once each");
    let parked = c.get_execution(f.parked).await.expect("a read").expect("found");
    match c
        .find_execution(&f.name, &parked.workflow_id)
        .await
        .expect("a lookup")
    {
        Resolution::Found { shard, execution, .. } => {
            assert_eq!((shard, execution.execution_id), (b, f.parked));
        }
        other => panic!("{other:?}"),
    }
    // A start of its key where the key lived attaches to the seal, so to
    // the live run: no second one.
    let again = c
        .start_workflow(
            &f.name,
            &parked.workflow_id,
            json!({}),
            StartOptions::new().placement(Placement::Shard(sid(0))),
        )
        .await
        .expect("a start");
    assert_eq!((again.execution_id, again.created), (f.parked, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebalance_moves_quiescent_runs_and_names_every_blocker() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = client("rb-test");
    let (a, b) = (sid(0), sid(1));
    let f = fleet_on_a(&c, a).await;
    let mut snapshots = Vec::new();
    for id in f.movable() {
        snapshots.push((id, history(&c, id).await));
    }
    dry_run_explains_everything(&c, &f, a, b).await;
    let mut last = None;
    let reports = c
        .admin()
        .rebalance(a, b, &RebalanceOptions::default(), |p, _| last = Some(p))
        .await
        .expect("a rebalance");
    for id in f.movable() {
        assert!(
            reports
                .iter()
                .any(|r| r.id == id && matches!(r.outcome, Ok(MoveOutcome::Moved { .. }))),
            "{id} did not move"
        );
    }
    let last = last.expect("progress was reported");
    assert!(last.moved >= 3 && last.bytes > 20 * 1024, "{last:?}");
    moved_whole(&c, &f, &snapshots, a, b).await;
    timer_fires_once_on(&c, f.timer, a, b).await;
    // Signals and cancels reach the live copy; the seal stays sealed.
    assert!(
        c.signal(f.parked, "poke", json!({}), Some("rb-1"))
            .await
            .expect("a signal")
    );
    assert_eq!(events_on(b, f.parked, "SignalReceived").await, 1);
    assert!(c.cancel_execution(f.plain, Some("done")).await.expect("a cancel"));
    assert_eq!(held(b, f.plain).await.map(|h| h.0).as_deref(), Some("CANCELLED"));
    assert_eq!(held(a, f.plain).await.map(|h| h.0).as_deref(), Some("MIGRATED"));
    counted_once(&c, &f, b).await;
    // One audit entry per move, naming the actor and the login beside it
    // (as does the move's record).
    let audit = c.admin().audit_log(a, None, 100).await.expect("the audit log");
    let login: String = sql(a)
        .await
        .query_one("SELECT session_user::text", &[])
        .await
        .expect("the login")
        .get(0);
    assert_ne!(login, "rb-test");
    let moves = c.admin().migrations(a, false, 1000).await.expect("the moves");
    for id in f.movable() {
        assert!(
            audit.iter().any(|e| e.action == "rebalance.migrate"
                && e.target.as_deref() == Some(&id.to_string())
                && e.outcome == "moved"
                && e.actor == "rb-test"
                && e.login == login),
            "{id}: {audit:?}"
        );
        assert!(
            moves
                .iter()
                .any(|m| m.execution_id == id && m.actor == "rb-test" && m.login == login),
            "{id}: {moves:?}"
        );
    }
    c.release(f.held_task.task_id, f.held_task.token)
        .await
        .expect("released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_moves_on_and_back_and_its_id_follows() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = client("rb-test");
    let (a, b, z) = (sid(0), sid(1), sid(2));
    let name = unique("rb-chain");
    declare(&c, &name, &unique("rb-chain-q")).await;
    let id = start_on(&c, a, &name).await;
    moved(&c, a, id, b).await;
    c.append_event(id, "OnB", json!({"here": 1}))
        .await
        .expect("an event on b");
    moved(&c, b, id, z).await;
    // The origin's seal points straight at the new home.
    assert_eq!(held(a, id).await.and_then(|h| h.1), Some(2));
    assert_eq!(held(b, id).await.and_then(|h| h.1), Some(2));
    assert_eq!(held(z, id).await.map(|h| h.2), Some(vec![0, 1]));
    let on_z = history(&c, id).await;
    assert!(on_z.iter().any(|e| e.1 == "OnB"));
    // And back to its origin: the seal there is replaced in place.
    moved(&c, z, id, a).await;
    let (state, pointer, from) = held(a, id).await.expect("the live copy");
    assert_eq!((state.as_str(), pointer, from), ("RUNNING", None, vec![0, 1, 2]));
    assert_eq!(history(&c, id).await, on_z);
    assert_eq!(live_on(id).await, vec![a]);
    assert_eq!(
        c.get_execution(id).await.expect("a read").map(|e| e.shard),
        Some(a)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_that_changes_after_verification_is_not_cut_over() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = client("rb-test");
    let (a, b) = (sid(0), sid(1));
    let name = unique("rb-late");
    declare(&c, &name, &unique("rb-late-q")).await;
    let id = start_on(&c, a, &name).await;
    let export = c
        .protocol()
        .migration_begin(a, id, b, Duration::from_secs(60))
        .await
        .expect("begun");
    let value = export.to_value().expect("json");
    let migration = value["migration_id"].as_i64().expect("an id");
    let token = value["lease_token"].as_i64().expect("a lease token");
    let digest = c.protocol().migration_stage(b, &export).await.expect("staged");
    assert!(
        c.protocol()
            .migration_verify(a, migration, token, &digest)
            .await
            .expect("verified")
    );
    // It wakes and appends between verify and a late cutover.
    c.append_event(id, "Late", json!({})).await.expect("an event");
    assert!(
        !c.protocol()
            .migration_cutover(a, migration, token)
            .await
            .expect("a cutover")
    );
    assert!(
        c.protocol()
            .migration_discard(b, id, a, migration)
            .await
            .expect("discarded")
    );
    assert_eq!(
        c.protocol()
            .migration_report(a, migration, token, "aborted", Some("test"))
            .await
            .expect("aborted"),
        "ABORTED"
    );
    assert_eq!(held(b, id).await, None, "the staged copy is gone");
    assert_eq!(live_on(id).await, vec![a]);
    // A later rebalance moves the current history.
    moved(&c, a, id, b).await;
    assert!(history(&c, id).await.iter().any(|e| e.1 == "Late"));
    assert_eq!(live_on(id).await, vec![b]);
}

fn run_cli(bin: &std::path::Path, args: &[&str], kill_after: Option<&str>) -> std::process::ExitStatus {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env("SHEAF_SHARDS", spec())
        .env_remove("SHEAF_TOPOLOGY_DIGEST");
    if let Some(phase) = kill_after {
        cmd.env("SHEAF_TEST_KILL_AFTER", phase);
    }
    cmd.output().expect("the CLI runs").status
}

/// A move killed after its cutover: claimable on neither shard until a
/// worker's auto-resume settles it once the grace period (5 s here) is over;
/// the timer that came due meanwhile fires once, where it lives now.
async fn auto_resumed(c: &Arc<Client>, from: ShardId, to: ShardId, id: ExecutionId) {
    assert_eq!(held(from, id).await.map(|h| h.0).as_deref(), Some("MIGRATED"));
    assert_eq!(held(to, id).await.map(|h| h.0).as_deref(), Some("MIGRATING"));
    let worker = Worker::start(
        c.clone(),
        WorkerOptions::new("rb-resumer", [unique("rb-idle")])
            .maintain_every(Duration::from_millis(500))
            .rebalance_resume(Some(Duration::from_secs(5))),
        |_t: TaskContext| async { Ok(TaskDone::Complete(None)) },
    )
    .expect("a worker");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !open_moves(c, from).await.is_empty() {
        assert!(Instant::now() < deadline, "auto-resume never settled the move");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while events_on(to, id, "WorkflowWoken").await == 0 {
        assert!(Instant::now() < deadline, "the timer never fired after the move");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    worker.shutdown().await;
    let audit = c.admin().audit_log(from, None, 20).await.expect("the audit log");
    assert!(
        audit
            .iter()
            .any(|e| e.action == "rebalance.auto_resume" && e.target.as_deref() == Some(&id.to_string())),
        "{audit:?}"
    );
    assert_eq!(events_on(to, id, "WorkflowWoken").await, 1);
    assert_eq!(events_on(from, id, "WorkflowWoken").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cli_killed_after_any_phase_leaves_one_authoritative_copy() {
    let _one = ONE_AT_A_TIME.lock().await;
    let bin = sheaf_tests::cli_binary();
    let c = client("rb-crash");
    let (from, to) = (sid(2), sid(1));
    let name = unique("rb-crash");
    declare(&c, &name, &unique("rb-crash-q")).await;
    for phase in ["begun", "staged", "verified", "committed", "activated"] {
        let id = start_on(&c, from, &name).await;
        c.suspend_execution(id, Some(SystemTime::now() + Duration::from_secs(3)))
            .await
            .expect("suspended");
        let before = history(&c, id).await;
        let status = run_cli(
            bin,
            &[
                "--actor",
                "rb-crash",
                "rebalance",
                "--from",
                "2",
                "--to",
                "1",
                "--limit",
                "1",
            ],
            Some(phase),
        );
        assert_eq!(
            status.signal(),
            Some(9),
            "{phase}: the CLI was killed ({status:?})"
        );
        let open = open_moves(&c, from).await;
        assert_eq!(open.len(), 1, "{phase}: {open:?}");
        let expect = match phase {
            "begun" | "staged" => "STARTED",
            "verified" => "VERIFIED",
            _ => "COMMITTED",
        };
        assert_eq!(open[0].phase, expect, "{phase}");
        if phase == "activated" {
            // Live on the target already; the record is not done yet.
            assert_eq!(live_on(id).await, vec![to], "{phase}");
        }
        // The killed mover's lease lapses (60 s; lapsed from outside here):
        // only then may a resume take its move over.
        sql(from)
            .await
            .execute(
                "UPDATE sheaf.migrations SET lease_until = now() - interval '1 second' \
                 WHERE phase NOT IN ('DONE', 'ABORTED')",
                &[],
            )
            .await
            .expect("the lease lapses");
        if phase == "committed" {
            auto_resumed(&c, from, to, id).await;
        } else {
            let status = run_cli(
                bin,
                &["--actor", "rb-crash", "rebalance-resume", "--from", "2"],
                None,
            );
            assert!(status.success(), "{phase}: rebalance-resume: {status:?}");
            let mut h = history(&c, id).await;
            // The timer may have fired on the source before the resume
            // moved it: then its history moved with it.
            h.retain(|e| e.1 != "WorkflowWoken");
            let mut b = before.clone();
            b.retain(|e| e.1 != "WorkflowWoken");
            assert_eq!(h, b, "{phase}: the history moved byte for byte");
        }
        assert!(open_moves(&c, from).await.is_empty(), "{phase}");
        assert_eq!(live_on(id).await, vec![to], "{phase}: one authoritative copy");
        let e = c.get_execution(id).await.expect("a read").expect("found");
        assert_eq!(e.shard, to, "{phase}");
        assert!(
            matches!(e.state, ExecutionState::Suspended | ExecutionState::Running),
            "{phase}: {e:?}"
        );
    }
}

/// The moves off `from` not settled yet.
async fn open_moves(c: &Client, from: ShardId) -> Vec<sheaf_driver::Migration> {
    c.admin().migrations(from, true, 10).await.expect("moves")
}

/// Whether any payload of `id` is left on `shard` (its input or an event's).
async fn payload_left(shard: ShardId, id: ExecutionId, needle: &str) -> bool {
    let pattern = format!("%{needle}%");
    sql(shard)
        .await
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM sheaf.executions WHERE id = $1 AND input::text LIKE $2) \
                 OR EXISTS (SELECT 1 FROM sheaf.events WHERE execution_id = $1 AND payload::text LIKE $2)",
            &[&id.as_uuid(), &pattern],
        )
        .await
        .expect("reading payloads")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_erasure_reaches_every_residence_or_reports_incomplete() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = client("rb-erase");
    let (a, b, z) = (sid(0), sid(1), sid(2));
    let name = unique("rb-erase");
    declare(&c, &name, &unique("rb-erase-q")).await;
    // Lived on a, then b, lives on z; ended there.
    let id = start_on(&c, a, &name).await;
    c.append_event(id, "Note", json!({"card": "4111-secret"}))
        .await
        .expect("an event");
    moved(&c, a, id, b).await;
    moved(&c, b, id, z).await;
    assert!(
        c.admin().erase_payloads(id).await.is_err(),
        "a running run is not erased, anywhere"
    );
    assert!(payload_left(a, id, "secret").await && payload_left(z, id, "secret").await);
    assert!(c.cancel_execution(id, None).await.expect("a cancel"));
    let erased = c.admin().erase_payloads(id).await.expect("an erasure");
    assert_eq!((erased.live, erased.prior_residences.clone()), (z, vec![a, b]));
    for shard in [a, b, z] {
        assert!(
            !payload_left(shard, id, "secret").await,
            "shard {shard} still holds a payload"
        );
        assert!(
            !payload_left(shard, id, "xxxx").await,
            "shard {shard} still holds the input"
        );
    }
    // One residence down: the erasure fails, and completes once it is back.
    // It started on z (its id routes there), lived on a, lives on b.
    let other = start_on(&c, z, &name).await;
    moved(&c, z, other, a).await;
    moved(&c, a, other, b).await;
    assert!(c.cancel_execution(other, None).await.expect("a cancel"));
    sheaf_tests::own_shards("rebalance", 24600, &["stop-one", "0"]);
    let down = c.admin().erase_payloads(other).await;
    sheaf_tests::own_shards("rebalance", 24600, &["start-one", "0"]);
    assert!(
        down.is_err(),
        "an erasure that missed a residence is not complete: {down:?}"
    );
    assert!(!payload_left(b, other, "xxxx").await, "the live copy was erased");
    assert!(
        !payload_left(z, other, "xxxx").await,
        "the reachable residence was erased"
    );
    assert!(
        payload_left(a, other, "xxxx").await,
        "the residence that was down still holds it"
    );
    let again = client("rb-erase");
    again
        .admin()
        .erase_payloads(other)
        .await
        .expect("the erasure, again");
    assert!(!payload_left(a, other, "xxxx").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drained_shard_can_be_retired_behind_a_forwards_entry() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = client("rb-drain");
    let leaving = sid(2);
    let name = unique("rb-drain");
    declare(&c, &name, &unique("rb-drain-q")).await;
    let mut movable = Vec::new();
    for _ in 0..6 {
        movable.push(start_on(&c, leaving, &name).await);
    }
    let paused = start_on(&c, leaving, &name).await;
    c.admin().pause_execution(paused).await.expect("paused");
    // Taken out of the writable set first, as the runbook says.
    let topology = sheaf_driver::TopologyBuilder::from_spec(spec())
        .expect("a spec")
        .writable([0, 1])
        .build()
        .expect("a topology");
    let options = PoolOptions::default().actor(Some("rb-drain".into()));
    let d = Client::new(topology.clone(), options.clone()).expect("a client");
    let dry = d
        .admin()
        .drain(leaving, &RebalanceOptions::default().dry_run(true), |_, _| {})
        .await
        .expect("a dry run");
    assert_eq!(dry.seals_adopted, 0);
    let drained = d
        .admin()
        .drain(leaving, &RebalanceOptions::default(), |_, _| {})
        .await
        .expect("a drain");
    let stragglers: Vec<ExecutionId> = drained.stragglers().map(|r| r.id).collect();
    assert!(
        stragglers.contains(&paused),
        "the paused run stays: {stragglers:?}"
    );
    for id in &movable {
        let (_, to) = drained
            .moves
            .iter()
            .find(|(r, _)| r.id == *id)
            .expect("considered");
        let e = c.get_execution(*id).await.expect("a read").expect("found");
        assert_eq!(e.shard, *to, "moved to its rendezvous winner");
        assert_eq!(
            Some(*to),
            Some(
                topology
                    .drain_target(&name, &e.workflow_id, leaving)
                    .expect("a winner")
            )
        );
    }
    // Retired: shard 2 gone from the topology, its ids forwarded. Every id
    // that encodes it still resolves, through the seals handed over.
    let retired = sheaf_driver::TopologyBuilder::from_spec(
        &spec()
            .split(',')
            .filter(|s| !s.starts_with("2="))
            .collect::<Vec<_>>()
            .join(","),
    )
    .expect("a spec")
    .forward(2, u32::from(drained.forward_to.get()))
    .build()
    .expect("a topology");
    let after = Client::new(retired, options).expect("a client");
    for id in &movable {
        let e = after.get_execution(*id).await.expect("a read").expect("found");
        assert_ne!(e.shard, leaving);
        assert_eq!(e.state, ExecutionState::Running, "{id}");
    }
    c.cancel_execution(paused, None).await.expect("cancelled");
}
