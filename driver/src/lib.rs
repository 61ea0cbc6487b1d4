//! sheaf-driver: use N sheaf shard databases as one queue.
//!
//! Every client computes placement itself; there is no proxy or coordinator.

pub mod status;
pub mod topology;

pub use status::{ShardStatus, probe_shard};
pub use topology::{Shard, ShardId, Topology, TopologyError};
