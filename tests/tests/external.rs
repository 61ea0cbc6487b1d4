//! Signals and cancels addressed by business key, across real shards with
//! the relay running: the key's live run is found wherever it is (a pinned
//! run off its hash shard, a stale ended run of the key on another shard),
//! each outcome reaches the sender's history once, a cancel that ends a run
//! is confirmed by a later fan-out, a key no shard has is "unknown" only
//! after a complete fan-out. On the suite's own shards (one is stopped
//! here): a shard that cannot be read leaves the delivery pending, never
//! unknown, and it is delivered once after the shard returns; a relay that
//! crashed after delivering and before reporting delivers nothing twice.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sheaf_driver::protocol::Steps;
use sheaf_driver::{
    ByKey, Client, ExecutionId, ExecutionState, Placement, PoolOptions, Relay, RelayOptions, ShardId,
    StartOptions, Topology,
};
use sheaf_tests::{fleet, unique};

fn client(topology: &Topology, options: PoolOptions) -> Arc<Client> {
    Arc::new(Client::new(topology.clone(), options).expect("a client"))
}

fn relay(c: &Arc<Client>) -> Relay {
    let shards = c.topology().shards().map(|s| s.id).collect();
    Relay::start(c.clone(), shards, RelayOptions::default())
}

fn nth(topology: &Topology, n: usize) -> ShardId {
    topology.shards().nth(n).expect("three shards").id
}

async fn start_on(c: &Client, shard: ShardId, name: &str, workflow_id: &str) -> ExecutionId {
    c.start_workflow(
        name,
        workflow_id,
        json!({}),
        StartOptions::new().placement(Placement::Shard(shard)),
    )
    .await
    .expect("a start")
    .execution_id
}

/// The payloads of `id`'s events of type `kind`.
async fn events(c: &Client, id: ExecutionId, kind: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = c.history(id, after, 1000).await.expect("a history page");
        out.extend(
            page.events
                .iter()
                .filter(|e| e.event_type == kind)
                .map(|e| e.payload.to_value().expect("json")),
        );
        match page.next_after {
            Some(n) => after = n,
            None => return out,
        }
    }
}

