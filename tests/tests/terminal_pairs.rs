//! The lock order (`extension/src/base/locks.rs`) under real concurrency:
//! each pair of paths that end or park an execution's work runs against the
//! other on two connections at once, round after round, on fresh state:
//! cancel vs complete, cancel vs reap, pause vs complete, resume vs cancel,
//! a lowered cap vs an execution ending, and a dead-lettered workflow task
//! (reap) vs its sibling completing. Passes when no side ever returns 40P01,
//! except where docs/reference/sql/mutex.md documents the inversion ("Deadlocks": a reap that
//! fails the execution against its cancel).
//! Every other refusal a side may meet is named per pair (an unknown task,
//! P0002, when the other side deleted it first; 55000 when the execution
//! ended first).

use std::time::Duration;

use serde_json::json;
use sheaf_tests::{Rng, code, connect, fleet, unique, workflows};
use tokio_postgres::Client;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

/// Rounds per pair: each round is a fresh execution, so each is one more
/// chance at an interleaving.
const ROUNDS: usize = 60;

/// One pair at a time: `sheaf.reap_expired()` reaps every queue of the
/// shard, so a reap of one pair reaches the fixtures of another running
/// beside it, including the documented inversion of
/// `cancel_vs_reap_failing_the_execution`, and would report its 40P01 as
/// this pair's.
static ONE_PAIR_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

