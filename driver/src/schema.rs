//! The shard schema versions this driver works with, [`COMPATIBLE_SCHEMAS`].

/// Every `sheaf` schema version (`pg_extension.extversion`) this driver
/// works with, oldest first. A release that adds a version appends it; one
/// that stops calling what an old version lacks drops that version.
///
/// Between a package upgrade and `ALTER EXTENSION sheaf UPDATE`, and while
/// an upgrade rolls across a fleet, shards run different schema versions. The
/// driver calls only functions that every version listed here has, so it
/// works with each of them; a shard on any other version (or without the
/// extension) is refused by name before a call is sent, never answered with
/// a 42883 (undefined function) halfway through.
pub const COMPATIBLE_SCHEMAS: &[&str] = &["0.1.0", "0.2.0", "0.3.0"];

/// Whether the driver works with a shard whose schema is `version`.
pub(crate) fn is_compatible(version: &str) -> bool {
    COMPATIBLE_SCHEMAS.contains(&version)
}

/// The first schema whose starts and enqueues take `opts.placement` (older
/// ones refuse it as an unknown option, and check no placement).
const PLACEMENT_SINCE: &str = "0.3.0";

/// Whether a shard on schema `version` takes `opts.placement`.
pub(crate) fn takes_placement(version: &str) -> bool {
    let at = |v: &str| COMPATIBLE_SCHEMAS.iter().position(|c| *c == v);
    matches!((at(version), at(PLACEMENT_SINCE)), (Some(v), Some(since)) if v >= since)
}

/// The refusal for a shard on `version` (`None`: no extension installed).
pub(crate) fn incompatibility(version: Option<&str>) -> String {
    match version {
        None => "the sheaf extension is not installed".to_owned(),
        Some(v) => format!(
            "it runs sheaf schema {v}, which this driver does not work with (it works with {}): \
             upgrade the driver, or run ALTER EXTENSION sheaf UPDATE on that shard",
            COMPATIBLE_SCHEMAS.join(", ")
        ),
    }
}

/// How a shard's schema version is read.
pub(crate) const SCHEMA_VERSION: &str =
    "SELECT (SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'sheaf')";

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema this driver is built beside is always one it works with.
    #[test]
    fn the_driver_works_with_its_own_release() {
        assert!(is_compatible(env!("CARGO_PKG_VERSION")));
    }

    #[test]
    fn placement_is_sent_to_the_schemas_that_take_it() {
        assert!(!takes_placement("0.1.0") && !takes_placement("0.2.0"));
        assert!(takes_placement("0.3.0"));
        assert!(!takes_placement("9.9.9"));
    }

    #[test]
    fn refusals_say_what_to_do() {
        assert!(incompatibility(Some("9.9.9")).contains("ALTER EXTENSION sheaf UPDATE"));
        assert!(incompatibility(None).contains("not installed"));
        assert!(!is_compatible("9.9.9"));
    }
}
