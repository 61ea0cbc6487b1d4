//! Residence, not origin: an id names the shard a run was born on; where it
//! lives after moves is reached through its seals' forwards, and every
//! decision about where a run is follows residence (docs/residence.md).
//! Each test here failed before the decision it checks followed residence:
//! a moved parent's local child reported its end to nobody; a default
//! child of a moved parent went to the parent's old shard; an attach to a
//! seal reported the seal's shard; a key lookup between a move's cutover
//! and its activation answered "ended MIGRATED" for a live run; usage
//! recorded between a move's verify and its cutover stayed on the seal;
//! an erasure missed a seal a drain had handed to another shard; a child
//! start deadlocked against a start of its key that closes runs.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sheaf_driver::protocol::Steps;
use sheaf_driver::{
    ByKey, ChildPlacement, Client, ClientError, DebounceMode, EnqueueOptions, ExecutionId, MoveOutcome,
    OnShard, Placement, PoolOptions, RebalanceOptions, Relay, RelayOptions, ShardId, StartOptions,
    TopologyBuilder,
};
use sheaf_tests::{connect, fleet, fleet_spec, sid, unique, until};

fn client() -> Arc<Client> {
    Arc::new(Client::new(fleet().clone(), PoolOptions::default()).expect("a client"))
}

async fn start_on(c: &Client, shard: ShardId, name: &str, workflow_id: &str) -> ExecutionId {
    c.start_workflow(
        name,
        workflow_id,
        json!({"card": "4111-secret"}),
        StartOptions::new().placement(Placement::Shard(shard)),
    )
    .await
    .expect("a start")
    .execution_id
}

async fn moved(c: &Client, from: ShardId, id: ExecutionId, to: ShardId) {
    match c.protocol().move_execution(from, id, to).await {
        Ok(MoveOutcome::Moved { .. }) => {}
        other => panic!("moving {id} {from} -> {to}: {other:?}"),
    }
}

async fn event_types(c: &Client, id: ExecutionId) -> Vec<String> {
    let page = c.history(id, 0, 1000).await.expect("a history page");
    page.events.iter().map(|e| e.event_type.to_string()).collect()
}

fn count(events: &[String], kind: &str) -> usize {
    events.iter().filter(|e| *e == kind).count()
}

/// A relay over every shard, once it has started `child` (a child the
/// relay starts on another shard than its parent's).
async fn relay_started(c: &Arc<Client>, child: ExecutionId) -> Relay {
    let relay = Relay::start(
        c.clone(),
        fleet().shards().map(|s| s.id).collect(),
        RelayOptions::default(),
    );
    until(
        "the relay to start the child",
        Duration::from_secs(20),
        async || c.get_execution(child).await.ok().flatten().is_some(),
    )
    .await;
    relay
}

/// The issue's repro, in SQL on the parent's new home: a child started
/// there with the default placement reports its end to its parent, once,
/// in its own terminal transaction (no relay runs in this test).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_local_child_of_a_moved_parent_reports_its_end_once() {
    let c = client();
    let (born, home) = (sid(0), sid(1));
    let name = unique("res-parent");
    let parent = start_on(&c, born, &name, "p-1").await;
    moved(&c, born, parent, home).await;
    let db = connect(fleet().get(home).expect("shard 1")).await;
    let row = db
        .query_one(
            "SELECT child_id, target_shard FROM sheaf.start_child($1, 'res-child', 'c-1', '{}', '{}')",
            &[&parent.as_uuid()],
        )
        .await
        .expect("a child started where the parent lives");
    let (child, target): (uuid::Uuid, i32) = (row.get(0), row.get(1));
    assert_eq!(target, 1, "the default placement is where the parent lives");
    db.execute("SELECT sheaf.complete_execution($1, '{\"ok\": 1}')", &[&child])
        .await
        .expect("the child completes");
    let events = event_types(&c, parent).await;
    assert_eq!(count(&events, "ChildStarted"), 1, "{events:?}");
    assert_eq!(count(&events, "ChildCompleted"), 1, "{events:?}");
    let rows: i64 = db
        .query_one(
            "SELECT count(*) FROM sheaf.cross_shard_children WHERE child_id = $1",
            &[&child],
        )
        .await
        .expect("the relay's rows")
        .get(0);
    assert_eq!(rows, 0, "nothing left for a relay");
}

/// Through the driver: `ParentShard` is where the parent lives, and a
/// child on a third shard of a moved parent gets its end back through the
/// relay exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn children_of_a_moved_parent_follow_its_residence() {
    let c = client();
    let (born, home, third) = (sid(0), sid(1), sid(2));
    let name = unique("res-parent");
    let parent = start_on(&c, born, &name, "p-1").await;
    moved(&c, born, parent, home).await;
    let local = c
        .start_child(
            parent,
            "res-child",
            "here",
            json!({}),
            ChildPlacement::ParentShard,
        )
        .await
        .expect("a default child");
    assert_eq!(local.shard, home, "{local:?}");
    assert_eq!(
        local.child_id.shard(),
        Some(home),
        "minted where the parent lives"
    );
    let remote = c
        .start_child(
            parent,
            "res-child",
            "there",
            json!({}),
            ChildPlacement::Shard(third),
        )
        .await
        .expect("a child on a third shard");
    assert_eq!(remote.shard, third);
    let relay = relay_started(&c, remote.child_id).await;
    assert!(
        c.complete_execution(local.child_id, json!({"n": 1}))
            .await
            .expect("the local child completes")
    );
    assert!(
        c.complete_execution(remote.child_id, json!({"n": 2}))
            .await
            .expect("the remote child completes")
    );
    until(
        "both ends reach the parent",
        Duration::from_secs(30),
        async || count(&event_types(&c, parent).await, "ChildCompleted") == 2,
    )
    .await;
    relay.shutdown().await;
    let events = event_types(&c, parent).await;
    assert_eq!(
        count(&events, "ChildCompleted"),
        2,
        "exactly once each: {events:?}"
    );
}

