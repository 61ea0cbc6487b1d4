//! Pure logic shared by the sheaf extension and driver. No I/O, no Postgres.

pub mod id;
pub mod sqlstate;
