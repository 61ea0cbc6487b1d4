//! The invariants: what the sampler checks while the soak runs, and what is
//! checked once everything has drained. Every count comes from the shard's
//! own tables (`tasks`, `dead_letters`, `events`, `executions`) against the
//! soak's record of what it enqueued and started.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use super::feed::{CAP, WORKFLOW};

/// Invariant violations found so far; the soak stops at the first.
#[derive(Default)]
pub struct Violations(Mutex<Vec<String>>);

impl Violations {
    pub fn push(&self, v: String) {
        eprintln!("VIOLATION: {v}");
        self.0.lock().unwrap().push(v);
    }
    pub fn any(&self) -> bool {
        !self.0.lock().unwrap().is_empty()
    }
    pub fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// Caps at this instant: running (and running + ready, which admission
/// bounds) per capped key never above the cap the soak set.
pub async fn caps(
    db: &tokio_postgres::Client,
    shard: u32,
    v: &Violations,
    peak: &AtomicI64,
) -> Result<(), tokio_postgres::Error> {
    let rows = db
        .query(
            "SELECT concurrency_key, running, ready FROM sheaf.concurrency_stats() WHERE concurrency_key LIKE 'soak-cap-%'",
            &[],
        )
        .await?;
    for row in rows {
        let (key, running, ready): (String, i64, i64) = (row.get(0), row.get(1), row.get(2));
        peak.fetch_max(running, Ordering::Relaxed);
        if running > CAP || running + ready > CAP {
            v.push(format!(
                "shard {shard}: key {key} has {running} running + {ready} ready, cap {CAP}"
            ));
        }
    }
    Ok(())
}

const OUTCOMES: &str = "('TaskCompleted', 'TaskDeadLettered')";
const TERMINALS: &str = "('WorkflowCompleted', 'WorkflowFailed', 'WorkflowCancelled', 'WorkflowTerminated', 'WorkflowTimedOut', 'WorkflowContinuedAsNew')";

/// Histories so far: no task's outcome recorded twice (a second completion
/// must have been refused), no execution ended twice.
pub async fn histories(
    db: &tokio_postgres::Client,
    shard: u32,
    v: &Violations,
) -> Result<(), tokio_postgres::Error> {
    let twice = db
        .query(
            &format!(
                "SELECT payload->>'task_id', count(*) FROM sheaf.events WHERE event_type IN {OUTCOMES} \
                 GROUP BY 1 HAVING count(*) > 1 LIMIT 5"
            ),
            &[],
        )
        .await?;
    for row in twice {
        let (task, n): (Option<String>, i64) = (row.get(0), row.get(1));
        v.push(format!(
            "shard {shard}: task {task:?} has {n} outcome events (completed or dead-lettered twice)"
        ));
    }
    let ended = db
        .query(
            &format!(
                "SELECT execution_id::text, count(*) FROM sheaf.events WHERE event_type IN {TERMINALS} \
                 GROUP BY 1 HAVING count(*) > 1 LIMIT 5"
            ),
            &[],
        )
        .await?;
    for row in ended {
        let (exec, n): (String, i64) = (row.get(0), row.get(1));
        v.push(format!("shard {shard}: execution {exec} ended {n} times"));
    }
    Ok(())
}

/// One shard's final figures, for the report.
#[derive(Debug, Default)]
pub struct ShardTotals {
    pub enqueued: i64,
    pub completed: i64,
    pub dead: i64,
    pub executions: i64,
}

/// The end state of one shard, after the drain.
pub async fn final_shard(db: &tokio_postgres::Client, shard: u32, v: &Violations) -> ShardTotals {
    let one = |sql: String| async move {
        let row = db
            .query_one(&sql, &[])
            .await
            .unwrap_or_else(|e| panic!("shard {shard}: {sql}: {e}"));
        row.get::<_, i64>(0)
    };
    let expect_zero = |what: &str, n: i64| {
        if n != 0 {
            v.push(format!("shard {shard}: {n} {what}"));
        }
    };
    expect_zero(
        "tasks left unfinished (ready, running, waiting or scheduled)",
        one("SELECT count(*) FROM sheaf.tasks".into()).await,
    );
    expect_zero(
        "dead letters of tasks that should have completed (not doomed/perm)",
        one("SELECT count(*) FROM soak.enqueued e JOIN sheaf.dead_letters d ON d.id = e.task_id WHERE e.t NOT IN ('doomed', 'perm')".into()).await,
    );
    expect_zero(
        "doomed/perm tasks not dead-lettered",
        one("SELECT count(*) FROM soak.enqueued e LEFT JOIN sheaf.dead_letters d ON d.id = e.task_id WHERE e.t IN ('doomed', 'perm') AND d.id IS NULL".into()).await,
    );
    expect_zero(
        "dead letters the soak never enqueued (a workflow task dead-lettered?)",
        one("SELECT count(*) FROM sheaf.dead_letters d LEFT JOIN soak.enqueued e ON e.task_id = d.id WHERE e.task_id IS NULL".into()).await,
    );
    expect_zero(
        "activities without exactly one outcome event (TaskCompleted or TaskDeadLettered)",
        one(format!(
            "WITH o AS (SELECT (payload->>'task_id')::uuid AS id, count(*) AS c FROM sheaf.events \
             WHERE event_type IN {OUTCOMES} GROUP BY 1) \
             SELECT count(*) FROM soak.enqueued e LEFT JOIN o ON o.id = e.task_id \
             WHERE e.t IN ('act', 'stale', 'dup') AND coalesce(o.c, 0) <> 1"
        ))
        .await,
    );
    final_executions(db, shard, v).await;
    final_probes(db, shard, v).await;
    ShardTotals {
        enqueued: one("SELECT count(*) FROM soak.enqueued".into()).await + one("SELECT count(*) FROM soak.started".into()).await,
        completed: one("SELECT count(*) FROM soak.enqueued e LEFT JOIN sheaf.dead_letters d ON d.id = e.task_id WHERE d.id IS NULL".into()).await
            + one("SELECT count(*) FROM sheaf.executions WHERE state = 'COMPLETED'".into()).await,
        dead: one("SELECT count(*) FROM sheaf.dead_letters".into()).await,
        executions: one("SELECT count(*) FROM soak.started".into()).await,
    }
}

/// Every started execution exists once, completed, with one terminal event.
async fn final_executions(db: &tokio_postgres::Client, shard: u32, v: &Violations) {
    let checks = [
        ("started executions missing on the shard", "SELECT count(*) FROM soak.started s LEFT JOIN sheaf.executions x ON x.id = s.execution_id WHERE x.id IS NULL".to_owned()),
        ("executions the soak never started", format!("SELECT count(*) FROM sheaf.executions x LEFT JOIN soak.started s ON s.execution_id = x.id WHERE s.execution_id IS NULL AND x.workflow_name = '{WORKFLOW}'")),
        ("executions not COMPLETED", "SELECT count(*) FROM sheaf.executions WHERE state <> 'COMPLETED'".to_owned()),
        ("executions without exactly one terminal event", format!(
            "WITH t AS (SELECT execution_id, count(*) AS c FROM sheaf.events WHERE event_type IN {TERMINALS} GROUP BY 1) \
             SELECT count(*) FROM sheaf.executions x LEFT JOIN t ON t.execution_id = x.id WHERE coalesce(t.c, 0) <> 1")),
    ];
    for (what, sql) in checks {
        let n: i64 = db
            .query_one(&sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0);
        if n != 0 {
            v.push(format!("shard {shard}: {n} {what}"));
        }
    }
}

/// A completion with a stale token was refused (55P03) every time.
async fn final_probes(db: &tokio_postgres::Client, shard: u32, v: &Violations) {
    let rows = db
        .query(
            "SELECT probe, outcome, count(*) FROM soak.probes GROUP BY 1, 2",
            &[],
        )
        .await
        .expect("probes");
    for row in rows {
        let (probe, outcome, n): (String, String, i64) = (row.get(0), row.get(1), row.get(2));
        eprintln!("shard {shard}: probe {probe}: {outcome} x{n}");
        if probe == "stale" && outcome != "55P03" {
            v.push(format!("shard {shard}: {n} completions with a stale token were answered {outcome}, not refused (55P03)"));
        }
    }
}

/// What the worker processes' logs say: task runs, and the mutex witness.
#[derive(Default)]
pub struct Logs {
    pub runs: HashMap<String, u32>,
    /// Per mutex key: (enter µs, end µs, token, pid).
    pub sections: BTreeMap<String, Vec<(u128, u128, i64, u32)>>,
}

/// Reads every `<pid>.log` in `dir`. A section with no `exit` ended when
/// its process did (`exits`: pid → when its exit was seen; still running:
/// open, and left out).
pub fn read_logs(dir: &str, exits: &HashMap<u32, u128>) -> Logs {
    let mut logs = Logs::default();
    for entry in std::fs::read_dir(dir).expect("soak dir").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_suffix(".log").and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let mut open: HashMap<String, (u128, i64)> = HashMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            match f.as_slice() {
                ["run", task, ..] => *logs.runs.entry((*task).to_owned()).or_default() += 1,
                ["enter", key, token, t] => {
                    open.insert(
                        format!("{key} {token}"),
                        (t.parse().unwrap_or(0), token.parse().unwrap_or(-1)),
                    );
                }
                ["exit", key, token, t, ..] => {
                    if let Some((enter, tok)) = open.remove(&format!("{key} {token}")) {
                        logs.sections.entry((*key).to_owned()).or_default().push((
                            enter,
                            t.parse().unwrap_or(0),
                            tok,
                            pid,
                        ));
                    }
                }
                _ => {}
            }
        }
        for (k, (enter, tok)) in open {
            if let Some(&end) = exits.get(&pid) {
                let key = k.split(' ').next().unwrap_or("").to_owned();
                logs.sections.entry(key).or_default().push((enter, end, tok, pid));
            }
        }
    }
    logs
}

