-- What each call of a task's life costs in WAL and buffers, sheaf beside
-- the textbook queue (the harness's: one table, a partial index on pending
-- rows, acknowledged by DELETE), one task per call, each call its own
-- transaction; each figure the mean of :n calls after :n unmeasured ones.
-- EXPLAIN (ANALYZE, BUFFERS, WAL) counts what the call's statement did,
-- sheaf's own statements inside it included; planning and the commit
-- record are not counted.
--
--   psql -X -v n=200 -d <a shard database, as its owner> -f benches/budget/wal.sql
--
-- It works in queue 'budget-probe' and schema budget_probe, dropped at the
-- end. Results: docs/benchmarks.md.

\set ON_ERROR_STOP on
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS budget_probe CASCADE;
CREATE SCHEMA budget_probe;
CREATE TABLE budget_probe.jobs (id bigserial PRIMARY KEY, state text NOT NULL DEFAULT 'pending',
                                payload jsonb NOT NULL, locked_at timestamptz);
CREATE INDEX jobs_pending ON budget_probe.jobs (id) WHERE state = 'pending';
CREATE TABLE budget_probe.costs (system text, call text, wal_records numeric, wal_bytes numeric,
                                 hit numeric, dirtied numeric);

-- Runs `sql` under EXPLAIN and, when `measured`, keeps its top node's
-- counters as (system, call).
CREATE PROCEDURE budget_probe.cost(system text, call text, sql text, measured boolean)
LANGUAGE plpgsql AS $$
DECLARE
    plan jsonb;
BEGIN
    EXECUTE 'EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) ' || sql INTO plan;
    plan := plan -> 0 -> 'Plan';
    IF measured THEN
        INSERT INTO budget_probe.costs
        VALUES (system, call, (plan ->> 'WAL Records')::numeric, (plan ->> 'WAL Bytes')::numeric,
                (plan ->> 'Shared Hit Blocks')::numeric, (plan ->> 'Shared Dirtied Blocks')::numeric);
    END IF;
END $$;

-- The running probe task: id and token.
CREATE FUNCTION budget_probe.running(OUT id uuid, OUT token bigint) LANGUAGE sql AS $$
    SELECT id, token FROM sheaf.tasks WHERE queue = 'budget-probe' AND state = 'running'
$$;

CREATE PROCEDURE budget_probe.run(n int) LANGUAGE plpgsql AS $$
DECLARE
    t record;
    job bigint;
    m boolean;
BEGIN
    FOR i IN 1 .. 2 * n LOOP
        m := i > n;
        -- sheaf: enqueue, claim, heartbeat, snooze (0 s: ready again),
        -- claim, fail (retried now), claim, complete.
        CALL budget_probe.cost('sheaf', 'enqueue', $q$SELECT sheaf.enqueue('budget-probe', '{"n": 1}')$q$, m);
        COMMIT;
        CALL budget_probe.cost('sheaf', 'claim', $q$SELECT * FROM sheaf.claim('budget-probe', 'probe', 1)$q$, m);
        COMMIT;
        t := budget_probe.running();
        CALL budget_probe.cost('sheaf', 'heartbeat', format('SELECT sheaf.heartbeat(%L, %s)', t.id, t.token), m);
        COMMIT;
        CALL budget_probe.cost('sheaf', 'snooze (0 s)',
                               format($q$SELECT sheaf.snooze(%L, %s, '0 seconds')$q$, t.id, t.token), m);
        COMMIT;
        PERFORM * FROM sheaf.claim('budget-probe', 'probe', 1);
        COMMIT;
        t := budget_probe.running();
        CALL budget_probe.cost('sheaf', 'fail (retried now)',
                               format($q$SELECT * FROM sheaf.fail(%L, %s, 'again', '0 seconds')$q$, t.id, t.token), m);
        COMMIT;
        PERFORM * FROM sheaf.claim('budget-probe', 'probe', 1);
        COMMIT;
        t := budget_probe.running();
        CALL budget_probe.cost('sheaf', 'complete', format('SELECT sheaf.complete(%L, %s)', t.id, t.token), m);
        COMMIT;
        -- The textbook queue: enqueue, claim, complete.
        CALL budget_probe.cost('textbook', 'enqueue',
                               $q$INSERT INTO budget_probe.jobs (payload) VALUES ('{"n": 1}')$q$, m);
        COMMIT;
        CALL budget_probe.cost('textbook', 'claim', $q$UPDATE budget_probe.jobs SET state = 'running', locked_at = now()
            WHERE id IN (SELECT id FROM budget_probe.jobs WHERE state = 'pending' ORDER BY id LIMIT 1
                         FOR UPDATE SKIP LOCKED) RETURNING id$q$, m);
        COMMIT;
        SELECT j.id INTO job FROM budget_probe.jobs j WHERE state = 'running';
        CALL budget_probe.cost('textbook', 'complete', 'DELETE FROM budget_probe.jobs WHERE id = ' || job, m);
        COMMIT;
    END LOOP;
END $$;

CALL budget_probe.run(:n);

SELECT system, call, round(avg(wal_records), 1) AS wal_records, round(avg(wal_bytes)) AS wal_bytes,
       round(avg(hit), 1) AS buffers_hit, round(avg(dirtied), 1) AS buffers_dirtied
FROM budget_probe.costs GROUP BY system, call ORDER BY system, min(ctid);
DROP SCHEMA budget_probe CASCADE;
