-- sheaf 0.1.0 -> 0.2.0: run by ALTER EXTENSION sheaf UPDATE on a shard
-- that runs 0.1.0.
--
-- Every change to the SQL surface after 0.1.0 goes into sql/schema.sql
-- (or the Rust functions) AND into this file, until 0.2.0 is released; then
-- this file is frozen. The upgrade test (scripts/upgrade-test) requires a
-- 0.1.0 shard updated by this file to match a fresh install of HEAD.
-- A changed function signature is DROP FUNCTION + CREATE FUNCTION here
-- (CREATE OR REPLACE with a new argument list adds a second function), and
-- a released C symbol keeps its argument and return types.
--
-- sheaf_relay: the protocol's own role (privileges.sql). The relay's and
-- rebalancing's steps below are granted to it, never to sheaf_worker: a
-- worker credential cannot forge a child's result, activate a staged copy
-- or repoint a forward. It is a member of sheaf_worker (the relay reads and
-- signals runs through the worker surface), and sheaf_admin a member of it.
-- Created once per cluster, like the other two.
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'sheaf_relay') THEN
        CREATE ROLE sheaf_relay NOLOGIN;
    END IF;
END
$roles$;
GRANT sheaf_worker TO sheaf_relay;
GRANT sheaf_relay TO sheaf_admin;
--
-- worker_deregister: a worker shutting down leaves the live-worker registry
-- at once, so its queues show as stranded now, not 60 seconds later.
CREATE FUNCTION "worker_deregister"(
	"worker" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'worker_deregister_wrapper';
-- A new function is executable by PUBLIC until revoked (privileges.sql
-- revoked it from every function of the install script).
REVOKE EXECUTE ON FUNCTION @extschema@.worker_deregister(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.worker_deregister(text) TO sheaf_worker;
--
-- The worker's outcomes beyond complete/fail: a snooze (run again later, the
-- attempt not spent), a failure no retry can fix (straight to the dead
-- letters), and a task that ends its execution in the same transaction (so
-- ending the execution does not cancel the task whose result it is).
CREATE FUNCTION "snooze"(
	"task_id" uuid,
	"token" bigint,
	"delay" interval
) RETURNS timestamp with time zone
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'snooze_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.snooze(uuid, bigint, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.snooze(uuid, bigint, interval) TO sheaf_worker;
CREATE FUNCTION "dead_letter"(
	"task_id" uuid,
	"token" bigint,
	"error" TEXT
) RETURNS void
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'dead_letter_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.dead_letter(uuid, bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.dead_letter(uuid, bigint, text) TO sheaf_worker;
CREATE FUNCTION "complete_task_and_execution"(
	"task_id" uuid,
	"token" bigint,
	"result" jsonb
) RETURNS void
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'complete_task_and_execution_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.complete_task_and_execution(uuid, bigint, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.complete_task_and_execution(uuid, bigint, jsonb) TO sheaf_worker;
CREATE FUNCTION "complete_task_and_fail_execution"(
	"task_id" uuid,
	"token" bigint,
	"error" TEXT
) RETURNS void
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'complete_task_and_fail_execution_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.complete_task_and_fail_execution(uuid, bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.complete_task_and_fail_execution(uuid, bigint, text) TO sheaf_worker;
--
-- Claim floors (see sql/schema.sql): a claim seeks each band of its queue
-- from the band's floor, past the dead entries a held snapshot keeps at
-- the head of ready_claim.
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
-- As privileges.sql leaves every table of a fresh install: no one's but
-- the owner's (the revoke makes the owner's grants explicit).
REVOKE ALL ON ready_floors FROM PUBLIC;
REVOKE ALL ON SEQUENCE ready_floor_gen FROM PUBLIC;
-- The bands of aging queues: each priority's rows, for the claim's merge.
CREATE FUNCTION @extschema@.ready_aging_band(priority integer, aging_secs integer)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN aging_secs IS NULL THEN NULL
            ELSE -1e15::double precision - priority::double precision END;
REVOKE EXECUTE ON FUNCTION @extschema@.ready_aging_band(integer, integer) FROM PUBLIC;
ALTER TABLE @extschema@.ready ADD COLUMN aging_band double precision;
UPDATE @extschema@.ready r SET aging_band = @extschema@.ready_aging_band(t.priority, q.aging_secs)
FROM @extschema@.tasks t, @extschema@.queues q
WHERE t.id = r.task_id AND q.name = r.queue AND q.aging_secs IS NOT NULL;
CREATE INDEX ready_aging ON @extschema@.ready (queue, aging_band, k1, k2, seq) WHERE aging_band IS NOT NULL;
-- Each band of the ready rows there are starts at its first row.
INSERT INTO ready_floors (queue, band, ngen, base, k1, k2, seq)
SELECT f.queue, f.band, -nextval('ready_floor_gen'), true, f.k1, f.k2, f.seq FROM (
SELECT DISTINCT ON (r.queue, coalesce(r.aging_band, r.k1)) r.queue, coalesce(r.aging_band, r.k1) AS band, r.k1, r.k2, r.seq
FROM ready r
ORDER BY r.queue, coalesce(r.aging_band, r.k1), r.k1, r.k2, r.seq) f;
-- And every queue has a band covering all its rows from minus infinity,
-- band NaN (above every other, and above every k1): ready rows written by
-- a transaction open across this update (by a library that found no floors
-- in the catalog, so it wrote no floor rows) are not in the rows above, and
-- this band keeps them claimable, after the other bands' rows. An advance
-- that finds it empty ends it.
INSERT INTO ready_floors (queue, band, ngen, base, k1, k2, seq)
SELECT name, 'NaN', -nextval('ready_floor_gen'), false, '-Infinity', '-Infinity', -9223372036854775808
FROM queues;
--
-- Wait floors (see concurrency_limits in schema.sql): every line is read
-- from its head until its first promotion.
ALTER TABLE @extschema@.concurrency_limits ADD COLUMN wait_priority integer, ADD COLUMN wait_seq bigint,
    ADD CHECK ((wait_priority IS NULL) = (wait_seq IS NULL));
