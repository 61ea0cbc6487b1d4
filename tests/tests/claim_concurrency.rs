//! The claim engine under real concurrency: 8 claimers on one shard, thousands
//! of tasks over hundreds of capped keys, random complete / fail / release /
//! crash (half the completions sent with the next claim, in one
//! `complete_and_claim`), caps lowered mid-run. Checks: a key's running
//! count never exceeds its cap (sampled from consistent snapshots while the run goes on), every
//! task ends exactly once (completed or dead-lettered), no stale token ever
//! succeeds, and the per-key counters end at zero.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sheaf_tests::{Rng, code, connect, fleet, unique};
use tokio::sync::watch;
use uuid::Uuid;

const WORKERS: usize = 8;
const KEYS: usize = 200;
const TASKS: usize = 4_000;

#[derive(Default)]
struct Outcome {
    completed: HashMap<Uuid, u32>,
    dead: HashSet<Uuid>,
    crashed: Vec<(Uuid, i64)>,
    stale_refused: u64,
}

fn cap_of(key: usize) -> i64 {
    (key % 3) as i64 + 1
}

/// Completes `finished` and claims in one call: each finished task is
/// completed, or (its 1 s lease ran out and it was reaped) reported stale
/// while the claim goes on; the claimed rows (id, token).
async fn fused(
    db: &tokio_postgres::Client,
    outcome: &Mutex<Outcome>,
    (queue, worker, batch): (&str, &str, i32),
    finished: &[(Uuid, i64)],
) -> Vec<tokio_postgres::Row> {
    let ids: Vec<Uuid> = finished.iter().map(|f| f.0).collect();
    let tokens: Vec<i64> = finished.iter().map(|f| f.1).collect();
    let rows = db
        .query(
            "SELECT task_id, token, completed FROM sheaf.complete_and_claim($1, $2, $3, $4, $5, '1 second')",
            &[&queue, &worker, &ids, &tokens, &batch],
        )
        .await
        .unwrap();
    let (done, claimed): (Vec<_>, Vec<_>) = rows
        .into_iter()
        .partition(|r| r.get::<_, Option<bool>>(2).is_some());
    assert_eq!(done.len(), finished.len(), "a row per finished task");
    let mut outcome = outcome.lock().unwrap();
    for row in done {
        if row.get::<_, Option<bool>>(2) == Some(true) {
            *outcome.completed.entry(row.get(0)).or_default() += 1;
        } else {
            outcome.stale_refused += 1;
        }
    }
    claimed
}

