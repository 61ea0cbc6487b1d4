//! One valid call of every function in schema `sheaf`: the shared asset of
//! the upgrade test (every function of HEAD is callable after an upgrade) and
//! the starting point of hostile-input tests (change one argument of a valid
//! call at a time).
//!
//! Contract: run in this order, once, in one fresh session, on a database
//! where `CREATE EXTENSION sheaf` ran and that is either not yet initialized
//! or initialized as shard [`SHARD_ID`] (the first call is `init_shard`).
//! Names start with `vc_`, so other state in the database is not touched.
//! Every argument is spelled out, defaults included, as an SQL expression;
//! `setup` statements run just before the call and leave what its arguments
//! read in temporary tables.
//!
//! [`check_coverage`] fails when a function of the schema has no entry here
//! (add one with the function), or an entry names a function that is gone.

use tokio_postgres::Client;

/// The shard id the calls initialize (or expect).
pub const SHARD_ID: i32 = 7;

/// One valid call.
#[derive(Debug, Clone, Copy)]
pub struct ValidCall {
    /// The function: `sheaf.<name>(<argument types>)`, types as
    /// `oidvectortypes` prints them (`integer, timestamp with time zone`).
    pub function: &'static str,
    /// Statements run first, in order, in the same session.
    pub setup: &'static [&'static str],
    /// Every argument, in order, as an SQL expression.
    pub args: &'static [&'static str],
}

impl ValidCall {
    /// The qualified name, without the argument types.
    pub fn name(&self) -> &'static str {
        self.function.split('(').next().unwrap_or(self.function)
    }

    /// The call as one statement.
    pub fn sql(&self) -> String {
        self.sql_with(self.args)
    }

    /// The call with other arguments (a hostile-input test's variations).
    pub fn sql_with(&self, args: &[&str]) -> String {
        format!("SELECT * FROM {}({})", self.name(), args.join(", "))
    }
}

const fn call(
    function: &'static str,
    setup: &'static [&'static str],
    args: &'static [&'static str],
) -> ValidCall {
    ValidCall {
        function,
        setup,
        args,
    }
}

