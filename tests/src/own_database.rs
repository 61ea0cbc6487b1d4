//! A database of a test's own beside `sheaf` on a shard's cluster: for
//! checks over whole tables (a fresh install, counts that must not move),
//! which the shared `sheaf` database cannot give while every other test
//! writes to it.

use tokio_postgres::{Client, Config, NoTls};

/// A connection to database `db` of the cluster behind `url`.
pub async fn connect(url: &str, db: &str) -> Client {
    let mut config: Config = url.parse().expect("a shard URL parses");
    config.dbname(db);
    let (client, connection) = config
        .connect(NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to database {db}: {}", pg_error(&e)));
    tokio::spawn(connection);
    client
}

/// Database `db` made anew (empty) on the cluster behind `url`.
pub async fn recreate(url: &str, db: &str) -> Client {
    let admin = connect(url, "postgres").await;
    // Two statements: CREATE DATABASE cannot run in a multi-statement batch.
    for sql in [
        format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
        format!("CREATE DATABASE {db}"),
    ] {
        admin
            .batch_execute(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {}", pg_error(&e)));
    }
    connect(url, db).await
}

/// A server error as its SQLSTATE and message (tokio-postgres' Display
/// says only "db error").
pub fn pg_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} {}", d.code().code(), d.message()),
        None => e.to_string(),
    }
}

/// Database `db` made anew with sheaf installed and initialized as shard
/// `shard_id`.
pub async fn shard(url: &str, db: &str, shard_id: u32) -> Client {
    let client = recreate(url, db).await;
    client
        .batch_execute(&format!(
            "CREATE EXTENSION sheaf; SELECT sheaf.init_shard({shard_id})"
        ))
        .await
        .unwrap_or_else(|e| panic!("installing sheaf in {db}: {e}"));
    client
}

/// Drops database `db` of the cluster behind `url`.
pub async fn drop(url: &str, db: &str) {
    connect(url, "postgres")
        .await
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .await
        .unwrap_or_else(|e| panic!("dropping database {db}: {e}"));
}
