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

/// A minter bound to this shard's id, read once: for minting many ids.
pub fn minter() -> impl FnMut() -> pgrx::Uuid {
    let shard = shard::current() as u16;
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
