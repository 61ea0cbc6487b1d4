//! sheaf's statements, each prepared once per backend and kept, so the hot
//! functions skip parse and plan on every call.

use std::cell::RefCell;
use std::collections::HashMap;

use pgrx::PgOid;
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiTupleTable};

use crate::base::errors::SpiResultExt;
use crate::base::rows::{self, Column, FromRow};

/// One statement: its SQL (its address is the cache key), argument types, and whether
/// it writes (SPI runs read-only statements against the transaction snapshot).
pub struct Stmt {
    pub sql: &'static str,
    pub args: &'static [PgBuiltInOids],
    pub writes: bool,
}

impl Stmt {
    pub const fn read(sql: &'static str, args: &'static [PgBuiltInOids]) -> Stmt {
        Stmt {
            sql,
            args,
            writes: false,
        }
    }

    pub const fn write(sql: &'static str, args: &'static [PgBuiltInOids]) -> Stmt {
        Stmt {
            sql,
            args,
            writes: true,
        }
    }
}

thread_local! {
    // A backend is single-threaded; the cache lives as long as the backend.
    // Keyed by the address of the statement's SQL text: every statement is a
    // `&'static str`, so the address identifies it without hashing the text.
    static PLANS: RefCell<HashMap<usize, OwnedPreparedStatement>> = RefCell::new(HashMap::new());
}

