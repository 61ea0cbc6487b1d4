//! Dead letters: tasks whose attempts ran out, kept until redriven.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

use crate::base::errors::not_ready;
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::queue::hooks::{ExecutionHooks, Outcome, TaskEvent};
use crate::queue::tasks::{attempt_secs, claim_times};
use crate::queue::{caps, promote};

// The attempt ends now, or at its lease's end if that came first (a reaped
// task's last attempt).
macro_rules! bury {
    ($catalog:tt) => {
        concat!(
                "WITH t AS (DELETE FROM tasks WHERE id = $1 RETURNING *), \
                 d AS (INSERT INTO dead_letters (id, queue, kind, payload, priority, attempts, max_attempts, \
                                                 execution_id, concurrency_key, fairness_key, fairness_weight, \
                                                 idempotency_key, last_error, enqueued_at) \
                       SELECT id, queue, kind, payload, priority, attempts, max_attempts, execution_id, \
                              concurrency_key, fairness_key, fairness_weight, idempotency_key, $2, enqueued_at \
                       FROM t) \
                 SELECT concurrency_key, execution_id, kind, attempts, ",
                attempt_secs!($catalog, "least(now(), lease_expires_at)"),
                " FROM t"
        )
    };
}
const BURY: [Stmt; 2] = [
    Stmt::write(bury!(0), &[PgBuiltInOids::UUIDOID, PgBuiltInOids::TEXTOID]),
    Stmt::write(bury!(1), &[PgBuiltInOids::UUIDOID, PgBuiltInOids::TEXTOID]),
];

row! {
    /// A buried task.
    struct Buried {
        key: Option<String>,
        execution_id: Option<pgrx::Uuid>,
        kind: String,
        attempts: i32,
        /// The last attempt's seconds since its claim.
        secs: Option<f64>,
    }
}

row! {
    /// A row of `REDRIVE`: the count of dead letters taken out (on every
    /// row), and a moved task (all NULL when none moved).
    struct Redriven {
        taken: i64,
        id: Option<pgrx::Uuid>,
        key: Option<String>,
        execution_id: Option<pgrx::Uuid>,
    }
}

row! {
    /// A dead letter that cannot be redriven, and why: the unfinished task
    /// holding its idempotency key, another dead letter of the call with
    /// its key, or its execution's state.
    struct Blocker {
        id: pgrx::Uuid,
        holder: Option<pgrx::Uuid>,
        twin: Option<pgrx::Uuid>,
        state: Option<String>,
    }
}

row! {
    /// What a purge took out: how many, and their executions.
    struct Gone {
        n: i64,
        executions: Vec<pgrx::Uuid>,
    }
}

row! {
    /// A dead letter that may be redriven.
    struct Redrivable {
        id: pgrx::Uuid,
        key: Option<String>,
    }
}

/// Moves a running task to the dead letters and frees its slot; its
/// execution hears of it through `hooks` (a workflow task's execution fails).
pub fn bury(task_id: pgrx::Uuid, error: &str, hooks: &dyn ExecutionHooks) {
    let row: Option<Buried> = BURY[claim_times()].first(&[task_id.into(), error.into()], "burying a task");
    let Some(Buried {
        key,
        execution_id,
        kind,
        attempts,
        secs,
    }) = row
    else {
        return;
    };
    // The execution row before the concurrency key (`base::locks`).
    if let Some(execution_id) = execution_id {
        hooks.task_outcome(TaskEvent {
            execution_id,
            task_id,
            kind: &kind,
            outcome: Outcome::DeadLettered { attempts, error },
            secs,
        });
    }
    if let Some(key) = key {
        caps::release(&key, 1);
    }
}

