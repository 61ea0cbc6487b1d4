//! What the fleet benchmarks share (`#[path]`-included by each binary):
//! their own release shards, and percentiles.

use std::process::Command;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Brings up `count` shards of PostgreSQL `pg` with a release build of the
/// extension (`scripts/shards up --release`) under `dir`, on ports from
/// `port`; their `SHEAF_SHARDS` entries, one per line.
pub fn release_shards(count: u32, pg: u32, dir: &str, port: u32) -> Result<String, Error> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(root.join("scripts/shards"))
        .args([
            "up",
            "--count",
            &count.to_string(),
            "--release",
            "--pg",
            &pg.to_string(),
        ])
        .args(["--dir", dir, "--base-port", &port.to_string()])
        .output()?;
    if !out.status.success() {
        return Err(format!("scripts/shards: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// The `p` quantile (0 to 1) of `v`, which it sorts; 0 when `v` is empty.
pub fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or(0.0)
}
