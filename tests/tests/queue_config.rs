//! A queue's configuration is cached by every backend that enqueues to it;
//! a change made by configure_queue in one session reaches the next enqueue
//! of every other session, whatever that session cached before.

use std::time::Duration;

use sheaf_tests::{connect, connect_listening, fleet, unique};
use tokio_postgres::Client;

/// Enqueues a task with `priority`; returns whether its ready row carries
/// the aging key for `aging_secs` (else it carries -priority).
async fn enqueue_keyed_by_aging(db: &Client, queue: &str, priority: i32) -> bool {
    let id: uuid::Uuid = db
        .query_one(
            "SELECT sheaf.enqueue($1, '{}', jsonb_build_object('priority', $2::int))",
            &[&queue, &priority],
        )
        .await
        .unwrap()
        .get(0);
    let row = db
        .query_one(
            "SELECT r.k1 = sheaf.ready_k1(t.priority, t.enqueued_at, 60), r.k1 = -t.priority::float8 \
             FROM sheaf.ready r JOIN sheaf.tasks t ON t.id = r.task_id WHERE r.task_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    let (aging, plain): (bool, bool) = (row.get(0), row.get(1));
    assert!(aging != plain, "a ready key is either the aging key or -priority");
    aging
}

#[tokio::test]
async fn a_configuration_change_reaches_other_sessions_next_enqueue() {
    let shard = fleet().shards().next().unwrap();
    let (worker, admin) = (connect(shard).await, connect(shard).await);
    let queue = unique("config");

    // The worker's session creates the queue, then reads (and caches) its
    // default configuration.
    assert!(!enqueue_keyed_by_aging(&worker, &queue, 5).await);
    assert!(!enqueue_keyed_by_aging(&worker, &queue, 5).await);

    admin
        .execute(
            "SELECT sheaf.configure_queue($1, '{\"aging_secs\": 60}')",
            &[&queue],
        )
        .await
        .unwrap();
    assert!(
        enqueue_keyed_by_aging(&worker, &queue, 5).await,
        "aging on reaches the worker"
    );

    admin
        .execute(
            "SELECT sheaf.configure_queue($1, '{\"aging_secs\": null}')",
            &[&queue],
        )
        .await
        .unwrap();
    assert!(
        !enqueue_keyed_by_aging(&worker, &queue, 5).await,
        "aging off reaches it too"
    );
}

#[tokio::test]
async fn turning_notifications_off_in_one_session_silences_another() {
    let shard = fleet().shards().nth(1).unwrap();
    let (listener, mut notes) = connect_listening(shard).await;
    listener.batch_execute("LISTEN sheaf_ready").await.unwrap();
    let (worker, admin) = (connect(shard).await, connect(shard).await);
    let queue = unique("config-notify");
    let drain = "SELECT count(*) FROM sheaf.claim($1, 'w', 1000)";

    // Two transactions: the first creates the queue, the second caches it.
    for _ in 0..2 {
        worker
            .execute("SELECT sheaf.enqueue($1, '{}')", &[&queue])
            .await
            .unwrap();
    }
    worker.execute(drain, &[&queue]).await.unwrap();
    admin
        .execute(
            "SELECT sheaf.configure_queue($1, '{\"notify\": false}')",
            &[&queue],
        )
        .await
        .unwrap();
    worker
        .execute("SELECT sheaf.enqueue($1, '{}')", &[&queue])
        .await
        .unwrap();

    let mut got = 0;
    while let Ok(Some(n)) = tokio::time::timeout(Duration::from_millis(500), notes.recv()).await {
        if n.payload() == queue {
            got += 1;
        }
    }
    assert_eq!(got, 1, "only the enqueue before notify was turned off notifies");
}
