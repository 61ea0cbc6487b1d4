//! Tasks: enqueue, claim, and finish a claimed task under its token.

use std::time::{Duration, SystemTime};

use sheaf_core::state::TaskKind;

use super::options::placement_opt;
use super::{Call, Client, ClientError, EnqueueOptions, Owned, first_column, single, unavailable_outcome};
use crate::id::{ExecutionId, TaskId};
use crate::json::Json;
use crate::router::Placement;
use crate::topology::ShardId;

// `run_at` goes as a timestamptz parameter; a NULL one is `"run_at": null`,
// which the shard reads as "not given".
const ENQUEUE: &str = "SELECT sheaf.enqueue($1, $2, $3 || jsonb_build_object('run_at', $4::timestamptz))";
const FIND_TASK: &str = "SELECT sheaf.find_task($1, $2)";
const CLAIM: &str = "SELECT task_id, token, payload, attempt, execution_id, concurrency_key, kind \
     FROM sheaf.claim($1, $2, $3, make_interval(secs => $4))";
const COMPLETE_AND_CLAIM: &str = "SELECT task_id, completed, token, payload, attempt, execution_id, concurrency_key, kind \
     FROM sheaf.complete_and_claim($1, $2, $3, $4, $5, make_interval(secs => $6))";
const COMPLETE: &str = "SELECT sheaf.complete($1, $2, $3)";
const FAIL: &str = "SELECT retry_at, dead_lettered FROM sheaf.fail($1, $2, $3, make_interval(secs => $4))";
const HEARTBEAT: &str = "SELECT sheaf.heartbeat($1, $2)";
const RELEASE: &str = "SELECT sheaf.release($1, $2)";
const SNOOZE: &str = "SELECT sheaf.snooze($1, $2, make_interval(secs => $3))";
const DEAD_LETTER: &str = "SELECT sheaf.dead_letter($1, $2, $3)";
const COMPLETE_TASK_AND_EXECUTION: &str = "SELECT sheaf.complete_task_and_execution($1, $2, $3)";
const COMPLETE_TASK_AND_FAIL_EXECUTION: &str = "SELECT sheaf.complete_task_and_fail_execution($1, $2, $3)";
const COMPLETE_TASK_AND_CONTINUE_AS_NEW: &str = "SELECT sheaf.complete_task_and_continue_as_new($1, $2, $3)";

/// A task enqueued on a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Enqueued {
    /// Its id (it names the shard).
    pub task_id: TaskId,
    /// The shard that holds it.
    pub shard: ShardId,
}

/// A task handed out by `claim`, under a lease fenced by `token`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ClaimedTask {
    /// Its id.
    pub task_id: TaskId,
    /// The fencing token of this claim: finishing calls must carry it.
    pub token: i64,
    /// The payload, exactly as enqueued.
    pub payload: Json,
    /// 1 on the first run.
    pub attempt: i32,
    /// The execution it belongs to, if any.
    pub execution_id: Option<ExecutionId>,
    /// The concurrency key whose slot it holds, if any.
    pub concurrency_key: Option<String>,
    /// An activity or a workflow task.
    pub kind: TaskKind,
    /// The queue it was claimed from.
    pub queue: String,
    /// The shard it was claimed from (its id routes there too).
    pub shard: ShardId,
}

/// What `fail` did with a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailOutcome {
    /// When the task runs again; `None` once it is dead-lettered.
    pub retry_at: Option<SystemTime>,
    /// Whether its attempts ran out and it moved to the dead letters.
    pub dead_lettered: bool,
}

impl Client {
    /// Enqueues a task on `queue`. A task of an execution
    /// ([`EnqueueOptions::execution`]) goes to that execution's shard. Else
    /// an automatic placement hashes (queue, idempotency key) when there is
    /// one, so a duplicate meets its first copy on the same shard, and
    /// spreads the rest over the shards that can take work now; a routing
    /// key or pin places it like a start.
    pub async fn enqueue(
        &self,
        queue: &str,
        payload: impl Into<Json>,
        options: EnqueueOptions,
    ) -> Result<Enqueued, ClientError> {
        let payload = payload.into();
        let placement = options.placement.clone().unwrap_or(Placement::Auto);
        let shard = match (&options.execution, options.affinity(queue)) {
            (Some(id), _) => {
                if placement != Placement::Auto {
                    return Err(ClientError::BadRequest(
                        "a task of an execution goes to its execution's shard; it takes no placement".into(),
                    ));
                }
                id.route(&self.topology)
            }
            (None, Some((name, key))) => {
                if let Some(held) = self
                    .held_elsewhere(queue, &options, &name, &key, &placement)
                    .await?
                {
                    return Ok(held);
                }
                self.topology.place(&name, &key, &placement, None)?
            }
            (None, None) if placement == Placement::Auto => {
                return self.enqueue_anywhere(queue, &payload, &options).await;
            }
            (None, None) => {
                let key = uuid::Uuid::new_v4().to_string();
                self.topology.place(queue, &key, &placement, None)?
            }
        };
        self.enqueue_on(shard, queue, &payload, &options).await
    }

