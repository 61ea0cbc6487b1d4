//! The durable mutex under real concurrency: 8 connections take one key in
//! turn, some holders crash without releasing and lose the lock to
//! `mutex_reclaim` once their lease runs out. Checks: never two holders inside
//! the critical section at once (an in-process witness), fencing tokens only
//! go up, a crashed holder's token is refused once the lock passed on, waiters
//! are served first come first served and keep their place when they ask
//! again.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use sheaf_driver::Shard;
use sheaf_tests::{Rng, code, connect, connect_listening, fleet, query_retrying, sqlstate, unique};
use tokio_postgres::{Client, Error};
use uuid::Uuid;

const HOLDERS: usize = 8;
const CYCLES: usize = 40;
/// Short, so a crashed holder's lease runs out within the test.
const LEASE: &str = "1 second";
const LEASE_LEN: Duration = Duration::from_secs(1);
/// How far the shard's idea of when a lease began may precede ours (the
/// granting transaction's start): a lease counts as lost early only beyond it.
const GRANT_SLACK: Duration = Duration::from_millis(500);
/// Between the shard's clock and ours when computing a lease's end.
const CLOCK_SLACK: Duration = Duration::from_millis(50);
/// How long a waiter polls before the test gives up on it.
const PATIENCE: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Acquired {
    granted: bool,
    token: Option<i64>,
    position: i32,
}

async fn acquire(db: &Client, key: &str, owner: Uuid, lease: &str) -> Result<Acquired, Error> {
    let rows = query_retrying(
        db,
        "SELECT granted, token, queue_position FROM sheaf.mutex_acquire($1, $2, $3::text::interval)",
        &[&key, &owner, &lease],
    )
    .await?;
    assert_eq!(rows.len(), 1, "mutex_acquire returns one row");
    Ok(Acquired {
        granted: rows[0].get(0),
        token: rows[0].get(1),
        position: rows[0].get(2),
    })
}

/// The next holder the release handed the lock to, if any.
async fn release(db: &Client, key: &str, owner: Uuid, token: i64) -> Result<Option<Uuid>, Error> {
    let rows = query_retrying(
        db,
        "SELECT sheaf.mutex_release($1, $2, $3)",
        &[&key, &owner, &token],
    )
    .await?;
    Ok(rows[0].get(0))
}

async fn renew(db: &Client, key: &str, owner: Uuid, token: i64) -> Result<SystemTime, Error> {
    let rows = query_retrying(
        db,
        "SELECT sheaf.mutex_renew($1, $2, $3, $4::text::interval)",
        &[&key, &owner, &token, &LEASE],
    )
    .await?;
    Ok(rows[0].get(0))
}

async fn reclaim(db: &Client) -> i32 {
    let rows = query_retrying(db, "SELECT sheaf.mutex_reclaim()", &[])
        .await
        .unwrap_or_else(|e| panic!("mutex_reclaim: {e:?}"));
    rows[0].get(0)
}

#[derive(Debug, Default, PartialEq)]
struct Status {
    holder: Option<Uuid>,
    token: Option<i64>,
    lease_expires_at: Option<SystemTime>,
    waiters: i32,
}

/// A free key may be reported as no row or as a row without a holder; both
/// read as the default status.
async fn status(db: &Client, key: &str) -> Status {
    let rows = db
        .query(
            "SELECT holder, token, lease_expires_at, waiters FROM sheaf.mutex_status($1)",
            &[&key],
        )
        .await
        .unwrap_or_else(|e| panic!("mutex_status {key}: {e}"));
    assert!(rows.len() <= 1, "mutex_status returns at most one row");
    rows.first().map_or_else(Status::default, |r| Status {
        holder: r.get(0),
        token: r.get(1),
        lease_expires_at: r.get(2),
        waiters: r.get(3),
    })
}

