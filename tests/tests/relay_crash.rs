//! Crash injection for the relay, on the suite's own three shards: relay
//! processes (`tests/src/bin/relay-process.rs`) are SIGKILLed at random
//! points of their sweeps and restarted, and one target shard is stopped and
//! started again, while parents on shard 0 spawn children on shards 1 and 2,
//! cancel some, and end early (their `parent_close` then closes the rest).
//! After the storm: every child exists exactly once on its target, each
//! parent's history has each child's end exactly once (none for a parent
//! that ended first), every cancel and parent_close reached its child, and
//! every lifecycle row settled.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sheaf_driver::{
    ChildOptions, ChildPlacement, Client, ExecutionId, ExecutionState, ParentClose, Placement, PoolOptions,
    ShardId, StartOptions, Topology,
};
use sheaf_tests::{Rng, connect};
use tokio::process::{Child, Command};

fn own(args: &[&str]) -> String {
    sheaf_tests::own_shards("relaycrash", 24500, args)
}

/// What the test does with a parent's children.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Each child completes; the parent stays running.
    Complete,
    /// The parent cancels each child.
    Cancel,
    /// The parent ends; its parent_close closes each child.
    ParentEnds,
}

const PARENTS_PER_PLAN: usize = 4;
const CHILDREN_PER_PARENT: usize = 6;
/// The storm goes on at least this long, whatever has ended.
const STORM: Duration = Duration::from_secs(15);

struct Relays {
    spec: String,
    running: Option<Child>,
    kills: u32,
}

impl Relays {
    fn spawn(&mut self) {
        self.running = Some(
            Command::new(env!("CARGO_BIN_EXE_relay-process"))
                .env("SHEAF_SHARDS", &self.spec)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("relay-process starts"),
        );
    }

    async fn kill(&mut self) {
        if let Some(mut c) = self.running.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
            self.kills += 1;
        }
    }
}

async fn ended(c: &Client, id: ExecutionId) -> Option<ExecutionState> {
    match c.get_execution(id).await {
        Ok(Some(e)) if !e.state.is_active() => Some(e.state),
        _ => None,
    }
}

type Children = BTreeMap<ExecutionId, (ExecutionId, Plan, ShardId, ParentClose)>;

/// Parents on `home`, each with children on `targets` (alternating).
async fn spawn_families(
    c: &Client,
    home: ShardId,
    targets: [ShardId; 2],
) -> (Vec<(ExecutionId, Plan)>, Children) {
    let run = std::process::id();
    let mut parents = Vec::new();
    let mut children = Children::new();
    for plan in [Plan::Complete, Plan::Cancel, Plan::ParentEnds] {
        for p in 0..PARENTS_PER_PLAN {
            let parent = c
                .start_workflow(
                    "crash-parent",
                    &format!("{run}-{plan:?}-{p}"),
                    json!({}),
                    StartOptions::new().placement(Placement::Shard(home)),
                )
                .await
                .expect("a parent")
                .execution_id;
            for k in 0..CHILDREN_PER_PARENT {
                let target = targets[k % 2];
                let close = if k % 3 == 0 {
                    ParentClose::RequestCancel
                } else {
                    ParentClose::Terminate
                };
                let child = c
                    .start_child(
                        parent,
                        "crash-child",
                        &format!("{run}-{plan:?}-{p}-{k}"),
                        json!({"k": k}),
                        ChildOptions::from(ChildPlacement::Shard(target)).parent_close(close),
                    )
                    .await
                    .expect("a child")
                    .child_id;
                children.insert(child, (parent, plan, target, close));
            }
            parents.push((parent, plan));
        }
    }
    (parents, children)
}

/// What a child's plan asks of it, once per pass: complete it when it
/// runs, or have its parent cancel it (once).
async fn act(c: &Client, children: &Children, cancelled: &mut Vec<ExecutionId>) {
    for (child, (parent, plan, _, _)) in children {
        match plan {
            Plan::Complete => {
                if let Ok(Some(e)) = c.get_execution(*child).await
                    && e.state == ExecutionState::Running
                {
                    let _ = c.complete_execution(*child, json!({"done": true})).await;
                }
            }
            Plan::Cancel
                if !cancelled.contains(child)
                    && c.cancel_child(*parent, *child, Some("the parent changed its mind"))
                        .await
                        .is_ok() =>
            {
                cancelled.push(*child);
            }
            _ => {}
        }
    }
}

