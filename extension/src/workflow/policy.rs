//! Workflow policies: the queue, concurrency gate and quota of a workflow
//! name, declared once and applied by every start.

use pgrx::prelude::*;
use sheaf_core::excerpt::quoted;
use sheaf_core::policy::WorkflowPolicy;

use crate::base::args::required;
use crate::base::errors::bad_argument;
use crate::base::plans::Stmt;

const LOAD: Stmt = Stmt::read(
    "SELECT policy FROM workflow_policies WHERE workflow_name = $1",
    &[PgBuiltInOids::TEXTOID],
);
const STORE: Stmt = Stmt::write(
    "INSERT INTO workflow_policies (workflow_name, policy) VALUES ($1, $2) \
     ON CONFLICT (workflow_name) DO UPDATE SET policy = EXCLUDED.policy, updated_at = now()",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::JSONBOID],
);

/// Validates a workflow name: 1 to 256 bytes, no control characters.
pub fn check_name(name: Option<&str>) -> &str {
    let name = required(name, "name");
    if name.is_empty() || name.len() > 256 {
        bad_argument("name", format!("must be 1 to 256 bytes, got {}", name.len()));
    }
    if name.chars().any(char::is_control) {
        bad_argument("name", "must not contain control characters");
    }
    name
}

/// The policy of a workflow name; the default (queue "default", no gates)
/// for a name never declared.
pub fn load(name: &str) -> WorkflowPolicy {
    let stored = LOAD.value::<pgrx::JsonB>(&[name.into()], "reading a workflow policy");
    match stored {
        None => WorkflowPolicy::default(),
        Some(json) => match WorkflowPolicy::parse(&json.0) {
            Ok(p) => p,
            Err(e) => bad_argument(
                "the stored policy",
                format!(
                    "of workflow {} no longer parses ({}); declare it again",
                    quoted(name),
                    e
                ),
            ),
        },
    }
}

/// Stores (or replaces) a workflow's validated policy.
pub fn store(name: &str, policy: &WorkflowPolicy) {
    STORE.exec(&[name.into(), pgrx::JsonB(policy.to_json()).into()]);
}

/// The current pace of a rate-limit bucket's name (`queue::rate::sweep`'s
/// question): a declared rate limit's, or `workflow:<name>`'s start
/// throttle's, with its live override; `None` if neither is declared now.
pub fn current_pace(bucket: &str) -> Option<sheaf_core::rate::Pace> {
    let declared = match bucket.strip_prefix("workflow:") {
        Some(workflow) => load(workflow).throttle.map(|t| t.pace),
        None => crate::queue::rate::declared(bucket).map(|l| l.pace),
    }?;
    Some(crate::queue::rate::effective(bucket, declared))
}
