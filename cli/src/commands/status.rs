//! `sheaf status`: every shard probed.

use std::time::Duration;

use sheaf_driver::{Client, TopologyStatus};

use super::Context;
use crate::exit::{self, Exit};
use crate::output::{print_json, say};

/// Probe every shard: reachable, its id, versions and schema parity, its
/// roles, live workers and stranded work (ready tasks no live worker serves).
#[derive(clap::Args)]
pub struct Args {
    /// How long one probe may take.
    #[arg(long, default_value = "5s", value_parser = crate::parse::duration)]
    timeout: Duration,
}

/// Exits 1 when a shard is unreachable, misidentified or behind the
/// fleet's schema; stranded work is reported but is not a probe failure.
pub async fn run(args: Args, ctx: &Context) -> Exit {
    let client = match ctx.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let status = client.admin().topology_status(args.timeout).await;
    if ctx.json {
        match serde_json::to_value(&status) {
            Ok(v) => print_json(&v),
            Err(e) => return exit::fail(Exit::Failed, format!("cannot encode status: {e}")),
        }
    } else {
        print_table(&client, &status);
    }
    let failing: Vec<String> = status
        .shards
        .iter()
        .filter(|s| !(s.probe.healthy() && s.schema_parity))
        .map(|s| s.probe.shard.to_string())
        .collect();
    if failing.is_empty() {
        Exit::Done
    } else {
        exit::fail(
            Exit::Failed,
            format!(
                "shard(s) {} unreachable, misidentified or behind the fleet's schema",
                failing.join(", ")
            ),
        )
    }
}

fn print_table(client: &Client, status: &TopologyStatus) {
    say!(
        "{:<6} {:<10} {:<8} {:<8} {:<8} {:<7} {:<9} {:<6} {:<8} {:<8} {:<12} {:<7} problem",
        "shard",
        "reachable",
        "db says",
        "sheaf",
        "schema",
        "parity",
        "postgres",
        "roles",
        "workers",
        "stranded",
        "relay",
        "digest"
    );
    for s in &status.shards {
        let p = &s.probe;
        let postgres = p
            .server_version
            .as_deref()
            .and_then(|v| v.split_whitespace().next());
        let roles = s.roles();
        let stranded = s.stranded_ready();
        // Lifecycle rows + outbox rows still to carry.
        let relay = p
            .relay
            .as_ref()
            .map_or("-".into(), |r| format!("{}+{}", r.children, r.outbox));
        // This client's digest against what the shard accepts.
        let mine = client.topology().digest();
        let digest = match p.accepted_digests.iter().position(|d| *d == mine) {
            _ if p.accepted_digests.is_empty() => "-",
            Some(0) => "ok",
            Some(_) => "prev",
            None => "OTHER",
        };
        say!(
            "{:<6} {:<10} {:<8} {:<8} {:<8} {:<7} {:<9} {:<6} {:<8} {:<8} {:<12} {:<7} {}",
            p.shard,
            if p.reachable { "yes" } else { "NO" },
            p.reported_shard_id.map_or("-".into(), |id| id.to_string()),
            p.library_version.as_deref().unwrap_or("-"),
            p.schema_version.as_deref().unwrap_or("-"),
            if s.schema_parity { "yes" } else { "NO" },
            postgres.unwrap_or("-"),
            roles,
            p.live_workers.len(),
            stranded,
            relay,
            digest,
            p.problem.as_deref().unwrap_or("")
        );
        if let Some(r) = p
            .relay
            .as_ref()
            .filter(|r| r.children_failing > 0 || r.outbox_indeterminate > 0)
        {
            say!(
                "         relay: {} child row(s) failing, {} outbox row(s) waiting on a shard that cannot be read{}",
                r.children_failing,
                r.outbox_indeterminate,
                r.oldest_indeterminate_secs
                    .map_or(String::new(), |s| format!(" (for {s:.0}s)"))
            );
        }
        for q in &p.stranded {
            say!(
                "         stranded: queue {:?} has {} ready tasks and no live worker",
                q.queue,
                q.ready
            );
        }
    }
    say!("roles: r readable, w writable, R reserved, d default; relay: child rows + outbox rows to carry");
}
