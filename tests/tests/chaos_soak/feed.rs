//! The feeder: every tick one batch of each kind of task and a few
//! executions, each batch in one transaction with its record in
//! `soak.enqueued` / `soak.started`, on a shard that takes it (the next one
//! when a shard is down: work keeps arriving through the faults).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use sheaf_driver::{Client, ClientError, EnqueueOptions, OnShard, Placement, ShardId, StartOptions};

pub const QUEUE: &str = "soak";
pub const WORKFLOW: &str = "soak-wf";
/// Capped keys and their cap, on every shard.
pub const CAP_KEYS: usize = 4;
pub const CAP: i64 = 2;
/// Activities per execution.
pub const ACTS: i64 = 3;
const EXECUTIONS_PER_TICK: i64 = 10;

/// One kind of task: its payload tag, how many per tick, its options, and
/// how many first attempts it fails.
struct Kind {
    t: &'static str,
    per_tick: usize,
    max_attempts: i32,
    fails: i64,
}

const KINDS: [Kind; 6] = [
    Kind {
        t: "plain",
        per_tick: 110,
        max_attempts: 25,
        fails: 0,
    },
    Kind {
        t: "flaky",
        per_tick: 30,
        max_attempts: 25,
        fails: 2,
    },
    Kind {
        t: "doomed",
        per_tick: 5,
        max_attempts: 2,
        fails: 0,
    },
    Kind {
        t: "perm",
        per_tick: 3,
        max_attempts: 25,
        fails: 0,
    },
    // Mutex tasks wait for a lock that may live on a stopped shard: each
    // failed acquire spends an attempt, so they get many.
    Kind {
        t: "mutex",
        per_tick: 8,
        max_attempts: 200,
        fails: 0,
    },
    Kind {
        t: "capped",
        per_tick: 12,
        max_attempts: 25,
        fails: 0,
    },
];

/// Tasks one tick enqueues (capped ones once per key; each execution is its
/// workflow task and its activities).
pub fn per_tick() -> u64 {
    let plain: usize = KINDS
        .iter()
        .map(|k| {
            if k.t == "capped" {
                k.per_tick * CAP_KEYS
            } else {
                k.per_tick
            }
        })
        .sum();
    plain as u64 + (EXECUTIONS_PER_TICK * (1 + ACTS)) as u64
}

pub struct Feeder {
    pub client: Arc<Client>,
    pub shards: Vec<ShardId>,
    pub enqueued: AtomicU64,
    pub refused: AtomicU64,
}

impl Feeder {
    /// Feeds `ticks` ticks, one every `every`.
    pub async fn run(&self, ticks: u64, every: Duration) {
        let mut clock = tokio::time::interval(every);
        for tick in 0..ticks {
            clock.tick().await;
            for kind in &KINDS {
                let keys = if kind.t == "capped" { CAP_KEYS } else { 1 };
                for key in 0..keys {
                    self.batch(tick, kind, key).await;
                }
            }
            self.executions(tick).await;
        }
    }

    async fn batch(&self, tick: u64, kind: &Kind, key: usize) {
        let payloads: Vec<Value> = (0..kind.per_tick)
            .map(|i| json!({"t": kind.t, "i": tick as usize * 1000 + i, "fails": kind.fails}))
            .collect();
        let mut options = EnqueueOptions::new().max_attempts(kind.max_attempts);
        if kind.t == "capped" {
            options = options.concurrency_key(format!("soak-cap-{key}"));
        }
        let t = kind.t;
        let n = payloads.len() as u64;
        self.on_some_shard(tick as usize + key, |tx, shard| {
            let (payloads, options) = (payloads.clone(), options.clone());
            Box::pin(async move {
                let on = OnShard::verify(tx, shard).await?;
                let batch = on.enqueue_batch(QUEUE, payloads, options).await?;
                let ids: Vec<uuid::Uuid> = batch.task_ids.iter().map(|id| id.as_uuid()).collect();
                let sql = "INSERT INTO soak.enqueued (task_id, t) SELECT unnest($1::uuid[]), $2";
                tx.execute(sql, &[&ids, &t]).await.map_err(sql_error)?;
                Ok(())
            })
        })
        .await
        .then(|| self.enqueued.fetch_add(n, Ordering::Relaxed));
    }

    async fn executions(&self, tick: u64) {
        let ok = self
            .on_some_shard(tick as usize, |tx, shard| {
                Box::pin(async move {
                    let on = OnShard::verify(tx, shard).await?;
                    for j in 0..EXECUTIONS_PER_TICK {
                        let n = tick as i64 * EXECUTIONS_PER_TICK + j;
                        // A fresh workflow id per attempt: a batch whose
                        // commit answer was lost may be on the shard already.
                        let id = format!("soak-{n}-{}", uuid::Uuid::new_v4().simple());
                        let options = StartOptions::new()
                            .placement(Placement::Shard(shard))
                            .queue(QUEUE);
                        let started = on
                            .start_workflow(WORKFLOW, &id, json!({"n": n, "acts": ACTS}), options)
                            .await?;
                        let sql = "INSERT INTO soak.started (execution_id, workflow_id) VALUES ($1, $2)";
                        tx.execute(sql, &[&started.execution_id.as_uuid(), &id])
                            .await
                            .map_err(sql_error)?;
                    }
                    Ok(())
                })
            })
            .await;
        if ok {
            self.enqueued
                .fetch_add((EXECUTIONS_PER_TICK * (1 + ACTS)) as u64, Ordering::Relaxed);
        }
    }

    /// Runs `body` in a transaction on the first shard, from `start` on,
    /// that commits it; whether one did.
    async fn on_some_shard<F>(&self, start: usize, body: F) -> bool
    where
        F: for<'t> Fn(
            &'t tokio_postgres::Transaction<'t>,
            ShardId,
        )
            -> std::pin::Pin<Box<dyn Future<Output = Result<(), ClientError>> + Send + 't>>,
    {
        for k in 0..self.shards.len() {
            let shard = self.shards[(start + k) % self.shards.len()];
            let attempt = async {
                let mut conn = self.client.shard_connection(shard).await?;
                let tx = conn.transaction().await?;
                body(&tx, shard).await?;
                tx.commit().await.map_err(sql_error)
            };
            match tokio::time::timeout(Duration::from_secs(10), attempt).await {
                Ok(Ok(())) => return true,
                _ => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        false
    }
}

fn sql_error(e: tokio_postgres::Error) -> ClientError {
    ClientError::BadRequest(e.to_string())
}
