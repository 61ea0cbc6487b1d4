//! The usage report against live shards, checked two ways: the numbers a
//! scripted workload must give (completed, failed and dead-lettered
//! attempts, a dead letter redriven and completed, a lease reaped, a
//! cancelled and a terminated run, metered units, executions without the
//! group key, the window's edges: a start at `from` counts, one at `to`
//! does not), and a recount of every group from the raw rows of every
//! shard, aggregated here.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use sheaf_driver::{
    Client, ClientError, EnqueueOptions, ExecutionId, GroupBy, PageStatus, Placement, PoolOptions, ShardId,
    StartOptions, Usage,
};
use sheaf_tests::{connect, fleet, unique};

fn client() -> Client {
    Client::new(fleet().clone(), PoolOptions::default()).expect("a client")
}

fn on(n: usize) -> Placement {
    let shards: Vec<ShardId> = fleet().shards().map(|s| s.id).collect();
    Placement::Shard(shards[n % shards.len()])
}

async fn start(c: &Client, name: &str, id: &str, shard: usize, attrs: Value) -> ExecutionId {
    let mut opts = StartOptions::new().placement(on(shard));
    if let Value::Object(m) = attrs {
        for (k, v) in m {
            opts = opts.search_attr(k, v);
        }
    }
    c.start_workflow(name, id, json!({}), opts)
        .await
        .expect("start")
        .execution_id
}

/// Enqueues an activity of `execution` and claims it (the only ready task of
/// its own queue).
async fn claimed(
    c: &Client,
    execution: ExecutionId,
    queue: &str,
    lease: Duration,
    attempts: i32,
) -> sheaf_driver::ClaimedTask {
    let shard = execution.shard().expect("a shard prefix");
    c.enqueue(
        queue,
        json!({}),
        EnqueueOptions::new().execution(execution).max_attempts(attempts),
    )
    .await
    .expect("enqueue");
    claim_one(c, shard, queue, lease).await
}

async fn claim_one(c: &Client, shard: ShardId, queue: &str, lease: Duration) -> sheaf_driver::ClaimedTask {
    let mut got = c
        .claim(shard, queue, "usage-test", 1, lease)
        .await
        .expect("claim");
    assert_eq!(got.len(), 1, "one task of {queue}");
    got.remove(0)
}

async fn created_at(id: ExecutionId) -> SystemTime {
    let shard = fleet()
        .shards()
        .find(|s| Some(s.id) == id.shard())
        .expect("its shard");
    connect(shard)
        .await
        .query_one(
            "SELECT created_at FROM sheaf.executions WHERE id = $1",
            &[&id.as_uuid()],
        )
        .await
        .expect("created_at")
        .get(0)
}

/// Every group of `[from, to)` by attribute `key`, recounted from the raw
/// rows of every shard.
async fn recount(from: SystemTime, to: SystemTime, key: &str) -> BTreeMap<String, Usage> {
    let mut groups: BTreeMap<String, Usage> = BTreeMap::new();
    let group = |attrs: &Value| match attrs.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => "(unattributed)".to_owned(),
    };
    for shard in fleet().shards() {
        let db = connect(shard).await;
        for r in db
            .query(
                "SELECT search_attrs FROM sheaf.executions WHERE created_at >= $1 AND created_at < $2",
                &[&from, &to],
            )
            .await
            .expect("executions")
        {
            groups.entry(group(&r.get(0))).or_default().workflow_starts += 1;
        }
        for r in db
            .query(
                "SELECT e.search_attrs, v.event_type, v.payload FROM sheaf.events v \
                 JOIN sheaf.executions e ON e.id = v.execution_id WHERE v.created_at >= $1 AND v.created_at < $2",
                &[&from, &to],
            )
            .await
            .expect("events")
        {
            let (attrs, kind, payload): (Value, String, Value) = (r.get(0), r.get(1), r.get(2));
            let u = groups.entry(group(&attrs)).or_default();
            let activity = payload["kind"] == "activity";
            match kind.as_str() {
                "WorkflowCompleted" => u.completed += 1,
                "WorkflowFailed" => u.failed += 1,
                "WorkflowCancelled" => u.cancelled += 1,
                "WorkflowTimedOut" => u.timed_out += 1,
                "TaskCompleted" | "TaskFailed" | "TaskDeadLettered" | "TaskReaped" if activity => {
                    u.activity_executions += 1;
                    if kind != "TaskCompleted" {
                        u.activity_executions_failed += 1;
                    }
                    u.activity_compute_seconds += payload["secs"].as_f64().unwrap_or(0.0);
                }
                _ => {}
            }
        }
        for r in db
            .query(
                "SELECT e.search_attrs, u.metrics FROM sheaf.usage_records u \
                 JOIN sheaf.executions e ON e.id = u.execution_id WHERE u.recorded_at >= $1 AND u.recorded_at < $2",
                &[&from, &to],
            )
            .await
            .expect("usage records")
        {
            let (attrs, metrics): (Value, Value) = (r.get(0), r.get(1));
            let u = groups.entry(group(&attrs)).or_default();
            for (metric, v) in metrics.as_object().expect("an object") {
                let have = u.metered.get(metric).and_then(|n| n.as_i64()).unwrap_or(0);
                u.metered.insert(metric.clone(), (have + v.as_i64().expect("integers here")).into());
            }
        }
    }
    groups
}

