-- sheaf shard schema, HEAD's version (the workspace version in Cargo.toml).
--
-- This file is the spec of what lives in every shard database. It is included
-- verbatim in the extension's install script (see extension/src/lib.rs), so a
-- fresh install runs it. Once a version is released (releases.toml), every
-- change here goes into the next upgrade script sql/sheaf--A--B.sql too
-- (CONTRIBUTING.md, "Schema changes and releases").
--
-- Nothing here is for callers to write directly: workers and admins act through
-- the functions (SECURITY DEFINER); see privileges.sql.

-- Which shard this database is. One row, written once by sheaf.init_shard().
CREATE TABLE shard_identity (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    shard_id    integer NOT NULL CHECK (shard_id BETWEEN 0 AND 65534),
    initialized_at timestamptz NOT NULL DEFAULT now()
);

-- Queues exist implicitly: the first enqueue to a name creates its row.
-- One ordering mode per queue: priority (default), aging, or fairness.
CREATE TABLE queues (
    name        text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 128),
    aging_secs  integer CHECK (aging_secs > 0),
    fairness    boolean NOT NULL DEFAULT false,
    notify      boolean NOT NULL DEFAULT true,
    -- Fairness virtual time: the start tag of the tasks being claimed. Moved
    -- forward lazily by claims (never waited on), read by admissions.
    vtime       double precision NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Since when retention's sweep has seen the queue with nothing in it
    -- (sheaf.set_retention's idle_queues); NULL once it sees work again.
    -- Written by sheaf.maintain only.
    idle_since  timestamptz,
    CHECK (NOT (fairness AND aging_secs IS NOT NULL))
);

-- Every unfinished task. A task leaves this table when it completes or is
-- dead-lettered. No foreign key to queues: every task insert would share-lock
-- the queue row. No CHECK constraints either: Postgres re-reads every CHECK
-- expression on each statement that writes the table, which costs more than
-- the rest of an enqueue; the functions validate every value (the comments
-- give the domains) and nothing else may write here.
--   scheduled: run_at is in the future, or a retry is backing off
--   waiting:   its concurrency key has no free slot
--   ready:     claimable; it has a row in `ready`
--   running:   claimed, under a lease fenced by `token`
--   paused:    its execution is PAUSED; holds no slot until resumed
-- Index cleanup on every vacuum: the lease-expiry, promotion and waiting-line
-- seeks start at the head of their partial indexes, where the entries of
-- tasks that moved on stay until a vacuum removes them (see `ready`).
CREATE TABLE tasks (
    id              uuid PRIMARY KEY,
    queue           text NOT NULL,
    kind            text NOT NULL DEFAULT 'activity',      -- activity | workflow
    payload         jsonb NOT NULL,
    priority        integer NOT NULL DEFAULT 0,
    state           text NOT NULL,                         -- see above
    seq             bigint NOT NULL,
    -- Fairness start tag, fixed when the task first becomes ready.
    fair_start      double precision,
    enqueued_at     timestamptz NOT NULL DEFAULT now(),
    run_at          timestamptz NOT NULL DEFAULT now(),
    attempts        integer NOT NULL DEFAULT 0,
    max_attempts    integer NOT NULL DEFAULT 25,           -- 1..1000
    execution_id    uuid,
    concurrency_key text,                                  -- 1..1024 bytes
    fairness_key    text,                                  -- 1..256 bytes
    fairness_weight double precision NOT NULL DEFAULT 1,   -- (0, 1e6]
    idempotency_key text,                                  -- 1..256 bytes
    lease_owner     text,
    lease_secs      double precision,
    lease_expires_at timestamptz,
    token           bigint,
    last_error      text,
    -- When the running attempt was claimed, set by the claim's own update:
    -- an attempt's compute seconds for sheaf.usage_report, at no extra write.
    claimed_at      timestamptz
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.05, vacuum_index_cleanup = on);
CREATE UNIQUE INDEX tasks_idempotency ON tasks (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX tasks_execution ON tasks (execution_id) WHERE execution_id IS NOT NULL;
-- Due-time promotion: a million future tasks cost one index probe per check.
CREATE INDEX tasks_scheduled ON tasks (queue, run_at) WHERE state = 'scheduled';
-- Lease expiry.
CREATE INDEX tasks_running ON tasks (queue, lease_expires_at) WHERE state = 'running';
-- Per-key waiting line: the next task to admit when a slot frees.
CREATE INDEX tasks_waiting ON tasks (concurrency_key, priority DESC, seq) WHERE state = 'waiting';

-- The ready set: narrow rows, inserted when a task becomes claimable and
-- deleted by the claim. The claim is one ordered seek on ready_claim; a task
-- whose key has no free slot is never here, so the claim needs no gate.
-- k1 = -priority or the aging key (sheaf.ready_k1), k2 = fairness start tag;
-- aging_band is a row's band in a queue that ages (sheaf.ready_aging_band),
-- NULL in one that does not (see ready_floors).
--
-- Vacuum: the claim deletes at the head of ready_claim, where nothing is
-- inserted, so the entries it leaves there go only when a VACUUM removes
-- them, and every claim steps over them until then. By default autovacuum
-- skips index cleanup while fewer than 2% of a table's pages hold dead rows
-- (vacuum_index_cleanup = auto): at 1M ready rows that let ~20K dead entries
-- pile up at the head, a 200-page walk in every claim, growing with the
-- table. So `ready` is vacuumed after every 1,000 deletions whatever its
-- size, always with index cleanup, and without cost-based sleeps (it is
-- narrow, and its heap pass reads only the pages touched since the last one).
CREATE TABLE ready (
    task_id     uuid PRIMARY KEY,
    queue       text NOT NULL,
    k1          double precision NOT NULL,
    k2          double precision NOT NULL,
    seq         bigint NOT NULL,
    aging_band  double precision
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
        vacuum_index_cleanup = on, autovacuum_vacuum_cost_delay = 0);
CREATE INDEX ready_claim ON ready (queue, k1, k2, seq);
-- Each band of an aging queue in claim order, for the claim's merge (see
-- ready_floors); the rows of queues without aging are not in it.
CREATE INDEX ready_aging ON ready (queue, aging_band, k1, k2, seq) WHERE aging_band IS NOT NULL;

