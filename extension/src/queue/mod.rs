//! The queue layer: tasks and everything that moves them. Names `base` only;
//! where a task's life matters to its execution it calls the hooks it is
//! handed (`hooks`), never workflow code.

pub mod cancel;
pub mod caps;
pub mod claim;
pub mod complete;
pub mod dead_letters;
pub mod enqueue;
pub mod floor;
pub mod hooks;
pub mod lease;
pub mod listing;
pub mod progress;
pub mod promote;
pub mod queues;
pub mod rate;
pub mod ready;
pub mod retry;
pub mod stats;
pub mod tasks;
pub mod workers;
