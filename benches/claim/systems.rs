//! The two queues under test, driven by the same workload: sheaf, and the
//! textbook `FOR UPDATE SKIP LOCKED` queue (one table, a partial index on
//! pending rows, completion by UPDATE), in the same database.

use tokio_postgres::Client;

use crate::Mode;

pub const QUEUES: usize = 64;
pub const HOT_ROWS: i64 = 100_000;
pub const FUTURE_ROWS: i64 = 1_000_000;
pub const FAIR_KEYS: i64 = 5_000;
/// Keys of `Mode::Capped`, each capped at `CAPPED_MAX`, which no backlog
/// here reaches.
pub const CAPPED_KEYS: i64 = 4;
pub const CAPPED_MAX: i32 = 10_000_000;

/// The capped key of the `i`-th task of `Mode::Capped`.
pub fn capped_key(i: i64) -> String {
    format!("c{}", i % CAPPED_KEYS)
}
const CHUNK: i64 = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum System {
    Sheaf,
    Textbook,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::Sheaf => "sheaf",
            System::Textbook => "textbook",
        }
    }
}

pub fn queue_name(mode: Mode, i: usize) -> String {
    match mode {
        Mode::Queues64 => format!("bench-{}", i % QUEUES),
        _ => "bench".to_owned(),
    }
}

/// Drops both queues' state and sets up `mode` with its fixed extras (the
/// saturated key's 100K rows, the 1M future rows), divided by `shrink`.
pub async fn reset(db: &Client, mode: Mode, shrink: i64) -> Result<(), tokio_postgres::Error> {
    let hot_rows = HOT_ROWS / shrink;
    let future_rows = FUTURE_ROWS / shrink;
    db.batch_execute(
        "DROP EXTENSION IF EXISTS sheaf CASCADE; CREATE EXTENSION sheaf; SELECT sheaf.init_shard(0);
         DROP SCHEMA IF EXISTS textbook CASCADE; CREATE SCHEMA textbook;
         CREATE TABLE textbook.jobs (
             id bigserial PRIMARY KEY, queue text NOT NULL, priority int NOT NULL DEFAULT 0,
             payload jsonb NOT NULL, state text NOT NULL DEFAULT 'pending',
             run_at timestamptz NOT NULL DEFAULT now(), created_at timestamptz NOT NULL DEFAULT now(),
             ckey text, fkey text, locked_by text, locked_at timestamptz);
         CREATE INDEX jobs_pending ON textbook.jobs (queue, priority DESC, run_at, id) WHERE state = 'pending';
         CREATE INDEX jobs_running_key ON textbook.jobs (ckey) WHERE state = 'running';
         CREATE INDEX jobs_running_fkey ON textbook.jobs (fkey) WHERE state = 'running';",
    )
    .await?;
    match mode {
        Mode::Aging => {
            db.batch_execute("SELECT sheaf.configure_queue('bench', '{\"aging_secs\": 60}')")
                .await?;
        }
        Mode::Fairness => {
            db.batch_execute("SELECT sheaf.configure_queue('bench', '{\"fairness\": true}')")
                .await?;
        }
        Mode::Saturated => {
            db.batch_execute("SELECT sheaf.set_concurrency_limit('hot', 1)")
                .await?;
            for _ in 0..(hot_rows + CHUNK - 1) / CHUNK {
                db.execute(
                    "SELECT count(*) FROM sheaf.enqueue_batch('bench', array_fill('{}'::jsonb, ARRAY[$1::int]), \
                     '{\"concurrency_key\": \"hot\", \"priority\": 10}')",
                    &[&(CHUNK.min(hot_rows) as i32)],
                )
                .await?;
            }
            db.execute(
                "INSERT INTO textbook.jobs (queue, priority, payload, ckey) \
                 SELECT 'bench', 10, '{}', 'hot' FROM generate_series(1, $1::bigint)",
                &[&hot_rows],
            )
            .await?;
        }
        Mode::Capped => {
            for k in 0..CAPPED_KEYS {
                db.execute(
                    "SELECT sheaf.set_concurrency_limit($1, $2)",
                    &[&capped_key(k), &CAPPED_MAX],
                )
                .await?;
            }
        }
        Mode::Future => {
            for i in 0..(future_rows + CHUNK - 1) / CHUNK {
                db.execute(
                    "SELECT count(*) FROM sheaf.enqueue_batch('bench', array_fill('{}'::jsonb, ARRAY[$1::int]), \
                     jsonb_build_object('run_at', '2999-01-01T00:00:00Z', 'priority', $2::int))",
                    &[&(CHUNK.min(future_rows) as i32), &((i % 4) as i32)],
                )
                .await?;
            }
            db.execute(
                "INSERT INTO textbook.jobs (queue, priority, payload, run_at) \
                 SELECT 'bench', i % 4, '{}', '2999-01-01' FROM generate_series(1, $1::bigint) i",
                &[&future_rows],
            )
            .await?;
        }
        Mode::Plain | Mode::Queues64 => {}
    }
    Ok(())
}

