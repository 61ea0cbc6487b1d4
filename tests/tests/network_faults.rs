//! Network faults for the driver: one shard of the real fleet is reached
//! through a TCP proxy (`sheaf_tests::proxy`) that goes half-open (forwards
//! nothing, closes nothing) or resets every connection. Every call about
//! work on that shard returns within its timeout with a typed error naming
//! that shard, its breaker opens, the other shards keep serving, a worker
//! keeps draining them and recovers the faulty shard's work once the proxy
//! heals, and an exhausted pool answers within its acquire timeout. A call
//! whose statement keeps meeting deadlocks is retried only within its one
//! query timeout. Every
//! connection carries the TCP keepalive time the options ask for (read
//! back from the kernel's `/proc/net/tcp`).
//!
//! Every call runs under a watchdog: a call that hangs fails the test
//! instead of hanging it. The long form (`SHEAF_NETFAULT_ROUNDS=N`) runs N
//! faults in a row under load; the CI form runs two (half-open, reset).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use sheaf_driver::protocol::Steps;
use sheaf_driver::{
    BreakerState, Client, ClientError, Coverage, EnqueueOptions, ExecutionId, Placement, PoolOptions,
    ShardError, ShardId, TaskContext, TaskDone, TaskFailure, TaskId, Topology, Worker, WorkerOptions,
};
use sheaf_tests::proxy::{Fault, Proxy};
use sheaf_tests::{Rng, fleet, unique};

const QUERY: Duration = Duration::from_millis(1500);
const CONNECT: Duration = Duration::from_millis(1000);
const ACQUIRE: Duration = Duration::from_millis(1000);
const COOLDOWN: Duration = Duration::from_millis(1500);
/// Scheduling slack on a loaded 2-core machine.
const MARGIN: Duration = Duration::from_millis(600);
/// The clients' TCP keepalive idle time (the kernel's default is 2 h).
const KEEPALIVE: Duration = Duration::from_secs(9);
/// Past this a call is hung: the watchdog fails the test.
const WATCHDOG: Duration = Duration::from_secs(10);

/// The client under test. `SHEAF_NETFAULT_SABOTAGE=query-timeout` gives it
/// an effectively infinite query timeout, to see the suite fail (the
/// watchdog) when the invariant it checks is broken.
fn options() -> PoolOptions {
    let sabotage = std::env::var("SHEAF_NETFAULT_SABOTAGE").ok();
    PoolOptions::default()
        .max_size(4)
        .acquire_timeout(ACQUIRE)
        .connect_timeout(CONNECT)
        .query_timeout(match sabotage.as_deref() {
            Some("query-timeout") => Duration::from_secs(86_400),
            _ => QUERY,
        })
        .breaker_threshold(3)
        .breaker_cooldown(COOLDOWN)
        .keepalive_idle(Some(KEEPALIVE))
}

/// The fleet, its last shard reached through a proxy.
struct Rig {
    client: Arc<Client>,
    proxy: Proxy,
    faulty: ShardId,
    healthy: Vec<ShardId>,
}

async fn rig(options: PoolOptions) -> Rig {
    let shards: Vec<_> = fleet().shards().cloned().collect();
    let last = shards.last().expect("a fleet").clone();
    let (proxy, through) = Proxy::in_front_of(&last.url).await.expect("the proxy starts");
    let mut b = Topology::builder();
    for s in &shards {
        let url = if s.id == last.id {
            through.clone()
        } else {
            s.url.clone()
        };
        b = b.shard(u32::from(s.id.get()), url);
    }
    let client = Arc::new(Client::new(b.build().expect("topology"), options).expect("client"));
    Rig {
        client,
        proxy,
        faulty: last.id,
        healthy: shards.iter().map(|s| s.id).filter(|id| *id != last.id).collect(),
    }
}

/// Runs `call` under the watchdog; returns its result and how long it took.
async fn timed<T>(what: &str, call: impl Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    match tokio::time::timeout(WATCHDOG, call).await {
        Ok(result) => (result, started.elapsed()),
        Err(_) => panic!("{what} hung: no answer after {WATCHDOG:?}"),
    }
}

