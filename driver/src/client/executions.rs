//! Executions: start (placed by the router, id minted here), read, and end.

use std::time::SystemTime;

use sheaf_core::state::ExecutionState;

use super::options::placement_opt;
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
const SIGNAL_WITH_START: &str = "SELECT execution_id, created, superseded \
     FROM sheaf.signal_with_start($1, $2, $3, $4, $5, \
          $6 || jsonb_build_object('run_at', $7::timestamptz, 'signal_id', $8::text))";
const SEAL_OF: &str = "SELECT execution_id FROM sheaf.find_execution($1, $2)";
const OPEN_WINDOW: &str = "SELECT 1 FROM sheaf.pending_starts($1, 1, $2)";
const CONTINUE_AS_NEW: &str = "SELECT sheaf.continue_as_new($1, $2)";
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
        let mut shard = self.start_shard(name, workflow_id, &options)?;
        if let Some(window) = self.window_elsewhere(name, &options).await? {
            shard = window;
        }
        let (call, opts) = self.start_call_on(shard, name, workflow_id, &options).await?;
        let rows = self
            .query(
                &call,
                START,
                &[&name, &workflow_id, &input, &opts, &options.run_at],
            )
            .await?;
        let started = started_from_rows(&call, &rows)?;
        self.metrics
            .superseded(call.shard, name, started.superseded.len());
        if started.created {
            return Ok(started);
        }
        // Attached: the run found may be a seal of one that moved away, and
        // `shard` says where the run lives (one more read, attaches only).
        let shard = self.residence(call.shard, started.execution_id).await?;
        Ok(Started { shard, ..started })
    }

    /// Where run `id` lives: a read of it from `start`, following its
    /// seals' forwards (`start` when no shard has it, e.g. a child its
    /// relay has yet to start).
    pub(super) async fn residence(&self, start: ShardId, id: ExecutionId) -> Result<ShardId, ClientError> {
        let at = Call {
            shard: start,
            owned: Owned::Execution(id),
        };
        let (shard, _) = self.query_followed(&at, GET_EXECUTION, &[&id.as_uuid()]).await?;
        Ok(shard)
    }

    /// A start's call (its shard, placed by `start_shard`) and its `opts`,
    /// with the execution id minted for that shard.
    async fn start_call(
        &self,
        name: &str,
        workflow_id: &str,
        options: &StartOptions,
    ) -> Result<(Call, serde_json::Value), ClientError> {
        let shard = self.start_shard(name, workflow_id, options)?;
        self.start_call_on(shard, name, workflow_id, options).await
    }

    async fn start_call_on(
        &self,
        shard: ShardId,
        name: &str,
        workflow_id: &str,
        options: &StartOptions,
    ) -> Result<(Call, serde_json::Value), ClientError> {
        let opts = options.to_sql_opts(ExecutionId::mint(shard)?);
        let placement = placement_opt(options.placement.as_ref(), options.tenant.as_deref());
        let opts = self.with_placement(shard, opts, placement).await;
        let call = Call {
            shard,
            owned: Owned::Workflow {
                name: name.to_owned(),
                workflow_id: workflow_id.to_owned(),
            },
        };
        Ok((call, opts))
    }

    /// Where a start goes: by its placement (or tenant), or, debounced, by
    /// its debounce key (a pin or tenant with a debounce is refused, never
    /// dropped: the key decides where the burst meets).
    fn start_shard(
        &self,
        name: &str,
        workflow_id: &str,
        options: &StartOptions,
    ) -> Result<ShardId, ClientError> {
        let placement = options.placement.clone().unwrap_or(Placement::Auto);
        match &options.debounce {
            Some(_) if placement != Placement::Auto || options.tenant.is_some() => {
                Err(ClientError::BadRequest(
                    "a debounced start is placed by its debounce key: it takes no placement or tenant".into(),
                ))
            }
            Some(_) if options.run_at.is_some() => Err(ClientError::BadRequest(
                "a debounced start is due when its window ends: give run_at or debounce, not both".into(),
            )),
            Some((key, ..)) => {
                Ok(self
                    .topology
                    .place(&format!("debounce:{name}"), key, &Placement::Auto, None)?)
            }
            None => Ok(self
                .topology
                .place(name, workflow_id, &placement, options.tenant.as_deref())?),
        }
    }

    /// A debounced start whose key's home stopped taking work (its shard is
    /// being drained) joins the window still open there: a window does not
    /// move (`debounce_open`), so the burst meets where it began. Asks only
    /// for the keys that moved.
    async fn window_elsewhere(
        &self,
        name: &str,
        options: &StartOptions,
    ) -> Result<Option<ShardId>, ClientError> {
        let Some((key, ..)) = &options.debounce else {
            return Ok(None);
        };
        self.open_window_at_former_home(name, key).await
    }

    /// The former home of debounce key (`name`, `key`) if a window of it is
    /// open there.
    pub(super) async fn open_window_at_former_home(
        &self,
        name: &str,
        key: &str,
    ) -> Result<Option<ShardId>, ClientError> {
        let Some(former) =
            self.topology
                .former_home(&format!("debounce:{name}"), key, &Placement::Auto, None)
        else {
            return Ok(None);
        };
        let owned = Owned::Workflow {
            name: name.to_owned(),
            workflow_id: key.to_owned(),
        };
        let (_, rows) = self.on_shard(former, owned, OPEN_WINDOW, &[&name, &key]).await?;
        Ok((!rows.is_empty()).then_some(former))
    }

    /// Signal-with-start: starts `name` with `workflow_id` as
    /// [`start_workflow`](Self::start_workflow) does (placed the same way,
    /// by `options`), or finds its active execution, and delivers `signal`
    /// with `payload` to it, in one transaction on its shard
    /// (`sheaf.signal_with_start`): racing starts and signal-with-starts of
    /// one workflow id make one run, and it gets every signal. `signal_id`
    /// makes a retry deliver nothing more. A run found moved to another
    /// shard is signalled there (`created = false`).
    #[allow(clippy::too_many_arguments)]
    pub async fn signal_with_start(
        &self,
        name: &str,
        workflow_id: &str,
        input: impl Into<Json>,
        signal: &str,
        payload: impl Into<Json>,
        signal_id: Option<&str>,
        options: StartOptions,
    ) -> Result<Started, ClientError> {
        let (input, payload) = (input.into(), payload.into());
        if options.debounce.is_some() {
            return Err(ClientError::BadRequest(
                "a signal-with-start is not debounced: its signal needs the run now".into(),
            ));
        }
        let (call, opts) = self.start_call(name, workflow_id, &options).await?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] = [
            &name,
            &workflow_id,
            &input,
            &signal,
            &payload,
            &opts,
            &options.run_at,
            &signal_id,
        ];
        match self.query(&call, SIGNAL_WITH_START, &params).await {
            Ok(rows) => {
                let started = started_from_rows(&call, &rows)?;
                self.metrics
                    .superseded(call.shard, name, started.superseded.len());
                Ok(started)
            }
            // The placed shard holds the run's seal: signal it where it
            // lives, from the seal's forward on, and report the shard that
            // took the signal (the forward may be one hop of several).
            Err(ClientError::Moved { to, .. }) => {
                let rows = self.query(&call, SEAL_OF, &[&name, &workflow_id]).await?;
                let seal = ExecutionId::from_uuid(first_column::<uuid::Uuid>(&call, &rows)?);
                let from = self.topology.serving(to);
                let shard = self.signal_from(from, seal, signal, payload, signal_id).await?.0;
                Ok(Started {
                    execution_id: seal,
                    shard,
                    created: false,
                    superseded: Vec::new(),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Continue-as-new: ends active execution `id` `CONTINUED_AS_NEW` and
    /// starts its successor with `input`, the same (name, workflow id),
    /// queue, keys, search attributes and deadline, in one transaction on
    /// its shard (`sheaf.continue_as_new`); returns the successor (on the
    /// same shard). Refused (55000) for a run that ended, is moving, or is a
    /// child. A workflow task's handler continues its own run with
    /// [`TaskDone::ContinueAsNew`](crate::TaskDone::ContinueAsNew) instead.
    pub async fn continue_as_new(
        &self,
        id: ExecutionId,
        input: impl Into<Json>,
    ) -> Result<ExecutionId, ClientError> {
        let call = self.by_execution(id);
        let input = input.into();
        let rows = self
            .query(&call, CONTINUE_AS_NEW, &[&id.as_uuid(), &input])
            .await?;
        first_column::<uuid::Uuid>(&call, &rows).map(ExecutionId::from_uuid)
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
        let start = self.by_execution(id).shard;
        Ok(self.cancel_from(start, id, reason).await?.1)
    }

    /// [`cancel_execution`](Self::cancel_execution) sent to shard `start`
    /// first, following the run's forwards: the shard that answered, and
    /// what it said.
    pub(crate) async fn cancel_from(
        &self,
        start: ShardId,
        id: ExecutionId,
        reason: Option<&str>,
    ) -> Result<(ShardId, bool), ClientError> {
        let call = Call {
            shard: start,
            owned: Owned::Execution(id),
        };
        let (shard, rows) = self
            .query_followed(&call, CANCEL_EXECUTION, &[&id.as_uuid(), &reason])
            .await?;
        let call = Call { shard, ..call };
        Ok((shard, first_column(&call, &rows)?))
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

/// A start's one row (`start_workflow`, `signal_with_start`, a start in a
/// transaction).
pub(super) fn started_from_rows(call: &Call, rows: &[tokio_postgres::Row]) -> Result<Started, ClientError> {
    let row = single(call, rows)?;
    let read = || -> Result<Started, tokio_postgres::Error> {
        Ok(Started {
            execution_id: ExecutionId::from_uuid(row.try_get("execution_id")?),
            shard: call.shard,
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
