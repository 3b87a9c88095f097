//! Deterministic simulator (docs/architecture.md): 3 or 5 replicas of the real `vsr`
//! code, clients, a lossy reordering network with partitions, storage that loses
//! unsynced writes, tears and corrupts, crashes and restarts; one seed replays a run
//! exactly. Checkers run after every step and at the end.

pub mod checker;
pub mod cluster;
mod faults;
pub mod many;
pub mod network;
mod scenario;
pub mod slow;
pub mod storage;
mod stretch;

pub use checker::Checker;
pub use cluster::{run_seed, Cluster, Failure, Faults, SimOptions, Summary, Wipe};
pub use many::{run_many, ManyOptions, ManySummary};
pub use network::{Network, NetworkFaults, Node, Packet};
pub use slow::{run_slow_node, SlowNodeReport, SlowNodeRun, SlowStretch, Slowness};
pub use storage::Storage;

/// The partition-plane group the simulator runs with `--partition` (stream 1, topic 1,
/// partition 1).
pub fn partition_plane_group() -> u64 {
    let key = crate::wire::PartitionKey {
        stream: 1,
        topic: 1,
        partition: 1,
    };
    key.pack().unwrap_or(1)
}