/// A start placed on the shard that holds the run's seal attaches to it,
/// and says where the run lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_attach_to_a_seal_reports_where_the_run_lives() {
    let c = client();
    let (born, home) = (sid(0), sid(2));
    let name = unique("res-attach");
    let id = start_on(&c, born, &name, "w-1").await;
    moved(&c, born, id, home).await;
    let again = c
        .start_workflow(
            &name,
            "w-1",
            json!({}),
            StartOptions::new().placement(Placement::Shard(born)),
        )
        .await
        .expect("an attach");
    assert!(!again.created);
    assert_eq!((again.execution_id, again.shard), (id, home));
}

/// Begins moving `id` and stages it: the move's id and its lease token.
async fn begun(c: &Client, from: ShardId, id: ExecutionId, to: ShardId) -> (i64, i64, String) {
    let export = c
        .protocol()
        .migration_begin(from, id, to, Duration::from_secs(60))
        .await
        .expect("begun");
    let value = export.to_value().expect("an export");
    let migration = value["migration_id"].as_i64().expect("a move id");
    let token = value["lease_token"].as_i64().expect("a lease token");
    let digest = c.protocol().migration_stage(to, &export).await.expect("staged");
    (migration, token, digest)
}

/// Steps a move to its cutover, leaving it unactivated: the run's only
/// copies are a seal on `from` and a staged copy on `to`.
async fn cut_over(c: &Client, from: ShardId, id: ExecutionId, to: ShardId) -> (i64, i64) {
    let (migration, token, digest) = begun(c, from, id, to).await;
    assert!(
        c.protocol()
            .migration_verify(from, migration, token, &digest)
            .await
            .expect("verified")
    );
    assert!(
        c.protocol()
            .migration_cutover(from, migration, token)
            .await
            .expect("cut over")
    );
    (migration, token)
}

/// A signal by key between a move's cutover and its activation waits for
/// the live copy and is delivered there, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_lookup_mid_move_waits_for_the_live_copy() {
    let c = client();
    let (from, to) = (sid(1), sid(2));
    let name = unique("res-key");
    let id = start_on(&c, from, &name, "k-1").await;
    let (migration, token) = cut_over(&c, from, id, to).await;
    let activate = {
        let c = c.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            c.protocol().migration_activate(to, id).await.expect("activated")
        })
    };
    let by_key = c
        .signal_by_key(&name, "k-1", "poke", json!({"n": 1}), Some("poke-1"))
        .await
        .expect("a signal by key");
    assert!(activate.await.expect("the activation task"));
    c.protocol()
        .migration_report(from, migration, token, "done", None)
        .await
        .expect("done");
    match by_key {
        ByKey::Delivered { execution_id, .. } => assert_eq!(execution_id, id),
        other => panic!("a live run mid-move is not {other:?}"),
    }
    let events = event_types(&c, id).await;
    assert_eq!(count(&events, "SignalReceived"), 1, "{events:?}");
}

/// Usage recorded after a move's verify declines its cutover, and is kept
/// where the run still lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn usage_recorded_during_a_move_is_kept() {
    let c = client();
    let (from, to) = (sid(0), sid(1));
    let name = unique("res-usage");
    let id = start_on(&c, from, &name, "u-1").await;
    let (migration, token, digest) = begun(&c, from, id, to).await;
    assert!(
        c.protocol()
            .migration_verify(from, migration, token, &digest)
            .await
            .expect("verified")
    );
    c.record_usage(id, json!({"tokens": 7}))
        .await
        .expect("usage recorded mid-move");
    assert!(
        !c.protocol()
            .migration_cutover(from, migration, token)
            .await
            .expect("a cutover"),
        "the cutover declines a run whose usage changed after its verify"
    );
    c.protocol()
        .migration_report(from, migration, token, "aborted", Some("usage changed"))
        .await
        .expect("aborted");
    assert!(
        c.protocol()
            .migration_discard(to, id, from, migration)
            .await
            .expect("discarded")
    );
    let db = connect(fleet().get(from).expect("the source")).await;
    let kept: i64 = db
        .query_one(
            "SELECT count(*) FROM sheaf.usage_records u JOIN sheaf.executions e ON e.id = u.execution_id \
             WHERE u.execution_id = $1 AND e.state = 'RUNNING'",
            &[&id.as_uuid()],
        )
        .await
        .expect("usage records")
        .get(0);
    assert_eq!(kept, 1, "the record stays with the live run");
    // The move, again, carries it.
    moved(&c, from, id, to).await;
    let db = connect(fleet().get(to).expect("the target")).await;
    let carried: i64 = db
        .query_one(
            "SELECT count(*) FROM sheaf.usage_records WHERE execution_id = $1",
            &[&id.as_uuid()],
        )
        .await
        .expect("usage records")
        .get(0);
    assert_eq!(carried, 1);
}

async fn payload_left(shard: ShardId, id: ExecutionId) -> bool {
    let db = connect(fleet().get(shard).expect("a shard")).await;
    db.query_one(
        "SELECT EXISTS (SELECT 1 FROM sheaf.executions WHERE id = $1 AND input::text LIKE '%secret%')",
        &[&id.as_uuid()],
    )
    .await
    .expect("reading payloads")
    .get(0)
}

