//! The replicated state machines: the metadata plane (streams, topics, partitions,
//! users, consumer groups) with password hashing, and each partition's applied state.

pub mod auth;
pub mod metadata;
pub mod ops;
pub mod partition;

pub use metadata::{Applied, Caller, MetadataState, PasswordWork, Right};
pub use ops::MetadataOp;

#[cfg(test)]
mod tests;
