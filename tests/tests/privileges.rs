//! Privileges: a login role granted only `sheaf_worker` cannot call an admin
//! function, read or write any table of schema sheaf, or create objects in
//! it (42501 each); the protocol's steps (the relay's, settling a move) are
//! `sheaf_relay`'s alone, and a `Worker` or `sheaf relay` under a login
//! without it says so instead of failing each sweep; audit rows name the
//! login beside the declared actor; every SECURITY DEFINER function pins a
//! safe `search_path` (live, from `pg_proc.proconfig`); and no function
//! runs SQL built from caller text (a check over the extension's source and
//! SQL files, and over the live catalog).

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sheaf_driver::{
    ChildPlacement, EnqueueOptions, ExecutionId, ExecutionState, Outcome, Placement, PoolOptions,
    ProtocolRole, RelayEdge, ShardId, StartOptions, TaskDone, Topology, Worker, WorkerOptions,
};
use sheaf_tests::source_check::{check_file, check_repository, dynamic_sql, lex, without_tests};
use sheaf_tests::{cli_binary, code, connect, fleet, repo_root, unique, until};
use tokio_postgres::{Client, Config, NoTls};

const ROLE: &str = "sheaf_test_worker_login";

async fn as_worker(url: &str) -> Client {
    as_login(url, ROLE).await
}

