//! The `sheaf` binary's handling of its configuration (no shard needed).

use std::process::Command;

fn sheaf() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sheaf"));
    for var in [
        "SHEAF_SHARDS",
        "SHEAF_READABLE",
        "SHEAF_WRITABLE",
        "SHEAF_RESERVED",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// Connection strings carry credentials; on the command line every process
/// on the host could read them, so the flag does not exist.
#[test]
fn shard_urls_are_not_accepted_on_the_command_line() {
    let out = sheaf()
        .args(["--shards", "0=postgres://u:secret@127.0.0.1:1/db", "status"])
        .output()
        .expect("sheaf runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--shards"), "{stderr}");
    assert!(!stderr.contains("secret"), "{stderr}");
}

#[test]
fn the_shards_come_from_the_environment() {
    let out = sheaf().arg("status").output().expect("sheaf runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("SHEAF_SHARDS"), "{stderr}");

    let out = sheaf()
        .arg("status")
        .env(
            "SHEAF_SHARDS",
            "0=postgres://u:secret@127.0.0.1:1/db,0=postgres://u:secret@h/db",
        )
        .output()
        .expect("sheaf runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad topology"), "{stderr}");
    assert!(!stderr.contains("secret"), "{stderr}");
}

#[test]
fn help_says_where_the_shards_come_from() {
    let out = sheaf().arg("--help").output().expect("sheaf runs");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("SHEAF_SHARDS"));
}

/// Bad input exits 2 wherever it is caught: by clap, by the command, or by
/// the driver before it sends anything (a shard's own refusal, SQLSTATE
/// 22023, is checked by the live suites). The shard named here does not
/// listen: none of these may need it.
#[test]
fn bad_input_exits_2_wherever_it_is_caught() {
    let cases: &[&[&str]] = &[
        // clap
        &["bogus"],
        &["list", "--page-size", "x"],
        &["status", "--timeout", "5x"],
        &["rebalance", "--from", "0", "--to", "1", "--lease", "1"],
        &["executions"],
        // the command
        &["list", "--state", "bogus"],
        &["list", "--order", "sideways"],
        &["list", "--filter", "not json"],
        &["list", "--attr", "no-equals-sign"],
        &["tasks", "list", "q", "--state", "bogus"],
        &["executions", "get", "not-an-id"],
        &["tasks", "get", "not-an-id"],
        &["audit", "--limit", "0"],
        &["usage", "--from", "yesterday"],
        &["rebalance", "--from", "0", "--to", "9"],
        &["config", "apply", "/nonexistent/sheaf.json"],
        &["topology", "diff", "/nonexistent/a", "/nonexistent/b"],
        // the driver
        &["list", "--page-size", "0"],
        &["list", "--cursor", "garbage"],
        &["tasks", "list", "q", "--page-size", "0"],
        &["dead-letters", "list", "--page-size", "0"],
        &[
            "executions",
            "history",
            "00000000-0000-0000-0000-000000000000",
            "--page-size",
            "0",
        ],
        &["rebalance", "--from", "0", "--to", "0"],
        &["schedules", "fires", "nightly", "--limit", "0"],
    ];
    for args in cases {
        let out = sheaf()
            .args(*args)
            .env("SHEAF_SHARDS", "0=postgres://sheaf@127.0.0.1:1/none")
            .env_remove("SHEAF_TOPOLOGY_DIGEST")
            .output()
            .expect("sheaf runs");
        assert_eq!(
            out.status.code(),
            Some(2),
            "sheaf {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn help_and_version_exit_0() {
    for args in [
        &["--help"][..],
        &["--version"],
        &["list", "--help"],
        &["help", "tasks"],
    ] {
        let out = sheaf().args(args).output().expect("sheaf runs");
        assert_eq!(out.status.code(), Some(0), "sheaf {args:?}");
        assert!(!out.stdout.is_empty(), "sheaf {args:?} prints to stdout");
    }
}
