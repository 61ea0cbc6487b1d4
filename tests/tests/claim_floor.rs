//! The claim floor (`extension/src/queue/floor.rs`, protocol in
//! `sql/schema.sql` beside `ready_floors`) under real concurrency: claims
//! that advance it race everything that readies a task below it.
//!
//! On one queue, for `CHAOS` seconds:
//! - two claimers (READ COMMITTED, so they advance the floor), one seeking
//!   from the floors and one from the head of the queue, take batches
//!   and complete them, or roll the claim back, or release the tasks (ready
//!   again at their old keys, below the floor), or fail them with a short
//!   retry (promoted again later), or dead-letter and redrive them; half
//!   their claims, at random, are `complete_and_claim` calls that complete
//!   the batch finished before (the worker's fused step), some of them
//!   rolled back too;
//! - two enqueuers add tasks of random priority (each priority is a band of
//!   its own, and the first task of a band makes its floor), some due a
//!   little later (promotion), some in a batch,
//!   some in a transaction held open a few milliseconds (it holds the shared
//!   floor lock while an advance tries for it);
//! - the queue's aging is switched on and off now and then (a re-key of
//!   every ready row);
//! - a reference claimer, in REPEATABLE READ so that two statements share a
//!   snapshot, or in READ COMMITTED with `ready` locked against writers (so
//!   its claims may start from the floors its backend keeps): it locks the first ready rows in claim order by reading the
//!   whole queue with no floor (the reference order), then claims (from the
//!   floors or from the head, at random), and the
//!   claim must return exactly those rows in that order;
//! - an invariant watcher: in every snapshot, every ready row of the queue is
//!   reachable by the claim (a floor row of some band b at or below it, with
//!   k1 <= b, or of its aging band).
//!
//! Then everything drains. Passes when the reference claims always matched,
//! the watcher never saw a row below the floor, the floor did advance, and
//! every task enqueued was completed exactly once.

use std::collections::HashMap;
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
/// The reference claims a run needs before its order is worth checking.
const MIN_REFERENCE_CLAIMS: u64 = 100;
/// The floor moves a run needs to have tested anything.
const MIN_FLOOR_MOVES: u64 = 10;

#[derive(Default)]
struct Record {
    ledger: Ledger,
    mismatches: Vec<String>,
    below_floor: Vec<i64>,
    reference_claims: u64,
    floor_moves: u64,
}

type Shared = Arc<Mutex<Record>>;

impl Books for Record {
    fn ledger(&mut self) -> &mut Ledger {
        &mut self.ledger
    }
}

async fn claim(db: &Client, queue: &str, worker: &str, n: i32) -> Vec<(Uuid, i64)> {
    ledger::claim(db, queue, worker, n, OnDeadlock::Fail).await
}

/// Makes the claims of `db` seek from the floors always (`floors`), or
/// from the head of the queue unless the xmin horizon lags (the default;
/// in this test it does not lag for long): both claims run concurrently.
async fn seek_from_floors(db: &Client, floors: bool) {
    let lag = if floors { 0 } else { 10_000 };
    floors_at(db, lag, lag * 10).await;
}

/// A threshold no test reaches.
const NEVER: i64 = 2_000_000_000;

/// Sets `sheaf.claim_floors_at_lag` and `sheaf.claim_floors_at_dead_rows`
/// for the session of `db`.
async fn floors_at(db: &Client, lag: i64, dead_rows: i64) {
    db.batch_execute(&format!(
        "SET sheaf.claim_floors_at_lag = {lag}; SET sheaf.claim_floors_at_dead_rows = {dead_rows}"
    ))
    .await
    .unwrap();
}

/// Makes the xmin horizon lag `lag` transactions or more behind while the
/// returned connection holds its snapshot open.
async fn hold_snapshot(lag: u32) -> Client {
    let shard = fleet().shards().next().unwrap();
    let (holder, burner) = (connect(shard).await, connect(shard).await);
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .await
        .unwrap();
    for _ in 0..lag {
        burner.batch_execute("SELECT pg_current_xact_id()").await.unwrap();
    }
    holder
}

