//! The books of a live claim test (`claim_floor.rs`, `wait_floor.rs`): the
//! tasks it enqueued and the completions it saw, the claim and complete
//! calls that keep them, the drain at the end, and its check that every
//! task enqueued was completed exactly once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Mutex;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::{Rng, code};

#[derive(Default)]
pub struct Ledger {
    pub enqueued: Vec<Uuid>,
    pub completed: HashMap<Uuid, u32>,
}

/// A test's record, which keeps a ledger besides what that test checks.
pub trait Books {
    fn ledger(&mut self) -> &mut Ledger;
}

/// What a claim that meets a deadlock (40P01) means to the test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDeadlock {
    /// A failure: nothing in the test should deadlock a claim.
    Fail,
    /// A claim that took nothing (docs/reference/sql/mutex.md, "Deadlocks" names the case),
    /// and the caller claims again.
    TakeNothing,
}

/// Claims up to `n` of `queue`; (id, token) pairs.
pub async fn claim(db: &Client, queue: &str, worker: &str, n: i32, on: OnDeadlock) -> Vec<(Uuid, i64)> {
    match db
        .query(
            "SELECT task_id, token FROM sheaf.claim($1, $2, $3)",
            &[&queue, &worker, &n],
        )
        .await
    {
        Ok(rows) => rows.iter().map(|r| (r.get(0), r.get(1))).collect(),
        Err(e) if on == OnDeadlock::TakeNothing && code(&e) == Some("40P01") => Vec::new(),
        Err(e) => panic!("claim: {e:?}"),
    }
}

/// Completes `tasks`, each booked as completed once more.
pub async fn complete<R: Books>(db: &Client, rec: &Mutex<R>, tasks: &[(Uuid, i64)]) {
    for (id, token) in tasks {
        db.execute("SELECT sheaf.complete($1, $2)", &[id, token])
            .await
            .unwrap_or_else(|e| panic!("complete: {e:?}"));
        *rec.lock().await.ledger().completed.entry(*id).or_default() += 1;
    }
}

/// Completes `finished` and claims up to `n` of `queue` in one call
/// (`sheaf.complete_and_claim`); each finished task must complete (the
/// caller holds its fresh token) and is booked once more; the claimed
/// (id, token) pairs.
pub async fn complete_and_claim<R: Books>(
    db: &Client,
    rec: &Mutex<R>,
    finished: &[(Uuid, i64)],
    (queue, worker, n): (&str, &str, i32),
    on: OnDeadlock,
) -> Vec<(Uuid, i64)> {
    let ids: Vec<Uuid> = finished.iter().map(|f| f.0).collect();
    let tokens: Vec<i64> = finished.iter().map(|f| f.1).collect();
    let rows = match db
        .query(
            "SELECT task_id, completed, token FROM sheaf.complete_and_claim($1, $2, $3, $4, $5)",
            &[&queue, &worker, &ids, &tokens, &n],
        )
        .await
    {
        Ok(rows) => rows,
        Err(e) if on == OnDeadlock::TakeNothing && code(&e) == Some("40P01") => {
            // Nothing was done: the finished tasks are completed alone.
            complete(db, rec, finished).await;
            return Vec::new();
        }
        Err(e) => panic!("complete_and_claim: {e:?}"),
    };
    let mut claimed = Vec::new();
    let mut books = rec.lock().await;
    for (k, row) in rows.iter().enumerate() {
        let id: Uuid = row.get(0);
        match row.get::<_, Option<bool>>(1) {
            Some(done) => {
                assert!(
                    done && finished.get(k).is_some_and(|f| f.0 == id),
                    "complete_and_claim: {id} (row {k}) not completed"
                );
                *books.ledger().completed.entry(id).or_default() += 1;
            }
            None => claimed.push((id, row.get::<_, Option<i64>>(2).expect("a claimed task's token"))),
        }
    }
    claimed
}

