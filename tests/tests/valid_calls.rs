//! Every function of schema `sheaf` has a valid call in
//! tests/src/valid_calls.rs, and each succeeds on a fresh install (the
//! upgrade test runs the same calls on an upgraded shard).

use sheaf_tests::{fleet, own_database, valid_calls};

const DB: &str = "sheaf_valid_calls";

#[tokio::test]
async fn every_function_has_a_valid_call_that_succeeds() {
    let shard = fleet().shards().next().expect("the test fleet has a shard");
    // A database of its own on shard 0's cluster: the calls initialize it
    // as shard valid_calls::SHARD_ID.
    let db = own_database::recreate(&shard.url, DB).await;
    db.batch_execute("CREATE EXTENSION sheaf")
        .await
        .unwrap_or_else(|e| panic!("CREATE EXTENSION sheaf: {e:?}"));
    let coverage = valid_calls::check_coverage(&db).await;
    let calls = valid_calls::run_all(&db).await;
    drop(db);
    own_database::drop(&shard.url, DB).await;
    if let Err(e) = coverage {
        panic!("{e}");
    }
    if let Err(e) = calls {
        panic!("{e}");
    }
}
