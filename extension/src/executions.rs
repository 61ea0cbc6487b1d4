//! Executions: the admission transaction (`start_workflow`) and reads.
//!
//! A start runs, in one transaction: active uniqueness (attach to the running
//! execution of the same name and workflow id), the quota check, the
//! concurrency gate (reject or supersede), then the insert of the execution,
//! its `WorkflowStarted` event and its first workflow task.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use sheaf_core::id;
use sheaf_core::options::{EnqueueOptions, Kind};
use sheaf_core::policy::{StartOptions, resolve_key};

use crate::errors::{
    SpiResultExt, bad_argument, not_ready, require_read_committed, required, unknown_execution,
};
use crate::jsonb::Jsonb;
use crate::plans::{Stmt, exec, run};
use crate::{concurrency, gates, history, ids, policy, quota, shard, tasks};

/// The states that count as active (for uniqueness, gates and quotas).
pub const ACTIVE: [&str; 3] = ["RUNNING", "SUSPENDED", "PAUSED"];

pub fn is_active(state: &str) -> bool {
    ACTIVE.contains(&state)
}

/// The advisory-lock namespace of (workflow name, workflow id) ("WF").
const START_LOCK_CLASS: i32 = 0x5746;

const START_LOCK: Stmt = Stmt::write(
    "SELECT pg_advisory_xact_lock($1, hashtext($2 || E'\\x1f' || $3))",
    &[
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
    ],
);
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
const INSERT: Stmt = Stmt::write(
    "INSERT INTO executions (id, workflow_name, workflow_id, state, seq, queue, input, concurrency_key, quota_key) \
     VALUES ($1, $2, $3, 'RUNNING', nextval('execution_seq'), $4, $5, $6, $7)",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
    ],
);
const STATE: Stmt = Stmt::read(
    "SELECT state FROM executions WHERE id = $1",
    &[PgBuiltInOids::UUIDOID],
);
const LOCK: Stmt = Stmt::write(
    "SELECT state, workflow_name, workflow_id, concurrency_key, quota_key, queue, paused_from \
     FROM executions WHERE id = $1 FOR UPDATE",
    &[PgBuiltInOids::UUIDOID],
);
/// The columns `get_execution` and `find_execution` return, in their order.
macro_rules! execution_columns {
    () => {
        "id, workflow_name, workflow_id, state, input, result, error, concurrency_key, \
         quota_key, history_bytes, created_at, closed_at, wake_at"
    };
}
const GET: Stmt = Stmt::read(
    concat!("SELECT ", execution_columns!(), " FROM executions WHERE id = $1"),
    &[PgBuiltInOids::UUIDOID],
);
// The active one if any (it sorts first), else the most recent.
const FIND: Stmt = Stmt::read(
    concat!(
        "SELECT ",
        execution_columns!(),
        " FROM executions WHERE workflow_name = $1 AND workflow_id = $2 \
         ORDER BY state NOT IN ('RUNNING', 'SUSPENDED', 'PAUSED', 'MIGRATING', 'MIGRATED'), seq DESC LIMIT 1"
    ),
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::TEXTOID],
);

/// An execution's state; `None` if it is not on this shard.
pub fn state_of(id: pgrx::Uuid) -> Option<String> {
    Spi::connect_mut(|client| {
        run(client, &STATE, &[id.into()])
            .next()
            .and_then(|row| row.get::<String>(1).or_internal("reading an execution"))
    })
}

const QUOTA_KEY: Stmt = Stmt::read(
    "SELECT quota_key FROM executions WHERE id = $1",
    &[PgBuiltInOids::UUIDOID],
);

/// The quota key stamped on an execution at its start, if any.
pub fn quota_key_of(id: pgrx::Uuid) -> Option<String> {
    Spi::connect_mut(|client| {
        run(client, &QUOTA_KEY, &[id.into()])
            .next()
            .and_then(|row| row.get::<String>(1).or_internal("reading a quota key"))
    })
}

/// A locked execution row.
pub struct Locked {
    pub id: pgrx::Uuid,
    pub state: String,
    pub workflow_name: String,
    pub workflow_id: String,
    pub concurrency_key: Option<String>,
    pub quota_key: Option<String>,
    pub queue: String,
    pub paused_from: Option<String>,
}

