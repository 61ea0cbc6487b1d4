-- sheaf 0.2.0 -> 0.3.0: run by ALTER EXTENSION sheaf UPDATE on a shard
-- that runs 0.2.0.
--
-- Every change to the SQL surface after 0.2.0 goes into sql/schema.sql
-- (or the Rust functions) AND into this file, until 0.3.0 is released; then
-- this file is frozen. The upgrade test (scripts/upgrade-test) requires a
-- 0.2.0 shard updated by this file to match a fresh install of HEAD.
-- A changed function signature is DROP FUNCTION + CREATE FUNCTION here
-- (CREATE OR REPLACE with a new argument list adds a second function), and
-- a released C symbol keeps its argument and return types.

-- Placement (issue 37): the projections of the accepted topology digests
-- (see topology_projections in sql/schema.sql). A digest published before
-- this update has none: publish the topology again to place by it.
CREATE TABLE topology_projections (
    digest          text PRIMARY KEY CHECK (digest ~ '^sha256:[0-9a-f]{64}$'),
    projection      jsonb NOT NULL,
    published_at    timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON topology_projections FROM PUBLIC;

-- publish_topology takes the projection, and computes the digest from it
-- (0.2.0 took the digest alone). The 0.2.0 C symbol stays in the library
-- for a 0.2.0 catalog; this one is new.
DROP FUNCTION publish_topology(text, boolean);
CREATE FUNCTION "publish_topology"(
	"projection" jsonb,
	"keep_previous" bool DEFAULT true
) RETURNS TABLE (
	"digest" TEXT,
	"previous" TEXT
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'publish_topology_projection_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.publish_topology(jsonb, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.publish_topology(jsonb, boolean) TO sheaf_admin;

-- Who owns a start, a keyed task, a mutex key or an id, under the
-- published projection.
CREATE FUNCTION "place_start"(
	"name" TEXT,
	"workflow_id" TEXT,
	"opts" jsonb DEFAULT '{}'
) RETURNS INT
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'place_start_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.place_start(text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.place_start(text, text, jsonb) TO sheaf_worker;
CREATE FUNCTION "place_task"(
	"queue" TEXT,
	"opts" jsonb DEFAULT '{}'
) RETURNS INT
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'place_task_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.place_task(text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.place_task(text, jsonb) TO sheaf_worker;
CREATE FUNCTION "place_mutex"(
	"mutex_key" TEXT
) RETURNS INT
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'place_mutex_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.place_mutex(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.place_mutex(text) TO sheaf_worker;
CREATE FUNCTION "locate_id"(
	"id" uuid
) RETURNS INT
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'locate_id_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.locate_id(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.locate_id(uuid) TO sheaf_worker;

-- How an application's start placed each run from now on (see
-- executions.placement in sql/schema.sql); runs started before keep NULL.
ALTER TABLE executions ADD COLUMN placement jsonb;

-- The accepted projections, for any client to route by; the live runs the
-- published topology places on another shard.
CREATE FUNCTION "topology_projections"() RETURNS TABLE (
	"digest" TEXT,
	"accepted_as" TEXT,
	"projection" jsonb,
	"published_at" timestamp with time zone
)
STRICT STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'topology_projections_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.topology_projections() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.topology_projections() TO sheaf_worker;
CREATE FUNCTION "misplaced_runs"(
	"max_rows" INT DEFAULT 100
) RETURNS TABLE (
	"execution_id" uuid,
	"workflow_name" TEXT,
	"workflow_id" TEXT,
	"owner_shard" INT,
	"placement" jsonb,
	"created_at" timestamp with time zone
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'misplaced_runs_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.misplaced_runs(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.misplaced_runs(integer) TO sheaf_worker;

-- The operator's view of the mutexes (issue 38): the stored locks by key,
-- keyset paged, with their live waiters counted.
CREATE FUNCTION "list_mutexes"(
	"after" TEXT DEFAULT NULL,
	"max_rows" INT DEFAULT 100
) RETURNS TABLE (
	"key" TEXT,
	"holder" uuid,
	"token" bigint,
	"acquired_at" timestamp with time zone,
	"lease_expires_at" timestamp with time zone,
	"waiters" INT
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'list_mutexes_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.list_mutexes(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.list_mutexes(text, integer) TO sheaf_worker;

-- get_task says when a running task's attempt was claimed (started_at).
-- The 0.2.0 C symbol stays in the library for a 0.2.0 catalog; this one
-- is new.
DROP FUNCTION get_task(uuid);
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
	"progress" jsonb,
	"started_at" timestamp with time zone
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'get_task_started_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.get_task(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.get_task(uuid) TO sheaf_worker;

-- Executions counted by state, each count bounded (the dashboard's counts).
CREATE FUNCTION "count_executions"(
	"filter" jsonb DEFAULT '{}',
	"cap" INT DEFAULT 10000
) RETURNS TABLE (
	"state" TEXT,
	"count" bigint,
	"capped" bool
)
STABLE SECURITY DEFINER PARALLEL SAFE
SET search_path TO @extschema@, pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'count_executions_wrapper';
REVOKE EXECUTE ON FUNCTION @extschema@.count_executions(jsonb, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.count_executions(jsonb, integer) TO sheaf_worker;