    /// An idempotency key whose home stopped taking work (its shard is
    /// being drained) may still be held there by an unfinished task: that
    /// task is the answer, as the key's home would give it. The former home
    /// is asked first, so a drain never doubles a keyed task; it takes no
    /// new task. Costs a round trip only for the keys that moved.
    pub(super) async fn held_elsewhere(
        &self,
        queue: &str,
        options: &EnqueueOptions,
        name: &str,
        key: &str,
        placement: &Placement,
    ) -> Result<Option<Enqueued>, ClientError> {
        let Some(idempotency_key) = options.idempotency_key.as_deref() else {
            return Ok(None);
        };
        let Some(former) = self.topology.former_home(name, key, placement, None) else {
            return Ok(None);
        };
        let (call, rows) = self
            .on_shard(
                former,
                Owned::Queue(queue.to_owned()),
                FIND_TASK,
                &[&queue, &idempotency_key],
            )
            .await?;
        let held: Option<uuid::Uuid> = first_column(&call, &rows)?;
        Ok(held.map(|id| Enqueued {
            task_id: TaskId::from_uuid(id),
            shard: former,
        }))
    }

    async fn enqueue_on(
        &self,
        shard: ShardId,
        queue: &str,
        payload: &Json,
        options: &EnqueueOptions,
    ) -> Result<Enqueued, ClientError> {
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
        // A task of an execution that moved is enqueued where the run
        // lives, after its seals' forwards: `shard` is that shard.
        let (shard, rows) = self
            .query_followed(&call, ENQUEUE, &[&queue, payload, &opts, &options.run_at])
            .await?;
        let call = Call { shard, ..call };
        let id: uuid::Uuid = first_column(&call, &rows)?;
        Ok(Enqueued {
            task_id: TaskId::from_uuid(id),
            shard,
        })
    }

    /// A task with no affinity (no execution, idempotency key or placement)
    /// may go to any writable shard: the placeable shards are tried in a
    /// random order, passing over one that cannot give a connection now
    /// (unreachable, short-circuited, exhausted, on another schema), which
    /// was sent nothing. A failure after the statement was sent is returned
    /// as it is: the task may exist. Fails only when no shard can take it.
    async fn enqueue_anywhere(
        &self,
        queue: &str,
        payload: &Json,
        options: &EnqueueOptions,
    ) -> Result<Enqueued, ClientError> {
        let mut shards: Vec<ShardId> = self.topology.placeable().collect();
        if shards.is_empty() {
            // No writable shard: the router's refusal says so.
            let key = uuid::Uuid::new_v4().to_string();
            self.topology.place(queue, &key, &Placement::Auto, None)?;
        }
        let start = (uuid::Uuid::new_v4().as_u64_pair().0 % shards.len().max(1) as u64) as usize;
        shards.rotate_left(start);
        let mut last = None;
        for shard in shards {
            if let Err(e) = self.pools.get(shard).await {
                self.metrics.request(shard, unavailable_outcome(&e));
                tracing::debug!(%shard, error = %e, "enqueue passes over a shard that cannot take work now");
                last = Some(e);
                continue;
            }
            return self.enqueue_on(shard, queue, payload, options).await;
        }
        Err(ClientError::NoShardAvailable {
            queue: queue.to_owned(),
            last: last.map(|e| e.to_string()).unwrap_or_default(),
        })
    }

    /// Claims up to `batch` tasks of `queue` on one shard under `lease`.
    pub async fn claim(
        &self,
        shard: ShardId,
        queue: &str,
        worker: &str,
        batch: i32,
        lease: Duration,
    ) -> Result<Vec<ClaimedTask>, ClientError> {
        let call = Call {
            shard,
            owned: Owned::Queue(queue.to_owned()),
        };
        let started = std::time::Instant::now();
        let rows = self
            .query(&call, CLAIM, &[&queue, &worker, &batch, &lease.as_secs_f64()])
            .await?;
        self.metrics.claim_took(shard, queue, started.elapsed());
        let tasks = rows
            .iter()
            .map(|row| claimed_from_row(row, queue, shard))
            .collect::<Result<Vec<_>, ClientError>>()?;
        self.metrics.claimed(shard, tasks.len());
        Ok(tasks)
    }

