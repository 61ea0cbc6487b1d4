//! The workflow layer: executions and everything that admits, moves and ends
//! them. Names `queue`, `mutex` and `base`; implements the queue's hooks
//! (`executions::INTAKE`, `hooks::EXECUTIONS`).

pub mod children;
pub mod config;
pub mod continuation;
pub mod debounce;
pub mod erase;
pub mod executions;
pub mod external;
pub mod family;
pub mod gates;
pub mod history;
pub mod hooks;
pub mod lifecycle;
pub mod migration;
pub mod policy;
pub mod quota;
pub mod relay;
pub mod retention;
pub mod schedules;
pub mod search;
pub mod signals;
pub mod start;
pub mod usage;
pub mod wake;
