//! Schedules: a timing (`sheaf_core::schedule`) and what each fire starts, a
//! workflow or a task, fired by `sheaf.maintain` on the shard that holds
//! them.
//!
//! A sweep locks each due schedule (`FOR UPDATE SKIP LOCKED`: concurrent
//! sweeps share the work, never a schedule), plans its due fire times by the
//! catch-up policy, and fires each in a subtransaction after writing its
//! record, whose primary key is (schedule, fire time): a fire time fires once
//! however many connections sweep, and a start the shard refuses (a quota, a
//! gate) is recorded `failed` without aborting the sweep.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use sheaf_core::options::{EnqueueOptions, MAX_CONCURRENCY_KEY_BYTES, MAX_KEY_BYTES, MAX_QUEUE_NAME_BYTES};
use sheaf_core::schedule::{self, Action, Overlap, Spec};

use crate::base::args;
use crate::base::catalog::{self, Feature};
use crate::base::errors::{bad_argument, not_found, not_ready};
use crate::base::jsonb::Jsonb;
use crate::base::names::{self, Kind};
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::base::subxact;
use crate::queue::{cancel, enqueue};
use crate::workflow::executions::{self, INTAKE};
use crate::workflow::hooks::EXECUTIONS;
use crate::workflow::lifecycle::{self, Close};
use crate::workflow::start;

/// Due fire times one sweep looks at per schedule: a schedule further
/// behind catches up over several sweeps.
const PLAN_BUDGET: usize = 10_000;

/// Whether this catalog has schedules (not a 0.1.0 catalog).
pub fn enabled() -> bool {
    catalog::has(Feature::Schedules)
}

fn require_enabled() {
    if !enabled() {
        not_ready("this shard's schema has no schedules: ALTER EXTENSION sheaf UPDATE first");
    }
}

// Times cross as microseconds since the Unix epoch (`sheaf_core::schedule`).
macro_rules! us {
    ($col:literal) => {
        concat!("(extract(epoch from ", $col, ") * 1000000)::bigint")
    };
}
macro_rules! ts {
    ($param:literal) => {
        concat!("(to_timestamp(0) + ", $param, " * interval '1 microsecond')")
    };
}

