//! The rest of an execution's life, by id (no lookup): terminate, pause and
//! resume, suspend and wake. Each returns whether it changed anything, as
//! the shard's function does; an id the shard does not hold is
//! [`ClientError::UnknownExecution`], a call the state does not allow (a
//! pause of an ended execution) is [`ClientError::WrongState`].

use std::time::SystemTime;

use super::{Admin, Client, ClientError, first_column};
use crate::id::ExecutionId;

const TERMINATE_EXECUTION: &str = "SELECT sheaf.terminate_execution($1, $2)";
const PAUSE_EXECUTION: &str = "SELECT sheaf.pause_execution($1)";
const RESUME_EXECUTION: &str = "SELECT sheaf.resume_execution($1)";
const SUSPEND_EXECUTION: &str = "SELECT sheaf.suspend_execution($1, $2::timestamptz)";
const WAKE_EXECUTION: &str = "SELECT sheaf.wake_execution($1)";

impl Client {
    /// `RUNNING` → `SUSPENDED` until [`Client::wake_execution`], or until
    /// `wake_at` when given (`sheaf.maintain()`, which every `Worker` runs,
    /// wakes due timers). `false` if it was not running.
    pub async fn suspend_execution(
        &self,
        id: ExecutionId,
        wake_at: Option<SystemTime>,
    ) -> Result<bool, ClientError> {
        let call = self.by_execution(id);
        let rows = self
            .query(&call, SUSPEND_EXECUTION, &[&id.as_uuid(), &wake_at])
            .await?;
        first_column(&call, &rows)
    }

    /// `SUSPENDED` → `RUNNING` with a new workflow task (payload
    /// `{"workflow_name", "workflow_id", "woken": true}`). `false` if it was
    /// not suspended.
    pub async fn wake_execution(&self, id: ExecutionId) -> Result<bool, ClientError> {
        self.by_id_bool(id, WAKE_EXECUTION).await
    }

    async fn by_id_bool(&self, id: ExecutionId, sql: &str) -> Result<bool, ClientError> {
        let call = self.by_execution(id);
        let rows = self.query(&call, sql, &[&id.as_uuid()]).await?;
        first_column(&call, &rows)
    }
}

impl Admin<'_> {
    /// Ends an execution as `TERMINATED` (an operator's stop; its tasks are
    /// cancelled, its locks released); `false` if it had already ended.
    pub async fn terminate_execution(
        self,
        id: ExecutionId,
        reason: Option<&str>,
    ) -> Result<bool, ClientError> {
        let call = self.client.by_execution(id);
        let rows = self
            .client
            .query(&call, TERMINATE_EXECUTION, &[&id.as_uuid(), &reason])
            .await?;
        first_column(&call, &rows)
    }

    /// Pauses an active execution: its ready, waiting and scheduled tasks
    /// are parked (running ones finish). `false` if it was already paused.
    pub async fn pause_execution(self, id: ExecutionId) -> Result<bool, ClientError> {
        self.client.by_id_bool(id, PAUSE_EXECUTION).await
    }

    /// Returns a paused execution to the state it paused from, its tasks
    /// back in line. `false` if it was not paused.
    pub async fn resume_execution(self, id: ExecutionId) -> Result<bool, ClientError> {
        self.client.by_id_bool(id, RESUME_EXECUTION).await
    }
}
