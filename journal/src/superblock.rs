//! The superblock: view, log_view, commit, checkpoint op and identity, in
//! `SUPERBLOCK_COPIES` copies with a sequence number. Each write bumps the sequence and
//! rewrites the copies one at a time, each durable before the next, so a crash tears at
//! most one copy and every other copy is a complete old or new state. The newest valid
//! copy wins. Decoding is sans-IO.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::io::{DmaFile, OpenOptions};
use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64;

use crate::error::{JournalError, Result};
use crate::journal::{sync_parent_dir, write_all};
use crate::layout::SECTOR_SIZE;

/// File name of the superblock inside a data directory.
pub const SUPERBLOCK_FILE: &str = "superblock";
/// Copies written; any one valid copy suffices.
pub const SUPERBLOCK_COPIES: u64 = 4;
/// Magic at the start of each copy.
pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"IGSUPER1";
/// Format version.
pub const SUPERBLOCK_VERSION: u32 = 1;
/// Bytes of the encoded record (the rest of each copy's sector is zero).
pub const SUPERBLOCK_RECORD_SIZE: usize = 256;
const CHECKSUM_AT: usize = SUPERBLOCK_RECORD_SIZE - 8;

const _: () = assert!(SUPERBLOCK_COPIES >= 2 && SUPERBLOCK_RECORD_SIZE as u64 <= SECTOR_SIZE);

/// The durable replica state that survives restarts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Superblock {
    /// Bumped by every write; the newest valid copy wins.
    pub sequence: u64,
    /// blake3-derived cluster id (docs/protocol.md, "Header layouts").
    #[serde(serialize_with = "crate::inspect::u128_string")]
    pub cluster: u128,
    pub replica: u8,
    pub replica_count: u8,
    pub view: u32,
    /// The view in which this replica was last in normal status.
    pub log_view: u32,
    pub commit: u64,
    /// The op the latest snapshot covers; the journal needs only ops above it.
    pub op_checkpoint: u64,
    /// XxHash3-64 of the snapshot file at `op_checkpoint` (0 before the first).
    pub snapshot_checksum: u64,
    /// Length in bytes of that snapshot file.
    pub snapshot_len: u64,
}

/// Why a copy was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyFault {
    Zero,
    Short,
    Magic,
    Checksum,
    Version,
    /// The copy verifies but names another copy index: a misdirected write.
    Misdirected {
        copy: u32,
    },
    /// Verifies but breaks a field rule (log_view > view, commit < checkpoint).
    Fields,
}

/// One copy as found on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CopyReport {
    pub copy: u64,
    pub sequence: Option<u64>,
    pub fault: Option<CopyFault>,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}

/// Encodes `superblock` as copy `copy` into a sector-sized buffer.
pub fn encode(superblock: &Superblock, copy: u64, sector: &mut [u8]) {
    assert!(sector.len() >= SUPERBLOCK_RECORD_SIZE && copy < SUPERBLOCK_COPIES);
    sector.fill(0);
    sector[0..8].copy_from_slice(&SUPERBLOCK_MAGIC);
    sector[8..12].copy_from_slice(&SUPERBLOCK_VERSION.to_le_bytes());
    sector[12..16].copy_from_slice(&(copy as u32).to_le_bytes());
    sector[16..24].copy_from_slice(&superblock.sequence.to_le_bytes());
    sector[24..40].copy_from_slice(&superblock.cluster.to_le_bytes());
    sector[40] = superblock.replica;
    sector[41] = superblock.replica_count;
    sector[44..48].copy_from_slice(&superblock.view.to_le_bytes());
    sector[48..52].copy_from_slice(&superblock.log_view.to_le_bytes());
    sector[56..64].copy_from_slice(&superblock.commit.to_le_bytes());
    sector[64..72].copy_from_slice(&superblock.op_checkpoint.to_le_bytes());
    sector[72..80].copy_from_slice(&superblock.snapshot_checksum.to_le_bytes());
    sector[80..88].copy_from_slice(&superblock.snapshot_len.to_le_bytes());
    let checksum = xxh3_64(&sector[..CHECKSUM_AT]);
    sector[CHECKSUM_AT..SUPERBLOCK_RECORD_SIZE].copy_from_slice(&checksum.to_le_bytes());
}

