//! sheaf: the durable queue primitives that run inside every shard database.
//!
//! The schema is hand-written SQL in `sql/` (the spec); this crate adds the
//! functions. Each module is one concept; pure logic lives in `sheaf-core`.
//!
//! # Layers
//!
//! The modules sit in layers, and a module names only its own layer and the
//! ones below it, and the modules of a layer form no circle
//! (`scripts/check-layers` fails on an upward `crate::` path and on a
//! circle; `scripts/test` runs it):
//!
//! ```text
//! api        every #[pg_extern]: validate, call, return
//!  ↓
//! workflow   executions: start/admission, gates, quota, policy, history, lifecycle
//!  ↓
//! queue      tasks: ready set, caps, promotion, claim, leases, completion,
//! mutex      retries, dead letters, workers, stats | the durable mutex
//!  ↓         (side by side: neither names the other)
//! base       statements, errors, argument checks, lock classes and the lock
//!            order, jsonb, ids, shard identity
//! ```
//!
//! The queue never names the workflow layer: a queue function whose task
//! may belong to an execution takes `&dyn queue::hooks::ExecutionHooks`,
//! which the workflow layer implements and the api layer passes in.
//! `testing` (helpers for `#[pg_test]`s) calls the SQL API only, and reads
//! rows with `base::rows`.

::pgrx::pg_module_magic!(name, version);

/// Runs once per backend, when Postgres loads the library.
#[pgrx::pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // pgrx puts a Rust backtrace into the DETAIL of every error raised while
    // sheaf runs (a panic, or a Postgres error passing through sheaf) when
    // the server's environment has RUST_BACKTRACE set: ~60 lines of build
    // paths sent to the client. std reads this variable once, on the first
    // capture, so setting it here turns capturing off for this library's
    // lifetime; the error itself, its SQLSTATE and message are unchanged.
    // SAFETY: a backend runs one thread; nothing reads the environment
    // concurrently.
    unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    queue::claim::define_settings();
}

mod api;
mod base;
mod mutex;
mod queue;
#[cfg(any(test, feature = "pg_test"))]
mod testing;
mod workflow;

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
