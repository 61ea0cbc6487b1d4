//! Starting workflow executions through SQL (`sheaf.start_workflow`), as the
//! tests that check the server's answers do.

use serde_json::Value;
use tokio_postgres::{Client, Error};
use uuid::Uuid;

use crate::query_retrying;

/// What `sheaf.start_workflow` answered.
#[derive(Debug)]
pub struct Started {
    pub id: Uuid,
    pub created: bool,
    pub superseded: Vec<Uuid>,
}

/// `sheaf.start_workflow(name, workflow_id, input)`, retried when Postgres
/// picks it as a deadlock victim.
pub async fn start(db: &Client, name: &str, workflow_id: &str, input: &Value) -> Result<Started, Error> {
    let rows = query_retrying(
        db,
        "SELECT execution_id, created, superseded FROM sheaf.start_workflow($1, $2, $3)",
        &[&name, &workflow_id, input],
    )
    .await?;
    assert_eq!(rows.len(), 1, "start_workflow returns one row");
    Ok(Started {
        id: rows[0].get(0),
        created: rows[0].get(1),
        superseded: rows[0].get(2),
    })
}

/// A start the test expects to create a new execution.
pub async fn start_new(db: &Client, name: &str, workflow_id: &str, input: &Value) -> Started {
    let s = start(db, name, workflow_id, input)
        .await
        .unwrap_or_else(|e| panic!("start {name}/{workflow_id} {input}: {e}"));
    assert!(
        s.created,
        "start {name}/{workflow_id} attached instead of creating: {s:?}"
    );
    s
}
