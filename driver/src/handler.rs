//! A worker's handler's inputs and outcome; see [`TaskContext`].

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::client::{ClaimedTask, Client, ClientError};
use crate::json::Json;

/// How a handler finished a task (its `Ok`). Every variant ends the attempt
/// in one statement on the task's shard.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TaskDone {
    /// Completes the task (`sheaf.complete`) with an optional result, which
    /// goes to its execution's history. For a workflow task this is
    /// "continue later": the execution stays running.
    Complete(Option<Json>),
    /// Completes the task and its execution with this result, in one
    /// transaction (`sheaf.complete_task_and_execution`); the task's result
    /// in the history is the same value. Only for a task of an execution.
    CompleteExecution(Json),
    /// Completes the task and fails its execution with this error, in one
    /// transaction (`sheaf.complete_task_and_fail_execution`). Only for a
    /// task of an execution.
    FailExecution(String),
    /// Completes the task and continues its execution as new with this
    /// input, in one transaction (`sheaf.complete_task_and_continue_as_new`):
    /// the run ends `CONTINUED_AS_NEW` and its successor, with the same
    /// workflow id, starts fresh. Only for a task of an execution.
    ContinueAsNew(Json),
    /// Runs the task again after this delay (up to 365 days) without
    /// spending its attempt (`sheaf.snooze`): not a failure, a wait (a rate
    /// limit, a resource not ready yet).
    Snooze(Duration),
}

/// A handler's refusal (its `Err`): the attempt failed.
///
/// [`TaskFailure::retryable`] retries it (after `retry_in`, or the shard's
/// backoff) until its attempts run out, then dead-letters it;
/// [`TaskFailure::permanent`] dead-letters it at once
/// (`sheaf.dead_letter`), whatever attempts it has left. Either way a
/// workflow task that ends in the dead letters fails its execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFailure {
    /// Kept as the task's last error, whole up to 1 MiB (a longer one is
    /// refused by the shard with 54000, never cut: the [`Worker`] then
    /// dead-letters the task with a short error naming the refusal).
    ///
    /// [`Worker`]: crate::Worker
    pub message: String,
    /// When to retry (default: the shard's exponential backoff). Ignored
    /// for a permanent failure.
    pub retry_in: Option<Duration>,
    /// Straight to the dead letters: no retry can fix it.
    pub permanent: bool,
}

impl TaskFailure {
    /// A failure worth retrying, after the shard's backoff unless
    /// [`TaskFailure::retry_in`] says otherwise.
    pub fn retryable(message: impl Into<String>) -> TaskFailure {
        TaskFailure {
            message: message.into(),
            retry_in: None,
            permanent: false,
        }
    }

    /// The same as [`TaskFailure::retryable`].
    pub fn new(message: impl Into<String>) -> TaskFailure {
        TaskFailure::retryable(message)
    }

    /// A failure no retry can fix (a malformed payload, a refused
    /// request): the task goes to the dead letters now.
    pub fn permanent(message: impl Into<String>) -> TaskFailure {
        TaskFailure {
            permanent: true,
            ..TaskFailure::retryable(message)
        }
    }

    /// Retries after `after` instead of the shard's backoff.
    pub fn retry_in(mut self, after: Duration) -> TaskFailure {
        self.retry_in = Some(after);
        self
    }
}

/// Whether `e`, from a call fenced by a claim's token, means the shard no
/// longer holds the task under that token: the one test of a lost lease,
/// for the signal and for `WorkerStats::lost`. Someone else holds it
/// (`StaleToken`), or it is gone (`UnknownTask`: reaped to the dead
/// letters, or cancelled with its execution).
pub(crate) fn lease_lost(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::StaleToken { .. } | ClientError::UnknownTask { .. }
    )
}

/// Why a task's cancellation signal fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelReason {
    /// The shard no longer holds the task under this claim's token: the
    /// lease expired and the task was reaped or claimed again, or the task
    /// was cancelled (its execution ended). Nothing the handler does now
    /// counts for the task.
    LeaseLost,
    /// The worker is going away: dropped, or shut down and the drain
    /// timeout passed. The task is released (its attempt not spent).
    Shutdown,
    /// An operator cancelled the task ([`Client::cancel_task`]). The worker
    /// gives it back, which ends it; the handler's outcome does not count.
    Cancelled,
}

