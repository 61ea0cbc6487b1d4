//! Operator actions on tasks, dead letters and queues: cancelling one task
//! (routed by its id), a handler's progress, and purging, redriving and
//! dropping by queue on every readable shard (a draining shard still holds
//! dead letters and runs work).

use std::time::Duration;

use super::fleet::FleetReport;
use super::{Admin, Client, ClientError, Owned, first_column};
use crate::id::TaskId;
use crate::json::Json;

const CANCEL_TASK: &str = "SELECT sheaf.cancel_task($1, $2)";
const SET_PROGRESS: &str = "SELECT sheaf.set_progress($1, $2, $3)";
const PURGE_DEAD_LETTERS: &str = "SELECT sheaf.purge_dead_letters($1, make_interval(secs => $2))";
const REDRIVE_QUEUE: &str = "SELECT sheaf.redrive_queue($1, make_interval(secs => $2::float8), $3)";
const DROP_QUEUE: &str = "SELECT sheaf.drop_queue($1, $2)";

/// The oldest age `older_than` may name (the shard's bound): 100 years.
const MAX_AGE: Duration = Duration::from_secs(100 * 365 * 86_400);

fn check_age(older_than: Duration) -> Result<f64, ClientError> {
    if older_than > MAX_AGE {
        return Err(ClientError::BadRequest(format!(
            "older_than must be at most 100 years, got {} s",
            older_than.as_secs()
        )));
    }
    Ok(older_than.as_secs_f64())
}

impl Client {
    /// Cancels a task (routed by its id); `true` if this call did, `false`
    /// if it was cancelled already. An unclaimed task leaves at once and its
    /// slot passes on; a running one is marked, and its holder is told on
    /// its next fenced call ([`ClientError::TaskCancelled`]; a [`Worker`]
    /// stops the handler and gives the task back). A workflow task is
    /// refused ([`ClientError::WrongState`]: cancel its execution), as is a
    /// dead letter; an unknown task is [`ClientError::UnknownTask`].
    ///
    /// [`Worker`]: crate::Worker
    pub async fn cancel_task(&self, task_id: TaskId, reason: Option<&str>) -> Result<bool, ClientError> {
        let call = self.by_task(task_id);
        let rows = self
            .query(&call, CANCEL_TASK, &[&task_id.as_uuid(), &reason])
            .await?;
        first_column(&call, &rows)
    }

    /// Records the progress of a task claimed under `token` (any JSON up to
    /// 64 KiB), replacing its last report; [`Client::get_task`] and
    /// [`Admin::list_tasks`](crate::Admin::list_tasks) show it.
    pub async fn set_progress(
        &self,
        task_id: TaskId,
        token: i64,
        progress: impl Into<Json>,
    ) -> Result<(), ClientError> {
        let progress = progress.into();
        let call = self.by_task(task_id);
        self.query(&call, SET_PROGRESS, &[&task_id.as_uuid(), &token, &progress])
            .await?;
        Ok(())
    }
}

impl Admin<'_> {
    /// Deletes `queue`'s dead letters older than `older_than`
    /// (`Duration::ZERO`: all of them) on every readable shard; per shard,
    /// how many went. Their executions' quota counters follow.
    pub async fn purge_dead_letters(
        self,
        queue: &str,
        older_than: Duration,
    ) -> Result<FleetReport<i64>, ClientError> {
        let secs = check_age(older_than)?;
        Ok(self
            .client
            .fan_out(self.client.readable_shards(), |shard| async move {
                let (call, rows) = self
                    .client
                    .on_shard(
                        shard,
                        Owned::Queue(queue.to_owned()),
                        PURGE_DEAD_LETTERS,
                        &[&queue, &secs],
                    )
                    .await?;
                first_column(&call, &rows)
            })
            .await)
    }

    /// Redrives up to `max_rows` (1..=100,000) of `queue`'s dead letters
    /// older than `older_than` on each readable shard, oldest first; per
    /// shard, how many moved. Those that cannot go back now are left, so
    /// calling it until every shard says 0 ends.
    pub async fn redrive_queue(
        self,
        queue: &str,
        older_than: Duration,
        max_rows: i32,
    ) -> Result<FleetReport<i32>, ClientError> {
        let secs = check_age(older_than)?;
        Ok(self
            .client
            .fan_out(self.client.readable_shards(), |shard| async move {
                let (call, rows) = self
                    .client
                    .on_shard(
                        shard,
                        Owned::Queue(queue.to_owned()),
                        REDRIVE_QUEUE,
                        &[&queue, &secs, &max_rows],
                    )
                    .await?;
                first_column(&call, &rows)
            })
            .await)
    }

    /// Drops `queue` on every shard that has it: its configuration and,
    /// with `force`, its unfinished tasks and dead letters; per shard, how
    /// many of those went (a shard without the queue is left out of `ok`
    /// and `failed`). Without `force` a shard where it holds any refuses
    /// ([`ClientError::WrongState`]), and a shard where it holds tasks of
    /// executions refuses either way.
    pub async fn drop_queue(self, queue: &str, force: bool) -> FleetReport<i64> {
        let mut report = self
            .client
            .fan_out(self.client.every_shard(), |shard| async move {
                match self
                    .client
                    .on_shard(
                        shard,
                        Owned::Queue(queue.to_owned()),
                        DROP_QUEUE,
                        &[&queue, &force],
                    )
                    .await
                {
                    Ok((call, rows)) => first_column(&call, &rows).map(Some),
                    Err(ClientError::UnknownQueue { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .await;
        FleetReport {
            ok: std::mem::take(&mut report.ok)
                .into_iter()
                .filter_map(|(shard, n)| n.map(|n| (shard, n)))
                .collect(),
            failed: report.failed,
        }
    }
}

impl FleetReport<i64> {
    /// The sum over the shards that answered.
    pub fn total(&self) -> i64 {
        self.ok.values().sum()
    }
}
