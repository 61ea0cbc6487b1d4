//! Helpers for the `#[pg_test]`s: short ways to drive the SQL API.

use pgrx::prelude::*;

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

/// Claims up to `batch`; returns (task id, token, payload) in claim order.
pub fn claim(queue: &str, batch: i32) -> Vec<(pgrx::Uuid, i64, serde_json::Value)> {
    Spi::connect(|client| {
        client
            .select(
                "SELECT task_id, token, payload FROM sheaf.claim($1, 'test-worker', $2)",
                None,
                &[queue.into(), batch.into()],
            )
            .expect("claim runs")
            .map(|row| {
                (
                    row.get::<pgrx::Uuid>(1).unwrap().unwrap(),
                    row.get::<i64>(2).unwrap().unwrap(),
                    row.get::<pgrx::JsonB>(3).unwrap().unwrap().0,
                )
            })
            .collect()
    })
}

pub fn complete(task: &(pgrx::Uuid, i64, serde_json::Value)) {
    Spi::run_with_args("SELECT sheaf.complete($1, $2)", &[task.0.into(), task.1.into()]).expect("complete");
}

pub fn count(sql: &str) -> i64 {
    Spi::get_one::<i64>(sql)
        .expect("count runs")
        .expect("count is not null")
}

/// The `n` field of each payload, in order.
pub fn ns(tasks: &[(pgrx::Uuid, i64, serde_json::Value)]) -> Vec<i64> {
    tasks
        .iter()
        .map(|t| t.2["n"].as_i64().expect("payload has n"))
        .collect()
}

/// Starts a workflow; returns (execution id, created, superseded).
pub fn start(name: &str, workflow_id: &str, input: serde_json::Value) -> (pgrx::Uuid, bool, Vec<pgrx::Uuid>) {
    Spi::connect(|client| {
        let row = client
            .select(
                "SELECT execution_id, created, superseded FROM sheaf.start_workflow($1, $2, $3)",
                None,
                &[name.into(), workflow_id.into(), pgrx::JsonB(input).into()],
            )
            .expect("start_workflow runs")
            .first();
        (
            row.get::<pgrx::Uuid>(1).unwrap().unwrap(),
            row.get::<bool>(2).unwrap().unwrap(),
            row.get::<Vec<pgrx::Uuid>>(3).unwrap().unwrap(),
        )
    })
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