// One scripted workload, then its report checked against expectations and
// against the recount; split, the expectations would sit apart from what
// produced them.
#[allow(clippy::too_many_lines)]
#[tokio::test]
async fn the_report_counts_each_unit_once_in_its_window() {
    let c = client();
    let name = unique("usage");
    let key = unique("acct").replace('-', "_");
    let queue = unique("usage-q");
    let a = start(&c, &name, "a1", 0, json!({ &key: "a" })).await;
    let a2 = start(&c, &name, "a2", 0, json!({ &key: "a" })).await;
    let b = start(&c, &name, "b1", 1, json!({ &key: "b" })).await;
    let none = start(&c, &name, "n1", 1, json!({})).await;
    let five = start(&c, &name, "f1", 2, json!({ &key: 5 })).await;

    // a: completed, failed then dead-lettered, redriven and completed.
    let t = claimed(&c, a, &format!("{queue}-1"), Duration::from_secs(60), 3).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.complete(t.task_id, t.token, None).await.expect("complete");
    let t = claimed(&c, a, &format!("{queue}-2"), Duration::from_secs(60), 2).await;
    c.fail(t.task_id, t.token, "first", Some(Duration::ZERO))
        .await
        .expect("fail");
    let t = claim_one(&c, t.shard, &format!("{queue}-2"), Duration::from_secs(60)).await;
    let out = c.fail(t.task_id, t.token, "second", None).await.expect("fail");
    assert!(out.dead_lettered, "two attempts spent");
    assert_eq!(
        c.admin()
            .redrive(&[t.task_id])
            .await
            .into_result()
            .expect("redrive")
            .values()
            .sum::<i32>(),
        1
    );
    let t = claim_one(&c, t.shard, &format!("{queue}-2"), Duration::from_secs(60)).await;
    c.complete(t.task_id, t.token, None)
        .await
        .expect("complete the redriven one");
    c.record_usage(a, json!({"tokens": 10, "calls": 1}))
        .await
        .expect("record");
    c.record_usage(a2, json!({"tokens": 5})).await.expect("record");
    c.complete_execution(a, json!({})).await.expect("complete a");
    c.cancel_execution(a2, Some("changed my mind"))
        .await
        .expect("cancel a2");

    // b: a lease reaped, then completed; the run terminated.
    let t = claimed(&c, b, &format!("{queue}-3"), Duration::from_secs(1), 3).await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    // Other suites' expired leases on the shard may be reaped with it.
    assert!(c.admin().reap_expired(t.shard, 100).await.expect("reap") >= 1);
    let t = claim_one(&c, t.shard, &format!("{queue}-3"), Duration::from_secs(60)).await;
    c.complete(t.task_id, t.token, None)
        .await
        .expect("complete after the reap");
    c.admin()
        .terminate_execution(b, Some("operator"))
        .await
        .expect("terminate b");

    // No key: metered and failed. A number-valued key: its own group.
    c.record_usage(none, json!({"tokens": 3})).await.expect("record");
    c.fail_execution(none, "broke").await.expect("fail");
    c.fail_execution(five, "broke").await.expect("fail");

    // The window's edges: from = a's start (counts), to = a later start's
    // (does not).
    let late = start(&c, &name, "late", 2, json!({ &key: "a" })).await;
    let (from, to) = (created_at(a).await, created_at(late).await);
    assert!(to > from);

    let report = c
        .admin()
        .usage_report(from, to, &GroupBy::SearchAttr(key.clone()))
        .await
        .expect("a report");
    assert_eq!(
        report.status,
        PageStatus::Complete,
        "{:?}",
        report.unavailable_shards
    );
    let g = |grp: &str| report.groups.get(grp).cloned().unwrap_or_default();
    let ga = g("a");
    assert_eq!(ga.workflow_starts, 2, "a1 and a2; late starts at `to`: {ga:?}");
    assert_eq!((ga.completed, ga.cancelled, ga.failed), (1, 1, 0), "{ga:?}");
    assert_eq!(
        (ga.activity_executions, ga.activity_executions_failed),
        (4, 2),
        "{ga:?}"
    );
    assert!(
        ga.activity_compute_seconds >= 0.04,
        "a's first attempt ran 50 ms: {ga:?}"
    );
    assert_eq!(ga.metered.get("tokens").and_then(|n| n.as_i64()), Some(15));
    assert_eq!(ga.metered.get("calls").and_then(|n| n.as_i64()), Some(1));
    let gb = g("b");
    assert_eq!(gb.workflow_starts, 1);
    assert_eq!(
        (gb.completed, gb.failed, gb.cancelled),
        (0, 0, 0),
        "terminated is none of them: {gb:?}"
    );
    assert_eq!(
        (gb.activity_executions, gb.activity_executions_failed),
        (2, 1),
        "{gb:?}"
    );
    assert!(
        gb.activity_compute_seconds >= 0.9,
        "the reaped attempt held its 1 s lease: {gb:?}"
    );
    let g5 = g("5");
    assert_eq!((g5.workflow_starts, g5.failed), (1, 1), "{g5:?}");
    let gn = g("(unattributed)");
    assert!(gn.workflow_starts >= 1 && gn.failed >= 1, "{gn:?}");
    assert!(gn.metered.get("tokens").and_then(|n| n.as_i64()).unwrap_or(0) >= 3);

    // Every group against the recount from the raw rows.
    let recounted = recount(from, to, &key).await;
    assert_eq!(
        report.groups.keys().collect::<Vec<_>>(),
        recounted.keys().collect::<Vec<_>>()
    );
    for (grp, want) in &recounted {
        let mut got = report.groups[grp].clone();
        assert!(
            (got.activity_compute_seconds - want.activity_compute_seconds).abs() < 1e-6,
            "{grp}: compute seconds {got:?} vs {want:?}"
        );
        got.activity_compute_seconds = want.activity_compute_seconds;
        assert_eq!(&got, want, "{grp}");
    }
    // The per-shard rows add up to the groups.
    let mut summed: BTreeMap<String, i64> = BTreeMap::new();
    for rows in report.per_shard.values() {
        for (grp, u) in rows {
            *summed.entry(grp.clone()).or_default() += u.workflow_starts;
        }
    }
    for (grp, u) in &report.groups {
        assert_eq!(summed.get(grp).copied().unwrap_or(0), u.workflow_starts, "{grp}");
    }

    // Grouped by workflow name, the test's workflow is one group.
    let by_name = c
        .admin()
        .usage_report(from, to, &GroupBy::WorkflowName)
        .await
        .expect("a report");
    assert_eq!(by_name.groups[&name].workflow_starts, 5);

    // An event at the edge: a window that ends at a's WorkflowCompleted
    // leaves it out, one that starts there counts it.
    let shard = fleet()
        .shards()
        .find(|s| Some(s.id) == a.shard())
        .expect("a's shard");
    let ended: SystemTime = connect(shard)
        .await
        .query_one(
            "SELECT created_at FROM sheaf.events WHERE execution_id = $1 AND event_type = 'WorkflowCompleted'",
            &[&a.as_uuid()],
        )
        .await
        .expect("a's end")
        .get(0);
    let completed = async |f: SystemTime, t: SystemTime| {
        let r = c
            .admin()
            .usage_report(f, t, &GroupBy::SearchAttr(key.clone()))
            .await
            .expect("a report");
        r.groups.get("a").map_or(0, |u| u.completed)
    };
    assert_eq!(completed(from, ended).await, 0, "an event at `to` is out");
    assert_eq!(completed(ended, to).await, 1, "an event at `from` is in");

    // Refusals: a window over 90 days, a backwards one, a bad metric.
    let day = Duration::from_secs(86_400);
    for (f, t) in [(to - day * 91, to), (to, from)] {
        let e = c
            .admin()
            .usage_report(f, t, &GroupBy::WorkflowName)
            .await
            .expect_err("refused");
        assert!(matches!(e, ClientError::BadRequest(_)), "{e}");
    }
    let e = c
        .record_usage(a, json!({"tokens": "many"}))
        .await
        .expect_err("refused");
    assert!(matches!(e, ClientError::InvalidArgument { .. }), "{e}");
}
