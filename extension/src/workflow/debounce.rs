//! Debounced starts (`start_workflow` opts `debounce`): one pending start
//! per (workflow name, debounce key) on this shard (the driver routes by the
//! key), so a burst of starts collapses into one run.
//!
//! The first start of a window creates the execution and returns its id;
//! later ones in the window return the same id with `created = false`.
//! `trailing`: the run's first workflow task is due when the window ends,
//! each later start replaces its input (the run's input, the task's, and a
//! `StartDebounced` event) and moves its time to a full window from now.
//! `leading`: the run starts at once; later starts in the window join it
//! (their input is not used) and extend the window. The pending start is a
//! row of `debounces`, listed by `pending_starts` and cancelled by
//! `cancel_pending_start`; `maintain` deletes expired ones.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use sheaf_core::policy::{Debounce, DebounceMode, StartOptions};

use crate::base::catalog::{self, Feature};
use crate::base::clock;
use crate::base::jsonb::Jsonb;
use crate::base::locks::{self, Class};
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::workflow::history;
use crate::workflow::lifecycle::{self, Close};
use crate::workflow::start::{self, Started};

/// Whether this catalog has debounces (not a 0.1.0 catalog).
pub fn enabled() -> bool {
    catalog::has(Feature::Debounce)
}

// Write statements read a fresh snapshot: what the previous holder of the
// debounce lock committed.
const LIVE: Stmt = Stmt::write(
    "SELECT d.execution_id, d.mode FROM debounces d JOIN executions e ON e.id = d.execution_id \
     WHERE d.workflow_name = $1 AND d.debounce_key = $2 AND d.until > now() \
       AND e.state IN ('RUNNING', 'SUSPENDED', 'PAUSED')",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::TEXTOID],
);
const FIRST_TASK: Stmt = Stmt::write(
    "SELECT id FROM tasks WHERE execution_id = $1 AND kind = 'workflow' AND state IN ('scheduled', 'paused') \
     ORDER BY seq LIMIT 1 FOR UPDATE",
    &[PgBuiltInOids::UUIDOID],
);
const MOVE: Stmt = Stmt::write(
    "UPDATE tasks SET run_at = now() + make_interval(secs => $2), payload = jsonb_set(payload, '{input}', $3) \
     WHERE id = $1",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::JSONBOID,
    ],
);
const SET_INPUT: Stmt = Stmt::write(
    "UPDATE executions SET input = $2 WHERE id = $1",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::JSONBOID],
);
const EXTEND: Stmt = Stmt::write(
    "UPDATE debounces SET until = now() + make_interval(secs => $3), starts = starts + 1 \
     WHERE workflow_name = $1 AND debounce_key = $2",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::FLOAT8OID,
    ],
);
const RECORD: Stmt = Stmt::write(
    "INSERT INTO debounces (workflow_name, debounce_key, execution_id, mode, until) \
     VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5)) \
     ON CONFLICT (workflow_name, debounce_key) DO UPDATE SET execution_id = excluded.execution_id, \
        mode = excluded.mode, until = excluded.until, starts = 1, created_at = now()",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::FLOAT8OID,
    ],
);
const LIST: Stmt = Stmt::read(
    "SELECT workflow_name, debounce_key, execution_id, mode, until, starts, created_at FROM debounces \
     WHERE until > now() AND ($1::text IS NULL OR workflow_name = $1) \
       AND ($3::text IS NULL OR debounce_key = $3) \
     ORDER BY workflow_name, debounce_key LIMIT $2",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::TEXTOID,
    ],
);
const TAKE: Stmt = Stmt::write(
    "DELETE FROM debounces WHERE workflow_name = $1 AND debounce_key = $2 AND until > now() \
     RETURNING execution_id, mode",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::TEXTOID],
);
const PRUNE: Stmt = Stmt::write(
    "WITH old AS (SELECT workflow_name, debounce_key FROM debounces WHERE until <= now() ORDER BY until LIMIT $1), \
          gone AS (DELETE FROM debounces d USING old \
                   WHERE d.workflow_name = old.workflow_name AND d.debounce_key = old.debounce_key RETURNING 1) \
     SELECT count(*) FROM gone",
    &[PgBuiltInOids::INT8OID],
);

