//! Pure logic shared by the sheaf extension and driver. No I/O, no Postgres.

pub mod backoff;
#[cfg(feature = "exact-json")]
pub mod children;
pub mod digest;
pub mod duration;
pub mod excerpt;
#[cfg(feature = "exact-json")]
pub mod external;
pub mod hrw;
pub mod id;
pub mod listing;
pub mod nesting;
#[cfg(feature = "exact-json")]
pub mod options;
pub mod ordering;
pub mod page;
#[cfg(feature = "exact-json")]
pub mod policy;
pub mod retention;
#[cfg(feature = "exact-json")]
pub mod search;
pub mod sqlstate;
pub mod state;
#[cfg(feature = "exact-json")]
pub mod usage;
