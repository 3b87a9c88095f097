//! The replica plane: wire format, and (as the issues land) the VSR consensus core,
//! the message bus and the deterministic simulator.

pub mod bus;
// Two lints new in clippy 1.95 fire inside wire/ (owned by the integrator); allowed here
// so `cargo clippy -D warnings` stays usable until wire/ is updated.
#[allow(clippy::manual_is_multiple_of, clippy::needless_lifetimes)]
pub mod wire;
