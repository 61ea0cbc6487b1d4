//! One worker process of the chaos soak (`tests/tests/chaos_soak.rs`): the
//! driver's `Worker` on queue `soak` of every shard in `SHEAF_SHARDS`, with
//! leases short enough to expire soon after the soak SIGKILLs it.
//!
//! It appends what it does to `$SOAK_DIR/<pid>.log`, one `write` per line
//! (O_APPEND, unbuffered: a SIGKILL loses nothing already written): `run`
//! for every handler run (a task may run twice after a crash; the checker
//! takes the shard's record for what finished), and `enter`/`exit` around
//! every critical section under a sheaf mutex, the witness the checker reads
//! for two holders at once. SIGTERM shuts it down gracefully.
//!
//! `SHEAF_SOAK_SABOTAGE` breaks it on purpose, to show the checker catches it:
//! `dup` writes a second `TaskCompleted` for a task (as if a second completion
//! had been accepted), `mutex` enters the critical section without the lock,
//! `cap` raises a key's cap on the shard behind the checker's back.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sheaf_driver::{
    Client, ClientError, EnqueueOptions, ExecutionId, LockOptions, MutexKey, OnShard, PoolOptions,
    TaskContext, TaskDone, TaskFailure, TaskKind, Topology, Worker, WorkerOptions,
};

/// The queue every soak task is on.
const QUEUE: &str = "soak";

struct Log(File);

