//! Queues: created implicitly by the first enqueue; `configure_queue` sets
//! their ordering mode and notifications.

use pgrx::prelude::*;
use sheaf_core::options::{QueueOptions, check_queue_name};
use sheaf_core::ordering::Mode;

use crate::errors::{SpiResultExt, bad_argument, not_ready, required};
use crate::plans::{Stmt, exec, run};

/// A queue's configuration.
#[derive(Debug, Clone)]
pub struct Queue {
    pub mode: Mode,
    pub notify: bool,
    /// It had no ready task when loaded: its workers may be asleep.
    pub idle: bool,
}

// Whether the queue has a ready task, looked up from the tail of its range:
// the head is where claims leave dead entries until the next vacuum.
const LOAD: Stmt = Stmt::read(
    "SELECT aging_secs, fairness, notify, \
            (SELECT task_id FROM ready WHERE queue = $1 ORDER BY k1 DESC, k2 DESC, seq DESC LIMIT 1) IS NULL \
     FROM queues WHERE name = $1",
    &[PgBuiltInOids::TEXTOID],
);
const CREATE: Stmt = Stmt::write(
    "INSERT INTO queues (name) VALUES ($1) ON CONFLICT (name) DO NOTHING",
    &[PgBuiltInOids::TEXTOID],
);

/// Validates a queue-name argument.
pub fn check_name(queue: Option<&str>) -> &str {
    let queue = required(queue, "queue");
    if let Err(why) = check_queue_name(queue) {
        bad_argument("queue", why);
    }
    queue
}

pub fn load(name: &str) -> Option<Queue> {
    Spi::connect_mut(|client| {
        let table = run(client, &LOAD, &[name.into()]);
        let row = table.into_iter().next()?;
        let aging: Option<i32> = row.get(1).or_internal("reading a queue");
        let fairness: Option<bool> = row.get(2).or_internal("reading a queue");
        let notify: Option<bool> = row.get(3).or_internal("reading a queue");
        let idle: Option<bool> = row.get(4).or_internal("reading a queue");
        let mode = match (aging, fairness) {
            (Some(secs), _) => Mode::Aging { secs: secs as u32 },
            (None, Some(true)) => Mode::Fairness,
            _ => Mode::Priority,
        };
        Some(Queue {
            mode,
            notify: notify.unwrap_or(true),
            idle: idle.unwrap_or(true),
        })
    })
}

/// The queue, created with defaults if this is its first use.
pub fn load_or_create(name: &str) -> Queue {
    if let Some(q) = load(name) {
        return q;
    }
    exec(&CREATE, &[name.into()]);
    match load(name) {
        Some(q) => q,
        None => not_ready(format!("queue {name:?} could not be created")),
    }
}

/// Sets a queue's options: `{"aging_secs": 60}` or `{"aging_secs": null}`,
/// `{"fairness": true|false}`, `{"notify": true|false}`. Only the options given
/// change. One ordering mode per queue: aging and fairness together are refused.
/// Switching between priority and aging re-keys the queue's ready tasks in this
/// transaction; switching fairness on or off while the queue has ready tasks
/// is refused (55000), because their fairness tags were never assigned.
/// Returns the resulting configuration.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn configure_queue(queue: Option<&str>, opts: Option<pgrx::JsonB>) -> pgrx::JsonB {
    let name = check_name(queue);
    let opts = required(opts, "opts");
    let parsed = match QueueOptions::parse(&opts.0) {
        Ok(o) => o,
        Err(e) => bad_argument(&e.option, e.why),
    };
    let current = load_or_create(name);
    let (mut aging, mut fairness) = match current.mode {
        Mode::Aging { secs } => (Some(secs as i32), false),
        Mode::Fairness => (None, true),
        Mode::Priority => (None, false),
    };
    if let Some(a) = parsed.aging_secs {
        aging = a;
    }
    if let Some(f) = parsed.fairness {
        fairness = f;
    }
    if aging.is_some() && fairness {
        bad_argument(
            "opts",
            format!(
                "queue {name:?} would have both aging and fairness: one ordering mode per queue (turn one off in the same call)"
            ),
        );
    }
    let notify = parsed.notify.unwrap_or(current.notify);
    let was_fair = current.mode == Mode::Fairness;
    if was_fair != fairness {
        let ready = Spi::get_one_with_args::<bool>(
            "SELECT EXISTS (SELECT 1 FROM ready WHERE queue = $1)",
            &[name.into()],
        )
        .or_internal("checking for ready tasks");
        if ready == Some(true) {
            not_ready(format!(
                "queue {name:?} has ready tasks: fairness can only be switched on or off while it has none"
            ));
        }
    }
    Spi::run_with_args(
        "UPDATE queues SET aging_secs = $2, fairness = $3, notify = $4 WHERE name = $1",
        &[name.into(), aging.into(), fairness.into(), notify.into()],
    )
    .or_internal("updating a queue");
    // Re-key: the same expression every insertion into `ready` uses.
    Spi::run_with_args(
        "UPDATE ready r SET k1 = ready_k1(t.priority, t.enqueued_at, $2) \
         FROM tasks t WHERE r.queue = $1 AND t.id = r.task_id",
        &[name.into(), aging.into()],
    )
    .or_internal("re-keying ready tasks");
    pgrx::JsonB(serde_json::json!({
        "queue": name,
        "aging_secs": aging,
        "fairness": fairness,
        "notify": notify,
    }))
}

/// Every queue's name.
pub fn names() -> Vec<String> {
    Spi::connect(|client| {
        client
            .select("SELECT name FROM queues ORDER BY name", None, &[])
            .or_internal("listing queues")
            .filter_map(|row| row.get::<String>(1).or_internal("listing queues"))
            .collect()
    })
}
