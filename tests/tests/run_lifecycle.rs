//! Continue-as-new, signal-with-start and execution timeouts under real
//! concurrency, on live shards: a chain continued by its own workflow tasks
//! (a worker) and by a caller while starts of the same workflow id race it
//! (every start attaches, none makes a second run); signal-with-starts
//! racing plain starts of fresh workflow ids (one run each, every signal in
//! its history); a run past its deadline ended `TIMED_OUT` by `maintain`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sheaf_driver::{
    Client, Coverage, ExecutionId, ExecutionState, Placement, PoolOptions, StartOptions, TaskContext,
    TaskDone, Worker, WorkerOptions,
};
use sheaf_tests::{connect, fleet, unique, until};

fn client() -> Arc<Client> {
    Arc::new(Client::new(fleet().clone(), PoolOptions::default()).expect("a client"))
}

/// The runs of (name, workflow id) on the shard of `db`, oldest first:
/// (id, state, the successor its end names, the predecessor its start names).
async fn chain(
    db: &tokio_postgres::Client,
    name: &str,
    workflow_id: &str,
) -> Vec<(uuid::Uuid, String, Option<String>, Option<String>)> {
    db.query(
        "SELECT e.id, e.state, \
                (SELECT payload->>'successor' FROM sheaf.events v \
                  WHERE v.execution_id = e.id AND v.event_type = 'WorkflowContinuedAsNew'), \
                (SELECT payload->>'continued_from' FROM sheaf.events v WHERE v.execution_id = e.id AND v.seq = 1) \
           FROM sheaf.executions e WHERE workflow_name = $1 AND workflow_id = $2 ORDER BY seq",
        &[&name, &workflow_id],
    )
    .await
    .expect("the chain")
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect()
}