    /// Completes `finished` (tasks claimed on `shard`, each with the token
    /// of its claim; none on a worker's first call), then claims up to
    /// `batch` tasks of `queue` there under `lease`: one round trip and one
    /// transaction. Whether each finished task completed (`false`: a stale
    /// token, that task left alone), in input order, and the tasks claimed.
    /// No result is recorded: complete a workflow's task with
    /// [`Client::complete`].
    pub async fn complete_and_claim(
        &self,
        shard: ShardId,
        queue: &str,
        worker: &str,
        finished: &[(TaskId, i64)],
        batch: i32,
        lease: Duration,
    ) -> Result<(Vec<(TaskId, bool)>, Vec<ClaimedTask>), ClientError> {
        if finished.len() > super::batch::MAX_BATCH {
            return Err(ClientError::BadRequest(format!(
                "at most {} finished tasks per call, got {}",
                super::batch::MAX_BATCH,
                finished.len()
            )));
        }
        let call = Call {
            shard,
            owned: Owned::Queue(queue.to_owned()),
        };
        let ids: Vec<uuid::Uuid> = finished.iter().map(|(id, _)| id.as_uuid()).collect();
        let tokens: Vec<i64> = finished.iter().map(|(_, token)| *token).collect();
        let started = std::time::Instant::now();
        let rows = self
            .query(
                &call,
                COMPLETE_AND_CLAIM,
                &[&queue, &worker, &ids, &tokens, &batch, &lease.as_secs_f64()],
            )
            .await?;
        self.metrics.claim_took(shard, queue, started.elapsed());
        let mut completed = Vec::with_capacity(finished.len());
        let mut claimed = Vec::new();
        for row in &rows {
            match row
                .try_get::<_, Option<bool>>("completed")
                .map_err(|e| call.error(e, 1))?
            {
                Some(done) => {
                    let id: uuid::Uuid = row.try_get("task_id").map_err(|e| call.error(e, 1))?;
                    completed.push((TaskId::from_uuid(id), done));
                }
                None => claimed.push(claimed_from_row(row, queue, shard)?),
            }
        }
        let done = completed.iter().filter(|(_, done)| *done).count();
        self.metrics.completed(shard, done);
        self.metrics.claimed(shard, claimed.len());
        Ok((completed, claimed))
    }

    /// Completes a task claimed under `token`; its result (if any) goes to
    /// its execution's history. [`ClientError::StaleToken`] if the lease was
    /// lost, [`ClientError::UnknownTask`] if the task is gone.
    pub async fn complete(
        &self,
        task_id: TaskId,
        token: i64,
        result: Option<Json>,
    ) -> Result<(), ClientError> {
        let call = self.by_task(task_id);
        self.query(&call, COMPLETE, &[&task_id.as_uuid(), &token, &result])
            .await?;
        self.metrics.completed(call.shard, 1);
        Ok(())
    }

    /// Records a failed attempt: retried after `retry_in` (default: the
    /// shard's exponential backoff) until its attempts run out, then
    /// dead-lettered.
    pub async fn fail(
        &self,
        task_id: TaskId,
        token: i64,
        error: &str,
        retry_in: Option<Duration>,
    ) -> Result<FailOutcome, ClientError> {
        let call = self.by_task(task_id);
        let retry_secs = retry_in.map(|d| d.as_secs_f64());
        let rows = self
            .query(&call, FAIL, &[&task_id.as_uuid(), &token, &error, &retry_secs])
            .await?;
        let row = single(&call, &rows)?;
        let read = || -> Result<FailOutcome, tokio_postgres::Error> {
            Ok(FailOutcome {
                retry_at: row.try_get("retry_at")?,
                dead_lettered: row.try_get("dead_lettered")?,
            })
        };
        read().map_err(|e| call.error(e, 1))
    }

    /// Extends a task's lease by the lease it was claimed with, from now;
    /// returns the new end.
    pub async fn heartbeat(&self, task_id: TaskId, token: i64) -> Result<SystemTime, ClientError> {
        let call = self.by_task(task_id);
        let rows = self
            .query(&call, HEARTBEAT, &[&task_id.as_uuid(), &token])
            .await?;
        first_column(&call, &rows)
    }

    /// Gives a claimed task back without spending an attempt.
    pub async fn release(&self, task_id: TaskId, token: i64) -> Result<(), ClientError> {
        let call = self.by_task(task_id);
        self.query(&call, RELEASE, &[&task_id.as_uuid(), &token]).await?;
        Ok(())
    }

