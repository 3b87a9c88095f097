//! The sparse offset index and the timestamp index of one segment.
//!
//! An entry is taken for the first batch and then for the first batch after every
//! `index_interval_bytes` of log, so a lookup reads at most about one interval. Both
//! indexes share entries: `(relative offset, position, base_timestamp)`. They are
//! persisted when a segment is sealed, as `.index` and `.timeindex` files with a checksum
//! each, and rebuilt from the log whenever a file is missing or fails verification.

use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64;

use super::scan::BatchEntry;

/// Magic of the offset index file.
pub const OFFSET_INDEX_MAGIC: [u8; 8] = *b"IGOIDX01";
/// Magic of the timestamp index file.
pub const TIME_INDEX_MAGIC: [u8; 8] = *b"IGTIDX01";
/// Most entries an index file may claim (bounds the allocation when decoding).
pub const INDEX_ENTRIES_MAX: u64 = 1 << 24;
const INDEX_HEADER_SIZE: usize = 8 + 8 + 8 + 8 + 4;

/// One sparse index point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct IndexEntry {
    /// Offset of the batch relative to the segment's base offset.
    pub relative_offset: u32,
    /// Byte position of the batch in the segment.
    pub position: u32,
    /// The batch's base_timestamp (non-decreasing along the log).
    pub timestamp: u64,
}

/// The in-memory index of a segment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SparseIndex {
    entries: Vec<IndexEntry>,
    /// Position at which the last entry was taken.
    last_indexed_position: Option<u64>,
}

impl SparseIndex {
    /// Offers a batch just appended (or scanned); takes an entry if due.
    pub fn observe(&mut self, base_offset: u64, entry: &BatchEntry, interval_bytes: u64) {
        let due = self
            .last_indexed_position
            .is_none_or(|last| entry.position >= last + interval_bytes);
        if due {
            // Invariant: the segment scan stops at the first batch whose base_offset is not
            // the expected next offset (a discontinuity), and appends stamp from the
            // segment's next offset, so no batch lies below its segment's base.
            assert!(entry.base_offset >= base_offset);
            self.entries.push(IndexEntry {
                relative_offset: u32::try_from(entry.base_offset - base_offset).unwrap_or(u32::MAX),
                position: u32::try_from(entry.position).unwrap_or(u32::MAX),
                timestamp: entry.base_timestamp,
            });
            self.last_indexed_position = Some(entry.position);
        }
    }

    /// Builds the index of a scanned segment.
    pub fn build(base_offset: u64, batches: &[BatchEntry], interval_bytes: u64) -> SparseIndex {
        let mut index = SparseIndex::default();
        for batch in batches {
            index.observe(base_offset, batch, interval_bytes);
        }
        index
    }

    /// The entries.
    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// The base_timestamp of the segment's first batch (its first entry).
    pub fn first_timestamp(&self) -> Option<u64> {
        self.entries.first().map(|e| e.timestamp)
    }

