//! The usage report and the cost ledger: what a window of this shard's
//! executions used, per workflow name or per search attribute.
//!
//! Each unit is counted once, in the window it happened, from durable
//! rows that never change: a start from its execution's `created_at`; an
//! execution's end from its `Workflow*` event (not from the mutable state);
//! an activity attempt from the event that ended it (`TaskCompleted`,
//! `TaskFailed`, `TaskDeadLettered`, `TaskReaped`), whose `secs` are its
//! compute seconds; metered units from `usage_records`. Every read seeks an
//! index by time (`executions_created`, `events_usage`,
//! `usage_records_window`): the cost follows the rows in the window.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

use sheaf_core::state::ExecutionState;
use sheaf_core::usage::{GroupBy, UNATTRIBUTED};

use crate::base::errors::unknown_execution;
use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;
use crate::base::rows::row;

/// The events the report counts; `events_usage` is the partial index of
/// exactly these (sql/schema.sql), which the statement's predicate repeats.
macro_rules! usage_events {
    () => {
        "('WorkflowCompleted', 'WorkflowFailed', 'WorkflowCancelled', 'WorkflowTimedOut', \
          'TaskCompleted', 'TaskFailed', 'TaskDeadLettered', 'TaskReaped')"
    };
}
/// A moved run counts once (`workflow::migration`): never as a staged copy
/// (MIGRATING), and as a seal (MIGRATED) only until its move is done (the
/// seal's `closed_at`), after which its new shard counts it.
macro_rules! counted {
    () => {
        "e.state <> 'MIGRATING' AND (e.state <> 'MIGRATED' OR e.closed_at IS NULL)"
    };
}
/// An execution's group: `$3` NULL groups by workflow name, else by the
/// text of search attribute `$3` (`$4` when it has none).
macro_rules! group {
    () => {
        "CASE WHEN $3::text IS NULL THEN e.workflow_name ELSE coalesce(e.search_attrs ->> $3::text, $4::text) END"
    };
}
macro_rules! attempt {
    ($events:expr) => {
        concat!(
            "v.event_type IN ",
            $events,
            " AND v.payload ->> 'kind' = 'activity'"
        )
    };
}

const REPORT: Stmt = Stmt::read(
    concat!(
        "WITH s AS (SELECT ",
        group!(),
        " AS grp, count(*) AS starts FROM executions e WHERE e.created_at >= $1 AND e.created_at < $2 AND ",
        counted!(),
        " GROUP BY 1), \
         v AS (SELECT ",
        group!(),
        " AS grp, \
                count(*) FILTER (WHERE v.event_type = 'WorkflowCompleted') AS completed, \
                count(*) FILTER (WHERE v.event_type = 'WorkflowFailed') AS failed, \
                count(*) FILTER (WHERE v.event_type = 'WorkflowCancelled') AS cancelled, \
                count(*) FILTER (WHERE v.event_type = 'WorkflowTimedOut') AS timed_out, \
                count(*) FILTER (WHERE ",
        attempt!("('TaskCompleted', 'TaskFailed', 'TaskDeadLettered', 'TaskReaped')"),
        ") AS attempts, \
                count(*) FILTER (WHERE ",
        attempt!("('TaskFailed', 'TaskDeadLettered', 'TaskReaped')"),
        ") AS attempts_failed, \
                coalesce(sum(CASE WHEN jsonb_typeof(v.payload -> 'secs') = 'number' \
                                  THEN (v.payload ->> 'secs')::float8 END) FILTER (WHERE ",
        attempt!("('TaskCompleted', 'TaskFailed', 'TaskDeadLettered', 'TaskReaped')"),
        "), 0) AS secs \
              FROM events v JOIN executions e ON e.id = v.execution_id \
              WHERE v.created_at >= $1 AND v.created_at < $2 AND v.event_type IN ",
        usage_events!(),
        " AND ",
        counted!(),
        " GROUP BY 1), \
         m AS (SELECT grp, jsonb_object_agg(metric, total) AS metered FROM (\
                 SELECT ",
        group!(),
        " AS grp, k.key AS metric, sum(k.value::numeric) AS total \
                 FROM usage_records u JOIN executions e ON e.id = u.execution_id \
                      CROSS JOIN LATERAL jsonb_each_text(u.metrics) k \
                 WHERE u.recorded_at >= $1 AND u.recorded_at < $2 AND ",
        counted!(),
        " GROUP BY 1, 2) t GROUP BY grp) \
         SELECT g.grp, coalesce(s.starts, 0), coalesce(v.completed, 0), coalesce(v.failed, 0), \
                coalesce(v.cancelled, 0), coalesce(v.timed_out, 0), coalesce(v.attempts, 0), \
                coalesce(v.attempts_failed, 0), coalesce(v.secs, 0)::float8, coalesce(m.metered, '{}') \
         FROM (SELECT grp FROM s UNION SELECT grp FROM v UNION SELECT grp FROM m) g \
              LEFT JOIN s ON s.grp = g.grp LEFT JOIN v ON v.grp = g.grp LEFT JOIN m ON m.grp = g.grp \
         ORDER BY g.grp"
    ),
    &[
        PgBuiltInOids::TIMESTAMPTZOID,
        PgBuiltInOids::TIMESTAMPTZOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
    ],
);
const RECORD: Stmt = Stmt::write(
    "INSERT INTO usage_records (execution_id, metrics) VALUES ($1, $2)",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::JSONBOID],
);
const SHARE: Stmt = Stmt::write(
    "SELECT state FROM executions WHERE id = $1 FOR SHARE",
    &[PgBuiltInOids::UUIDOID],
);

