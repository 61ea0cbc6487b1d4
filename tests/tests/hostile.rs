//! Hostile input: every function of schema `sheaf`, enumerated from
//! `pg_proc` (a new function is covered without editing this file), called
//! with hostile values of each argument's type, one argument at a time, the
//! others as in its valid call (`tests/src/valid_calls.rs`; a function with
//! none gets typed defaults). Pass: success or a SQLSTATE of the errors
//! table in docs/reference/errors.md (never XX000), the connection still usable, no call over
//! 2 s, nothing written by a refused call, no refusal longer than 1 KB (a
//! huge value is never echoed), and the server log free of PANIC, TRAP and
//! `terminated by signal`. Two input rules (docs/reference/input-rules.md)
//! on every call: a call that went through stored no name that breaks the
//! name rule (`NAMES_BREAKING_THE_RULE`, scanned before its rollback), and
//! every argument that takes a value to store (`SIZED`) refuses one byte
//! over its limit with 54000 and takes exactly the limit.
//!
//! Values Postgres itself cannot convert (an `'infinity'` interval before
//! PostgreSQL 17) never reach sheaf and are skipped. Functions granted to
//! no role (`ready_k1` and `ready_aging_band`, the ready set's aging key and
//! band) are left out.
//!
//! CI form: the fixed list of `sheaf_tests::hostile`, spread over the
//! fleet's shards (each in a database of its own). Long form:
//! `SHEAF_HOSTILE_ROUNDS=N` adds N rounds of random combinations (several
//! arguments hostile at once, several option fields at once) per function,
//! seeded by `SHEAF_HOSTILE_SEED` (printed).

use std::time::{Duration, Instant};

use sheaf_tests::hostile::{
    NAMES_BREAKING_THE_RULE, OWN_COPIES, SIZED, default_arg, random_value, sized_value, values,
};
use sheaf_tests::valid_calls::{VALID_CALLS, ValidCall};
use sheaf_tests::{Rng, fleet, own_database, repo_root};
use tokio_postgres::Client;

const DB: &str = "sheaf_hostile";
const LIMIT: Duration = Duration::from_secs(2);
const MESSAGE_CAP: usize = 1024;

/// A function of schema sheaf, as the catalog has it.
#[derive(Debug, Clone)]
struct Function {
    signature: String,
    name: String,
    types: Vec<String>,
    names: Vec<String>,
    granted: bool,
}

async fn functions(db: &Client) -> Vec<Function> {
    let rows = db
        .query(
            "SELECT format('%s.%s(%s)', n.nspname, p.proname, pg_catalog.oidvectortypes(p.proargtypes)), \
                    'sheaf.' || p.proname, \
                    ARRAY(SELECT pg_catalog.format_type(t, NULL) FROM unnest(p.proargtypes) WITH ORDINALITY a(t, i) ORDER BY i), \
                    coalesce(p.proargnames[1:p.pronargs], '{}'), \
                    has_function_privilege('sheaf_worker', p.oid, 'EXECUTE') \
                      OR has_function_privilege('sheaf_admin', p.oid, 'EXECUTE') \
             FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = 'sheaf' ORDER BY 1",
            &[],
        )
        .await
        .expect("listing the functions of schema sheaf");
    rows.iter()
        .map(|r| Function {
            signature: r.get(0),
            name: r.get(1),
            types: r.get(2),
            names: r.get(3),
            granted: r.get(4),
        })
        .collect()
}

/// The SQLSTATEs of the errors table (docs/reference/errors.md), XX000 left out.
fn documented_codes() -> Vec<String> {
    let doc = std::fs::read_to_string(repo_root().join("docs/reference/errors.md"))
        .expect("docs/reference/errors.md");
    let section = doc
        .split("# Errors\n")
        .nth(1)
        .and_then(|s| s.split("\n#").next())
        .expect("docs/reference/errors.md has an Errors section");
    let codes: Vec<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|c| c.len() == 5 && *c != "XX000")
        .map(str::to_owned)
        .collect();
    assert!(codes.len() >= 5, "the Errors table parsed: {codes:?}");
    codes
}

/// The statement counting every table of schema sheaf.
async fn counts_sql(db: &Client) -> String {
    let tables: String = db
        .query_one(
            "SELECT string_agg(format('(SELECT count(*) FROM sheaf.%I)', relname), ', ' ORDER BY relname) \
             FROM pg_catalog.pg_class WHERE relnamespace = 'sheaf'::regnamespace AND relkind IN ('r', 'p')",
            &[],
        )
        .await
        .expect("listing the tables")
        .get(0);
    format!("SELECT ARRAY[{tables}]::bigint[]")
}

