//! The soak's own three shards (its own directory and ports, like
//! outage.rs), the faults it injects into them, and the soak tables it keeps
//! beside sheaf's in each shard database.

use std::process::Command;

use sheaf_tests::shards_script;
use std::time::Duration;

use sheaf_driver::Topology;

pub struct Fleet {
    pub major: String,
    pub dir: String,
    pub port: u32,
    pub spec: String,
    pub topology: Topology,
}

impl Fleet {
    /// Starts (or reuses) the clusters and recreates their `sheaf` databases.
    pub fn up() -> Fleet {
        let major = sheaf_tests::test_pg();
        let n: u32 = major.parse().expect("SHEAF_TEST_PG is a number");
        let dir = format!("/tmp/sheaf-soak/pg{major}");
        let port = 27750 + 10 * n.saturating_sub(15);
        let spec = shards_script(&major, &dir, port, &["up", "--count", "3", "--no-install"]);
        let topology = Topology::parse(&spec).expect("scripts/shards prints a shard list");
        Fleet {
            major,
            dir,
            port,
            spec,
            topology,
        }
    }

    /// `scripts/shards <args>` on the soak's clusters; its stdout.
    pub fn shards(&self, args: &[&str]) -> String {
        shards_script(&self.major, &self.dir, self.port, args)
    }

    /// A crash: `pg_ctl restart -m immediate` (no checkpoint, every backend
    /// killed, crash recovery on start). Run through bash so the server
    /// inherits none of our descriptors (a caller's `flock` lock would be
    /// held for as long as the cluster runs), as scripts/shards does.
    pub fn restart_immediate(&self, shard: u32) {
        let root = sheaf_tests::repo_root();
        let script = r#"source "$0/scripts/lib.sh"
            bindir="$(bindir_for "$1")"
            for fd in /proc/self/fd/*; do
                fd="${fd##*/}"
                [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-" 2>/dev/null
            done
            as_pg "$bindir/pg_ctl" -D "$2/data" -l "$2/log" -m immediate -w -t 60 restart >/dev/null"#;
        let shard_dir = format!("{}/shard{shard}", self.dir);
        let out = Command::new("bash")
            .args(["-c", script, &root.to_string_lossy(), &self.major, &shard_dir])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "pg_ctl restart -m immediate of shard {shard}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn down(&self) {
        self.shards(&["down"]);
    }
}

/// What the soak records beside sheaf's tables, in each shard's database:
/// every task id it enqueued (written in the enqueue's own transaction, so
/// the shard's record and ours cannot disagree, even when a commit's answer
/// is lost), every execution it started, which executions spawned their
/// activities, and the probes' outcomes.
pub const SOAK_SCHEMA: &str = "
    CREATE SCHEMA soak;
    CREATE TABLE soak.enqueued (task_id uuid PRIMARY KEY, t text NOT NULL);
    CREATE TABLE soak.started (execution_id uuid PRIMARY KEY, workflow_id text NOT NULL);
    CREATE TABLE soak.spawned (execution_id uuid PRIMARY KEY);
    CREATE TABLE soak.tokens (task_id uuid PRIMARY KEY, token bigint NOT NULL);
    CREATE TABLE soak.probes (task_id uuid NOT NULL, probe text NOT NULL, outcome text NOT NULL);
";

/// A connection for the soak's own reads, or `None` while the shard is down.
pub async fn connect(url: &str) -> Option<tokio_postgres::Client> {
    let attempt = tokio_postgres::connect(url, tokio_postgres::NoTls);
    match tokio::time::timeout(Duration::from_secs(2), attempt).await {
        Ok(Ok((client, connection))) => {
            tokio::spawn(connection);
            Some(client)
        }
        _ => None,
    }
}
