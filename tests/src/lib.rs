//! The harness for tests against live shard databases.
//!
//! The shards come from `SHEAF_TEST_SHARDS` (the `SHEAF_SHARDS` format) when
//! `scripts/test` started them; otherwise the harness starts three itself with
//! the same `scripts/shards up` (PostgreSQL `SHEAF_TEST_PG`, default 15), so a
//! plain `cargo test -p sheaf-tests` works too.

pub mod catalog;
pub mod hostile;
pub mod ledger;
pub mod own_database;
pub mod proxy;
pub mod source_check;
pub mod valid_calls;
pub mod workflows;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use sheaf_driver::{Shard, Topology};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Error, NoTls, Row};

/// The shard databases every test in this binary shares.
pub fn fleet() -> &'static Topology {
    static FLEET: OnceLock<Topology> = OnceLock::new();
    FLEET.get_or_init(|| match Topology::parse(fleet_spec()) {
        Ok(t) => t,
        Err(e) => panic!("SHEAF_TEST_SHARDS is not a valid shard list: {e}"),
    })
}

/// [`fleet`]'s shards in the `SHEAF_SHARDS` format (for a process of its
/// own: the CLI, a worker).
pub fn fleet_spec() -> &'static str {
    static SPEC: OnceLock<String> = OnceLock::new();
    SPEC.get_or_init(|| match std::env::var("SHEAF_TEST_SHARDS") {
        Ok(spec) => spec,
        Err(_) => start_shards(),
    })
}

/// The `sheaf` CLI, built for the test that asks (once per test binary).
pub fn cli_binary() -> &'static std::path::Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", "sheaf-cli"])
            .current_dir(repo_root())
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building the sheaf CLI");
        let target = std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| repo_root().join("target"));
        target.join("debug").join("sheaf")
    })
}

/// `sheaf --json ARGS` against the test fleet: its exit code and its JSON
/// (null when it printed nothing; anything else not JSON fails the test).
pub fn cli_json(args: &[&str]) -> (Option<i32>, serde_json::Value) {
    cli_json_on(fleet_spec(), args)
}

/// [`cli_json`] against the shards of `spec` (`SHEAF_SHARDS` format).
pub fn cli_json_on(spec: &str, args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let out = Command::new(cli_binary())
        .arg("--json")
        .args(args)
        .env("SHEAF_SHARDS", spec)
        .env_remove("SHEAF_TOPOLOGY_DIGEST")
        .output()
        .expect("the CLI runs");
    if out.stdout.is_empty() {
        return (out.status.code(), serde_json::Value::Null);
    }
    let value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "sheaf {args:?}: not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), value)
}

/// Runs `scripts/shards <args>` on a suite's own clusters: under
/// `/tmp/sheaf-test-<name>/pg<major>` (major from `SHEAF_TEST_PG`, default
/// 15), ports from `base_port + 10 * major`. Its stdout (for `up`, the
/// `SHEAF_SHARDS` lines); fails the test when the script does.
pub fn own_shards(name: &str, base_port: u32, args: &[&str]) -> String {
    let major = test_pg();
    let port = base_port + 10 * major.parse::<u32>().expect("SHEAF_TEST_PG is a number");
    shards_script(&major, &format!("/tmp/sheaf-test-{name}/pg{major}"), port, args)
}

/// The PostgreSQL major the tests run on: `SHEAF_TEST_PG`, default 15.
pub fn test_pg() -> String {
    std::env::var("SHEAF_TEST_PG").unwrap_or_else(|_| "15".into())
}

