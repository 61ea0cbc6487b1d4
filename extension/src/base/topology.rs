//! The fleet's topology digest on this shard (`topology_digest` in
//! sql/schema.sql): published by an operator, compared with the digest a
//! client declares for its session (`sheaf.topology_digest`) by every
//! function that accepts placed work. A client that declares nothing (a
//! plain SQL caller) is not checked.
//!
//! Since 0.3.0 a publish carries the topology's projection (ids, roles,
//! residency, forwards; never URLs), kept by digest in
//! `topology_projections`: the digest is computed here from it, and
//! placement (`sheaf_core::placement`) answers from it.

use pgrx::prelude::*;

use crate::base::catalog::{self, Feature};
use sheaf_core::placement::{self, Admission, PlaceError, Projection};

use crate::base::errors::{internal, topology_mismatch};
use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;
use crate::base::rows::row;
use crate::base::shard;

/// The session setting a client declares its digest in.
const SETTING: &std::ffi::CStr = c"sheaf.topology_digest";

const READ: Stmt = Stmt::read("SELECT digest, previous, published_at FROM topology_digest", &[]);
const PUBLISH: Stmt = Stmt::write(
    "INSERT INTO topology_digest AS t (one, digest, previous) VALUES (true, $1, NULL) \
     ON CONFLICT (one) DO UPDATE SET \
        previous = CASE WHEN NOT $2 THEN NULL WHEN t.digest = $1 THEN t.previous ELSE t.digest END, \
        digest = $1, published_at = now() \
     RETURNING digest, previous",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::BOOLOID],
);

row! {
    /// What this shard has published.
    pub struct Published {
        pub digest: String,
        pub previous: Option<String>,
        pub at: pgrx::datum::TimestampWithTimeZone,
    }
}

row! {
    /// The digest a publish left, and the previous one still accepted.
    pub struct Accepted {
        pub digest: String,
        pub previous: Option<String>,
    }
}

const KEEP_PROJECTION: Stmt = Stmt::write(
    "INSERT INTO topology_projections (digest, projection) VALUES ($1, $2) \
     ON CONFLICT (digest) DO UPDATE SET published_at = now()",
    &[PgBuiltInOids::TEXTOID, PgBuiltInOids::JSONBOID],
);
// Only the digests still accepted keep their projection.
const FORGET_PROJECTIONS: Stmt = Stmt::write(
    "DELETE FROM topology_projections p USING topology_digest t \
     WHERE p.digest <> t.digest AND p.digest IS DISTINCT FROM t.previous",
    &[],
);
const READ_PROJECTIONS: Stmt = Stmt::read(
    "SELECT c.projection AS current, p.projection AS previous FROM topology_digest t \
     LEFT JOIN topology_projections c ON c.digest = t.digest \
     LEFT JOIN topology_projections p ON p.digest = t.previous",
    &[],
);

const LIST_PROJECTIONS: Stmt = Stmt::read(
    "SELECT p.digest, CASE WHEN p.digest = t.digest THEN 'current' ELSE 'previous' END AS accepted_as, \
            p.projection, p.published_at \
     FROM topology_projections p JOIN topology_digest t ON p.digest IN (t.digest, t.previous) \
     ORDER BY p.digest <> t.digest",
    &[],
);

row! {
    /// A projection this shard accepts, as `topology_projections` lists it.
    pub struct Listed {
        pub digest: String,
        pub accepted_as: String,
        pub projection: pgrx::JsonB,
        pub published_at: pgrx::datum::TimestampWithTimeZone,
    }
}

/// The projections this shard accepts: the published one, then the
/// previous one while it is kept.
pub fn projections() -> Vec<Listed> {
    if !projections_enabled() {
        return Vec::new();
    }
    LIST_PROJECTIONS.all(&[], "listing the topology projections")
}

row! {
    /// The published digest's projection and the previous one's (none:
    /// published before 0.3.0, or no previous kept).
    struct Stored {
        current: Option<pgrx::JsonB>,
        previous: Option<pgrx::JsonB>,
    }
}

