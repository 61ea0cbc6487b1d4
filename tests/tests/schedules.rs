//! Schedules on live shards, swept by 4 connections at once: a fire time
//! fires exactly once however many sweep (its record is unique, and each
//! started fire has exactly one task); a New York schedule swept across the
//! November 2026 fall-back fires its fixed time once and its hourly times
//! in both passes; after downtime, each catch-up policy fires what it says.
//! Downtime and the DST day are simulated by moving a schedule's next fire
//! time into the past: the shards' clocks are real.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use sheaf_driver::{Client, ClientError, PoolOptions};
use sheaf_tests::{cli_json as cli, connect, fleet, unique};

fn client() -> Arc<Client> {
    Arc::new(Client::new(fleet().clone(), PoolOptions::default()).expect("a client"))
}

fn home() -> &'static sheaf_driver::Shard {
    let t = fleet();
    t.get(t.default_shard()).expect("the default shard")
}

/// `sweepers` connections calling `sheaf.maintain()` on the default shard
/// at once, `rounds` times each.
async fn sweep(sweepers: usize, rounds: usize) {
    let dbs: Vec<Arc<tokio_postgres::Client>> =
        futures::future::join_all((0..sweepers).map(|_| connect(home())))
            .await
            .into_iter()
            .map(Arc::new)
            .collect();
    let barrier = Arc::new(tokio::sync::Barrier::new(sweepers));
    let runs = dbs.iter().map(|db| {
        let (db, barrier) = (db.clone(), barrier.clone());
        tokio::spawn(async move {
            for _ in 0..rounds {
                barrier.wait().await;
                db.execute("SELECT sheaf.maintain()", &[])
                    .await
                    .expect("maintain");
            }
        })
    });
    for r in futures::future::join_all(runs).await {
        r.expect("a sweeper");
    }
}

/// Sweeps (4 at once) until every schedule of `names` has caught up (its
/// next fire time is in the future). A sweep skips schedules another
/// connection holds (other tests sweep this shard too), so one round is not
/// enough to know.
async fn sweep_until_caught_up(db: &tokio_postgres::Client, names: &[&String]) {
    let names: Vec<String> = names.iter().map(|n| (*n).clone()).collect();
    sheaf_tests::until("caught up", Duration::from_secs(30), async || {
        sweep(4, 1).await;
        let behind: i64 = db
            .query_one(
                "SELECT count(*) FROM sheaf.schedules WHERE name = ANY($1) AND next_fire_at <= now()",
                &[&names],
            )
            .await
            .expect("behind")
            .get(0);
        behind == 0
    })
    .await;
}

/// Moves schedule `name`'s next fire time to `at` (SQL text).
async fn due_at(db: &tokio_postgres::Client, name: &str, at: &str) {
    let n = db
        .execute(
            &format!("UPDATE sheaf.schedules SET next_fire_at = {at} WHERE name = $1"),
            &[&name],
        )
        .await
        .expect("move the next fire time");
    assert_eq!(n, 1);
}

/// Tasks on `queue` and started fire records of `name`.
async fn started(db: &tokio_postgres::Client, name: &str, queue: &str) -> (i64, i64) {
    let r = db
        .query_one(
            "SELECT (SELECT count(*) FROM sheaf.tasks WHERE queue = $2), \
                    (SELECT count(*) FROM sheaf.schedule_fires WHERE schedule = $1 AND outcome = 'started')",
            &[&name, &queue],
        )
        .await
        .expect("counts");
    (r.get(0), r.get(1))
}

