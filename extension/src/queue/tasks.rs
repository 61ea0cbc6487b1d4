//! Enqueueing tasks, and moving existing tasks between states.

use pgrx::datum::{DatumWithOid, TimestampWithTimeZone};
use pgrx::prelude::*;
use sheaf_core::excerpt::quoted;
use sheaf_core::options::EnqueueOptions;
use sheaf_core::ordering::Mode;
use sheaf_core::policy::resolve_key;
use sheaf_core::state::TaskState;

use crate::base::clock;
use crate::base::errors::bad_argument;
use crate::base::ids;
use crate::base::jsonb::Jsonb;
use crate::base::plans::{Stmt, exec, run};
use crate::base::rows;
use crate::queue::floor::{self, lower_in_enqueue};
use crate::queue::hooks::{ExecutionHooks, Intake};
use crate::queue::queues::Queue;
use crate::queue::{caps, queues, rate, ready};

/// The most payloads one `enqueue_batch` accepts.
pub const MAX_BATCH: usize = 10_000;

/// `'running'`, for the statements that find a running task by id: they
/// take it as a parameter, never as a literal. With `state = 'running'`
/// written out, the planner can prove the predicate of the partial index
/// `tasks_running` and may pick that index for the generic plan (it did,
/// for a completion), which then reads every running task's entry, and
/// under a held snapshot every dead one too, where one primary-key seek
/// does.
pub const RUNNING: &str = "running";

/// Which form of a statement that reads `tasks.claimed_at` runs: 1 on a
/// 0.2.0 catalog, 0 on an older one (between installing this library and
/// `ALTER EXTENSION sheaf UPDATE`), where the column is missing. The claim
/// floors arrived in the same release, so their check answers for both.
pub fn claim_times() -> usize {
    floor::enabled() as usize
}

/// An attempt's seconds since its claim, as a statement's output column
/// (`$end` is when the attempt ended), and its stand-in on an older
/// catalog ([`claim_times`]).
macro_rules! attempt_secs {
    (0, $end:expr) => {
        "NULL::float8"
    };
    (1, $end:expr) => {
        concat!("extract(epoch FROM ", $end, " - claimed_at)::float8")
    };
}
pub(crate) use attempt_secs;

/// The queues with a task in `$state` for which `$cond` holds (on `t`), by
/// a skip scan of that state's partial index by queue: one probe per queue
/// with tasks in that state, never one per queue ever created (`maintain`).
macro_rules! queues_with {
    ($state:literal, $cond:literal) => {
        concat!(
            "WITH RECURSIVE q(queue) AS ( \
               (SELECT queue FROM tasks WHERE state = '",
            $state,
            "' ORDER BY queue LIMIT 1) \
               UNION ALL \
               SELECT (SELECT t.queue FROM tasks t WHERE t.state = '",
            $state,
            "' AND t.queue > q.queue \
                       ORDER BY t.queue LIMIT 1) \
               FROM q WHERE q.queue IS NOT NULL) \
             SELECT q.queue FROM q WHERE q.queue IS NOT NULL AND EXISTS ( \
               SELECT 1 FROM tasks t WHERE t.state = '",
            $state,
            "' AND t.queue = q.queue AND ",
            $cond,
            ")"
        )
    };
}
pub(crate) use queues_with;

