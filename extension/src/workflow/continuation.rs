//! Continue-as-new: a run ends `CONTINUED_AS_NEW` and its successor starts,
//! with the same (name, workflow id), in the same transaction. The successor
//! takes over the run's place: active uniqueness (the start lock is held
//! throughout, so a concurrent start attaches to one of the two, never makes
//! a third), its concurrency key and quota key (no gate or quota check: the
//! chain keeps the slot it had), its queue, search attributes and deadline.
//! The histories link both ways: the run's `WorkflowContinuedAsNew` names the
//! successor, the successor's `WorkflowStarted` its predecessor.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use sheaf_core::state::ExecutionState;

use crate::base::errors::{not_ready, unknown_execution};
use crate::base::ids;
use crate::base::jsonb::Jsonb;
use crate::base::locks::{self, Class};
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::queue::{complete, tasks};
use crate::workflow::executions::{self, Locked};
use crate::workflow::lifecycle::{self, Close};
use crate::workflow::start::{self, Begin, Timeout};
use crate::workflow::{hooks, quota};

const PRIOR: Stmt = Stmt::read(
    "SELECT workflow_name, workflow_id, search_attrs, timeout_at FROM executions WHERE id = $1",
    &[PgBuiltInOids::UUIDOID],
);
const EXECUTION_OF_TASK: Stmt = Stmt::read(
    "SELECT execution_id FROM tasks WHERE id = $1",
    &[PgBuiltInOids::UUIDOID],
);

row! {
    /// What the successor inherits that `Locked` does not carry.
    struct Prior {
        workflow_name: String,
        workflow_id: String,
        search_attrs: pgrx::JsonB,
        timeout_at: Option<TimestampWithTimeZone>,
    }
}

fn prior(id: pgrx::Uuid) -> Prior {
    PRIOR
        .first(&[id.into()], "reading an execution")
        .unwrap_or_else(|| unknown_execution(id))
}

/// Locks the run's tasks, then its row (`base::locks`), and refuses what
/// cannot continue: a run that moved (the forwarding error, which names its
/// shard for the driver), one moving (55000), one that ended (55000), a
/// child (55000: its parent waits for this run's own end).
fn lock_continuable(id: pgrx::Uuid) -> Locked {
    tasks::lock_of_execution(id);
    let e = executions::try_lock(id).unwrap_or_else(|| unknown_execution(id));
    executions::forward(id, e.state);
    match e.state {
        ExecutionState::Migrating => not_ready(format!(
            "execution {id} is MIGRATING: it continues as new where it lives once its move is done"
        )),
        s if !s.is_active() => not_ready(format!(
            "execution {id} is {s}: only an active execution continues as new"
        )),
        _ if e.parent_id.is_some() => not_ready(format!(
            "execution {id} is a child execution: its parent waits for its own end, so it cannot continue as new"
        )),
        _ => e,
    }
}

/// Starts the successor of `prior_id` (closed just before), holding its
/// place; returns its id.
fn begin_successor(
    e: Locked,
    p: Prior,
    prior_id: pgrx::Uuid,
    successor: pgrx::Uuid,
    input: Jsonb,
) -> pgrx::Uuid {
    let next = Locked {
        id: successor,
        state: ExecutionState::Running,
        paused_from: None,
        parent_id: None,
        ..e
    };
    if let Some(key) = &next.quota_key {
        // The predecessor's close gave its active slot back.
        quota::add(key, 1, 0, 0);
    }
    // The chain keeps its place: its successor is not throttled again.
    start::insert(
        &next,
        input,
        Begin {
            priority: 0,
            run_at: None,
            search_attrs: p.search_attrs,
            timeout: Timeout::Inherited(p.timeout_at),
            continued_from: Some(prior_id),
            placement: None,
        },
    );
    successor
}

/// `sheaf.continue_as_new`: ends active execution `id` `CONTINUED_AS_NEW`
/// and starts its successor with `input`; returns the successor's id. The
/// run's unfinished tasks are cancelled as in any terminal transition (a
/// handler ending its own run uses `with_task`).
pub fn continue_as_new(id: pgrx::Uuid, input: Jsonb) -> pgrx::Uuid {
    let p = prior(id);
    locks::exclusive_pair(Class::Start, &p.workflow_name, &p.workflow_id);
    let e = lock_continuable(id);
    let successor = ids::mint();
    lifecycle::close(id, Close::ContinuedAsNew { successor });
    begin_successor(e, p, id, successor, input)
}

