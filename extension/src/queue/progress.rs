//! A running task's progress (`sheaf.set_progress`), kept beside the task
//! in `task_progress`: a report never rewrites the task row.

use pgrx::prelude::*;

use crate::base::catalog::{self, Feature};
use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;
use crate::queue::lease;

/// The largest progress value kept, in bytes of compact JSON text.
pub const MAX_PROGRESS_BYTES: usize = 65_536;

/// Whether this catalog keeps progress (not a 0.1.0 catalog).
pub fn enabled() -> bool {
    catalog::has(Feature::Progress)
}

// Key-share: a completion waits for the report to commit, so a report never
// outlives its task unseen; two reports of one task do not wait on each other.
const RUNNING: Stmt = Stmt::write(
    "SELECT 1 FROM tasks WHERE id = $1 AND token = $2 AND state = 'running' FOR KEY SHARE",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::INT8OID],
);
const SET: Stmt = Stmt::write(
    "INSERT INTO task_progress (task_id, progress) VALUES ($1, $2) \
     ON CONFLICT (task_id) DO UPDATE SET progress = excluded.progress, updated_at = now()",
    &[PgBuiltInOids::UUIDOID, PgBuiltInOids::JSONBOID],
);
// Progress of tasks that finished: neither unfinished nor a dead letter.
const PRUNE: Stmt = Stmt::write(
    "WITH d AS (DELETE FROM task_progress WHERE task_id IN ( \
       SELECT p.task_id FROM task_progress p \
       WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = p.task_id) \
         AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.id = p.task_id) \
       LIMIT $1) RETURNING 1) \
     SELECT count(*) FROM d",
    &[PgBuiltInOids::INT8OID],
);

/// Records the progress of a task running under `token`.
pub fn set(task_id: pgrx::Uuid, token: i64, progress: Jsonb) {
    let held = RUNNING.count(&[task_id.into(), token.into()]) > 0;
    if !held {
        lease::not_running(task_id, token);
    }
    SET.exec(&[task_id.into(), progress.into()]);
}

/// Deletes up to `max` progress rows of finished tasks; how many.
pub fn prune(max: i64) -> i64 {
    if !enabled() {
        return 0;
    }
    PRUNE.one_value(&[max.into()], "pruning task progress")
}
