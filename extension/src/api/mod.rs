//! The top layer: every `#[pg_extern]`, one module per concept. Each
//! function validates its arguments, calls the layer below, and returns;
//! none holds logic of its own. Queue functions that can touch an execution
//! are handed the workflow layer's hooks (`workflow::hooks::EXECUTIONS`,
//! `workflow::executions::INTAKE`).

// pgrx takes a table function's column names from the `name!` markers in
// its signature; a type alias would hide them, so the long return types stay.
#![allow(clippy::type_complexity)]

mod audit;
mod budget;
mod cancel;
mod caps;
mod catalog;
mod children;
mod claim;
mod complete;
mod config;
mod dead_letters;
mod enqueue;
mod erase;
mod executions;
mod external;
mod history;
mod ids;
mod lease;
mod lifecycle;
mod listing;
mod maintain;
mod mutex;
mod policy;
mod progress;
mod queues;
mod quota;
mod rate_limits;
mod rebalance;
mod relay;
mod retention;
mod retry;
mod schedules;
mod search;
mod shard;
mod signals;
mod stats;
mod topology;
mod usage;
mod workers;