type Arg = Box<dyn ToSql + Sync + Send>;
/// One side of a race: a statement and its arguments.
type Side = (&'static str, Vec<Arg>);

struct Fixture {
    execution: Uuid,
    /// The concurrency key of its activity tasks (capped at 3).
    key: String,
    /// Its claimed activity tasks: (task id, token).
    running: Vec<(Uuid, i64)>,
}

/// What a round starts from.
struct Setup {
    /// Activity tasks claimed (of four: three admitted under the cap of 3,
    /// one waiting).
    claimed: usize,
    /// Whether the workflow task is claimed too.
    workflow_claimed: bool,
    /// Attempts of every task: 1 makes an expired lease a dead letter.
    max_attempts: i32,
    /// Whether the claimed workflow task's lease has run out (and, with
    /// `expire_activities`, the activities' leases).
    expire_workflow: bool,
    expire_activities: bool,
    /// Whether the execution is paused before the race.
    paused: bool,
}

const PLAIN: Setup = Setup {
    claimed: 0,
    workflow_claimed: false,
    max_attempts: 25,
    expire_workflow: false,
    expire_activities: false,
    paused: false,
};

async fn one(db: &Client, sql: &str, params: &[&(dyn ToSql + Sync)]) {
    db.execute(sql, params)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn claim(db: &Client, queue: &str, n: usize) -> Vec<(Uuid, i64)> {
    if n == 0 {
        return Vec::new();
    }
    let rows = db
        .query(
            "SELECT task_id, token FROM sheaf.claim($1, 'pairs', $2)",
            &[&queue, &(n as i32)],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), n, "claimed the fixture's tasks");
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

async fn expire(db: &Client, tasks: &[(Uuid, i64)]) {
    let ids: Vec<Uuid> = tasks.iter().map(|t| t.0).collect();
    one(
        db,
        "UPDATE sheaf.tasks SET lease_expires_at = now() - interval '1 second' WHERE id = ANY($1)",
        &[&ids],
    )
    .await;
}

/// A running execution of a fresh workflow (its workflow task in a queue of
/// its own) with four activity tasks of one capped key in another queue.
async fn fixture(db: &Client, s: &Setup) -> Fixture {
    let name = unique("pairs");
    let workflow_queue = unique("pairs-w");
    let queue = unique("pairs-a");
    let key = unique("pairs-k");
    one(
        db,
        "SELECT sheaf.declare_workflow($1, jsonb_build_object('queue', $2::text))",
        &[&name, &workflow_queue],
    )
    .await;
    one(db, "SELECT sheaf.set_concurrency_limit($1, 3)", &[&key]).await;
    let execution = workflows::start_new(db, &name, "w", &json!({})).await.id;
    one(
        db,
        "UPDATE sheaf.tasks SET max_attempts = $2 WHERE execution_id = $1",
        &[&execution, &s.max_attempts],
    )
    .await;
    let opts = json!({"execution_id": execution.to_string(), "concurrency_key": key, "max_attempts": s.max_attempts});
    for n in 0..4 {
        one(
            db,
            "SELECT sheaf.enqueue($1, $2, $3)",
            &[&queue, &json!({ "n": n }), &opts],
        )
        .await;
    }
    let running = claim(db, &queue, s.claimed).await;
    let workflow = claim(db, &workflow_queue, usize::from(s.workflow_claimed)).await;
    if s.expire_workflow {
        expire(db, &workflow).await;
    }
    if s.expire_activities {
        expire(db, &running).await;
    }
    if s.paused {
        one(db, "SELECT sheaf.pause_execution($1)", &[&execution]).await;
    }
    Fixture {
        execution,
        key,
        running,
    }
}

/// Runs one side after `delay`; its SQLSTATE, or None when it succeeded.
async fn run_side(db: &Client, (sql, params): Side, delay: Duration) -> Option<String> {
    tokio::time::sleep(delay).await;
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
    match db.query(sql, &refs).await {
        Ok(_) => None,
        Err(e) => Some(code(&e).map_or_else(|| format!("no SQLSTATE: {e}"), str::to_owned)),
    }
}

/// One pair, `ROUNDS` times on fresh fixtures: the two sides start together
/// (each after a random delay of up to 2 ms, so either may go first) on
/// connections of their own. A side may fail only with a code in `allowed`,
/// and never with 40P01.
async fn pair(label: &str, setup: Setup, allowed: &[&str], sides: impl Fn(&Fixture) -> (Side, Side)) {
    let _serial = ONE_PAIR_AT_A_TIME.lock().await;
    let shard = fleet().shards().next().unwrap();
    let db = connect(shard).await;
    let a = connect(shard).await;
    let b = connect(shard).await;
    let (mut rng, seed) = Rng::from_time();
    let mut deadlocks = Vec::new();
    for round in 0..ROUNDS {
        let f = fixture(&db, &setup).await;
        let (side_a, side_b) = sides(&f);
        let delay_a = Duration::from_micros(rng.below(2000));
        let delay_b = Duration::from_micros(rng.below(2000));
        let (ra, rb) = tokio::join!(run_side(&a, side_a, delay_a), run_side(&b, side_b, delay_b));
        for (side, r) in [("a", ra), ("b", rb)] {
            match r.as_deref() {
                None => {}
                Some(code) if allowed.contains(&code) => {}
                Some("40P01") => deadlocks.push(format!("round {round}, side {side}")),
                Some(other) => assert!(
                    allowed.contains(&other),
                    "{label}, round {round}: side {side} failed with {other} (seed {seed})"
                ),
            }
        }
    }
    assert!(
        deadlocks.is_empty(),
        "{label}: deadlock (40P01) in {} of {ROUNDS} rounds: {deadlocks:?} (seed {seed})",
        deadlocks.len()
    );
}

fn cancel(f: &Fixture) -> Side {
    (
        "SELECT sheaf.cancel_execution($1, 'pairs')",
        vec![Box::new(f.execution)],
    )
}

fn complete_first(f: &Fixture) -> Side {
    (
        "SELECT sheaf.complete($1, $2)",
        vec![Box::new(f.running[0].0), Box::new(f.running[0].1)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_vs_complete() {
    // Two running tasks of the key complete in one batch while the
    // execution is cancelled (which deletes them: then the batch reports
    // them stale).
    let setup = Setup { claimed: 2, ..PLAIN };
    pair("cancel vs complete", setup, &[], |f| {
        (
            (
                "SELECT * FROM sheaf.complete_batch(ARRAY[$1, $2]::uuid[], ARRAY[$3, $4]::bigint[])",
                vec![
                    Box::new(f.running[0].0),
                    Box::new(f.running[1].0),
                    Box::new(f.running[0].1),
                    Box::new(f.running[1].1),
                ],
            ),
            cancel(f),
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_vs_reap() {
    // Every claimed activity is on its last attempt with an expired lease:
    // the reap dead-letters them (each recorded in the execution's history)
    // while the execution is cancelled.
    let setup = Setup {
        claimed: 3,
        max_attempts: 1,
        expire_activities: true,
        ..PLAIN
    };
    pair("cancel vs reap", setup, &[], |f| {
        (("SELECT sheaf.reap_expired()", Vec::new()), cancel(f))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_vs_reap_failing_the_execution() {
    // As above, and the workflow task's lease ran out on its last attempt
    // too: the reap fails the execution, locking its other tasks after the
    // ones it reaped. Against a cancel that already holds one of those and
    // waits for a reaped one, that is the documented inversion (docs/reference/sql/mutex.md,
    // "Deadlocks"): 40P01 may end either side, nothing else may.
    let setup = Setup {
        claimed: 3,
        workflow_claimed: true,
        max_attempts: 1,
        expire_workflow: true,
        expire_activities: true,
        ..PLAIN
    };
    pair("cancel vs reap failing the execution", setup, &["40P01"], |f| {
        (("SELECT sheaf.reap_expired()", Vec::new()), cancel(f))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_vs_complete() {
    // A running task of the key completes (its slot goes to the waiting
    // one) while its ready siblings are parked. A complete that comes second
    // finds its task still running: pause leaves running tasks alone.
    let setup = Setup { claimed: 1, ..PLAIN };
    pair("pause vs complete", setup, &[], |f| {
        (
            complete_first(f),
            ("SELECT sheaf.pause_execution($1)", vec![Box::new(f.execution)]),
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resume_vs_cancel() {
    // Resume puts the parked tasks back in line while the cancel deletes
    // them; a resume that comes second finds the execution ended (55000).
    let setup = Setup {
        paused: true,
        ..PLAIN
    };
    pair("resume vs cancel", setup, &["55000"], |f| {
        (
            ("SELECT sheaf.resume_execution($1)", vec![Box::new(f.execution)]),
            cancel(f),
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cap_lowered_vs_execution_ending() {
    // Three ready tasks hold the key's three slots; the cap drops to 1 (two
    // go back to waiting) while the execution is cancelled.
    pair("cap lowered vs execution ending", PLAIN, &[], |f| {
        (
            (
                "SELECT sheaf.set_concurrency_limit($1, 1)",
                vec![Box::new(f.key.clone())],
            ),
            cancel(f),
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_lettered_workflow_task_vs_sibling_completing() {
    // The workflow task's lease ran out on its last attempt: the reap fails
    // the execution, which cancels its tasks, while a running activity
    // completes (P0002, no such task, when the reap deleted it first). This is the
    // documented inversion of a reap that fails an execution (docs/reference/sql/mutex.md,
    // "Deadlocks"; base/locks.rs): the reap holds the workflow task and then
    // locks its siblings, so a sibling completing at that moment can
    // deadlock with it (1 round in 60 in one CI run): 40P01, retried.
    let setup = Setup {
        claimed: 2,
        workflow_claimed: true,
        max_attempts: 1,
        expire_workflow: true,
        ..PLAIN
    };
    pair(
        "dead-lettered workflow task vs sibling completing",
        setup,
        &["P0002", "40P01"],
        |f| (("SELECT sheaf.reap_expired()", Vec::new()), complete_first(f)),
    )
    .await;
}
