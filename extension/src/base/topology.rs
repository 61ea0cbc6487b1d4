//! The fleet's topology digest on this shard (`topology_digest` in
//! sql/schema.sql): published by an operator, compared with the digest a
//! client declares for its session (`sheaf.topology_digest`) by every
//! function that accepts placed work. A client that declares nothing (a
//! plain SQL caller) is not checked.

use pgrx::prelude::*;

use crate::base::catalog::{self, Feature};
use crate::base::errors::topology_mismatch;
use crate::base::plans::Stmt;
use crate::base::rows::row;

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

fn enabled() -> bool {
    catalog::has(Feature::TopologyDigest)
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
    use crate::testing::init;
    use pgrx::prelude::*;

    fn d(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn publish(digest: &str, keep: bool) -> (Option<String>, Option<String>) {
        Spi::get_two_with_args::<String, String>(
            "SELECT * FROM sheaf.publish_topology($1, $2)",
            &[digest.into(), keep.into()],
        )
        .unwrap()
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

    #[pg_test]
    fn a_published_digest_and_its_previous_are_accepted() {
        init();
        declare(&d('a'));
        assert!(enqueue(), "nothing published: nothing checked");
        assert_eq!(publish(&d('a'), true), (Some(d('a')), None));
        assert!(enqueue());
        assert_eq!(publish(&d('b'), true), (Some(d('b')), Some(d('a'))));
        assert!(enqueue(), "the previous digest, during a rollout");
        assert_eq!(
            publish(&d('b'), true),
            (Some(d('b')), Some(d('a'))),
            "a repeat keeps it"
        );
        declare("");
        assert!(enqueue(), "a caller that declares nothing is not checked");
    }

    #[pg_test]
    #[should_panic(expected = "placed work refused")]
    fn another_digest_is_refused() {
        init();
        publish(&d('b'), true);
        publish(&d('c'), false);
        declare(&d('b'));
        enqueue();
    }

    #[pg_test]
    #[should_panic(expected = "must be sha256: and 64 lowercase hex digits")]
    fn a_malformed_digest_is_refused() {
        init();
        publish("sha256:ABC", true);
    }
}
