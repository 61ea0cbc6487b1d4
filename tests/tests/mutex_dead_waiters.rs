//! Mutex waiters whose connection dies while they wait: each contender polls
//! on a connection of its own, and a waiter is killed by terminating its
//! backend. Its place lapses a third of its lease after its last acquire;
//! from then on no hand-over grants it the lock, and a grant handed to it
//! before passes on after that third, so the line moves on. Checks: never
//! two holders at once (an in-process witness), tokens only go up, the live
//! waiters are served first come first served, no dead waiter is handed the
//! lock once its place has lapsed, and one handed it just before holds up
//! the line for a third of its lease, not a whole one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sheaf_driver::Shard;
use sheaf_tests::{Rng, code, connect, fleet, query_retrying, unique};
use tokio_postgres::{Client, Error};
use uuid::Uuid;

/// The lease every contender asks for: the place it holds in line without
/// asking again, and the grant's lease.
const LEASE: &str = "1 second";
const LEASE_LEN: Duration = Duration::from_secs(1);
/// How long a waiter's place lasts without asking again: a third of it.
const PLACE_LEN: Duration = Duration::from_millis(333);
/// How often a live waiter asks again (well within its lease).
const POLL: Duration = Duration::from_millis(50);
/// How far the shard's start of a grant's lease may precede the last refused
/// poll we sent (the granting transaction began before it).
const GRANT_SLACK: Duration = Duration::from_millis(500);

/// (granted, token, queue position), under `LEASE`.
async fn acquire(db: &Client, key: &str, owner: Uuid) -> Result<(bool, Option<i64>, i32), Error> {
    acquire_for(db, key, owner, LEASE).await
}

