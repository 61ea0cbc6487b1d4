//! sheaf's audit log on this shard.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;

use crate::base::errors::bad_argument;
use crate::base::jsonb::Jsonb;
use crate::base::{args, audit};

/// The most entries one `audit_log` page holds.
const MAX_PAGE: i32 = 1000;

/// This shard's audit log, newest first: the entries before `before_id`
/// (NULL: from the newest), at most `max_rows` (1..1000). Every operator
/// action writes one (`action`, its `target`, `outcome`, `detail`), with
/// the `actor` its session named (`sheaf.actor`, else the login role) and
/// the `login` role that did it (`session_user`: an actor is the session's
/// claim, the login is whose credential it was).
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
        name!(login, String),
        name!(action, String),
        name!(target, Option<String>),
        name!(outcome, String),
        name!(detail, Option<pgrx::JsonB>),
    ),
> {
    let max_rows = args::page_rows(max_rows, MAX_PAGE);
    TableIterator::new(audit::page(before_id, max_rows).into_iter().map(|e| {
        (
            e.id, e.at, e.actor, e.login, e.action, e.target, e.outcome, e.detail,
        )
    }))
}

/// Adds an entry to this shard's audit log for an action a client did
/// across shards (`action` and `outcome` 1 to 64 bytes, `target` up to 256,
/// `detail` a JSON object up to 8 KiB): the driver records a fan-out that
/// did not reach every shard (`outcome` `failed`) on the shards it did
/// reach.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(@extschema@, pg_catalog, pg_temp)]
fn audit_note(
    action: Option<&str>,
    target: Option<&str>,
    outcome: Option<&str>,
    detail: default!(Option<Jsonb>, "'{}'"),
) {
    let action = short(action, "action");
    let outcome = short(outcome, "outcome");
    let target = args::required(target, "target");
    if target.len() > 256 {
        bad_argument(
            "target",
            format!("must be at most 256 bytes, got {}", target.len()),
        );
    }
    let detail = args::required(detail, "detail").checked("detail");
    if detail.compact_len() > 8192 {
        bad_argument(
            "detail",
            format!("must be at most 8192 bytes of JSON, got {}", detail.compact_len()),
        );
    }
    let detail = detail.parse("detail");
    if !detail.is_object() {
        bad_argument("detail", "must be a JSON object");
    }
    audit::record(action, target, outcome, detail);
}

fn short<'a>(value: Option<&'a str>, arg: &str) -> &'a str {
    let value = args::required(value, arg);
    if value.is_empty() || value.len() > 64 {
        bad_argument(arg, format!("must be 1 to 64 bytes, got {}", value.len()));
    }
    value
}
