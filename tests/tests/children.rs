//! Child workflows across real shards, with the relay running: a child on
//! another shard is started by the relay and its end comes back into the
//! parent's history exactly once; a parent's end reaches its children
//! (`parent_close`); a run of the child's key already active is not adopted;
//! `Distributed` placement spreads children and re-derives the same shard on
//! a retried spawn; `children` and `tree` read every shard.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sheaf_driver::{
    ChildOptions, ChildPlacement, Client, ExecutionId, ExecutionState, ParentClose, Placement, PoolOptions,
    Relay, RelayOptions, StartOptions,
};
use sheaf_tests::{connect, fleet, unique};

fn client() -> Arc<Client> {
    Arc::new(Client::new(fleet().clone(), PoolOptions::default()).expect("a client"))
}

fn relay(c: &Arc<Client>) -> Relay {
    let shards = fleet().shards().map(|s| s.id).collect();
    Relay::start(c.clone(), shards, RelayOptions::default())
}

async fn events(id: ExecutionId, kind: &str) -> Vec<serde_json::Value> {
    let shard = fleet().get(id.route(fleet())).expect("its shard");
    let db = connect(shard).await;
    db.query(
        "SELECT payload FROM sheaf.events WHERE execution_id = $1 AND event_type = $2 ORDER BY seq",
        &[&id.as_uuid(), &kind],
    )
    .await
    .expect("events")
    .iter()
    .map(|r| r.get::<_, serde_json::Value>(0))
    .collect()
}