async fn acquire_for(
    db: &Client,
    key: &str,
    owner: Uuid,
    lease: &str,
) -> Result<(bool, Option<i64>, i32), Error> {
    let rows = query_retrying(
        db,
        "SELECT granted, token, queue_position FROM sheaf.mutex_acquire($1, $2, $3::text::interval)",
        &[&key, &owner, &lease],
    )
    .await?;
    Ok((rows[0].get(0), rows[0].get(1), rows[0].get(2)))
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

async fn backend_pid(db: &Client) -> i32 {
    db.query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pg_backend_pid")
        .get(0)
}

/// Kills a contender's connection the way a crash does: its backend goes,
/// and it never asks again.
async fn kill(admin: &Client, pid: i32) {
    let killed: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("pg_terminate_backend")
        .get(0);
    assert!(killed, "backend {pid} was not terminated");
}

/// Who is inside the critical section, as the holders report it.
#[derive(Default)]
struct Witness {
    inside: Option<(Uuid, i64, Instant)>,
    last_token: i64,
    entries: usize,
    /// A holder stalled past its lease was displaced (allowed).
    overruns: usize,
}

impl Witness {
    /// `valid_until`: a moment before which the holder's lease surely runs.
    fn enter(&mut self, owner: Uuid, token: i64, valid_until: Instant) {
        if let Some((other, other_token, until)) = self.inside {
            assert!(
                Instant::now() >= until,
                "two holders: {owner} (token {token}) entered while {other} (token {other_token}) \
                 holds a lease that runs {:?} more",
                until - Instant::now()
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
        self.inside = Some((owner, token, valid_until));
    }

    fn exit(&mut self, owner: Uuid) {
        if self.inside.is_some_and(|(o, _, _)| o == owner) {
            self.inside = None;
        }
    }
}

/// Polls until granted: the token and a moment before which its lease surely
/// runs. `Err` when the connection died (the contender was killed).
async fn wait_for_grant(db: &Client, key: &str, owner: Uuid) -> Result<(i64, Instant), Error> {
    let mut earliest = Instant::now();
    loop {
        let sent = Instant::now();
        let (granted, token, position) = acquire(db, key, owner).await?;
        if granted {
            let token = token.unwrap_or_else(|| panic!("{owner}: a grant without a token"));
            return Ok((token, earliest + LEASE_LEN - GRANT_SLACK));
        }
        assert!(position >= 1, "{owner} waits at position {position}");
        earliest = sent;
        tokio::time::sleep(POLL).await;
    }
}

/// One turn of a contender: the owner, its token, the owner its release
/// handed the lock to, and when that release was sent (its transaction, and
/// so the hand-over's `now()`, began after).
type Turn = (Uuid, i64, Option<Uuid>, Instant);

/// A waiter that holds the lock briefly once granted, then releases.
async fn take_turn(
    db: &Client,
    key: &str,
    owner: Uuid,
    hold: Duration,
    witness: &Mutex<Witness>,
) -> Result<Turn, Error> {
    let (token, valid_until) = wait_for_grant(db, key, owner).await?;
    witness.lock().unwrap().enter(owner, token, valid_until);
    tokio::time::sleep(hold).await;
    // Leave before releasing: the next holder may enter once it commits.
    witness.lock().unwrap().exit(owner);
    let sent = Instant::now();
    let next = release(db, key, owner, token).await?;
    Ok((owner, token, next, sent))
}

/// `n` waiters join `key`'s line one after the other, behind `ahead` in
/// line already, each on a connection of its own, and each then waits for
/// its turn: their owners, backend pids and turns.
async fn join_line(
    shard: &'static Shard,
    key: &str,
    ahead: usize,
    n: usize,
    witness: &Arc<Mutex<Witness>>,
) -> (
    Vec<Uuid>,
    Vec<i32>,
    Vec<tokio::task::JoinHandle<Result<Turn, Error>>>,
) {
    let (mut owners, mut pids, mut turns) = (Vec::new(), Vec::new(), Vec::new());
    for i in ahead..ahead + n {
        let db = connect(shard).await;
        let owner = Uuid::new_v4();
        let (granted, _, position) = acquire(&db, key, owner).await.unwrap();
        assert_eq!(
            (granted, position),
            (false, i as i32 + 1),
            "waiter {i} joins at the back"
        );
        pids.push(backend_pid(&db).await);
        owners.push(owner);
        let (key, witness) = (key.to_owned(), witness.clone());
        turns.push(tokio::spawn(async move {
            take_turn(&db, &key, owner, Duration::from_millis(30), &witness).await
        }));
    }
    (owners, pids, turns)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_waiter_loses_its_place_and_the_live_ones_are_served_in_order() {
    let shard = fleet().shards().next().unwrap();
    let admin = connect(shard).await;
    let key = unique("deadwait");
    let witness = Arc::new(Mutex::new(Witness::default()));

    // A holder with a long lease keeps the lock while the line forms.
    let holder = Uuid::new_v4();
    let (granted, token, _) = acquire(&admin, &key, holder).await.unwrap();
    assert!(granted, "a free key is granted at once");
    let holder_token = token.unwrap();
    admin
        .execute(
            "SELECT sheaf.mutex_renew($1, $2, $3, '60 seconds')",
            &[&key, &holder, &holder_token],
        )
        .await
        .unwrap();

    // Six waiters join in turn; the head (0) and one in the middle (3) die.
    const WAITERS: usize = 6;
    const KILLED: [usize; 2] = [0, 3];
    let (owners, pids, turns) = join_line(shard, &key, 0, WAITERS, &witness).await;
    for &i in &KILLED {
        kill(&admin, pids[i]).await;
    }
    // Past the dead waiters' places; the live ones keep asking meanwhile.
    tokio::time::sleep(PLACE_LEN + Duration::from_millis(500)).await;
    let live: Vec<Uuid> = (0..WAITERS)
        .filter(|i| !KILLED.contains(i))
        .map(|i| owners[i])
        .collect();
    let waiting: i32 = admin
        .query_one("SELECT waiters FROM sheaf.mutex_status($1)", &[&key])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        waiting,
        live.len() as i32,
        "lapsed places are not counted as waiting"
    );

    let released = Instant::now();
    let next = release(&admin, &key, holder, holder_token).await.unwrap();
    assert_eq!(next, Some(live[0]), "the release skips the dead head of the line");
    let mut served: Vec<Turn> = Vec::new();
    for (i, turn) in turns.into_iter().enumerate() {
        let result = tokio::time::timeout(Duration::from_secs(30), turn)
            .await
            .unwrap_or_else(|_| panic!("waiter {i} not served within 30 s"))
            .unwrap();
        match result {
            Ok(turn) => {
                assert!(!KILLED.contains(&i), "the killed waiter {i} was served");
                served.push(turn);
            }
            Err(e) => assert!(
                KILLED.contains(&i) && code(&e).is_none_or(|c| c == "57P01"),
                "waiter {i}: {e}"
            ),
        }
    }
    let took = released.elapsed();
    // First come first served among the live, each handing on to the next
    // live one: no grant went to a dead waiter.
    served.sort_by_key(|&(_, token, _, _)| token);
    let order: Vec<Uuid> = served.iter().map(|&(owner, _, _, _)| owner).collect();
    assert_eq!(order, live, "the live waiters in the order they joined");
    let handed: Vec<Option<Uuid>> = served.iter().map(|&(_, _, next, _)| next).collect();
    let expected: Vec<Option<Uuid>> = live[1..].iter().copied().map(Some).chain([None]).collect();
    assert_eq!(handed, expected, "each release hands to the next live waiter");
    // A few polls per hand-over; a grant to a dead waiter would have cost
    // a whole lease.
    println!("the line emptied {took:?} after the holder's release");
    let left: i64 = admin
        .query_one("SELECT count(*) FROM sheaf.mutex_waiters WHERE key = $1", &[&key])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "the dead waiters' places were deleted");
    assert_eq!(witness.lock().unwrap().entries, live.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grant_handed_to_a_waiter_that_died_passes_on_within_a_third_of_its_lease() {
    let shard = fleet().shards().nth(2).unwrap();
    let admin = connect(shard).await;
    let key = unique("deadgrant");
    let witness = Arc::new(Mutex::new(Witness::default()));
    let holder = Uuid::new_v4();
    let (granted, token, _) = acquire(&admin, &key, holder).await.unwrap();
    assert!(granted, "a free key is granted at once");
    let holder_token = token.unwrap();
    // The waiter that dies asks for a 6 s lease: 2 s to pick a grant up.
    let doomed_db = connect(shard).await;
    let doomed = Uuid::new_v4();
    let (granted, _, position) = acquire_for(&doomed_db, &key, doomed, "6 seconds").await.unwrap();
    assert_eq!((granted, position), (false, 1));
    let (_, pids, mut turns) = join_line(shard, &key, 1, 1, &witness).await;
    kill(&admin, backend_pid(&doomed_db).await).await;
    // Its place has not lapsed yet: the release hands it the lock.
    let released = Instant::now();
    let next = release(&admin, &key, holder, holder_token).await.unwrap();
    assert_eq!(next, Some(doomed), "the release hands to the first waiter");
    let turn = tokio::time::timeout(Duration::from_secs(30), turns.remove(0))
        .await
        .expect("the live waiter was served within 30 s")
        .unwrap()
        .unwrap_or_else(|e| panic!("the live waiter (backend {}): {e}", pids[0]));
    let waited = released.elapsed();
    println!("the live waiter got the lock {waited:?} after the hand-over to the dead one");
    assert!(
        waited < Duration::from_secs(5),
        "the grant to the dead waiter held the line {waited:?}: its whole 6 s lease, not 2 s"
    );
    assert_eq!(turn.2, None, "nobody waits after the live waiter");
}

/// Grants each contender wins before the test ends.
const CYCLES: usize = 6;
const CONTENDERS: usize = 5;
/// Out of 100: how often a contender dies while it waits.
const DEATH_RATE: u64 = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_dying_at_random_never_get_the_lock_once_their_place_lapsed() {
    let shard = fleet().shards().nth(1).unwrap();
    let key = unique("deadchurn");
    let (_, seed) = Rng::from_time();
    println!("seed {seed}, key {key}");
    let witness = Arc::new(Mutex::new(Witness::default()));
    // Dead owners and when they were killed.
    let dead: Arc<Mutex<HashMap<Uuid, Instant>>> = Arc::default();
    // Hand-overs to a dead owner, and the longest time since its death.
    let late = Arc::new(Mutex::new(Vec::<Duration>::new()));
    let mut contenders = Vec::new();
    for c in 0..CONTENDERS {
        let (key, witness, dead, late) = (key.clone(), witness.clone(), dead.clone(), late.clone());
        let mut rng = Rng::new(seed ^ (c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        contenders.push(tokio::spawn(async move {
            contend(shard, &key, &mut rng, &witness, &dead, &late).await
        }));
    }
    let started = Instant::now();
    let mut deaths = 0;
    for c in contenders {
        deaths += tokio::time::timeout(Duration::from_secs(120), c)
            .await
            .expect("the contenders finished within 120 s")
            .unwrap();
    }
    let late = late.lock().unwrap().clone();
    let (entries, overruns) = {
        let w = witness.lock().unwrap();
        (w.entries, w.overruns)
    };
    println!(
        "{entries} grants, {deaths} waiters killed, {} hand-overs to a dead waiter before its place lapsed \
         (the longest {:?} after its death), {overruns} leases overrun, {:?}",
        late.len(),
        late.iter().max(),
        started.elapsed()
    );
    assert_eq!(entries, CONTENDERS * CYCLES, "every cycle got the lock");
    assert!(deaths > 0, "no waiter died (seed {seed})");
}

/// One contender: `CYCLES` grants, dying now and then while it waits (a new
/// owner on a new connection comes back). Returns how many times it died.
async fn contend(
    shard: &Shard,
    key: &str,
    rng: &mut Rng,
    witness: &Mutex<Witness>,
    dead: &Mutex<HashMap<Uuid, Instant>>,
    late: &Mutex<Vec<Duration>>,
) -> usize {
    let admin = connect(shard).await;
    let mut deaths = 0;
    let mut won = 0;
    while won < CYCLES {
        let db = connect(shard).await;
        let owner = Uuid::new_v4();
        let asked = Instant::now();
        let (granted, token, _) = acquire(&db, key, owner).await.unwrap();
        let turn = if granted {
            let token = token.unwrap();
            witness
                .lock()
                .unwrap()
                .enter(owner, token, asked + LEASE_LEN - GRANT_SLACK);
            tokio::time::sleep(Duration::from_millis(100 + rng.below(100))).await;
            witness.lock().unwrap().exit(owner);
            let sent = Instant::now();
            (owner, token, release(&db, key, owner, token).await.unwrap(), sent)
        } else if rng.below(100) < DEATH_RATE {
            // Dies in line (after its one acquire), never to ask again.
            let pid = backend_pid(&db).await;
            dead.lock().unwrap().insert(owner, Instant::now());
            kill(&admin, pid).await;
            deaths += 1;
            continue;
        } else {
            let hold = Duration::from_millis(100 + rng.below(100));
            take_turn(&db, key, owner, hold, witness).await.unwrap()
        };
        won += 1;
        // A release that hands the lock to a dead waiter: only within its
        // lease of its death (its last acquire came before it, the
        // hand-over after the release was sent).
        let (_, _, next, sent) = turn;
        let died = next.and_then(|next| dead.lock().unwrap().get(&next).copied());
        if let (Some(next), Some(died)) = (next, died) {
            let since = sent.saturating_duration_since(died);
            assert!(
                since < PLACE_LEN + Duration::from_millis(50),
                "{} handed the lock to {next}, dead for {since:?}, past its place (a third of {LEASE})",
                turn.0
            );
            late.lock().unwrap().push(since);
        }
    }
    deaths
}
