//! The typed execution surface against live shards: lifecycle calls and
//! what they return, history paged across pages and streamed, append_event,
//! find_execution across every shard, batches.

use std::time::{Duration, SystemTime};

use futures::TryStreamExt;
use serde_json::json;
use sheaf_driver::{
    Client, ClientError, EnqueueOptions, ExecutionId, ExecutionState, Json, Placement, PoolOptions,
    Resolution, StartOptions,
};
use sheaf_tests::{fleet, unique};

fn client() -> Client {
    Client::new(fleet().clone(), PoolOptions::default()).expect("a client for the test fleet")
}

async fn state(c: &Client, id: ExecutionId) -> ExecutionState {
    c.get_execution(id)
        .await
        .expect("get")
        .expect("the execution exists")
        .state
}

#[tokio::test]
async fn lifecycle_calls_say_whether_they_changed_anything() {
    let c = client();
    let name = unique("life");
    let s = c
        .start_workflow(&name, "w1", json!({"n": 1}), StartOptions::new())
        .await
        .expect("start");
    let id = s.execution_id;
    assert!(c.admin().pause_execution(id).await.expect("pause"));
    assert_eq!(state(&c, id).await, ExecutionState::Paused);
    assert!(
        !c.admin().pause_execution(id).await.expect("pause again"),
        "already paused"
    );
    assert!(c.admin().resume_execution(id).await.expect("resume"));
    assert!(
        !c.admin().resume_execution(id).await.expect("resume again"),
        "not paused"
    );
    assert_eq!(state(&c, id).await, ExecutionState::Running);

    let wake_at = SystemTime::now() + Duration::from_secs(3600);
    assert!(c.suspend_execution(id, Some(wake_at)).await.expect("suspend"));
    let e = c.get_execution(id).await.expect("get").expect("exists");
    assert_eq!(e.state, ExecutionState::Suspended);
    let drift = e
        .wake_at
        .expect("a timer")
        .duration_since(wake_at)
        .unwrap_or_default();
    assert!(drift < Duration::from_millis(2), "wake_at {drift:?} off");
    assert!(!c.suspend_execution(id, None).await.expect("suspend again"));
    assert!(c.wake_execution(id).await.expect("wake"));
    assert!(!c.wake_execution(id).await.expect("wake again"));
    assert_eq!(state(&c, id).await, ExecutionState::Running);

    let seq = c
        .append_event(id, "Note", Json::parse(r#"{"price": 1.50}"#).expect("json"))
        .await
        .expect("append");
    let page = c.history(id, seq - 1, 10).await.expect("history");
    assert_eq!(page.events[0].payload.as_str(), r#"{"price": 1.50}"#);

    assert!(
        c.admin()
            .terminate_execution(id, Some("operator"))
            .await
            .expect("terminate")
    );
    assert!(
        !c.admin()
            .terminate_execution(id, None)
            .await
            .expect("terminate again")
    );
    assert_eq!(state(&c, id).await, ExecutionState::Terminated);
    match c.admin().pause_execution(id).await {
        Err(ClientError::WrongState { .. }) => {}
        other => panic!("a pause of an ended execution: {other:?}"),
    }
    match c.append_event(id, "Late", json!({})).await {
        Err(ClientError::WrongState { .. }) => {}
        other => panic!("an append to a closed history: {other:?}"),
    }
    let nobody = ExecutionId::mint(s.shard).expect("mint");
    match c.wake_execution(nobody).await {
        Err(ClientError::UnknownExecution { shard, .. }) => assert_eq!(shard, s.shard),
        other => panic!("an unknown id: {other:?}"),
    }
}

#[tokio::test]
async fn history_pages_across_pages_and_streams_in_order() {
    let c = client();
    let s = c
        .start_workflow(&unique("hist"), "w", json!({}), StartOptions::new())
        .await
        .expect("start");
    let id = s.execution_id;
    for i in 0..25 {
        c.append_event(id, "Step", json!({ "i": i }))
            .await
            .expect("append");
    }
    // 26 events: WorkflowStarted, then 25 steps. Pages of 10: 10, 10, 6.
    let mut sizes = Vec::new();
    let mut seqs = Vec::new();
    let mut cursor = 0;
    loop {
        let page = c.history(id, cursor, 10).await.expect("a page");
        sizes.push(page.events.len());
        seqs.extend(page.events.iter().map(|e| e.seq));
        match page.next_after {
            Some(next) => cursor = next,
            None => break,
        }
    }
    assert_eq!(sizes, [10, 10, 6]);
    assert_eq!(seqs, (1..=26).collect::<Vec<i64>>());
    // A page that ends exactly at the end says so (the shard was asked for one more).
    let exact = c.history(id, 13, 13).await.expect("the last 13");
    assert_eq!((exact.events.len(), exact.next_after), (13, None));
    let first = c.history(id, 0, 13).await.expect("the first 13");
    assert_eq!(first.next_after, Some(13));

    let streamed: Vec<_> = c.history_stream(id, 7).try_collect().await.expect("the stream");
    assert_eq!(streamed.len(), 26);
    assert_eq!(streamed[0].event_type, "WorkflowStarted");
    assert_eq!(streamed[25].payload.to_value().expect("json")["i"], 24);
    assert!(matches!(
        c.history(id, 0, 0).await,
        Err(ClientError::BadRequest(_))
    ));
}

#[tokio::test]
async fn find_execution_asks_every_shard() {
    let c = client();
    let name = unique("find");
    let options = StartOptions::new().placement(Placement::RoutingKey(unique("rk")));
    let s = c
        .start_workflow(&name, "order-7", json!({}), options.clone())
        .await
        .expect("start");
    let Resolution::Found { execution, shard, .. } = c.find_execution(&name, "order-7").await.expect("find")
    else {
        panic!("not found");
    };
    assert_eq!((execution.execution_id, shard), (s.execution_id, s.shard));
    assert!(matches!(
        c.find_execution(&name, "order-8").await.expect("find"),
        Resolution::Absent
    ));
    // Ended: still found, as the most recent ended one.
    c.cancel_execution(s.execution_id, None).await.expect("cancel");
    let Resolution::Found { execution, .. } = c.find_execution(&name, "order-7").await.expect("find") else {
        panic!("the ended run is not found");
    };
    assert_eq!(execution.state, ExecutionState::Cancelled);
}

#[tokio::test]
async fn batches_enqueue_in_order_on_one_shard_and_complete_per_task() {
    let c = client();
    let queue = unique("batch");
    let shard = fleet().shards().nth(1).expect("three shards").id;
    let payloads: Vec<_> = (0..5).map(|i| json!({ "i": i })).collect();
    let batch = c
        .enqueue_batch(
            &queue,
            payloads,
            EnqueueOptions::new().placement(Placement::Shard(shard)),
        )
        .await
        .expect("enqueue_batch");
    assert_eq!((batch.task_ids.len(), batch.shard), (5, shard));
    assert!(batch.task_ids.iter().all(|t| t.shard() == Some(shard)));
    let claimed = c
        .claim(shard, &queue, "w", 5, Duration::from_secs(30))
        .await
        .expect("claim");
    let order: Vec<_> = claimed.iter().map(|t| t.task_id).collect();
    assert_eq!(order, batch.task_ids, "claimed in enqueue order");
    let mut entries: Vec<_> = claimed.iter().map(|t| (t.task_id, t.token)).collect();
    entries[0].1 += 1000; // a stale token: reported false, left alone
    let done = c.complete_batch(&entries).await.expect("complete_batch");
    assert_eq!(done.len(), 5);
    assert!(!done[&entries[0].0]);
    assert_eq!(done.values().filter(|&&ok| ok).count(), 4);
    let stats = c.admin().queue_stats(&queue).await;
    assert!(stats.is_complete(), "{:?}", stats.failed);
    assert_eq!(stats.ok[&shard].running, 1);
    assert_eq!(stats.total().running, 1);
    let none: Vec<serde_json::Value> = Vec::new();
    assert!(matches!(
        c.enqueue_batch(&queue, none, EnqueueOptions::new()).await,
        Err(ClientError::BadRequest(_))
    ));
}