// One statement inserts the tasks (in input order, so `seq` keeps the batch's
// order) and the ready rows of those admitted now, and answers whether the
// queue had no ready task before (its workers may be asleep on LISTEN; see
// ready.rs). It looks from the tail of the queue's range: the head is where
// claims leave dead entries until the next vacuum. A single task is inserted
// from VALUES, a batch from unnest (a function scan costs more to start than
// a one-row insert takes). ON CONFLICT makes Postgres use speculative
// insertion for every row, which costs, so only enqueues that carry an
// idempotency key pay for it; only queues that notify pay for the probe.
macro_rules! insert_tasks {
    ($rows:expr, $on_conflict:expr, $probe:expr, $floor:expr) => {
        insert_tasks!($rows, $on_conflict, $probe, $floor, "", "")
    };
    // With claim floors, the ready rows carry their aging band.
    ($rows:expr, $on_conflict:expr, $probe:expr, $floor:expr, banded) => {
        insert_tasks!(
            $rows,
            $on_conflict,
            $probe,
            $floor,
            ", aging_band",
            ", ready_aging_band(t.priority, $15)"
        )
    };
    ($rows:expr, $on_conflict:expr, $probe:expr, $floor:expr, $band_col:expr, $band:expr) => {
        concat!(
            "WITH t AS (\
               INSERT INTO tasks (id, queue, kind, payload, priority, state, seq, fair_start, run_at, \
                                  max_attempts, execution_id, concurrency_key, fairness_key, fairness_weight, \
                                  idempotency_key) ",
            $rows,
            " ",
            $on_conflict,
            " RETURNING id, queue, priority, enqueued_at, fair_start, seq, state), \
             r AS (INSERT INTO ready (task_id, queue, k1, k2, seq",
            $band_col,
            ") SELECT t.id, t.queue, ready_k1(t.priority, t.enqueued_at, $15), coalesce(t.fair_start, 0), t.seq",
            $band,
            " FROM t WHERE t.state = 'ready' RETURNING k1, k2, seq",
            $band_col,
            ")",
            $floor,
            " SELECT ",
            $probe
        )
    };
}
macro_rules! idle {
    () => {
        "(SELECT task_id FROM ready WHERE queue = $2 ORDER BY k1 DESC, k2 DESC, seq DESC LIMIT 1) IS NULL"
    };
}
macro_rules! idempotent {
    () => {
        "ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
    };
}
macro_rules! one_task {
    () => {
        "VALUES ($1, $2, $3, $12, $4, $13, nextval('task_seq'), $14, coalesce($5, now()), $6, $7, $8, $9, $10, $11)"
    };
}
macro_rules! many_tasks {
    () => {
        "SELECT x.id, $2, $3, x.payload, $4, x.state, nextval('task_seq'), x.fair_start, \
                coalesce($5, now()), $6, $7, $8, $9, $10, $11 \
         FROM unnest($1::uuid[], $12::jsonb[], $13::text[], $14::float8[]) AS x(id, payload, state, fair_start)"
    };
}
// $1, $12, $13 and $14 are per task: scalars for one task, arrays for many.
macro_rules! insert_args {
    ($id:ident, $payload:ident, $state:ident, $fair_start:ident) => {
        &[
            PgBuiltInOids::$id,
            PgBuiltInOids::TEXTOID,
            PgBuiltInOids::TEXTOID,
            PgBuiltInOids::INT4OID,
            PgBuiltInOids::TIMESTAMPTZOID,
            PgBuiltInOids::INT4OID,
            PgBuiltInOids::UUIDOID,
            PgBuiltInOids::TEXTOID,
            PgBuiltInOids::TEXTOID,
            PgBuiltInOids::FLOAT8OID,
            PgBuiltInOids::TEXTOID,
            PgBuiltInOids::$payload,
            PgBuiltInOids::$state,
            PgBuiltInOids::$fair_start,
            PgBuiltInOids::INT4OID,
            PgBuiltInOids::BOOLOID,
        ]
    };
}
const ONE: &[PgBuiltInOids] = insert_args!(UUIDOID, JSONBOID, TEXTOID, FLOAT8OID);
const MANY: &[PgBuiltInOids] = insert_args!(UUIDARRAYOID, JSONBARRAYOID, TEXTARRAYOID, FLOAT8ARRAYOID);
/// The insert statements: [one task, one with an idempotency key, a batch],
/// each without and with the idle probe; all of them with and without the
/// claim floor (`queue::floor`: a catalog older than 0.2.0 has none).
static INSERTS: [[[Stmt; 2]; 3]; 2] = [
    [
        [
            Stmt::write(insert_tasks!(one_task!(), "", "false", ""), ONE),
            Stmt::write(insert_tasks!(one_task!(), "", idle!(), ""), ONE),
        ],
        [
            Stmt::write(insert_tasks!(one_task!(), idempotent!(), "false", ""), ONE),
            Stmt::write(insert_tasks!(one_task!(), idempotent!(), idle!(), ""), ONE),
        ],
        [
            Stmt::write(insert_tasks!(many_tasks!(), "", "false", ""), MANY),
            Stmt::write(insert_tasks!(many_tasks!(), "", idle!(), ""), MANY),
        ],
    ],
    [
        [
            Stmt::write(
                insert_tasks!(one_task!(), "", "false", lower_in_enqueue!(), banded),
                ONE,
            ),
            Stmt::write(
                insert_tasks!(one_task!(), "", idle!(), lower_in_enqueue!(), banded),
                ONE,
            ),
        ],
        [
            Stmt::write(
                insert_tasks!(one_task!(), idempotent!(), "false", lower_in_enqueue!(), banded),
                ONE,
            ),
            Stmt::write(
                insert_tasks!(one_task!(), idempotent!(), idle!(), lower_in_enqueue!(), banded),
                ONE,
            ),
        ],
        [
            Stmt::write(
                insert_tasks!(many_tasks!(), "", "false", lower_in_enqueue!(), banded),
                MANY,
            ),
            Stmt::write(
                insert_tasks!(many_tasks!(), "", idle!(), lower_in_enqueue!(), banded),
                MANY,
            ),
        ],
    ],
];
const BY_IDEMPOTENCY_KEY: Stmt = Stmt::read(
    "SELECT id FROM tasks WHERE queue = $1 AND idempotency_key = $2",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::TEXTOID],
);
const NOTIFY: Stmt = Stmt::write("SELECT pg_notify('sheaf_ready', $1)", &[PgBuiltInOids::TEXTOID]);
const NEEDING_FAIR_START: Stmt = Stmt::read(
    "SELECT t.id, t.queue, t.fairness_key, t.fairness_weight \
     FROM tasks t JOIN queues q ON q.name = t.queue \
     WHERE t.id = ANY($1) AND q.fairness AND t.fair_start IS NULL \
     ORDER BY t.queue, t.priority DESC, t.seq",
    &[PgBuiltInOids::UUIDARRAYOID],
);
const SET_READY: Stmt = Stmt::write(
    "UPDATE tasks t SET state = 'ready', fair_start = coalesce(x.fair_start, t.fair_start) \
     FROM unnest($1::uuid[], $2::float8[]) AS x(id, fair_start) WHERE t.id = x.id",
    &[PgBuiltInOids::UUIDARRAYOID, PgBuiltInOids::FLOAT8ARRAYOID],
);
/// The rows one insert statement writes, by what each parameter holds:
/// `$1, $12, $13, $14` are per task (scalars for one task, arrays for a
/// batch), `$2..$11`, `$15` and `$16` shared by all.
struct NewTasks<'a> {
    ids: Vec<pgrx::Uuid>,
    payloads: Vec<Jsonb>,
    states: Vec<&'static str>,
    fair_starts: Vec<Option<f64>>,
    queue: &'a str,
    o: &'a EnqueueOptions,
    run_at: Option<TimestampWithTimeZone>,
    execution_id: Option<pgrx::Uuid>,
    /// The queue's aging (`ready_k1`'s third argument), if it ages.
    aging_secs: Option<i32>,
    /// Whether the statement may compare with the floor (`floor::Readying`).
    floor_locked: bool,
}

