//! Partition storage: segment logs of message batches with sparse offset and timestamp
//! indexes (`log`, `index`), their sans-IO scan (`scan`), consumer offsets kept apart
//! (`offsets`), and offline inspection (`inspect`).

pub mod index;
pub mod inspect;
pub mod log;
pub mod offsets;
pub mod read;
pub mod scan;
mod sealed;

pub use log::{
    AppendReceipt, OpenReport, PartitionConfig, PartitionLog, Plan, Planned, PlannedWrite, Syncer,
};
pub use offsets::ConsumerOffsets;
pub use read::{ReadFrom, ReadPlan};
pub use scan::{scan_segment, BatchEntry, SegmentScan, SegmentTail};
