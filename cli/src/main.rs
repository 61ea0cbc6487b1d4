//! `sheaf`: the operator's command line. Parses the command line and
//! dispatches to the command's module (`commands/`), which owns its
//! arguments and its `run`; every command ends with an [`exit::Exit`].

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use commands::{
    Context, audit, concurrency, config, dead_letters, enqueue, executions, find, list, metrics, mutexes,
    orphans, queues, rate_limits, rebalance, rebalance_resume, relay, retention, schedules, serve, shard,
    start, status, tasks, topology, tree, usage,
};

mod commands;
mod exit;
mod moves;
mod output;
mod parse;
#[cfg(test)]
mod reference;

#[derive(Parser)]
#[command(
    name = "sheaf",
    version,
    about = "Operate a fleet of sheaf shard databases",
    after_help = "The shards come from the environment only, never from the command line \
                  (where every process on the host can read them): SHEAF_SHARDS holds \
                  `<id>=<connection string>` entries, comma-separated or a JSON list; \
                  or, for a single database, SHEAF_DATABASE_URL alone; \
                  SHEAF_READABLE, SHEAF_WRITABLE, SHEAF_RESERVED, SHEAF_DEFAULT_SHARD, \
                  SHEAF_RESIDENCY, SHEAF_FORWARDS and SHEAF_TENANTS are optional (see docs/reference/settings.md)."
)]
struct Cli {
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Who is acting, for the shards' audit logs (default: $USER, else the
    /// database login role).
    #[arg(long, global = true, env = "USER", value_name = "WHO")]
    actor: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// Every command, in the order `sheaf --help` lists them; each one's help
/// is its module's `Args`.
#[derive(Subcommand)]
enum Command {
    Status(status::Args),
    List(list::Args),
    Find(find::Args),
    Usage(usage::Args),
    Start(start::Args),
    Enqueue(enqueue::Args),
    Executions(executions::Args),
    Tasks(tasks::Args),
    DeadLetters(dead_letters::Args),
    Queues(queues::Args),
    Metrics(metrics::Args),
    #[command(alias = "ui")]
    Serve(serve::Args),
    RateLimits(rate_limits::Args),
    Schedules(schedules::Args),
    Retention(retention::Args),
    Concurrency(concurrency::Args),
    Mutexes(mutexes::Args),
    Tree(tree::Args),
    Orphans(orphans::Args),
    Config(config::Args),
    Audit(audit::Args),
    Rebalance(rebalance::Args),
    RebalanceResume(rebalance_resume::Args),
    Shard(shard::Args),
    Topology(topology::Args),
    Relay(relay::Args),
}

#[tokio::main]
async fn main() -> ExitCode {
    // `sheaf ... | head` ends quietly when head is done, as other command
    // line tools do, instead of panicking on the closed pipe.
    // SAFETY: restores the default disposition of one signal, before any
    // thread of ours writes to stdout.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return exit::clap(&e).into(),
    };
    exit::set_json(cli.json);
    let ctx = Context::new(cli.json, cli.actor);
    let done = match cli.command {
        Command::Status(args) => status::run(args, &ctx).await,
        Command::List(args) => list::run(args, &ctx).await,
        Command::Find(args) => find::run(args, &ctx).await,
        Command::Usage(args) => usage::run(args, &ctx).await,
        Command::Start(args) => start::run(args, &ctx).await,
        Command::Enqueue(args) => enqueue::run(args, &ctx).await,
        Command::Executions(args) => executions::run(args, &ctx).await,
        Command::Tasks(args) => tasks::run(args, &ctx).await,
        Command::DeadLetters(args) => dead_letters::run(args, &ctx).await,
        Command::Queues(args) => queues::run(args, &ctx).await,
        Command::Metrics(args) => metrics::run(args, &ctx).await,
        Command::Serve(args) => serve::run(args, &ctx).await,
        Command::RateLimits(args) => rate_limits::run(args, &ctx).await,
        Command::Schedules(args) => schedules::run(args, &ctx).await,
        Command::Retention(args) => retention::run(args, &ctx).await,
        Command::Concurrency(args) => concurrency::run(args, &ctx).await,
        Command::Mutexes(args) => mutexes::run(args, &ctx).await,
        Command::Tree(args) => tree::run(args, &ctx).await,
        Command::Orphans(args) => orphans::run(args, &ctx).await,
        Command::Config(args) => config::run(args, &ctx).await,
        Command::Audit(args) => audit::run(args, &ctx).await,
        Command::Rebalance(args) => rebalance::run(args, &ctx).await,
        Command::RebalanceResume(args) => rebalance_resume::run(args, &ctx).await,
        Command::Shard(args) => shard::run(args, &ctx).await,
        Command::Topology(args) => topology::run(args, &ctx).await,
        Command::Relay(args) => relay::run(args, &ctx).await,
    };
    done.into()
}
