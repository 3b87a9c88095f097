//! Partition storage on one node: the segment log and consumer offsets of every
//! partition group, opened when the metadata op that creates the partition commits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use journal::segment::{ConsumerOffsets, PartitionConfig, PartitionLog};
use journal::Durability;
use replication::wire::PartitionKey;

use crate::protocol::Consumer;

/// Bytes of log a poll reads at most (whole batches; the reply stays far below the
/// frame limit).
pub const POLL_BYTES_MAX: u64 = 4 << 20;

/// One partition's committed data.
pub struct Partition {
    pub key: PartitionKey,
    pub log: PartitionLog,
    pub offsets: ConsumerOffsets,
}

/// Every partition this node stores, by group.
#[derive(Default)]
pub struct Partitions {
    pub by_group: BTreeMap<u64, Partition>,
}

/// The folder of a partition inside the data directory's `partitions/`.
pub fn partition_dir(data_dir: &Path, key: PartitionKey) -> PathBuf {
    data_dir
        .join(journal::data_dir::PARTITIONS_DIR)
        .join(format!("{}-{}-{}", key.stream, key.topic, key.partition))
}

/// The consumer-offset table key: kind in the high half, id in the low.
pub fn consumer_key(consumer: Consumer) -> u64 {
    match consumer {
        Consumer::Single(id) => u64::from(id),
        Consumer::Group(id) => (1 << 32) | u64::from(id),
    }
}

/// Opens (creating if absent) one partition's log and offsets.
pub async fn open(
    data_dir: &Path,
    key: PartitionKey,
    group: u64,
    config: PartitionConfig,
    offset_durability: Durability,
) -> journal::Result<Partition> {
    let dir = partition_dir(data_dir, key);
    let (log, report) = PartitionLog::open(&dir, group, config).await?;
    if let Some((from, to)) = report.truncated_tail {
        tracing::warn!(?key, from, to, "partition log: torn tail truncated");
    }
    let offsets = ConsumerOffsets::open(&dir.join("consumer-offsets"), offset_durability)?;
    Ok(Partition { key, log, offsets })
}