-- Claim floors: where a queue's claim starts its seeks on ready_claim. A
-- transaction held open anywhere in the database (a report, pg_dump, a
-- stuck client) keeps alive every ready row the claims deleted since it
-- began, and neither vacuum nor the index's own dead-entry marking can
-- remove them: a claim seeking from the head of its queue's range would
-- step over all of them, O(claims since the snapshot). It seeks from the
-- floors instead, which the claims move up past what they took.
--
-- A queue's ready rows fall into bands, one per priority, so a band
-- emptied by the claims (a high priority, claimed as soon as it comes) is
-- one short seek, not a walk over its dead entries. Without aging, band =
-- k1 (= -priority): the claim order is priority first, so the claim takes
-- the bands in ascending order, each from its floor F(q, b): the ready rows
-- with (k1, k2, seq) >= F(q, b) and k1 <= b on ready_claim. With aging,
-- band = aging_band = -1e15 - priority (sheaf.ready_aging_band: every
-- aging band is below -1e14, apart from every band of priorities), and
-- ready_aging gives each band's rows in claim order: the claim reads the
-- first rows of each band from its floor without locking them, merges them
-- by key, and locks them in that order, skipping the ones other claims
-- hold, until it has its batch (if it runs out of them, because other
-- claims hold them, it reads many more). So the claim never steps over
-- the dead entries of the other priorities, which the aging key
-- interleaves with the rows it takes. The band of a ready row is
-- coalesce(aging_band, k1).
--
-- The rows here of (q, b) are base rows, written by advances, and lowering
-- rows, written by readying; each takes a new generation from
-- ready_floor_gen, and ready_floors_walk lists a band's rows newest first.
-- The floor rows of (q, b) are its rows from the newest down to the newest
-- base row; F(q, b) is the smallest (k1, k2, seq) among them, and a band
-- with no row has no floor. A lookup reads only those rows and jumps over
-- the older ones with one seek: every advance leaves the rows it replaced
-- dead there, and while a snapshot is held open they stay, but behind.
--
-- Invariant: in every snapshot, every ready row of queue q in band b has a
-- floor row of (q, b) at or below it, and every row of (q, b) that snapshot
-- sees is a floor row. Kept by the one protocol below, which every path
-- that makes a ready row follows (queue::floor).
--
-- Readying (every insert into ready, and any change of a ready row's keys):
-- in the same transaction, after writing the rows, with m the smallest key
-- written in band b of queue q:
--   1. try the shared floor lock of q (base::locks, Class::Floor), never
--      waiting: held, it keeps every advance of q out until this
--      transaction ends. If it is not had (an advance holds it), take the
--      shared late-readiers lock of q (Class::FloorLate), which keeps every
--      later advance out until this transaction ends;
--   2. in a later statement (a newer snapshot than the lock), insert m as
--      a lowering row unless the newest row of (q, b) is at or below m;
--      insert it regardless if step 1 did not get the floor lock, or if the
--      transaction runs under REPEATABLE READ or SERIALIZABLE (its snapshot
--      may predate an advance). A lowering row more than needed is harmless.
--      Step 2 is skipped, in a band of priorities, when the backend knows
--      the band's floor is at or below m (queue::floor, known_below): it
--      readied a key k of the band in a transaction that has not rolled
--      back (so a floor row at or below k is committed or its own: the one
--      it compared with, or the one it wrote), k's (k1, k2) is at or below m's (its seq
--      is lower, taken earlier by the same backend), and ready_floor_gen
--      has not moved since (read after the lock of step 1, which no
--      advance holds meanwhile); only on a 0.3.0 catalog or later, where no
--      0.2.0 library (whose advances take no generation under the lock)
--      runs. A prepared transaction counts as rolled back.
-- Advancing (a claim, every ADVANCE_EVERY claimed rows, under READ
-- COMMITTED only): if the late-readiers lock is free, take a generation g,
-- then try the exclusive floor lock, never waiting (it is free only when no
-- readying transaction of q is open), and test the late-readiers lock again;
-- with both, take one more generation (so every advance that writes moves
-- ready_floor_gen after any readier that held a floor lock before it), and,
-- in one statement (one snapshot), for each band: find the first
-- ready row at or above F (rows other transactions are claiming or deleting
-- still show, so a claim that rolls back finds its rows above the new
-- floor); with none, take the highest key this backend claimed from the
-- band since its last advance. If the key found is above F, it becomes a
-- base row of generation g and the band's floor rows are deleted; if it is
-- not but the band has lowering rows, they and the base row become one base
-- row at F the same way (a late readier writes one whatever the floor, and
-- in a band nobody claims from they would pile up in every lookup); an
-- empty band with neither stays, or goes with its rows if the queue has
-- more than 16 bands or the band is of the other mode (aging or not) than
-- the queue's. An empty band may take any floor: rows readied later
-- compare with it or bring their own. The advance takes no new rows into account,
-- and needs none: a readying transaction either committed before the
-- advance took its lock (its rows are in the snapshot), or holds the
-- shared lock (no advance), or is late (its lowering row, which the advance
-- does not see, is newer than g, since g was taken before the lock it
-- found held, and no later advance runs before it ends), or starts after
-- the advance committed (it compares with the new floor). Deleting a ready
-- row, committed or rolled back, never breaks the invariant.
-- Keeping (a claim, under READ COMMITTED only): a backend may keep the
-- floors it read between its claims instead of walking them each time: it
-- reads g, ready_floor_gen's last value, finds both floor locks of q free,
-- then reads the floors; each claim from them checks, after its snapshot,
-- that the last value is still g. Every write here takes a generation
-- first, and a readying transaction holds a floor lock from before its
-- generation to its end: a lowering row of generation up to g is in the
-- floors read, and a later one moves the value. An advance of generation
-- up to g that takes its lock after the check only raises floors, so the
-- kept ones stay at or below them. Floors read in a transaction or
-- subtransaction that rolls back are dropped (its own advance is undone).
--
-- A change of aging re-keys the queue's ready rows (a readying): they go to
-- the new mode's bands, and the old bands, empty, go at the next advance.
-- A task readied while the change commits may keep the old mode's keys
-- and band until it is claimed: as long as the queue has an aging band,
-- its claims merge every band, so it is claimed in the order of its keys
-- like any other. Band NaN (left by the upgrade to 0.2.0) is read the way
-- bands of priorities are, and covers every row.
CREATE SEQUENCE ready_floor_gen;
CREATE TABLE ready_floors (
    queue       text NOT NULL,
    band        double precision NOT NULL,
    -- Minus the row's generation (from ready_floor_gen): a band's newest
    -- rows come first in ready_floors_walk.
    ngen        bigint NOT NULL,
    base        boolean NOT NULL,
    k1          double precision NOT NULL,
    k2          double precision NOT NULL,
    seq         bigint NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 100,
        vacuum_index_cleanup = on, autovacuum_vacuum_cost_delay = 0);
CREATE INDEX ready_floors_walk ON ready_floors (queue, band, ngen);

-- The primary ready key. Aging: effective priority priority + age/aging_secs
-- orders exactly like enqueued_at - priority * aging_secs ascending (now is
-- common to all rows); sheaf-core's ordering module proves it, and a test
-- checks this function against it. Written so the planner inlines it into the
-- statements that insert ready rows: no SET clause, and only immutable
-- operations (extract from a timestamptz is merely stable, extract from an
-- interval is immutable). A SQL-standard body binds its names at creation,
-- so search_path cannot change what it calls.
CREATE FUNCTION ready_k1(priority integer, enqueued_at timestamptz, aging_secs integer)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN aging_secs IS NULL THEN -priority::double precision
            ELSE extract(epoch FROM enqueued_at - '1970-01-01 00:00:00+00'::timestamptz)::double precision
                 - priority::double precision * aging_secs END;

-- The band of a ready row of a queue that ages (see ready_floors), NULL in
-- one that does not. Inlined like ready_k1.
CREATE FUNCTION ready_aging_band(priority integer, aging_secs integer)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN aging_secs IS NULL THEN NULL
            ELSE -1e15::double precision - priority::double precision END;

-- Per-key caps. A key's slots held (`admitted`, in concurrency_slots) count
-- its tasks holding a slot: ready plus running. Admission keeps admitted <=
-- max_running (lowering a cap can leave running tasks above it; they finish
-- and no slot is handed out until below). The row here is written only when
-- the cap or the wait floor changes: every admission and release of the key
-- locks it (queue::caps), and a row lock writes no new version.
--
-- Wait floors: a key's waiting line is read in promotion order (priority
-- descending, then seq) on tasks_waiting, and every task promoted leaves a
-- dead entry at its head that a snapshot held open elsewhere keeps (see
-- ready_floors); a saturated key promotes one task per release. So each
-- promotion seeks from the key's wait floor (wait_priority, wait_seq),
-- NULL for the line's head: the tasks of that priority from that seq, then
-- the lower priorities, two seeks that step over what was promoted.
-- Invariant: every waiting task of the key sorts at or after its floor.
-- Every write to a key's waiting line (enqueue, promotion of due tasks, a
-- redrive or a resume, a put-back over a lowered cap) is made holding the
-- key's row here, locked until the transaction ends (queue::caps), so the
-- protocol is local to that row: a transaction that puts tasks in the line
-- lowers the floor to (their highest priority, their lowest seq) if that
-- sorts before it; a promotion under READ COMMITTED (which sees every task
-- put in the line before it took the row) moves the floor to the first task
-- still waiting after the old floor, locked by another transaction or not
-- (a promotion skips those, and one that rolls back leaves its task
-- there), else to the last task it promoted; a lowered cap sending ready
-- tasks back to the line resets it to the head. Removing a task from the
-- line never breaks the invariant.
CREATE TABLE concurrency_limits (
    key         text PRIMARY KEY CHECK (octet_length(key) BETWEEN 1 AND 1024),
    max_running integer NOT NULL CHECK (max_running >= 0),
    wait_priority integer,
    wait_seq    bigint,
    CHECK ((wait_priority IS NULL) = (wait_seq IS NULL))
);

