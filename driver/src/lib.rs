//! sheaf-driver: use N sheaf shard databases as one queue.
//!
//! Every client computes placement itself; there is no proxy or coordinator.

pub mod breaker;
pub mod client;
pub mod id;
pub mod pool;
pub mod router;
pub mod status;
pub mod topology;

pub use breaker::{Breaker, BreakerState};
pub use client::{Client, ClientError, Execution, FailOutcome, Owned, Started, TaskId};
pub use id::{ExecutionId, IdError};
pub use pool::{PoolOptions, ShardError, ShardPools};
pub use router::{Placement, RouteError};
pub use status::{ShardStatus, probe_shard};
pub use topology::{Shard, ShardId, Topology, TopologyBuilder, TopologyError};
