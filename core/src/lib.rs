//! Pure logic shared by the sheaf extension and driver. No I/O, no Postgres.

pub mod backoff;
pub mod excerpt;
pub mod hrw;
pub mod id;
pub mod nesting;
#[cfg(feature = "exact-json")]
pub mod options;
pub mod ordering;
#[cfg(feature = "exact-json")]
pub mod policy;
pub mod sqlstate;
pub mod state;