row! {
    /// One group's row of the report, in `usage_report`'s column order.
    pub struct UsageRow {
        pub grp: String,
        pub workflow_starts: i64,
        pub completed: i64,
        pub failed: i64,
        pub cancelled: i64,
        pub timed_out: i64,
        pub activity_executions: i64,
        pub activity_executions_failed: i64,
        pub activity_compute_seconds: f64,
        pub metered: pgrx::JsonB,
    }
}

/// The report of `[from, to)`, one row per group, in group order.
pub fn report(from: TimestampWithTimeZone, to: TimestampWithTimeZone, group_by: &GroupBy) -> Vec<UsageRow> {
    let key = match group_by {
        GroupBy::WorkflowName => None,
        GroupBy::SearchAttr(key) => Some(key.as_str()),
    };
    REPORT.all(
        &[from.into(), to.into(), key.into(), UNATTRIBUTED.into()],
        "reading a usage report",
    )
}

/// Records `metrics` (checked: `sheaf_core::usage::check_metrics`)
/// against an execution of this shard, now; P0002 if it is not here.
pub fn record(id: pgrx::Uuid, metrics: Jsonb) {
    // Shared-locked, so a move's cutover (which locks the row) comes
    // wholly before this (then the seal forwards the call where the run
    // lives) or after (then its fingerprint has the record, and a record
    // added after the move's verify declines the cutover): never a record
    // left behind on a seal.
    let state: Option<ExecutionState> = SHARE.value(&[id.into()], "locking an execution");
    match state {
        None => unknown_execution(id),
        Some(state) => crate::workflow::executions::forward(id, state),
    }
    RECORD.exec(&[id.into(), metrics.into()]);
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::{claim, init, rows, start};
    use pgrx::prelude::*;
    use serde_json::json;

    row! {
        #[derive(Debug)]
        struct Report {
            grp: String,
            workflow_starts: i64,
            completed: i64,
            cancelled: i64,
            activity_executions: i64,
            activity_executions_failed: i64,
            activity_compute_seconds: f64,
            metered: pgrx::JsonB,
        }
    }

    fn report(group_by: &str) -> Vec<Report> {
        rows(
            "SELECT grp, workflow_starts, completed, cancelled, activity_executions, \
                    activity_executions_failed, activity_compute_seconds, metered \
             FROM sheaf.usage_report(now() - interval '1 hour', now() + interval '1 hour', $1)",
            &[group_by.into()],
        )
    }

    #[pg_test]
    fn starts_ends_attempts_and_metered_units_per_group() {
        init();
        let a = Spi::get_one::<pgrx::Uuid>(
            "SELECT execution_id FROM sheaf.start_workflow('w', 'a', '{}', '{\"search_attrs\": {\"tenant\": \"acme\"}}')",
        )
        .unwrap()
        .unwrap();
        let b = start("w", "b", json!({})).id;
        Spi::run_with_args(
            "SELECT sheaf.enqueue('acts', '{}', jsonb_build_object('execution_id', $1::text))",
            &[a.into()],
        )
        .unwrap();
        let t = claim("acts", 1).remove(0);
        Spi::run_with_args(
            "SELECT sheaf.complete($1, $2, '{}')",
            &[t.id.into(), t.token.into()],
        )
        .unwrap();
        Spi::run_with_args(
            "SELECT sheaf.record_usage($1, '{\"llm_calls\": 2, \"tokens\": 10}')",
            &[a.into()],
        )
        .unwrap();
        Spi::run_with_args("SELECT sheaf.record_usage($1, '{\"tokens\": 5}')", &[a.into()]).unwrap();
        Spi::run_with_args("SELECT sheaf.cancel_execution($1, 'x')", &[b.into()]).unwrap();
        let rows = report("workflow_name");
        assert_eq!(rows.len(), 1, "{rows:?}");
        let r = &rows[0];
        assert_eq!(
            (
                r.grp.as_str(),
                r.workflow_starts,
                r.completed,
                r.cancelled,
                r.activity_executions,
                r.activity_executions_failed
            ),
            ("w", 2, 0, 1, 1, 0)
        );
        assert!(r.activity_compute_seconds >= 0.0);
        assert_eq!(r.metered.0, json!({"llm_calls": 2, "tokens": 15}));
        let by_tenant: Vec<(String, i64)> = report("search_attr:tenant")
            .into_iter()
            .map(|r| (r.grp, r.workflow_starts))
            .collect();
        assert_eq!(
            by_tenant,
            vec![("(unattributed)".to_owned(), 1), ("acme".to_owned(), 1)]
        );
    }

    #[pg_test]
    #[should_panic(expected = "at most 90 days")]
    fn a_window_over_90_days_is_refused() {
        init();
        Spi::run("SELECT * FROM sheaf.usage_report(now() - interval '91 days', now())").unwrap();
    }

    #[pg_test]
    #[should_panic(expected = "must be a number from -1e15 to 1e15")]
    fn a_metric_must_be_a_number() {
        init();
        let b = start("w", "b", json!({})).id;
        Spi::run_with_args("SELECT sheaf.record_usage($1, '{\"x\": \"1\"}')", &[b.into()]).unwrap();
    }

    #[pg_test]
    #[should_panic(expected = "is one of sheaf's own event types")]
    fn sheafs_own_event_types_are_reserved() {
        init();
        let b = start("w", "b", json!({})).id;
        Spi::run_with_args(
            "SELECT sheaf.append_event($1, 'TaskCompleted', '{\"secs\": \"x\"}')",
            &[b.into()],
        )
        .unwrap();
    }
}