/// Polls until granted, reclaiming expired leases between polls (no
/// background worker does it in this test). Returns the token and the
/// earliest moment the grant can have happened: when the last poll that was
/// not granted was sent.
async fn acquire_waiting(db: &Client, key: &str, owner: Uuid) -> (i64, Instant) {
    let give_up = Instant::now() + PATIENCE;
    let mut earliest = Instant::now();
    loop {
        let sent = Instant::now();
        let a = acquire(db, key, owner, LEASE)
            .await
            .unwrap_or_else(|e| panic!("mutex_acquire by {owner}: {e}"));
        if a.granted {
            assert_eq!(a.position, 0, "a holder has no queue position");
            let token = a
                .token
                .unwrap_or_else(|| panic!("a grant without a token: {a:?}"));
            return (token, earliest);
        }
        assert_eq!(a.token, None, "a waiter gets no token");
        // Every other holder can be waiting, and the holder can be a crashed one.
        assert!(
            (1..=HOLDERS as i32).contains(&a.position),
            "queue position {} with {HOLDERS} contenders",
            a.position
        );
        earliest = sent;
        reclaim(db).await;
        assert!(Instant::now() < give_up, "{owner} waited {PATIENCE:?} for {key}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Renews the lease just granted and returns a moment before which it surely
/// still runs: the renewed end minus the shard's clock, counted from before the
/// call was sent. None: the lease ran out and passed on before we got here.
async fn confirm(db: &Client, key: &str, owner: Uuid, token: i64) -> Option<Instant> {
    let sent = Instant::now();
    let rows = query_retrying(
        db,
        "SELECT extract(epoch FROM sheaf.mutex_renew($1, $2, $3, $4::text::interval) - clock_timestamp())::float8",
        &[&key, &owner, &token, &LEASE],
    )
    .await;
    match rows {
        Ok(rows) => {
            let left: f64 = rows[0].get(0);
            let left = Duration::from_secs_f64(left.max(0.0));
            Some(sent + left.saturating_sub(CLOCK_SLACK))
        }
        Err(e) if code(&e) == Some("55P03") => None,
        Err(e) => panic!("mutex_renew by the holder {owner} (token {token}): {e}"),
    }
}

/// Who is inside the critical section, as the holders themselves report it.
#[derive(Default)]
struct Witness {
    inside: Option<Inside>,
    last_token: i64,
    entries: usize,
    /// A holder whose lease ran out while it was inside was displaced: a
    /// loaded machine can stall a holder past a 1 s lease.
    overruns: usize,
    /// Grants that ran out before the holder could use them.
    lost: usize,
}

struct Inside {
    owner: Uuid,
    token: i64,
    valid_until: Instant,
}

impl Witness {
    fn enter(&mut self, owner: Uuid, token: i64, valid_until: Instant) {
        if let Some(other) = &self.inside {
            let now = Instant::now();
            assert!(
                now >= other.valid_until,
                "two holders: {owner} (token {token}) entered while {} (token {}) holds a lease \
                 that runs {:?} more",
                other.owner,
                other.token,
                other.valid_until - now
            );
            self.overruns += 1;
        }
        assert!(
            token > self.last_token,
            "fencing token {token} granted after {}",
            self.last_token
        );
        self.last_token = token;
        self.entries += 1;
        self.inside = Some(Inside {
            owner,
            token,
            valid_until,
        });
    }

    /// A holder that overran its lease may find its successor inside already.
    fn exit(&mut self, owner: Uuid) {
        if self.inside.as_ref().is_some_and(|i| i.owner == owner) {
            self.inside = None;
        }
    }
}

/// One connection's acquire / work / release cycles. Returns the (owner,
/// token) of every crash.
async fn holder_run(shard: &Shard, key: &str, witness: &Mutex<Witness>, rng: &mut Rng) -> Vec<(Uuid, i64)> {
    let db = connect(shard).await;
    let mut owner = Uuid::new_v4();
    let mut crashed = Vec::new();
    // Crashed incarnations of this holder whose stale release is still to try.
    let mut unchecked: Vec<(Uuid, i64)> = Vec::new();
    for _ in 0..CYCLES {
        let (token, earliest) = acquire_waiting(&db, key, owner).await;
        let Some(valid_until) = confirm(&db, key, owner, token).await else {
            assert!(
                Instant::now() >= earliest + LEASE_LEN - GRANT_SLACK,
                "{owner} lost token {token} {:?} after it can have been granted, under its {LEASE} lease",
                earliest.elapsed()
            );
            witness.lock().unwrap().lost += 1;
            continue;
        };
        witness.lock().unwrap().enter(owner, token, valid_until);
        // We hold the lock, so it passed on from every crashed incarnation of
        // this holder: their tokens are stale now, and trying them must not
        // disturb us (our own release below must still succeed).
        for (old, old_token) in unchecked.drain(..) {
            assert_eq!(
                sqlstate(release(&db, key, old, old_token).await),
                "55P03",
                "the crashed holder {old} released with its stale token {old_token}"
            );
        }
        tokio::time::sleep(Duration::from_millis(1 + rng.below(4))).await;
        if rng.below(100) < 10 {
            // Crash: the holder stops working and walks away without
            // releasing. A restarted process comes back as a new owner.
            witness.lock().unwrap().exit(owner);
            crashed.push((owner, token));
            unchecked.push((owner, token));
            owner = Uuid::new_v4();
            continue;
        }
        // Leave before releasing: the next holder may enter as soon as the
        // release commits.
        witness.lock().unwrap().exit(owner);
        match release(&db, key, owner, token).await {
            Ok(_) => {}
            Err(e) if code(&e) == Some("55P03") && Instant::now() >= valid_until => {
                witness.lock().unwrap().overruns += 1;
            }
            Err(e) => panic!("release by the holder {owner} (token {token}) within its lease: {e}"),
        }
    }
    crashed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_holder_at_a_time_and_a_crashed_holder_loses_the_lock_to_reclaim() {
    let shard = fleet().shards().next().unwrap();
    let key = unique("mutex");
    let (_, seed) = Rng::from_time();
    println!("seed {seed}, key {key}");
    let witness = Arc::new(Mutex::new(Witness::default()));
    let mut holders = Vec::new();
    for h in 0..HOLDERS {
        let witness = witness.clone();
        let key = key.clone();
        let mut rng = Rng::new(seed ^ (h as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        holders.push(tokio::spawn(async move {
            holder_run(shard, &key, &witness, &mut rng).await
        }));
    }
    let mut crashed = Vec::new();
    for h in holders {
        crashed.extend(h.await.unwrap());
    }
    let (entries, lost, overruns, last_token) = {
        let w = witness.lock().unwrap();
        (w.entries, w.lost, w.overruns, w.last_token)
    };
    println!(
        "{entries} entries, {} crashes, {lost} grants lost before use, {overruns} leases overrun",
        crashed.len()
    );
    assert_eq!(entries + lost, HOLDERS * CYCLES, "every cycle got the lock");
    // 10% of 320 cycles: no crash at all would mean the crash path never ran.
    assert!(!crashed.is_empty(), "no holder crashed (seed {seed})");

    // The last crashed holder may still hold an expired lease: a fresh owner
    // takes the lock (reclaiming it) and lets it go, so it passed on from all.
    let db = connect(shard).await;
    let last = Uuid::new_v4();
    let (token, _) = acquire_waiting(&db, &key, last).await;
    assert!(token > last_token, "token {token} after {last_token}");
    assert_eq!(
        release(&db, &key, last, token).await.unwrap(),
        None,
        "nobody waits any more"
    );
    let st = status(&db, &key).await;
    assert_eq!((st.holder, st.waiters), (None, 0), "{st:?}");
    for (owner, token) in &crashed {
        assert_eq!(
            sqlstate(release(&db, &key, *owner, *token).await),
            "55P03",
            "the crashed holder {owner} released with its stale token {token}"
        );
    }
}

#[tokio::test]
async fn waiters_are_served_in_enqueue_order_and_keep_their_place() {
    let shard = fleet().shards().nth(1).unwrap();
    let (listener, mut notes) = connect_listening(shard).await;
    listener.batch_execute("LISTEN sheaf_mutex").await.unwrap();
    let db = connect(shard).await;
    let key = unique("fifo");
    let holder = Uuid::new_v4();
    let waiters: Vec<Uuid> = (0..5).map(|_| Uuid::new_v4()).collect();

    let first = acquire(&db, &key, holder, "60 seconds").await.unwrap();
    assert!(first.granted && first.position == 0, "{first:?}");
    let token = first.token.expect("a grant carries a token");
    // Asking again while holding changes nothing: same token.
    let again = acquire(&db, &key, holder, "60 seconds").await.unwrap();
    assert!(again.granted, "{again:?}");
    assert_eq!(again.token, Some(token));

    for (i, w) in waiters.iter().enumerate() {
        let a = acquire(&db, &key, *w, "60 seconds").await.unwrap();
        assert!(!a.granted, "{w}: {a:?}");
        assert_eq!(a.token, None);
        assert_eq!(
            a.position,
            i as i32 + 1,
            "waiter {i} queues behind the ones before it"
        );
    }
    let before = status(&db, &key).await;
    assert_eq!(before.holder, Some(holder));
    assert_eq!(before.token, Some(token));
    assert_eq!(before.waiters, 5);
    assert!(before.lease_expires_at.is_some_and(|t| t > SystemTime::now()));

    // A waiter that asks again keeps its place instead of going to the back.
    let a = acquire(&db, &key, waiters[2], "60 seconds").await.unwrap();
    assert_eq!((a.granted, a.position), (false, 3), "{a:?}");

    // Neither a waiter nor the holder with a wrong token can release or renew.
    assert_eq!(sqlstate(release(&db, &key, waiters[0], token).await), "55P03");
    assert_eq!(sqlstate(release(&db, &key, holder, token + 1).await), "55P03");
    assert_eq!(sqlstate(renew(&db, &key, waiters[0], token).await), "55P03");
    assert_eq!(status(&db, &key).await, before, "a refused call changed the lock");

    // Each release hands the lock to the next waiter in enqueue order.
    let mut current = (holder, token);
    for (i, w) in waiters.iter().enumerate() {
        let next = release(&db, &key, current.0, current.1).await.unwrap();
        assert_eq!(next, Some(*w), "release {i} hands over to waiter {i}");
        let a = acquire(&db, &key, *w, "60 seconds").await.unwrap();
        assert!(a.granted && a.position == 0, "waiter {i}: {a:?}");
        let t = a.token.expect("a grant carries a token");
        assert!(t > current.1, "token {t} after {}", current.1);
        // The last waiter moved up one place with every hand-over.
        if i + 1 < waiters.len() {
            let last = acquire(&db, &key, waiters[4], "60 seconds").await.unwrap();
            assert_eq!((last.granted, last.position), (false, 4 - i as i32), "{last:?}");
        }
        let st = status(&db, &key).await;
        assert_eq!(
            (st.holder, st.token, st.waiters),
            (Some(*w), Some(t), 4 - i as i32)
        );
        current = (*w, t);
    }
    assert_eq!(release(&db, &key, current.0, current.1).await.unwrap(), None);
    let st = status(&db, &key).await;
    assert_eq!((st.holder, st.waiters), (None, 0), "{st:?}");

    // Every hand-over to a waiter was announced, in order, once.
    let ours: HashSet<String> = waiters.iter().map(Uuid::to_string).collect();
    let mut announced = Vec::new();
    while let Ok(Some(n)) = tokio::time::timeout(Duration::from_millis(500), notes.recv()).await {
        if ours.contains(n.payload()) {
            announced.push(n.payload().to_owned());
        }
    }
    let expected: Vec<String> = waiters.iter().map(Uuid::to_string).collect();
    assert_eq!(announced, expected);
}

#[tokio::test]
async fn an_expired_lease_passes_to_the_next_waiter_on_reclaim() {
    let shard = fleet().shards().nth(2).unwrap();
    let db = connect(shard).await;
    let key = unique("expire");
    let (holder, waiter) = (Uuid::new_v4(), Uuid::new_v4());

    let a = acquire(&db, &key, holder, LEASE).await.unwrap();
    let token = a.token.expect("a free key is granted at once");
    // Renewing moves the lease's end forward and the status shows it.
    let before = status(&db, &key).await;
    let renewed = renew(&db, &key, holder, token).await.unwrap();
    assert!(before.lease_expires_at.is_some_and(|t| renewed >= t));
    assert_eq!(status(&db, &key).await.lease_expires_at, Some(renewed));

    let w = acquire(&db, &key, waiter, "60 seconds").await.unwrap();
    assert_eq!((w.granted, w.position), (false, 1), "{w:?}");
    tokio::time::sleep(LEASE_LEN + Duration::from_millis(300)).await;
    assert!(reclaim(&db).await >= 1, "the expired lease was reclaimed");

    let st = status(&db, &key).await;
    assert_eq!((st.holder, st.waiters), (Some(waiter), 0), "{st:?}");
    let w = acquire(&db, &key, waiter, "60 seconds").await.unwrap();
    assert!(w.granted, "{w:?}");
    let new_token = w.token.expect("a grant carries a token");
    assert!(new_token > token);
    // The old holder's token is fenced off.
    assert_eq!(sqlstate(release(&db, &key, holder, token).await), "55P03");
    assert_eq!(sqlstate(renew(&db, &key, holder, token).await), "55P03");
    assert_eq!(status(&db, &key).await.holder, Some(waiter));
    assert_eq!(release(&db, &key, waiter, new_token).await.unwrap(), None);
}
