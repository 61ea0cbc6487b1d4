-- sheaf shard schema, version 0.1.0.
--
-- This file is the spec of what lives in every shard database. It is included
-- verbatim in the extension's install script (see extension/src/lib.rs). Until
-- the first tagged release it may change; after it, changes ship only as
-- sheaf--A--B.sql upgrade scripts beside it.
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
CREATE TABLE queues (
    name        text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 128),
    aging_secs  integer CHECK (aging_secs > 0),
    fairness    boolean NOT NULL DEFAULT false,
    notify      boolean NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (NOT (fairness AND aging_secs IS NOT NULL))
);

-- Every unfinished task. A task leaves this table when it completes or is
-- dead-lettered; the claim never reads it by scan, only by primary key.
CREATE TABLE tasks (
    id              uuid PRIMARY KEY,
    queue           text NOT NULL REFERENCES queues (name),
    kind            text NOT NULL DEFAULT 'activity' CHECK (kind IN ('activity', 'workflow')),
    payload         jsonb NOT NULL,
    priority        integer NOT NULL DEFAULT 0,
    state           text NOT NULL CHECK (state IN ('scheduled', 'waiting', 'ready', 'running')),
    seq             bigint NOT NULL,
    enqueued_at     timestamptz NOT NULL DEFAULT now(),
    run_at          timestamptz NOT NULL DEFAULT now(),
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts    integer NOT NULL DEFAULT 25 CHECK (max_attempts >= 1),
    execution_id    uuid,
    concurrency_key text CHECK (length(concurrency_key) BETWEEN 1 AND 256),
    fairness_key    text CHECK (length(fairness_key) BETWEEN 1 AND 256),
    fairness_weight double precision NOT NULL DEFAULT 1 CHECK (fairness_weight > 0),
    idempotency_key text CHECK (length(idempotency_key) BETWEEN 1 AND 256),
    lease_owner     text,
    lease_expires_at timestamptz,
    token           bigint,
    last_error      text
);
CREATE UNIQUE INDEX tasks_idempotency ON tasks (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX tasks_execution ON tasks (execution_id) WHERE execution_id IS NOT NULL;

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
    last_error      text,
    enqueued_at     timestamptz NOT NULL,
    dead_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_letters_queue ON dead_letters (queue, dead_at);

-- Live-worker registry: a worker is live while its heartbeat is recent.
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

CREATE TABLE executions (
    id              uuid PRIMARY KEY,
    workflow_name   text NOT NULL CHECK (length(workflow_name) BETWEEN 1 AND 256),
    workflow_id     text NOT NULL CHECK (length(workflow_id) BETWEEN 1 AND 256),
    state           text NOT NULL CHECK (state IN (
                        'RUNNING', 'SUSPENDED', 'PAUSED',
                        'COMPLETED', 'FAILED', 'CANCELLED', 'TERMINATED', 'TIMED_OUT',
                        'CONTINUED_AS_NEW', 'MIGRATING', 'MIGRATED')),
    parent_id       uuid,
    concurrency_key text,
    quota_key       text,
    search_attrs    jsonb NOT NULL DEFAULT '{}',
    history_bytes   bigint NOT NULL DEFAULT 0 CHECK (history_bytes >= 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    closed_at       timestamptz
);
-- Active uniqueness: one non-terminal (or MIGRATED) run per (name, workflow_id).
CREATE UNIQUE INDEX executions_active ON executions (workflow_name, workflow_id)
    WHERE state IN ('RUNNING', 'SUSPENDED', 'PAUSED', 'MIGRATING', 'MIGRATED');
CREATE INDEX executions_by_key ON executions (workflow_name, workflow_id, created_at DESC);

-- Append-only history. Never updated.
CREATE TABLE events (
    execution_id    uuid NOT NULL REFERENCES executions (id),
    seq             bigint NOT NULL,
    event_type      text NOT NULL CHECK (length(event_type) BETWEEN 1 AND 128),
    payload         jsonb NOT NULL DEFAULT '{}',
    bytes           integer NOT NULL CHECK (bytes >= 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (execution_id, seq)
);

-- Durable FIFO mutex: one holder per key, fenced by a token.
CREATE TABLE mutex_locks (
    key             text PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 256),
    holder          uuid NOT NULL,
    token           bigint NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    acquired_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE mutex_waiters (
    key             text NOT NULL,
    owner           uuid NOT NULL,
    position        bigint NOT NULL,
    enqueued_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key, owner)
);
CREATE UNIQUE INDEX mutex_waiters_fifo ON mutex_waiters (key, position);

-- Fencing tokens and enqueue order: sequences, never the clock.
CREATE SEQUENCE task_seq;
CREATE SEQUENCE fence_token;
