//! The admission transaction: `start_workflow`.
//!
//! A start runs, in one transaction: active uniqueness (attach to the running
//! execution of the same name and workflow id), the quota check, the
//! concurrency gate (reject or supersede), then the insert of the execution,
//! its `WorkflowStarted` event and its first workflow task.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use sheaf_core::id;
use sheaf_core::placement::placement_to_json;
use sheaf_core::policy::{
    ConcurrencyPolicy, OnConflict, QuotaPolicy, StartOptions, WorkflowPolicy, resolve_key,
};
use sheaf_core::rate::{Throttle, throttle_name};
use sheaf_core::state::ExecutionState;

use crate::base::errors::{bad_argument, not_ready};
use crate::base::jsonb::Jsonb;
use crate::base::locks::{self, Class};
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::base::{clock, ids, shard};
use crate::queue::caps;
use crate::queue::rate::{self, Admission};
use crate::workflow::executions::{
    Locked, enqueue_workflow_task, placed_runs_enabled, task_key, timeouts_enabled,
};
use crate::workflow::{gates, history, policy, quota};

// Write statements read with a fresh snapshot: they must see what the
// previous holder of the start lock committed.
const HOLDING_ID: Stmt = Stmt::write(
    "SELECT id FROM executions WHERE workflow_name = $1 AND workflow_id = $2 \
     AND state IN ('RUNNING', 'SUSPENDED', 'PAUSED', 'MIGRATING', 'MIGRATED')",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::TEXTOID],
);
const ID_TAKEN: Stmt = Stmt::write(
    "SELECT EXISTS (SELECT 1 FROM executions WHERE id = $1)",
    &[PgBuiltInOids::UUIDOID],
);
// The documents a start writes around the caller's input, built by
// Postgres from the input as it stored it: the `WorkflowStarted` event's
// payload (naming the predecessor of a continue-as-new) and the first
// workflow task's.
const DOCUMENTS: Stmt = Stmt::read(
    "SELECT jsonb_build_object('workflow_id', $2::text, 'input', $3::jsonb) \
              || CASE WHEN $4::uuid IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('continued_from', $4::uuid) END, \
            jsonb_build_object('workflow_name', $1::text, 'workflow_id', $2::text, 'input', $3::jsonb)",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::UUIDOID,
    ],
);
const INSERT: Stmt = Stmt::write(
    "INSERT INTO executions (id, workflow_name, workflow_id, state, seq, queue, input, concurrency_key, quota_key, \
                             search_attrs, parent_id) \
     VALUES ($1, $2, $3, 'RUNNING', nextval('execution_seq'), $4, $5, $6, $7, $8, $9)",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::UUIDOID,
    ],
);
// With a deadline: the start's own timeout from now, or the one it
// inherits. Apart from `INSERT`, which a 0.1.0 catalog (no `timeout_at`)
// still takes.
const INSERT_TIMED: Stmt = Stmt::write(
    "INSERT INTO executions (id, workflow_name, workflow_id, state, seq, queue, input, concurrency_key, quota_key, \
                             search_attrs, parent_id, timeout_at) \
     VALUES ($1, $2, $3, 'RUNNING', nextval('execution_seq'), $4, $5, $6, $7, $8, $9, \
             coalesce($11, now() + $10 * interval '1 second'))",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::TIMESTAMPTZOID,
    ],
);
// A 0.3.0 catalog's: every column a start writes, the deadline (NULL:
// none) and how the caller placed it (NULL: sheaf's own start).
const INSERT_PLACED: Stmt = Stmt::write(
    "INSERT INTO executions (id, workflow_name, workflow_id, state, seq, queue, input, concurrency_key, quota_key, \
                             search_attrs, parent_id, timeout_at, placement) \
     VALUES ($1, $2, $3, 'RUNNING', nextval('execution_seq'), $4, $5, $6, $7, $8, $9, \
             coalesce($11, now() + $10 * interval '1 second'), $12)",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::TIMESTAMPTZOID,
        PgBuiltInOids::JSONBOID,
    ],
);

/// What a start returns: the execution, whether this start created it, and
/// the executions it superseded.
pub type Started = (pgrx::Uuid, bool, Vec<pgrx::Uuid>);

