//! History: an execution's append-only events, read in pages (keyset on
//! `seq`) or as a stream; appending an event; signalling an execution.

use std::time::SystemTime;

use futures::{Stream, TryStreamExt};

use super::{Call, Client, ClientError, Owned, first_column};
use crate::id::ExecutionId;
use crate::json::Json;
use crate::topology::ShardId;
use crate::words::{word, words};

const HISTORY: &str = "SELECT seq, event_type, payload, created_at FROM sheaf.history($1, $2, $3)";
const APPEND_EVENT: &str = "SELECT sheaf.append_event($1, $2, $3)";
const SIGNAL: &str =
    "SELECT sheaf.signal($1, $2, $3, jsonb_strip_nulls(jsonb_build_object('signal_id', $4::text)))";

/// The most events one page may hold (the shard's `max_rows` bound).
pub const MAX_HISTORY_PAGE: usize = 10_000;

words! {
    /// An event's type: the ones the shards write, or an application's own
    /// (appended with [`Client::append_event`]).
    pub enum EventType {
        /// The run was started.
        WorkflowStarted = "WorkflowStarted",
        /// The run completed.
        WorkflowCompleted = "WorkflowCompleted",
        /// The run failed.
        WorkflowFailed = "WorkflowFailed",
        /// The run was cancelled.
        WorkflowCancelled = "WorkflowCancelled",
        /// The run timed out.
        WorkflowTimedOut = "WorkflowTimedOut",
        /// An operator terminated the run.
        WorkflowTerminated = "WorkflowTerminated",
        /// The run continued as a new run.
        WorkflowContinuedAsNew = "WorkflowContinuedAsNew",
        /// The run was paused.
        WorkflowPaused = "WorkflowPaused",
        /// The run was resumed from a pause.
        WorkflowResumed = "WorkflowResumed",
        /// The run suspended itself.
        WorkflowSuspended = "WorkflowSuspended",
        /// The run was woken from a suspension.
        WorkflowWoken = "WorkflowWoken",
        /// A task of the run completed.
        TaskCompleted = "TaskCompleted",
        /// A task of the run failed an attempt.
        TaskFailed = "TaskFailed",
        /// A task of the run was dead-lettered.
        TaskDeadLettered = "TaskDeadLettered",
        /// A task's lease expired and it was put back.
        TaskReaped = "TaskReaped",
        /// A task of the run was cancelled.
        TaskCancelled = "TaskCancelled",
        /// A signal arrived.
        SignalReceived = "SignalReceived",
        /// A start was debounced into the run.
        StartDebounced = "StartDebounced",
        /// Search attributes were set.
        SearchAttrsUpserted = "SearchAttrsUpserted",
        /// A child was started.
        ChildStarted = "ChildStarted",
        /// A child completed.
        ChildCompleted = "ChildCompleted",
        /// A child failed.
        ChildFailed = "ChildFailed",
        /// A child was cancelled.
        ChildCancelled = "ChildCancelled",
        /// A child was terminated.
        ChildTerminated = "ChildTerminated",
        /// A child timed out.
        ChildTimedOut = "ChildTimedOut",
        /// A signal to another execution was requested.
        ExternalSignalRequested = "ExternalSignalRequested",
        /// That signal was delivered.
        ExternalSignalDelivered = "ExternalSignalDelivered",
        /// That signal could not be delivered.
        ExternalSignalFailed = "ExternalSignalFailed",
        /// A cancel of another execution was requested.
        ExternalCancelRequested = "ExternalCancelRequested",
        /// That cancel was delivered.
        ExternalCancelDelivered = "ExternalCancelDelivered",
        /// The other execution was not found.
        ExternalTargetUnknown = "ExternalTargetUnknown",
    }
    other
    /// An application's own type, or one this driver does not know.
    Custom
}

/// One event of an execution's history.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Event {
    /// Its place in the history: 1, 2, 3, … with no gaps.
    pub seq: i64,
    /// `WorkflowStarted`, `TaskCompleted`, or an application's own type.
    pub event_type: EventType,
    /// Its payload, exactly as appended.
    pub payload: Json,
    /// When it was appended.
    pub created_at: SystemTime,
}

/// One page of a history.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct HistoryPage {
    /// The events after the cursor asked for, in `seq` order.
    pub events: Vec<Event>,
    /// The cursor of the next page (pass it as `after_seq`); `None` when
    /// this page reached the end of the history as it was when read.
    pub next_after: Option<i64>,
}

