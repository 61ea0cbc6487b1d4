//! One relay process of the relay crash test (`tests/tests/relay_crash.rs`):
//! the driver's `Relay` over every shard in `SHEAF_SHARDS`, with leases short
//! enough to run out soon after the test SIGKILLs it. Runs until killed.

use std::sync::Arc;
use std::time::Duration;

use sheaf_driver::{Client, PoolOptions, Relay, RelayOptions, Topology};

#[tokio::main]
async fn main() {
    let spec = std::env::var("SHEAF_SHARDS").expect("SHEAF_SHARDS");
    let topology = Topology::parse(&spec).expect("a topology");
    let options = PoolOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .acquire_timeout(Duration::from_secs(1))
        .breaker_cooldown(Duration::from_millis(500));
    let client = Arc::new(Client::new(topology, options).expect("a client"));
    let shards = client.topology().shards().map(|s| s.id).collect();
    let relay_options = RelayOptions::new()
        .lease(Duration::from_secs(2))
        .recheck(Duration::from_millis(500))
        .sweep_every(Duration::from_millis(200));
    let _relay = Relay::start(client, shards, relay_options);
    std::future::pending::<()>().await;
}
