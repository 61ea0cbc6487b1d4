//! Whether a name is stored already: what lets a name from before the name
//! rule (`sheaf_core::hygiene`) keep working. Asked only of a name that
//! breaks the rule's characters (`args::new_name`), so never on a hot path.

use pgrx::prelude::*;

use crate::base::plans::Stmt;

/// A kind of stored name.
#[derive(Debug, Clone, Copy)]
pub enum Kind<'a> {
    /// A queue with a row (used, not dropped or expired as idle).
    Queue,
    /// A workflow name with a declared policy or an execution on this shard.
    Workflow,
    /// A workflow id with an execution of workflow `.0` on this shard.
    WorkflowId(&'a str),
    /// A worker in the live-worker registry.
    Worker,
    /// A mutex key held or waited on.
    Mutex,
    /// A concurrency key with a cap or slots in use.
    ConcurrencyKey,
}

const QUEUE: Stmt = Stmt::read(
    "SELECT EXISTS (SELECT 1 FROM queues WHERE name = $1)",
    &[PgBuiltInOids::TEXTOID],
);
const WORKFLOW: Stmt = Stmt::read(
    "SELECT EXISTS (SELECT 1 FROM workflow_policies WHERE workflow_name = $1) \
     OR EXISTS (SELECT 1 FROM executions WHERE workflow_name = $1)",
    &[PgBuiltInOids::TEXTOID],
);
const WORKFLOW_ID: Stmt = Stmt::read(
    "SELECT EXISTS (SELECT 1 FROM executions WHERE workflow_name = $2 AND workflow_id = $1)",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::TEXTOID],
);
const WORKER: Stmt = Stmt::read(
    "SELECT EXISTS (SELECT 1 FROM workers WHERE name = $1)",
    &[PgBuiltInOids::TEXTOID],
);
const MUTEX: Stmt = Stmt::read(
    "SELECT EXISTS (SELECT 1 FROM mutex_locks WHERE key = $1) \
     OR EXISTS (SELECT 1 FROM mutex_waiters WHERE key = $1)",
    &[PgBuiltInOids::TEXTOID],
);

const CONCURRENCY_KEY: Stmt = Stmt::read(
    "SELECT EXISTS (SELECT 1 FROM concurrency_limits WHERE key = $1) \
     OR EXISTS (SELECT 1 FROM concurrency_slots WHERE key = $1)",
    &[PgBuiltInOids::TEXTOID],
);

