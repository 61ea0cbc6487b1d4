//! The wait floor of a capped key (`extension/src/queue/caps.rs`, protocol in
//! `sql/schema.sql` beside `concurrency_limits`) under real concurrency:
//! promotions that move it up race everything that puts a task in a line.
//!
//! On one queue, three keys capped at 1 to 3, for at least `CHAOS` seconds
//! (on until it did enough to prove something):
//! - two claimers take tasks and complete them (a slot frees: the next
//!   waiting task is promoted from the floor; half the time with the next
//!   claim, in one `complete_and_claim`), or complete them in a
//!   transaction that rolls back, or roll the claim back, or release them
//!   (over a lowered cap a released task goes back to its old place in the
//!   line, maybe before the floor), or fail them with a short retry (due
//!   again later, into the line), or dead-letter and redrive them;
//! - two enqueuers add tasks of random key and priority, some due a little
//!   later, some in a batch, some in a transaction held open a few
//!   milliseconds (holding the key while a release waits for it);
//! - a capper moves the keys' caps up and down (a raise promotes, a cut
//!   sends ready tasks back to the line);
//! - a holder locks a waiting task for a few milliseconds and rolls back, as
//!   a cancel of its execution that fails does: a promotion skips it, and it
//!   must still be in the line afterwards;
//! - a watcher: in every snapshot, every waiting task of a capped key sorts
//!   at or after its key's floor (priority descending, then seq).
//!
//! Then the caps are lifted to 1 or more and everything drains: a task left
//! behind a floor would never be promoted. Passes when the watcher never saw
//! a task before its floor, the floors did move, and every task enqueued was
//! completed exactly once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use sheaf_tests::ledger::{self, Books, EnqueueMix, Ledger, OnDeadlock};
use sheaf_tests::{Rng, code, connect, fleet, unique};
use tokio::sync::Mutex;
use tokio_postgres::Client;
use uuid::Uuid;

const CHAOS: Duration = Duration::from_secs(8);
/// What a run must have done to prove something (`check`).
const MIN_FLOOR_MOVES: u64 = 20;
const MIN_HELD: u64 = 20;
const KEYS: u64 = 3;

#[derive(Default)]
struct Record {
    ledger: Ledger,
    before_floor: Vec<String>,
    floor_moves: u64,
    skipped_held: u64,
}

type Shared = Arc<Mutex<Record>>;

impl Books for Record {
    fn ledger(&mut self) -> &mut Ledger {
        &mut self.ledger
    }
}

/// A claim; one that deadlocks with a cap cut (docs/reference/sql/mutex.md, "Deadlocks": its
/// sweep promotes due tasks of the key whose ready tasks the cut waits for)
/// took nothing, and the caller claims again.
async fn claim(db: &Client, queue: &str, worker: &str, n: i32) -> Vec<(Uuid, i64)> {
    ledger::claim(db, queue, worker, n, OnDeadlock::TakeNothing).await
}

fn key(queue: &str, k: u64) -> String {
    format!("{queue}-k{k}")
}

/// Runs `sql` on each task; a deadlock with a cap change (docs/reference/sql/mutex.md,
/// "Deadlocks") is retried, as a caller would.
async fn each(db: &Client, sql: &str, tasks: &[(Uuid, i64)]) {
    for (id, token) in tasks {
        loop {
            match db.execute(sql, &[id, token]).await {
                Ok(_) => break,
                Err(e) if code(&e) == Some("40P01") => continue,
                Err(e) => panic!("{sql}: {e}"),
            }
        }
    }
}