    /// Bytes of memory the entries hold.
    pub fn memory_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<IndexEntry>()
    }

    /// Position to start scanning from to find `relative_offset`.
    pub fn position_for_offset(&self, relative_offset: u64) -> u64 {
        let at = self
            .entries
            .partition_point(|e| u64::from(e.relative_offset) <= relative_offset);
        at.checked_sub(1)
            .map_or(0, |i| u64::from(self.entries[i].position))
    }

    /// Position to start scanning from to find the first batch with timestamp >= `ts`.
    pub fn position_for_timestamp(&self, timestamp: u64) -> u64 {
        let at = self.entries.partition_point(|e| e.timestamp < timestamp);
        at.checked_sub(1)
            .map_or(0, |i| u64::from(self.entries[i].position))
    }

    /// Encodes the offset index (`time == false`) or the timestamp index for a segment
    /// of `log_len` bytes ending at `next_offset`.
    pub fn encode(&self, time: bool, base_offset: u64, next_offset: u64, log_len: u64) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(INDEX_HEADER_SIZE + self.entries.len() * 16 + 8);
        bytes.extend_from_slice(if time {
            &TIME_INDEX_MAGIC
        } else {
            &OFFSET_INDEX_MAGIC
        });
        bytes.extend_from_slice(&base_offset.to_le_bytes());
        bytes.extend_from_slice(&next_offset.to_le_bytes());
        bytes.extend_from_slice(&log_len.to_le_bytes());
        bytes.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for e in &self.entries {
            if time {
                bytes.extend_from_slice(&e.timestamp.to_le_bytes());
                bytes.extend_from_slice(&e.relative_offset.to_le_bytes());
                bytes.extend_from_slice(&e.position.to_le_bytes());
            } else {
                bytes.extend_from_slice(&e.relative_offset.to_le_bytes());
                bytes.extend_from_slice(&e.position.to_le_bytes());
            }
        }
        let checksum = xxh3_64(&bytes);
        bytes.extend_from_slice(&checksum.to_le_bytes());
        bytes
    }

    /// Decodes an index file written by `encode` for this segment; `None` if it is
    /// damaged, belongs to other log contents, or is out of order (then rebuild).
    pub fn decode(
        bytes: &[u8],
        time: bool,
        base_offset: u64,
        log_len: u64,
    ) -> Option<(SparseIndex, u64)> {
        let body_len = bytes.len().checked_sub(8)?;
        let (body, trailer) = bytes.split_at(body_len);
        if xxh3_64(body) != u64::from_le_bytes(trailer.try_into().ok()?) {
            return None;
        }
        let magic = if time {
            TIME_INDEX_MAGIC
        } else {
            OFFSET_INDEX_MAGIC
        };
        let u64_at = |at: usize| Some(u64::from_le_bytes(body.get(at..at + 8)?.try_into().ok()?));
        if body.get(..8)? != magic || u64_at(8)? != base_offset || u64_at(24)? != log_len {
            return None;
        }
        let next_offset = u64_at(16)?;
        let count = u64::from(u32::from_le_bytes(body.get(32..36)?.try_into().ok()?));
        let entry_size = if time { 16 } else { 8 };
        if count > INDEX_ENTRIES_MAX
            || body.len() as u64 != INDEX_HEADER_SIZE as u64 + count * entry_size
        {
            return None;
        }
        let mut index = SparseIndex::default();
        for chunk in body[INDEX_HEADER_SIZE..].chunks_exact(entry_size as usize) {
            let u32_at =
                |at: usize| u32::from_le_bytes(chunk[at..at + 4].try_into().unwrap_or([0; 4]));
            let entry = if time {
                IndexEntry {
                    timestamp: u64::from_le_bytes(chunk[0..8].try_into().unwrap_or([0; 8])),
                    relative_offset: u32_at(8),
                    position: u32_at(12),
                }
            } else {
                IndexEntry {
                    relative_offset: u32_at(0),
                    position: u32_at(4),
                    timestamp: 0,
                }
            };
            if let Some(last) = index.entries.last() {
                let ordered = entry.relative_offset > last.relative_offset
                    && entry.position > last.position
                    && entry.timestamp >= last.timestamp;
                if !ordered {
                    return None;
                }
            }
            if u64::from(entry.position) >= log_len {
                return None;
            }
            index.last_indexed_position = Some(u64::from(entry.position));
            index.entries.push(entry);
        }
        Some((index, next_offset))
    }

    /// Merges a timestamp index into this offset index (same entry points).
    pub fn with_timestamps(mut self, time: &SparseIndex) -> Option<SparseIndex> {
        if time.entries.len() != self.entries.len() {
            return None;
        }
        for (e, t) in self.entries.iter_mut().zip(&time.entries) {
            if (e.relative_offset, e.position) != (t.relative_offset, t.position) {
                return None;
            }
            e.timestamp = t.timestamp;
        }
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries() -> Vec<BatchEntry> {
        (0..10)
            .map(|i| BatchEntry {
                position: i * 1000,
                len: 1000,
                base_offset: 50 + i * 3,
                message_count: 3,
                base_timestamp: 7000 + i * 10,
            })
            .collect()
    }

    #[test]
    fn index_is_sparse_and_lookups_land_at_or_before_the_target() {
        let index = SparseIndex::build(50, &entries(), 2500);
        assert_eq!(index.entries().len(), 4); // positions 0, 3000, 6000, 9000
        assert_eq!(index.position_for_offset(0), 0);
        assert_eq!(index.position_for_offset(10), 3000);
        assert_eq!(index.position_for_offset(29), 9000);
        assert_eq!(index.position_for_timestamp(7000), 0);
        assert_eq!(index.position_for_timestamp(7065), 6000);
    }

    #[test]
    fn index_files_round_trip_and_reject_damage() {
        let index = SparseIndex::build(50, &entries(), 2500);
        let offsets = index.encode(false, 50, 80, 10_000);
        let times = index.encode(true, 50, 80, 10_000);
        let (decoded, next) = SparseIndex::decode(&offsets, false, 50, 10_000).unwrap();
        let (time, _) = SparseIndex::decode(&times, true, 50, 10_000).unwrap();
        assert_eq!(next, 80);
        assert_eq!(
            decoded.with_timestamps(&time).unwrap().entries(),
            index.entries()
        );
        for at in 0..offsets.len() {
            let mut bad = offsets.clone();
            bad[at] ^= 0x08;
            assert!(
                SparseIndex::decode(&bad, false, 50, 10_000).is_none(),
                "flip at {at}"
            );
        }
        // An index for a log of another length is stale.
        assert!(SparseIndex::decode(&offsets, false, 50, 9_000).is_none());
    }
}