// A scenario reads top to bottom as one story (set up, race, check);
// split into helpers it would scatter what it asserts.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn caps_hold_and_every_task_ends_exactly_once_under_8_claimers() {
    let shard = fleet().shards().next().unwrap();
    let queue = unique("conc");
    let (mut rng, seed) = Rng::from_time();
    println!("seed {seed}, queue {queue}");
    let keys: Vec<String> = (0..KEYS).map(|k| format!("{queue}-k{k}")).collect();

    let admin = connect(shard).await;
    for (k, key) in keys.iter().enumerate() {
        admin
            .execute(
                "SELECT sheaf.set_concurrency_limit($1, $2::int)",
                &[key, &(cap_of(k) as i32)],
            )
            .await
            .unwrap();
    }
    let mut all = HashSet::new();
    for chunk in 0..TASKS / 100 {
        let k = chunk % KEYS;
        let opts = serde_json::json!({
            "concurrency_key": keys[k],
            "priority": rng.below(3),
            "max_attempts": 1 + rng.below(3),
        });
        let payloads: Vec<serde_json::Value> = (0..100).map(|i| serde_json::json!({"i": i})).collect();
        // One batch per key slice so every key gets tasks.
        for row in admin
            .query(
                "SELECT sheaf.enqueue_batch($1, $2::jsonb[], $3)",
                &[&queue, &payloads, &opts],
            )
            .await
            .unwrap()
        {
            all.insert(row.get::<_, Uuid>(0));
        }
    }
    // Spread: 40 batches hit 40 keys; the rest of the keys get single tasks.
    for (k, key) in keys.iter().enumerate().skip(TASKS / 100) {
        let opts = serde_json::json!({"concurrency_key": key, "max_attempts": 2});
        for _ in 0..5 {
            let id: Uuid = admin
                .query_one(
                    "SELECT sheaf.enqueue($1, $2, $3)",
                    &[&queue, &serde_json::json!({"k": k}), &opts],
                )
                .await
                .unwrap()
                .get(0);
            all.insert(id);
        }
    }
    let total = all.len();

    let outcome = Arc::new(Mutex::new(Outcome::default()));
    let lowered: Arc<Mutex<HashMap<String, i64>>> = Arc::new(Mutex::new(HashMap::new()));
    let (stop_tx, stop_rx) = watch::channel(false);

    // Sampler: running per key from one consistent snapshot, again and again.
    let sampler = {
        let lowered = lowered.clone();
        let mut stop = stop_rx.clone();
        let queue = queue.clone();
        let caps: HashMap<String, i64> = keys
            .iter()
            .enumerate()
            .map(|(k, key)| (key.clone(), cap_of(k)))
            .collect();
        tokio::spawn(async move {
            let db = connect(fleet().shards().next().unwrap()).await;
            let mut ceiling = caps.clone();
            let mut samples = 0u64;
            loop {
                // Read which caps are lowered before taking the snapshot: a
                // cap marked lowered here is lowered in the snapshot too.
                let lowered_now = lowered.lock().unwrap().clone();
                let rows = db
                    .query(
                        "SELECT concurrency_key, count(*) FROM sheaf.tasks \
                         WHERE queue = $1 AND state = 'running' GROUP BY 1",
                        &[&queue],
                    )
                    .await
                    .unwrap();
                let running: HashMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
                for (key, ceil) in ceiling.iter_mut() {
                    let n = running.get(key).copied().unwrap_or(0);
                    assert!(n <= *ceil, "key {key}: {n} running, allowed {ceil}");
                    if let Some(new_cap) = lowered_now.get(key) {
                        // After a lowering, running may only fall until it is under the new cap.
                        *ceil = n.max(*new_cap);
                    }
                }
                samples += 1;
                if *stop.borrow_and_update() {
                    return samples;
                }
            }
        })
    };

    // Controller: lowers the caps of 20 keys to 1 once the run is under way.
    let controller = {
        let lowered = lowered.clone();
        let keys = keys.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let db = connect(fleet().shards().next().unwrap()).await;
            for (k, key) in keys.iter().enumerate().filter(|(k, _)| cap_of(*k) == 3).take(20) {
                db.execute("SELECT sheaf.set_concurrency_limit($1, 1)", &[key])
                    .await
                    .unwrap();
                lowered.lock().unwrap().insert(key.clone(), 1);
                let _ = k;
            }
        })
    };

    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let outcome = outcome.clone();
        let queue = queue.clone();
        let mut rng = Rng::new(seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        workers.push(tokio::spawn(async move {
            let db = connect(fleet().shards().next().unwrap()).await;
            let worker = format!("w{w}");
            let deadline = Instant::now() + Duration::from_secs(120);
            // Tasks done whose completion goes with the next claim, in one
            // `complete_and_claim` (the worker's fused step).
            let mut finished: Vec<(Uuid, i64)> = Vec::new();
            loop {
                assert!(Instant::now() < deadline, "the run did not drain in 120 s");
                let batch = 1 + rng.below(5) as i32;
                let claimed = if finished.is_empty() {
                    db.query(
                        "SELECT task_id, token FROM sheaf.claim($1, $2, $3, '1 second')",
                        &[&queue, &worker, &batch],
                    )
                    .await
                    .unwrap()
                } else {
                    fused(
                        &db,
                        &outcome,
                        (&queue, &worker, batch),
                        &std::mem::take(&mut finished),
                    )
                    .await
                };
                if claimed.is_empty() {
                    let left: i64 = db
                        .query_one("SELECT count(*) FROM sheaf.tasks WHERE queue = $1", &[&queue])
                        .await
                        .unwrap()
                        .get(0);
                    if left == 0 {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                for row in claimed {
                    let (id, token): (Uuid, i64) = (row.get(0), row.get(1));
                    // A 1 s lease can run out on a loaded machine: the call is
                    // then refused as stale (55P03), and the task was reaped
                    // and goes to another claim, or already finished there
                    // (P0002). Anything else is a failure.
                    let lost = |r: Result<(), tokio_postgres::Error>| match r {
                        Ok(()) => false,
                        Err(e) if matches!(code(&e), Some("55P03" | "P0002")) => true,
                        Err(e) => panic!("task {id}: {e}"),
                    };
                    let action = rng.below(100);
                    let result = match action {
                        0..=34 => {
                            finished.push((id, token));
                            continue;
                        }
                        35..=69 => db
                            .execute("SELECT sheaf.complete($1, $2)", &[&id, &token])
                            .await
                            .map(|_| ()),
                        70..=79 => {
                            match db
                                .query_one(
                                    "SELECT dead_lettered FROM sheaf.fail($1, $2, 'boom', '0 seconds')",
                                    &[&id, &token],
                                )
                                .await
                            {
                                Ok(r) => {
                                    if r.get::<_, bool>(0) {
                                        outcome.lock().unwrap().dead.insert(id);
                                    }
                                    Ok(())
                                }
                                Err(e) => Err(e),
                            }
                        }
                        80..=89 => db
                            .execute("SELECT sheaf.release($1, $2)", &[&id, &token])
                            .await
                            .map(|_| ()),
                        90..=94 => {
                            outcome.lock().unwrap().crashed.push((id, token));
                            Ok(())
                        }
                        _ => match db.execute("SELECT sheaf.heartbeat($1, $2)", &[&id, &token]).await {
                            Ok(_) => db
                                .execute("SELECT sheaf.complete($1, $2)", &[&id, &token])
                                .await
                                .map(|_| ()),
                            Err(e) => Err(e),
                        },
                    };
                    if lost(result) {
                        outcome.lock().unwrap().stale_refused += 1;
                    } else if (35..=69).contains(&action) || action >= 95 {
                        *outcome.lock().unwrap().completed.entry(id).or_default() += 1;
                    }
                }
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    controller.await.unwrap();
    stop_tx.send(true).unwrap();
    let samples = sampler.await.unwrap();
    assert!(samples > 10, "the sampler ran {samples} times");

    // Every crashed claim's token is stale now: refused, nothing changed
    // (55P03 while the task is still here, P0002 once it finished).
    let mut outcome = Arc::try_unwrap(outcome).ok().unwrap().into_inner().unwrap();
    for (id, token) in outcome.crashed.clone() {
        let r = admin
            .execute("SELECT sheaf.complete($1, $2)", &[&id, &token])
            .await;
        let code = r.expect_err("a stale token must be refused").code().cloned();
        let code = code.map(|c| c.code().to_owned());
        assert!(matches!(code.as_deref(), Some("55P03" | "P0002")), "{code:?}");
        outcome.stale_refused += 1;
    }
    // Tasks dead-lettered by lease expiry on their last attempt.
    for row in admin
        .query("SELECT id FROM sheaf.dead_letters WHERE queue = $1", &[&queue])
        .await
        .unwrap()
    {
        outcome.dead.insert(row.get(0));
    }
    let dead_rows: i64 = admin
        .query_one(
            "SELECT count(*) FROM sheaf.dead_letters WHERE queue = $1",
            &[&queue],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(dead_rows as usize, outcome.dead.len());
    for (id, n) in &outcome.completed {
        assert_eq!(*n, 1, "task {id} completed {n} times");
        assert!(!outcome.dead.contains(id), "task {id} both completed and dead");
    }
    let ended: HashSet<Uuid> = outcome
        .completed
        .keys()
        .chain(outcome.dead.iter())
        .copied()
        .collect();
    assert_eq!(ended.len(), total, "every task ends exactly once");
    assert_eq!(ended, all);
    let drift: i64 = admin
        .query_one(
            "SELECT coalesce(sum(admitted), 0) FROM sheaf.concurrency_slots WHERE key LIKE $1 || '-k%'",
            &[&queue],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(drift, 0, "slot counters end at zero");
    println!(
        "{total} tasks: {} completed, {} dead, {} stale tokens refused, {samples} samples",
        outcome.completed.len(),
        outcome.dead.len(),
        outcome.stale_refused
    );
}

/// A key's count is rotated (`concurrency_slots`), so locking the key's
/// limit row no longer tells a REPEATABLE READ transaction that the count
/// changed since its snapshot. An enqueue whose snapshot predates another
/// transaction's change of the count is a serialization failure either
/// way: when it would admit (the count's row it replaces is gone), and when
/// it would wait because the key looks full while a slot was freed since
/// (it locks the row it read), which would leave its task waiting with a
/// slot free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_changed_since_a_repeatable_read_snapshot_is_a_serialization_failure() {
    let shard = fleet().shards().next().unwrap();
    for freed in [false, true] {
        let queue = unique("rr-cap");
        let key = format!("{queue}-k");
        let opts = serde_json::json!({ "concurrency_key": key }).to_string();
        let (a, b) = (connect(shard).await, connect(shard).await);
        b.execute("SELECT sheaf.set_concurrency_limit($1, 1)", &[&key])
            .await
            .unwrap();
        let enqueue = "SELECT sheaf.enqueue($1, '{}', $2::text::jsonb)";
        if freed {
            b.execute(enqueue, &[&queue, &opts]).await.unwrap();
        }
        a.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
            .await
            .unwrap();
        // After a's snapshot: takes the key's only slot, or frees it.
        if freed {
            let t = b
                .query_one("SELECT task_id, token FROM sheaf.claim($1, 'rr', 1)", &[&queue])
                .await
                .unwrap();
            let (id, token): (Uuid, i64) = (t.get(0), t.get(1));
            b.execute("SELECT sheaf.complete($1, $2)", &[&id, &token])
                .await
                .unwrap();
        } else {
            b.execute(enqueue, &[&queue, &opts]).await.unwrap();
        }
        match a.execute(enqueue, &[&queue, &opts]).await {
            Err(e) => assert_eq!(code(&e), Some("40001"), "{e}"),
            Ok(_) => panic!(
                "an enqueue under a snapshot older than the key's count went through (slot freed since: {freed})"
            ),
        }
        a.batch_execute("ROLLBACK").await.unwrap();
    }
}