/// A seal handed to a shard the run never lived on (what a drain does) is
/// erased too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_erasure_reaches_a_seal_a_drain_handed_over() {
    let c = client();
    let (born, home, adopter) = (sid(0), sid(1), sid(2));
    let name = unique("res-erase");
    let id = start_on(&c, born, &name, "e-1").await;
    moved(&c, born, id, home).await;
    let db = connect(fleet().get(born).expect("the origin")).await;
    let seal: serde_json::Value = db
        .query_one(
            "SELECT seal FROM sheaf.migration_seals(NULL, 10000) WHERE execution_id = $1",
            &[&id.as_uuid()],
        )
        .await
        .expect("its seal")
        .get(0);
    let seal = sheaf_driver::Json::from_serialize(&seal).expect("a seal document");
    assert!(
        c.protocol()
            .migration_adopt_seal(adopter, &seal)
            .await
            .expect("adopted")
    );
    assert!(
        payload_left(adopter, id).await,
        "the handed-over seal holds the input"
    );
    assert!(c.cancel_execution(id, None).await.expect("a cancel"));
    let erased = c.admin().erase_payloads(id).await.expect("an erasure");
    assert_eq!(erased.live, home);
    assert_eq!(erased.prior_residences, vec![born, adopter]);
    for shard in [born, home, adopter] {
        assert!(
            !payload_left(shard, id).await,
            "shard {shard} still holds the input"
        );
    }
}

/// A plain connection to `shard`, for transactions held open by hand.
async fn connect_raw(shard: ShardId) -> tokio_postgres::Client {
    let url = &fleet().get(shard).expect("a shard").url;
    let (db, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("a connection");
    tokio::spawn(conn);
    db
}

/// Whether another backend running a statement containing `marker` waits
/// on a lock.
async fn waits_on_lock(db: &tokio_postgres::Client, marker: &str) -> bool {
    let pattern = format!("%{marker}%");
    let waiting: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1 \
             AND pid <> pg_backend_pid()",
            &[&pattern],
        )
        .await
        .expect("pg_stat_activity")
        .get(0);
    waiting > 0
}

/// Waits until the backend running a statement containing `marker` waits
/// on a lock.
async fn until_blocked(db: &tokio_postgres::Client, marker: &str) {
    until(
        "a backend to wait on a lock",
        Duration::from_secs(20),
        async || waits_on_lock(db, marker).await,
    )
    .await;
}

/// Runs `sql` with `params` on a connection of its own, in a task.
fn spawn_query(
    db: tokio_postgres::Client,
    sql: &'static str,
    a: uuid::Uuid,
    b: String,
) -> tokio::task::JoinHandle<Result<(), tokio_postgres::Error>> {
    tokio::spawn(async move { db.query(sql, &[&a, &b]).await.map(drop) })
}

fn deadlocked(r: &Result<(), tokio_postgres::Error>) -> bool {
    r.as_ref()
        .err()
        .and_then(|e| e.code())
        .is_some_and(|c| c.code() == "40P01")
}

/// The lock order (docs/reference/sql/mutex.md, "Deadlocks"): a child started in its parent's
/// transaction takes the child's start and gate locks before the parent's
/// row. Interleaved against a latest-wins start of the child's key that
/// supersedes the parent, it waits instead of deadlocking: before, the
/// child start held the parent's row while waiting for the gate, and the
/// superseding start held the gate while waiting for the parent's row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_child_start_and_a_superseding_start_do_not_deadlock() {
    let c = client();
    let shard = sid(0);
    let name = unique("res-latest");
    c.admin()
        .declare_workflow(
            &name,
            json!({"concurrency": {"key": "input.k", "limit": 1, "on_conflict": "cancel_running"}}),
        )
        .await
        .into_result()
        .expect("declared");
    let parent = c
        .start_workflow(
            &name,
            "parent",
            json!({"k": "x"}),
            StartOptions::new().placement(Placement::Shard(shard)),
        )
        .await
        .expect("the parent")
        .execution_id;
    // A start of the child's key holds its start lock in an open transaction.
    let holder = connect_raw(shard).await;
    holder.batch_execute("BEGIN").await.expect("begin");
    holder
        .query(
            "SELECT * FROM sheaf.start_workflow($1, 'child', '{\"k\": \"y\"}', '{}')",
            &[&name],
        )
        .await
        .expect("a start holding the child's start lock");
    // The child start waits for it.
    let child_start = spawn_query(
        connect_raw(shard).await,
        "SELECT * FROM sheaf.start_child($1, $2, 'child', '{\"k\": \"x\"}', '{}') -- res-child-start",
        parent.as_uuid(),
        name.clone(),
    );
    let watcher = connect_raw(shard).await;
    until_blocked(&watcher, "res-child-start").await;
    // A start of the parent's key supersedes the parent.
    let superseding = {
        let db = connect_raw(shard).await;
        let name = name.clone();
        tokio::spawn(async move {
            db.query(
                "SELECT * FROM sheaf.start_workflow($1, 'newer', '{\"k\": \"x\"}', '{}') -- res-supersede",
                &[&name],
            )
            .await
            .map(drop)
        })
    };
    // It finishes, or waits for a lock; then the holder lets go.
    until(
        "the superseding start to finish or wait",
        Duration::from_secs(20),
        async || superseding.is_finished() || waits_on_lock(&watcher, "res-supersede").await,
    )
    .await;
    holder.batch_execute("ROLLBACK").await.expect("rollback");
    let superseded = superseding.await.expect("the superseding task");
    let child = child_start.await.expect("the child task");
    assert!(
        !deadlocked(&superseded) && !deadlocked(&child),
        "no deadlock: superseding {superseded:?}, child start {child:?}"
    );
    assert!(superseded.is_ok(), "{superseded:?}");
}

