//! Privileges: a login role granted only `sheaf_worker` cannot call an admin
//! function, read or write any table of schema sheaf, or create objects in
//! it (42501 each); every SECURITY DEFINER function pins a safe
//! `search_path` (live, from `pg_proc.proconfig`); and no function runs SQL
//! built from caller text (a check over the extension's source and SQL
//! files, and over the live catalog).

use sheaf_tests::source_check::{check_file, check_repository, dynamic_sql, lex, without_tests};
use sheaf_tests::{code, connect, fleet, repo_root};
use tokio_postgres::{Client, Config, NoTls};

const ROLE: &str = "sheaf_test_worker_login";

async fn as_worker(url: &str) -> Client {
    let mut config: Config = url.parse().expect("a shard URL parses");
    config.user(ROLE);
    let (client, connection) = config
        .connect(NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting as {ROLE}: {e}"));
    tokio::spawn(connection);
    client
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
                        "{f}: no pinned search_path (README: every function pins it)"
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