// Why a dead letter cannot go back: its idempotency key is held by an
// unfinished task or by another dead letter of the same call (two unfinished
// tasks would share it), or its execution has ended. The first such entry.
const REDRIVE_BLOCKER: Stmt = Stmt::read(
    "SELECT d.id, \
            (SELECT t.id FROM tasks t WHERE t.queue = d.queue AND t.idempotency_key = d.idempotency_key), \
            (SELECT o.id FROM dead_letters o WHERE o.id = ANY($1) AND o.id <> d.id AND o.queue = d.queue \
               AND o.idempotency_key = d.idempotency_key ORDER BY o.id LIMIT 1), \
            (SELECT coalesce(e.state, 'gone') FROM (SELECT 1) one \
               LEFT JOIN executions e ON e.id = d.execution_id WHERE d.execution_id IS NOT NULL) \
     FROM dead_letters d WHERE d.id = ANY($1) \
       AND (EXISTS (SELECT 1 FROM tasks t WHERE t.queue = d.queue AND t.idempotency_key = d.idempotency_key) \
            OR EXISTS (SELECT 1 FROM dead_letters o WHERE o.id = ANY($1) AND o.id <> d.id \
                       AND o.queue = d.queue AND o.idempotency_key = d.idempotency_key) \
            OR (d.execution_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM executions e \
                WHERE e.id = d.execution_id AND e.state IN ('RUNNING', 'SUSPENDED')))) \
     ORDER BY d.id LIMIT 1",
    &[PgBuiltInOids::UUIDARRAYOID],
);
// Moves the dead letters back as scheduled tasks (promoted right away).
// Counts what it took out, so an idempotency key taken between the check
// above and this statement cannot drop a dead letter: the call fails whole.
const REDRIVE: Stmt = Stmt::write(
    "WITH d AS (DELETE FROM dead_letters d WHERE id = ANY($1) \
       AND (d.execution_id IS NULL OR EXISTS (SELECT 1 FROM executions e \
            WHERE e.id = d.execution_id AND e.state IN ('RUNNING', 'SUSPENDED'))) \
       RETURNING *), \
     i AS (INSERT INTO tasks (id, queue, kind, payload, priority, state, seq, enqueued_at, run_at, \
                              attempts, max_attempts, execution_id, concurrency_key, fairness_key, \
                              fairness_weight, idempotency_key, last_error) \
       SELECT id, queue, kind, payload, priority, 'scheduled', nextval('task_seq'), enqueued_at, now(), \
              0, max_attempts, execution_id, concurrency_key, fairness_key, fairness_weight, \
              idempotency_key, last_error \
       FROM d \
       ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING \
       RETURNING id, concurrency_key, execution_id) \
     SELECT (SELECT count(*) FROM d), i.id, i.concurrency_key, i.execution_id \
     FROM (SELECT 1) one LEFT JOIN i ON true",
    &[PgBuiltInOids::UUIDARRAYOID],
);

/// Puts dead letters back in line with fresh attempts; returns how many
/// moved. Ids that are not dead letters (never were, or already redriven)
/// are skipped. A dead letter that cannot go back refuses the whole call
/// (55000, nothing moves): its idempotency key is held by an unfinished task
/// or by another dead letter of the call, or its execution has ended.
/// The executions of those that moved hear of it through `hooks`.
/// (The statements read `executions` themselves: they decide which dead
/// letters may move.)
pub fn redrive(ids: Vec<pgrx::Uuid>, hooks: &dyn ExecutionHooks) -> i32 {
    refuse_blocked(&ids);
    let (taken, moved) = {
        // One row per moved task, or one row of NULLs when none moved; the
        // count of what was taken out is on every row.
        let rows: Vec<Redriven> = REDRIVE.all(&[ids.into()], "redriving dead letters");
        let taken = rows.first().map_or(0, |r| r.taken);
        let moved: Vec<(pgrx::Uuid, Option<String>, Option<pgrx::Uuid>)> = rows
            .into_iter()
            .filter_map(|r| r.id.map(|id| (id, r.key, r.execution_id)))
            .collect();
        (taken, moved)
    };
    if taken != moved.len() as i64 {
        not_ready(
            "an unfinished task took a redriven dead letter's idempotency key meanwhile; nothing was redriven",
        );
    }
    let n = moved.len() as i32;
    let executions: Vec<pgrx::Uuid> = moved.iter().filter_map(|m| m.2).collect();
    if !executions.is_empty() {
        hooks.dead_letters_gone(&executions);
    }
    promote::place(moved.into_iter().map(|m| (m.0, m.1)).collect());
    n
}

/// 55000 naming the first of `ids` that cannot go back, and why.
fn refuse_blocked(ids: &[pgrx::Uuid]) {
    let blocker: Option<Blocker> =
        REDRIVE_BLOCKER.first(&[ids.to_vec().into()], "checking dead letters to redrive");
    let Some(Blocker {
        id,
        holder,
        twin,
        state,
    }) = blocker
    else {
        return;
    };
    not_ready(match (holder, twin) {
        (Some(task), _) => format!(
            "dead letter {id} cannot be redriven: unfinished task {task} holds its idempotency key; nothing was redriven"
        ),
        (None, Some(twin)) => format!(
            "dead letters {id} and {twin} share an idempotency key: redrive one of them; nothing was redriven"
        ),
        (None, None) => format!(
            "dead letter {id} cannot be redriven: its execution is {}; nothing was redriven",
            state.unwrap_or_else(|| "gone".into())
        ),
    });
}

/// Dead letters purged per statement: a purge of millions holds no more
/// than this many execution ids at once.
const PURGE_BATCH: i64 = 10_000;

