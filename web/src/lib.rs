//! sheaf-web: the fleet dashboard (`sheaf serve`) over
//! [`sheaf_driver`], in a crate of its own so an application that uses
//! the driver does not compile a web server.
#![warn(missing_docs)]

mod dashboard;

pub use dashboard::{UiOptions, UiServer};
