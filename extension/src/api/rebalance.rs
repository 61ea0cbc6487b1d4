//! Rebalancing quiescent executions between shards (`workflow::migration`):
//! the steps the driver's `Client::rebalance` runs, one transaction each,
//! callable from SQL as they are.

use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;

use crate::base::args::{page_rows, required};
use crate::base::errors::bad_argument;
use crate::base::jsonb::Jsonb;
use crate::workflow::{migration, relay};

/// The most rows one page of candidates or moves holds.
const MAX_PAGE: i32 = 10_000;
/// The shortest grace a stalled cutover gets before a worker settles it.
const MIN_GRACE_SECS: f64 = 5.0;

fn shard_arg(value: Option<i32>, arg: &str) -> i32 {
    let shard = required(value, arg);
    if !(0..=i32::from(sheaf_core::id::MAX_SHARD_ID)).contains(&shard) {
        bad_argument(
            arg,
            format!(
                "must be a shard id from 0 to {}, got {shard}",
                sheaf_core::id::MAX_SHARD_ID
            ),
        );
    }
    shard
}

fn migration_arg(value: Option<i64>) -> i64 {
    let id = required(value, "migration_id");
    if id < 1 {
        bad_argument("migration_id", format!("must be positive, got {id}"));
    }
    id
}

/// A page of this shard's unfinished executions after `after_id` (NULL:
/// from the first), in id order, at most `max_rows` (1..10000), each with
/// every reason it cannot move now (`blockers`; empty: it may move):
/// `not_running` (paused), `migration_in_progress`, `task_claimed`, `mutex`
/// (holds one or waits in a line), `children_unsettled`, `parent_here` (its
/// parent, on this shard, still runs), `outbox_unsettled`, `dead_letters`,
/// `rate_limited`, `debounce_open` (starts in its window join it here).
/// What a dry run reports; nothing is locked or written.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn rebalance_candidates(
    after_id: default!(Option<pgrx::Uuid>, "NULL"),
    max_rows: default!(Option<i32>, 100),
) -> TableIterator<
    'static,
    (
        name!(execution_id, pgrx::Uuid),
        name!(workflow_name, String),
        name!(workflow_id, String),
        name!(state, String),
        name!(history_bytes, i64),
        name!(blockers, Vec<String>),
    ),
> {
    let max_rows = page_rows(max_rows, MAX_PAGE);
    TableIterator::new(migration::candidates(after_id, max_rows).into_iter().map(|c| {
        (
            c.id,
            c.workflow_name,
            c.workflow_id,
            c.state,
            c.history_bytes,
            c.blockers,
        )
    }))
}

/// Starts moving a quiescent execution to shard `target_shard`: a STARTED
/// move recorded here (the actor is `sheaf.actor`, else the login role;
/// the login beside it), held by the caller for `lease` (5 seconds to 1
/// hour; each later step renews it), and the export to stage there
/// (`migration_stage`), carrying the lease token. 55000 naming every
/// blocker if it cannot move now.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn migration_begin(
    execution_id: Option<pgrx::Uuid>,
    target_shard: Option<i32>,
    lease: default!(Option<Interval>, "'60 seconds'"),
) -> Jsonb {
    let id = required(execution_id, "execution_id");
    let target = shard_arg(target_shard, "target_shard");
    migration::begin(id, target, lease_arg(lease))
}

/// A mover's lease, 5 seconds to 1 hour.
fn lease_arg(lease: Option<Interval>) -> f64 {
    let secs = required(lease, "lease").as_micros() as f64 / 1e6;
    if !(5.0..=3600.0).contains(&secs) {
        bad_argument(
            "lease",
            format!("must be from 5 seconds to 1 hour, got {secs} seconds"),
        );
    }
    secs
}

/// Stages an export from `migration_begin` on this shard (the target): the
/// execution as MIGRATING, its tasks parked under ids of this shard,
/// nothing claimable or counted until `migration_activate`. Refuses (55000)
/// an export with a column this shard lacks. Returns the digest of what it
/// stored, for `migration_verify` on the source.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn migration_stage(export: Option<Jsonb>) -> String {
    let export = required(export, "export").parse("export");
    migration::check_export(&export);
    migration::stage(&export)
}