const NOW: Stmt = Stmt::read(concat!("SELECT ", us!("now()")), &[]);
const INSERT: Stmt = Stmt::write(
    concat!(
        "INSERT INTO schedules (name, spec, next_fire_at) VALUES ($1, $2, ",
        ts!("$3"),
        ") ON CONFLICT (name) DO NOTHING RETURNING next_fire_at"
    ),
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::INT8OID,
    ],
);
const LOCK: Stmt = Stmt::write(
    concat!(
        "SELECT spec, paused, ",
        us!("next_fire_at"),
        ", last_execution_id, last_task_id FROM schedules WHERE name = $1 FOR UPDATE"
    ),
    &[PgBuiltInOids::TEXTOID],
);
const REPLACE: Stmt = Stmt::write(
    concat!(
        "UPDATE schedules SET spec = $2, next_fire_at = ",
        ts!("$3"),
        ", updated_at = now() WHERE name = $1 RETURNING next_fire_at"
    ),
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::INT8OID,
    ],
);
const SET_PAUSED: Stmt = Stmt::write(
    concat!(
        "UPDATE schedules SET paused = $2, updated_at = now(), \
                next_fire_at = CASE WHEN $3::bigint IS NULL THEN next_fire_at ELSE ",
        ts!("$3"),
        " END WHERE name = $1 AND paused <> $2 RETURNING true"
    ),
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::BOOLOID,
        PgBuiltInOids::INT8OID,
    ],
);
const DELETE: Stmt = Stmt::write(
    "WITH s AS (DELETE FROM schedules WHERE name = $1 RETURNING name), \
          f AS (DELETE FROM schedule_fires WHERE schedule IN (SELECT name FROM s)) \
     SELECT count(*) FROM s",
    &[PgBuiltInOids::TEXTOID],
);
const DUE: Stmt = Stmt::write(
    "SELECT name FROM schedules WHERE NOT paused AND next_fire_at <= now() \
     ORDER BY next_fire_at LIMIT $1 FOR UPDATE SKIP LOCKED",
    &[PgBuiltInOids::INT8OID],
);
const ADVANCE: Stmt = Stmt::write(
    concat!(
        "UPDATE schedules SET next_fire_at = ",
        ts!("$2"),
        ", skipped = skipped + $3 WHERE name = $1"
    ),
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::INT8OID,
    ],
);
const RECORD_FIRE: Stmt = Stmt::write(
    concat!(
        "INSERT INTO schedule_fires (schedule, fire_at, outcome, manual) VALUES ($1, ",
        ts!("$2"),
        ", 'started', $3) ON CONFLICT DO NOTHING RETURNING true"
    ),
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::BOOLOID,
    ],
);
const SETTLE_FIRE: Stmt = Stmt::write(
    concat!(
        "WITH f AS (UPDATE schedule_fires SET outcome = $3, execution_id = $4, task_id = $5, error = $6 \
                    WHERE schedule = $1 AND fire_at = ",
        ts!("$2"),
        ") \
         UPDATE schedules SET last_fire_at = ",
        ts!("$2"),
        ", last_outcome = $3, last_error = $6, fires = fires + 1, \
                last_execution_id = coalesce($4, last_execution_id), last_task_id = coalesce($5, last_task_id) \
         WHERE name = $1"
    ),
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
    ],
);
const FIRE_TIME: Stmt = Stmt::read(concat!("SELECT ", ts!("$1")), &[PgBuiltInOids::INT8OID]);
const TASK_UNFINISHED: Stmt = Stmt::read(
    "SELECT EXISTS (SELECT 1 FROM tasks WHERE id = $1)",
    &[PgBuiltInOids::UUIDOID],
);
const LIST: Stmt = Stmt::read(
    "SELECT name, spec, paused, next_fire_at, last_fire_at, last_outcome, last_error, fires, skipped, \
            created_at, updated_at FROM schedules ORDER BY name",
    &[],
);
const FIRES: Stmt = Stmt::read(
    "SELECT fire_at, fired_at, outcome, execution_id, task_id, error, manual FROM schedule_fires \
     WHERE schedule = $1 AND fire_at < coalesce($2, 'infinity') ORDER BY fire_at DESC LIMIT $3",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TIMESTAMPTZOID,
        PgBuiltInOids::INT8OID,
    ],
);
const PRUNE_FIRES: Stmt = Stmt::write(
    "WITH old AS (SELECT schedule, fire_at FROM schedule_fires \
                  WHERE fired_at < now() - make_interval(secs => $1) ORDER BY fired_at LIMIT $2), \
          gone AS (DELETE FROM schedule_fires f USING old \
                   WHERE f.schedule = old.schedule AND f.fire_at = old.fire_at RETURNING 1) \
     SELECT count(*) FROM gone",
    &[PgBuiltInOids::FLOAT8OID, PgBuiltInOids::INT8OID],
);

/// A schedule name: 1 to 256 bytes.
pub fn check_name(name: Option<&str>) -> &str {
    let name = crate::base::args::required(name, "name");
    if name.is_empty() || name.len() > 256 {
        bad_argument("name", format!("must be 1 to 256 bytes, got {}", name.len()));
    }
    name
}

/// The name rule (`args::new_name`) on the names a spec's fires would
/// store, when the spec is given (a stored spec fires as it was accepted):
/// the workflow's name or the task's queue (stored ones keep working), and
/// the keys of their options.
fn check_new_names(action: &Action) {
    match action {
        Action::Workflow { name, opts, .. } => {
            args::new_name(name, "spec.workflow.name", MAX_KEY_BYTES, || {
                names::stored(Kind::Workflow, name)
            });
            if let Some(q) = &opts.queue {
                args::new_name(q, "spec.workflow.opts.queue", MAX_QUEUE_NAME_BYTES, || {
                    names::stored(Kind::Queue, q)
                });
            }
        }
        Action::Task { queue, opts, .. } => {
            args::new_name(queue, "spec.task.queue", MAX_QUEUE_NAME_BYTES, || {
                names::stored(Kind::Queue, queue)
            });
            args::new_key(
                opts.concurrency_key.as_deref(),
                "spec.task.opts.concurrency_key",
                MAX_CONCURRENCY_KEY_BYTES,
            );
            args::new_key(
                opts.fairness_key.as_deref(),
                "spec.task.opts.fairness_key",
                MAX_KEY_BYTES,
            );
        }
    }
}