/// The gates that apply to one start: each policy with its key resolved
/// from the input (a missing or null key means that gate does not apply).
struct Gates<'p> {
    concurrency: Option<(&'p ConcurrencyPolicy, String)>,
    quota: Option<(&'p QuotaPolicy, String)>,
}

/// The input is read into a `serde_json::Value` only for a policy with a
/// gate, whose key it names.
fn resolve_gates<'p>(p: &'p WorkflowPolicy, input: &Jsonb) -> Gates<'p> {
    if p.concurrency.is_none() && p.quota.is_none() {
        return Gates {
            concurrency: None,
            quota: None,
        };
    }
    let input = input.clone().parse("input");
    let resolve = |segments: &[String], field: &str| match resolve_key(&input, segments, field) {
        Ok(k) => k,
        Err(e) => bad_argument(&format!("input (for {})", e.option), e.why),
    };
    Gates {
        concurrency: p
            .concurrency
            .as_ref()
            .and_then(|c| resolve(&c.key, "policy.concurrency.key").map(|k| (c, k))),
        quota: p
            .quota
            .as_ref()
            .and_then(|q| resolve(&q.key, "policy.quota.key").map(|k| (q, k))),
    }
}

/// Takes a start's advisory locks ahead of a row lock its caller needs
/// first (a parent's, for a child started in its transaction), so the
/// lock order holds (`base::locks`): the start lock, then the gate lock if
/// its policy gates admissions. `start_at` takes them again: transaction
/// advisory locks are reentrant.
pub fn lock_ahead(name: &str, workflow_id: &str, input: &Jsonb) {
    let p = policy::load(name);
    let gates = resolve_gates(&p, input);
    locks::exclusive_pair(Class::Start, name, workflow_id);
    if let Some((c, key)) = &gates.concurrency
        && c.on_conflict != OnConflict::Defer
    {
        locks::exclusive_pair(Class::Gate, name, key);
    }
}

/// The new execution's id: minted here, or the caller's, which must carry
/// this shard's prefix.
fn new_execution_id(given: Option<[u8; 16]>) -> pgrx::Uuid {
    match given.map(pgrx::Uuid::from_bytes) {
        None => ids::mint(),
        Some(given) => {
            let here = shard::current();
            let prefix = id::shard_of(given.as_bytes()) as i32;
            if prefix != here {
                bad_argument(
                    "opts.execution_id",
                    format!("{given} was minted for shard {prefix}, and this is shard {here}"),
                );
            }
            given
        }
    }
}

/// The active (or migrating) execution of (name, workflow id), if any. The
/// caller holds the start lock; a write statement reads a fresh snapshot.
fn holding(name: &str, workflow_id: &str) -> Option<pgrx::Uuid> {
    HOLDING_ID.value(
        &[name.into(), workflow_id.into()],
        "looking up an active execution",
    )
}

fn refuse_taken(new_id: pgrx::Uuid) {
    let taken: bool = ID_TAKEN.one_value(&[new_id.into()], "checking an execution id");
    if taken {
        bad_argument(
            "opts.execution_id",
            format!("{new_id} already names another execution on this shard"),
        );
    }
}

/// Starts an execution of workflow `name` with `workflow_id` (validated)
/// unless one is active: then returns it with `created = false`, changing
/// nothing. Refusals: 53400 (quota), 55006 (concurrency gate `reject`).
pub fn start(name: &str, workflow_id: &str, input: Jsonb, o: &StartOptions) -> Started {
    start_as(name, workflow_id, input, o, None)
}

/// `start`, of a child of `parent` (its `parent_id`) when given.
pub fn start_as(
    name: &str,
    workflow_id: &str,
    input: Jsonb,
    o: &StartOptions,
    parent: Option<pgrx::Uuid>,
) -> Started {
    let run_at = o
        .run_at
        .as_deref()
        .map(|s| match s.parse::<TimestampWithTimeZone>() {
            Ok(t) if t.is_finite() => t,
            _ => bad_argument(
                "opts.run_at",
                format!(
                    "must be a finite timestamp with time zone, got {}",
                    sheaf_core::excerpt::quoted(s)
                ),
            ),
        });
    start_at(name, workflow_id, input, o, parent, run_at)
}

