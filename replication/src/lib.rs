//! The replica plane: wire format, and (as the issues land) the VSR consensus core,
//! the message bus and the deterministic simulator.

pub mod sim;
pub mod vsr;
pub mod wire;
