//! What a new user's first trial of sheaf ran into, each checked from a
//! client, where the SQLSTATE is what an application sees.

use std::time::Duration;

use sheaf_core::nesting::MAX_DEPTH;
use sheaf_driver::{Client as Driver, PoolOptions};
use sheaf_tests::{code, connect, fleet, unique, workflows};
use tokio_postgres::Client;

/// `levels` nested arrays around a number, as JSON text.
fn nested_json(levels: usize) -> String {
    format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
}

/// [`nested_json`] as SQL text for a jsonb literal.
fn nested(levels: usize) -> String {
    format!("'{}'::jsonb", nested_json(levels))
}

async fn refused(db: &Client, sql: &str) -> tokio_postgres::error::DbError {
    match db.batch_execute(sql).await {
        Ok(()) => panic!("expected a refusal: {sql:.200}"),
        Err(e) => match e.as_db_error() {
            Some(db) => db.clone(),
            None => panic!("expected a server error, got {e}"),
        },
    }
}

async fn first_shard() -> (Client, sheaf_driver::Shard) {
    let shard = fleet().shards().next().expect("a shard").clone();
    (connect(&shard).await, shard)
}

/// Starts an execution of a fresh workflow name with input `json`; its id.
async fn start(db: &Client, json: &str) -> String {
    let input = serde_json::from_str(json).expect("JSON");
    workflows::start_new(db, &unique("wf"), "w1", &input)
        .await
        .id
        .to_string()
}

/// Every jsonb argument follows one nesting rule: 100 levels are accepted
/// and read back (history too, where sheaf wraps the value), 101 and far
/// more are refused with 22023 naming the argument and the limit — never
/// XX000, never stored data that cannot be read.
#[tokio::test]
async fn every_jsonb_argument_follows_one_nesting_rule() {
    let (db, _) = first_shard().await;
    let ok = nested(MAX_DEPTH);
    let queue = unique("deep");

    // Accepted at the limit, and readable afterwards.
    let execution = start(&db, &nested_json(MAX_DEPTH)).await;
    db.batch_execute(&format!(
        "SELECT sheaf.append_event('{execution}', 'Note', {ok}); \
         SELECT sheaf.complete_execution('{execution}', {ok});"
    ))
    .await
    .expect("values at the limit are accepted");
    let events = db
        .query(
            &format!("SELECT event_type, payload FROM sheaf.history('{execution}')"),
            &[],
        )
        .await
        .expect("history of deep values reads back");
    assert!(events.len() >= 3, "{} events", events.len());
    for row in &events {
        let _: serde_json::Value = row.get(1);
    }
    db.query_one(
        &format!("SELECT input, result FROM sheaf.get_execution('{execution}')"),
        &[],
    )
    .await
    .expect("the execution reads back");

    for levels in [MAX_DEPTH + 1, 128, 300] {
        let deep = nested(levels);
        let execution = start(&db, "{}").await;
        let wf = unique("wf");
        let cases = [
            (format!("SELECT sheaf.enqueue('{queue}', '{{}}', {deep})"), "opts"),
            (
                format!("SELECT sheaf.enqueue_batch('{queue}', ARRAY['{{}}'::jsonb], {deep})"),
                "opts",
            ),
            (format!("SELECT sheaf.enqueue('{queue}', {deep})"), "payload"),
            (
                format!("SELECT sheaf.enqueue_batch('{queue}', ARRAY['{{}}'::jsonb, {deep}])"),
                "payloads[2]",
            ),
            (
                format!("SELECT * FROM sheaf.start_workflow('{wf}', 'w', {deep})"),
                "input",
            ),
            (
                format!("SELECT * FROM sheaf.start_workflow('{wf}', 'w', '{{}}', {deep})"),
                "opts",
            ),
            (
                format!("SELECT sheaf.append_event('{execution}', 'Note', {deep})"),
                "payload",
            ),
            (
                format!("SELECT sheaf.complete_execution('{execution}', {deep})"),
                "result",
            ),
            (format!("SELECT sheaf.declare_workflow('{wf}', {deep})"), "policy"),
            (format!("SELECT sheaf.configure_queue('{queue}', {deep})"), "opts"),
            (
                format!("SELECT sheaf.complete('00000000-0000-8000-8000-000000000001', 1, {deep})"),
                "result",
            ),
        ];
        for (sql, arg) in cases {
            let e = refused(&db, &sql).await;
            assert_eq!(
                e.code().code(),
                "22023",
                "{levels} levels, {arg}: {}",
                e.message()
            );
            assert!(
                e.message().contains(&format!("invalid {arg}:")) && e.message().contains("at most 100"),
                "{levels} levels, {arg}: {}",
                e.message()
            );
        }
    }
}

