//! Consumer offsets, stored apart from the segment log in one small file per partition.
//!
//! The whole table is rewritten atomically (temporary file, rename) with a checksum, so
//! the file is always either the old or the new table. When it is written and forced to
//! stable storage is the partition's `offset_durability`: every store, at most an
//! interval later, or only at flush/close.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use xxhash_rust::xxh3::xxh3_64;

use crate::durability::{Durability, SyncSchedule};
use crate::error::{JournalError, Result};
use crate::journal::sync_parent_dir;

/// File name of the offsets table inside a partition directory.
pub const OFFSETS_FILE: &str = "consumer-offsets";
/// Magic at the start of the file.
pub const OFFSETS_MAGIC: [u8; 8] = *b"IGOFFS01";
/// Most consumers one partition tracks (bounds the file and the decode allocation).
pub const CONSUMERS_MAX: usize = 1 << 20;

/// Encodes a table.
pub fn encode(offsets: &BTreeMap<u64, u64>) -> Vec<u8> {
    assert!(offsets.len() <= CONSUMERS_MAX);
    let mut bytes = Vec::with_capacity(12 + offsets.len() * 16 + 8);
    bytes.extend_from_slice(&OFFSETS_MAGIC);
    bytes.extend_from_slice(&(offsets.len() as u32).to_le_bytes());
    for (consumer, offset) in offsets {
        bytes.extend_from_slice(&consumer.to_le_bytes());
        bytes.extend_from_slice(&offset.to_le_bytes());
    }
    let checksum = xxh3_64(&bytes);
    bytes.extend_from_slice(&checksum.to_le_bytes());
    bytes
}

/// Decodes a table; `Err` names what is wrong.
pub fn decode(bytes: &[u8]) -> std::result::Result<BTreeMap<u64, u64>, &'static str> {
    let body_len = bytes
        .len()
        .checked_sub(8)
        .ok_or("shorter than its checksum")?;
    let (body, trailer) = bytes.split_at(body_len);
    let stored = u64::from_le_bytes(trailer.try_into().map_err(|_| "short checksum")?);
    if xxh3_64(body) != stored {
        return Err("checksum mismatch");
    }
    if body.get(..8) != Some(&OFFSETS_MAGIC[..]) {
        return Err("bad magic");
    }
    let count = u32::from_le_bytes(
        body.get(8..12)
            .ok_or("short header")?
            .try_into()
            .map_err(|_| "short header")?,
    ) as usize;
    if count > CONSUMERS_MAX || body.len() != 12 + count * 16 {
        return Err("entry count does not match the file length");
    }
    let mut offsets = BTreeMap::new();
    for entry in body[12..].chunks_exact(16) {
        let consumer = u64::from_le_bytes(entry[..8].try_into().map_err(|_| "short entry")?);
        let offset = u64::from_le_bytes(entry[8..].try_into().map_err(|_| "short entry")?);
        if offsets.insert(consumer, offset).is_some() {
            return Err("duplicate consumer");
        }
    }
    Ok(offsets)
}

/// The consumer-offset table of one partition.
pub struct ConsumerOffsets {
    path: PathBuf,
    offsets: BTreeMap<u64, u64>,
    schedule: SyncSchedule,
}