fn parse(spec: &serde_json::Value) -> Spec {
    Spec::parse(spec).unwrap_or_else(|e| bad_argument(&e.option, e.why))
}

fn now_us() -> i64 {
    NOW.one_value(&[], "reading the time")
}

/// The first fire time after now (a spec that never fires was refused).
fn first_fire(spec: &Spec) -> i64 {
    spec.timing
        .next_after(now_us())
        .unwrap_or_else(|| bad_argument("spec.cron", "never fires (no time matches within 30 years)"))
}

struct Locked {
    spec: serde_json::Value,
    paused: bool,
    next: Option<i64>,
    last_execution: Option<pgrx::Uuid>,
    last_task: Option<pgrx::Uuid>,
}

row! {
    /// A schedule's row as `LOCK` reads it.
    struct LockedRow {
        spec: pgrx::JsonB,
        paused: bool,
        next: Option<i64>,
        last_execution: Option<pgrx::Uuid>,
        last_task: Option<pgrx::Uuid>,
    }
}

fn lock(name: &str) -> Option<Locked> {
    let row: Option<LockedRow> = LOCK.first(&[name.into()], "locking a schedule");
    row.map(|r| Locked {
        spec: r.spec.0,
        paused: r.paused,
        next: r.next,
        last_execution: r.last_execution,
        last_task: r.last_task,
    })
}

fn lock_known(name: &str) -> Locked {
    lock(name).unwrap_or_else(|| not_found(format!("no schedule {} on this shard", excerpt(name))))
}

fn excerpt(name: &str) -> String {
    sheaf_core::excerpt::quoted(name)
}

/// Creates a schedule; returns its first fire time. 55000 if the name is
/// taken.
pub fn create(name: &str, spec: &serde_json::Value) -> TimestampWithTimeZone {
    require_enabled();
    let spec = parse(spec);
    check_new_names(&spec.action);
    let next = first_fire(&spec);
    let created: Option<TimestampWithTimeZone> = INSERT.value(
        &[
            name.into(),
            Jsonb::from_value(spec.normalized).into(),
            next.into(),
        ],
        "creating a schedule",
    );
    created.unwrap_or_else(|| {
        not_ready(format!(
            "schedule {} exists: update_schedule changes it",
            excerpt(name)
        ))
    })
}

/// Replaces the fields of a schedule's spec that `patch` names; its timing
/// starts again from now (fire times missed before are not caught up).
/// Returns its next fire time.
pub fn update(name: &str, patch: &serde_json::Value) -> TimestampWithTimeZone {
    require_enabled();
    let Some(patch_fields) = patch.as_object() else {
        bad_argument("spec", "must be a JSON object of the fields to change");
    };
    let s = lock_known(name);
    let mut merged = s.spec;
    if let Some(m) = merged.as_object_mut() {
        for (k, v) in patch_fields {
            // Naming one action drops the other: a schedule starts one thing.
            match k.as_str() {
                "workflow" => {
                    m.remove("task");
                }
                "task" => {
                    m.remove("workflow");
                }
                _ => {}
            }
            if v.is_null() {
                m.remove(k);
            } else {
                m.insert(k.clone(), v.clone());
            }
        }
        // `catch_up_max` goes with `catch_up: "all"`.
        if m.get("catch_up").and_then(|c| c.as_str()) != Some("all") {
            m.remove("catch_up_max");
        }
    }
    let spec = parse(&merged);
    // A patch naming the action gives its names anew; one that does not
    // keeps the stored action as it was accepted.
    if patch_fields.contains_key("workflow") || patch_fields.contains_key("task") {
        check_new_names(&spec.action);
    }
    let next = first_fire(&spec);
    REPLACE.one_value(
        &[
            name.into(),
            Jsonb::from_value(spec.normalized).into(),
            next.into(),
        ],
        "updating a schedule",
    )
}

