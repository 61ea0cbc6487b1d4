//! Rebalancing: moving one quiescent execution to another shard
//! (`migrations` in sql/schema.sql). On the source: the blockers, the
//! export, verify, the cutover and the record; on the target: stage,
//! activate and discard; on the origin: repoint. The driver's
//! `Client::rebalance` runs them in order, each one transaction on one shard,
//! so a crash between two leaves a record that says what is outstanding.
//!
//! The copy is column-list-free (`to_jsonb` here, `jsonb_populate_record`
//! there) after a parity check that refuses a target lacking a column. Shard
//! values are not copied as they are: tasks get ids minted on the target
//! and new enqueue sequence numbers, the execution a new admission number,
//! and the byte check leaves those out.

use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use sheaf_core::state::ExecutionState;

use crate::base::errors::{bad_argument, lease_lost, not_found, not_ready, sqlstate_text, unknown_execution};
use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::base::{audit, ids, shard};
use crate::queue::{caps, promote, queues, tasks};
use crate::workflow::{executions, quota};

/// The tables a move copies, with the rows of one execution.
const COPIED: [&str; 7] = [
    "executions",
    "events",
    "tasks",
    "signals_seen",
    "children",
    "outbox",
    "usage_records",
];

/// The blockers of execution `e` (a row of `executions`), as a `text[]`:
/// empty when it may move. A dry run and the cutover read the same list.
/// Each test is a probe per row (`OFFSET 0` keeps the planner from hashing
/// a whole table once per page: on 100K executions that made every page of
/// a dry run cost 60 ms instead of 1).
macro_rules! blockers {
    () => {
        "array_remove(ARRAY[\
           CASE WHEN e.state NOT IN ('RUNNING', 'SUSPENDED', 'MIGRATING') THEN 'not_running' END, \
           CASE WHEN e.state = 'MIGRATING' OR EXISTS (SELECT 1 FROM migrations m \
                     WHERE m.execution_id = e.id AND m.phase NOT IN ('DONE', 'ABORTED') OFFSET 0) \
                THEN 'migration_in_progress' END, \
           CASE WHEN EXISTS (SELECT 1 FROM tasks t WHERE t.execution_id = e.id AND t.state = 'running' OFFSET 0) \
                THEN 'task_claimed' END, \
           CASE WHEN EXISTS (SELECT 1 FROM mutex_locks l WHERE l.holder = e.id OFFSET 0) \
                  OR EXISTS (SELECT 1 FROM mutex_waiters w WHERE w.owner = e.id OFFSET 0) THEN 'mutex' END, \
           CASE WHEN EXISTS (SELECT 1 FROM cross_shard_children c WHERE c.parent_id = e.id OFFSET 0) \
                  OR EXISTS (SELECT 1 FROM executions k WHERE k.parent_id = e.id \
                             AND k.state IN ('RUNNING', 'SUSPENDED', 'PAUSED', 'MIGRATING') OFFSET 0) \
                THEN 'children_unsettled' END, \
           CASE WHEN EXISTS (SELECT 1 FROM executions p WHERE p.id = e.parent_id \
                             AND p.state IN ('RUNNING', 'SUSPENDED', 'PAUSED') OFFSET 0) THEN 'parent_here' END, \
           CASE WHEN EXISTS (SELECT 1 FROM outbox o WHERE o.sender_id = e.id AND o.state <> 'DONE' OFFSET 0) \
                THEN 'outbox_unsettled' END, \
           CASE WHEN EXISTS (SELECT 1 FROM dead_letters d WHERE d.execution_id = e.id OFFSET 0) \
                THEN 'dead_letters' END, \
           CASE WHEN EXISTS (SELECT 1 FROM tasks t WHERE t.execution_id = e.id AND t.run_at = 'infinity' OFFSET 0) \
                THEN 'rate_limited' END, \
           CASE WHEN EXISTS (SELECT 1 FROM debounces d WHERE d.execution_id = e.id AND d.until > now() OFFSET 0) \
                THEN 'debounce_open' END], NULL)"
    };
}

/// The portable digest of execution `$1`'s rows on this shard: what a move
/// copies, byte for byte as `jsonb` text, without the shard's own values
/// (task ids and sequence numbers, the admission number, claim state, the
/// move's bookkeeping), so the source and the staged copy compare equal.
macro_rules! digest {
    () => {
        "encode(sha256(convert_to(concat_ws(E'\\n', \
           (SELECT (to_jsonb(x) - ARRAY['state', 'seq', 'paused_from', 'closed_at', 'migrated_to_shard', \
                                        'migrated_from_shards', 'replaced_seal', 'staged_by']) \
                   || jsonb_build_object('state', CASE WHEN x.state = 'MIGRATING' THEN x.paused_from ELSE x.state END) \
            FROM executions x WHERE x.id = $1)::text, \
           (SELECT string_agg(to_jsonb(v)::text, E'\\n' ORDER BY v.seq) FROM events v WHERE v.execution_id = $1), \
           '-', \
           (SELECT string_agg((to_jsonb(t) - ARRAY['id', 'seq', 'state', 'fair_start', 'token', 'lease_owner', \
                                                  'lease_expires_at', 'claimed_at'])::text, E'\\n' ORDER BY t.seq) \
            FROM tasks t WHERE t.execution_id = $1), \
           '-', \
           (SELECT string_agg(s.signal_id, E'\\n' ORDER BY s.signal_id) FROM signals_seen s WHERE s.execution_id = $1), \
           '-', \
           (SELECT string_agg(to_jsonb(c)::text, E'\\n' ORDER BY c.child_id) FROM children c WHERE c.parent_id = $1), \
           '-', \
           (SELECT string_agg(to_jsonb(o)::text, E'\\n' ORDER BY o.outbox_id) FROM outbox o WHERE o.sender_id = $1), \
           '-', \
           (SELECT string_agg(to_jsonb(u)::text, E'\\n' ORDER BY u.recorded_at, u.metrics::text) \
            FROM usage_records u WHERE u.execution_id = $1)), 'UTF8')), 'hex')"
    };
}

/// The source's high-water mark of execution `$1`: its row, its tasks as
/// they are here (shard values included) and how many usage records it
/// has. Any change (an event, a wake, a claim, a promotion, usage recorded
/// without an event) changes it.
macro_rules! fingerprint {
    () => {
        "md5(concat_ws(E'\\n', (SELECT to_jsonb(x)::text FROM executions x WHERE x.id = $1), \
           (SELECT string_agg(to_jsonb(t)::text, E'\\n' ORDER BY t.id) FROM tasks t WHERE t.execution_id = $1), \
           (SELECT count(*)::text FROM usage_records u WHERE u.execution_id = $1)))"
    };
}