impl Client {
    /// Up to `page_size` (1..=10,000) events of `id`'s history after
    /// `after_seq` (0: from the start). The shard is asked for one event
    /// more than the page, so `next_after` is `None` exactly at the end.
    pub async fn history(
        &self,
        id: ExecutionId,
        after_seq: i64,
        page_size: usize,
    ) -> Result<HistoryPage, ClientError> {
        if page_size == 0 || page_size > MAX_HISTORY_PAGE {
            return Err(ClientError::BadRequest(format!(
                "page_size must be from 1 to {MAX_HISTORY_PAGE}, got {page_size}"
            )));
        }
        let call = self.by_execution(id);
        // One more than the page tells "more after this" from "the end",
        // except at the shard's bound, where a full page says "maybe more".
        let ask = (page_size + 1).min(MAX_HISTORY_PAGE);
        let rows = self
            .query(&call, HISTORY, &[&id.as_uuid(), &after_seq, &(ask as i32)])
            .await?;
        let mut events = rows
            .iter()
            .map(|row| event_from_row(&call, row))
            .collect::<Result<Vec<_>, _>>()?;
        let more = events.len() > page_size || (ask == page_size && events.len() == page_size);
        events.truncate(page_size);
        let next_after = if more { events.last().map(|e| e.seq) } else { None };
        Ok(HistoryPage { events, next_after })
    }

    /// `id`'s whole history as a stream of events, read `page_size` at a
    /// time (memory: one page). The stream ends after the last event there
    /// was when its last page was read; an error ends it after yielding it.
    pub fn history_stream(
        &self,
        id: ExecutionId,
        page_size: usize,
    ) -> impl Stream<Item = Result<Event, ClientError>> + '_ {
        let pages = futures::stream::try_unfold(Some(0i64), move |cursor| async move {
            let Some(after) = cursor else {
                return Ok::<_, ClientError>(None);
            };
            let page = self.history(id, after, page_size).await?;
            Ok(Some((page.events, page.next_after)))
        });
        pages
            .map_ok(|events| futures::stream::iter(events.into_iter().map(Ok::<_, ClientError>)))
            .try_flatten()
    }

    /// Appends an event to an active execution's history (payload at most
    /// 1 MiB of JSON); its `seq`. An ended execution's history is closed:
    /// [`ClientError::WrongState`].
    pub async fn append_event(
        &self,
        id: ExecutionId,
        event_type: &str,
        payload: impl Into<Json>,
    ) -> Result<i64, ClientError> {
        let call = self.by_execution(id);
        let payload = payload.into();
        let rows = self
            .query(&call, APPEND_EVENT, &[&id.as_uuid(), &event_type, &payload])
            .await?;
        first_column(&call, &rows)
    }
}

impl Client {
    /// Delivers `signal` (1 to 128 bytes) with `payload` to an execution,
    /// routed by its id: `SignalReceived` in its history, and a wake (a new
    /// workflow task) if it is suspended. A `signal_id` makes a retry
    /// deliver nothing more (it returns `true`, as delivered). `false` if
    /// the execution has ended.
    pub async fn signal(
        &self,
        id: ExecutionId,
        signal: &str,
        payload: impl Into<Json>,
        signal_id: Option<&str>,
    ) -> Result<bool, ClientError> {
        let start = self.by_execution(id).shard;
        Ok(self.signal_from(start, id, signal, payload, signal_id).await?.1)
    }

    /// [`signal`](Self::signal) sent to shard `start` first, following the
    /// run's forwards: the shard that answered, and what it said.
    pub(crate) async fn signal_from(
        &self,
        start: ShardId,
        id: ExecutionId,
        signal: &str,
        payload: impl Into<Json>,
        signal_id: Option<&str>,
    ) -> Result<(ShardId, bool), ClientError> {
        let call = Call {
            shard: start,
            owned: Owned::Execution(id),
        };
        let payload = payload.into();
        let (shard, rows) = self
            .query_followed(&call, SIGNAL, &[&id.as_uuid(), &signal, &payload, &signal_id])
            .await?;
        let call = Call { shard, ..call };
        Ok((shard, first_column(&call, &rows)?))
    }
}

fn event_from_row(call: &Call, row: &tokio_postgres::Row) -> Result<Event, ClientError> {
    let read = || -> Result<Event, tokio_postgres::Error> {
        Ok(Event {
            seq: row.try_get("seq")?,
            event_type: word(row, "event_type")?,
            payload: row.try_get("payload")?,
            created_at: row.try_get("created_at")?,
        })
    };
    read().map_err(|e| call.error(e, 1))
}
