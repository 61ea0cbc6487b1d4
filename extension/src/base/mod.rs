//! The bottom layer: what every other layer stands on. Names nothing above it.

pub mod args;
pub mod audit;
pub mod catalog;
pub mod clock;
pub mod errors;
pub mod ids;
pub mod jsonb;
pub mod list;
pub mod locks;
pub mod names;
pub mod plans;
pub mod rows;
pub mod shard;
pub mod subxact;
pub mod topology;
