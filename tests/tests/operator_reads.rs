//! The operator's reads across the live test shards (issue 19): a queue's
//! tasks in every state paged across three shards (every task once, ground
//! truth from the tables), dead letters newest first across shards, a task
//! and a dead letter read back by id, every queue with its counts, cursors
//! the listing refuses, and a shard that cannot answer (a partial page that
//! names it, the others exact).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::json;
use sheaf_driver::{
    Client, ClientError, EnqueueOptions, PageStatus, Placement, PoolOptions, ShardId, TaskId, TaskState,
    Topology, TopologyBuilder,
};
use sheaf_tests::{connect, fleet, unique};

fn client(topology: &Topology) -> Arc<Client> {
    let pools = PoolOptions::default().connect_timeout(Duration::from_secs(1));
    Arc::new(Client::new(topology.clone(), pools).expect("a client"))
}

fn on(shard: ShardId) -> EnqueueOptions {
    EnqueueOptions::new().placement(Placement::Shard(shard))
}

/// Every page of `list_tasks(queue, state)` of `size` rows: the ids in the
/// order listed, and the states.
async fn walk(c: &Client, queue: &str, state: Option<TaskState>, size: usize) -> Vec<(TaskId, TaskState)> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = c
            .admin()
            .list_tasks(queue, state, cursor.as_deref(), size)
            .await
            .expect("a page");
        assert_eq!(page.status, PageStatus::Complete);
        assert!(page.items.len() <= size);
        out.extend(page.items.iter().map(|t| (t.task_id, t.state)));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return out,
        }
    }
}

/// (task id, state) of every unfinished task of `queue`, from the tables.
async fn ground_truth(topology: &Topology, queue: &str) -> BTreeSet<(uuid::Uuid, String)> {
    let mut out = BTreeSet::new();
    for shard in topology.shards() {
        let db = connect(shard).await;
        for row in db
            .query("SELECT id, state FROM sheaf.tasks WHERE queue = $1", &[&queue])
            .await
            .expect("tasks")
        {
            out.insert((row.get(0), row.get(1)));
        }
    }
    out
}

/// A cursor of another listing, or one tampered with, is refused.
async fn refuses_foreign_cursors(c: &Client, queue: &str) {
    let page = c.admin().list_tasks(queue, None, None, 1).await.expect("a page");
    let cursor = page.next_cursor.expect("more pages");
    for (q, state, text) in [
        (queue, Some(TaskState::Ready), cursor.as_str()),
        ("another", None, cursor.as_str()),
        (queue, None, "s1.nonsense"),
    ] {
        assert!(
            matches!(
                c.admin().list_tasks(q, state, Some(text), 10).await,
                Err(ClientError::BadRequest(_))
            ),
            "{q} {state:?} {text}"
        );
    }
    assert!(matches!(
        c.admin().list_tasks(queue, None, None, 0).await,
        Err(ClientError::BadRequest(_))
    ));
}

