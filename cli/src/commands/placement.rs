//! The placement flags `sheaf start` and `sheaf enqueue` share.

use sheaf_driver::{Placement, ShardId};

use crate::parse;

/// Where the work goes instead of where its key routes it (at most one).
#[derive(clap::Args)]
pub struct PlacementArgs {
    /// Exactly this shard.
    #[arg(long, value_parser = parse::shard, conflicts_with_all = ["residency_key", "routing_key"])]
    shard: Option<ShardId>,
    /// The shard the topology's residency map names for this key.
    #[arg(long, value_name = "KEY", conflicts_with = "routing_key")]
    residency_key: Option<String>,
    /// Everything with this key lands on one shard.
    #[arg(long, value_name = "KEY")]
    routing_key: Option<String>,
}

impl PlacementArgs {
    /// The placement the flags give (clap lets at most one through); `None`
    /// leaves it automatic.
    pub fn placement(self) -> Option<Placement> {
        match (self.shard, self.residency_key, self.routing_key) {
            (Some(s), _, _) => Some(Placement::Shard(s)),
            (None, Some(k), _) => Some(Placement::ResidencyKey(k)),
            (None, None, Some(k)) => Some(Placement::RoutingKey(k)),
            (None, None, None) => None,
        }
    }
}