/// A payload at the limit is claimed and decoded by the driver: what the
/// extension accepts, the driver reads.
#[tokio::test]
async fn the_driver_reads_the_deepest_payload_the_extension_accepts() {
    let (db, shard) = first_shard().await;
    let queue = unique("deep-claim");
    db.batch_execute(&format!("SELECT sheaf.enqueue('{queue}', {})", nested(MAX_DEPTH)))
        .await
        .expect("enqueue at the limit");
    let driver = Driver::new(fleet().clone(), PoolOptions::default()).expect("client");
    let tasks = driver
        .claim(shard.id, &queue, "w", 10, Duration::from_secs(30))
        .await
        .expect("the claim decodes");
    assert_eq!(tasks.len(), 1);
    assert_eq!(
        sheaf_core::nesting::depth(&tasks[0].payload.to_value().unwrap()),
        MAX_DEPTH
    );
}

/// Two dead letters sharing an idempotency key, or one whose key an
/// unfinished task holds, refuse the redrive with 55000 and move nothing
/// (it used to raise 23505, or silently skip).
#[tokio::test]
async fn redrive_refuses_what_would_break_an_idempotency_key() {
    let (db, _) = first_shard().await;
    let queue = unique("redrive");
    let opts = r#"'{"idempotency_key": "k", "max_attempts": 1}'"#;
    let mut dead = Vec::new();
    for _ in 0..2 {
        let id: uuid::Uuid = db
            .query_one(&format!("SELECT sheaf.enqueue('{queue}', '{{}}', {opts})"), &[])
            .await
            .expect("enqueue")
            .get(0);
        let token: i64 = db
            .query_one(&format!("SELECT token FROM sheaf.claim('{queue}', 'w')"), &[])
            .await
            .expect("claim")
            .get(0);
        db.execute("SELECT * FROM sheaf.fail($1, $2, 'boom')", &[&id, &token])
            .await
            .expect("fail");
        dead.push(id);
    }
    assert_eq!(dead_count(&db, &queue).await, 2);

    let both = db
        .execute("SELECT sheaf.redrive($1)", &[&dead])
        .await
        .expect_err("two dead letters cannot both hold the key");
    assert_eq!(code(&both), Some("55000"), "{both:?}");
    assert!(message(&both).contains("share an idempotency key"), "{both:?}");
    assert_eq!(dead_count(&db, &queue).await, 2, "nothing moved");

    // An unfinished task with the key blocks the redrive of either.
    db.batch_execute(&format!("SELECT sheaf.enqueue('{queue}', '{{}}', {opts})"))
        .await
        .expect("a third task takes the key");
    let held = db
        .execute("SELECT sheaf.redrive($1)", &[&vec![dead[0]]])
        .await
        .expect_err("the key is held");
    assert_eq!(code(&held), Some("55000"), "{held:?}");
    assert!(message(&held).contains("holds its idempotency key"), "{held:?}");
    assert_eq!(dead_count(&db, &queue).await, 2, "nothing moved");

    // Once the key is free, one of them goes back.
    db.batch_execute(&format!(
        "SELECT sheaf.complete(task_id, token) FROM sheaf.claim('{queue}', 'w')"
    ))
    .await
    .expect("finish the holder");
    let moved: i32 = db
        .query_one("SELECT sheaf.redrive($1)", &[&vec![dead[0]]])
        .await
        .expect("redrive one")
        .get(0);
    assert_eq!(moved, 1);
    assert_eq!(dead_count(&db, &queue).await, 1);
}

fn message(e: &tokio_postgres::Error) -> &str {
    e.as_db_error().map_or("", |db| db.message())
}

async fn dead_count(db: &Client, queue: &str) -> i64 {
    db.query_one(
        "SELECT count(*) FROM sheaf.dead_letters WHERE queue = $1",
        &[&queue],
    )
    .await
    .expect("count")
    .get(0)
}

