//! Executions: locking, reading and setting the state of one, whether one
//! takes a new task (the queue's `ExecutionIntake`), and enqueueing its
//! workflow tasks.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use sheaf_core::options::EnqueueOptions;
use sheaf_core::state::ExecutionState;
use sheaf_core::state::TaskKind;

use crate::base::catalog::{self, Feature};
use crate::base::errors::{moved, not_ready, unknown_execution};
use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::queue::enqueue;
use crate::queue::hooks::{ExecutionIntake, Intake};

const STATE: Stmt = Stmt::read(
    "SELECT state FROM executions WHERE id = $1",
    &[PgBuiltInOids::UUIDOID],
);
const LOCK: Stmt = Stmt::write(
    "SELECT state, workflow_name, workflow_id, concurrency_key, quota_key, queue, paused_from, parent_id \
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
pub fn state_of(id: pgrx::Uuid) -> Option<ExecutionState> {
    STATE.value(&[id.into()], "reading an execution")
}

const QUOTA_KEY: Stmt = Stmt::read(
    "SELECT quota_key FROM executions WHERE id = $1",
    &[PgBuiltInOids::UUIDOID],
);

/// The quota key stamped on an execution at its start, if any.
pub fn quota_key_of(id: pgrx::Uuid) -> Option<String> {
    QUOTA_KEY
        .value::<Option<String>>(&[id.into()], "reading a quota key")
        .flatten()
}

/// Sends a call about execution `id` where the run lives if it moved away
/// (the forwarding error, `forward`); nothing if it lives here
/// or is not here.
pub fn forward_if_moved(id: pgrx::Uuid) {
    if let Some(state) = state_of(id) {
        forward(id, state);
    }
}

row! {
    /// The columns `LOCK` reads: a [`Locked`] but its id.
    struct LockedRow {
        state: ExecutionState,
        workflow_name: String,
        workflow_id: String,
        concurrency_key: Option<String>,
        quota_key: Option<String>,
        queue: String,
        paused_from: Option<ExecutionState>,
        parent_id: Option<pgrx::Uuid>,
    }
}

/// A locked execution row.
pub struct Locked {
    pub id: pgrx::Uuid,
    pub state: ExecutionState,
    pub workflow_name: String,
    pub workflow_id: String,
    pub concurrency_key: Option<String>,
    pub quota_key: Option<String>,
    pub queue: String,
    pub paused_from: Option<ExecutionState>,
    /// The execution that started it as its child (`sheaf.start_child`).
    pub parent_id: Option<pgrx::Uuid>,
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

/// Locks an execution's row; P0002 if it is not on this shard, the
/// forwarding error if it moved (`forward`).
pub fn lock(id: pgrx::Uuid) -> Locked {
    let e = try_lock(id).unwrap_or_else(|| unknown_execution(id));
    forward(id, e.state);
    e
}

/// Locks an execution's row; `None` if it is not on this shard.
pub fn try_lock(id: pgrx::Uuid) -> Option<Locked> {
    {
        let r: LockedRow = LOCK.first(&[id.into()], "locking an execution")?;
        Some(Locked {
            id,
            state: r.state,
            workflow_name: r.workflow_name,
            workflow_id: r.workflow_id,
            concurrency_key: r.concurrency_key,
            quota_key: r.quota_key,
            queue: r.queue,
            paused_from: r.paused_from,
            parent_id: r.parent_id,
        })
    }
}

/// Locks an execution that must be active; 55000 naming its state if not.
pub fn lock_active(id: pgrx::Uuid, doing: &str) -> Locked {
    let e = lock(id);
    if !e.state.is_active() {
        not_ready(format!("execution {id} is {}: cannot {doing}", e.state));
    }
    e
}

/// Enqueues a workflow task for an execution (its first, or after a wake).
/// Its id; `run_at` may be `infinity` (a throttled start's task in its
/// bucket's line).
pub fn enqueue_workflow_task(
    e: &Locked,
    payload: Jsonb,
    priority: i32,
    run_at: Option<TimestampWithTimeZone>,
) -> pgrx::Uuid {
    let o = EnqueueOptions {
        priority,
        concurrency_key: e.task_key(),
        execution_id: Some(*e.id.as_bytes()),
        kind: TaskKind::Workflow,
        ..EnqueueOptions::default()
    };
    let ids = enqueue::insert_at(&e.queue, vec![payload], &o, run_at, &INTAKE);
    ids.first()
        .copied()
        .unwrap_or_else(|| crate::base::errors::internal("enqueueing a workflow task: no id came back"))
}

/// Executions as the queue's enqueue asks them whether they take a task.
pub struct TaskIntake;

/// The one implementation; the api layer hands it to `queue::enqueue`.
pub static INTAKE: TaskIntake = TaskIntake;

impl ExecutionIntake for TaskIntake {
    fn intake(&self, id: pgrx::Uuid) -> Intake {
        match state_of(id) {
            None => unknown_execution(id),
            Some(ExecutionState::Paused) => Intake::Parked,
            Some(state) if state.takes_tasks() => Intake::Open,
            Some(state) => {
                // A task for a run that moved goes where it lives.
                forward(id, state);
                not_ready(format!("execution {id} is {state}: it takes no new tasks"))
            }
        }
    }
}

const SET_STATE: Stmt = Stmt::write(
    "UPDATE executions SET state = $2, paused_from = $3, wake_at = CASE WHEN $5 THEN $4 ELSE wake_at END \
     WHERE id = $1",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TIMESTAMPTZOID,
        PgBuiltInOids::BOOLOID,
    ],
);

/// Sets a locked execution's state (pause, resume, suspend, wake);
/// `wake_at`: `Some(t)` sets the timer to `t`, `None` keeps it.
pub fn set_state(
    e: &Locked,
    state: ExecutionState,
    paused_from: Option<ExecutionState>,
    wake_at: Option<Option<TimestampWithTimeZone>>,
) {
    SET_STATE.exec(&[
        e.id.into(),
        state.as_str().into(),
        paused_from.map(ExecutionState::as_str).into(),
        wake_at.flatten().into(),
        wake_at.is_some().into(),
    ]);
}

row! {
    /// An execution as `get_execution` returns it.
    pub struct Row {
        pub id: pgrx::Uuid,
        pub workflow_name: String,
        pub workflow_id: String,
        pub state: String,
        pub input: pgrx::JsonB,
        pub result: Option<pgrx::JsonB>,
        pub error: Option<String>,
        pub concurrency_key: Option<String>,
        pub quota_key: Option<String>,
        pub history_bytes: i64,
        pub created_at: TimestampWithTimeZone,
        pub closed_at: Option<TimestampWithTimeZone>,
        pub wake_at: Option<TimestampWithTimeZone>,
    }
}

fn read_rows(stmt: &Stmt, args: Vec<pgrx::datum::DatumWithOid<'_>>) -> Vec<Row> {
    stmt.all(&args, "reading an execution")
}

/// An execution by id: one row, or none if it is not on this shard.
/// A seal raises the forwarding error (`forward`).
pub fn get(id: pgrx::Uuid) -> Vec<Row> {
    let rows = read_rows(&GET, vec![id.into()]);
    if let Some(row) = rows.first()
        && let Ok(state) = row.state.parse::<ExecutionState>()
    {
        forward(id, state);
    }
    rows
}

/// The active execution of (name, workflow_id), else the most recent
/// terminal one; none if there is none.
pub fn find(name: &str, workflow_id: &str) -> Vec<Row> {
    read_rows(&FIND, vec![name.into(), workflow_id.into()])
}

const POINTER: Stmt = Stmt::write(
    "SELECT migrated_to_shard FROM executions WHERE id = $1",
    &[PgBuiltInOids::UUIDOID],
);

const SEALED_TO: Stmt = Stmt::read(
    "SELECT migrated_to_shard FROM executions WHERE id = $1 AND state = 'MIGRATED'",
    &[PgBuiltInOids::UUIDOID],
);

/// The shard execution `id` moved to, if this shard holds its seal.
pub fn moved_to(id: pgrx::Uuid) -> Option<i32> {
    if !moves_enabled() {
        return None;
    }
    SEALED_TO
        .value::<Option<i32>>(&[id.into()], "reading a seal's forward")
        .flatten()
}

/// Whether this shard's catalog has rebalancing (0.2.0 on).
pub fn moves_enabled() -> bool {
    catalog::has(Feature::Moves)
}

// Live runs an application started here (not moved here, not children),
// but for those it pinned to a shard: the runs a topology may place
// elsewhere, by id from `after` (the seek of the primary key).
const PLACED_LIVE: Stmt = Stmt::read(
    "SELECT id, workflow_name, workflow_id, placement, created_at FROM executions \
     WHERE id > coalesce($1, '00000000-0000-0000-0000-000000000000'::uuid) \
       AND state IN ('RUNNING', 'SUSPENDED', 'PAUSED') AND placement IS NOT NULL \
       AND NOT placement ? 'shard' AND parent_id IS NULL AND migrated_from_shards = '{}' \
     ORDER BY id LIMIT $2",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::INT8OID],
);

