//! sheaf's audit log on this shard.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

use crate::base::{args, audit};

/// The most entries one `audit_log` page holds.
const MAX_PAGE: i32 = 1000;

/// This shard's audit log, newest first: the entries before `before_id`
/// (NULL: from the newest), at most `max_rows` (1..1000). Every operator
/// action writes one (`action`, its `target`, `outcome`, `detail`), with
/// the `actor` its session named (`sheaf.actor`, else the login role).
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn audit_log(
    before_id: default!(Option<i64>, "NULL"),
    max_rows: default!(Option<i32>, 100),
) -> TableIterator<
    'static,
    (
        name!(id, i64),
        name!(at, TimestampWithTimeZone),
        name!(actor, String),
        name!(action, String),
        name!(target, Option<String>),
        name!(outcome, String),
        name!(detail, Option<pgrx::JsonB>),
    ),
> {
    let max_rows = args::page_rows(max_rows, MAX_PAGE);
    TableIterator::new(audit::page(before_id, max_rows))
}
