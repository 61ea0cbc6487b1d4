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