// Values rendered the same in every session: to_jsonb prints timestamps in
// the session's time zone and floats by extra_float_digits. For the rest of
// the calling transaction.
const CANONICAL: Stmt = Stmt::write(
    "SELECT set_config('TimeZone', 'UTC', true), set_config('extra_float_digits', '1', true)",
    &[],
);
const CANDIDATES: Stmt = Stmt::read(
    concat!(
        "SELECT e.id, e.workflow_name, e.workflow_id, e.state, e.history_bytes, ",
        blockers!(),
        " FROM executions e WHERE e.state IN ('RUNNING', 'SUSPENDED', 'PAUSED', 'MIGRATING') \
         AND e.id > coalesce($1, '00000000-0000-0000-0000-000000000000'::uuid) ORDER BY e.id LIMIT $2"
    ),
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::INT8OID],
);
const BLOCKERS_OF: Stmt = Stmt::write(
    concat!("SELECT ", blockers!(), " FROM executions e WHERE e.id = $1"),
    &[PgBuiltInOids::UUIDOID],
);
// Ready rows before task rows, tasks in id order, as every path
// (`base::locks`); a claim takes ready rows SKIP LOCKED.
const RECORD: Stmt = Stmt::write(
    "INSERT INTO migrations (execution_id, target_shard, actor, login, bytes, lease_token, lease_until, lease_secs) \
     SELECT $1, $2, left(coalesce(nullif(current_setting('sheaf.actor', true), ''), session_user::text), 256), \
            session_user::text, history_bytes, nextval('fence_token'), now() + make_interval(secs => $3), $3 \
     FROM executions WHERE id = $1 RETURNING id, lease_token",
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::FLOAT8OID,
    ],
);
const LEAVES_ENDED_PARENT: Stmt = Stmt::write(
    "UPDATE executions e SET result_pulled_at = now() \
     WHERE e.id = $1 AND e.parent_id IS NOT NULL AND e.result_pulled_at IS NULL \
       AND EXISTS (SELECT 1 FROM executions p WHERE p.id = e.parent_id \
                   AND p.state NOT IN ('RUNNING', 'SUSPENDED', 'PAUSED', 'MIGRATING', 'MIGRATED'))",
    &[PgBuiltInOids::UUIDOID],
);
const EXPORT: Stmt = Stmt::read(
    concat!(
        "SELECT jsonb_build_object(\
       'migration_id', $2::bigint, 'lease_token', $5::bigint, 'source_shard', $3::int, 'digest', ",
        digest!(),
        ", \
       'columns', (SELECT jsonb_object_agg(c.relname, c.cols) FROM (\
          SELECT r.relname, jsonb_agg(a.attname ORDER BY a.attnum) AS cols \
          FROM pg_class r JOIN pg_attribute a ON a.attrelid = r.oid \
          WHERE r.oid = ANY($4::regclass[]) AND a.attnum > 0 AND NOT a.attisdropped GROUP BY r.relname) c), \
       'execution', (SELECT to_jsonb(x) FROM executions x WHERE x.id = $1), \
       'events', coalesce((SELECT jsonb_agg(to_jsonb(v) ORDER BY v.seq) FROM events v WHERE v.execution_id = $1), '[]'), \
       'tasks', coalesce((SELECT jsonb_agg(to_jsonb(t) ORDER BY t.seq) FROM tasks t WHERE t.execution_id = $1), '[]'), \
       'signals_seen', coalesce((SELECT jsonb_agg(to_jsonb(s)) FROM signals_seen s WHERE s.execution_id = $1), '[]'), \
       'children', coalesce((SELECT jsonb_agg(to_jsonb(c)) FROM children c WHERE c.parent_id = $1), '[]'), \
       'outbox', coalesce((SELECT jsonb_agg(to_jsonb(o)) FROM outbox o WHERE o.sender_id = $1), '[]'), \
       'usage_records', coalesce((SELECT jsonb_agg(to_jsonb(u)) FROM usage_records u WHERE u.execution_id = $1), '[]'))"
    ),
    &[
        PgBuiltInOids::UUIDOID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::TEXTARRAYOID,
        PgBuiltInOids::INT8OID,
    ],
);
const RECORD_FOR_UPDATE: Stmt = Stmt::write(
    "SELECT execution_id, target_shard, phase, verified_fingerprint, lease_token FROM migrations \
     WHERE id = $1 FOR UPDATE",
    &[PgBuiltInOids::INT8OID],
);
// A step of the record's mover: its lease runs its length again.
const RENEW: Stmt = Stmt::write(
    "UPDATE migrations SET lease_until = now() + make_interval(secs => lease_secs) WHERE id = $1",
    &[PgBuiltInOids::INT8OID],
);
// A new mover for a record whose lease lapsed (a crashed or stuck one).
const TAKEOVER: Stmt = Stmt::write(
    "UPDATE migrations SET lease_token = nextval('fence_token'), lease_secs = $2, \
            lease_until = now() + make_interval(secs => $2), updated_at = now() \
     WHERE id = $1 AND phase NOT IN ('DONE', 'ABORTED') AND lease_until < now() RETURNING lease_token",
    &[PgBuiltInOids::INT8OID, PgBuiltInOids::FLOAT8OID],
);
const MARKS: Stmt = Stmt::write(
    concat!(
        "SELECT ",
        digest!(),
        ", ",
        fingerprint!(),
        ", (SELECT last_event_seq FROM executions WHERE id = $1)"
    ),
    &[PgBuiltInOids::UUIDOID],
);
const FINGERPRINT: Stmt = Stmt::write(concat!("SELECT ", fingerprint!()), &[PgBuiltInOids::UUIDOID]);
const DIGEST: Stmt = Stmt::read(concat!("SELECT ", digest!()), &[PgBuiltInOids::UUIDOID]);
const SET_VERIFIED: Stmt = Stmt::write(
    "UPDATE migrations SET phase = 'VERIFIED', verified_event_seq = $2, verified_fingerprint = $3, \
     last_error = NULL, updated_at = now() WHERE id = $1",
    &[
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::TEXTOID,
    ],
);
const NOTE_ERROR: Stmt = Stmt::write(
    "UPDATE migrations SET attempts = attempts + 1, last_error = left($2, 1000), updated_at = now() WHERE id = $1",
    &[PgBuiltInOids::INT8OID, PgBuiltInOids::TEXTOID],
);
const SEAL: Stmt = Stmt::write(
    "UPDATE executions SET state = 'MIGRATED', migrated_to_shard = $2, seal_released_at = NULL WHERE id = $1 \
     RETURNING history_bytes, quota_key",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::INT4OID],
);
const SET_PHASE: Stmt = Stmt::write(
    "UPDATE migrations SET phase = $2, last_error = coalesce(left($3, 1000), last_error), updated_at = now() \
     WHERE id = $1 RETURNING execution_id, target_shard, bytes",
    &[
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
    ],
);
const SEAL_DONE: Stmt = Stmt::write(
    "UPDATE executions SET closed_at = now() WHERE id = $1 AND state = 'MIGRATED'",
    &[PgBuiltInOids::UUIDOID],
);
const STALLED: Stmt = Stmt::write(
    "UPDATE migrations m SET updated_at = now(), lease_token = nextval('fence_token'), lease_secs = $4, \
            lease_until = now() + make_interval(secs => $4) FROM (\
       SELECT id FROM migrations WHERE phase = 'COMMITTED' AND updated_at < now() - make_interval(secs => $1) \
       AND lease_until < now() AND ($3::int[] IS NULL OR target_shard = ANY($3)) \
       ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED) s \
     WHERE m.id = s.id RETURNING m.id, m.execution_id, m.target_shard, m.attempts, m.lease_token",
    &[
        PgBuiltInOids::FLOAT8OID,
        PgBuiltInOids::INT8OID,
        PgBuiltInOids::INT4ARRAYOID,
        PgBuiltInOids::FLOAT8OID,
    ],
);
const LIST: Stmt = Stmt::read(
    "SELECT id, execution_id, target_shard, phase, attempts, last_error, verified_event_seq, bytes, actor, \
            login, created_at, updated_at FROM migrations \
     WHERE NOT $1 OR phase NOT IN ('DONE', 'ABORTED') ORDER BY id DESC LIMIT $2",
    &[PgBuiltInOids::BOOLOID, PgBuiltInOids::INT8OID],
);
const HERE: Stmt = Stmt::write(
    "SELECT state, workflow_name, workflow_id, migrated_to_shard, replaced_seal IS NOT NULL, staged_by \
     FROM executions WHERE id = $1",
    &[PgBuiltInOids::UUIDOID],
);
const COLUMNS: Stmt = Stmt::read(
    "SELECT r.relname::text, array_agg(a.attname::text ORDER BY a.attnum) \
     FROM pg_class r JOIN pg_attribute a ON a.attrelid = r.oid \
     WHERE r.oid = ANY($1::regclass[]) AND a.attnum > 0 AND NOT a.attisdropped GROUP BY r.relname",
    &[PgBuiltInOids::TEXTARRAYOID],
);
const KEY_TAKEN: Stmt = Stmt::read(
    "SELECT id FROM executions WHERE workflow_name = $1 AND workflow_id = $2 AND id <> $3 \
     AND state IN ('RUNNING', 'SUSPENDED', 'PAUSED', 'MIGRATING', 'MIGRATED') LIMIT 1",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::UUIDOID,
    ],
);
// The staged row: the source's, in MIGRATING, remembering the state it
// returns to, with this shard's admission number.
macro_rules! staged {
    () => {
        "$1 || jsonb_build_object('state', 'MIGRATING', 'paused_from', $1->>'state', \
           'seq', nextval('execution_seq'), 'closed_at', NULL, 'migrated_to_shard', $2::int, \
           'migrated_from_shards', coalesce($1->'migrated_from_shards', '[]') || to_jsonb($3::int), \
           'replaced_seal', $4::jsonb, 'staged_by', $5::text)"
    };
}
const INSERT_STAGED: Stmt = Stmt::write(
    concat!(
        "INSERT INTO executions SELECT * FROM jsonb_populate_record(NULL::executions, ",
        staged!(),
        ")"
    ),
    &[
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::TEXTOID,
    ],
);
const SEAL_ROW: Stmt = Stmt::write(
    "SELECT to_jsonb(x) FROM executions x WHERE x.id = $1",
    &[PgBuiltInOids::UUIDOID],
);
const INSERT_EVENTS: Stmt = Stmt::write(
    "INSERT INTO events SELECT * FROM jsonb_populate_recordset(NULL::events, $1) ON CONFLICT DO NOTHING",
    &[PgBuiltInOids::JSONBOID],
);
const INSERT_SIGNALS: Stmt = Stmt::write(
    "INSERT INTO signals_seen SELECT * FROM jsonb_populate_recordset(NULL::signals_seen, $1) ON CONFLICT DO NOTHING",
    &[PgBuiltInOids::JSONBOID],
);
const INSERT_CHILDREN: Stmt = Stmt::write(
    "INSERT INTO children SELECT * FROM jsonb_populate_recordset(NULL::children, $1) ON CONFLICT DO NOTHING",
    &[PgBuiltInOids::JSONBOID],
);
const INSERT_OUTBOX: Stmt = Stmt::write(
    "INSERT INTO outbox SELECT * FROM jsonb_populate_recordset(NULL::outbox, $1) ON CONFLICT DO NOTHING",
    &[PgBuiltInOids::JSONBOID],
);
const INSERT_USAGE: Stmt = Stmt::write(
    "INSERT INTO usage_records SELECT * FROM jsonb_populate_recordset(NULL::usage_records, $1)",
    &[PgBuiltInOids::JSONBOID],
);
// Tasks parked (holding no slot) under ids of this shard, in the source's
// enqueue order; activation admits them as a resume does.
// The ids come minted in `$2`, one per task in order (a function minting
// them inside this statement would run a statement within a statement).
const INSERT_TASKS: Stmt = Stmt::write(
    "INSERT INTO tasks SELECT (jsonb_populate_record(NULL::tasks, x.t || jsonb_build_object(\
       'id', i.id, 'state', 'paused', 'seq', nextval('task_seq'), 'fair_start', NULL, 'token', NULL, \
       'lease_owner', NULL, 'lease_expires_at', NULL, 'claimed_at', NULL))).* \
     FROM jsonb_array_elements($1) WITH ORDINALITY AS x(t, n) \
     JOIN unnest($2::uuid[]) WITH ORDINALITY AS i(id, m) ON i.m = x.n ORDER BY x.n",
    &[PgBuiltInOids::JSONBOID, PgBuiltInOids::UUIDARRAYOID],
);
const DELETE_USAGE: Stmt = Stmt::write(
    "DELETE FROM usage_records WHERE execution_id = $1",
    &[PgBuiltInOids::UUIDOID],
);
const DELETE_STAGED: Stmt = Stmt::write(
    "WITH v AS (DELETE FROM events WHERE execution_id = $1), \
          s AS (DELETE FROM signals_seen WHERE execution_id = $1), \
          c AS (DELETE FROM children WHERE parent_id = $1), \
          o AS (DELETE FROM outbox WHERE sender_id = $1), \
          u AS (DELETE FROM usage_records WHERE execution_id = $1) \
     SELECT 1",
    &[PgBuiltInOids::UUIDOID],
);
const DELETE_ROW: Stmt = Stmt::write(
    "DELETE FROM executions WHERE id = $1 AND state = 'MIGRATING'",
    &[PgBuiltInOids::UUIDOID],
);
const DELETE_NEWER_EVENTS: Stmt = Stmt::write(
    "DELETE FROM events WHERE execution_id = $1 AND seq > $2",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::INT8OID],
);
const ACTIVATE: Stmt = Stmt::write(
    "UPDATE executions SET state = coalesce(paused_from, 'RUNNING'), paused_from = NULL, \
     migrated_to_shard = NULL, replaced_seal = NULL, staged_by = NULL WHERE id = $1 AND state = 'MIGRATING' \
     RETURNING history_bytes, quota_key",
    &[PgBuiltInOids::UUIDOID],
);
const REPOINT: Stmt = Stmt::write(
    "UPDATE executions SET migrated_to_shard = $2 WHERE id = $1 AND state = 'MIGRATED' \
     AND migrated_to_shard IS DISTINCT FROM $2 RETURNING id",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::INT4OID],
);