/// Adds `n` pending, due rows to both queues, spread like the workload.
pub async fn fill(db: &Client, mode: Mode, n: i64) -> Result<(), tokio_postgres::Error> {
    let mut left = n;
    let mut chunk_no: i64 = 0;
    while left > 0 {
        let size = left.min(CHUNK);
        match mode {
            Mode::Fairness => {
                // Every fairness key gets its share of the chunk.
                let per_key = (size / FAIR_KEYS).max(1);
                let keys = (size / per_key).min(FAIR_KEYS);
                db.execute(
                    "SELECT count(*) FROM generate_series(1, $1::int) k, \
                     LATERAL sheaf.enqueue_batch('bench', array_fill('{}'::jsonb, ARRAY[$2::int]), \
                                                 jsonb_build_object('fairness_key', 'f' || k))",
                    &[&(keys as i32), &(per_key as i32)],
                )
                .await?;
            }
            _ => {
                let queues = if mode == Mode::Queues64 { QUEUES as i64 } else { 1 };
                let per_queue = (size / queues).max(1);
                for q in 0..queues.min(size) {
                    let ckey = (mode == Mode::Capped).then(|| capped_key(chunk_no + q));
                    db.execute(
                        "SELECT count(*) FROM sheaf.enqueue_batch($1, array_fill('{}'::jsonb, ARRAY[$2::int]), \
                         jsonb_strip_nulls(jsonb_build_object('priority', $3::int, 'concurrency_key', $4::text)))",
                        &[
                            &queue_name(mode, q as usize),
                            &(per_queue as i32),
                            &(((chunk_no + q) % 4) as i32),
                            &ckey,
                        ],
                    )
                    .await?;
                }
            }
        }
        let queues = if mode == Mode::Queues64 { QUEUES as i64 } else { 1 };
        db.execute(
            "INSERT INTO textbook.jobs (queue, priority, payload, fkey, ckey) \
             SELECT CASE WHEN $2::bigint > 1 THEN 'bench-' || (i % $2::bigint) ELSE 'bench' END, i % 4, '{}', 'f' || (i % $3::bigint), \
                    CASE WHEN $4 THEN 'c' || (i % $5::bigint) END \
             FROM generate_series(1, $1::bigint) i",
            &[&size, &queues, &FAIR_KEYS, &(mode == Mode::Capped), &CAPPED_KEYS],
        )
        .await?;
        left -= size;
        chunk_no += 1;
    }
    // A checkpoint now, so the fill's dirty pages are written before the
    // measured windows rather than during one of them.
    db.batch_execute("VACUUM ANALYZE sheaf.tasks, sheaf.ready, textbook.jobs")
        .await?;
    db.batch_execute("CHECKPOINT").await?;
    Ok(())
}

/// Prepared statements for one client of one system in one mode.
#[derive(Clone)]
pub struct Ops {
    system: System,
    enqueue: tokio_postgres::Statement,
    claim: tokio_postgres::Statement,
    complete: tokio_postgres::Statement,
    complete_batch: tokio_postgres::Statement,
}

impl Ops {
    pub async fn prepare(db: &Client, system: System, mode: Mode) -> Result<Ops, tokio_postgres::Error> {
        let (enqueue, claim, complete, complete_batch) = match system {
            System::Sheaf => (
                "SELECT sheaf.enqueue($1, '{}', jsonb_strip_nulls(jsonb_build_object('priority', $2::int, \
                 'fairness_key', $3::text, 'concurrency_key', $4::text)))",
                "SELECT task_id::text, token FROM sheaf.claim($1, 'bench', $2)",
                "SELECT sheaf.complete($1::text::uuid, $2)",
                "SELECT count(*) FROM sheaf.complete_batch($1::text[]::uuid[], $2) WHERE completed",
            ),
            System::Textbook => (
                "INSERT INTO textbook.jobs (queue, priority, payload, fkey, ckey) VALUES ($1, $2, '{}', $3, $4)",
                textbook_claim(mode),
                "UPDATE textbook.jobs SET state = 'done' WHERE id = $1::text::bigint AND $2::bigint = 0",
                "WITH d AS (UPDATE textbook.jobs SET state = 'done' \
                 WHERE id = ANY($1::text[]::bigint[]) AND cardinality($2::bigint[]) >= 0 RETURNING 1) \
                 SELECT count(*) FROM d",
            ),
        };
        Ok(Ops {
            system,
            enqueue: db.prepare(enqueue).await?,
            claim: db.prepare(claim).await?,
            complete: db.prepare(complete).await?,
            complete_batch: db.prepare(complete_batch).await?,
        })
    }

