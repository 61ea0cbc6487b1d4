//! Schedules: create, change, pause, fire by hand, list. `maintain` fires
//! them. Every change writes the audit log.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use sheaf_core::options::MAX_KEY_BYTES;

use crate::base::args::{self, required};
use crate::base::audit;
use crate::base::errors::bad_argument;
use crate::base::jsonb::Jsonb;
use crate::workflow::schedules;

/// Creates schedule `name` (1 to 256 bytes) from `spec`:
/// `{"cron": "*/5 * * * *" | "@hourly" | "@every 30s", "time_zone": "UTC",
/// "workflow": {"name", "input", "workflow_id", "opts"} | "task": {"queue",
/// "payload", "opts"}, "overlap": "skip" | "allow" | "cancel_previous",
/// "catch_up": "skip" | "once" | "all", "catch_up_max": 10, "jitter":
/// "30s"}`. Returns its first fire time. 55000 if the name is taken.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn create_schedule(name: Option<&str>, spec: Option<Jsonb>) -> TimestampWithTimeZone {
    let name = schedules::check_name(name);
    // The name rule (`args::new_name`): a new schedule's name is new (one
    // taken is refused with 55000 anyway).
    args::new_name(name, "name", MAX_KEY_BYTES, || false);
    let spec = required(spec, "spec").parse("spec");
    let next = schedules::create(name, &spec);
    audit::record("create_schedule", name, "ok", spec);
    next
}

/// Changes the fields of a schedule's spec that `spec` names (`null`
/// removes one); the timing starts again from now. Returns the next fire
/// time. P0002 for an unknown schedule.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn update_schedule(name: Option<&str>, spec: Option<Jsonb>) -> TimestampWithTimeZone {
    let name = schedules::check_name(name);
    let patch = required(spec, "spec").parse("spec");
    let next = schedules::update(name, &patch);
    audit::record("update_schedule", name, "ok", patch);
    next
}

/// Pauses a schedule: it fires nothing until resumed. `false` if it was
/// paused already.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn pause_schedule(name: Option<&str>) -> bool {
    let name = schedules::check_name(name);
    let changed = schedules::set_paused(name, true);
    audit::record(
        "pause_schedule",
        name,
        "ok",
        serde_json::json!({ "changed": changed }),
    );
    changed
}

/// Resumes a paused schedule from its next fire time after now (what fell
/// due while it was paused is not caught up). `false` if it was not paused.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn resume_schedule(name: Option<&str>) -> bool {
    let name = schedules::check_name(name);
    let changed = schedules::set_paused(name, false);
    audit::record(
        "resume_schedule",
        name,
        "ok",
        serde_json::json!({ "changed": changed }),
    );
    changed
}

/// Deletes a schedule and its fire records (what it started runs on);
/// `false` if there was none.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn delete_schedule(name: Option<&str>) -> bool {
    let name = schedules::check_name(name);
    let deleted = schedules::delete(name);
    audit::record(
        "delete_schedule",
        name,
        "ok",
        serde_json::json!({ "deleted": deleted }),
    );
    deleted
}

/// Fires a schedule now (paused or not), under its overlap policy: the
/// fire's time, outcome (`started`, `skipped_overlap`, `failed`), what it
/// started and why it failed.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn trigger_schedule(
    name: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(fire_at, TimestampWithTimeZone),
        name!(outcome, String),
        name!(execution_id, Option<pgrx::Uuid>),
        name!(task_id, Option<pgrx::Uuid>),
        name!(error, Option<String>),
    ),
> {
    let name = schedules::check_name(name);
    let fire = schedules::trigger(name);
    audit::record("trigger_schedule", name, &fire.1, serde_json::json!({}));
    TableIterator::once(fire)
}

/// Every schedule on this shard, by name.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn list_schedules() -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(spec, pgrx::JsonB),
        name!(paused, bool),
        name!(next_fire_at, Option<TimestampWithTimeZone>),
        name!(last_fire_at, Option<TimestampWithTimeZone>),
        name!(last_outcome, Option<String>),
        name!(last_error, Option<String>),
        name!(fires, i64),
        name!(skipped, i64),
        name!(created_at, TimestampWithTimeZone),
        name!(updated_at, TimestampWithTimeZone),
    ),
> {
    TableIterator::new(schedules::list().into_iter().map(|s| {
        (
            s.name,
            s.spec,
            s.paused,
            s.next_fire_at,
            s.last_fire_at,
            s.last_outcome,
            s.last_error,
            s.fires,
            s.skipped,
            s.created_at,
            s.updated_at,
        )
    }))
}