/// Waits (at most 20 s) until `done` holds.
async fn eventually<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn parent(c: &Client, name: &str) -> ExecutionId {
    let shard = fleet().shards().next().expect("a shard").id;
    c.start_workflow(
        name,
        "p",
        json!({}),
        StartOptions::new().placement(Placement::Shard(shard)),
    )
    .await
    .expect("start the parent")
    .execution_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_child_on_another_shard_starts_and_its_end_returns_once() {
    let c = client();
    let r = relay(&c);
    let name = unique("parent");
    let p = parent(&c, &name).await;
    let other = fleet().shards().nth(1).expect("three shards").id;
    let child_name = unique("child");
    let started = c
        .start_child(
            p,
            &child_name,
            "c-1",
            json!({"n": 1}),
            ChildPlacement::Shard(other),
        )
        .await
        .expect("start the child");
    assert!(started.created);
    assert_eq!((started.shard, started.child_id.shard()), (other, Some(other)));
    let again = c
        .start_child(
            p,
            &child_name,
            "c-1",
            json!({"n": 1}),
            ChildPlacement::Distributed,
        )
        .await
        .expect("again");
    assert_eq!(
        (again.child_id, again.created),
        (started.child_id, false),
        "a retried spawn is the same child"
    );
    let child = started.child_id;
    let t0 = Instant::now();
    eventually("the relay started the child", || {
        let c = c.clone();
        async move { matches!(c.get_execution(child).await, Ok(Some(e)) if e.state == ExecutionState::Running) }
    })
    .await;
    let started_after = t0.elapsed();
    c.complete_execution(child, json!({"answer": 42}))
        .await
        .expect("the child completes");
    eventually("the parent has the child's end", || async move {
        !events(p, "ChildCompleted").await.is_empty()
    })
    .await;
    // Give a duplicate every chance to show up.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ended = events(p, "ChildCompleted").await;
    assert_eq!(ended.len(), 1, "exactly once: {ended:?}");
    assert_eq!(ended[0]["result"]["answer"], 42);
    assert_eq!(ended[0]["child_id"], child.as_uuid().to_string());
    let kids = c.children(p).await.expect("children");
    assert_eq!(kids.items.len(), 1);
    assert_eq!(
        (kids.items[0].shard, kids.items[0].state),
        (other, Some(ExecutionState::Completed))
    );
    // Its lifecycle row settled (other tests' rows may be in the backlog).
    let db = connect(fleet().get(p.route(fleet())).expect("a shard")).await;
    let left: i64 = db
        .query_one(
            "SELECT count(*) FROM sheaf.cross_shard_children WHERE child_id = $1",
            &[&child.as_uuid()],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(left, 0);
    let backlog = c
        .admin()
        .relay_backlog(p.shard().expect("a shard"))
        .await
        .expect("backlog");
    assert!(backlog.iter().all(|b| b.rows > 0), "{backlog:?}");
    eprintln!("cross-shard child running {started_after:?} after the spawn");
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_parents_end_reaches_its_children_on_every_shard() {
    let c = client();
    let r = relay(&c);
    let name = unique("closing");
    let p = parent(&c, &name).await;
    let child_name = unique("kid");
    let mut kids = Vec::new();
    for (n, shard) in fleet().shards().map(|s| s.id).enumerate() {
        let close = if n == 2 {
            ParentClose::RequestCancel
        } else {
            ParentClose::Terminate
        };
        let k = c
            .start_child(
                p,
                &child_name,
                &format!("k-{n}"),
                json!({}),
                ChildOptions::from(ChildPlacement::Shard(shard)).parent_close(close),
            )
            .await
            .expect("start a child");
        kids.push((k.child_id, close));
    }
    let abandoned = c
        .start_child(
            p,
            &child_name,
            "abandoned",
            json!({}),
            ChildOptions::from(ChildPlacement::Shard(
                fleet().shards().nth(1).expect("a shard").id,
            ))
            .parent_close(ParentClose::Abandon),
        )
        .await
        .expect("an abandoned child")
        .child_id;
    // Running before its parent ends: its row then settles with nothing to deliver.
    eventually("the abandoned child runs before its parent ends", || {
        let c = c.clone();
        async move {
            matches!(c.get_execution(abandoned).await, Ok(Some(e)) if e.state == ExecutionState::Running)
        }
    })
    .await;
    c.complete_execution(p, json!(null))
        .await
        .expect("the parent ends");
    for (kid, close) in kids {
        let want = match close {
            ParentClose::RequestCancel => ExecutionState::Cancelled,
            _ => ExecutionState::Terminated,
        };
        eventually("the child is closed", || {
            let c = c.clone();
            async move { matches!(c.get_execution(kid).await, Ok(Some(e)) if e.state == want) }
        })
        .await;
    }
    eventually("the abandoned child runs", || {
        let c = c.clone();
        async move {
            matches!(c.get_execution(abandoned).await, Ok(Some(e)) if e.state == ExecutionState::Running)
        }
    })
    .await;
    eventually("every lifecycle row settled", || async move {
        let db = connect(fleet().get(p.route(fleet())).expect("a shard")).await;
        let n: i64 = db
            .query_one(
                "SELECT count(*) FROM sheaf.cross_shard_children WHERE parent_id = $1",
                &[&p.as_uuid()],
            )
            .await
            .expect("count")
            .get(0);
        n == 0
    })
    .await;
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_active_run_of_the_key_on_the_target_is_not_adopted() {
    let c = client();
    let r = relay(&c);
    let p = parent(&c, &unique("adopt")).await;
    let target = fleet().shards().nth(2).expect("three shards").id;
    let child_name = unique("taken");
    let existing = c
        .start_workflow(
            &child_name,
            "k",
            json!({}),
            StartOptions::new().placement(Placement::Shard(target)),
        )
        .await
        .expect("the existing run")
        .execution_id;
    let child = c
        .start_child(p, &child_name, "k", json!({}), ChildPlacement::Shard(target))
        .await
        .expect("spawn")
        .child_id;
    eventually("the parent learns the child failed", || async move {
        !events(p, "ChildFailed").await.is_empty()
    })
    .await;
    let failed = events(p, "ChildFailed").await;
    assert_eq!(failed[0]["child_id"], child.as_uuid().to_string());
    let why = failed[0]["error"].as_str().unwrap_or_default();
    assert!(why.contains(&existing.as_uuid().to_string()), "{why}");
    assert!(
        c.get_execution(child).await.expect("read").is_none(),
        "no second run"
    );
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn distributed_children_spread_and_a_tree_reads_every_shard() {
    let c = client();
    let r = relay(&c);
    let p = parent(&c, &unique("fan")).await;
    let child_name = unique("leaf");
    let mut per_shard = std::collections::BTreeMap::new();
    for i in 0..60 {
        let k = c
            .start_child(
                p,
                &child_name,
                &format!("l-{i}"),
                json!({"i": i}),
                ChildPlacement::Distributed,
            )
            .await
            .expect("spawn");
        *per_shard.entry(k.shard).or_insert(0) += 1;
    }
    assert_eq!(per_shard.len(), 3, "{per_shard:?}");
    assert!(per_shard.values().all(|n| *n >= 8), "roughly even: {per_shard:?}");
    eventually("all 60 started", || {
        let c = c.clone();
        async move {
            let kids = c.children(p).await.expect("children");
            kids.items.len() == 60
                && kids
                    .items
                    .iter()
                    .all(|k| k.state == Some(ExecutionState::Running))
        }
    })
    .await;
    let tree = c.tree(p).await.expect("tree");
    assert_eq!(tree.nodes.len(), 60);
    assert!(tree.nodes.iter().all(|n| n.parent == p && n.depth == 1));
    // A residency-pinned parent's default children stay home.
    let home = c
        .start_child(p, &child_name, "home", json!({}), ChildPlacement::ParentShard)
        .await
        .expect("spawn");
    assert_eq!(Some(home.shard), p.shard());
    c.admin()
        .terminate_execution(p, None)
        .await
        .expect("end the parent");
    r.shutdown().await;
}

/// Shards restored to different instants: a child whose parent's shard
/// lost its record of it is an orphan; its siblings are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_child_whose_parent_lost_its_record_is_an_orphan() {
    let c = client();
    let name = unique("restored");
    let p = parent(&c, &name).await;
    let child_name = unique("kid");
    let mut kids = Vec::new();
    for n in 0..2 {
        kids.push(
            c.start_child(
                p,
                &child_name,
                &format!("k-{n}"),
                json!({}),
                ChildPlacement::ParentShard,
            )
            .await
            .expect("a child")
            .child_id,
        );
    }
    let orphans = c.admin().orphan_children().await.expect("orphan_children");
    assert!(
        orphans.items.iter().all(|o| !kids.contains(&o.execution_id)),
        "{:?}",
        orphans.items
    );
    // The parent's shard "restored" to before the second child's start.
    let db = connect(fleet().get(p.route(fleet())).expect("a shard")).await;
    db.execute(
        "DELETE FROM sheaf.children WHERE child_id = $1",
        &[&kids[1].as_uuid()],
    )
    .await
    .expect("forget the child");
    let orphans = c.admin().orphan_children().await.expect("orphan_children");
    let mine: Vec<_> = orphans.items.iter().filter(|o| o.parent_id == p).collect();
    assert_eq!(mine.len(), 1, "{mine:?}");
    assert_eq!(
        (mine[0].execution_id, mine[0].workflow_id.as_str()),
        (kids[1], "k-1")
    );
    assert_eq!(orphans.status, sheaf_driver::PageStatus::Complete);
}