/// `heartbeat` without `extend` extends by the lease the task was claimed
/// with, even after an earlier heartbeat gave a longer extension.
#[tokio::test]
async fn heartbeat_defaults_to_the_claimed_lease() {
    let (db, _) = first_shard().await;
    let queue = unique("beat");
    db.batch_execute(&format!("SELECT sheaf.enqueue('{queue}', '{{}}')"))
        .await
        .expect("enqueue");
    let row = db
        .query_one(
            &format!("SELECT task_id, token FROM sheaf.claim('{queue}', 'w', 1, '30 seconds')"),
            &[],
        )
        .await
        .expect("claim");
    let (id, token): (uuid::Uuid, i64) = (row.get(0), row.get(1));
    let secs_left = |extend: &'static str| {
        let db = &db;
        async move {
            db.query_one(
                &format!("SELECT extract(epoch FROM sheaf.heartbeat($1, $2{extend}) - now())::float8"),
                &[&id, &token],
            )
            .await
            .expect("heartbeat")
            .get::<_, f64>(0)
        }
    };
    let long = secs_left(", '10 minutes'").await;
    assert!((590.0..=600.0).contains(&long), "{long}");
    let default = secs_left("").await;
    assert!((25.0..=30.0).contains(&default), "{default}");
}

/// Bounds that used to let a value through which then broke something.
#[tokio::test]
async fn out_of_range_numbers_are_refused() {
    let (db, _) = first_shard().await;
    let queue = unique("fair");
    db.batch_execute(&format!(
        "SELECT sheaf.configure_queue('{queue}', '{{\"fairness\": true}}')"
    ))
    .await
    .expect("fairness on");
    for weight in ["1e-300", "1e-20", "0.0009", "1000.5"] {
        let e = refused(
            &db,
            &format!(
                "SELECT sheaf.enqueue('{queue}', '{{}}', '{{\"fairness_key\": \"a\", \"fairness_weight\": {weight}}}')"
            ),
        )
        .await;
        assert_eq!(e.code().code(), "22023", "{weight}: {}", e.message());
        assert!(e.message().contains("opts.fairness_weight"), "{}", e.message());
    }
    for weight in ["0.001", "1000"] {
        db.batch_execute(&format!(
            "SELECT sheaf.enqueue('{queue}', '{{}}', '{{\"fairness_key\": \"a\", \"fairness_weight\": {weight}}}')"
        ))
        .await
        .expect("the bounds themselves are accepted");
    }

    let wf = unique("quota");
    for limit in ["1e-400", "0.5"] {
        let e = refused(
            &db,
            &format!(
                "SELECT sheaf.declare_workflow('{wf}', '{{\"quota\": {{\"key\": \"input.t\", \"max_active_executions\": {limit}}}}}')"
            ),
        )
        .await;
        assert_eq!(e.code().code(), "22023", "{limit}: {}", e.message());
        assert!(
            e.message().contains("policy.quota.max_active_executions"),
            "{}",
            e.message()
        );
    }
}

/// A fairness key on a queue without fairness would be stored and never
/// used; it is refused instead.
#[tokio::test]
async fn a_fairness_key_needs_a_fairness_queue() {
    let (db, _) = first_shard().await;
    let queue = unique("plain");
    let e = refused(
        &db,
        &format!("SELECT sheaf.enqueue('{queue}', '{{}}', '{{\"fairness_key\": \"a\"}}')"),
    )
    .await;
    assert_eq!(e.code().code(), "22023", "{}", e.message());
    assert!(e.message().contains("configure_queue"), "{}", e.message());
    let e = refused(
        &db,
        &format!("SELECT sheaf.enqueue('{queue}', '{{}}', '{{\"fairness_weight\": 2}}')"),
    )
    .await;
    assert_eq!(e.code().code(), "22023", "{}", e.message());
}

/// An execution id that names no execution is P0002, as everywhere else.
#[tokio::test]
async fn enqueue_for_an_unknown_execution_is_no_data_found() {
    let (db, _) = first_shard().await;
    let e = refused(
        &db,
        "SELECT sheaf.enqueue('q', '{}', '{\"execution_id\": \"00000000-0000-8000-8000-00000000beef\"}')",
    )
    .await;
    assert_eq!(e.code().code(), "P0002", "{}", e.message());
}