/// A probe beside a busy worker on the faulty shard: as
/// `assert_shard_failure`, or `Exhausted`. The probe shares the shard's
/// pool (4 connections) with the worker, whose calls hang there until their
/// query timeout: when those hold all four, the probe's typed failure is
/// `Exhausted`, naming the shard, within its acquire timeout.
fn assert_probe_failure<T: std::fmt::Debug>(
    result: Result<T, ClientError>,
    took: Duration,
    faulty: ShardId,
    bound: Duration,
) {
    if let Err(
        e @ ClientError::Shard {
            error: ShardError::Exhausted { .. },
            ..
        },
    ) = &result
    {
        assert_eq!(e.shard(), Some(faulty), "Exhausted names the faulty shard: {e}");
        assert!(
            took <= bound,
            "get_execution took {took:?}, over its bound {bound:?}"
        );
        return;
    }
    assert_shard_failure("get_execution", result, took, faulty, bound);
}

/// A call on the faulty shard: a typed shard error naming it, in time.
fn assert_shard_failure<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, ClientError>,
    took: Duration,
    faulty: ShardId,
    bound: Duration,
) {
    assert!(took <= bound, "{what} took {took:?}, over its bound {bound:?}");
    match result {
        Err(ClientError::Shard { error, .. }) => {
            assert!(
                matches!(
                    error,
                    ShardError::Timeout { .. }
                        | ShardError::Unreachable { .. }
                        | ShardError::ShortCircuited { .. }
                ),
                "{what}: {error:?}"
            );
            assert_eq!(error.shard(), faulty, "{what} names the faulty shard: {error}");
            for other in fleet().shards().map(|s| s.id).filter(|id| *id != faulty) {
                assert!(
                    !error.to_string().contains(&format!("shard {other} ")),
                    "{what} names only its shard: {error}"
                );
            }
        }
        other => panic!("{what} on the faulty shard: expected a shard error, got {other:?}"),
    }
}

fn on(shard: ShardId) -> EnqueueOptions {
    EnqueueOptions::new().placement(Placement::Shard(shard))
}

/// Every kind of call about work on `shard`, once each.
async fn calls_on(
    client: &Client,
    shard: ShardId,
    queue: &str,
) -> Vec<(&'static str, Result<(), ClientError>, Duration)> {
    let execution = ExecutionId::mint(shard).expect("an id");
    let task = TaskId::mint(shard).expect("an id");
    let lease = Duration::from_secs(30);
    let mut out = Vec::new();
    let (r, t) = timed("claim", client.claim(shard, queue, "nf", 4, lease)).await;
    out.push(("claim", r.map(drop), t));
    let (r, t) = timed("enqueue", client.enqueue(queue, json!({}), on(shard))).await;
    out.push(("enqueue", r.map(drop), t));
    let (r, t) = timed("get_execution", client.get_execution(execution)).await;
    out.push(("get_execution", r.map(drop), t));
    let (r, t) = timed("complete", client.complete(task, 1, None)).await;
    out.push(("complete", r.map(drop), t));
    let (r, t) = timed(
        "heartbeat",
        client
            .protocol()
            .worker_heartbeat(shard, "nf", &[queue.to_owned()]),
    )
    .await;
    out.push(("worker_heartbeat", r.map(drop), t));
    let (r, t) = timed("maintain", client.admin().maintain(shard)).await;
    out.push(("maintain", r.map(drop), t));
    out
}

/// Calls on a healthy shard succeed, quickly, while another is faulty.
async fn healthy_serve(client: &Client, shards: &[ShardId], queue: &str) {
    for &shard in shards {
        let (r, took) = timed(
            "enqueue on a healthy shard",
            client.enqueue(queue, json!({}), on(shard)),
        )
        .await;
        r.unwrap_or_else(|e| panic!("shard {shard} stopped serving: {e}"));
        let (r, took2) = timed(
            "claim on a healthy shard",
            client.claim(shard, queue, "nf", 1, QUERY),
        )
        .await;
        r.unwrap_or_else(|e| panic!("shard {shard} stopped serving: {e}"));
        assert!(
            took + took2 < QUERY,
            "a healthy shard slowed down: {took:?} + {took2:?}"
        );
    }
}

/// Warm the faulty shard's pool: several connections open and idle, so the
/// fault meets recycled connections as well as new ones.
async fn warm(client: &Client, shard: ShardId, queue: &str) {
    let calls = (0..4).map(|_| client.enqueue(queue, json!({"warm": true}), on(shard)));
    for r in futures::future::join_all(calls).await {
        r.expect("the shard serves before the fault");
    }
}

