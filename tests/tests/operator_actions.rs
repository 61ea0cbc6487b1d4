//! The operator's actions on the live test shards (issue 19): a running
//! task cancelled under a real worker loop (the handler is stopped, the
//! task ends, its slot passes on), progress shown while it runs, a snooze
//! that keeps its attempts, dead letters purged and redriven by queue
//! across three shards with the quota counters equal to a recount, and a
//! queue dropped only with force.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use sheaf_driver::{
    Client, ClientError, EnqueueOptions, ExecutionId, Placement, PoolOptions, ShardId, StartOptions,
    TaskContext, TaskDone, TaskFailure, TaskState, Worker, WorkerOptions,
};
use sheaf_tests::{cli_binary, cli_json, connect, fleet, fleet_spec, unique, until};

fn client() -> Arc<Client> {
    Arc::new(Client::new(fleet().clone(), PoolOptions::default()).expect("a client"))
}

fn shards() -> Vec<ShardId> {
    fleet().shards().map(|s| s.id).collect()
}

fn on(shard: ShardId) -> EnqueueOptions {
    EnqueueOptions::new().placement(Placement::Shard(shard))
}

type Handled = Pin<Box<dyn Future<Output = Result<TaskDone, TaskFailure>> + Send>>;

/// A handler that reports progress every 50 ms for 20 s (or, with `quiet`,
/// only sleeps, so a heartbeat is what tells it of a cancellation), and
/// sets `finished` if it ever gets to the end; a `{"quick": true}` task
/// completes at once.
fn long_handler(
    quiet: bool,
    finished: Arc<AtomicBool>,
) -> impl Fn(TaskContext) -> Handled + Send + Sync + 'static {
    move |ctx: TaskContext| {
        let finished = finished.clone();
        Box::pin(async move {
            if ctx.task().payload.to_value().unwrap_or_default()["quick"] == json!(true) {
                return Ok(TaskDone::Complete(None));
            }
            for step in 0..400 {
                if !quiet {
                    let _ = ctx.progress(json!({"step": step})).await;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            finished.store(true, Ordering::SeqCst);
            Ok(TaskDone::Complete(None))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_task_cancelled_stops_its_handler_and_frees_its_slot() {
    for quiet in [false, true] {
        let c = client();
        let shard = shards()[0];
        let queue = unique("ops-cancel");
        let key = unique("ops-cancel-key");
        assert!(c.admin().set_concurrency_limit(&key, Some(1)).await.is_complete());
        let finished = Arc::new(AtomicBool::new(false));
        let worker = Worker::start(
            c.clone(),
            WorkerOptions::new(unique("w"), [queue.clone()])
                .concurrency(2)
                .lease(Duration::from_secs(3)),
            long_handler(quiet, finished.clone()),
        )
        .expect("a worker");
        let long = c
            .enqueue(&queue, json!({}), on(shard).concurrency_key(&key))
            .await
            .expect("enqueue");
        let next = c
            .enqueue(&queue, json!({"quick": true}), on(shard).concurrency_key(&key))
            .await
            .expect("enqueue");
        until("the long task to run", Duration::from_secs(20), async || {
            c.get_task(long.task_id)
                .await
                .is_ok_and(|t| t.state == "running" && (quiet || t.progress.is_some()))
        })
        .await;
        if !quiet {
            let listed = c
                .admin()
                .list_tasks(&queue, Some(TaskState::Running), None, 10)
                .await
                .expect("a page");
            assert!(
                listed.items[0]
                    .progress
                    .as_ref()
                    .is_some_and(|p| p["step"].is_number())
            );
        }
        assert_eq!(c.get_task(next.task_id).await.expect("waiting").state, "waiting");
        assert!(
            c.cancel_task(long.task_id, Some("ops: not needed"))
                .await
                .expect("cancel")
        );
        assert!(
            !c.cancel_task(long.task_id, None).await.expect("again"),
            "cancelled once"
        );
        until("the handler to be stopped", Duration::from_secs(20), async || {
            worker.stats().cancelled == 1
        })
        .await;
        until(
            "the next task of the key to run",
            Duration::from_secs(20),
            async || worker.stats().completed == 1,
        )
        .await;
        match c.get_task(long.task_id).await {
            Err(ClientError::UnknownTask { message, .. }) => {
                assert!(message.contains("cancelled"), "{message}")
            }
            other => panic!("the cancelled task is gone: {other:?}"),
        }
        assert!(!finished.load(Ordering::SeqCst), "the handler never completed");
        let stats = worker.stats();
        assert_eq!((stats.lost, stats.failed), (0, 0), "quiet = {quiet}");
        worker.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snooze_keeps_its_attempts() {
    let c = client();
    let queue = unique("ops-snooze");
    let shard = shards()[1];
    let task = c
        .enqueue(&queue, json!({}), on(shard).max_attempts(2))
        .await
        .expect("enqueue");
    for _ in 0..3 {
        let claimed = c
            .claim(shard, &queue, "ops", 1, Duration::from_secs(30))
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 1, "it runs again at once, its attempts unspent");
        c.snooze(task.task_id, claimed[0].token, Duration::ZERO)
            .await
            .expect("snooze");
    }
    let info = c.get_task(task.task_id).await.expect("get_task");
    assert_eq!((info.attempts, info.max_attempts), (0, 2));
}

/// Dead letters of `queue` on every shard: `per_shard` each, dead-lettered
/// by a claim and a failure.
async fn dead_letters(c: &Client, queue: &str, per_shard: usize, opts: impl Fn() -> EnqueueOptions) {
    for shard in shards() {
        for i in 0..per_shard {
            c.enqueue(
                queue,
                json!({"i": i}),
                opts().placement(Placement::Shard(shard)).max_attempts(1),
            )
            .await
            .expect("enqueue");
        }
        let claimed = c
            .claim(shard, queue, "ops", per_shard as i32, Duration::from_secs(60))
            .await
            .expect("claim");
        assert_eq!(claimed.len(), per_shard);
        for t in claimed {
            c.fail(t.task_id, t.token, "ops: boom", None).await.expect("fail");
        }
    }
}

#[tokio::test]
async fn dead_letters_purge_and_redrive_by_queue_on_every_shard() {
    let c = client();
    let n = shards().len();
    let queue = unique("ops-redrive");
    dead_letters(&c, &queue, 3, EnqueueOptions::new).await;
    let young = c
        .admin()
        .purge_dead_letters(&queue, Duration::from_secs(3600))
        .await
        .expect("purge");
    assert!(young.is_complete());
    assert_eq!(young.total(), 0, "none is an hour old");
    let first = c
        .admin()
        .redrive_queue(&queue, Duration::ZERO, 2)
        .await
        .expect("redrive");
    assert_eq!(first.ok.len(), n);
    assert!(first.ok.values().all(|&m| m == 2), "{:?}", first.ok);
    let rest = c
        .admin()
        .redrive_queue(&queue, Duration::ZERO, 1000)
        .await
        .expect("redrive");
    assert_eq!(rest.total(), n as i64);
    assert_eq!(
        c.admin()
            .redrive_queue(&queue, Duration::ZERO, 1000)
            .await
            .expect("again")
            .total(),
        0
    );
    let queues = c.admin().list_queues().await;
    let mine = queues.queues.iter().find(|q| q.queue == queue).expect("listed");
    assert_eq!(mine.total.dead, 0);
    assert_eq!(mine.total.ready as usize, 3 * n, "every one back in line");

    let purge = unique("ops-purge");
    dead_letters(&c, &purge, 2, EnqueueOptions::new).await;
    let purged = c
        .admin()
        .purge_dead_letters(&purge, Duration::ZERO)
        .await
        .expect("purge");
    assert_eq!(purged.total(), 2 * n as i64);
    for shard in fleet().shards() {
        let db = connect(shard).await;
        let left: i64 = db
            .query_one(
                "SELECT count(*) FROM sheaf.dead_letters WHERE queue = $1",
                &[&purge],
            )
            .await
            .expect("count")
            .get(0);
        assert_eq!(left, 0);
    }
    assert!(matches!(
        c.admin()
            .purge_dead_letters(&purge, Duration::from_secs(200 * 365 * 86_400))
            .await,
        Err(ClientError::BadRequest(_))
    ));
}

#[tokio::test]
async fn purged_dead_letters_of_executions_give_the_tenant_its_quota_back() {
    let c = client();
    let workflow = unique("ops-quota");
    let tenant = unique("tenant");
    let policy =
        json!({"queue": unique("ops-quota-q"), "quota": {"key": "input.tenant", "max_dead_letters": 2}});
    assert!(
        c.admin()
            .declare_workflow(&workflow, policy.clone())
            .await
            .is_complete()
    );
    let queue = unique("ops-quota-acts");
    let shard = shards()[0];
    let pinned = || StartOptions::new().placement(Placement::Shard(shard));
    let started = c
        .start_workflow(&workflow, &unique("run"), json!({"tenant": tenant}), pinned())
        .await
        .expect("start");
    for _ in 0..2 {
        c.enqueue(
            &queue,
            json!({}),
            EnqueueOptions::new()
                .execution(started.execution_id)
                .max_attempts(1),
        )
        .await
        .expect("an activity");
    }
    for t in c
        .claim(shard, &queue, "ops", 2, Duration::from_secs(60))
        .await
        .expect("claim")
    {
        c.fail(t.task_id, t.token, "ops: boom", None).await.expect("fail");
    }
    let refused = c
        .start_workflow(&workflow, &unique("run"), json!({"tenant": tenant}), pinned())
        .await;
    assert!(
        matches!(refused, Err(ClientError::QuotaExceeded { .. })),
        "{refused:?}"
    );
    assert_eq!(
        c.admin()
            .purge_dead_letters(&queue, Duration::ZERO)
            .await
            .expect("purge")
            .total(),
        2
    );
    let usage = c.admin().quota_usage(&tenant).await;
    let recount = c.admin().quota_recompute(&tenant).await;
    assert_eq!(usage.total().dead_letters, 0);
    assert_eq!(recount.total(), usage.total(), "the counters equal a recount");
    c.start_workflow(&workflow, &unique("run"), json!({"tenant": tenant}), pinned())
        .await
        .expect("the tenant may start again");
}

#[tokio::test]
async fn a_queue_drops_only_with_force() {
    let c = client();
    let queue = unique("ops-drop");
    for shard in shards() {
        c.enqueue(&queue, json!({}), on(shard)).await.expect("enqueue");
    }
    let refused = c.admin().drop_queue(&queue, false).await;
    assert_eq!(refused.failed.len(), shards().len());
    assert!(
        refused
            .failed
            .values()
            .all(|e| matches!(e, ClientError::WrongState { .. }))
    );
    let dropped = c.admin().drop_queue(&queue, true).await;
    assert!(dropped.is_complete());
    assert_eq!(dropped.total(), shards().len() as i64);
    assert!(
        c.admin()
            .list_queues()
            .await
            .queues
            .iter()
            .all(|q| q.queue != queue)
    );
    let again = c.admin().drop_queue(&queue, true).await;
    assert!(
        again.ok.is_empty() && again.failed.is_empty(),
        "no shard has it now"
    );
}

#[tokio::test]
async fn the_cli_redrives_a_queues_dead_letters_across_shards_and_cancels_a_task() {
    let c = client();
    let n = shards().len();
    let queue = unique("ops-cli");
    dead_letters(&c, &queue, 3, EnqueueOptions::new).await;
    let (code, listed) = cli_json(&["dead-letters", "list", "--queue", &queue]);
    assert_eq!(code, Some(0));
    assert_eq!(listed["items"].as_array().map(Vec::len), Some(3 * n));
    let (code, report) = cli_json(&["dead-letters", "redrive", "--queue", &queue]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["redriven"], json!(3 * n));
    for shard in shards() {
        assert_eq!(report["per_shard"][shard.to_string()], json!(3), "{report}");
    }
    // Ground truth: no dead letter left, every task back in line.
    for shard in fleet().shards() {
        let db = connect(shard).await;
        let (dead, ready): (i64, i64) = {
            let row = db
                .query_one(
                    "SELECT (SELECT count(*) FROM sheaf.dead_letters WHERE queue = $1), \
                            (SELECT count(*) FROM sheaf.tasks WHERE queue = $1 AND state = 'ready')",
                    &[&queue],
                )
                .await
                .expect("counts");
            (row.get(0), row.get(1))
        };
        assert_eq!((dead, ready), (0, 3));
    }
    let (code, queues) = cli_json(&["queues"]);
    assert_eq!(code, Some(0));
    let mine = queues["queues"]
        .as_array()
        .and_then(|qs| qs.iter().find(|q| q["queue"] == json!(queue)))
        .cloned()
        .unwrap_or_else(|| panic!("{queue} in {queues}"));
    assert_eq!(mine["total"]["ready"], json!(3 * n), "{mine}");

    let task = c
        .enqueue(&queue, json!({}), on(shards()[0]))
        .await
        .expect("enqueue");
    let (code, out) = cli_json(&["tasks", "cancel", &task.task_id.to_string(), "--reason", "cli"]);
    assert_eq!((code, &out["cancelled"]), (Some(0), &json!(true)));
    let (code, _) = cli_json(&["tasks", "get", &task.task_id.to_string()]);
    assert_eq!(code, Some(4), "a cancelled task is not kept");
}

#[tokio::test]
async fn one_database_alone_is_a_fleet_of_one_shard() {
    let shard = fleet().shards().nth(1).expect("a second shard");
    let url = shard.url.clone();
    let only_url = |name: &str| (name == "SHEAF_DATABASE_URL").then(|| url.clone());
    let c = Client::from_vars(only_url, PoolOptions::default())
        .await
        .expect("a client on one database");
    let ids: Vec<ShardId> = c.topology().shards().map(|s| s.id).collect();
    assert_eq!(ids, vec![shard.id], "the id it was initialized with");
    let queue = unique("ops-single");
    let task = c
        .enqueue(&queue, json!({"n": 1}), EnqueueOptions::new())
        .await
        .expect("enqueue");
    assert_eq!(task.task_id.shard(), Some(shard.id));
    let claimed = c
        .claim(shard.id, &queue, "ops", 1, Duration::from_secs(30))
        .await
        .expect("claim");
    c.complete(claimed[0].task_id, claimed[0].token, None)
        .await
        .expect("complete");

    let nothing = |_: &str| None;
    assert!(matches!(
        Client::from_vars(nothing, PoolOptions::default()).await,
        Err(sheaf_driver::EnvError::Unset)
    ));
    let bad = "postgres://nobody:secret@127.0.0.1:1/none".to_owned();
    let unreachable = move |name: &str| (name == "SHEAF_DATABASE_URL").then(|| bad.clone());
    let options = PoolOptions::default().connect_timeout(Duration::from_secs(1));
    match Client::from_vars(unreachable, options).await {
        Err(e @ sheaf_driver::EnvError::Database(_)) => {
            assert!(
                !e.to_string().contains("secret"),
                "never the connection string: {e}"
            )
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("an unreachable database made a client"),
    }

    let out = std::process::Command::new(cli_binary())
        .args(["--json", "queues"])
        .env("SHEAF_DATABASE_URL", &shard.url)
        .env_remove("SHEAF_SHARDS")
        .env_remove("SHEAF_TOPOLOGY_DIGEST")
        .output()
        .expect("the CLI runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let queues: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        queues["queues"]
            .as_array()
            .is_some_and(|qs| qs.iter().any(|q| q["queue"] == json!(queue))),
        "{queues}"
    );
}

#[tokio::test]
async fn the_cli_reads_and_drives_one_execution() {
    let c = client();
    let workflow = unique("ops-cli-wf");
    let started = c
        .start_workflow(&workflow, &unique("run"), json!({"n": 1}), StartOptions::new())
        .await
        .expect("start");
    let id = started.execution_id.to_string();
    let (code, got) = cli_json(&["executions", "get", &id]);
    assert_eq!(code, Some(0), "{got}");
    assert_eq!(
        (&got["state"], &got["input"]),
        (&json!("RUNNING"), &json!({"n": 1}))
    );
    for (verb, field) in [("pause", "paused"), ("resume", "resumed")] {
        let (code, out) = cli_json(&["executions", verb, &id]);
        assert_eq!((code, &out[field]), (Some(0), &json!(true)), "{verb}: {out}");
    }
    let (code, out) = cli_json(&[
        "executions",
        "signal",
        &id,
        "go",
        "--payload",
        r#"{"k": 1}"#,
        "--signal-id",
        "s1",
    ]);
    assert_eq!((code, &out["signalled"]), (Some(0), &json!(true)), "{out}");
    let (_, again) = cli_json(&["executions", "signal", &id, "go", "--signal-id", "s1"]);
    assert_eq!(
        again["signalled"],
        json!(true),
        "a retry is answered as delivered"
    );
    let (code, out) = cli_json(&["executions", "cancel", &id, "--reason", "cli"]);
    assert_eq!((code, &out["cancelled"]), (Some(0), &json!(true)), "{out}");
    let (code, history) = cli_json(&["executions", "history", &id]);
    assert_eq!(code, Some(0));
    let types: Vec<&str> = history["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["event_type"].as_str())
        .collect();
    assert_eq!(types.first(), Some(&"WorkflowStarted"), "{types:?}");
    assert!(
        types.contains(&"go") || types.iter().any(|t| t.contains("Signal")),
        "{types:?}"
    );
    let unknown = format!("{}", sheaf_driver::ExecutionId::mint(shards()[0]).expect("an id"));
    let (code, _) = cli_json(&["executions", "get", &unknown]);
    assert_eq!(code, Some(4));
    let (code, _) = cli_json(&["executions", "cancel", &unknown]);
    assert_eq!(code, Some(4), "an action on no execution: not found");
    let (code, _) = cli_json(&["list", "--filter", r#"{"no_such_test": 1}"#]);
    assert_eq!(code, Some(2), "a filter the shards refuse is bad input");
    let (code, _) = cli_json(&["list", "--page-size", "0"]);
    assert_eq!(code, Some(2), "a page size the driver refuses is bad input");
}

/// The retention policies every shard has now, restored when dropped
/// (tests share the fleet).
async fn set_retention_cli(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["retention", "set"];
    all.extend_from_slice(args);
    let (code, out) = cli_json(&all);
    assert_eq!(code, Some(0), "{out}");
    out
}

/// Runs of `workflow` on every shard: ended 45 and 40 days ago (the first
/// with a dead letter), 10 and 1 days ago, and one active since long ago.
async fn runs_of_every_age(
    c: &Client,
    workflow: &str,
    tenant: &str,
) -> (Vec<ExecutionId>, Vec<ExecutionId>, Vec<ExecutionId>) {
    let mut past = Vec::new();
    let mut inside = Vec::new();
    let mut active = Vec::new();
    for shard in fleet().shards() {
        let db = connect(shard).await;
        let pinned = || StartOptions::new().placement(Placement::Shard(shard.id));
        for (i, days) in [45, 40, 10, 1].into_iter().enumerate() {
            let run = c
                .start_workflow(workflow, &unique("run"), json!({"tenant": tenant}), pinned())
                .await
                .expect("start");
            if i == 0 {
                // A dead letter of an old run: its tenant's count goes with it.
                let queue = unique("ops-ret-acts");
                c.enqueue(
                    &queue,
                    json!({}),
                    EnqueueOptions::new().execution(run.execution_id).max_attempts(1),
                )
                .await
                .expect("an activity");
                for t in c
                    .claim(shard.id, &queue, "ops", 1, Duration::from_secs(60))
                    .await
                    .expect("claim")
                {
                    c.fail(t.task_id, t.token, "ops: boom", None).await.expect("fail");
                }
            }
            c.complete_execution(run.execution_id, json!({"ok": true}))
                .await
                .expect("complete");
            db.execute(
                "UPDATE sheaf.executions SET closed_at = now() - make_interval(days => $2) WHERE id = $1",
                &[&run.execution_id.as_uuid(), &days],
            )
            .await
            .expect("backdated");
            if days > 30 {
                past.push(run.execution_id)
            } else {
                inside.push(run.execution_id)
            }
        }
        let running = c
            .start_workflow(workflow, &unique("run"), json!({"tenant": tenant}), pinned())
            .await
            .expect("start");
        db.execute(
            "UPDATE sheaf.executions SET created_at = now() - interval '400 days' WHERE id = $1",
            &[&running.execution_id.as_uuid()],
        )
        .await
        .expect("backdated");
        active.push(running.execution_id);
    }
    (past, inside, active)
}

/// No run of `workflow` in `past` is left on any shard, and nothing hangs
/// off a deleted run (ground truth from the tables).
async fn nothing_past_its_window(workflow: &str, past: &[ExecutionId]) {
    for shard in fleet().shards() {
        let db = connect(shard).await;
        let left: Vec<uuid::Uuid> = db
            .query(
                "SELECT id FROM sheaf.executions WHERE workflow_name = $1",
                &[&workflow],
            )
            .await
            .expect("executions")
            .iter()
            .map(|r| r.get(0))
            .collect();
        for id in &left {
            assert!(
                !past.iter().any(|p| p.as_uuid() == *id),
                "a run past its window stayed"
            );
        }
        let orphans: i64 = db
            .query_one(
                "SELECT (SELECT count(*) FROM sheaf.events v WHERE NOT EXISTS \
                   (SELECT 1 FROM sheaf.executions e WHERE e.id = v.execution_id)) + \
                 (SELECT count(*) FROM sheaf.dead_letters d WHERE d.execution_id IS NOT NULL AND NOT EXISTS \
                   (SELECT 1 FROM sheaf.executions e WHERE e.id = d.execution_id))",
                &[],
            )
            .await
            .expect("orphans")
            .get(0);
        assert_eq!(orphans, 0, "nothing left hanging off a deleted run");
    }
}

#[tokio::test]
async fn retention_deletes_exactly_what_is_past_its_window_and_keeps_quota_exact() {
    let c = client();
    let workflow = unique("ops-ret");
    let tenant = unique("ret-tenant");
    let policy =
        json!({"queue": unique("ops-ret-q"), "quota": {"key": "input.tenant", "max_dead_letters": 100}});
    assert!(c.admin().declare_workflow(&workflow, policy).await.is_complete());
    let (past, inside, active) = runs_of_every_age(&c, &workflow, &tenant).await;
    set_retention_cli(&["--workflow", &format!("{workflow}=30days")]).await;
    let (code, shown) = cli_json(&["retention", "get"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        shown["per_shard"]["0"]["workflows"][&workflow]["executions"],
        json!("30days"),
        "{shown}"
    );
    for shard in shards() {
        loop {
            let report = c.admin().maintain(shard).await.expect("maintain");
            if report["retention"]["executions"] == json!(0) {
                break;
            }
        }
    }
    nothing_past_its_window(&workflow, &past).await;
    for id in inside.iter().chain(&active) {
        assert!(
            c.get_execution(*id).await.expect("get").is_some(),
            "{id} is inside its window or active"
        );
    }
    for id in &past {
        assert!(
            c.get_execution(*id).await.expect("get").is_none(),
            "{id} is past its window"
        );
    }
    let usage = c.admin().quota_usage(&tenant).await;
    let recount = c.admin().quota_recompute(&tenant).await;
    assert_eq!(usage.total(), recount.total(), "the counters equal a recount");
    assert_eq!(recount.total().dead_letters, 0);
    assert_eq!(recount.total().active_executions, shards().len() as i64);
    let out = set_retention_cli(&["--workflow", &format!("{workflow}=forever")]).await;
    assert_eq!(
        out["per_shard"]["0"]["workflows"][&workflow]["executions"],
        json!("forever"),
        "{out}"
    );
    let (code, _) = cli_json(&["retention", "set", "--executions", "10s"]);
    assert_eq!(code, Some(2), "a window under a minute is refused: bad input");
}

/// `GET /metrics` from `addr` over a real TCP connection: the body of a 200.
async fn scrape(addr: std::net::SocketAddr) -> String {
    let (head, body) = sheaf_tests::http_get(addr, "/metrics").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("content-type: text/plain"),
        "{head}"
    );
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_are_served_over_http_with_each_queues_counts() {
    let c = client();
    let shard = shards()[0];
    let queue = unique("ops-metrics");
    for _ in 0..3 {
        c.enqueue(&queue, json!({}), on(shard)).await.expect("enqueue");
    }
    let later = std::time::SystemTime::now() + Duration::from_secs(3600);
    c.enqueue(&queue, json!({}), on(shard).run_at(later))
        .await
        .expect("scheduled");
    let options = sheaf_driver::MetricsServerOptions::new().sample_every(Duration::from_secs(1));
    let server = sheaf_driver::MetricsServer::start(c.clone(), "127.0.0.1:0".parse().unwrap(), options)
        .await
        .expect("a metrics server");
    let body = scrape(server.local_addr()).await;
    for line in [
        format!(r#"sheaf_queue_tasks{{queue="{queue}",shard="{shard}",state="ready"}} 3"#),
        format!(r#"sheaf_queue_tasks{{queue="{queue}",shard="{shard}",state="scheduled"}} 1"#),
        format!(r#"sheaf_queue_tasks{{queue="{queue}",shard="{shard}",state="dead"}} 0"#),
        "# TYPE sheaf_queue_oldest_ready_seconds gauge".to_owned(),
        "# TYPE sheaf_shard_requests_total counter".to_owned(),
    ] {
        assert!(body.contains(&line), "missing {line:?} in\n{body}");
    }
    // A second scrape within the sample interval does not sample again.
    c.enqueue(&queue, json!({}), on(shard)).await.expect("enqueue");
    let again = scrape(server.local_addr()).await;
    assert!(again.contains(&format!(
        r#"sheaf_queue_tasks{{queue="{queue}",shard="{shard}",state="ready"}} 3"#
    )));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let later_body = scrape(server.local_addr()).await;
    assert!(later_body.contains(&format!(
        r#"sheaf_queue_tasks{{queue="{queue}",shard="{shard}",state="ready"}} 4"#
    )));
    server.shutdown().await;

    // A worker serves its own.
    let worker = Worker::start(
        c.clone(),
        WorkerOptions::new(unique("w"), [queue.clone()]).metrics_listen("127.0.0.1:0".parse().unwrap()),
        |_ctx: TaskContext| async { Ok(TaskDone::Complete(None)) },
    )
    .expect("a worker");
    until(
        "the ready tasks to be done",
        Duration::from_secs(20),
        async || worker.stats().completed == 4,
    )
    .await;
    let addr = worker.metrics_addr().expect("served");
    let body = scrape(addr).await;
    assert!(
        body.contains(&format!(
            r#"sheaf_tasks_total{{outcome="completed",queue="{queue}",shard="{shard}"}} 4"#
        )),
        "{body}"
    );
    worker.shutdown().await;

    the_cli_serves_metrics(&queue, shard).await;
}

/// `sheaf metrics serve` on any free port it prints, scraped.
async fn the_cli_serves_metrics(queue: &str, shard: ShardId) {
    let (mut cli, addr) = sheaf_tests::metrics_serve(fleet_spec(), &[]).await;
    let body = scrape(addr).await;
    assert!(
        body.contains(&format!(
            r#"sheaf_queue_tasks{{queue="{queue}",shard="{shard}",state="scheduled"}} 1"#
        )),
        "{body}"
    );
    cli.kill().await.expect("stopped");
}