-- Slots held per capped key, rotated: each change of a key's count inserts
-- a row with a new generation (from concurrency_slot_gen) and deletes the
-- one it replaces, so the key's live row is the newest, and a lookup
-- (newest first on the primary key) reads it first. An update in place
-- would leave one version per admission and per release that every lookup
-- of the key walks while a snapshot is held open elsewhere (see
-- ready_floors). A capped key has exactly one live row here, written with
-- its concurrency_limits row held, and none once uncapped. Under
-- REPEATABLE READ a writer locks the row it read, so a count another
-- transaction replaced since the snapshot is a serialization failure, not
-- a stale count. No foreign key: its check would lock the limit row again
-- on every change.
CREATE SEQUENCE concurrency_slot_gen;
CREATE TABLE concurrency_slots (
    key         text NOT NULL,
    gen         bigint NOT NULL,
    admitted    integer NOT NULL CHECK (admitted >= 0),
    PRIMARY KEY (key, gen)
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
        vacuum_index_cleanup = on, autovacuum_vacuum_cost_delay = 0);

-- Fairness: the finish tag of each key's last task, per queue.
CREATE TABLE fairness_keys (
    queue       text NOT NULL,
    key         text NOT NULL,
    finish      double precision NOT NULL,
    PRIMARY KEY (queue, key)
);