async fn as_login(url: &str, login: &str) -> Client {
    let mut config: Config = url.parse().expect("a shard URL parses");
    config.user(login);
    let (client, connection) = config
        .connect(NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting as {login}: {e}"));
    tokio::spawn(connection);
    client
}

/// On every shard of `fleet`: `login`, a login role granted `role` alone
/// (made anew).
async fn make_login(fleet: &Topology, login: &str, role: &str) {
    for shard in fleet.shards() {
        connect(shard)
            .await
            .batch_execute(&format!(
                "DROP ROLE IF EXISTS {login}; CREATE ROLE {login} LOGIN; GRANT {role} TO {login}"
            ))
            .await
            .unwrap_or_else(|e| panic!("creating {login} on shard {}: {e}", shard.id));
    }
}

async fn drop_login(fleet: &Topology, login: &str) {
    for shard in fleet.shards() {
        connect(shard)
            .await
            .batch_execute(&format!("DROP ROLE {login}"))
            .await
            .unwrap_or_else(|e| panic!("dropping {login} on shard {}: {e}", shard.id));
    }
}

/// `url` with its user replaced by `login` (a URL, as scripts/shards prints).
fn url_as(url: &str, login: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
    let host = rest.split_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{login}@{host}")
}

/// `fleet`'s shards, connecting as `login`, in the SHEAF_SHARDS format.
fn spec_as(fleet: &Topology, login: &str) -> String {
    fleet
        .shards()
        .map(|s| format!("{}={}", s.id, url_as(&s.url, login)))
        .collect::<Vec<_>>()
        .join(",")
}

/// A client of `fleet` connecting as `login`.
fn client_as(fleet: &Topology, login: &str, actor: Option<&str>) -> Arc<sheaf_driver::Client> {
    let topology = Topology::parse(&spec_as(fleet, login)).expect("the fleet as another login");
    let options = PoolOptions::default().actor(actor.map(str::to_owned));
    Arc::new(sheaf_driver::Client::new(topology, options).expect("a client"))
}

/// `Err` unless `sql` is refused with 42501.
async fn refused(db: &Client, sql: &str) -> Result<(), String> {
    let result = db.batch_execute(sql).await;
    let _ = db.batch_execute("ROLLBACK").await;
    match result {
        Ok(()) => Err(format!("allowed: {sql}")),
        Err(e) if code(&e) == Some("42501") => Ok(()),
        Err(e) => Err(format!("refused with {:?}, not 42501: {sql}: {e}", code(&e))),
    }
}

/// Creating objects in the schema, changing sheaf's, becoming someone else.
const INTRUSIONS: &[&str] = &[
    "CREATE TABLE sheaf.intruder (i int)",
    "CREATE VIEW sheaf.intruder AS SELECT 1 AS i",
    "CREATE SEQUENCE sheaf.intruder",
    "CREATE FUNCTION sheaf.intruder() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "CREATE FUNCTION sheaf.shard_id(x int) RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "CREATE TYPE sheaf.intruder AS (i int)",
    "CREATE DOMAIN sheaf.intruder AS int",
    "ALTER FUNCTION sheaf.enqueue(text, jsonb, jsonb) SET search_path = public",
    "ALTER FUNCTION sheaf.enqueue(text, jsonb, jsonb) SECURITY INVOKER",
    "CREATE OR REPLACE FUNCTION sheaf.shard_id() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "CREATE INDEX intruder ON sheaf.tasks (queue)",
    "ALTER TABLE sheaf.tasks ADD COLUMN intruder int",
    "CREATE TRIGGER intruder BEFORE INSERT ON sheaf.tasks FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()",
    "SET ROLE sheaf_admin",
    "SET ROLE sheaf_relay",
    "SET SESSION AUTHORIZATION postgres",
];

/// The statements a worker must be refused, from the live catalog.
async fn forbidden_statements(admin: &Client) -> Vec<String> {
    let mut sql = Vec::new();
    // Every function not granted to sheaf_worker (the admin surface, and
    // the ones granted to no role), called with NULLs: the privilege check
    // comes before the function runs.
    let rows = admin
        .query(
            "SELECT 'sheaf.' || p.proname, \
                    ARRAY(SELECT 'NULL::' || pg_catalog.format_type(t, NULL) FROM unnest(p.proargtypes) WITH ORDINALITY a(t, i) ORDER BY i) \
             FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'sheaf'::regnamespace \
               AND NOT has_function_privilege('sheaf_worker', p.oid, 'EXECUTE') ORDER BY 1",
            &[],
        )
        .await
        .expect("listing admin functions");
    let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    for must in [
        "sheaf.init_shard",
        "sheaf.configure_queue",
        "sheaf.redrive",
        "sheaf.declare_workflow",
    ] {
        assert!(
            names.iter().any(|n| n == must),
            "{must} is an admin function: {names:?}"
        );
    }
    for r in &rows {
        let args: Vec<String> = r.get(1);
        sql.push(format!(
            "SELECT * FROM {}({})",
            r.get::<_, String>(0),
            args.join(", ")
        ));
    }
    // Every relation of the schema: read, write, truncate.
    let rows = admin
        .query(
            "SELECT format('sheaf.%I', c.relname), c.relkind::text, \
                    (SELECT format('%I', a.attname) FROM pg_catalog.pg_attribute a \
                     WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum LIMIT 1) \
             FROM pg_catalog.pg_class c WHERE c.relnamespace = 'sheaf'::regnamespace \
               AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S') ORDER BY 1",
            &[],
        )
        .await
        .expect("listing relations");
    assert!(rows.len() >= 10, "the tables of schema sheaf");
    for r in &rows {
        let (t, kind, col): (String, String, Option<String>) = (r.get(0), r.get(1), r.get(2));
        if kind == "S" {
            sql.push(format!("SELECT nextval('{t}')"));
            sql.push(format!("SELECT setval('{t}', 1)"));
            sql.push(format!("SELECT * FROM {t}"));
            continue;
        }
        sql.push(format!("SELECT * FROM {t} LIMIT 1"));
        sql.push(format!("INSERT INTO {t} DEFAULT VALUES"));
        if let Some(col) = col {
            sql.push(format!("SELECT {col} FROM {t} LIMIT 1"));
            sql.push(format!("UPDATE {t} SET {col} = {col}"));
        }
        sql.push(format!("DELETE FROM {t}"));
        if kind == "r" || kind == "p" {
            sql.push(format!("TRUNCATE {t}"));
            sql.push(format!("COPY {t} TO STDOUT"));
            sql.push(format!("BEGIN; LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE"));
        }
    }
    sql.extend(INTRUSIONS.iter().map(|s| s.to_string()));
    sql
}

#[tokio::test]
async fn a_worker_login_cannot_call_admin_functions_touch_tables_or_create_objects() {
    for shard in fleet().shards() {
        let admin = connect(shard).await;
        admin
            .batch_execute(&format!(
                "DROP ROLE IF EXISTS {ROLE}; CREATE ROLE {ROLE} LOGIN; GRANT sheaf_worker TO {ROLE}"
            ))
            .await
            .expect("creating the worker login");
        let worker = as_worker(&shard.url).await;
        // The worker surface works.
        let id: i32 = worker
            .query_one("SELECT sheaf.shard_id()", &[])
            .await
            .expect("a worker may call shard_id")
            .get(0);
        assert_eq!(id, i32::from(shard.id.get()));
        let mut problems = Vec::new();
        let statements = forbidden_statements(&admin).await;
        for sql in &statements {
            if let Err(p) = refused(&worker, sql).await {
                problems.push(p);
            }
        }
        // The catalog agrees: no right on any relation or column, no CREATE
        // on the schema.
        let granted: Option<String> = admin
            .query_one(
                &format!(
                    "SELECT string_agg(c.relname, ', ') FROM pg_catalog.pg_class c \
                     WHERE c.relnamespace = 'sheaf'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S') \
                       AND (has_table_privilege('{ROLE}', c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER') \
                            OR (c.relkind <> 'S' AND has_any_column_privilege('{ROLE}', c.oid, 'SELECT, INSERT, UPDATE, REFERENCES')) \
                            OR (c.relkind = 'S' AND has_sequence_privilege('{ROLE}', c.oid, 'USAGE, SELECT, UPDATE')))"
                ),
                &[],
            )
            .await
            .expect("the privilege query runs")
            .get(0);
        if let Some(t) = granted {
            problems.push(format!("{ROLE} has rights on: {t}"));
        }
        let create: bool = admin
            .query_one(
                &format!("SELECT has_schema_privilege('{ROLE}', 'sheaf', 'CREATE')"),
                &[],
            )
            .await
            .expect("the schema privilege query runs")
            .get(0);
        if create {
            problems.push(format!("{ROLE} may CREATE in schema sheaf"));
        }
        drop(worker);
        admin
            .batch_execute(&format!("DROP ROLE {ROLE}"))
            .await
            .expect("dropping the worker login");
        assert!(
            problems.is_empty(),
            "shard {}: {} of {} statements not refused with 42501:\n  {}",
            shard.id,
            problems.len(),
            statements.len(),
            problems.join("\n  ")
        );
    }
}

/// Held by a test while a relay of its own runs: another's would drive its
/// children too.
static RELAYING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The relay tests' own shards: any `Worker` of the other tests relays the
/// shared fleet's children, and these tests must be the only relay there is.
fn relay_fleet() -> &'static Topology {
    static FLEET: std::sync::OnceLock<Topology> = std::sync::OnceLock::new();
    FLEET.get_or_init(|| {
        let spec = sheaf_tests::own_shards("privileges", 24800, &["up", "--count", "2", "--no-install"]);
        Topology::parse(&spec).expect("own shards")
    })
}