async fn claimer(queue: String, worker: String, rec: Shared, stop: Arc<AtomicBool>, seed: u64) {
    let shard = fleet().shards().next().unwrap();
    let db = connect(shard).await;
    let mut rng = Rng::new(seed);
    // Tasks done whose completion goes with the next fused claim.
    let mut finished: Vec<(Uuid, i64)> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let n = 1 + rng.below(3) as i32;
        let roll = rng.below(100);
        let fuse = roll >= 10 && rng.below(2) == 0;
        if !fuse {
            ledger::complete(&db, &*rec, &std::mem::take(&mut finished)).await;
        }
        if roll < 10 {
            db.batch_execute("BEGIN").await.unwrap();
            let _ = claim(&db, &queue, &worker, n).await;
            db.batch_execute("ROLLBACK").await.unwrap();
            continue;
        }
        let got = if fuse {
            // The worker's fused step: the slots the finished tasks free
            // promote waiting tasks in the same call that claims.
            let done = std::mem::take(&mut finished);
            ledger::complete_and_claim(&db, &*rec, &done, (&queue, &worker, n), OnDeadlock::TakeNothing).await
        } else {
            claim(&db, &queue, &worker, n).await
        };
        if got.is_empty() {
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        // Each holds its slot a moment, so the lines stay long.
        tokio::time::sleep(Duration::from_micros(rng.below(3000))).await;
        match roll {
            10..20 => {
                // A promotion that rolls back: its tasks stay in the line.
                // One task: a transaction that completes tasks of two keys
                // in separate statements takes the keys in its own order
                // and can deadlock (docs/reference/sql/mutex.md, "Deadlocks").
                db.batch_execute("BEGIN").await.unwrap();
                let (id, token) = &got[0];
                // A deadlock with a cap change ends it early: as good.
                let _ = db.execute("SELECT sheaf.complete($1, $2)", &[id, token]).await;
                db.batch_execute("ROLLBACK").await.unwrap();
                ledger::complete(&db, &*rec, &got).await;
            }
            20..32 => each(&db, "SELECT sheaf.release($1, $2)", &got).await,
            32..40 => {
                each(
                    &db,
                    "SELECT * FROM sheaf.fail($1, $2, 'again', '30 milliseconds')",
                    &got,
                )
                .await
            }
            40..44 => {
                each(&db, "SELECT sheaf.dead_letter($1, $2, 'buried')", &got).await;
                for (id, _) in &got {
                    db.execute("SELECT sheaf.redrive(ARRAY[$1]::uuid[])", &[id])
                        .await
                        .unwrap();
                }
            }
            _ => finished = got,
        }
    }
    ledger::complete(&db, &*rec, &finished).await;
}

async fn enqueuer(queue: String, rec: Shared, stop: Arc<AtomicBool>, seed: u64) {
    const MIX: EnqueueMix = EnqueueMix {
        batch: 4,
        later_ms: 200,
        hold_us: 4000,
    };
    let shard = fleet().shards().next().unwrap();
    let db = connect(shard).await;
    let mut rng = Rng::new(seed);
    while !stop.load(Ordering::Relaxed) {
        let opts = json!({
            "priority": rng.below(4) as i32,
            "concurrency_key": key(&queue, rng.below(KEYS)),
            "max_attempts": 1000,
        });
        ledger::enqueue(&db, &*rec, &mut rng, &queue, &opts, &MIX).await;
        tokio::time::sleep(Duration::from_micros(rng.below(2000))).await;
    }
}

async fn capper(queue: String, stop: Arc<AtomicBool>, seed: u64) {
    let shard = fleet().shards().next().unwrap();
    let db = connect(shard).await;
    let mut rng = Rng::new(seed);
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(150 + rng.below(300))).await;
        let k = key(&queue, rng.below(KEYS));
        let cap = rng.below(4) as i32;
        loop {
            match db
                .execute("SELECT sheaf.set_concurrency_limit($1, $2)", &[&k, &cap])
                .await
            {
                Ok(_) => break,
                Err(e) if code(&e) == Some("40P01") => continue,
                Err(e) => panic!("set_concurrency_limit: {e:?}"),
            }
        }
    }
}

