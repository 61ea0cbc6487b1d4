//! Execution and task ids: minted here with this shard's prefix, decoded
//! anywhere. The layout is `sheaf_core::id`.

use std::time::{SystemTime, UNIX_EPOCH};

use sheaf_core::id;

use crate::base::errors::{internal, not_ready};
use crate::base::shard;

/// Mints an id for this shard: shard prefix, wall-clock milliseconds, random.
pub fn mint() -> pgrx::Uuid {
    minter()()
}

/// Mints an id for shard `shard` (0..=`id::MAX_SHARD_ID`, checked by the
/// caller): a child's on the shard it will run on.
pub fn mint_for(shard: i32) -> pgrx::Uuid {
    minter_for(shard as u16)()
}

/// A minter bound to this shard's id, read once: for minting many ids.
pub fn minter() -> impl FnMut() -> pgrx::Uuid {
    minter_for(shard::current() as u16)
}

fn minter_for(shard: u16) -> impl FnMut() -> pgrx::Uuid {
    move || {
        let ms = match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_millis() as u64,
            Err(_) => not_ready("the system clock reads before 1970; cannot mint a time-ordered id"),
        };
        let random = uuid::Uuid::new_v4().as_u64_pair().1;
        match id::compose(shard, ms, random) {
            Ok(bytes) => pgrx::Uuid::from_bytes(bytes),
            // The shard id is checked at init and the time fits 44 bits.
            Err(e) => internal(format_args!("minting an id: {e}")),
        }
    }
}