pub use crate::workflow::executions::moves_enabled as enabled;

fn require_enabled() {
    if !enabled() {
        not_ready("this shard's schema has no rebalancing: ALTER EXTENSION sheaf UPDATE first");
    }
}

fn canonical() {
    CANONICAL.exec(&[]);
}

row! {
    /// A candidate for a move, and its blockers (none: it may move).
    pub struct Candidate {
        pub id: pgrx::Uuid,
        pub workflow_name: String,
        pub workflow_id: String,
        pub state: String,
        pub history_bytes: i64,
        pub blockers: Vec<String>,
    }
}

row! {
    /// A move's record, as `RECORD` wrote it: its id and lease token.
    struct Recorded {
        migration: i64,
        token: i64,
    }
}

row! {
    /// A move's record, locked: `lock_record` reads it.
    struct RecordRow {
        execution_id: pgrx::Uuid,
        target: i32,
        phase: String,
        fingerprint: Option<String>,
        held_by: i64,
    }
}

row! {
    /// An execution's marks: its digest, fingerprint and last event seq.
    struct Marks {
        digest: String,
        fingerprint: String,
        seq: i64,
    }
}

row! {
    /// What a seal or an activation moved: the execution's history bytes
    /// and quota key.
    struct Share {
        bytes: i64,
        key: Option<String>,
    }
}