/// The fire times of `name`, as RFC 3339 UTC, oldest first.
async fn fire_times(db: &tokio_postgres::Client, name: &str) -> Vec<String> {
    db.query(
        "SELECT to_char(fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') FROM sheaf.schedule_fires \
         WHERE schedule = $1 ORDER BY fire_at",
        &[&name],
    )
    .await
    .expect("fire times")
    .iter()
    .map(|r| r.get(0))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_sweepers_fire_each_time_once() {
    let c = client();
    let db = connect(home()).await;
    let (name, queue) = (unique("every-second"), unique("ticks"));
    c.admin()
        .create_schedule(
            &name,
            json!({"cron": "@every 1s", "task": {"queue": queue, "payload": {}}, "overlap": "allow"}),
        )
        .await
        .expect("create");
    let stop = Arc::new(AtomicBool::new(false));
    let sweeping = {
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                sweep(4, 5).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    sweeping.await.expect("the sweepers");
    let (tasks, fires) = started(&db, &name, &queue).await;
    assert!(fires >= 3, "fired {fires} times in 5 s");
    assert_eq!(tasks, fires, "one task per fire, none twice");
    let times = fire_times(&db, &name).await;
    let mut distinct = times.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), times.len());
    assert!(c.admin().delete_schedule(&name).await.expect("delete"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_york_schedule_swept_across_fall_back() {
    let c = client();
    let db = connect(home()).await;
    let (fixed, hourly) = (unique("ny-fixed"), unique("ny-hourly"));
    let (qf, qh) = (unique("nyf"), unique("nyh"));
    // 01:30 every day, and every hour at :30 on November 1st only.
    for (name, cron, queue) in [(&fixed, "30 1 * * *", &qf), (&hourly, "30 * 1 11 *", &qh)] {
        c.admin()
            .create_schedule(
                name,
                json!({"cron": cron, "time_zone": "America/New_York", "task": {"queue": queue},
                   "catch_up": "all", "catch_up_max": 1000, "overlap": "allow"}),
            )
            .await
            .expect("create");
        due_at(&db, name, "'2026-10-31T23:00:00Z'").await;
    }
    sweep_until_caught_up(&db, &[&fixed, &hourly]).await;
    let f = fire_times(&db, &fixed).await;
    assert_eq!(
        &f[..3],
        [
            "2026-11-01T05:30:00Z",
            "2026-11-02T06:30:00Z",
            "2026-11-03T06:30:00Z"
        ],
        "01:30 fires once on the fall-back day"
    );
    let h = fire_times(&db, &hourly).await;
    assert_eq!(h.len(), 25, "November 1st has 25 hours in New York: {h:?}");
    assert_eq!(&h[..2], ["2026-11-01T04:30:00Z", "2026-11-01T05:30:00Z"]);
    assert_eq!(h[2], "2026-11-01T06:30:00Z", "01:30 EST, the second pass");
    for (name, queue) in [(&fixed, &qf), (&hourly, &qh)] {
        let (tasks, fires) = started(&db, name, queue).await;
        assert_eq!(tasks, fires);
        c.admin().delete_schedule(name).await.expect("delete");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_downtime_each_catch_up_policy_fires_what_it_says() {
    let c = client();
    let db = connect(home()).await;
    let cases = [
        // (cron, catch_up, next fire moved to, fires expected)
        (
            "0 * * * *",
            json!({"catch_up": "all", "catch_up_max": 3}),
            "date_trunc('hour', now()) - interval '5 hours'",
            3,
        ),
        (
            "0 * * * *",
            json!({"catch_up": "once"}),
            "date_trunc('hour', now()) - interval '5 hours'",
            1,
        ),
        (
            "0 0 1 1 *",
            json!({"catch_up": "skip"}),
            "'2026-01-01T00:00:00Z'",
            0,
        ),
        (
            "0 0 1 1 *",
            json!({"catch_up": "once"}),
            "'2026-01-01T00:00:00Z'",
            1,
        ),
    ];
    let mut made = Vec::new();
    for (cron, policy, at, expected) in cases {
        let (name, queue) = (unique("downtime"), unique("dq"));
        let mut spec = json!({"cron": cron, "task": {"queue": queue}, "overlap": "allow"});
        for (k, v) in policy.as_object().expect("an object") {
            spec[k] = v.clone();
        }
        c.admin().create_schedule(&name, spec).await.expect("create");
        due_at(&db, &name, at).await;
        made.push((name, queue, expected, policy));
    }
    let names: Vec<&String> = made.iter().map(|m| &m.0).collect();
    sweep_until_caught_up(&db, &names).await;
    for (name, queue, expected, policy) in &made {
        let (tasks, fires) = started(&db, name, queue).await;
        assert_eq!((tasks, fires), (*expected, *expected), "{policy}");
        let next: bool = db
            .query_one(
                "SELECT next_fire_at > now() FROM sheaf.schedules WHERE name = $1",
                &[name],
            )
            .await
            .expect("next")
            .get(0);
        assert!(next, "{policy}: caught up");
        c.admin().delete_schedule(name).await.expect("delete");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_driver_manages_a_schedule_end_to_end() {
    let c = client();
    let (name, queue) = (unique("managed"), unique("mq"));
    c.admin()
        .create_schedule(
            &name,
            json!({"cron": "@daily", "task": {"queue": queue, "payload": {"n": 1}}}),
        )
        .await
        .expect("create");
    let taken = c
        .admin()
        .create_schedule(&name, json!({"cron": "@daily", "task": {"queue": queue}}))
        .await
        .expect_err("a taken name");
    assert!(matches!(taken, ClientError::WrongState { .. }), "{taken}");
    let bad = c
        .admin()
        .create_schedule(
            &unique("bad"),
            json!({"cron": "0 0 30 2 *", "task": {"queue": queue}}),
        )
        .await
        .expect_err("never fires");
    assert!(matches!(bad, ClientError::InvalidArgument { .. }), "{bad}");
    let fire = c.admin().trigger_schedule(&name).await.expect("trigger");
    assert_eq!(fire.outcome, "started");
    assert!(fire.task_id.is_some());
    assert!(c.admin().pause_schedule(&name).await.expect("pause"));
    c.admin()
        .update_schedule(&name, json!({"jitter": "5s"}))
        .await
        .expect("update");
    let listed = c.admin().list_schedules().await;
    assert!(listed.failed.is_empty());
    let s = listed
        .ok
        .values()
        .flatten()
        .find(|s| s.name == name)
        .expect("listed");
    assert!(s.paused);
    assert_eq!(s.spec.to_value().expect("json")["jitter"], "5s");
    assert_eq!(
        c.admin()
            .schedule_fires(&name, None, 10)
            .await
            .expect("fires")
            .len(),
        1
    );
    assert!(c.admin().resume_schedule(&name).await.expect("resume"));
    assert!(c.admin().delete_schedule(&name).await.expect("delete"));
    let gone = c.admin().pause_schedule(&name).await.expect_err("deleted");
    assert!(matches!(gone, ClientError::UnknownSchedule { .. }), "{gone}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cli_creates_lists_triggers_and_deletes() {
    let (name, queue) = (unique("cli"), unique("cq"));
    let (code, created) = cli(&[
        "schedules",
        "create",
        &name,
        "--cron",
        "0 6 * * 1-5",
        "--tz",
        "Europe/Berlin",
        "--queue",
        &queue,
        "--payload",
        r#"{"report": true}"#,
    ]);
    assert_eq!(code, Some(0), "{created}");
    assert!(created["next_fire_at"].is_string());
    let (code, listed) = cli(&["schedules", "list"]);
    assert_eq!(code, Some(0));
    let mine = listed["schedules"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["name"] == name.as_str()))
        .cloned()
        .expect("listed");
    assert_eq!(mine["spec"]["task"]["payload"]["report"], true);
    let (code, fire) = cli(&["schedules", "trigger", &name]);
    assert_eq!((code, fire["outcome"].as_str()), (Some(0), Some("started")));
    let (code, fires) = cli(&["schedules", "fires", &name]);
    assert_eq!(
        (code, fires["fires"].as_array().map(Vec::len)),
        (Some(0), Some(1))
    );
    let (code, _) = cli(&["schedules", "create", &unique("x"), "--cron", "0 6 * * *"]);
    assert_eq!(code, Some(2), "no action: the shard refuses it as bad input");
    let (code, _) = cli(&["schedules", "create", &unique("x"), "--queue", "q"]);
    assert_eq!(code, Some(2), "no timing: a usage error");
    assert_eq!(cli(&["schedules", "delete", &name]).0, Some(0));
    assert_eq!(cli(&["schedules", "pause", &name]).0, Some(4), "unknown now");
}