/// `start_as`, the first workflow task due at `run_at` (parsed).
pub fn start_at(
    name: &str,
    workflow_id: &str,
    input: Jsonb,
    o: &StartOptions,
    parent: Option<pgrx::Uuid>,
    run_at: Option<TimestampWithTimeZone>,
) -> Started {
    let p = policy::load(name);
    let gates = resolve_gates(&p, &input);
    let new_id = new_execution_id(o.execution_id);

    // (1) Active uniqueness, serialized per (name, workflow id).
    locks::exclusive_pair(Class::Start, name, workflow_id);
    if let Some(existing) = holding(name, workflow_id) {
        return (existing, false, Vec::new());
    }
    refuse_taken(new_id);
    // (2) Quota: the early, lock-free check keeps the documented order of
    // refusals; the authoritative one (locked counters) runs after the gate,
    // so every path locks executions before quota counters.
    if let Some((q, key)) = &gates.quota {
        quota::precheck(name, key, q);
    }
    // (3) Concurrency gate.
    let superseded = match &gates.concurrency {
        Some((c, key)) => {
            caps::ensure_limit(&task_key(name, key), c.limit);
            gates::admit(name, key, c, new_id)
        }
        None => Vec::new(),
    };
    if let Some((q, key)) = &gates.quota {
        quota::admit(name, key, q);
    }
    // (4) The execution, its first event and its first workflow task.
    let started = Locked {
        id: new_id,
        state: ExecutionState::Running,
        workflow_name: name.to_owned(),
        workflow_id: workflow_id.to_owned(),
        concurrency_key: gates.concurrency.map(|(_, k)| k),
        quota_key: gates.quota.map(|(_, k)| k),
        queue: o.queue.clone().unwrap_or_else(|| p.queue.clone()),
        paused_from: None,
        parent_id: parent,
    };
    let (run_at, line) = match &p.throttle {
        Some(t) => throttle(name, t, &input, run_at),
        None => (run_at, None),
    };
    let begin = Begin {
        priority: o.priority,
        run_at,
        search_attrs: pgrx::JsonB(o.search_attrs.clone().unwrap_or_else(|| serde_json::json!({}))),
        timeout: Timeout::After(o.execution_timeout.map(|d| d.as_secs_f64())),
        continued_from: None,
        placement: o
            .record_placement
            .then(|| placement_to_json(&o.placement, o.tenant.as_deref())),
    };
    let task = insert(&started, input, begin);
    if let Some((bucket, key)) = line {
        rate::line(&bucket, &key, &[task]);
    }
    (new_id, true, superseded)
}

/// A throttled start's first workflow task: when its bucket admits it (not
/// before `run_at`), and the bucket whose line it joins if that is beyond
/// the lookahead (`queue::rate`). Starts are admitted in order per bucket.
fn throttle(
    name: &str,
    t: &Throttle,
    input: &Jsonb,
    run_at: Option<TimestampWithTimeZone>,
) -> (Option<TimestampWithTimeZone>, Option<(String, String)>) {
    let key = match &t.key {
        Some(path) => {
            let value = input.clone().parse("input");
            match resolve_key(&value, path, "policy.throttle.key") {
                Ok(k) => k.unwrap_or_default(),
                Err(e) => bad_argument(&format!("input (for {})", e.option), e.why),
            }
        }
        None => String::new(),
    };
    let bucket = throttle_name(name);
    let pace = rate::effective(&bucket, t.pace);
    let arrival = run_at.map_or(i64::MIN, clock::to_us);
    match rate::reserve(&bucket, &key, pace, &[arrival])[0] {
        Admission::At(us) => (Some(clock::from_us(us)), None),
        Admission::Line => (
            Some(TimestampWithTimeZone::positive_infinity()),
            Some((bucket, key)),
        ),
    }
}

/// A new execution's deadline.
pub enum Timeout {
    /// This long from now (`None`: no deadline).
    After(Option<f64>),
    /// A predecessor's (`None`: it had none).
    Inherited(Option<TimestampWithTimeZone>),
}