/// The protocol's steps (docs/reference/roles.md): granted to `sheaf_relay` (and so
/// to `sheaf_admin`), never to `sheaf_worker`.
const PROTOCOL: [&str; 13] = [
    "migration_activate",
    "migration_repoint",
    "migration_report",
    "migration_stalled",
    "outbox_report",
    "outbox_take",
    "relay_close_child",
    "relay_pulled",
    "relay_report",
    "relay_start_child",
    "relay_take",
    "seal_run_ended",
    "seals_due",
];

/// Each protocol step as a relay calls it, for `child` of `parent`, a run
/// started on this shard for this caller (`key`: a fresh workflow id for
/// the child it starts): the function, the statement, and what a login
/// that may call it gets (`None`: an answer; a SQLSTATE: the function's
/// own refusal, which means it ran). `other`: another shard's id. The
/// takes lease nothing another test's relay is waiting for.
fn protocol_calls(
    child: uuid::Uuid,
    parent: uuid::Uuid,
    key: &str,
    other: ShardId,
) -> Vec<(&'static str, String, Option<&'static str>)> {
    vec![
        (
            "relay_take",
            format!("SELECT * FROM sheaf.relay_take(10, '1 second', ARRAY['{child}'::uuid])"),
            None,
        ),
        // No row of this child is taken: `stale`.
        (
            "relay_report",
            format!("SELECT sheaf.relay_report('{child}', 1, '{{\"pending\": 10}}')"),
            None,
        ),
        (
            "relay_start_child",
            format!(
                "SELECT * FROM sheaf.relay_start_child(sheaf.new_id(), '{parent}', 'proto-child', '{key}', '{{}}')"
            ),
            None,
        ),
        (
            "relay_close_child",
            format!("SELECT sheaf.relay_close_child('{child}', '{parent}', 'cancel', 'roles test')"),
            None,
        ),
        (
            "relay_pulled",
            format!("SELECT sheaf.relay_pulled('{child}')"),
            None,
        ),
        (
            "outbox_take",
            "SELECT * FROM sheaf.outbox_take(1, '1 second')".into(),
            None,
        ),
        ("seals_due", "SELECT * FROM sheaf.seals_due(1)".into(), None),
        // Not a seal: `false`.
        (
            "seal_run_ended",
            format!("SELECT sheaf.seal_run_ended('{child}')"),
            None,
        ),
        (
            "outbox_report",
            "SELECT sheaf.outbox_report(gen_random_uuid(), 1, '{\"failed\": \"roles test\"}')".into(),
            None,
        ),
        // Nothing staged: `false`.
        (
            "migration_activate",
            format!("SELECT sheaf.migration_activate('{child}')"),
            None,
        ),
        (
            "migration_report",
            "SELECT sheaf.migration_report(9223372036854775807, 1, 'failed', 'roles test')".into(),
            Some("P0002"),
        ),
        (
            "migration_stalled",
            "SELECT * FROM sheaf.migration_stalled('30 seconds', 10, '{}')".into(),
            None,
        ),
        // No seal of it here: `false`.
        (
            "migration_repoint",
            format!("SELECT sheaf.migration_repoint(sheaf.new_id(), {other})"),
            None,
        ),
    ]
}

