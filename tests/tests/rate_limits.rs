//! Rate limits and start throttles on live shards: 8 claimers drain a
//! limited queue no faster than its bucket; the admission times granted to
//! 8 concurrent enqueuers never exceed the bucket in any window (every
//! window of four lengths) and follow enqueue order; throttled starts from 8 connections are all created at
//! once and paced in the bucket; an override fanned out with one shard
//! stopped reports that shard, records `failed` in the audit log of the
//! others, and reverts at its end on each of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;
use sheaf_driver::{
    Client, ClientError, EnqueueOptions, Placement, PoolOptions, ShardId, StartOptions, Topology,
};
use sheaf_tests::{connect, fleet, unique};

fn client() -> Arc<Client> {
    Arc::new(Client::new(fleet().clone(), PoolOptions::default()).expect("a client"))
}

/// Grants (microseconds) never exceed `burst + window / interval` in any
/// window of the lengths tried.
fn assert_within_bucket(grants: &mut [i64], rate_per_sec: f64, burst: f64) {
    grants.sort_unstable();
    let interval = 1e6 / rate_per_sec;
    for (i, &start) in grants.iter().enumerate() {
        for window in [100_000i64, 500_000, 1_000_000, 5_000_000] {
            let n = grants[i..].iter().take_while(|&&g| g < start + window).count() as f64;
            assert!(
                n <= burst + window as f64 / interval + 1e-6,
                "{n} grants in {window} µs from {start}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_claimers_never_get_more_than_the_bucket_grants() {
    let c = client();
    let shard = fleet().shards().nth(1).expect("three shards");
    let (limit, queue) = (unique("rl"), unique("rlq"));
    let (rate, burst, tasks) = (50.0, 5.0, 400);
    let declared = c
        .admin()
        .declare_rate_limit(&limit, json!({"rate": rate, "period": "1s", "burst": burst}))
        .await;
    assert!(declared.is_complete());
    // From before the first enqueue: each task's admission time is fixed
    // at its enqueue (the first at once, then 1/rate apart), so the whole
    // run takes at least the bucket's 7.9 s however slowly the enqueues go
    // (measured from after them, a loaded machine's slow enqueues made
    // the claims look faster than the bucket).
    let began = Instant::now();
    for n in 0..tasks {
        c.enqueue(
            &queue,
            json!({ "n": n }),
            EnqueueOptions::new()
                .rate_limit(limit.clone())
                .placement(Placement::Shard(shard.id)),
        )
        .await
        .expect("enqueue");
    }
    let total = Arc::new(AtomicUsize::new(0));
    let claimers = (0..8).map(|w| {
        let (c, queue, total) = (c.clone(), queue.clone(), total.clone());
        tokio::spawn(async move {
            while began.elapsed() < Duration::from_secs(20) && total.load(Ordering::Relaxed) < tasks {
                let claimed = c
                    .claim(shard.id, &queue, &format!("rl-{w}"), 4, Duration::from_secs(30))
                    .await
                    .expect("claim");
                if claimed.is_empty() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                for t in claimed {
                    c.complete(t.task_id, t.token, None).await.expect("complete");
                    total.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    });
    for r in futures::future::join_all(claimers).await {
        r.expect("a claimer");
    }
    let claimed = total.load(Ordering::Relaxed);
    let took = began.elapsed();
    assert_eq!(claimed, tasks, "every task claimed once");
    // 5 at once, then 395 at 50 a second: 7.9 s, within the 30 s lookahead.
    assert!(
        took >= Duration::from_millis(7_500),
        "done in {took:?}: faster than the bucket"
    );
    assert!(
        took <= Duration::from_secs(15),
        "done in {took:?}: far slower than the bucket"
    );
    let db = connect(shard).await;
    let row = db
        .query_one("SELECT count(*) FROM sheaf.tasks WHERE queue = $1", &[&queue])
        .await
        .expect("left");
    assert_eq!(row.get::<_, i64>(0), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admission_times_never_exceed_the_bucket_under_concurrent_enqueues() {
    let c = client();
    let shard = fleet().shards().nth(2).expect("three shards");
    let (limit, queue) = (unique("rlc"), unique("rlcq"));
    c.admin()
        .declare_rate_limit(&limit, json!({"rate": 40, "period": "1s", "burst": 8}))
        .await
        .into_result()
        .expect("declared everywhere");
    let enqueuers = (0..8).map(|w| {
        let (c, limit, queue) = (c.clone(), limit.clone(), queue.clone());
        tokio::spawn(async move {
            for n in 0..50 {
                c.enqueue(
                    &queue,
                    json!({ "w": w, "n": n }),
                    EnqueueOptions::new()
                        .rate_limit(limit.clone())
                        .placement(Placement::Shard(shard.id)),
                )
                .await
                .expect("enqueue");
            }
        })
    });
    for r in futures::future::join_all(enqueuers).await {
        r.expect("an enqueuer");
    }
    let db = connect(shard).await;
    let rows = db
        .query(
            "SELECT (extract(epoch from run_at) * 1000000)::bigint, \
                    (extract(epoch from enqueued_at) * 1000000)::bigint \
             FROM sheaf.tasks WHERE queue = $1 AND run_at <> 'infinity' ORDER BY seq",
            &[&queue],
        )
        .await
        .expect("admission times");
    // 400 at 40 a second is 10 s of grants, all within the lookahead.
    assert_eq!(rows.len(), 400);
    let mut grants: Vec<i64> = rows.iter().map(|r| r.get::<_, i64>(0)).collect();
    // Units timed ahead follow enqueue order; those admitted at once carry
    // their transaction's start, and are claimed in enqueue order anyway.
    let ahead: Vec<i64> = rows
        .iter()
        .filter(|r| r.get::<_, i64>(0) > r.get::<_, i64>(1))
        .map(|r| r.get::<_, i64>(0))
        .collect();
    assert!(ahead.len() > 300, "most were timed ahead: {}", ahead.len());
    assert!(
        ahead.windows(2).all(|w| w[0] <= w[1]),
        "admission follows enqueue order in one bucket"
    );
    assert!(rows.iter().all(|r| r.get::<_, i64>(0) >= r.get::<_, i64>(1)));
    assert_within_bucket(&mut grants, 40.0, 8.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn throttled_starts_are_created_at_once_and_paced() {
    let c = client();
    let shard = fleet().shards().next().expect("a shard");
    let name = unique("throttled");
    c.admin()
        .declare_workflow(
            &name,
            json!({"queue": name, "throttle": {"rate": 20, "period": "1s", "burst": 4}}),
        )
        .await
        .into_result()
        .expect("declared");
    let starters = (0..8).map(|w| {
        let (c, name) = (c.clone(), name.clone());
        tokio::spawn(async move {
            for n in 0..10 {
                let s = c
                    .start_workflow(
                        &name,
                        &format!("{w}-{n}"),
                        json!({}),
                        StartOptions::new().placement(Placement::Shard(shard.id)),
                    )
                    .await
                    .expect("start");
                assert!(s.created, "an over-rate start still creates its execution");
            }
        })
    });
    for r in futures::future::join_all(starters).await {
        r.expect("a starter");
    }
    let db = connect(shard).await;
    let rows = db
        .query(
            "SELECT (extract(epoch from t.run_at) * 1000000)::bigint FROM sheaf.tasks t \
             JOIN sheaf.executions e ON e.id = t.execution_id \
             WHERE e.workflow_name = $1 AND t.kind = 'workflow'",
            &[&name],
        )
        .await
        .expect("first tasks");
    assert_eq!(rows.len(), 80);
    let mut grants: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_within_bucket(&mut grants, 20.0, 4.0);
    let spread = grants.last().copied().unwrap_or(0) - grants.first().copied().unwrap_or(0);
    assert!(
        spread >= 3_700_000,
        "80 starts at 20 a second after 4 at once: {spread} µs"
    );
}

fn own(args: &[&str]) -> String {
    sheaf_tests::own_shards("ratelimits", 24200, args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_override_with_a_shard_down_reports_it_and_reverts_at_its_end() {
    let topology = Topology::parse(&own(&["up", "--count", "3", "--no-install"])).expect("shards");
    let options = PoolOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .acquire_timeout(Duration::from_secs(2));
    let c = Client::new(topology.clone(), options).expect("a client");
    let admin = c.admin();
    let (limit, keyed) = (unique("ovr"), unique("keyed"));
    for (name, spec) in [
        (&limit, json!({"rate": 1, "period": "1s"})),
        (&keyed, json!({"rate": 1, "key": "payload.t"})),
    ] {
        admin
            .declare_rate_limit(name, spec)
            .await
            .into_result()
            .expect("declared everywhere");
    }
    let refused = admin
        .set_rate_override(
            &keyed,
            5.0,
            Duration::from_secs(1),
            SystemTime::now() + Duration::from_secs(60),
        )
        .await
        .expect_err("a keyed limit has no one bucket");
    assert!(matches!(refused, ClientError::WrongState { .. }), "{refused}");
    own(&["stop-one", "1"]);
    let ends = SystemTime::now() + Duration::from_secs(4);
    let override_until = |ends| admin.set_rate_override(&limit, 100.0, Duration::from_secs(1), ends);
    let report = override_until(ends).await.expect("two shards took it");
    let id = |n: u32| ShardId::new(n).expect("an id");
    assert_eq!(report.applied, [id(0), id(2)]);
    assert_eq!(report.shard_errors.keys().copied().collect::<Vec<_>>(), [id(1)]);
    for n in [0, 2] {
        let db = connect(topology.get(id(n)).expect("a shard")).await;
        let failed: i64 = db
            .query_one(
                "SELECT count(*) FROM sheaf.audit_log() WHERE action = 'set_rate_override' AND outcome = 'failed' \
                 AND target = $1",
                &[&limit],
            )
            .await
            .expect("audit")
            .get(0);
        assert_eq!(failed, 1, "shard {n} records the partial fan-out");
    }
    let live = async || {
        admin
            .rate_limits()
            .await
            .ok
            .into_iter()
            .filter(|(_, limits)| {
                limits
                    .iter()
                    .any(|l| l.name == limit && l.override_pace.is_some())
            })
            .count()
    };
    assert_eq!(live().await, 2);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(live().await, 0, "each shard ended it on its own clock");
    own(&["start-one", "1"]);
    let all_failed = {
        own(&["stop-one", "0"]);
        own(&["stop-one", "1"]);
        own(&["stop-one", "2"]);
        override_until(SystemTime::now() + Duration::from_secs(60)).await
    };
    assert!(all_failed.is_err(), "no shard took it: an error, not a report");
    own(&["down"]);
}