row! {
    /// A move's record after a phase change: execution, target, bytes.
    struct Phased {
        id: pgrx::Uuid,
        target: i32,
        bytes: i64,
    }
}

row! {
    /// A table moves copy, and its columns.
    struct TableColumns {
        table: String,
        columns: Vec<String>,
    }
}

/// A page of this shard's unfinished executions after `after`, in id order,
/// each with every reason it cannot move now.
pub fn candidates(after: Option<pgrx::Uuid>, max_rows: i64) -> Vec<Candidate> {
    require_enabled();
    CANDIDATES.all(&[after.into(), max_rows.into()], "listing rebalance candidates")
}

fn blockers_of(id: pgrx::Uuid) -> Vec<String> {
    BLOCKERS_OF
        .value::<Vec<String>>(&[id.into()], "reading blockers")
        .unwrap_or_else(|| unknown_execution(id))
}

/// Locks an execution's ready rows, then its tasks, then its row.
fn lock_all(id: pgrx::Uuid) -> executions::Locked {
    tasks::lock_of_execution(id);
    executions::try_lock(id).unwrap_or_else(|| unknown_execution(id))
}

/// Starts moving execution `id` to `target`: 55000 naming every blocker if
/// it is not quiescent; else a STARTED record and the export the target
/// stages (`stage`).
pub fn begin(id: pgrx::Uuid, target: i32, lease_secs: f64) -> Jsonb {
    require_enabled();
    let here = shard::current();
    if target == here {
        bad_argument(
            "target_shard",
            format!("is this shard ({here}): a move goes elsewhere"),
        );
    }
    canonical();
    lock_all(id);
    let blockers = blockers_of(id);
    if !blockers.is_empty() {
        not_ready(format!("execution {id} cannot move now: {}", blockers.join(", ")));
    }
    // A child leaving its ended parent here: no relay pulls the end of a
    // child started in its parent's transaction, so it is marked delivered
    // now and retention keeps neither waiting for the other.
    LEAVES_ENDED_PARENT.exec(&[id.into()]);
    let Recorded { migration, token } =
        RECORD.one(&[id.into(), target.into(), lease_secs.into()], "recording a move");
    let tables: Vec<String> = COPIED.iter().map(|t| (*t).to_owned()).collect();
    EXPORT.one_value(
        &[
            id.into(),
            migration.into(),
            here.into(),
            tables.into(),
            token.into(),
        ],
        "exporting an execution",
    )
}

struct Record {
    execution_id: pgrx::Uuid,
    target: i32,
    phase: String,
    fingerprint: Option<String>,
}

/// Locks move `migration`'s record for a step of its mover, the holder of
/// `token`: 55P03 for anyone else (a mover whose lease lapsed and was
/// taken over). The step renews the lease.
fn lock_record(migration: i64, token: i64) -> Record {
    require_enabled();
    let found: Option<RecordRow> = RECORD_FOR_UPDATE.first(&[migration.into()], "locking a move");
    let Some(RecordRow {
        execution_id,
        target,
        phase,
        fingerprint,
        held_by,
    }) = found
    else {
        not_found(format!("no move {migration} on this shard"));
    };
    if held_by != token {
        lease_lost(format!(
            "move {migration} is not held under lease token {token}: another mover took it over"
        ));
    }
    RENEW.exec(&[migration.into()]);
    Record {
        execution_id,
        target,
        phase,
        fingerprint,
    }
}

/// How long a worker's auto-resume holds a move it claimed (a mover's own
/// lease is `migration_begin`'s, 60 s unless it says otherwise): a step
/// renews it; a resume takes over a record only after it lapsed.
pub const LEASE_SECS: f64 = 60.0;

/// A new lease on move `migration` for `lease_secs`, when its mover's has
/// lapsed: the new token, or `None` while the mover still holds it (or
/// the move is over).
pub fn takeover(migration: i64, lease_secs: f64) -> Option<i64> {
    require_enabled();
    TAKEOVER.value(&[migration.into(), lease_secs.into()], "taking a move over")
}

/// Records that the staged copy's digest is `target_digest`: VERIFIED with
/// this shard's high-water mark if it equals this shard's; else `false`
/// (the error noted, the phase kept: the driver discards the copy and
/// aborts). A VERIFIED record verifies again.
pub fn verify(migration: i64, token: i64, target_digest: &str) -> bool {
    canonical();
    let r = lock_record(migration, token);
    if r.phase != "STARTED" && r.phase != "VERIFIED" {
        not_ready(format!(
            "move {migration} is {}: only a STARTED move verifies",
            r.phase
        ));
    }
    let Marks {
        digest,
        fingerprint,
        seq,
    } = MARKS.one(&[r.execution_id.into()], "reading an execution's marks");
    if digest != target_digest {
        NOTE_ERROR.exec(&[migration.into(), "the staged copy differs from the source".into()]);
        return false;
    }
    SET_VERIFIED.exec(&[migration.into(), seq.into(), fingerprint.into()]);
    true
}

/// The cutover: seals the execution MIGRATED (its tasks, slots and quota
/// share go with it) only while it still matches the verified high-water
/// mark and nothing blocks it; `false` if not (the reason noted, the phase
/// kept: the driver discards the copy and aborts). A COMMITTED record is
/// `true` again.
pub fn cutover(migration: i64, token: i64) -> bool {
    canonical();
    let r = lock_record(migration, token);
    match r.phase.as_str() {
        "COMMITTED" | "DONE" => return true,
        "VERIFIED" => {}
        other => not_ready(format!(
            "move {migration} is {other}: only a VERIFIED move cuts over"
        )),
    }
    let id = r.execution_id;
    lock_all(id);
    let now: String = FINGERPRINT.one_value(&[id.into()], "reading a fingerprint");
    // This move is the one in progress.
    let blockers: Vec<String> = blockers_of(id)
        .into_iter()
        .filter(|b| b != "migration_in_progress")
        .collect();
    let declined = if Some(&now) != r.fingerprint.as_ref() {
        Some("the execution changed after it was verified".to_owned())
    } else if !blockers.is_empty() {
        Some(format!("blocked at the cutover: {}", blockers.join(", ")))
    } else {
        None
    };
    if let Some(why) = declined {
        NOTE_ERROR.exec(&[migration.into(), why.into()]);
        return false;
    }
    let gone = tasks::delete_of_execution(id);
    caps::release_held(gone);
    let Share { bytes, key } = SEAL.one(&[id.into(), r.target.into()], "sealing an execution");
    if let Some(key) = key {
        quota::add(&key, -1, -bytes, 0);
    }
    set_phase(migration, "COMMITTED", None);
    true
}

