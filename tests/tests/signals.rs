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

/// A committed inline send: its outbox row, its sender, its target.
type Sent = (uuid::Uuid, uuid::Uuid, uuid::Uuid);

/// One connection's `SENDS` signals between random runs of `runs` (all of
/// workflow `name`, ids `r0`…), a fifth of them rolled back: the committed
/// sends and the rolled-back rows.
async fn send_between(
    shard: &'static sheaf_driver::Shard,
    runs: Arc<Vec<uuid::Uuid>>,
    name: String,
    n: usize,
) -> (Vec<Sent>, Vec<uuid::Uuid>) {
    const SENDS: usize = 25;
    let db = connect(shard).await;
    let mut rng = sheaf_tests::Rng::new(0x5eed + n as u64);
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    let count = runs.len() as u64;
    for i in 0..SENDS {
        let from = rng.below(count) as usize;
        let to = (from + 1 + rng.below(count - 1) as usize) % runs.len();
        db.batch_execute("BEGIN").await.expect("begin");
        let outbox: uuid::Uuid = db
            .query_one(
                "SELECT sheaf.signal_external($1, $2, $3, 'ping', $4)",
                &[&runs[from], &name, &format!("r{to}"), &json!({ "n": n, "i": i })],
            )
            .await
            .unwrap_or_else(|e| panic!("signal_external: {e:?}"))
            .get(0);
        if rng.below(5) == 0 {
            db.batch_execute("ROLLBACK").await.expect("rollback");
            dropped.push(outbox);
        } else {
            db.batch_execute("COMMIT").await.expect("commit");
            kept.push((outbox, runs[from], runs[to]));
        }
    }
    (kept, dropped)
}

/// The (execution, `payload->>field`) of every `event` of `runs`.
async fn events_of(
    db: &tokio_postgres::Client,
    runs: &[uuid::Uuid],
    event: &str,
    field: &str,
) -> Vec<(uuid::Uuid, String)> {
    db.query(
        "SELECT execution_id, payload->>$3 FROM sheaf.events WHERE execution_id = ANY($1) AND event_type = $2",
        &[&runs, &event, &field],
    )
    .await
    .expect("events")
    .iter()
    .map(|r| (r.get(0), r.get::<_, Option<String>>(1).unwrap_or_default()))
    .collect()
}

/// `signal_external` between runs of one shard, under real concurrency:
/// eight connections, each run both a sender and a target, a fifth of the
/// sends rolled back. Each committed send is delivered inline, before its
/// transaction's commit returns (the outbox row is `DONE`: no relay has
/// anything to do): the target's history holds exactly one `SignalReceived`
/// carrying the row's id, the sender's exactly one `ExternalSignalDelivered`
/// naming it; a rolled-back send left nothing anywhere. Runs signalling each
/// other at once lock in id order: no deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signals_between_runs_of_one_shard_are_delivered_inline_under_contention() {
    let c = client();
    let shard = fleet().shards().nth(2).expect("three shards");
    let name = unique("inline");
    let mut runs = Vec::new();
    for r in 0..6 {
        let s = c
            .start_workflow(
                &name,
                &format!("r{r}"),
                json!({}),
                StartOptions::new().placement(Placement::Shard(shard.id)),
            )
            .await
            .expect("start");
        runs.push(s.execution_id.as_uuid());
    }
    let runs = Arc::new(runs);
    let sends = (0..8).map(|n| tokio::spawn(send_between(shard, runs.clone(), name.clone(), n)));
    let (mut kept, mut dropped) = (Vec::new(), Vec::new());
    for r in futures::future::join_all(sends).await {
        let (k, d) = r.expect("a sender");
        kept.extend(k);
        dropped.extend(d);
    }
    assert!(!kept.is_empty() && !dropped.is_empty());
    let db = connect(shard).await;
    let received = events_of(&db, &runs, "SignalReceived", "signal_id").await;
    let delivered = events_of(&db, &runs, "ExternalSignalDelivered", "outbox_id").await;
    assert_eq!(
        received.len(),
        kept.len(),
        "one SignalReceived per committed send"
    );
    assert_eq!(
        delivered.len(),
        kept.len(),
        "one ExternalSignalDelivered per committed send"
    );
    for (outbox, from, to) in &kept {
        let id = outbox.to_string();
        assert_eq!(
            received.iter().filter(|e| e.1 == id && e.0 == *to).count(),
            1,
            "{id} at its target"
        );
        assert_eq!(
            delivered.iter().filter(|e| e.1 == id && e.0 == *from).count(),
            1,
            "{id} at its sender"
        );
    }
    let open: i64 = db
        .query_one(
            "SELECT count(*) FROM sheaf.outbox WHERE sender_id = ANY($1) AND state <> 'DONE'",
            &[&*runs],
        )
        .await
        .expect("outbox")
        .get(0);
    assert_eq!(open, 0, "nothing left for a relay");
    let dropped: Vec<String> = dropped.iter().map(ToString::to_string).collect();
    let leaked: i64 = db
        .query_one(
            "SELECT count(*) FROM sheaf.events WHERE execution_id = ANY($1) \
             AND (payload->>'signal_id' = ANY($2) OR payload->>'outbox_id' = ANY($2))",
            &[&*runs, &dropped],
        )
        .await
        .expect("events")
        .get(0);
    assert_eq!(leaked, 0, "a rolled-back send left nothing");
}
