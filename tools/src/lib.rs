//! Operator tools shared by the `appliance-inspect` and `appliance-cli` binaries.

pub mod cli;
pub mod inspect;
pub mod workload;