/// One shard's run: its database, what it found, what it checked.
struct Run {
    shard: u16,
    db: Client,
    codes: Vec<String>,
    counts_sql: String,
    failures: Vec<String>,
    calls: usize,
    refused: usize,
    skipped: usize,
    /// Arguments the size limit was checked on.
    sized: usize,
    /// The argument made hostile is sheaf's own copy (`OWN_COPIES`).
    own_copy: bool,
    slowest: (Duration, String),
    alive: bool,
}

fn excerpt(sql: &str) -> String {
    if sql.len() <= 300 {
        return sql.to_owned();
    }
    let mut cut = 300;
    while !sql.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes)", &sql[..cut], sql.len())
}

impl Run {
    async fn counts(&mut self) -> Vec<i64> {
        match self.db.query_one(&self.counts_sql, &[]).await {
            Ok(r) => r.get(0),
            Err(e) => {
                self.fail(format!("counting rows: {e}"));
                Vec::new()
            }
        }
    }

    fn fail(&mut self, what: String) {
        eprintln!("hostile FAIL (shard {}): {what}", self.shard);
        self.failures.push(what);
    }

    /// Whether Postgres converts `value` to its type at all (if not, the
    /// value never reaches sheaf: not sheaf's to judge).
    async fn converts(&mut self, value: &str) -> bool {
        let ok = self
            .db
            .query_one(&format!("SELECT ({value}) IS NULL"), &[])
            .await
            .is_ok();
        if !ok {
            self.skipped += 1;
        }
        ok
    }

    /// One hostile call in a transaction of its own, rolled back, judged;
    /// its SQLSTATE if refused.
    async fn attempt(&mut self, f: &Function, args: &[String], before: &[i64]) -> Option<String> {
        let sql = format!("SELECT * FROM {}({})", f.name, args.join(", "));
        let began = self.db.batch_execute("BEGIN").await;
        let started = Instant::now();
        let result = self.db.query(&sql, &[]).await;
        let took = started.elapsed();
        // What a call that went through stored, before the rollback.
        let stored = match &result {
            Ok(_) if !self.own_copy => self.db.query_one(NAMES_BREAKING_THE_RULE, &[]).await.ok(),
            _ => None,
        };
        let _ = self.db.batch_execute("ROLLBACK").await;
        if let Some(bad) = stored.and_then(|r| r.get::<_, Option<String>>(0)) {
            self.fail(format!(
                "{}: stored a name that breaks the name rule ({bad}): {}",
                f.signature,
                excerpt(&sql)
            ));
        }
        let code = result
            .as_ref()
            .err()
            .and_then(|e| e.as_db_error())
            .map(|d| d.code().code().to_owned());
        self.calls += 1;
        if took > self.slowest.0 {
            self.slowest = (took, excerpt(&sql));
        }
        if took > LIMIT {
            self.fail(format!("{}: took {took:?}: {}", f.signature, excerpt(&sql)));
        }
        if let Err(e) = result {
            self.refused += 1;
            self.judge_refusal(f, &sql, &e);
        }
        if began.is_err() || self.db.query_one("SELECT 1", &[]).await.is_err() {
            self.fail(format!(
                "{}: the connection died (a backend crash?): {}",
                f.signature,
                excerpt(&sql)
            ));
            self.alive = false;
            return code;
        }
        let after = self.counts().await;
        if after != before {
            self.fail(format!(
                "{}: rows changed ({before:?} -> {after:?}): {}",
                f.signature,
                excerpt(&sql)
            ));
        }
        code
    }

    /// The size limit on an argument that takes a caller's value to store
    /// (`SIZED`): one byte over its limit is refused with 54000, exactly
    /// the limit is not (it may be refused for something else).
    async fn size_limit(&mut self, f: &Function, base: &[String], i: usize, before: &[i64]) {
        let (ty, name) = (&f.types[i], f.names.get(i).map_or("", String::as_str));
        let Some(&(_, limit)) = SIZED.iter().find(|(n, _)| *n == name) else {
            return;
        };
        if OWN_COPIES.contains(&(f.name.as_str(), name)) {
            return;
        }
        let (Some(over), Some(at)) = (sized_value(ty, limit + 1), sized_value(ty, limit)) else {
            return;
        };
        self.sized += 1;
        for (value, over_limit) in [(over, true), (at, false)] {
            let mut args = base.to_vec();
            args[i] = value;
            let code = self.attempt(f, &args, before).await;
            if (code.as_deref() == Some("54000")) != over_limit {
                self.fail(format!(
                    "{}: {name} of {} bytes (the limit {limit}): SQLSTATE {code:?}, expected {}",
                    f.signature,
                    if over_limit { limit + 1 } else { limit },
                    if over_limit { "54000" } else { "anything but 54000" }
                ));
            }
        }
    }

