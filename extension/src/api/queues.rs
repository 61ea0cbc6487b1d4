//! Queue configuration and removal: `configure_queue`, `drop_queue`.

use pgrx::prelude::*;
use sheaf_core::options::{MAX_QUEUE_NAME_BYTES, QueueOptions};

use crate::base::args::{self, required};
use crate::base::audit;
use crate::base::errors::bad_argument;
use crate::base::jsonb::Jsonb;
use crate::base::names::{self, Kind};
use crate::queue::queues;
use crate::workflow::hooks::EXECUTIONS;

/// Sets a queue's options: `{"aging_secs": 60}` or `{"aging_secs": null}`,
/// `{"fairness": true|false}`, `{"notify": true|false}`. Only the options given
/// change. One ordering mode per queue: aging and fairness together are refused.
/// Switching between priority and aging re-keys the queue's ready tasks in this
/// transaction; switching fairness on or off while the queue has ready tasks
/// is refused (55000), because their fairness tags were never assigned.
/// Returns the resulting configuration.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn configure_queue(queue: Option<&str>, opts: Option<Jsonb>) -> pgrx::JsonB {
    let name = queues::check_name(queue);
    // The name rule (`args::new_name`): configuring creates a queue that
    // does not exist; one that exists keeps working.
    args::new_name(name, "queue", MAX_QUEUE_NAME_BYTES, || {
        names::stored(Kind::Queue, name)
    });
    let opts = required(opts, "opts").parse("opts");
    let parsed = match QueueOptions::parse(&opts) {
        Ok(o) => o,
        Err(e) => bad_argument(&e.option, e.why),
    };
    let config = queues::configure(name, &parsed);
    audit::record("configure_queue", name, "ok", config.clone());
    pgrx::JsonB(config)
}

/// Drops a queue: its configuration and, with `force`, its unfinished tasks
/// (their concurrency slots pass on; a running task's holder finds it gone,
/// P0002) and dead letters; returns how many of those went. Without `force`
/// a queue that holds any is refused (55000); a queue holding tasks of
/// executions is refused either way (cancel those executions). An unknown
/// queue is P0002. Reads the whole task table: an operator's call.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn drop_queue(queue: Option<&str>, force: default!(Option<bool>, false)) -> i64 {
    let name = queues::check_name(queue);
    let force = required(force, "force");
    let dropped = queues::drop(name, force, &EXECUTIONS);
    audit::record(
        "drop_queue",
        name,
        "ok",
        serde_json::json!({"force": force, "dropped": dropped}),
    );
    dropped
}