/// The witness: per key, sections never overlap, and tokens grow with time.
pub fn witness(logs: &Logs, v: &Violations) -> usize {
    let mut sections = 0;
    for (key, list) in &logs.sections {
        let mut list = list.clone();
        list.sort();
        sections += list.len();
        for w in list.windows(2) {
            let ((e1, x1, t1, p1), (e2, _, t2, p2)) = (w[0], w[1]);
            if e2 < x1 {
                v.push(format!("mutex {key}: two holders at once: token {t1} (pid {p1}) held it until {x1} µs, token {t2} (pid {p2}) entered at {e2} µs"));
                return sections;
            }
            if t2 <= t1 {
                v.push(format!("mutex {key}: token {t2} (pid {p2}) entered after token {t1} (pid {p1}, entered {e1}): fencing tokens must grow"));
                return sections;
            }
        }
    }
    sections
}

/// Every task the shards record as enqueued ran at least once.
pub fn every_task_ran(logs: &Logs, enqueued: &HashSet<String>, v: &Violations) {
    let never: Vec<&String> = enqueued
        .iter()
        .filter(|id| !logs.runs.contains_key(*id))
        .take(5)
        .collect();
    if !never.is_empty() {
        v.push(format!(
            "tasks that finished without ever running a handler: {never:?}"
        ));
    }
}