/// Polls `f` until it holds, failing after `within`.
async fn until(what: &str, within: Duration, mut f: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !f().await {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}

/// One fault from start to heal: typed, bounded failures on the faulty
/// shard only, its breaker open, the others serving, then back.
async fn fault_scenario(fault: Fault, stale_schema: bool) {
    let r = rig(options()).await;
    let queue = unique("netfault");
    warm(&r.client, r.faulty, &queue).await;
    if stale_schema {
        // Past the driver's schema re-check (10 s): the next checkout reads
        // the schema version again, on a connection that no longer answers.
        tokio::time::sleep(Duration::from_millis(10_500)).await;
    }
    r.proxy.set(fault);
    let bound = QUERY + MARGIN;
    let mut worst = Duration::ZERO;
    for round in 0..3 {
        for (what, result, took) in calls_on(&r.client, r.faulty, &queue).await {
            eprintln!(
                "{fault:?} round {round}: {what} {took:?} {:?}",
                result.as_ref().err().map(kind)
            );
            worst = worst.max(took);
            assert_shard_failure(what, result, took, r.faulty, bound);
        }
        healthy_serve(&r.client, &r.healthy, &queue).await;
    }
    assert_eq!(
        r.client.admin().pools().breaker_state(r.faulty),
        Some(BreakerState::Open)
    );
    // Past the cooldown the breaker lets one probe through: on a pooled
    // connection (a round trip decides) and then on a new one (the TCP
    // connect succeeds, the startup packet goes unanswered): bounded too.
    for probe in 0..2 {
        tokio::time::sleep(COOLDOWN + Duration::from_millis(100)).await;
        for (what, result, took) in calls_on(&r.client, r.faulty, &queue).await {
            eprintln!(
                "{fault:?} probe {probe}: {what} {took:?} {:?}",
                result.as_ref().err().map(kind)
            );
            worst = worst.max(took);
            assert_shard_failure(what, result, took, r.faulty, bound);
        }
        assert_eq!(
            r.client.admin().pools().breaker_state(r.faulty),
            Some(BreakerState::Open)
        );
    }
    eprintln!("{fault:?}: worst call on the faulty shard {worst:?}");
    for &shard in &r.healthy {
        assert_eq!(
            r.client.admin().pools().breaker_state(shard),
            Some(BreakerState::Closed)
        );
    }
    r.proxy.heal();
    let back = until(
        "the faulty shard serves again",
        COOLDOWN * 4 + QUERY * 4,
        async || {
            let (res, _) = timed(
                "claim after heal",
                r.client.claim(r.faulty, &queue, "nf", 1, QUERY),
            )
            .await;
            res.is_ok()
        },
    )
    .await;
    eprintln!("{fault:?}: back {back:?} after the heal");
    assert_eq!(
        r.client.admin().pools().breaker_state(r.faulty),
        Some(BreakerState::Closed)
    );
}

fn kind(e: &ClientError) -> String {
    match e {
        ClientError::Shard { error, .. } => format!("{error:?}")
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_owned(),
        other => format!("{other:?}"),
    }
}

#[tokio::test]
async fn half_open_shard_fails_typed_in_time_and_spares_the_others() {
    fault_scenario(Fault::HalfOpen, false).await;
}

#[tokio::test]
async fn reset_shard_fails_typed_in_time_and_spares_the_others() {
    fault_scenario(Fault::Reset, false).await;
}

/// The schema version is read again on checkout every 10 s: that read on a
/// half-open connection is bounded too.
#[tokio::test]
async fn half_open_shard_with_a_stale_schema_reading_is_bounded() {
    fault_scenario(Fault::HalfOpen, true).await;
}

/// A caller that gives up on a call (a dropped future) while it is the
/// breaker's half-open probe does not leave the breaker waiting for that
/// probe forever: once the proxy heals the shard serves again.
#[tokio::test]
async fn an_abandoned_probe_does_not_wedge_the_breaker() {
    let r = rig(options()).await;
    let queue = unique("netfault-probe");
    warm(&r.client, r.faulty, &queue).await;
    r.proxy.set(Fault::HalfOpen);
    until("the breaker opens", Duration::from_secs(20), async || {
        let _ = timed("claim", r.client.claim(r.faulty, &queue, "nf", 1, QUERY)).await;
        r.client.admin().pools().breaker_state(r.faulty) == Some(BreakerState::Open)
    })
    .await;
    tokio::time::sleep(COOLDOWN + Duration::from_millis(100)).await;
    // The probe, given up on while it waits for the half-open shard.
    let probe = tokio::time::timeout(
        Duration::from_millis(200),
        r.client.claim(r.faulty, &queue, "nf", 1, QUERY),
    )
    .await;
    assert!(
        probe.is_err(),
        "the probe should still have been waiting: {probe:?}"
    );
    r.proxy.heal();
    until("the shard serves again", COOLDOWN * 4 + QUERY * 2, async || {
        let (res, _) = timed(
            "claim after heal",
            r.client.claim(r.faulty, &queue, "nf", 1, QUERY),
        )
        .await;
        res.is_ok()
    })
    .await;
}

/// Every connection held (by the caller, or hung on a half-open shard): a
/// call answers `Exhausted` within the acquire timeout, never hangs.
#[tokio::test]
async fn an_exhausted_pool_answers_within_its_acquire_timeout() {
    let r = rig(options().max_size(2)).await;
    let queue = unique("netfault-exhausted");
    // Held by the caller.
    let held = futures::future::join_all((0..2).map(|_| r.client.shard_connection(r.faulty))).await;
    let held: Vec<_> = held.into_iter().map(|c| c.expect("a connection")).collect();
    let (res, took) = timed(
        "claim on a full pool",
        r.client.claim(r.faulty, &queue, "nf", 1, QUERY),
    )
    .await;
    eprintln!("held by the caller: {took:?} {:?}", res.as_ref().err().map(kind));
    assert!(
        matches!(res, Err(ClientError::Shard { error: ShardError::Exhausted { shard, .. }, .. }) if shard == r.faulty),
        "{res:?}"
    );
    assert!(took <= ACQUIRE + MARGIN, "{took:?}");
    drop(held);
    // Hung on the half-open shard: two calls hold both connections.
    warm(&r.client, r.faulty, &queue).await;
    r.proxy.set(Fault::HalfOpen);
    let hung = (0..2).map(|_| r.client.claim(r.faulty, &queue, "nf", 1, QUERY));
    let third = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        timed("a third call", r.client.claim(r.faulty, &queue, "nf", 1, QUERY)).await
    };
    let (hung, (res, took)) = tokio::join!(futures::future::join_all(hung), third);
    eprintln!("held by hung calls: {took:?} {:?}", res.as_ref().err().map(kind));
    assert!(took <= ACQUIRE + MARGIN, "{took:?}");
    assert!(
        matches!(
            &res,
            Err(ClientError::Shard {
                error: ShardError::Exhausted { .. } | ShardError::Timeout { .. },
                ..
            })
        ),
        "{res:?}"
    );
    for h in hung {
        assert!(h.is_err(), "a call on the half-open shard succeeded");
    }
    healthy_serve(&r.client, &r.healthy, &queue).await;
}

