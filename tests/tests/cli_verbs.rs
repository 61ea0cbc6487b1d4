//! The command line's verbs for scripts (issue 37, item 6): `sheaf start`
//! with each placement flag, `sheaf enqueue`, and `sheaf executions
//! signal|cancel` by id and by business key, with their refusals, against
//! the suite's shards (no topology is published on them). The CLI runs as
//! a blocking child process, so each test's own `Client` reads run on a
//! multi-threaded runtime beside it.

use std::process::Command;

use serde_json::Value;
use sheaf_driver::{Client, ExecutionId, Placement, PoolOptions, ShardId, StartOptions, TaskId};
use sheaf_tests::{cli_binary, cli_json, fleet, fleet_spec, unique};

fn client() -> Client {
    Client::new(fleet().clone(), PoolOptions::default()).expect("a client")
}

fn shards() -> Vec<ShardId> {
    fleet().shards().map(|s| s.id).collect()
}

/// `sheaf --json ARGS` that must succeed: its answer.
fn ok(args: &[&str]) -> Value {
    let (code, out) = cli_json(args);
    assert_eq!(code, Some(0), "sheaf {args:?}: {out}");
    out
}

/// `sheaf --json ARGS` that must fail with `code`: its JSON error (the last
/// line of stderr).
fn refused(args: &[&str], code: i32) -> Value {
    let out = Command::new(cli_binary())
        .arg("--json")
        .args(args)
        .env("SHEAF_SHARDS", fleet_spec())
        .env_remove("SHEAF_TOPOLOGY_DIGEST")
        .env_remove("SHEAF_RESIDENCY")
        .output()
        .expect("the CLI runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "sheaf {args:?}: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    let error: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert_eq!(error["error"]["exit"], code, "{error}");
    error["error"].clone()
}

fn execution_id(answer: &Value) -> ExecutionId {
    answer["execution_id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("an execution id: {answer}"))
}

fn shard_of(answer: &Value) -> u64 {
    answer["shard"]
        .as_u64()
        .unwrap_or_else(|| panic!("a shard: {answer}"))
}

/// Each placement flag puts the run where the driver would, and the JSON
/// names the shard the run is read back from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_places_as_each_flag_says() {
    let client = client();
    let name = unique("verbs-start");
    let read_back = |answer: Value| {
        let client = &client;
        async move {
            let id = execution_id(&answer);
            let e = client
                .get_execution(id)
                .await
                .expect("a read")
                .expect("the run exists");
            assert_eq!(u64::from(e.shard.get()), shard_of(&answer), "{answer}");
            e
        }
    };

    // Automatic: by (name, workflow id), with its input.
    let answer = ok(&["start", &name, "auto", "--input", r#"{"n": 1}"#]);
    assert_eq!(answer["created"], true, "{answer}");
    let e = read_back(answer).await;
    assert_eq!(e.input.to_value().expect("JSON")["n"], 1);
    let again = ok(&["start", &name, "auto"]);
    assert_eq!(again["created"], false, "the key's active run: {again}");
    assert_eq!(execution_id(&again), e.execution_id);

    // --shard: every shard of the fleet, exactly.
    for shard in shards() {
        let wid = format!("pinned-{shard}");
        let answer = ok(&["start", &name, &wid, "--shard", &shard.to_string()]);
        assert_eq!(shard_of(&answer), u64::from(shard.get()), "{answer}");
        read_back(answer).await;
    }

    // --routing-key: where the driver puts another start with that key.
    let key = unique("verbs-route");
    let answer = ok(&["start", &name, "routed", "--routing-key", &key]);
    let mine = read_back(answer).await;
    let theirs = client
        .start_workflow(
            &name,
            "routed-by-driver",
            Value::Null,
            StartOptions::new().placement(Placement::RoutingKey(key)),
        )
        .await
        .expect("a start");
    assert_eq!(mine.shard, theirs.shard);

    // --tenant: where the driver puts another start of the tenant.
    let tenant = unique("verbs-tenant");
    let answer = ok(&[
        "start", &name, "tenanted", "--tenant", &tenant, "--queue", "verbs-q",
    ]);
    let mine = read_back(answer).await;
    let theirs = client
        .start_workflow(
            &name,
            "tenanted-by-driver",
            Value::Null,
            StartOptions::new().tenant(tenant),
        )
        .await
        .expect("a start");
    assert_eq!(mine.shard, theirs.shard);

    // --residency-key: the shard the environment's residency map names.
    let last = *shards().last().expect("a shard");
    let out = Command::new(cli_binary())
        .args([
            "--json",
            "start",
            &name,
            "resident",
            "--residency-key",
            "verbs-eu",
        ])
        .env("SHEAF_SHARDS", fleet_spec())
        .env("SHEAF_RESIDENCY", format!("verbs-eu={last}"))
        .env_remove("SHEAF_TOPOLOGY_DIGEST")
        .output()
        .expect("the CLI runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(shard_of(&answer), u64::from(last.get()), "{answer}");
    read_back(answer).await;
}

/// Input that is not JSON, a file that cannot be read, a shard or residency
/// key the topology lacks, two placements: exit 2, naming what is wrong.
#[test]
fn start_and_enqueue_refuse_bad_input() {
    let name = unique("verbs-bad");
    let e = refused(&["start", &name, "x", "--input", "{not json"], 2);
    assert!(
        e["message"].as_str().unwrap_or_default().contains("--input"),
        "{e}"
    );
    let e = refused(&["start", &name, "x", "--input-file", "/no/such/file"], 2);
    assert!(
        e["message"].as_str().unwrap_or_default().contains("--input-file"),
        "{e}"
    );
    let e = refused(&["enqueue", &name, "--payload", "[1,"], 2);
    assert!(
        e["message"].as_str().unwrap_or_default().contains("--payload"),
        "{e}"
    );
    let e = refused(&["start", &name, "x", "--shard", "999"], 2);
    assert!(e["message"].as_str().unwrap_or_default().contains("999"), "{e}");
    refused(&["enqueue", &name, "--shard", "999"], 2);
    refused(&["start", &name, "x", "--residency-key", "nowhere"], 2);
    refused(&["start", &name, "x", "--shard", "0", "--routing-key", "k"], 2);
    refused(&["start", &name, "x", "--run-at", "tomorrow"], 2);
    refused(&["enqueue", &name, "--rate-key", "k"], 2);
    // Nothing was started by any of them.
    refused(&["find", &name, "x"], 4);
}

/// An enqueued task is where the JSON says, with its payload and options;
/// an idempotency key gives the same task twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_answers_the_task_and_its_shard() {
    let client = client();
    let queue = unique("verbs-queue");
    for shard in shards() {
        let answer = ok(&[
            "enqueue",
            &queue,
            "--payload",
            r#"{"to": "a@example.com"}"#,
            "--shard",
            &shard.to_string(),
            "--priority",
            "-3",
            "--max-attempts",
            "4",
        ]);
        assert_eq!(shard_of(&answer), u64::from(shard.get()), "{answer}");
        let id: TaskId = answer["task_id"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("a task id");
        let task = client.get_task(id).await.expect("the task");
        assert_eq!(task.shard, shard);
        assert_eq!(task.queue, queue);
        assert_eq!((task.priority, task.max_attempts), (-3, 4));
    }
    let first = ok(&["enqueue", &queue, "--idempotency-key", "once"]);
    let second = ok(&["enqueue", &queue, "--idempotency-key", "once"]);
    assert_eq!(first["task_id"], second["task_id"], "{first} {second}");
}

/// Signal and cancel by id and by business key, one spelling: the same
/// run, its history shows both; an unknown key is 4, a key and an id 2.
#[test]
fn signal_and_cancel_by_key_and_by_id() {
    let name = unique("verbs-key");
    let started = ok(&["start", &name, "order-1"]);
    let id = started["execution_id"].as_str().expect("an id").to_owned();

    let by_key = ["--workflow", name.as_str(), "--workflow-id", "order-1"];
    let mut args = vec!["executions", "signal"];
    args.extend(by_key);
    args.extend(["approve", "--payload", r#"{"by": "key"}"#, "--signal-id", "s-key"]);
    let answer = ok(&args);
    assert_eq!(
        (answer["execution_id"].as_str(), &answer["signalled"]),
        (Some(id.as_str()), &Value::Bool(true))
    );
    ok(&[
        "executions",
        "signal",
        &id,
        "approve-by-id",
        "--payload",
        r#"{"by": "id"}"#,
    ]);
    let history = ok(&["executions", "history", &id]).to_string();
    for seen in ["\"approve\"", "\"s-key\"", "\"approve-by-id\""] {
        assert!(history.contains(seen), "{seen} in {history}");
    }

    let mut args = vec!["executions", "cancel"];
    args.extend(by_key);
    args.extend(["--reason", "by key"]);
    let answer = ok(&args);
    assert_eq!(answer["cancelled"], true, "{answer}");
    assert_eq!(ok(&["executions", "get", &id])["state"], "CANCELLED");
    // The key now names an ended run: nothing to do, by key as by id.
    let answer = ok(&args);
    assert_eq!(answer["cancelled"], false, "{answer}");
    assert_eq!(ok(&["executions", "cancel", &id])["cancelled"], false);

    let e = refused(
        &[
            "executions",
            "cancel",
            "--workflow",
            &name,
            "--workflow-id",
            "nope",
        ],
        4,
    );
    assert!(e["message"].as_str().unwrap_or_default().contains("nope"), "{e}");
    refused(
        &[
            "executions",
            "signal",
            "--workflow",
            &name,
            "--workflow-id",
            "nope",
            "go",
        ],
        4,
    );
    refused(
        &[
            "executions",
            "cancel",
            &id,
            "--workflow",
            &name,
            "--workflow-id",
            "order-1",
        ],
        2,
    );
    refused(&["executions", "cancel", "--workflow", &name], 2);
    refused(&["executions", "signal", "go"], 2);
}

/// A key with two live runs (a pinned duplicate on another shard) is
/// refused, naming both, and neither run is touched.
#[test]
fn a_key_with_two_live_runs_is_refused() {
    let name = unique("verbs-dup");
    let first = ok(&["start", &name, "twice"]);
    let other = shards()
        .into_iter()
        .find(|s| u64::from(s.get()) != shard_of(&first))
        .expect("another shard");
    let second = ok(&["start", &name, "twice", "--shard", &other.to_string()]);
    assert_eq!(second["created"], true, "a duplicate on another shard: {second}");
    let e = refused(
        &[
            "executions",
            "cancel",
            "--workflow",
            &name,
            "--workflow-id",
            "twice",
        ],
        1,
    );
    let message = e["message"].as_str().unwrap_or_default();
    assert!(message.contains("2 live runs"), "{e}");
    for run in [&first, &second] {
        let id = run["execution_id"].as_str().expect("an id");
        assert!(message.contains(id), "{id} in {e}");
        assert_eq!(ok(&["executions", "get", id])["state"], "RUNNING", "untouched");
    }
    refused(
        &[
            "executions",
            "signal",
            "--workflow",
            &name,
            "--workflow-id",
            "twice",
            "go",
        ],
        1,
    );
    // Each one by id still works.
    for run in [&first, &second] {
        let id = run["execution_id"].as_str().expect("an id");
        assert_eq!(ok(&["executions", "cancel", id])["cancelled"], true);
    }
}

/// The shard audits what the CLI does to an execution, with `--actor`:
/// pause, resume, signal (its name, never its payload) and cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execution_actions_are_audited_with_the_actor() {
    let name = unique("verbs-audit");
    let actor = unique("cli-operator");
    let started = ok(&["start", &name, "a"]);
    let (id, shard) = (execution_id(&started), shard_of(&started));
    let target = id.to_string();
    for action in [
        vec!["executions", "pause", &target],
        vec!["executions", "resume", &target],
        vec![
            "executions",
            "signal",
            &target,
            "go",
            "--payload",
            r#"{"secret": 1}"#,
        ],
        vec!["executions", "cancel", &target, "--reason", "audited"],
    ] {
        let mut args = vec!["--actor", actor.as_str()];
        args.extend(action);
        ok(&args);
    }
    let shard = shards()
        .into_iter()
        .find(|s| u64::from(s.get()) == shard)
        .expect("the run's shard");
    let mut logged: Vec<(String, String)> = client()
        .admin()
        .audit_log(shard, None, 200)
        .await
        .expect("the audit log")
        .into_iter()
        .filter(|e| e.actor == actor && e.target.as_deref() == Some(target.as_str()))
        .map(|e| (e.action, e.detail.map(|d| d.to_string()).unwrap_or_default()))
        .collect();
    logged.reverse();
    let actions: Vec<&str> = logged.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(
        actions,
        [
            "pause_execution",
            "resume_execution",
            "signal",
            "cancel_execution"
        ]
    );
    assert!(
        logged[2].1.contains("\"go\"") && !logged[2].1.contains("secret"),
        "{logged:?}"
    );
}