/// Waits (at most `secs`) until `done` holds.
async fn eventually<F, Fut>(what: &str, secs: u64, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_signal_by_key_reaches_the_live_run_wherever_it_is() {
    let topology = fleet();
    let c = client(topology, PoolOptions::default());
    let r = relay(&c);
    let name = unique("target");
    // The live run pinned off the shard its key hashes to, and a stale ended
    // run of the key on a third shard.
    let hashed = topology
        .place(&name, "k", &Placement::Auto, None)
        .expect("the key's shard");
    let mut others = topology.shards().map(|s| s.id).filter(|s| *s != hashed);
    let (pinned, stale_shard) = (others.next().expect("a shard"), others.next().expect("another"));
    let stale = start_on(&c, stale_shard, &name, "k").await;
    c.complete_execution(stale, json!(null))
        .await
        .expect("the stale run ends");
    let live = start_on(&c, pinned, &name, "k").await;
    let sender = start_on(&c, hashed, &unique("sender"), "s").await;

    let outbox = c
        .signal_external(sender, &name, "k", "go", json!({"n": 1}), Some("once"))
        .await
        .expect("signal_external");
    let again = c
        .signal_external(sender, &name, "k", "go", json!({"n": 1}), Some("once"))
        .await
        .expect("a retried handler");
    assert_eq!(again, outbox, "opts.signal_id: the same outbox row");
    eventually("the sender has the delivery", 20, || async {
        !events(&c, sender, "ExternalSignalDelivered").await.is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let delivered = events(&c, sender, "ExternalSignalDelivered").await;
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(delivered[0]["execution_id"], live.as_uuid().to_string());
    assert_eq!(events(&c, live, "SignalReceived").await.len(), 1);
    assert!(events(&c, stale, "SignalReceived").await.is_empty());

    // From outside a workflow: the same resolution, at once.
    match c
        .signal_by_key(&name, "k", "go", json!(2), None)
        .await
        .expect("signal_by_key")
    {
        ByKey::Delivered {
            execution_id,
            shard,
            complete,
        } => {
            assert_eq!((execution_id, shard, complete), (live, pinned, true));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        c.signal_by_key(&unique("nobody"), "k", "go", json!(2), None)
            .await,
        Ok(ByKey::Unknown)
    ));
    c.complete_execution(live, json!(null))
        .await
        .expect("the live run ends");
    assert!(matches!(
        c.signal_by_key(&name, "k", "go", json!(3), None).await,
        Ok(ByKey::Ended { execution_id, state: ExecutionState::Completed }) if execution_id == live
    ));
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_by_key_is_confirmed_and_an_unknown_key_is_reported_once() {
    let topology = fleet();
    let c = client(topology, PoolOptions::default());
    let r = relay(&c);
    let name = unique("doomed");
    let target = start_on(&c, nth(topology, 2), &name, "k").await;
    let sender = start_on(&c, nth(topology, 0), &unique("canceller"), "s").await;
    c.cancel_external(sender, &name, "k", Some("enough"), None)
        .await
        .expect("cancel_external");
    c.signal_external(sender, &unique("nobody"), "k", "go", json!(null), None)
        .await
        .expect("a signal to nobody");
    eventually("the cancel is confirmed", 20, || async {
        !events(&c, sender, "ExternalCancelDelivered").await.is_empty()
    })
    .await;
    let e = c.get_execution(target).await.expect("read").expect("the target");
    assert_eq!(e.state, ExecutionState::Cancelled);
    assert_eq!(e.error.as_deref(), Some("enough"));
    eventually("the unknown target is reported", 20, || async {
        !events(&c, sender, "ExternalTargetUnknown").await.is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let confirmed = events(&c, sender, "ExternalCancelDelivered").await;
    assert_eq!(confirmed.len(), 1, "{confirmed:?}");
    assert_eq!(confirmed[0]["cancelled"], true);
    assert_eq!(confirmed[0]["execution_id"], target.as_uuid().to_string());
    assert_eq!(events(&c, sender, "ExternalTargetUnknown").await.len(), 1);
    // The sender was woken for each: a workflow task waits for it.
    let woken = c.history(sender, 0, 1000).await.expect("history");
    assert!(
        woken
            .events
            .iter()
            .any(|e| e.event_type == "ExternalCancelRequested"),
        "{:?}",
        woken.events
    );
    r.shutdown().await;
}

fn own(args: &[&str]) -> String {
    sheaf_tests::own_shards("external", 25700, args)
}

/// Shard 1 stopped: a signal to its live run stays pending (indeterminate,
/// counted per shard), is never "unknown", and is delivered once after it
/// returns. Then a relay that "crashed" after delivering and before
/// reporting: the row comes back after its lease and adds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreadable_shard_delays_a_delivery_and_a_crashed_relay_repeats_nothing() {
    let topology = Topology::parse(&own(&["up", "--count", "3", "--no-install"])).expect("own shards");
    let options = PoolOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .acquire_timeout(Duration::from_secs(2))
        .breaker_threshold(2)
        .breaker_cooldown(Duration::from_secs(1));
    let c = client(&topology, options);
    let (s0, s1) = (nth(&topology, 0), nth(&topology, 1));
    let name = unique("away");
    let live = start_on(&c, s1, &name, "k").await;
    let sender = start_on(&c, s0, &unique("sender"), "s").await;

    own(&["stop-one", "1"]);
    let r = relay(&c);
    c.signal_external(sender, &name, "k", "go", json!({"n": 1}), None)
        .await
        .expect("signal_external");
    eventually("the resolution is indeterminate", 20, || async {
        c.admin().outbox_backlog(s0).await.is_ok_and(|b| {
            b.iter()
                .any(|g| g.indeterminate > 0 && g.indeterminate_since.is_some())
        })
    })
    .await;
    assert!(c.metrics().outbox_indeterminate_total(s1, "signal") > 0);
    assert!(events(&c, sender, "ExternalTargetUnknown").await.is_empty());
    match c.signal_by_key(&name, "k", "go", json!(0), None).await {
        Ok(ByKey::Indeterminate { unavailable_shards }) => {
            assert!(unavailable_shards.contains_key(&s1), "{unavailable_shards:?}");
        }
        other => panic!("expected indeterminate, got {other:?}"),
    }
    // The backlog gauges see the row (refreshed every RelayOptions::gauges_every).
    eventually("the outbox gauge counts the row", 20, || async {
        c.metrics().outbox_pending(s0, "signal") >= 1
    })
    .await;
    own(&["start-one", "1"]);
    eventually("the signal is delivered after the shard returns", 60, || async {
        !events(&c, sender, "ExternalSignalDelivered").await.is_empty()
    })
    .await;
    r.shutdown().await;
    assert!(c.metrics().outbox_deliveries_total(s0, "signal", "delivered") >= 1);
    assert!(c.metrics().outbox_deliveries_total(s0, "signal", "indeterminate") >= 1);
    assert_eq!(events(&c, live, "SignalReceived").await.len(), 1);
    assert!(events(&c, sender, "ExternalTargetUnknown").await.is_empty());

    // A relay takes a row, delivers, and dies before it reports.
    c.signal_external(sender, &name, "k", "again", json!({"n": 2}), None)
        .await
        .expect("signal_external");
    let taken = c
        .protocol()
        .outbox_take(s0, 10, Duration::from_secs(1))
        .await
        .expect("outbox_take");
    assert_eq!(taken.len(), 1, "{taken:?}");
    let signal_id = taken[0].outbox_id.to_string();
    assert!(
        c.signal(live, "again", json!({"n": 2}), Some(&signal_id))
            .await
            .expect("the crashed relay's delivery")
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let r = relay(&c);
    eventually("the row is delivered again, after its lease", 20, || async {
        events(&c, sender, "ExternalSignalDelivered").await.len() == 2
    })
    .await;
    r.shutdown().await;
    let received = events(&c, live, "SignalReceived").await;
    assert_eq!(
        received.iter().filter(|e| e["signal"] == "again").count(),
        1,
        "delivered once: {received:?}"
    );
    own(&["down"]);
}
