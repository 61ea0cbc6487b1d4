//! Cancelling one task: `cancel_task`.

use pgrx::prelude::*;

use crate::base::args::{self, required};
use crate::base::audit;
use crate::queue::cancel;
use crate::workflow::hooks::EXECUTIONS;

/// Cancels a task; true if this call did, false if it was cancelled
/// already. A scheduled, waiting, ready or paused task leaves at once and
/// its slot passes on. A running one is marked: its holder learns it on its
/// next `heartbeat`, `complete`, `fail`, `snooze` or `set_progress` (57000),
/// stops, and gives it back with `release`, which ends it (or its lease
/// runs out); it keeps its slot until then. Its execution's history gets
/// `TaskCancelled`. A workflow task is refused (55000: cancel its
/// execution), as is a dead letter; an unknown task is P0002. `reason` is
/// kept whole up to the one size limit (1 MiB; longer is 54000).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn cancel_task(task_id: Option<pgrx::Uuid>, reason: default!(Option<&str>, "NULL")) -> bool {
    let task_id = required(task_id, "task_id");
    let reason = reason.map(|r| args::text(r, "reason"));
    let cancelled = cancel::cancel(task_id, reason, &EXECUTIONS);
    audit::record(
        "cancel_task",
        &task_id.to_string(),
        if cancelled { "ok" } else { "already_cancelled" },
        serde_json::json!({"reason": reason.map(sheaf_core::excerpt::excerpt)}),
    );
    cancelled
}