#[tokio::test]
async fn the_protocol_steps_are_the_relay_roles_alone() {
    const WORKER: &str = "sheaf_test_proto_worker";
    const RELAY: &str = "sheaf_test_proto_relay";
    const ADMIN: &str = "sheaf_test_proto_admin";
    make_login(fleet(), WORKER, "sheaf_worker").await;
    make_login(fleet(), RELAY, "sheaf_relay").await;
    make_login(fleet(), ADMIN, "sheaf_admin").await;
    let mut problems = Vec::new();
    for shard in fleet().shards() {
        let owner = connect(shard).await;
        // The catalog: exactly these are the relay's and not the worker's.
        let rows = owner
            .query(
                "SELECT p.proname::text FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'sheaf'::regnamespace \
                   AND has_function_privilege('sheaf_relay', p.oid, 'EXECUTE') \
                   AND NOT has_function_privilege('sheaf_worker', p.oid, 'EXECUTE') ORDER BY 1",
                &[],
            )
            .await
            .expect("reading the grants");
        let relays: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        if relays != PROTOCOL {
            problems.push(format!(
                "shard {}: the relay's own functions are {relays:?}",
                shard.id
            ));
        }
        for (login, may) in [(WORKER, false), (RELAY, true), (ADMIN, true)] {
            // A child of a parent on another shard, started here for this caller.
            let parent = ExecutionId::mint(ShardId::new(9).expect("an id"))
                .expect("an id")
                .as_uuid();
            let child: uuid::Uuid = owner
                .query_one(
                    "SELECT execution_id FROM sheaf.relay_start_child(sheaf.new_id(), $1, 'proto-child', $2, '{}')",
                    &[&parent, &unique("proto")],
                )
                .await
                .expect("a child to act on")
                .get(0);
            let db = as_login(&shard.url, login).await;
            let other = fleet()
                .shards()
                .map(|s| s.id)
                .find(|s| *s != shard.id)
                .expect("another shard");
            for (function, sql, refusal) in protocol_calls(child, parent, &unique("proto"), other) {
                let got = db.query(sql.as_str(), &[]).await;
                let got = got
                    .as_ref()
                    .map(drop)
                    .map_err(|e| code(e).unwrap_or("none").to_owned());
                let want: Result<(), String> = match (may, refusal) {
                    (false, _) => Err("42501".into()),
                    (true, None) => Ok(()),
                    (true, Some(code)) => Err(code.into()),
                };
                if got != want {
                    problems.push(format!(
                        "shard {} {login} {function}: {got:?}, not {want:?}",
                        shard.id
                    ));
                }
            }
            // The backlogs stay the worker's: its metrics read them.
            for sql in [
                "SELECT * FROM sheaf.relay_backlog()",
                "SELECT * FROM sheaf.outbox_backlog()",
            ] {
                if let Err(e) = db.query(sql, &[]).await {
                    problems.push(format!("shard {} {login}: {sql}: {e}", shard.id));
                }
            }
        }
    }
    drop_login(fleet(), WORKER).await;
    drop_login(fleet(), RELAY).await;
    drop_login(fleet(), ADMIN).await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Waits until the parent `p` has its child's end in its history.
async fn child_completed(fleet: &Topology, p: ExecutionId) -> bool {
    let shard = fleet.get(p.route(fleet)).expect("its shard");
    let db = connect(shard).await;
    let n: i64 = db
        .query_one(
            "SELECT count(*) FROM sheaf.events WHERE execution_id = $1 AND event_type = 'ChildCompleted'",
            &[&p.as_uuid()],
        )
        .await
        .expect("reading its history")
        .get(0);
    n > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_login_works_without_the_protocol_and_a_relay_login_drives_a_child() {
    const WORKER: &str = "sheaf_test_proto_worker_w";
    const RELAY: &str = "sheaf_test_proto_relay_w";
    let _relaying = RELAYING.lock().await;
    let fleet = relay_fleet();
    make_login(fleet, WORKER, "sheaf_worker").await;
    make_login(fleet, RELAY, "sheaf_relay").await;
    let shards: Vec<ShardId> = fleet.shards().map(|s| s.id).collect();
    let owner = Arc::new(sheaf_driver::Client::new(fleet.clone(), PoolOptions::default()).expect("a client"));
    // A child on another shard than its parent's: the relay's to start.
    let parent = owner
        .start_workflow(
            &unique("proto-parent"),
            "p",
            json!({}),
            StartOptions::new().placement(Placement::Shard(shards[0])),
        )
        .await
        .expect("a parent")
        .execution_id;
    let child = owner
        .start_child(
            parent,
            &unique("proto-child"),
            "c",
            json!({}),
            ChildPlacement::Shard(shards[1]),
        )
        .await
        .expect("a child")
        .child_id;
    a_worker_login_runs_no_relay(&owner, child, &shards, WORKER).await;
    a_relay_login_drives_the_child(&owner, parent, child, &shards, RELAY).await;
    drop_login(fleet, WORKER).await;
    drop_login(fleet, RELAY).await;
}

/// A worker under `login` (sheaf_worker alone) claims and completes, and
/// runs no relay: the protocol is off on every shard, and it says so.
async fn a_worker_login_runs_no_relay(
    owner: &sheaf_driver::Client,
    child: ExecutionId,
    shards: &[ShardId],
    login: &str,
) {
    let worker = client_as(relay_fleet(), login, None);
    let queue = unique("proto-q");
    for &s in shards {
        for i in 0..3 {
            worker
                .enqueue(
                    &queue,
                    json!({"i": i}),
                    EnqueueOptions::new().placement(Placement::Shard(s)),
                )
                .await
                .expect("a worker login enqueues");
        }
    }
    let w = Worker::start(
        worker.clone(),
        WorkerOptions::new(unique("proto-w"), [queue.clone()]),
        |_ctx| async { Ok(TaskDone::Complete(None)) },
    )
    .expect("a worker starts");
    until(
        "the worker login's tasks are done",
        Duration::from_secs(30),
        async || w.stats().completed == 3 * shards.len() as u64,
    )
    .await;
    until(
        "every shard answered about sheaf_relay",
        Duration::from_secs(10),
        async || {
            shards
                .iter()
                .all(|&s| w.protocol_role(s) == Some(ProtocolRole::Missing))
        },
    )
    .await;
    // Two sweeps' time: the relay ran nowhere, so nothing was refused.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let text = worker.metrics_text();
    for &s in shards {
        assert!(!worker.metrics().protocol_role_held(s));
        assert!(
            text.contains(&format!("sheaf_protocol_role{{shard=\"{s}\"}} 0")),
            "{text}"
        );
        assert_eq!(
            worker.metrics().requests_total(s, Outcome::Error),
            0,
            "shard {s}: refused calls"
        );
    }
    assert_eq!(
        owner.get_execution(child).await.expect("a read"),
        None,
        "not started by anyone"
    );
    w.shutdown().await;
}

/// A worker under `login` (sheaf_relay alone) starts `child` of `parent`
/// and reports its end.
async fn a_relay_login_drives_the_child(
    owner: &sheaf_driver::Client,
    parent: ExecutionId,
    child: ExecutionId,
    shards: &[ShardId],
    login: &str,
) {
    let relay = client_as(relay_fleet(), login, None);
    let r = Worker::start(
        relay.clone(),
        WorkerOptions::new(unique("proto-r"), [unique("proto-none")]),
        |_ctx| async { Ok(TaskDone::Complete(None)) },
    )
    .expect("a relay login's worker starts");
    until("the relay started the child", Duration::from_secs(20), async || {
        matches!(owner.get_execution(child).await, Ok(Some(e)) if e.state == ExecutionState::Running)
    })
    .await;
    for &s in shards {
        assert_eq!(r.protocol_role(s), Some(ProtocolRole::Held));
        assert!(relay.metrics().protocol_role_held(s));
    }
    // Counted once the start is reported (the lock keeps any other relay away).
    until(
        "this worker's relay counted the start",
        Duration::from_secs(10),
        async || {
            relay
                .metrics()
                .relay_attempts_total(shards[1], RelayEdge::Start, false)
                >= 1
        },
    )
    .await;
    owner
        .complete_execution(child, json!({"done": true}))
        .await
        .expect("the child completes");
    until(
        "the parent has the child's end",
        Duration::from_secs(20),
        async || child_completed(relay_fleet(), parent).await,
    )
    .await;
    r.shutdown().await;
}

#[tokio::test]
async fn sheaf_relay_needs_the_relay_role_and_says_so() {
    const WORKER: &str = "sheaf_test_proto_worker_cli";
    const RELAY: &str = "sheaf_test_proto_relay_cli";
    let _relaying = RELAYING.lock().await;
    let fleet = relay_fleet();
    make_login(fleet, WORKER, "sheaf_worker").await;
    make_login(fleet, RELAY, "sheaf_relay").await;
    let refused = tokio::process::Command::new(cli_binary())
        .args(["relay", "--report-every", "1s"])
        .env("SHEAF_SHARDS", spec_as(fleet, WORKER))
        .env_remove("SHEAF_TOPOLOGY_DIGEST")
        .kill_on_drop(true)
        .output();
    let refused = tokio::time::timeout(Duration::from_secs(30), refused)
        .await
        .expect("it exits at once")
        .expect("the CLI runs");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(7), "{stderr}");
    assert!(
        stderr.contains("sheaf_relay") && stderr.contains(WORKER) && stderr.contains("GRANT"),
        "{stderr}"
    );
    for shard in fleet.shards() {
        let host = url_as(&shard.url, "x");
        let host = host.split_once('@').map_or("", |(_, h)| h);
        assert!(
            !stderr.contains(host) && !stderr.contains("://"),
            "a connection string in {stderr}"
        );
    }

    let mut running = tokio::process::Command::new(cli_binary())
        .args(["relay", "--report-every", "1s"])
        .env("SHEAF_SHARDS", spec_as(fleet, RELAY))
        .env_remove("SHEAF_TOPOLOGY_DIGEST")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the CLI starts");
    let mut lines = tokio::io::BufReader::new(running.stdout.take().expect("stdout"));
    // Its start, then one report of every shard's backlog.
    for _ in 0..=fleet.shards().count() {
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(20),
            tokio::io::AsyncBufReadExt::read_line(&mut lines, &mut line),
        )
        .await
        .expect("a line in time")
        .expect("a line");
        assert!(
            line.starts_with("relay running") || line.starts_with("shard "),
            "{line}"
        );
    }
    running.kill().await.expect("stopped");
    drop_login(fleet, WORKER).await;
    drop_login(fleet, RELAY).await;
}

