//! A running task's progress: `set_progress`.

use pgrx::prelude::*;

use crate::base::args::required;
use crate::base::errors::too_large;
use crate::base::jsonb::Jsonb;
use crate::queue::progress;

/// Records the progress of a task running under `token` (any JSON up to
/// 64 KiB), replacing the last report; `get_task` and `list_tasks` show
/// it. Kept beside the task, so a report never rewrites the task's row. A
/// cancelled task raises 57000, a stale token 55P03, a task that is gone
/// P0002; each changes nothing.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn set_progress(task_id: Option<pgrx::Uuid>, token: Option<i64>, progress: Option<Jsonb>) {
    let task_id = required(task_id, "task_id");
    let token = required(token, "token");
    let value = required(progress, "progress").checked("progress");
    let len = value.compact_len();
    // Tighter than the one size limit: progress is rewritten often, read
    // while the task runs. Refused as too large all the same (54000).
    if len > progress::MAX_PROGRESS_BYTES {
        too_large(
            "progress",
            format!(
                "is {len} bytes of JSON; the limit for progress is {} bytes",
                progress::MAX_PROGRESS_BYTES
            ),
        );
    }
    if !progress::enabled() {
        crate::base::errors::not_ready(
            "this shard's catalog predates set_progress: run ALTER EXTENSION sheaf UPDATE",
        );
    }
    progress::set(task_id, token, value);
}
