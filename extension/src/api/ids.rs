//! Ids: minting one on this shard, and decoding any id's shard and time.
//! The layout is `sheaf_core::id`.

use pgrx::prelude::*;
use sheaf_core::id;

use crate::base::args::required;
use crate::base::ids::mint;

/// A new id prefixed with this shard (RFC 9562 version 8, time-ordered).
#[pg_extern(volatile, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn new_id() -> pgrx::Uuid {
    mint()
}

/// The origin shard of an id; 65535 for ids that do not carry one.
#[pg_extern(immutable, parallel_safe)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn id_shard(id: Option<pgrx::Uuid>) -> i32 {
    let id = required(id, "id");
    id::shard_of(id.as_bytes()) as i32
}

/// When an id was minted; NULL for ids that do not carry a time.
#[pg_extern(immutable, parallel_safe)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn id_timestamp(id: Option<pgrx::Uuid>) -> Option<TimestampWithTimeZone> {
    let id = required(id, "id");
    let ms = id::unix_ms_of(id.as_bytes())? as i64;
    // Postgres counts microseconds from 2000-01-01; 44 bits of ms always fit.
    const PG_EPOCH_UNIX_MS: i64 = 946_684_800_000;
    TimestampWithTimeZone::try_from((ms - PG_EPOCH_UNIX_MS) * 1000).ok()
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::one;
    use pgrx::prelude::*;
    use serde::Deserialize;

    row! {
        /// What `id_shard` and `id_timestamp` (as Unix milliseconds) read
        /// from an id.
        struct Decoded {
            shard: Option<i32>,
            ms: Option<i64>,
        }
    }

    #[derive(Deserialize)]
    struct Vector {
        shard: i32,
        unix_ms: i64,
        id: String,
    }

    /// The SQL decoders agree with the vectors the driver is tested against.
    #[pg_test]
    fn decodes_the_shared_vectors() {
        let vectors: Vec<Vector> =
            serde_json::from_str(include_str!("../../../core/testdata/id_vectors.json"))
                .expect("vectors parse");
        for v in vectors {
            let q = format!(
                "SELECT sheaf.id_shard('{0}'), \
                 (extract(epoch FROM sheaf.id_timestamp('{0}')) * 1000)::bigint",
                v.id
            );
            let decoded: Decoded = one(&q, &[]);
            assert_eq!(decoded.shard, Some(v.shard), "{}", v.id);
            assert_eq!(decoded.ms, Some(v.unix_ms), "{}", v.id);
        }
    }

    #[pg_test]
    fn minted_ids_carry_this_shard_and_now() {
        Spi::run("SELECT sheaf.init_shard(513)").expect("init");
        row! {
            struct Minted {
                shard: i32,
                skew_secs: f64,
            }
        }
        let minted: Minted = one(
            "WITH i AS (SELECT sheaf.new_id() AS id) \
             SELECT sheaf.id_shard(id), \
                    abs(extract(epoch FROM clock_timestamp() - sheaf.id_timestamp(id)))::float8 \
             FROM i",
            &[],
        );
        assert_eq!(minted.shard, 513);
        assert!(minted.skew_secs < 5.0);
        let distinct =
            Spi::get_one::<i64>("SELECT count(DISTINCT sheaf.new_id()) FROM generate_series(1, 10000)")
                .expect("query runs");
        assert_eq!(distinct, Some(10000));
    }

    #[pg_test]
    fn foreign_uuids_have_no_shard_or_time() {
        let decoded: Decoded = one(
            "SELECT sheaf.id_shard(u), \
                    (extract(epoch FROM sheaf.id_timestamp(u)) * 1000)::bigint \
             FROM (SELECT '0001a2b3-c4d5-4e6f-8a0b-1c2d3e4f5a6b'::uuid AS u) s",
            &[],
        );
        assert_eq!(decoded.shard, Some(65535));
        assert_eq!(decoded.ms, None);
    }

    #[pg_test(error = "shard not initialized: run SELECT sheaf.init_shard(<shard id>) once in this database")]
    fn minting_needs_an_initialized_shard() {
        Spi::run("SELECT sheaf.new_id()").expect("refused");
    }

    #[pg_test(error = "id must not be null")]
    fn decoding_refuses_null() {
        Spi::run("SELECT sheaf.id_shard(NULL)").expect("refused");
    }
}
