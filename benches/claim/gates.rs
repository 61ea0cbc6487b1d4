//! The gates benchmark: what admission policies, quota checks and the durable
//! mutex cost.
//!
//! 1. `start_workflow` admissions/s with no policy, with a deferring
//!    concurrency gate plus a quota, and with `cancel_running` (limit 1)
//!    while every client starts on the same key.
//! 2. The quota check with 1 vs `history_events` events on the key: a start
//!    for tenant A (one event) against a start for tenant B (a huge history,
//!    bulk-inserted, counters recomputed). Flat is a B/A ratio near 1.
//! 3. Mutex acquire + release cycles/s: one client on its own key, then
//!    `contenders` clients on one key (waiters LISTEN on `sheaf_mutex` and
//!    re-acquire when woken, or after a short poll interval).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, Client, NoTls};
use uuid::Uuid;

use crate::connect;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const WF_PLAIN: &str = "bench_plain";
const WF_DEFER: &str = "bench_defer";
const WF_CANCEL: &str = "bench_cancel";
const WF_QUOTA: &str = "bench_quota";
/// Tenants of the deferring gate's key.
const TENANTS: usize = 100;
/// Large enough never to refuse during a run.
const HUGE: i64 = 1_000_000_000;
/// Events inserted per statement when building the big history.
const FILL_CHUNK: i64 = 250_000;
/// Untimed start + cancel cycles per tenant before the quota measurement.
const WARMUP: usize = 50;
/// A mutex waiter re-acquires after this long if no NOTIFY woke it.
const POLL_FALLBACK: Duration = Duration::from_millis(10);
/// A mutex waiter that waits this long for a grant fails the run.
const STUCK: Duration = Duration::from_secs(30);

/// What `gates` runs.
pub struct Opts {
    /// Measured window of each admission and mutex row; the quota rows get one each.
    pub window: Duration,
    /// Clients of the admission rows (all on one key for `cancel_running`).
    pub clients: usize,
    /// Events in tenant B's history.
    pub history_events: i64,
    /// Clients contending for one mutex key.
    pub contenders: usize,
}

/// Completed operations over a window, with per-operation latencies.
#[derive(Default)]
struct Sample {
    count: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Sample {
    fn rate(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64()
    }

    fn percentile_ms(&self, p: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        let mut v = self.latencies.clone();
        v.sort();
        let i = ((v.len() as f64 - 1.0) * p).round() as usize;
        v[i].as_secs_f64() * 1000.0
    }

    fn merge(&mut self, other: Sample) {
        self.count += other.count;
        self.elapsed += other.elapsed;
        self.latencies.extend(other.latencies);
    }
}

/// Deadlocks and serialization failures are retried, and counted.
fn retryable(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
    )
}

async fn reset(admin: &Client) -> Result<(), tokio_postgres::Error> {
    admin
        .batch_execute(
            "DROP EXTENSION IF EXISTS sheaf CASCADE; CREATE EXTENSION sheaf; SELECT sheaf.init_shard(0);",
        )
        .await
}

async fn declare(admin: &Client, name: &str, policy: Value) -> Result<(), tokio_postgres::Error> {
    admin
        .execute("SELECT sheaf.declare_workflow($1, $2::jsonb)", &[&name, &policy])
        .await?;
    Ok(())
}