row! {
    /// A pending start's run, and its mode.
    struct PendingRun {
        id: pgrx::Uuid,
        mode: String,
    }
}

/// A debounced start of `name` (see the module). `o.run_at` is not given
/// (the caller refused it): a trailing window sets the first task's time.
/// `before_new_run` runs when the start makes a run rather than joining a
/// pending one (a start misplaced here may only join, and it raises).
pub fn start(
    name: &str,
    workflow_id: &str,
    input: Jsonb,
    o: &StartOptions,
    d: &Debounce,
    before_new_run: impl FnOnce(),
) -> Started {
    if !enabled() {
        crate::base::errors::not_ready(
            "this shard's schema has no debounced starts: ALTER EXTENSION sheaf UPDATE first",
        );
    }
    let window = d.window.as_secs_f64();
    // Serialized per (name, key) before the start lock (`base::locks`).
    locks::exclusive_pair(Class::Debounce, name, &d.key);
    let live: Option<PendingRun> =
        LIVE.first(&[name.into(), d.key.as_str().into()], "reading a pending start");
    if let Some(PendingRun { id, mode }) = live
        && join(id, &mode, workflow_id, &input, window)
    {
        EXTEND.exec(&[name.into(), d.key.as_str().into(), window.into()]);
        return (id, false, Vec::new());
    }
    before_new_run();
    let run_at = match d.mode {
        DebounceMode::Trailing => Some(clock::from_us(clock::now_us() + d.window.as_micros() as i64)),
        DebounceMode::Leading => None,
    };
    let started = start::start_at(name, workflow_id, input, o, None, run_at);
    if started.1 {
        RECORD.exec(&[
            name.into(),
            d.key.as_str().into(),
            started.0.into(),
            d.mode.as_str().into(),
            window.into(),
        ]);
    }
    started
}

/// A later start joins pending run `id`; `false` if it cannot (a trailing
/// run whose first task has been claimed: this start makes a new one).
fn join(id: pgrx::Uuid, mode: &str, workflow_id: &str, input: &Jsonb, window: f64) -> bool {
    if mode == DebounceMode::Leading.as_str() {
        return true;
    }
    // The task, then the run's row (`base::locks`).
    let task: Option<pgrx::Uuid> = FIRST_TASK.value(&[id.into()], "locking a pending start");
    let Some(task) = task else {
        return false;
    };
    MOVE.exec(&[task.into(), window.into(), input.clone().into()]);
    SET_INPUT.exec(&[id.into(), input.clone().into()]);
    let payload = serde_json::json!({ "workflow_id": workflow_id, "input": input.clone().parse("input") });
    history::append(id, "StartDebounced", payload);
    true
}

row! {
    /// A pending start as `pending_starts` lists it.
    pub struct Pending {
        pub workflow_name: String,
        pub debounce_key: String,
        pub execution_id: pgrx::Uuid,
        pub mode: String,
        pub window_ends_at: TimestampWithTimeZone,
        pub starts: i64,
        pub created_at: TimestampWithTimeZone,
    }
}

/// The pending starts of `name` (every workflow's if `None`; of `key` if
/// given), by name and key.
pub fn pending(name: Option<&str>, key: Option<&str>, max: i64) -> Vec<Pending> {
    if !enabled() {
        return Vec::new();
    }
    LIST.all(&[name.into(), max.into(), key.into()], "listing pending starts")
}

/// Cancels the pending start of (`name`, `key`): a trailing one's run is
/// cancelled before it ran; a leading one's run goes on, and the next start
/// makes a new one. Whether there was one.
pub fn cancel(name: &str, key: &str, reason: Option<&str>) -> bool {
    if !enabled() {
        return false;
    }
    locks::exclusive_pair(Class::Debounce, name, key);
    let taken: Option<PendingRun> = TAKE.first(&[name.into(), key.into()], "cancelling a pending start");
    let Some(PendingRun { id, mode }) = taken else {
        return false;
    };
    if mode == DebounceMode::Trailing.as_str() {
        lifecycle::close(
            id,
            Close::Cancelled {
                reason: Some(
                    reason
                        .unwrap_or("its pending debounced start was cancelled")
                        .to_owned(),
                ),
            },
        );
    }
    true
}

