//! Batches: many payloads enqueued on one shard in one statement, and many
//! claimed tasks completed on their shards.

use std::collections::BTreeMap;

use super::options::placement_opt;
use super::{Call, Client, ClientError, EnqueueOptions, Owned, unavailable_outcome};
use crate::id::TaskId;
use crate::json::Json;
use crate::router::Placement;
use crate::topology::ShardId;

// `run_at` as a timestamptz parameter, as for a single enqueue.
const ENQUEUE_BATCH: &str =
    "SELECT sheaf.enqueue_batch($1, $2, $3 || jsonb_build_object('run_at', $4::timestamptz))";
const COMPLETE_BATCH: &str = "SELECT task_id, completed FROM sheaf.complete_batch($1, $2)";

/// The most payloads (or tasks) one batch call takes, per shard.
pub const MAX_BATCH: usize = 10_000;

/// A batch enqueued on one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnqueuedBatch {
    /// The tasks' ids, in the order of the payloads.
    pub task_ids: Vec<TaskId>,
    /// The shard that holds them all.
    pub shard: ShardId,
}

impl Client {
    /// Enqueues 1..=10,000 payloads on `queue` with the same options, on one
    /// shard, in one statement: all or none. The shard is chosen as for
    /// [`Client::enqueue`] (the execution's, the idempotency key's, the
    /// placement's, else any writable shard that can give a connection now).
    pub async fn enqueue_batch<P: Into<Json>>(
        &self,
        queue: &str,
        payloads: impl IntoIterator<Item = P>,
        options: EnqueueOptions,
    ) -> Result<EnqueuedBatch, ClientError> {
        let payloads: Vec<Json> = payloads.into_iter().map(Into::into).collect();
        if payloads.is_empty() || payloads.len() > MAX_BATCH {
            return Err(ClientError::BadRequest(format!(
                "a batch holds 1 to {MAX_BATCH} payloads, got {}",
                payloads.len()
            )));
        }
        if let (None, Some((name, key)), [_]) =
            (&options.execution, options.affinity(queue), payloads.as_slice())
        {
            let placement = options.placement.clone().unwrap_or(Placement::Auto);
            if let Some(held) = self
                .held_elsewhere(queue, &options, &name, &key, &placement)
                .await?
            {
                return Ok(EnqueuedBatch {
                    task_ids: vec![held.task_id],
                    shard: held.shard,
                });
            }
        }
        let shard = self.batch_shard(queue, &options).await?;
        let call = Call {
            shard,
            owned: match options.execution {
                Some(id) => Owned::Execution(id),
                None => Owned::Queue(queue.to_owned()),
            },
        };
        let opts = options.to_sql_opts();
        let opts = self
            .with_placement(shard, opts, placement_opt(options.placement.as_ref(), None))
            .await;
        // Where the run lives, for a task of an execution that moved.
        let (shard, rows) = self
            .query_followed(&call, ENQUEUE_BATCH, &[&queue, &payloads, &opts, &options.run_at])
            .await?;
        let call = Call { shard, ..call };
        let task_ids = rows
            .iter()
            .map(|row| row.try_get::<_, uuid::Uuid>(0).map(TaskId::from_uuid))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| call.error(e, 1))?;
        Ok(EnqueuedBatch { task_ids, shard })
    }

    /// Where a batch goes: like a single enqueue, all of it on one shard.
    async fn batch_shard(&self, queue: &str, options: &EnqueueOptions) -> Result<ShardId, ClientError> {
        let placement = options.placement.clone().unwrap_or(Placement::Auto);
        match (&options.execution, options.affinity(queue)) {
            (Some(_), _) if placement != Placement::Auto => Err(ClientError::BadRequest(
                "a task of an execution goes to its execution's shard; it takes no placement".into(),
            )),
            (Some(id), _) => Ok(id.route(&self.topology)),
            (None, Some((name, key))) => Ok(self.topology.place(&name, &key, &placement, None)?),
            (None, None) if placement == Placement::Auto => self.any_shard_now(queue).await,
            (None, None) => {
                let key = uuid::Uuid::new_v4().to_string();
                Ok(self.topology.place(queue, &key, &placement, None)?)
            }
        }
    }

    /// A writable shard that gives a connection now, tried in a random
    /// order (the batch then runs there; a shard lost in between fails the
    /// call, naming it).
    async fn any_shard_now(&self, queue: &str) -> Result<ShardId, ClientError> {
        let mut shards: Vec<ShardId> = self.topology.placeable().collect();
        if shards.is_empty() {
            let key = uuid::Uuid::new_v4().to_string();
            self.topology.place(queue, &key, &Placement::Auto, None)?;
        }
        let start = (uuid::Uuid::new_v4().as_u64_pair().0 % shards.len().max(1) as u64) as usize;
        shards.rotate_left(start);
        let mut last = None;
        for shard in shards {
            match self.pools.get(shard).await {
                Ok(_) => return Ok(shard),
                Err(e) => {
                    self.metrics.request(shard, unavailable_outcome(&e));
                    last = Some(e);
                }
            }
        }
        Err(ClientError::NoShardAvailable {
            queue: queue.to_owned(),
            last: last.map(|e| e.to_string()).unwrap_or_default(),
        })
    }

    /// Completes tasks claimed on `shard` (each with the token of its
    /// claim) in one `sheaf.complete_batch` there; whether each completed.
    pub(crate) async fn complete_batch_on(
        &self,
        shard: ShardId,
        tasks: &[(TaskId, i64)],
    ) -> Result<BTreeMap<TaskId, bool>, ClientError> {
        let ids: Vec<uuid::Uuid> = tasks.iter().map(|(id, _)| id.as_uuid()).collect();
        let tokens: Vec<i64> = tasks.iter().map(|(_, token)| *token).collect();
        let call = Call {
            shard,
            owned: Owned::Shard,
        };
        let rows = self.query(&call, COMPLETE_BATCH, &[&ids, &tokens]).await?;
        let mut completed = BTreeMap::new();
        for row in &rows {
            let id: uuid::Uuid = row.try_get(0).map_err(|e| call.error(e, 1))?;
            let done: bool = row.try_get(1).map_err(|e| call.error(e, 1))?;
            completed.insert(TaskId::from_uuid(id), done);
        }
        self.metrics
            .completed(shard, completed.values().filter(|d| **d).count());
        Ok(completed)
    }

    /// Completes claimed tasks (each with the token of its claim), grouped
    /// by the shard each id routes to: one `sheaf.complete_batch` per shard.
    /// Whether each one completed; a stale entry (lease lost, task gone) is
    /// `false` and left alone. A shard that failed fails the whole call
    /// (the other shards' completions stand: retrying them reports `false`).
    pub async fn complete_batch(
        &self,
        tasks: &[(TaskId, i64)],
    ) -> Result<BTreeMap<TaskId, bool>, ClientError> {
        let mut by_shard: BTreeMap<ShardId, Vec<(TaskId, i64)>> = BTreeMap::new();
        for &(id, token) in tasks {
            by_shard
                .entry(id.route(&self.topology))
                .or_default()
                .push((id, token));
        }
        let calls = by_shard
            .iter()
            .map(|(&shard, tasks)| self.complete_batch_on(shard, tasks));
        let mut out = BTreeMap::new();
        for result in futures::future::join_all(calls).await {
            out.extend(result?);
        }
        Ok(out)
    }
}
