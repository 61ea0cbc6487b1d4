//! A tour of the whole typed surface: every `Client` method, once, against
//! the shards in `SHEAF_SHARDS`, checking what each returns. It exits
//! non-zero at the first answer that is not what sheaf promises, so
//! `scripts/test` runs it after the integration tests.
//!
//! `SHEAF_SHARDS=... cargo run -p sheaf-driver --example tour`
//! (`scripts/shards up` prints the list). It needs two shards or more, and
//! writes only names that start with `tour-<pid>`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::TryStreamExt;
use serde_json::json;
use sheaf_driver::protocol::{ChildStart, CloseKind, OutboxOutcome, RelayOutcome, ReportStatus, Steps};
use sheaf_driver::{
    Acquired, Client, ClientError, EnqueueOptions, ExecutionState, Json, LockOptions, MutexKey, OnShard,
    Placement, PoolOptions, QueueOptions, Resolution, ShardId, StartOptions, TaskKind, Topology,
};
use sheaf_driver::{AttrOp, ExecutionFilter, GroupBy, PageStatus, SortOrder};
use sheaf_driver::{ByKey, ChildPlacement};
use sheaf_driver::{FleetConfig, config_drift};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Fails the tour with a message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+).into());
        }
    };
}

struct Tour {
    client: Arc<Client>,
    shards: Vec<ShardId>,
    prefix: String,
}

impl Tour {
    fn name(&self, what: &str) -> String {
        format!("{}-{what}", self.prefix)
    }
}

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("tour: FAILED: {e}");
        std::process::exit(1);
    }
    println!("tour: every typed method answered as documented");
}

async fn run() -> Result<(), Error> {
    let spec = std::env::var("SHEAF_SHARDS").map_err(|_| "set SHEAF_SHARDS (scripts/shards up prints it)")?;
    let topology = Topology::parse(&spec)?;
    let client = Arc::new(Client::new(topology.clone(), PoolOptions::default())?);
    let shards: Vec<ShardId> = topology.shards().map(|s| s.id).collect();
    ensure!(
        shards.len() >= 2,
        "the tour needs two shards or more, got {}",
        shards.len()
    );
    let tour = Tour {
        client,
        shards,
        prefix: format!("tour-{}", std::process::id()),
    };
    println!("tour: {} shards", tour.shards.len());
    shard_housekeeping(&tour).await?;
    tasks(&tour).await?;
    batches_and_dead_letters(&tour).await?;
    operator_surface(&tour).await?;
    task_outcomes(&tour).await?;
    executions(&tour).await?;
    lifecycle_and_history(&tour).await?;
    children_and_relay(&tour).await?;
    by_key(&tour).await?;
    fleet_policies(&tour).await?;
    fleet_admin(&tour).await?;
    fleet_reads(&tour).await?;
    mutex(&tour).await?;
    in_transaction(&tour).await?;
    Ok(())
}

async fn shard_housekeeping(t: &Tour) -> Result<(), Error> {
    let c = &t.client;
    let status = c.admin().topology_status(Duration::from_secs(5)).await;
    ensure!(
        status.shards.iter().all(|s| s.probe.reachable),
        "a shard is unreachable: {status:?}"
    );
    for &shard in &t.shards {
        let info = c.admin().shard_info(shard).await?;
        ensure!(info.matches(), "shard {shard} reports id {}", info.reported_id);
        c.admin().init_shard(shard).await?; // idempotent for its own id
        let reaped = c.admin().reap_expired(shard, 100).await?;
        let reclaimed = c.admin().mutex_reclaim(shard, 100).await?;
        let report = c.admin().maintain(shard).await?;
        ensure!(report.is_object(), "maintain returned {report}");
        println!(
            "  shard {shard}: sheaf {}, reaped {reaped}, reclaimed {reclaimed}",
            info.version
        );
    }
    let worker = t.name("worker");
    let queues = [t.name("q")];
    c.protocol()
        .worker_heartbeat(t.shards[0], &worker, &queues)
        .await?;
    let live = c.admin().live_workers().await.into_result()?;
    ensure!(
        live[&t.shards[0]].iter().any(|w| w.worker == worker),
        "the heartbeat is not live"
    );
    ensure!(
        c.protocol().worker_deregister(t.shards[0], &worker).await?,
        "deregister found no worker"
    );
    ensure!(
        c.metrics_text().contains("sheaf_shard_requests_total"),
        "no request metrics"
    );
    println!("  status, shard_info, init_shard, reap_expired, mutex_reclaim, maintain, registry: ok");
    Ok(())
}

