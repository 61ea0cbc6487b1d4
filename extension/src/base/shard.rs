//! Shard identity: which shard this database is, set once.

use std::cell::Cell;

use pgrx::prelude::*;

use crate::base::errors::not_ready;
use crate::base::plans::Stmt;
use crate::base::rows::row;

const INIT: Stmt = Stmt::write(
    "INSERT INTO shard_identity (shard_id) VALUES ($1) ON CONFLICT (singleton) DO NOTHING",
    &[PgBuiltInOids::INT4OID],
);

/// Makes this database shard `shard_id` (validated by the caller).
/// Idempotent for the same id; a different id on an initialized shard is
/// refused (ids route by shard, so renumbering would orphan every id already
/// minted here).
pub fn init(shard_id: i32) -> i32 {
    // A concurrent init with another id blocks on the primary key, then
    // reads the winner's row and is refused below.
    INIT.exec(&[shard_id.into()]);
    let current = stored().map_or(shard_id, |s| s.shard_id);
    if current != shard_id {
        not_ready(format!(
            "this database is already shard {current}; init_shard({shard_id}) refused \
             (a shard id cannot change once ids have been minted with it)"
        ));
    }
    current
}

/// This database's shard id; refuses (55000) an uninitialized shard.
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
        Some(Stored { shard_id: id, xmin }) => {
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

row! {
    /// The stored shard id, and the transaction that wrote it.
    struct Stored {
        shard_id: i32,
        xmin: pg_sys::TransactionId,
    }
}

fn stored() -> Option<Stored> {
    STORED.first(&[], "reading the shard id")
}