/// Every run but the last ended `CONTINUED_AS_NEW` naming the next, which
/// names it back; the last is in `last`.
fn assert_linked(runs: &[(uuid::Uuid, String, Option<String>, Option<String>)], last: &str) {
    for pair in runs.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert_eq!(a.1, "CONTINUED_AS_NEW");
        assert_eq!(
            a.2.as_deref(),
            Some(b.0.to_string().as_str()),
            "{a:?} names its successor"
        );
        assert_eq!(
            b.3.as_deref(),
            Some(a.0.to_string().as_str()),
            "{b:?} names its predecessor"
        );
    }
    assert_eq!(runs.last().map(|r| r.1.as_str()), Some(last));
    assert_eq!(runs[0].3, None, "the first run continues nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chain_continued_while_starts_race_it_stays_one_run() {
    let c = client();
    let shard = fleet().shards().nth(1).expect("three shards");
    let name = unique("chain");
    let on = StartOptions::new().placement(Placement::Shard(shard.id));
    let first = c
        .start_workflow(&name, "one", json!({"n": 0}), on.clone())
        .await
        .expect("start");
    let rounds = 40;
    let continuer = {
        let c = c.clone();
        tokio::spawn(async move {
            let mut current = first.execution_id;
            for n in 1..=rounds {
                current = c
                    .continue_as_new(current, json!({ "n": n }))
                    .await
                    .expect("continue_as_new");
            }
            current
        })
    };
    let starters = (0..8).map(|_| {
        let (c, name, on) = (c.clone(), name.clone(), on.clone());
        tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..30 {
                let s = c
                    .start_workflow(&name, "one", json!({"n": -1}), on.clone())
                    .await
                    .expect("a racing start");
                assert!(!s.created, "a start made a second run beside the chain");
                seen.push(s.execution_id);
            }
            seen
        })
    });
    let seen: Vec<ExecutionId> = futures::future::join_all(starters)
        .await
        .into_iter()
        .flat_map(|r| r.expect("a starter"))
        .collect();
    let last = continuer.await.expect("the continuer");
    let db = connect(shard).await;
    let runs = chain(&db, &name, "one").await;
    assert_eq!(runs.len(), rounds + 1);
    assert_linked(&runs, "RUNNING");
    assert_eq!(runs.last().map(|r| r.0), Some(last.as_uuid()));
    let ids: Vec<uuid::Uuid> = runs.iter().map(|r| r.0).collect();
    assert!(
        seen.iter().all(|id| ids.contains(&id.as_uuid())),
        "every racing start attached to a run of the chain"
    );
    let e = c.get_execution(last).await.expect("read").expect("the last run");
    assert_eq!(e.state, ExecutionState::Running);
    assert_eq!(e.input.to_value().expect("json"), json!({ "n": rounds }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_continues_its_runs_as_new_until_done() {
    let c = client();
    let shard = fleet().shards().next().expect("a shard");
    let name = unique("chainw");
    let queue = unique("chainq");
    let on = StartOptions::new()
        .placement(Placement::Shard(shard.id))
        .queue(queue.clone());
    c.start_workflow(&name, "w", json!({"n": 0}), on.clone())
        .await
        .expect("start");
    let generations = 15;
    let options = WorkerOptions::new(unique("w"), [queue.clone()])
        .coverage(Coverage::Shards(vec![shard.id]))
        .concurrency(2);
    let worker = Worker::start(c.clone(), options, move |ctx: TaskContext| async move {
        let payload = ctx.task().payload.to_value().unwrap_or_default();
        let n = payload["input"]["n"].as_i64().unwrap_or(0);
        Ok(if n < generations {
            TaskDone::ContinueAsNew(json!({ "n": n + 1 }).into())
        } else {
            TaskDone::CompleteExecution(json!({ "generations": n }).into())
        })
    })
    .expect("the worker starts");
    let db = connect(shard).await;
    until("the chain completes", Duration::from_secs(60), async || {
        chain(&db, &name, "w")
            .await
            .last()
            .is_some_and(|r| r.1 == "COMPLETED")
    })
    .await;
    worker.shutdown().await;
    let runs = chain(&db, &name, "w").await;
    assert_eq!(runs.len() as i64, generations + 1);
    assert_linked(&runs, "COMPLETED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signal_with_start_racing_starts_makes_one_run_with_every_signal() {
    let c = client();
    let shard = fleet().shards().nth(2).expect("three shards");
    let name = unique("sws");
    let on = StartOptions::new().placement(Placement::Shard(shard.id));
    let db = connect(shard).await;
    for round in 0..10 {
        let workflow_id = format!("r{round}");
        let calls = (0..12).map(|n| {
            let (c, name, on, workflow_id) = (c.clone(), name.clone(), on.clone(), workflow_id.clone());
            tokio::spawn(async move {
                if n % 2 == 0 {
                    c.start_workflow(&name, &workflow_id, json!({"by": "start"}), on)
                        .await
                        .expect("start")
                } else {
                    c.signal_with_start(
                        &name,
                        &workflow_id,
                        json!({"by": "signal"}),
                        "poke",
                        json!({ "n": n }),
                        None,
                        on,
                    )
                    .await
                    .expect("signal_with_start")
                }
            })
        });
        let started: Vec<_> = futures::future::join_all(calls)
            .await
            .into_iter()
            .map(|r| r.expect("a caller"))
            .collect();
        let id = started[0].execution_id;
        assert!(
            started.iter().all(|s| s.execution_id == id),
            "one run per workflow id"
        );
        assert_eq!(started.iter().filter(|s| s.created).count(), 1, "created once");
        let (runs, signals): (i64, i64) = {
            let r = db
                .query_one(
                    "SELECT (SELECT count(*) FROM sheaf.executions WHERE workflow_name = $1 AND workflow_id = $2), \
                            (SELECT count(*) FROM sheaf.events WHERE execution_id = $3 AND event_type = 'SignalReceived')",
                    &[&name, &workflow_id, &id.as_uuid()],
                )
                .await
                .expect("counts");
            (r.get(0), r.get(1))
        };
        assert_eq!((runs, signals), (1, 6), "round {round}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn maintain_ends_a_run_past_its_deadline() {
    let c = client();
    let shard = fleet().shards().next().expect("a shard");
    let name = unique("deadline");
    let s = c
        .start_workflow(
            &name,
            "d",
            json!({}),
            StartOptions::new()
                .placement(Placement::Shard(shard.id))
                .execution_timeout(Duration::from_secs(1)),
        )
        .await
        .expect("start");
    let spare = c
        .start_workflow(
            &name,
            "spare",
            json!({}),
            StartOptions::new().placement(Placement::Shard(shard.id)),
        )
        .await
        .expect("start");
    until("the run times out", Duration::from_secs(20), async || {
        c.admin().maintain(shard.id).await.expect("maintain");
        c.get_execution(s.execution_id)
            .await
            .expect("read")
            .is_some_and(|e| e.state == ExecutionState::TimedOut)
    })
    .await;
    let spare = c
        .get_execution(spare.execution_id)
        .await
        .expect("read")
        .expect("the spare");
    assert_eq!(
        spare.state,
        ExecutionState::Running,
        "a run without a timeout runs on"
    );
    let page = c.history(s.execution_id, 0, 100).await.expect("history");
    assert!(page.events.iter().any(|e| e.event_type == "WorkflowTimedOut"));
}