/// A relay whose lease on a child's start lapsed while the start ran, and a
/// second relay starting the same child meanwhile: the second waits for the
/// first's start lock and then finds the child itself, which is `exists`
/// (it runs), never a `conflict` that would fail the child in its parent's
/// history.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_start_that_meets_its_own_child_is_not_a_conflict() {
    let shard = sid(2);
    let child = ExecutionId::mint(shard).expect("a child id").as_uuid();
    let parent = ExecutionId::mint(sid(0)).expect("a parent id").as_uuid();
    let name = unique("res-relay-child");
    let start = "SELECT outcome FROM sheaf.relay_start_child($1, $2, $3, 'c-1', '{}') -- res-relay-start";
    let first = connect_raw(shard).await;
    first.batch_execute("BEGIN").await.expect("begin");
    let outcome: String = first
        .query_one(start, &[&child, &parent, &name])
        .await
        .expect("the first start")
        .get(0);
    assert_eq!(outcome, "started");
    let second = {
        let db = connect_raw(shard).await;
        let name = name.clone();
        tokio::spawn(async move {
            db.query_one(start, &[&child, &parent, &name])
                .await
                .map(|r| r.get::<_, String>(0))
        })
    };
    let watcher = connect_raw(shard).await;
    until_blocked(&watcher, "res-relay-start").await;
    first.batch_execute("COMMIT").await.expect("commit");
    let outcome = second.await.expect("the second start").expect("its outcome");
    assert_eq!(outcome, "exists");
}

/// Which shards hold `id`, and in what state.
async fn copies(id: ExecutionId) -> Vec<(ShardId, String)> {
    let mut out = Vec::new();
    for shard in fleet().shards() {
        let db = connect(shard).await;
        if let Some(row) = db
            .query_opt(
                "SELECT state FROM sheaf.executions WHERE id = $1",
                &[&id.as_uuid()],
            )
            .await
            .expect("a read")
        {
            out.push((shard.id, row.get(0)));
        }
    }
    out
}

/// A move has one mover at a time: a resume leaves a move whose mover's
/// lease is live alone, a step under another token is refused and changes
/// nothing, and the mover goes on to the end. Once its lease lapses (the
/// mover "crashed": its lease is expired from outside), a resume takes it
/// over, and the old mover's steps are refused from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_move_has_one_mover_at_a_time() {
    let c = client();
    let (from, to) = (sid(0), sid(2));
    let name = unique("res-lease");
    let id = start_on(&c, from, &name, "l-1").await;
    let (migration, token, digest) = begun(&c, from, id, to).await;
    let resumed = c.admin().rebalance_resume(from).await.expect("a resume");
    let mine = resumed.iter().find(|r| r.id == id).expect("the move is listed");
    assert!(
        matches!(&mine.outcome, Ok(MoveOutcome::Blocked(why)) if why[0].as_str().contains("lease")),
        "a move in progress is not taken over: {mine:?}"
    );
    assert!(
        c.protocol()
            .migration_verify(from, migration, token + 1_000_000, &digest)
            .await
            .is_err(),
        "a step under another token is refused"
    );
    assert!(
        c.protocol()
            .migration_verify(from, migration, token, &digest)
            .await
            .expect("its mover verifies")
    );
    assert!(
        c.protocol()
            .migration_cutover(from, migration, token)
            .await
            .expect("its mover cuts over")
    );
    assert!(c.protocol().migration_activate(to, id).await.expect("activated"));
    assert_eq!(
        c.protocol()
            .migration_report(from, migration, token, "done", None)
            .await
            .expect("done"),
        "DONE"
    );
    let mut held = copies(id).await;
    held.sort();
    assert_eq!(held, vec![(from, "MIGRATED".into()), (to, "RUNNING".into())]);

    // A second move, whose mover dies after staging.
    let other = start_on(&c, from, &name, "l-2").await;
    let (migration, token, digest) = begun(&c, from, other, to).await;
    let db = connect(fleet().get(from).expect("the source")).await;
    db.execute(
        "UPDATE sheaf.migrations SET lease_until = now() - interval '1 second' WHERE id = $1",
        &[&migration],
    )
    .await
    .expect("the lease expired from outside");
    let resumed = c.admin().rebalance_resume(from).await.expect("a resume");
    let mine = resumed
        .iter()
        .find(|r| r.id == other)
        .expect("the move is listed");
    assert!(
        matches!(&mine.outcome, Ok(MoveOutcome::Moved { .. })),
        "a lapsed move is taken over and moved again: {mine:?}"
    );
    assert!(
        c.protocol()
            .migration_verify(from, migration, token, &digest)
            .await
            .is_err(),
        "the old mover is fenced out"
    );
    let mut held = copies(other).await;
    held.sort();
    assert_eq!(held, vec![(from, "MIGRATED".into()), (to, "RUNNING".into())]);
}

