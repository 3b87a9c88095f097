//! The client protocol carried in Request (5) and Reply (8) bodies on the `tcp` port:
//! request bodies per operation, NonReplicated read commands, reply statuses and reply
//! bodies.
//! docs/client-protocol.md is the reference for every encoding.

pub mod codec;
pub mod options;
pub mod reply;
pub mod request;
pub mod status;
pub mod system;
pub mod users;

pub use codec::BodyError;
pub use request::{
    ClientRequest, ClientVersion, Consumer, Credentials, PollStrategy, ReadCommand, Retention,
    StreamPermission,
};
pub use status::Status;

#[cfg(test)]
mod reply_tests;
#[cfg(test)]
mod tests;
