//! The replicated state machines. So far: the metadata plane (streams, topics,
//! partitions, users, consumer groups) and password hashing.

pub mod auth;
pub mod metadata;
pub mod ops;

pub use metadata::{Applied, Caller, MetadataState, PasswordWork, Right};
pub use ops::MetadataOp;

#[cfg(test)]
mod tests;
