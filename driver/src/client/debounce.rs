//! Pending debounced starts: listed on every readable shard, cancelled on
//! the shard their key routes to (where every start of the key meets).

use std::time::SystemTime;

use super::fleet::FleetReport;
use super::{Call, Client, ClientError, DebounceMode, Owned, first_column};
use crate::id::ExecutionId;
use crate::router::Placement;
use crate::topology::ShardId;
use crate::words::word;

const PENDING: &str = "SELECT workflow_name, debounce_key, execution_id, mode, window_ends_at, starts, created_at \
     FROM sheaf.pending_starts($1, $2)";
const CANCEL: &str = "SELECT sheaf.cancel_pending_start($1, $2, $3)";

/// A debounced start whose window is open (`sheaf.pending_starts`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingStart {
    /// The shard that holds it.
    pub shard: ShardId,
    /// The workflow.
    pub workflow_name: String,
    /// The debounce key.
    pub debounce_key: String,
    /// The run every start of the burst joins.
    pub execution_id: ExecutionId,
    /// Which start of the burst it keeps.
    pub mode: DebounceMode,
    /// When the window ends (a trailing run starts then).
    pub window_ends_at: SystemTime,
    /// Starts collapsed into it.
    pub starts: i64,
    /// When the first of them came.
    pub created_at: SystemTime,
}

impl Client {
    /// The open debounce windows of workflow `name` (every workflow's if
    /// `None`) on every readable shard, up to `max_rows` (1..10,000) each.
    pub async fn pending_starts(&self, name: Option<&str>, max_rows: i32) -> FleetReport<Vec<PendingStart>> {
        self.fan_out(self.readable_shards(), |shard| async move {
            let (call, rows) = self
                .on_shard(
                    shard,
                    Owned::Listing("pending starts"),
                    PENDING,
                    &[&name, &max_rows],
                )
                .await?;
            rows.iter()
                .map(|row| {
                    let read = || -> Result<PendingStart, tokio_postgres::Error> {
                        Ok(PendingStart {
                            shard,
                            workflow_name: row.try_get("workflow_name")?,
                            debounce_key: row.try_get("debounce_key")?,
                            execution_id: ExecutionId::from_uuid(row.try_get("execution_id")?),
                            mode: word(row, "mode")?,
                            window_ends_at: row.try_get("window_ends_at")?,
                            starts: row.try_get("starts")?,
                            created_at: row.try_get("created_at")?,
                        })
                    };
                    read().map_err(|e| call.error(e, 1))
                })
                .collect()
        })
        .await
    }

    /// Cancels the pending start of (`name`, `key`) where its window is
    /// open: the shard the key routes to, or its former home while that
    /// shard drains. A trailing one's run is cancelled before it ran; a
    /// leading one's run goes on. `false` if no window was open.
    pub async fn cancel_pending_start(
        &self,
        name: &str,
        key: &str,
        reason: Option<&str>,
    ) -> Result<bool, ClientError> {
        let shard = match self.open_window_at_former_home(name, key).await? {
            Some(former) => former,
            None => self
                .topology
                .place(&format!("debounce:{name}"), key, &Placement::Auto, None)?,
        };
        let call = Call {
            shard,
            owned: Owned::Workflow {
                name: name.to_owned(),
                workflow_id: key.to_owned(),
            },
        };
        let rows = self.query(&call, CANCEL, &[&name, &key, &reason]).await?;
        first_column(&call, &rows)
    }
}
