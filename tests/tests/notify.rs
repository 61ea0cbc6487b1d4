//! Workers can LISTEN for new work: a notification when an idle queue gets
//! ready tasks (one per transaction however many rows), none while it is
//! busy, and none once a queue turns them off.

use std::time::Duration;

use sheaf_tests::{connect, connect_listening, fleet, unique};

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
    let mut got = Vec::new();
    while let Ok(Some(n)) = tokio::time::timeout(Duration::from_millis(500), notes.recv()).await {
        if n.payload() == queue {
            got.push(n);
        }
    }
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
    let quiet = tokio::time::timeout(Duration::from_millis(500), async {
        loop {
            match notes.recv().await {
                Some(n) if n.payload() == queue => return true,
                Some(_) => continue,
                None => return false,
            }
        }
    })
    .await;
    assert!(quiet.is_err(), "no notification once notify is off");
}