#[tokio::test]
async fn audit_rows_carry_the_login_beside_the_declared_actor() {
    const ADMIN: &str = "sheaf_test_audit_login";
    make_login(fleet(), ADMIN, "sheaf_admin").await;
    let c = client_as(fleet(), ADMIN, Some("ann"));
    let key = unique("audit-login");
    let set = c.admin().set_concurrency_limit(&key, Some(3)).await;
    assert!(set.failed.is_empty(), "{:?}", set.failed);
    let audit = c.admin().fleet_audit_log(50).await;
    assert!(audit.failed.is_empty(), "{:?}", audit.failed);
    for shard in fleet().shards() {
        let entry = audit.ok[&shard.id]
            .iter()
            .find(|e| e.target.as_deref() == Some(key.as_str()))
            .expect("the cap's entry");
        assert_eq!(
            (entry.actor.as_str(), entry.login.as_str()),
            ("ann", ADMIN),
            "shard {}",
            shard.id
        );
    }
    drop(c);
    drop_login(fleet(), ADMIN).await;
}

#[tokio::test]
async fn every_security_definer_function_pins_a_safe_search_path() {
    for shard in fleet().shards() {
        let db = connect(shard).await;
        let rows = db
            .query(
                "SELECT p.oid::regprocedure::text, p.prosecdef, \
                        (SELECT substr(c, 13) FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%'), \
                        p.prosqlbody IS NOT NULL \
                 FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'sheaf'::regnamespace ORDER BY 1",
                &[],
            )
            .await
            .expect("reading pg_proc");
        let definers = rows.iter().filter(|r| r.get::<_, bool>(1)).count();
        assert!(definers >= 20, "SECURITY DEFINER functions: {definers}");
        let mut problems = Vec::new();
        for r in &rows {
            let (f, definer, path, bound): (String, bool, Option<String>, bool) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            let Some(path) = path else {
                if definer {
                    problems.push(format!("{f}: SECURITY DEFINER without a pinned search_path"));
                } else if !bound {
                    // A SQL-standard body (ready_k1, ready_aging_band) binds its names when it
                    // is created: no search_path can change what it calls.
                    problems.push(format!(
                        "{f}: no pinned search_path (docs/reference/sql/README.md: every function pins it)"
                    ));
                }
                continue;
            };
            let parts: Vec<&str> = path.split(',').map(|s| s.trim().trim_matches('"')).collect();
            let safe = parts.first() == Some(&"sheaf")
                && parts.last() == Some(&"pg_temp")
                && parts
                    .iter()
                    .all(|p| ["sheaf", "pg_catalog", "pg_temp"].contains(p));
            if !safe {
                problems.push(format!(
                    "{f}: search_path={path} (must be sheaf, pg_catalog, pg_temp: pg_temp last, nothing a caller can create in)"
                ));
            }
        }
        assert!(
            problems.is_empty(),
            "shard {}:\n  {}",
            shard.id,
            problems.join("\n  ")
        );
    }
}

