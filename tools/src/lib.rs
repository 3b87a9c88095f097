//! Operator tools shared by the `appliance-inspect` and (later) `appliance-cli` binaries.

pub mod inspect;
