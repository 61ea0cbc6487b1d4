//! The workflow layer: executions and everything that admits, moves and ends
//! them. Names `queue`, `mutex` and `base`; implements the queue's hook
//! (`hooks`).

pub mod executions;
pub mod gates;
pub mod history;
pub mod hooks;
pub mod lifecycle;
pub mod policy;
pub mod quota;
pub mod search;
pub mod signals;
pub mod start;
pub mod usage;