/// Compares the staged copy's digest with this shard's (the source):
/// VERIFIED with this shard's high-water mark if equal; `false` if not
/// (noted in the move's `last_error`).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn migration_verify(
    migration_id: Option<i64>,
    lease_token: Option<i64>,
    staged_digest: Option<&str>,
) -> bool {
    let id = migration_arg(migration_id);
    let token = required(lease_token, "lease_token");
    let digest = required(staged_digest, "staged_digest");
    if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
        bad_argument(
            "staged_digest",
            format!(
                "must be 64 hex digits (what migration_stage returned), got {} bytes",
                digest.len()
            ),
        );
    }
    migration::verify(id, token, digest)
}

/// The cutover, on the source: seals the execution MIGRATED, pointing at
/// the target, in one transaction, only while it still matches its
/// verified high-water mark and nothing blocks it; `false` if not (noted
/// in `last_error`: discard the staged copy and abort).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn migration_cutover(migration_id: Option<i64>, lease_token: Option<i64>) -> bool {
    migration::cutover(migration_arg(migration_id), required(lease_token, "lease_token"))
}

/// Makes the staged copy of an execution live on this shard (the target):
/// its state back, its tasks claimable, its timer armed. `false` if it is
/// not staged here (already activated).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn migration_activate(execution_id: Option<pgrx::Uuid>) -> bool {
    migration::activate(required(execution_id, "execution_id"))
}

/// Removes the copy of an execution that move `migration_id` of shard
/// `source_shard` staged on this shard (a move that will not complete), or
/// puts back the seal a move back replaced; `false` if nothing is staged
/// here or the copy here is another move's.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn migration_discard(
    execution_id: Option<pgrx::Uuid>,
    source_shard: Option<i32>,
    migration_id: Option<i64>,
) -> bool {
    migration::discard_staged(
        required(execution_id, "execution_id"),
        shard_arg(source_shard, "source_shard"),
        migration_arg(migration_id),
    )
}

/// Records how a move ended, on the source: `done` (activated; after the
/// cutover), `resumed` (the same, settled by a worker), `aborted` (nothing
/// moved; before the cutover) with an audit entry each, or `failed` (one
/// more attempt and its `error`; the phase stays). Returns the phase.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn migration_report(
    migration_id: Option<i64>,
    lease_token: Option<i64>,
    outcome: Option<&str>,
    error: default!(Option<&str>, "NULL"),
) -> String {
    let id = migration_arg(migration_id);
    let token = required(lease_token, "lease_token");
    let outcome = required(outcome, "outcome");
    migration::report(id, token, outcome, error)
}

/// Takes move `migration_id` over for `lease` (5 seconds to 1 hour) when
/// its mover's lease has lapsed (a crashed or stuck mover): the new lease
/// token for its next steps, or NULL while its mover still holds it (a
/// move in progress is never taken from under it) or the move is over.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn migration_takeover(
    migration_id: Option<i64>,
    lease: default!(Option<Interval>, "'60 seconds'"),
) -> Option<i64> {
    migration::takeover(migration_arg(migration_id), lease_arg(lease))
}

/// Claims up to `max_rows` (1..10000) COMMITTED moves on this shard not
/// touched for `grace` (at least 5 seconds), whose mover's lease has
/// lapsed, and whose target is in `target_shards` (NULL: any), each with a
/// new lease token, so that one settler has it: what a worker's auto-resume
/// activates.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn migration_stalled(
    grace: default!(Option<Interval>, "'30 seconds'"),
    max_rows: default!(Option<i32>, 10),
    target_shards: default!(Option<Vec<Option<i32>>>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(migration_id, i64),
        name!(execution_id, pgrx::Uuid),
        name!(target_shard, i32),
        name!(attempts, i32),
        name!(lease_token, i64),
    ),
