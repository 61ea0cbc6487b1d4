//! Shard identity: which shard this database is, set once.

use crate::errors::{SpiResultExt, bad_argument, not_ready, required};
use crate::plans::{Stmt, run};
use pgrx::prelude::*;
use sheaf_core::id::MAX_SHARD_ID;
use std::cell::Cell;

/// Makes this database shard `shard_id`. Idempotent for the same id; a
/// different id on an initialized shard is refused (ids route by shard, so
/// renumbering would orphan every id already minted here).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn init_shard(shard_id: Option<i32>) -> i32 {
    let shard_id = required(shard_id, "shard_id");
    if !(0..=MAX_SHARD_ID as i32).contains(&shard_id) {
        bad_argument(
            "shard_id",
            format!("must be between 0 and {MAX_SHARD_ID}, got {shard_id}"),
        );
    }
    // A concurrent init with another id blocks on the primary key, then
    // reads the winner's row and is refused below.
    Spi::run_with_args(
        "INSERT INTO shard_identity (shard_id) VALUES ($1) ON CONFLICT (singleton) DO NOTHING",
        &[shard_id.into()],
    )
    .or_internal("recording the shard id");
    let current = stored_shard_id().unwrap_or(shard_id);
    if current != shard_id {
        not_ready(format!(
            "this database is already shard {current}; init_shard({shard_id}) refused \
             (a shard id cannot change once ids have been minted with it)"
        ));
    }
    current
}

/// This database's shard id. Raises 55000 if `init_shard` has not run.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn shard_id() -> i32 {
    current()
}

/// The version of the sheaf library serving this database.
#[pg_extern(immutable, parallel_safe)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// The shard id, for use by other modules; refuses an uninitialized shard.
pub fn current() -> i32 {
    // SAFETY: a catalog lookup through the active search path, whose first
    // schema is sheaf's (every sheaf function sets it).
    let table = unsafe { pg_sys::RelnameGetRelid(c"shard_identity".as_ptr()) };
    if let Some((cached_table, id)) = CACHED.get()
        && cached_table == table
    {
        return id;
    }
    match stored() {
        Some((id, xmin)) => {
            // A row this transaction wrote may yet roll back: not cached.
            // SAFETY: a plain lookup in this backend's transaction state.
            if !unsafe { pg_sys::TransactionIdIsCurrentTransactionId(xmin) } {
                CACHED.set(Some((table, id)));
            }
            id
        }
        None => {
            not_ready("shard not initialized: run SELECT sheaf.init_shard(<shard id>) once in this database")
        }
    }
}

thread_local! {
    // The shard id and the table it was read from. The row is written once
    // and never changes (init_shard refuses another id), so a backend reads
    // it once: every enqueue and start needs it. A dropped and re-created
    // extension has a new table, with a new oid, and is read afresh.
    static CACHED: Cell<Option<(pg_sys::Oid, i32)>> = const { Cell::new(None) };
}

const STORED: Stmt = Stmt::read("SELECT shard_id, xmin FROM shard_identity", &[]);

fn stored() -> Option<(i32, pg_sys::TransactionId)> {
    Spi::connect_mut(|client| {
        let row = run(client, &STORED, &[]).next()?;
        Some((
            row.get::<i32>(1).or_internal("reading the shard id")?,
            row.get::<pg_sys::TransactionId>(2)
                .or_internal("reading the shard id")?,
        ))
    })
}

fn stored_shard_id() -> Option<i32> {
    stored().map(|(id, _)| id)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn get(q: &str) -> Option<i32> {
        Spi::get_one::<i32>(q).expect("query runs")
    }

    #[pg_test]
    fn init_is_idempotent_for_the_same_id() {
        assert_eq!(get("SELECT sheaf.init_shard(7)"), Some(7));
        assert_eq!(get("SELECT sheaf.init_shard(7)"), Some(7));
        assert_eq!(get("SELECT sheaf.shard_id()"), Some(7));
        assert_eq!(get("SELECT count(*)::int FROM sheaf.shard_identity"), Some(1));
    }

    #[pg_test]
    fn init_accepts_the_bounds() {
        assert_eq!(get("SELECT sheaf.init_shard(65534)"), Some(65534));
    }

    #[pg_test(
        error = "this database is already shard 3; init_shard(4) refused (a shard id cannot change once ids have been minted with it)"
    )]
    fn init_refuses_a_second_id() {
        get("SELECT sheaf.init_shard(3)");
        get("SELECT sheaf.init_shard(4)");
    }

    #[pg_test(error = "invalid shard_id: must be between 0 and 65534, got 65535")]
    fn init_refuses_the_unencoded_marker() {
        get("SELECT sheaf.init_shard(65535)");
    }

    #[pg_test(error = "invalid shard_id: must be between 0 and 65534, got -1")]
    fn init_refuses_negative_ids() {
        get("SELECT sheaf.init_shard(-1)");
    }

    #[pg_test(error = "shard_id must not be null")]
    fn init_refuses_null() {
        get("SELECT sheaf.init_shard(NULL)");
    }

    #[pg_test(error = "shard not initialized: run SELECT sheaf.init_shard(<shard id>) once in this database")]
    fn shard_id_refuses_an_uninitialized_shard() {
        get("SELECT sheaf.shard_id()");
    }

    #[pg_test]
    fn version_is_the_crate_version() {
        let v = Spi::get_one::<String>("SELECT sheaf.version()").expect("query runs");
        assert_eq!(v.as_deref(), Some(env!("CARGO_PKG_VERSION")));
    }
}
