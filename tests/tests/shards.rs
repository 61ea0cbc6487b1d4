//! Each live shard knows who it is, refuses bad identities, and grants its
//! roles no more than they need.

use sheaf_core::id;
use sheaf_tests::{connect, fleet, sqlstate};

#[tokio::test]
async fn every_shard_reports_its_own_id_and_version() {
    let fleet = fleet();
    assert_eq!(fleet.len(), 3);
    for shard in fleet.shards() {
        let db = connect(shard).await;
        let row = db
            .query_one("SELECT sheaf.shard_id(), sheaf.version(), (SELECT extversion FROM pg_extension WHERE extname = 'sheaf')", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, i32>(0), shard.id.get() as i32);
        assert_eq!(row.get::<_, String>(1), env!("CARGO_PKG_VERSION"));
        assert_eq!(row.get::<_, String>(2), env!("CARGO_PKG_VERSION"));
    }
}

#[tokio::test]
async fn ids_minted_on_a_shard_carry_it_and_decode_in_the_driver() {
    for shard in fleet().shards() {
        let db = connect(shard).await;
        let row = db
            .query_one(
                "WITH i AS (SELECT sheaf.new_id() AS id) SELECT id, sheaf.id_shard(id) FROM i",
                &[],
            )
            .await
            .unwrap();
        let minted: uuid::Uuid = row.get(0);
        assert_eq!(row.get::<_, i32>(1), shard.id.get() as i32);
        assert_eq!(id::shard_of(minted.as_bytes()), shard.id.get());
    }
}

#[tokio::test]
async fn init_shard_refuses_bad_input_with_documented_sqlstates() {
    for shard in fleet().shards() {
        let db = connect(shard).await;
        let me = shard.id.get() as i32;
        // Idempotent for its own id.
        let again: i32 = db
            .query_one("SELECT sheaf.init_shard($1)", &[&me])
            .await
            .unwrap()
            .get(0);
        assert_eq!(again, me);
        for bad in [-1, 65535, 70000, i32::MIN] {
            let r = db.query_one("SELECT sheaf.init_shard($1)", &[&bad]).await;
            assert_eq!(sqlstate(r), "22023", "init_shard({bad})");
        }
        let r = db.query_one("SELECT sheaf.init_shard(NULL)", &[]).await;
        assert_eq!(sqlstate(r), "22004");
        let other = (me + 1) % 3;
        let r = db.query_one("SELECT sheaf.init_shard($1)", &[&other]).await;
        assert_eq!(sqlstate(r), "55000");
        // Nothing was written by any refusal.
        let still: i32 = db.query_one("SELECT sheaf.shard_id()", &[]).await.unwrap().get(0);
        assert_eq!(still, me);
    }
}

#[tokio::test]
async fn roles_get_exactly_their_functions() {
    let shard = fleet().shards().next().unwrap();
    let db = connect(shard).await;

    db.batch_execute("SET ROLE sheaf_worker").await.unwrap();
    let id: i32 = db.query_one("SELECT sheaf.shard_id()", &[]).await.unwrap().get(0);
    assert_eq!(id, shard.id.get() as i32);
    let r = db.query_one("SELECT sheaf.init_shard(0)", &[]).await;
    assert_eq!(sqlstate(r), "42501", "workers may not init a shard");
    let r = db
        .query_one("SELECT count(*) FROM sheaf.shard_identity", &[])
        .await;
    assert_eq!(sqlstate(r), "42501", "workers may not read tables directly");

    db.batch_execute("RESET ROLE; SET ROLE sheaf_admin")
        .await
        .unwrap();
    let me = shard.id.get() as i32;
    let again: i32 = db
        .query_one("SELECT sheaf.init_shard($1)", &[&me])
        .await
        .unwrap()
        .get(0);
    assert_eq!(again, me, "admins may init");
    let id: i32 = db.query_one("SELECT sheaf.shard_id()", &[]).await.unwrap().get(0);
    assert_eq!(id, me, "admins may do what workers do");

    // PUBLIC has nothing: a role outside both sheaf roles cannot call anything.
    // Even with the schema visible, a role in neither sheaf role can call nothing.
    db.batch_execute(
        "RESET ROLE; DROP ROLE IF EXISTS sheaf_test_outsider; CREATE ROLE sheaf_test_outsider; \
         GRANT USAGE ON SCHEMA sheaf TO sheaf_test_outsider; SET ROLE sheaf_test_outsider",
    )
    .await
    .unwrap();
    let r = db.query_one("SELECT sheaf.shard_id()", &[]).await;
    assert_eq!(sqlstate(r), "42501", "PUBLIC may not call sheaf functions");
    db.batch_execute(
        "RESET ROLE; REVOKE USAGE ON SCHEMA sheaf FROM sheaf_test_outsider; DROP ROLE sheaf_test_outsider",
    )
    .await
    .unwrap();
}