    /// Gives a claimed task back to run again after `delay` (up to 365
    /// days) without spending an attempt (`sheaf.snooze`); returns when it
    /// runs again. It holds no concurrency slot meanwhile.
    pub async fn snooze(
        &self,
        task_id: TaskId,
        token: i64,
        delay: Duration,
    ) -> Result<SystemTime, ClientError> {
        let call = self.by_task(task_id);
        let rows = self
            .query(&call, SNOOZE, &[&task_id.as_uuid(), &token, &delay.as_secs_f64()])
            .await?;
        first_column(&call, &rows)
    }

    /// Moves a claimed task to the dead letters now, whatever attempts it
    /// has left (`sheaf.dead_letter`): a failure no retry can fix. A
    /// workflow task's execution fails, as when its last attempt fails.
    pub async fn dead_letter(&self, task_id: TaskId, token: i64, error: &str) -> Result<(), ClientError> {
        let call = self.by_task(task_id);
        self.query(&call, DEAD_LETTER, &[&task_id.as_uuid(), &token, &error])
            .await?;
        Ok(())
    }

    /// Completes a claimed task of an execution and completes the execution
    /// with `result`, in one transaction on its shard
    /// (`sheaf.complete_task_and_execution`): the history gets the task's
    /// `TaskCompleted`, then `WorkflowCompleted`. (Completing the execution
    /// first would cancel the task, and its `complete` would then find it
    /// gone.) A task of no execution is [`ClientError::WrongState`].
    pub async fn complete_task_and_execution(
        &self,
        task_id: TaskId,
        token: i64,
        result: impl Into<Json>,
    ) -> Result<(), ClientError> {
        let call = self.by_task(task_id);
        let result = result.into();
        self.query(
            &call,
            COMPLETE_TASK_AND_EXECUTION,
            &[&task_id.as_uuid(), &token, &result],
        )
        .await?;
        self.metrics.completed(call.shard, 1);
        Ok(())
    }

    /// Completes a claimed task of an execution and fails the execution with
    /// `error`, in one transaction on its shard
    /// (`sheaf.complete_task_and_fail_execution`).
    pub async fn complete_task_and_fail_execution(
        &self,
        task_id: TaskId,
        token: i64,
        error: &str,
    ) -> Result<(), ClientError> {
        let call = self.by_task(task_id);
        self.query(
            &call,
            COMPLETE_TASK_AND_FAIL_EXECUTION,
            &[&task_id.as_uuid(), &token, &error],
        )
        .await?;
        self.metrics.completed(call.shard, 1);
        Ok(())
    }

    /// Completes a claimed task of an execution and continues the
    /// execution as new with `input`, in one transaction on its shard
    /// (`sheaf.complete_task_and_continue_as_new`); returns the successor.
    pub async fn complete_task_and_continue_as_new(
        &self,
        task_id: TaskId,
        token: i64,
        input: impl Into<Json>,
    ) -> Result<ExecutionId, ClientError> {
        let call = self.by_task(task_id);
        let input = input.into();
        let rows = self
            .query(
                &call,
                COMPLETE_TASK_AND_CONTINUE_AS_NEW,
                &[&task_id.as_uuid(), &token, &input],
            )
            .await?;
        self.metrics.completed(call.shard, 1);
        first_column::<uuid::Uuid>(&call, &rows).map(ExecutionId::from_uuid)
    }
}

fn claimed_from_row(
    row: &tokio_postgres::Row,
    queue: &str,
    shard: ShardId,
) -> Result<ClaimedTask, ClientError> {
    let call = Call {
        shard,
        owned: Owned::Queue(queue.to_owned()),
    };
    let kind: String = row.try_get("kind").map_err(|e| call.error(e, 1))?;
    let Ok(kind) = kind.parse::<TaskKind>() else {
        return Err(ClientError::Database {
            shard,
            code: None,
            message: format!(
                "the shard returned task kind {}, which this driver does not know: upgrade the driver",
                sheaf_core::excerpt::quoted(&kind)
            ),
        });
    };
    let read = || -> Result<ClaimedTask, tokio_postgres::Error> {
        Ok(ClaimedTask {
            task_id: TaskId::from_uuid(row.try_get("task_id")?),
            token: row.try_get("token")?,
            payload: row.try_get("payload")?,
            attempt: row.try_get("attempt")?,
            execution_id: row
                .try_get::<_, Option<uuid::Uuid>>("execution_id")?
                .map(ExecutionId::from_uuid),
            concurrency_key: row.try_get("concurrency_key")?,
            kind,
            queue: queue.to_owned(),
            shard,
        })
    };
    read().map_err(|e| call.error(e, 1))
}