/// An abort records ABORTED before it discards, and a discard removes only
/// the copy its own move staged: an aborted move's late discard (its mover
/// stalled between the two) leaves a newer move's copy alone, and that
/// move completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_discard_never_removes_a_newer_moves_copy() {
    let c = client();
    let (from, to) = (sid(1), sid(0));
    let name = unique("res-discard");
    let id = start_on(&c, from, &name, "d-1").await;
    let (first, token, _) = begun(&c, from, id, to).await;
    assert_eq!(
        c.protocol()
            .migration_report(from, first, token, "aborted", Some("test"))
            .await
            .expect("aborted"),
        "ABORTED"
    );
    assert!(
        c.protocol().migration_cutover(from, first, token).await.is_err(),
        "no cutover after an abort"
    );
    let (second, token, digest) = begun(&c, from, id, to).await;
    assert!(
        !c.protocol()
            .migration_discard(to, id, from, first)
            .await
            .expect("a late discard"),
        "the newer move's copy is not the late discard's"
    );
    assert!(
        c.protocol()
            .migration_verify(from, second, token, &digest)
            .await
            .expect("verified")
    );
    assert!(
        c.protocol()
            .migration_cutover(from, second, token)
            .await
            .expect("cut over")
    );
    assert!(c.protocol().migration_activate(to, id).await.expect("activated"));
    c.protocol()
        .migration_report(from, second, token, "done", None)
        .await
        .expect("done");
    let mut held = copies(id).await;
    held.sort();
    assert_eq!(held, vec![(to, "RUNNING".into()), (from, "MIGRATED".into())]);
}

/// Keys of `name` (as the router hashes them) whose home is `home` while
/// every shard takes work.
fn keys_homed_on(name: &str, home: ShardId, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("key-{i}"))
        .filter(|k| fleet().place(name, k, &Placement::Auto, None) == Ok(home))
        .take(n)
        .collect()
}

/// The test fleet with `leaving` out of the writable set, as a drain's
/// runbook first does.
fn draining_without(leaving: ShardId) -> sheaf_driver::Topology {
    let writable: Vec<u32> = fleet()
        .shards()
        .map(|s| u32::from(s.id.get()))
        .filter(|&s| s != u32::from(leaving.get()))
        .collect();
    TopologyBuilder::from_spec(fleet_spec())
        .expect("a spec")
        .writable(writable)
        .build()
        .expect("a topology")
}

/// A keyed task stays on its shard while that shard drains (no drain moves
/// it): an enqueue with its idempotency key returns it there, where it once
/// made a second task at the key's new home. Once the key is free, its next
/// task goes to the new home.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_held_on_a_draining_shard_are_answered_there() {
    let c = client();
    let leaving = sid(2);
    let queue = unique("res-idem");
    let keys = keys_homed_on(&queue, leaving, 2);
    let mut held = Vec::new();
    for k in &keys {
        let e = c
            .enqueue(
                &queue,
                json!({ "k": k }),
                EnqueueOptions::new().idempotency_key(k.clone()),
            )
            .await
            .expect("an enqueue");
        assert_eq!(e.shard, leaving, "homed where the router says");
        held.push(e.task_id);
    }
    let d = Client::new(draining_without(leaving), PoolOptions::default()).expect("a client");
    let again = d
        .enqueue(
            &queue,
            json!({}),
            EnqueueOptions::new().idempotency_key(keys[0].clone()),
        )
        .await
        .expect("an enqueue");
    assert_eq!(
        (again.task_id, again.shard),
        (held[0], leaving),
        "the holder answers"
    );
    let batch = d
        .enqueue_batch(
            &queue,
            [json!({})],
            EnqueueOptions::new().idempotency_key(keys[1].clone()),
        )
        .await
        .expect("a batch");
    assert_eq!((batch.task_ids, batch.shard), (vec![held[1]], leaving));

    let claimed = c
        .claim(leaving, &queue, "res-idem", 10, Duration::from_secs(60))
        .await
        .expect("a claim");
    let first = claimed.iter().find(|t| t.task_id == held[0]).expect("claimed");
    c.complete(first.task_id, first.token, None)
        .await
        .expect("completed");
    let fresh = d
        .enqueue(
            &queue,
            json!({}),
            EnqueueOptions::new().idempotency_key(keys[0].clone()),
        )
        .await
        .expect("an enqueue");
    assert_ne!(fresh.task_id, held[0], "a free key makes a new task");
    assert_ne!(fresh.shard, leaving, "at the key's new home");
}

/// A debounce window stays on its shard while that shard drains (the run
/// does not move while it is open): a start of its key joins it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_on_a_draining_shard_meets_where_it_began() {
    let c = client();
    let leaving = sid(2);
    let d = Client::new(draining_without(leaving), PoolOptions::default()).expect("a client");
    let name = unique("res-debounce");
    let dkey = keys_homed_on(&format!("debounce:{name}"), leaving, 1).remove(0);
    let debounced =
        || StartOptions::new().debounce(dkey.clone(), Duration::from_secs(3600), DebounceMode::Trailing);
    let opened = c
        .start_workflow(&name, "d-1", json!({"rev": 1}), debounced())
        .await
        .expect("a debounced start");
    assert!(opened.created);
    assert_eq!(opened.shard, leaving);
    let joined = d
        .start_workflow(&name, "d-2", json!({"rev": 2}), debounced())
        .await
        .expect("a debounced start");
    assert_eq!(
        (joined.execution_id, joined.created, joined.shard),
        (opened.execution_id, false, leaving),
        "the burst meets where it began"
    );
    assert!(
        d.cancel_pending_start(&name, &dkey, None)
            .await
            .expect("a cancel")
    );
}

