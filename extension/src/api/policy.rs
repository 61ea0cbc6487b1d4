//! Workflow policies: declaring one.

use pgrx::prelude::*;
use sheaf_core::options::{MAX_KEY_BYTES, MAX_QUEUE_NAME_BYTES};
use sheaf_core::policy::WorkflowPolicy;

use crate::base::args::{self, required};
use crate::base::audit;
use crate::base::errors::bad_argument;
use crate::base::jsonb::Jsonb;
use crate::base::names::{self, Kind};
use crate::workflow::policy;

/// Declares (or replaces) a workflow's policy; every field is optional:
/// `{"queue": "default",
///   "concurrency": {"key": "input.tenant_id", "limit": 10, "on_conflict": "defer"},
///   "quota": {"key": "input.tenant_id", "max_active_executions": 100,
///             "max_history_bytes": 1e9, "max_dead_letters": 50}}`.
/// Applies to starts from now on; running executions keep what they got.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn declare_workflow(name: Option<&str>, policy: Option<Jsonb>) {
    let name = policy::check_name(name);
    let policy = required(policy, "policy").parse("policy");
    let parsed = match WorkflowPolicy::parse(&policy) {
        Ok(p) => p,
        Err(e) => bad_argument(&e.option, e.why),
    };
    // The name rule (`args::new_name`): a name with a policy or an
    // execution here, or a queue that exists, keeps working.
    args::new_name(name, "name", MAX_KEY_BYTES, || {
        names::stored(Kind::Workflow, name)
    });
    args::new_name(&parsed.queue, "policy.queue", MAX_QUEUE_NAME_BYTES, || {
        names::stored(Kind::Queue, &parsed.queue)
    });
    policy::store(name, &parsed);
    audit::record("declare_workflow", name, "ok", policy);
}