/// Decodes copy `copy` from its sector.
pub fn decode(bytes: &[u8], copy: u64) -> std::result::Result<Superblock, CopyFault> {
    let record = bytes
        .get(..SUPERBLOCK_RECORD_SIZE)
        .ok_or(CopyFault::Short)?;
    if record.iter().all(|b| *b == 0) {
        return Err(CopyFault::Zero);
    }
    if record[0..8] != SUPERBLOCK_MAGIC {
        return Err(CopyFault::Magic);
    }
    if xxh3_64(&record[..CHECKSUM_AT]) != u64_at(record, CHECKSUM_AT) {
        return Err(CopyFault::Checksum);
    }
    if u32_at(record, 8) != SUPERBLOCK_VERSION {
        return Err(CopyFault::Version);
    }
    let found = u32_at(record, 12);
    if u64::from(found) != copy {
        return Err(CopyFault::Misdirected { copy: found });
    }
    let superblock = Superblock {
        sequence: u64_at(record, 16),
        cluster: u128::from_le_bytes(record[24..40].try_into().unwrap_or([0; 16])),
        replica: record[40],
        replica_count: record[41],
        view: u32_at(record, 44),
        log_view: u32_at(record, 48),
        commit: u64_at(record, 56),
        op_checkpoint: u64_at(record, 64),
        snapshot_checksum: u64_at(record, 72),
        snapshot_len: u64_at(record, 80),
    };
    if superblock.log_view > superblock.view || superblock.commit < superblock.op_checkpoint {
        return Err(CopyFault::Fields);
    }
    Ok(superblock)
}

/// Picks the newest valid copy from a whole superblock file image.
pub fn decode_copies(image: &[u8]) -> (Option<Superblock>, Vec<CopyReport>) {
    let mut newest: Option<Superblock> = None;
    let mut reports = Vec::new();
    for copy in 0..SUPERBLOCK_COPIES {
        let at = (copy * SECTOR_SIZE) as usize;
        let sector = image.get(at..at + SECTOR_SIZE as usize).unwrap_or(&[]);
        match decode(sector, copy) {
            Ok(found) => {
                reports.push(CopyReport {
                    copy,
                    sequence: Some(found.sequence),
                    fault: None,
                });
                if newest.is_none_or(|n| found.sequence > n.sequence) {
                    newest = Some(found);
                }
            }
            Err(fault) => reports.push(CopyReport {
                copy,
                sequence: None,
                fault: Some(fault),
            }),
        }
    }
    (newest, reports)
}

/// Reads the superblock at `path` with plain IO (tools, and `SuperblockFile::open`).
pub fn read(path: &Path) -> Result<(Superblock, Vec<CopyReport>)> {
    let image = std::fs::read(path).map_err(|e| JournalError::io("read", path, e))?;
    match decode_copies(&image) {
        (Some(superblock), reports) => Ok((superblock, reports)),
        (None, _) => Err(JournalError::SuperblockLost { path: path.into() }),
    }
}

/// The open superblock file; each copy is written with direct IO and fdatasync'd.
pub struct SuperblockFile {
    path: PathBuf,
    file: DmaFile,
    current: Superblock,
}

impl SuperblockFile {
    /// Creates the file (which must not exist) holding `initial` at sequence 1.
    pub async fn create(path: &Path, initial: Superblock) -> Result<SuperblockFile> {
        let file = open(path, true).await?;
        let mut superblock = SuperblockFile {
            path: path.into(),
            file,
            current: Superblock::default(),
        };
        superblock
            .write_copies(Superblock {
                sequence: 1,
                ..initial
            })
            .await?;
        sync_parent_dir(path)?;
        Ok(superblock)
    }

    /// Opens the file and takes its newest valid copy.
    pub async fn open(path: &Path) -> Result<SuperblockFile> {
        let (current, _) = read(path)?;
        let file = open(path, false).await?;
        Ok(SuperblockFile {
            path: path.into(),
            file,
            current,
        })
    }

    /// The state last written (or read).
    pub fn current(&self) -> &Superblock {
        &self.current
    }