/// Claims and completes every task left in `queue` (scheduled ones come due
/// within a second); fails after 30 s naming the seed.
pub async fn drain<R: Books>(db: &Client, queue: &str, rec: &Mutex<R>, seed: u64, on: OnDeadlock) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = claim(db, queue, "drain", 100, on).await;
        complete(db, rec, &got).await;
        let left: i64 = db
            .query_one("SELECT count(*) FROM sheaf.tasks WHERE queue = $1", &[&queue])
            .await
            .unwrap_or_else(|e| panic!("counting tasks left: {e}"))
            .get(0);
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} tasks never drained (seed {seed})"
        );
        if got.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Ledger {
    /// Every task enqueued was completed, and none more than once.
    pub fn check_exactly_once(&self, seed: u64) {
        let twice: Vec<_> = self.completed.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "completed more than once: {twice:?} (seed {seed})"
        );
        let mut missing = self
            .enqueued
            .iter()
            .filter(|id| !self.completed.contains_key(id))
            .peekable();
        assert!(
            missing.peek().is_none(),
            "never completed: {:?} (seed {seed})",
            missing.collect::<Vec<_>>()
        );
        assert_eq!(self.completed.len(), self.enqueued.len(), "seed {seed}");
    }
}

/// How an enqueuer varies its enqueues: a batch of `batch` tasks in one roll
/// of ten, else one; one roll in ten due up to `later_ms` from now (promoted
/// by a claim's sweep); 15 rolls in 100 held in an open transaction for up
/// to `hold_us`, so claims meet tasks not yet committed.
pub struct EnqueueMix {
    pub batch: usize,
    pub later_ms: u64,
    pub hold_us: u64,
}

/// One enqueue of `mix` into `queue` with `opts`, booked in `rec`.
pub async fn enqueue<R: Books>(
    db: &Client,
    rec: &Mutex<R>,
    rng: &mut Rng,
    queue: &str,
    opts: &Value,
    mix: &EnqueueMix,
) {
    const OPTS: &str = "CASE WHEN $4::float8 > 0 THEN $3::jsonb || jsonb_build_object('run_at', \
                          now() + make_interval(secs => $4::float8 / 1000)) ELSE $3::jsonb END";
    let later_ms = if rng.below(10) == 0 {
        rng.below(mix.later_ms) as f64
    } else {
        0.0
    };
    let n = rng.next_u64();
    let roll = rng.below(100);
    let held = roll < 15;
    let (sql, params): (String, Vec<Value>) = if roll >= 90 {
        let payloads: Vec<Value> = (0..mix.batch).map(|i| json!({"n": n, "i": i})).collect();
        (
            format!("SELECT * FROM sheaf.enqueue_batch($1, $2::jsonb[], {OPTS})"),
            payloads,
        )
    } else {
        (
            format!("SELECT sheaf.enqueue($1, $2, {OPTS})"),
            vec![json!({"n": n})],
        )
    };
    // A deadlock victim (40P01) wrote nothing: the enqueue is made again, as
    // a caller would (docs/reference/sql/mutex.md, "Deadlocks"). Anything
    // else fails the test, with its SQLSTATE and message.
    let ids: Vec<Uuid> = loop {
        if held {
            db.batch_execute("BEGIN").await.unwrap();
        }
        let result = if roll >= 90 {
            db.query(sql.as_str(), &[&queue, &params, opts, &later_ms]).await
        } else {
            db.query(sql.as_str(), &[&queue, &params[0], opts, &later_ms])
                .await
        };
        match result {
            Ok(rows) => break rows.iter().map(|r| r.get(0)).collect(),
            Err(e) if code(&e) == Some("40P01") => {
                eprintln!("enqueue: a deadlock victim, enqueued again: {e:?}");
                if held {
                    db.batch_execute("ROLLBACK").await.unwrap();
                }
            }
            Err(e) => panic!("enqueue: {e:?}"),
        }
    };
    if held {
        tokio::time::sleep(Duration::from_micros(rng.below(mix.hold_us))).await;
        db.batch_execute("COMMIT").await.unwrap();
    }
    rec.lock().await.ledger().enqueued.extend(ids);
}
