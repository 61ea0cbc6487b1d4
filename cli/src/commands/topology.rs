//! `sheaf topology digest|diff|publish`: the byte-stable projection of a
//! topology (ids, roles, residency, forwards; never connection strings) and
//! its `sha256:` digest, to pin in every client (`SHEAF_TOPOLOGY_DIGEST`)
//! and to compare deployments.

use serde_json::{Value, json};
use sheaf_driver::Topology;

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{failures_json, print_json, say};

/// The topology's digest (what to pin in SHEAF_TOPOLOGY_DIGEST) and
/// comparing two deployments' topologies.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// The `sha256:` digest of this environment's topology (--json: with
    /// its projection: ids, roles, residency, forwards; never URLs).
    Digest,
    /// Compare two topologies: each file an environment file of SHEAF_*
    /// lines, or the JSON `topology digest --json` prints. Exits 5 when
    /// they differ, naming each differing field.
    Diff {
        /// The first file.
        a: String,
        /// The second file.
        b: String,
    },
    /// Record this environment's digest on every shard: from then on a
    /// client configured otherwise is refused on placed work. The digest
    /// it replaces stays accepted (a rolling change) unless --replace.
    /// Exits 3 when a shard did not take it.
    Publish {
        /// Accept only this digest from now on (the rollout is done).
        #[arg(long)]
        replace: bool,
    },
}

/// `diff` compares files and needs no shards; the others connect.
pub async fn run(args: Args, ctx: &Context) -> Exit {
    match args.what {
        Action::Diff { a, b } => diff(&a, &b, ctx.json),
        Action::Digest => match ctx.client().await {
            Ok(client) => digest(client.topology(), ctx.json),
            Err(code) => code,
        },
        Action::Publish { replace } => match ctx.client().await {
            Ok(client) => publish(&client, !replace, ctx.json).await,
            Err(code) => code,
        },
    }
}

/// `sheaf topology digest`: this environment's topology.
fn digest(topology: &Topology, as_json: bool) -> Exit {
    if as_json {
        let projection: Value = serde_json::from_str(&topology.projection()).unwrap_or(Value::Null);
        print_json(&json!({"digest": topology.digest(), "projection": projection}));
    } else {
        say!("{}", topology.digest());
    }
    Exit::Done
}

/// `sheaf topology publish`: this environment's digest on every shard.
async fn publish(client: &sheaf_driver::Client, keep_previous: bool, as_json: bool) -> Exit {
    let report = client.admin().publish_topology(keep_previous).await;
    if as_json {
        let ok: serde_json::Map<String, Value> = report
            .ok
            .iter()
            .map(|(s, (d, p))| (s.to_string(), json!({"digest": d, "previous": p})))
            .collect();
        print_json(&json!({"published": ok, "failed": failures_json(&report.failed)}));
    } else {
        for (shard, (digest, previous)) in &report.ok {
            match previous {
                Some(p) => say!("shard {shard}: {digest} (still accepting {p})"),
                None => say!("shard {shard}: {digest}"),
            }
        }
    }
    exit::partial_if(&report.failed, !report.failed.is_empty())
}

/// One side of a diff: a digest (when known) and the projection.
#[derive(Debug)]
struct Side {
    digest: Option<String>,
    projection: Value,
}

/// A file is either the JSON `sheaf topology digest --json` prints (or a
/// bare projection), or an environment file of `SHEAF_*=value` lines, as a
/// deployment hands them to its processes (`#` comments, optional quotes).
fn read(path: &str) -> Result<Side, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        let digest = v.get("digest").and_then(Value::as_str).map(str::to_owned);
        let projection = v.get("projection").cloned().unwrap_or(v);
        if !projection.is_object() {
            return Err(format!("{path}: JSON, but not a topology projection"));
        }
        return Ok(Side { digest, projection });
    }
    let vars: Vec<(String, String)> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("export ").unwrap_or(l).split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().trim_matches(['"', '\'']).to_owned()))
        .collect();
    let topology = Topology::from_vars(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
        .map_err(|e| format!("{path}: {e}"))?;
    Ok(Side {
        digest: Some(topology.digest()),
        projection: serde_json::from_str(&topology.projection()).unwrap_or(Value::Null),
    })
}

/// `sheaf topology diff A B`: exits 0 when both route alike, 5 when they
/// differ (each differing field printed), 2 when a file cannot be read.
fn diff(a: &str, b: &str, as_json: bool) -> Exit {
    let (left, right) = match (read(a), read(b)) {
        (Ok(l), Ok(r)) => (l, r),
        (Err(e), _) | (_, Err(e)) => return exit::bad_input(e),
    };
    let empty = serde_json::Map::new();
    let (lm, rm) = (
        left.projection.as_object().unwrap_or(&empty),
        right.projection.as_object().unwrap_or(&empty),
    );
    let mut fields: Vec<&String> = lm.keys().chain(rm.keys()).collect();
    fields.sort();
    fields.dedup();
    let differing: Vec<(&String, Value, Value)> = fields
        .into_iter()
        .filter_map(|f| {
            let (l, r) = (
                lm.get(f).cloned().unwrap_or(Value::Null),
                rm.get(f).cloned().unwrap_or(Value::Null),
            );
            (l != r).then_some((f, l, r))
        })
        .collect();
    if as_json {
        let d: serde_json::Map<String, Value> = differing
            .iter()
            .map(|(f, l, r)| ((*f).clone(), json!({"a": l, "b": r})))
            .collect();
        print_json(&json!({"a": left.digest, "b": right.digest, "same": d.is_empty(), "differing": d}));
    } else {
        let show = |d: &Option<String>| d.clone().unwrap_or_else(|| "(no digest in the file)".into());
        say!("a: {}", show(&left.digest));
        say!("b: {}", show(&right.digest));
        if differing.is_empty() {
            say!("the same topology");
        }
        for (f, l, r) in &differing {
            say!("{f}: {l} (a) vs {r} (b)");
        }
    }
    if differing.is_empty() {
        Exit::Done
    } else {
        Exit::Found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> String {
        let path = std::env::temp_dir().join(format!("sheaf-topology-{}-{name}", std::process::id()));
        std::fs::write(&path, text).expect("a temp file");
        path.display().to_string()
    }

    #[test]
    fn env_files_and_digest_json_read_alike() {
        let env = file(
            "a.env",
            "# a deployment\nexport SHEAF_SHARDS=\"0=postgres://u:pw@a/d,1=postgres://b/d\"\nSHEAF_RESIDENCY='eu=1'\n",
        );
        let side = read(&env).expect("an env file");
        let t = Topology::from_vars(|n| match n {
            "SHEAF_SHARDS" => Some("1=postgres://x/d,0=postgres://y/d".into()),
            "SHEAF_RESIDENCY" => Some("eu=1".into()),
            _ => None,
        })
        .expect("a topology");
        assert_eq!(side.digest.as_deref(), Some(t.digest().as_str()));
        let json = file(
            "b.json",
            &json!({"digest": t.digest(), "projection": serde_json::from_str::<Value>(&t.projection()).unwrap()})
                .to_string(),
        );
        let other = read(&json).expect("digest --json output");
        assert_eq!(other.projection, side.projection);
        assert!(read(&file("c.json", "[1, 2]")).is_err());
        assert!(
            read(&file("d.env", "SHEAF_WRITABLE=0\n"))
                .unwrap_err()
                .contains("SHEAF_SHARDS")
        );
    }
}
