//! Helpers for the `#[pg_test]`s: short ways to drive the SQL API, and to
//! read what a test's own SQL returns into named `row!` types (the
//! production `FromRow`, so a test reads a row as sheaf's code does:
//! never by position).

use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;

use crate::base::rows::{self, Column, FromRow, row};

/// Every row `sql` returns with `args`, each read into a `row!` type.
pub fn rows<T: FromRow>(sql: &str, args: &[DatumWithOid<'_>]) -> Vec<T> {
    Spi::connect(|client| rows::all(client.select(sql, None, args).expect(sql), sql))
}

/// The one row `sql` returns with `args` (an error if it returns none).
pub fn one<T: FromRow>(sql: &str, args: &[DatumWithOid<'_>]) -> T {
    Spi::connect(|client| rows::only(client.select(sql, None, args).expect(sql), sql))
}

/// The first column of every row `sql` returns with `args`.
pub fn values<T: Column>(sql: &str, args: &[DatumWithOid<'_>]) -> Vec<T> {
    Spi::connect(|client| rows::values(client.select(sql, None, args).expect(sql), sql))
}

pub fn init() {
    Spi::run("SELECT sheaf.init_shard(1)").expect("init");
}

pub fn enqueue(queue: &str, payload: serde_json::Value, opts: serde_json::Value) -> pgrx::Uuid {
    Spi::get_one_with_args::<pgrx::Uuid>(
        "SELECT sheaf.enqueue($1, $2, $3)",
        &[
            queue.into(),
            pgrx::JsonB(payload).into(),
            pgrx::JsonB(opts).into(),
        ],
    )
    .expect("enqueue runs")
    .expect("enqueue returns an id")
}

row! {
    /// A task `claim` handed out.
    pub struct Claimed {
        pub id: pgrx::Uuid,
        pub token: i64,
        pub payload: pgrx::JsonB,
    }
}

/// Claims up to `batch`, in claim order.
pub fn claim(queue: &str, batch: i32) -> Vec<Claimed> {
    rows(
        "SELECT task_id, token, payload FROM sheaf.claim($1, 'test-worker', $2)",
        &[queue.into(), batch.into()],
    )
}

pub fn complete(task: &Claimed) {
    Spi::run_with_args(
        "SELECT sheaf.complete($1, $2)",
        &[task.id.into(), task.token.into()],
    )
    .expect("complete");
}

pub fn count(sql: &str) -> i64 {
    Spi::get_one::<i64>(sql)
        .expect("count runs")
        .expect("count is not null")
}

/// The `n` field of each payload, in order.
pub fn ns(tasks: &[Claimed]) -> Vec<i64> {
    tasks
        .iter()
        .map(|t| t.payload.0["n"].as_i64().expect("payload has n"))
        .collect()
}

row! {
    /// What `start_workflow` returns.
    pub struct Started {
        pub id: pgrx::Uuid,
        pub created: bool,
        pub superseded: Vec<pgrx::Uuid>,
    }
}

/// Starts a workflow.
pub fn start(name: &str, workflow_id: &str, input: serde_json::Value) -> Started {
    one(
        "SELECT execution_id, created, superseded FROM sheaf.start_workflow($1, $2, $3)",
        &[name.into(), workflow_id.into(), pgrx::JsonB(input).into()],
    )
}

pub fn declare(name: &str, policy: serde_json::Value) {
    Spi::run_with_args(
        "SELECT sheaf.declare_workflow($1, $2)",
        &[name.into(), pgrx::JsonB(policy).into()],
    )
    .expect("declare_workflow runs");
}

pub fn state(id: pgrx::Uuid) -> String {
    Spi::get_one_with_args::<String>("SELECT state FROM sheaf.executions WHERE id = $1", &[id.into()])
        .unwrap()
        .unwrap()
}
