//! History and lookup by business key: an execution's append-only events,
//! read in pages (keyset on `seq`) or as a stream; appending an event; and
//! finding the execution of (name, workflow id).

use std::time::SystemTime;

use futures::{Stream, TryStreamExt};

use super::executions::execution_from_row;
use super::{Call, Client, ClientError, Execution, Owned, StartOptions, first_column};
use crate::id::ExecutionId;
use crate::json::Json;
use crate::router::Placement;

const HISTORY: &str = "SELECT seq, event_type, payload, created_at FROM sheaf.history($1, $2, $3)";
const APPEND_EVENT: &str = "SELECT sheaf.append_event($1, $2, $3)";
const FIND_EXECUTION: &str = "SELECT execution_id, workflow_name, workflow_id, state, input, result, error, \
     concurrency_key, quota_key, history_bytes, created_at, closed_at, wake_at \
     FROM sheaf.find_execution($1, $2)";

/// The most events one page may hold (the shard's `max_rows` bound).
pub const MAX_HISTORY_PAGE: usize = 10_000;

/// One event of an execution's history.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Event {
    /// Its place in the history: 1, 2, 3, … with no gaps.
    pub seq: i64,
    /// `WorkflowStarted`, `TaskCompleted`, or an application's own type.
    pub event_type: String,
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

    /// The active execution of (`name`, `workflow_id`), else its most recent
    /// ended one, else `None`. Asked on the shard a start with the same
    /// placement and tenant (`options`; the rest of it is ignored) would go
    /// to now, which is where such a start would attach to it. After the
    /// writable set changed, an execution started before may live elsewhere:
    /// its id still routes to it ([`Client::get_execution`]).
    pub async fn find_execution(
        &self,
        name: &str,
        workflow_id: &str,
        options: &StartOptions,
    ) -> Result<Option<Execution>, ClientError> {
        let placement = options.placement.clone().unwrap_or(Placement::Auto);
        let shard = self
            .topology
            .place(name, workflow_id, &placement, options.tenant.as_deref())?;
        let call = Call {
            shard,
            owned: Owned::Workflow {
                name: name.to_owned(),
                workflow_id: workflow_id.to_owned(),
            },
        };
        let rows = self.query(&call, FIND_EXECUTION, &[&name, &workflow_id]).await?;
        rows.first().map(|row| execution_from_row(&call, row)).transpose()
    }
}

fn event_from_row(call: &Call, row: &tokio_postgres::Row) -> Result<Event, ClientError> {
    let read = || -> Result<Event, tokio_postgres::Error> {
        Ok(Event {
            seq: row.try_get("seq")?,
            event_type: row.try_get("event_type")?,
            payload: row.try_get("payload")?,
            created_at: row.try_get("created_at")?,
        })
    };
    read().map_err(|e| call.error(e, 1))
}