/// A parent that moved after a child of it was started (and ended) on its
/// old shard, and a default child started where it lives now.
async fn moved_parent_with_children(c: &Client) -> (ExecutionId, ExecutionId, ExecutionId) {
    let (born, home) = (sid(0), sid(1));
    let name = unique("res-list");
    let parent = start_on(c, born, &name, "p-1").await;
    // Child keys of their own: a child still live would hold its key on
    // the next run of this suite against the same shards.
    let before = c
        .start_child(
            parent,
            "res-child",
            &unique("before"),
            json!({}),
            ChildPlacement::ParentShard,
        )
        .await
        .expect("a child where the parent was born");
    assert_eq!(before.shard, born);
    assert!(
        c.complete_execution(before.child_id, json!({"n": 1}))
            .await
            .expect("it ends")
    );
    moved(c, born, parent, home).await;
    let after = c
        .start_child(
            parent,
            "res-child",
            &unique("after"),
            json!({}),
            ChildPlacement::ParentShard,
        )
        .await
        .expect("a child where the parent lives");
    assert_eq!(after.shard, home);
    (parent, before.child_id, after.child_id)
}

/// Its children are listed wherever they are: the shard holding only the
/// parent's seal lists the child started there (it used to forward the
/// listing to the parent's new home, which does not have that child).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_moved_parents_children_are_all_listed() {
    let c = client();
    let (parent, before, after) = moved_parent_with_children(&c).await;
    let listed: Vec<(ExecutionId, ShardId)> = c
        .children(parent)
        .await
        .expect("a listing")
        .items
        .iter()
        .map(|k| (k.execution_id, k.shard))
        .collect();
    assert_eq!(listed, vec![(before, sid(0)), (after, sid(1))]);
    c.cancel_execution(after, None).await.expect("cancelled");
}

/// A child is an orphan only if the shard where its parent lives does not
/// know it: a parent that moved took its children's records with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_moved_parents_children_are_not_orphans() {
    let c = client();
    let (parent, before, after) = moved_parent_with_children(&c).await;
    let orphans = c.admin().orphan_children().await.expect("an orphan check");
    let ours: Vec<_> = orphans.items.iter().filter(|o| o.parent_id == parent).collect();
    assert!(ours.is_empty(), "{before} and {after} have a parent: {ours:?}");
    c.cancel_execution(after, None).await.expect("cancelled");
}

/// A transaction on the shard where a run lives may enqueue its tasks,
/// wherever the run was born; the shard it left refuses, naming its home.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transaction_enqueues_for_a_run_living_on_its_shard() {
    let c = client();
    let (born, home) = (sid(0), sid(2));
    let id = start_on(&c, born, &unique("res-tx"), "t-1").await;
    moved(&c, born, id, home).await;
    let queue = unique("res-tx-q");
    let mut conn = c.shard_connection(home).await.expect("a connection");
    let tx = conn.transaction().await.expect("begin");
    let on = OnShard::verify(&tx, home).await.expect("verify");
    let task = on
        .enqueue(&queue, json!({}), EnqueueOptions::new().execution(id))
        .await
        .expect("a task of a run living here");
    assert_eq!(task.shard, home);
    tx.commit().await.expect("commit");
    let mut conn = c.shard_connection(born).await.expect("a connection");
    let tx = conn.transaction().await.expect("begin");
    let on = OnShard::verify(&tx, born).await.expect("verify");
    match on
        .enqueue(&queue, json!({}), EnqueueOptions::new().execution(id))
        .await
    {
        Err(ClientError::Moved { to, .. }) => assert_eq!(to, home),
        other => panic!("a task of a run that moved away: {other:?}"),
    }
    tx.rollback().await.expect("rollback");
}

/// A task of a moved run is enqueued where it lives, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_enqueue_for_a_moved_run_reports_where_it_went() {
    let c = client();
    let (born, home) = (sid(0), sid(1));
    let id = start_on(&c, born, &unique("res-enq"), "t-1").await;
    moved(&c, born, id, home).await;
    let queue = unique("res-enq-q");
    let one = c
        .enqueue(&queue, json!({}), EnqueueOptions::new().execution(id))
        .await
        .expect("a task");
    assert_eq!((one.shard, one.task_id.shard()), (home, Some(home)));
    let batch = c
        .enqueue_batch(
            &queue,
            [json!({}), json!({})],
            EnqueueOptions::new().execution(id),
        )
        .await
        .expect("a batch");
    assert_eq!(batch.shard, home);
}

/// A signal-with-start that meets a seal signals the run where it lives
/// and says where that is, even when the seal's pointer is one hop of
/// several (its repoint had not reached it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_signal_with_start_at_a_seal_reports_where_the_run_lives() {
    let c = client();
    let (born, middle, home) = (sid(0), sid(1), sid(2));
    let name = unique("res-sws");
    let id = start_on(&c, born, &name, "w-1").await;
    moved(&c, born, id, middle).await;
    moved(&c, middle, id, home).await;
    // Out of protocol: the origin's seal still points at the middle hop.
    connect(fleet().get(born).expect("the origin"))
        .await
        .execute(
            "UPDATE sheaf.executions SET migrated_to_shard = $2 WHERE id = $1",
            &[&id.as_uuid(), &i32::from(middle.get())],
        )
        .await
        .expect("an old pointer");
    let started = c
        .signal_with_start(
            &name,
            "w-1",
            json!({}),
            "poke",
            json!({}),
            None,
            StartOptions::new().placement(Placement::Shard(born)),
        )
        .await
        .expect("a signal-with-start");
    assert!(!started.created);
    assert_eq!((started.execution_id, started.shard), (id, home));
    assert_eq!(count(&event_types(&c, id).await, "SignalReceived"), 1);
}

