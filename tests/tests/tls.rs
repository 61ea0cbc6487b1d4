//! TLS to a live shard (issue 19): a shard of its own serving TLS with a
//! certificate signed by a test CA (`scripts/shards up --tls`), reached with
//! `sslmode=require&sslrootcert=<the CA>`: the pool, a worker's listener,
//! the status probe and `Client::from_vars` on `SHEAF_DATABASE_URL` all
//! connect over TLS (the server says so in `pg_stat_ssl`), and a client
//! that does not trust the CA is refused, naming no connection string.
//!
//! Only a PostgreSQL built with OpenSSL can serve TLS: here the Debian
//! PostgreSQL 15. The 16 and 18 wheels have none, and on them this test
//! says so and passes without a shard.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sheaf_driver::{
    Client, ClientError, EnqueueOptions, PoolOptions, TaskContext, TaskDone, Topology, Worker, WorkerOptions,
};
use sheaf_tests::{test_pg, unique};

/// A plain connection to the shard behind `url` (its TLS settings dropped).
async fn plain(url: &str) -> tokio_postgres::Client {
    let base = url.split('?').next().expect("a URL");
    let (db, conn) = tokio_postgres::connect(base, tokio_postgres::NoTls)
        .await
        .expect("a plain connection");
    tokio::spawn(conn);
    db
}

/// Backends of database sheaf connected over TLS, as the server sees them.
async fn tls_backends(db: &tokio_postgres::Client) -> i64 {
    db.query_one(
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.datname = 'sheaf' AND s.ssl",
        &[],
    )
    .await
    .expect("pg_stat_ssl")
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_that_requires_tls_is_reached_over_tls_and_verified() {
    if test_pg() != "15" {
        eprintln!(
            "skipped: the PostgreSQL {} build here has no OpenSSL (only the Debian PostgreSQL 15 serves TLS)",
            test_pg()
        );
        return;
    }
    let spec = sheaf_tests::own_shards("tls", 24300, &["up", "--count", "1", "--tls", "--no-install"]);
    let url = spec
        .lines()
        .next()
        .and_then(|l| l.split_once('='))
        .map(|(_, u)| u.to_owned())
        .expect("a shard");
    assert!(url.contains("sslmode=require"), "{url}");
    let topology = Topology::parse(spec.trim()).expect("a topology");
    let shard = topology.shards().next().expect("a shard").id;
    let c = Arc::new(Client::new(topology.clone(), PoolOptions::default()).expect("a client"));
    let db = plain(&url).await;
    assert_eq!(tls_backends(&db).await, 0);

    let queue = unique("tls");
    let task = c
        .enqueue(&queue, json!({"n": 1}), EnqueueOptions::new())
        .await
        .expect("enqueue over TLS");
    assert!(tls_backends(&db).await >= 1, "the pool's connection is TLS");

    // A worker's claims and its listener, over TLS too.
    let worker = Worker::start(
        c.clone(),
        WorkerOptions::new(unique("w"), [queue.clone()]).idle_poll(Duration::from_millis(200)),
        |_t: TaskContext| async { Ok(TaskDone::Complete(None)) },
    )
    .expect("a worker");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while worker.stats().completed < 1 {
        assert!(tokio::time::Instant::now() < deadline, "the task was never done");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(matches!(
        c.get_task(task.task_id).await,
        Err(ClientError::UnknownTask { .. })
    ));
    assert!(tls_backends(&db).await >= 2, "the listener's connection is TLS");
    worker.shutdown().await;

    let status = c.admin().topology_status(Duration::from_secs(5)).await;
    assert!(
        status.shards.iter().all(|s| s.probe.reachable),
        "the status probe connects over TLS"
    );

    let single = url.clone();
    let one = Client::from_vars(
        move |name| (name == "SHEAF_DATABASE_URL").then(|| single.clone()),
        PoolOptions::default(),
    )
    .await
    .expect("one database over TLS");
    assert_eq!(one.topology().shards().next().map(|s| s.id), Some(shard));

    an_untrusted_server_is_refused(&url, shard, &queue).await;
    sheaf_tests::own_shards("tls", 24300, &["down"]);
}

/// A client that does not trust the test CA is refused, and says why
/// without the connection string.
async fn an_untrusted_server_is_refused(url: &str, shard: sheaf_driver::ShardId, queue: &str) {
    let untrusted = url.replace(
        &url[url.find("sslrootcert=").expect("a root cert")..],
        "sslrootcert=/etc/ssl/certs/ca-certificates.crt",
    );
    let other = Topology::parse(&format!("{shard}={untrusted}")).expect("a topology");
    let options = PoolOptions::default()
        .connect_timeout(Duration::from_secs(2))
        .acquire_timeout(Duration::from_secs(2));
    let refused = Client::new(other, options)
        .expect("a client")
        .enqueue(queue, json!({}), EnqueueOptions::new())
        .await;
    match refused {
        Err(e @ (ClientError::Shard { .. } | ClientError::NoShardAvailable { .. })) => {
            let text = e.to_string();
            assert!(
                !text.contains("postgres://"),
                "never the connection string: {text}"
            );
            assert!(text.to_lowercase().contains("certificate"), "{text}");
        }
        other => panic!("an untrusted server was used: {other:?}"),
    }
}
