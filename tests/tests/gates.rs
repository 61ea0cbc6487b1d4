//! Workflow admission under real concurrency: the concurrency gate's three
//! answers to a full key (cancel_running supersedes the oldest, reject
//! refuses, defer admits and holds the workflow tasks back), quotas that refuse
//! without writing and whose counters match a recount after a random
//! concurrent workload, a re-start of a running workflow id attaching to it,
//! and bad input to every function of the executions API.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use sheaf_driver::Shard;
use sheaf_tests::workflows::{Started, start, start_new};
use sheaf_tests::{Rng, code, connect, fleet, own_database, query_retrying, sqlstate, unique};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Error};
use uuid::Uuid;

/// The non-terminal states: what a gate and a quota count as active.
const ACTIVE: &str = "state IN ('RUNNING', 'SUSPENDED', 'PAUSED')";
/// What one admission may cancel under cancel_running.
const SUPERSEDE_BATCH: usize = 32;
/// The bad-input test's own database.
const DB: &str = "sheaf_gates_bad_input";

fn shard(n: usize) -> &'static Shard {
    fleet().shards().nth(n).unwrap()
}

async fn declare(db: &Client, name: &str, policy: Value) {
    db.execute("SELECT sheaf.declare_workflow($1, $2)", &[&name, &policy])
        .await
        .unwrap_or_else(|e| panic!("declare_workflow {name} {policy}: {e}"));
}