async fn tasks(t: &Tour) -> Result<(), Error> {
    let c = &t.client;
    let queue = t.name("tasks");
    let shard = t.shards[0];
    let pin = EnqueueOptions::new().placement(Placement::Shard(shard));
    let exact = Json::parse(r#"{"amount": 1.50}"#)?;
    let one = c.enqueue(&queue, exact.clone(), pin.clone().priority(5)).await?;
    ensure!(
        one.shard == shard && one.task_id.shard() == Some(shard),
        "enqueue placed {one:?}"
    );
    let two = c.enqueue(&queue, json!({"n": 2}), pin.clone()).await?;
    let three = c.enqueue(&queue, json!({"n": 3}), pin).await?;
    let claimed = c.claim(shard, &queue, "tour", 3, Duration::from_secs(30)).await?;
    ensure!(claimed.len() == 3, "claimed {}", claimed.len());
    ensure!(claimed[0].task_id == one.task_id, "priority 5 first");
    ensure!(
        claimed[0].payload == exact,
        "payload came back as {}",
        claimed[0].payload
    );
    ensure!(
        claimed[0].kind == TaskKind::Activity,
        "kind {:?}",
        claimed[0].kind
    );
    let lease_end = c.heartbeat(one.task_id, claimed[0].token).await?;
    ensure!(
        lease_end > SystemTime::now(),
        "heartbeat returned a past lease end"
    );
    c.complete(one.task_id, claimed[0].token, Some(json!({"ok": true}).into()))
        .await?;
    c.release(two.task_id, claimed[1].token).await?;
    let failed = c
        .fail(
            three.task_id,
            claimed[2].token,
            "tour failure",
            Some(Duration::from_secs(60)),
        )
        .await?;
    ensure!(
        !failed.dead_lettered && failed.retry_at.is_some(),
        "fail: {failed:?}"
    );
    match c.complete(one.task_id, claimed[0].token, None).await {
        Err(ClientError::UnknownTask { .. }) => {}
        other => return Err(format!("completing a finished task: {other:?}").into()),
    }
    let stats = c.admin().queue_stats(&queue).await.into_result()?;
    let s = stats[&shard];
    ensure!(
        (s.ready, s.scheduled, s.running) == (1, 1, 0),
        "queue_stats {s:?}"
    );
    println!("  enqueue, claim, heartbeat, complete, release, fail, queue_stats: ok");
    Ok(())
}

async fn batches_and_dead_letters(t: &Tour) -> Result<(), Error> {
    let c = &t.client;
    let queue = t.name("batch");
    let mut dead = Vec::new();
    for &shard in &t.shards[..2] {
        let options = EnqueueOptions::new()
            .max_attempts(1)
            .placement(Placement::Shard(shard));
        let batch = c
            .enqueue_batch(&queue, (0..3).map(|i| json!({ "i": i })), options)
            .await?;
        ensure!(
            batch.task_ids.len() == 3 && batch.shard == shard,
            "enqueue_batch {batch:?}"
        );
        let claimed = c.claim(shard, &queue, "tour", 3, Duration::from_secs(30)).await?;
        let ids: Vec<_> = claimed.iter().map(|k| k.task_id).collect();
        ensure!(ids == batch.task_ids, "a batch claims in order");
        let entries: Vec<_> = claimed[..2].iter().map(|k| (k.task_id, k.token)).collect();
        let done = c.complete_batch(&entries).await?;
        ensure!(
            done.values().all(|&ok| ok) && done.len() == 2,
            "complete_batch {done:?}"
        );
        let last = &claimed[2];
        ensure!(
            c.fail(last.task_id, last.token, "no more", None)
                .await?
                .dead_lettered,
            "not dead-lettered"
        );
        dead.push(last.task_id);
    }
    let report = c.admin().redrive(&dead).await;
    ensure!(report.is_complete() && report.total() == 2, "redrive {report:?}");
    ensure!(
        c.admin().queue_stats(&queue).await.total().ready == 2,
        "the redriven tasks are ready"
    );
    println!("  enqueue_batch, complete_batch, redrive (per shard): ok");
    Ok(())
}

/// The operator's reads and actions on one shard's queue, and retention.
async fn operator_surface(t: &Tour) -> Result<(), Error> {
    let c = &t.client;
    let shard = t.shards[0];
    let queue = t.name("ops");
    let on = || EnqueueOptions::new().placement(Placement::Shard(shard));
    let waiting = c.enqueue(&queue, json!({"n": 1}), on()).await?;
    let running = c.enqueue(&queue, json!({"n": 2}), on().priority(5)).await?;
    let claimed = c.claim(shard, &queue, "tour", 1, Duration::from_secs(30)).await?;
    ensure!(claimed[0].task_id == running.task_id, "the higher priority first");
    c.set_progress(running.task_id, claimed[0].token, json!({"done": 1}))
        .await?;
    let info = c.get_task(running.task_id).await?;
    ensure!(
        info.state == "running" && info.progress == Some(json!({"done": 1})),
        "get_task {info:?}"
    );
    let page = c.admin().list_tasks(&queue, None, None, 10).await?;
    ensure!(
        page.items.len() == 2 && page.next_cursor.is_none(),
        "list_tasks {page:?}"
    );
    ensure!(c.cancel_task(running.task_id, Some("tour")).await?, "cancel_task");
    ensure!(
        matches!(
            c.heartbeat(running.task_id, claimed[0].token).await,
            Err(ClientError::TaskCancelled { .. })
        ),
        "the holder of a cancelled task is told"
    );
    c.release(running.task_id, claimed[0].token).await?;
    // The other one to the dead letters, then back, then purged.
    let again = c.claim(shard, &queue, "tour", 1, Duration::from_secs(30)).await?;
    ensure!(again[0].task_id == waiting.task_id, "the other task");
    c.dead_letter(waiting.task_id, again[0].token, "tour: hopeless")
        .await?;
    let dead = c.admin().list_dead_letters(Some(&queue), None, 10).await?;
    ensure!(dead.items.len() == 1, "list_dead_letters {dead:?}");
    let moved = c.admin().redrive_queue(&queue, Duration::ZERO, 10).await?;
    ensure!(moved.total() == 1, "redrive_queue {moved:?}");
    let back = c.claim(shard, &queue, "tour", 1, Duration::from_secs(30)).await?;
    c.dead_letter(back[0].task_id, back[0].token, "tour: hopeless")
        .await?;
    let purged = c.admin().purge_dead_letters(&queue, Duration::ZERO).await?;
    ensure!(purged.total() == 1, "purge_dead_letters {purged:?}");
    let queues = c.admin().list_queues().await;
    ensure!(
        queues
            .queues
            .iter()
            .any(|q| q.queue == queue && q.total.dead == 0),
        "list_queues"
    );
    let dropped = c.admin().drop_queue(&queue, false).await;
    ensure!(
        dropped.is_complete() && dropped.total() == 0,
        "drop_queue {dropped:?}"
    );
    ensure!(c.admin().sample_queues().await.is_empty(), "sample_queues");
    // Retention read, and written back unchanged.
    let policies = c.admin().retention().await;
    ensure!(policies.is_complete(), "retention {policies:?}");
    for (shard, policy) in policies.ok {
        let on_one = Client::new(
            Topology::parse(&format!(
                "{shard}={}",
                c.topology().get(shard).ok_or("a shard")?.url
            ))?,
            PoolOptions::default(),
        )?;
        let set = on_one.admin().set_retention(policy.clone()).await;
        ensure!(set.ok.get(&shard) == Some(&policy), "set_retention {set:?}");
    }
    println!(
        "  get_task, list_tasks, set_progress, cancel_task, list_dead_letters, redrive_queue, \
         purge_dead_letters, list_queues, drop_queue, sample_queues, retention, set_retention: ok"
    );
    Ok(())
}

async fn task_outcomes(t: &Tour) -> Result<(), Error> {
    let c = &t.client;
    let (queue, shard, lease) = (t.name("outcomes"), t.shards[0], Duration::from_secs(30));
    let pin = EnqueueOptions::new().placement(Placement::Shard(shard));
    let a = c.enqueue(&queue, json!({}), pin.clone()).await?;
    let b = c.enqueue(&queue, json!({}), pin).await?;
    let claimed = c.claim(shard, &queue, "tour", 2, lease).await?;
    ensure!(
        claimed.len() == 2 && claimed[0].task_id == a.task_id,
        "claimed {claimed:?}"
    );
    let at = c
        .snooze(a.task_id, claimed[0].token, Duration::from_secs(60))
        .await?;
    ensure!(at > SystemTime::now(), "snoozed into the past");
    c.dead_letter(b.task_id, claimed[1].token, "no retry can fix this")
        .await?;
    let s = c.admin().queue_stats(&queue).await.into_result()?[&shard];
    ensure!(
        (s.scheduled, s.dead, s.running) == (1, 1, 0),
        "after snooze and dead_letter: {s:?}"
    );
    let wq = t.name("wfq");
    let name = t.name("ends");
    let opts = StartOptions::new()
        .placement(Placement::Shard(shard))
        .queue(wq.clone());
    let done = c.start_workflow(&name, "ok", json!({}), opts.clone()).await?;
    let failed = c.start_workflow(&name, "bad", json!({}), opts).await?;
    let tasks = c.claim(shard, &wq, "tour", 2, lease).await?;
    ensure!(
        tasks.len() == 2 && tasks.iter().all(|k| k.kind == TaskKind::Workflow),
        "workflow tasks"
    );
    for task in &tasks {
        if task.execution_id == Some(done.execution_id) {
            c.complete_task_and_execution(task.task_id, task.token, json!({"r": 1}))
                .await?;
        } else {
            c.complete_task_and_fail_execution(task.task_id, task.token, "tour")
                .await?;
        }
    }
    let state = |id| async move { c.get_execution(id).await.map(|e| e.map(|e| e.state)) };
    ensure!(
        state(done.execution_id).await? == Some(ExecutionState::Completed),
        "completed with its task"
    );
    ensure!(
        state(failed.execution_id).await? == Some(ExecutionState::Failed),
        "failed with its task"
    );
    println!("  snooze, dead_letter, complete_task_and_execution, complete_task_and_fail_execution: ok");
    Ok(())
}

async fn executions(t: &Tour) -> Result<(), Error> {
    let c = &t.client;
    let name = t.name("wf");
    let opts = StartOptions::new().placement(Placement::RoutingKey(t.name("rk")));
    let s = c
        .start_workflow(&name, "a", json!({"x": 1}), opts.clone())
        .await?;
    ensure!(s.created, "the first start creates");
    let again = c.start_workflow(&name, "a", json!({}), opts.clone()).await?;
    ensure!(
        !again.created && again.execution_id == s.execution_id,
        "a second start attaches"
    );
    let Resolution::Found { execution: found, .. } = c.find_execution(&name, "a").await? else {
        return Err("find_execution did not find it".into());
    };
    ensure!(
        found.execution_id == s.execution_id,
        "find_execution found another"
    );
    attrs_and_usage(t, s.execution_id).await?;
    let e = c
        .get_execution(s.execution_id)
        .await?
        .ok_or("get_execution found nothing")?;
    ensure!(e.state == ExecutionState::Running, "state {:?}", e.state);
    ensure!(
        s.execution_id.timestamp().is_some(),
        "an id carries its mint time"
    );
    ensure!(
        c.complete_execution(s.execution_id, json!({"done": 1})).await?,
        "complete_execution"
    );
    let b = c.start_workflow(&name, "b", json!({}), opts.clone()).await?;
    ensure!(c.fail_execution(b.execution_id, "tour").await?, "fail_execution");
    let d = c.start_workflow(&name, "d", json!({}), opts).await?;
    ensure!(
        c.cancel_execution(d.execution_id, Some("tour")).await?,
        "cancel_execution"
    );
    ensure!(
        !c.cancel_execution(d.execution_id, None).await?,
        "a second cancel changes nothing"
    );
    println!(
        "  start_workflow, find_execution, upsert_search_attrs, list_executions, signal, record_usage, usage_report, get_execution, complete/fail/cancel_execution: ok"
    );
    Ok(())
}

async fn lifecycle_and_history(t: &Tour) -> Result<(), Error> {
    let c = &t.client;
    let s = c
        .start_workflow(&t.name("life"), "a", json!({}), StartOptions::new())
        .await?;
    let id = s.execution_id;
    ensure!(
        c.admin().pause_execution(id).await? && !c.admin().pause_execution(id).await?,
        "pause once"
    );
    ensure!(
        c.admin().resume_execution(id).await? && !c.admin().resume_execution(id).await?,
        "resume once"
    );
    let later = SystemTime::now() + Duration::from_secs(3600);
    ensure!(c.suspend_execution(id, Some(later)).await?, "suspend");
    ensure!(
        c.wake_execution(id).await? && !c.wake_execution(id).await?,
        "wake once"
    );
    for i in 0..12 {
        c.append_event(id, "TourStep", json!({ "i": i })).await?;
    }
    let first = c.history(id, 0, 5).await?;
    ensure!(
        first.events.len() == 5 && first.next_after == Some(5),
        "first page {:?}",
        first.next_after
    );
    let all: Vec<_> = c.history_stream(id, 5).try_collect().await?;
    let seqs: Vec<i64> = all.iter().map(|e| e.seq).collect();
    ensure!(
        seqs == (1..=seqs.len() as i64).collect::<Vec<_>>(),
        "history seqs {seqs:?}"
    );
    ensure!(
        all.iter().filter(|e| e.event_type == "TourStep").count() == 12,
        "12 steps in the history"
    );
    ensure!(
        c.admin().terminate_execution(id, Some("tour")).await?,
        "terminate"
    );
    match c.append_event(id, "Late", json!({})).await {
        Err(ClientError::WrongState { .. }) => {}
        other => return Err(format!("an append to an ended execution: {other:?}").into()),
    }
    println!("  pause/resume/suspend/wake/terminate, append_event, history pages and stream: ok");
    Ok(())
}

/// Children across shards, driven by hand through the relay's primitives.
async fn children_and_relay(t: &Tour) -> Result<(), Error> {
    let c = &t.client;
    let (home, away) = (t.shards[0], t.shards[1]);
    let parent = c
        .start_workflow(
            &t.name("parent"),
            "p",
            json!({}),
            StartOptions::new().placement(Placement::Shard(home)),
        )
        .await?
        .execution_id;
    let kid = c
        .start_child(
            parent,
            &t.name("kid"),
            "k",
            json!({}),
            ChildPlacement::Shard(away),
        )
        .await?;
    ensure!(kid.created && kid.shard == away, "a child elsewhere: {kid:?}");
    let local = c
        .start_child(
            parent,
            &t.name("kid"),
            "local",
            json!({}),
            ChildPlacement::ParentShard,
        )
        .await?;
    ensure!(local.shard == home, "a child at home");
    ensure!(
        c.admin()
            .relay_backlog(home)
            .await?
            .iter()
            .any(|b| !b.started && b.target_shard == away),
        "the lifecycle row in the backlog"
    );
    relay_by_hand(c, home, parent, kid.child_id).await?;
    let kids = c.children(parent).await?;
    ensure!(kids.items.len() == 2, "two children: {:?}", kids.items);
    let tree = c.tree(parent).await?;
    ensure!(
        tree.nodes.len() == 2 && tree.status == PageStatus::Complete,
        "the tree"
    );
    ensure!(
        c.cancel_child(parent, local.child_id, Some("tour")).await?,
        "a local cancel"
    );
    let orphans = c.admin().orphan_children().await?;
    ensure!(
        orphans.items.iter().all(|o| o.parent_id != parent),
        "no orphan of the tour's parent"
    );
    println!(
        "  start_child, relay_take/start_child/report/close_child, backlog, children, tree, cancel_child, orphan_children: ok"
    );
    Ok(())
}

/// One lifecycle row through its start and close edges, as the relay drives it.
async fn relay_by_hand(
    c: &Client,
    home: ShardId,
    parent: sheaf_driver::ExecutionId,
    child: sheaf_driver::ExecutionId,
) -> Result<(), Error> {
    let rows = c
        .protocol()
        .relay_take(home, 10, Duration::from_secs(30), Some(&[child]))
        .await?;
    let row = rows.first().ok_or("the named row taken")?;
    let input = row.input.clone().unwrap_or_else(Json::null);
    ensure!(
        c.protocol()
            .relay_start_child(child, parent, &row.workflow_name, &row.workflow_id, &input)
            .await?
            == ChildStart::Started,
        "started by its id"
    );
    ensure!(
        c.protocol()
            .relay_report(home, child, row.lease_token, &RelayOutcome::Started)
            .await?
            == ReportStatus::Held,
        "the start recorded"
    );
    ensure!(
        c.protocol()
            .relay_close_child(child, parent, CloseKind::Cancel, Some("tour"))
            .await?,
        "closed on its shard"
    );
    Ok(())
}

/// Signals and cancels addressed by business key.
async fn by_key(t: &Tour) -> Result<(), Error> {
    let c = &t.client;
    let target = c
        .start_workflow(
            &t.name("keyed"),
            "k",
            json!({}),
            StartOptions::new().placement(Placement::Shard(t.shards[1])),
        )
        .await?
        .execution_id;
    match c
        .signal_by_key(&t.name("keyed"), "k", "hello", json!(1), None)
        .await?
    {
        ByKey::Delivered {
            execution_id,
            complete: true,
            ..
        } if execution_id == target => {}
        other => return Err(format!("signal_by_key: {other:?}").into()),
    }
    let sender = c
        .start_workflow(
            &t.name("sender"),
            "s",
            json!({}),
            StartOptions::new().placement(Placement::Shard(t.shards[0])),
        )
        .await?
        .execution_id;
    let outbox = c
        .signal_external(sender, &t.name("keyed"), "k", "hi", json!(2), Some("tour-1"))
        .await?;
    ensure!(
        c.signal_external(sender, &t.name("keyed"), "k", "hi", json!(2), Some("tour-1"))
            .await?
            == outbox,
        "deduplicated by signal id"
    );
    c.cancel_external(sender, &t.name("nobody"), "k", Some("tour"), None)
        .await?;
    deliver_outbox(c, t.shards[0], sender).await?;
    match c.cancel_by_key(&t.name("keyed"), "k", Some("tour")).await? {
        ByKey::Delivered { execution_id, .. } if execution_id == target => {}
        other => return Err(format!("cancel_by_key: {other:?}").into()),
    }
    ensure!(
        matches!(
            c.cancel_by_key(&t.name("keyed"), "k", None).await?,
            ByKey::Ended { .. }
        ),
        "an ended key"
    );
    println!(
        "  signal_by_key, cancel_by_key, signal_external, cancel_external, outbox_take/report/backlog: ok"
    );
    Ok(())
}

/// Delivers `sender`'s outbox rows on `shard` by hand, as a relay does.
async fn deliver_outbox(c: &Client, shard: ShardId, sender: sheaf_driver::ExecutionId) -> Result<(), Error> {
    ensure!(
        c.admin()
            .outbox_backlog(shard)
            .await?
            .iter()
            .map(|b| b.rows)
            .sum::<i64>()
            >= 2,
        "two rows to deliver"
    );
    let steps = c.protocol();
    for row in steps.outbox_take(shard, 1000, Duration::from_secs(30)).await? {
        if row.sender == sender {
            let status = steps
                .outbox_report(shard, row.outbox_id, row.lease_token, &OutboxOutcome::Unknown)
                .await?;
            ensure!(status == ReportStatus::Settled, "reported: {status:?}");
        }
    }
    Ok(())
}

/// One configuration for the fleet, the audit log, readiness and the
/// published topology (read only: publishing would bind the shared shards).
async fn fleet_admin(t: &Tour) -> Result<(), Error> {
    let c = &t.client;
    let key = t.name("admin-cap");
    let config = FleetConfig::parse(&json!({"caps": {key.clone(): 2}}).to_string())?;
    let applied = c.admin().apply_config(&config).await;
    ensure!(applied.is_complete(), "apply_config: {:?}", applied.failed);
    let held = c.admin().fleet_config().await;
    ensure!(
        held.ok.values().all(|cfg| cfg.caps.get(&key) == Some(&Some(2))),
        "the cap on every shard"
    );
    let _ = config_drift(&held);
    let audit = c.admin().fleet_audit_log(50).await;
    ensure!(
        audit
            .ok
            .values()
            .all(|entries| entries.iter().any(|e| e.target.as_deref() == Some(key.as_str()))),
        "the cap in every audit log"
    );
    let one = c.admin().audit_log(t.shards[0], None, 1).await?;
    ensure!(one.len() == 1, "one entry");
    let verdicts = c.admin().shard_health(None, Duration::from_secs(5)).await;
    ensure!(verdicts.len() == t.shards.len(), "a verdict per shard");
    let published = c.admin().published_topology().await;
    ensure!(
        published.is_complete(),
        "published_topology: {:?}",
        published.failed
    );
    let removed = c
        .admin()
        .apply_config(&FleetConfig::parse(&json!({"caps": {key: null}}).to_string())?)
        .await;
    ensure!(removed.is_complete(), "a cap removed");
    println!(
        "  apply_config, fleet_config, config_drift, audit_log, fleet_audit_log, shard_health, published_topology: ok"
    );
    Ok(())
}

async fn fleet_policies(t: &Tour) -> Result<(), Error> {
    let c = &t.client;
    let name = t.name("gated");
    let policy = json!({"concurrency": {"key": "input.tenant", "limit": 1, "on_conflict": "reject"},
                        "quota": {"key": "input.tenant", "max_active_executions": 5}});
    let report = c.admin().declare_workflow(&name, policy).await;
    ensure!(
        report.is_complete() && report.ok.len() == t.shards.len(),
        "declare_workflow {report:?}"
    );
    let opts = StartOptions::new().placement(Placement::Shard(t.shards[1]));
    c.start_workflow(&name, "1", json!({"tenant": "acme"}), opts.clone())
        .await?;
    match c
        .start_workflow(&name, "2", json!({"tenant": "acme"}), opts)
        .await
    {
        Err(ClientError::GateRejected { .. }) => {}
        other => return Err(format!("the gate let a second start in: {other:?}").into()),
    }
    let usage = c.admin().quota_usage("acme").await.into_result()?;
    ensure!(
        usage[&t.shards[1]].active_executions >= 1,
        "quota_usage {usage:?}"
    );
    let recount = c.admin().quota_recompute("acme").await.into_result()?;
    ensure!(recount == usage, "the counters drifted: {usage:?} vs {recount:?}");
    let key = t.name("cap");
    ensure!(
        c.admin().set_concurrency_limit(&key, Some(2)).await.is_complete(),
        "set_concurrency_limit"
    );
    let queue = t.name("configured");
    let configs = c
        .admin()
        .configure_queue(&queue, &QueueOptions::new().aging_secs(Some(10)))
        .await
        .into_result()?;
    ensure!(
        configs.values().all(|q| q.aging_secs == Some(10)),
        "configure_queue {configs:?}"
    );
    ensure!(
        c.admin()
            .configure_queue(&queue, &QueueOptions::new().aging_secs(None))
            .await
            .is_complete(),
        "aging off"
    );
    println!("  declare_workflow, set_concurrency_limit, configure_queue (every shard), quota: ok");
    Ok(())
}

/// Search attributes, a listing by one, a signal, and the usage report's
/// metered units.
async fn attrs_and_usage(t: &Tour, id: sheaf_driver::ExecutionId) -> Result<(), Error> {
    let c = &t.client;
    let tag = t.name("tag");
    let attrs = c.upsert_search_attrs(id, json!({ "tour": tag })).await?;
    ensure!(
        attrs.to_value()?["tour"] == json!(tag),
        "upsert_search_attrs: {attrs}"
    );
    let page = c
        .list_executions(
            &ExecutionFilter::new().attr("tour", AttrOp::Eq, tag.as_str()),
            None,
            10,
            SortOrder::Desc,
        )
        .await?;
    ensure!(
        page.items.len() == 1 && page.items[0].execution_id == id && page.status == PageStatus::Complete,
        "list_executions by attribute: {page:?}"
    );
    ensure!(
        c.signal(id, "tour", json!({"n": 1}), Some("tour-1")).await?
            && c.signal(id, "tour", json!({"n": 1}), Some("tour-1")).await?,
        "signal, and its retry, read as delivered"
    );
    c.record_usage(id, json!({"tour_calls": 2})).await?;
    let day = Duration::from_secs(86_400);
    let now = SystemTime::now();
    let usage = c
        .admin()
        .usage_report(now - day, now + day, &GroupBy::SearchAttr("tour".into()))
        .await?;
    let mine = usage
        .groups
        .get(&tag)
        .ok_or("usage_report: the tour's group is missing")?;
    ensure!(
        mine.metered.get("tour_calls").and_then(|n| n.as_i64()) == Some(2),
        "usage_report: {mine:?}"
    );
    Ok(())
}

async fn fleet_reads(t: &Tour) -> Result<(), Error> {
    let c = &t.client;
    let key = t.name("cap");
    let stats = c.admin().concurrency_stats().await.into_result()?;
    for (shard, keys) in &stats {
        let mine = keys
            .iter()
            .find(|k| k.concurrency_key == key)
            .ok_or("the cap is missing")?;
        ensure!(
            mine.max_running == Some(2),
            "shard {shard}: cap {:?}",
            mine.max_running
        );
    }
    let merged = c.admin().concurrency_report().await?;
    let caps = merged.groups.get(&key).map(|k| k.caps.len());
    ensure!(
        caps == Some(t.shards.len()),
        "concurrency_report: the cap on {caps:?} shards"
    );
    let stranded = c.admin().stranded_work().await.into_result()?;
    let queue = t.name("batch");
    let waiting: i64 = stranded
        .values()
        .flatten()
        .filter(|s| s.queue == queue)
        .map(|s| s.ready)
        .sum();
    ensure!(
        waiting == 2,
        "stranded_work sees {waiting} of the 2 redriven tasks"
    );
    ensure!(
        c.admin().set_concurrency_limit(&key, None).await.is_complete(),
        "cap removed"
    );
    println!("  concurrency_stats, concurrency_report, stranded_work, live_workers (fan-out): ok");
    Ok(())
}

async fn mutex(t: &Tour) -> Result<(), Error> {
    let c = &t.client;
    let key = MutexKey::new(t.name("deploy"));
    let (a, b) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let Acquired::Granted { token } = c.mutex_acquire(&key, a, Duration::from_secs(30)).await? else {
        return Err("a free mutex was not granted".into());
    };
    let queued = c.mutex_acquire(&key, b, Duration::from_secs(30)).await?;
    ensure!(
        queued == Acquired::Queued { position: 1 },
        "the second owner: {queued:?}"
    );
    c.mutex_renew(&key, a, token, Duration::from_secs(30)).await?;
    let status = c.mutex_status(&key).await?;
    ensure!(
        status.holder == Some(a) && status.waiters == 1,
        "mutex_status {status:?}"
    );
    // The operator's listing, paged to the tour's key.
    let mut cursor = None;
    let listed = loop {
        let page = c.admin().list_mutexes(cursor.as_deref(), 999).await?;
        if let Some(m) = page.items.iter().find(|m| m.key == key.key()) {
            break Some(m.clone());
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break None,
        }
    };
    ensure!(
        matches!(&listed, Some(m) if m.holder == a && m.token == token && m.waiters == 1
            && m.shard == c.mutex_shard(&key)),
        "list_mutexes {listed:?}"
    );
    ensure!(
        c.mutex_release(&key, a, token).await? == Some(b),
        "the lock passes to the waiter"
    );
    match c.mutex_release(&key, a, token).await {
        Err(ClientError::StaleToken { .. }) => {}
        other => return Err(format!("a stale release: {other:?}").into()),
    }
    let Acquired::Granted { token: next } = c.mutex_acquire(&key, b, Duration::from_secs(30)).await? else {
        return Err("the waiter was not granted".into());
    };
    ensure!(next > token, "fencing tokens increase");
    ensure!(
        c.try_lock(key.clone(), LockOptions::new(), Duration::from_millis(200))
            .await?
            .is_none(),
        "held"
    );
    c.mutex_release(&key, b, next).await?;
    let guard = c.lock(key.clone(), LockOptions::new()).await?;
    ensure!(guard.token() > next && !guard.is_lost(), "the guard's token");
    ensure!(guard.shard() == c.mutex_shard(&key), "the guard's shard");
    guard.release().await?;
    println!("  mutex_acquire/renew/status/release, list_mutexes, lock, try_lock, guard: ok");
    Ok(())
}

async fn in_transaction(t: &Tour) -> Result<(), Error> {
    let c = &t.client;
    let shard = t.shards[1];
    let queue = t.name("tx");
    let mut conn = c.shard_connection(shard).await?;
    let tx = conn.transaction().await?;
    let on = OnShard::verify(&tx, shard).await?;
    on.enqueue(&queue, json!({}), EnqueueOptions::new()).await?;
    on.enqueue_batch(&queue, [json!(1), json!(2)], EnqueueOptions::new())
        .await?;
    let s = on
        .start_workflow(&t.name("txwf"), "a", json!({}), StartOptions::new())
        .await?;
    tx.rollback().await?;
    ensure!(
        c.get_execution(s.execution_id).await?.is_none(),
        "a rolled-back start is gone"
    );
    let tx = conn.transaction().await?;
    let on = OnShard::verify(&tx, shard).await?;
    on.enqueue(&queue, json!({}), EnqueueOptions::new()).await?;
    tx.commit().await?;
    ensure!(
        c.admin().queue_stats(&queue).await.total().ready == 1,
        "one committed task"
    );
    let tx = conn.transaction().await?;
    let wrong = OnShard::verify(&tx, t.shards[0]).await;
    ensure!(
        matches!(wrong, Err(ClientError::WrongState { .. })),
        "a wrong shard was accepted"
    );
    tx.rollback().await?;
    println!(
        "  shard_connection, OnShard enqueue/enqueue_batch/start_workflow (rollback, commit, wrong shard): ok"
    );
    Ok(())
}