pub async fn run(url: &str, admin: &Client, opts: &Opts) -> Result<(), Box<dyn std::error::Error>> {
    admissions(url, admin, opts).await?;
    quota_cost(url, admin, opts).await?;
    mutex(url, admin, opts).await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// 1. Admissions

/// What one admission run saw besides the sample.
#[derive(Default)]
struct AdmitExtras {
    superseded: i64,
    not_created: u64,
    retries: u64,
}

/// `clients` clients start workflows of `workflow` with fresh workflow ids
/// for `window`; `tenants` spreads `input.tenant` over that many values (None:
/// no tenant in the input).
async fn admit(
    url: &str,
    workflow: &'static str,
    tenants: Option<usize>,
    clients: usize,
    window: Duration,
) -> Result<(Sample, AdmitExtras), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let deadline = started + window;
    let mut handles = Vec::new();
    for c in 0..clients {
        let url = url.to_owned();
        handles.push(tokio::spawn(async move {
            let db = connect(&url).await?;
            let start = db
                .prepare(
                    "SELECT created, coalesce(cardinality(superseded), 0)::bigint \
                     FROM sheaf.start_workflow($1, $2, $3::jsonb)",
                )
                .await?;
            let mut sample = Sample::default();
            let mut extras = AdmitExtras::default();
            let mut i = c;
            loop {
                let workflow_id = format!("{workflow}-{c}-{i}");
                let input = match tenants {
                    Some(n) => json!({ "tenant": format!("t{}", i % n) }),
                    None => json!({}),
                };
                let t = Instant::now();
                match db.query_one(&start, &[&workflow, &workflow_id, &input]).await {
                    Ok(row) => {
                        sample.latencies.push(t.elapsed());
                        sample.count += 1;
                        if !row.get::<_, bool>(0) {
                            extras.not_created += 1;
                        }
                        extras.superseded += row.get::<_, i64>(1);
                        i += clients;
                    }
                    // Rolled back: the same workflow id is retried.
                    Err(e) if retryable(&e) => extras.retries += 1,
                    Err(e) => return Err(e),
                }
                if Instant::now() >= deadline {
                    break;
                }
            }
            Ok::<_, tokio_postgres::Error>((sample, extras))
        }));
    }
    let mut sample = Sample::default();
    let mut extras = AdmitExtras::default();
    for h in handles {
        let (s, x) = h.await??;
        sample.count += s.count;
        sample.latencies.extend(s.latencies);
        extras.superseded += x.superseded;
        extras.not_created += x.not_created;
        extras.retries += x.retries;
    }
    sample.elapsed = started.elapsed();
    Ok((sample, extras))
}