impl NewTasks<'_> {
    /// Which of `INSERTS` writes these rows (one task, one with an
    /// idempotency key, a batch), and its arguments in parameter order.
    fn statement(self) -> (usize, Vec<DatumWithOid<'static>>) {
        let o = self.o;
        let shared: [DatumWithOid<'static>; 10] = [
            self.queue.to_owned().into(),
            o.kind.as_str().into(),
            o.priority.into(),
            self.run_at.into(),
            o.max_attempts.into(),
            self.execution_id.into(),
            o.concurrency_key.clone().into(),
            o.fairness_key.clone().into(),
            o.fairness_weight.into(),
            o.idempotency_key.clone().into(),
        ];
        let (variant, [id, payload, state, start]): (usize, [DatumWithOid<'static>; 4]) =
            if self.ids.len() == 1 {
                (
                    usize::from(o.idempotency_key.is_some()),
                    [
                        self.ids[0].into(),
                        self.payloads.into_iter().next().into(),
                        self.states[0].into(),
                        self.fair_starts[0].into(),
                    ],
                )
            } else {
                // A key names one task: refused before for a batch.
                (
                    2,
                    [
                        self.ids.into(),
                        self.payloads.into(),
                        self.states.into(),
                        self.fair_starts.into(),
                    ],
                )
            };
        let mut args = vec![id];
        args.extend(shared);
        args.extend([
            payload,
            state,
            start,
            self.aging_secs.into(),
            self.floor_locked.into(),
        ]);
        (variant, args)
    }
}

fn parse_run_at(o: &EnqueueOptions) -> Option<TimestampWithTimeZone> {
    o.run_at
        .as_deref()
        .map(|s| match s.parse::<TimestampWithTimeZone>() {
            Ok(t) if t.is_finite() => t,
            _ => bad_argument(
                "opts.run_at",
                format!("must be a finite timestamp with time zone, got {}", quoted(s)),
            ),
        })
}

/// A fairness key on a queue that does not share claims by it would be
/// stored and never used: refuse it rather than ignore it.
fn refuse_unused_fairness(q: Queue, name: &str, o: &EnqueueOptions) {
    if q.mode != Mode::Fairness && (o.fairness_key.is_some() || o.fairness_weight != 1.0) {
        bad_argument(
            "opts.fairness_key",
            format!(
                "queue {} does not share claims by fairness key; turn fairness on first: \
                 sheaf.configure_queue(queue, '{{\"fairness\": true}}')",
                quoted(name)
            ),
        );
    }
}

/// Whether a task with `run_at` is due now (`run_at <= now()`, in Rust:
/// now() is the transaction's start).
fn is_due(run_at: Option<TimestampWithTimeZone>) -> bool {
    match run_at {
        None => true,
        // SAFETY: reads this backend's transaction state, set inside one.
        Some(t) => pg_sys::TimestampTz::from(t) <= unsafe { pg_sys::GetCurrentTransactionStartTimestamp() },
    }
}

/// Each new task's state: the first `admitted` of due tasks are ready, the
/// rest wait for a slot; tasks not due are scheduled; a paused execution's
/// are parked.
fn states(n: usize, due: bool, admitted: usize, paused: bool) -> Vec<&'static str> {
    (0..n)
        .map(|i| match (due, i < admitted) {
            _ if paused => TaskState::Paused,
            (false, _) => TaskState::Scheduled,
            (true, true) => TaskState::Ready,
            (true, false) => TaskState::Waiting,
        })
        .map(TaskState::as_str)
        .collect()
}

