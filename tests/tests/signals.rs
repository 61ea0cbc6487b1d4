//! Signals under real concurrency: many connections signalling one
//! suspended execution at once (one signal id among them), and signals
//! racing a cancel. Checks that a signal id is delivered exactly once, the
//! run wakes exactly once, and every signal reported delivered is in the
//! history before the end, none after.

use std::sync::Arc;

use serde_json::json;
use sheaf_driver::{
    Client, ClientError, ExecutionId, ExecutionState, Placement, PoolOptions, ShardId, StartOptions,
};
use sheaf_tests::{connect, fleet, unique};

fn client() -> Client {
    Client::new(fleet().clone(), PoolOptions::default()).expect("a client")
}

async fn count(db: &tokio_postgres::Client, id: ExecutionId, kind: &str) -> i64 {
    db.query_one(
        "SELECT count(*) FROM sheaf.events WHERE execution_id = $1 AND event_type = $2",
        &[&id.as_uuid(), &kind],
    )
    .await
    .expect("count")
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_signal_id_is_delivered_once_and_wakes_once_under_contention() {
    let c = client();
    let shard = fleet().shards().nth(1).expect("three shards");
    let s = c
        .start_workflow(
            &unique("sig"),
            "one",
            json!({}),
            StartOptions::new().placement(Placement::Shard(shard.id)),
        )
        .await
        .expect("start");
    c.suspend_execution(s.execution_id, None).await.expect("suspend");
    let senders = 16;
    let dbs: Vec<Arc<tokio_postgres::Client>> =
        futures::future::join_all((0..senders).map(|_| connect(shard)))
            .await
            .into_iter()
            .map(Arc::new)
            .collect();
    let id = s.execution_id.as_uuid();
    let barrier = Arc::new(tokio::sync::Barrier::new(senders));
    let sends = dbs.iter().enumerate().map(|(n, db)| {
        let (db, barrier) = (db.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            // Two each: the shared id, then one of its own without an id.
            let shared: bool = db
                .query_one(
                    "SELECT sheaf.signal($1, 'approve', $2, '{\"signal_id\": \"once\"}')",
                    &[&id, &json!({ "n": n })],
                )
                .await
                .expect("signal")
                .get(0);
            let own: bool = db
                .query_one("SELECT sheaf.signal($1, 'note', $2)", &[&id, &json!({ "n": n })])
                .await
                .expect("signal")
                .get(0);
            shared && own
        })
    });
    for r in futures::future::join_all(sends).await {
        assert!(r.expect("a sender"), "a signal to a live run reads as delivered");
    }
    let db = &dbs[0];
    let with_id: i64 = db
        .query_one(
            "SELECT count(*) FROM sheaf.events WHERE execution_id = $1 AND event_type = 'SignalReceived' \
             AND payload ->> 'signal_id' = 'once'",
            &[&id],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(with_id, 1, "the shared signal id delivered exactly once");
    assert_eq!(
        count(db, s.execution_id, "SignalReceived").await,
        1 + senders as i64
    );
    assert_eq!(count(db, s.execution_id, "WorkflowWoken").await, 1, "woken once");
    let e = c
        .get_execution(s.execution_id)
        .await
        .expect("get")
        .expect("found");
    assert_eq!(e.state, ExecutionState::Running);
    let workflow_tasks: i64 = db
        .query_one(
            "SELECT count(*) FROM sheaf.tasks WHERE execution_id = $1 AND kind = 'workflow'",
            &[&id],
        )
        .await
        .expect("tasks")
        .get(0);
    assert_eq!(workflow_tasks, 2, "the start's task and the one wake's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signals_racing_a_cancel_land_before_the_end_or_not_at_all() {
    let c = Arc::new(client());
    let shard = fleet().shards().next().expect("a shard");
    let s = c
        .start_workflow(
            &unique("sig"),
            "race",
            json!({}),
            StartOptions::new().placement(Placement::Shard(shard.id)),
        )
        .await
        .expect("start");
    let sends = (0..40).map(|n| {
        let c = c.clone();
        tokio::spawn(async move {
            c.signal(s.execution_id, "ping", json!({ "n": n }), Some(&format!("p-{n}")))
                .await
                .expect("a signal")
        })
    });
    let sends: Vec<_> = sends.collect();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    c.cancel_execution(s.execution_id, Some("race"))
        .await
        .expect("cancel");
    let mut delivered = 0;
    for r in futures::future::join_all(sends).await {
        delivered += i64::from(r.expect("a sender"));
    }
    let db = connect(shard).await;
    assert_eq!(
        count(&db, s.execution_id, "SignalReceived").await,
        delivered,
        "every signal reported delivered is in the history, no other"
    );
    let after: i64 = db
        .query_one(
            "SELECT count(*) FROM sheaf.events s, sheaf.events c WHERE s.execution_id = $1 AND c.execution_id = $1 \
             AND s.event_type = 'SignalReceived' AND c.event_type = 'WorkflowCancelled' AND s.seq > c.seq",
            &[&s.execution_id.as_uuid()],
        )
        .await
        .expect("order")
        .get(0);
    assert_eq!(after, 0, "no signal after the end");
    assert!(
        !c.signal(s.execution_id, "late", json!({}), None)
            .await
            .expect("signal"),
        "an ended run takes no signal"
    );

    // Refusals, typed.
    let unknown = ExecutionId::mint(ShardId::new(0).expect("shard 0")).expect("an id");
    assert!(matches!(
        c.signal(unknown, "x", json!({}), None).await,
        Err(ClientError::UnknownExecution { .. })
    ));
    assert!(matches!(
        c.signal(s.execution_id, "", json!({}), None).await,
        Err(ClientError::InvalidArgument { .. })
    ));
    eprintln!("{delivered} of 40 signals landed before the cancel");
}