/// `scripts/shards <args> --pg major --dir dir --base-port port`: its stdout;
/// fails the test when the script does.
pub fn shards_script(major: &str, dir: &str, port: u32, args: &[&str]) -> String {
    let out = Command::new(repo_root().join("scripts/shards"))
        .args(args)
        .args(["--pg", major, "--dir", dir, "--base-port", &port.to_string()])
        .output()
        .expect("scripts/shards runs");
    assert!(
        out.status.success(),
        "scripts/shards {args:?}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The repository's root. Read when the test runs, not when it is compiled:
/// a shared target directory can hand a checkout binaries built in another
/// one, whose compiled-in path may be gone.
pub fn repo_root() -> PathBuf {
    let manifest =
        std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    PathBuf::from(manifest).join("..")
}

fn start_shards() -> String {
    let major = test_pg();
    let port = 25000 + 10 * major.parse::<u32>().expect("SHEAF_TEST_PG is a number");
    let dir = format!("/tmp/sheaf-test-shards/pg{major}");
    shards_script(&major, &dir, port, &["up", "--count", "3"])
}

/// A fresh connection to one shard; the connection task runs in the background.
pub async fn connect(shard: &Shard) -> Client {
    let (client, connection) = tokio_postgres::connect(&shard.url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to shard {}: {e}", shard.id));
    tokio::spawn(connection);
    client
}

/// The SQLSTATE of an error, if the server raised it.
pub fn code(e: &Error) -> Option<&str> {
    e.code().map(|c| c.code())
}

/// Runs a statement again when Postgres aborted it as a deadlock victim or a
/// serialization failure: the documented answer is to retry, and nothing of
/// the aborted attempt remains.
pub async fn query_retrying(
    db: &Client,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, Error> {
    let mut attempt = 0u64;
    loop {
        match db.query(sql, params).await {
            Err(e) if matches!(code(&e), Some("40P01" | "40001")) && attempt < 100 => {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_millis(attempt)).await;
            }
            result => return result,
        }
    }
}

/// The SQLSTATE of a failed statement, for asserting on refusals.
pub fn sqlstate(result: Result<impl Sized, tokio_postgres::Error>) -> String {
    match result {
        Ok(_) => panic!("expected the statement to be refused"),
        Err(e) => match code(&e) {
            Some(code) => code.to_owned(),
            None => panic!("expected a SQLSTATE, got {e}"),
        },
    }
}

/// A small deterministic PRNG (xorshift64*) for test workloads; the seed is
/// printed by the tests that use it so a failure can be replayed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn from_time() -> (Rng, u64) {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(42);
        (Rng::new(seed), seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// A name no other test run uses, for queues and keys. The counter keeps
/// two calls in the same nanosecond (tests run side by side) apart.
pub fn unique(prefix: &str) -> String {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let (mut rng, _) = Rng::from_time();
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix}-{:x}{call:x}", rng.next_u64())
}

/// A connection whose notifications (LISTEN) arrive on the returned channel.
pub async fn connect_listening(
    shard: &Shard,
) -> (
    Client,
    tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
) {
    use futures::StreamExt;
    let (client, mut connection) = tokio_postgres::connect(&shard.url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to shard {}: {e}", shard.id));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = tx.send(n);
            }
        }
    });
    (client, rx)
}

/// A shard id from a small number, for pins in tests.
pub fn sid(n: u16) -> sheaf_driver::ShardId {
    sheaf_driver::ShardId::new(u32::from(n)).expect("a test shard id is in range")
}

/// Waits until `done` says so, polling every 20 ms; fails the test naming
/// `what` after `timeout`.
pub async fn until(what: &str, timeout: std::time::Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `sheaf metrics serve --listen 127.0.0.1:0 ARGS` over the shards of
/// `spec`, killed when dropped: the process and the address it printed.
pub async fn metrics_serve(spec: &str, args: &[&str]) -> (tokio::process::Child, std::net::SocketAddr) {
    let mut cli = tokio::process::Command::new(cli_binary())
        .args(["metrics", "serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .env("SHEAF_SHARDS", spec)
        .env_remove("SHEAF_TOPOLOGY_DIGEST")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the CLI starts");
    let mut lines = tokio::io::BufReader::new(cli.stdout.take().expect("stdout"));
    let mut first = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut lines, &mut first)
        .await
        .expect("its address");
    let addr = first
        .trim()
        .strip_prefix("serving http://")
        .and_then(|a| a.strip_suffix("/metrics"))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("{first}"));
    (cli, addr)
}

/// `GET path` from `addr` over a real TCP connection (HTTP/1.1, closed
/// after): the response's head (status line and headers) and body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: sheaf\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("request");
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).await.expect("response");
    let text = String::from_utf8(raw).expect("utf-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("a response");
    (head.to_owned(), body.to_owned())
}

/// `n` dead letters of `queue` on `shard`, with `error` as their error.
pub async fn dead_letters(
    c: &sheaf_driver::Client,
    queue: &str,
    shard: sheaf_driver::ShardId,
    n: usize,
    error: &str,
) -> Vec<sheaf_driver::TaskId> {
    for i in 0..n {
        c.enqueue(
            queue,
            serde_json::json!({ "i": i }),
            sheaf_driver::EnqueueOptions::new().placement(sheaf_driver::Placement::Shard(shard)),
        )
        .await
        .expect("enqueue");
    }
    let claimed = c
        .claim(shard, queue, "test", n as i32, std::time::Duration::from_secs(60))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), n);
    for t in &claimed {
        c.dead_letter(t.task_id, t.token, error)
            .await
            .expect("dead-letter");
    }
    claimed.iter().map(|t| t.task_id).collect()
}

/// A cursor of `Admin::list_mutexes` (and `sheaf mutexes list --cursor`,
/// `/mutexes?cursor=`) that starts every shard of [`fleet`] just after
/// `prefix`, as if the page before had ended there on each: a test whose
/// keys share a unique prefix reads them whatever else the shared fleet
/// holds.
pub fn mutexes_from(prefix: &str) -> String {
    sheaf_core::listing::ShardCursor {
        anchors: fleet()
            .shards()
            .map(|s| (s.id.get(), serde_json::Value::String(prefix.to_owned())))
            .collect(),
        listing: sheaf_core::listing::listing_hash(&["mutexes"]),
    }
    .encode()
}
