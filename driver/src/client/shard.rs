//! Shard housekeeping: the live-worker registry and maintenance.

use serde_json::Value;

use super::{Admin, Call, Client, ClientError, Owned, Protocol, first_column};
use crate::topology::ShardId;

const WORKER_HEARTBEAT: &str = "SELECT sheaf.worker_heartbeat($1, $2)";
const WORKER_DEREGISTER: &str = "SELECT sheaf.worker_deregister($1)";
const MAINTAIN: &str = "SELECT sheaf.maintain()";
const STRANDED_READY: &str = "SELECT coalesce(sum(ready), 0)::bigint FROM sheaf.stranded_work()";

impl Client {
    /// Ready tasks on `shard` whose queue no live worker serves: what
    /// `sheaf_shard_stranded_ready` shows.
    pub(crate) async fn stranded_ready(&self, shard: ShardId) -> Result<i64, ClientError> {
        let call = Call {
            shard,
            owned: Owned::Shard,
        };
        let rows = self.query(&call, STRANDED_READY, &[]).await?;
        first_column(&call, &rows)
    }
}

impl Admin<'_> {
    /// Runs `sheaf.maintain()` on one shard; returns its report.
    pub async fn maintain(self, shard: ShardId) -> Result<Value, ClientError> {
        let call = Call {
            shard,
            owned: Owned::Shard,
        };
        let rows = self.client.query(&call, MAINTAIN, &[]).await?;
        first_column(&call, &rows)
    }
}

impl Protocol<'_> {
    /// Registers `worker` as live on `shard`, serving `queues`.
    pub async fn worker_heartbeat(
        self,
        shard: ShardId,
        worker: &str,
        queues: &[String],
    ) -> Result<(), ClientError> {
        let call = Call {
            shard,
            owned: Owned::Shard,
        };
        self.client
            .query(&call, WORKER_HEARTBEAT, &[&worker, &queues])
            .await?;
        Ok(())
    }

    /// Takes `worker` out of one shard's live-worker registry
    /// (`sheaf.worker_deregister`); whether it was registered there.
    pub async fn worker_deregister(self, shard: ShardId, worker: &str) -> Result<bool, ClientError> {
        let call = Call {
            shard,
            owned: Owned::Shard,
        };
        let rows = self.client.query(&call, WORKER_DEREGISTER, &[&worker]).await?;
        first_column(&call, &rows)
    }
}