async fn enqueue_n(client: &Client, queue: &str, shard: ShardId, n: usize) {
    for i in 0..n {
        client
            .enqueue(queue, json!({ "i": i }), on(shard))
            .await
            .unwrap_or_else(|e| panic!("enqueue on shard {shard}: {e}"));
    }
}

fn worker(r: &Rig, queue: &str, idle_poll: Duration) -> Worker {
    worker_running(r, queue, idle_poll, |_task: TaskContext| async {
        Ok(TaskDone::Complete(None))
    })
}

/// A worker over every shard (the faulty one last) running `handler`.
fn worker_running<H, F>(r: &Rig, queue: &str, idle_poll: Duration, handler: H) -> Worker
where
    H: Fn(TaskContext) -> F + Send + Sync + 'static,
    F: Future<Output = Result<TaskDone, TaskFailure>> + Send + 'static,
{
    let mut shards = r.healthy.clone();
    shards.push(r.faulty);
    let options = WorkerOptions::new(unique("nf-w"), [queue.to_owned()])
        .coverage(Coverage::Shards(shards))
        .concurrency(4)
        .batch(4)
        .lease(Duration::from_secs(5))
        .idle_poll(idle_poll)
        .maintain_every(Duration::from_secs(1))
        .drain_timeout(Duration::from_secs(1));
    Worker::start(r.client.clone(), options, handler).expect("the worker starts")
}

