//! sheaf's audit log (`audit_log` in sql/schema.sql): one row per operator
//! action, written in the action's own transaction.

use pgrx::prelude::*;

use crate::base::catalog::{self, Feature};
use crate::base::jsonb::Jsonb;
use crate::base::plans::Stmt;
use crate::base::rows::row;

/// The longest actor or target kept (a caller's setting is cut, never
/// stored whole).
const MAX_TEXT: usize = 256;

const RECORD: Stmt = Stmt::write(
    "INSERT INTO audit_log (actor, login, action, target, outcome, detail) \
     VALUES (left(coalesce(nullif(current_setting('sheaf.actor', true), ''), session_user::text), 256), \
             session_user::text, $1, left($2, 256), $3, $4)",
    &[
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::TEXTOID,
        PgBuiltInOids::JSONBOID,
    ],
);
const PAGE: Stmt = Stmt::read(
    "SELECT id, at, actor, login, action, target, outcome, detail FROM audit_log \
     WHERE id < $1 ORDER BY id DESC LIMIT $2",
    &[PgBuiltInOids::INT8OID, PgBuiltInOids::INT8OID],
);

fn enabled() -> bool {
    catalog::has(Feature::AuditLog)
}

/// Records that `action` was done to `target` (`ok` unless `outcome` says).
pub fn record(action: &str, target: &str, outcome: &str, detail: serde_json::Value) {
    if !enabled() {
        return;
    }
    let target = sheaf_core::children::cut(target, MAX_TEXT);
    RECORD.exec(&[
        action.into(),
        target.into(),
        outcome.into(),
        Jsonb::from_value(detail).into(),
    ]);
}

/// Whether this session names who it acts for (`sheaf.actor`, set and not
/// empty). Operator tools always do (the CLI's `--actor`, the dashboard,
/// the HTTP API); an application's driver does only when told to.
pub fn actor_named() -> bool {
    // SAFETY: reads a setting by name in a backend; missing_ok gives NULL
    // for one never set, and the string is the GUC's own, read at once.
    unsafe {
        let value = pg_sys::GetConfigOption(c"sheaf.actor".as_ptr(), true, false);
        !value.is_null() && *value != 0
    }
}

row! {
    /// An entry as `audit_log()` returns it.
    pub struct Entry {
        pub id: i64,
        pub at: pgrx::datum::TimestampWithTimeZone,
        pub actor: String,
        pub login: String,
        pub action: String,
        pub target: Option<String>,
        pub outcome: String,
        pub detail: Option<pgrx::JsonB>,
    }
}

/// The entries before `before` (newest first), at most `max`.
pub fn page(before: Option<i64>, max: i64) -> Vec<Entry> {
    if !enabled() {
        return Vec::new();
    }
    let before = before.unwrap_or(i64::MAX);
    PAGE.all(&[before.into(), max.into()], "reading the audit log")
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::base::rows::row;
    use crate::testing::{init, rows};
    use pgrx::prelude::*;

    row! {
        #[derive(Debug, PartialEq)]
        struct Entry {
            actor: String,
            login: String,
            action: String,
            target: String,
        }
    }

    #[pg_test]
    fn operator_actions_are_recorded_with_their_actor_and_login() {
        init();
        Spi::run("SELECT set_config('sheaf.actor', 'ann', true)").unwrap();
        Spi::run("SELECT sheaf.set_concurrency_limit('tenant-a', 3)").unwrap();
        Spi::run("SELECT sheaf.configure_queue('q', '{\"aging_secs\": 5}')").unwrap();
        Spi::run("SELECT set_config('sheaf.actor', '', true)").unwrap();
        Spi::run("SELECT sheaf.declare_workflow('w', '{}')").unwrap();
        let logged: Vec<Entry> = rows(
            "SELECT actor, login, action, target FROM sheaf.audit_log(NULL, 10)",
            &[],
        );
        // The login is the session's whatever actor it declared.
        let session: String = Spi::get_one("SELECT session_user::text").unwrap().unwrap();
        let entry = |actor: &str, action: &str, target: &str| Entry {
            actor: actor.to_owned(),
            login: session.clone(),
            action: action.to_owned(),
            target: target.to_owned(),
        };
        assert_eq!(
            logged,
            [
                entry(&session, "declare_workflow", "w"),
                entry("ann", "configure_queue", "q"),
                entry("ann", "set_concurrency_limit", "tenant-a"),
            ]
        );
        let older: i64 = Spi::get_one(
            "SELECT count(*) FROM sheaf.audit_log((SELECT max(id) FROM sheaf.audit_log(NULL, 10)), 10)",
        )
        .unwrap()
        .unwrap();
        assert_eq!(older, 2, "a page before an id");
    }
}
