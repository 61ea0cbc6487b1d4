//! sheaf-driver: use N sheaf shard databases as one queue.
//!
//! Every client computes placement itself; there is no proxy or coordinator.

pub mod breaker;
pub mod client;
pub mod handler;
pub mod id;
pub mod json;
pub mod metrics;
pub mod pool;
pub mod router;
pub mod schema;
pub mod status;
pub mod topology;
pub mod worker;

pub use breaker::{Breaker, BreakerState};
pub use client::{
    Acquired, ClaimedTask, Client, ClientError, ConcurrencyStat, EnqueueOptions, Enqueued, EnqueuedBatch,
    Event, Execution, FailOutcome, FleetError, FleetReport, HistoryPage, LockOptions, MutexGuard, MutexKey,
    MutexStatus, OnShard, Owned, QueueConfig, QueueOptions, QueueStats, QuotaDetail, QuotaUsage,
    RegisteredWorker, ShardConnection, ShardInfo, StartOptions, Started, StrandedWork,
};
pub use handler::{CancelReason, TaskContext, TaskDone, TaskFailure};
pub use id::{ExecutionId, IdError, TaskId};
pub use json::Json;
pub use metrics::{Metrics, Outcome};
pub use pool::{PoolOptions, ShardError, ShardPools};
pub use router::{Placement, RouteError};
pub use schema::COMPATIBLE_SCHEMAS;
pub use sheaf_core::state::{ExecutionState, TaskKind};
pub use status::{LiveWorker, ShardHealth, ShardStatus, StrandedQueue, TopologyStatus, probe_shard};
pub use topology::{Shard, ShardId, Topology, TopologyBuilder, TopologyError};
pub use worker::{Coverage, DrainReport, Worker, WorkerError, WorkerOptions, WorkerStats};