fn set_phase(migration: i64, phase: &str, error: Option<&str>) -> Phased {
    SET_PHASE.one(
        &[migration.into(), phase.into(), error.into()],
        "recording a move's phase",
    )
}

/// Records how a move ended, or that a step failed: `done` (activated on
/// the target; COMMITTED only), `resumed` (the same, by a worker's
/// auto-resume), `aborted` (nothing moved; before the cutover only) or
/// `failed` (an attempt and its error; the phase stays). The record's phase
/// after it.
pub fn report(migration: i64, token: i64, outcome: &str, error: Option<&str>) -> String {
    let r = lock_record(migration, token);
    let committed = r.phase == "COMMITTED";
    let (phase, action) = match outcome {
        "done" | "resumed" if r.phase == "DONE" => return r.phase,
        "done" | "resumed" if committed => ("DONE", outcome),
        "aborted" if r.phase == "ABORTED" => return r.phase,
        "aborted" if r.phase == "STARTED" || r.phase == "VERIFIED" => ("ABORTED", outcome),
        "failed" => {
            NOTE_ERROR.exec(&[migration.into(), error.unwrap_or("failed").into()]);
            return r.phase;
        }
        "done" | "resumed" | "aborted" => not_ready(format!(
            "move {migration} is {}: cannot record it {outcome}",
            r.phase
        )),
        _ => bad_argument("outcome", "must be one of done, resumed, aborted, failed"),
    };
    let Phased { id, target, bytes } = set_phase(migration, phase, error);
    if phase == "DONE" {
        SEAL_DONE.exec(&[id.into()]);
    }
    let detail = serde_json::json!({
        "migration_id": migration, "target_shard": target, "bytes": bytes,
        "error": error.map(|e| sheaf_core::children::cut(e, 256)),
    });
    let action = if action == "resumed" {
        "rebalance.auto_resume"
    } else {
        "rebalance.migrate"
    };
    let outcome = if phase == "DONE" { "moved" } else { "aborted" };
    audit::record(action, &id.to_string(), outcome, detail);
    phase.to_owned()
}

row! {
    /// A COMMITTED move a worker may settle, and the lease token the claim
    /// gave it.
    pub struct Stalled {
        pub id: i64,
        pub execution_id: pgrx::Uuid,
        pub target_shard: i32,
        pub attempts: i32,
        pub lease_token: i64,
    }
}

/// Claims up to `max_rows` COMMITTED moves not touched for `grace_secs`
/// (at least 5) whose target is in `targets` (NULL: any), for one settler
/// each: the claim touches them.
pub fn stalled(grace_secs: f64, max_rows: i64, targets: Option<Vec<i32>>) -> Vec<Stalled> {
    require_enabled();
    STALLED.all(
        &[
            grace_secs.into(),
            max_rows.into(),
            targets.into(),
            LEASE_SECS.into(),
        ],
        "claiming stalled moves",
    )
}

row! {
    /// A move as `migrations()` lists it.
    pub struct Listed {
        pub id: i64,
        pub execution_id: pgrx::Uuid,
        pub target_shard: i32,
        pub phase: String,
        pub attempts: i32,
        pub last_error: Option<String>,
        pub verified_event_seq: Option<i64>,
        pub bytes: i64,
        pub actor: String,
        pub login: String,
        pub created_at: pgrx::datum::TimestampWithTimeZone,
        pub updated_at: pgrx::datum::TimestampWithTimeZone,
    }
}

/// This shard's moves, newest first; only unfinished ones if `open_only`.
pub fn list(open_only: bool, max_rows: i64) -> Vec<Listed> {
    require_enabled();
    LIST.all(&[open_only.into(), max_rows.into()], "listing moves")
}

row! {
    /// What this shard holds of an execution.
    struct Held {
        state: ExecutionState,
        _workflow_name: String,
        _workflow_id: String,
        /// Where it moved to, if it did.
        pointer: Option<i32>,
        /// Whether it is a staged copy over this shard's own seal.
        _over_seal: bool,
        /// The move that staged it.
        staged_by: Option<String>,
    }
}

/// How a staged copy names the move that staged it (`staged_by`).
fn staged_by(source: i32, migration: i64) -> String {
    format!("{source}:{migration}")
}

fn held(id: pgrx::Uuid) -> Option<Held> {
    HERE.first(&[id.into()], "reading an execution")
}

/// Stages `export` (from `begin` on the source) here: MIGRATING, its tasks
/// parked, nothing claimable or counted yet. Returns the digest of what it
/// stored, for the source to compare (`verify`). Staging again replaces an
/// earlier staged copy.
pub fn stage(export: &serde_json::Value) -> String {
    require_enabled();
    canonical();
    parity(export);
    let execution = &export["execution"];
    let Some(id) = execution["id"]
        .as_str()
        .and_then(|s| uuid::Uuid::parse_str(s).ok())
    else {
        bad_argument(
            "export",
            "has no execution id: pass what sheaf.migration_begin returned",
        );
    };
    let id = pgrx::Uuid::from_bytes(*id.as_bytes());
    let source = export["source_shard"].as_i64().unwrap_or_default() as i32;
    if source == shard::current() {
        bad_argument("export", "comes from this shard: a move goes elsewhere");
    }
    let mut seal: Option<Jsonb> = None;
    let mut pointer: Option<i32> = None;
    match held(id) {
        None => {}
        Some(Held {
            state: ExecutionState::Migrated,
            pointer: to,
            ..
        }) => {
            // A move back: this shard's own seal goes into the staged row,
            // which keeps its pointer until activation.
            seal = Some(SEAL_ROW.one_value(&[id.into()], "reading a seal"));
            pointer = to;
        }
        Some(Held {
            state: ExecutionState::Migrating,
            ..
        }) => {
            discard(id);
            return stage(export);
        }
        Some(Held { state, .. }) => {
            not_ready(format!("execution {id} already lives on this shard ({state})"))
        }
    }
    let name = execution["workflow_name"].as_str().unwrap_or_default();
    let workflow_id = execution["workflow_id"].as_str().unwrap_or_default();
    let taken: Option<pgrx::Uuid> = KEY_TAKEN.value(
        &[name.into(), workflow_id.into(), id.into()],
        "checking a business key",
    );
    if let Some(other) = taken {
        not_ready(format!(
            "execution {id} cannot be staged here: run {other} of its workflow id is active on this shard"
        ));
    }
    fitted(|| write_staged(export, id, seal, pointer, source));
    digest(id)
}

