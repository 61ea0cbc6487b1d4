//! `sheaf`: the operator's command line.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use sheaf_driver::{Client, PoolOptions};

mod config;
mod execution;
mod executions;
mod exit;
mod metrics;
mod operations;
mod rate_limits;
mod rebalance;
mod relay;
mod reports;
mod retention;
mod schedules;
mod shard;
mod tasks;
mod topology;
mod ui;

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
                  SHEAF_RESIDENCY and SHEAF_FORWARDS are optional (see docs/reference/settings.md)."
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
        /// A filter tree as JSON (and, or, not, attr tests: see docs/reference/sql/executions.md).
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
    /// One execution by id, on the shard it lives on: read it, its
    /// history, or act on it. Exits 4 when no such execution.
    Executions {
        #[command(subcommand)]
        what: ExecutionsCommand,
    },
    /// A queue's tasks across every shard, state by state (running, ready,
    /// scheduled, waiting, paused), a page at a time; one task by id.
    Tasks {
        #[command(subcommand)]
        what: TasksCommand,
    },
    /// Dead letters across every shard, newest first, a page at a time.
    DeadLetters {
        #[command(subcommand)]
        what: DeadLettersCommand,
    },
    /// Every queue of every shard: its tasks by state and dead letters,
    /// per shard and in total, and its oldest ready task's age. Exits 3
    /// when partial.
    Queues,
    /// Serve the fleet's metrics over HTTP (`/metrics`, Prometheus text):
    /// per shard reachability, breaker and requests, and per shard and
    /// queue its tasks by state and oldest ready age, sampled at most every
    /// --sample-every. Runs until SIGINT or SIGTERM.
    Metrics {
        #[command(subcommand)]
        what: MetricsCommand,
    },
    /// Serve the fleet dashboard in the browser (shards, queues,
    /// executions, dead letters, tasks, usage, rebalancing) until SIGINT or
    /// SIGTERM; prints its address first. Actions (redrive, purge, cancel)
    /// need the admin token in SHEAF_UI_TOKEN (16+ characters); without it
    /// the dashboard is read-only.
    Ui {
        /// Where to listen (loopback by default).
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// A host name (`host` or `host:port`) the dashboard answers to
        /// besides its address (and localhost, when on loopback or every
        /// address); repeatable. Requests naming any other are refused.
        #[arg(long = "public-host", value_name = "HOST")]
        public_hosts: Vec<String>,
    },
    /// Rate limits on every shard (each shard paces its own buckets) and
    /// pacing overrides, fanned out to every readable shard. Exits 3 when
    /// a shard did not answer or take it.
    RateLimits {
        #[command(subcommand)]
        what: RateLimitsCommand,
    },
    /// Schedules: cron timings (or @every) that start a workflow or enqueue
    /// a task, created on the fleet's default shard, whose maintain fires
    /// them. Exits 4 for an unknown schedule.
    Schedules {
        #[command(subcommand)]
        what: SchedulesCommand,
    },
    /// How long every shard keeps what has ended (ended executions with
    /// their history, dead letters, seals of moved runs); `sheaf.maintain`,
    /// which every worker runs, deletes what is past it.
    Retention {
        #[command(subcommand)]
        what: RetentionCommand,
    },
    /// Every concurrency key of every shard: running, ready and waiting
    /// tasks added up, and each shard's cap. Exits 3 when partial.
    Concurrency,
    /// Every descendant of an execution, across every shard, indented under
    /// its parent with the shard it runs on. Exits 3 when partial.
    Tree {
        /// The root execution's id.
        execution_id: String,
    },
    /// Children whose parent's shard has no record of them (shards restored
    /// to different instants: see docs/concepts/across-shards.md). Exits 5 when it finds any,
    /// 3 when partial.
    Orphans,
    /// The fleet's workflow policies, queue options and caps, declared once
    /// in a JSON file ({"workflows": {...}, "queues": {...}, "caps": {...}}).
    Config {
        #[command(subcommand)]
        what: ConfigCommand,
    },
    /// What operators did, newest first, from every shard's audit log
    /// (configuration, topology digests, redrives, terminations), each with
    /// the actor its session declared (--actor) and its login role.
    Audit {
        /// Entries per shard.
        #[arg(long, default_value_t = 50)]
        limit: i32,
    },
    /// Move quiescent executions from one shard to another, one at a time
    /// (copy, byte-for-byte verify, one cutover transaction, activation),
    /// with a progress bar, then a table of what moved and what stayed with
    /// its blockers. Ids keep working: the source keeps a seal that points
    /// at the new home. Every move writes an audit entry (--actor). Exits 1
    /// when a move failed (run rebalance-resume).
    Rebalance {
        /// The shard to move from.
        #[arg(long)]
        from: u32,
        /// The shard to move to.
        #[arg(long)]
        to: u32,
        /// Move at most this many executions.
        #[arg(long)]
        limit: Option<usize>,
        /// Report what would move and why the rest would not; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// How long each move is this process's without a step, in seconds
        /// (5..3600): `rebalance-resume` takes a move over only after it
        /// lapsed.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(5..=3600))]
        lease: u64,
    },
    /// Finish the moves a crash or an interruption left on a shard: before
    /// the cutover, discard the staged copy and move it again; after it,
    /// activate the copy on its target (a worker does that on its own
    /// after 30 s).
    RebalanceResume {
        /// The shard the moves are from.
        #[arg(long)]
        from: u32,
    },
    /// A shard's lifecycle: its readiness (the pre-flip checklist).
    Shard {
        #[command(subcommand)]
        what: ShardCommand,
    },
    /// The topology's digest (what to pin in SHEAF_TOPOLOGY_DIGEST) and
    /// comparing two deployments' topologies.
    Topology {
        #[command(subcommand)]
        what: TopologyCommand,
    },
    /// Run the relay alone (every Worker runs one for its shards): child
    /// workflows across shards and the outbox of signals and cancels by
    /// key. Runs until SIGINT or SIGTERM, printing each shard's backlog.
    /// Its login needs role sheaf_relay on every shard it relays (exits 7
    /// naming the shard and the fix when one lacks it).
    Relay {
        /// Only this shard's rows (repeatable; default: every shard).
        #[arg(long = "shard", value_name = "N")]
        shards: Vec<u32>,
        /// How often the backlog is printed.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        report_every: Duration,
    },
}