/// A worker over every shard drains the healthy ones while one is faulty,
/// claims and completes the faulty shard's tasks after it heals, and shuts
/// down in time with the shard half-open.
async fn worker_scenario(fault: Fault) {
    let r = rig(options()).await;
    let queue = unique("netfault-worker");
    let w = worker(&r, &queue, Duration::from_millis(500));
    enqueue_n(&r.client, &queue, r.faulty, 3).await;
    until(
        "the worker drains the shard before the fault",
        Duration::from_secs(10),
        async || w.stats().completed >= 3,
    )
    .await;
    r.proxy.set(fault);
    enqueue_n(&r.client, &queue, r.healthy[0], 10).await;
    enqueue_n(&r.client, &queue, r.healthy[1], 10).await;
    let drained = until(
        "the healthy shards drain meanwhile",
        Duration::from_secs(15),
        async || w.stats().completed >= 23,
    )
    .await;
    eprintln!("{fault:?}: healthy shards drained in {drained:?} during the fault");
    // Tasks waiting on the faulty shard (enqueued straight to it, not through the proxy).
    let direct = Client::new(fleet().clone(), options()).expect("client");
    enqueue_n(&direct, &queue, r.faulty, 5).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        w.stats().claimed.get(&r.faulty),
        Some(&3),
        "claimed through a faulty proxy?"
    );
    r.proxy.heal();
    let back = until(
        "the faulty shard's tasks after the heal",
        Duration::from_secs(20),
        async || w.stats().completed >= 28,
    )
    .await;
    eprintln!("{fault:?}: faulty shard's tasks done {back:?} after the heal");
    r.proxy.set(Fault::HalfOpen);
    enqueue_n(&r.client, &queue, r.healthy[0], 2).await;
    let bound = Duration::from_secs(1) + QUERY * 3 + MARGIN * 2;
    let (report, took) = timed("Worker::shutdown with the shard half-open", w.shutdown()).await;
    eprintln!("{fault:?}: shutdown took {took:?} ({report:?})");
    assert!(took <= bound, "shutdown took {took:?}, over {bound:?}");
}

#[tokio::test]
async fn a_worker_rides_out_a_half_open_shard() {
    worker_scenario(Fault::HalfOpen).await;
}

#[tokio::test]
async fn a_worker_rides_out_a_reset_shard() {
    worker_scenario(Fault::Reset).await;
}

/// A half-open shard holds up only its own claims: with query and connect
/// timeouts of 6 s and the breaker probing every 0.5 s, a worker whose
/// claims went shard after shard waited for each probe of the half-open
/// shard (a connection that never starts, a query that never returns)
/// before it came back to the healthy shards. Tasks enqueued on the
/// healthy shards one by one while the fault lasts are each done within
/// 2.5 s.
#[tokio::test]
async fn a_half_open_shard_does_not_slow_the_worker_on_the_others() {
    let r = rig(options()
        .query_timeout(Duration::from_secs(6))
        .connect_timeout(Duration::from_secs(6))
        .acquire_timeout(Duration::from_secs(6))
        .breaker_cooldown(Duration::from_millis(500)))
    .await;
    let queue = unique("netfault-pace");
    let done: Arc<std::sync::Mutex<Vec<(u128, Instant)>>> = Arc::default();
    let seen = done.clone();
    let w = worker_running(
        &r,
        &queue,
        Duration::from_millis(200),
        move |task: TaskContext| {
            let seen = seen.clone();
            async move {
                let n = task.task().payload.to_value().ok().and_then(|v| v["n"].as_u64());
                if let Some(n) = n {
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((u128::from(n), Instant::now()));
                }
                Ok(TaskDone::Complete(None))
            }
        },
    );
    r.proxy.set(Fault::HalfOpen);
    let mut enqueued = Vec::new();
    for n in 0..16u64 {
        let shard = r.healthy[n as usize % r.healthy.len()];
        enqueued.push(Instant::now());
        r.client
            .enqueue(&queue, json!({ "n": n }), on(shard))
            .await
            .unwrap_or_else(|e| panic!("enqueue on shard {shard}: {e}"));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    until(
        "every task on the healthy shards",
        Duration::from_secs(10),
        async || done.lock().unwrap_or_else(|p| p.into_inner()).len() >= 16,
    )
    .await;
    let slowest = done
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(n, at)| at.duration_since(enqueued[*n as usize]))
        .max()
        .unwrap_or_default();
    eprintln!("half-open shard: the slowest healthy task took {slowest:?}");
    r.proxy.heal();
    timed("Worker::shutdown", w.shutdown()).await;
    assert!(
        slowest <= Duration::from_millis(2500),
        "a task on a healthy shard waited {slowest:?} behind the half-open one"
    );
}