/// Writes the staged rows of `export` (`stage`): the execution's, then the
/// rows that reference it, then its tasks, parked.
fn write_staged(
    export: &serde_json::Value,
    id: pgrx::Uuid,
    seal: Option<Jsonb>,
    pointer: Option<i32>,
    source: i32,
) {
    let execution = &export["execution"];
    let row = Jsonb::from_value(execution.clone());
    let by = staged_by(source, export["migration_id"].as_i64().unwrap_or_default());
    let args = [
        row.into(),
        pointer.into(),
        source.into(),
        seal.clone().into(),
        by.into(),
    ];
    if seal.is_some() {
        let staged: Jsonb = STAGED_ROW.one_value(&args, "building a staged row");
        replace_row(id, staged);
        DELETE_USAGE.exec(&[id.into()]);
    } else {
        INSERT_STAGED.exec(&args);
    }
    let rows_of = |key: &str| Jsonb::from_value(export[key].clone());
    INSERT_EVENTS.exec(&[rows_of("events").into()]);
    INSERT_SIGNALS.exec(&[rows_of("signals_seen").into()]);
    INSERT_CHILDREN.exec(&[rows_of("children").into()]);
    INSERT_OUTBOX.exec(&[rows_of("outbox").into()]);
    INSERT_USAGE.exec(&[rows_of("usage_records").into()]);
    // Each task's queue exists here before its tasks are admitted.
    let mut names: Vec<&str> = export["tasks"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["queue"].as_str()).collect())
        .unwrap_or_default();
    names.sort_unstable();
    names.dedup();
    for name in names {
        queues::load_or_create(queues::check_name(Some(name)));
    }
    let n = export["tasks"].as_array().map_or(0, Vec::len);
    let mut mint = ids::minter();
    let task_ids: Vec<pgrx::Uuid> = (0..n).map(|_| mint()).collect();
    INSERT_TASKS.exec(&[rows_of("tasks").into(), task_ids.into()]);
}

/// Runs `f`, turning a row of the export that does not fit this shard's
/// tables into a refusal: a value of the wrong type or a missing one
/// (22023), a row that collides with one here, such as a task's
/// idempotency key (55000). The message is cut, never echoing a value whole.
fn fitted<R>(f: impl FnOnce() -> R) -> R {
    PgTryBuilder::new(std::panic::AssertUnwindSafe(f))
        .catch_others(|e| match e {
            CaughtError::PostgresError(r) => {
                let code = sqlstate_text(r.sql_error_code());
                let why = sheaf_core::children::cut(r.message(), 200).to_owned();
                match code.as_str() {
                    "23505" => not_ready(format!("the export collides with a row on this shard: {why}")),
                    c if c.starts_with("22") || c.starts_with("23") => {
                        bad_argument("export", format!("a row does not fit this shard's tables: {why}"))
                    }
                    _ => CaughtError::PostgresError(r).rethrow(),
                }
            }
            other => other.rethrow(),
        })
        .execute()
}

/// Checks an export's shape before anything is written: an execution
/// object with an id, name and workflow id, in a state a move takes, a
/// source shard, and arrays of rows that each belong to that execution
/// (a row naming another execution would be written under it).
pub fn check_export(export: &serde_json::Value) {
    let bad = |why: String| -> ! {
        bad_argument(
            "export",
            format!("{why}: pass what sheaf.migration_begin returned"),
        )
    };
    let e = &export["execution"];
    let Some(id) = e["id"].as_str().filter(|s| uuid::Uuid::parse_str(s).is_ok()) else {
        bad("has no execution id".to_owned());
    };
    for key in ["workflow_name", "workflow_id"] {
        if !e[key].as_str().is_some_and(|s| !s.is_empty() && s.len() <= 256) {
            bad(format!("execution.{key} must be text of 1 to 256 bytes"));
        }
    }
    if !matches!(e["state"].as_str(), Some("RUNNING" | "SUSPENDED")) {
        bad("execution.state must be RUNNING or SUSPENDED".to_owned());
    }
    if export["migration_id"].as_i64().is_none_or(|m| m <= 0) {
        bad("migration_id must be a positive move id".to_owned());
    }
    if !export["source_shard"]
        .as_i64()
        .is_some_and(|s| (0..=i64::from(sheaf_core::id::MAX_SHARD_ID)).contains(&s))
    {
        bad("source_shard must be a shard id".to_owned());
    }
    let owners = [
        ("events", "execution_id"),
        ("tasks", "execution_id"),
        ("signals_seen", "execution_id"),
        ("children", "parent_id"),
        ("outbox", "sender_id"),
        ("usage_records", "execution_id"),
    ];
    for (table, owner) in owners {
        let Some(rows) = export[table].as_array() else {
            bad(format!("{table} must be an array"));
        };
        if rows.iter().any(|r| r[owner].as_str() != Some(id)) {
            bad(format!("every row of {table} must have {owner} {id}"));
        }
    }
}

/// The portable digest of an execution's rows here (see `digest!`).
fn digest(id: pgrx::Uuid) -> String {
    DIGEST.one_value(&[id.into()], "digesting an execution")
}

/// Refuses an export carrying a column this shard's tables lack (it would
/// be dropped silently).
fn parity(export: &serde_json::Value) {
    let Some(theirs) = export["columns"].as_object() else {
        bad_argument(
            "export",
            "has no column lists: pass what sheaf.migration_begin returned",
        );
    };
    let tables: Vec<String> = COPIED.iter().map(|t| (*t).to_owned()).collect();
    let ours: Vec<TableColumns> = COLUMNS.all(&[tables.into()], "reading this shard's columns");
    for (table, columns) in theirs {
        let Some(TableColumns { columns: mine, .. }) = ours.iter().find(|t| &t.table == table) else {
            bad_argument(
                "export",
                format!("names table {} that moves do not copy", cut(table)),
            );
        };
        let names = columns.as_array().map(Vec::as_slice).unwrap_or_default();
        if let Some(missing) = names
            .iter()
            .filter_map(|c| c.as_str())
            .find(|c| !mine.iter().any(|m| m == c))
        {
            not_ready(format!(
                "this shard lacks column {}.{} that the source has: bring both shards to the same sheaf version",
                cut(table),
                cut(missing)
            ));
        }
    }
}

fn cut(s: &str) -> &str {
    sheaf_core::children::cut(s, 64)
}

/// Every column of `executions` but `id`: what a row replaced in place
/// takes from its document. `every_column_is_replaced` checks it against
/// the catalog, so a new column cannot be left behind.
macro_rules! replaced_columns {
    () => {
        "workflow_name, workflow_id, state, seq, queue, input, result, error, parent_id, concurrency_key, \
         quota_key, paused_from, wake_at, search_attrs, history_bytes, last_event_seq, created_at, closed_at, \
         migrated_to_shard, migrated_from_shards, replaced_seal, result_pulled_at, timeout_at, staged_by, \
         seal_released_at"
    };
    // A 0.3.0 catalog's, with how the run was placed.
    (placed) => {
        concat!(replaced_columns!(), ", placement")
    };
}
const REPLACE_ROW: Stmt = Stmt::write(
    concat!(
        "UPDATE executions SET (",
        replaced_columns!(),
        ") = (SELECT ",
        replaced_columns!(),
        " FROM jsonb_populate_record(NULL::executions, $2)) WHERE id = $1"
    ),
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::JSONBOID],
);
const REPLACE_PLACED_ROW: Stmt = Stmt::write(
    concat!(
        "UPDATE executions SET (",
        replaced_columns!(placed),
        ") = (SELECT ",
        replaced_columns!(placed),
        " FROM jsonb_populate_record(NULL::executions, $2)) WHERE id = $1"
    ),
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::JSONBOID],
);
const STAGED_ROW: Stmt = Stmt::write(
    concat!("SELECT ", staged!()),
    &[
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::INT4OID,
        PgBuiltInOids::JSONBOID,
        PgBuiltInOids::TEXTOID,
    ],
);