/// Pauses (`true`) or resumes a schedule; `false` if it already was. A
/// resumed schedule fires next after now: what fell due while it was paused
/// is not caught up.
pub fn set_paused(name: &str, paused: bool) -> bool {
    require_enabled();
    let s = lock_known(name);
    let next = if paused {
        None
    } else {
        Some(first_fire(&parse(&s.spec)))
    };
    SET_PAUSED
        .value::<bool>(&[name.into(), paused.into(), next.into()], "pausing a schedule")
        .unwrap_or(false)
}

/// Deletes a schedule and its fire records; `false` if there was none. What
/// it started runs on.
pub fn delete(name: &str) -> bool {
    require_enabled();
    let n: i64 = DELETE.one_value(&[name.into()], "deleting a schedule");
    n > 0
}

/// One fire: its time, outcome, what it started, why it failed.
pub type Fire = (
    TimestampWithTimeZone,
    String,
    Option<pgrx::Uuid>,
    Option<pgrx::Uuid>,
    Option<String>,
);

/// Fires a schedule now, paused or not, under its overlap policy.
pub fn trigger(name: &str) -> Fire {
    require_enabled();
    let s = lock_known(name);
    let spec = parse(&s.spec);
    let at = now_us();
    let mut last = (s.last_execution, s.last_task);
    match fire(name, &spec, at, true, &mut last) {
        Some(f) => f,
        // Two triggers in one microsecond: the second finds the first's record.
        None => not_ready(format!(
            "schedule {} was fired at this instant already",
            excerpt(name)
        )),
    }
}

/// Fires the due times of up to `max` schedules; returns the fires started.
pub fn fire_due(max: i64) -> i64 {
    if !enabled() {
        return 0;
    }
    let due: Vec<String> = DUE.values(&[max.into()], "reading due schedules");
    let now = now_us();
    let mut started = 0;
    for name in due {
        let Some(s) = lock(&name) else { continue };
        let (Some(next), false) = (s.next, s.paused) else {
            continue;
        };
        // A spec this library cannot read (stored by another version) is
        // left as it is, never fired on a guess.
        let Ok(spec) = Spec::parse(&s.spec) else { continue };
        let plan = schedule::plan(&spec.timing, spec.catch_up, next, now, PLAN_BUDGET);
        let mut last = (s.last_execution, s.last_task);
        for at in &plan.fire {
            if let Some((_, outcome, ..)) = fire(&name, &spec, *at, false, &mut last)
                && outcome == "started"
            {
                started += 1;
            }
        }
        // A timing with no further fire keeps its last time: it is never
        // due again.
        let next = plan.next.unwrap_or(next);
        ADVANCE.exec(&[name.as_str().into(), next.into(), (plan.skipped as i64).into()]);
    }
    started
}

/// Whether the previous fire's run or task is unfinished. A run that moved
/// to another shard cannot be seen from here: it counts as finished.
fn unfinished(last: (Option<pgrx::Uuid>, Option<pgrx::Uuid>), action: &Action) -> bool {
    match action {
        Action::Workflow { .. } => last
            .0
            .and_then(executions::state_of)
            .is_some_and(|s| s.is_active()),
        Action::Task { .. } => last
            .1
            .is_some_and(|id| TASK_UNFINISHED.one_value::<bool>(&[id.into()], "reading a scheduled task")),
    }
}

/// Fires time `at` of schedule `name` (locked): its record, the overlap
/// policy, then the start in a subtransaction. `None` if `at` was fired
/// already (its record exists).
fn fire(
    name: &str,
    spec: &Spec,
    at: i64,
    manual: bool,
    last: &mut (Option<pgrx::Uuid>, Option<pgrx::Uuid>),
) -> Option<Fire> {
    let first: Option<bool> = RECORD_FIRE.value(&[name.into(), at.into(), manual.into()], "recording a fire");
    first?;
    let busy = unfinished(*last, &spec.action);
    let outcome = if busy && spec.overlap == Overlap::Skip {
        ("skipped_overlap", None, None, None)
    } else {
        let cancel_previous = busy && spec.overlap == Overlap::CancelPrevious;
        let previous = *last;
        match subxact::attempt(|| {
            if cancel_previous {
                cancel(name, at, previous, &spec.action);
            }
            begin(name, spec, at)
        }) {
            Ok((execution, task)) => ("started", execution, task, None),
            Err(f) => (
                "failed",
                None,
                None,
                Some(format!("{}: {}", f.sqlstate, f.message)),
            ),
        }
    };
    let (what, execution, task, error) = outcome;
    SETTLE_FIRE.exec(&[
        name.into(),
        at.into(),
        what.into(),
        execution.into(),
        task.into(),
        error.clone().into(),
    ]);
    if what == "started" {
        *last = (execution.or(last.0), task.or(last.1));
    }
    let fire_at: TimestampWithTimeZone = FIRE_TIME.one_value(&[at.into()], "reading a fire time");
    Some((fire_at, what.to_owned(), execution, task, error))
}

