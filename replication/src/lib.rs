//! The replica plane: the wire format, the message bus, the VSR consensus core (sans-IO)
//! and the deterministic simulator that proves it.

pub mod bus;
pub mod sim;
pub mod vsr;
pub mod wire;