/// Arrays of more than one dimension used to be flattened silently.
#[tokio::test]
async fn multidimensional_arrays_are_refused() {
    let (db, _) = first_shard().await;
    let id = "'00000000-0000-8000-8000-000000000001'::uuid";
    let cases = [
        (
            "SELECT sheaf.enqueue_batch('q', ARRAY[['{}', '{}'], ['{}', '{}']]::jsonb[])".to_owned(),
            "payloads",
        ),
        (format!("SELECT sheaf.redrive(ARRAY[[{id}, {id}]])"), "task_ids"),
        (
            "SELECT sheaf.worker_heartbeat('w', ARRAY[['a', 'b'], ['c', 'd']])".to_owned(),
            "queues",
        ),
        (
            format!("SELECT * FROM sheaf.complete_batch(ARRAY[[{id}, {id}]], ARRAY[1, 2]::bigint[])"),
            "task_ids",
        ),
        (
            format!("SELECT * FROM sheaf.complete_batch(ARRAY[{id}, {id}], ARRAY[[1, 2]]::bigint[])"),
            "tokens",
        ),
    ];
    for (sql, arg) in cases {
        let e = refused(&db, &sql).await;
        assert_eq!(e.code().code(), "22023", "{arg}: {}", e.message());
        assert!(
            e.message().contains(&format!("invalid {arg}")) && e.message().contains("one-dimensional"),
            "{arg}: {}",
            e.message()
        );
    }
}

/// A 1 MiB bad value comes back as a short message that says it was cut.
#[tokio::test]
async fn refusals_quote_at_most_64_bytes_of_a_value() {
    let (db, _) = first_shard().await;
    let huge = "x".repeat(1 << 20);
    let cases = [
        format!("SELECT sheaf.enqueue('q', '{{}}', '{{\"{huge}\": 1}}')"),
        format!("SELECT sheaf.enqueue('q', '{{}}', '{{\"kind\": \"{huge}\"}}')"),
        format!(
            "SELECT sheaf.enqueue('q', '{{}}', '{{\"run_at\": \"{}\"}}')",
            &huge[..60]
        ),
        format!("SELECT sheaf.declare_workflow('w', '{{\"queue\": [\"{huge}\"]}}')"),
        format!(
            "SELECT sheaf.declare_workflow('w', '{{\"concurrency\": {{\"key\": \"input.{huge}\", \"limit\": 1}}}}')"
        ),
    ];
    for sql in cases {
        let e = refused(&db, &sql).await;
        assert_eq!(e.code().code(), "22023", "{:.200}", e.message());
        assert!(
            e.message().len() < 400,
            "{} bytes: {:.200}",
            e.message().len(),
            e.message()
        );
    }
    let e = refused(
        &db,
        &format!("SELECT sheaf.enqueue('q', '{{}}', '{{\"kind\": \"{huge}\"}}')"),
    )
    .await;
    assert!(e.message().contains("bytes, cut)"), "{}", e.message());
}

/// A Postgres error raised while sheaf runs (here a lock timeout inside
/// `heartbeat`) reaches the client with its own code and message and no
/// Rust backtrace, though the shard's server runs with RUST_BACKTRACE=1
/// (scripts/shards starts it so).
#[tokio::test]
async fn no_rust_backtrace_reaches_a_client() {
    let (db, shard) = first_shard().await;
    let queue = unique("bt");
    db.batch_execute(&format!("SELECT sheaf.enqueue('{queue}', '{{}}')"))
        .await
        .expect("enqueue");
    let row = db
        .query_one(
            &format!("SELECT task_id, token FROM sheaf.claim('{queue}', 'w')"),
            &[],
        )
        .await
        .expect("claim");
    let (id, token): (uuid::Uuid, i64) = (row.get(0), row.get(1));
    let holder = connect(&shard).await;
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM sheaf.tasks WHERE id = '{id}' FOR UPDATE"
        ))
        .await
        .expect("hold the task's row");
    db.batch_execute("SET lock_timeout = '100ms'").await.expect("set");
    let e = db
        .query_one("SELECT sheaf.heartbeat($1, $2)", &[&id, &token])
        .await
        .expect_err("the row is locked");
    let e = e.as_db_error().expect("a server error");
    assert_eq!(e.code().code(), "55P03", "{}", e.message());
    assert!(e.message().contains("lock timeout"), "{}", e.message());
    for text in [Some(e.message()), e.detail(), e.hint(), e.where_()]
        .into_iter()
        .flatten()
    {
        assert!(
            !text.contains("backtrace") && !text.contains(".rs:") && !text.contains("rustc"),
            "a backtrace reached the client: {text:.300}"
        );
    }
    holder.batch_execute("ROLLBACK").await.expect("rollback");
}
