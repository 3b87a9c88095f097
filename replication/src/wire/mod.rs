//! The replica-plane wire format of protocol 0.11.0 (docs/protocol.md): 256-byte
//! headers, the command and operation registries, the three seals, frame validation,
//! plane gates, group keys and the message batch.
//!
//! Decoding is a cast of a 16-byte-aligned buffer followed by validation; nothing here
//! allocates per frame on the receive path, and no input panics.

pub mod batch;
pub mod cluster;
pub mod decode;
pub mod error;
pub mod frame;
pub mod gate;
pub mod header;
pub mod registry;

pub use cluster::{cluster_id, group_kind, GroupKind, PartitionKey};
pub use decode::{check_header, decode, decode_as, decode_trusted, HeaderInfo, Limits, Message};
pub use error::FrameError;
pub use frame::{Frame, FrameBuf, PrepareChain};
pub use gate::{client_plane_admit, replica_plane_admit, GateError};
pub use header::*;
pub use registry::{Command, Operation, Plane, METADATA_GROUP};

#[cfg(test)]
mod tests;
