//! A blocking client of the appliance's client protocol (docs/client-protocol.md) over
//! std::net, used by `appliance-cli` and by tests.
//!
//! - Connects to any node; every group (metadata, each partition) has a primary, cached
//!   per group and learned from NotPrimary replies and ClusterMetadata.
//! - Login is per connection and repeated on every new one; the session is the
//!   cluster's and survives reconnects.
//! - A replicated request is sent under the session with the next request number, and
//!   every retry of it reuses that number, so a retry of an applied request is answered
//!   from the primary's client table, never applied twice.
//!
//! What is retried and why it is safe (docs/client-protocol.md, "What the client
//! library retries"): connection loss, timeouts, Unavailable and PipelineFull are
//! retried with backoff at the next node, with the same number; NotPrimary at the named
//! primary, unless that node just failed an attempt and another is left to ask (the
//! backups of a silent primary name it until they notice). NoSession re-registers and resends only when no earlier attempt can have
//! been applied; otherwise the call reports `SessionLost`. When a call fails after a
//! possible delivery, the session is dropped so the abandoned number is never reused.
//! Every reply frame passes `wire::decode` and is matched to its request (client,
//! request number, operation) before its body is read.

mod conn;
mod engine;
mod error;
mod ops;
mod retry;

#[cfg(any(test, feature = "test-server"))]
pub mod fake;

#[cfg(test)]
mod tests;

pub use conn::ClientTls;
pub use engine::{resolve, Client, ClientOptions, NODES_MAX};
pub use error::ClientError;
pub use retry::{RetryPolicy, ATTEMPTS_LIMIT};
