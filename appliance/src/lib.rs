//! The appliance daemon: config, executors, client plane, state machines, stats
//! endpoint. So far: the configuration (see README.md, "Status").

pub mod client;
pub mod config;
pub mod protocol;
pub mod state;
pub mod stats;