/// Fairness start tags of the admitted tasks in a fairness queue.
fn fair_starts(q: Queue, name: &str, o: &EnqueueOptions, n: usize, admitted: usize) -> Vec<Option<f64>> {
    let mut fair_start: Vec<Option<f64>> = vec![None; n];
    if q.mode == Mode::Fairness && admitted > 0 {
        let starts = ready::fair_starts(name, &vec![(o.fairness_key.clone(), o.fairness_weight); admitted]);
        for (slot, s) in fair_start.iter_mut().zip(starts) {
            *slot = Some(s);
        }
    }
    fair_start
}

/// Inserts tasks with validated options (the queue name is checked). A task
/// of an execution asks it whether it takes tasks (`hooks`).
pub fn insert(
    name: &str,
    payloads: Vec<Jsonb>,
    o: &EnqueueOptions,
    hooks: &dyn ExecutionHooks,
) -> Vec<pgrx::Uuid> {
    let run_at = parse_run_at(o);
    match &o.rate_limit {
        None => insert_at(name, payloads, o, run_at, hooks),
        Some(limit) => insert_limited(name, limit, payloads, o, run_at, hooks),
    }
}

/// `insert` of tasks that wait on rate limit `limit`: each is admitted at
/// its bucket's time for it (`queue::rate`), in order; those beyond the
/// lookahead wait in the bucket's line, `scheduled` at `infinity`.
fn insert_limited(
    name: &str,
    limit: &str,
    payloads: Vec<Jsonb>,
    o: &EnqueueOptions,
    run_at: Option<TimestampWithTimeZone>,
    hooks: &dyn ExecutionHooks,
) -> Vec<pgrx::Uuid> {
    let Some(declared) = rate::declared(limit) else {
        bad_argument(
            "opts.rate_limit",
            format!(
                "{} is not a rate limit on this shard: declare it first (sheaf.declare_rate_limit)",
                quoted(limit)
            ),
        );
    };
    if let Some(key) = &o.idempotency_key
        && let Some(existing) = by_idempotency_key(name, key)
    {
        // A duplicate takes no token.
        return vec![existing];
    }
    let pace = rate::effective(limit, declared.pace);
    let arrival = run_at.map_or(i64::MIN, clock::to_us);
    let mut ids = Vec::with_capacity(payloads.len());
    for payload in payloads {
        let key = match (&o.rate_key, &declared.key) {
            (Some(k), _) => k.clone(),
            (None, Some(path)) => {
                let value = payload.clone().parse("payload");
                match resolve_key(&value, path, "opts.rate_limit") {
                    Ok(k) => k.unwrap_or_default(),
                    Err(e) => bad_argument(&format!("payload (for {})", e.option), e.why),
                }
            }
            // One bucket for the limit; a keyed limit's task without its key shares it too.
            (None, None) => String::new(),
        };
        let at = match rate::reserve(limit, &key, pace, &[arrival])[0] {
            rate::Admission::At(us) => clock::from_us(us),
            rate::Admission::Line => TimestampWithTimeZone::positive_infinity(),
        };
        let id = insert_at(name, vec![payload], o, Some(at), hooks);
        if at.is_infinity() {
            rate::line(limit, &key, &id);
        }
        ids.extend(id);
    }
    ids
}

