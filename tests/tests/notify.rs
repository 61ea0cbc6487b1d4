//! Workers can LISTEN for new work: a notification when an idle queue gets
//! ready tasks (one per transaction however many rows), none while it is
//! busy, and none once a queue turns them off.

use std::time::Duration;

use sheaf_tests::{connect, connect_listening, fleet, unique};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_postgres::{Client, Notification};

#[tokio::test]
async fn notifications_are_coalesced_per_transaction_and_can_be_turned_off() {
    let shard = fleet().shards().nth(2).unwrap();
    let (listener, mut notes) = connect_listening(shard).await;
    listener.batch_execute("LISTEN sheaf_ready").await.unwrap();
    let db = connect(shard).await;
    let queue = unique("notify");

    // An idle queue gets one notification per transaction, however many rows.
    db.execute(
        "SELECT sheaf.enqueue_batch($1, array_fill('{}'::jsonb, ARRAY[100]))",
        &[&queue],
    )
    .await
    .unwrap();
    // A busy queue gets none: its workers are coming back for more anyway.
    db.execute("SELECT sheaf.enqueue($1, '{}')", &[&queue])
        .await
        .unwrap();
    // Drained, it is idle again: the next transaction notifies once.
    db.execute("SELECT count(*) FROM sheaf.claim($1, 'w', 1000)", &[&queue])
        .await
        .unwrap();
    db.batch_execute(&format!(
        "BEGIN; SELECT sheaf.enqueue('{queue}', '{{}}'); SELECT sheaf.enqueue('{queue}', '{{}}'); COMMIT"
    ))
    .await
    .unwrap();
    let got = notified_until_marker(&db, &mut notes, &queue).await;
    assert_eq!(
        got.len(),
        2,
        "one for the batch into the idle queue, one for the transaction after draining"
    );
    assert_eq!(got[0].channel(), "sheaf_ready");

    db.execute("SELECT count(*) FROM sheaf.claim($1, 'w', 1000)", &[&queue])
        .await
        .unwrap();
    db.execute(
        "SELECT sheaf.configure_queue($1, '{\"notify\": false}')",
        &[&queue],
    )
    .await
    .unwrap();
    db.execute("SELECT sheaf.enqueue($1, '{}')", &[&queue])
        .await
        .unwrap();
    let got = notified_until_marker(&db, &mut notes, &queue).await;
    assert!(got.is_empty(), "no notification once notify is off: {got:?}");
}

/// The notifications about `queue` that arrived before a marker the test
/// sends after them: Postgres delivers notifications in commit order, so
/// nothing about what came before can arrive after it. No fixed wait, and
/// the other tests' notifications on the channel do not matter.
async fn notified_until_marker(
    db: &Client,
    notes: &mut UnboundedReceiver<Notification>,
    queue: &str,
) -> Vec<Notification> {
    let marker = format!("{queue}-marker");
    db.execute("SELECT pg_notify('sheaf_ready', $1)", &[&marker])
        .await
        .unwrap();
    let mut got = Vec::new();
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), notes.recv())
            .await
            .expect("the marker notification within 30 s")
            .expect("the listening connection is open");
        if n.payload() == marker {
            return got;
        }
        if n.payload() == queue {
            got.push(n);
        }
    }
}