--
-- Slots held, rotated (see concurrency_slots in schema.sql): each capped
-- key's count moves to its first row there.
CREATE SEQUENCE concurrency_slot_gen;
CREATE TABLE concurrency_slots (
    key         text NOT NULL,
    gen         bigint NOT NULL,
    admitted    integer NOT NULL CHECK (admitted >= 0),
    PRIMARY KEY (key, gen)
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
        vacuum_index_cleanup = on, autovacuum_vacuum_cost_delay = 0);
REVOKE ALL ON concurrency_slots FROM PUBLIC;
REVOKE ALL ON SEQUENCE concurrency_slot_gen FROM PUBLIC;
INSERT INTO concurrency_slots (key, gen, admitted)
SELECT key, nextval('concurrency_slot_gen'), admitted FROM @extschema@.concurrency_limits;
ALTER TABLE @extschema@.concurrency_limits DROP COLUMN admitted;
--
-- Mutex waiters hold their place for a third of their lease, renewed by
-- each acquire, so a waiter whose process died no longer stays in line
-- forever. The waiters of the moment get a whole lease from the upgrade (no
-- one polled them under the new rule yet), in the order they had. No
-- default (as in a fresh install: every join sets the column), so the
-- column is added empty, filled, then made NOT NULL.
ALTER TABLE @extschema@.mutex_waiters ADD COLUMN expires_at timestamptz;
UPDATE @extschema@.mutex_waiters SET expires_at = now() + make_interval(secs => lease_secs);
ALTER TABLE @extschema@.mutex_waiters ALTER COLUMN expires_at SET NOT NULL;
--
-- Search attributes and listing executions: keyset pages in (created_at,
-- id) order, overall, within states and workflow names, and by attribute.
CREATE INDEX executions_created ON @extschema@.executions (created_at, id);
CREATE INDEX executions_state ON @extschema@.executions (state, created_at, id);
CREATE INDEX executions_name ON @extschema@.executions (workflow_name, created_at, id);
CREATE STATISTICS @extschema@.executions_name_state (mcv) ON workflow_name, state FROM @extschema@.executions;
-- Its numbers now rather than at the next autovacuum (a sample: fast on any size).
ANALYZE @extschema@.executions;
CREATE INDEX executions_search ON @extschema@.executions USING gin (search_attrs);
CREATE FUNCTION "upsert_search_attrs"(
	"execution_id" uuid,
	"attrs" jsonb
) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'upsert_search_attrs_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.upsert_search_attrs(uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.upsert_search_attrs(uuid, jsonb) TO sheaf_worker;
CREATE FUNCTION "list_executions"(
	"filter" jsonb DEFAULT '{}',
	"after" jsonb DEFAULT NULL,
	"max_rows" INT DEFAULT 50,
	"sort_order" TEXT DEFAULT 'desc'
) RETURNS TABLE (
	"execution_id" uuid,
	"workflow_name" TEXT,
	"workflow_id" TEXT,
	"state" TEXT,
	"created_at" timestamp with time zone,
	"closed_at" timestamp with time zone,
	"parent_id" uuid,
	"search_attrs" jsonb
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'list_executions_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.list_executions(jsonb, jsonb, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.list_executions(jsonb, jsonb, integer, text) TO sheaf_worker;
--
-- The usage report: an attempt's claim time (set by the claim's update),
-- an index over the events it counts, and the cost ledger.
ALTER TABLE @extschema@.tasks ADD COLUMN claimed_at timestamptz;
CREATE INDEX events_usage ON @extschema@.events (created_at)
    WHERE event_type IN ('WorkflowCompleted', 'WorkflowFailed', 'WorkflowCancelled', 'WorkflowTimedOut',
                         'TaskCompleted', 'TaskFailed', 'TaskDeadLettered', 'TaskReaped');