impl Locked {
    /// The concurrency key its workflow tasks carry, if its policy capped it.
    pub fn task_key(&self) -> Option<String> {
        self.concurrency_key
            .as_ref()
            .map(|k| task_key(&self.workflow_name, k))
    }
}

/// The task concurrency key of a workflow's resolved concurrency key.
pub fn task_key(workflow: &str, key: &str) -> String {
    format!("{workflow}:{key}")
}

/// Locks an execution's row; P0002 if it is not on this shard.
pub fn lock(id: pgrx::Uuid) -> Locked {
    let row = Spi::connect_mut(|client| {
        let row = run(client, &LOCK, &[id.into()]).next()?;
        let text = |i: usize| row.get::<String>(i).or_internal("locking an execution");
        Some(Locked {
            id,
            state: text(1)?,
            workflow_name: text(2)?,
            workflow_id: text(3)?,
            concurrency_key: text(4),
            quota_key: text(5),
            queue: text(6)?,
            paused_from: text(7),
        })
    });
    row.unwrap_or_else(|| unknown_execution(id))
}

/// Locks an execution that must be active; 55000 naming its state if not.
pub fn lock_active(id: pgrx::Uuid, doing: &str) -> Locked {
    let e = lock(id);
    if !is_active(&e.state) {
        not_ready(format!("execution {id} is {}: cannot {doing}", e.state));
    }
    e
}

/// Enqueues a workflow task for an execution (its first, or after a wake).
pub fn enqueue_workflow_task(e: &Locked, payload: serde_json::Value, priority: i32, run_at: Option<String>) {
    let o = EnqueueOptions {
        priority,
        run_at,
        concurrency_key: e.task_key(),
        execution_id: Some(*e.id.as_bytes()),
        kind: Kind::Workflow,
        ..EnqueueOptions::default()
    };
    tasks::insert(&e.queue, vec![Jsonb::from_value(payload)], &o);
}

/// Starts an execution of workflow `name` with `workflow_id` unless one is
/// active (then returns it with `created = false`, changing nothing).
/// `opts`: `execution_id` (an id minted for this shard by a router),
/// `queue` (overrides the policy's), `priority` and `run_at` of the first
/// workflow task. `superseded`: the executions this start cancelled (latest
/// wins). Refusals: 53400 (quota), 55006 (concurrency gate `reject`).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn start_workflow(
    name: Option<&str>,
    workflow_id: Option<&str>,
    input: Option<pgrx::JsonB>,
    opts: default!(Option<pgrx::JsonB>, "'{}'"),
) -> TableIterator<
    'static,
    (
        name!(execution_id, pgrx::Uuid),
        name!(created, bool),
        name!(superseded, Vec<pgrx::Uuid>),
    ),
