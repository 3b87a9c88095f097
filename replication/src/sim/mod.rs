//! Deterministic simulator (docs/architecture.md): 3 or 5 replicas of the real `vsr`
//! code, clients, a lossy reordering network with partitions, storage that loses
//! unsynced writes, tears and corrupts, crashes and restarts; one seed replays a run
//! exactly. Checkers run after every step and at the end.

pub mod checker;
pub mod cluster;
mod faults;
pub mod network;
mod scenario;
pub mod storage;

pub use checker::Checker;
pub use cluster::{run_seed, Cluster, Failure, Faults, SimOptions, Summary, Wipe};
pub use network::{Network, NetworkFaults, Node, Packet};
pub use storage::Storage;