/// The storm: a relay killed every few hundred milliseconds and restarted,
/// shard 2 stopped for 4 s, children acted on, early parents ended; for
/// `STORM` at least, and until every child has ended.
async fn storm(c: &Client, parents: &[(ExecutionId, Plan)], children: &Children, relays: &mut Relays) {
    let (mut rng, seed) = Rng::from_time();
    eprintln!("relay crash seed {seed}");
    let started = Instant::now();
    let mut stopped_at: Option<Instant> = None;
    let mut shard_restarted = false;
    let mut parents_ended = false;
    let mut cancelled = Vec::new();
    loop {
        tokio::time::sleep(Duration::from_millis(100 + rng.below(600))).await;
        relays.kill().await;
        relays.spawn();
        let elapsed = started.elapsed();
        if stopped_at.is_none() && elapsed > Duration::from_secs(2) {
            own(&["stop-one", "2"]);
            stopped_at = Some(Instant::now());
        }
        if !shard_restarted && stopped_at.is_some_and(|t| t.elapsed() > Duration::from_secs(4)) {
            own(&["start-one", "2"]);
            shard_restarted = true;
        }
        act(c, children, &mut cancelled).await;
        if !parents_ended && elapsed > Duration::from_secs(1) {
            for (parent, plan) in parents {
                if *plan == Plan::ParentEnds {
                    c.complete_execution(*parent, json!(null))
                        .await
                        .expect("a parent ends");
                }
            }
            parents_ended = true;
        }
        let mut all_ended = shard_restarted && elapsed > STORM;
        for child in children.keys() {
            if ended(c, *child).await.is_none() {
                all_ended = false;
                break;
            }
        }
        if all_ended {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "children still running after 120 s ({} relay kills)",
            relays.kills
        );
    }
}

/// Every child exactly once on its target and nowhere else; its end as its
/// plan asked, in its parent's history exactly once (none after the parent's end).
async fn check(c: &Client, topology: &Topology, children: &Children) {
    let home = topology.shards().next().expect("a shard");
    let db0 = connect(home).await;
    for (child, (parent, plan, target, close)) in children {
        for s in topology.shards() {
            let db = connect(s).await;
            let n: i64 = db
                .query_one(
                    "SELECT count(*) FROM sheaf.executions WHERE id = $1 OR \
                     (workflow_name, workflow_id) = (SELECT workflow_name, workflow_id FROM sheaf.executions WHERE id = $1)",
                    &[&child.as_uuid()],
                )
                .await
                .expect("count a child")
                .get(0);
            assert_eq!(n, i64::from(s.id == *target), "child {child} on shard {}", s.id);
        }
        let state = ended(c, *child).await.expect("every child ended");
        let want = match plan {
            Plan::Complete => ExecutionState::Completed,
            Plan::Cancel => ExecutionState::Cancelled,
            Plan::ParentEnds if *close == ParentClose::RequestCancel => ExecutionState::Cancelled,
            Plan::ParentEnds => ExecutionState::Terminated,
        };
        assert_eq!(state, want, "child {child} ({plan:?}, {close:?})");
        let rows = db0
            .query(
                "SELECT event_type FROM sheaf.events WHERE execution_id = $1 AND event_type LIKE 'Child%' \
                 AND event_type <> 'ChildStarted' AND payload->>'child_id' = $2",
                &[&parent.as_uuid(), &child.as_uuid().to_string()],
            )
            .await
            .expect("the parent's events");
        assert_eq!(
            rows.len(),
            usize::from(*plan != Plan::ParentEnds),
            "child {child} ({plan:?}): its end in its parent's history {} times",
            rows.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_relays_and_a_stopped_shard_lose_and_repeat_nothing() {
    let spec = own(&["up", "--count", "3", "--no-install"])
        .lines()
        .collect::<Vec<_>>()
        .join(",");
    let topology = Topology::parse(&spec).expect("own shards");
    let options = PoolOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .acquire_timeout(Duration::from_secs(2))
        .breaker_cooldown(Duration::from_millis(500));
    let c = Arc::new(Client::new(topology.clone(), options).expect("a client"));
    let shard = |n: usize| topology.shards().nth(n).expect("three shards").id;
    let mut relays = Relays {
        spec: spec.clone(),
        running: None,
        kills: 0,
    };
    relays.spawn();
    let started = Instant::now();
    let (parents, children) = spawn_families(&c, shard(0), [shard(1), shard(2)]).await;
    storm(&c, &parents, &children, &mut relays).await;
    // Let the last relay settle what is left, then stop it.
    let db0 = connect(topology.get(shard(0)).expect("shard 0")).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left: i64 = db0
            .query_one("SELECT count(*) FROM sheaf.cross_shard_children", &[])
            .await
            .expect("count lifecycle rows")
            .get(0);
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} lifecycle rows never settled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    relays.kill().await;
    check(&c, &topology, &children).await;
    eprintln!(
        "relay crash: {} children, {} relay processes SIGKILLed, shard 2 stopped and restarted, {:.1} s",
        children.len(),
        relays.kills,
        started.elapsed().as_secs_f64()
    );
    own(&["down"]);
}