/// `insert` at `run_at` (parsed; `infinity` for a task in a rate line).
pub fn insert_at(
    name: &str,
    payloads: Vec<Jsonb>,
    o: &EnqueueOptions,
    run_at: Option<TimestampWithTimeZone>,
    hooks: &dyn ExecutionHooks,
) -> Vec<pgrx::Uuid> {
    let execution_id = o.execution_id.map(pgrx::Uuid::from_bytes);
    // A paused execution's new tasks wait, holding no slot, until it resumes.
    let paused = execution_id.is_some_and(|id| hooks.intake(id) == Intake::Parked);
    if let Some(key) = &o.idempotency_key {
        if payloads.len() > 1 {
            bad_argument(
                "opts.idempotency_key",
                "names one task: it cannot apply to a batch of several payloads",
            );
        }
        if let Some(existing) = by_idempotency_key(name, key) {
            return vec![existing];
        }
    }
    let q = queues::load_or_create(name);
    refuse_unused_fairness(q, name, o);
    let n = payloads.len();
    let due = !paused && is_due(run_at);
    let admitted = match (&o.concurrency_key, due) {
        (_, false) => 0,
        (None, true) => n,
        (Some(key), true) => caps::admit(key, n as i32) as usize,
    };
    let mut mint = ids::minter();
    let new_ids: Vec<pgrx::Uuid> = (0..n).map(|_| mint()).collect();
    let first_id = new_ids[0];
    let states = states(n, due, admitted, paused);
    // Readying, step 1 (`queue::floor`); the statement does step 2.
    let readying = if states.contains(&TaskState::Ready.as_str()) {
        floor::try_readying(name)
    } else {
        floor::Readying {
            floors: floor::enabled(),
            compare: true,
        }
    };
    let (variant, args) = NewTasks {
        ids: new_ids.clone(),
        payloads,
        states,
        fair_starts: fair_starts(q, name, o, n, admitted),
        queue: name,
        o,
        run_at,
        execution_id,
        aging_secs: match q.mode {
            Mode::Aging { secs } => Some(secs as i32),
            _ => None,
        },
        floor_locked: readying.compare,
    }
    .statement();
    let stmt = &INSERTS[readying.floors as usize][variant][q.notify as usize];
    let was_idle = Spi::connect_mut(|client| {
        // The probe answers once per statement, even when an idempotency
        // conflict inserted nothing.
        rows::only_value::<bool>(run(client, stmt, &args), "enqueueing")
    });
    if let Some(key) = &o.idempotency_key
        && let Some(existing) = by_idempotency_key(name, key)
        && existing != first_id
    {
        // A concurrent enqueue with the same key won the insert: give back
        // the slot taken for ours and answer with theirs.
        if let Some(ckey) = &o.concurrency_key
            && admitted > 0
        {
            caps::release(ckey, admitted as i32);
        }
        return vec![existing];
    }
    if let Some(ckey) = &o.concurrency_key
        && due
        && admitted < n
    {
        caps::waited(ckey, &new_ids[admitted..]);
    }
    // Only an idle queue's workers can be asleep on LISTEN (see ready.rs).
    if admitted > 0 && q.notify && was_idle {
        exec(&NOTIFY, &[name.into()]);
    }
    new_ids
}