#[tokio::test]
async fn no_function_runs_sql_built_from_caller_text() {
    let problems = check_repository(&repo_root());
    assert!(
        problems.is_empty(),
        "SQL built at run time (every statement must be a `const` Stmt run by plans::run):\n  {}",
        problems.join("\n  ")
    );
    // The live catalog: every function is C (its SQL is the constants
    // above), or its body has no dynamic SQL.
    let shard = fleet().shards().next().expect("a shard");
    let db = connect(shard).await;
    let rows = db
        .query(
            "SELECT p.oid::regprocedure::text, l.lanname, p.prosrc FROM pg_catalog.pg_proc p \
             JOIN pg_catalog.pg_language l ON l.oid = p.prolang \
             WHERE p.pronamespace = 'sheaf'::regnamespace",
            &[],
        )
        .await
        .expect("reading pg_proc");
    let mut live = Vec::new();
    for r in &rows {
        let (f, lang, src): (String, String, String) = (r.get(0), r.get(1), r.get(2));
        if lang != "c" && !dynamic_sql(&src).is_empty() {
            live.push(format!("{f} ({lang}): {:?}", dynamic_sql(&src)));
        }
    }
    assert!(
        live.is_empty(),
        "functions with dynamic SQL:\n  {}",
        live.join("\n  ")
    );
}

