//! Health and alerts over HTTP, against two shards of its own (one is
//! stopped here): tasks in flight, superseded runs and an open snapshot's
//! age measured; `/health`
//! and `/ready` on `sheaf metrics serve` and on a Worker's
//! `metrics_listen`; every metric the alert rules
//! (`ops/prometheus/sheaf-rules.yml`) name in both live scrapes; and
//! `promtool test rules` fed with the series scraped before and after the
//! stop, so `SheafShardUnready` is shown firing after it and not before.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sheaf_driver::{
    Client, EnqueueOptions, Placement, PoolOptions, Relay, RelayOptions, StartOptions, TaskContext, TaskDone,
    Topology, Worker, WorkerOptions,
};
use sheaf_tests::{http_get, metrics_serve, repo_root, sid, unique, until};

fn shards(args: &[&str]) -> String {
    sheaf_tests::own_shards("alerts", 23600, args)
}

/// `GET path` from `addr`: the status code and body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let (head, body) = http_get(addr, path).await;
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{head}"));
    (code, body)
}

async fn scrape(addr: SocketAddr) -> String {
    let (code, body) = get(addr, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    body
}

/// The metric families the rules file names (a histogram's by its name).
fn rule_metrics() -> BTreeSet<String> {
    let rules = std::fs::read_to_string(rules_file()).expect("the rules file");
    let mut names = BTreeSet::new();
    for line in rules.lines().filter(|l| l.trim_start().starts_with("expr:")) {
        let mut rest = line;
        while let Some(at) = rest.find("sheaf_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            names.insert(name);
        }
    }
    assert!(names.len() >= 8, "the rules name their series: {names:?}");
    names
}

fn rules_file() -> PathBuf {
    repo_root().join("ops/prometheus/sheaf-rules.yml")
}

/// The families a scrape carries samples of.
fn families(scrape: &str) -> BTreeSet<String> {
    samples(scrape)
        .map(|(series, _)| series.split('{').next().unwrap_or_default().to_owned())
        .collect()
}

/// Each sample of a scrape: its series (name and labels) and value.
fn samples(scrape: &str) -> impl Iterator<Item = (&str, f64)> {
    scrape.lines().filter(|l| !l.starts_with('#')).filter_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        Some((series, value.parse().ok()?))
    })
}

/// A `promtool test rules` file: every series of the rules' families (the
/// loop timestamps aside: their value is the wall clock, not a test's)
/// holding its `before` value for 10 minutes, then its `after` value for
/// 20; `SheafShardUnready` expected on `expect_before` at 9m and on
/// `expect_after` at 29m.
fn promtool_test(before: &str, after: &str, expect_before: &[u32], expect_after: &[u32]) -> String {
    let wanted: BTreeSet<String> = rule_metrics()
        .into_iter()
        .filter(|m| m != "sheaf_loop_last_tick_timestamp_seconds")
        .collect();
    let pick = |scrape: &str| -> std::collections::BTreeMap<String, f64> {
        samples(scrape)
            .filter(|(series, _)| wanted.contains(series.split('{').next().unwrap_or_default()))
            .map(|(series, v)| (series.to_owned(), v))
            .collect()
    };
    let (before, after) = (pick(before), pick(after));
    let every: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    let mut series = String::new();
    for s in every {
        let phase = |values: &std::collections::BTreeMap<String, f64>, n: usize| {
            let v = values.get(s).map_or("_".to_owned(), |v| format!("{v}"));
            vec![v; n].join(" ")
        };
        series.push_str(&format!(
            "      - series: '{}'\n        values: '{} {}'\n",
            s.replace('\'', "''"),
            phase(&before, 10),
            phase(&after, 20)
        ));
    }
    let alerts = |shards: &[u32]| -> String {
        if shards.is_empty() {
            return " []\n".into();
        }
        shards
            .iter()
            .map(|s| {
                format!(
                    "\n          - exp_labels: {{severity: warning, shard: \"{s}\"}}\n            \
                     exp_annotations:\n              summary: \"Shard {s} is not ready\"\n              \
                     description: \"{}\"",
                    UNREADY_DESCRIPTION
                )
            })
            .collect::<String>()
            + "\n"
    };
    format!(
        "rule_files: ['{}']\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n{series}    \
         alert_rule_test:\n      - eval_time: 9m\n        alertname: SheafShardUnready\n        exp_alerts:{}      \
         - eval_time: 29m\n        alertname: SheafShardUnready\n        exp_alerts:{}",
        rules_file().display(),
        alerts(expect_before),
        alerts(expect_after)
    )
}

