//! Offline inspection of one segment file (`segment verify|dump FILE`): plain reads,
//! serde-serializable reports.

use std::path::Path;

use replication::wire::batch::{messages, verify};
use serde::Serialize;

use super::index::SparseIndex;
use super::log::{parse_segment_name, segment_file_name};
use super::scan::{guess_partition, scan_segment, BatchEntry, SegmentTail};
use crate::error::{JournalError, Result};

/// `segment verify FILE`.
#[derive(Clone, Debug, Serialize)]
pub struct SegmentReport {
    pub path: String,
    pub base_offset: u64,
    pub partition_id: u64,
    pub file_len: u64,
    /// Bytes of the verified prefix.
    pub valid_len: u64,
    pub batches: usize,
    pub messages: u64,
    /// The offset after the last valid message.
    pub next_offset: u64,
    pub tail: SegmentTail,
    /// Whether `.index`/`.timeindex` beside the file exist and match the log.
    pub index_ok: bool,
    /// Clean tail and everything verified.
    pub ok: bool,
}

/// One message in `segment dump FILE`.
#[derive(Clone, Debug, Serialize)]
pub struct MessageDump {
    pub offset: u64,
    pub timestamp: u64,
    #[serde(serialize_with = "crate::inspect::u128_string")]
    pub id: u128,
    pub payload_len: usize,
    pub user_headers_len: usize,
}

/// One batch in `segment dump FILE`.
#[derive(Clone, Debug, Serialize)]
pub struct BatchDump {
    #[serde(flatten)]
    pub entry: BatchEntry,
    pub messages: Vec<MessageDump>,
}

/// `segment dump FILE`.
#[derive(Clone, Debug, Serialize)]
pub struct SegmentDump {
    pub report: SegmentReport,
    pub batches: Vec<BatchDump>,
}

fn scan_file(path: &Path) -> Result<(Vec<u8>, SegmentReport, Vec<BatchEntry>)> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let base_offset = parse_segment_name(&name).ok_or(JournalError::Format {
        path: path.into(),
        reason: "segment files are named <20-digit base offset>.log",
    })?;
    let image = std::fs::read(path).map_err(|e| JournalError::io("read", path, e))?;
    let partition_id = guess_partition(&image);
    let scan = scan_segment(&image, partition_id, base_offset);
    let dir = path.parent().unwrap_or(Path::new("."));
    let index_ok = [(false, "index"), (true, "timeindex")]
        .iter()
        .all(|(time, extension)| {
            std::fs::read(dir.join(segment_file_name(base_offset, extension)))
                .ok()
                .and_then(|bytes| {
                    SparseIndex::decode(&bytes, *time, base_offset, image.len() as u64)
                })
                .is_some_and(|(_, next)| next == scan.next_offset(base_offset))
        });
    let report = SegmentReport {
        path: path.display().to_string(),
        base_offset,
        partition_id,
        file_len: image.len() as u64,
        valid_len: scan.valid_len,
        batches: scan.batches.len(),
        messages: scan
            .batches
            .iter()
            .map(|b| u64::from(b.message_count))
            .sum(),
        next_offset: scan.next_offset(base_offset),
        ok: scan.tail == SegmentTail::Clean,
        tail: scan.tail,
        index_ok,
    };
    Ok((image, report, scan.batches))
}

/// Verifies every batch of the segment file at `path`.
pub fn segment_verify(path: &Path) -> Result<SegmentReport> {
    Ok(scan_file(path)?.1)
}

/// Lists every verified batch and message of the segment file at `path`.
pub fn segment_dump(path: &Path) -> Result<SegmentDump> {
    let (image, report, entries) = scan_file(path)?;
    let batches = entries
        .into_iter()
        .map(|entry| {
            let bytes = &image[entry.position as usize..(entry.position + entry.len) as usize];
            debug_assert!(verify(bytes).is_ok());
            BatchDump {
                entry,
                messages: messages(bytes)
                    .map(|m| MessageDump {
                        offset: m.offset,
                        timestamp: m.timestamp,
                        id: m.id,
                        payload_len: m.payload.len(),
                        user_headers_len: m.user_headers.len(),
                    })
                    .collect(),
            }
        })
        .collect();
    Ok(SegmentDump { report, batches })
}