/// What is left on a shard that did not drain, to say why: its tasks by
/// queue, state and kind (with the unclaimable ones among the ready: no
/// floor row of a band the claim seeks reaches them, see `ready_floors`),
/// its unfinished executions by state, the floors of the queues with ready
/// rows, the slots held, the mutexes, and the transactions open for long
/// (a held snapshot, or a wait).
pub async fn leftovers(db: &tokio_postgres::Client) -> Result<String, tokio_postgres::Error> {
    let row = db
        .query_one(
            "SELECT (SELECT string_agg(format('%s/%s/%s: %s (attempts up to %s, oldest %s s)', queue, state, t, n, a, age), \
                                       ', ' ORDER BY queue, state, t) \
                     FROM (SELECT queue, state, coalesce(payload->>'t', kind) t, count(*) n, max(attempts) a, \
                                  round(extract(epoch FROM now() - min(enqueued_at))) age \
                           FROM sheaf.tasks GROUP BY 1, 2, 3) t), \
                    (SELECT string_agg(format('%s: %s', queue, n), ', ' ORDER BY queue) \
                     FROM (SELECT r.queue, count(*) n FROM sheaf.ready r WHERE NOT EXISTS ( \
                             SELECT 1 FROM sheaf.ready_floors f WHERE f.queue = r.queue \
                               AND (CASE WHEN f.band < -1e14 THEN f.band = r.aging_band ELSE r.k1 <= f.band END) \
                               AND (f.k1, f.k2, f.seq) <= (r.k1, r.k2, r.seq)) GROUP BY 1) u), \
                    (SELECT string_agg(format('%s: %s', state, n), ', ' ORDER BY state) \
                     FROM (SELECT state, count(*) n FROM sheaf.executions \
                           WHERE state IN ('RUNNING', 'SUSPENDED', 'PAUSED') GROUP BY 1) e), \
                    (SELECT string_agg(format('%s %s %s%s:%s/%s/%s', queue, band, CASE WHEN base THEN 'base' ELSE 'low' END, \
                                              -ngen, k1, k2, seq), '; ' ORDER BY queue, band, ngen) \
                     FROM sheaf.ready_floors WHERE queue IN (SELECT queue FROM sheaf.ready)), \
                    (SELECT string_agg(format('%s: admitted %s of %s', l.key, s.admitted, l.max_running), ', ' ORDER BY l.key) \
                     FROM sheaf.concurrency_limits l JOIN sheaf.concurrency_slots s ON s.key = l.key WHERE s.admitted > 0), \
                    (SELECT count(*) FROM sheaf.tasks t WHERE t.state = 'ready' \
                       AND NOT EXISTS (SELECT 1 FROM sheaf.ready r WHERE r.task_id = t.id)), \
                    (SELECT count(*) FROM sheaf.ready r WHERE NOT EXISTS ( \
                       SELECT 1 FROM sheaf.tasks t WHERE t.id = r.task_id AND t.state = 'ready')), \
                    (SELECT string_agg(format('%s held (token %s, lease %s s left), %s waiting', l.key, l.token, \
                                              round(extract(epoch FROM l.lease_expires_at - now()), 1), \
                                              (SELECT count(*) FROM sheaf.mutex_waiters w WHERE w.key = l.key)), ', ' ORDER BY l.key) \
                     FROM sheaf.mutex_locks l), \
                    (SELECT string_agg(format('%s %s s, waiting on %s: %s', state, \
                                              round(extract(epoch FROM now() - xact_start)), \
                                              coalesce(wait_event_type || '/' || wait_event, 'nothing'), left(query, 80)), \
                                       '; ' ORDER BY xact_start) \
                     FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() \
                       AND xact_start < now() - interval '2 seconds')",
            &[],
        )
        .await?;
    let part = |i: usize| row.get::<_, Option<String>>(i).unwrap_or_else(|| "none".into());
    Ok(format!(
        "tasks {}; unclaimable ready rows {}; executions {}; floors {}; slots held {}; \
         ready tasks without a ready row {}; ready rows of no ready task {}; mutexes {}; \
         transactions open over 2 s {}",
        part(0),
        part(1),
        part(2),
        part(3),
        part(4),
        row.get::<_, i64>(5),
        row.get::<_, i64>(6),
        part(7),
        part(8)
    ))
}
