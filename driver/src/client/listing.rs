//! Operator reads: one task by id, a queue's tasks and the dead letters
//! across the fleet, page by page, and every queue with its counts per shard.
//!
//! A page asks every readable shard for `page_size + 1` rows after that
//! shard's anchor, merges them (tasks state by state; dead letters newest
//! first), and keeps in its cursor, per shard, the anchor of the last row it
//! listed from that shard (`sheaf_core::listing::ShardCursor`). The merge
//! only ever takes a prefix of each shard's rows, so paging to the end lists
//! every row that stayed put exactly once. A shard that could not answer
//! keeps its anchor: the next page asks it again from there.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde_json::Value;
use sheaf_core::listing::{STATE_ORDER, ShardCursor, listing_hash};
use sheaf_core::page::{SortOrder, merge_sorted};
use sheaf_core::state::{TaskKind, TaskState};

use super::fleet::FleetReport;
use super::search::{refused_argument, status};
use super::{Admin, Call, Client, ClientError, Owned, PageStatus, single};
use crate::id::{ExecutionId, TaskId};
use crate::metrics::QueueSample;
use crate::topology::ShardId;
use crate::words::{word, words};

/// The most rows a listing page may ask for (each shard is asked for one
/// more, and a shard returns at most 1000).
pub const MAX_TASK_PAGE: usize = 999;

// Every column, read by name: a shard still on 0.2.0 has no `started_at`.
const GET_TASK: &str = "SELECT * FROM sheaf.get_task($1)";
const LIST_TASKS: &str = "SELECT task_id, kind, task_state, priority, attempts, max_attempts, run_at, enqueued_at, \
     concurrency_key, lease_expires_at, last_error, execution_id, progress, anchor \
     FROM sheaf.list_tasks($1, $2, $3, $4)";
const LIST_DEAD: &str = "SELECT task_id, queue_name, kind, priority, attempts, max_attempts, execution_id, \
     concurrency_key, last_error, enqueued_at, dead_at, anchor FROM sheaf.list_dead_letters($1, $2, $3)";
const LIST_QUEUES: &str = "SELECT queue, aging_secs, fairness, notify, created_at, ready, scheduled, running, \
     waiting, paused, dead, extract(epoch FROM oldest_ready_age)::float8 AS oldest_ready_secs \
     FROM sheaf.list_queues()";

words! {
    /// Where a task stands as [`Client::get_task`] reports it: a queued
    /// task's [`TaskState`], or dead-lettered.
    pub enum TaskStatus {
        /// Due later (a `run_at`, a retry's backoff).
        Scheduled = "scheduled",
        /// Held back by its concurrency key's cap, or a rate limit.
        Waiting = "waiting",
        /// Claimable now.
        Ready = "ready",
        /// Claimed, under a lease.
        Running = "running",
        /// Parked with its paused execution.
        Paused = "paused",
        /// In the dead letters.
        Dead = "dead",
    }
}

/// A task as `get_task` reads it: unfinished, or dead-lettered (`dead_at`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TaskInfo {
    /// The task's id (it names its shard).
    pub task_id: TaskId,
    /// The shard that holds it.
    pub shard: ShardId,
    /// Its queue.
    pub queue: String,
    /// An activity or a workflow task.
    pub kind: TaskKind,
    /// Where it stands, dead-lettered included.
    pub state: TaskStatus,
    /// Its priority (higher first).
    pub priority: i32,
    /// Attempts spent.
    pub attempts: i32,
    /// Attempts it may spend.
    pub max_attempts: i32,
    /// When it runs (none for a dead letter).
    pub run_at: Option<SystemTime>,
    /// When it was enqueued.
    pub enqueued_at: SystemTime,
    /// Its concurrency key, if any.
    pub concurrency_key: Option<String>,
    /// When a running task's lease ends.
    pub lease_expires_at: Option<SystemTime>,
    /// The error of its last failed attempt.
    pub last_error: Option<String>,
    /// The execution it belongs to, if any.
    pub execution_id: Option<ExecutionId>,
    /// Its payload, as enqueued.
    pub payload: Value,
    /// The worker holding its lease.
    pub lease_owner: Option<String>,
    /// Its idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// Its fairness key, if any.
    pub fairness_key: Option<String>,
    /// When it was dead-lettered.
    pub dead_at: Option<SystemTime>,
    /// Its handler's last progress report ([`Client::set_progress`]).
    pub progress: Option<Value>,
    /// When its running attempt was claimed (`None` unless it is running,
    /// and from a shard still on schema 0.2.0).
    pub started_at: Option<SystemTime>,
}

