//! Checkpoints: the metadata state machine's state, snapshotted at a commit op into a
//! whole file with a checksum, so the journal can wrap and never grows without bound.
//! Snapshot files are the METADATA_SNAPSHOT artifacts state transfer ships: the manifest
//! entry's `len` and `checksum` are the file's length and XxHash3-64 of the whole file.
//!
//! File: `[magic "IGSNAP01"][op u64][payload_len u64][payload][xxh3-64 of all before]`.
//!
//! A checkpoint is made in an order that survives a crash at any step: write the
//! snapshot durably under a temporary name and rename it; write the superblock naming it
//! (op, length, checksum); tell the journal; only then delete older snapshots.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64;

use crate::error::{JournalError, Result};
use crate::journal::{sync_parent_dir, Journal};
use crate::superblock::{Superblock, SuperblockFile};

/// Magic at the start of a snapshot file.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"IGSNAP01";
/// Bytes before the payload.
pub const SNAPSHOT_HEADER_SIZE: usize = 24;
/// Largest payload accepted (bounds the read allocation).
pub const SNAPSHOT_PAYLOAD_MAX: u64 = 4 << 30;

/// A snapshot file as the superblock and the state-transfer manifest describe it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SnapshotInfo {
    /// The commit op the snapshot is taken at (the manifest's `frontier`).
    pub op: u64,
    pub path: PathBuf,
    /// Whole-file length.
    pub len: u64,
    /// XxHash3-64 of the whole file.
    pub checksum: u64,
}

/// File name of the snapshot at `op`.
pub fn snapshot_file_name(op: u64) -> String {
    format!("snapshot-{op:020}.snap")
}

/// Encodes a snapshot file image.
pub fn encode(op: u64, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(SNAPSHOT_HEADER_SIZE + payload.len() + 8);
    bytes.extend_from_slice(&SNAPSHOT_MAGIC);
    bytes.extend_from_slice(&op.to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    bytes.extend_from_slice(payload);
    let checksum = xxh3_64(&bytes);
    bytes.extend_from_slice(&checksum.to_le_bytes());
    bytes
}

/// Decodes a snapshot image: `(op, payload)`, or why it is invalid.
pub fn decode(bytes: &[u8]) -> std::result::Result<(u64, &[u8]), &'static str> {
    let body_len = bytes
        .len()
        .checked_sub(8)
        .ok_or("shorter than its checksum")?;
    let (body, trailer) = bytes.split_at(body_len);
    let stored = u64::from_le_bytes(trailer.try_into().map_err(|_| "short checksum")?);
    if xxh3_64(body) != stored {
        return Err("checksum mismatch");
    }
    let header = body.get(..SNAPSHOT_HEADER_SIZE).ok_or("short header")?;
    if header[..8] != SNAPSHOT_MAGIC {
        return Err("bad magic");
    }
    let op = u64::from_le_bytes(header[8..16].try_into().map_err(|_| "short header")?);
    let len = u64::from_le_bytes(header[16..24].try_into().map_err(|_| "short header")?);
    if len > SNAPSHOT_PAYLOAD_MAX || body.len() as u64 != SNAPSHOT_HEADER_SIZE as u64 + len {
        return Err("payload length does not match the file");
    }
    Ok((op, &body[SNAPSHOT_HEADER_SIZE..]))
}

