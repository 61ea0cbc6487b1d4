//! Every function of schema `sheaf` has a valid call in
//! tests/src/valid_calls.rs, and each succeeds on a fresh install (the
//! upgrade test runs the same calls on an upgraded shard).

use sheaf_tests::{fleet, valid_calls};
use tokio_postgres::{Config, NoTls};

const DB: &str = "sheaf_valid_calls";

#[tokio::test]
async fn every_function_has_a_valid_call_that_succeeds() {
    let shard = fleet().shards().next().expect("the test fleet has a shard");
    let config: Config = shard.url.parse().expect("a shard URL parses");
    let connect = |db: &'static str| {
        let mut config = config.clone();
        config.dbname(db);
        async move {
            let (client, connection) = config
                .connect(NoTls)
                .await
                .unwrap_or_else(|e| panic!("connecting to database {db} of shard 0: {e}"));
            tokio::spawn(connection);
            client
        }
    };
    // A database of its own on shard 0's cluster: the calls initialize it
    // as shard valid_calls::SHARD_ID.
    let admin = connect("postgres").await;
    // Two statements: CREATE DATABASE cannot run in a multi-statement batch.
    for sql in [
        format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)"),
        format!("CREATE DATABASE {DB}"),
    ] {
        admin
            .batch_execute(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }
    let db = connect(DB).await;
    db.batch_execute("CREATE EXTENSION sheaf")
        .await
        .unwrap_or_else(|e| panic!("CREATE EXTENSION sheaf: {e:?}"));
    let coverage = valid_calls::check_coverage(&db).await;
    let calls = valid_calls::run_all(&db).await;
    drop(db);
    admin
        .batch_execute(&format!("DROP DATABASE {DB} WITH (FORCE)"))
        .await
        .expect("dropping the valid-calls database");
    if let Err(e) = coverage {
        panic!("{e}");
    }
    if let Err(e) = calls {
        panic!("{e}");
    }
}
