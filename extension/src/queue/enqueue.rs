//! Enqueueing: new tasks, their ready rows when admitted now, and what an
//! enqueue answers.

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
use crate::base::plans::Stmt;
use crate::queue::floor::{self, lower_in_enqueue};
use crate::queue::hooks::{ExecutionIntake, Intake};
use crate::queue::queues::Queue;
use crate::queue::{caps, queues, rate, ready};

/// The most payloads one `enqueue_batch` accepts.
pub const MAX_BATCH: usize = 10_000;

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
/// each without and with the idle probe; all of them without the claim
/// floor (`queue::floor`: a catalog older than 0.2.0 has none), with step 2
/// of readying, and with floors but without it (`floor::known_below`).
static INSERTS: [[[Stmt; 2]; 3]; 3] = [
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
    [
        [
            Stmt::write(insert_tasks!(one_task!(), "", "false", "", banded), ONE),
            Stmt::write(insert_tasks!(one_task!(), "", idle!(), "", banded), ONE),
        ],
        [
            Stmt::write(
                insert_tasks!(one_task!(), idempotent!(), "false", "", banded),
                ONE,
            ),
            Stmt::write(
                insert_tasks!(one_task!(), idempotent!(), idle!(), "", banded),
                ONE,
            ),
        ],
        [
            Stmt::write(insert_tasks!(many_tasks!(), "", "false", "", banded), MANY),
            Stmt::write(insert_tasks!(many_tasks!(), "", idle!(), "", banded), MANY),
        ],
    ],
];
const BY_IDEMPOTENCY_KEY: Stmt = Stmt::read(
    "SELECT id FROM tasks WHERE queue = $1 AND idempotency_key = $2",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::TEXTOID],
);
const NOTIFY: Stmt = Stmt::write("SELECT pg_notify('sheaf_ready', $1)", &[PgBuiltInOids::TEXTOID]);
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
    o.run_at.as_deref().map(|s| clock::run_at(s, "opts.run_at"))
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

/// Step 1 of readying, when any of `states` is ready.
fn step_one(name: &str, states: &[&str]) -> floor::Readying {
    if states.contains(&TaskState::Ready.as_str()) {
        floor::try_readying(name)
    } else {
        floor::Readying {
            floors: floor::enabled(),
            compare: true,
        }
    }
}

/// Which of `INSERTS`' floor variants readies the rows of fair starts
/// `ready` (none: nothing is readied), and, in a queue of priorities, their
/// band and lowest k2 (an aging queue's keys are the statement's to compute).
fn floor_step(
    q: Queue,
    name: &str,
    priority: i32,
    readying: floor::Readying,
    ready: &[Option<f64>],
) -> (usize, Option<(f64, f64)>) {
    let band = (!ready.is_empty() && !matches!(q.mode, Mode::Aging { .. })).then(|| {
        let k2 = ready
            .iter()
            .map(|s| s.unwrap_or(0.0))
            .fold(f64::INFINITY, f64::min);
        (-f64::from(priority), k2)
    });
    let floors = match (readying.floors, band) {
        (false, _) => 0,
        (true, Some((b, k2))) if floor::known_below(name, b, k2, readying) => 2,
        (true, _) => 1,
    };
    (floors, band)
}

/// Inserts tasks with validated options (the queue name is checked). A task
/// of an execution asks it whether it takes tasks (`intake`).
pub fn insert(
    name: &str,
    payloads: Vec<Jsonb>,
    o: &EnqueueOptions,
    intake: &dyn ExecutionIntake,
) -> Vec<pgrx::Uuid> {
    let run_at = parse_run_at(o);
    match &o.rate_limit {
        None => insert_at(name, payloads, o, run_at, intake),
        Some(limit) => insert_limited(name, limit, payloads, o, run_at, intake),
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
    intake: &dyn ExecutionIntake,
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
        let id = insert_at(name, vec![payload], o, Some(at), intake);
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
    intake: &dyn ExecutionIntake,
) -> Vec<pgrx::Uuid> {
    let execution_id = o.execution_id.map(pgrx::Uuid::from_bytes);
    // A paused execution's new tasks wait, holding no slot, until it resumes.
    let paused = execution_id.is_some_and(|id| intake.intake(id) == Intake::Parked);
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
    let readying = step_one(name, &states);
    let fair_starts = fair_starts(q, name, o, n, admitted);
    let (floors, priority_band) = floor_step(q, name, o.priority, readying, &fair_starts[..admitted]);
    // One payload at most (a key names one task).
    let retry = if o.idempotency_key.is_some() {
        payloads.clone()
    } else {
        Vec::new()
    };
    let (variant, args) = NewTasks {
        ids: new_ids.clone(),
        payloads,
        states,
        fair_starts,
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
    let stmt = &INSERTS[floors][variant][q.notify as usize];
    let was_idle = {
        // The probe answers once per statement, even when an idempotency
        // conflict inserted nothing.
        stmt.one_value::<bool>(&args, "enqueueing")
    };
    if let Some(key) = &o.idempotency_key
        && let Some(holder) = lost_key(name, key, first_id, o, admitted)
    {
        // Answer with theirs, or, if it has finished since, enqueue again.
        return holder.map_or_else(|| insert_at(name, retry, o, run_at, intake), |id| vec![id]);
    }
    // Only now is it certain the statement wrote the rows (and did step 2).
    if floors == 1
        && let Some((band, k2)) = priority_band
    {
        floor::note_readied(name, band, k2);
    }
    if let Some(ckey) = &o.concurrency_key
        && due
        && admitted < n
    {
        caps::waited(ckey, &new_ids[admitted..]);
    }
    // Only an idle queue's workers can be asleep on LISTEN (see ready.rs).
    if admitted > 0 && q.notify && was_idle {
        NOTIFY.exec(&[name.into()]);
    }
    new_ids
}

/// After an insert of task `ours` with idempotency `key`: `None` if it went
/// in; else a concurrent enqueue with the key won the insert, the slots
/// `admitted` for ours are given back, and the answer is the task holding
/// the key now (`None` inside if that one has finished since: ours was
/// never written).
fn lost_key(
    queue: &str,
    key: &str,
    ours: pgrx::Uuid,
    o: &EnqueueOptions,
    admitted: usize,
) -> Option<Option<pgrx::Uuid>> {
    let holder = by_idempotency_key(queue, key);
    if holder == Some(ours) {
        return None;
    }
    if let Some(ckey) = &o.concurrency_key
        && admitted > 0
    {
        caps::release(ckey, admitted as i32);
    }
    Some(holder)
}

/// The unfinished task of `queue` holding idempotency `key`, if any.
pub fn by_idempotency_key(queue: &str, key: &str) -> Option<pgrx::Uuid> {
    BY_IDEMPOTENCY_KEY.value(&[queue.into(), key.into()], "reading an idempotency key")
}