// Oldest first on `dead_letters_queue`; ids locked in id order
// (`base::locks`) before they go.
const PURGE: Stmt = Stmt::write(
    "WITH old AS (SELECT id FROM dead_letters WHERE queue = $1 AND dead_at <= $2 ORDER BY dead_at LIMIT $3), \
          locked AS (SELECT d.id FROM dead_letters d JOIN old USING (id) ORDER BY d.id FOR UPDATE OF d), \
          gone AS (DELETE FROM dead_letters d USING locked WHERE d.id = locked.id RETURNING d.execution_id) \
     SELECT (SELECT count(*) FROM gone), \
            ARRAY(SELECT execution_id FROM gone WHERE execution_id IS NOT NULL)",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TIMESTAMPTZOID,
        PgBuiltInOids::INT8OID,
    ],
);
const CUTOFF: Stmt = Stmt::read(
    "SELECT now() - make_interval(secs => $1)",
    &[PgBuiltInOids::FLOAT8OID],
);

/// Deletes the dead letters of `queue` dead for longer than `older_secs`
/// (`None`: every one); returns how many. Their executions' quota counters
/// follow (`hooks.dead_letters_gone`), so a tenant held back by
/// `max_dead_letters` can start again.
pub fn purge(queue: &str, older_secs: Option<f64>, hooks: &dyn ExecutionHooks) -> i64 {
    let cutoff = match older_secs {
        Some(secs) => CUTOFF.one_value::<TimestampWithTimeZone>(&[secs.into()], "reading the clock"),
        None => TimestampWithTimeZone::positive_infinity(),
    };
    let mut total = 0;
    loop {
        let Gone { n, executions } = PURGE.one(
            &[queue.into(), cutoff.into(), PURGE_BATCH.into()],
            "purging dead letters",
        );
        if !executions.is_empty() {
            hooks.dead_letters_gone(&executions);
        }
        total += n;
        if n < PURGE_BATCH {
            return total;
        }
    }
}

// Candidates of a queue's redrive, oldest first: those that may go back (no
// unfinished task holds their idempotency key, their execution is live).
const REDRIVABLE: Stmt = Stmt::read(
    "SELECT d.id, d.idempotency_key FROM dead_letters d \
     WHERE d.queue = $1 AND d.dead_at <= now() - make_interval(secs => $2) \
       AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.queue = d.queue AND t.idempotency_key = d.idempotency_key) \
       AND (d.execution_id IS NULL OR EXISTS (SELECT 1 FROM executions e \
            WHERE e.id = d.execution_id AND e.state IN ('RUNNING', 'SUSPENDED'))) \
     ORDER BY d.dead_at, d.id LIMIT $3",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::INT8OID,
    ],
);

/// Redrives up to `max` dead letters of `queue` dead for longer than
/// `older_secs`, oldest first; returns how many moved. Those that cannot go
/// back (an unfinished task holds their idempotency key, their execution
/// ended, or an older one of the same key goes first) are left, so calling
/// it again until it returns 0 ends.
pub fn redrive_queue(queue: &str, older_secs: f64, max: i64, hooks: &dyn ExecutionHooks) -> i32 {
    let found: Vec<Redrivable> = REDRIVABLE.all(
        &[queue.into(), older_secs.into(), max.into()],
        "choosing dead letters to redrive",
    );
    let mut keys = std::collections::HashSet::new();
    let ids: Vec<pgrx::Uuid> = found
        .into_iter()
        .filter(|d| d.key.as_ref().is_none_or(|k| keys.insert(k.clone())))
        .map(|d| d.id)
        .collect();
    if ids.is_empty() {
        return 0;
    }
    redrive(ids, hooks)
}

// Every queue's dead letters past their retention, oldest first on
// `dead_letters_age`, locked in id order.
const EXPIRED: Stmt = Stmt::write(
    "WITH old AS (SELECT id FROM dead_letters WHERE dead_at < now() - make_interval(secs => $1) \
                  ORDER BY dead_at LIMIT $2), \
          locked AS (SELECT d.id FROM dead_letters d JOIN old USING (id) ORDER BY d.id FOR UPDATE OF d SKIP LOCKED), \
          gone AS (DELETE FROM dead_letters d USING locked WHERE d.id = locked.id RETURNING d.execution_id) \
     SELECT (SELECT count(*) FROM gone), \
            ARRAY(SELECT execution_id FROM gone WHERE execution_id IS NOT NULL)",
    &[PgBuiltInOids::FLOAT8OID, PgBuiltInOids::INT8OID],
);

/// Deletes up to `max` dead letters (of any queue) dead for longer than
/// `older_secs`, oldest first (retention); how many. Quota counters follow.
pub fn expire(older_secs: f64, max: i64, hooks: &dyn ExecutionHooks) -> i64 {
    let Gone { n, executions } =
        EXPIRED.one(&[older_secs.into(), max.into()], "deleting expired dead letters");
    if !executions.is_empty() {
        hooks.dead_letters_gone(&executions);
    }
    n
}
