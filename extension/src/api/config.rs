//! The fleet configuration this shard holds.

use pgrx::prelude::*;

use crate::base::jsonb::Jsonb;
use crate::workflow::config;

/// This shard's declared configuration, as one JSON object: `workflows`
/// (name → policy, as stored), `queues` (name → options, those that differ
/// from the defaults), `caps` (key → max running). Equal on every shard of
/// a fleet that does not drift.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn fleet_config() -> Jsonb {
    config::snapshot()
}