async fn count(db: &Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> i64 {
    db.query_one(sql, params)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

/// The active executions of a workflow name, oldest first.
async fn active_ids(db: &Client, name: &str) -> Vec<Uuid> {
    db.query(
        &format!(
            "SELECT id FROM sheaf.executions WHERE workflow_name = $1 AND {ACTIVE} ORDER BY created_at, id"
        ),
        &[&name],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

async fn state_of(db: &Client, id: Uuid) -> String {
    db.query_one("SELECT state FROM sheaf.get_execution($1)", &[&id])
        .await
        .unwrap_or_else(|e| panic!("get_execution {id}: {e}"))
        .get(0)
}

/// What a workflow name has written: its executions, their events, their
/// tasks, and every task in its policy queue (so a refused start cannot hide
/// an orphan task either).
async fn footprint(db: &Client, name: &str, queue: &str) -> [i64; 4] {
    let row = db
        .query_one(
            "SELECT (SELECT count(*) FROM sheaf.executions WHERE workflow_name = $1), \
                    (SELECT count(*) FROM sheaf.events e JOIN sheaf.executions x ON x.id = e.execution_id \
                      WHERE x.workflow_name = $1), \
                    (SELECT count(*) FROM sheaf.tasks t JOIN sheaf.executions x ON x.id = t.execution_id \
                      WHERE x.workflow_name = $1), \
                    (SELECT count(*) FROM sheaf.tasks WHERE queue = $2)",
            &[&name, &queue],
        )
        .await
        .unwrap();
    [row.get(0), row.get(1), row.get(2), row.get(3)]
}

async fn find(db: &Client, name: &str, workflow_id: &str) -> Vec<Uuid> {
    db.query(
        "SELECT execution_id FROM sheaf.find_execution($1, $2)",
        &[&name, &workflow_id],
    )
    .await
    .unwrap_or_else(|e| panic!("find_execution {name}/{workflow_id}: {e}"))
    .iter()
    .map(|r| r.get(0))
    .collect()
}

async fn transition(db: &Client, sql: &str, id: Uuid) -> bool {
    db.query_one(sql, &[&id])
        .await
        .unwrap_or_else(|e| panic!("{sql} on {id}: {e}"))
        .get(0)
}

/// One start call of the concurrent supersede run, stamped on one shared
/// clock before it was sent and after it returned.
struct Admission {
    workflow_id: String,
    started: Started,
    issued: u64,
    returned: u64,
}

// A scenario reads top to bottom as one story (set up, race, check);
// split into helpers it would scatter what it asserts.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_running_keeps_only_the_newest_of_100_concurrent_starts() {
    const STARTS: usize = 100;
    const CONNECTIONS: usize = 16;
    let admin = connect(shard(0)).await;
    let name = unique("supersede");
    let queue = unique("supersede-q");
    let doc = unique("doc");
    declare(
        &admin,
        &name,
        json!({"queue": queue,
               "concurrency": {"key": "input.doc", "limit": 1, "on_conflict": "cancel_running"}}),
    )
    .await;

    let clock = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let mut pool = Vec::new();
    for _ in 0..CONNECTIONS {
        let (clock, next, name, doc) = (clock.clone(), next.clone(), name.clone(), doc.clone());
        pool.push(tokio::spawn(async move {
            let db = connect(shard(0)).await;
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, SeqCst);
                if i >= STARTS {
                    return mine;
                }
                let workflow_id = format!("run-{i}");
                let issued = clock.fetch_add(1, SeqCst);
                let started = start_new(&db, &name, &workflow_id, &json!({"doc": doc, "i": i})).await;
                let returned = clock.fetch_add(1, SeqCst);
                mine.push(Admission {
                    workflow_id,
                    started,
                    issued,
                    returned,
                });
            }
        }));
    }
    let mut admissions = Vec::new();
    for c in pool {
        admissions.extend(c.await.unwrap());
    }
    assert_eq!(admissions.len(), STARTS);
    let by_id: HashMap<Uuid, &Admission> = admissions.iter().map(|a| (a.started.id, a)).collect();
    assert_eq!(by_id.len(), STARTS, "every start made its own execution");

    let active = active_ids(&admin, &name).await;
    assert_eq!(active.len(), 1, "exactly one run of the key survives: {active:?}");
    let survivor = by_id[&active[0]];

    // Admissions are serialized per key, and each cancelled the run before
    // it: every other execution was superseded exactly once, the survivor
    // never.
    let mut superseded = HashSet::new();
    for a in &admissions {
        assert!(a.started.superseded.len() <= SUPERSEDE_BATCH);
        for old in &a.started.superseded {
            assert!(superseded.insert(*old), "{old} superseded twice");
            // It was admitted before the start that cancelled it returned.
            let old = by_id
                .get(old)
                .unwrap_or_else(|| panic!("{} superseded {old}, not one of ours", a.workflow_id));
            assert!(old.issued < a.returned);
        }
    }
    let others: HashSet<Uuid> = by_id
        .keys()
        .copied()
        .filter(|id| *id != survivor.started.id)
        .collect();
    assert_eq!(
        superseded, others,
        "the survivor is the only run nobody superseded"
    );
    // Newest wins: no start was even sent after the survivor's had returned
    // (such a start would have been admitted after it, and cancelled it).
    for a in &admissions {
        assert!(
            a.issued < survivor.returned,
            "{} was sent after the survivor {} returned",
            a.workflow_id,
            survivor.workflow_id
        );
    }
    // The executions table records admission order: the survivor came last.
    let newest: Uuid = admin
        .query_one(
            "SELECT id FROM sheaf.executions WHERE workflow_name = $1 ORDER BY seq DESC LIMIT 1",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(newest, survivor.started.id, "the survivor is the last admitted");
    let last_returned = admissions.iter().map(|a| a.returned).max().unwrap();
    println!(
        "survivor {} returned {}",
        survivor.workflow_id,
        if survivor.returned == last_returned {
            "last"
        } else {
            "among the last, concurrently"
        }
    );

    let cancelled = count(
        &admin,
        "SELECT count(*) FROM sheaf.executions WHERE workflow_name = $1 AND state = 'CANCELLED'",
        &[&name],
    )
    .await;
    assert_eq!(cancelled, STARTS as i64 - 1);
    let unexplained = count(
        &admin,
        "SELECT count(*) FROM sheaf.executions x WHERE x.workflow_name = $1 AND x.state = 'CANCELLED' \
         AND NOT EXISTS (SELECT FROM sheaf.events e WHERE e.execution_id = x.id \
           AND e.event_type = 'WorkflowCancelled' AND e.payload->>'reason' ILIKE '%supersede%')",
        &[&name],
    )
    .await;
    assert_eq!(unexplained, 0, "every cancelled run records why");
}

#[tokio::test]
async fn a_deferred_backlog_converges_within_32_cancellations_per_start() {
    const BACKLOG: usize = 80;
    let db = connect(shard(1)).await;
    let name = unique("backlog");
    let bystander = unique("bystander");
    let doc = unique("doc");
    let defer = |queue: String| {
        json!({"queue": queue,
               "concurrency": {"key": "input.doc", "limit": 1, "on_conflict": "defer"}})
    };
    declare(&db, &name, defer(unique("backlog-q"))).await;
    declare(&db, &bystander, defer(unique("bystander-q"))).await;
    for i in 0..BACKLOG {
        start_new(&db, &name, &format!("old-{i}"), &json!({"doc": doc})).await;
    }
    // Same key string, other workflow name: another gate.
    for i in 0..3 {
        start_new(&db, &bystander, &format!("b-{i}"), &json!({"doc": doc})).await;
    }
    assert_eq!(active_ids(&db, &name).await.len(), BACKLOG);

    declare(
        &db,
        &name,
        json!({"queue": unique("backlog-q"),
               "concurrency": {"key": "input.doc", "limit": 1, "on_conflict": "cancel_running"}}),
    )
    .await;
    let mut active = BACKLOG;
    let mut newest = None;
    for round in 0..3 {
        let s = start_new(&db, &name, &format!("new-{round}"), &json!({"doc": doc})).await;
        assert!(
            s.superseded.len() <= SUPERSEDE_BATCH,
            "round {round} cancelled {}",
            s.superseded.len()
        );
        assert!(!s.superseded.contains(&s.id));
        for old in &s.superseded {
            assert_eq!(state_of(&db, *old).await, "CANCELLED");
        }
        active = active + 1 - s.superseded.len();
        assert_eq!(active_ids(&db, &name).await.len(), active, "round {round}");
        newest = Some(s.id);
    }
    assert_eq!(
        active_ids(&db, &name).await,
        vec![newest.unwrap()],
        "only the newest run is left"
    );
    assert_eq!(
        active_ids(&db, &bystander).await.len(),
        3,
        "the other workflow name is untouched"
    );
}

#[tokio::test]
async fn reject_refuses_a_full_key_and_writes_nothing() {
    let db = connect(shard(0)).await;
    let name = unique("reject");
    let queue = unique("reject-q");
    let doc = unique("doc");
    declare(
        &db,
        &name,
        json!({"queue": queue,
               "concurrency": {"key": "input.doc", "limit": 2, "on_conflict": "reject"}}),
    )
    .await;
    let input = json!({"doc": doc});
    let first = start_new(&db, &name, "w1", &input).await;
    let second = start_new(&db, &name, "w2", &input).await;

    let before = footprint(&db, &name, &queue).await;
    assert_eq!(sqlstate(start(&db, &name, "w3", &input).await), "55006");
    assert_eq!(
        footprint(&db, &name, &queue).await,
        before,
        "a refused start wrote"
    );
    assert!(find(&db, &name, "w3").await.is_empty());

    // Asking again for a running workflow id is not a new admission: it
    // attaches even though the key is full.
    let again = start(&db, &name, "w2", &input).await.unwrap();
    assert!(!again.created && again.id == second.id, "{again:?}");
    assert_eq!(footprint(&db, &name, &queue).await, before);

    // Another key value is another gate.
    start_new(&db, &name, "w4", &json!({"doc": unique("doc")})).await;
    // A run that ends makes room.
    assert!(transition(&db, "SELECT sheaf.cancel_execution($1, 'make room')", first.id).await);
    start_new(&db, &name, "w3", &input).await;
    assert_eq!(sqlstate(start(&db, &name, "w5", &input).await), "55006");
}

#[tokio::test]
async fn defer_admits_every_start_and_runs_at_most_limit_workflow_tasks() {
    let db = connect(shard(1)).await;
    let name = unique("defer");
    let queue = unique("defer-q");
    let doc = unique("doc");
    declare(
        &db,
        &name,
        json!({"queue": queue,
               "concurrency": {"key": "input.doc", "limit": 2, "on_conflict": "defer"}}),
    )
    .await;
    let mut ids = HashSet::new();
    for i in 0..6 {
        let s = start_new(&db, &name, &format!("d{i}"), &json!({"doc": doc})).await;
        assert!(s.superseded.is_empty(), "defer cancels nothing: {s:?}");
        ids.insert(s.id);
    }
    assert_eq!(active_ids(&db, &name).await.len(), 6);

    let claim = "SELECT task_id, token, execution_id, concurrency_key, kind FROM sheaf.claim($1, 'w', 10)";
    let claimed = db.query(claim, &[&queue]).await.unwrap();
    assert_eq!(claimed.len(), 2, "the key's cap is the gate's limit");
    for row in &claimed {
        assert!(ids.contains(&row.get::<_, Uuid>(2)));
        assert_eq!(row.get::<_, String>(3), format!("{name}:{doc}"));
        assert_eq!(row.get::<_, String>(4), "workflow");
    }
    assert!(db.query(claim, &[&queue]).await.unwrap().is_empty());

    let (task, token): (Uuid, i64) = (claimed[0].get(0), claimed[0].get(1));
    db.execute("SELECT sheaf.complete($1, $2)", &[&task, &token])
        .await
        .unwrap();
    assert_eq!(
        db.query(claim, &[&queue]).await.unwrap().len(),
        1,
        "a finished workflow task frees its slot for the next"
    );
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Usage {
    active_executions: i64,
    history_bytes: i64,
    dead_letters: i64,
}

async fn quota(db: &Client, function: &str, key: &str) -> Usage {
    let rows = query_retrying(
        db,
        &format!("SELECT active_executions, history_bytes, dead_letters FROM sheaf.{function}($1)"),
        &[&key],
    )
    .await
    .unwrap_or_else(|e| panic!("{function}({key}): {e}"));
    assert_eq!(rows.len(), 1, "{function} returns one row");
    Usage {
        active_executions: rows[0].get(0),
        history_bytes: rows[0].get(1),
        dead_letters: rows[0].get(2),
    }
}

/// The numbers a message states, once the names in it (which may contain
/// digits) are cut out.
fn numbers_in(message: &str, names: &[&str]) -> HashSet<u64> {
    let mut m = message.to_owned();
    for n in names {
        m = m.replace(n, " ");
    }
    m.split(|c: char| !c.is_ascii_digit())
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// Asserts a start is refused by the quota, with a message naming the
/// workflow, the key, the resource, the limit and the usage.
async fn assert_quota_refused(
    db: &Client,
    name: &str,
    tenant: &str,
    workflow_id: &str,
    limit: u64,
    usage: u64,
) {
    let err = match start(db, name, workflow_id, &json!({"tenant": tenant})).await {
        Ok(s) => panic!("admitted past the quota: {s:?}"),
        Err(e) => e,
    };
    let db_err = err
        .as_db_error()
        .unwrap_or_else(|| panic!("not a database error: {err}"));
    assert_eq!(db_err.code().code(), "53400", "{}", db_err.message());
    let message = db_err.message();
    for part in [name, tenant, "max_active_executions"] {
        assert!(message.contains(part), "{message:?} does not name {part}");
    }
    let numbers = numbers_in(message, &[name, tenant, workflow_id]);
    assert!(
        numbers.contains(&limit) && numbers.contains(&usage),
        "{message:?} does not state limit {limit} and usage {usage}"
    );
}

#[tokio::test]
async fn the_quota_refuses_past_max_active_executions_and_writes_nothing() {
    let db = connect(shard(0)).await;
    let name = unique("quota");
    let queue = unique("quota-q");
    let tenant = unique("tenant");
    let policy = |limit: i64| json!({"queue": queue, "quota": {"key": "input.tenant", "max_active_executions": limit}});
    declare(&db, &name, policy(5)).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            start_new(&db, &name, &format!("q{i}"), &json!({"tenant": tenant}))
                .await
                .id,
        );
    }
    let usage = quota(&db, "quota_usage", &tenant).await;
    assert_eq!((usage.active_executions, usage.dead_letters), (5, 0));

    let before = footprint(&db, &name, &queue).await;
    assert_quota_refused(&db, &name, &tenant, "q5", 5, 5).await;
    assert_eq!(
        footprint(&db, &name, &queue).await,
        before,
        "a refused start wrote"
    );
    assert!(find(&db, &name, "q5").await.is_empty());
    assert_eq!(quota(&db, "quota_usage", &tenant).await, usage);

    // Lowered below the usage: the message tells the two apart.
    declare(&db, &name, policy(3)).await;
    assert_quota_refused(&db, &name, &tenant, "q5", 3, 5).await;
    // Another tenant has its own usage; an input without the key has none.
    start_new(&db, &name, "other", &json!({"tenant": unique("tenant")})).await;
    start_new(&db, &name, "keyless", &json!({"n": 1})).await;

    // Closing runs frees the quota: refused while usage >= limit.
    for id in &ids[..2] {
        assert!(transition(&db, "SELECT sheaf.complete_execution($1, '{}')", *id).await);
    }
    assert_eq!(quota(&db, "quota_usage", &tenant).await.active_executions, 3);
    assert_quota_refused(&db, &name, &tenant, "q5", 3, 3).await;
    assert!(transition(&db, "SELECT sheaf.terminate_execution($1, 'room')", ids[2]).await);
    start_new(&db, &name, "q5", &json!({"tenant": tenant})).await;
    assert_eq!(quota(&db, "quota_usage", &tenant).await.active_executions, 3);
}

/// The shared setting of the quota drift workload.
struct DriftPlan {
    names: [String; 2],
    tenants: Vec<String>,
    /// Activity tasks of the runs go here, to be dead-lettered.
    activities: String,
}

#[derive(Clone, Copy)]
struct Run {
    id: Uuid,
    tenant: Option<usize>,
}

#[derive(Default, Debug)]
struct Tally {
    started: usize,
    appended: usize,
    dead_lettered: usize,
    closed: usize,
    refused_closed: usize,
}

/// Ok, or refused because the run is closed (another connection may close it
/// at any time); anything else fails the test.
fn unless_closed<T>(what: &str, result: Result<T, Error>, tally: &mut Tally) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(e) if code(&e) == Some("55000") => {
            tally.refused_closed += 1;
            None
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

async fn drift_start(db: &Client, plan: &DriftPlan, runs: &Mutex<Vec<Run>>, rng: &mut Rng, wid: String) {
    let name = &plan.names[rng.below(2) as usize];
    // One in four inputs has no tenant: no quota key, nothing counted.
    let t = rng.below(plan.tenants.len() as u64 + 1) as usize;
    let (tenant, input) = match plan.tenants.get(t) {
        Some(key) => (Some(t), json!({"tenant": key})),
        None => (None, json!({"n": t})),
    };
    let s = start_new(db, name, &wid, &input).await;
    runs.lock().unwrap().push(Run { id: s.id, tenant });
}

/// Enqueues a single-attempt activity task for the run, claims one (maybe
/// another connection's) and fails it: a dead letter.
async fn drift_dead_letter(db: &Client, plan: &DriftPlan, run: Run, worker: &str, tally: &mut Tally) {
    let opts = json!({"execution_id": run.id.to_string(), "max_attempts": 1});
    let enqueued = query_retrying(
        db,
        "SELECT sheaf.enqueue($1, $2, $3)",
        &[&plan.activities, &json!({"run": run.id.to_string()}), &opts],
    )
    .await;
    if unless_closed("enqueue", enqueued, tally).is_none() {
        return;
    }
    let claimed = query_retrying(
        db,
        "SELECT task_id, token FROM sheaf.claim($1, $2, 1)",
        &[&plan.activities, &worker],
    )
    .await
    .unwrap_or_else(|e| panic!("claim: {e:?}"));
    for row in claimed {
        let (task, token): (Uuid, i64) = (row.get(0), row.get(1));
        let failed = match query_retrying(
            db,
            "SELECT dead_lettered FROM sheaf.fail($1, $2, 'boom')",
            &[&task, &token],
        )
        .await
        {
            Ok(rows) => rows,
            // Another connection ended the task's execution, which cancelled
            // (deleted) the task: it is gone, and there is no dead letter.
            Err(e) if code(&e) == Some("P0002") => continue,
            Err(e) => panic!("fail {task}: {e}"),
        };
        assert!(
            failed[0].get::<_, bool>(0),
            "a single attempt ends in a dead letter"
        );
        tally.dead_lettered += 1;
    }
}

async fn drift_run(
    shard: &Shard,
    w: usize,
    plan: &DriftPlan,
    runs: &Mutex<Vec<Run>>,
    rng: &mut Rng,
    ops: usize,
) -> Tally {
    let db = connect(shard).await;
    let worker = format!("drift-{w}");
    let mut tally = Tally::default();
    for op in 0..ops {
        let pick = {
            let runs = runs.lock().unwrap();
            (!runs.is_empty()).then(|| runs[rng.below(runs.len() as u64) as usize])
        };
        let (roll, run) = match pick {
            Some(run) => (rng.below(100), run),
            None => (
                0,
                Run {
                    id: Uuid::nil(),
                    tenant: None,
                },
            ),
        };
        match roll {
            0..=24 => {
                drift_start(&db, plan, runs, rng, format!("{w}-{op}")).await;
                tally.started += 1;
            }
            25..=44 => {
                let pad = "x".repeat(rng.below(4000) as usize);
                let r = query_retrying(
                    &db,
                    "SELECT sheaf.append_event($1, 'Note', $2)",
                    &[&run.id, &json!({"pad": pad})],
                )
                .await;
                if unless_closed("append_event", r, &mut tally).is_some() {
                    tally.appended += 1;
                }
            }
            45..=59 => drift_dead_letter(&db, plan, run, &worker, &mut tally).await,
            60..=79 => {
                let sql = [
                    "SELECT sheaf.complete_execution($1, '{\"ok\": true}')",
                    "SELECT sheaf.fail_execution($1, 'drift')",
                    "SELECT sheaf.cancel_execution($1, 'drift')",
                    "SELECT sheaf.terminate_execution($1, 'drift')",
                ][rng.below(4) as usize];
                // Closing a closed run answers false, never an error.
                let r = query_retrying(&db, sql, &[&run.id])
                    .await
                    .unwrap_or_else(|e| panic!("{sql} on {}: {e}", run.id));
                if r[0].get::<_, bool>(0) {
                    tally.closed += 1;
                }
            }
            _ => {
                let sql = [
                    "SELECT sheaf.pause_execution($1)",
                    "SELECT sheaf.resume_execution($1)",
                    "SELECT sheaf.suspend_execution($1)",
                    "SELECT sheaf.wake_execution($1)",
                ][rng.below(4) as usize];
                let r = query_retrying(&db, sql, &[&run.id]).await;
                unless_closed(sql, r, &mut tally);
            }
        }
    }
    tally
}

/// Recounts a tenant's usage from the runs the workload made, through the
/// raw tables.
async fn recount(db: &Client, ids: &[Uuid]) -> Usage {
    let row = db
        .query_one(
            &format!(
                "SELECT count(*) FILTER (WHERE {ACTIVE}), \
                        coalesce(sum(history_bytes) FILTER (WHERE {ACTIVE}), 0)::bigint, \
                        (SELECT count(*) FROM sheaf.dead_letters WHERE execution_id = ANY($1)) \
                 FROM sheaf.executions WHERE id = ANY($1)"
            ),
            &[&ids],
        )
        .await
        .unwrap();
    Usage {
        active_executions: row.get(0),
        history_bytes: row.get(1),
        dead_letters: row.get(2),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_counters_match_a_recount_after_a_random_concurrent_workload() {
    const WORKERS: usize = 4;
    const OPS: usize = 150;
    let db = connect(shard(1)).await;
    let (_, seed) = Rng::from_time();
    let plan = Arc::new(DriftPlan {
        names: [unique("drift-a"), unique("drift-b")],
        tenants: (0..3).map(|_| unique("tenant")).collect(),
        activities: unique("drift-act"),
    });
    println!("seed {seed}, workflows {:?}", plan.names);
    // Limits far above the workload: counting, not refusing, is under test.
    // Both names share the tenants: usage is per key across workflow names.
    for name in &plan.names {
        declare(
            &db,
            name,
            json!({"queue": unique("drift-q"),
                   "quota": {"key": "input.tenant", "max_active_executions": 1_000_000,
                             "max_history_bytes": 1_000_000_000_000i64, "max_dead_letters": 1_000_000}}),
        )
        .await;
    }
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (plan, runs) = (plan.clone(), runs.clone());
        let mut rng = Rng::new(seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        workers.push(tokio::spawn(async move {
            drift_run(shard(1), w, &plan, &runs, &mut rng, OPS).await
        }));
    }
    for w in workers {
        println!("{:?}", w.await.unwrap());
    }

    let runs = runs.lock().unwrap().clone();
    let all: Vec<Uuid> = runs.iter().map(|r| r.id).collect();
    let mut busy = 0;
    for (t, tenant) in plan.tenants.iter().enumerate() {
        let usage = quota(&db, "quota_usage", tenant).await;
        let recomputed = quota(&db, "quota_recompute", tenant).await;
        assert_eq!(
            usage, recomputed,
            "tenant {tenant}: the counters drifted (seed {seed})"
        );
        let ids: Vec<Uuid> = runs
            .iter()
            .filter(|r| r.tenant == Some(t))
            .map(|r| r.id)
            .collect();
        assert_eq!(
            recount(&db, &ids).await,
            recomputed,
            "tenant {tenant}: the recount is wrong"
        );
        // Recomputing stored what it counted.
        assert_eq!(quota(&db, "quota_usage", tenant).await, recomputed);
        println!("tenant {tenant}: {usage:?}");
        busy += usize::from(usage.history_bytes > 0 && usage.dead_letters > 0);
    }
    assert!(
        busy > 0,
        "the workload never both appended and dead-lettered for a tenant (seed {seed})"
    );
    // Each run's byte count is its history's.
    let off = count(
        &db,
        "SELECT count(*) FROM sheaf.executions x WHERE x.id = ANY($1) AND x.history_bytes <> \
         coalesce((SELECT sum(bytes) FROM sheaf.events e WHERE e.execution_id = x.id), 0)",
        &[&all],
    )
    .await;
    assert_eq!(off, 0, "history_bytes differs from the sum of its events' bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restarting_a_running_workflow_id_attaches_and_a_closed_one_starts_fresh() {
    let db = connect(shard(0)).await;
    let name = unique("attach");
    let queue = unique("attach-q");
    declare(&db, &name, json!({"queue": queue})).await;

    let first = start_new(&db, &name, "order-1", &json!({"n": 1})).await;
    assert!(first.superseded.is_empty());
    let before = footprint(&db, &name, &queue).await;
    let again = start(&db, &name, "order-1", &json!({"n": 2})).await.unwrap();
    assert!(!again.created && again.id == first.id, "{again:?}");
    assert!(again.superseded.is_empty());
    assert_eq!(footprint(&db, &name, &queue).await, before, "attaching wrote");
    let input: Value = db
        .query_one("SELECT input FROM sheaf.get_execution($1)", &[&first.id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(input, json!({"n": 1}), "attaching keeps the running input");

    assert!(
        transition(
            &db,
            "SELECT sheaf.complete_execution($1, '{\"ok\": true}')",
            first.id
        )
        .await
    );
    let fresh = start_new(&db, &name, "order-1", &json!({"n": 3})).await;
    assert_ne!(fresh.id, first.id);
    assert_eq!(state_of(&db, first.id).await, "COMPLETED");
    assert!(find(&db, &name, "order-1").await.contains(&fresh.id));

    // Racing starts of one new workflow id: one creates, the rest attach.
    const RACERS: usize = 12;
    let mut racers = Vec::new();
    for _ in 0..RACERS {
        let name = name.clone();
        racers.push(tokio::spawn(async move {
            let db = connect(shard(0)).await;
            start(&db, &name, "order-2", &json!({"n": 4}))
                .await
                .unwrap_or_else(|e| panic!("racing start: {e}"))
        }));
    }
    let mut results = Vec::new();
    for r in racers {
        results.push(r.await.unwrap());
    }
    assert_eq!(results.iter().filter(|s| s.created).count(), 1, "{results:?}");
    let ids: HashSet<Uuid> = results.iter().map(|s| s.id).collect();
    assert_eq!(ids.len(), 1, "every racer got the same execution: {results:?}");
    let rows = count(
        &db,
        "SELECT count(*) FROM sheaf.executions WHERE workflow_name = $1 AND workflow_id = 'order-2'",
        &[&name],
    )
    .await;
    assert_eq!(rows, 1);
}

/// Every table the executions API and the mutex can write, on one shard.
const TABLES: &str = "SELECT (SELECT count(*) FROM sheaf.executions), (SELECT count(*) FROM sheaf.events), \
    (SELECT count(*) FROM sheaf.tasks), (SELECT count(*) FROM sheaf.ready), \
    (SELECT count(*) FROM sheaf.queues), (SELECT count(*) FROM sheaf.dead_letters), \
    (SELECT count(*) FROM sheaf.workflow_policies), (SELECT count(*) FROM sheaf.mutex_locks), \
    (SELECT count(*) FROM sheaf.mutex_waiters), (SELECT count(*) FROM sheaf.quota_usage)";

async fn table_counts(db: &Client) -> Vec<i64> {
    let row = db.query_one(TABLES, &[]).await.unwrap();
    (0..row.len()).map(|i| row.get(i)).collect()
}

/// `(sql, SQLSTATE, what the message must name)` for every function of the
/// executions API and the mutex. Placeholders: `$NAME` a declared workflow
/// (gate key `input.doc`), `$RUNNING` a running execution, `$CLOSED` a
/// completed one, `$UNKNOWN` an id minted on this shard that names no
/// execution, `$OWNER` a mutex owner holding nothing.
const BAD_CALLS: &[(&str, &str, &str)] = &[
    (r#"SELECT sheaf.declare_workflow(NULL, '{}')"#, "22004", "name"),
    (
        r#"SELECT sheaf.declare_workflow('$NAME-x', NULL)"#,
        "22004",
        "policy",
    ),
    (r#"SELECT sheaf.declare_workflow('', '{}')"#, "22023", "name"),
    (
        r#"SELECT sheaf.declare_workflow('$NAME-x', '[]')"#,
        "22023",
        "policy",
    ),
    (
        r#"SELECT sheaf.declare_workflow('$NAME-x', '{"queu": "q"}')"#,
        "22023",
        "queu",
    ),
    (
        r#"SELECT sheaf.declare_workflow('$NAME-x', '{"queue": ""}')"#,
        "22023",
        "queue",
    ),
    (
        r#"SELECT sheaf.declare_workflow('$NAME-x', '{"concurrency": {"key": "tenant", "limit": 1}}')"#,
        "22023",
        "concurrency.key",
    ),
    (
        r#"SELECT sheaf.declare_workflow('$NAME-x', '{"concurrency": {"key": "input.doc", "limit": -1}}')"#,
        "22023",
        "limit",
    ),
    (
        r#"SELECT sheaf.declare_workflow('$NAME-x',
             '{"concurrency": {"key": "input.doc", "limit": 1, "on_conflict": "explode"}}')"#,
        "22023",
        "on_conflict",
    ),
    (
        r#"SELECT sheaf.declare_workflow('$NAME-x', '{"quota": {"key": "input.t", "max_active_executions": -1}}')"#,
        "22023",
        "max_active_executions",
    ),
    (
        r#"SELECT sheaf.declare_workflow('$NAME-x', '{"quota": {"key": "input.t", "max_runs": 1}}')"#,
        "22023",
        "max_runs",
    ),
    (
        r#"SELECT * FROM sheaf.start_workflow(NULL, 'w', '{}')"#,
        "22004",
        "name",
    ),
    (
        r#"SELECT * FROM sheaf.start_workflow('$NAME', NULL, '{}')"#,
        "22004",
        "workflow_id",
    ),
    (
        r#"SELECT * FROM sheaf.start_workflow('$NAME', 'w', NULL)"#,
        "22004",
        "input",
    ),
    (
        r#"SELECT * FROM sheaf.start_workflow('$NAME', 'w', '{}', NULL)"#,
        "22004",
        "opts",
    ),
    (
        r#"SELECT * FROM sheaf.start_workflow('$NAME', '', '{}')"#,
        "22023",
        "workflow_id",
    ),
    (
        r#"SELECT * FROM sheaf.start_workflow('$NAME', 'w', '{}', '[]')"#,
        "22023",
        "opts",
    ),
    (
        r#"SELECT * FROM sheaf.start_workflow('$NAME', 'w', '{}', '{"priorty": 1}')"#,
        "22023",
        "priorty",
    ),
    (
        r#"SELECT * FROM sheaf.start_workflow('$NAME', 'w', '{}', '{"queue": ""}')"#,
        "22023",
        "queue",
    ),
    (
        r#"SELECT * FROM sheaf.start_workflow('$NAME', 'w', '{}', '{"run_at": "soon"}')"#,
        "22023",
        "run_at",
    ),
    (
        r#"SELECT * FROM sheaf.start_workflow('$NAME', 'w', '{}', '{"execution_id": "x"}')"#,
        "22023",
        "execution_id",
    ),
    // An id that carries no shard (or another shard) cannot name an execution here.
    (
        r#"SELECT * FROM sheaf.start_workflow('$NAME', 'w', '{}',
             '{"execution_id": "00000000-0000-8000-8000-00000000abcd"}')"#,
        "22023",
        "execution_id",
    ),
    // The gate key resolves to an object: no key can be made of it.
    (
        r#"SELECT * FROM sheaf.start_workflow('$NAME', 'w', '{"doc": {"a": 1}}')"#,
        "22023",
        "input",
    ),
    (
        r#"SELECT * FROM sheaf.find_execution(NULL, 'w')"#,
        "22004",
        "name",
    ),
    (
        r#"SELECT * FROM sheaf.find_execution('$NAME', NULL)"#,
        "22004",
        "workflow_id",
    ),
    (
        r#"SELECT * FROM sheaf.get_execution(NULL)"#,
        "22004",
        "execution_id",
    ),
    (
        r#"SELECT sheaf.append_event(NULL, 'Note', '{}')"#,
        "22004",
        "execution_id",
    ),
    (
        r#"SELECT sheaf.append_event('$RUNNING', NULL, '{}')"#,
        "22004",
        "event_type",
    ),
    (
        r#"SELECT sheaf.append_event('$RUNNING', '', '{}')"#,
        "22023",
        "event_type",
    ),
    (
        r#"SELECT sheaf.append_event('$RUNNING', 'Note', NULL)"#,
        "22004",
        "payload",
    ),
    (
        r#"SELECT sheaf.append_event('$UNKNOWN', 'Note', '{}')"#,
        "P0002",
        "$UNKNOWN",
    ),
    (
        r#"SELECT sheaf.append_event('$CLOSED', 'Note', '{}')"#,
        "55000",
        "$CLOSED",
    ),
    (
        r#"SELECT sheaf.complete_execution(NULL, '{}')"#,
        "22004",
        "execution_id",
    ),
    (
        r#"SELECT sheaf.complete_execution('$UNKNOWN', '{}')"#,
        "P0002",
        "$UNKNOWN",
    ),
    (
        r#"SELECT sheaf.fail_execution(NULL, 'x')"#,
        "22004",
        "execution_id",
    ),
    (
        r#"SELECT sheaf.fail_execution('$RUNNING', NULL)"#,
        "22004",
        "error",
    ),
    (
        r#"SELECT sheaf.fail_execution('$UNKNOWN', 'x')"#,
        "P0002",
        "$UNKNOWN",
    ),
    (
        r#"SELECT sheaf.cancel_execution(NULL, 'x')"#,
        "22004",
        "execution_id",
    ),
    (
        r#"SELECT sheaf.cancel_execution('$UNKNOWN', 'x')"#,
        "P0002",
        "$UNKNOWN",
    ),
    (
        r#"SELECT sheaf.terminate_execution(NULL, 'x')"#,
        "22004",
        "execution_id",
    ),
    (
        r#"SELECT sheaf.terminate_execution('$UNKNOWN', 'x')"#,
        "P0002",
        "$UNKNOWN",
    ),
    (r#"SELECT sheaf.pause_execution(NULL)"#, "22004", "execution_id"),
    (r#"SELECT sheaf.pause_execution('$UNKNOWN')"#, "P0002", "$UNKNOWN"),
    (r#"SELECT sheaf.pause_execution('$CLOSED')"#, "55000", "$CLOSED"),
    (r#"SELECT sheaf.resume_execution(NULL)"#, "22004", "execution_id"),
    (
        r#"SELECT sheaf.resume_execution('$UNKNOWN')"#,
        "P0002",
        "$UNKNOWN",
    ),
    (r#"SELECT sheaf.suspend_execution(NULL)"#, "22004", "execution_id"),
    (
        r#"SELECT sheaf.suspend_execution('$UNKNOWN')"#,
        "P0002",
        "$UNKNOWN",
    ),
    (
        r#"SELECT sheaf.suspend_execution('$RUNNING', 'infinity')"#,
        "22023",
        "wake_at",
    ),
    (r#"SELECT sheaf.wake_execution(NULL)"#, "22004", "execution_id"),
    (r#"SELECT sheaf.wake_execution('$UNKNOWN')"#, "P0002", "$UNKNOWN"),
    (r#"SELECT * FROM sheaf.history(NULL)"#, "22004", "execution_id"),
    (
        r#"SELECT * FROM sheaf.history('$RUNNING', -1)"#,
        "22023",
        "after_seq",
    ),
    (
        r#"SELECT * FROM sheaf.history('$RUNNING', 0, 0)"#,
        "22023",
        "max_rows",
    ),
    (
        r#"SELECT * FROM sheaf.history('$RUNNING', 0, NULL)"#,
        "22004",
        "max_rows",
    ),
    (r#"SELECT * FROM sheaf.history('$UNKNOWN')"#, "P0002", "$UNKNOWN"),
    (r#"SELECT * FROM sheaf.quota_usage(NULL)"#, "22004", "key"),
    (r#"SELECT * FROM sheaf.quota_recompute(NULL)"#, "22004", "key"),
    (
        r#"SELECT * FROM sheaf.mutex_acquire(NULL, '$OWNER')"#,
        "22004",
        "key",
    ),
    (
        r#"SELECT * FROM sheaf.mutex_acquire('', '$OWNER')"#,
        "22023",
        "key",
    ),
    (
        r#"SELECT * FROM sheaf.mutex_acquire('$NAME-lock', NULL)"#,
        "22004",
        "owner",
    ),
    (
        r#"SELECT * FROM sheaf.mutex_acquire('$NAME-lock', '$OWNER', '0 seconds')"#,
        "22023",
        "lease",
    ),
    (
        r#"SELECT * FROM sheaf.mutex_acquire('$NAME-lock', '$OWNER', NULL)"#,
        "22004",
        "lease",
    ),
    (r#"SELECT sheaf.mutex_leave(NULL, '$OWNER')"#, "22004", "key"),
    (
        r#"SELECT sheaf.mutex_leave('$NAME-lock', NULL)"#,
        "22004",
        "owner",
    ),
    (r#"SELECT sheaf.mutex_release(NULL, '$OWNER', 1)"#, "22004", "key"),
    (
        r#"SELECT sheaf.mutex_release('$NAME-lock', '$OWNER', NULL)"#,
        "22004",
        "token",
    ),
    (
        r#"SELECT sheaf.mutex_release('$NAME-lock', '$OWNER', 1)"#,
        "55P03",
        "$OWNER",
    ),
    (
        r#"SELECT sheaf.mutex_renew('$NAME-lock', '$OWNER', 1, '0 seconds')"#,
        "22023",
        "lease",
    ),
    (
        r#"SELECT sheaf.mutex_renew('$NAME-lock', '$OWNER', 1)"#,
        "55P03",
        "$OWNER",
    ),
    (r#"SELECT sheaf.mutex_reclaim(0)"#, "22023", "max_rows"),
    (r#"SELECT sheaf.mutex_reclaim(NULL)"#, "22004", "max_rows"),
    (r#"SELECT * FROM sheaf.mutex_status(NULL)"#, "22004", "key"),
];

#[tokio::test]
async fn every_function_refuses_bad_input_with_its_sqlstate_and_writes_nothing() {
    // Its own database: the counts below cover whole tables, which the
    // other tests write to in the shared one.
    let db = own_database::shard(&shard(2).url, DB, shard(2).id.get().into()).await;
    let name = unique("bad");
    declare(
        &db,
        &name,
        json!({"queue": unique("bad-q"),
               "concurrency": {"key": "input.doc", "limit": 10, "on_conflict": "defer"}}),
    )
    .await;
    let running = start_new(&db, &name, "running", &json!({})).await.id;
    let closed = start_new(&db, &name, "closed", &json!({})).await.id;
    assert!(transition(&db, "SELECT sheaf.complete_execution($1, '{}')", closed).await);
    let unknown: Uuid = db.query_one("SELECT sheaf.new_id()", &[]).await.unwrap().get(0);
    let fill = |template: &str| {
        template
            .replace("$NAME", &name)
            .replace("$RUNNING", &running.to_string())
            .replace("$CLOSED", &closed.to_string())
            .replace("$UNKNOWN", &unknown.to_string())
            .replace("$OWNER", "00000000-0000-4000-8000-000000000001")
    };

    let before = table_counts(&db).await;
    // An id that names no execution reads as no row; acting on it is P0002.
    let none = db
        .query("SELECT * FROM sheaf.get_execution($1)", &[&unknown])
        .await
        .unwrap();
    assert!(none.is_empty());
    for (sql, code, names) in BAD_CALLS {
        let (sql, names) = (fill(sql), fill(names));
        let err = match db.batch_execute(&sql).await {
            Ok(()) => panic!("accepted: {sql}"),
            Err(e) => e,
        };
        let db_err = err
            .as_db_error()
            .unwrap_or_else(|| panic!("{sql}: not a database error: {err}"));
        assert_eq!(db_err.code().code(), *code, "{sql}: {}", db_err.message());
        assert!(
            db_err.message().contains(&names),
            "{sql}: message {:?} does not name {names}",
            db_err.message()
        );
    }

    // Gates and the mutex serialize on a lock and then read what committed
    // before it: a snapshot older than the statement could admit past a
    // limit, so they refuse to run in one.
    let serialized = [
        fill("SELECT * FROM sheaf.start_workflow('$NAME', 'snapshot', '{}')"),
        fill("SELECT * FROM sheaf.mutex_acquire('$NAME-lock', '$OWNER')"),
    ];
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        for sql in &serialized {
            db.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
                .await
                .unwrap();
            let r = db.batch_execute(sql).await;
            db.batch_execute("ROLLBACK").await.unwrap();
            assert_eq!(sqlstate(r), "0A000", "{sql} at {level}");
        }
    }

    // Closing a closed run is an answer, not an error, and writes nothing.
    let events = "SELECT count(*) FROM sheaf.events WHERE execution_id = $1";
    let closed_events = count(&db, events, &[&closed]).await;
    for sql in [
        "SELECT sheaf.complete_execution($1, '{}')",
        "SELECT sheaf.fail_execution($1, 'again')",
        "SELECT sheaf.cancel_execution($1, 'again')",
        "SELECT sheaf.terminate_execution($1, 'again')",
    ] {
        assert!(!transition(&db, sql, closed).await, "{sql} on a closed run");
    }
    assert_eq!(count(&db, events, &[&closed]).await, closed_events);
    assert_eq!(state_of(&db, closed).await, "COMPLETED");
    assert_eq!(state_of(&db, running).await, "RUNNING");

    assert_eq!(table_counts(&db).await, before, "a refused call wrote");
    drop(db);
    own_database::drop(&shard(2).url, DB).await;
}
