//! Subtransactions: a step that may fail (a scheduled start refused by a
//! quota, say) without aborting the transaction that runs it (`maintain`,
//! firing every due schedule).

use pgrx::pg_sys;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;

use crate::base::errors::sqlstate_text;

/// Why a step failed: its SQLSTATE and message.
#[derive(Debug, Clone)]
pub struct Failed {
    pub sqlstate: String,
    pub message: String,
}

/// Runs `f` in a subtransaction: its writes stay if it returns, and are
/// rolled back if it raises an error (`Err`, the caller's transaction goes
/// on). A panic, which is a bug in sheaf, is rolled back and raised again.
pub fn attempt<R>(f: impl FnOnce() -> R) -> Result<R, Failed> {
    // SAFETY: the PL pattern (plpython's subtransactions): begin, run, then
    // release or roll back, and restore the caller's memory context and
    // resource owner either way. In a transaction, on the backend's thread.
    let (context, owner) = unsafe { (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner) };
    unsafe {
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(context);
    }
    let outcome = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| Ok(f())))
        .catch_others(|e| Err(Box::new(e)))
        .execute();
    let restore = || unsafe {
        pg_sys::MemoryContextSwitchTo(context);
        pg_sys::CurrentResourceOwner = owner;
    };
    match outcome {
        Ok(r) => {
            // SAFETY: the subtransaction begun above, still current.
            unsafe { pg_sys::ReleaseCurrentSubTransaction() };
            restore();
            Ok(r)
        }
        Err(e) => {
            // SAFETY: as above; the error state was flushed by the catch.
            unsafe { pg_sys::RollbackAndReleaseCurrentSubTransaction() };
            restore();
            match *e {
                CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) => Err(Failed {
                    sqlstate: sqlstate_text(r.sql_error_code()),
                    message: sheaf_core::children::cut(r.message(), 500).to_owned(),
                }),
                panic @ CaughtError::RustPanic { .. } => panic.rethrow(),
            }
        }
    }
}