/// The worker's LISTEN connection goes half-open and stays dead (its peer
/// lost it): the worker notices and listens again, so a task enqueued
/// after the heal is picked up by notification, long before the idle poll.
#[tokio::test]
async fn the_listener_recovers_from_a_dead_connection() {
    let r = rig(options()).await;
    let queue = unique("netfault-listen");
    let w = worker(&r, &queue, Duration::from_secs(120));
    enqueue_n(&r.client, &queue, r.faulty, 1).await;
    until(
        "a notified claim before the fault",
        Duration::from_secs(10),
        async || w.stats().completed >= 1,
    )
    .await;
    r.proxy.set(Fault::HalfOpen);
    tokio::time::sleep(Duration::from_secs(4)).await;
    r.proxy.heal();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let direct = Client::new(fleet().clone(), options()).expect("client");
    enqueue_n(&direct, &queue, r.faulty, 1).await;
    let took = until(
        "a notified claim after the heal",
        Duration::from_secs(30),
        async || w.stats().completed >= 2,
    )
    .await;
    eprintln!("listener: the task after the heal was done in {took:?}");
    let (_, took) = timed("Worker::shutdown", w.shutdown()).await;
    assert!(
        took <= Duration::from_secs(1) + QUERY * 3 + MARGIN * 2,
        "{took:?}"
    );
}

/// A pool full of idle connections that went half-open: each checkout of
/// one proves nothing, so it must not close the breaker again; the breaker
/// opens after `breaker_threshold` timeouts, not after the pool has timed
/// out every idle connection once (it used to: each recycled checkout reset
/// the failure count).
#[tokio::test]
async fn idle_connections_gone_half_open_do_not_hold_the_breaker_closed() {
    let r = rig(options().max_size(12)).await;
    let queue = unique("netfault-idle");
    let calls = (0..12).map(|_| r.client.enqueue(&queue, json!({}), on(r.faulty)));
    for res in futures::future::join_all(calls).await {
        res.expect("the shard serves before the fault");
    }
    r.proxy.set(Fault::HalfOpen);
    let started = Instant::now();
    let mut calls = 0;
    while r.client.admin().pools().breaker_state(r.faulty) != Some(BreakerState::Open) {
        calls += 1;
        assert!(
            calls <= 4,
            "the breaker still closed after {} timeouts",
            calls - 1
        );
        let (res, took) = timed("claim", r.client.claim(r.faulty, &queue, "nf", 1, QUERY)).await;
        assert_shard_failure("claim", res, took, r.faulty, QUERY + MARGIN);
    }
    eprintln!(
        "idle half-open pool: breaker open after {calls} calls, {:?}",
        started.elapsed()
    );
}

/// The keepalive timers the kernel runs on the established TCP connections
/// to `port` (from `/proc/net/tcp` and `tcp6`: timer 2 is the keepalive
/// timer, its expiry in USER_HZ ticks, 100 a second on Linux), in seconds;
/// `None` for a connection with another timer running (a retransmission,
/// say) or none.
fn keepalive_timers(port: u16) -> Vec<Option<f64>> {
    const TICKS: f64 = 100.0;
    let mut timers = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state), Some(timer)) = (f.get(2), f.get(3), f.get(5)) else {
                continue;
            };
            let remote_port = remote
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            // 01: ESTABLISHED.
            if remote_port != Some(port) || *state != "01" {
                continue;
            }
            let (kind, when) = timer.split_once(':').unwrap_or(("", ""));
            timers.push(
                (kind == "02")
                    .then(|| u64::from_str_radix(when, 16).ok())
                    .flatten()
                    .map(|t| t as f64 / TICKS),
            );
        }
    }
    timers
}

/// Every connection the pool opens carries `keepalive_idle` as its TCP
/// keepalive time, so the kernel closes one whose peer is gone within
/// twice that; without it (`None`) the system's two hours apply. A
/// `keepalive_idle` under 3 s (the kernel counts whole seconds) is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_connections_carry_tcp_keepalives() {
    let queue = unique("netfault-keepalive");
    for (idle, within) in [(Some(KEEPALIVE), KEEPALIVE), (None, Duration::from_secs(7200))] {
        let r = rig(options().keepalive_idle(idle)).await;
        let (res, _) = timed("enqueue", r.client.enqueue(&queue, json!({}), on(r.faulty))).await;
        res.expect("the shard serves through the proxy");
        // The proxy's own connections to the shard are not the client's:
        // only those to the proxy's port are.
        let timers = keepalive_timers(r.proxy.addr().port());
        assert!(!timers.is_empty(), "no connection to the proxy's port seen");
        for timer in &timers {
            let secs = timer
                .unwrap_or_else(|| panic!("keepalive_idle {idle:?}: a connection without a keepalive timer"));
            assert!(
                secs <= within.as_secs_f64() && secs > within.as_secs_f64() / 2.0,
                "keepalive_idle {idle:?}: the timer is at {secs} s"
            );
        }
    }
    let refused = Client::new(
        fleet().clone(),
        options().keepalive_idle(Some(Duration::from_secs(2))),
    )
    .expect_err("a 2 s keepalive");
    assert!(
        refused.to_string().contains("keepalive_idle is 2s: at least 3s"),
        "{refused}"
    );
}