    fn judge_refusal(&mut self, f: &Function, sql: &str, e: &tokio_postgres::Error) {
        let Some(db) = e.as_db_error() else {
            return; // a lost connection: the liveness check reports it
        };
        let code = db.code().code();
        if !self.codes.iter().any(|c| c == code) {
            self.fail(format!(
                "{}: SQLSTATE {code} is not in docs/reference/errors.md: {} ({})",
                f.signature,
                excerpt(db.message()),
                excerpt(sql)
            ));
        }
        let size = db.message().len() + db.detail().map_or(0, str::len) + db.hint().map_or(0, str::len);
        if size >= MESSAGE_CAP {
            self.fail(format!(
                "{}: a {size}-byte refusal ({code}): {} ({})",
                f.signature,
                excerpt(db.message()),
                excerpt(sql)
            ));
        }
    }

    /// Every hostile value of every argument of `f`, one at a time.
    async fn fixed_variations(&mut self, f: &Function, base: &[String]) {
        let before = self.counts().await;
        for (i, ty) in f.types.iter().enumerate() {
            let name = f.names.get(i).map_or("", String::as_str);
            // Sheaf's own copy of a name an entry point took: not judged again.
            self.own_copy = OWN_COPIES.contains(&(f.name.as_str(), name));
            for value in values(ty, name, &base[i]) {
                if !self.alive {
                    return;
                }
                if !self.converts(&value).await {
                    continue;
                }
                let mut args = base.to_vec();
                args[i] = value;
                self.attempt(f, &args, &before).await;
            }
            if self.alive {
                self.size_limit(f, base, i, &before).await;
            }
        }
    }

    /// The long form: `rounds` calls of `f` with random arguments made
    /// hostile, several at once.
    async fn random_variations(&mut self, f: &Function, base: &[String], rng: &mut Rng, rounds: u64) {
        if f.types.is_empty() {
            return;
        }
        let before = self.counts().await;
        for _ in 0..rounds {
            let mut args = base.to_vec();
            let mut ok = true;
            self.own_copy = false;
            for (i, ty) in f.types.iter().enumerate() {
                if rng.below(2) == 0 {
                    continue;
                }
                let name = f.names.get(i).map_or("", String::as_str);
                self.own_copy |= OWN_COPIES.contains(&(f.name.as_str(), name));
                let value = random_value(rng, ty, name, &base[i]);
                ok &= self.converts(&value).await;
                args[i] = value;
            }
            if !self.alive {
                return;
            }
            if ok {
                self.attempt(f, &args, &before).await;
            }
        }
    }
}

/// The server log of a shard started by `scripts/shards` (`<dir>/log`
/// beside `<dir>/data`), and its length now.
async fn server_log(db: &Client) -> Option<(std::path::PathBuf, u64)> {
    let data: String = db.query_one("SHOW data_directory", &[]).await.ok()?.get(0);
    let log = std::path::Path::new(&data).parent()?.join("log");
    let len = std::fs::metadata(&log).ok()?.len();
    Some((log, len))
}