> {
    require_read_committed("start_workflow");
    let name = policy::check_name(name);
    let workflow_id = required(workflow_id, "workflow_id");
    if workflow_id.is_empty() || workflow_id.len() > 256 {
        bad_argument(
            "workflow_id",
            format!("must be 1 to 256 bytes, got {}", workflow_id.len()),
        );
    }
    let input = required(input, "input").0;
    let opts = required(opts, "opts");
    let o = match StartOptions::parse(&opts.0) {
        Ok(o) => o,
        Err(e) => bad_argument(&e.option, e.why),
    };
    let run_at = o.run_at.clone();
    if let Some(s) = &run_at
        && !matches!(s.parse::<TimestampWithTimeZone>(), Ok(t) if t.is_finite())
    {
        bad_argument(
            "opts.run_at",
            format!("must be a finite timestamp with time zone, got {s:?}"),
        );
    }
    let p = policy::load(name);
    let resolve = |segments: &[String], field: &str| match resolve_key(&input, segments, field) {
        Ok(k) => k,
        Err(e) => bad_argument(&format!("input (for {})", e.option), e.why),
    };
    let concurrency = p
        .concurrency
        .as_ref()
        .and_then(|c| resolve(&c.key, "policy.concurrency.key").map(|k| (c, k)));
    let quota = p
        .quota
        .as_ref()
        .and_then(|q| resolve(&q.key, "policy.quota.key").map(|k| (q, k)));
    let new_id = match o.execution_id.map(pgrx::Uuid::from_bytes) {
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
    };

    // (1) Active uniqueness, serialized per (name, workflow id).
    exec(
        &START_LOCK,
        &[START_LOCK_CLASS.into(), name.into(), workflow_id.into()],
    );
    let holding = Spi::connect_mut(|client| {
        run(client, &HOLDING_ID, &[name.into(), workflow_id.into()])
            .next()
            .and_then(|row| {
                row.get::<pgrx::Uuid>(1)
                    .or_internal("looking up an active execution")
            })
    });
    if let Some(existing) = holding {
        return TableIterator::once((existing, false, Vec::new()));
    }
    let taken = Spi::connect_mut(|client| {
        run(client, &ID_TAKEN, &[new_id.into()])
            .next()
            .and_then(|row| row.get::<bool>(1).or_internal("checking an execution id"))
    });
    if taken == Some(true) {
        bad_argument(
            "opts.execution_id",
            format!("{new_id} already names another execution on this shard"),
        );
    }
    // (2) Quota: the early, lock-free check keeps the documented order of
    // refusals; the authoritative one (locked counters) runs after the gate,
    // so every path locks executions before quota counters.
    if let Some((q, key)) = &quota {
        quota::precheck(name, key, q);
    }
    // (3) Concurrency gate.
    let superseded = match &concurrency {
        Some((c, key)) => {
            concurrency::ensure_limit(&task_key(name, key), c.limit);
            gates::admit(name, key, c, new_id)
        }
        None => Vec::new(),
    };
    if let Some((q, key)) = &quota {
        quota::admit(name, key, q);
    }
    // (4) The execution, its first event and its first workflow task.
    let queue = o.queue.clone().unwrap_or_else(|| p.queue.clone());
    let concurrency_key = concurrency.as_ref().map(|(_, k)| k.clone());
    let quota_key = quota.as_ref().map(|(_, k)| k.clone());
    exec(
        &INSERT,
        &[
            new_id.into(),
            name.into(),
            workflow_id.into(),
            queue.as_str().into(),
            pgrx::JsonB(input.clone()).into(),
            concurrency_key.clone().into(),
            quota_key.clone().into(),
        ],
    );
    history::append(
        new_id,
        "WorkflowStarted",
        serde_json::json!({"workflow_id": workflow_id, "input": input}),
    );
    let started = Locked {
        id: new_id,
        state: "RUNNING".into(),
        workflow_name: name.to_owned(),
        workflow_id: workflow_id.to_owned(),
        concurrency_key,
        quota_key,
        queue,
        paused_from: None,
    };
    enqueue_workflow_task(
        &started,
        serde_json::json!({"workflow_name": name, "workflow_id": workflow_id, "input": input}),
        o.priority,
        run_at,
    );
    TableIterator::once((new_id, true, superseded))
}

type Row = (
    pgrx::Uuid,
    String,
    String,
    String,
    pgrx::JsonB,
    Option<pgrx::JsonB>,
    Option<String>,
    Option<String>,
    Option<String>,
    i64,
    TimestampWithTimeZone,
    Option<TimestampWithTimeZone>,
    Option<TimestampWithTimeZone>,
);

fn read_rows(stmt: &Stmt, args: Vec<pgrx::datum::DatumWithOid<'_>>) -> Vec<Row> {
    Spi::connect_mut(|client| {
        run(client, stmt, &args)
            .filter_map(|row| {
                let ctx = "reading an execution";
                Some((
                    row.get::<pgrx::Uuid>(1).or_internal(ctx)?,
                    row.get::<String>(2).or_internal(ctx)?,
                    row.get::<String>(3).or_internal(ctx)?,
                    row.get::<String>(4).or_internal(ctx)?,
                    row.get::<pgrx::JsonB>(5).or_internal(ctx)?,
                    row.get::<pgrx::JsonB>(6).or_internal(ctx),
                    row.get::<String>(7).or_internal(ctx),
                    row.get::<String>(8).or_internal(ctx),
                    row.get::<String>(9).or_internal(ctx),
                    row.get::<i64>(10).or_internal(ctx)?,
                    row.get::<TimestampWithTimeZone>(11).or_internal(ctx)?,
                    row.get::<TimestampWithTimeZone>(12).or_internal(ctx),
                    row.get::<TimestampWithTimeZone>(13).or_internal(ctx),
                ))
            })
            .collect()
    })
}

