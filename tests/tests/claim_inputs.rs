//! Bad input to every claim-engine function: the documented SQLSTATE, a
//! message naming what was wrong, and nothing written.

use sheaf_tests::{code, connect, fleet, own_database};

const DB: &str = "sheaf_claim_inputs";

const TABLES: &str = "SELECT (SELECT count(*) FROM sheaf.tasks), (SELECT count(*) FROM sheaf.ready), \
    (SELECT count(*) FROM sheaf.queues), (SELECT count(*) FROM sheaf.dead_letters), \
    (SELECT count(*) FROM sheaf.concurrency_limits), (SELECT count(*) FROM sheaf.workers)";

// A scenario reads top to bottom as one story (set up, race, check);
// split into helpers it would scatter what it asserts.
#[allow(clippy::too_many_lines)]
#[tokio::test]
async fn every_function_refuses_bad_input_with_its_sqlstate_and_writes_nothing() {
    // Its own database: the counts below cover whole tables, which the
    // other tests write to in the shared one.
    let shard = fleet().shards().next().unwrap();
    let db = own_database::shard(&shard.url, DB, shard.id.get().into()).await;
    let stranger = "'00000000-0000-8000-8000-00000000abcd'";
    let cases: Vec<(String, &str, &str)> = vec![
        ("SELECT sheaf.enqueue(NULL, '{}')".into(), "22004", "queue"),
        ("SELECT sheaf.enqueue('', '{}')".into(), "22023", "queue"),
        (
            format!("SELECT sheaf.enqueue('{}', '{{}}')", "q".repeat(129)),
            "22023",
            "queue",
        ),
        ("SELECT sheaf.enqueue('in', NULL)".into(), "22004", "payload"),
        ("SELECT sheaf.enqueue('in', '{}', NULL)".into(), "22004", "opts"),
        ("SELECT sheaf.enqueue('in', '{}', '[]')".into(), "22023", "opts"),
        (
            "SELECT sheaf.enqueue('in', '{}', '{\"priorty\": 1}')".into(),
            "22023",
            "priorty",
        ),
        (
            "SELECT sheaf.enqueue('in', '{}', '{\"priority\": 1.5}')".into(),
            "22023",
            "opts.priority",
        ),
        (
            "SELECT sheaf.enqueue('in', '{}', '{\"max_attempts\": 0}')".into(),
            "22023",
            "opts.max_attempts",
        ),
        (
            "SELECT sheaf.enqueue('in', '{}', '{\"run_at\": \"soon\"}')".into(),
            "22023",
            "opts.run_at",
        ),
        (
            "SELECT sheaf.enqueue('in', '{}', '{\"run_at\": \"infinity\"}')".into(),
            "22023",
            "opts.run_at",
        ),
        (
            format!(
                "SELECT sheaf.enqueue('in', '{{}}', '{{\"concurrency_key\": \"{}\"}}')",
                "k".repeat(1025)
            ),
            "22023",
            "opts.concurrency_key",
        ),
        (
            "SELECT sheaf.enqueue('in', '{}', '{\"kind\": \"job\"}')".into(),
            "22023",
            "opts.kind",
        ),
        (
            "SELECT sheaf.enqueue('in', '{}', '{\"execution_id\": \"x\"}')".into(),
            "22023",
            "opts.execution_id",
        ),
        (
            format!(
                "SELECT sheaf.enqueue('in', '{{}}', '{{\"execution_id\": {}}}')",
                stranger.replace('\'', "\"")
            ),
            "P0002",
            "no execution",
        ),
        (
            "SELECT sheaf.enqueue('in', '{}', '{\"fairness_weight\": -1}')".into(),
            "22023",
            "opts.fairness_weight",
        ),
        (
            "SELECT sheaf.enqueue_batch('in', ARRAY[]::jsonb[])".into(),
            "22023",
            "payloads",
        ),
        (
            "SELECT sheaf.enqueue_batch('in', NULL)".into(),
            "22004",
            "payloads",
        ),
        (
            "SELECT sheaf.enqueue_batch('in', ARRAY['{}', NULL]::jsonb[])".into(),
            "22023",
            "payloads",
        ),
        (
            "SELECT sheaf.enqueue_batch('in', array_fill('{}'::jsonb, ARRAY[10001]))".into(),
            "22023",
            "payloads",
        ),
        (
            "SELECT sheaf.enqueue_batch('in', ARRAY['{}', '{}']::jsonb[], '{\"idempotency_key\": \"x\"}')"
                .into(),
            "22023",
            "opts.idempotency_key",
        ),
        ("SELECT * FROM sheaf.claim('in', 'w', 0)".into(), "22023", "batch"),
        (
            "SELECT * FROM sheaf.claim('in', 'w', -1)".into(),
            "22023",
            "batch",
        ),
        (
            "SELECT * FROM sheaf.claim('in', 'w', 1001)".into(),
            "22023",
            "batch",
        ),
        (
            "SELECT * FROM sheaf.claim('in', 'w', NULL)".into(),
            "22004",
            "batch",
        ),
        (
            "SELECT * FROM sheaf.claim('in', 'w', 1, '0 seconds')".into(),
            "22023",
            "lease",
        ),
        (
            "SELECT * FROM sheaf.claim('in', 'w', 1, '2 days')".into(),
            "22023",
            "lease",
        ),
        ("SELECT * FROM sheaf.claim('in', '')".into(), "22023", "worker"),
        ("SELECT * FROM sheaf.claim('in', NULL)".into(), "22004", "worker"),
        ("SELECT sheaf.complete(NULL, 1)".into(), "22004", "task_id"),
        (
            format!("SELECT sheaf.complete({stranger}, 1)"),
            "P0002",
            "never existed",
        ),
        (
            format!("SELECT * FROM sheaf.complete_batch(ARRAY[{stranger}]::uuid[], ARRAY[1, 2])"),
            "22023",
            "tokens",
        ),
        (
            "SELECT * FROM sheaf.complete_batch(ARRAY[]::uuid[], ARRAY[]::bigint[])".into(),
            "22023",
            "task_ids",
        ),
        (
            format!("SELECT * FROM sheaf.complete_batch(ARRAY[{stranger}]::uuid[], ARRAY[NULL]::bigint[])"),
            "22023",
            "tokens",
        ),
        (
            format!("SELECT * FROM sheaf.fail({stranger}, 1, NULL)"),
            "22004",
            "error",
        ),
        (
            format!("SELECT * FROM sheaf.fail({stranger}, 1, 'x', '-1 second')"),
            "22023",
            "retry_in",
        ),
        (
            format!("SELECT * FROM sheaf.fail({stranger}, 1, 'x')"),
            "P0002",
            "no task",
        ),
        (
            format!("SELECT sheaf.heartbeat({stranger}, 1, '0 seconds')"),
            "22023",
            "extend",
        ),
        (
            format!("SELECT sheaf.heartbeat({stranger}, 1)"),
            "P0002",
            "no task",
        ),
        (format!("SELECT sheaf.release({stranger}, 1)"), "P0002", "no task"),
        (
            "SELECT sheaf.snooze(NULL, 1, '1 second')".into(),
            "22004",
            "task_id",
        ),
        (
            format!("SELECT sheaf.snooze({stranger}, NULL, '1 second')"),
            "22004",
            "token",
        ),
        (
            format!("SELECT sheaf.snooze({stranger}, 1, NULL)"),
            "22004",
            "delay",
        ),
        (
            format!("SELECT sheaf.snooze({stranger}, 1, '-1 second')"),
            "22023",
            "delay",
        ),
        (
            format!("SELECT sheaf.snooze({stranger}, 1, '366 days')"),
            "22023",
            "delay",
        ),
        (
            format!("SELECT sheaf.snooze({stranger}, 1, '1 second')"),
            "P0002",
            "never existed",
        ),
        (
            "SELECT sheaf.dead_letter(NULL, 1, 'x')".into(),
            "22004",
            "task_id",
        ),
        (
            format!("SELECT sheaf.dead_letter({stranger}, NULL, 'x')"),
            "22004",
            "token",
        ),
        (
            format!("SELECT sheaf.dead_letter({stranger}, 1, NULL)"),
            "22004",
            "error",
        ),
        (
            format!("SELECT sheaf.dead_letter({stranger}, 1, 'x')"),
            "P0002",
            "never existed",
        ),
        (
            "SELECT sheaf.complete_task_and_execution(NULL, 1, '{}')".into(),
            "22004",
            "task_id",
        ),
        (
            format!("SELECT sheaf.complete_task_and_execution({stranger}, NULL, '{{}}')"),
            "22004",
            "token",
        ),
        (
            format!("SELECT sheaf.complete_task_and_execution({stranger}, 1, '{{}}')"),
            "P0002",
            "never existed",
        ),
        (
            "SELECT sheaf.complete_task_and_fail_execution(NULL, 1, 'x')".into(),
            "22004",
            "task_id",
        ),
        (
            format!("SELECT sheaf.complete_task_and_fail_execution({stranger}, 1, NULL)"),
            "22004",
            "error",
        ),
        (
            format!("SELECT sheaf.complete_task_and_fail_execution({stranger}, 1, 'x')"),
            "P0002",
            "never existed",
        ),
        ("SELECT sheaf.reap_expired(0)".into(), "22023", "max_rows"),
        (
            "SELECT sheaf.configure_queue('in', '{\"aging_secs\": 60, \"fairness\": true}')".into(),
            "22023",
            "opts",
        ),
        (
            "SELECT sheaf.configure_queue('in', '{\"aging_secs\": 0}')".into(),
            "22023",
            "opts.aging_secs",
        ),
        (
            "SELECT sheaf.configure_queue('in', '{\"mode\": \"fifo\"}')".into(),
            "22023",
            "mode",
        ),
        ("SELECT sheaf.configure_queue('in', NULL)".into(), "22004", "opts"),
        ("SELECT sheaf.set_concurrency_limit('', 1)".into(), "22023", "key"),
        (
            "SELECT sheaf.set_concurrency_limit(NULL, 1)".into(),
            "22004",
            "key",
        ),
        (
            "SELECT sheaf.set_concurrency_limit('k', -1)".into(),
            "22023",
            "max_running",
        ),
        ("SELECT sheaf.redrive(NULL)".into(), "22004", "task_ids"),
        (
            "SELECT sheaf.redrive(ARRAY[NULL]::uuid[])".into(),
            "22023",
            "task_ids",
        ),
        (
            "SELECT sheaf.worker_heartbeat('w', NULL)".into(),
            "22004",
            "queues",
        ),
        (
            "SELECT sheaf.worker_heartbeat('w', ARRAY[NULL]::text[])".into(),
            "22023",
            "queues",
        ),
        (
            "SELECT sheaf.worker_heartbeat('', ARRAY['q'])".into(),
            "22023",
            "worker",
        ),
        ("SELECT sheaf.worker_deregister(NULL)".into(), "22004", "worker"),
        ("SELECT sheaf.worker_deregister('')".into(), "22023", "worker"),
        ("SELECT * FROM sheaf.queue_stats('')".into(), "22023", "queue"),
    ];
    let before = db.query_one(TABLES, &[]).await.unwrap();
    for (sql, code, names) in &cases {
        let err = match db.batch_execute(sql).await {
            Ok(()) => panic!("accepted: {sql}"),
            Err(e) => e,
        };
        let db_err = err
            .as_db_error()
            .unwrap_or_else(|| panic!("{sql}: not a database error: {err}"));
        assert_eq!(db_err.code().code(), *code, "{sql}: {}", db_err.message());
        assert!(
            db_err.message().contains(names),
            "{sql}: message {:?} does not name {names}",
            db_err.message()
        );
    }
    let after = db.query_one(TABLES, &[]).await.unwrap();
    for i in 0..6 {
        assert_eq!(
            before.get::<_, i64>(i),
            after.get::<_, i64>(i),
            "table {i} changed"
        );
    }
    drop(db);
    own_database::drop(&shard.url, DB).await;
}

#[tokio::test]
async fn switching_fairness_with_ready_tasks_is_refused() {
    let shard = fleet().shards().nth(1).unwrap();
    let db = connect(shard).await;
    let queue = sheaf_tests::unique("fair-switch");
    db.execute("SELECT sheaf.enqueue($1, '{}')", &[&queue])
        .await
        .unwrap();
    let err = db
        .execute(
            "SELECT sheaf.configure_queue($1, '{\"fairness\": true}')",
            &[&queue],
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some("55000"));
}