fn log_problems(log: &std::path::Path, from: u64) -> Vec<String> {
    use std::io::{Read, Seek};
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(log) {
        let _ = f.seek(std::io::SeekFrom::Start(from));
        let mut bytes = Vec::new();
        let _ = f.read_to_end(&mut bytes);
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    text.lines()
        .filter(|l| l.contains("PANIC") || l.contains("TRAP") || l.contains("terminated by signal"))
        .map(|l| format!("server log {}: {}", log.display(), excerpt(l)))
        .collect()
}

/// The valid calls' order, then functions with none (typed defaults).
fn plan(all: &[Function]) -> Vec<(Function, Option<&'static ValidCall>)> {
    let mut plan: Vec<(Function, Option<&'static ValidCall>)> = VALID_CALLS
        .iter()
        .filter_map(|c| {
            all.iter()
                .find(|f| f.signature == c.function)
                .map(|f| (f.clone(), Some(c)))
        })
        .collect();
    for f in all {
        if !VALID_CALLS.iter().any(|c| c.function == f.signature) {
            eprintln!("hostile: {} has no valid call; typed defaults", f.signature);
            plan.push((f.clone(), None));
        }
    }
    plan
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// A fresh database on the shard's cluster, made by the valid calls' rules.
async fn fresh_database(url: &str) -> Client {
    let db = own_database::recreate(url, DB).await;
    db.batch_execute("CREATE EXTENSION sheaf; SET statement_timeout = '2s'")
        .await
        .expect("CREATE EXTENSION sheaf");
    db
}

/// Runs the valid calls in order on shard `index` of `shards`, and the
/// hostile variations of every `shards`-th function of them.
async fn run_shard(url: String, shard: u16, index: usize, shards: usize) -> Run {
    let db = fresh_database(&url).await;
    let all = functions(&db).await;
    let counts_sql = counts_sql(&db).await;
    let log = server_log(&db).await;
    let mut run = Run {
        shard,
        db,
        codes: documented_codes(),
        counts_sql,
        failures: Vec::new(),
        calls: 0,
        refused: 0,
        skipped: 0,
        sized: 0,
        own_copy: false,
        slowest: (Duration::ZERO, String::new()),
        alive: true,
    };
    let rounds = env_u64("SHEAF_HOSTILE_ROUNDS").unwrap_or(0);
    let seed = env_u64("SHEAF_HOSTILE_SEED").unwrap_or_else(|| Rng::from_time().1) + index as u64;
    let mut rng = Rng::new(seed);
    if rounds > 0 {
        eprintln!("hostile: shard {shard}: {rounds} random rounds per function, seed {seed}");
    }
    for (n, (f, valid)) in plan(&all).into_iter().enumerate() {
        if !run.alive {
            break;
        }
        let base: Vec<String> = match valid {
            Some(c) => c.args.iter().map(|a| a.to_string()).collect(),
            None => f.types.iter().map(|t| default_arg(t)).collect(),
        };
        for sql in valid.map_or(&[][..], |c| c.setup) {
            if let Err(e) = run.db.batch_execute(sql).await {
                run.fail(format!("{}: setup failed: {sql}: {e}", f.signature));
            }
        }
        if n % shards == index && f.granted {
            run.fixed_variations(&f, &base).await;
            run.random_variations(&f, &base, &mut rng, rounds).await;
        } else if !f.granted && index == 0 {
            eprintln!("hostile: {} is granted to no role: left out", f.signature);
        }
        // The valid call still works after its variations (they wrote nothing).
        if let (Some(c), true) = (valid, run.alive)
            && let Err(e) = run.db.batch_execute(&c.sql()).await
        {
            run.fail(format!(
                "{}: the valid call failed after the hostile ones: {e}",
                f.signature
            ));
        }
    }
    if let Some((path, from)) = log {
        for problem in log_problems(&path, from) {
            run.fail(problem);
        }
    } else {
        eprintln!("hostile: shard {shard}: server log not found (not a scripts/shards cluster?)");
    }
    run
}

#[tokio::test]
async fn every_function_survives_hostile_arguments() {
    let shards: Vec<(String, u16)> = fleet().shards().map(|s| (s.url.clone(), s.id.get())).collect();
    let count = shards.len();
    let started = Instant::now();
    let runs = futures::future::join_all(
        shards
            .into_iter()
            .enumerate()
            .map(|(i, (url, id))| tokio::spawn(run_shard(url, id, i, count))),
    )
    .await;
    let mut failures = Vec::new();
    let mut sized = 0;
    for run in runs {
        let run = run.expect("a shard's run panicked");
        eprintln!(
            "hostile: shard {}: {} calls, {} refused, {} values skipped (Postgres cannot convert them), {} arguments size-checked, slowest {:?}: {}",
            run.shard, run.calls, run.refused, run.skipped, run.sized, run.slowest.0, run.slowest.1
        );
        sized += run.sized;
        let _ = run.db.batch_execute("SELECT 1").await;
        failures.extend(run.failures);
        let url = fleet()
            .shards()
            .find(|s| s.id.get() == run.shard)
            .map(|s| s.url.clone());
        drop(run.db);
        if let Some(url) = url {
            own_database::drop(&url, DB).await;
        }
    }
    eprintln!("hostile: done in {:?}", started.elapsed());
    // payload, payloads, input, result, progress and error of enqueue,
    // enqueue_batch, the starts, signals, completions and failures.
    assert!(
        sized >= 15,
        "the size limit was checked on only {sized} arguments"
    );
    assert!(
        failures.is_empty(),
        "{} hostile-input failures:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}