/// A statement that keeps meeting a transient conflict (here a trigger on
/// this test's queue, 400 ms and then 40P01, every attempt) is retried
/// within one query timeout for the whole call, not one per attempt: five
/// attempts of 400 ms each would take over 2 s.
#[tokio::test]
async fn retries_after_conflicts_share_one_query_timeout() {
    let queue = unique("netfault-conflicts");
    let shard = fleet().shards().next().expect("a fleet").clone();
    let admin = sheaf_tests::connect(&shard).await;
    let trigger = queue.replace('-', "_");
    admin
        .batch_execute(&format!(
            "CREATE FUNCTION public.{trigger}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               PERFORM pg_sleep(0.4); RAISE EXCEPTION 'a conflict, on purpose' USING ERRCODE = '40P01'; \
             END $$; \
             CREATE TRIGGER {trigger} BEFORE INSERT ON sheaf.tasks FOR EACH ROW \
               WHEN (NEW.queue = '{queue}') EXECUTE FUNCTION public.{trigger}()"
        ))
        .await
        .expect("the trigger");
    let budget = Duration::from_secs(1);
    let topology = Topology::builder()
        .shard(u32::from(shard.id.get()), shard.url.clone())
        .build()
        .expect("topology");
    let client = Client::new(topology, options().query_timeout(budget)).expect("client");
    let (res, took) = timed(
        "an enqueue that keeps conflicting",
        client.enqueue(&queue, json!({}), on(shard.id)),
    )
    .await;
    admin
        .batch_execute(&format!(
            "DROP TRIGGER {trigger} ON sheaf.tasks; DROP FUNCTION public.{trigger}()"
        ))
        .await
        .expect("dropping the trigger");
    eprintln!("conflicting enqueue: {took:?} {:?}", res.as_ref().err().map(kind));
    assert!(res.is_err(), "{res:?}");
    assert!(
        took <= budget + MARGIN,
        "took {took:?}, over its query timeout {budget:?}"
    );
}

