//! Executions: start (placed by the router, id minted here), read, and end.

use std::time::SystemTime;

use sheaf_core::state::ExecutionState;

use super::{Call, Client, ClientError, Owned, StartOptions, first_column, single};
use crate::id::ExecutionId;
use crate::json::Json;
use crate::router::Placement;
use crate::topology::ShardId;

// `run_at` goes as a timestamptz parameter (NULL: not given).
const START: &str = "SELECT execution_id, created, superseded \
     FROM sheaf.start_workflow($1, $2, $3, $4 || jsonb_build_object('run_at', $5::timestamptz))";
const GET_EXECUTION: &str = "SELECT execution_id, workflow_name, workflow_id, state, input, result, error, \
     concurrency_key, quota_key, history_bytes, created_at, closed_at, wake_at \
     FROM sheaf.get_execution($1)";
const CANCEL_EXECUTION: &str = "SELECT sheaf.cancel_execution($1, $2)";
const COMPLETE_EXECUTION: &str = "SELECT sheaf.complete_execution($1, $2)";
const FAIL_EXECUTION: &str = "SELECT sheaf.fail_execution($1, $2)";

/// A start the shard accepted (or attached to).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Started {
    /// The execution's id (it names the shard).
    pub execution_id: ExecutionId,
    /// The shard that holds the execution.
    pub shard: ShardId,
    /// `false`: (name, workflow id) already had an active execution, and this
    /// is it; nothing was written.
    pub created: bool,
    /// The executions this start cancelled (`cancel_running`, latest wins).
    pub superseded: Vec<ExecutionId>,
}

/// One execution, as `sheaf.get_execution` returns it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Execution {
    /// Its id.
    pub execution_id: ExecutionId,
    /// The shard that answered (the one `execution_id` routes to).
    pub shard: ShardId,
    /// The workflow it runs.
    pub workflow_name: String,
    /// The caller's id for this run.
    pub workflow_id: String,
    /// Where it is in its life.
    pub state: ExecutionState,
    /// Its input, exactly as started.
    pub input: Json,
    /// Its result, once completed.
    pub result: Option<Json>,
    /// Its error, once failed, cancelled or terminated.
    pub error: Option<String>,
    /// The concurrency gate's key, if its policy has one.
    pub concurrency_key: Option<String>,
    /// The quota key, if its policy has one.
    pub quota_key: Option<String>,
    /// The size of its history.
    pub history_bytes: i64,
    /// When it started.
    pub created_at: SystemTime,
    /// When it ended.
    pub closed_at: Option<SystemTime>,
    /// When a suspended execution wakes on its own.
    pub wake_at: Option<SystemTime>,
}

impl Client {
    /// Starts `name` with `workflow_id`, or attaches to its active execution
    /// (`created = false`). The id is minted here for the placed shard, so
    /// later calls route by id alone; a retried attempt carries the same id.
    pub async fn start_workflow(
        &self,
        name: &str,
        workflow_id: &str,
        input: impl Into<Json>,
        options: StartOptions,
    ) -> Result<Started, ClientError> {
        let input = input.into();
        let placement = options.placement.clone().unwrap_or(Placement::Auto);
        let shard = self
            .topology
            .place(name, workflow_id, &placement, options.tenant.as_deref())?;
        let execution_id = ExecutionId::mint(shard)?;
        let opts = options.to_sql_opts(execution_id);
        let call = Call {
            shard,
            owned: Owned::Workflow {
                name: name.to_owned(),
                workflow_id: workflow_id.to_owned(),
            },
        };
        let rows = self
            .query(
                &call,
                START,
                &[&name, &workflow_id, &input, &opts, &options.run_at],
            )
            .await?;
        let row = single(&call, &rows)?;
        let read = || -> Result<Started, tokio_postgres::Error> {
            Ok(Started {
                execution_id: ExecutionId::from_uuid(row.try_get("execution_id")?),
                shard,
                created: row.try_get("created")?,
                superseded: row
                    .try_get::<_, Vec<uuid::Uuid>>("superseded")?
                    .into_iter()
                    .map(ExecutionId::from_uuid)
                    .collect(),
            })
        };
        read().map_err(|e| call.error(e, 1))
    }

    /// The execution, from the shard its id routes to; `None` if that shard
    /// has no such execution.
    pub async fn get_execution(&self, id: ExecutionId) -> Result<Option<Execution>, ClientError> {
        let call = self.by_execution(id);
        let (shard, rows) = self
            .query_followed(&call, GET_EXECUTION, &[&id.as_uuid()])
            .await?;
        // The shard it lives on, when it moved.
        let call = Call { shard, ..call };
        rows.first().map(|row| execution_from_row(&call, row)).transpose()
    }

    /// Cancels an execution; `false` if it had already ended.
    pub async fn cancel_execution(&self, id: ExecutionId, reason: Option<&str>) -> Result<bool, ClientError> {
        let call = self.by_execution(id);
        let rows = self
            .query(&call, CANCEL_EXECUTION, &[&id.as_uuid(), &reason])
            .await?;
        first_column(&call, &rows)
    }

    /// Completes an execution with `result`; `false` if it had already ended.
    /// It cancels the execution's running workflow task: a handler of that
    /// task finishes both at once through the worker instead.
    pub async fn complete_execution(
        &self,
        id: ExecutionId,
        result: impl Into<Json>,
    ) -> Result<bool, ClientError> {
        let call = self.by_execution(id);
        let result = result.into();
        let rows = self
            .query(&call, COMPLETE_EXECUTION, &[&id.as_uuid(), &result])
            .await?;
        first_column(&call, &rows)
    }

    /// Fails an execution with `error`; `false` if it had already ended.
    pub async fn fail_execution(&self, id: ExecutionId, error: &str) -> Result<bool, ClientError> {
        let call = self.by_execution(id);
        let rows = self
            .query(&call, FAIL_EXECUTION, &[&id.as_uuid(), &error])
            .await?;
        first_column(&call, &rows)
    }
}

/// A row's `state` column; a state this driver does not know is an error
/// saying to upgrade it.
pub(crate) fn read_state(call: &Call, row: &tokio_postgres::Row) -> Result<ExecutionState, ClientError> {
    let state: String = row.try_get("state").map_err(|e| call.error(e, 1))?;
    state
        .parse::<ExecutionState>()
        .map_err(|_| ClientError::Database {
            shard: call.shard,
            code: None,
            message: format!(
                "the shard returned execution state {}, which this driver does not know: upgrade the driver",
                sheaf_core::excerpt::quoted(&state)
            ),
        })
}

/// An execution row of `get_execution`'s shape.
pub(crate) fn execution_from_row(call: &Call, row: &tokio_postgres::Row) -> Result<Execution, ClientError> {
    let state = read_state(call, row)?;
    let read = || -> Result<Execution, tokio_postgres::Error> {
        Ok(Execution {
            execution_id: ExecutionId::from_uuid(row.try_get("execution_id")?),
            shard: call.shard,
            workflow_name: row.try_get("workflow_name")?,
            workflow_id: row.try_get("workflow_id")?,
            state,
            input: row.try_get("input")?,
            result: row.try_get("result")?,
            error: row.try_get("error")?,
            concurrency_key: row.try_get("concurrency_key")?,
            quota_key: row.try_get("quota_key")?,
            history_bytes: row.try_get("history_bytes")?,
            created_at: row.try_get("created_at")?,
            closed_at: row.try_get("closed_at")?,
            wake_at: row.try_get("wake_at")?,
        })
    };
    read().map_err(|e| call.error(e, 1))
}