/// The source check sees what it must refuse (each case alone is flagged).
#[test]
fn the_source_check_sees_sql_built_at_run_time() {
    let cases = [
        "fn f(q: &str) { Spi::run(&format!(\"SELECT {q}\")).ok(); }",
        "fn f(c: &mut SpiClient, q: String) { c.update(&q, None, &[]); }",
        "fn f(q: String) { let s = Stmt::read(q.leak(), &[]); }",
        "fn f() { let s = Stmt::read(\"SELECT 1\", &[]); }",
        "const S: Stmt = Stmt::read(\"SELECT format('%s', $1)\", &[]);",
        "const S: Stmt = Stmt::write(\"DO $$ BEGIN EXECUTE $1; END $$\", &[]);",
        "fn f() { unsafe { pg_sys::SPI_execute(p, false, 0) }; }",
    ];
    for case in cases {
        let l = lex(case);
        let (code, _) = without_tests(&l.code);
        assert!(
            !check_file("queue/x.rs", &code, &l.strings).is_empty(),
            "not flagged: {case}"
        );
    }
    // What sheaf does is not flagged, nor tests.
    let fine = "const S: Stmt = Stmt::read(\"SELECT 1 FROM t WHERE id = $1\", &[]);\n\
                fn f() { Spi::connect_mut(|c| run(c, &S, &[])); }\n\
                #[cfg(any(test, feature = \"pg_test\"))]\nmod tests { fn t() { Spi::run(&format!(\"x{}\", 1)); } }";
    let l = lex(fine);
    let (code, _) = without_tests(&l.code);
    assert_eq!(check_file("queue/x.rs", &code, &l.strings), Vec::<String>::new());
}