/// Ends the previous fire's run or task (`overlap: cancel_previous`).
fn cancel(name: &str, at: i64, previous: (Option<pgrx::Uuid>, Option<pgrx::Uuid>), action: &Action) {
    let reason = format!(
        "superseded by schedule {}'s fire at {}",
        excerpt(name),
        schedule::fire_label(at)
    );
    match action {
        Action::Workflow { .. } => {
            if let Some(id) = previous.0 {
                lifecycle::close(id, Close::Cancelled { reason: Some(reason) });
            }
        }
        Action::Task { .. } => {
            if let Some(id) = previous.1 {
                cancel::cancel(id, Some(&reason), &EXECUTIONS);
            }
        }
    }
}

/// Starts fire `at`'s work: a workflow `<prefix>@<fire time>` or a task,
/// due at the fire time plus its jitter.
fn begin(name: &str, spec: &Spec, at: i64) -> (Option<pgrx::Uuid>, Option<pgrx::Uuid>) {
    let jitter = spec.jitter_of(name, at);
    let run_at = (jitter > 0).then(|| schedule::fire_label(at + jitter));
    match &spec.action {
        Action::Workflow {
            name: workflow,
            input,
            id_prefix,
            opts,
            ..
        } => {
            let workflow_id = format!("{id_prefix}@{}", schedule::fire_label(at));
            let mut o = opts.clone();
            o.run_at = run_at;
            let (id, ..) = start::start(workflow, &workflow_id, Jsonb::from_value(input.clone()), &o);
            (Some(id), None)
        }
        Action::Task {
            queue, payload, opts, ..
        } => {
            let o = EnqueueOptions {
                run_at,
                ..opts.clone()
            };
            let ids = enqueue::insert(queue, vec![Jsonb::from_value(payload.clone())], &o, &INTAKE);
            (None, ids.first().copied())
        }
    }
}

row! {
    /// A schedule as `list_schedules` returns it.
    pub struct Listed {
        pub name: String,
        pub spec: pgrx::JsonB,
        pub paused: bool,
        pub next_fire_at: Option<TimestampWithTimeZone>,
        pub last_fire_at: Option<TimestampWithTimeZone>,
        pub last_outcome: Option<String>,
        pub last_error: Option<String>,
        pub fires: i64,
        pub skipped: i64,
        pub created_at: TimestampWithTimeZone,
        pub updated_at: TimestampWithTimeZone,
    }
}

/// Every schedule on this shard, by name.
pub fn list() -> Vec<Listed> {
    require_enabled();
    LIST.all(&[], "listing schedules")
}

row! {
    /// A fire record as `schedule_fires` returns it.
    pub struct FireRecord {
        pub fire_at: TimestampWithTimeZone,
        pub fired_at: TimestampWithTimeZone,
        pub outcome: String,
        pub execution_id: Option<pgrx::Uuid>,
        pub task_id: Option<pgrx::Uuid>,
        pub error: Option<String>,
        pub manual: bool,
    }
}

/// A schedule's fire records before `before` (newest first).
pub fn fires(name: &str, before: Option<TimestampWithTimeZone>, max: i64) -> Vec<FireRecord> {
    require_enabled();
    FIRES.all(&[name.into(), before.into(), max.into()], "reading fire records")
}

/// Deletes up to `max` fire records older than `secs`; returns how many.
pub fn prune_fires(secs: f64, max: i64) -> i64 {
    if !enabled() {
        return 0;
    }
    PRUNE_FIRES.one_value(&[secs.into(), max.into()], "pruning fire records")
}
