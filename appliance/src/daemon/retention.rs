//! Retention: the metadata primary deletes whole sealed segments, oldest first, of topics
//! past their message expiry or size limit, through the metadata group's consensus.

use std::time::Duration;

/// The server defaults ([retention]) and how often the primary looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionSettings {
    /// Zero: never.
    pub message_expiry: Duration,
    /// Zero: no limit.
    pub max_topic_size: u64,
    pub check_ticks: u64,
}