/// The topology this shard places by: the published projection, and the
/// one it replaced while that is still accepted (a rolling change).
pub struct Fleet {
    pub current: Projection,
    pub previous: Option<Projection>,
}

fn enabled() -> bool {
    catalog::has(Feature::TopologyDigest)
}

fn projections_enabled() -> bool {
    catalog::has(Feature::TopologyProjections)
}

/// The projections this shard places by; `None` when none was published
/// (nothing published, or only a digest, before 0.3.0: publish again).
pub fn fleet() -> Option<Fleet> {
    if !projections_enabled() {
        return None;
    }
    let stored: Stored = READ_PROJECTIONS.first(&[], "reading the topology projections")?;
    let parse = |p: Option<pgrx::JsonB>| {
        p.map(|j| {
            Projection::from_json(&j.0)
                .unwrap_or_else(|e| internal(format!("reading a stored topology projection: {e}")))
        })
    };
    let current = parse(stored.current)?;
    Some(Fleet {
        current,
        previous: parse(stored.previous),
    })
}

/// Whether this shard takes work that `place` places (see
/// [`sheaf_core::placement::admit`]); with no projection published,
/// everything (a lone database checks nothing).
pub fn admit(place: impl Fn(&Projection) -> Result<Option<u16>, PlaceError>) -> Admission {
    let Some(fleet) = fleet() else {
        return Admission::Here;
    };
    // Publish refuses a projection that does not list this shard.
    let here = u16::try_from(shard::current())
        .unwrap_or_else(|_| internal("a topology is published on a shard whose id is not a shard id"));
    placement::admit(here, &fleet.current, fleet.previous.as_ref(), place)
}

/// Publishes the topology whose projection is `projection` (validated):
/// its digest is computed from it, and the projection kept beside it.
pub fn publish_projection(projection: &Projection, keep_previous: bool) -> Accepted {
    let digest = projection.digest();
    let json: serde_json::Value = serde_json::from_str(&projection.canonical())
        .unwrap_or_else(|e| internal(format!("reading a canonical projection back: {e}")));
    KEEP_PROJECTION.exec(&[digest.as_str().into(), Jsonb::from_value(json).into()]);
    let accepted = publish(&digest, keep_previous);
    FORGET_PROJECTIONS.exec(&[]);
    accepted
}

/// The digest this session's client declared, if any.
fn declared() -> Option<String> {
    // SAFETY: reads a setting by name; missing_ok, so an undefined
    // placeholder is NULL rather than an error.
    let value = unsafe { pg_sys::GetConfigOption(SETTING.as_ptr(), true, false) };
    if value.is_null() {
        return None;
    }
    // SAFETY: GetConfigOption returns a NUL-terminated string it owns.
    let text = unsafe { std::ffi::CStr::from_ptr(value) }
        .to_string_lossy()
        .trim()
        .to_owned();
    (!text.is_empty()).then_some(text)
}

/// This shard's published digest, if one was published.
pub fn published() -> Option<Published> {
    if !enabled() {
        return None;
    }
    READ.first(&[], "reading the topology digest")
}

/// Refuses (55000, with the digests as JSON in the DETAIL) placed work from
/// a client whose declared digest this shard does not accept.
pub fn check_declared() {
    let Some(client) = declared() else {
        return;
    };
    let Some(Published { digest, previous, .. }) = published() else {
        return;
    };
    if client == digest || previous.as_deref() == Some(client.as_str()) {
        return;
    }
    let accepted: Vec<String> = std::iter::once(digest).chain(previous).collect();
    topology_mismatch(&client, &accepted);
}