/// Overwrites execution `id`'s row in place with `row` (a document of
/// every column), keeping the rows that reference it.
fn replace_row(id: pgrx::Uuid, row: Jsonb) {
    if executions::placed_runs_enabled() {
        REPLACE_PLACED_ROW.exec(&[id.into(), row.into()]);
    } else {
        REPLACE_ROW.exec(&[id.into(), row.into()]);
    }
}

/// Makes a staged copy live: its state back, its tasks admitted (a timer
/// due meanwhile fires once, here), its quota share counted here. `false`
/// if it is not staged here (already live: activation is idempotent).
pub fn activate(id: pgrx::Uuid) -> bool {
    require_enabled();
    match held(id) {
        None => unknown_execution(id),
        Some(Held {
            state: ExecutionState::Migrating,
            ..
        }) => {}
        Some(_) => return false,
    }
    // Tasks before the execution row (`base::locks`), as a resume.
    let parked = tasks::unpark_of_execution(id);
    if executions::try_lock(id).is_none_or(|e| e.state != ExecutionState::Migrating) {
        return false;
    }
    let Share { bytes, key } = ACTIVATE.one(&[id.into()], "activating an execution");
    if let Some(key) = key {
        quota::add(&key, 1, bytes, 0);
    }
    promote::place(parked);
    true
}

/// Removes the staged copy move `migration` of `source` staged here (a
/// move that aborted), or puts back the seal it replaced; `false` if
/// nothing is staged here, or the copy here is another move's (a later
/// move's copy is never removed by an earlier move's late abort).
pub fn discard_staged(id: pgrx::Uuid, source: i32, migration: i64) -> bool {
    require_enabled();
    match held(id) {
        Some(Held {
            state: ExecutionState::Migrating,
            staged_by: Some(by),
            ..
        }) if by == staged_by(source, migration) => {}
        _ => return false,
    }
    discard(id)
}

/// Removes whatever copy is staged here (restaging replaces it), or puts
/// back the seal it replaced; `false` if nothing is staged here.
fn discard(id: pgrx::Uuid) -> bool {
    require_enabled();
    if !matches!(
        held(id),
        Some(Held {
            state: ExecutionState::Migrating,
            ..
        })
    ) {
        return false;
    }
    let parked = tasks::delete_of_execution(id);
    caps::release_held(parked);
    if executions::try_lock(id).is_none_or(|e| e.state != ExecutionState::Migrating) {
        return false;
    }
    let seal: Option<Jsonb> = SEAL_OF
        .value::<Option<Jsonb>>(&[id.into()], "reading a replaced seal")
        .flatten();
    match seal {
        Some(seal) => {
            let last = seal.clone().parse("replaced_seal")["last_event_seq"]
                .as_i64()
                .unwrap_or(i64::MAX);
            DELETE_NEWER_EVENTS.exec(&[id.into(), last.into()]);
            replace_row(id, seal);
        }
        None => {
            DELETE_STAGED.exec(&[id.into()]);
            DELETE_ROW.exec(&[id.into()]);
        }
    }
    true
}

const SEAL_OF: Stmt = Stmt::write(
    "SELECT replaced_seal FROM executions WHERE id = $1",
    &[PgBuiltInOids::UUIDOID],
);

const SEALS: Stmt = Stmt::read(
    "SELECT id, migrated_to_shard, to_jsonb(x) FROM executions x \
     WHERE state = 'MIGRATED' AND id > coalesce($1, '00000000-0000-0000-0000-000000000000'::uuid) ORDER BY id LIMIT $2",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::INT8OID],
);
// Any conflict (the id, or an active run of its key here) adopts nothing.
const ADOPT: Stmt = Stmt::write(
    "INSERT INTO executions SELECT * FROM jsonb_populate_record(NULL::executions, $1 || jsonb_build_object(\
       'seq', nextval('execution_seq'), 'replaced_seal', NULL)) ON CONFLICT DO NOTHING RETURNING id",
    &[PgBuiltInOids::JSONBOID],
);

row! {
    /// A seal as `migration_seals` lists it: id, pointer, row.
    pub struct Seal {
        pub id: pgrx::Uuid,
        pub moved_to: Option<i32>,
        pub seal: Jsonb,
    }
}

/// A page of this shard's seals after `after`, in id order: what a drained
/// shard hands to the shard its ids will forward to (`adopt_seal`).
pub fn seals(after: Option<pgrx::Uuid>, max_rows: i64) -> Vec<Seal> {
    require_enabled();
    SEALS.all(&[after.into(), max_rows.into()], "listing seals")
}

/// Keeps a seal from a shard being retired (a row `seals` listed), so ids
/// routed here by its forwards entry still find where their runs live;
/// `false` if this shard already holds the id (or an active run of its
/// key). Only a MIGRATED row pointing elsewhere is taken.
pub fn adopt_seal(seal: &serde_json::Value) -> bool {
    require_enabled();
    canonical();
    let here = i64::from(shard::current());
    let ok = seal["state"].as_str() == Some("MIGRATED")
        && seal["id"]
            .as_str()
            .is_some_and(|s| uuid::Uuid::parse_str(s).is_ok())
        && seal["migrated_to_shard"]
            .as_i64()
            .is_some_and(|t| t != here && (0..=65534).contains(&t));
    if !ok {
        bad_argument(
            "seal",
            "must be a MIGRATED row pointing at another shard, as sheaf.migration_seals returns it",
        );
    }
    ADOPT.count(&[Jsonb::from_value(seal.clone()).into()]) > 0
}