/// SheafShardUnready's description, as the rules file has it.
const UNREADY_DESCRIPTION: &str = "Something holds the shard back (unreachable, wrong identity or schema, no live \
     worker, stranded work, topology digest or configuration drift): GET /ready or `sheaf shard health` names what.";

/// Runs `promtool test rules` on `test`; whether it passed, and its output.
fn promtool(test: &str, name: &str) -> (bool, String) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("alerts");
    std::fs::create_dir_all(&dir).expect("the test's directory");
    let file = dir.join(name);
    std::fs::write(&file, test).expect("the promtool test");
    let promtool =
        std::env::var("SHEAF_PROMTOOL").unwrap_or_else(|_| "/opt/prometheus/usr/bin/promtool".into());
    let out = std::process::Command::new(&promtool)
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("{promtool} runs (scripts/bootstrap unpacks it): {e}"));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// Shard `n`'s entry in a `/ready` body.
fn shard_verdict(body: &serde_json::Value, n: u32) -> &serde_json::Value {
    body["shards"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["shard"] == json!(n)))
        .unwrap_or_else(|| panic!("shard {n} in {body}"))
}

// A scenario reads top to bottom as one story (set up, stop a shard,
// check); split into helpers it would scatter what it asserts.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_shard_turns_ready_to_503_and_fires_the_readiness_alert() {
    let spec = shards(&["up", "--count", "2", "--no-install"]);
    let topology = Topology::parse(&spec).expect("the shards");
    let pool = PoolOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .acquire_timeout(Duration::from_secs(2));
    let client = Arc::new(Client::new(topology.clone(), pool.clone()).expect("a client"));
    let queue = unique("alerts");
    for (n, payload) in [(0, "hold"), (1, "go")] {
        client
            .enqueue(
                &queue,
                json!(payload),
                EnqueueOptions::new().placement(Placement::Shard(sid(n))),
            )
            .await
            .expect("enqueue");
    }
    // The "hold" task's handler runs until the gate opens: in flight.
    let gate = Arc::new(tokio::sync::Notify::new());
    let held = gate.clone();
    let worker = Worker::start(
        client.clone(),
        WorkerOptions::new(unique("w"), [queue.clone()]).metrics_listen("127.0.0.1:0".parse().unwrap()),
        move |ctx: TaskContext| {
            let held = held.clone();
            async move {
                if ctx.task().payload.as_str() == r#""hold""# {
                    held.notified().await;
                }
                Ok(TaskDone::Complete(None))
            }
        },
    )
    .expect("a worker");
    let at_worker = worker.metrics_addr().expect("served");
    let metrics = client.metrics();
    until("one task done, one held", Duration::from_secs(30), async || {
        worker.stats().completed == 1 && metrics.tasks_in_flight(sid(0), &queue) == 1
    })
    .await;
    let in_flight = format!(r#"sheaf_tasks_in_flight{{queue="{queue}",shard="0"}}"#);
    assert!(scrape(at_worker).await.contains(&format!("{in_flight} 1")));
    gate.notify_one();
    until("the held task to be done", Duration::from_secs(30), async || {
        worker.stats().completed == 2
    })
    .await;
    assert_eq!(metrics.tasks_in_flight(sid(0), &queue), 0);

    // Declared on every shard now; started (on one) after the stop.
    let workflow = unique("alerts-latest");
    client
        .admin()
        .declare_workflow(
            &workflow,
            json!({"concurrency": {"key": "input.k", "limit": 1, "on_conflict": "cancel_running"}}),
        )
        .await
        .into_result()
        .expect("declared");
    let (mut cli, at_cli) = metrics_serve(&spec, &["--sample-every", "1s"]).await;

    // A standalone relay's loop ticks too.
    let relay_client = Arc::new(Client::new(topology, pool).expect("a client"));
    let relay = Relay::start(relay_client.clone(), vec![sid(0)], RelayOptions::new());
    until(
        "the standalone relay to sweep",
        Duration::from_secs(30),
        async || {
            relay_client
                .metrics_text()
                .contains(r#"sheaf_loop_last_tick_timestamp_seconds{loop="relay",shard="0"}"#)
        },
    )
    .await;
    relay.shutdown().await;

    for at in [at_worker, at_cli] {
        assert_eq!(get(at, "/health").await, (200, r#"{"status":"ok"}"#.into()));
        // The worker's registration is what makes each shard ready.
        until("every shard to be ready", Duration::from_secs(30), async || {
            get(at, "/ready").await.0 == 200
        })
        .await;
    }
    let before_cli = scrape(at_cli).await;
    let before_worker = scrape(at_worker).await;
    let wanted = rule_metrics();
    let loops = "sheaf_loop_last_tick_timestamp_seconds";
    for (what, scrape) in [
        ("the worker", &before_worker),
        ("sheaf metrics serve", &before_cli),
    ] {
        let have = families(scrape);
        // Only a process running loops has their ticks.
        for m in wanted.iter().filter(|m| what == "the worker" || *m != loops) {
            assert!(have.contains(m), "{what} does not export {m}:\n{scrape}");
        }
    }
    for lp in ["claim", "maintenance", "relay"] {
        assert!(
            before_worker.contains(&format!(r#"{loops}{{loop="{lp}",shard="1"}}"#)),
            "the {lp} loop ticks:\n{before_worker}"
        );
    }
    assert!(
        before_cli.contains(r#"sheaf_shard_ready{shard="1"} 1"#),
        "{before_cli}"
    );

    shards(&["stop-one", "1"]);
    for at in [at_worker, at_cli] {
        assert_eq!(get(at, "/health").await.0, 200, "liveness asks no shard");
        let (code, body) = get(at, "/ready").await;
        assert_eq!(code, 503, "{body}");
        assert!(!body.contains("postgres://"), "no connection string: {body}");
        let body: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(body["ready"], json!(false), "{body}");
        assert_eq!(shard_verdict(&body, 0)["ready"], json!(true), "{body}");
        let down = shard_verdict(&body, 1);
        assert_eq!(down["ready"], json!(false), "{body}");
        assert_eq!(down["reason_codes"], json!(["unreachable"]), "{body}");
    }
    let after_cli = scrape(at_cli).await;
    assert!(
        after_cli.contains(r#"sheaf_shard_ready{shard="1"} 0"#),
        "{after_cli}"
    );
    assert!(
        after_cli.contains(r#"sheaf_shard_ready{shard="0"} 1"#),
        "{after_cli}"
    );

    // The alert fires after the stop and not before ...
    let (passed, said) = promtool(
        &promtool_test(&before_cli, &after_cli, &[], &[1]),
        "unready.test.yml",
    );
    assert!(passed, "promtool test rules:\n{said}");
    // ... and promtool fails a test that expects otherwise.
    let (passed, said) = promtool(
        &promtool_test(&before_cli, &after_cli, &[1], &[1]),
        "unready-before.test.yml",
    );
    assert!(
        !passed && said.contains("SheafShardUnready"),
        "expecting the alert before the stop fails:\n{said}"
    );

    // A latest-wins start supersedes the run before it, counted. Last: the
    // cap it leaves on shard 0 alone reads as configuration drift, which
    // would hold the shard back.
    for id in ["first", "second"] {
        let on = StartOptions::new().placement(Placement::Shard(sid(0)));
        let started = client
            .start_workflow(&workflow, id, json!({"k": "x"}), on)
            .await
            .expect("a start");
        assert_eq!(started.superseded.len(), usize::from(id == "second"));
    }
    assert!(
        scrape(at_worker).await.contains(&format!(
            r#"sheaf_executions_superseded_total{{shard="0",workflow="{workflow}"}} 1"#
        )),
        "the superseded run is counted"
    );

    // A transaction holding a snapshot is the oldest one's age.
    let holder = sheaf_tests::connect(client.topology().get(sid(0)).expect("shard 0")).await;
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM sheaf.tasks")
        .await
        .expect("a snapshot held");
    let held_for = client.admin().oldest_snapshot(sid(0)).await.expect("its age");
    assert!(held_for > Duration::ZERO, "{held_for:?}");
    holder.batch_execute("COMMIT").await.expect("released");

    worker.shutdown().await;
    cli.kill().await.expect("stopped");
    shards(&["down"]);
}