/// What a new execution starts with beside its input.
pub struct Begin {
    pub priority: i32,
    pub run_at: Option<TimestampWithTimeZone>,
    pub search_attrs: pgrx::JsonB,
    pub timeout: Timeout,
    /// The run it continues (continue-as-new), named by its first event.
    pub continued_from: Option<pgrx::Uuid>,
    /// How its caller placed it (`executions.placement`); `None` for
    /// sheaf's own starts.
    pub placement: Option<serde_json::Value>,
}

/// Writes a new execution, its `WorkflowStarted` event and its first
/// workflow task; returns the task's id.
pub fn insert(e: &Locked, input: Jsonb, b: Begin) -> pgrx::Uuid {
    row! {
        /// A start's `WorkflowStarted` event and its first task's payload.
        struct Documents {
            event: Jsonb,
            task: Jsonb,
        }
    }
    let Documents { event, task } = DOCUMENTS.one(
        &[
            e.workflow_name.as_str().into(),
            e.workflow_id.as_str().into(),
            input.clone().into(),
            b.continued_from.into(),
        ],
        "building a start's documents",
    );
    let (after, inherited) = match b.timeout {
        Timeout::After(secs) => (secs, None),
        Timeout::Inherited(at) => (None, at),
    };
    let timed = after.is_some() || inherited.is_some();
    if timed && !timeouts_enabled() {
        not_ready("this shard's schema has no execution timeouts: ALTER EXTENSION sheaf UPDATE first");
    }
    let mut args: Vec<pgrx::datum::DatumWithOid> = vec![
        e.id.into(),
        e.workflow_name.as_str().into(),
        e.workflow_id.as_str().into(),
        e.queue.as_str().into(),
        input.into(),
        e.concurrency_key.clone().into(),
        e.quota_key.clone().into(),
        b.search_attrs.into(),
        e.parent_id.into(),
    ];
    if placed_runs_enabled() {
        let placement = b.placement.map(Jsonb::from_value);
        args.extend([after.into(), inherited.into(), placement.into()]);
        INSERT_PLACED.exec(&args);
    } else if timed {
        args.extend([after.into(), inherited.into()]);
        INSERT_TIMED.exec(&args);
    } else {
        INSERT.exec(&args);
    }
    history::append_jsonb(e.id, "WorkflowStarted", event);
    enqueue_workflow_task(e, task, b.priority, b.run_at)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{claim, count, declare, init, start, state};
    use pgrx::prelude::*;
    use serde_json::json;

    /// A workflow's input is the caller's data: its numbers keep every digit
    /// and their scale in the execution, its first event and its task.
    #[pg_test]
    fn a_start_keeps_the_input_exactly() {
        init();
        let input = r#"{"amount": 12345678901234567890.10, "rate": 0.1000000000000000055511151231257827}"#;
        Spi::run_with_args(
            "SELECT sheaf.start_workflow('order', 'o-1', $1::jsonb)",
            &[input.into()],
        )
        .expect("start");
        let exact = |sql: &str| {
            Spi::get_one_with_args::<bool>(sql, &[input.into()])
                .expect("query")
                .expect("a row")
        };
        assert!(exact(
            "SELECT input::text = $1::jsonb::text FROM sheaf.executions"
        ));
        assert!(exact(
            "SELECT (payload -> 'input')::text = $1::jsonb::text FROM sheaf.tasks WHERE kind = 'workflow'"
        ));
    }

    #[pg_test]
    fn a_start_writes_the_execution_its_event_and_its_workflow_task() {
        init();
        let started = start("order", "o-1", json!({"sku": 7}));
        assert!(started.created && started.superseded.is_empty());
        let id = started.id;
        assert_eq!(state(id), "RUNNING");
        assert_eq!(
            Spi::get_one::<String>("SELECT event_type FROM sheaf.events WHERE seq = 1")
                .unwrap()
                .as_deref(),
            Some("WorkflowStarted")
        );
        let t = claim("default", 1);
        assert_eq!(t[0].payload.0["input"]["sku"], 7);
        assert_eq!(
            count("SELECT count(*) FROM sheaf.tasks WHERE kind = 'workflow' AND execution_id IS NOT NULL"),
            1
        );
    }

    #[pg_test]
    fn restarting_an_active_workflow_attaches_and_changes_nothing() {
        init();
        let id = start("order", "o-1", json!({})).id;
        let again = start("order", "o-1", json!({"other": true}));
        assert_eq!((again.id, again.created), (id, false));
        assert_eq!(count("SELECT count(*) FROM sheaf.events"), 1);
        assert_eq!(count("SELECT count(*) FROM sheaf.tasks"), 1);
        Spi::run_with_args("SELECT sheaf.complete_execution($1, NULL)", &[id.into()]).unwrap();
        let fresh = start("order", "o-1", json!({}));
        assert!(
            fresh.created && fresh.id != id,
            "a finished run frees its workflow id"
        );
        let found = Spi::get_one_with_args::<pgrx::Uuid>(
            "SELECT execution_id FROM sheaf.find_execution('order', 'o-1')",
            &[],
        )
        .unwrap();
        assert_eq!(found, Some(fresh.id), "the active run is found first");
    }

    #[pg_test]
    fn latest_wins_keeps_the_newest_and_leaves_other_workflows_alone() {
        init();
        declare(
            "doc",
            json!({"concurrency": {"key": "input.doc", "limit": 1, "on_conflict": "cancel_running"}}),
        );
        let other = start("other", "x", json!({"doc": "d"})).id;
        let first = start("doc", "a", json!({"doc": "d"})).id;
        let second = start("doc", "b", json!({"doc": "d"}));
        assert_eq!(second.superseded, vec![first]);
        let second = second.id;
        assert_eq!(state(first), "CANCELLED");
        assert_eq!(
            (state(second), state(other)),
            ("RUNNING".into(), "RUNNING".into())
        );
        let reason = Spi::get_one_with_args::<String>(
            "SELECT payload->>'reason' FROM sheaf.events WHERE execution_id = $1 AND event_type = 'WorkflowCancelled'",
            &[first.into()],
        )
        .unwrap()
        .unwrap();
        assert!(reason.contains("superseded by execution"), "{reason}");
        assert_eq!(
            count(
                "SELECT count(*) FROM sheaf.tasks WHERE execution_id IS NOT NULL AND concurrency_key = 'doc:d'"
            ),
            1,
            "the cancelled run's task is gone"
        );
    }

    #[pg_test(
        error = "workflow \"job\" refused: concurrency key \"k\" already has 1 active execution(s) (limit 1, on_conflict reject)"
    )]
    fn reject_refuses_a_start_over_the_limit() {
        init();
        declare(
            "job",
            json!({"concurrency": {"key": "input.k", "limit": 1, "on_conflict": "reject"}}),
        );
        start("job", "1", json!({"k": "k"}));
        start("job", "2", json!({"k": "k"}));
    }

    #[pg_test]
    fn a_missing_key_path_means_no_gate() {
        init();
        declare(
            "job",
            json!({"concurrency": {"key": "input.k", "limit": 1, "on_conflict": "reject"},
                             "quota": {"key": "input.k", "max_active_executions": 1}}),
        );
        start("job", "1", json!({}));
        let created = start("job", "2", json!({"k": null})).created;
        assert!(created);
    }

    #[pg_test]
    fn defer_caps_the_running_workflow_tasks() {
        init();
        declare(
            "job",
            json!({"queue": "jobs", "concurrency": {"key": "input.k", "limit": 2}}),
        );
        for i in 0..5 {
            start("job", &i.to_string(), json!({"k": "k"}));
        }
        assert_eq!(claim("jobs", 10).len(), 2);
    }

    #[pg_test(
        error = "invalid opts.execution_id: 00070000-0000-8000-8000-000000000001 was minted for shard 7, and this is shard 1"
    )]
    fn an_execution_id_of_another_shard_is_refused() {
        init();
        Spi::run("SELECT sheaf.start_workflow('w', '1', '{}', '{\"execution_id\": \"00070000-0000-8000-8000-000000000001\"}')")
            .unwrap();
    }

    #[pg_test(
        error = "invalid input (for policy.quota.key): resolves to 257 bytes in the input; a key is at most 256 bytes (never truncated)"
    )]
    fn a_key_over_256_bytes_is_refused() {
        init();
        declare(
            "w",
            json!({"quota": {"key": "input.t", "max_active_executions": 5}}),
        );
        start("w", "1", json!({"t": "x".repeat(257)}));
    }
}