/// Holds a waiting task a few milliseconds, then rolls back.
async fn holder(queue: String, rec: Shared, stop: Arc<AtomicBool>, seed: u64) {
    let shard = fleet().shards().next().unwrap();
    let db = connect(shard).await;
    let mut rng = Rng::new(seed);
    while !stop.load(Ordering::Relaxed) {
        db.batch_execute("BEGIN").await.unwrap();
        let held = db
            .query(
                "SELECT id FROM sheaf.tasks WHERE queue = $1 AND state = 'waiting' \
                 ORDER BY priority DESC, seq OFFSET $2 LIMIT 1 FOR UPDATE SKIP LOCKED",
                &[&queue, &(rng.below(3) as i64)],
            )
            .await
            .unwrap();
        if !held.is_empty() {
            rec.lock().await.skipped_held += 1;
            tokio::time::sleep(Duration::from_micros(1000 + rng.below(4000))).await;
        }
        db.batch_execute("ROLLBACK").await.unwrap();
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

async fn watcher(queue: String, rec: Shared, stop: Arc<AtomicBool>) {
    let shard = fleet().shards().next().unwrap();
    let db = connect(shard).await;
    let mut last: Option<String> = None;
    while !stop.load(Ordering::Relaxed) {
        // One statement, one snapshot: the waiting tasks that sort before
        // their key's floor, and the floors.
        let row = db
            .query_one(
                "SELECT (SELECT string_agg(format('%s %s/%s before %s/%s', t.concurrency_key, t.priority, t.seq, \
                                                  c.wait_priority, c.wait_seq), ', ') \
                         FROM sheaf.tasks t JOIN sheaf.concurrency_limits c ON c.key = t.concurrency_key \
                         WHERE t.queue = $1 AND t.state = 'waiting' AND c.wait_priority IS NOT NULL \
                           AND (t.priority > c.wait_priority \
                                OR (t.priority = c.wait_priority AND t.seq < c.wait_seq))), \
                        (SELECT string_agg(format('%s:%s/%s', key, wait_priority, wait_seq), ' ' ORDER BY key) \
                         FROM sheaf.concurrency_limits WHERE key LIKE $1 || '-k%')",
                &[&queue],
            )
            .await
            .unwrap();
        let before: Option<String> = row.get(0);
        let floors: Option<String> = row.get(1);
        let mut r = rec.lock().await;
        if let Some(b) = before {
            r.before_floor.push(b);
        }
        if last != floors {
            r.floor_moves += 1;
            last = floors;
        }
        drop(r);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_waiting_task_stays_at_or_after_its_keys_wait_floor() {
    let queue = unique("waitfloor");
    let rec: Shared = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let (mut rng, seed) = Rng::from_time();
    let shard = fleet().shards().next().unwrap();
    let db = connect(shard).await;
    for k in 0..KEYS {
        db.execute(
            "SELECT sheaf.set_concurrency_limit($1, $2)",
            &[&key(&queue, k), &(1 + k as i32)],
        )
        .await
        .unwrap();
    }
    let mut tasks = Vec::new();
    for i in 0..2 {
        tasks.push(tokio::spawn(claimer(
            queue.clone(),
            format!("claimer-{i}"),
            rec.clone(),
            stop.clone(),
            rng.next_u64(),
        )));
        tasks.push(tokio::spawn(enqueuer(
            queue.clone(),
            rec.clone(),
            stop.clone(),
            rng.next_u64(),
        )));
    }
    tasks.push(tokio::spawn(capper(queue.clone(), stop.clone(), rng.next_u64())));
    tasks.push(tokio::spawn(holder(
        queue.clone(),
        rec.clone(),
        stop.clone(),
        rng.next_u64(),
    )));
    tasks.push(tokio::spawn(watcher(queue.clone(), rec.clone(), stop.clone())));
    // At least CHAOS, and on until the floors moved and tasks were held
    // often enough, however slow the machine (bounded: a stalled run fails
    // in `check`).
    let began = std::time::Instant::now();
    tokio::time::sleep(CHAOS).await;
    while began.elapsed() < CHAOS * 15 {
        let r = rec.lock().await;
        if r.floor_moves > MIN_FLOOR_MOVES && r.skipped_held > MIN_HELD {
            break;
        }
        drop(r);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }

    // Caps of at least 1 (none of 0 holding a line forever), then drain.
    for k in 0..KEYS {
        db.execute(
            "SELECT sheaf.set_concurrency_limit($1, $2)",
            &[&key(&queue, k), &(1 + k as i32)],
        )
        .await
        .unwrap();
    }
    ledger::drain(&db, &queue, &*rec, seed, OnDeadlock::TakeNothing).await;
    check(&*rec.lock().await, seed);
}

/// Everything the run recorded, against the invariants (see the top).
fn check(rec: &Record, seed: u64) {
    assert!(
        rec.before_floor.is_empty(),
        "waiting tasks before their key's floor in {} snapshot(s), first: {} (seed {seed})",
        rec.before_floor.len(),
        rec.before_floor[0]
    );
    let moves = rec.floor_moves;
    assert!(
        moves > MIN_FLOOR_MOVES,
        "the floors moved only {moves} time(s): the test proves nothing"
    );
    assert!(
        rec.skipped_held > MIN_HELD,
        "a waiting task was held only {} time(s)",
        rec.skipped_held
    );
    rec.ledger.check_exactly_once(seed);
    println!(
        "{} tasks, the floors seen at {moves} places, a waiting task held {} times",
        rec.ledger.enqueued.len(),
        rec.skipped_held
    );
}