#[tokio::test]
async fn tasks_page_across_shards_state_by_state_every_task_once() {
    let topology = fleet();
    let c = client(topology);
    let queue = unique("ops");
    let key = unique("ops-key");
    let shards: Vec<ShardId> = topology.shards().map(|s| s.id).collect();
    assert!(c.admin().set_concurrency_limit(&key, Some(1)).await.is_complete());
    let later = SystemTime::now() + Duration::from_secs(3600);
    for (i, &shard) in shards.iter().enumerate() {
        for p in 0..4 {
            c.enqueue(&queue, json!({"p": p}), on(shard).priority(p))
                .await
                .expect("ready");
        }
        c.enqueue(&queue, json!({}), on(shard).run_at(later))
            .await
            .expect("scheduled");
        for _ in 0..=i {
            c.enqueue(&queue, json!({}), on(shard).concurrency_key(&key))
                .await
                .expect("keyed");
        }
        let claimed = c
            .claim(shard, &queue, "ops-worker", 2, Duration::from_secs(300))
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 2);
    }
    let truth = ground_truth(topology, &queue).await;
    let all = walk(&c, &queue, None, 999).await;
    let listed: BTreeSet<(uuid::Uuid, String)> = all
        .iter()
        .map(|(id, s)| (id.as_uuid(), s.as_str().to_owned()))
        .collect();
    assert_eq!(listed.len(), all.len(), "no task twice");
    assert_eq!(listed, truth, "every task, in its state");
    let states: Vec<TaskState> = all.iter().map(|(_, s)| *s).collect();
    let mut sorted = states.clone();
    let order = [
        TaskState::Running,
        TaskState::Ready,
        TaskState::Scheduled,
        TaskState::Waiting,
        TaskState::Paused,
    ];
    sorted.sort_by_key(|s| order.iter().position(|o| o == s));
    assert_eq!(states, sorted, "state by state");
    for size in [1, 2, 5] {
        assert_eq!(walk(&c, &queue, None, size).await, all, "pages of {size}");
    }
    let waiting = walk(&c, &queue, Some(TaskState::Waiting), 2).await;
    assert!(waiting.iter().all(|(_, s)| *s == TaskState::Waiting));
    assert_eq!(
        waiting.len(),
        truth.iter().filter(|(_, s)| s == "waiting").count()
    );

    // One task read back by id, from its own shard.
    let (first, _) = all[0];
    let task = c.get_task(first).await.expect("get_task");
    assert_eq!((task.task_id, task.state.as_str()), (first, "running"));
    assert_eq!(task.lease_owner.as_deref(), Some("ops-worker"));

    // Counts per queue, per shard and in total.
    let queues = c.admin().list_queues().await;
    assert_eq!(queues.status, PageStatus::Complete);
    let mine = queues
        .queues
        .iter()
        .find(|q| q.queue == queue)
        .expect("the queue is listed");
    assert_eq!(mine.per_shard.len(), shards.len());
    assert_eq!(mine.total.running, 2 * shards.len() as i64);
    assert_eq!(mine.total.scheduled, shards.len() as i64);
    let total = mine.total.ready + mine.total.running + mine.total.scheduled + mine.total.waiting;
    assert_eq!(total as usize, truth.len());

    refuses_foreign_cursors(&c, &queue).await;
}

#[tokio::test]
async fn dead_letters_list_newest_first_across_shards_and_a_missing_shard_is_named() {
    let topology = fleet();
    let c = client(topology);
    let queue = unique("ops-dead");
    let shards: Vec<ShardId> = topology.shards().map(|s| s.id).collect();
    let mut dead = Vec::new();
    for round in 0..2 {
        for &shard in &shards {
            let t = c
                .enqueue(&queue, json!({"round": round}), on(shard).max_attempts(1))
                .await
                .expect("enqueue");
            let claimed = c
                .claim(shard, &queue, "ops-worker", 1, Duration::from_secs(60))
                .await
                .expect("claim");
            assert_eq!(claimed[0].task_id, t.task_id);
            c.fail(t.task_id, claimed[0].token, "ops: boom", None)
                .await
                .expect("fail");
            dead.push(t.task_id);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let mut listed = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = c
            .admin()
            .list_dead_letters(Some(&queue), cursor.as_deref(), 2)
            .await
            .expect("a page");
        listed.extend(page.items.iter().map(|d| d.task_id));
        assert!(
            page.items
                .iter()
                .all(|d| d.last_error.as_deref() == Some("ops: boom"))
        );
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let newest_first: Vec<TaskId> = dead.iter().rev().copied().collect();
    assert_eq!(listed, newest_first);
    let letter = c.get_task(dead[0]).await.expect("a dead letter reads back");
    assert_eq!(letter.state, "dead");
    assert_eq!(letter.payload, json!({"round": 0}));
    assert!(letter.dead_at.is_some());

    // A shard that cannot answer: named, and the others' rows exact.
    let spec: Vec<String> = topology.shards().map(|s| format!("{}={}", s.id, s.url)).collect();
    let with_dead = TopologyBuilder::from_spec(&spec.join(","))
        .map(|b| b.shard(9, "postgres://postgres@127.0.0.1:1/sheaf"))
        .and_then(|b| b.build())
        .expect("a topology with a shard that is not there");
    let partial = client(&with_dead);
    let page = partial
        .admin()
        .list_dead_letters(Some(&queue), None, 100)
        .await
        .expect("a partial page");
    assert_eq!(page.status, PageStatus::Partial);
    assert_eq!(
        page.unavailable_shards
            .keys()
            .map(|s| s.get())
            .collect::<Vec<_>>(),
        [9]
    );
    assert_eq!(
        page.items.iter().map(|d| d.task_id).collect::<Vec<_>>(),
        newest_first
    );
    let queues = partial.admin().list_queues().await;
    assert_eq!(queues.status, PageStatus::Partial);
}