row! {
    /// A live run and how its caller placed it.
    pub struct Placed {
        pub id: pgrx::Uuid,
        pub workflow_name: String,
        pub workflow_id: String,
        pub placement: pgrx::JsonB,
        pub created_at: pgrx::datum::TimestampWithTimeZone,
    }
}

/// Up to `max` live runs an application placed (see `PLACED_LIVE`), after
/// id `after`, by id; none on a catalog that does not record placement.
pub fn placed_live(after: Option<pgrx::Uuid>, max: i64) -> Vec<Placed> {
    if !placed_runs_enabled() {
        return Vec::new();
    }
    PLACED_LIVE.all(&[after.into(), max.into()], "listing placed runs")
}

/// Whether this shard's catalog records how a run was placed (0.3.0 on).
pub fn placed_runs_enabled() -> bool {
    catalog::has(Feature::PlacedRuns)
}

/// Whether this shard's catalog has execution timeouts (0.2.0 on).
pub fn timeouts_enabled() -> bool {
    catalog::has(Feature::Timeouts)
}

/// Raises the forwarding error (`errors::moved`) if execution `id` is a
/// seal here, or a staged copy still carrying its seal's pointer; nothing
/// otherwise. For id-routed calls that found it in one of those states.
pub fn forward(id: pgrx::Uuid, state: ExecutionState) {
    if !state.is_migrating() || !moves_enabled() {
        return;
    }
    let to: Option<i32> = POINTER
        .value::<Option<i32>>(&[id.into()], "reading a forwarding pointer")
        .flatten();
    if let Some(to) = to {
        moved(id, to);
    }
}