    /// Durably replaces the state with `next` (its `sequence` is assigned here).
    /// View, log_view, commit and checkpoint never go backwards: a caller that tries is
    /// a bug.
    pub async fn write(&mut self, next: Superblock) -> Result<()> {
        let old = self.current;
        assert!(next.view >= old.view, "view regressed");
        assert!(next.log_view >= old.log_view, "log_view regressed");
        assert!(next.commit >= old.commit, "commit regressed");
        assert!(
            next.op_checkpoint >= old.op_checkpoint,
            "checkpoint regressed"
        );
        assert!(next.log_view <= next.view && next.op_checkpoint <= next.commit);
        self.write_copies(Superblock {
            sequence: old.sequence + 1,
            ..next
        })
        .await
    }

    async fn write_copies(&mut self, next: Superblock) -> Result<()> {
        for copy in 0..SUPERBLOCK_COPIES {
            let mut buffer = self.file.alloc_dma_buffer(SECTOR_SIZE as usize);
            encode(&next, copy, buffer.as_bytes_mut());
            write_all(&self.file, &self.path, Rc::new(buffer), copy * SECTOR_SIZE).await?;
            // This copy is durable before the next one is touched.
            self.file
                .fdatasync()
                .await
                .map_err(|e| JournalError::io("fdatasync", &self.path, e))?;
        }
        self.current = next;
        Ok(())
    }

    /// Closes the file.
    pub async fn close(self) -> Result<()> {
        self.file
            .close()
            .await
            .map_err(|e| JournalError::io("close", &self.path, e))
    }
}

async fn open(path: &Path, create: bool) -> Result<DmaFile> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(create)
        .dma_open(path)
        .await
        .map_err(|e| JournalError::io("open (O_DIRECT)", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(sequence: u64) -> Superblock {
        Superblock {
            sequence,
            cluster: 0xABCD,
            replica: 1,
            replica_count: 3,
            view: 7,
            log_view: 6,
            commit: 100,
            op_checkpoint: 64,
            snapshot_checksum: 0x1234,
            snapshot_len: 4096,
        }
    }

    fn image(copies: &[Superblock]) -> Vec<u8> {
        let mut image = vec![0; (SUPERBLOCK_COPIES * SECTOR_SIZE) as usize];
        for (copy, sb) in copies.iter().enumerate() {
            let at = copy * SECTOR_SIZE as usize;
            encode(sb, copy as u64, &mut image[at..at + SECTOR_SIZE as usize]);
        }
        image
    }

    #[test]
    fn newest_valid_copy_wins() {
        let image = image(&[sample(5), sample(6), sample(5), sample(5)]);
        let (found, reports) = decode_copies(&image);
        assert_eq!(found.map(|s| s.sequence), Some(6));
        assert!(reports.iter().all(|r| r.fault.is_none()));
    }

    #[test]
    fn torn_newest_copy_falls_back_to_the_previous_state() {
        let mut image = image(&[sample(6), sample(5), sample(5), sample(5)]);
        image[100] ^= 0xFF;
        let (found, reports) = decode_copies(&image);
        assert_eq!(found.map(|s| s.sequence), Some(5));
        assert_eq!(reports[0].fault, Some(CopyFault::Checksum));
    }

    #[test]
    fn every_single_byte_flip_is_detected() {
        let clean = image(&[sample(5)]);
        for at in 0..SUPERBLOCK_RECORD_SIZE {
            let mut bad = clean.clone();
            bad[at] ^= 0x01;
            assert!(
                decode(&bad[..SECTOR_SIZE as usize], 0).is_err(),
                "flip at {at} accepted"
            );
        }
    }

    #[test]
    fn copy_written_to_the_wrong_sector_is_misdirected() {
        let mut image = image(&[sample(5), sample(5)]);
        let first = image[..SECTOR_SIZE as usize].to_vec();
        image[SECTOR_SIZE as usize..2 * SECTOR_SIZE as usize].copy_from_slice(&first);
        let (_, reports) = decode_copies(&image);
        assert_eq!(reports[1].fault, Some(CopyFault::Misdirected { copy: 0 }));
    }

    #[test]
    fn all_copies_bad_means_lost() {
        let image = vec![0xEE; (SUPERBLOCK_COPIES * SECTOR_SIZE) as usize];
        assert_eq!(decode_copies(&image).0, None);
    }
}