CREATE TABLE usage_records (
    execution_id    uuid NOT NULL REFERENCES executions (id),
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    metrics         jsonb NOT NULL
);
CREATE INDEX usage_records_window ON usage_records (recorded_at);
REVOKE ALL ON usage_records FROM PUBLIC;
CREATE FUNCTION "usage_report"(
	"from_ts" timestamp with time zone,
	"to_ts" timestamp with time zone,
	"group_by" TEXT DEFAULT 'workflow_name'
) RETURNS TABLE (
	"grp" TEXT,
	"workflow_starts" bigint,
	"completed" bigint,
	"failed" bigint,
	"cancelled" bigint,
	"timed_out" bigint,
	"activity_executions" bigint,
	"activity_executions_failed" bigint,
	"activity_compute_seconds" double precision,
	"metered" jsonb
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'usage_report_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.usage_report(timestamptz, timestamptz, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.usage_report(timestamptz, timestamptz, text) TO sheaf_admin;
CREATE FUNCTION "record_usage"(
	"execution_id" uuid,
	"metrics" jsonb
) RETURNS void
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'record_usage_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.record_usage(uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.record_usage(uuid, jsonb) TO sheaf_worker;
--
-- Signals to one execution, deduplicated by the sender's signal id.
CREATE TABLE signals_seen (
    execution_id    uuid NOT NULL REFERENCES executions (id),
    signal_id       text NOT NULL CHECK (octet_length(signal_id) BETWEEN 1 AND 256),
    PRIMARY KEY (execution_id, signal_id)
);
CREATE INDEX signals_seen_id ON signals_seen (signal_id);
REVOKE ALL ON signals_seen FROM PUBLIC;
CREATE FUNCTION "signal"(
	"execution_id" uuid,
	"signal" TEXT,
	"payload" jsonb,
	"opts" jsonb DEFAULT '{}'
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'signal_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.signal(uuid, text, jsonb, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.signal(uuid, text, jsonb, jsonb) TO sheaf_worker;
--
-- Child workflows and the relay that carries their effects across shards
-- (see children and cross_shard_children in sql/schema.sql).
CREATE TABLE children (
    parent_id       uuid NOT NULL REFERENCES executions (id),
    workflow_name   text NOT NULL,
    workflow_id     text NOT NULL,
    child_id        uuid NOT NULL UNIQUE,
    target_shard    integer NOT NULL CHECK (target_shard BETWEEN 0 AND 65534),
    parent_close    text NOT NULL CHECK (parent_close IN ('terminate', 'request_cancel', 'abandon')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (parent_id, workflow_name, workflow_id)
);
REVOKE ALL ON children FROM PUBLIC;
CREATE INDEX executions_parent ON executions (parent_id, id) WHERE parent_id IS NOT NULL;
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
    lease_token     bigint,
    created_at      timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON cross_shard_children FROM PUBLIC;
CREATE INDEX cross_shard_children_due ON cross_shard_children (due_at);
CREATE INDEX cross_shard_children_parent ON cross_shard_children (parent_id);
CREATE FUNCTION "start_child"(
	"parent_id" uuid,
	"name" TEXT,
	"workflow_id" TEXT,
	"input" jsonb,
	"opts" jsonb DEFAULT '{}'
) RETURNS TABLE (
	"child_id" uuid,
	"target_shard" INT,
	"created" bool
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'start_child_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.start_child(uuid, text, text, jsonb, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.start_child(uuid, text, text, jsonb, jsonb) TO sheaf_worker;
CREATE FUNCTION "cancel_child"(
	"parent_id" uuid,
	"child_id" uuid,
	"reason" TEXT DEFAULT NULL
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'cancel_child_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cancel_child(uuid, uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.cancel_child(uuid, uuid, text) TO sheaf_worker;
CREATE FUNCTION "list_children"(
	"parent_id" uuid,
	"after" uuid DEFAULT NULL,
	"max_rows" INT DEFAULT 1000
) RETURNS TABLE (
	"execution_id" uuid,
	"workflow_name" TEXT,
	"workflow_id" TEXT,
	"state" TEXT,
	"shard" INT,
	"created_at" timestamp with time zone,
	"closed_at" timestamp with time zone
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'list_children_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.list_children(uuid, uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.list_children(uuid, uuid, integer) TO sheaf_worker;
CREATE FUNCTION "relay_take"(
	"max_rows" INT DEFAULT 100,
	"lease" interval DEFAULT '30 seconds',
	"child_ids" uuid[] DEFAULT NULL
) RETURNS TABLE (
	"child_id" uuid,
	"parent_id" uuid,
	"target_shard" INT,
	"state" TEXT,
	"workflow_name" TEXT,
	"workflow_id" TEXT,
	"input" jsonb,
	"close_requested" TEXT,
	"close_reason" TEXT,
	"close_delivered" bool,
	"parent_ended" bool,
	"attempts" INT,
	"lease_token" bigint
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'relay_take_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.relay_take(integer, interval, uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.relay_take(integer, interval, uuid[]) TO sheaf_relay;
CREATE FUNCTION "relay_report"(
	"child_id" uuid,
	"lease_token" bigint,
	"outcome" jsonb
) RETURNS TEXT
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'relay_report_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.relay_report(uuid, bigint, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.relay_report(uuid, bigint, jsonb) TO sheaf_relay;
CREATE FUNCTION "relay_start_child"(
	"child_id" uuid,
	"parent_id" uuid,
	"name" TEXT,
	"workflow_id" TEXT,
	"input" jsonb
) RETURNS TABLE (
	"outcome" TEXT,
	"execution_id" uuid
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'relay_start_child_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.relay_start_child(uuid, uuid, text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.relay_start_child(uuid, uuid, text, text, jsonb) TO sheaf_relay;
CREATE FUNCTION "relay_close_child"(
	"child_id" uuid,
	"parent_id" uuid,
	"how" TEXT,
	"reason" TEXT DEFAULT NULL
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'relay_close_child_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.relay_close_child(uuid, uuid, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.relay_close_child(uuid, uuid, text, text) TO sheaf_relay;
CREATE FUNCTION "relay_backlog"() RETURNS TABLE (
	"target_shard" INT,
	"state" TEXT,
	"close_requested" TEXT,
	"rows" bigint,
	"failing" bigint,
	"oldest" timestamp with time zone,
	"max_attempts" INT,
	"last_error" TEXT
)
STRICT STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'relay_backlog_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.relay_backlog() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.relay_backlog() TO sheaf_worker;
--
-- Signals and cancels addressed by business key: the outbox the relay
-- delivers (see outbox in sql/schema.sql).
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
    delivered_to    uuid,
    delivered_shard integer CHECK (delivered_shard BETWEEN 0 AND 65534),
    attempts        integer NOT NULL DEFAULT 0,
    indeterminate   integer NOT NULL DEFAULT 0,
    indeterminate_since timestamptz,
    last_attempt_at timestamptz,
    last_error      text,
    due_at          timestamptz DEFAULT now(),
    lease_token     bigint,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (sender_id, kind, signal_id)
);
REVOKE ALL ON outbox FROM PUBLIC;
CREATE INDEX outbox_due ON outbox (due_at) WHERE due_at IS NOT NULL;
CREATE FUNCTION "signal_external"(
	"sender" uuid,
	"name" TEXT,
	"workflow_id" TEXT,
	"signal" TEXT,
	"payload" jsonb,
	"opts" jsonb DEFAULT '{}'
) RETURNS uuid
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'signal_external_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.signal_external(uuid, text, text, text, jsonb, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.signal_external(uuid, text, text, text, jsonb, jsonb) TO sheaf_worker;
CREATE FUNCTION "cancel_external"(
	"sender" uuid,
	"name" TEXT,
	"workflow_id" TEXT,
	"reason" TEXT DEFAULT NULL,
	"opts" jsonb DEFAULT '{}'
) RETURNS uuid
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'cancel_external_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cancel_external(uuid, text, text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.cancel_external(uuid, text, text, text, jsonb) TO sheaf_worker;
CREATE FUNCTION "outbox_take"(
	"max_rows" INT DEFAULT 100,
	"lease" interval DEFAULT '30 seconds'
) RETURNS TABLE (
	"outbox_id" uuid,
	"sender_id" uuid,
	"kind" TEXT,
	"state" TEXT,
	"workflow_name" TEXT,
	"workflow_id" TEXT,
	"signal" TEXT,
	"payload" jsonb,
	"reason" TEXT,
	"delivered_to" uuid,
	"attempts" INT,
	"indeterminate" INT,
	"lease_token" bigint
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'outbox_take_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.outbox_take(integer, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_take(integer, interval) TO sheaf_relay;
CREATE FUNCTION "outbox_report"(
	"outbox_id" uuid,
	"lease_token" bigint,
	"outcome" jsonb
) RETURNS TEXT
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'outbox_report_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.outbox_report(uuid, bigint, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_report(uuid, bigint, jsonb) TO sheaf_relay;
CREATE FUNCTION "outbox_backlog"() RETURNS TABLE (
	"kind" TEXT,
	"state" TEXT,
	"rows" bigint,
	"failing" bigint,
	"indeterminate" bigint,
	"oldest" timestamp with time zone,
	"indeterminate_since" timestamp with time zone,
	"max_attempts" INT,
	"last_error" TEXT
)
STRICT STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'outbox_backlog_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.outbox_backlog() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.outbox_backlog() TO sheaf_worker;
CREATE FUNCTION "list_child_links"(
	"after_parent" uuid DEFAULT NULL,
	"after_child" uuid DEFAULT NULL,
	"max_rows" INT DEFAULT 1000
) RETURNS TABLE (
	"parent_id" uuid,
	"child_id" uuid,
	"workflow_name" TEXT,
	"workflow_id" TEXT,
	"state" TEXT,
	"created_at" timestamp with time zone
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'list_child_links_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.list_child_links(uuid, uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.list_child_links(uuid, uuid, integer) TO sheaf_admin;
CREATE FUNCTION "known_children"(
	"child_ids" uuid[]
) RETURNS SETOF uuid
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'known_children_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.known_children(uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.known_children(uuid[]) TO sheaf_admin;
--
-- The fleet's topology digest (see topology_digest in sql/schema.sql).
CREATE TABLE topology_digest (
    one             boolean PRIMARY KEY DEFAULT true CHECK (one),
    digest          text NOT NULL CHECK (digest ~ '^sha256:[0-9a-f]{64}$'),
    previous        text CHECK (previous ~ '^sha256:[0-9a-f]{64}$'),
    published_at    timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON topology_digest FROM PUBLIC;
CREATE FUNCTION "publish_topology"(
	"topology_digest" TEXT,
	"keep_previous" bool DEFAULT true
) RETURNS TABLE (
	"digest" TEXT,
	"previous" TEXT
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'publish_topology_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.publish_topology(text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.publish_topology(text, boolean) TO sheaf_admin;
CREATE FUNCTION "published_topology"() RETURNS TABLE (
	"digest" TEXT,
	"previous" TEXT,
	"published_at" timestamp with time zone
)
STRICT STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'published_topology_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.published_topology() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.published_topology() TO sheaf_worker;
CREATE FUNCTION "fleet_config"() RETURNS jsonb
STRICT STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'fleet_config_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.fleet_config() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.fleet_config() TO sheaf_worker;
--
-- sheaf's audit log (see audit_log in sql/schema.sql).
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
REVOKE ALL ON audit_log FROM PUBLIC;
REVOKE ALL ON SEQUENCE audit_log_id_seq FROM PUBLIC;
CREATE FUNCTION "audit_log"(
	"before_id" bigint DEFAULT NULL,
	"max_rows" INT DEFAULT 100
) RETURNS TABLE (
	"id" bigint,
	"at" timestamp with time zone,
	"actor" TEXT,
	"login" TEXT,
	"action" TEXT,
	"target" TEXT,
	"outcome" TEXT,
	"detail" jsonb
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'audit_log_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.audit_log(bigint, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.audit_log(bigint, integer) TO sheaf_admin;
--
-- Rebalancing (see migrations in sql/schema.sql).
ALTER TABLE executions ADD COLUMN migrated_to_shard integer CHECK (migrated_to_shard BETWEEN 0 AND 65534);
ALTER TABLE executions ADD COLUMN migrated_from_shards integer[] NOT NULL DEFAULT '{}';
ALTER TABLE executions ADD COLUMN replaced_seal jsonb;
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
    bytes           bigint NOT NULL DEFAULT 0,
    actor           text NOT NULL,
    login           text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    lease_token     bigint NOT NULL,
    lease_until     timestamptz NOT NULL,
    lease_secs      double precision NOT NULL CHECK (lease_secs BETWEEN 5 AND 3600)
);
CREATE UNIQUE INDEX migrations_open ON migrations (execution_id) WHERE phase NOT IN ('DONE', 'ABORTED');
CREATE INDEX migrations_pending ON migrations (phase, updated_at) WHERE phase NOT IN ('DONE', 'ABORTED');
REVOKE ALL ON migrations FROM PUBLIC;
REVOKE ALL ON SEQUENCE migrations_id_seq FROM PUBLIC;
CREATE FUNCTION "rebalance_candidates"(
	"after_id" uuid DEFAULT NULL,
	"max_rows" INT DEFAULT 100
) RETURNS TABLE (
	"execution_id" uuid,
	"workflow_name" TEXT,
	"workflow_id" TEXT,
	"state" TEXT,
	"history_bytes" bigint,
	"blockers" TEXT[]
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'rebalance_candidates_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.rebalance_candidates(uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.rebalance_candidates(uuid, integer) TO sheaf_admin;
CREATE FUNCTION "relay_rows_to"(
	"target_shard" INT,
	"after" uuid DEFAULT NULL,
	"max_rows" INT DEFAULT 1000
) RETURNS TABLE (
	"child_id" uuid,
	"parent_id" uuid,
	"state" TEXT
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'relay_rows_to_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.relay_rows_to(integer, uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.relay_rows_to(integer, uuid, integer) TO sheaf_admin;
CREATE FUNCTION "migration_begin"(
	"execution_id" uuid,
	"target_shard" INT,
	"lease" interval DEFAULT '60 seconds'
) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'migration_begin_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.migration_begin(uuid, integer, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.migration_begin(uuid, integer, interval) TO sheaf_admin;
CREATE FUNCTION "migration_stage"(
	"export" jsonb
) RETURNS TEXT
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'migration_stage_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.migration_stage(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.migration_stage(jsonb) TO sheaf_admin;
CREATE FUNCTION "migration_verify"(
	"migration_id" bigint,
	"lease_token" bigint,
	"staged_digest" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'migration_verify_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.migration_verify(bigint, bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.migration_verify(bigint, bigint, text) TO sheaf_admin;
CREATE FUNCTION "migration_cutover"(
	"migration_id" bigint,
	"lease_token" bigint
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'migration_cutover_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.migration_cutover(bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.migration_cutover(bigint, bigint) TO sheaf_admin;
CREATE FUNCTION "migration_activate"(
	"execution_id" uuid
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'migration_activate_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.migration_activate(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.migration_activate(uuid) TO sheaf_relay;
CREATE FUNCTION "migration_discard"(
	"execution_id" uuid,
	"source_shard" INT,
	"migration_id" bigint
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'migration_discard_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.migration_discard(uuid, integer, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.migration_discard(uuid, integer, bigint) TO sheaf_admin;
CREATE FUNCTION "migration_report"(
	"migration_id" bigint,
	"lease_token" bigint,
	"outcome" TEXT,
	"error" TEXT DEFAULT NULL
) RETURNS TEXT
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'migration_report_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.migration_report(bigint, bigint, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.migration_report(bigint, bigint, text, text) TO sheaf_relay;
CREATE FUNCTION "migration_stalled"(
	"grace" interval DEFAULT '30 seconds',
	"max_rows" INT DEFAULT 10,
	"target_shards" INT[] DEFAULT NULL
) RETURNS TABLE (
	"migration_id" bigint,
	"execution_id" uuid,
	"target_shard" INT,
	"attempts" INT,
	"lease_token" bigint
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'migration_stalled_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.migration_stalled(interval, integer, integer[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.migration_stalled(interval, integer, integer[]) TO sheaf_relay;
CREATE FUNCTION "migration_takeover"(
	"migration_id" bigint,
	"lease" interval DEFAULT '60 seconds'
) RETURNS bigint
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'migration_takeover_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.migration_takeover(bigint, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.migration_takeover(bigint, interval) TO sheaf_admin;
CREATE FUNCTION "migration_repoint"(
	"execution_id" uuid,
	"home_shard" INT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'migration_repoint_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.migration_repoint(uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.migration_repoint(uuid, integer) TO sheaf_relay;
CREATE FUNCTION "migrations"(
	"open_only" bool DEFAULT true,
	"max_rows" INT DEFAULT 100
) RETURNS TABLE (
	"migration_id" bigint,
	"execution_id" uuid,
	"target_shard" INT,
	"phase" TEXT,
	"attempts" INT,
	"last_error" TEXT,
	"verified_event_seq" bigint,
	"bytes" bigint,
	"actor" TEXT,
	"login" TEXT,
	"created_at" timestamp with time zone,
	"updated_at" timestamp with time zone
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'migrations_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.migrations(boolean, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.migrations(boolean, integer) TO sheaf_admin;
CREATE FUNCTION "erase_payloads"(
	"execution_id" uuid
) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'erase_payloads_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.erase_payloads(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.erase_payloads(uuid) TO sheaf_admin;
CREATE FUNCTION "migration_seals"(
	"after_id" uuid DEFAULT NULL,
	"max_rows" INT DEFAULT 100
) RETURNS TABLE (
	"execution_id" uuid,
	"moved_to" INT,
	"seal" jsonb
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'migration_seals_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.migration_seals(uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.migration_seals(uuid, integer) TO sheaf_admin;
CREATE FUNCTION "migration_adopt_seal"(
	"seal" jsonb
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'migration_adopt_seal_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.migration_adopt_seal(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.migration_adopt_seal(jsonb) TO sheaf_admin;
CREATE FUNCTION "mutex_leave"(
	"key" TEXT,
	"owner" uuid
) RETURNS uuid
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'mutex_leave_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.mutex_leave(text, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.mutex_leave(text, uuid) TO sheaf_worker;
CREATE INDEX dead_letters_age ON @extschema@.dead_letters (dead_at, id);
CREATE FUNCTION "get_task"(
	"task_id" uuid
) RETURNS TABLE (
	"queue" TEXT,
	"kind" TEXT,
	"state" TEXT,
	"priority" INT,
	"attempts" INT,
	"max_attempts" INT,
	"run_at" timestamp with time zone,
	"enqueued_at" timestamp with time zone,
	"concurrency_key" TEXT,
	"lease_expires_at" timestamp with time zone,
	"last_error" TEXT,
	"execution_id" uuid,
	"payload" jsonb,
	"lease_owner" TEXT,
	"idempotency_key" TEXT,
	"fairness_key" TEXT,
	"dead_at" timestamp with time zone,
	"progress" jsonb
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'get_task_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.get_task(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.get_task(uuid) TO sheaf_worker;
CREATE FUNCTION "find_task"(
	"queue" TEXT,
	"idempotency_key" TEXT
) RETURNS uuid
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'find_task_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.find_task(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.find_task(text, text) TO sheaf_worker;
CREATE FUNCTION "list_tasks"(
	"queue" TEXT,
	"state" TEXT DEFAULT NULL,
	"after" jsonb DEFAULT NULL,
	"max_rows" INT DEFAULT 100
) RETURNS TABLE (
	"task_id" uuid,
	"kind" TEXT,
	"task_state" TEXT,
	"priority" INT,
	"attempts" INT,
	"max_attempts" INT,
	"run_at" timestamp with time zone,
	"enqueued_at" timestamp with time zone,
	"concurrency_key" TEXT,
	"lease_expires_at" timestamp with time zone,
	"last_error" TEXT,
	"execution_id" uuid,
	"progress" jsonb,
	"anchor" jsonb
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'list_tasks_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.list_tasks(text, text, jsonb, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.list_tasks(text, text, jsonb, integer) TO sheaf_worker;
CREATE FUNCTION "list_dead_letters"(
	"queue" TEXT DEFAULT NULL,
	"after" jsonb DEFAULT NULL,
	"max_rows" INT DEFAULT 100
) RETURNS TABLE (
	"task_id" uuid,
	"queue_name" TEXT,
	"kind" TEXT,
	"priority" INT,
	"attempts" INT,
	"max_attempts" INT,
	"execution_id" uuid,
	"concurrency_key" TEXT,
	"last_error" TEXT,
	"enqueued_at" timestamp with time zone,
	"dead_at" timestamp with time zone,
	"anchor" jsonb
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'list_dead_letters_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.list_dead_letters(text, jsonb, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.list_dead_letters(text, jsonb, integer) TO sheaf_worker;
CREATE FUNCTION "list_queues"() RETURNS TABLE (
	"queue" TEXT,
	"aging_secs" INT,
	"fairness" bool,
	"notify" bool,
	"created_at" timestamp with time zone,
	"ready" bigint,
	"scheduled" bigint,
	"running" bigint,
	"waiting" bigint,
	"paused" bigint,
	"dead" bigint,
	"oldest_ready_age" interval
)
STRICT STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'list_queues_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.list_queues() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.list_queues() TO sheaf_worker;
-- Cancellations of single tasks (sheaf.cancel_task). An unclaimed task
-- leaves at once (settled_at = cancelled_at). A running one stays, holding
-- its slot while its handler may still run, fenced out of its holder (its
-- token negated) until the holder hears of it (57000 from its next
-- heartbeat, complete, fail, snooze or set_progress) and gives it back with
-- sheaf.release, or its lease expires (the reaper): then it leaves and its
-- slot passes on. `token` is the holder's, so its later calls are told
-- "cancelled", not "lease lost". A settled row is kept for a week
-- (sheaf.maintain), so get_task can say what became of the task.
CREATE TABLE @extschema@.task_cancellations (
    task_id         uuid PRIMARY KEY,
    queue           text NOT NULL,
    execution_id    uuid,
    token           bigint,
    reason          text,
    cancelled_at    timestamptz NOT NULL DEFAULT now(),
    settled_at      timestamptz
);
REVOKE ALL ON @extschema@.task_cancellations FROM PUBLIC;
CREATE INDEX task_cancellations_settled ON @extschema@.task_cancellations (settled_at) WHERE settled_at IS NOT NULL;

-- A running task's progress as its handler last reported it
-- (sheaf.set_progress), beside the task and not in it: a report rewrites
-- this narrow row, never the task row the claim's indexes point at. Shown
-- by get_task and list_tasks; a row whose task is neither unfinished nor a
-- dead letter any more is deleted by sheaf.maintain.
CREATE TABLE @extschema@.task_progress (
    task_id         uuid PRIMARY KEY,
    progress        jsonb NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON @extschema@.task_progress FROM PUBLIC;

CREATE FUNCTION "cancel_task"(
	"task_id" uuid,
	"reason" TEXT DEFAULT NULL
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'cancel_task_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cancel_task(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.cancel_task(uuid, text) TO sheaf_admin;
CREATE FUNCTION "set_progress"(
	"task_id" uuid,
	"token" bigint,
	"progress" jsonb
) RETURNS void
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'set_progress_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.set_progress(uuid, bigint, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.set_progress(uuid, bigint, jsonb) TO sheaf_worker;
CREATE FUNCTION "purge_dead_letters"(
	"queue" TEXT,
	"older_than" interval
) RETURNS bigint
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'purge_dead_letters_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.purge_dead_letters(text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.purge_dead_letters(text, interval) TO sheaf_admin;
CREATE FUNCTION "redrive_queue"(
	"queue" TEXT,
	"older_than" interval DEFAULT NULL,
	"max_rows" INT DEFAULT 1000
) RETURNS INT
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'redrive_queue_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.redrive_queue(text, interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.redrive_queue(text, interval, integer) TO sheaf_admin;
CREATE FUNCTION "drop_queue"(
	"queue" TEXT,
	"force" bool DEFAULT false
) RETURNS bigint
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'drop_queue_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.drop_queue(text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.drop_queue(text, boolean) TO sheaf_admin;
ALTER TABLE @extschema@.executions ADD COLUMN result_pulled_at timestamptz;
CREATE INDEX executions_ended ON @extschema@.executions (closed_at)
    WHERE state IN ('COMPLETED', 'FAILED', 'CANCELLED', 'TERMINATED', 'TIMED_OUT', 'CONTINUED_AS_NEW');
CREATE INDEX executions_sealed ON @extschema@.executions (closed_at) WHERE state = 'MIGRATED';
CREATE INDEX usage_records_execution ON @extschema@.usage_records (execution_id);
CREATE INDEX migrations_execution ON @extschema@.migrations (execution_id);
CREATE TABLE @extschema@.retention (
    one             boolean PRIMARY KEY DEFAULT true CHECK (one),
    policy          jsonb NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON @extschema@.retention FROM PUBLIC;
ALTER TABLE @extschema@.queues ADD COLUMN idle_since timestamptz;
CREATE FUNCTION "set_retention"(
	"opts" jsonb
) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'set_retention_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.set_retention(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.set_retention(jsonb) TO sheaf_admin;
CREATE FUNCTION "retention"() RETURNS jsonb
STRICT STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'retention_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.retention() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.retention() TO sheaf_worker;
CREATE FUNCTION "relay_pulled"(
	"child_id" uuid
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'relay_pulled_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.relay_pulled(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.relay_pulled(uuid) TO sheaf_relay;
CREATE FUNCTION "seals_due"(
	"max_rows" INT DEFAULT 100
) RETURNS TABLE (
	"execution_id" uuid,
	"moved_to" INT
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'seals_due_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.seals_due(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.seals_due(integer) TO sheaf_relay;
CREATE FUNCTION "seal_run_ended"(
	"execution_id" uuid
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'seal_run_ended_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.seal_run_ended(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.seal_run_ended(uuid) TO sheaf_relay;

-- Execution timeouts, continue-as-new and signal-with-start.
ALTER TABLE @extschema@.executions ADD COLUMN timeout_at timestamptz;
ALTER TABLE @extschema@.executions ADD COLUMN staged_by text;
ALTER TABLE @extschema@.executions ADD COLUMN seal_released_at timestamptz;
CREATE INDEX executions_timeout ON @extschema@.executions (timeout_at)
    WHERE timeout_at IS NOT NULL AND state IN ('RUNNING', 'SUSPENDED', 'PAUSED');
CREATE FUNCTION "continue_as_new"(
	"execution_id" uuid,
	"input" jsonb
) RETURNS uuid
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'continue_as_new_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.continue_as_new(uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.continue_as_new(uuid, jsonb) TO sheaf_worker;
CREATE FUNCTION "complete_task_and_continue_as_new"(
	"task_id" uuid,
	"token" bigint,
	"input" jsonb
) RETURNS uuid
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'complete_task_and_continue_as_new_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.complete_task_and_continue_as_new(uuid, bigint, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.complete_task_and_continue_as_new(uuid, bigint, jsonb) TO sheaf_worker;
CREATE FUNCTION "signal_with_start"(
	"name" TEXT,
	"workflow_id" TEXT,
	"input" jsonb,
	"signal" TEXT,
	"payload" jsonb,
	"opts" jsonb DEFAULT '{}'
) RETURNS TABLE (
	"execution_id" uuid,
	"created" bool,
	"superseded" uuid[]
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'signal_with_start_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.signal_with_start(text, text, jsonb, text, jsonb, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.signal_with_start(text, text, jsonb, text, jsonb, jsonb) TO sheaf_worker;

-- Schedules (sheaf.create_schedule; sheaf_core::schedule parses the spec and
-- computes fire times). Fired by sheaf.maintain on the shard that holds them
-- (the driver creates them on the default shard), never inside a claim.
CREATE TABLE @extschema@.schedules (
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
CREATE INDEX schedules_due ON @extschema@.schedules (next_fire_at) WHERE NOT paused;
-- A fire time fires once however many sweeps look at it: its record is
-- unique, and written in the transaction that starts the fire's work.
CREATE TABLE @extschema@.schedule_fires (
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
CREATE INDEX schedule_fires_fired ON @extschema@.schedule_fires (fired_at);
REVOKE ALL ON @extschema@.schedules FROM PUBLIC;
REVOKE ALL ON @extschema@.schedule_fires FROM PUBLIC;
CREATE FUNCTION "create_schedule"(
	"name" TEXT,
	"spec" jsonb
) RETURNS timestamp with time zone
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'create_schedule_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.create_schedule(text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.create_schedule(text, jsonb) TO sheaf_admin;
CREATE FUNCTION "update_schedule"(
	"name" TEXT,
	"spec" jsonb
) RETURNS timestamp with time zone
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'update_schedule_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.update_schedule(text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.update_schedule(text, jsonb) TO sheaf_admin;
CREATE FUNCTION "pause_schedule"(
	"name" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'pause_schedule_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.pause_schedule(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.pause_schedule(text) TO sheaf_admin;
CREATE FUNCTION "resume_schedule"(
	"name" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'resume_schedule_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.resume_schedule(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.resume_schedule(text) TO sheaf_admin;
CREATE FUNCTION "delete_schedule"(
	"name" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'delete_schedule_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.delete_schedule(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.delete_schedule(text) TO sheaf_admin;
CREATE FUNCTION "trigger_schedule"(
	"name" TEXT
) RETURNS TABLE (
	"fire_at" timestamp with time zone,
	"outcome" TEXT,
	"execution_id" uuid,
	"task_id" uuid,
	"error" TEXT
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'trigger_schedule_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.trigger_schedule(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.trigger_schedule(text) TO sheaf_admin;
CREATE FUNCTION "list_schedules"() RETURNS TABLE (
	"name" TEXT,
	"spec" jsonb,
	"paused" bool,
	"next_fire_at" timestamp with time zone,
	"last_fire_at" timestamp with time zone,
	"last_outcome" TEXT,
	"last_error" TEXT,
	"fires" bigint,
	"skipped" bigint,
	"created_at" timestamp with time zone,
	"updated_at" timestamp with time zone
)
STRICT STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'list_schedules_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.list_schedules() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.list_schedules() TO sheaf_worker;
CREATE FUNCTION "schedule_fires"(
	"name" TEXT,
	"before" timestamp with time zone DEFAULT NULL,
	"max_rows" INT DEFAULT 100
) RETURNS TABLE (
	"fire_at" timestamp with time zone,
	"fired_at" timestamp with time zone,
	"outcome" TEXT,
	"execution_id" uuid,
	"task_id" uuid,
	"error" TEXT,
	"manual" bool
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'schedule_fires_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.schedule_fires(text, timestamp with time zone, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.schedule_fires(text, timestamp with time zone, integer) TO sheaf_worker;

-- Rate limits (sheaf.declare_rate_limit) and start throttles (a workflow
-- policy's throttle), sheaf_core::rate: a bucket per (name, key) holds its
-- theoretical arrival time (GCRA). A limited task or throttled start is
-- admitted at its bucket's time, scheduled until then; beyond a 30-second
-- lookahead it waits in its bucket's line (rate_waiting), scheduled at
-- infinity, until sheaf.maintain times it. The claim never reads these.
CREATE TABLE @extschema@.rate_limits (
    name            text PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 256),
    spec            jsonb NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
-- Pacing overrides (sheaf.set_rate_override): a rate limit's or a start
-- throttle's (workflow:<name>) pace until expires_at, on this shard's clock.
CREATE TABLE @extschema@.rate_overrides (
    name            text PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 266),
    rate            double precision NOT NULL CHECK (rate > 0),
    period          interval NOT NULL,
    expires_at      timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE @extschema@.rate_buckets (
    -- The rate limit, or workflow:<name> for a start throttle.
    name            text NOT NULL,
    -- The resolved key; '' for an unkeyed limit (and a task without its key).
    key             text NOT NULL,
    tat             timestamptz NOT NULL,
    -- When the head of its line may be admitted; NULL: no line.
    line_at         timestamptz,
    PRIMARY KEY (name, key)
);
CREATE INDEX rate_buckets_line ON @extschema@.rate_buckets (line_at) WHERE line_at IS NOT NULL;
CREATE TABLE @extschema@.rate_waiting (
    name            text NOT NULL,
    key             text NOT NULL,
    seq             bigint NOT NULL,
    task_id         uuid NOT NULL,
    PRIMARY KEY (name, key, seq)
);
CREATE SEQUENCE @extschema@.rate_seq;
REVOKE ALL ON @extschema@.rate_limits FROM PUBLIC;
REVOKE ALL ON @extschema@.rate_overrides FROM PUBLIC;
REVOKE ALL ON @extschema@.rate_buckets FROM PUBLIC;
REVOKE ALL ON @extschema@.rate_waiting FROM PUBLIC;
REVOKE ALL ON SEQUENCE @extschema@.rate_seq FROM PUBLIC;

-- Debounced starts (start_workflow opts debounce; workflow::debounce): the
-- pending start of (workflow, key), which later starts in its window join.
CREATE TABLE @extschema@.debounces (
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
CREATE INDEX debounces_until ON @extschema@.debounces (until);
CREATE INDEX debounces_execution ON @extschema@.debounces (execution_id);
REVOKE ALL ON @extschema@.debounces FROM PUBLIC;
CREATE FUNCTION "declare_rate_limit"(
	"name" TEXT,
	"spec" jsonb
) RETURNS jsonb
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'declare_rate_limit_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.declare_rate_limit(text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.declare_rate_limit(text, jsonb) TO sheaf_admin;
CREATE FUNCTION "set_rate_override"(
	"name" TEXT,
	"rate" double precision,
	"period" interval,
	"expires_at" timestamp with time zone
) RETURNS void
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'set_rate_override_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.set_rate_override(text, double precision, interval, timestamp with time zone) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.set_rate_override(text, double precision, interval, timestamp with time zone) TO sheaf_admin;
CREATE FUNCTION "clear_rate_override"(
	"name" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'clear_rate_override_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.clear_rate_override(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.clear_rate_override(text) TO sheaf_admin;
CREATE FUNCTION "rate_limits"() RETURNS TABLE (
	"name" TEXT,
	"spec" jsonb,
	"override_rate" double precision,
	"override_period" interval,
	"override_expires_at" timestamp with time zone,
	"buckets" bigint,
	"waiting" bigint
)
STRICT STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'rate_limits_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.rate_limits() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.rate_limits() TO sheaf_worker;
CREATE FUNCTION "audit_note"(
	"action" TEXT,
	"target" TEXT,
	"outcome" TEXT,
	"detail" jsonb DEFAULT '{}'
) RETURNS void
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'audit_note_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.audit_note(text, text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.audit_note(text, text, text, jsonb) TO sheaf_admin;
CREATE FUNCTION "pending_starts"(
	"name" TEXT DEFAULT NULL,
	"max_rows" INT DEFAULT 1000,
	"debounce_key" TEXT DEFAULT NULL
) RETURNS TABLE (
	"workflow_name" TEXT,
	"debounce_key" TEXT,
	"execution_id" uuid,
	"mode" TEXT,
	"window_ends_at" timestamp with time zone,
	"starts" bigint,
	"created_at" timestamp with time zone
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'pending_starts_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.pending_starts(text, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.pending_starts(text, integer, text) TO sheaf_worker;
CREATE FUNCTION "cancel_pending_start"(
	"name" TEXT,
	"debounce_key" TEXT,
	"reason" TEXT DEFAULT NULL
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'cancel_pending_start_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.cancel_pending_start(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.cancel_pending_start(text, text, text) TO sheaf_admin;
CREATE FUNCTION "complete_and_claim"(
	"queue" TEXT,
	"worker" TEXT,
	"task_ids" uuid[],
	"tokens" bigint[],
	"batch" INT DEFAULT 1,
	"lease" interval DEFAULT '30 seconds'
) RETURNS TABLE (
	"task_id" uuid,
	"completed" bool,
	"token" bigint,
	"payload" jsonb,
	"attempt" INT,
	"execution_id" uuid,
	"concurrency_key" TEXT,
	"kind" TEXT
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'complete_and_claim_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.complete_and_claim(text, text, uuid[], bigint[], integer, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.complete_and_claim(text, text, uuid[], bigint[], integer, interval) TO sheaf_worker;