> {
    let grace = required(grace, "grace");
    let secs = grace.as_micros() as f64 / 1e6;
    if !(MIN_GRACE_SECS..=86_400.0).contains(&secs) {
        bad_argument(
            "grace",
            format!("must be from {MIN_GRACE_SECS} seconds to 1 day, got {secs} seconds"),
        );
    }
    let max_rows = page_rows(max_rows, MAX_PAGE);
    let targets = target_shards.map(|t| {
        t.into_iter()
            .map(|s| shard_arg(s, "target_shards"))
            .collect::<Vec<_>>()
    });
    TableIterator::new(
        migration::stalled(secs, max_rows, targets)
            .into_iter()
            .map(|s| (s.id, s.execution_id, s.target_shard, s.attempts, s.lease_token)),
    )
}

/// Points this shard's seal of an execution straight at `home_shard`, where
/// it lives after a later move (so chains of forwards collapse); `false` if
/// there is no seal here or it already points there.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn migration_repoint(execution_id: Option<pgrx::Uuid>, home_shard: Option<i32>) -> bool {
    let id = required(execution_id, "execution_id");
    migration::repoint(id, shard_arg(home_shard, "home_shard"))
}

/// This shard's moves (as the source), newest first, at most `max_rows`
/// (1..10000); only unfinished ones unless `open_only` is false.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn migrations(
    open_only: default!(Option<bool>, true),
    max_rows: default!(Option<i32>, 100),
) -> TableIterator<
    'static,
    (
        name!(migration_id, i64),
        name!(execution_id, pgrx::Uuid),
        name!(target_shard, i32),
        name!(phase, String),
        name!(attempts, i32),
        name!(last_error, Option<String>),
        name!(verified_event_seq, Option<i64>),
        name!(bytes, i64),
        name!(actor, String),
        name!(login, String),
        name!(created_at, TimestampWithTimeZone),
        name!(updated_at, TimestampWithTimeZone),
    ),
> {
    let open_only = required(open_only, "open_only");
    let max_rows = page_rows(max_rows, MAX_PAGE);
    TableIterator::new(migration::list(open_only, max_rows).into_iter().map(|m| {
        (
            m.id,
            m.execution_id,
            m.target_shard,
            m.phase,
            m.attempts,
            m.last_error,
            m.verified_event_seq,
            m.bytes,
            m.actor,
            m.login,
            m.created_at,
            m.updated_at,
        )
    }))
}

/// A page of this shard's seals (executions that moved away) after
/// `after_id`, in id order, at most `max_rows` (1..10000): the row of each
/// as `to_jsonb`, for `migration_adopt_seal` on the shard a retired shard
/// forwards to.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn migration_seals(
    after_id: default!(Option<pgrx::Uuid>, "NULL"),
    max_rows: default!(Option<i32>, 100),
) -> TableIterator<
    'static,
    (
        name!(execution_id, pgrx::Uuid),
        name!(moved_to, Option<i32>),
        name!(seal, Jsonb),
    ),
> {
    let max_rows = page_rows(max_rows, MAX_PAGE);
    TableIterator::new(
        migration::seals(after_id, max_rows)
            .into_iter()
            .map(|s| (s.id, s.moved_to, s.seal)),
    )
}

/// Keeps a seal from a shard about to be retired (a row of its
/// `migration_seals`), so ids its forwards entry routes here still find
/// their runs; `false` if this shard holds the id (or an active run of its
/// key) already.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn migration_adopt_seal(seal: Option<Jsonb>) -> bool {
    let seal = required(seal, "seal").parse("seal");
    migration::adopt_seal(&seal)
}

/// The lifecycle rows on this shard whose child is, or is still to be
/// started, on shard `target_shard`, in child id order after `after`, at
/// most `max_rows` (1..10,000): a drain of that shard asks every other
/// shard, since a child start still to happen there, or a child's end
/// there not yet pulled, is lost once it is retired.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn relay_rows_to(
    target_shard: Option<i32>,
    after: default!(Option<pgrx::Uuid>, "NULL"),
    max_rows: default!(Option<i32>, 1000),
) -> TableIterator<
    'static,
    (
        name!(child_id, pgrx::Uuid),
        name!(parent_id, pgrx::Uuid),
        name!(state, String),
    ),
> {
    let target = shard_arg(target_shard, "target_shard");
    let max_rows = page_rows(max_rows, MAX_PAGE);
    TableIterator::new(
        relay::rows_to(target, after, max_rows)
            .into_iter()
            .map(|r| (r.child_id, r.parent_id, r.state)),
    )
}
