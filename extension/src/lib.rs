//! sheaf: the durable queue primitives that run inside every shard database.
//!
//! The schema is hand-written SQL in `sql/` (the spec); this crate adds the
//! functions. Each module is one concept; pure logic lives in `sheaf-core`.

::pgrx::pg_module_magic!(name, version);

mod claim;
mod complete;
mod concurrency;
mod dead_letters;
mod errors;
mod executions;
mod gates;
mod history;
mod ids;
mod jsonb;
mod lease;
mod lifecycle;
mod maintain;
mod mutex;
mod plans;
mod policy;
mod promote;
mod queue;
mod quota;
mod ready;
mod retry;
mod shard;
mod stats;
mod tasks;
#[cfg(any(test, feature = "pg_test"))]
mod testing;
mod workers;

// The tables come first so every function below can reference them.
pgrx::extension_sql_file!("../../sql/schema.sql", name = "schema", bootstrap);
// Roles and grants come last: they name functions that must already exist.
pgrx::extension_sql_file!("../../sql/privileges.sql", name = "privileges", finalize);

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
