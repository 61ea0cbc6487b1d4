-- Plans that never degrade into a scan.
--
-- The hot functions run prepared statements, and PostgreSQL switches them to a
-- generic plan after five runs. On a small table that plan reads the whole
-- table (a sequential scan is the cheapest way through 1,000 rows), and it
-- keeps doing so as the table grows until the next re-plan: a claim, a
-- completion or an enqueue would then cost O(rows). With sequential scans
-- priced out inside these functions, every statement they run seeks an
-- index, whatever the table's size. (The setting is scoped to the function
-- call; the caller's session is unchanged.) JIT goes off with it: before
-- PostgreSQL 18 a priced-out scan (a one-row table like shard_identity) costs
-- 1e10, far above jit_above_cost, and would compile every such statement.
ALTER FUNCTION @extschema@.enqueue(text, jsonb, jsonb) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION @extschema@.enqueue_batch(text, jsonb[], jsonb) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION @extschema@.claim(text, text, integer, interval) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION @extschema@.complete(uuid, bigint, jsonb) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION @extschema@.complete_batch(uuid[], bigint[]) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION @extschema@.fail(uuid, bigint, text, interval) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION @extschema@.release(uuid, bigint) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION @extschema@.heartbeat(uuid, bigint, interval) SET enable_seqscan = off SET jit = off;