/// One claimed task as its handler sees it: the task, the client, the
/// lease, and a cancellation signal. Cheap to clone (one `Arc`); clones
/// share the signal and the lease.
///
/// When the signal fires the worker stops the handler: it is aborted at
/// its next `.await`, so the signal is for work the handler cannot
/// `.await` (blocking sections, tasks it spawned) and for choosing what to
/// do first.
///
/// What a worker's handler gets and returns: a [`TaskContext`] for one
/// claimed task, and its outcome, `Result<TaskDone, TaskFailure>`.
///
/// ```no_run
/// # use std::time::Duration;
/// # use sheaf_driver::{TaskContext, TaskDone, TaskFailure};
/// async fn handle(ctx: TaskContext) -> Result<TaskDone, TaskFailure> {
///     let payload: serde_json::Value = ctx.task().payload.to_value().unwrap_or_default();
///     let Some(n) = payload["n"].as_i64() else {
///         // No retry can fix a malformed payload: straight to the dead letters.
///         return Err(TaskFailure::permanent("the payload has no n"));
///     };
///     if n < 0 {
///         // Not now: again in a minute, the attempt not spent.
///         return Ok(TaskDone::Snooze(Duration::from_secs(60)));
///     }
///     tokio::select! {
///         _ = ctx.cancelled() => Err(TaskFailure::retryable("cancelled")),
///         _ = tokio::time::sleep(Duration::from_millis(10)) => {
///             Ok(TaskDone::Complete(Some(serde_json::json!({ "doubled": n * 2 }).into())))
///         }
///     }
/// }
/// ```
#[derive(Clone)]
pub struct TaskContext {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for TaskContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskContext")
            .field("task", &self.inner.task)
            .field("cancel_reason", &self.cancel_reason())
            .field("lease_deadline", &self.lease_deadline())
            .finish_non_exhaustive()
    }
}

struct Inner {
    task: ClaimedTask,
    client: Arc<Client>,
    cancel: CancellationToken,
    reason: OnceLock<CancelReason>,
    deadline: Mutex<SystemTime>,
}

impl TaskContext {
    /// A context for `task`, whose lease ends at `deadline`.
    pub(crate) fn new(task: ClaimedTask, client: Arc<Client>, deadline: SystemTime) -> TaskContext {
        TaskContext {
            inner: Arc::new(Inner {
                task,
                client,
                cancel: CancellationToken::new(),
                reason: OnceLock::new(),
                deadline: Mutex::new(deadline),
            }),
        }
    }

    /// The claimed task: id, token, payload, attempt, execution, kind, queue
    /// and shard.
    pub fn task(&self) -> &ClaimedTask {
        &self.inner.task
    }

    /// The client the worker runs on (to enqueue follow-up work, start
    /// workflows, read executions).
    pub fn client(&self) -> &Arc<Client> {
        &self.inner.client
    }

    /// The cancellation signal, to hand to work of the handler's own.
    pub fn cancellation(&self) -> CancellationToken {
        self.inner.cancel.clone()
    }

    /// Waits until the signal fires.
    pub async fn cancelled(&self) {
        self.inner.cancel.cancelled().await;
    }

    /// Whether the signal fired.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    /// Why the signal fired; `None` while it has not.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.inner.reason.get().copied()
    }

    /// When the lease ends unless it is heartbeated: as the shard last
    /// reported it (at the claim, a lower bound computed before the claim
    /// was sent).
    pub fn lease_deadline(&self) -> SystemTime {
        *self.inner.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Extends the lease now, by the lease the task was claimed with (the
    /// worker does it every third of the lease anyway); returns the new end.
    /// A [`ClientError::StaleToken`] means the lease is lost: the signal
    /// fires ([`CancelReason::LeaseLost`]) and the worker stops the handler.
    /// A [`ClientError::TaskCancelled`] means an operator cancelled the
    /// task: the signal fires ([`CancelReason::Cancelled`]).
    pub async fn heartbeat(&self) -> Result<SystemTime, ClientError> {
        let task = &self.inner.task;
        match self.inner.client.heartbeat(task.task_id, task.token).await {
            Ok(until) => {
                *self.inner.deadline.lock().unwrap_or_else(|p| p.into_inner()) = until;
                Ok(until)
            }
            Err(e) => Err(self.heard(e)),
        }
    }

    /// Reports the task's progress (any JSON up to 64 KiB), replacing the
    /// last report; operators see it in [`Client::get_task`] and
    /// [`Admin::list_tasks`](crate::Admin::list_tasks). A cancellation or a lost lease fires the
    /// signal, as for [`TaskContext::heartbeat`].
    pub async fn progress(&self, progress: impl Into<Json>) -> Result<(), ClientError> {
        let task = &self.inner.task;
        self.inner
            .client
            .set_progress(task.task_id, task.token, progress)
            .await
            .map_err(|e| self.heard(e))
    }

    /// Fires the signal when a fenced call's refusal says the task is no
    /// longer this claim's: cancelled, or its lease lost.
    fn heard(&self, e: ClientError) -> ClientError {
        if matches!(e, ClientError::TaskCancelled { .. }) {
            self.cancel(CancelReason::Cancelled);
        } else if lease_lost(&e) {
            self.cancel(CancelReason::LeaseLost);
        }
        e
    }

    /// Fires the signal; the first reason given is the one kept.
    pub(crate) fn cancel(&self, reason: CancelReason) {
        let _ = self.inner.reason.set(reason);
        self.inner.cancel.cancel();
    }
}