/// Every function of schema `sheaf`, with a valid call, in the order they run.
pub const VALID_CALLS: &[ValidCall] = &[
    // Shard and ids.
    call("sheaf.init_shard(integer)", &[], &["7"]),
    call("sheaf.shard_id()", &[], &[]),
    call("sheaf.version()", &[], &[]),
    call("sheaf.new_id()", &[], &[]),
    call("sheaf.id_shard(uuid)", &[], &["sheaf.new_id()"]),
    call("sheaf.id_timestamp(uuid)", &[], &["sheaf.new_id()"]),
    // The aging order key of the ready set (used by the schema's index).
    call(
        "sheaf.ready_k1(integer, timestamp with time zone, integer)",
        &[],
        &["1", "now()", "60"],
    ),
    // The band of a ready row of an aging queue (written beside its key).
    call("sheaf.ready_aging_band(integer, integer)", &[], &["1", "60"]),
    // The queue.
    call(
        "sheaf.configure_queue(text, jsonb)",
        &[],
        &["'vc_q'", r#"'{"aging_secs": 60, "notify": false}'"#],
    ),
    call(
        "sheaf.set_concurrency_limit(text, integer)",
        &[],
        &["'vc_key'", "2"],
    ),
    call(
        "sheaf.enqueue(text, jsonb, jsonb)",
        &[],
        &[
            "'vc_q'",
            r#"'{"n": 1}'"#,
            r#"'{"priority": 1, "concurrency_key": "vc_key", "max_attempts": 3, "idempotency_key": "vc-1"}'"#,
        ],
    ),
    call(
        "sheaf.enqueue_batch(text, jsonb[], jsonb)",
        &[],
        &[
            "'vc_q'",
            r#"ARRAY['{"n": 2}', '{"n": 3}']::jsonb[]"#,
            r#"'{"run_at": "2000-01-01T00:00:00Z"}'"#,
        ],
    ),
    call(
        "sheaf.claim(text, text, integer, interval)",
        &[],
        &["'vc_q'", "'vc_worker'", "2", "'5 minutes'"],
    ),
    call(
        "sheaf.heartbeat(uuid, bigint, interval)",
        &[
            "SELECT sheaf.enqueue('vc_heartbeat', '{}', '{}')",
            "CREATE TEMP TABLE vc_heartbeat AS SELECT task_id, token FROM sheaf.claim('vc_heartbeat', 'vc_worker', 1, '5 minutes')",
        ],
        &[
            "(SELECT task_id FROM vc_heartbeat)",
            "(SELECT token FROM vc_heartbeat)",
            "'10 minutes'",
        ],
    ),
    call(
        "sheaf.complete(uuid, bigint, jsonb)",
        &[
            "SELECT sheaf.enqueue('vc_complete', '{}', '{}')",
            "CREATE TEMP TABLE vc_complete AS SELECT task_id, token FROM sheaf.claim('vc_complete', 'vc_worker', 1, '5 minutes')",
        ],
        &[
            "(SELECT task_id FROM vc_complete)",
            "(SELECT token FROM vc_complete)",
            r#"'{"ok": true}'"#,
        ],
    ),
    call(
        "sheaf.complete_batch(uuid[], bigint[])",
        &[
            "SELECT sheaf.enqueue_batch('vc_complete_batch', ARRAY['{}', '{}']::jsonb[], '{}')",
            "CREATE TEMP TABLE vc_complete_batch AS SELECT task_id, token FROM sheaf.claim('vc_complete_batch', 'vc_worker', 2, '5 minutes')",
        ],
        &[
            "ARRAY(SELECT task_id FROM vc_complete_batch ORDER BY task_id)",
            "ARRAY(SELECT token FROM vc_complete_batch ORDER BY task_id)",
        ],
    ),
    call(
        "sheaf.complete_and_claim(text, text, uuid[], bigint[], integer, interval)",
        &[
            "SELECT sheaf.enqueue_batch('vc_complete_and_claim', ARRAY['{}', '{}']::jsonb[], '{}')",
            "CREATE TEMP TABLE vc_complete_and_claim AS SELECT task_id, token FROM sheaf.claim('vc_complete_and_claim', 'vc_worker', 1, '5 minutes')",
        ],
        &[
            "'vc_complete_and_claim'",
            "'vc_worker'",
            "ARRAY(SELECT task_id FROM vc_complete_and_claim)",
            "ARRAY(SELECT token FROM vc_complete_and_claim)",
            "1",
            "'5 minutes'",
        ],
    ),
    call(
        "sheaf.fail(uuid, bigint, text, interval)",
        &[
            "SELECT sheaf.enqueue('vc_fail', '{}', '{}')",
            "CREATE TEMP TABLE vc_fail AS SELECT task_id, token FROM sheaf.claim('vc_fail', 'vc_worker', 1, '5 minutes')",
        ],
        &[
            "(SELECT task_id FROM vc_fail)",
            "(SELECT token FROM vc_fail)",
            "'vc: failed on purpose'",
            "'1 second'",
        ],
    ),
    call(
        "sheaf.release(uuid, bigint)",
        &[
            "SELECT sheaf.enqueue('vc_release', '{}', '{}')",
            "CREATE TEMP TABLE vc_release AS SELECT task_id, token FROM sheaf.claim('vc_release', 'vc_worker', 1, '5 minutes')",
        ],
        &[
            "(SELECT task_id FROM vc_release)",
            "(SELECT token FROM vc_release)",
        ],
    ),
    call(
        "sheaf.snooze(uuid, bigint, interval)",
        &[
            "SELECT sheaf.enqueue('vc_snooze', '{}', '{}')",
            "CREATE TEMP TABLE vc_snooze AS SELECT task_id, token FROM sheaf.claim('vc_snooze', 'vc_worker', 1, '5 minutes')",
        ],
        &[
            "(SELECT task_id FROM vc_snooze)",
            "(SELECT token FROM vc_snooze)",
            "'1 minute'",
        ],
    ),
    call(
        "sheaf.dead_letter(uuid, bigint, text)",
        &[
            "SELECT sheaf.enqueue('vc_dead_letter', '{}', '{}')",
            "CREATE TEMP TABLE vc_dead_letter AS SELECT task_id, token FROM sheaf.claim('vc_dead_letter', 'vc_worker', 1, '5 minutes')",
        ],
        &[
            "(SELECT task_id FROM vc_dead_letter)",
            "(SELECT token FROM vc_dead_letter)",
            "'vc: hopeless on purpose'",
        ],
    ),
    call(
        "sheaf.redrive(uuid[])",
        &[
            r#"SELECT sheaf.enqueue('vc_redrive', '{}', '{"max_attempts": 1}')"#,
            "CREATE TEMP TABLE vc_redrive AS SELECT task_id, token FROM sheaf.claim('vc_redrive', 'vc_worker', 1, '5 minutes')",
            "SELECT * FROM sheaf.fail((SELECT task_id FROM vc_redrive), (SELECT token FROM vc_redrive), 'vc: dead', NULL)",
        ],
        &["ARRAY(SELECT task_id FROM vc_redrive)"],
    ),
    call("sheaf.reap_expired(integer)", &[], &["100"]),
    call("sheaf.maintain()", &[], &[]),
    call(
        "sheaf.worker_heartbeat(text, text[])",
        &[],
        &["'vc_worker'", "ARRAY['vc_q', 'vc_fail']"],
    ),
    call("sheaf.worker_deregister(text)", &[], &["'vc_worker'"]),
    call("sheaf.live_workers()", &[], &[]),
    call("sheaf.stranded_work()", &[], &[]),
    call("sheaf.queue_stats(text)", &[], &["'vc_q'"]),
    call("sheaf.get_task(uuid)", &[], &["(SELECT task_id FROM vc_redrive)"]),
    call(
        "sheaf.find_task(text, text)",
        &[],
        &["'vc_redrive'", "'vc-no-such-key'"],
    ),
    call(
        "sheaf.list_tasks(text, text, jsonb, integer)",
        &[],
        &["'vc_redrive'", "NULL", "NULL", "100"],
    ),
    call(
        "sheaf.list_dead_letters(text, jsonb, integer)",
        &[],
        &["'vc_redrive'", "NULL", "100"],
    ),
    call("sheaf.list_queues()", &[], &[]),
    call(
        "sheaf.set_progress(uuid, bigint, jsonb)",
        &[
            "SELECT sheaf.enqueue('vc_progress', '{}', '{}')",
            "CREATE TEMP TABLE vc_progress AS SELECT task_id, token FROM sheaf.claim('vc_progress', 'vc_worker', 1, '5 minutes')",
        ],
        &[
            "(SELECT task_id FROM vc_progress)",
            "(SELECT token FROM vc_progress)",
            r#"'{"done": 1, "of": 2}'"#,
        ],
    ),
    call(
        "sheaf.cancel_task(uuid, text)",
        &["CREATE TEMP TABLE vc_cancel AS SELECT sheaf.enqueue('vc_cancel', '{}', '{}') AS task_id"],
        &["(SELECT task_id FROM vc_cancel)", "'vc: not needed'"],
    ),
    call(
        "sheaf.redrive_queue(text, interval, integer)",
        &[
            r#"SELECT sheaf.enqueue('vc_redrive_queue', '{}', '{"max_attempts": 1}')"#,
            "SELECT f.* FROM sheaf.claim('vc_redrive_queue', 'vc_worker', 1, '5 minutes') c, \
             LATERAL sheaf.fail(c.task_id, c.token, 'vc: dead', NULL) f",
        ],
        &["'vc_redrive_queue'", "NULL", "1000"],
    ),
    call(
        "sheaf.purge_dead_letters(text, interval)",
        &[
            r#"SELECT sheaf.enqueue('vc_purge', '{}', '{"max_attempts": 1}')"#,
            "SELECT f.* FROM sheaf.claim('vc_purge', 'vc_worker', 1, '5 minutes') c, \
             LATERAL sheaf.fail(c.task_id, c.token, 'vc: dead', NULL) f",
        ],
        &["'vc_purge'", "'0 seconds'"],
    ),
    call(
        "sheaf.drop_queue(text, boolean)",
        &["SELECT sheaf.enqueue('vc_drop', '{}', '{}')"],
        &["'vc_drop'", "true"],
    ),
    call("sheaf.concurrency_stats()", &[], &[]),
    // Executions and gates.
    call(
        "sheaf.declare_workflow(text, jsonb)",
        &[],
        &[
            "'vc_wf'",
            r#"'{"queue": "vc_wf_q", "concurrency": {"key": "input.tenant", "limit": 10, "on_conflict": "defer"}, "quota": {"key": "input.tenant", "max_active_executions": 100, "max_history_bytes": 1000000000, "max_dead_letters": 50}}'"#,
        ],
    ),
    call(
        "sheaf.start_workflow(text, text, jsonb, jsonb)",
        &[],
        &[
            "'vc_wf'",
            "'vc-start'",
            r#"'{"tenant": "vc_t"}'"#,
            r#"'{"priority": 2, "search_attrs": {"vc_tier": "gold"}}'"#,
        ],
    ),
    call(
        "sheaf.find_execution(text, text)",
        &[],
        &["'vc_wf'", "'vc-start'"],
    ),
    call(
        "sheaf.get_execution(uuid)",
        &[],
        &["(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-start'))"],
    ),
    call(
        "sheaf.append_event(uuid, text, jsonb)",
        &[],
        &[
            "(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-start'))",
            "'VcNote'",
            r#"'{"note": 1}'"#,
        ],
    ),
    call(
        "sheaf.signal(uuid, text, jsonb, jsonb)",
        &[],
        &[
            "(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-start'))",
            "'vc_approve'",
            r#"'{"by": "vc"}'"#,
            r#"'{"signal_id": "vc-signal-1"}'"#,
        ],
    ),
    call(
        "sheaf.upsert_search_attrs(uuid, jsonb)",
        &[],
        &[
            "(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-start'))",
            r#"'{"vc_n": 3, "vc_tier": null}'"#,
        ],
    ),
    call(
        "sheaf.record_usage(uuid, jsonb)",
        &[],
        &[
            "(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-start'))",
            r#"'{"vc_llm_calls": 1, "vc_tokens": 812}'"#,
        ],
    ),
    call(
        "sheaf.usage_report(timestamp with time zone, timestamp with time zone, text)",
        &[],
        &[
            "now() - interval '1 day'",
            "now() + interval '1 day'",
            "'search_attr:vc_n'",
        ],
    ),
    call(
        "sheaf.list_executions(jsonb, jsonb, integer, text)",
        &[],
        &[
            r#"'{"and": [{"workflow_name": ["vc_wf"]}, {"attr": "vc_n", "op": ">=", "value": 3}]}'"#,
            r#"'{"created_at": "2999-01-01T00:00:00Z", "execution_id": "00000000-0000-0000-0000-000000000000"}'"#,
            "10",
            "'desc'",
        ],
    ),
    call(
        "sheaf.history(uuid, bigint, integer)",
        &[],
        &[
            "(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-start'))",
            "0",
            "100",
        ],
    ),
    call(
        "sheaf.pause_execution(uuid)",
        &["SELECT * FROM sheaf.start_workflow('vc_wf', 'vc-pause', '{\"tenant\": \"vc_t\"}', '{}')"],
        &["(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-pause'))"],
    ),
    call(
        "sheaf.resume_execution(uuid)",
        &[],
        &["(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-pause'))"],
    ),
    call(
        "sheaf.suspend_execution(uuid, timestamp with time zone)",
        &["SELECT * FROM sheaf.start_workflow('vc_wf', 'vc-suspend', '{\"tenant\": \"vc_t\"}', '{}')"],
        &[
            "(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-suspend'))",
            "now() + interval '1 hour'",
        ],
    ),
    call(
        "sheaf.wake_execution(uuid)",
        &[],
        &["(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-suspend'))"],
    ),
    call(
        "sheaf.complete_task_and_execution(uuid, bigint, jsonb)",
        &[
            "SELECT * FROM sheaf.start_workflow('vc_wf', 'vc-task-done', '{\"tenant\": \"vc_t\"}', '{\"queue\": \"vc_wf_done\"}')",
            "CREATE TEMP TABLE vc_task_done AS SELECT task_id, token FROM sheaf.claim('vc_wf_done', 'vc_worker', 1, '5 minutes')",
        ],
        &[
            "(SELECT task_id FROM vc_task_done)",
            "(SELECT token FROM vc_task_done)",
            r#"'{"total": 1}'"#,
        ],
    ),
    call(
        "sheaf.complete_task_and_fail_execution(uuid, bigint, text)",
        &[
            "SELECT * FROM sheaf.start_workflow('vc_wf', 'vc-task-failed', '{\"tenant\": \"vc_t\"}', '{\"queue\": \"vc_wf_failed\"}')",
            "CREATE TEMP TABLE vc_task_failed AS SELECT task_id, token FROM sheaf.claim('vc_wf_failed', 'vc_worker', 1, '5 minutes')",
        ],
        &[
            "(SELECT task_id FROM vc_task_failed)",
            "(SELECT token FROM vc_task_failed)",
            "'vc: failed on purpose'",
        ],
    ),
    call(
        "sheaf.complete_task_and_continue_as_new(uuid, bigint, jsonb)",
        &[
            "SELECT * FROM sheaf.start_workflow('vc_wf', 'vc-task-continue', '{\"tenant\": \"vc_t\"}', '{\"queue\": \"vc_wf_continue\"}')",
            "CREATE TEMP TABLE vc_task_continue AS SELECT task_id, token FROM sheaf.claim('vc_wf_continue', 'vc_worker', 1, '5 minutes')",
        ],
        &[
            "(SELECT task_id FROM vc_task_continue)",
            "(SELECT token FROM vc_task_continue)",
            r#"'{"tenant": "vc_t", "round": 2}'"#,
        ],
    ),
    call(
        "sheaf.continue_as_new(uuid, jsonb)",
        &[
            "SELECT * FROM sheaf.start_workflow('vc_wf', 'vc-continue', '{\"tenant\": \"vc_t\"}', '{\"execution_timeout\": \"1 day\"}')",
        ],
        &[
            "(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-continue'))",
            r#"'{"tenant": "vc_t", "round": 2}'"#,
        ],
    ),
    call(
        "sheaf.signal_with_start(text, text, jsonb, text, jsonb, jsonb)",
        &[],
        &[
            "'vc_wf'",
            "'vc-signal-with-start'",
            r#"'{"tenant": "vc_t"}'"#,
            "'vc_go'",
            r#"'{"n": 1}'"#,
            r#"'{"signal_id": "vc-sws-1", "execution_timeout": "1 hour"}'"#,
        ],
    ),
    call(
        "sheaf.complete_execution(uuid, jsonb)",
        &[],
        &[
            "(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-start'))",
            r#"'{"done": true}'"#,
        ],
    ),
    call(
        "sheaf.fail_execution(uuid, text)",
        &["SELECT * FROM sheaf.start_workflow('vc_wf', 'vc-fail', '{\"tenant\": \"vc_t\"}', '{}')"],
        &[
            "(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-fail'))",
            "'vc: failed on purpose'",
        ],
    ),
    // Children and the relay.
    call(
        "sheaf.start_child(uuid, text, text, jsonb, jsonb)",
        &["SELECT * FROM sheaf.start_workflow('vc_wf', 'vc-parent', '{\"tenant\": \"vc_t\"}', '{}')"],
        &[
            "(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-parent'))",
            "'vc_child'",
            "'vc-child-1'",
            r#"'{"tenant": "vc_t"}'"#,
            r#"'{"parent_close": "abandon"}'"#,
        ],
    ),
    call(
        "sheaf.list_children(uuid, uuid, integer)",
        &[],
        &[
            "(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-parent'))",
            "NULL",
            "100",
        ],
    ),
    call(
        "sheaf.cancel_child(uuid, uuid, text)",
        &[],
        &[
            "(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-parent'))",
            "(SELECT execution_id FROM sheaf.find_execution('vc_child', 'vc-child-1'))",
            "'vc: not needed'",
        ],
    ),
    call(
        "sheaf.relay_take(integer, interval, uuid[])",
        &[
            r#"SELECT * FROM sheaf.start_child((SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-parent')), 'vc_child', 'vc-child-2', '{}', '{"target_shard": 8}')"#,
        ],
        &["10", "'1 second'", "NULL"],
    ),
    call(
        "sheaf.relay_report(uuid, bigint, jsonb)",
        &[
            r#"SELECT * FROM sheaf.start_child((SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-parent')), 'vc_child', 'vc-child-3', '{}', '{"target_shard": 8}')"#,
            "CREATE TEMP TABLE vc_relay AS SELECT child_id, lease_token FROM sheaf.relay_take(1, '30 seconds', \
             ARRAY(SELECT execution_id FROM sheaf.list_children((SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-parent')), NULL, 100) WHERE workflow_id = 'vc-child-3'))",
        ],
        &[
            "(SELECT child_id FROM vc_relay)",
            "(SELECT lease_token FROM vc_relay)",
            r#"'{"started": true}'"#,
        ],
    ),
    call(
        "sheaf.relay_start_child(uuid, uuid, text, text, jsonb)",
        &[],
        &[
            "'00070000-0000-8000-8000-0000000000c1'",
            "'00080000-0000-8000-8000-0000000000a1'",
            "'vc_child'",
            "'vc-remote-1'",
            r#"'{"tenant": "vc_t"}'"#,
        ],
    ),
    call(
        "sheaf.relay_close_child(uuid, uuid, text, text)",
        &[],
        &[
            "'00070000-0000-8000-8000-0000000000c1'",
            "'00080000-0000-8000-8000-0000000000a1'",
            "'cancel'",
            "'vc: done'",
        ],
    ),
    call("sheaf.relay_backlog()", &[], &[]),
    // Signals and cancels by business key, through the outbox.
    call(
        "sheaf.signal_external(uuid, text, text, text, jsonb, jsonb)",
        &[],
        &[
            "(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-parent'))",
            "'vc_wf'",
            "'vc-start'",
            "'vc_sig'",
            r#"'{"n": 1}'"#,
            r#"'{"signal_id": "vc-ext-1"}'"#,
        ],
    ),
    call(
        "sheaf.cancel_external(uuid, text, text, text, jsonb)",
        &[],
        &[
            "(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-parent'))",
            "'vc_wf'",
            "'vc-nobody'",
            "'vc: not needed'",
            "'{}'",
        ],
    ),
    call("sheaf.outbox_take(integer, interval)", &[], &["10", "'1 second'"]),
    call(
        "sheaf.outbox_report(uuid, bigint, jsonb)",
        &[
            "SELECT sheaf.signal_external((SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-parent')), 'vc_wf', 'vc-report', 'vc_sig', '{}')",
            "CREATE TEMP TABLE vc_outbox AS SELECT outbox_id, lease_token FROM sheaf.outbox_take(1000, '30 seconds') WHERE workflow_id = 'vc-report'",
        ],
        &[
            "(SELECT outbox_id FROM vc_outbox)",
            "(SELECT lease_token FROM vc_outbox)",
            r#"'{"unknown": true}'"#,
        ],
    ),
    call("sheaf.outbox_backlog()", &[], &[]),
    call(
        "sheaf.list_child_links(uuid, uuid, integer)",
        &[],
        &["NULL", "NULL", "100"],
    ),
    call(
        "sheaf.known_children(uuid[])",
        &[],
        &[
            "ARRAY(SELECT execution_id FROM sheaf.list_children((SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-parent')), NULL, 100))",
        ],
    ),
    // The topology digest. These calls declare none, so a published one
    // checks nothing they do.
    call(
        "sheaf.publish_topology(jsonb, boolean)",
        &[],
        &["'{\"shards\": [7]}'", "true"],
    ),
    call("sheaf.published_topology()", &[], &[]),
    // Placement under the projection just published.
    call(
        "sheaf.place_start(text, text, jsonb)",
        &[],
        &[
            "'vc_wf'",
            "'vc-placed'",
            "'{\"placement\": {\"tenant\": \"acme\"}}'",
        ],
    ),
    call(
        "sheaf.place_task(text, jsonb)",
        &[],
        &["'vc_q'", "'{\"idempotency_key\": \"vc-key\"}'"],
    ),
    call("sheaf.place_mutex(text)", &[], &["'vc-lock'"]),
    call("sheaf.locate_id(uuid)", &[], &["sheaf.new_id()"]),
    call("sheaf.topology_projections()", &[], &[]),
    call("sheaf.misplaced_runs(integer)", &[], &["10"]),
    call("sheaf.fleet_config()", &[], &[]),
    call("sheaf.audit_log(bigint, integer)", &[], &["NULL", "10"]),
    call("sheaf.rebalance_candidates(uuid, integer)", &[], &["NULL", "100"]),
    call(
        "sheaf.relay_rows_to(integer, uuid, integer)",
        &[],
        &["1", "NULL", "100"],
    ),
    call(
        "sheaf.migration_begin(uuid, integer, interval)",
        &[
            r#"CREATE TEMP TABLE vc_move AS SELECT execution_id FROM sheaf.start_workflow('vc_wf', 'vc-move', '{"tenant": "vc_t"}', '{}')"#,
        ],
        &["(SELECT execution_id FROM vc_move)", "8", "'60 seconds'"],
    ),
    // A move of vc-move-2 to shard 8, whose export is also staged here as if
    // it came from shard 8 under another id (vc-move-2s): the source's and
    // the target's steps on one database.
    call(
        "sheaf.migration_stage(jsonb)",
        &[
            r#"CREATE TEMP TABLE vc_move2 AS SELECT execution_id FROM sheaf.start_workflow('vc_wf', 'vc-move-2', '{"tenant": "vc_t"}', '{}')"#,
            "CREATE TEMP TABLE vc_export AS SELECT sheaf.migration_begin((SELECT execution_id FROM vc_move2), 8) AS export",
        ],
        &[
            r#"(SELECT replace(replace(export::text, (SELECT execution_id FROM vc_move2)::text, 'b0000000-0000-8000-8000-000000000001'), '"vc-move-2"', '"vc-move-2s"')::jsonb || '{"source_shard": 8}' FROM vc_export)"#,
        ],
    ),
    call(
        "sheaf.migration_verify(bigint, bigint, text)",
        &[],
        &[
            "(SELECT (export->>'migration_id')::bigint FROM vc_export)",
            "(SELECT (export->>'lease_token')::bigint FROM vc_export)",
            "(SELECT export->>'digest' FROM vc_export)",
        ],
    ),
    call(
        "sheaf.migration_cutover(bigint, bigint)",
        &[],
        &[
            "(SELECT (export->>'migration_id')::bigint FROM vc_export)",
            "(SELECT (export->>'lease_token')::bigint FROM vc_export)",
        ],
    ),
    call(
        "sheaf.migration_activate(uuid)",
        &[],
        &["'b0000000-0000-8000-8000-000000000001'"],
    ),
    call(
        "sheaf.migration_repoint(uuid, integer)",
        &[],
        &["(SELECT execution_id FROM vc_move2)", "9"],
    ),
    call(
        "sheaf.migration_report(bigint, bigint, text, text)",
        &[],
        &[
            "(SELECT (export->>'migration_id')::bigint FROM vc_export)",
            "(SELECT (export->>'lease_token')::bigint FROM vc_export)",
            "'done'",
            "NULL",
        ],
    ),
    call(
        "sheaf.migration_discard(uuid, integer, bigint)",
        &[
            r#"SELECT sheaf.migration_stage(replace(replace(export::text, (SELECT execution_id FROM vc_move2)::text, 'b0000000-0000-8000-8000-000000000002'), '"vc-move-2"', '"vc-move-2d"')::jsonb || '{"source_shard": 8}') FROM vc_export"#,
        ],
        &[
            "'b0000000-0000-8000-8000-000000000002'",
            "8",
            "(SELECT (export->>'migration_id')::bigint FROM vc_export)",
        ],
    ),
    call(
        "sheaf.migration_takeover(bigint, interval)",
        &[],
        &[
            "(SELECT (export->>'migration_id')::bigint FROM vc_export)",
            "'60 seconds'",
        ],
    ),
    call(
        "sheaf.migration_stalled(interval, integer, integer[])",
        &[],
        &["'30 seconds'", "10", "NULL"],
    ),
    call("sheaf.migrations(boolean, integer)", &[], &["true", "100"]),
    call("sheaf.migration_seals(uuid, integer)", &[], &["NULL", "100"]),
    // vc-move-2's seal, as if handed over by a shard being retired: its id
    // and key changed, so this shard does not hold it yet.
    call(
        "sheaf.migration_adopt_seal(jsonb)",
        &[],
        &[
            r#"(SELECT replace(replace(seal::text, execution_id::text, 'b0000000-0000-8000-8000-000000000003'), '"vc-move-2"', '"vc-move-2a"')::jsonb FROM sheaf.migration_seals(NULL, 100) WHERE execution_id = (SELECT execution_id FROM vc_move2))"#,
        ],
    ),
    call(
        "sheaf.erase_payloads(uuid)",
        &[
            r#"CREATE TEMP TABLE vc_erase AS SELECT execution_id FROM sheaf.start_workflow('vc_wf', 'vc-erase', '{"tenant": "vc_t"}', '{}')"#,
            "SELECT sheaf.cancel_execution((SELECT execution_id FROM vc_erase), 'vc')",
        ],
        &["(SELECT execution_id FROM vc_erase)"],
    ),
    call(
        "sheaf.cancel_execution(uuid, text)",
        &["SELECT * FROM sheaf.start_workflow('vc_wf', 'vc-cancel', '{\"tenant\": \"vc_t\"}', '{}')"],
        &[
            "(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-cancel'))",
            "'vc: not needed'",
        ],
    ),
    call(
        "sheaf.terminate_execution(uuid, text)",
        &["SELECT * FROM sheaf.start_workflow('vc_wf', 'vc-terminate', '{\"tenant\": \"vc_t\"}', '{}')"],
        &[
            "(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-terminate'))",
            "'vc: stopped'",
        ],
    ),
    call(
        "sheaf.relay_pulled(uuid)",
        &[],
        &["(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-cancel'))"],
    ),
    call("sheaf.seals_due(integer)", &[], &["10"]),
    call(
        "sheaf.seal_run_ended(uuid)",
        &[],
        &["(SELECT execution_id FROM sheaf.find_execution('vc_wf', 'vc-cancel'))"],
    ),
    call(
        "sheaf.set_retention(jsonb)",
        &[],
        &[r#"'{"dead_letters": "3650days", "workflows": {"vc_wf": {"executions": "3650days"}}}'"#],
    ),
    call("sheaf.retention()", &[], &[]),
    // Schedules.
    call(
        "sheaf.create_schedule(text, jsonb)",
        &[],
        &[
            "'vc_sched'",
            r#"'{"cron": "0 3 * * *", "time_zone": "Europe/Berlin", "workflow": {"name": "vc_wf", "input": {"tenant": "vc_t"}, "workflow_id": "vc-nightly"}, "overlap": "skip", "catch_up": "all", "catch_up_max": 3, "jitter": "10s"}'"#,
        ],
    ),
    call(
        "sheaf.update_schedule(text, jsonb)",
        &[],
        &["'vc_sched'", r#"'{"cron": "30 3 * * *"}'"#],
    ),
    call("sheaf.trigger_schedule(text)", &[], &["'vc_sched'"]),
    call("sheaf.pause_schedule(text)", &[], &["'vc_sched'"]),
    call("sheaf.resume_schedule(text)", &[], &["'vc_sched'"]),
    call("sheaf.list_schedules()", &[], &[]),
    call(
        "sheaf.schedule_fires(text, timestamp with time zone, integer)",
        &[],
        &["'vc_sched'", "now() + interval '1 day'", "10"],
    ),
    call("sheaf.delete_schedule(text)", &[], &["'vc_sched'"]),
    // Debounced starts.
    call(
        "sheaf.pending_starts(text, integer, text)",
        &[
            "SELECT * FROM sheaf.start_workflow('vc_wf', 'vc-debounced', '{\"tenant\": \"vc_t\"}', '{\"debounce\": {\"key\": \"vc-doc\", \"window\": \"1 hour\"}}')",
        ],
        &["'vc_wf'", "10", "'vc-doc'"],
    ),
    call(
        "sheaf.cancel_pending_start(text, text, text)",
        &[],
        &["'vc_wf'", "'vc-doc'", "'vc: cancelled'"],
    ),
    // Rate limits.
    call(
        "sheaf.declare_rate_limit(text, jsonb)",
        &[],
        &["'vc_rl'", r#"'{"rate": 5, "period": "1s", "burst": 5}'"#],
    ),
    call(
        "sheaf.set_rate_override(text, double precision, interval, timestamp with time zone)",
        &[],
        &["'vc_rl'", "10", "'1 second'", "now() + interval '1 hour'"],
    ),
    call("sheaf.rate_limits()", &[], &[]),
    call("sheaf.clear_rate_override(text)", &[], &["'vc_rl'"]),
    call(
        "sheaf.audit_note(text, text, text, jsonb)",
        &[],
        &[
            "'vc_fan_out'",
            "'vc_target'",
            "'failed'",
            r#"'{"shards_failed": 1}'"#,
        ],
    ),
    call("sheaf.quota_usage(text)", &[], &["'vc_t'"]),
    call("sheaf.quota_recompute(text)", &[], &["'vc_t'"]),
    // The durable mutex.
    call(
        "sheaf.mutex_acquire(text, uuid, interval)",
        &[],
        &["'vc_m'", "'00000000-0000-0000-0000-00000000a001'", "'1 minute'"],
    ),
    call("sheaf.mutex_status(text)", &[], &["'vc_m'"]),
    call(
        "sheaf.mutex_renew(text, uuid, bigint, interval)",
        &[],
        &[
            "'vc_m'",
            "'00000000-0000-0000-0000-00000000a001'",
            "(SELECT token FROM sheaf.mutex_status('vc_m'))",
            "'2 minutes'",
        ],
    ),
    call(
        "sheaf.mutex_release(text, uuid, bigint)",
        &[],
        &[
            "'vc_m'",
            "'00000000-0000-0000-0000-00000000a001'",
            "(SELECT token FROM sheaf.mutex_status('vc_m'))",
        ],
    ),
    call(
        "sheaf.mutex_leave(text, uuid)",
        &[],
        &["'vc_m'", "'00000000-0000-0000-0000-00000000a001'"],
    ),
    call("sheaf.mutex_reclaim(integer)", &[], &["100"]),
    call("sheaf.list_mutexes(text, integer)", &[], &["'vc_l'", "10"]),
    call(
        "sheaf.count_executions(jsonb, integer)",
        &[],
        &[r#"'{"workflow_name": ["vc_wf"]}'"#, "100"],
    ),
];

/// The functions of schema `sheaf` in this database, as [`ValidCall::function`]
/// spells them, with their argument counts.
pub async fn functions(db: &Client) -> Result<Vec<(String, usize)>, tokio_postgres::Error> {
    let rows = db
        .query(
            "SELECT format('%s.%s(%s)', n.nspname, p.proname, pg_catalog.oidvectortypes(p.proargtypes)), \
                    p.pronargs::int \
             FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = 'sheaf' ORDER BY 1",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i32>(1) as usize))
        .collect())
}

/// `Err` names every function without an entry, every entry without a
/// function, and every entry whose argument count is not the function's.
pub async fn check_coverage(db: &Client) -> Result<(), String> {
    let functions = functions(db)
        .await
        .map_err(|e| format!("listing the functions of schema sheaf: {e}"))?;
    let mut problems = Vec::new();
    for (function, nargs) in &functions {
        match VALID_CALLS.iter().find(|c| c.function == function) {
            None => problems.push(format!(
                "{function}: no valid call in tests/src/valid_calls.rs (add one)"
            )),
            Some(c) if c.args.len() != *nargs => problems.push(format!(
                "{function}: the valid call gives {} arguments, the function takes {nargs} (spell out every one)",
                c.args.len()
            )),
            Some(_) => {}
        }
    }
    for c in VALID_CALLS {
        if !functions.iter().any(|(f, _)| f == c.function) {
            problems.push(format!(
                "{}: in tests/src/valid_calls.rs, but not a function of schema sheaf",
                c.function
            ));
        }
        if VALID_CALLS.iter().filter(|d| d.function == c.function).count() > 1 {
            problems.push(format!("{}: more than one valid call", c.function));
        }
    }
    problems.dedup();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the valid calls do not match the functions of schema sheaf:\n  {}",
            problems.join("\n  ")
        ))
    }
}

/// Runs every valid call (setup first) on `db`; `Err` lists every failure
/// with its statement and the server's error.
pub async fn run_all(db: &Client) -> Result<(), String> {
    let mut failures = Vec::new();
    for c in VALID_CALLS {
        let mut statements: Vec<String> = c.setup.iter().map(|s| s.to_string()).collect();
        statements.push(c.sql());
        for sql in &statements {
            if let Err(e) = db.batch_execute(sql).await {
                let detail = match e.as_db_error() {
                    Some(d) => format!("{} {}", d.code().code(), d.message()),
                    None => e.to_string(),
                };
                failures.push(format!("{}: {sql}\n    -> {detail}", c.function));
                break;
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} of {} valid calls failed:\n  {}",
            failures.len(),
            VALID_CALLS.len(),
            failures.join("\n  ")
        ))
    }
}