/// A task in a listing.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ListedTask {
    /// The task's id (it names its shard).
    pub task_id: TaskId,
    /// The shard that holds it.
    pub shard: ShardId,
    /// Its queue.
    pub queue: String,
    /// An activity or a workflow task.
    pub kind: TaskKind,
    /// Its state.
    pub state: TaskState,
    /// Its priority (higher first).
    pub priority: i32,
    /// Attempts spent.
    pub attempts: i32,
    /// Attempts it may spend.
    pub max_attempts: i32,
    /// When it runs (or ran).
    pub run_at: SystemTime,
    /// When it was enqueued.
    pub enqueued_at: SystemTime,
    /// Its concurrency key, if any.
    pub concurrency_key: Option<String>,
    /// When a running task's lease ends.
    pub lease_expires_at: Option<SystemTime>,
    /// The error of its last failed attempt.
    pub last_error: Option<String>,
    /// The execution it belongs to, if any.
    pub execution_id: Option<ExecutionId>,
    /// Its handler's last progress report ([`Client::set_progress`]).
    pub progress: Option<Value>,
    anchor: Value,
}

/// A dead letter in a listing.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ListedDeadLetter {
    /// The task's id (it names its shard).
    pub task_id: TaskId,
    /// The shard that holds it.
    pub shard: ShardId,
    /// Its queue.
    pub queue: String,
    /// An activity or a workflow task.
    pub kind: TaskKind,
    /// Its priority (higher first).
    pub priority: i32,
    /// Attempts spent.
    pub attempts: i32,
    /// Attempts it may spend.
    pub max_attempts: i32,
    /// The execution it belongs to, if any.
    pub execution_id: Option<ExecutionId>,
    /// Its concurrency key, if any.
    pub concurrency_key: Option<String>,
    /// The error of its last failed attempt.
    pub last_error: Option<String>,
    /// When it was enqueued.
    pub enqueued_at: SystemTime,
    /// When it was dead-lettered.
    pub dead_at: SystemTime,
    anchor: Value,
}

/// One page of a fleet listing.
#[derive(Debug)]
#[non_exhaustive]
pub struct ListPage<T> {
    /// At most `page_size` rows, merged.
    pub items: Vec<T>,
    /// Pass it back for the next page; `None` after the last one.
    pub next_cursor: Option<String>,
    /// `Partial` when a shard is missing from the page.
    pub status: PageStatus,
    /// Each shard that could not answer, and why.
    pub unavailable_shards: BTreeMap<ShardId, ClientError>,
}

/// One queue's configuration and counts on one shard.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct QueueCounts {
    /// Ready tasks.
    pub ready: i64,
    /// Scheduled tasks.
    pub scheduled: i64,
    /// Running tasks.
    pub running: i64,
    /// Tasks waiting for a slot of their key.
    pub waiting: i64,
    /// Tasks of paused executions.
    pub paused: i64,
    /// Dead letters.
    pub dead: i64,
    /// The age of its oldest ready task.
    pub oldest_ready_age: Option<Duration>,
}

impl QueueCounts {
    /// Adds `other`'s counts to these (the oldest ready age is the older
    /// of the two): a queue over shards, or queues over a fleet.
    pub fn add(&mut self, other: &QueueCounts) {
        self.ready += other.ready;
        self.scheduled += other.scheduled;
        self.running += other.running;
        self.waiting += other.waiting;
        self.paused += other.paused;
        self.dead += other.dead;
        self.oldest_ready_age = self.oldest_ready_age.max(other.oldest_ready_age);
    }
}

/// A queue across the fleet: its counts on each shard that has it, and the
/// total (the oldest ready age is the oldest of any shard).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct QueueSummary {
    /// Its queue.
    pub queue: String,
    /// Per shard: (aging_secs, fairness, notify) as configured there.
    pub config: BTreeMap<ShardId, (Option<i32>, bool, bool)>,
    /// Its counts on each shard that has it.
    pub per_shard: BTreeMap<ShardId, QueueCounts>,
    /// Its counts added up over the shards.
    pub total: QueueCounts,
}

/// Every queue of the fleet, by name.
#[derive(Debug)]
#[non_exhaustive]
pub struct QueueListing {
    /// Every queue, by name.
    pub queues: Vec<QueueSummary>,
    /// `Partial` when a shard could not answer: its queues and counts are missing.
    pub status: PageStatus,
    /// Each shard that could not answer, and why.
    pub unavailable_shards: BTreeMap<ShardId, ClientError>,
}

