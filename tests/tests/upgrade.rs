//! The upgrade test, as a user lives it (docs/operating/upgrading.md): a shard runs a
//! released sheaf with live state; the package is upgraded (here: the
//! cluster's `dynamic_library_path` stops pointing at the released library,
//! so new connections load HEAD's); the old catalog keeps working with the
//! new library; `ALTER EXTENSION sheaf UPDATE`; then
//!   1. the schema equals a fresh install of HEAD (a normalized catalog diff,
//!      printed in full when it is not empty),
//!   2. the data carries on (held tokens complete, queued tasks claim in
//!      order, the cap holds, the mutex passes to its first waiter, quota
//!      counters equal a recount),
//!   3. every function of HEAD is callable (tests/src/valid_calls.rs).
//!
//! `scripts/upgrade-test` runs it once per release and PostgreSQL major, on
//! a fresh cluster of its own, with
//!   SHEAF_UPGRADE_URL        the cluster's `postgres` database
//!   SHEAF_UPGRADE_FROM       the released version
//!   SHEAF_UPGRADE_OLD_LIBDIR the directory holding that release's sheaf.so
//! Without them it does nothing. The live state is written with the API of
//! the oldest release (0.1.0): when a later release changes a function,
//! keep the old call here (its catalog still has it) and branch on `from`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sheaf_tests::own_database::{self, pg_error};
use sheaf_tests::{catalog, valid_calls};
use tokio_postgres::{Client, Config, NoTls};
use uuid::Uuid;

const HEAD: &str = env!("CARGO_PKG_VERSION");
const LIVE_DB: &str = "upgrade_live";
const FRESH_DB: &str = "upgrade_fresh";

struct Env {
    url: String,
    config: Config,
    from: String,
    old_libdir: String,
}

impl Env {
    fn from_env() -> Option<Env> {
        let url = std::env::var("SHEAF_UPGRADE_URL").ok()?;
        let from =
            std::env::var("SHEAF_UPGRADE_FROM").expect("SHEAF_UPGRADE_FROM is set with SHEAF_UPGRADE_URL");
        let old_libdir = std::env::var("SHEAF_UPGRADE_OLD_LIBDIR")
            .expect("SHEAF_UPGRADE_OLD_LIBDIR is set with SHEAF_UPGRADE_URL");
        let config = url.parse().expect("SHEAF_UPGRADE_URL is a postgres:// URL");
        Some(Env {
            url,
            config,
            from,
            old_libdir,
        })
    }

    async fn connect(&self, db: &str) -> Client {
        let mut config = self.config.clone();
        config.dbname(db);
        let (client, connection) = config.connect(NoTls).await.unwrap_or_else(|e| {
            panic!(
                "cannot connect to database {db} of the upgrade cluster: {}",
                pg_error(&e)
            )
        });
        tokio::spawn(connection);
        client
    }
}

async fn one_text(db: &Client, sql: &str) -> String {
    let row = db
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {}", pg_error(&e)));
    row.get(0)
}

