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
