//! The gates demo, on one shard (gates are shard-local): latest-wins
//! supersede, and the durable FIFO mutex with a crashed holder.
//!
//! `scripts/demo` runs it after the main demo. By hand:
//! `SHEAF_SHARDS=... cargo run -p sheaf-driver --example gates`.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use sheaf_driver::{Shard, Topology};
use tokio_postgres::{AsyncMessage, Client, NoTls};
use uuid::Uuid;

type Error = Box<dyn std::error::Error + Send + Sync>;

async fn connect(shard: &Shard) -> Result<Client, Error> {
    let (client, connection) = tokio_postgres::connect(&shard.url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// A connection whose `sheaf_mutex` notifications (payload: the new holder)
/// arrive on the returned channel.
async fn connect_listening(
    shard: &Shard,
) -> Result<(Client, tokio::sync::mpsc::UnboundedReceiver<String>), Error> {
    let (client, mut connection) = tokio_postgres::connect(&shard.url, NoTls).await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(n) = message {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    client.batch_execute("LISTEN sheaf_mutex").await?;
    Ok((client, rx))
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let spec = std::env::var("SHEAF_SHARDS").map_err(|_| "set SHEAF_SHARDS (scripts/shards up prints it)")?;
    let topology = Topology::parse(&spec)?;
    let shard = topology
        .shards()
        .next()
        .ok_or("SHEAF_SHARDS lists no shard")?
        .clone();
    let run = std::process::id();
    latest_wins(&shard, run).await?;
    println!();
    mutex(&shard, run).await?;
    Ok(())
}

/// A document indexer declared latest-wins: every edit starts a re-index,
/// and only the newest run per document may stay active.
// The demo's script, step after step as it prints them.
#[allow(clippy::too_many_lines)]
async fn latest_wins(shard: &Shard, run: u32) -> Result<(), Error> {
    println!(
        "# latest-wins: doc_index keeps the newest run per document (limit 1, on_conflict cancel_running)"
    );
    let db = connect(shard).await?;
    let workflow = format!("doc_index-{run}");
    db.execute(
        "SELECT sheaf.declare_workflow($1, $2)",
        &[
            &workflow,
            &serde_json::json!({"concurrency": {"key": "input.doc", "limit": 1, "on_conflict": "cancel_running"}}),
        ],
    )
    .await?;
    let start = "SELECT execution_id, superseded FROM sheaf.start_workflow($1, $2, $3)";
    for edit in 1..=3 {
        let row = db
            .query_one(
                start,
                &[
                    &workflow,
                    &format!("readme-edit-{edit}"),
                    &serde_json::json!({"doc": "readme"}),
                ],
            )
            .await?;
        let superseded: Vec<Uuid> = row.get(1);
        println!(
            "edit {edit} of readme: run {} started, superseded {:?}",
            short(row.get(0)),
            superseded.iter().map(|u| short(*u)).collect::<Vec<_>>()
        );
    }
    // A burst of 20 concurrent edits of one document, each on its own connection.
    let mut burst = Vec::new();
    for edit in 0..20 {
        let shard = shard.clone();
        let workflow = workflow.clone();
        burst.push(tokio::spawn(async move {
            let db = connect(&shard).await?;
            loop {
                match db
                    .query_one(
                        start,
                        &[
                            &workflow,
                            &format!("guide-edit-{edit}"),
                            &serde_json::json!({"doc": "guide"}),
                        ],
                    )
                    .await
                {
                    Ok(_) => return Ok::<_, Error>(()),
                    // A deadlock rolls the start back whole; it is safe to retry.
                    Err(e) if e.code().is_some_and(|c| c.code() == "40P01") => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }));
    }
    for b in burst {
        b.await??;
    }
    let rows = db
        .query(
            "SELECT concurrency_key, count(*) FILTER (WHERE state = 'RUNNING'), \
                    count(*) FILTER (WHERE state = 'CANCELLED') \
             FROM sheaf.executions WHERE workflow_name = $1 GROUP BY 1 ORDER BY 1",
            &[&workflow],
        )
        .await?;
    for r in rows {
        let (doc, running, cancelled): (String, i64, i64) = (r.get(0), r.get(1), r.get(2));
        println!("doc {doc}: {running} running, {cancelled} cancelled by newer runs");
    }
    let reason: String = db
        .query_one(
            "SELECT ev.payload->>'reason' FROM sheaf.events ev JOIN sheaf.executions e ON e.id = ev.execution_id \
             WHERE e.workflow_name = $1 AND ev.event_type = 'WorkflowCancelled' LIMIT 1",
            &[&workflow],
        )
        .await?
        .get(0);
    println!("a cancelled run's history says: {reason}");
    Ok(())
}

/// Four deployers share one production lock. One crashes while holding it;
/// its lease runs out and the lock passes on. Its late release is refused.
async fn mutex(shard: &Shard, run: u32) -> Result<(), Error> {
    println!("# durable mutex: 4 deployers, one lock, FIFO grants, a holder that crashes");
    let key = format!("deploy:prod-{run}");
    let inside = Arc::new(AtomicI32::new(0));
    let started = Instant::now();
    let mut deployers = Vec::new();
    for n in 0..4 {
        let (shard, key, inside) = (shard.clone(), key.clone(), inside.clone());
        deployers.push(tokio::spawn(async move {
            // Arrive in order, so the FIFO line is visible in the output.
            tokio::time::sleep(Duration::from_millis(20 * n)).await;
            let (db, mut grants) = connect_listening(&shard).await?;
            let owner = Uuid::new_v4();
            let acquire =
                "SELECT granted, token, queue_position FROM sheaf.mutex_acquire($1, $2, '2 seconds')";
            let mut last_position = 0;
            let token = loop {
                let row = db.query_one(acquire, &[&key, &owner]).await?;
                if row.get::<_, bool>(0) {
                    break row.get::<_, i64>(1);
                }
                let position: i32 = row.get(2);
                if position != last_position {
                    println!("deployer {n}: waiting, position {position}");
                    last_position = position;
                }
                // Woken by our grant's NOTIFY; the timeout covers a crashed holder.
                loop {
                    match tokio::time::timeout(Duration::from_millis(500), grants.recv()).await {
                        Ok(Some(holder)) if holder == owner.to_string() => break,
                        Ok(Some(_)) => continue,
                        Ok(None) => return Err::<(), Error>("notification stream ended".into()),
                        Err(_) => {
                            db.execute("SELECT sheaf.mutex_reclaim()", &[]).await?;
                            break;
                        }
                    }
                }
            };
            if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                return Err("two deployers inside at once".into());
            }
            println!(
                "deployer {n}: holds the lock (token {token}) at {:.2} s",
                started.elapsed().as_secs_f64()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            if n == 1 {
                println!("deployer {n}: crashes without releasing; its 2 s lease will run out");
                tokio::time::sleep(Duration::from_secs(3)).await;
                let late = db
                    .execute("SELECT sheaf.mutex_release($1, $2, $3)", &[&key, &owner, &token])
                    .await;
                match late {
                    Err(e) if e.code().is_some_and(|c| c.code() == "55P03") => {
                        println!(
                            "deployer {n}: back, its release with token {token} is refused (55P03): fenced"
                        )
                    }
                    other => return Err(format!("a stale release was not refused: {other:?}").into()),
                }
                return Ok(());
            }
            db.execute("SELECT sheaf.mutex_release($1, $2, $3)", &[&key, &owner, &token])
                .await?;
            Ok(())
        }));
    }
    for d in deployers {
        d.await??;
    }
    let db = connect(shard).await?;
    let free: bool = db
        .query_one("SELECT holder IS NULL FROM sheaf.mutex_status($1)", &[&key])
        .await?
        .get(0);
    println!("lock free at the end: {free}; never more than one deployer inside");
    Ok(())
}

/// The random tail of an id (its head is the shard and the millisecond).
fn short(id: Uuid) -> String {
    id.to_string()[24..].to_owned()
}
