//! The appliance daemon: config, executors, client plane, state machines, stats
//! endpoint, the node core's decisions as values (`node_core`), and the daemon that
//! runs them (`daemon`).

pub mod client;
pub mod config;
pub mod daemon;
pub mod node_core;
pub mod protocol;
pub mod state;
pub mod stats;