#[cfg(any(test, feature = "pg_test"))]
thread_local! {
    /// The statements this backend ran, for the budget test (`api::budget`).
    static RAN: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Notes a statement run, in a test build; nothing otherwise.
fn note(_sql: &str) {
    #[cfg(any(test, feature = "pg_test"))]
    RAN.with(|r| r.borrow_mut().push(_sql.to_owned()));
}

/// The statements run since the last call, in order (a test build only).
#[cfg(any(test, feature = "pg_test"))]
pub fn take_ran() -> Vec<String> {
    RAN.with(|r| std::mem::take(&mut *r.borrow_mut()))
}

/// Runs `stmt` with `args` through its kept plan, preparing it on first use.
fn run<'conn>(client: &mut SpiClient<'conn>, stmt: &Stmt, args: &[DatumWithOid<'_>]) -> SpiTupleTable<'conn> {
    note(stmt.sql);
    PLANS.with(|plans| {
        let mut plans = plans.borrow_mut();
        let key = stmt.sql.as_ptr() as usize;
        let plan = &*plans.entry(key).or_insert_with(|| {
            let types: Vec<PgOid> = stmt.args.iter().map(|t| PgOid::BuiltIn(*t)).collect();
            let prepared = if stmt.writes {
                client.prepare_mut(stmt.sql, &types)
            } else {
                client.prepare(stmt.sql, &types)
            };
            prepared.or_internal("preparing a statement").keep()
        });
        let _settings = PlannerSettings::apply(false);
        let result = if stmt.writes {
            client.update(plan, None, args)
        } else {
            client.select(plan, None, args)
        };
        result.or_internal("running a statement")
    })
}

/// Runs a read built for one call (a listing's filter decides its shape):
/// planned for its values and not kept. Sequential scans and JIT stay off as
/// for every sheaf statement; bitmap scans are allowed, as a GIN lookup on
/// search attributes and the branches of an `or` come only as bitmaps.
pub fn select_once<'conn>(
    client: &SpiClient<'conn>,
    sql: &str,
    args: &[DatumWithOid<'_>],
) -> SpiTupleTable<'conn> {
    note(sql);
    let _settings = PlannerSettings::apply(true);
    client.select(sql, None, args).or_internal("running a listing")
}

/// A statement run on its own SPI connection, through its kept plan and
/// under sheaf's planner settings (as [`run`]), its rows read by
/// [`FromRow`] or [`Column`] with `rows`' NULL policy; `doing` says what
/// sheaf was doing, for the XX000 a bad row raises. [`run`] stays for
/// statements that must share one connection or stream their rows.
impl Stmt {
    /// Runs it, for what it does.
    pub fn exec(&self, args: &[DatumWithOid<'_>]) {
        Spi::connect_mut(|client| {
            run(client, self, args);
        })
    }

    /// How many rows it returned (or wrote, without a `RETURNING`).
    pub fn count(&self, args: &[DatumWithOid<'_>]) -> usize {
        Spi::connect_mut(|client| run(client, self, args).len())
    }

    /// The row it always returns (an aggregate, `EXISTS`, a `RETURNING` of
    /// a row known to exist); XX000 if there is none ([`rows::only`]).
    pub fn one<T: FromRow>(&self, args: &[DatumWithOid<'_>], doing: &str) -> T {
        Spi::connect_mut(|client| rows::only(run(client, self, args), doing))
    }

    /// Its first row, if it returned one.
    pub fn first<T: FromRow>(&self, args: &[DatumWithOid<'_>], doing: &str) -> Option<T> {
        Spi::connect_mut(|client| rows::first(run(client, self, args), doing))
    }

    /// Every row it returned.
    pub fn all<T: FromRow>(&self, args: &[DatumWithOid<'_>], doing: &str) -> Vec<T> {
        Spi::connect_mut(|client| rows::all(run(client, self, args), doing))
    }

    /// The first column of the row it always returns; XX000 if there is none.
    pub fn one_value<T: Column>(&self, args: &[DatumWithOid<'_>], doing: &str) -> T {
        Spi::connect_mut(|client| rows::only_value(run(client, self, args), doing))
    }

    /// The first column of its first row, if it returned one.
    pub fn value<T: Column>(&self, args: &[DatumWithOid<'_>], doing: &str) -> Option<T> {
        Spi::connect_mut(|client| rows::value(run(client, self, args), doing))
    }

    /// The first column of every row it returned.
    pub fn values<T: Column>(&self, args: &[DatumWithOid<'_>], doing: &str) -> Vec<T> {
        Spi::connect_mut(|client| rows::values(run(client, self, args), doing))
    }
}

/// The planner settings every sheaf statement runs under, applied while it
/// runs (whenever the plan cache plans it: the first run, and after any
/// invalidation, such as an ANALYZE of its tables):
/// - the generic plan. Left to itself the plan cache keeps choosing custom
///   plans for statements with a `LIMIT $n`, and re-plans them on every call:
///   planning cost more than the claim itself.
/// - no sequential scans. The generic plan of a statement prepared while a
///   table is small reads the whole table (the cheapest way through 1,000
///   rows), and keeps doing so as the table grows until the next re-plan: a
///   claim, a completion or an enqueue would then cost O(rows). Every sheaf
///   statement is written for a seek on the index its predicate names.
/// - no bitmap scans, for the same reason: a bitmap scan reads every entry
///   in its range before the first row comes out, where an index scan under
///   a `LIMIT` stops at the first live one. The planner prices them alike
///   on a table its statistics call small, and picked one for the walk over
///   the claim floors (`queue::floor`), reading every old floor a held
///   snapshot keeps.
/// - no JIT. Before PostgreSQL 18 a priced-out scan (a one-row table such as
///   `shard_identity` has nothing else) costs 1e10, far above
///   `jit_above_cost`, and would compile every such statement.
///
/// Set as the GUCs' own variables, not as `SET` clauses on the functions: a
/// function's `SET` is parsed and undone on every call, which measured 2–4%
/// of a queue's full cycle. The previous values come back when the guard
/// drops, also when the statement raises an error (pgrx turns the error into
/// an unwinding panic, which runs drops). The caller's session never sees
/// them.
struct PlannerSettings {
    plan_cache_mode: std::ffi::c_int,
    enable_seqscan: bool,
    enable_bitmapscan: bool,
    jit_enabled: bool,
}

impl PlannerSettings {
    fn apply(bitmaps: bool) -> PlannerSettings {
        // SAFETY: a backend is single-threaded; these are the GUCs' own
        // variables, which the planner reads and no assign hook mirrors.
        unsafe {
            let previous = PlannerSettings {
                plan_cache_mode: pg_sys::plan_cache_mode,
                enable_seqscan: pg_sys::enable_seqscan,
                enable_bitmapscan: pg_sys::enable_bitmapscan,
                jit_enabled: pg_sys::jit_enabled,
            };
            pg_sys::plan_cache_mode =
                pg_sys::PlanCacheMode::PLAN_CACHE_MODE_FORCE_GENERIC_PLAN as std::ffi::c_int;
            pg_sys::enable_seqscan = false;
            pg_sys::enable_bitmapscan = bitmaps;
            pg_sys::jit_enabled = false;
            previous
        }
    }
}

impl Drop for PlannerSettings {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe {
            pg_sys::plan_cache_mode = self.plan_cache_mode;
            pg_sys::enable_seqscan = self.enable_seqscan;
            pg_sys::enable_bitmapscan = self.enable_bitmapscan;
            pg_sys::jit_enabled = self.jit_enabled;
        }
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::{claim, complete, enqueue, init, one};
    use pgrx::prelude::*;
    use serde_json::json;

    /// On one-page tables a sequential scan is the cheapest plan for every
    /// statement; sheaf's still seek, and the caller's settings are untouched.
    #[pg_test]
    fn statements_seek_even_on_tiny_tables() {
        init();
        for n in 0..8 {
            enqueue("q", json!({"n": n}), json!({}));
        }
        row! {
            #[derive(Debug, PartialEq)]
            struct Settings {
                enable_seqscan: String,
                jit: String,
                plan_cache_mode: String,
            }
        }
        let settings = || -> Settings {
            one(
                "SELECT current_setting('enable_seqscan'), current_setting('jit'), \
                        current_setting('plan_cache_mode')",
                &[],
            )
        };
        let before = settings();
        for _ in 0..8 {
            let task = claim("q", 1).remove(0);
            Spi::run_with_args(
                "SELECT sheaf.heartbeat($1, $2)",
                &[task.id.into(), task.token.into()],
            )
            .expect("heartbeat");
            complete(&task);
        }
        let scans = Spi::get_one::<i64>(
            "SELECT sum(seq_scan)::bigint FROM pg_stat_xact_user_tables \
             WHERE schemaname = 'sheaf' AND relname IN ('tasks', 'ready')",
        )
        .expect("stats")
        .expect("the tables are counted");
        assert_eq!(scans, 0, "sequential scans of tasks and ready");
        assert_eq!(settings(), before);
        assert_eq!(before.enable_seqscan, "on", "the session's own enable_seqscan");
    }
}