/// The long form (docs/reliability/network-faults.md): `SHEAF_NETFAULT_ROUNDS` rounds
/// (2 by default, the CI form: half-open, then reset; later rounds draw
/// the kind at random) of a fault of
/// 2 to 8 s on one shard, then 1 to 3 s healthy, while a worker drains
/// every shard and tasks arrive on all of them, 50 a second (the faulty
/// shard's straight to it, not through the proxy, so every task enqueued is
/// known). All the while a probe calls the faulty shard every 250 ms: each
/// call fails typed within its bound, and after each heal the shard serves
/// again within a bound. At the end every task was handled and none is left
/// on any shard. Prints the worst call on the faulty shard, the times back
/// after the heals, and the tasks handled twice (a completion lost to a
/// reset: the lease runs out and the task runs again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rounds_of_faults_under_a_working_worker() {
    let rounds: u32 = std::env::var("SHEAF_NETFAULT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let r = Arc::new(rig(options()).await);
    let queue = unique("netfault-rounds");
    let (mut rng, seed) = Rng::from_time();
    eprintln!("rounds: {rounds}, seed {seed}");
    let handled: Handled = Arc::default();
    let w = worker_running(&r, &queue, Duration::from_millis(500), counting(handled.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let enqueued = Arc::new(AtomicU64::new(0));
    let enqueuer = tokio::spawn(enqueue_steadily(
        r.clone(),
        queue.clone(),
        stop.clone(),
        enqueued.clone(),
    ));
    let probe = || async {
        let id = ExecutionId::mint(r.faulty).expect("an id");
        timed("get_execution on the faulty shard", r.client.get_execution(id)).await
    };
    let bound = QUERY + MARGIN;
    let (mut worst, mut calls, mut backs) = (Duration::ZERO, 0u32, Vec::new());
    for round in 0..rounds {
        // Both kinds first (the CI form), then at random.
        let fault = match round {
            0 => Fault::HalfOpen,
            1 => Fault::Reset,
            _ if rng.below(2) == 0 => Fault::HalfOpen,
            _ => Fault::Reset,
        };
        let lasts = Duration::from_millis(2000 + rng.below(6000));
        // Pooled connections to the faulty shard exist before the fault, so
        // the probes meet it on recycled connections, not only on new ones.
        warm(&r.client, r.faulty, &queue).await;
        r.proxy.set(fault);
        let began = Instant::now();
        while began.elapsed() < lasts {
            let (res, took) = probe().await;
            assert_probe_failure(res, took, r.faulty, bound);
            worst = worst.max(took);
            calls += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        r.proxy.heal();
        let back = until(
            "the faulty shard serves again",
            COOLDOWN * 4 + QUERY * 4,
            async || matches!(probe().await, (Ok(None), _)),
        )
        .await;
        eprintln!("round {round}: {fault:?} for {lasts:?}, back {back:?} after the heal");
        backs.push(back);
        tokio::time::sleep(Duration::from_millis(1000 + rng.below(2000))).await;
    }
    stop.store(true, Ordering::Relaxed);
    enqueuer.await.expect("the enqueuer");
    let total = enqueued.load(Ordering::Relaxed);
    until("every task handled", Duration::from_secs(60), async || {
        handled.lock().unwrap_or_else(|p| p.into_inner()).len() as u64 >= total
    })
    .await;
    // The worker keeps running until the queue is empty: a completion lost to
    // a reset leaves its task running until the lease ends, and only a
    // running worker claims it again.
    let left = until("no task left on any shard", Duration::from_secs(30), async || {
        queue_is_empty(&queue).await
    })
    .await;
    let (report, _) = timed("Worker::shutdown", w.shutdown()).await;
    let handled = handled.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(
        (0..total).all(|n| handled.contains_key(&n)),
        "a task was never handled"
    );
    let twice = handled.values().filter(|&&c| c > 1).count();
    backs.sort();
    eprintln!(
        "rounds: {rounds}, {total} tasks, {twice} handled twice, {calls} probe calls on the faulty shard, \
         worst {worst:?} (bound {bound:?}), back after the heal: median {:?}, worst {:?}; queue empty {left:?} \
         after the last; worker {report:?}",
        backs[backs.len() / 2],
        backs.last().copied().unwrap_or_default()
    );
}

/// Enqueues a task every 20 ms, on each shard in turn, until `stop`; the
/// faulty shard's straight to it. `enqueued` counts them (payload `n`).
async fn enqueue_steadily(r: Arc<Rig>, queue: String, stop: Arc<AtomicBool>, enqueued: Arc<AtomicU64>) {
    let direct = Client::new(fleet().clone(), options()).expect("client");
    let mut shards = r.healthy.clone();
    shards.push(r.faulty);
    while !stop.load(Ordering::Relaxed) {
        let n = enqueued.load(Ordering::Relaxed);
        let shard = shards[n as usize % shards.len()];
        let through = if shard == r.faulty { &direct } else { &*r.client };
        let (res, _) = timed("enqueue", through.enqueue(&queue, json!({ "n": n }), on(shard))).await;
        res.unwrap_or_else(|e| panic!("enqueue on shard {shard}: {e}"));
        enqueued.store(n + 1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `queue` has no task left in any state on any shard (read
/// straight from the shards).
async fn queue_is_empty(queue: &str) -> bool {
    let direct = Client::new(fleet().clone(), options()).expect("client");
    let stats = direct.admin().queue_stats(queue).await;
    stats.is_complete()
        && stats
            .ok
            .values()
            .all(|s| s.ready + s.scheduled + s.running + s.waiting + s.dead == 0)
}

/// How many times the handler ran each task, by payload `n`.
type Handled = Arc<std::sync::Mutex<HashMap<u64, u32>>>;

/// A handler that counts its runs in `handled` and completes the task.
fn counting(
    handled: Handled,
) -> impl Fn(TaskContext) -> std::pin::Pin<Box<dyn Future<Output = Result<TaskDone, TaskFailure>> + Send>>
+ Send
+ Sync
+ 'static {
    move |task: TaskContext| {
        let handled = handled.clone();
        Box::pin(async move {
            let n = task.task().payload.to_value().ok().and_then(|v| v["n"].as_u64());
            if let Some(n) = n {
                *handled
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(n)
                    .or_default() += 1;
            }
            Ok(TaskDone::Complete(None))
        })
    }
}
