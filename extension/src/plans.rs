//! sheaf's statements, each prepared once per backend and kept, so the hot
//! functions skip parse and plan on every call.

use std::cell::RefCell;
use std::collections::HashMap;

use pgrx::PgOid;
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiTupleTable};

use crate::errors::SpiResultExt;

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

/// Runs `stmt` with `args` through its kept plan, preparing it on first use.
pub fn run<'conn>(
    client: &mut SpiClient<'conn>,
    stmt: &Stmt,
    args: &[DatumWithOid<'_>],
) -> SpiTupleTable<'conn> {
    PLANS.with(|plans| {
        let mut plans = plans.borrow_mut();
        let key = stmt.sql.as_ptr() as usize;
        plans.entry(key).or_insert_with(|| {
            let types: Vec<PgOid> = stmt.args.iter().map(|t| PgOid::BuiltIn(*t)).collect();
            let prepared = if stmt.writes {
                client.prepare_mut(stmt.sql, &types)
            } else {
                client.prepare(stmt.sql, &types)
            };
            prepared.or_internal("preparing a statement").keep()
        });
        let plan = plans.get(&key).expect("inserted above");
        let _generic = GenericPlans::force();
        let result = if stmt.writes {
            client.update(plan, None, args)
        } else {
            client.select(plan, None, args)
        };
        result.or_internal("running a statement")
    })
}

/// Runs a statement inside its own SPI connection.
pub fn exec(stmt: &Stmt, args: &[DatumWithOid<'_>]) {
    Spi::connect_mut(|client| {
        run(client, stmt, args);
    })
}

/// Forces the generic plan while one of sheaf's statements runs. Left to
/// itself the plan cache keeps choosing custom plans for statements with a
/// `LIMIT $n`, and re-plans them on every call: planning cost more than the
/// claim itself. Every sheaf statement is written for its generic plan (a
/// seek on the index its predicate names). The previous mode comes back when
/// the guard drops, also when the statement raises an error (pgrx turns the
/// error into an unwinding panic, which runs drops).
struct GenericPlans(std::ffi::c_int);

impl GenericPlans {
    fn force() -> GenericPlans {
        // SAFETY: a backend is single-threaded; this is the GUC's own variable.
        unsafe {
            let previous = pg_sys::plan_cache_mode;
            pg_sys::plan_cache_mode =
                pg_sys::PlanCacheMode::PLAN_CACHE_MODE_FORCE_GENERIC_PLAN as std::ffi::c_int;
            GenericPlans(previous)
        }
    }
}

impl Drop for GenericPlans {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe {
            pg_sys::plan_cache_mode = self.0;
        }
    }
}