/// Publishes `digest`, keeping the one it replaces as `previous` (for a
/// rolling change) unless `keep_previous` is false. The digest and the
/// previous one now accepted.
pub fn publish(digest: &str, keep_previous: bool) -> Accepted {
    PUBLISH.one(
        &[digest.into(), keep_previous.into()],
        "publishing the topology digest",
    )
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::{init, one};
    use pgrx::prelude::*;
    use serde_json::{Value, json};
    use sheaf_core::placement::Projection;

    /// A fleet of this shard (1) and `others`.
    fn fleet(others: &[u16]) -> Value {
        let mut shards = vec![1];
        shards.extend_from_slice(others);
        json!({ "shards": shards })
    }

    fn digest(projection: &Value) -> String {
        Projection::from_json(projection).unwrap().digest()
    }

    row! {
        struct Published {
            digest: Option<String>,
            previous: Option<String>,
        }
    }

    /// The digest published and the one kept as previous.
    fn publish(projection: &Value, keep: bool) -> (Option<String>, Option<String>) {
        let p: Published = one(
            "SELECT digest, previous FROM sheaf.publish_topology($1, $2)",
            &[pgrx::JsonB(projection.clone()).into(), keep.into()],
        );
        (p.digest, p.previous)
    }

    fn declare(digest: &str) {
        Spi::run_with_args(
            "SELECT set_config('sheaf.topology_digest', $1, true)",
            &[digest.into()],
        )
        .unwrap();
    }

    fn enqueue() -> bool {
        Spi::get_one::<pgrx::Uuid>("SELECT sheaf.enqueue('topo', '{}')")
            .map(|id| id.is_some())
            .unwrap_or(false)
    }

    fn kept() -> i64 {
        Spi::get_one::<i64>("SELECT count(*) FROM sheaf.topology_projections")
            .unwrap()
            .unwrap()
    }

    #[pg_test]
    fn a_published_digest_and_its_previous_are_accepted() {
        init();
        let (a, b) = (fleet(&[]), fleet(&[2]));
        declare(&digest(&a));
        assert!(enqueue(), "nothing published: nothing checked");
        assert_eq!(publish(&a, true), (Some(digest(&a)), None));
        assert!(enqueue());
        assert_eq!(publish(&b, true), (Some(digest(&b)), Some(digest(&a))));
        assert!(enqueue(), "the previous digest, during a rollout");
        assert_eq!(
            publish(&b, true),
            (Some(digest(&b)), Some(digest(&a))),
            "a repeat keeps it"
        );
        assert_eq!(kept(), 2, "the current and the previous projection");
        declare("");
        assert!(enqueue(), "a caller that declares nothing is not checked");
        assert_eq!(publish(&fleet(&[3]), true).1, Some(digest(&b)));
        assert_eq!(kept(), 2, "older projections are forgotten");
        publish(&fleet(&[3]), false);
        assert_eq!(kept(), 1);
    }

    #[pg_test]
    fn the_digest_is_the_projections_whatever_its_spelling() {
        init();
        // Unsorted, defaults left out: the canonical form is hashed.
        let short = json!({"shards": [2, 1]});
        let long = json!({"shards": [1, 2], "readable": [1, 2], "writable": [2, 1], "reserved": [],
                          "default": 1, "residency": {}, "forwards": {}});
        let (d, _) = publish(&short, true);
        assert_eq!(d, publish(&long, true).0);
        assert_eq!(
            d.unwrap(),
            sheaf_core::digest::of(br#"{"shards":[1,2],"readable":[1,2],"writable":[1,2],"reserved":[],"default":1,"residency":{},"forwards":{}}"#)
        );
    }

    #[pg_test]
    #[should_panic(expected = "placed work refused")]
    fn another_digest_is_refused() {
        init();
        publish(&fleet(&[2]), true);
        publish(&fleet(&[3]), false);
        declare(&digest(&fleet(&[2])));
        enqueue();
    }

    #[pg_test]
    #[should_panic(expected = "invalid projection: writable shard 2 is not readable")]
    fn a_bad_projection_is_refused() {
        init();
        publish(
            &json!({"shards": [1, 2], "readable": [1], "writable": [1, 2]}),
            true,
        );
    }

    #[pg_test]
    #[should_panic(expected = "invalid projection: unknown field \"urls\"")]
    fn a_projection_never_carries_urls() {
        init();
        publish(
            &json!({"shards": [1], "urls": {"1": "postgres://u:secret@h/d"}}),
            true,
        );
    }

    #[pg_test]
    #[should_panic(expected = "does not list this shard (1)")]
    fn a_projection_without_this_shard_is_refused() {
        init();
        publish(&json!({"shards": [0, 2]}), true);
    }
}