    pub async fn enqueue(
        &self,
        db: &Client,
        queue: &str,
        priority: i32,
        fairness_key: Option<&str>,
        concurrency_key: Option<&str>,
    ) -> Result<(), tokio_postgres::Error> {
        db.execute(
            &self.enqueue,
            &[&queue, &priority, &fairness_key, &concurrency_key],
        )
        .await?;
        Ok(())
    }

    /// Claims up to `batch`; returns (id, token) pairs.
    pub async fn claim(
        &self,
        db: &Client,
        queue: &str,
        batch: i32,
    ) -> Result<Vec<(String, i64)>, tokio_postgres::Error> {
        let rows = match self.system {
            System::Sheaf => db.query(&self.claim, &[&queue, &batch]).await?,
            System::Textbook => db.query(&self.claim, &[&queue, &(batch as i64)]).await?,
        };
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    pub async fn complete(&self, db: &Client, task: &(String, i64)) -> Result<(), tokio_postgres::Error> {
        db.execute(&self.complete, &[&task.0, &task.1]).await?;
        Ok(())
    }

    pub async fn complete_batch(
        &self,
        db: &Client,
        tasks: &[(String, i64)],
    ) -> Result<i64, tokio_postgres::Error> {
        let ids: Vec<&str> = tasks.iter().map(|t| t.0.as_str()).collect();
        let tokens: Vec<i64> = tasks.iter().map(|t| t.1).collect();
        Ok(db.query_one(&self.complete_batch, &[&ids, &tokens]).await?.get(0))
    }
}

/// The textbook claim of each mode: how a plain SKIP LOCKED queue gates on a
/// cap, ages priorities and interleaves fairness keys, computed at claim time.
fn textbook_claim(mode: Mode) -> &'static str {
    match mode {
        Mode::Plain | Mode::Queues64 | Mode::Future => {
            "UPDATE textbook.jobs SET state = 'running', locked_by = 'bench', locked_at = now() \
             WHERE id IN (SELECT id FROM textbook.jobs WHERE queue = $1 AND state = 'pending' AND run_at <= now() \
                          ORDER BY priority DESC, run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED) \
             RETURNING id::text, 0::bigint"
        }
        Mode::Saturated => {
            "UPDATE textbook.jobs SET state = 'running', locked_by = 'bench', locked_at = now() \
             WHERE id IN (SELECT id FROM textbook.jobs j WHERE queue = $1 AND state = 'pending' AND run_at <= now() \
                            AND (ckey IS NULL OR (SELECT count(*) FROM textbook.jobs r \
                                                  WHERE r.ckey = j.ckey AND r.state = 'running') < 1) \
                          ORDER BY priority DESC, run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED) \
             RETURNING id::text, 0::bigint"
        }
        Mode::Capped => {
            // Saturated's gate, at CAPPED_MAX.
            "UPDATE textbook.jobs SET state = 'running', locked_by = 'bench', locked_at = now() \
             WHERE id IN (SELECT id FROM textbook.jobs j WHERE queue = $1 AND state = 'pending' AND run_at <= now() \
                            AND (ckey IS NULL OR (SELECT count(*) FROM textbook.jobs r \
                                                  WHERE r.ckey = j.ckey AND r.state = 'running') < 10000000) \
                          ORDER BY priority DESC, run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED) \
             RETURNING id::text, 0::bigint"
        }
        Mode::Aging => {
            "UPDATE textbook.jobs SET state = 'running', locked_by = 'bench', locked_at = now() \
             WHERE id IN (SELECT id FROM textbook.jobs WHERE queue = $1 AND state = 'pending' AND run_at <= now() \
                          ORDER BY priority + extract(epoch FROM now() - created_at) / 60 DESC, id \
                          LIMIT $2 FOR UPDATE SKIP LOCKED) \
             RETURNING id::text, 0::bigint"
        }
        Mode::Fairness => {
            // Round-robin over keys: each key's n-th pending task ranks n.
            "UPDATE textbook.jobs SET state = 'running', locked_by = 'bench', locked_at = now() \
             WHERE id IN (SELECT id FROM textbook.jobs WHERE state = 'pending' AND id IN ( \
                            SELECT id FROM (SELECT id, row_number() OVER (PARTITION BY fkey ORDER BY id) AS rn \
                                            FROM textbook.jobs WHERE queue = $1 AND state = 'pending' \
                                              AND run_at <= now()) ranked \
                            ORDER BY rn, id LIMIT $2::bigint * 16) \
                          LIMIT $2 FOR UPDATE SKIP LOCKED) \
             RETURNING id::text, 0::bigint"
        }
    }
}