/// A repeated start of a child that moved since reports where it lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_repeated_child_start_reports_where_the_child_lives() {
    let c = client();
    let (parent_shard, first, home) = (sid(0), sid(1), sid(2));
    let parent = start_on(&c, parent_shard, &unique("res-rep"), "p-1").await;
    let key = unique("c");
    let child = c
        .start_child(parent, "res-child", &key, json!({}), ChildPlacement::Shard(first))
        .await
        .expect("a child elsewhere");
    let relay = relay_started(&c, child.child_id).await;
    relay.shutdown().await;
    moved(&c, first, child.child_id, home).await;
    let again = c
        .start_child(parent, "res-child", &key, json!({}), ChildPlacement::Shard(first))
        .await
        .expect("a repeat");
    assert!(!again.created);
    assert_eq!((again.child_id, again.shard), (child.child_id, home));
    c.cancel_execution(child.child_id, None).await.expect("cancelled");
}

/// A signal by key to a run that moved: the sender's
/// `ExternalSignalDelivered` names the shard the run lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_external_signal_names_where_its_target_lives() {
    let c = client();
    let (born, home) = (sid(0), sid(1));
    let target_name = unique("res-ext-target");
    let target = start_on(&c, born, &target_name, "t-1").await;
    moved(&c, born, target, home).await;
    let sender = start_on(&c, sid(2), &unique("res-ext-sender"), "s-1").await;
    c.signal_external(sender, &target_name, "t-1", "go", json!({"n": 1}), Some("once"))
        .await
        .expect("a signal by key");
    let relay = Relay::start(
        c.clone(),
        fleet().shards().map(|s| s.id).collect(),
        RelayOptions::default(),
    );
    let delivered = async || {
        let page = c.history(sender, 0, 1000).await.expect("a history page");
        page.events
            .iter()
            .find(|e| e.event_type == "ExternalSignalDelivered")
            .map(|e| e.payload.to_value().expect("a payload"))
    };
    until(
        "the relay delivers the signal",
        Duration::from_secs(30),
        async || delivered().await.is_some(),
    )
    .await;
    relay.shutdown().await;
    let event = delivered().await.expect("delivered");
    assert_eq!(event["execution_id"], json!(target.to_string()));
    assert_eq!(event["shard"], json!(home.get()), "{event}");
}

/// Two children of `parent` for shard `leaving`, their lifecycle rows held
/// out of every relay's reach (a lease no relay has): the first still to
/// be started; the second started (as the relay would) and ended there,
/// its end waiting for the relay's pull.
async fn held_children(
    c: &Client,
    db: &mut tokio_postgres::Client,
    parent: ExecutionId,
    leaving: ShardId,
) -> (ExecutionId, ExecutionId) {
    let tx = db.transaction().await.expect("begin");
    let mut children = Vec::new();
    let keys = [unique("to-start"), unique("ended")];
    for wid in &keys {
        let row = tx
            .query_one(
                "SELECT child_id FROM sheaf.start_child($1, 'res-drain-child', $2, '{}', $3)",
                &[&parent.as_uuid(), &wid, &json!({"target_shard": leaving.get()})],
            )
            .await
            .expect("a child for the leaving shard");
        children.push(ExecutionId::from_uuid(row.get(0)));
    }
    tx.execute(
        "UPDATE sheaf.cross_shard_children SET lease_token = -1, due_at = now() + interval '1 hour' \
         WHERE parent_id = $1",
        &[&parent.as_uuid()],
    )
    .await
    .expect("held");
    tx.commit().await.expect("commit");
    let (to_start, ended) = (children[0], children[1]);
    let input = sheaf_driver::Json::from_serialize(&json!({})).expect("an input");
    c.protocol()
        .relay_start_child(ended, parent, "res-drain-child", &keys[1], &input)
        .await
        .expect("started on the leaving shard");
    db.execute(
        "UPDATE sheaf.cross_shard_children SET state = 'RUNNING', input = NULL WHERE child_id = $1",
        &[&ended.as_uuid()],
    )
    .await
    .expect("recorded as started");
    assert!(
        c.complete_execution(ended, json!({"n": 1}))
            .await
            .expect("it ends")
    );
    (to_start, ended)
}

/// What a dry-run drain of `leaving` reports unsettled about `children`.
async fn unsettled(
    c: &Client,
    leaving: ShardId,
    children: &[ExecutionId],
) -> Vec<(ExecutionId, ShardId, String)> {
    let drain = c
        .admin()
        .drain(leaving, &RebalanceOptions::default().dry_run(true), |_, _| {})
        .await
        .expect("a dry-run drain");
    drain
        .unsettled
        .into_iter()
        .filter_map(|u| u.execution_id.map(|id| (id, u.shard, u.reason)))
        .filter(|(id, ..)| children.contains(id))
        .collect()
}