/// An execution by id: one row, or none if it is not on this shard.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn get_execution(
    execution_id: Option<pgrx::Uuid>,
) -> TableIterator<
    'static,
    (
        name!(execution_id, pgrx::Uuid),
        name!(workflow_name, String),
        name!(workflow_id, String),
        name!(state, String),
        name!(input, pgrx::JsonB),
        name!(result, Option<pgrx::JsonB>),
        name!(error, Option<String>),
        name!(concurrency_key, Option<String>),
        name!(quota_key, Option<String>),
        name!(history_bytes, i64),
        name!(created_at, TimestampWithTimeZone),
        name!(closed_at, Option<TimestampWithTimeZone>),
        name!(wake_at, Option<TimestampWithTimeZone>),
    ),
> {
    let id = required(execution_id, "execution_id");
    TableIterator::new(read_rows(&GET, vec![id.into()]))
}

/// The execution of (name, workflow_id) on this shard: the active one, else
/// the most recent terminal one; no row if there is none.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn find_execution(
    name: Option<&str>,
    workflow_id: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(execution_id, pgrx::Uuid),
        name!(workflow_name, String),
        name!(workflow_id, String),
        name!(state, String),
        name!(input, pgrx::JsonB),
        name!(result, Option<pgrx::JsonB>),
        name!(error, Option<String>),
        name!(concurrency_key, Option<String>),
        name!(quota_key, Option<String>),
        name!(history_bytes, i64),
        name!(created_at, TimestampWithTimeZone),
        name!(closed_at, Option<TimestampWithTimeZone>),
        name!(wake_at, Option<TimestampWithTimeZone>),
    ),
> {
    let name = policy::check_name(name);
    let workflow_id = required(workflow_id, "workflow_id");
    if workflow_id.is_empty() || workflow_id.len() > 256 {
        bad_argument(
            "workflow_id",
            format!("must be 1 to 256 bytes, got {}", workflow_id.len()),
        );
    }
    TableIterator::new(read_rows(&FIND, vec![name.into(), workflow_id.into()]))
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
        let (id, created, superseded) = start("order", "o-1", json!({"sku": 7}));
        assert!(created && superseded.is_empty());
        assert_eq!(state(id), "RUNNING");
        assert_eq!(
            Spi::get_one::<String>("SELECT event_type FROM sheaf.events WHERE seq = 1")
                .unwrap()
                .as_deref(),
            Some("WorkflowStarted")
        );
        let t = claim("default", 1);
        assert_eq!(t[0].2["input"]["sku"], 7);
        assert_eq!(
            count("SELECT count(*) FROM sheaf.tasks WHERE kind = 'workflow' AND execution_id IS NOT NULL"),
            1
        );
    }

    #[pg_test]
    fn restarting_an_active_workflow_attaches_and_changes_nothing() {
        init();
        let (id, ..) = start("order", "o-1", json!({}));
        let again = start("order", "o-1", json!({"other": true}));
        assert_eq!((again.0, again.1), (id, false));
        assert_eq!(count("SELECT count(*) FROM sheaf.events"), 1);
        assert_eq!(count("SELECT count(*) FROM sheaf.tasks"), 1);
        Spi::run_with_args("SELECT sheaf.complete_execution($1, NULL)", &[id.into()]).unwrap();
        let fresh = start("order", "o-1", json!({}));
        assert!(fresh.1 && fresh.0 != id, "a finished run frees its workflow id");
        let found = Spi::get_one_with_args::<pgrx::Uuid>(
            "SELECT execution_id FROM sheaf.find_execution('order', 'o-1')",
            &[],
        )
        .unwrap();
        assert_eq!(found, Some(fresh.0), "the active run is found first");
    }

    #[pg_test]
    fn latest_wins_keeps_the_newest_and_leaves_other_workflows_alone() {
        init();
        declare(
            "doc",
            json!({"concurrency": {"key": "input.doc", "limit": 1, "on_conflict": "cancel_running"}}),
        );
        let (other, ..) = start("other", "x", json!({"doc": "d"}));
        let (first, ..) = start("doc", "a", json!({"doc": "d"}));
        let (second, _, superseded) = start("doc", "b", json!({"doc": "d"}));
        assert_eq!(superseded, vec![first]);
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
        let (_, created, _) = start("job", "2", json!({"k": null}));
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