/// `sheaf.complete_task_and_continue_as_new`: completes the task claimed
/// under `token` and continues its execution as new, in one transaction (the
/// task's `TaskCompleted` first in the run's history). The errors of
/// `complete_task_and_execution`, then those of `continue_as_new`.
pub fn with_task(task_id: pgrx::Uuid, token: i64, input: Jsonb) -> pgrx::Uuid {
    let execution_id: Option<pgrx::Uuid> = EXECUTION_OF_TASK
        .value::<Option<pgrx::Uuid>>(&[task_id.into()], "reading a task")
        .flatten();
    let Some(id) = execution_id else {
        // Gone, stale, or of no execution: the completion's own refusal.
        complete::take(task_id, token);
        not_ready(format!(
            "task {task_id} belongs to no execution: complete it with sheaf.complete"
        ));
    };
    let p = prior(id);
    locks::exclusive_pair(Class::Start, &p.workflow_name, &p.workflow_id);
    let e = lock_continuable(id);
    let successor = ids::mint();
    hooks::close_with_task(task_id, token, None, Close::ContinuedAsNew { successor });
    begin_successor(e, p, id, successor, input)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{claim, count, declare, init, start, state};
    use pgrx::prelude::*;
    use serde_json::json;

    fn continue_as_new(id: pgrx::Uuid, input: serde_json::Value) -> pgrx::Uuid {
        Spi::get_one_with_args::<pgrx::Uuid>(
            "SELECT sheaf.continue_as_new($1, $2)",
            &[id.into(), pgrx::JsonB(input).into()],
        )
        .expect("continue_as_new")
        .expect("a successor")
    }

    #[pg_test]
    fn the_successor_takes_the_run_s_place_and_the_histories_link_both() {
        init();
        declare(
            "w",
            json!({"queue": "wq", "concurrency": {"key": "input.k", "limit": 1},
                   "quota": {"key": "input.k", "max_active_executions": 1}}),
        );
        let a = start("w", "chain", json!({"k": "t", "n": 1})).id;
        let b = continue_as_new(a, json!({"k": "t", "n": 2}));
        assert_ne!(a, b);
        assert_eq!(
            (state(a), state(b)),
            ("CONTINUED_AS_NEW".into(), "RUNNING".into())
        );
        let linked = |sql: &str, id: pgrx::Uuid| {
            Spi::get_one_with_args::<String>(sql, &[id.into()])
                .unwrap()
                .unwrap()
        };
        assert_eq!(
            linked(
                "SELECT payload->>'successor' FROM sheaf.events WHERE execution_id = $1 \
                 AND event_type = 'WorkflowContinuedAsNew'",
                a
            ),
            b.to_string()
        );
        assert_eq!(
            linked(
                "SELECT payload->>'continued_from' FROM sheaf.events WHERE execution_id = $1 AND seq = 1",
                b
            ),
            a.to_string()
        );
        // Uniqueness passed on: a start attaches to the successor.
        let again = start("w", "chain", json!({"k": "t"}));
        assert_eq!((again.id, again.created), (b, false));
        // The gate's slot and the quota's active count passed on, not doubled.
        assert_eq!(count("SELECT active_executions FROM sheaf.quota_usage('t')"), 1);
        let t = claim("wq", 10);
        assert_eq!(t.len(), 1, "only the successor's workflow task");
        assert_eq!(t[0].payload.0["input"]["n"], 2);
    }

    #[pg_test]
    fn a_handler_continues_its_own_run_with_its_task() {
        init();
        let a = start("w", "chain", json!({"n": 1})).id;
        let t = claim("default", 1);
        let b = Spi::get_one_with_args::<pgrx::Uuid>(
            "SELECT sheaf.complete_task_and_continue_as_new($1, $2, '{\"n\": 2}')",
            &[t[0].id.into(), t[0].token.into()],
        )
        .unwrap()
        .unwrap();
        assert_eq!(state(a), "CONTINUED_AS_NEW");
        assert_eq!(
            count(&format!(
                "SELECT count(*) FROM sheaf.events WHERE execution_id = '{a}' \
                 AND event_type IN ('TaskCompleted', 'WorkflowContinuedAsNew')"
            )),
            2
        );
        let next = claim("default", 1);
        assert_eq!(next[0].payload.0["input"]["n"], 2);
        assert_eq!(state(b), "RUNNING");
    }

    #[pg_test(error = "no execution 00010000-0000-8000-8000-000000000001 on this shard")]
    fn an_unknown_run_is_refused() {
        init();
        Spi::run("SELECT sheaf.continue_as_new('00010000-0000-8000-8000-000000000001', '{}')").unwrap();
    }

    #[pg_test(
        error = "execution 00010000-0000-8000-8000-000000000001 is CANCELLED: only an active execution continues as new"
    )]
    fn an_ended_run_does_not_continue() {
        init();
        Spi::run(
            "SELECT sheaf.start_workflow('w', 'x', '{}', \
                    '{\"execution_id\": \"00010000-0000-8000-8000-000000000001\"}')",
        )
        .unwrap();
        Spi::run("SELECT sheaf.cancel_execution('00010000-0000-8000-8000-000000000001', NULL)").unwrap();
        Spi::run("SELECT sheaf.continue_as_new('00010000-0000-8000-8000-000000000001', '{}')").unwrap();
    }

    #[pg_test]
    fn a_successor_keeps_its_predecessor_s_deadline() {
        init();
        Spi::run("SELECT sheaf.start_workflow('w', 'x', '{}', '{\"execution_timeout\": \"1 hour\"}')")
            .unwrap();
        let a = Spi::get_one::<pgrx::Uuid>("SELECT id FROM sheaf.executions")
            .unwrap()
            .unwrap();
        let b = continue_as_new(a, json!({}));
        let same = Spi::get_one_with_args::<bool>(
            "SELECT (SELECT timeout_at FROM sheaf.executions WHERE id = $1) \
                  = (SELECT timeout_at FROM sheaf.executions WHERE id = $2)",
            &[a.into(), b.into()],
        )
        .unwrap();
        assert_eq!(same, Some(true));
    }
}