/// A drain of a shard reports, as unsettled, the relay work its
/// retirement would lose: a child still to be started there for a parent
/// elsewhere, and a child that ended there whose end its parent (elsewhere)
/// has not pulled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_reports_relay_work_its_retirement_would_lose() {
    let c = client();
    let (parent_shard, leaving) = (sid(0), sid(2));
    let parent = start_on(&c, parent_shard, &unique("res-drain"), "p-1").await;
    let mut db = connect(fleet().get(parent_shard).expect("the parent's shard")).await;
    let (to_start, ended) = held_children(&c, &mut db, parent, leaving).await;
    let owed = unsettled(&c, leaving, &[to_start, ended]).await;
    assert_eq!(owed.len(), 2, "{owed:?}");
    assert!(
        owed.iter()
            .any(|(id, s, why)| *id == to_start && *s == parent_shard && why.contains("still to be started")),
        "{owed:?}"
    );
    assert!(
        owed.iter()
            .any(|(id, s, why)| *id == ended && *s == parent_shard && why.contains("has not had its end")),
        "{owed:?}"
    );
    // Let the relay have them: once it started the one and pulled the
    // other's end, the drain owes nothing for them.
    db.execute(
        "UPDATE sheaf.cross_shard_children SET lease_token = NULL, due_at = now() WHERE parent_id = $1",
        &[&parent.as_uuid()],
    )
    .await
    .expect("let go");
    let relay = Relay::start(
        c.clone(),
        fleet().shards().map(|s| s.id).collect(),
        RelayOptions::default(),
    );
    until("the relay settles both", Duration::from_secs(30), async || {
        count(&event_types(&c, parent).await, "ChildCompleted") == 1
            && c.get_execution(to_start).await.ok().flatten().is_some()
    })
    .await;
    relay.shutdown().await;
    assert_eq!(unsettled(&c, leaving, &[to_start, ended]).await, vec![]);
    c.cancel_execution(to_start, None).await.expect("cancelled");
    c.cancel_execution(parent, None).await.expect("cancelled");
}

async fn seal_state(db: &tokio_postgres::Client, id: ExecutionId) -> Option<bool> {
    db.query_opt(
        "SELECT seal_released_at IS NOT NULL FROM sheaf.executions WHERE id = $1 AND state = 'MIGRATED'",
        &[&id.as_uuid()],
    )
    .await
    .expect("reading a seal")
    .map(|r| r.get(0))
}

/// A seal past its retention window stays while its run lives elsewhere
/// (it is the only forward for ids of its shard); once the relay's check
/// finds the run ended where it lives, retention deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_seal_is_kept_while_its_run_lives() {
    let c = client();
    let (born, home) = (sid(0), sid(1));
    let id = start_on(&c, born, &unique("res-seal"), "s-1").await;
    moved(&c, born, id, home).await;
    let db = connect(fleet().get(born).expect("the origin")).await;
    // This shard alone keeps seals an hour, and this one is a day old.
    db.execute(r#"SELECT sheaf.set_retention('{"seals": "1h"}')"#, &[])
        .await
        .expect("a policy");
    db.execute(
        "UPDATE sheaf.executions SET closed_at = now() - interval '1 day' WHERE id = $1",
        &[&id.as_uuid()],
    )
    .await
    .expect("an old seal");
    c.protocol().confirm_seals(born, 1000).await.expect("a check");
    db.execute("SELECT sheaf.maintain()", &[])
        .await
        .expect("maintain");
    assert_eq!(seal_state(&db, id).await, Some(false), "kept: its run lives");
    assert!(
        c.get_execution(id).await.expect("a read").is_some(),
        "its id resolves"
    );
    assert!(c.cancel_execution(id, None).await.expect("a cancel"));
    c.protocol().confirm_seals(born, 1000).await.expect("a check");
    assert_eq!(seal_state(&db, id).await, Some(true), "its run ended");
    db.execute("SELECT sheaf.maintain()", &[])
        .await
        .expect("maintain");
    assert_eq!(seal_state(&db, id).await, None, "deleted once its run ended");
    db.execute(r#"SELECT sheaf.set_retention('{"seals": null}')"#, &[])
        .await
        .expect("the policy back");
}

/// A seal pointing at a shard since retired is followed through the
/// forwards entry that replaced it: a run born on 0, moved to 1 and on to
/// 2, whose origin's seal still points at 1 (its repoint to 2 not applied
/// yet: set so from outside), is reached from its id once 1 is gone
/// (`1=2`), where the call once failed on a shard the topology no longer
/// has.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_seal_pointing_at_a_retired_shard_is_followed_by_its_forward() {
    let c = client();
    let (born, retired, home) = (sid(0), sid(1), sid(2));
    let name = unique("res-retired");
    let id = start_on(&c, born, &name, "r-1").await;
    moved(&c, born, id, retired).await;
    moved(&c, retired, id, home).await;
    let origin = connect(fleet().get(born).expect("the origin")).await;
    let stale = origin
        .execute(
            "UPDATE sheaf.executions SET migrated_to_shard = $2 WHERE id = $1 AND state = 'MIGRATED'",
            &[&id.as_uuid(), &i32::from(retired.get())],
        )
        .await
        .expect("a repoint undone from outside");
    assert_eq!(stale, 1, "the origin's seal");
    let without: Vec<&str> = fleet_spec()
        .split([',', '\n'])
        .map(str::trim)
        .filter(|entry| !entry.is_empty() && !entry.starts_with(&format!("{}=", retired.get())))
        .collect();
    let topology = TopologyBuilder::from_spec(&without.join(","))
        .expect("a spec")
        .forward(u32::from(retired.get()), u32::from(home.get()))
        .build()
        .expect("a topology");
    let r = Client::new(topology, PoolOptions::default()).expect("a client");
    let e = r.get_execution(id).await.expect("a read").expect("found");
    assert_eq!(e.shard, home, "reached where it lives");
    assert!(
        r.signal(id, "poke", json!({}), None).await.expect("a signal"),
        "signalled there"
    );
}
