//! `sheaf`: the operator's command line.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use sheaf_driver::{Topology, probe_shard};

#[derive(Parser)]
#[command(name = "sheaf", version, about = "Operate a fleet of sheaf shard databases")]
struct Cli {
    /// The shards: `<id>=<connection string>` entries, comma-separated or a JSON list.
    #[arg(long, env = "SHEAF_SHARDS", hide_env_values = true)]
    shards: String,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Probe every shard: reachable, its id, its sheaf and Postgres versions.
    Status {
        /// How long one probe may take.
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        timeout: Duration,
    },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 500ms or 5s"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        _ => Err(format!("`{s}` is not a duration like 500ms or 5s")),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let topology = match Topology::parse(&cli.shards) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("sheaf: bad shard list: {e}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Status { timeout } => {
            let probes = topology.shards().map(|s| probe_shard(s, timeout));
            // Concurrently, so one slow shard does not delay the rest.
            let statuses = futures::future::join_all(probes).await;
            if cli.json {
                match serde_json::to_string_pretty(&statuses) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("sheaf: cannot encode status: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                println!(
                    "{:<6} {:<10} {:<8} {:<8} {:<8} {:<9} problem",
                    "shard", "reachable", "db says", "sheaf", "schema", "postgres"
                );
                for s in &statuses {
                    let postgres = s
                        .server_version
                        .as_deref()
                        .and_then(|v| v.split_whitespace().next());
                    println!(
                        "{:<6} {:<10} {:<8} {:<8} {:<8} {:<9} {}",
                        s.shard,
                        if s.reachable { "yes" } else { "NO" },
                        s.reported_shard_id.map_or("-".into(), |id| id.to_string()),
                        s.library_version.as_deref().unwrap_or("-"),
                        s.schema_version.as_deref().unwrap_or("-"),
                        postgres.unwrap_or("-"),
                        s.problem.as_deref().unwrap_or("")
                    );
                }
            }
            if statuses.iter().all(|s| s.healthy()) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