impl Log {
    fn line(&self, line: String) {
        // One write per line: O_APPEND keeps lines whole, and nothing sits in
        // a user-space buffer a SIGKILL would throw away.
        let _ = (&self.0).write_all(format!("{line}\n").as_bytes());
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sabotage {
    None,
    Dup,
    Mutex,
    Cap,
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

fn retry(what: &str, e: impl std::fmt::Display) -> TaskFailure {
    TaskFailure::retryable(format!("{what}: {e}")).retry_in(Duration::from_millis(500))
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if let Err(e) = runtime.block_on(run()) {
        eprintln!("soak-worker: {e}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::var("SOAK_DIR")?;
    let name = std::env::var("SOAK_NAME")?;
    let sabotage = match std::env::var("SHEAF_SOAK_SABOTAGE").as_deref() {
        Ok("dup") => Sabotage::Dup,
        Ok("mutex") => Sabotage::Mutex,
        Ok("cap") => Sabotage::Cap,
        _ => Sabotage::None,
    };
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(format!("{dir}/{}.log", std::process::id()))?;
    let log = Arc::new(Log(file));
    // Short timeouts everywhere: a shard that is down must cost a call
    // seconds, never the soak's whole budget.
    let pools = PoolOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .acquire_timeout(Duration::from_secs(2))
        .query_timeout(Duration::from_secs(5))
        .breaker_threshold(3)
        .breaker_cooldown(Duration::from_secs(1));
    let client = Arc::new(Client::new(Topology::from_env()?, pools)?);
    let options = WorkerOptions::new(name, [QUEUE])
        .lease(Duration::from_secs(3))
        .concurrency(8)
        .batch(8)
        .idle_poll(Duration::from_millis(200))
        .maintain_every(Duration::from_secs(1))
        .drain_timeout(Duration::from_secs(3));
    let worker = Worker::start(client, options, move |ctx| handle(ctx, log.clone(), sabotage))?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    term.recv().await;
    let report = worker.shutdown().await;
    eprintln!("soak-worker {}: shut down: {report:?}", std::process::id());
    Ok(())
}

async fn handle(ctx: TaskContext, log: Arc<Log>, sabotage: Sabotage) -> Result<TaskDone, TaskFailure> {
    let task = ctx.task();
    let p: Value = task
        .payload
        .to_value()
        .map_err(|e| TaskFailure::permanent(e.to_string()))?;
    let t = p["t"].as_str().unwrap_or("?").to_owned();
    log.line(format!("run {} {} {t}", task.task_id, task.attempt));
    let fails = p["fails"].as_i64().unwrap_or(0);
    if task.kind == TaskKind::Workflow {
        return workflow(&ctx).await;
    }
    match t.as_str() {
        "flaky" | "act" if i64::from(task.attempt) <= fails => {
            Err(TaskFailure::retryable("flaky: fails its first attempts")
                .retry_in(Duration::from_millis(100)))
        }
        "doomed" => {
            Err(TaskFailure::retryable("doomed: fails every attempt").retry_in(Duration::from_millis(50)))
        }
        "perm" => Err(TaskFailure::permanent("perm: no retry can fix this")),
        "capped" => {
            if sabotage == Sabotage::Cap {
                let key = task.concurrency_key.clone().unwrap_or_default();
                let _ = ctx.client().admin().set_concurrency_limit(&key, Some(8)).await;
            }
            // Long enough that a key's line is saturated at the sampler's
            // instants: a cap that did not hold would show.
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(TaskDone::Complete(None))
        }
        "mutex" => critical_section(&ctx, &log, &p, sabotage).await,
        "stale" => stale_probe(&ctx).await,
        "dup" => dup_probe(&ctx, sabotage).await,
        _ => {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok(TaskDone::Complete(Some(json!({"t": t}).into())))
        }
    }
}

/// The workflow task: spawns the execution's activities once (recorded in
/// `soak.spawned` in the same transaction as the enqueue, so a rerun after a
/// crash spawns nothing), then ends the execution once its history holds an
/// outcome for every activity, and polls (snoozes) until then.
async fn workflow(ctx: &TaskContext) -> Result<TaskDone, TaskFailure> {
    let task = ctx.task();
    let exec = task
        .execution_id
        .ok_or_else(|| TaskFailure::permanent("a workflow task with no execution"))?;
    let input = task
        .payload
        .to_value()
        .map_err(|e| TaskFailure::permanent(e.to_string()))?;
    let acts = input["input"]["acts"].as_i64().unwrap_or(0);
    let n = input["input"]["n"].as_i64().unwrap_or(0);
    spawn_activities(ctx, exec, n, acts)
        .await
        .map_err(|e| retry("spawning activities", e))?;
    let page = ctx
        .client()
        .history(exec, 0, 1000)
        .await
        .map_err(|e| retry("history", e))?;
    let mut done = std::collections::BTreeSet::new();
    for event in &page.events {
        if matches!(event.event_type.as_str(), "TaskCompleted" | "TaskDeadLettered") {
            let payload = event.payload.to_value().unwrap_or(Value::Null);
            if payload["kind"] == "activity" {
                done.insert(payload["task_id"].as_str().unwrap_or("").to_owned());
            }
        }
    }
    if done.len() as i64 >= acts {
        Ok(TaskDone::CompleteExecution(
            json!({"activities": done.len()}).into(),
        ))
    } else {
        Ok(TaskDone::Snooze(Duration::from_millis(500)))
    }
}

async fn spawn_activities(
    ctx: &TaskContext,
    exec: ExecutionId,
    n: i64,
    acts: i64,
) -> Result<(), ClientError> {
    let shard = ctx.task().shard;
    let mut conn = ctx.client().shard_connection(shard).await?;
    let tx = conn.transaction().await?;
    let sql_error = |e: tokio_postgres::Error| ClientError::BadRequest(e.to_string());
    let fresh = tx
        .execute(
            "INSERT INTO soak.spawned (execution_id) VALUES ($1) ON CONFLICT DO NOTHING",
            &[&exec.as_uuid()],
        )
        .await
        .map_err(sql_error)?;
    if fresh == 1 {
        // One probe per execution in four: the second completion of a
        // stale token (`stale`) and of a current one (`dup`) must be refused.
        let kinds: Vec<String> = (0..acts)
            .map(|i| match (i, n % 4) {
                (0, 0) => "stale".to_owned(),
                (0, 1) => "dup".to_owned(),
                _ => "act".to_owned(),
            })
            .collect();
        let payloads: Vec<Value> = kinds
            .iter()
            .enumerate()
            .map(|(i, t)| json!({"t": t, "i": i, "fails": i64::from(i % 3 == 1)}))
            .collect();
        let on = OnShard::verify(&tx, shard).await?;
        let batch = on
            .enqueue_batch(
                QUEUE,
                payloads,
                EnqueueOptions::new().execution(exec).priority(10),
            )
            .await?;
        let ids: Vec<uuid::Uuid> = batch.task_ids.iter().map(|id| id.as_uuid()).collect();
        tx.execute(
            "INSERT INTO soak.enqueued (task_id, t) SELECT * FROM unnest($1::uuid[], $2::text[])",
            &[&ids, &kinds],
        )
        .await
        .map_err(sql_error)?;
    }
    tx.commit().await.map_err(sql_error)
}

/// A critical section under a sheaf mutex, bracketed by `enter`/`exit`
/// witness lines carrying the fencing token and the time.
async fn critical_section(
    ctx: &TaskContext,
    log: &Log,
    p: &Value,
    sabotage: Sabotage,
) -> Result<TaskDone, TaskFailure> {
    let key = format!("soak-mutex-{}", p["i"].as_i64().unwrap_or(0) % 4);
    if sabotage == Sabotage::Mutex {
        let section = Section::enter(log, &key, 0);
        tokio::time::sleep(Duration::from_millis(5)).await;
        drop(section);
        return Ok(TaskDone::Complete(None));
    }
    // A killed worker's place in a line lapses a third of the lease after
    // its last poll, and a grant handed to it before that passes on then.
    let options = LockOptions::new()
        .lease(Duration::from_secs(5))
        .poll(Duration::from_millis(20));
    let guard = match ctx
        .client()
        .try_lock(MutexKey::new(&key), options, Duration::from_secs(10))
        .await
    {
        Ok(Some(guard)) => guard,
        Ok(None) => return Err(retry("mutex", "no grant within 10 s")),
        Err(e) => return Err(retry("mutex", e)),
    };
    let section = Section::enter(log, &key, guard.token());
    tokio::time::sleep(Duration::from_millis(5)).await;
    drop(section);
    // A release that fails (the mutex's shard restarting) leaves the lock to
    // its lease: the next holder waits, never overlaps.
    let _ = guard.release().await;
    Ok(TaskDone::Complete(None))
}

/// A critical section in the witness: `enter` when made, `exit` when
/// dropped, also when the handler is aborted inside it (a lost task lease, a
/// shutdown), which ends the section as surely as leaving it does. Only a
/// SIGKILL leaves one open; the checker ends it when its process exited.
struct Section<'l> {
    log: &'l Log,
    key: String,
    token: i64,
}

impl<'l> Section<'l> {
    fn enter(log: &'l Log, key: &str, token: i64) -> Section<'l> {
        log.line(format!("enter {key} {token} {}", now_us()));
        Section {
            log,
            key: key.to_owned(),
            token,
        }
    }
}

impl Drop for Section<'_> {
    fn drop(&mut self) {
        self.log
            .line(format!("exit {} {} {}", self.key, self.token, now_us()));
    }
}

/// The first claim records its token and fails; a later one completes the
/// task with that stale token straight through SQL, which must be refused
/// (55P03), and records what the shard said.
async fn stale_probe(ctx: &TaskContext) -> Result<TaskDone, TaskFailure> {
    let task = ctx.task();
    let id = task.task_id.as_uuid();
    let conn = ctx
        .client()
        .shard_connection(task.shard)
        .await
        .map_err(|e| retry("probe", e))?;
    let recorded = conn
        .query_opt("SELECT token FROM soak.tokens WHERE task_id = $1", &[&id])
        .await
        .map_err(|e| retry("probe", e))?;
    let Some(row) = recorded else {
        conn.execute(
            "INSERT INTO soak.tokens (task_id, token) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&id, &task.token],
        )
        .await
        .map_err(|e| retry("probe", e))?;
        return Err(
            TaskFailure::retryable("stale probe: token recorded").retry_in(Duration::from_millis(100))
        );
    };
    let old: i64 = row.get(0);
    let outcome = match conn.execute("SELECT sheaf.complete($1, $2)", &[&id, &old]).await {
        Ok(_) => "accepted".to_owned(),
        Err(e) => e.code().map_or_else(|| e.to_string(), |c| c.code().to_owned()),
    };
    record_probe(&conn, id, "stale", &outcome).await?;
    Ok(TaskDone::Complete(Some(json!({"probe": "stale"}).into())))
}

/// Completes the task itself with its current token, then returns
/// `Complete`: the worker's own completion is the second one, and must be
/// refused, so the history keeps one `TaskCompleted`.
async fn dup_probe(ctx: &TaskContext, sabotage: Sabotage) -> Result<TaskDone, TaskFailure> {
    let task = ctx.task();
    let id = task.task_id.as_uuid();
    let conn = ctx
        .client()
        .shard_connection(task.shard)
        .await
        .map_err(|e| retry("probe", e))?;
    let first = json!({"probe": "dup"});
    let outcome = match conn
        .execute("SELECT sheaf.complete($1, $2, $3)", &[&id, &task.token, &first])
        .await
    {
        Ok(_) => "completed".to_owned(),
        Err(e) => e.code().map_or_else(|| e.to_string(), |c| c.code().to_owned()),
    };
    record_probe(&conn, id, "dup", &outcome).await?;
    if sabotage == Sabotage::Dup
        && let Some(exec) = task.execution_id
    {
        let fake = json!({"task_id": task.task_id.to_string(), "kind": "activity", "result": first});
        let _ = ctx.client().append_event(exec, "TaskCompleted", fake).await;
    }
    Ok(TaskDone::Complete(Some(first.into())))
}

async fn record_probe(
    conn: &tokio_postgres::Client,
    id: uuid::Uuid,
    probe: &str,
    outcome: &str,
) -> Result<(), TaskFailure> {
    conn.execute(
        "INSERT INTO soak.probes (task_id, probe, outcome) VALUES ($1, $2, $3)",
        &[&id, &probe, &outcome],
    )
    .await
    .map(|_| ())
    .map_err(|e| retry("probe", e))
}
