//! [`Protocol`]: the relay's, the rebalancer's and the worker registry's
//! steps, one SQL call each. The driver drives them itself ([`crate::Relay`],
//! [`Admin::rebalance`](crate::Admin::rebalance), [`crate::Worker`]); they
//! are public only through the `#[doc(hidden)]` module `sheaf_driver::protocol`,
//! for the CLI and the tests that walk a protocol one step at a time. No
//! compatibility promise: an application never needs them.

use super::Client;

/// One step at a time of the relay, outbox, migration and worker-registry
/// protocols on a [`Client`]'s shards: `client.protocol()` with [`Steps`]
/// in scope.
#[derive(Debug, Clone, Copy)]
pub struct Protocol<'c> {
    pub(crate) client: &'c Client,
}

/// Gives a [`Client`] its [`Protocol`] steps; a trait, so that they are
/// reachable only where `sheaf_driver::protocol::Steps` is imported.
pub trait Steps {
    /// This client's protocol steps.
    fn protocol(&self) -> Protocol<'_>;
}

impl Steps for Client {
    fn protocol(&self) -> Protocol<'_> {
        Protocol { client: self }
    }
}