/// Points the cluster's library search at `path` and waits until new
/// connections see it (a reload reaches the postmaster asynchronously).
async fn set_library_path(env: &Env, path: Option<&str>) {
    let admin = env.connect("postgres").await;
    let sql = match path {
        Some(p) => format!(
            "ALTER SYSTEM SET dynamic_library_path = '{}'",
            p.replace('\'', "''")
        ),
        None => "ALTER SYSTEM RESET dynamic_library_path".to_owned(),
    };
    admin
        .batch_execute(&sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {}", pg_error(&e)));
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .expect("pg_reload_conf");
    let want = path.unwrap_or("$libdir");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let probe = env.connect("postgres").await;
        if one_text(&probe, "SHOW dynamic_library_path").await == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "dynamic_library_path did not become {want} within 20 s of the reload"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the test holds of the live state: ids, tokens, owners.
struct Live {
    ready_order: Vec<Uuid>,
    aging_order: Vec<Uuid>,
    running: Vec<(Uuid, i64)>,
    cap_running: (Uuid, i64),
    cap_waiting: Vec<Uuid>,
    dead: Uuid,
    exec_running: Uuid,
    exec_paused: Uuid,
    exec_suspended: Uuid,
    mutex_holder: (Uuid, i64),
    mutex_waiters: Vec<Uuid>,
}

const QUEUES: &[&str] = &[
    "q_ready", "q_aging", "q_run", "q_cap", "q_sched", "q_dead", "wf_q",
];
const QUOTA_KEY: &str = "tenant_a";
const MUTEX_KEY: &str = "deploy";

async fn enqueue(db: &Client, queue: &str, payload: &str, opts: &str) -> Uuid {
    let sql = "SELECT sheaf.enqueue($1, $2::text::jsonb, $3::text::jsonb)";
    db.query_one(sql, &[&queue, &payload, &opts])
        .await
        .unwrap_or_else(|e| panic!("enqueue to {queue} with {opts}: {}", pg_error(&e)))
        .get(0)
}

async fn claim(db: &Client, queue: &str, batch: i32) -> Vec<(Uuid, i64)> {
    db.query(
        "SELECT task_id, token FROM sheaf.claim($1, 'upgrade-worker', $2, '1 hour')",
        &[&queue, &batch],
    )
    .await
    .unwrap_or_else(|e| panic!("claim from {queue}: {}", pg_error(&e)))
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

async fn start(db: &Client, workflow_id: &str) -> Uuid {
    db.query_one(
        "SELECT execution_id FROM sheaf.start_workflow('wf', $1, $2::text::jsonb, '{}')",
        &[&workflow_id, &format!(r#"{{"tenant": "{QUOTA_KEY}"}}"#)],
    )
    .await
    .unwrap_or_else(|e| panic!("start_workflow wf {workflow_id}: {}", pg_error(&e)))
    .get(0)
}

async fn exec_bool(db: &Client, sql: &str, id: Uuid) -> bool {
    db.query_one(sql, &[&id])
        .await
        .unwrap_or_else(|e| panic!("{sql} ({id}): {}", pg_error(&e)))
        .get(0)
}

/// Live state in every state the release knows, written with its API.
async fn build_live_state(db: &Client) -> Live {
    db.query("SELECT sheaf.init_shard($1)", &[&valid_calls::SHARD_ID])
        .await
        .expect("init_shard");
    let ready_order = live_ready(db).await;
    let aging_order = live_aging(db).await;
    let running = live_running(db).await;
    let (cap_running, cap_waiting) = live_capped(db).await;
    // Scheduled for later.
    enqueue(db, "q_sched", "{}", r#"{"run_at": "2999-01-01T00:00:00Z"}"#).await;
    let (exec_running, exec_paused, exec_suspended) = live_executions(db).await;
    let dead = live_dead_letter(db, exec_running).await;
    let (mutex_holder, mutex_waiters) = live_mutex(db).await;
    Live {
        ready_order,
        aging_order,
        running,
        cap_running,
        cap_waiting,
        dead,
        exec_running,
        exec_paused,
        exec_suspended,
        mutex_holder,
        mutex_waiters,
    }
}

/// Ready tasks; returns them in the order they must be claimed.
async fn live_ready(db: &Client) -> Vec<Uuid> {
    // Ready, in a known order: priority first, then enqueue order.
    let mut by_priority = Vec::new();
    for (i, priority) in [0, 5, 0, 9, 1].into_iter().enumerate() {
        let id = enqueue(
            db,
            "q_ready",
            &format!(r#"{{"i": {i}}}"#),
            &format!(r#"{{"priority": {priority}}}"#),
        )
        .await;
        by_priority.push((priority, i, id));
    }
    by_priority.sort_by_key(|&(p, i, _)| (-p, i));
    by_priority.into_iter().map(|(_, _, id)| id).collect()
}

/// Ready tasks of an aging queue (each priority a band of its own after the
/// upgrade, merged by the aging key); returns them in claim order.
async fn live_aging(db: &Client) -> Vec<Uuid> {
    db.batch_execute(r#"SELECT sheaf.configure_queue('q_aging', '{"aging_secs": 60}')"#)
        .await
        .expect("configure q_aging");
    let mut ids = Vec::new();
    for (i, priority) in [0, 2, 1, 2].into_iter().enumerate() {
        let id = enqueue(
            db,
            "q_aging",
            &format!(r#"{{"i": {i}}}"#),
            &format!(r#"{{"priority": {priority}}}"#),
        )
        .await;
        ids.push(id);
    }
    // Task 0 waited 200 s: at 60 s a step it passes priority 2; the
    // configuration again re-keys the queue.
    db.batch_execute(
        "UPDATE sheaf.tasks SET enqueued_at = enqueued_at - interval '200 seconds' \
         WHERE queue = 'q_aging' AND payload->>'i' = '0'; \
         SELECT sheaf.configure_queue('q_aging', '{\"aging_secs\": 60}')",
    )
    .await
    .expect("age task 0");
    vec![ids[0], ids[1], ids[3], ids[2]]
}

/// Running tasks, their tokens held by this test.
async fn live_running(db: &Client) -> Vec<(Uuid, i64)> {
    // Running, tokens held by this test.
    for i in 0..2 {
        enqueue(db, "q_run", &format!(r#"{{"i": {i}}}"#), "{}").await;
    }
    let running = claim(db, "q_run", 2).await;
    assert_eq!(running.len(), 2, "both q_run tasks claimed");
    running
}

/// A capped key: the running task and the waiting ones, in line order.
async fn live_capped(db: &Client) -> ((Uuid, i64), Vec<Uuid>) {
    // A capped key: one running, two waiting behind it.
    db.batch_execute("SELECT sheaf.set_concurrency_limit('cap_k', 1)")
        .await
        .expect("set_concurrency_limit");
    let mut cap = Vec::new();
    for i in 0..3 {
        cap.push(
            enqueue(
                db,
                "q_cap",
                &format!(r#"{{"i": {i}}}"#),
                r#"{"concurrency_key": "cap_k"}"#,
            )
            .await,
        );
    }
    let cap_claimed = claim(db, "q_cap", 3).await;
    assert_eq!(cap_claimed.len(), 1, "a cap of 1 lets one task of cap_k run");
    assert_eq!(cap_claimed[0].0, cap[0], "the first task of cap_k runs");

    (cap_claimed[0], cap[1..].to_vec())
}

/// Running, paused and suspended executions (and an ended one).
async fn live_executions(db: &Client) -> (Uuid, Uuid, Uuid) {
    // Executions of a workflow with a quota: running (with history), paused,
    // suspended, and one that ended.
    db.batch_execute(
        r#"SELECT sheaf.declare_workflow('wf', '{"queue": "wf_q", "quota": {"key": "input.tenant", "max_active_executions": 100, "max_history_bytes": 100000000, "max_dead_letters": 10}}')"#,
    )
    .await
    .expect("declare_workflow");
    let exec_running = start(db, "running").await;
    db.query(
        "SELECT sheaf.append_event($1, 'Note', '{\"n\": 1}')",
        &[&exec_running],
    )
    .await
    .expect("append_event");
    let exec_paused = start(db, "paused").await;
    assert!(exec_bool(db, "SELECT sheaf.pause_execution($1)", exec_paused).await);
    let exec_suspended = start(db, "suspended").await;
    assert!(exec_bool(db, "SELECT sheaf.suspend_execution($1, NULL)", exec_suspended).await);
    let ended = start(db, "ended").await;
    db.query("SELECT sheaf.complete_execution($1, '{\"ok\": true}')", &[&ended])
        .await
        .expect("complete_execution");

    (exec_running, exec_paused, exec_suspended)
}

/// A dead letter of `execution` (counted by its quota key).
async fn live_dead_letter(db: &Client, execution: Uuid) -> Uuid {
    // A dead letter of the running execution (counted by its quota key).
    let dead = enqueue(
        db,
        "q_dead",
        "{}",
        &format!(r#"{{"max_attempts": 1, "execution_id": "{execution}"}}"#),
    )
    .await;
    let dead_claim = claim(db, "q_dead", 1).await;
    assert_eq!(dead_claim.len(), 1, "the q_dead task claimed");
    let dead_lettered: bool = db
        .query_one(
            "SELECT dead_lettered FROM sheaf.fail($1, $2, 'upgrade test: failed on purpose')",
            &[&dead_claim[0].0, &dead_claim[0].1],
        )
        .await
        .expect("fail")
        .get(0);
    assert!(dead_lettered, "a task with max_attempts 1 is dead-lettered");

    dead
}

/// A held mutex with two waiters: (holder, token) and the waiters in order.
async fn live_mutex(db: &Client) -> ((Uuid, i64), Vec<Uuid>) {
    // A held mutex with two waiters.
    let (holder, first, second) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let mut mutex_holder = None;
    for (owner, position) in [(holder, 0), (first, 1), (second, 2)] {
        let row = db
            .query_one(
                "SELECT granted, token, queue_position FROM sheaf.mutex_acquire($1, $2, '1 hour')",
                &[&MUTEX_KEY, &owner],
            )
            .await
            .expect("mutex_acquire");
        assert_eq!(row.get::<_, i32>(2), position, "mutex line position");
        if position == 0 {
            assert!(row.get::<_, bool>(0), "the first owner is granted");
            mutex_holder = Some((owner, row.get::<_, i64>(1)));
        }
    }

    (mutex_holder.expect("the mutex holder"), vec![first, second])
}

/// Everything the live state shows through the API, as text, by name.
async fn snapshot(db: &Client, live: &Live) -> BTreeMap<String, String> {
    let mut s = BTreeMap::new();
    for q in QUEUES {
        let row = db
            .query_one(
                "SELECT (ready, scheduled, running, waiting, dead, live_workers)::text FROM sheaf.queue_stats($1)",
                &[q],
            )
            .await
            .unwrap_or_else(|e| panic!("queue_stats({q}): {}", pg_error(&e)));
        s.insert(format!("queue_stats({q})"), row.get(0));
    }
    let rows = db
        .query(
            "SELECT (concurrency_key, max_running, running, ready, waiting)::text FROM sheaf.concurrency_stats() ORDER BY 1",
            &[],
        )
        .await
        .expect("concurrency_stats");
    let cs: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    s.insert("concurrency_stats()".into(), cs.join("; "));
    for (name, id) in [
        ("running", live.exec_running),
        ("paused", live.exec_paused),
        ("suspended", live.exec_suspended),
    ] {
        let row = db
            .query_one(
                "SELECT (workflow_name, workflow_id, state, input, result, error, concurrency_key, quota_key, \
                         history_bytes, created_at, closed_at, wake_at)::text FROM sheaf.get_execution($1)",
                &[&id],
            )
            .await
            .unwrap_or_else(|e| panic!("get_execution({name}): {}", pg_error(&e)));
        s.insert(format!("get_execution({name})"), row.get(0));
        let row = db
            .query_one(
                "SELECT coalesce(string_agg((seq, event_type, payload, created_at)::text, '; ' ORDER BY seq), '') \
                 FROM sheaf.history($1, 0, 1000)",
                &[&id],
            )
            .await
            .unwrap_or_else(|e| panic!("history({name}): {}", pg_error(&e)));
        s.insert(format!("history({name})"), row.get(0));
    }
    let row = db
        .query_one(
            "SELECT (active_executions, history_bytes, dead_letters)::text FROM sheaf.quota_usage($1)",
            &[&QUOTA_KEY],
        )
        .await
        .expect("quota_usage");
    s.insert(format!("quota_usage({QUOTA_KEY})"), row.get(0));
    let row = db
        .query_one(
            "SELECT (holder, token, lease_expires_at, waiters)::text FROM sheaf.mutex_status($1)",
            &[&MUTEX_KEY],
        )
        .await
        .expect("mutex_status");
    s.insert(format!("mutex_status({MUTEX_KEY})"), row.get(0));
    s
}

fn snapshot_diff(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<String> {
    before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(v))
        .map(|(k, v)| {
            format!(
                "{k}: was {v}, now {}",
                after.get(k).map_or("(missing)", |s| s.as_str())
            )
        })
        .collect()
}

/// The old catalog's functions, called through the new library before the
/// UPDATE: every released C symbol must keep working. Touches only names of
/// its own, so the live state's snapshot stays as it was.
const OLD_CATALOG_CALLS: &[&str] = &[
    "SELECT sheaf.shard_id(), sheaf.id_shard(sheaf.new_id()), sheaf.id_timestamp(sheaf.new_id())",
    r#"SELECT sheaf.configure_queue('between_q', '{"notify": true}')"#,
    r#"SELECT sheaf.enqueue('between_q', '{"n": 1}', '{"priority": 3}')"#,
    r#"SELECT * FROM sheaf.enqueue_batch('between_q', ARRAY['{"n": 2}', '{"n": 3}', '{"n": 4}']::jsonb[], '{}')"#,
    "CREATE TEMP TABLE between_claim AS SELECT * FROM sheaf.claim('between_q', 'between-worker', 4, '5 minutes')",
    "DO $$ BEGIN IF (SELECT count(*) FROM between_claim) <> 4 THEN RAISE 'claimed % of 4 tasks', (SELECT count(*) FROM between_claim); END IF; END $$",
    "SELECT sheaf.heartbeat(task_id, token, '10 minutes') FROM between_claim",
    "SELECT sheaf.complete(task_id, token, '{\"ok\": 1}') FROM (SELECT * FROM between_claim ORDER BY task_id LIMIT 1) t",
    "SELECT * FROM sheaf.complete_batch(ARRAY(SELECT task_id FROM between_claim ORDER BY task_id OFFSET 1 LIMIT 1), \
                                        ARRAY(SELECT token FROM between_claim ORDER BY task_id OFFSET 1 LIMIT 1))",
    "SELECT * FROM sheaf.fail((SELECT task_id FROM between_claim ORDER BY task_id OFFSET 2 LIMIT 1), \
                              (SELECT token FROM between_claim ORDER BY task_id OFFSET 2 LIMIT 1), 'between: failed', '1 second')",
    "SELECT sheaf.release(task_id, token) FROM (SELECT * FROM between_claim ORDER BY task_id OFFSET 3 LIMIT 1) t",
    "SELECT * FROM sheaf.queue_stats('between_q')",
    "SELECT * FROM sheaf.concurrency_stats()",
    "SELECT sheaf.worker_heartbeat('between-worker', ARRAY['between_q'])",
    "SELECT * FROM sheaf.live_workers()",
    "SELECT * FROM sheaf.stranded_work()",
    r#"SELECT sheaf.declare_workflow('between_wf', '{"queue": "between_wf_q"}')"#,
    r#"SELECT * FROM sheaf.start_workflow('between_wf', 'between-1', '{"tenant": "between"}', '{}')"#,
    "SELECT * FROM sheaf.get_execution((SELECT execution_id FROM sheaf.find_execution('between_wf', 'between-1')))",
    "SELECT sheaf.append_event((SELECT execution_id FROM sheaf.find_execution('between_wf', 'between-1')), 'Note', '{}')",
    "SELECT * FROM sheaf.history((SELECT execution_id FROM sheaf.find_execution('between_wf', 'between-1')), 0, 10)",
    "SELECT sheaf.complete_execution((SELECT execution_id FROM sheaf.find_execution('between_wf', 'between-1')), '{}')",
    "SELECT * FROM sheaf.quota_usage('between')",
    "SELECT * FROM sheaf.mutex_acquire('between_m', '00000000-0000-0000-0000-0000000000b1', '1 minute')",
    "SELECT * FROM sheaf.mutex_status('between_m')",
    "SELECT sheaf.mutex_release('between_m', '00000000-0000-0000-0000-0000000000b1', (SELECT token FROM sheaf.mutex_status('between_m')))",
    "SELECT sheaf.reap_expired(10), sheaf.mutex_reclaim(10)",
    // 0.2.0's get_task (no started_at) on its own C symbol (0.1.0 had none).
    "DO $$ BEGIN IF to_regprocedure('sheaf.get_task(uuid)') IS NOT NULL THEN \
       PERFORM queue, progress FROM sheaf.get_task((SELECT task_id FROM between_claim ORDER BY task_id OFFSET 2 LIMIT 1)); \
     END IF; END $$",
];

async fn run_statements(db: &Client, statements: &[&str]) -> Vec<String> {
    let mut failures = Vec::new();
    for sql in statements {
        if let Err(e) = db.batch_execute(sql).await {
            failures.push(format!("{sql}\n    -> {}", pg_error(&e)));
        }
    }
    failures
}

/// A query inside a check: a server error becomes the check's `Err`, naming
/// the statement.
macro_rules! q {
    ($db:expr, $sql:expr $(, $p:expr)* $(,)?) => {
        $db.query($sql, &[$($p),*])
            .await
            .map_err(|e| format!("{}: {}", $sql, pg_error(&e)))?
    };
}

/// A condition inside a check: `Err` with the message when it fails.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)*) => {
        if !$cond {
            return Err(format!($($msg)*));
        }
    };
}

/// A quota row as (active executions, history bytes, dead letters).
fn usage_of(rows: &[tokio_postgres::Row]) -> (i64, i64, i64) {
    (rows[0].get(0), rows[0].get(1), rows[0].get(2))
}

/// 2. The live state carries on under HEAD. `Err` says what did not.
async fn data_carries_on(db: &Client, live: &Live) -> Result<(), String> {
    tasks_carry_on(db, live).await?;
    cap_carries_on(db, live).await?;
    quota_and_dead_letters_carry_on(db, live).await?;
    mutex_carries_on(db, live).await?;
    executions_carry_on(db, live).await
}

/// Held tokens, the ready order, the scheduled task.
async fn tasks_carry_on(db: &Client, live: &Live) -> Result<(), String> {
    // The held tokens still fence their tasks: heartbeat, then complete.
    for (task, token) in &live.running {
        q!(db, "SELECT sheaf.heartbeat($1, $2, '30 minutes')", task, token);
        q!(db, "SELECT sheaf.complete($1, $2, NULL)", task, token);
    }

    // Queued tasks claim in their order.
    let claimed: Vec<Uuid> = q!(
        db,
        "SELECT task_id FROM sheaf.claim('q_ready', 'upgrade-worker', 10, '1 hour')",
    )
    .iter()
    .map(|r| r.get(0))
    .collect();
    ensure!(
        claimed == live.ready_order,
        "q_ready claimed {claimed:?}, expected the release's order {:?}",
        live.ready_order
    );

    let claimed: Vec<Uuid> = q!(
        db,
        "SELECT task_id FROM sheaf.claim('q_aging', 'upgrade-worker', 10, '1 hour')",
    )
    .iter()
    .map(|r| r.get(0))
    .collect();
    ensure!(
        claimed == live.aging_order,
        "q_aging claimed {claimed:?}, expected the aging order {:?}",
        live.aging_order
    );

    // The scheduled task is still in the future.
    let due = q!(
        db,
        "SELECT task_id FROM sheaf.claim('q_sched', 'upgrade-worker', 10, '1 hour')",
    );
    ensure!(
        due.is_empty(),
        "a task scheduled for 2999 was claimable after the upgrade"
    );

    Ok(())
}

/// The capped key still holds its cap, and its count of slots held.
async fn cap_carries_on(db: &Client, live: &Live) -> Result<(), String> {
    // A freed slot goes to the next in line.
    let over_cap = q!(
        db,
        "SELECT task_id FROM sheaf.claim('q_cap', 'upgrade-worker', 10, '1 hour')",
    );
    ensure!(
        over_cap.is_empty(),
        "cap_k (cap 1, one running) let {} more task(s) run",
        over_cap.len()
    );
    // A task enqueued now waits too: the key's count of slots held carried
    // over (0.2.0 moved it to concurrency_slots).
    let late: Uuid = q!(
        db,
        "SELECT sheaf.enqueue('q_cap', '{\"late\": true}', '{\"concurrency_key\": \"cap_k\"}')",
    )[0]
    .get(0);
    let over_cap = q!(
        db,
        "SELECT task_id FROM sheaf.claim('q_cap', 'upgrade-worker', 10, '1 hour')",
    );
    ensure!(
        over_cap.is_empty(),
        "a task enqueued after the upgrade ran beside cap_k's running one (cap 1): the count of slots held was lost"
    );
    let (task, token) = live.cap_running;
    q!(db, "SELECT sheaf.complete($1, $2, NULL)", &task, &token);
    for expected in &live.cap_waiting {
        let next: Vec<(Uuid, i64)> = q!(
            db,
            "SELECT task_id, token FROM sheaf.claim('q_cap', 'upgrade-worker', 10, '1 hour')",
        )
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
        ensure!(
            next.len() == 1 && next[0].0 == *expected,
            "after a cap_k slot freed, the claim got {next:?}, expected exactly {expected}"
        );
        q!(db, "SELECT sheaf.complete($1, $2, NULL)", &next[0].0, &next[0].1);
    }
    let last: Vec<(Uuid, i64)> = q!(
        db,
        "SELECT task_id, token FROM sheaf.claim('q_cap', 'upgrade-worker', 10, '1 hour')",
    )
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    ensure!(
        last.len() == 1 && last[0].0 == late,
        "after cap_k's line drained, the claim got {last:?}, expected the late task {late}"
    );
    q!(db, "SELECT sheaf.complete($1, $2, NULL)", &last[0].0, &last[0].1);

    Ok(())
}

/// The quota counters, and the dead letter they count.
async fn quota_and_dead_letters_carry_on(db: &Client, live: &Live) -> Result<(), String> {
    // The quota counters equal a recount from the raw rows, with the values
    // the release left: running, paused and suspended count; one dead letter.
    let usage = q!(
        db,
        "SELECT active_executions, history_bytes, dead_letters FROM sheaf.quota_usage($1)",
        &QUOTA_KEY
    );
    let recount = q!(
        db,
        "SELECT active_executions, history_bytes, dead_letters FROM sheaf.quota_recompute($1)",
        &QUOTA_KEY
    );
    ensure!(
        usage_of(&usage) == usage_of(&recount),
        "quota_usage({QUOTA_KEY}) = {:?}, but quota_recompute counts {:?}",
        usage_of(&usage),
        usage_of(&recount)
    );
    ensure!(
        usage_of(&usage).0 == 3 && usage_of(&usage).2 == 1,
        "quota_usage({QUOTA_KEY}) = {:?}, expected 3 active executions and 1 dead letter",
        usage_of(&usage)
    );

    // The dead letter comes back.
    let redriven = q!(db, "SELECT sheaf.redrive(ARRAY[$1]::uuid[])", &live.dead);
    ensure!(
        redriven[0].get::<_, i32>(0) == 1,
        "redrive of the release's dead letter put back {}",
        redriven[0].get::<_, i32>(0)
    );
    let back = q!(
        db,
        "SELECT task_id FROM sheaf.claim('q_dead', 'upgrade-worker', 10, '1 hour')",
    );
    ensure!(
        back.len() == 1 && back[0].get::<_, Uuid>(0) == live.dead,
        "the redriven dead letter did not come back to q_dead"
    );

    Ok(())
}

/// The mutex line.
async fn mutex_carries_on(db: &Client, live: &Live) -> Result<(), String> {
    // The mutex holder releases to its first waiter; the line moves up.
    let (holder, token) = live.mutex_holder;
    let next: Option<Uuid> = q!(
        db,
        "SELECT sheaf.mutex_release($1, $2, $3)",
        &MUTEX_KEY,
        &holder,
        &token
    )[0]
    .get(0);
    ensure!(
        next == Some(live.mutex_waiters[0]),
        "mutex_release handed {MUTEX_KEY} to {next:?}, expected the first waiter {}",
        live.mutex_waiters[0]
    );
    let granted = q!(
        db,
        "SELECT granted, queue_position FROM sheaf.mutex_acquire($1, $2, '1 hour')",
        &MUTEX_KEY,
        &live.mutex_waiters[0]
    );
    ensure!(
        granted[0].get::<_, bool>(0),
        "the first waiter does not hold {MUTEX_KEY} after the release"
    );
    let second = q!(
        db,
        "SELECT granted, queue_position FROM sheaf.mutex_acquire($1, $2, '1 hour')",
        &MUTEX_KEY,
        &live.mutex_waiters[1]
    );
    ensure!(
        second[0].get::<_, i32>(1) == 1,
        "the second waiter is at position {} of {MUTEX_KEY}, expected 1",
        second[0].get::<_, i32>(1)
    );

    Ok(())
}

/// Executions in each active state, and the quota after one ends.
async fn executions_carry_on(db: &Client, live: &Live) -> Result<(), String> {
    // Executions go on from the states the release left them in.
    let history_before = q!(
        db,
        "SELECT count(*) FROM sheaf.history($1, 0, 1000)",
        &live.exec_running
    )[0]
    .get::<_, i64>(0);
    q!(
        db,
        "SELECT sheaf.append_event($1, 'AfterUpgrade', '{}')",
        &live.exec_running
    );
    let history_after = q!(
        db,
        "SELECT count(*) FROM sheaf.history($1, 0, 1000)",
        &live.exec_running
    )[0]
    .get::<_, i64>(0);
    ensure!(
        history_after == history_before + 1,
        "append_event after the upgrade: history went from {history_before} to {history_after} events"
    );
    for (what, sql, id) in [
        (
            "resume the paused execution",
            "SELECT sheaf.resume_execution($1)",
            live.exec_paused,
        ),
        (
            "wake the suspended execution",
            "SELECT sheaf.wake_execution($1)",
            live.exec_suspended,
        ),
        (
            "complete the running execution",
            "SELECT sheaf.complete_execution($1, '{}')",
            live.exec_running,
        ),
    ] {
        let done: bool = q!(db, sql, &id)[0].get(0);
        ensure!(done, "could not {what} ({id}) after the upgrade");
    }
    let states: Vec<String> = q!(
        db,
        "SELECT e.state FROM unnest(ARRAY[$1, $2, $3]::uuid[]) WITH ORDINALITY AS i(id, n), \
         LATERAL sheaf.get_execution(i.id) e ORDER BY i.n",
        &live.exec_paused,
        &live.exec_suspended,
        &live.exec_running
    )
    .iter()
    .map(|r| r.get(0))
    .collect();
    ensure!(
        states == ["RUNNING", "RUNNING", "COMPLETED"],
        "execution states after resume, wake and complete: {states:?}"
    );
    let usage = q!(
        db,
        "SELECT active_executions, history_bytes, dead_letters FROM sheaf.quota_usage($1)",
        &QUOTA_KEY
    );
    let recount = q!(
        db,
        "SELECT active_executions, history_bytes, dead_letters FROM sheaf.quota_recompute($1)",
        &QUOTA_KEY
    );
    ensure!(
        usage_of(&usage) == usage_of(&recount) && usage_of(&usage).0 == 2,
        "after completing one execution: quota_usage = {:?}, recount = {:?}, expected 2 active",
        usage_of(&usage),
        usage_of(&recount)
    );
    Ok(())
}

/// The shard at the release: its library first in the search path, the
/// extension created at the released version, live state. Returns the state
/// and its snapshot.
async fn at_the_release(env: &Env) -> (Live, BTreeMap<String, String>) {
    let from = &env.from;
    set_library_path(env, Some(&format!("{}:$libdir", env.old_libdir))).await;
    let db = own_database::recreate(&env.url, LIVE_DB).await;
    db.batch_execute(&format!("CREATE EXTENSION sheaf VERSION '{from}'"))
        .await
        .unwrap_or_else(|e| panic!("CREATE EXTENSION sheaf VERSION '{from}': {}", pg_error(&e)));
    assert_eq!(
        one_text(&db, "SELECT sheaf.version()").await,
        *from,
        "the released library serves the released catalog"
    );
    let live = build_live_state(&db).await;
    let before = snapshot(&db, &live).await;
    (live, before)
}

/// The package upgrade: HEAD's library under the release's catalog. Returns
/// the old catalog's failed calls, the snapshot, and the connection, whose
/// backend has served the old catalog (a long-lived pooled connection).
async fn after_the_swap(env: &Env, live: &Live) -> (Vec<String>, BTreeMap<String, String>, Client) {
    set_library_path(env, None).await;
    let db = env.connect(LIVE_DB).await;
    assert_eq!(
        one_text(&db, "SELECT sheaf.version()").await,
        HEAD,
        "after the library swap a new connection runs HEAD's library"
    );
    assert_eq!(
        one_text(&db, "SELECT extversion FROM pg_extension WHERE extname = 'sheaf'").await,
        env.from,
        "the catalog is still the release's before ALTER EXTENSION UPDATE"
    );
    let old_catalog = run_statements(&db, OLD_CATALOG_CALLS).await;
    let snap = snapshot(&db, live).await;
    (old_catalog, snap, db)
}

/// `ALTER EXTENSION sheaf UPDATE` on a new connection (as after a restart
/// of the workers). Returns the connection, the snapshot, and the catalog
/// diff against a fresh install with the number of lines compared.
async fn after_the_update(env: &Env, live: &Live) -> (Client, BTreeMap<String, String>, Vec<String>, usize) {
    let db = env.connect(LIVE_DB).await;
    db.batch_execute("ALTER EXTENSION sheaf UPDATE")
        .await
        .unwrap_or_else(|e| panic!("ALTER EXTENSION sheaf UPDATE from {}: {}", env.from, pg_error(&e)));
    assert_eq!(
        one_text(&db, "SELECT extversion FROM pg_extension WHERE extname = 'sheaf'").await,
        HEAD,
        "ALTER EXTENSION sheaf UPDATE reaches HEAD's version"
    );
    let after = snapshot(&db, live).await;
    // Roles are cluster-wide: dump the upgraded database before a fresh
    // install could create a role the upgrade forgot.
    let upgraded = catalog::dump(&db).await.expect("dumping the upgraded catalog");
    let fresh_db = own_database::recreate(&env.url, FRESH_DB).await;
    fresh_db
        .batch_execute("CREATE EXTENSION sheaf")
        .await
        .unwrap_or_else(|e| panic!("a fresh CREATE EXTENSION sheaf of HEAD: {}", pg_error(&e)));
    let fresh = catalog::dump(&fresh_db).await.expect("dumping the fresh catalog");
    let diff = catalog::diff(&upgraded, &fresh);
    (db, after, diff, fresh.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_shard_equals_a_fresh_install_and_carries_on() {
    let Some(env) = Env::from_env() else {
        eprintln!("upgrade test: SHEAF_UPGRADE_URL is not set; skipped (scripts/upgrade-test runs it)");
        return;
    };
    let from = env.from.clone();
    eprintln!(
        "upgrade test: {from} -> {HEAD}, released library from {}",
        env.old_libdir
    );

    let (live, before) = at_the_release(&env).await;
    let (old_catalog, between, pooled) = after_the_swap(&env, &live).await;
    let (db, after, catalog_diff, compared) = after_the_update(&env, &live).await;
    let data = data_carries_on(&db, &live).await;
    // 3. Every function of HEAD, called on the upgraded database (shard
    // valid_calls::SHARD_ID, as they expect; its state has no `vc_` names),
    // through the backend that served the old catalog before the UPDATE ran
    // elsewhere: it must see the new catalog (`base::catalog`), or the
    // features the old one lacked stay off there.
    let calls_db = pooled;
    let coverage = valid_calls::check_coverage(&calls_db).await;
    let calls = valid_calls::run_all(&calls_db).await;

    let mut failures = Vec::new();
    if !old_catalog.is_empty() {
        failures.push(format!(
            "{} call(s) of the {from} catalog failed with HEAD's library before the UPDATE:\n  {}",
            old_catalog.len(),
            old_catalog.join("\n  ")
        ));
    }
    for (when, snap) in [("after the library swap", &between), ("after the UPDATE", &after)] {
        let d = snapshot_diff(&before, snap);
        if !d.is_empty() {
            failures.push(format!("the live state changed {when}:\n  {}", d.join("\n  ")));
        }
    }
    if !catalog_diff.is_empty() {
        failures.push(format!(
            "the schema after ALTER EXTENSION sheaf UPDATE from {from} differs from a fresh install of {HEAD} \
             ({} lines; - upgraded only, + fresh install only):\n{}",
            catalog_diff.len(),
            catalog_diff.join("\n")
        ));
    }
    let errs = [
        data.err().map(|e| format!("the data did not carry on: {e}")),
        coverage.err(),
        calls.err().map(|e| format!("after the upgrade, {e}")),
    ];
    failures.extend(errs.into_iter().flatten());
    eprintln!(
        "upgrade test: {compared} catalog lines compared, {} valid calls, {} old-catalog calls",
        valid_calls::VALID_CALLS.len(),
        OLD_CATALOG_CALLS.len()
    );
    assert!(
        failures.is_empty(),
        "upgrade {from} -> {HEAD}:\n\n{}",
        failures.join("\n\n")
    );
}
