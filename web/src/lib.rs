//! sheaf-web: the fleet dashboard and the HTTP JSON API (`sheaf serve`;
//! docs/operating/dashboard.md and docs/operating/api.md) over
//! [`sheaf_driver`], in a crate of its own so an application that uses the
//! driver does not compile a web server.
#![warn(missing_docs)]

mod api;
mod dashboard;
mod metrics;

pub use dashboard::{UiOptions, UiServer};