async fn admissions(url: &str, admin: &Client, opts: &Opts) -> Result<(), Box<dyn std::error::Error>> {
    reset(admin).await?;
    declare(admin, WF_PLAIN, json!({})).await?;
    declare(
        admin,
        WF_DEFER,
        json!({
            "concurrency": {"key": "input.tenant", "limit": 10, "on_conflict": "defer"},
            "quota": {"key": "input.tenant", "max_active_executions": HUGE},
        }),
    )
    .await?;
    declare(
        admin,
        WF_CANCEL,
        json!({"concurrency": {"key": "input.tenant", "limit": 1, "on_conflict": "cancel_running"}}),
    )
    .await?;

    println!(
        "start_workflow admissions: {} clients, {} s per row",
        opts.clients,
        opts.window.as_secs_f64()
    );
    println!(
        "{:<36} {:>9} {:>9} {:>9}  notes",
        "policy", "admits/s", "p50", "p99"
    );
    let rows: [(&str, &'static str, Option<usize>); 3] = [
        ("none (unique workflow ids)", WF_PLAIN, None),
        ("defer(10) + quota, 100 tenants", WF_DEFER, Some(TENANTS)),
        ("cancel_running(1), all on 1 key", WF_CANCEL, Some(1)),
    ];
    for (label, workflow, tenants) in rows {
        let (s, x) = admit(url, workflow, tenants, opts.clients, opts.window).await?;
        let mut notes = Vec::new();
        if workflow == WF_CANCEL {
            let active: i64 = admin
                .query_one(
                    "SELECT count(*) FROM sheaf.executions \
                     WHERE workflow_name = $1 AND state IN ('RUNNING', 'SUSPENDED', 'PAUSED')",
                    &[&workflow],
                )
                .await?
                .get(0);
            notes.push(format!("superseded {}, active after {active}", x.superseded));
        }
        if x.retries > 0 {
            notes.push(format!("retries {}", x.retries));
        }
        if x.not_created > 0 {
            notes.push(format!("NOT CREATED {}", x.not_created));
        }
        println!(
            "{:<36} {:>9.0} {:>7.2}ms {:>7.2}ms  {}",
            label,
            s.rate(),
            s.percentile_ms(0.5),
            s.percentile_ms(0.99),
            notes.join(", ")
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// 2. Quota check cost vs history size

/// Starts one execution of `WF_QUOTA` for `tenant` from the admin connection.
async fn start_one(admin: &Client, workflow_id: &str, tenant: &str) -> Result<Uuid, tokio_postgres::Error> {
    Ok(admin
        .query_one(
            "SELECT execution_id FROM sheaf.start_workflow($1, $2, $3::jsonb)",
            &[&WF_QUOTA, &workflow_id, &json!({ "tenant": tenant })],
        )
        .await?
        .get(0))
}

/// Bulk-inserts events into `exec`'s history until it holds `events`, then
/// makes the byte counters agree: the execution's `history_bytes`, then the
/// quota key's recount. Returns (events, quota key, active, history bytes).
async fn fill_history(
    admin: &Client,
    exec: Uuid,
    events: i64,
) -> Result<(i64, String, i64, i64), Box<dyn std::error::Error>> {
    let mut have: i64 = admin
        .query_one(
            "SELECT coalesce(max(seq), 0) FROM sheaf.events WHERE execution_id = $1",
            &[&exec],
        )
        .await?
        .get(0);
    while have < events {
        let n = (events - have).min(FILL_CHUNK);
        admin
            .execute(
                "INSERT INTO sheaf.events (execution_id, seq, event_type, payload, bytes) \
                 SELECT $1::uuid, s, 'BenchFiller', p, octet_length(p::text) \
                 FROM generate_series($2::bigint + 1, $2::bigint + $3::bigint) s, \
                      LATERAL (SELECT jsonb_build_object('step', s, 'note', 'bench filler') AS p) x",
                &[&exec, &have, &n],
            )
            .await?;
        have += n;
    }
    admin
        .execute(
            "UPDATE sheaf.executions \
             SET history_bytes = (SELECT coalesce(sum(bytes), 0) FROM sheaf.events WHERE execution_id = $1) \
             WHERE id = $1",
            &[&exec],
        )
        .await?;
    let key: Option<String> = admin
        .query_one("SELECT quota_key FROM sheaf.executions WHERE id = $1", &[&exec])
        .await?
        .get(0);
    let key = key.ok_or("the big execution has no quota key: input.tenant did not resolve")?;
    let usage = admin
        .query_one(
            "SELECT active_executions::bigint, history_bytes::bigint FROM sheaf.quota_recompute($1)",
            &[&key],
        )
        .await?;
    let count: i64 = admin
        .query_one(
            "SELECT count(*) FROM sheaf.events WHERE execution_id = $1",
            &[&exec],
        )
        .await?
        .get(0);
    Ok((count, key, usage.get(0), usage.get(1)))
}

/// One client, for `window`: start a fresh workflow for `tenant` (timed),
/// then cancel it (untimed, but inside the rate) so the active count stays flat.
async fn quota_cycles(
    url: &str,
    tenant: &str,
    window: Duration,
    tag: usize,
) -> Result<Sample, Box<dyn std::error::Error>> {
    let db = connect(url).await?;
    let start = db
        .prepare("SELECT execution_id FROM sheaf.start_workflow($1, $2, $3::jsonb)")
        .await?;
    let cancel = db
        .prepare("SELECT sheaf.cancel_execution($1, 'bench: quota cycle')")
        .await?;
    let input = json!({ "tenant": tenant });
    let mut sample = Sample::default();
    let mut i = 0usize;
    let mut measuring_from = None;
    loop {
        let workflow_id = format!("q-{tenant}-{tag}-{i}");
        i += 1;
        let t = Instant::now();
        let id: Uuid = match db.query_one(&start, &[&WF_QUOTA, &workflow_id, &input]).await {
            Ok(row) => row.get(0),
            Err(e) if retryable(&e) => continue,
            Err(e) => return Err(e.into()),
        };
        let lat = t.elapsed();
        db.execute(&cancel, &[&id]).await?;
        if i <= WARMUP {
            continue;
        }
        let from = *measuring_from.get_or_insert(t);
        sample.latencies.push(lat);
        sample.count += 1;
        if from.elapsed() >= window {
            sample.elapsed = from.elapsed();
            break;
        }
    }
    Ok(sample)
}

async fn quota_cost(url: &str, admin: &Client, opts: &Opts) -> Result<(), Box<dyn std::error::Error>> {
    reset(admin).await?;
    declare(
        admin,
        WF_QUOTA,
        json!({"quota": {
            "key": "input.tenant",
            "max_active_executions": HUGE,
            "max_history_bytes": HUGE * HUGE,
            "max_dead_letters": HUGE,
        }}),
    )
    .await?;
    let a = start_one(admin, "history-a", "A").await?;
    let b = start_one(admin, "history-b", "B").await?;
    let filling = Instant::now();
    let (a_events, _, _, a_bytes) = fill_history(admin, a, 1).await?;
    let (b_events, b_key, b_active, b_bytes) = fill_history(admin, b, opts.history_events).await?;
    admin
        .batch_execute("VACUUM ANALYZE sheaf.events, sheaf.executions")
        .await?;
    println!(
        "quota check vs history size: 1 client, start (timed) + cancel per admission, {} s per tenant \
         (history of B built in {:.1} s; key {b_key:?}: {b_active} active, {b_bytes} history bytes)",
        opts.window.as_secs_f64(),
        filling.elapsed().as_secs_f64()
    );
    println!(
        "{:<7} {:>14} {:>14} {:>9} {:>9} {:>9}",
        "tenant", "history events", "history bytes", "start p50", "p99", "admits/s"
    );
    // A and B alternate in half windows, so drift hits both alike.
    let half = opts.window / 2;
    let mut sa = Sample::default();
    let mut sb = Sample::default();
    for round in 0..2 {
        sa.merge(quota_cycles(url, "A", half, round).await?);
        sb.merge(quota_cycles(url, "B", half, round).await?);
    }
    for (tenant, events, bytes, s) in [("A", a_events, a_bytes, &sa), ("B", b_events, b_bytes, &sb)] {
        println!(
            "{:<7} {:>14} {:>14} {:>7.2}ms {:>7.2}ms {:>9.0}",
            tenant,
            events,
            bytes,
            s.percentile_ms(0.5),
            s.percentile_ms(0.99),
            s.rate()
        );
    }
    println!(
        "B / A: start p50 {:.2}x, p99 {:.2}x, admits/s {:.2}x (flat is ~1.0)",
        sb.percentile_ms(0.5) / sa.percentile_ms(0.5),
        sb.percentile_ms(0.99) / sa.percentile_ms(0.99),
        sb.rate() / sa.rate()
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// 3. The durable mutex

/// A connection whose notifications arrive on the returned channel (payloads).
async fn connect_listening(
    url: &str,
) -> Result<(Client, mpsc::UnboundedReceiver<String>), tokio_postgres::Error> {
    let (client, mut connection) = tokio_postgres::connect(url, NoTls).await?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(msg) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match msg {
                Ok(AsyncMessage::Notification(n)) => {
                    let _ = tx.send(n.payload().to_owned());
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    Ok((client, rx))
}

struct MutexStmts {
    acquire: tokio_postgres::Statement,
    release: tokio_postgres::Statement,
}

impl MutexStmts {
    async fn prepare(db: &Client) -> Result<MutexStmts, tokio_postgres::Error> {
        Ok(MutexStmts {
            acquire: db
                .prepare("SELECT granted, token, queue_position::int FROM sheaf.mutex_acquire($1, $2)")
                .await?,
            release: db.prepare("SELECT sheaf.mutex_release($1, $2, $3)").await?,
        })
    }

    /// (granted, token, queue position); deadlocks are retried.
    async fn acquire(
        &self,
        db: &Client,
        key: &str,
        owner: Uuid,
    ) -> Result<(bool, Option<i64>, i32), tokio_postgres::Error> {
        loop {
            match db.query_one(&self.acquire, &[&key, &owner]).await {
                Ok(row) => return Ok((row.get(0), row.get(1), row.get(2))),
                Err(e) if retryable(&e) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    async fn release(
        &self,
        db: &Client,
        key: &str,
        owner: Uuid,
        token: i64,
    ) -> Result<(), tokio_postgres::Error> {
        loop {
            match db.execute(&self.release, &[&key, &owner, &token]).await {
                Ok(_) => return Ok(()),
                Err(e) if retryable(&e) => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// One client on its own key: acquire (always granted) then release.
async fn mutex_solo(url: &str, window: Duration) -> Result<Sample, Box<dyn std::error::Error>> {
    let db = connect(url).await?;
    let stmts = MutexStmts::prepare(&db).await?;
    let owner = Uuid::new_v4();
    let key = "bench-solo";
    let mut sample = Sample::default();
    let started = Instant::now();
    while started.elapsed() < window {
        let t = Instant::now();
        let (granted, token, position) = stmts.acquire(&db, key, owner).await?;
        let token = match (granted, token) {
            (true, Some(token)) => token,
            _ => return Err(format!("uncontended acquire not granted (queue position {position})").into()),
        };
        stmts.release(&db, key, owner, token).await?;
        sample.latencies.push(t.elapsed());
        sample.count += 1;
    }
    sample.elapsed = started.elapsed();
    Ok(sample)
}

/// What the contenders saw besides grants and waits.
#[derive(Default)]
struct Contention {
    reacquires: u64,
    woken_by_notify: u64,
    woken_by_poll: u64,
}

/// `contenders` clients loop on one key: acquire; while not granted, wait
/// for our NOTIFY (or the poll interval) and acquire again; release. Grants
/// made before the deadline count; after it, each client finishes its wait
/// (a waiter cannot leave the FIFO) and releases, so the key ends free.
async fn mutex_contended(
    url: &str,
    contenders: usize,
    window: Duration,
) -> Result<(Sample, Contention), Box<dyn std::error::Error>> {
    let key = "bench-hot";
    let mut handles = Vec::new();
    // Connected and listening before the clock starts.
    let mut ready = Vec::new();
    for _ in 0..contenders {
        let (db, notes) = connect_listening(url).await?;
        db.batch_execute("LISTEN sheaf_mutex").await?;
        let stmts = MutexStmts::prepare(&db).await?;
        ready.push((db, notes, stmts));
    }
    let started = Instant::now();
    let deadline = started + window;
    for (db, mut notes, stmts) in ready {
        handles.push(tokio::spawn(async move {
            let owner = Uuid::new_v4();
            let me = owner.to_string();
            let mut sample = Sample::default();
            let mut seen = Contention::default();
            loop {
                let t = Instant::now();
                let (mut granted, mut token, _) = stmts.acquire(&db, key, owner).await?;
                while !granted {
                    if t.elapsed() > STUCK {
                        return Err::<_, BoxError>(
                            format!("waited over {} s for a grant of {key}", STUCK.as_secs()).into(),
                        );
                    }
                    let woken = tokio::time::timeout(POLL_FALLBACK, async {
                        while let Some(payload) = notes.recv().await {
                            if payload == me {
                                return true;
                            }
                        }
                        false
                    })
                    .await;
                    match woken {
                        Ok(true) => seen.woken_by_notify += 1,
                        _ => seen.woken_by_poll += 1,
                    }
                    seen.reacquires += 1;
                    (granted, token, _) = stmts.acquire(&db, key, owner).await?;
                }
                let granted_at = Instant::now();
                let token = token.ok_or("granted without a token")?;
                stmts.release(&db, key, owner, token).await?;
                if granted_at < deadline {
                    sample.latencies.push(granted_at - t);
                    sample.count += 1;
                }
                if Instant::now() >= deadline {
                    break;
                }
            }
            Ok((sample, seen))
        }));
    }
    let mut sample = Sample::default();
    let mut seen = Contention::default();
    for h in handles {
        let (s, c) = h.await?.map_err(|e| -> Box<dyn std::error::Error> { e })?;
        sample.count += s.count;
        sample.latencies.extend(s.latencies);
        seen.reacquires += c.reacquires;
        seen.woken_by_notify += c.woken_by_notify;
        seen.woken_by_poll += c.woken_by_poll;
    }
    sample.elapsed = window;
    Ok((sample, seen))
}

async fn mutex(url: &str, admin: &Client, opts: &Opts) -> Result<(), Box<dyn std::error::Error>> {
    reset(admin).await?;
    println!(
        "mutex acquire + release: {} s per row (solo: latency of acquire + release; \
         contended: from first acquire to grant)",
        opts.window.as_secs_f64()
    );
    println!(
        "{:<24} {:>9} {:>9} {:>9}  notes",
        "mutex", "cycles/s", "p50", "p99"
    );
    let solo = mutex_solo(url, opts.window).await?;
    println!(
        "{:<24} {:>9.0} {:>7.2}ms {:>7.2}ms",
        "1 client, own key",
        solo.rate(),
        solo.percentile_ms(0.5),
        solo.percentile_ms(0.99)
    );
    let (hot, seen) = mutex_contended(url, opts.contenders, opts.window).await?;
    // No row, or a row with neither holder nor waiters: the key ended free.
    let status = admin
        .query_opt(
            "SELECT holder IS NULL, coalesce(waiters, 0)::bigint FROM sheaf.mutex_status('bench-hot')",
            &[],
        )
        .await?;
    let after = match status {
        Some(row) if !(row.get::<_, bool>(0) && row.get::<_, i64>(1) == 0) => format!(
            "KEY NOT FREE after: holder {}, {} waiters",
            if row.get::<_, bool>(0) { "none" } else { "set" },
            row.get::<_, i64>(1)
        ),
        _ => "key free after".to_owned(),
    };
    let wakeups = seen.woken_by_notify + seen.woken_by_poll;
    println!(
        "{:<24} {:>9.0} {:>7.2}ms {:>7.2}ms  re-acquires/grant {:.2}, woken by NOTIFY {:.0}%, {after}",
        format!("{} contenders, 1 key", opts.contenders),
        hot.rate(),
        hot.percentile_ms(0.5),
        hot.percentile_ms(0.99),
        seen.reacquires as f64 / hot.count.max(1) as f64,
        if wakeups == 0 {
            100.0
        } else {
            seen.woken_by_notify as f64 * 100.0 / wakeups as f64
        },
    );
    println!("contended / solo: {:.2}x", hot.rate() / solo.rate());
    Ok(())
}