/// Writes the snapshot at `op` into `dir` durably (temporary file, fsync, rename, fsync
/// of the directory).
pub fn write_snapshot(dir: &Path, op: u64, payload: &[u8]) -> Result<SnapshotInfo> {
    std::fs::create_dir_all(dir).map_err(|e| JournalError::io("create directory", dir, e))?;
    let path = dir.join(snapshot_file_name(op));
    let tmp = path.with_extension("tmp");
    let bytes = encode(op, payload);
    let mut file = std::fs::File::create(&tmp).map_err(|e| JournalError::io("create", &tmp, e))?;
    file.write_all(&bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| JournalError::io("write", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| JournalError::io("rename", &tmp, e))?;
    sync_parent_dir(&path)?;
    Ok(SnapshotInfo {
        op,
        path,
        len: bytes.len() as u64,
        checksum: xxh3_64(&bytes),
    })
}

/// Reads and verifies a snapshot file: `(info, payload)`.
pub fn read_snapshot(path: &Path) -> Result<(SnapshotInfo, Vec<u8>)> {
    let bytes = std::fs::read(path).map_err(|e| JournalError::io("read", path, e))?;
    let (op, payload) = decode(&bytes).map_err(|reason| JournalError::SnapshotInvalid {
        path: path.into(),
        reason,
    })?;
    let info = SnapshotInfo {
        op,
        path: path.into(),
        len: bytes.len() as u64,
        checksum: xxh3_64(&bytes),
    };
    Ok((info, payload.to_vec()))
}

/// Loads the snapshot the superblock names (`None` before the first checkpoint),
/// verifying op, length and checksum against it.
pub fn load_checkpoint(
    dir: &Path,
    superblock: &Superblock,
) -> Result<Option<(SnapshotInfo, Vec<u8>)>> {
    if superblock.op_checkpoint == 0 && superblock.snapshot_len == 0 {
        return Ok(None);
    }
    let path = dir.join(snapshot_file_name(superblock.op_checkpoint));
    let (info, payload) = read_snapshot(&path)?;
    if info.op != superblock.op_checkpoint
        || info.len != superblock.snapshot_len
        || info.checksum != superblock.snapshot_checksum
    {
        return Err(JournalError::SnapshotInvalid {
            path,
            reason: "snapshot does not match the superblock",
        });
    }
    Ok(Some((info, payload)))
}

/// Takes a checkpoint at commit op `op` with the state machine's serialized `state`:
/// snapshot, superblock, journal, then removal of older snapshots.
pub async fn checkpoint(
    dir: &Path,
    superblock: &mut SuperblockFile,
    journal: &mut Journal,
    op: u64,
    state: &[u8],
) -> Result<SnapshotInfo> {
    let current = *superblock.current();
    if op <= current.op_checkpoint || op > journal.op_head() {
        return Err(JournalError::CheckpointInvalid {
            op,
            reason: "must be above the last checkpoint and at most the journal head",
        });
    }
    if journal.faulty().any(|faulty| faulty <= op) {
        return Err(JournalError::CheckpointInvalid {
            op,
            reason: "ops at or below it are still faulty",
        });
    }
    record(dir, superblock, journal, op, state).await
}

/// Installs a snapshot received by state transfer at commit op `op`, which may lie
/// beyond the journal's head: snapshot, superblock, then the journal moves its checkpoint
/// there (prepares above `op` that it already holds are kept: they may be promises).
/// A crash before the superblock write leaves the old checkpoint in force.
pub async fn install(
    dir: &Path,
    superblock: &mut SuperblockFile,
    journal: &mut Journal,
    op: u64,
    state: &[u8],
) -> Result<SnapshotInfo> {
    let current = *superblock.current();
    if op <= current.op_checkpoint {
        return Err(JournalError::CheckpointInvalid {
            op,
            reason: "an installed snapshot must be above the last checkpoint",
        });
    }
    record(dir, superblock, journal, op, state).await
}

/// Writes the snapshot, then the superblock naming it (the step that makes it count),
/// then moves the journal's checkpoint and removes older snapshots.
async fn record(
    dir: &Path,
    superblock: &mut SuperblockFile,
    journal: &mut Journal,
    op: u64,
    state: &[u8],
) -> Result<SnapshotInfo> {
    let current = *superblock.current();
    let info = write_snapshot(dir, op, state)?;
    superblock
        .write(Superblock {
            commit: current.commit.max(op),
            op_checkpoint: op,
            snapshot_checksum: info.checksum,
            snapshot_len: info.len,
            ..current
        })
        .await?;
    journal.set_checkpoint(op)?;
    remove_snapshots_before(dir, op)?;
    Ok(info)
}

/// Deletes snapshot files (and leftover temporaries) older than `op`.
pub fn remove_snapshots_before(dir: &Path, op: u64) -> Result<usize> {
    let mut removed = 0;
    let entries = std::fs::read_dir(dir).map_err(|e| JournalError::io("list", dir, e))?;
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("snapshot-") else {
            continue;
        };
        let digits = rest.trim_end_matches(".snap").trim_end_matches(".tmp");
        if digits.parse::<u64>().is_ok_and(|found| found < op) {
            let path = entry.path();
            std::fs::remove_file(&path).map_err(|e| JournalError::io("remove", &path, e))?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_round_trips_and_rejects_every_flip() {
        let bytes = encode(77, b"state machine bytes");
        assert_eq!(decode(&bytes), Ok((77, &b"state machine bytes"[..])));
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x20;
            assert!(decode(&bad).is_err(), "flip at {at} accepted");
        }
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn written_snapshot_checksum_is_the_whole_file_hash() {
        let dir = tempfile::tempdir().unwrap();
        let info = write_snapshot(dir.path(), 9, b"abc").unwrap();
        let bytes = std::fs::read(&info.path).unwrap();
        assert_eq!(
            (info.len, info.checksum),
            (bytes.len() as u64, xxh3_64(&bytes))
        );
        let (read, payload) = read_snapshot(&info.path).unwrap();
        assert_eq!((read, payload), (info, b"abc".to_vec()));
    }
}
