//! The replica plane: the wire format, the message bus, and (as the issues land) the
//! VSR consensus core and the deterministic simulator.

pub mod bus;
pub mod wire;
