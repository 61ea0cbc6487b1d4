//! Debounced starts on live shards: 1,000 concurrent starts on one key (from
//! 50 connections) make one run, whose id every start returns and whose
//! input is the last start's; the run's first task is due a window after
//! the burst; a debounced start with a pin is refused, never placed
//! elsewhere.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sheaf_driver::{Client, ClientError, DebounceMode, Placement, PoolOptions, StartOptions};
use sheaf_tests::{connect, fleet, unique};

fn client() -> Arc<Client> {
    let options = PoolOptions::default().max_size(50);
    Arc::new(Client::new(fleet().clone(), options).expect("a client"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_starts_on_one_key_make_one_run() {
    let c = client();
    let (name, key, queue) = (unique("debounced"), unique("doc"), unique("debq"));
    c.admin()
        .declare_workflow(&name, json!({ "queue": queue }))
        .await
        .into_result()
        .expect("declared");
    let window = Duration::from_secs(2);
    let starters = (0..50).map(|w| {
        let (c, name, key) = (c.clone(), name.clone(), key.clone());
        tokio::spawn(async move {
            let mut out = Vec::new();
            for n in 0..20 {
                let s = c
                    .start_workflow(
                        &name,
                        &format!("edit-{w}-{n}"),
                        json!({ "w": w, "n": n }),
                        StartOptions::new().debounce(key.clone(), window, DebounceMode::Trailing),
                    )
                    .await
                    .expect("a debounced start");
                out.push(s);
            }
            out
        })
    });
    let started: Vec<_> = futures::future::join_all(starters)
        .await
        .into_iter()
        .flat_map(|r| r.expect("a starter"))
        .collect();
    assert_eq!(started.len(), 1000);
    let id = started[0].execution_id;
    assert!(
        started.iter().all(|s| s.execution_id == id),
        "one run for the burst"
    );
    assert_eq!(started.iter().filter(|s| s.created).count(), 1);
    let shard = fleet().get(started[0].shard).expect("its shard");
    let db = connect(shard).await;
    let row = db
        .query_one(
            "SELECT (SELECT count(*) FROM sheaf.executions WHERE workflow_name = $1), \
                    (SELECT count(*) FROM sheaf.events WHERE execution_id = $2 AND event_type = 'StartDebounced'), \
                    (SELECT starts FROM sheaf.pending_starts($1)), \
                    (SELECT input = (SELECT payload -> 'input' FROM sheaf.events WHERE execution_id = $2 \
                                     ORDER BY seq DESC LIMIT 1) FROM sheaf.executions WHERE id = $2)",
            &[&name, &id.as_uuid()],
        )
        .await
        .expect("counts");
    let (runs, joined, starts, last): (i64, i64, i64, bool) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!((runs, joined, starts), (1, 999, 1000));
    assert!(last, "the run's input is the last start's");
    let pending = c.pending_starts(Some(&name), 10).await;
    assert_eq!(pending.ok.values().flatten().count(), 1);
    // A window after the burst, its first task is claimable.
    let after_burst = std::time::Instant::now();
    sheaf_tests::until("the run's first task", Duration::from_secs(10), async || {
        let tasks = c
            .claim(shard.id, &queue, "deb", 100, Duration::from_secs(30))
            .await
            .expect("claim");
        let mine = tasks.iter().any(|t| t.execution_id == Some(id));
        for t in tasks {
            let _ = c.release(t.task_id, t.token).await;
        }
        mine
    })
    .await;
    let claimed = after_burst.elapsed();
    assert!(
        claimed >= window.saturating_sub(Duration::from_secs(1)),
        "not before the window: {claimed:?}"
    );
    c.cancel_execution(id, None).await.expect("cancel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pinned_debounced_start_is_refused() {
    let c = client();
    let shard = fleet().shards().next().expect("a shard").id;
    let refused = c
        .start_workflow(
            &unique("pinned"),
            "x",
            json!({}),
            StartOptions::new().placement(Placement::Shard(shard)).debounce(
                "k",
                Duration::from_secs(1),
                DebounceMode::Leading,
            ),
        )
        .await
        .expect_err("a pin with a debounce");
    assert!(matches!(refused, ClientError::BadRequest(_)), "{refused}");
}
