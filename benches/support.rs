//! What the fleet benchmarks share (`#[path]`-included by each binary):
//! their own release shards, the executions fill, and percentiles.

use std::process::Command;

use tokio_postgres::NoTls;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Brings up `count` shards of PostgreSQL `pg` with a release build of the
/// extension (`scripts/shards up --release`) under `dir`, on ports from
/// `port`; their `SHEAF_SHARDS` entries, one per line.
#[allow(
    dead_code,
    reason = "width-bench makes its shards as databases of bare clusters"
)]
pub fn release_shards(count: u32, pg: u32, dir: &str, port: u32) -> Result<String, Error> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(root.join("scripts/shards"))
        .args([
            "up",
            "--count",
            &count.to_string(),
            "--release",
            "--pg",
            &pg.to_string(),
        ])
        .args(["--dir", dir, "--base-port", &port.to_string()])
        .output()?;
    if !out.status.success() {
        return Err(format!("scripts/shards: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// Fills the shard at `url` with `per_shard` executions created over the
/// last 60 days (workflows `bench-0` to `bench-4`, 100 tenants, 1% with
/// `rare`, 5% FAILED) and their usage events, each written with one
/// `INSERT … SELECT` (a start through `start_workflow` would take hours).
/// A shard that already holds exactly `per_shard` of them is left as it is;
/// otherwise its executions and events are truncated first.
#[allow(
    dead_code,
    reason = "fanout-bench and ui-bench fill; the other benches include this file too"
)]
pub async fn fill(url: &str, per_shard: u32) -> Result<(), Error> {
    const FILL: &str = "\
INSERT INTO sheaf.executions (id, workflow_name, workflow_id, state, seq, queue, input, search_attrs, \
                              created_at, closed_at, last_event_seq) \
SELECT sheaf.new_id(), 'bench-' || (g % 5), 'b-' || g, s.state, nextval('sheaf.execution_seq'), 'default', '{}', \
       jsonb_build_object('tenant', 't' || (g % 100)) || CASE WHEN g % 100 = 7 THEN '{\"rare\": true}'::jsonb ELSE '{}'::jsonb END, \
       t.at, CASE WHEN s.state <> 'RUNNING' THEN t.at + interval '1 minute' END, 3 \
FROM generate_series(1, $1::int) g, \
     LATERAL (SELECT now() - random() * interval '60 days' + g * interval '0 seconds' AS at) t, \
     LATERAL (SELECT CASE WHEN g % 20 = 0 THEN 'FAILED' WHEN g % 20 < 3 THEN 'CANCELLED' \
                          WHEN g % 20 < 11 THEN 'COMPLETED' ELSE 'RUNNING' END AS state) s";
    const FILL_EVENTS: &str = "\
INSERT INTO sheaf.events (execution_id, seq, event_type, payload, bytes, created_at) \
SELECT e.id, k, CASE WHEN k = 1 THEN 'TaskCompleted' WHEN k = 2 THEN 'TaskFailed' \
                     WHEN e.state = 'COMPLETED' THEN 'WorkflowCompleted' WHEN e.state = 'FAILED' THEN 'WorkflowFailed' \
                     ELSE 'WorkflowCancelled' END, \
       '{\"kind\": \"activity\", \"secs\": 1.5}', 40, e.created_at + k * interval '10 seconds' \
FROM sheaf.executions e CROSS JOIN generate_series(1, 3) k \
WHERE e.workflow_name LIKE 'bench-%' AND (k < 3 OR e.state <> 'RUNNING')";

    let (db, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(conn);
    let have: i64 = db
        .query_one(
            "SELECT count(*) FROM sheaf.executions WHERE workflow_name LIKE 'bench-%'",
            &[],
        )
        .await?
        .get(0);
    if have == i64::from(per_shard) {
        return Ok(());
    }
    db.batch_execute("TRUNCATE sheaf.events, sheaf.usage_records, sheaf.executions CASCADE")
        .await?;
    db.execute(FILL, &[&(per_shard as i32)]).await?;
    db.execute(FILL_EVENTS, &[]).await?;
    // One statement each: a multi-statement string runs as one transaction,
    // which VACUUM refuses.
    db.batch_execute("VACUUM ANALYZE sheaf.executions").await?;
    db.batch_execute("VACUUM ANALYZE sheaf.events").await?;
    Ok(())
}

/// The `p` quantile (0 to 1) of `v`, which it sorts; 0 when `v` is empty.
pub fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or(0.0)
}
