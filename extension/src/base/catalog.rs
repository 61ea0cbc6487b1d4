//! Which release of sheaf's catalog this shard runs, in one place. Between
//! installing a newer library and `ALTER EXTENSION sheaf UPDATE` the
//! catalog is older than the library, and each feature it lacks stays off
//! (`has`) until the update: the library serves both.
//!
//! A backend reads the release once, by the newest release whose marker
//! relation exists, and keeps it until a change to `pg_class` names reaches
//! it (`ALTER EXTENSION … UPDATE`, `DROP`/`CREATE EXTENSION` anywhere in the
//! database: every backend processes the invalidation at its next
//! transaction start or lock), so a long-lived pooled connection follows an
//! update from its next transaction on.

use std::cell::Cell;
use std::ffi::CStr;

use pgrx::prelude::*;

/// A release of the catalog, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Release {
    V0_1_0,
    V0_2_0,
    V0_3_0,
}

/// A relation each release after the first added, newest release first:
/// the first one found names the catalog's release.
const MARKERS: &[(Release, &CStr)] = &[
    (Release::V0_3_0, c"topology_projections"),
    (Release::V0_2_0, c"ready_floors"),
];

/// What the library does only with a catalog that has its tables, columns
/// or functions.
#[derive(Debug, Clone, Copy)]
pub enum Feature {
    /// `ready_floors` and the claim time (`queue::floor`, `queue::claim`).
    ClaimFloors,
    /// `task_progress`.
    Progress,
    /// `retention`.
    Retention,
    /// `task_cancellations`.
    Cancellations,
    /// `rate_buckets`.
    RateLimits,
    /// `topology_digest`.
    TopologyDigest,
    /// `audit_log`.
    AuditLog,
    /// `migrations` (rebalancing, forwarding pointers).
    Moves,
    /// `executions.timeout_at`.
    Timeouts,
    /// `cross_shard_children`.
    CrossShardChildren,
    /// `debounces`.
    Debounce,
    /// `schedules`.
    Schedules,
    /// `mutex_waiters.expires_at`.
    WaiterLeases,
    /// `topology_projections` (placement, `base::topology`).
    TopologyProjections,
    /// `executions.placement` (how a caller placed a run: misplaced runs).
    PlacedRuns,
    /// No table: every library that runs on this catalog takes a generation
    /// under an advance's lock (0.2.0's did not), so a readier may skip
    /// step 2 where it knows the floor is below (`queue::floor::known_below`).
    FloorBounds,
}

impl Feature {
    /// The release that brought it.
    const fn since(self) -> Release {
        match self {
            Feature::ClaimFloors
            | Feature::Progress
            | Feature::Retention
            | Feature::Cancellations
            | Feature::RateLimits
            | Feature::TopologyDigest
            | Feature::AuditLog
            | Feature::Moves
            | Feature::Timeouts
            | Feature::CrossShardChildren
            | Feature::Debounce
            | Feature::Schedules
            | Feature::WaiterLeases => Release::V0_2_0,
            Feature::TopologyProjections | Feature::PlacedRuns | Feature::FloorBounds => Release::V0_3_0,
        }
    }
}

thread_local! {
    static KNOWN: Cell<Option<Release>> = const { Cell::new(None) };
    static REGISTERED: Cell<bool> = const { Cell::new(false) };
}

/// Whether this shard's catalog has `feature`.
pub fn has(feature: Feature) -> bool {
    release() >= feature.since()
}

/// The release of this shard's catalog.
pub fn release() -> Release {
    if let Some(known) = KNOWN.get() {
        return known;
    }
    if !REGISTERED.replace(true) {
        // SAFETY: a callback with no captured state, registered once per
        // backend (Postgres keeps a small fixed list of them).
        unsafe {
            pg_sys::CacheRegisterSyscacheCallback(
                pg_sys::SysCacheIdentifier::RELNAMENSP as _,
                Some(invalidated),
                pg_sys::Datum::from(0),
            )
        };
    }
    let release = MARKERS
        .iter()
        // SAFETY: catalog lookups by name, in a transaction (the search
        // path starts with sheaf's schema).
        .find(|(_, marker)| unsafe { pg_sys::RelnameGetRelid(marker.as_ptr()) } != pg_sys::InvalidOid)
        .map_or(Release::V0_1_0, |(release, _)| *release);
    KNOWN.set(Some(release));
    release
}

unsafe extern "C-unwind" fn invalidated(_: pg_sys::Datum, _: std::ffi::c_int, _: u32) {
    // Runs inside invalidation processing: no catalog access, no errors,
    // only a Cell.
    KNOWN.set(None);
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::{Release, release};
    use pgrx::prelude::*;

    /// A fresh install is the newest release; without its marker the
    /// catalog reads as the one before, from the next lookup on (the
    /// rename's invalidation reaches this backend at once).
    #[pg_test]
    fn the_release_follows_the_catalog() {
        // As in every sheaf function.
        Spi::run("SET LOCAL search_path = sheaf").expect("search path");
        assert_eq!(release(), Release::V0_3_0);
        Spi::run("ALTER TABLE sheaf.topology_projections RENAME TO topology_projections_gone")
            .expect("rename");
        assert_eq!(release(), Release::V0_2_0);
        Spi::run("ALTER TABLE sheaf.ready_floors RENAME TO ready_floors_gone").expect("rename");
        assert_eq!(release(), Release::V0_1_0);
        Spi::run("ALTER TABLE sheaf.ready_floors_gone RENAME TO ready_floors").expect("rename back");
        Spi::run("ALTER TABLE sheaf.topology_projections_gone RENAME TO topology_projections")
            .expect("rename back");
        assert_eq!(release(), Release::V0_3_0);
    }
}