/// The unfinished task of `queue` holding idempotency `key`, if any.
pub fn by_idempotency_key(queue: &str, key: &str) -> Option<pgrx::Uuid> {
    Spi::connect_mut(|client| {
        rows::value(
            run(client, &BY_IDEMPOTENCY_KEY, &[queue.into(), key.into()]),
            "reading an idempotency key",
        )
    })
}

/// Marks existing tasks ready (the caller has admitted them), fixing the
/// fairness start tag of those entering a fairness queue for the first time.
/// The caller then inserts their ready rows with `ready::insert`.
pub fn set_ready(ids: &[pgrx::Uuid]) {
    if ids.is_empty() {
        return;
    }
    let needing: Vec<(pgrx::Uuid, String, Option<String>, f64)> = Spi::connect_mut(|client| {
        rows::all(
            run(client, &NEEDING_FAIR_START, &[ids.to_vec().into()]),
            "reading fairness keys",
        )
    });
    let mut starts: Vec<Option<f64>> = vec![None; ids.len()];
    let index: std::collections::HashMap<pgrx::Uuid, usize> =
        ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    let mut i = 0;
    while i < needing.len() {
        let queue = &needing[i].1;
        let group: Vec<_> = needing[i..].iter().take_while(|t| &t.1 == queue).collect();
        let tags = ready::fair_starts(
            queue,
            &group.iter().map(|t| (t.2.clone(), t.3)).collect::<Vec<_>>(),
        );
        for (t, tag) in group.iter().zip(tags) {
            if let Some(&pos) = index.get(&t.0) {
                starts[pos] = Some(tag);
            }
        }
        i += group.len();
    }
    exec(&SET_READY, &[ids.to_vec().into(), starts.into()]);
}

// An execution's tasks, for its state changes (the workflow layer's close,
// pause and resume). Ready rows first, as the claim locks them (ready row,
// then task row).
const UNREADY: Stmt = Stmt::write(
    "DELETE FROM ready WHERE task_id = ANY(ARRAY(\
       SELECT id FROM tasks WHERE execution_id = $1 AND state = 'ready'))",
    &[PgBuiltInOids::UUIDOID],
);
// Every statement locking several tasks locks them in id order
// (`base::locks`), here before the DELETE takes them: a DELETE alone locks in
// the order of the execution's index, which is not the order of ids, and a
// batch completing two of its tasks meanwhile deadlocked with it (once in 60
// rounds of terminal_pairs' cancel vs complete).
const DELETE_OF_EXECUTION: Stmt = Stmt::write(
    "WITH mine AS (SELECT id FROM tasks WHERE execution_id = $1 ORDER BY id FOR UPDATE) \
     DELETE FROM tasks t USING mine WHERE t.id = mine.id RETURNING t.state, t.concurrency_key",
    &[PgBuiltInOids::UUIDOID],
);
// Ready, waiting and scheduled tasks wait, holding no slot, until resumed.
const PARK: Stmt = Stmt::write(
    "WITH old AS (SELECT id, state, concurrency_key FROM tasks \
                  WHERE execution_id = $1 AND state IN ('ready', 'waiting', 'scheduled') ORDER BY id FOR UPDATE) \
     UPDATE tasks t SET state = 'paused' FROM old WHERE t.id = old.id \
     RETURNING old.state, old.concurrency_key",
    &[PgBuiltInOids::UUIDOID],
);
const UNPARK_FUTURE: Stmt = Stmt::write(
    "UPDATE tasks SET state = 'scheduled' WHERE execution_id = $1 AND state = 'paused' AND run_at > now()",
    &[PgBuiltInOids::UUIDOID],
);
// Locked in id order, as a cancel locks them: locked in admission order
// instead, a resume and a cancel of an execution of several tasks could each
// wait for a task the other holds (seen once in 60 rounds of terminal_pairs'
// resume vs cancel). The caller sorts.
const PARKED: Stmt = Stmt::write(
    "SELECT id, concurrency_key, priority, seq FROM tasks WHERE execution_id = $1 AND state = 'paused' \
     ORDER BY id FOR UPDATE",
    &[PgBuiltInOids::UUIDOID],
);

