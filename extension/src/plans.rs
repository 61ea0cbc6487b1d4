//! sheaf's statements, each prepared once per backend and kept, so the hot
//! functions skip parse and plan on every call.

use std::cell::RefCell;
use std::collections::HashMap;

use pgrx::PgOid;
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiTupleTable};

use crate::errors::SpiResultExt;

/// One statement: its SQL (also its cache key), argument types, and whether
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
    static PLANS: RefCell<HashMap<&'static str, OwnedPreparedStatement>> = RefCell::new(HashMap::new());
}

/// Runs `stmt` with `args` through its kept plan, preparing it on first use.
pub fn run<'conn>(
    client: &mut SpiClient<'conn>,
    stmt: &Stmt,
    args: &[DatumWithOid<'_>],
) -> SpiTupleTable<'conn> {
    PLANS.with(|plans| {
        let mut plans = plans.borrow_mut();
        if !plans.contains_key(stmt.sql) {
            let types: Vec<PgOid> = stmt.args.iter().map(|t| PgOid::BuiltIn(*t)).collect();
            let prepared = if stmt.writes {
                client.prepare_mut(stmt.sql, &types)
            } else {
                client.prepare(stmt.sql, &types)
            };
            plans.insert(stmt.sql, prepared.or_internal("preparing a statement").keep());
        }
        let plan = plans.get(stmt.sql).expect("inserted above");
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