pub(super) fn shard_cursor(cursor: Option<&str>, listing: u64) -> Result<ShardCursor, ClientError> {
    let Some(text) = cursor else {
        return Ok(ShardCursor {
            anchors: BTreeMap::new(),
            listing,
        });
    };
    let c = ShardCursor::decode(text).map_err(|e| ClientError::BadRequest(e.to_string()))?;
    if c.listing != listing {
        return Err(ClientError::BadRequest(
            "cursor: it belongs to another listing (another list, queue, state or kind)".into(),
        ));
    }
    Ok(c)
}

pub(super) fn check_page(page_size: usize) -> Result<(), ClientError> {
    if page_size == 0 || page_size > MAX_TASK_PAGE {
        return Err(ClientError::BadRequest(format!(
            "page_size must be from 1 to {MAX_TASK_PAGE}, got {page_size}"
        )));
    }
    Ok(())
}

/// A fleet listing's page from what the shards answered: a shard's
/// refusal of the arguments is the caller's mistake; else the runs merged
/// into at most `page_size` rows, and the next cursor: per shard, the
/// anchor of its last row taken, else the anchor it had. The shards that
/// did not answer make the page partial.
pub(super) fn paginate<T, K: Ord>(
    report: FleetReport<Vec<T>>,
    mut cursor: ShardCursor,
    page_size: usize,
    order: SortOrder,
    key: impl Fn(&T) -> K,
    place: impl Fn(&T) -> (ShardId, Value),
) -> Result<ListPage<T>, ClientError> {
    refused_argument(&report.failed)?;
    let fetched: usize = report.ok.values().map(Vec::len).sum();
    let mut items = merge_sorted(report.ok.into_values().collect(), order, page_size, key);
    items.truncate(page_size);
    for item in &items {
        let (shard, anchor) = place(item);
        cursor.anchors.insert(shard.get(), anchor);
    }
    let next_cursor = (fetched > items.len()).then(|| cursor.encode());
    Ok(ListPage {
        items,
        next_cursor,
        status: status(&report.failed),
        unavailable_shards: report.failed,
    })
}

fn micros(at: SystemTime) -> i64 {
    match at.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_micros()).unwrap_or(i64::MAX),
    }
}

fn rank(state: TaskState) -> i64 {
    STATE_ORDER.iter().position(|s| *s == state).unwrap_or(0) as i64
}

impl Client {
    /// The task `task_id` (routed by its id), or its dead letter.
    /// [`ClientError::UnknownTask`] when its shard has neither: it completed
    /// (completed tasks are not kept), or never existed.
    pub async fn get_task(&self, task_id: TaskId) -> Result<TaskInfo, ClientError> {
        let call = self.by_task(task_id);
        let rows = self.query(&call, GET_TASK, &[&task_id.as_uuid()]).await?;
        let row = single(&call, &rows)?;
        let read = || -> Result<TaskInfo, tokio_postgres::Error> {
            Ok(TaskInfo {
                task_id,
                shard: call.shard,
                queue: row.try_get("queue")?,
                kind: word(row, "kind")?,
                state: word(row, "state")?,
                priority: row.try_get("priority")?,
                attempts: row.try_get("attempts")?,
                max_attempts: row.try_get("max_attempts")?,
                run_at: row.try_get("run_at")?,
                enqueued_at: row.try_get("enqueued_at")?,
                concurrency_key: row.try_get("concurrency_key")?,
                lease_expires_at: row.try_get("lease_expires_at")?,
                last_error: row.try_get("last_error")?,
                execution_id: row
                    .try_get::<_, Option<uuid::Uuid>>("execution_id")?
                    .map(ExecutionId::from_uuid),
                payload: row.try_get("payload")?,
                lease_owner: row.try_get("lease_owner")?,
                idempotency_key: row.try_get("idempotency_key")?,
                fairness_key: row.try_get("fairness_key")?,
                dead_at: row.try_get("dead_at")?,
                progress: row.try_get("progress")?,
                started_at: if row.columns().iter().any(|c| c.name() == "started_at") {
                    row.try_get("started_at")?
                } else {
                    None
                },
            })
        };
        read().map_err(|e| call.error(e, 1))
    }
}

