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
