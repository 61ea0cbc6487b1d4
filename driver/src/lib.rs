//! sheaf-driver: use N sheaf shard databases as one queue.
//!
//! Every client computes placement itself; there is no proxy or coordinator.
//! Each shard is a PostgreSQL database with `CREATE EXTENSION sheaf` and
//! `sheaf.init_shard(<id>)` run (`scripts/shards up` brings up local ones).
//!
//! # Quickstart
//!
//! Topology → client → start → worker → shutdown:
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use serde_json::json;
//! use sheaf_driver::{
//!     Client, PoolOptions, StartOptions, TaskContext, TaskDone, TaskFailure, Topology, Worker,
//!     WorkerOptions,
//! };
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // SHEAF_SHARDS="0=postgres://...,1=postgres://..." (never on a command line).
//!     let topology = Topology::from_env()?;
//!     let client = Arc::new(Client::new(topology, PoolOptions::default())?);
//!
//!     // A start is placed on one shard and its id names that shard.
//!     let started = client
//!         .start_workflow("invoice", "inv-42", json!({ "amount": "12.50" }), StartOptions::new())
//!         .await?;
//!     println!("started {} on shard {}", started.execution_id, started.shard);
//!
//!     // The workflow's queue is "default" unless its policy says otherwise.
//!     let worker = Worker::start(
//!         client.clone(),
//!         WorkerOptions::new("billing-1", ["default"]),
//!         |ctx: TaskContext| async move {
//!             let input: serde_json::Value = ctx
//!                 .task()
//!                 .payload
//!                 .deserialize()
//!                 .map_err(|e| TaskFailure::permanent(format!("bad payload: {e}")))?;
//!             // ... do the work; end the workflow with its result:
//!             Ok(TaskDone::CompleteExecution(json!({ "paid": input }).into()))
//!         },
//!     )?;
//!
//!     tokio::time::sleep(Duration::from_secs(5)).await;
//!     // Stops claiming, lets the tasks in hand finish (or releases them),
//!     // and leaves every shard's live-worker registry.
//!     let report = worker.shutdown().await;
//!     println!("drained: {report:?}");
//!     Ok(())
//! }
//! ```
//!
//! # Applications and operators
//!
//! [`Client`] has what an application calls: tasks, executions and the
//! durable mutex. The fleet's and the operator's calls (policies, dead
//! letters, retention, rebalancing and draining, topology and shard
//! lifecycle, reports, the audit log) are on [`Client::admin`], an
//! [`Admin`] borrowing the same client.
//!
//! # Logging
//!
//! The worker and the pools log through [`tracing`]: a failing shard, a lost
//! lease, an undersized pool are warnings. Install a subscriber to see them,
//! e.g. `tracing_subscriber::fmt().with_env_filter("sheaf_driver=info").init()`.
//!
//! More: `driver/examples/` in the repository (the demo, the gates
//! walkthrough, a tour of every client method).
#![warn(missing_docs)]

mod breaker;
mod client;
mod handler;
mod health;
mod id;
mod json;
mod listen;
mod metrics;
#[cfg(feature = "http")]
mod metrics_http;
mod pool;
mod relay;
mod router;
mod schema;
mod status;
mod tls;
mod topology;
mod words;
mod worker;

/// The relay's, the rebalancer's and the worker registry's steps one SQL
/// call at a time, for the `sheaf` command line and the tests. Not part of
/// the API: the driver runs these protocols itself ([`Relay`],
/// [`Admin::rebalance`], [`Worker`]), and they may change in any release.
#[doc(hidden)]
pub mod protocol {
    pub use crate::client::{
        ChildStart, CloseKind, OutboxKind, OutboxOutcome, OutboxRow, Protocol, RelayOutcome, RelayRow,
        ReportStatus, StalledMove, Steps,
    };
}

/// The serving lifecycle the metrics server uses, for the `sheaf-web`
/// crate's dashboard and API (feature `http`). Not part of the API.
#[cfg(feature = "http")]
#[doc(hidden)]
pub mod served {
    pub use crate::metrics_http::Served;
}

pub use breaker::{Breaker, BreakerState};
pub use client::{
    Acquired, Admin, AttrOp, AuditEntry, Blocker, ByKey, Candidate, Child, ChildOptions, ChildPlacement,
    Children, ClaimedTask, Client, ClientError, ConcurrencyStat, DebounceMode, Drain, EnqueueOptions,
    Enqueued, EnqueuedBatch, EnvError, Erasure, Event, EventType, Execution, ExecutionCounts,
    ExecutionFilter, ExecutionPage, ExternalAction, FailOutcome, Fire, FireOutcome, FleetConfig, FleetError,
    FleetReport, GroupBy, HistoryPage, KeyConcurrency, ListPage, ListedDeadLetter, ListedExecution,
    ListedMutex, ListedTask, LockOptions, MAX_BATCH, MAX_CHILDREN, MAX_COUNT_CAP, MAX_FIRES_PAGE,
    MAX_FORWARDS, MAX_HISTORY_PAGE, MAX_LIST_PAGE, MAX_TASK_PAGE, MIN_STALL_AFTER, Migration, MisplacedRun,
    MoveOutcome, MovePhase, MoveReport, MutexGuard, MutexKey, MutexStatus, OnShard, Orphan, Orphans,
    OutboxBacklog, OutboxState, OverrideReport, Owned, PageStatus, ParentClose, PendingStart, Phase,
    PhaseHook, Progress, PublishedTopology, QueueConfig, QueueCounts, QueueListing, QueueOptions, QueueStats,
    QueueSummary, QuotaDetail, QuotaUsage, RateLimitInfo, RebalanceOptions, RegisteredWorker, RelayBacklog,
    Report, Resolution, STALL_AFTER, Schedule, ShardConnection, ShardInfo, SortOrder, StartOptions, Started,
    StartedChild, StateCount, StrandedWork, TaskInfo, TaskStatus, Tree, TreeNode, Unsettled, Usage,
    attr_equality, config_drift,
};
pub use handler::{CancelReason, TaskContext, TaskDone, TaskFailure};
pub use health::{FleetReadiness, HealthReason, Readiness};
pub use id::{ExecutionId, IdError, TaskId};
pub use json::Json;
pub use metrics::{Loop, Metrics, Outcome, RelayEdge, TaskOutcome};
#[cfg(feature = "http")]
pub use metrics_http::{MetricsServer, MetricsServerOptions};
pub use pool::{PoolOptions, ShardError, ShardPools};
pub use relay::{Relay, RelayOptions, Sweep};
pub use router::{Placement, RouteError};
pub use schema::COMPATIBLE_SCHEMAS;
pub use sheaf_core::placement::TenantPlacement;
pub use sheaf_core::state::{ExecutionState, TaskKind, TaskState};
pub use status::{
    LiveWorker, RelayBacklogSummary, ShardHealth, ShardStatus, StrandedQueue, TopologyStatus, probe_shard,
};
pub use tls::ROOT_CERT_VAR;
pub use topology::{Shard, ShardId, Topology, TopologyBuilder, TopologyError};
pub use worker::{Coverage, DrainReport, ProtocolRole, Worker, WorkerError, WorkerOptions, WorkerStats};