/// Points this shard's seal of `id` straight at `home` (chains collapse);
/// `false` if there is no seal here or it already points there.
pub fn repoint(id: pgrx::Uuid, home: i32) -> bool {
    require_enabled();
    if home == shard::current() {
        bad_argument("home_shard", "is this shard: a seal points elsewhere");
    }
    REPOINT.count(&[id.into(), home.into()]) > 0
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{claim, count, declare, init, start, state};
    use pgrx::prelude::*;
    use serde_json::json;

    fn blockers(id: pgrx::Uuid) -> Vec<String> {
        Spi::get_one_with_args::<Vec<String>>(
            "SELECT blockers FROM sheaf.rebalance_candidates(NULL, 1000) WHERE execution_id = $1",
            &[id.into()],
        )
        .unwrap()
        .unwrap_or_default()
    }

    /// Every blocker is named at once; a claimed task blocks, a paused run
    /// is not running, and a quiescent run has none.
    #[pg_test]
    fn a_dry_run_names_each_blocker() {
        init();
        declare("mw", json!({"queue": "mq"}));
        let quiet = start("mw", "quiet", json!({})).id;
        assert!(blockers(quiet).is_empty());
        let paused = start("mw", "paused", json!({})).id;
        Spi::run_with_args("SELECT sheaf.pause_execution($1)", &[paused.into()]).unwrap();
        assert_eq!(blockers(paused), ["not_running"]);
        let busy = start("mw", "busy", json!({})).id;
        // Claims every ready workflow task of the queue: the quiet one too.
        claim("mq", 10);
        assert_eq!(blockers(busy), ["task_claimed"]);
        assert_eq!(state(busy), "RUNNING");
        // A trailing debounced run waits in its window: starts in it join it here.
        let waiting = Spi::get_one::<pgrx::Uuid>(
            "SELECT execution_id FROM sheaf.start_workflow('mw', 'deb', '{}', \
             '{\"debounce\": {\"key\": \"k\", \"window\": \"1 hour\"}}')",
        )
        .unwrap()
        .unwrap();
        assert_eq!(blockers(waiting), ["debounce_open"]);
    }

    /// `replaced_columns!` names every column of `executions` but `id`.
    #[pg_test]
    fn every_column_is_replaced() {
        let catalog = Spi::get_one::<String>(
            "SELECT string_agg(attname, ',' ORDER BY attname) FROM pg_attribute \
             WHERE attrelid = 'sheaf.executions'::regclass AND attnum > 0 AND NOT attisdropped AND attname <> 'id'",
        )
        .unwrap()
        .unwrap();
        let mut listed: Vec<&str> = replaced_columns!(placed).split(',').map(str::trim).collect();
        listed.sort_unstable();
        assert_eq!(catalog, listed.join(","));
    }

    /// A move goes to another shard.
    #[pg_test]
    #[should_panic(expected = "is this shard")]
    fn a_move_to_this_shard_is_refused() {
        init();
        declare("mb", json!({"queue": "mbq"}));
        let id = start("mb", "one", json!({})).id;
        Spi::run_with_args("SELECT sheaf.migration_begin($1, sheaf.shard_id())", &[id.into()]).unwrap();
    }

    /// A run that is not quiescent is refused with its blockers.
    #[pg_test]
    #[should_panic(expected = "cannot move now: task_claimed")]
    fn a_busy_run_is_refused() {
        init();
        declare("mc", json!({"queue": "mcq"}));
        let id = start("mc", "one", json!({})).id;
        claim("mcq", 1);
        Spi::run_with_args("SELECT sheaf.migration_begin($1, 9)", &[id.into()]).unwrap();
    }

    /// An export is checked before anything is written: rows must belong
    /// to its execution.
    #[pg_test]
    #[should_panic(expected = "every row of events must have execution_id")]
    fn an_export_with_a_foreign_row_is_refused() {
        init();
        let e = json!({"id": "00000000-0000-8000-8000-000000000001", "workflow_name": "w",
                       "workflow_id": "x", "state": "RUNNING"});
        let export = json!({"execution": e, "migration_id": 1, "source_shard": 3, "columns": {},
            "events": [{"execution_id": "00000000-0000-8000-8000-000000000002"}],
            "tasks": [], "signals_seen": [], "children": [], "outbox": [], "usage_records": []});
        super::check_export(&export);
    }

    /// An export row whose value does not fit its column is refused with
    /// 22023, naming no value whole.
    #[pg_test]
    #[should_panic(expected = "a row does not fit this shard's tables")]
    fn an_export_row_that_does_not_fit_is_refused() {
        init();
        declare("mf", json!({"queue": "mfq"}));
        let id = start("mf", "one", json!({})).id;
        Spi::run_with_args(
            "SELECT sheaf.migration_stage(jsonb_set(replace(replace(sheaf.migration_begin($1, 9)::text, $1::text, \
             'b0000000-0000-8000-8000-0000000000bb'), '\"one\"', '\"one-f\"')::jsonb || '{\"source_shard\": 9}', \
             '{events,0,seq}', '\"not a number\"'))",
            &[id.into()],
        )
        .unwrap();
    }

    /// A staged copy (here: this shard's own export under another id, as
    /// if from shard 9) holds no slot and nothing of it is claimable until
    /// it is activated; then its workflow task is.
    #[pg_test]
    fn a_staged_copy_is_claimable_only_once_activated() {
        init();
        declare("ms", json!({"queue": "msq"}));
        let id = start("ms", "one", json!({})).id;
        let staged = "b0000000-0000-8000-8000-0000000000aa";
        Spi::run_with_args(
            "SELECT sheaf.migration_stage(replace(replace(sheaf.migration_begin($1, 9)::text, $1::text, $2), \
             '\"one\"', '\"one-s\"')::jsonb || '{\"source_shard\": 9}')",
            &[id.into(), staged.into()],
        )
        .unwrap();
        let paused =
            format!("SELECT count(*) FROM sheaf.tasks WHERE execution_id = '{staged}' AND state = 'paused'");
        assert_eq!(count(&paused), 1);
        assert_eq!(
            state(pgrx::Uuid::from_bytes(
                *uuid::Uuid::parse_str(staged).unwrap().as_bytes()
            )),
            "MIGRATING"
        );
        // The source's own task is claimed first (it is older); the staged
        // one is not claimable.
        assert_eq!(claim("msq", 10).len(), 1);
        assert!(
            Spi::get_one_with_args::<bool>("SELECT sheaf.migration_activate($1::uuid)", &[staged.into()])
                .unwrap()
                .unwrap()
        );
        let ready = claim("msq", 10);
        assert_eq!(ready.len(), 1, "the activated copy's workflow task");
    }

    /// A move's steps belong to the holder of its lease token; a takeover
    /// waits for the lease to lapse, then fences the old holder out.
    #[pg_test]
    fn a_move_has_one_holder() {
        init();
        let id = start("ml", "one", json!({})).id;
        let export =
            Spi::get_one_with_args::<pgrx::JsonB>("SELECT sheaf.migration_begin($1, 9)", &[id.into()])
                .unwrap()
                .unwrap()
                .0;
        let (migration, token) = (
            export["migration_id"].as_i64().unwrap(),
            export["lease_token"].as_i64().unwrap(),
        );
        let takeover = || {
            Spi::get_one_with_args::<i64>("SELECT sheaf.migration_takeover($1)", &[migration.into()]).unwrap()
        };
        assert_eq!(takeover(), None, "the mover's lease is live");
        Spi::run_with_args(
            "UPDATE sheaf.migrations SET lease_until = now() - interval '1 second' WHERE id = $1",
            &[migration.into()],
        )
        .unwrap();
        let new = takeover().expect("a lapsed lease is taken over");
        assert_ne!(new, token);
        assert_eq!(
            Spi::get_one_with_args::<String>(
                "SELECT sheaf.migration_report($1, $2, 'aborted', 'taken over')",
                &[migration.into(), new.into()],
            )
            .unwrap()
            .as_deref(),
            Some("ABORTED")
        );
        assert_eq!(takeover(), None, "a move that is over");
    }

    #[pg_test(
        error = "move 4242 is not held under lease token 0: another mover took it over; nothing changed"
    )]
    fn a_step_under_another_token_is_refused() {
        init();
        let id = start("ml", "two", json!({})).id;
        Spi::run("ALTER TABLE sheaf.migrations ALTER COLUMN id RESTART WITH 4242").unwrap();
        Spi::run_with_args("SELECT sheaf.migration_begin($1, 9)", &[id.into()]).unwrap();
        Spi::run("SELECT sheaf.migration_cutover(4242, 0)").unwrap();
    }
}