impl ConsumerOffsets {
    /// Opens the table at `path` (empty if the file does not exist yet).
    pub fn open(path: &Path, durability: Durability) -> Result<ConsumerOffsets> {
        let offsets = match std::fs::read(path) {
            Ok(bytes) => decode(&bytes).map_err(|reason| JournalError::Format {
                path: path.into(),
                reason,
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(JournalError::io("read", path, e)),
        };
        Ok(ConsumerOffsets {
            path: path.into(),
            offsets,
            schedule: SyncSchedule::new(durability),
        })
    }

    /// The stored offset of `consumer`.
    pub fn get(&self, consumer: u64) -> Option<u64> {
        self.offsets.get(&consumer).copied()
    }

    /// Every consumer and its offset.
    pub fn all(&self) -> &BTreeMap<u64, u64> {
        &self.offsets
    }

    /// Stores `offset` for `consumer`. Returns whether it is on stable storage now.
    pub fn store(&mut self, consumer: u64, offset: u64) -> Result<bool> {
        if !self.offsets.contains_key(&consumer) && self.offsets.len() >= CONSUMERS_MAX {
            return Err(JournalError::Config {
                key: "consumers",
                value: CONSUMERS_MAX as u64,
                rule: "a partition tracks at most CONSUMERS_MAX consumers",
            });
        }
        self.offsets.insert(consumer, offset);
        self.after_change()
    }

    /// Deletes `consumer`'s offset. Returns whether the change is on stable storage now.
    pub fn delete(&mut self, consumer: u64) -> Result<bool> {
        if self.offsets.remove(&consumer).is_none() {
            return Ok(!self.schedule.is_dirty());
        }
        self.after_change()
    }

    fn after_change(&mut self) -> Result<bool> {
        if self.schedule.written(Instant::now()) {
            self.flush()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Persists if the interval policy says it is due. Returns whether it did.
    pub fn tick(&mut self) -> Result<bool> {
        // A clean table (every idle partition) is not due: no clock read.
        if self.schedule.is_dirty() && self.schedule.due(Instant::now()) {
            self.flush()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether the table has changes not yet on stable storage.
    pub fn is_dirty(&self) -> bool {
        self.schedule.is_dirty()
    }

    /// Writes the table and forces it to stable storage (whatever the policy).
    pub fn flush(&mut self) -> Result<()> {
        let tmp = self.path.with_extension("tmp");
        let bytes = encode(&self.offsets);
        let mut file =
            std::fs::File::create(&tmp).map_err(|e| JournalError::io("create", &tmp, e))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_data())
            .map_err(|e| JournalError::io("write", &tmp, e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| JournalError::io("rename", &tmp, e))?;
        sync_parent_dir(&self.path)?;
        self.schedule.synced();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_round_trips_and_any_flip_is_rejected() {
        let table: BTreeMap<u64, u64> = [(1, 10), (7, 70), (u64::MAX, 3)].into();
        let bytes = encode(&table);
        assert_eq!(decode(&bytes), Ok(table));
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x02;
            assert!(decode(&bad).is_err(), "flip at {at} accepted");
        }
        assert!(decode(&bytes[..bytes.len() - 3]).is_err());
    }

    #[test]
    fn every_policy_persists_each_store_and_none_waits_for_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(OFFSETS_FILE);
        let mut every = ConsumerOffsets::open(&path, Durability::EveryBatch).unwrap();
        assert!(!every.is_dirty());
        assert!(every.store(4, 40).unwrap());
        assert!(!every.is_dirty(), "stored and synced at once");
        assert_eq!(
            ConsumerOffsets::open(&path, Durability::None)
                .unwrap()
                .get(4),
            Some(40)
        );

        let mut lazy = ConsumerOffsets::open(&path, Durability::None).unwrap();
        assert!(!lazy.is_dirty());
        assert!(!lazy.store(4, 41).unwrap());
        assert!(lazy.is_dirty(), "a change waits for a flush");
        assert_eq!(
            ConsumerOffsets::open(&path, Durability::None)
                .unwrap()
                .get(4),
            Some(40)
        );
        lazy.flush().unwrap();
        assert!(!lazy.is_dirty());
        assert_eq!(
            ConsumerOffsets::open(&path, Durability::None)
                .unwrap()
                .get(4),
            Some(41)
        );
    }

    #[test]
    fn corrupt_offsets_file_is_an_error_not_an_empty_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(OFFSETS_FILE);
        let mut bytes = encode(&[(1, 2)].into());
        bytes[13] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert!(matches!(
            ConsumerOffsets::open(&path, Durability::EveryBatch),
            Err(JournalError::Format { .. })
        ));
    }
}