/// Deletes up to `max` expired pending starts; returns how many.
pub fn prune(max: i64) -> i64 {
    if !enabled() {
        return 0;
    }
    PRUNE.one_value(&[max.into()], "pruning pending starts")
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{Started, count, init, one};
    use pgrx::prelude::*;
    use serde_json::json;

    fn start(workflow_id: &str, input: serde_json::Value, mode: &str) -> Started {
        let opts = json!({"debounce": {"key": "doc-1", "window": "2 seconds", "mode": mode}});
        one(
            "SELECT execution_id, created, superseded FROM sheaf.start_workflow('edit', $1, $2, $3)",
            &[
                workflow_id.into(),
                pgrx::JsonB(input).into(),
                pgrx::JsonB(opts).into(),
            ],
        )
    }

    #[pg_test]
    fn a_trailing_burst_makes_one_run_with_the_last_input() {
        init();
        let a = start("e-1", json!({"rev": 1}), "trailing");
        let b = start("e-2", json!({"rev": 2}), "trailing");
        let c = start("e-3", json!({"rev": 3}), "trailing");
        assert!(a.created && !b.created);
        assert_eq!((a.id, a.id), (b.id, c.id));
        assert_eq!(count("SELECT count(*) FROM sheaf.executions"), 1);
        assert_eq!(
            count("SELECT (input->>'rev')::bigint FROM sheaf.executions"),
            3,
            "the last input"
        );
        assert_eq!(
            count("SELECT (payload->'input'->>'rev')::bigint FROM sheaf.tasks"),
            3
        );
        assert_eq!(
            count(
                "SELECT count(*) FROM sheaf.tasks WHERE state = 'scheduled' AND run_at = now() + interval '2 seconds'"
            ),
            1,
            "due a window after the last start"
        );
        assert_eq!(
            count("SELECT count(*) FROM sheaf.events WHERE event_type = 'StartDebounced'"),
            2
        );
        assert_eq!(count("SELECT starts FROM sheaf.pending_starts('edit')"), 3);
        assert_eq!(
            count("SELECT starts FROM sheaf.pending_starts('edit', 10, 'doc-1')"),
            3
        );
        assert_eq!(
            count("SELECT count(*) FROM sheaf.pending_starts('edit', 10, 'doc-2')"),
            0,
            "one key's window only"
        );
        assert_eq!(
            Spi::get_one::<bool>("SELECT sheaf.cancel_pending_start('edit', 'doc-1')").unwrap(),
            Some(true)
        );
        assert_eq!(
            count("SELECT count(*) FROM sheaf.executions WHERE state = 'CANCELLED'"),
            1
        );
        let d = start("e-4", json!({"rev": 4}), "trailing");
        assert!(
            d.created && d.id != a.id,
            "a cancelled window makes way for a new one"
        );
    }

    #[pg_test]
    fn a_leading_burst_runs_at_once_and_later_starts_join_it() {
        init();
        let a = start("e-1", json!({"rev": 1}), "leading");
        let b = start("e-2", json!({"rev": 2}), "leading");
        assert!(a.created && !b.created && a.id == b.id);
        assert_eq!(
            count("SELECT (input->>'rev')::bigint FROM sheaf.executions"),
            1,
            "the first input"
        );
        assert_eq!(count("SELECT count(*) FROM sheaf.tasks WHERE state = 'ready'"), 1);
    }

    #[pg_test(
        error = "invalid opts.run_at: a debounced start is due when its window ends: give run_at or debounce, not both"
    )]
    fn a_debounce_with_run_at_is_refused() {
        init();
        Spi::run(
            "SELECT sheaf.start_workflow('edit', 'e', '{}', \
               '{\"run_at\": \"2030-01-01T00:00:00Z\", \"debounce\": {\"key\": \"k\", \"window\": \"1s\"}}')",
        )
        .unwrap();
    }
}