fn state_and_key(
    client: &mut pgrx::spi::SpiClient<'_>,
    stmt: &Stmt,
    execution_id: pgrx::Uuid,
    doing: &str,
) -> Vec<(TaskState, Option<String>)> {
    rows::all(run(client, stmt, &[execution_id.into()]), doing)
}

const UNCLAIMED_OF_EXECUTION: Stmt = Stmt::read(
    "SELECT EXISTS (SELECT 1 FROM tasks WHERE execution_id = $1 AND kind = $2 AND state <> $3)",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
    ],
);

/// Whether an execution has a task of `kind` that no one holds yet
/// (scheduled, waiting, ready or parked): it will run, and read what the
/// execution's history has by then.
pub fn has_unclaimed_of_execution(execution_id: pgrx::Uuid, kind: &str) -> bool {
    Spi::connect_mut(|client| {
        rows::only_value(
            run(
                client,
                &UNCLAIMED_OF_EXECUTION,
                &[execution_id.into(), kind.into(), RUNNING.into()],
            ),
            "looking for an execution's unclaimed task",
        )
    })
}

const LOCK_READY_OF_EXECUTION: Stmt = Stmt::write(
    "SELECT task_id FROM ready WHERE task_id = ANY(ARRAY(\
       SELECT id FROM tasks WHERE execution_id = $1 AND state = 'ready')) ORDER BY task_id FOR UPDATE",
    &[PgBuiltInOids::UUIDOID],
);
const LOCK_OF_EXECUTION: Stmt = Stmt::write(
    "SELECT id FROM tasks WHERE execution_id = $1 ORDER BY id FOR UPDATE",
    &[PgBuiltInOids::UUIDOID],
);

/// Locks an execution's ready rows, then its tasks (`base::locks`),
/// changing nothing: for a caller that must read its row's state before
/// deciding to change them.
pub fn lock_of_execution(execution_id: pgrx::Uuid) {
    exec(&LOCK_READY_OF_EXECUTION, &[execution_id.into()]);
    exec(&LOCK_OF_EXECUTION, &[execution_id.into()]);
}

/// Deletes an execution's unfinished tasks (locking them); returns
/// `(state, key)` of each, for `caps::release_held`.
pub fn delete_of_execution(execution_id: pgrx::Uuid) -> Vec<(TaskState, Option<String>)> {
    exec(&UNREADY, &[execution_id.into()]);
    Spi::connect_mut(|client| state_and_key(client, &DELETE_OF_EXECUTION, execution_id, "cancelling tasks"))
}

/// Parks an execution's ready, waiting and scheduled tasks (locking them);
/// returns `(previous state, key)` of each, for `caps::release_held`.
pub fn park_of_execution(execution_id: pgrx::Uuid) -> Vec<(TaskState, Option<String>)> {
    exec(&UNREADY, &[execution_id.into()]);
    Spi::connect_mut(|client| state_and_key(client, &PARK, execution_id, "parking tasks"))
}

/// Locks an execution's parked tasks, and makes those not yet due
/// scheduled again; returns the rest, `(id, key)` in the order they should
/// be admitted (`promote::place`).
pub fn unpark_of_execution(execution_id: pgrx::Uuid) -> Vec<(pgrx::Uuid, Option<String>)> {
    exec(&UNPARK_FUTURE, &[execution_id.into()]);
    let mut parked: Vec<(pgrx::Uuid, Option<String>, i32, i64)> =
        Spi::connect_mut(|client| rows::all(run(client, &PARKED, &[execution_id.into()]), "unparking tasks"));
    // Priority first, then enqueue order: the line of a concurrency key.
    parked.sort_by(|a, b| b.2.cmp(&a.2).then(a.3.cmp(&b.3)));
    parked.into_iter().map(|(id, key, _, _)| (id, key)).collect()
}
