//! The harness for tests against live shard databases.
//!
//! The shards come from `SHEAF_TEST_SHARDS` (the `SHEAF_SHARDS` format) when
//! `scripts/test` started them; otherwise the harness starts three itself with
//! the same `scripts/shards up` (PostgreSQL `SHEAF_TEST_PG`, default 15), so a
//! plain `cargo test -p sheaf-tests` works too.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use sheaf_driver::{Shard, Topology};
use tokio_postgres::{Client, NoTls};

/// The shard databases every test in this binary shares.
pub fn fleet() -> &'static Topology {
    static FLEET: OnceLock<Topology> = OnceLock::new();
    FLEET.get_or_init(|| {
        let spec = match std::env::var("SHEAF_TEST_SHARDS") {
            Ok(spec) => spec,
            Err(_) => start_shards(),
        };
        match Topology::parse(&spec) {
            Ok(t) => t,
            Err(e) => panic!("SHEAF_TEST_SHARDS is not a valid shard list: {e}"),
        }
    })
}

fn start_shards() -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let major = std::env::var("SHEAF_TEST_PG").unwrap_or_else(|_| "15".into());
    let out = Command::new(root.join("scripts/shards"))
        .args([
            "up",
            "--count",
            "3",
            "--pg",
            &major,
            "--dir",
            &format!("/tmp/sheaf-test-shards/pg{major}"),
        ])
        .args([
            "--base-port",
            &(55000 + 10 * major.parse::<u32>().expect("SHEAF_TEST_PG is a number")).to_string(),
        ])
        .output()
        .expect("scripts/shards runs");
    assert!(
        out.status.success(),
        "scripts/shards up failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("shard list is UTF-8")
}

/// A fresh connection to one shard; the connection task runs in the background.
pub async fn connect(shard: &Shard) -> Client {
    let (client, connection) = tokio_postgres::connect(&shard.url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to shard {}: {e}", shard.id));
    tokio::spawn(connection);
    client
}

/// The SQLSTATE of a failed statement, for asserting on refusals.
pub fn sqlstate(result: Result<impl Sized, tokio_postgres::Error>) -> String {
    match result {
        Ok(_) => panic!("expected the statement to be refused"),
        Err(e) => match e.code() {
            Some(code) => code.code().to_owned(),
            None => panic!("expected a SQLSTATE, got {e}"),
        },
    }
}