/// Whether `name` of `kind` is stored on this shard.
pub fn stored(kind: Kind<'_>, name: &str) -> bool {
    let (stmt, other) = match kind {
        Kind::Queue => (&QUEUE, None),
        Kind::Workflow => (&WORKFLOW, None),
        Kind::WorkflowId(workflow) => (&WORKFLOW_ID, Some(workflow)),
        Kind::Worker => (&WORKER, None),
        Kind::Mutex => (&MUTEX, None),
        Kind::ConcurrencyKey => (&CONCURRENCY_KEY, None),
    };
    let found = match other {
        Some(o) => stmt.value::<bool>(&[name.into(), o.into()], "looking a stored name up"),
        None => stmt.value::<bool>(&[name.into()], "looking a stored name up"),
    };
    found.unwrap_or(false)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::subxact;
    use crate::testing::{count, init, start};
    use pgrx::prelude::*;

    /// Names that break the rule: a bidi override, a zero-width space, a
    /// decomposed accent (not NFC), a control character.
    const BAD: &[&str] = &["pay\u{202e}moc.exe", "q\u{200b}", "cafe\u{301}", "a\nb"];

    /// Every place a name is first stored, with `$1` the name, and the
    /// start of its refusal.
    const CALLS: &[(&str, &str)] = &[
        ("SELECT sheaf.enqueue($1, '{}')", "invalid queue: "),
        (
            "SELECT sheaf.enqueue_batch($1, ARRAY['{}'::jsonb])",
            "invalid queue: ",
        ),
        (
            "SELECT sheaf.configure_queue($1, '{\"notify\": true}')",
            "invalid queue: ",
        ),
        (
            "SELECT sheaf.enqueue('q', '{}', jsonb_build_object('idempotency_key', $1::text))",
            "invalid opts.idempotency_key: ",
        ),
        (
            "SELECT sheaf.enqueue('q', '{}', jsonb_build_object('concurrency_key', $1::text))",
            "invalid opts.concurrency_key: ",
        ),
        (
            "SELECT sheaf.enqueue('q', '{}', jsonb_build_object('fairness_key', $1::text))",
            "invalid opts.fairness_key: ",
        ),
        ("SELECT sheaf.start_workflow($1, 'id', '{}')", "invalid name: "),
        (
            "SELECT sheaf.start_workflow('w', $1, '{}')",
            "invalid workflow_id: ",
        ),
        (
            "SELECT sheaf.start_workflow('w', 'id', '{}', jsonb_build_object('queue', $1::text))",
            "invalid opts.queue: ",
        ),
        (
            "SELECT sheaf.start_workflow('w', 'id', '{}', jsonb_build_object('search_attrs', jsonb_build_object($1::text, 1)))",
            "invalid opts.search_attrs: ",
        ),
        (
            "SELECT sheaf.start_workflow('w', 'id', '{}', jsonb_build_object('debounce', jsonb_build_object('key', $1::text, 'window', '1s')))",
            "invalid opts.debounce.key: ",
        ),
        (
            "SELECT sheaf.signal_with_start($1, 'id', '{}', 's', '{}')",
            "invalid name: ",
        ),
        ("SELECT sheaf.declare_workflow($1, '{}')", "invalid name: "),
        (
            "SELECT sheaf.declare_workflow('w', jsonb_build_object('queue', $1::text))",
            "invalid policy.queue: ",
        ),
        (
            "SELECT sheaf.create_schedule($1, '{\"cron\": \"@every 1s\", \"task\": {\"queue\": \"q\"}}')",
            "invalid name: ",
        ),
        (
            "SELECT sheaf.create_schedule('s', jsonb_build_object('cron', '@every 1s', 'task', jsonb_build_object('queue', $1::text)))",
            "invalid spec.task.queue: ",
        ),
        (
            "SELECT sheaf.create_schedule('s', jsonb_build_object('cron', '@every 1s', 'workflow', jsonb_build_object('name', $1::text)))",
            "invalid spec.workflow.name: ",
        ),
        (
            "SELECT sheaf.declare_rate_limit($1, '{\"rate\": 1}')",
            "invalid name: ",
        ),
        (
            "SELECT sheaf.worker_heartbeat($1, ARRAY['q'])",
            "invalid worker: ",
        ),
        (
            "SELECT sheaf.mutex_acquire($1, gen_random_uuid())",
            "invalid key: ",
        ),
        ("SELECT sheaf.set_concurrency_limit($1, 1)", "invalid key: "),
        ("SELECT sheaf.claim('q', $1)", "invalid worker: "),
    ];

    /// `sql` with `$1` the name: its SQLSTATE and message, or "ok".
    fn outcome(sql: &str, name: &str) -> (String, String) {
        match subxact::attempt(|| Spi::run_with_args(sql, &[name.into()]).expect(sql)) {
            Ok(()) => ("ok".into(), String::new()),
            Err(f) => (f.sqlstate, f.message),
        }
    }

    /// Every place a name is first stored refuses one that breaks the
    /// rule: 22023, naming the argument, quoting none of the name.
    #[pg_test]
    fn every_new_name_follows_the_name_rule() {
        init();
        let exec = start("w", "attrs", serde_json::json!({})).id;
        let upsert = format!("SELECT sheaf.upsert_search_attrs('{exec}', jsonb_build_object($1::text, 1))");
        let upsert = (upsert.as_str(), "invalid attrs: ");
        let calls = CALLS.iter().chain(std::iter::once(&upsert));
        let tables = "SELECT (SELECT count(*) FROM sheaf.queues) + (SELECT count(*) FROM sheaf.tasks) \
                      + (SELECT count(*) FROM sheaf.executions) + (SELECT count(*) FROM sheaf.workflow_policies) \
                      + (SELECT count(*) FROM sheaf.schedules) + (SELECT count(*) FROM sheaf.rate_limits) \
                      + (SELECT count(*) FROM sheaf.workers) + (SELECT count(*) FROM sheaf.mutex_locks) \
                      + (SELECT count(*) FROM sheaf.concurrency_limits)";
        for &(sql, prefix) in calls {
            for name in BAD {
                let before = count(tables);
                let (code, message) = outcome(sql, name);
                assert_eq!(count(tables), before, "{sql} with {name:?} wrote nothing");
                assert_eq!(code, "22023", "{sql} with {name:?}: {message}");
                assert!(message.starts_with(prefix), "{sql} with {name:?}: {message}");
                assert!(!message.contains("moc.exe"), "the name is not echoed: {message}");
            }
            // The same call with a clean name passes the rule (it may be
            // refused for something else, never for its name).
            let (_, message) = outcome(sql, "clean-name");
            assert!(
                !message.contains("character") && !message.contains("NFC"),
                "{sql}: {message}"
            );
        }
    }

    /// Names stored before the rule keep working: a call naming a queue, a
    /// workflow, an execution, a worker or a mutex that exists is not
    /// refused for its characters.
    #[pg_test]
    fn names_stored_before_the_rule_keep_working() {
        init();
        let (queue, workflow, id, worker, key, capped) = (
            "q\u{200b}",
            "pay\u{202e}w",
            "cafe\u{301}",
            "w\u{feff}",
            "k\u{2066}",
            "c\u{2067}",
        );
        // As an older sheaf stored them.
        Spi::run_with_args(
            "INSERT INTO sheaf.queues (name) VALUES ($1); \
             INSERT INTO sheaf.workflow_policies (workflow_name, policy) VALUES ($2, '{}'); \
             INSERT INTO sheaf.workers (name, queues) VALUES ($3, ARRAY['q']); \
             INSERT INTO sheaf.mutex_locks (key, holder, token, lease_expires_at) \
                 VALUES ($4, gen_random_uuid(), 1, now() + interval '1 hour'); \
             INSERT INTO sheaf.concurrency_limits (key, max_running) VALUES ($5, 1)",
            &[
                queue.into(),
                workflow.into(),
                worker.into(),
                key.into(),
                capped.into(),
            ],
        )
        .expect("the old rows");
        let ok = |sql: &str, args: &[&str]| {
            let args: Vec<_> = args.iter().map(|a| (*a).into()).collect();
            Spi::run_with_args(sql, &args).unwrap_or_else(|e| panic!("{sql}: {e}"));
        };
        ok("SELECT sheaf.enqueue($1, '{}')", &[queue]);
        ok("SELECT sheaf.configure_queue($1, '{\"notify\": true}')", &[queue]);
        ok("SELECT sheaf.start_workflow($1, 'fine', '{}')", &[workflow]);
        ok("SELECT sheaf.declare_workflow($1, '{}')", &[workflow]);
        ok(
            "SELECT sheaf.declare_workflow('w2', jsonb_build_object('queue', $1::text))",
            &[queue],
        );
        ok("SELECT sheaf.worker_heartbeat($1, ARRAY['q'])", &[worker]);
        ok("SELECT sheaf.claim('q', $1)", &[worker]);
        ok("SELECT sheaf.set_concurrency_limit($1, 2)", &[capped]);
        ok("SELECT sheaf.set_concurrency_limit($1, NULL)", &[capped]);
        ok("SELECT sheaf.mutex_acquire($1, gen_random_uuid())", &[key]);
        // An execution's id from before the rule: a start finds it, not a new one.
        Spi::run_with_args(
            "UPDATE sheaf.executions SET workflow_id = $1 WHERE workflow_name = $2",
            &[id.into(), workflow.into()],
        )
        .expect("an old id");
        ok("SELECT sheaf.start_workflow($2, $1, '{}')", &[id, workflow]);
        // A search attribute key the execution has keeps working.
        let exec = start("w3", "a", serde_json::json!({})).id;
        Spi::run_with_args(
            "UPDATE sheaf.executions SET search_attrs = jsonb_build_object($1::text, 1) WHERE id = $2",
            &[key.into(), exec.into()],
        )
        .expect("an old attribute");
        Spi::run_with_args(
            "SELECT sheaf.upsert_search_attrs($2, jsonb_build_object($1::text, 2))",
            &[key.into(), exec.into()],
        )
        .expect("an old attribute key updates");
        // Its length was always checked: a stored name is not let off that.
        let (code, _) = outcome("SELECT sheaf.enqueue($1, '{}')", &"q\u{200b}".repeat(40));
        assert_eq!(code, "22023");
    }
}