impl Admin<'_> {
    /// One page of `queue`'s tasks across every readable shard: in `state`,
    /// or every state (running, ready, scheduled, waiting, paused, in that
    /// order); within a state by priority (highest first) then enqueue time,
    /// scheduled ones by `run_at`, running ones by lease end. `cursor` is a
    /// page's `next_cursor` for the same queue and state.
    pub async fn list_tasks(
        self,
        queue: &str,
        state: Option<TaskState>,
        cursor: Option<&str>,
        page_size: usize,
    ) -> Result<ListPage<ListedTask>, ClientError> {
        check_page(page_size)?;
        let state_name = state.map(TaskState::as_str);
        let cursor = shard_cursor(cursor, listing_hash(&["tasks", queue, state_name.unwrap_or("")]))?;
        let ask = (page_size + 1) as i32;
        let report = self
            .client
            .fan_out(self.client.readable_shards(), |shard| {
                let after = cursor.anchors.get(&shard.get()).cloned();
                async move {
                    let call = Call {
                        shard,
                        owned: Owned::Queue(queue.to_owned()),
                    };
                    let rows = self
                        .client
                        .query(&call, LIST_TASKS, &[&queue, &state_name, &after, &ask])
                        .await?;
                    rows.iter().map(|row| listed_task(&call, queue, row)).collect()
                }
            })
            .await;
        paginate(
            report,
            cursor,
            page_size,
            SortOrder::Asc,
            task_key,
            |t: &ListedTask| (t.shard, t.anchor.clone()),
        )
    }

    /// One page of dead letters (of `queue`, or of every queue) across
    /// every readable shard, newest first. `cursor` is a page's
    /// `next_cursor` for the same queue.
    pub async fn list_dead_letters(
        self,
        queue: Option<&str>,
        cursor: Option<&str>,
        page_size: usize,
    ) -> Result<ListPage<ListedDeadLetter>, ClientError> {
        check_page(page_size)?;
        let cursor = shard_cursor(cursor, listing_hash(&["dead", queue.unwrap_or("")]))?;
        let ask = (page_size + 1) as i32;
        let report = self
            .client
            .fan_out(self.client.readable_shards(), |shard| {
                let after = cursor.anchors.get(&shard.get()).cloned();
                async move {
                    let call = Call {
                        shard,
                        owned: Owned::Listing("listing dead letters"),
                    };
                    let rows = self
                        .client
                        .query(&call, LIST_DEAD, &[&queue, &after, &ask])
                        .await?;
                    rows.iter().map(|row| listed_dead(&call, row)).collect()
                }
            })
            .await;
        paginate(
            report,
            cursor,
            page_size,
            SortOrder::Desc,
            |d: &ListedDeadLetter| (micros(d.dead_at), 0, d.task_id.as_uuid()),
            |d: &ListedDeadLetter| (d.shard, d.anchor.clone()),
        )
    }

    /// Every queue of every readable shard, by name, with its counts per
    /// shard and in total.
    pub async fn list_queues(self) -> QueueListing {
        let report = self
            .client
            .fan_out(self.client.readable_shards(), |shard| async move {
                let (call, rows) = self
                    .client
                    .on_shard(shard, Owned::Shard, LIST_QUEUES, &[])
                    .await?;
                rows.iter()
                    .map(|row| queue_row(&call, row))
                    .collect::<Result<Vec<_>, _>>()
            })
            .await;
        let mut by_name: BTreeMap<String, QueueSummary> = BTreeMap::new();
        for (shard, rows) in report.ok {
            for (name, config, counts) in rows {
                let q = by_name.entry(name.clone()).or_insert_with(|| QueueSummary {
                    queue: name,
                    config: BTreeMap::new(),
                    per_shard: BTreeMap::new(),
                    total: QueueCounts::default(),
                });
                q.total.add(&counts);
                q.config.insert(shard, config);
                q.per_shard.insert(shard, counts);
            }
        }
        QueueListing {
            queues: by_name.into_values().collect(),
            status: status(&report.failed),
            unavailable_shards: report.failed,
        }
    }
}

impl Admin<'_> {
    /// Samples every readable shard's queues into this client's metrics
    /// (`sheaf_queue_tasks{shard,queue,state}`,
    /// `sheaf_queue_oldest_ready_seconds{shard,queue}`): one `list_queues`
    /// per shard, whose counts walk each queue's indexes. Returns the
    /// shards that could not answer (their last sample stays, and
    /// `sheaf_shard_up` says they are down).
    pub async fn sample_queues(self) -> BTreeMap<ShardId, ClientError> {
        let listing = self.list_queues().await;
        let mut per_shard: BTreeMap<ShardId, Vec<QueueSample>> = BTreeMap::new();
        for shard in self.client.readable_shards() {
            if !listing.unavailable_shards.contains_key(&shard) {
                per_shard.insert(shard, Vec::new());
            }
        }
        for q in &listing.queues {
            for (shard, c) in &q.per_shard {
                per_shard.entry(*shard).or_default().push(QueueSample {
                    queue: q.queue.clone(),
                    counts: [c.ready, c.scheduled, c.waiting, c.running, c.paused, c.dead],
                    oldest_ready_secs: c.oldest_ready_age.map(|d| d.as_secs_f64()),
                });
            }
        }
        for (shard, sample) in per_shard {
            self.client.metrics().queues(shard, &sample);
        }
        listing.unavailable_shards
    }
}