/// A schedule's fire records, newest first, before `before` (a keyset
/// page, 1 to 1000 rows).
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn schedule_fires(
    name: Option<&str>,
    before: default!(Option<TimestampWithTimeZone>, "NULL"),
    max_rows: default!(Option<i32>, "100"),
) -> TableIterator<
    'static,
    (
        name!(fire_at, TimestampWithTimeZone),
        name!(fired_at, TimestampWithTimeZone),
        name!(outcome, String),
        name!(execution_id, Option<pgrx::Uuid>),
        name!(task_id, Option<pgrx::Uuid>),
        name!(error, Option<String>),
        name!(manual, bool),
    ),
> {
    let name = schedules::check_name(name);
    let max = required(max_rows, "max_rows");
    if !(1..=1000).contains(&max) {
        bad_argument("max_rows", format!("must be from 1 to 1000, got {max}"));
    }
    if before.is_some_and(|b| !b.is_finite()) {
        bad_argument("before", "must be a finite timestamp");
    }
    TableIterator::new(
        schedules::fires(name, before, i64::from(max))
            .into_iter()
            .map(|f| {
                (
                    f.fire_at,
                    f.fired_at,
                    f.outcome,
                    f.execution_id,
                    f.task_id,
                    f.error,
                    f.manual,
                )
            }),
    )
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::{count, declare, init, one};
    use pgrx::prelude::*;
    use serde_json::json;

    fn create(name: &str, spec: serde_json::Value) {
        Spi::run_with_args(
            "SELECT sheaf.create_schedule($1, $2)",
            &[name.into(), pgrx::JsonB(spec).into()],
        )
        .expect("create_schedule");
    }

    /// Makes `name` due `secs` ago, as if the shard had been down.
    fn due(name: &str, secs: i64) {
        Spi::run_with_args(
            "UPDATE sheaf.schedules SET next_fire_at = date_trunc('second', now()) - make_interval(secs => $2) \
             WHERE name = $1",
            &[name.into(), (secs as f64).into()],
        )
        .unwrap();
    }

    fn fired() -> i64 {
        Spi::get_one::<i64>("SELECT (sheaf.maintain()->>'schedules_fired')::bigint")
            .unwrap()
            .unwrap()
    }

    #[pg_test]
    fn a_due_schedule_starts_its_workflow_once() {
        init();
        create(
            "nightly",
            json!({"cron": "0 3 * * *", "time_zone": "Europe/Berlin",
                   "workflow": {"name": "report", "input": {"full": true}}}),
        );
        assert_eq!(fired(), 0, "not due yet");
        // Yesterday's 03:00 in Berlin: missed, so due.
        Spi::run(
            "UPDATE sheaf.schedules SET next_fire_at = \
               (date_trunc('day', now() AT TIME ZONE 'Europe/Berlin') - interval '21 hours') AT TIME ZONE 'Europe/Berlin'",
        )
        .unwrap();
        assert_eq!(fired(), 1);
        assert_eq!(fired(), 0, "a fire time fires once");
        assert_eq!(
            count(
                "SELECT count(*) FROM sheaf.executions WHERE workflow_name = 'report' AND workflow_id LIKE 'report@%'"
            ),
            1
        );
        assert_eq!(
            count(
                "SELECT count(*) FROM sheaf.schedule_fires WHERE outcome = 'started' AND execution_id IS NOT NULL"
            ),
            1
        );
        let next_is_later = Spi::get_one::<bool>("SELECT next_fire_at > now() FROM sheaf.schedules").unwrap();
        assert_eq!(next_is_later, Some(true));
    }

    #[pg_test]
    fn catch_up_all_fires_the_latest_missed_times_and_once_fires_one() {
        init();
        create(
            "all",
            json!({"cron": "@every 1s", "task": {"queue": "ticks", "payload": {}},
                   "catch_up": "all", "catch_up_max": 3, "overlap": "allow"}),
        );
        create("once", json!({"cron": "@every 1s", "task": {"queue": "tocks"}}));
        due("all", 10);
        due("once", 10);
        assert_eq!(fired(), 4);
        assert_eq!(count("SELECT count(*) FROM sheaf.tasks WHERE queue = 'ticks'"), 3);
        assert_eq!(count("SELECT count(*) FROM sheaf.tasks WHERE queue = 'tocks'"), 1);
        assert_eq!(count("SELECT skipped FROM sheaf.schedules WHERE name = 'all'"), 8);
    }

    #[pg_test]
    fn overlap_skip_waits_for_the_previous_run_and_cancel_previous_ends_it() {
        init();
        create("s", json!({"cron": "@every 1s", "workflow": {"name": "w"}}));
        create(
            "c",
            json!({"cron": "@every 1s", "workflow": {"name": "v"}, "overlap": "cancel_previous"}),
        );
        due("s", 1);
        due("c", 1);
        assert_eq!(fired(), 2);
        row! {
            struct Outcomes {
                skip: String,
                cancel_previous: String,
            }
        }
        let outcomes: Outcomes = one(
            "SELECT (SELECT outcome FROM sheaf.trigger_schedule('s')), (SELECT outcome FROM sheaf.trigger_schedule('c'))",
            &[],
        );
        assert_eq!(
            (outcomes.skip.as_str(), outcomes.cancel_previous.as_str()),
            ("skipped_overlap", "started")
        );
        assert_eq!(
            count(
                "SELECT count(*) FROM sheaf.schedule_fires WHERE schedule = 's' AND outcome = 'skipped_overlap'"
            ),
            1
        );
        assert_eq!(
            count("SELECT count(*) FROM sheaf.executions WHERE workflow_name = 'v' AND state = 'CANCELLED'"),
            1
        );
        assert_eq!(
            count("SELECT count(*) FROM sheaf.executions WHERE workflow_name = 'v' AND state = 'RUNNING'"),
            1
        );
    }

    #[pg_test]
    fn a_refused_start_is_recorded_and_the_sweep_goes_on() {
        init();
        declare(
            "q",
            json!({"quota": {"key": "input.t", "max_active_executions": 1}}),
        );
        Spi::run("SELECT sheaf.start_workflow('q', 'first', '{\"t\": \"a\"}')").unwrap();
        create(
            "full",
            json!({"cron": "@every 1s", "workflow": {"name": "q", "input": {"t": "a"}}}),
        );
        create("fine", json!({"cron": "@every 1s", "task": {"queue": "ok"}}));
        due("full", 1);
        due("fine", 1);
        assert_eq!(fired(), 1);
        let error = Spi::get_one::<String>("SELECT error FROM sheaf.schedule_fires WHERE schedule = 'full'")
            .unwrap()
            .unwrap();
        assert!(error.starts_with("53400"), "{error}");
        assert_eq!(
            count("SELECT count(*) FROM sheaf.executions WHERE workflow_name = 'q'"),
            1
        );
        assert_eq!(count("SELECT count(*) FROM sheaf.tasks WHERE queue = 'ok'"), 1);
    }

    #[pg_test]
    fn trigger_pause_resume_update_and_delete() {
        init();
        create(
            "t",
            json!({"cron": "@daily", "task": {"queue": "tq", "payload": {"n": 1}}}),
        );
        let outcome = Spi::get_one::<String>("SELECT outcome FROM sheaf.trigger_schedule('t')").unwrap();
        assert_eq!(outcome.as_deref(), Some("started"));
        assert_eq!(
            Spi::get_one::<bool>("SELECT sheaf.pause_schedule('t')").unwrap(),
            Some(true)
        );
        assert_eq!(
            Spi::get_one::<bool>("SELECT sheaf.pause_schedule('t')").unwrap(),
            Some(false)
        );
        due("t", 5);
        assert_eq!(fired(), 0, "paused");
        assert_eq!(
            Spi::get_one::<bool>("SELECT sheaf.resume_schedule('t')").unwrap(),
            Some(true)
        );
        assert_eq!(fired(), 0, "what fell due while paused is not caught up");
        Spi::run(
            "SELECT sheaf.update_schedule('t', '{\"task\": {\"queue\": \"tq\", \"payload\": {\"n\": 2}}}')",
        )
        .unwrap();
        let spec = Spi::get_one::<pgrx::JsonB>("SELECT spec FROM sheaf.list_schedules()")
            .unwrap()
            .unwrap();
        assert_eq!(spec.0["task"]["payload"]["n"], 2);
        assert_eq!(spec.0["cron"], "@daily");
        assert_eq!(count("SELECT count(*) FROM sheaf.schedule_fires('t')"), 1);
        assert_eq!(
            Spi::get_one::<bool>("SELECT sheaf.delete_schedule('t')").unwrap(),
            Some(true)
        );
        assert_eq!(count("SELECT count(*) FROM sheaf.schedule_fires"), 0);
        assert_eq!(
            count("SELECT count(*) FROM sheaf.audit_log() WHERE action LIKE '%schedule'"),
            7
        );
    }

    #[pg_test(error = "schedule \"t\" exists: update_schedule changes it")]
    fn a_taken_name_is_refused() {
        init();
        create("t", json!({"cron": "@daily", "task": {"queue": "q"}}));
        create("t", json!({"cron": "@daily", "task": {"queue": "q"}}));
    }

    #[pg_test(
        error = "invalid spec.time_zone: \"Mars/Base\" is not an IANA time zone name (like \"Europe/Berlin\" or \"UTC\")"
    )]
    fn an_unknown_zone_is_refused() {
        init();
        create(
            "t",
            json!({"cron": "0 3 * * *", "time_zone": "Mars/Base", "task": {"queue": "q"}}),
        );
    }
}
