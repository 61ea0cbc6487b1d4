//! Shard identity: making this database a shard, and reading which one.

use pgrx::prelude::*;
use sheaf_core::id::MAX_SHARD_ID;

use crate::base::args::required;
use crate::base::errors::bad_argument;
use crate::base::shard;

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
    shard::init(shard_id)
}

/// This database's shard id. Raises 55000 if `init_shard` has not run.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn shard_id() -> i32 {
    shard::current()
}

/// The version of the sheaf library serving this database.
#[pg_extern(immutable, parallel_safe)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
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