-- Tasks whose attempts ran out. redrive() moves them back into tasks.
CREATE TABLE dead_letters (
    id              uuid PRIMARY KEY,
    queue           text NOT NULL,
    kind            text NOT NULL,
    payload         jsonb NOT NULL,
    priority        integer NOT NULL,
    attempts        integer NOT NULL,
    max_attempts    integer NOT NULL,
    execution_id    uuid,
    concurrency_key text,
    fairness_key    text,
    fairness_weight double precision NOT NULL,
    idempotency_key text,
    last_error      text,
    enqueued_at     timestamptz NOT NULL,
    dead_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_letters_queue ON dead_letters (queue, dead_at);
CREATE INDEX dead_letters_execution ON dead_letters (execution_id) WHERE execution_id IS NOT NULL;
-- Every queue's dead letters newest first (sheaf.list_dead_letters without a queue).
CREATE INDEX dead_letters_age ON dead_letters (dead_at, id);

-- Cancellations of single tasks (sheaf.cancel_task). An unclaimed task
-- leaves at once (settled_at = cancelled_at). A running one stays, holding
-- its slot while its handler may still run, fenced out of its holder (its
-- token negated) until the holder hears of it (57000 from its next
-- heartbeat, complete, fail, snooze or set_progress) and gives it back with
-- sheaf.release, or its lease expires (the reaper): then it leaves and its
-- slot passes on. `token` is the holder's, so its later calls are told
-- "cancelled", not "lease lost". A settled row is kept for a week
-- (sheaf.maintain), so get_task can say what became of the task.
CREATE TABLE task_cancellations (
    task_id         uuid PRIMARY KEY,
    queue           text NOT NULL,
    execution_id    uuid,
    token           bigint,
    reason          text,
    cancelled_at    timestamptz NOT NULL DEFAULT now(),
    settled_at      timestamptz
);
CREATE INDEX task_cancellations_settled ON task_cancellations (settled_at) WHERE settled_at IS NOT NULL;

-- A running task's progress as its handler last reported it
-- (sheaf.set_progress), beside the task and not in it: a report rewrites
-- this narrow row, never the task row the claim's indexes point at. Shown
-- by get_task and list_tasks; a row whose task is neither unfinished nor a
-- dead letter any more is deleted by sheaf.maintain.
CREATE TABLE task_progress (
    task_id         uuid PRIMARY KEY,
    progress        jsonb NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Live-worker registry: a worker is live while its heartbeat is under 60 s old.
CREATE TABLE workers (
    name            text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 256),
    queues          text[] NOT NULL,
    last_seen_at    timestamptz NOT NULL DEFAULT now()
);

-- Per-workflow-name admission policy (concurrency gate, quota).
CREATE TABLE workflow_policies (
    workflow_name   text PRIMARY KEY CHECK (length(workflow_name) BETWEEN 1 AND 256),
    policy          jsonb NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Executions. RUNNING, SUSPENDED and PAUSED are active; COMPLETED, FAILED,
-- CANCELLED, TERMINATED, TIMED_OUT and CONTINUED_AS_NEW are terminal;
-- MIGRATING and MIGRATED belong to rebalancing (a MIGRATED execution still
-- holds its (name, workflow_id) for uniqueness).
CREATE TABLE executions (
    id              uuid PRIMARY KEY,
    workflow_name   text NOT NULL CHECK (octet_length(workflow_name) BETWEEN 1 AND 256),
    workflow_id     text NOT NULL CHECK (octet_length(workflow_id) BETWEEN 1 AND 256),
    state           text NOT NULL CHECK (state IN (
                        'RUNNING', 'SUSPENDED', 'PAUSED',
                        'COMPLETED', 'FAILED', 'CANCELLED', 'TERMINATED', 'TIMED_OUT',
                        'CONTINUED_AS_NEW', 'MIGRATING', 'MIGRATED')),
    -- Admission order: "newest" for latest-wins means the highest seq.
    seq             bigint NOT NULL,
    queue           text NOT NULL,
    input           jsonb NOT NULL,
    result          jsonb,
    error           text,
    parent_id       uuid,
    -- The resolved policy keys (not the task key `<name>:<key>`).
    concurrency_key text,
    quota_key       text,
    -- PAUSED remembers what it paused (RUNNING or SUSPENDED).
    paused_from     text,
    wake_at         timestamptz,
    search_attrs    jsonb NOT NULL DEFAULT '{}',
    history_bytes   bigint NOT NULL DEFAULT 0 CHECK (history_bytes >= 0),
    -- The seq of its last event. Kept here, not read as max(seq): an append
    -- that waited for the row lock must number after the one it waited for.
    last_event_seq  bigint NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- When it ended here; on a MIGRATED seal, when its move was done.
    closed_at       timestamptz,
    -- Rebalancing (see migrations): on a MIGRATED seal, the shard the run
    -- moved to, its forwarding pointer; on a staged copy that replaced this
    -- shard's own seal (a move back), that seal's pointer until activation.
    migrated_to_shard integer CHECK (migrated_to_shard BETWEEN 0 AND 65534),
    -- Every shard the run lived on before this one, oldest first: where an
    -- erasure must also go.
    migrated_from_shards integer[] NOT NULL DEFAULT '{}',
    -- A staged copy over this shard's own seal: the seal's row, put back if
    -- the move aborts.
    replaced_seal   jsonb,
    -- A child: when its parent had its end (in the child's terminal
    -- transaction for a parent living here; by the relay, sheaf.relay_pulled,
    -- for one elsewhere), or the child moved away from its ended parent.
    -- Retention keeps a child until then, and a parent until its children
    -- here have it.
    result_pulled_at timestamptz,
    -- opts.execution_timeout: when maintain() ends the run TIMED_OUT (a
    -- successor of continue-as-new keeps its predecessor's deadline).
    timeout_at      timestamptz,
    -- On a staged copy: the move that staged it, "<source shard>:<move id>";
    -- only that move's abort discards it (a late discard of an aborted move
    -- never removes a newer move's copy).
    staged_by       text,
    -- On a MIGRATED seal: when the relay found its run ended where it
    -- lives (sheaf.seal_run_ended). A seal is the only forward for ids of
    -- this shard, so retention deletes none before.
    seal_released_at timestamptz,
    -- How an application's start placed the run (since 0.3.0): its
    -- opts.placement ({} automatic; shard, residency_key, routing_key,
    -- tenant), what sheaf.misplaced_runs checks against the published
    -- topology. NULL for sheaf's own starts (children, schedule fires,
    -- continue-as-new), debounced starts, and runs started before 0.3.0.
    placement       jsonb
);
-- Active uniqueness: one non-terminal (or MIGRATED) run per (name, workflow_id).
CREATE UNIQUE INDEX executions_active ON executions (workflow_name, workflow_id)
    WHERE state IN ('RUNNING', 'SUSPENDED', 'PAUSED', 'MIGRATING', 'MIGRATED');
-- By-key resolution: the most recent run of (name, workflow_id).
CREATE INDEX executions_by_key ON executions (workflow_name, workflow_id, seq DESC);
-- The concurrency gate's bounded scan: a (name, key)'s active runs, newest first.
CREATE INDEX executions_gate ON executions (workflow_name, concurrency_key, seq DESC)
    WHERE concurrency_key IS NOT NULL AND state IN ('RUNNING', 'SUSPENDED', 'PAUSED');
-- Quota recounts.
CREATE INDEX executions_quota ON executions (quota_key) WHERE quota_key IS NOT NULL;
-- Execution timeouts (sheaf.maintain): active runs, earliest deadline first.
CREATE INDEX executions_timeout ON executions (timeout_at)
    WHERE timeout_at IS NOT NULL AND state IN ('RUNNING', 'SUSPENDED', 'PAUSED');
-- Timers: suspended executions whose wake time has come.
CREATE INDEX executions_wake ON executions (wake_at) WHERE state = 'SUSPENDED' AND wake_at IS NOT NULL;
-- Listing (sheaf.list_executions): keyset pages in (created_at, id) order,
-- over every execution, within states, within workflow names; search
-- attributes by containment (=, in) and key existence (the filter's index
-- rule, sheaf_core::search::Filter::uses_index).
CREATE INDEX executions_created ON executions (created_at, id);
CREATE INDEX executions_state ON executions (state, created_at, id);
CREATE INDEX executions_name ON executions (workflow_name, created_at, id);
CREATE INDEX executions_search ON executions USING gin (search_attrs);
-- A listing filtered by workflow and state: taken as independent columns,
-- a pair that never occurs (no run of this workflow ever FAILED) is
-- estimated at thousands of rows, and the planner walks every execution in
-- created order to find none (ui-bench: 380 ms a page at 250K runs a
-- shard, 7 ms with this).
CREATE STATISTICS executions_name_state (mcv) ON workflow_name, state FROM executions;
-- Retention (sheaf.maintain): ended runs and seals, oldest end first.
CREATE INDEX executions_ended ON executions (closed_at)
    WHERE state IN ('COMPLETED', 'FAILED', 'CANCELLED', 'TERMINATED', 'TIMED_OUT', 'CONTINUED_AS_NEW');
CREATE INDEX executions_sealed ON executions (closed_at) WHERE state = 'MIGRATED';

-- Append-only history. Never updated.
CREATE TABLE events (
    execution_id    uuid NOT NULL REFERENCES executions (id),
    seq             bigint NOT NULL,
    event_type      text NOT NULL CHECK (octet_length(event_type) BETWEEN 1 AND 128),
    payload         jsonb NOT NULL DEFAULT '{}',
    bytes           integer NOT NULL CHECK (bytes >= 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (execution_id, seq)
);
-- The usage report's events (sheaf.usage_report, workflow::usage): the
-- durable ends of executions and of their task attempts, by when they
-- happened, so a report reads the rows of its window only.
CREATE INDEX events_usage ON events (created_at)
    WHERE event_type IN ('WorkflowCompleted', 'WorkflowFailed', 'WorkflowCancelled', 'WorkflowTimedOut',
                         'TaskCompleted', 'TaskFailed', 'TaskDeadLettered', 'TaskReaped');

-- Signal ids already delivered to an execution (sheaf.signal's
-- opts.signal_id): a sender's retry delivers nothing more, to the run or to
-- any run of its (workflow, workflow id) here (a continue-as-new successor,
-- a run that ended after it got the signal), looked up by signal id.
CREATE TABLE signals_seen (
    execution_id    uuid NOT NULL REFERENCES executions (id),
    signal_id       text NOT NULL CHECK (octet_length(signal_id) BETWEEN 1 AND 256),
    PRIMARY KEY (execution_id, signal_id)
);
CREATE INDEX signals_seen_id ON signals_seen (signal_id);

-- Children (sheaf.start_child): every child a parent started, kept with the
-- parent. A repeated start_child of one (parent, name, workflow_id) finds its
-- child here; the child's shard is its id's prefix (target_shard).
CREATE TABLE children (
    parent_id       uuid NOT NULL REFERENCES executions (id),
    workflow_name   text NOT NULL,
    workflow_id     text NOT NULL,
    child_id        uuid NOT NULL UNIQUE,
    target_shard    integer NOT NULL CHECK (target_shard BETWEEN 0 AND 65534),
    -- What the parent's end does to a child still running.
    parent_close    text NOT NULL CHECK (parent_close IN ('terminate', 'request_cancel', 'abandon')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (parent_id, workflow_name, workflow_id)
);
-- A child's execution names its parent; children and trees are read by it.
CREATE INDEX executions_parent ON executions (parent_id, id) WHERE parent_id IS NOT NULL;

-- The relay's lifecycle rows (the driver's relay drives them, sheaf.relay_take
-- and sheaf.relay_report): a child on another shard until its end is in its
-- parent's history, and any child its parent's end still has to reach
-- (parent_close). The edges, in order, each at least once and idempotent:
--   start   STARTING: start the child on its shard with this id (the input
--           is kept here until then), then RUNNING;
--   close   close_requested and not close_delivered: cancel or terminate
--           the child on its shard;
--   settle  the parent ended: the row is deleted once started and closed;
--   pull    RUNNING: read the child; once it has ended, its end goes into
--           the parent's history (Child*), the parent is woken and the row
--           deleted, in one transaction: exactly once.
-- A relay takes a due row by a lease (lease_token fences its report; due_at
-- moves to the lease's end, so a relay that died leaves the row due again);
-- a failed edge counts an attempt and waits min(attempts, 6) x 5 s.
CREATE TABLE cross_shard_children (
    child_id        uuid PRIMARY KEY REFERENCES children (child_id),
    parent_id       uuid NOT NULL,
    target_shard    integer NOT NULL CHECK (target_shard BETWEEN 0 AND 65534),
    state           text NOT NULL CHECK (state IN ('STARTING', 'RUNNING')),
    input           jsonb,
    close_requested text CHECK (close_requested IN ('cancel', 'terminate')),
    close_reason    text,
    close_delivered boolean NOT NULL DEFAULT false,
    parent_ended    boolean NOT NULL DEFAULT false,
    attempts        integer NOT NULL DEFAULT 0,
    last_attempt_at timestamptz,
    last_error      text,
    due_at          timestamptz NOT NULL DEFAULT now(),
    -- The relay holding the row, until due_at (its lease).
    lease_token     bigint,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX cross_shard_children_due ON cross_shard_children (due_at);
CREATE INDEX cross_shard_children_parent ON cross_shard_children (parent_id);

-- What operators did to this shard (sheaf's audit log): every call that
-- changes its configuration or its topology digest, or acts on work as an
-- operator (redrive, terminate), writes one row in the call's transaction,
-- so an action that rolled back left none. `actor` is the session's
-- sheaf.actor setting (the driver's PoolOptions::actor, the CLI's --actor),
-- else the login role; `login` is the login role (session_user) whatever
-- the session declared: an actor is a claim, the login is who had the
-- credential.
CREATE TABLE audit_log (
    id              bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT now(),
    actor           text NOT NULL,
    login           text NOT NULL,
    action          text NOT NULL,
    target          text,
    outcome         text NOT NULL,
    detail          jsonb
);

-- The fleet's topology digest, as an operator published it here
-- (sheaf.publish_topology): sha256 of the driver's byte-stable projection
-- (ids, roles, residency map, forwards; never connection strings). A
-- client declares its own digest per connection (the session setting
-- sheaf.topology_digest); a shard with a published digest refuses placed
-- work (starts, enqueues, children) from a client whose digest is neither
-- this one nor the previous (kept while a change rolls out), so two
-- replicas configured differently cannot place work inconsistently.
CREATE TABLE topology_digest (
    one             boolean PRIMARY KEY DEFAULT true CHECK (one),
    digest          text NOT NULL CHECK (digest ~ '^sha256:[0-9a-f]{64}$'),
    previous        text CHECK (previous ~ '^sha256:[0-9a-f]{64}$'),
    published_at    timestamptz NOT NULL DEFAULT now()
);

-- The projections of the accepted topology digests (since 0.3.0): what
-- sheaf.publish_topology was given (ids, readable, writable, reserved,
-- default, residency map, forwards; never connection strings), in its
-- canonical form, keyed by the digest computed from it. Only the current
-- and the previous digest keep theirs (a publish deletes the rest), so the
-- table holds at most two rows. The placement functions (place_start,
-- place_task, place_mutex, locate_id) answer from the current one.
CREATE TABLE topology_projections (
    digest          text PRIMARY KEY CHECK (digest ~ '^sha256:[0-9a-f]{64}$'),
    projection      jsonb NOT NULL,
    published_at    timestamptz NOT NULL DEFAULT now()
);

-- Signals and cancels addressed by business key (sheaf.signal_external,
-- sheaf.cancel_external), written in the sender's transaction and delivered
-- by the driver's relay (sheaf.outbox_take, sheaf.outbox_report). The
-- relay resolves (workflow_name, workflow_id) over every readable shard,
-- active run first (Client::find_execution); a resolution a shard could
-- not answer is indeterminate and retried, never "unknown". Edges:
--   deliver  PENDING: the signal goes to the run found, deduplicated by
--            this row's id as its signal_id (ExternalSignalDelivered); a
--            cancel ends the run found and becomes CONFIRMING; a complete
--            fan-out that found only an ended run reports at once
--            (ExternalSignalFailed, or ExternalCancelDelivered with
--            cancelled false); one that found nothing, ExternalTargetUnknown;
--   confirm  CONFIRMING: a later fan-out, complete and finding no live run
--            of the key, records ExternalCancelDelivered; a live run found
--            then (started during the first fan-out) is cancelled too.
-- Each result goes into the sender's history once and wakes it; the row is
-- then DONE (due_at NULL), kept for opts.signal_id until the sender ends.
-- Leases, fencing and back-off as for cross_shard_children.
CREATE TABLE outbox (
    outbox_id       uuid PRIMARY KEY,
    sender_id       uuid NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('signal', 'cancel')),
    workflow_name   text NOT NULL,
    workflow_id     text NOT NULL,
    signal          text,
    payload         jsonb,
    reason          text,
    signal_id       text CHECK (octet_length(signal_id) BETWEEN 1 AND 256),
    state           text NOT NULL DEFAULT 'PENDING' CHECK (state IN ('PENDING', 'CONFIRMING', 'DONE')),
    -- CONFIRMING: the run the cancel ended, and the shard it lived on then
    -- (its residence, which its id does not say).
    delivered_to    uuid,
    delivered_shard integer CHECK (delivered_shard BETWEEN 0 AND 65534),
    attempts        integer NOT NULL DEFAULT 0,
    -- Resolutions in a row that a shard could not answer, since when.
    indeterminate   integer NOT NULL DEFAULT 0,
    indeterminate_since timestamptz,
    last_attempt_at timestamptz,
    last_error      text,
    due_at          timestamptz DEFAULT now(),
    lease_token     bigint,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (sender_id, kind, signal_id)
);
CREATE INDEX outbox_due ON outbox (due_at) WHERE due_at IS NOT NULL;

-- The cost ledger: metrics an application records against an execution
-- (sheaf.record_usage), summed per group by sheaf.usage_report.
CREATE TABLE usage_records (
    execution_id    uuid NOT NULL REFERENCES executions (id),
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    metrics         jsonb NOT NULL
);
CREATE INDEX usage_records_window ON usage_records (recorded_at);
-- Retention deletes an ended run's records with it.
CREATE INDEX usage_records_execution ON usage_records (execution_id);

-- Per-tenant quota usage, one row per quota key, kept by the same
-- transactions that change what it counts (quota_recompute recounts it):
-- active executions, their history bytes, and dead letters of the key's
-- executions.
CREATE TABLE quota_usage (
    key                 text PRIMARY KEY CHECK (octet_length(key) BETWEEN 1 AND 256),
    active_executions   bigint NOT NULL DEFAULT 0,
    history_bytes       bigint NOT NULL DEFAULT 0,
    dead_letters        bigint NOT NULL DEFAULT 0
);

-- Durable FIFO mutex: one holder per key, fenced by a token.
CREATE TABLE mutex_locks (
    key             text PRIMARY KEY CHECK (octet_length(key) BETWEEN 1 AND 256),
    holder          uuid NOT NULL,
    token           bigint NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    acquired_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX mutex_locks_holder ON mutex_locks (holder);
CREATE INDEX mutex_locks_expiry ON mutex_locks (lease_expires_at);

-- Its waiting line, in arrival order. A waiter's lease (lease_secs) applies
-- once it picks up its grant; until then it holds its place until
-- expires_at, renewed to now + lease_secs / 3 by each acquire: a waiter that
-- stopped asking (its process died) lapses, and hand-overs and mutex_reclaim
-- delete it. No index on expires_at: each poll updates it (HOT updates).
CREATE TABLE mutex_waiters (
    key             text NOT NULL,
    owner           uuid NOT NULL,
    position        bigint NOT NULL,
    lease_secs      double precision NOT NULL,
    enqueued_at     timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (key, owner)
);
CREATE UNIQUE INDEX mutex_waiters_fifo ON mutex_waiters (key, position);
CREATE INDEX mutex_waiters_owner ON mutex_waiters (owner);

-- Rebalancing (sheaf.migration_begin ... migration_report, driven by the
-- driver's Client::rebalance): one record per move of a quiescent execution
-- off this shard, kept here on the source, which stays authoritative until
-- the cutover. Phases:
--   STARTED    quiescent and exported; a staged copy (state MIGRATING, its
--              tasks paused, no slot held) may exist on the target
--   VERIFIED   the staged copy matched this shard's rows byte for byte;
--              verified_event_seq and verified_fingerprint are this
--              shard's high-water mark at that moment
--   COMMITTED  the cutover: one transaction sealed the execution MIGRATED
--              (migrated_to_shard = target, its tasks and slots gone), only
--              while it still matched the high-water mark
--   DONE       the staged copy was activated (its tasks claimable, its
--              timer armed) and the origin's seal points at it
--   ABORTED    nothing moved (recorded before the staged copy is
--              discarded, so no cutover can follow); last_error
--              says why
-- Only VERIFIED -> COMMITTED changes which copy is authoritative. After a
-- crash, rebalance-resume discards and redoes a record before the cutover
-- and activates one after it; a worker activates a COMMITTED record stalled
-- past its grace period on its own (sheaf.migration_stalled).
-- One mover at a time: every step on the source (verify, cutover, report)
-- names the record's lease token and renews its lease; a resume takes a
-- record over (sheaf.migration_takeover, a new token) only once its lease
-- has lapsed, so a mover that is still working is never aborted under it.
CREATE TABLE migrations (
    id              bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    execution_id    uuid NOT NULL REFERENCES executions (id),
    target_shard    integer NOT NULL CHECK (target_shard BETWEEN 0 AND 65534),
    phase           text NOT NULL DEFAULT 'STARTED'
                    CHECK (phase IN ('STARTED', 'VERIFIED', 'COMMITTED', 'DONE', 'ABORTED')),
    attempts        integer NOT NULL DEFAULT 0,
    last_error      text,
    verified_event_seq bigint,
    verified_fingerprint text,
    -- History bytes moved.
    bytes           bigint NOT NULL DEFAULT 0,
    -- Who began the move: as audit_log's actor and login.
    actor           text NOT NULL,
    login           text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    -- The mover's lease: its token (from fence_token), until when, and
    -- how long each step renews it for.
    lease_token     bigint NOT NULL,
    lease_until     timestamptz NOT NULL,
    lease_secs      double precision NOT NULL CHECK (lease_secs BETWEEN 5 AND 3600)
);
-- One move at a time per execution.
CREATE UNIQUE INDEX migrations_open ON migrations (execution_id) WHERE phase NOT IN ('DONE', 'ABORTED');
CREATE INDEX migrations_pending ON migrations (phase, updated_at) WHERE phase NOT IN ('DONE', 'ABORTED');
-- Retention deletes a seal's records of its moves with it.
CREATE INDEX migrations_execution ON migrations (execution_id);

-- How long this shard keeps what has ended (sheaf.set_retention, applied in
-- bounded batches by sheaf.maintain; sheaf_core::retention reads it). One
-- row once set; none means keep everything.
CREATE TABLE retention (
    one             boolean PRIMARY KEY DEFAULT true CHECK (one),
    policy          jsonb NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Schedules (sheaf.create_schedule; sheaf_core::schedule parses the spec and
-- computes fire times). Fired by sheaf.maintain on the shard that holds them
-- (the driver creates them on the default shard), never inside a claim.
CREATE TABLE schedules (
    name            text PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 256),
    -- The spec with every default spelled out.
    spec            jsonb NOT NULL,
    paused          boolean NOT NULL DEFAULT false,
    -- The first fire time not yet handled: a sweep fires what is due from
    -- here, by the spec's catch-up policy.
    next_fire_at    timestamptz,
    last_fire_at    timestamptz,
    last_outcome    text,
    last_error      text,
    -- The last fire's run or task, for the overlap policy.
    last_execution_id uuid,
    last_task_id    uuid,
    fires           bigint NOT NULL DEFAULT 0,
    skipped         bigint NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE NOT paused;
-- A fire time fires once however many sweeps look at it: its record is
-- unique, and written in the transaction that starts the fire's work.
CREATE TABLE schedule_fires (
    schedule        text NOT NULL,
    fire_at         timestamptz NOT NULL,
    fired_at        timestamptz NOT NULL DEFAULT now(),
    outcome         text NOT NULL CHECK (outcome IN ('started', 'skipped_overlap', 'failed')),
    execution_id    uuid,
    task_id         uuid,
    error           text,
    -- sheaf.trigger_schedule, not the timing.
    manual          boolean NOT NULL DEFAULT false,
    PRIMARY KEY (schedule, fire_at)
);
-- Retention (schedule_fires): oldest first.
CREATE INDEX schedule_fires_fired ON schedule_fires (fired_at);

-- Rate limits (sheaf.declare_rate_limit) and start throttles (a workflow
-- policy's throttle), sheaf_core::rate: a bucket per (name, key) holds its
-- theoretical arrival time (GCRA). A limited task or throttled start is
-- admitted at its bucket's time, scheduled until then; beyond a 30-second
-- lookahead it waits in its bucket's line (rate_waiting), scheduled at
-- infinity, until sheaf.maintain times it. The claim never reads these.
CREATE TABLE rate_limits (
    name            text PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 256),
    spec            jsonb NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
-- Pacing overrides (sheaf.set_rate_override): a rate limit's or a start
-- throttle's (workflow:<name>) pace until expires_at, on this shard's clock.
CREATE TABLE rate_overrides (
    name            text PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 266),
    rate            double precision NOT NULL CHECK (rate > 0),
    period          interval NOT NULL,
    expires_at      timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE rate_buckets (
    -- The rate limit, or workflow:<name> for a start throttle.
    name            text NOT NULL,
    -- The resolved key; '' for an unkeyed limit (and a task without its key).
    key             text NOT NULL,
    tat             timestamptz NOT NULL,
    -- When the head of its line may be admitted; NULL: no line.
    line_at         timestamptz,
    PRIMARY KEY (name, key)
);
CREATE INDEX rate_buckets_line ON rate_buckets (line_at) WHERE line_at IS NOT NULL;
CREATE TABLE rate_waiting (
    name            text NOT NULL,
    key             text NOT NULL,
    seq             bigint NOT NULL,
    task_id         uuid NOT NULL,
    PRIMARY KEY (name, key, seq)
);
CREATE SEQUENCE rate_seq;

-- Debounced starts (start_workflow opts debounce; workflow::debounce): the
-- pending start of (workflow, key), which later starts in its window join.
CREATE TABLE debounces (
    workflow_name   text NOT NULL,
    debounce_key    text NOT NULL CHECK (octet_length(debounce_key) BETWEEN 1 AND 256),
    execution_id    uuid NOT NULL,
    mode            text NOT NULL CHECK (mode IN ('trailing', 'leading')),
    -- When the window ends (a trailing run's first task is due then).
    until           timestamptz NOT NULL,
    starts          bigint NOT NULL DEFAULT 1,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_name, debounce_key)
);
CREATE INDEX debounces_until ON debounces (until);
-- A run whose window is open does not move (rebalancing's debounce_open).
CREATE INDEX debounces_execution ON debounces (execution_id);

-- Fencing tokens and enqueue order: sequences, never the clock.
CREATE SEQUENCE task_seq;
CREATE SEQUENCE fence_token;
CREATE SEQUENCE execution_seq;
CREATE SEQUENCE mutex_seq;