#[derive(Subcommand)]
enum ExecutionsCommand {
    /// Its state, input, result or error, keys and times.
    Get {
        /// The execution's id.
        execution_id: String,
    },
    /// Its history, a page at a time.
    History {
        /// The execution's id.
        execution_id: String,
        /// Events after this seq (the `more:` of the page before).
        #[arg(long, default_value_t = 0)]
        after: i64,
        /// Events per page (1 to 10000).
        #[arg(long, default_value_t = 100)]
        page_size: usize,
    },
    /// Cancel it (its tasks leave, its children hear of it).
    Cancel {
        /// The execution's id.
        execution_id: String,
        /// Why (kept in its history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Terminate it: end it now, as an operator (written to the audit log).
    Terminate {
        /// The execution's id.
        execution_id: String,
        /// Why (kept in its history).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Pause it: its tasks wait, holding no slot, until resumed.
    Pause {
        /// The execution's id.
        execution_id: String,
    },
    /// Resume a paused execution.
    Resume {
        /// The execution's id.
        execution_id: String,
    },
    /// Send it a signal (deduplicated by --signal-id).
    Signal {
        /// The execution's id.
        execution_id: String,
        /// The signal's name.
        name: String,
        /// Its payload, as JSON.
        #[arg(long)]
        payload: Option<String>,
        /// Delivered once per id.
        #[arg(long)]
        signal_id: Option<String>,
    },
}

#[derive(Subcommand)]
enum TasksCommand {
    /// A queue's tasks; exits 3 when a shard did not answer.
    List {
        /// The queue.
        queue: String,
        /// Only this state: scheduled, waiting, ready, running or paused.
        #[arg(long)]
        state: Option<String>,
        /// Tasks per page (1 to 999).
        #[arg(long, default_value_t = 50)]
        page_size: usize,
        /// Where to go on from: the `more:` cursor of the page before.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// One task (or its dead letter) by id, payload included; exits 4 when
    /// its shard has neither (completed tasks are not kept).
    Get {
        /// The task's id.
        task_id: String,
    },
    /// Cancel a task: an unclaimed one leaves at once, a running one when
    /// its worker hears of it (or at its lease's end). A workflow task is
    /// refused (cancel its execution). Exits 4 when its shard has no such
    /// task.
    Cancel {
        /// The task's id.
        task_id: String,
        /// Why, kept with the cancellation and told to its worker.
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Subcommand)]
enum DeadLettersCommand {
    /// Dead letters, newest first; exits 3 when a shard did not answer.
    List {
        /// Only this queue's.
        #[arg(long)]
        queue: Option<String>,
        /// Dead letters per page (1 to 999).
        #[arg(long, default_value_t = 50)]
        page_size: usize,
        /// Where to go on from: the `more:` cursor of the page before.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Put dead letters back in line with fresh attempts: a queue's on
    /// every shard (in batches, with a progress bar, until none is left to
    /// move: those that cannot go back stay), or the ones named. Prints a
    /// count per shard; exits 3 when a shard did not answer.
    Redrive {
        /// Every dead letter of this queue.
        #[arg(long, conflicts_with = "task_ids", required_unless_present = "task_ids")]
        queue: Option<String>,
        /// Only those dead longer than this (1h, 7days).
        #[arg(long, requires = "queue", value_parser = operations::parse_age)]
        older_than: Option<Duration>,
        /// These dead letters (each shard moves its ids or none).
        task_ids: Vec<String>,
    },
    /// Delete a queue's dead letters older than --older-than on every
    /// shard (their tenants' quota counters follow). Prints a count per
    /// shard; exits 3 when a shard did not answer.
    Purge {
        /// The queue.
        #[arg(long)]
        queue: String,
        /// Only those dead longer than this (1h, 7days; 0s: all of them).
        #[arg(long, value_parser = operations::parse_age)]
        older_than: Duration,
    },
}

#[derive(Subcommand)]
enum MetricsCommand {
    /// Listen on ADDR (127.0.0.1:9464; port 0 takes any free port, printed).
    Serve {
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1:9464")]
        listen: std::net::SocketAddr,
        /// The shortest time between two samples of the shards' queues.
        #[arg(long, default_value = "15s", value_parser = parse_duration)]
        sample_every: Duration,
    },
}

#[derive(Subcommand)]
enum RateLimitsCommand {
    /// Every shard's rate limits, overrides, buckets and waiting units.
    List,
    /// Declare (or change) a rate limit on every shard.
    Declare {
        /// The limit's name.
        name: String,
        /// Units per period.
        #[arg(long)]
        rate: f64,
        /// The period (default 1s).
        #[arg(long)]
        period: Option<String>,
        /// Units at once (default: the rate, rounded up).
        #[arg(long)]
        burst: Option<i64>,
        /// A bucket per value of this payload path (payload.tenant).
        #[arg(long)]
        key: Option<String>,
    },
    /// Pace a limit (or workflow:NAME, a start throttle) at --rate per
    /// --period for --ttl, on every readable shard.
    Override {
        /// The limit's name, or workflow:NAME.
        name: String,
        /// Units per period.
        #[arg(long)]
        rate: f64,
        /// The period (1s, 1m).
        #[arg(long, value_parser = parse_human_duration)]
        period: Duration,
        /// How long the override lasts (10m, 2h; each shard reads its end
        /// on its own clock).
        #[arg(long, value_parser = parse_human_duration)]
        ttl: Duration,
    },
    /// Remove a pacing override on every readable shard.
    Clear {
        /// The limit's name, or workflow:NAME.
        name: String,
    },
}

#[derive(Subcommand)]
enum SchedulesCommand {
    /// Every schedule of every shard: its timing, what it starts, its next
    /// fire and its last outcome. Exits 3 when a shard did not answer.
    List,
    /// Create a schedule: --cron and --workflow or --queue, or a whole
    /// --spec (flags given beside it replace its fields).
    Create(Box<schedules::CreateArgs>),
    /// Change the fields of a schedule's spec that a JSON patch names; its
    /// timing starts again from now.
    Update {
        /// The schedule's name.
        name: String,
        /// The fields to change, as JSON (null removes one).
        #[arg(long)]
        spec: String,
    },
    /// Pause a schedule: it fires nothing until resumed.
    Pause {
        /// The schedule's name.
        name: String,
    },
    /// Resume a paused schedule from its next fire time after now.
    Resume {
        /// The schedule's name.
        name: String,
    },
    /// Fire a schedule now (paused or not), under its overlap policy.
    /// Exits 1 when the start failed.
    Trigger {
        /// The schedule's name.
        name: String,
    },
    /// Delete a schedule and its fire records (what it started runs on).
    Delete {
        /// The schedule's name.
        name: String,
    },
    /// A schedule's latest fire records.
    Fires {
        /// The schedule's name.
        name: String,
        /// How many (1 to 1000).
        #[arg(long, default_value_t = 20)]
        limit: i32,
    },
}

#[derive(Subcommand)]
enum RetentionCommand {
    /// Each shard's policy; exits 3 when a shard did not answer.
    Get,
    /// Change the fields given on every shard (the rest stay as they are).
    /// Each is a duration from 1 minute to 100 years (30days, 12h) or
    /// `forever`. Exits 3 when a shard did not take it.
    Set {
        /// Ended executions, with their history.
        #[arg(long)]
        executions: Option<String>,
        /// Dead letters.
        #[arg(long)]
        dead_letters: Option<String>,
        /// Seals of executions moved to another shard (their old ids route
        /// through them).
        #[arg(long)]
        seals: Option<String>,
        /// Queues of the default configuration with nothing in them.
        #[arg(long)]
        idle_queues: Option<String>,
        /// Schedules' fire records.
        #[arg(long)]
        schedule_fires: Option<String>,
        /// One workflow's ended executions: NAME=DURATION (repeatable;
        /// NAME=default removes its own setting).
        #[arg(long = "workflow", value_name = "NAME=DURATION")]
        workflows: Vec<String>,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Apply the file to every shard (entries it does not name stay as they
    /// are; a cap of null removes it). Exits 3 when a shard did not take it.
    Apply {
        /// The configuration file.
        file: String,
    },
    /// Show each shard whose configuration differs from most shards'.
    /// Exits 5 when one does.
    Diff,
    /// Print one shard's configuration as the file `apply` takes (JSON).
    Show {
        /// The shard to read.
        #[arg(long, default_value_t = 0)]
        shard: u32,
    },
}

#[derive(Subcommand)]
enum ShardCommand {
    /// Move every quiescent execution off SHARD, each to its rendezvous
    /// winner among the other writable shards, hand its seals to the shard
    /// its ids will forward to, then list what stayed (with blockers) and
    /// the SHEAF_FORWARDS entry to add when the shard leaves SHEAF_SHARDS
    /// (a forward from a listed shard is refused). Take
    /// SHARD out of SHEAF_WRITABLE first. Exits 5 while executions stay.
    Drain {
        /// The shard to drain.
        shard: u32,
        /// Move at most this many.
        #[arg(long)]
        limit: Option<usize>,
        /// Report what would move and why the rest would not; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// How long each move is this process's without a step, in seconds
        /// (5..3600): `rebalance-resume` takes a move over only after it
        /// lapsed.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(5..=3600))]
        lease: u64,
    },
    /// Each shard `ready` or `degraded` with reason codes (unreachable,
    /// identity_mismatch, schema_incompatible, schema_behind_fleet,
    /// no_live_worker, stranded_work, topology_digest_mismatch): run it
    /// before a new shard is made writable. Exits 6 unless every shard
    /// reported is ready.
    Health {
        /// Only this shard (the one about to be made writable).
        #[arg(long, value_name = "SHARD")]
        candidate: Option<u32>,
        /// How long one probe may take.
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        timeout: Duration,
    },
}

#[derive(Subcommand)]
enum TopologyCommand {
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

/// A duration as humantime reads it (`90s`, `10m`, `2h 30m`).
fn parse_human_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("`{s}` is not a duration like 30s, 10m or 2h: {e}"))
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
    // `sheaf ... | head` ends quietly when head is done, as other command
    // line tools do, instead of panicking on the closed pipe.
    // SAFETY: restores the default disposition of one signal, before any
    // thread of ours writes to stdout.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    // Comparing files needs no shards.
    if let Command::Topology {
        what: TopologyCommand::Diff { a, b },
    } = &cli.command
    {
        return topology::diff(a, b, cli.json);
    }
    // Connection strings carry credentials: they come from the environment
    // alone, never from an argument every process on the host can read.
    let options = PoolOptions {
        actor: cli.actor.clone(),
        ..PoolOptions::default()
    };
    let client = match Client::from_env(options).await {
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
        Command::Executions { what } => {
            use execution::Action;
            let (id, action) = match what {
                ExecutionsCommand::Get { execution_id } => (execution_id, Action::Get),
                ExecutionsCommand::History {
                    execution_id,
                    after,
                    page_size,
                } => (execution_id, Action::History { after, page_size }),
                ExecutionsCommand::Cancel { execution_id, reason } => {
                    (execution_id, Action::Cancel { reason })
                }
                ExecutionsCommand::Terminate { execution_id, reason } => {
                    (execution_id, Action::Terminate { reason })
                }
                ExecutionsCommand::Pause { execution_id } => (execution_id, Action::Pause),
                ExecutionsCommand::Resume { execution_id } => (execution_id, Action::Resume),
                ExecutionsCommand::Signal {
                    execution_id,
                    name,
                    payload,
                    signal_id,
                } => (
                    execution_id,
                    Action::Signal {
                        name,
                        payload,
                        signal_id,
                    },
                ),
            };
            execution::run(&client, &id, action, cli.json).await
        }
        Command::Tasks { what } => match what {
            TasksCommand::List {
                queue,
                state,
                page_size,
                cursor,
            } => {
                tasks::list(
                    &client,
                    &queue,
                    state.as_deref(),
                    cursor.as_deref(),
                    page_size,
                    cli.json,
                )
                .await
            }
            TasksCommand::Get { task_id } => tasks::get(&client, &task_id, cli.json).await,
            TasksCommand::Cancel { task_id, reason } => {
                operations::cancel(&client, &task_id, reason.as_deref(), cli.json).await
            }
        },
        Command::DeadLetters { what } => match what {
            DeadLettersCommand::List {
                queue,
                page_size,
                cursor,
            } => tasks::dead_letters(&client, queue.as_deref(), cursor.as_deref(), page_size, cli.json).await,
            DeadLettersCommand::Redrive {
                queue: Some(queue),
                older_than,
                ..
            } => operations::redrive_queue(&client, &queue, older_than.unwrap_or_default(), cli.json).await,
            DeadLettersCommand::Redrive { task_ids, .. } => {
                operations::redrive_ids(&client, &task_ids, cli.json).await
            }
            DeadLettersCommand::Purge { queue, older_than } => {
                operations::purge(&client, &queue, older_than, cli.json).await
            }
        },
        Command::Queues => tasks::queues(&client, cli.json).await,
        Command::Concurrency => reports::concurrency(&client, cli.json).await,
        Command::Metrics {
            what: MetricsCommand::Serve { listen, sample_every },
        } => metrics::serve(client, listen, sample_every).await,
        Command::Ui { listen, public_hosts } => ui::serve(client, listen, public_hosts).await,
        Command::Schedules { what } => schedule_command(&client, what, cli.json).await,
        Command::RateLimits { what } => match what {
            RateLimitsCommand::List => rate_limits::list(&client, cli.json).await,
            RateLimitsCommand::Declare {
                name,
                rate,
                period,
                burst,
                key,
            } => rate_limits::declare(&client, &name, rate, period, burst, key, cli.json).await,
            RateLimitsCommand::Override {
                name,
                rate,
                period,
                ttl,
            } => rate_limits::override_pace(&client, &name, rate, period, ttl, cli.json).await,
            RateLimitsCommand::Clear { name } => rate_limits::clear(&client, &name, cli.json).await,
        },
        Command::Retention {
            what: RetentionCommand::Get,
        } => retention::get(&client, cli.json).await,
        Command::Retention {
            what:
                RetentionCommand::Set {
                    executions,
                    dead_letters,
                    seals,
                    idle_queues,
                    schedule_fires,
                    workflows,
                },
        } => {
            let args = retention::SetArgs {
                executions,
                dead_letters,
                seals,
                idle_queues,
                schedule_fires,
                workflows,
            };
            retention::set(&client, &args, cli.json).await
        }
        Command::Tree { execution_id } => relay::tree(&client, &execution_id, cli.json).await,
        Command::Orphans => relay::orphans(&client, cli.json).await,
        Command::Audit { limit } => config::audit(&client, limit, cli.json).await,
        Command::Rebalance {
            from,
            to,
            limit,
            dry_run,
            lease,
        } => rebalance::rebalance(&client, from, to, limit, dry_run, lease, cli.json).await,
        Command::RebalanceResume { from } => rebalance::resume(&client, from, cli.json).await,
        Command::Config {
            what: ConfigCommand::Apply { file },
        } => config::apply(&client, &file, cli.json).await,
        Command::Config {
            what: ConfigCommand::Diff,
        } => config::diff(&client, cli.json).await,
        Command::Config {
            what: ConfigCommand::Show { shard },
        } => config::show(&client, shard).await,
        Command::Shard {
            what: ShardCommand::Health { candidate, timeout },
        } => shard::health(&client, candidate, timeout, cli.json).await,
        Command::Shard {
            what:
                ShardCommand::Drain {
                    shard,
                    limit,
                    dry_run,
                    lease,
                },
        } => rebalance::drain(&client, shard, limit, dry_run, lease, cli.json).await,
        Command::Topology { what } => match what {
            TopologyCommand::Digest => topology::digest(client.topology(), cli.json),
            TopologyCommand::Diff { a, b } => topology::diff(&a, &b, cli.json),
            TopologyCommand::Publish { replace } => topology::publish(&client, !replace, cli.json).await,
        },
        Command::Relay { shards, report_every } => relay::run(client, shards, report_every, cli.json).await,
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
                    println!(
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
                        println!(
                            "         relay: {} child row(s) failing, {} outbox row(s) waiting on a shard that cannot be read{}",
                            r.children_failing,
                            r.outbox_indeterminate,
                            r.oldest_indeterminate_secs
                                .map_or(String::new(), |s| format!(" (for {s:.0}s)"))
                        );
                    }
                    for q in &p.stranded {
                        println!(
                            "         stranded: queue {:?} has {} ready tasks and no live worker",
                            q.queue, q.ready
                        );
                    }
                }
                println!(
                    "roles: r readable, w writable, R reserved, d default; relay: child rows + outbox rows to carry"
                );
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

async fn schedule_command(client: &Client, what: SchedulesCommand, as_json: bool) -> ExitCode {
    use schedules::Change;
    match what {
        SchedulesCommand::List => schedules::list(client, as_json).await,
        SchedulesCommand::Create(args) => schedules::create(client, &args, as_json).await,
        SchedulesCommand::Update { name, spec } => schedules::update(client, &name, &spec, as_json).await,
        SchedulesCommand::Pause { name } => schedules::change(client, &name, Change::Pause, as_json).await,
        SchedulesCommand::Resume { name } => schedules::change(client, &name, Change::Resume, as_json).await,
        SchedulesCommand::Delete { name } => schedules::change(client, &name, Change::Delete, as_json).await,
        SchedulesCommand::Trigger { name } => schedules::trigger(client, &name, as_json).await,
        SchedulesCommand::Fires { name, limit } => schedules::fires(client, &name, limit, as_json).await,
    }
}
