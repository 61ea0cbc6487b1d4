//! Schedules: created, changed and fired by hand on the fleet's default
//! shard (the guide's rule: schedules land there, and that shard's
//! `maintain` fires them); listed on every readable shard, so a schedule
//! made on another shard with SQL is seen too.

use std::time::SystemTime;

use super::fleet::FleetReport;
use super::{Admin, Call, Client, ClientError, Owned, first_column, single};
use crate::id::{ExecutionId, TaskId};
use crate::json::Json;
use crate::topology::ShardId;
use crate::words::{word, word_opt, words};

const CREATE: &str = "SELECT sheaf.create_schedule($1, $2)";
const UPDATE: &str = "SELECT sheaf.update_schedule($1, $2)";
const PAUSE: &str = "SELECT sheaf.pause_schedule($1)";
const RESUME: &str = "SELECT sheaf.resume_schedule($1)";
const DELETE: &str = "SELECT sheaf.delete_schedule($1)";
const TRIGGER: &str = "SELECT fire_at, outcome, execution_id, task_id, error FROM sheaf.trigger_schedule($1)";
const LIST: &str = "SELECT name, spec, paused, next_fire_at, last_fire_at, last_outcome, last_error, fires, \
     skipped, created_at, updated_at FROM sheaf.list_schedules()";
const FIRES: &str = "SELECT fire_at, fired_at, outcome, execution_id, task_id, error, manual \
     FROM sheaf.schedule_fires($1, $2, $3)";

/// A schedule, as `sheaf.list_schedules` returns it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Schedule {
    /// The shard that holds it (and fires it).
    pub shard: ShardId,
    /// Its name.
    pub name: String,
    /// Its spec, every default spelled out.
    pub spec: Json,
    /// Paused: it fires nothing until resumed.
    pub paused: bool,
    /// The first fire time not yet handled.
    pub next_fire_at: Option<SystemTime>,
    /// Its last fire's time, outcome and error.
    pub last_fire_at: Option<SystemTime>,
    /// `started`, `skipped_overlap` or `failed`.
    pub last_outcome: Option<FireOutcome>,
    /// Why the last fire failed.
    pub last_error: Option<String>,
    /// Fire records written.
    pub fires: i64,
    /// Due times passed over by the catch-up policy.
    pub skipped: i64,
    /// When it was created and last changed.
    pub created_at: SystemTime,
    /// When it was last changed.
    pub updated_at: SystemTime,
}

words! {
    /// What a schedule's fire did.
    pub enum FireOutcome {
        /// It started its workflow run, or enqueued its task.
        Started = "started",
        /// Skipped: the previous run was unfinished.
        SkippedOverlap = "skipped_overlap",
        /// The shard refused the start (the fire's `error` says why).
        Failed = "failed",
    }
}

/// One fire of a schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fire {
    /// The fire time (a manual trigger's: when it was asked).
    pub fire_at: SystemTime,
    /// When it was handled (`None` from a trigger: now).
    pub fired_at: Option<SystemTime>,
    /// What it did.
    pub outcome: FireOutcome,
    /// The workflow run it started.
    pub execution_id: Option<ExecutionId>,
    /// The task it enqueued.
    pub task_id: Option<TaskId>,
    /// The refusal (`<SQLSTATE>: <message>`).
    pub error: Option<String>,
    /// From `trigger_schedule`, not the timing.
    pub manual: bool,
}

/// The most fire records one page holds.
pub const MAX_FIRES_PAGE: i32 = 1000;

impl Client {
    fn schedule_call(&self, name: &str) -> Call {
        Call {
            shard: self.topology.default_shard(),
            owned: Owned::Schedule(name.to_owned()),
        }
    }
}

