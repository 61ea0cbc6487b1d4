//! `sheaf`: the operator's command line.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use sheaf_driver::{Client, PoolOptions, Topology};

mod executions;
mod exit;
mod reports;

#[derive(Parser)]
#[command(
    name = "sheaf",
    version,
    about = "Operate a fleet of sheaf shard databases",
    after_help = "The shards come from the environment only, never from the command line \
                  (where every process on the host can read them): SHEAF_SHARDS holds \
                  `<id>=<connection string>` entries, comma-separated or a JSON list; \
                  SHEAF_READABLE, SHEAF_WRITABLE, SHEAF_RESERVED, SHEAF_DEFAULT_SHARD, \
                  SHEAF_RESIDENCY and SHEAF_FORWARDS are optional (see the README)."
)]
struct Cli {
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Probe every shard: reachable, its id, versions and schema parity, its
    /// roles, live workers and stranded work (ready tasks no live worker serves).
    Status {
        /// How long one probe may take.
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// List executions across every shard, newest first, a page at a time.
    /// Filters are and-ed; a partial page (a shard did not answer) exits 3.
    List {
        /// Only this workflow (repeatable: any of them).
        #[arg(long = "workflow", value_name = "W")]
        workflows: Vec<String>,
        /// Only this state, e.g. running (repeatable: any of them).
        #[arg(long = "state", value_name = "S")]
        states: Vec<String>,
        /// Only executions whose search attribute K equals V (repeatable).
        /// V is read as JSON when it parses (5 a number, "5" a string,
        /// true a boolean), else as a string.
        #[arg(long = "attr", value_name = "K=V")]
        attrs: Vec<String>,
        /// A filter tree as JSON (and, or, not, attr tests: see the README).
        #[arg(long, value_name = "JSON")]
        filter: Option<String>,
        /// Executions per page (1 to 999).
        #[arg(long, default_value_t = 50)]
        page_size: usize,
        /// Where to go on from: the `more:` cursor of the page before.
        #[arg(long)]
        cursor: Option<String>,
        /// desc (newest first) or asc.
        #[arg(long, default_value = "desc")]
        order: String,
    },
    /// Find an execution by its business key on whichever shard holds it:
    /// its active run, else its latest ended one. Exits 4 when no shard has
    /// it, 3 when a shard that may have it did not answer.
    Find {
        /// The workflow's name.
        name: String,
        /// The workflow id it was started with.
        workflow_id: String,
    },
    /// What the executions of every shard used in a window (at most 90
    /// days), per workflow or per search attribute: starts, ends, activity
    /// attempts and compute seconds, metered units. Exits 3 when partial.
    Usage {
        /// Where the window starts: a duration back from now (24h, 7days)
        /// or a timestamp (2026-11-01T00:00:00Z).
        #[arg(long)]
        from: String,
        /// Where it ends (exclusive), the same forms.
        #[arg(long, default_value = "0s")]
        to: String,
        /// workflow_name, or a search attribute (tenant or search_attr:tenant).
        #[arg(long, default_value = "workflow_name")]
        group_by: String,
    },
    /// Every concurrency key of every shard: running, ready and waiting
    /// tasks added up, and each shard's cap. Exits 3 when partial.
    Concurrency,
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

// One arm per subcommand; each arm is short, and the match is the CLI's
// table of contents.
#[allow(clippy::too_many_lines)]
#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // Connection strings carry credentials: they come from the environment
    // alone, never from an argument every process on the host can read.
    let topology = match Topology::from_env() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("sheaf: bad topology: {e}");
            return ExitCode::from(2);
        }
    };
    let client = match Client::new(topology, PoolOptions::default()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sheaf: {e}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::List {
            workflows,
            states,
            attrs,
            filter,
            page_size,
            cursor,
            order,
        } => {
            let args = executions::ListArgs {
                workflows,
                states,
                attrs,
                filter,
                page_size,
                cursor,
                order,
            };
            executions::list(&client, args, cli.json).await
        }
        Command::Find { name, workflow_id } => executions::find(&client, &name, &workflow_id, cli.json).await,
        Command::Usage { from, to, group_by } => {
            reports::usage(&client, &from, &to, &group_by, cli.json).await
        }
        Command::Concurrency => reports::concurrency(&client, cli.json).await,
        Command::Status { timeout } => {
            let status = client.topology_status(timeout).await;
            if cli.json {
                match serde_json::to_string_pretty(&status) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("sheaf: cannot encode status: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                println!(
                    "{:<6} {:<10} {:<8} {:<8} {:<8} {:<7} {:<9} {:<6} {:<8} {:<8} problem",
                    "shard",
                    "reachable",
                    "db says",
                    "sheaf",
                    "schema",
                    "parity",
                    "postgres",
                    "roles",
                    "workers",
                    "stranded"
                );
                for s in &status.shards {
                    let p = &s.probe;
                    let postgres = p
                        .server_version
                        .as_deref()
                        .and_then(|v| v.split_whitespace().next());
                    let roles = s.roles();
                    let stranded = s.stranded_ready();
                    println!(
                        "{:<6} {:<10} {:<8} {:<8} {:<8} {:<7} {:<9} {:<6} {:<8} {:<8} {}",
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
                        p.problem.as_deref().unwrap_or("")
                    );
                    for q in &p.stranded {
                        println!(
                            "         stranded: queue {:?} has {} ready tasks and no live worker",
                            q.queue, q.ready
                        );
                    }
                }
                println!("roles: r readable, w writable, R reserved, d default");
            }
            // Unreachable or misidentified shards fail the command; stranded
            // work is reported but is not a probe failure.
            if status.shards.iter().all(|s| s.probe.healthy() && s.schema_parity) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