/// Merge key of a listed task: its state's place, then priority (highest
/// first), then the state's own time.
fn task_key(t: &ListedTask) -> (i64, i64, uuid::Uuid) {
    let at = match t.state {
        TaskState::Scheduled => micros(t.run_at),
        TaskState::Running => t.lease_expires_at.map_or(i64::MAX, micros),
        _ => micros(t.enqueued_at),
    };
    let priority = if matches!(t.state, TaskState::Ready | TaskState::Waiting) {
        -i64::from(t.priority)
    } else {
        0
    };
    // (state, priority) packed: priorities are i32, so the state is the
    // high part.
    (rank(t.state) * (1i64 << 33) + priority, at, t.task_id.as_uuid())
}

fn listed_task(call: &Call, queue: &str, row: &tokio_postgres::Row) -> Result<ListedTask, ClientError> {
    let read = || -> Result<(ListedTask, String), tokio_postgres::Error> {
        let state: String = row.try_get("task_state")?;
        Ok((
            ListedTask {
                task_id: TaskId::from_uuid(row.try_get("task_id")?),
                shard: call.shard,
                queue: queue.to_owned(),
                kind: word(row, "kind")?,
                state: TaskState::Ready,
                priority: row.try_get("priority")?,
                attempts: row.try_get("attempts")?,
                max_attempts: row.try_get("max_attempts")?,
                run_at: row.try_get("run_at")?,
                enqueued_at: row.try_get("enqueued_at")?,
                concurrency_key: row.try_get("concurrency_key")?,
                lease_expires_at: row.try_get("lease_expires_at")?,
                last_error: row.try_get("last_error")?,
                execution_id: row
                    .try_get::<_, Option<uuid::Uuid>>("execution_id")?
                    .map(ExecutionId::from_uuid),
                progress: row.try_get("progress")?,
                anchor: row.try_get("anchor")?,
            },
            state,
        ))
    };
    let (mut task, state) = read().map_err(|e| call.error(e, 1))?;
    task.state = state.parse().map_err(|_| ClientError::Database {
        shard: call.shard,
        code: None,
        message: format!("list_tasks returned a task in state {state:?}, which this driver does not know"),
    })?;
    Ok(task)
}

fn listed_dead(call: &Call, row: &tokio_postgres::Row) -> Result<ListedDeadLetter, ClientError> {
    let read = || -> Result<ListedDeadLetter, tokio_postgres::Error> {
        Ok(ListedDeadLetter {
            task_id: TaskId::from_uuid(row.try_get("task_id")?),
            shard: call.shard,
            queue: row.try_get("queue_name")?,
            kind: word(row, "kind")?,
            priority: row.try_get("priority")?,
            attempts: row.try_get("attempts")?,
            max_attempts: row.try_get("max_attempts")?,
            execution_id: row
                .try_get::<_, Option<uuid::Uuid>>("execution_id")?
                .map(ExecutionId::from_uuid),
            concurrency_key: row.try_get("concurrency_key")?,
            last_error: row.try_get("last_error")?,
            enqueued_at: row.try_get("enqueued_at")?,
            dead_at: row.try_get("dead_at")?,
            anchor: row.try_get("anchor")?,
        })
    };
    read().map_err(|e| call.error(e, 1))
}

type QueueRow = (String, (Option<i32>, bool, bool), QueueCounts);

fn queue_row(call: &Call, row: &tokio_postgres::Row) -> Result<QueueRow, ClientError> {
    let read = || -> Result<QueueRow, tokio_postgres::Error> {
        Ok((
            row.try_get("queue")?,
            (
                row.try_get("aging_secs")?,
                row.try_get("fairness")?,
                row.try_get("notify")?,
            ),
            QueueCounts {
                ready: row.try_get("ready")?,
                scheduled: row.try_get("scheduled")?,
                running: row.try_get("running")?,
                waiting: row.try_get("waiting")?,
                paused: row.try_get("paused")?,
                dead: row.try_get("dead")?,
                oldest_ready_age: row
                    .try_get::<_, Option<f64>>("oldest_ready_secs")?
                    .map(|s| Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX)),
            },
        ))
    };
    read().map_err(|e| call.error(e, 1))
}
