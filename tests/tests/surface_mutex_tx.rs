//! The mutex guard and in-transaction enqueue/start against live shards.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use sheaf_driver::{
    Acquired, Client, ClientError, EnqueueOptions, LockOptions, MutexKey, OnShard, Placement, PoolOptions,
    StartOptions,
};
use sheaf_tests::{fleet, unique};

fn client() -> Arc<Client> {
    Arc::new(Client::new(fleet().clone(), PoolOptions::default()).expect("a client for the test fleet"))
}

async fn until_free(c: &Client, key: &MutexKey) -> bool {
    for _ in 0..50 {
        if c.mutex_status(key).await.expect("status").holder.is_none() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn one_guard_at_a_time_with_increasing_tokens() {
    let c = client();
    let key = MutexKey::new(unique("mx"));
    let inside = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let holders = (0..4).map(|_| {
        let (c, key, inside, tokens) = (c.clone(), key.clone(), inside.clone(), tokens.clone());
        tokio::spawn(async move {
            for _ in 0..3 {
                let options = LockOptions::new().poll(Duration::from_millis(20));
                let guard = c.lock(key.clone(), options).await.expect("lock");
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                tokens.lock().expect("tokens").push(guard.token());
                tokio::time::sleep(Duration::from_millis(30)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                // Released in turn: half by release(), half by drop.
                if guard.token() % 2 == 0 {
                    guard.release().await.expect("release");
                } else {
                    drop(guard);
                }
            }
        })
    });
    for h in futures::future::join_all(holders).await {
        h.expect("a holder task");
    }
    let tokens = tokens.lock().expect("tokens").clone();
    assert_eq!(tokens.len(), 12);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens increase: {tokens:?}"
    );
    assert!(until_free(&c, &key).await, "the last holder's drop released it");
}

#[tokio::test]
async fn a_dropped_guard_releases_and_a_stolen_one_reports_the_loss() {
    let c = client();
    let key = MutexKey::new(unique("mx"));
    let guard = c.lock(key.clone(), LockOptions::new()).await.expect("lock");
    let status = c.mutex_status(&key).await.expect("status");
    assert_eq!(
        (status.holder, status.token),
        (Some(guard.owner()), Some(guard.token()))
    );
    assert_eq!(guard.shard(), c.mutex_shard(&key));
    drop(guard);
    assert!(until_free(&c, &key).await, "dropping the guard released the lock");

    // A lease of 1.5 s renewed every 0.5 s; the lock taken away under it
    // (released with its own token, as a stale holder's successor would
    // find it) makes the next renewal stale: the guard reports the loss.
    let options = LockOptions::new().lease(Duration::from_millis(1500));
    let guard = c.lock(key.clone(), options).await.expect("lock again");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!guard.is_lost(), "renewed in time");
    c.mutex_release(&key, guard.owner(), guard.token())
        .await
        .expect("taken away");
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the guard noticed");
    assert!(matches!(
        guard.release().await,
        Err(ClientError::StaleToken { .. })
    ));

    // try_lock gives up, and gives its place in line up too.
    let holder = c.lock(key.clone(), LockOptions::new()).await.expect("hold");
    let waited = c
        .try_lock(key.clone(), LockOptions::new(), Duration::from_millis(300))
        .await
        .expect("try_lock");
    assert!(waited.is_none());
    let mut left = false;
    for _ in 0..20 {
        if c.mutex_status(&key).await.expect("status").waiters == 0 {
            left = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        left,
        "the waiter that gave up left the line before the holder let go"
    );
    holder.release().await.expect("release");
    let owner = uuid::Uuid::new_v4();
    let mut granted = false;
    for _ in 0..50 {
        if let Acquired::Granted { .. } = c
            .mutex_acquire(&key, owner, Duration::from_secs(5))
            .await
            .expect("acquire")
        {
            granted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(granted, "the waiter that gave up passed the lock on");
}

#[tokio::test]
async fn work_in_the_callers_transaction_commits_or_rolls_back_with_it() {
    let c = client();
    let shards: Vec<_> = fleet().shards().map(|s| s.id).collect();
    let shard = shards[1];
    let queue = unique("tx");
    let mut conn = c.shard_connection(shard).await.expect("a connection");

    let tx = conn.transaction().await.expect("begin");
    let on = OnShard::verify(&tx, shard).await.expect("verify");
    let task = on
        .enqueue(&queue, json!({"a": 1}), EnqueueOptions::new())
        .await
        .expect("enqueue");
    assert_eq!(task.task_id.shard(), Some(shard));
    let started = on
        .start_workflow(&unique("txwf"), "w", json!({}), StartOptions::new())
        .await
        .expect("start");
    tx.rollback().await.expect("rollback");
    assert_eq!(
        c.admin().queue_stats(&queue).await.total().ready,
        0,
        "rolled back: no task"
    );
    assert!(
        c.get_execution(started.execution_id)
            .await
            .expect("get")
            .is_none()
    );

    let tx = conn.transaction().await.expect("begin");
    let on = OnShard::verify(&tx, shard).await.expect("verify");
    on.enqueue_batch(&queue, [json!(1), json!(2)], EnqueueOptions::new())
        .await
        .expect("enqueue_batch");
    let started = on
        .start_workflow(&unique("txwf"), "w", json!({}), StartOptions::new())
        .await
        .expect("start");
    assert_eq!(
        c.admin().queue_stats(&queue).await.total().ready,
        0,
        "not visible before the commit"
    );
    tx.commit().await.expect("commit");
    assert_eq!(c.admin().queue_stats(&queue).await.ok[&shard].ready, 2);
    assert!(
        c.get_execution(started.execution_id)
            .await
            .expect("get")
            .is_some()
    );

    // The wrong shard is refused, once, before anything is written.
    let tx = conn.transaction().await.expect("begin");
    match OnShard::verify(&tx, shards[0]).await {
        Err(ClientError::WrongState { message, .. }) => assert!(message.contains("not shard"), "{message}"),
        other => panic!("a connection to another shard: {other:?}"),
    }
    let on = OnShard::verify(&tx, shard).await.expect("verify");
    let elsewhere = EnqueueOptions::new().placement(Placement::Shard(shards[0]));
    assert!(matches!(
        on.enqueue(&queue, json!({}), elsewhere).await,
        Err(ClientError::BadRequest(_))
    ));
    // A run this shard does not hold is refused by the shard (where a run
    // lives is not in its id: tests/tests/residence.rs), which aborts the
    // transaction.
    let foreign = sheaf_driver::ExecutionId::mint(shards[0]).expect("mint");
    let of_foreign = EnqueueOptions::new().execution(foreign);
    assert!(matches!(
        on.enqueue(&queue, json!({}), of_foreign).await,
        Err(ClientError::UnknownExecution { .. })
    ));
    tx.rollback().await.expect("rollback");
}