async fn claimer(queue: String, worker: String, floors: bool, rec: Shared, stop: Arc<AtomicBool>, seed: u64) {
    let shard = fleet().shards().next().unwrap();
    let db = connect(shard).await;
    seek_from_floors(&db, floors).await;
    let mut rng = Rng::new(seed);
    // Tasks done whose completion goes with the next fused claim.
    let mut finished: Vec<(Uuid, i64)> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let n = 1 + rng.below(8) as i32;
        let roll = rng.below(100);
        let fuse = rng.below(2) == 0;
        if !fuse {
            ledger::complete(&db, &*rec, &std::mem::take(&mut finished)).await;
        }
        if roll < 15 {
            // A claim that rolls back: its rows come back where they were,
            // and a fused call's completions are undone (booked, then
            // taken back, and completed again alone).
            let done = std::mem::take(&mut finished);
            db.batch_execute("BEGIN").await.unwrap();
            let got = next(&db, &rec, (&queue, &worker, n), fuse, &done).await;
            if !got.is_empty() {
                tokio::time::sleep(Duration::from_micros(rng.below(2000))).await;
            }
            db.batch_execute("ROLLBACK").await.unwrap();
            let mut books = rec.lock().await;
            for (id, _) in &done {
                *books.ledger.completed.entry(*id).or_default() -= 1;
            }
            drop(books);
            ledger::complete(&db, &*rec, &done).await;
            continue;
        }
        let got = next(
            &db,
            &rec,
            (&queue, &worker, n),
            fuse,
            &std::mem::take(&mut finished),
        )
        .await;
        if got.is_empty() {
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        match roll {
            15..25 => {
                for (id, token) in &got {
                    db.execute("SELECT sheaf.release($1, $2)", &[id, token])
                        .await
                        .unwrap();
                }
            }
            25..33 => {
                for (id, token) in &got {
                    db.execute(
                        "SELECT * FROM sheaf.fail($1, $2, 'again', '30 milliseconds')",
                        &[id, token],
                    )
                    .await
                    .unwrap();
                }
            }
            33..37 => {
                for (id, token) in &got {
                    db.execute("SELECT sheaf.dead_letter($1, $2, 'buried')", &[id, token])
                        .await
                        .unwrap();
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

/// The next claim: fused with the completion of `done` (`fuse`), or alone.
async fn next(
    db: &Client,
    rec: &Shared,
    (queue, worker, n): (&str, &str, i32),
    fuse: bool,
    done: &[(Uuid, i64)],
) -> Vec<(Uuid, i64)> {
    if fuse {
        ledger::complete_and_claim(db, &**rec, done, (queue, worker, n), OnDeadlock::Fail).await
    } else {
        assert!(done.is_empty(), "completed before a plain claim");
        claim(db, queue, worker, n).await
    }
}

async fn enqueuer(queue: String, rec: Shared, stop: Arc<AtomicBool>, seed: u64) {
    const MIX: EnqueueMix = EnqueueMix {
        batch: 5,
        later_ms: 300,
        hold_us: 5000,
    };
    let shard = fleet().shards().next().unwrap();
    let db = connect(shard).await;
    let mut rng = Rng::new(seed);
    while !stop.load(Ordering::Relaxed) {
        let opts = json!({"priority": rng.below(6) as i32, "max_attempts": 1000});
        ledger::enqueue(&db, &*rec, &mut rng, &queue, &opts, &MIX).await;
        tokio::time::sleep(Duration::from_micros(rng.below(1500))).await;
    }
}

async fn reference_claimer(queue: String, rec: Shared, stop: Arc<AtomicBool>, seed: u64) {
    let shard = fleet().shards().next().unwrap();
    let db = connect(shard).await;
    let mut rng = Rng::new(seed);
    while !stop.load(Ordering::Relaxed) {
        let n = 1 + rng.below(4) as i64;
        seek_from_floors(&db, rng.below(2) == 0).await;
        // Or READ COMMITTED, where claims may start from the floors their
        // backend keeps, with the ready set held still (SHARE: no writer
        // in flight, none until the end) so each statement sees the same.
        let begin = if rng.below(2) == 0 {
            "BEGIN ISOLATION LEVEL REPEATABLE READ"
        } else {
            "BEGIN ISOLATION LEVEL READ COMMITTED; LOCK TABLE sheaf.ready IN SHARE MODE"
        };
        db.batch_execute(begin).await.unwrap();
        match reference_round(&db, &queue, n).await {
            Ok((reference, before, claimed)) => {
                db.batch_execute("COMMIT").await.unwrap();
                let ids: Vec<Uuid> = claimed.iter().map(|t| t.0).collect();
                if let Some(wrong) = out_of_order(&reference, &before, &ids, n as usize) {
                    rec.lock().await.mismatches.push(wrong);
                }
                rec.lock().await.reference_claims += 1;
                ledger::complete(&db, &*rec, &claimed).await;
            }
            // A row changed since the snapshot (a concurrent claim or
            // completion): nothing to compare.
            Err(e) if code(&e) == Some("40001") => db.batch_execute("ROLLBACK").await.unwrap(),
            Err(e) => panic!("reference round: {e}"),
        }
    }
}

/// In one snapshot (or a held-still ready set): the first `n` unlocked ready rows in
/// claim order read with no floor (locked, so no one else takes them), the
/// queue's ready set, and what the claim returns.
async fn reference_round(
    db: &Client,
    queue: &str,
    n: i64,
) -> Result<(Vec<Uuid>, HashMap<Uuid, Key>, Vec<(Uuid, i64)>), tokio_postgres::Error> {
    // Ordered by expressions: the index (and so any floor) plays no part.
    let reference: Vec<Uuid> = db
        .query(
            "SELECT task_id FROM sheaf.ready WHERE queue = $1 \
             ORDER BY k1 + 0, k2 + 0, seq + 0 LIMIT $2 FOR UPDATE SKIP LOCKED",
            &[&queue, &n],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let before: HashMap<Uuid, Key> = db
        .query(
            "SELECT task_id, k1, k2, seq FROM sheaf.ready WHERE queue = $1",
            &[&queue],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
        .collect();
    let claimed = db
        .query(
            "SELECT task_id, token FROM sheaf.claim($1, 'reference', $2)",
            &[&queue, &(n as i32)],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    Ok((reference, before, claimed))
}

/// Why `claimed` (a claim of `n`) skipped a row it should have taken, if it
/// did: a reference row (ours, locked, so the claim could take it) may be
/// left out only by a full claim whose every row comes before it. Rows
/// that were locked by someone else while the reference was read (and
/// free again for the claim) may come first; so may tasks the claim's own
/// sweep promoted (not in `before`).
fn out_of_order(
    reference: &[Uuid],
    before: &HashMap<Uuid, Key>,
    claimed: &[Uuid],
    n: usize,
) -> Option<String> {
    let highest = claimed
        .iter()
        .filter_map(|id| before.get(id))
        .copied()
        .reduce(|a, b| if later(b, a) { b } else { a });
    let skipped: Vec<&Uuid> = reference
        .iter()
        .filter(|r| !claimed.contains(r))
        .filter(|r| claimed.len() < n || highest.is_some_and(|h| later(h, before[*r])))
        .collect();
    (!skipped.is_empty())
        .then(|| format!("reference {reference:?}, claimed {claimed:?}: skipped {skipped:?}"))
}

type Key = (f64, f64, i64);

/// Whether `a` comes after `b` in claim order.
fn later(a: Key, b: Key) -> bool {
    a.0.total_cmp(&b.0)
        .then(a.1.total_cmp(&b.1))
        .then(a.2.cmp(&b.2))
        .is_gt()
}

async fn watcher(queue: String, rec: Shared, stop: Arc<AtomicBool>) {
    let shard = fleet().shards().next().unwrap();
    let db = connect(shard).await;
    let mut last: Option<String> = None;
    while !stop.load(Ordering::Relaxed) {
        // One statement, one snapshot: the ready rows no band's seek reaches
        // (the claim seeks band b from its floor, up to k1 <= b), and the
        // floors.
        let row = db
            .query_one(
                "SELECT (SELECT count(*) FROM sheaf.ready r WHERE r.queue = $1 AND NOT EXISTS ( \
                           SELECT 1 FROM sheaf.ready_floors f WHERE f.queue = $1 \
                             AND (CASE WHEN f.band < -1e14 THEN f.band = r.aging_band ELSE r.k1 <= f.band END) \
                             AND (f.k1, f.k2, f.seq) <= (r.k1, r.k2, r.seq))), \
                        (SELECT string_agg(format('%s:%s/%s/%s', band, k1, k2, seq), ' ' ORDER BY band) \
                         FROM (SELECT DISTINCT ON (band) band, k1, k2, seq FROM sheaf.ready_floors \
                               WHERE queue = $1 ORDER BY band, k1, k2, seq) fl)",
                &[&queue],
            )
            .await
            .unwrap();
        let below: i64 = row.get(0);
        let floor: Option<String> = row.get(1);
        let mut r = rec.lock().await;
        if below > 0 {
            r.below_floor.push(below);
        }
        if last != floor {
            r.floor_moves += 1;
            last = floor;
        }
        drop(r);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn rekeyer(queue: String, stop: Arc<AtomicBool>) {
    let shard = fleet().shards().next().unwrap();
    let db = connect(shard).await;
    let mut aging = false;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(700)).await;
        aging = !aging;
        let opts = if aging {
            json!({"aging_secs": 60})
        } else {
            json!({"aging_secs": null})
        };
        db.execute("SELECT sheaf.configure_queue($1, $2)", &[&queue, &opts])
            .await
            .unwrap_or_else(|e| panic!("configure_queue: {e:?}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_claim_order_holds_while_the_floor_moves() {
    let queue = unique("floor");
    let rec: Shared = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let (mut rng, seed) = Rng::from_time();
    let shard = fleet().shards().next().unwrap();
    let db = connect(shard).await;
    // The queue exists (and has its floor row) before anyone claims it.
    db.execute("SELECT sheaf.configure_queue($1, '{}')", &[&queue])
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..2 {
        tasks.push(tokio::spawn(claimer(
            queue.clone(),
            format!("claimer-{i}"),
            i == 0,
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
    tasks.push(tokio::spawn(reference_claimer(
        queue.clone(),
        rec.clone(),
        stop.clone(),
        rng.next_u64(),
    )));
    tasks.push(tokio::spawn(watcher(queue.clone(), rec.clone(), stop.clone())));
    tasks.push(tokio::spawn(rekeyer(queue.clone(), stop.clone())));
    // At least CHAOS, and on until the reference has claimed enough to
    // compare with, however slow the machine (bounded: a stalled run fails
    // in `check`).
    let began = std::time::Instant::now();
    tokio::time::sleep(CHAOS).await;
    while began.elapsed() < CHAOS * 15 {
        let r = rec.lock().await;
        if r.reference_claims > MIN_REFERENCE_CLAIMS && r.floor_moves > MIN_FLOOR_MOVES {
            break;
        }
        drop(r);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }

    ledger::drain(&db, &queue, &*rec, seed, OnDeadlock::Fail).await;
    check(&*rec.lock().await, seed);
}

/// Everything the run recorded, against the invariants (see the top).
fn check(rec: &Record, seed: u64) {
    assert!(
        rec.mismatches.is_empty(),
        "the claim left the reference order {} time(s) of {}, first: {} (seed {seed})",
        rec.mismatches.len(),
        rec.reference_claims,
        rec.mismatches[0]
    );
    assert!(
        rec.below_floor.is_empty(),
        "ready rows below the floor in {} snapshot(s) (seed {seed})",
        rec.below_floor.len()
    );
    assert!(
        rec.reference_claims > MIN_REFERENCE_CLAIMS,
        "only {} reference claims",
        rec.reference_claims
    );
    let moves = rec.floor_moves;
    assert!(
        moves > MIN_FLOOR_MOVES,
        "the floor moved only {moves} time(s): the test proves nothing"
    );
    rec.ledger.check_exactly_once(seed);
    println!(
        "{} tasks, {} reference claims, the floor seen at {moves} places",
        rec.ledger.enqueued.len(),
        rec.reference_claims
    );
}

/// Index scans of `ready_floors` in the open transaction of `db`.
async fn floor_reads(db: &Client) -> i64 {
    db.query_one(
        "SELECT coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables \
         WHERE schemaname = 'sheaf' AND relname = 'ready_floors'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Whether one claim of `queue` on `db`, and then one fused
/// `complete_and_claim`, both read the floors (each must seek as the other
/// does; a claim's periodic lease sweep may read them too, but not in two
/// calls in a row).
async fn claim_reads_floors(db: &Client, queue: &str) -> bool {
    let mut read = Vec::new();
    for sql in [
        "SELECT task_id FROM sheaf.claim($1, 'w', 1)",
        "SELECT task_id FROM sheaf.complete_and_claim($1, 'w', '{}', '{}', 1)",
    ] {
        db.batch_execute("BEGIN").await.unwrap();
        let before = floor_reads(db).await;
        let got = db.query(sql, &[&queue]).await.unwrap();
        let after = floor_reads(db).await;
        db.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(got.len(), 1, "a task to claim ({sql})");
        read.push(after > before);
    }
    read[0] && read[1]
}

/// Claims seek from the head of the queue while nothing holds the xmin
/// horizon back, and from the floors once a snapshot held open lets it lag
/// `sheaf.claim_floors_at_lag` transactions behind.
#[tokio::test]
async fn claims_seek_from_the_floors_once_a_held_snapshot_lags() {
    let queue = unique("lag");
    let shard = fleet().shards().next().unwrap();
    let db = connect(shard).await;
    db.execute("SELECT sheaf.enqueue($1, '{}')", &[&queue])
        .await
        .unwrap();
    floors_at(&db, NEVER, NEVER).await;
    assert!(!claim_reads_floors(&db, &queue).await, "no lag: from the head");
    floors_at(&db, 0, NEVER).await;
    assert!(claim_reads_floors(&db, &queue).await, "0: always from the floors");

    let holder = hold_snapshot(20).await;
    floors_at(&db, 10, NEVER).await;
    assert!(
        claim_reads_floors(&db, &queue).await,
        "a lag of 20 or more: from the floors"
    );
    holder.batch_execute("COMMIT").await.unwrap();
}

/// Claims seek from the floors while `ready` counts
/// `sheaf.claim_floors_at_dead_rows` dead rows (read once a second from
/// the statistics, which other backends flush about as often): here 1,
/// with dead rows made until a claim sees them.
#[tokio::test]
async fn claims_seek_from_the_floors_while_ready_counts_dead_rows() {
    let queue = unique("dead");
    let shard = fleet().shards().next().unwrap();
    let (db, churn) = (connect(shard).await, connect(shard).await);
    db.execute("SELECT sheaf.enqueue($1, '{}')", &[&queue])
        .await
        .unwrap();
    floors_at(&db, NEVER, NEVER).await;
    assert!(
        !claim_reads_floors(&db, &queue).await,
        "too few dead rows: from the head"
    );
    floors_at(&db, NEVER, 1).await;
    let churned = unique("churn");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    // Each round leaves dead rows in `ready` (claimed tasks), in case a
    // vacuum took the last ones; the statistics show them within seconds.
    while !claim_reads_floors(&db, &queue).await {
        assert!(
            std::time::Instant::now() < deadline,
            "no claim read the floors in 60 s of dead rows"
        );
        churn
            .batch_execute(&format!(
                "SELECT sheaf.enqueue_batch('{churned}', array_fill('{{}}'::jsonb, ARRAY[20])); \
                 SELECT sheaf.complete(task_id, token) FROM sheaf.claim('{churned}', 'churn', 20)"
            ))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The first ready task of `queue` in claim order, read whole (no floor).
async fn head(db: &Client, queue: &str) -> Uuid {
    db.query_one(
        "SELECT task_id FROM sheaf.ready WHERE queue = $1 ORDER BY k1, k2, seq LIMIT 1",
        &[&queue],
    )
    .await
    .unwrap()
    .get(0)
}

/// A backend keeps the floors it read between its claims instead of
/// walking them each time (`floor::kept`). A task another backend readies
/// below them (a release, back at its old key) is still the next it
/// claims; so is the head of the queue after a transaction of its own that
/// advanced the floors rolled back.
#[tokio::test]
async fn kept_floors_give_way_to_a_release_and_to_a_rollback() {
    let queue = unique("kept");
    let shard = fleet().shards().next().unwrap();
    let (a, b) = (connect(shard).await, connect(shard).await);
    floors_at(&a, 0, 0).await;
    a.execute(
        "SELECT sheaf.enqueue($1, jsonb_build_object('n', i)) FROM generate_series(0, 599) i",
        &[&queue],
    )
    .await
    .unwrap();
    // One by one past an advance (every 128 rows): the floors move up, and
    // the claims after it start from floors read afresh and kept.
    let mut taken = Vec::new();
    for _ in 0..140 {
        taken.extend(claim(&a, &queue, "a", 1).await);
    }
    assert_eq!(taken.len(), 140);
    let (id, token) = taken[0];
    b.execute("SELECT sheaf.release($1, $2)", &[&id, &token])
        .await
        .unwrap();
    assert_eq!(
        claim(&a, &queue, "a", 1).await[0].0,
        id,
        "the released task, readied below the kept floors, is claimed next"
    );

    let next = head(&b, &queue).await;
    a.batch_execute("BEGIN").await.unwrap();
    for _ in 0..140 {
        assert_eq!(claim(&a, &queue, "a", 1).await.len(), 1);
    }
    a.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        claim(&a, &queue, "a", 1).await[0].0,
        next,
        "after the rollback of its advance, the head of the queue"
    );
}

/// A claim from kept floors whose generation moved meanwhile takes nothing
/// and tries floors read afresh; when those move too before its claim,
/// it walks the floors in the claim's own statement, and never reports
/// an empty queue while tasks wait. Three backends cycle enqueue → claim
/// → complete over a queue that never holds fewer than 300 ready tasks,
/// each claim from the floors, while a fourth takes floor generations as
/// fast as it can (as an advance does before it finds the lock taken and
/// writes nothing): every claim must return its task.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_never_comes_back_empty_while_the_floor_generation_moves() {
    const READY: i64 = 300;
    const CYCLES: usize = 1_000;
    let queue = unique("moving-gen");
    let shard = fleet().shards().next().unwrap();
    let db = connect(shard).await;
    db.execute(
        "SELECT sheaf.enqueue($1, jsonb_build_object('n', i), jsonb_build_object('priority', i % 3)) \
         FROM generate_series(1, $2::int8) i",
        &[&queue, &READY],
    )
    .await
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mover = {
        let stop = stop.clone();
        let mover = connect(shard).await;
        tokio::spawn(async move {
            let mut moves = 0u64;
            while !stop.load(Ordering::Relaxed) {
                mover
                    .batch_execute("SELECT nextval('sheaf.ready_floor_gen')")
                    .await
                    .unwrap();
                moves += 1;
            }
            moves
        })
    };
    let mut cyclers = Vec::new();
    for i in 0..3 {
        let (queue, c) = (queue.clone(), connect(shard).await);
        floors_at(&c, 0, 0).await;
        cyclers.push(tokio::spawn(async move {
            let mut empty = 0;
            for n in 0..CYCLES {
                c.execute(
                    "SELECT sheaf.enqueue($1, jsonb_build_object('n', $2::int8), jsonb_build_object('priority', $2::int8 % 3))",
                    &[&queue, &(n as i64)],
                )
                .await
                .unwrap();
                match claim(&c, &queue, &format!("cycler-{i}"), 1).await[..] {
                    [(id, token)] => {
                        c.execute("SELECT sheaf.complete($1, $2)", &[&id, &token])
                            .await
                            .unwrap();
                    }
                    _ => empty += 1,
                }
            }
            empty
        }));
    }
    let mut empty = 0;
    for c in cyclers {
        empty += c.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let moves = mover.await.unwrap();
    assert_eq!(
        empty,
        0,
        "{empty} of {} claims came back empty with at least {READY} tasks ready ({moves} generations taken meanwhile)",
        3 * CYCLES
    );
    assert!(
        moves > 100,
        "only {moves} generations taken: the test proves nothing"
    );
}
