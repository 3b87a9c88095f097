//! The appliance daemon: config, executors, client plane, state machines, stats
//! endpoint, and the daemon that runs them (`daemon`).

pub mod client;
pub mod config;
pub mod daemon;
pub mod protocol;
pub mod state;
pub mod stats;