impl Admin<'_> {
    /// Creates schedule `name` from `spec` (see docs/reference/sql/schedules.md)
    /// on the default shard; returns its first fire time.
    /// [`ClientError::WrongState`] if the name is taken,
    /// [`ClientError::InvalidArgument`] naming what is wrong in the spec.
    pub async fn create_schedule(self, name: &str, spec: impl Into<Json>) -> Result<SystemTime, ClientError> {
        let call = self.client.schedule_call(name);
        let spec = spec.into();
        let rows = self.client.query(&call, CREATE, &[&name, &spec]).await?;
        first_column(&call, &rows)
    }

    /// Changes the fields of schedule `name`'s spec that `patch` names
    /// (`null` removes one; naming `workflow` or `task` replaces the
    /// action); its timing starts again from now. Returns the next fire
    /// time; [`ClientError::UnknownSchedule`] if there is none.
    pub async fn update_schedule(
        self,
        name: &str,
        patch: impl Into<Json>,
    ) -> Result<SystemTime, ClientError> {
        let call = self.client.schedule_call(name);
        let patch = patch.into();
        let rows = self.client.query(&call, UPDATE, &[&name, &patch]).await?;
        first_column(&call, &rows)
    }

    /// Pauses schedule `name`; `false` if it was paused already.
    pub async fn pause_schedule(self, name: &str) -> Result<bool, ClientError> {
        let call = self.client.schedule_call(name);
        let rows = self.client.query(&call, PAUSE, &[&name]).await?;
        first_column(&call, &rows)
    }

    /// Resumes schedule `name` from its next fire time after now; `false`
    /// if it was not paused.
    pub async fn resume_schedule(self, name: &str) -> Result<bool, ClientError> {
        let call = self.client.schedule_call(name);
        let rows = self.client.query(&call, RESUME, &[&name]).await?;
        first_column(&call, &rows)
    }

    /// Deletes schedule `name` and its fire records (what it started runs
    /// on); `false` if there was none.
    pub async fn delete_schedule(self, name: &str) -> Result<bool, ClientError> {
        let call = self.client.schedule_call(name);
        let rows = self.client.query(&call, DELETE, &[&name]).await?;
        first_column(&call, &rows)
    }

    /// Fires schedule `name` now (paused or not) under its overlap policy.
    pub async fn trigger_schedule(self, name: &str) -> Result<Fire, ClientError> {
        let call = self.client.schedule_call(name);
        let rows = self.client.query(&call, TRIGGER, &[&name]).await?;
        let row = single(&call, &rows)?;
        fire_from_row(row, true).map_err(|e| call.error(e, 1))
    }

    /// Schedule `name`'s fire records before `before` (`None`: the newest),
    /// newest first, 1 to [`MAX_FIRES_PAGE`] of them.
    pub async fn schedule_fires(
        self,
        name: &str,
        before: Option<SystemTime>,
        max_rows: i32,
    ) -> Result<Vec<Fire>, ClientError> {
        if !(1..=MAX_FIRES_PAGE).contains(&max_rows) {
            return Err(ClientError::BadRequest(format!(
                "max_rows must be from 1 to {MAX_FIRES_PAGE}, got {max_rows}"
            )));
        }
        let call = self.client.schedule_call(name);
        let rows = self
            .client
            .query(&call, FIRES, &[&name, &before, &max_rows])
            .await?;
        rows.iter()
            .map(|row| fire_from_row(row, false).map_err(|e| call.error(e, 1)))
            .collect()
    }

    /// Every schedule on every readable shard, by shard and name.
    pub async fn list_schedules(self) -> FleetReport<Vec<Schedule>> {
        self.client
            .fan_out(self.client.readable_shards(), |shard| async move {
                let (call, rows) = self
                    .client
                    .on_shard(shard, Owned::Listing("schedules"), LIST, &[])
                    .await?;
                rows.iter()
                    .map(|row| {
                        let read = || -> Result<Schedule, tokio_postgres::Error> {
                            Ok(Schedule {
                                shard,
                                name: row.try_get("name")?,
                                spec: row.try_get("spec")?,
                                paused: row.try_get("paused")?,
                                next_fire_at: row.try_get("next_fire_at")?,
                                last_fire_at: row.try_get("last_fire_at")?,
                                last_outcome: word_opt(row, "last_outcome")?,
                                last_error: row.try_get("last_error")?,
                                fires: row.try_get("fires")?,
                                skipped: row.try_get("skipped")?,
                                created_at: row.try_get("created_at")?,
                                updated_at: row.try_get("updated_at")?,
                            })
                        };
                        read().map_err(|e| call.error(e, 1))
                    })
                    .collect()
            })
            .await
    }
}

/// A fire from `trigger_schedule` (`triggered`: no `fired_at` or `manual`
/// column, it was fired now by hand) or `schedule_fires`.
fn fire_from_row(row: &tokio_postgres::Row, triggered: bool) -> Result<Fire, tokio_postgres::Error> {
    Ok(Fire {
        fire_at: row.try_get("fire_at")?,
        fired_at: if triggered { None } else { row.try_get("fired_at")? },
        outcome: word(row, "outcome")?,
        execution_id: row
            .try_get::<_, Option<uuid::Uuid>>("execution_id")?
            .map(ExecutionId::from_uuid),
        task_id: row
            .try_get::<_, Option<uuid::Uuid>>("task_id")?
            .map(TaskId::from_uuid),
        error: row.try_get("error")?,
        manual: triggered || row.try_get("manual")?,
    })
}
