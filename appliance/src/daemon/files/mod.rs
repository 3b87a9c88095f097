//! Small durable side files of a data directory that the journal crate does not own:
//! the genesis metadata state written at format (the root user), and the VSR superblock
//! suffix headers (vsr::Superblock carries the log_view's suffix, which the journal
//! superblock has no room for). The side files are XxHash3-64 trailed, written to a
//! temporary name, fsync'd, renamed and the directory fsync'd before they are trusted;
//! the VSR superblock instead keeps two slots written in turn in place
//! (`vsr_superblock.rs`), and many groups' superblocks share one sync (`round.rs`).

use std::fs::File;
use std::io::Write;
use std::path::Path;

/// The metadata state a freshly formatted cluster starts from.
pub const GENESIS_FILE: &str = "metadata-genesis";
/// view, log_view and suffix headers of the metadata group.
pub const VSR_SUPERBLOCK_FILE: &str = "vsr-superblock";

/// A partition group's checkpoint: commit op, stamp position and client table.
pub const CHECKPOINT_FILE: &str = "vsr-checkpoint";

const MAGIC_GENESIS: &[u8; 4] = b"AGN1";
const MAGIC_CHECKPOINT: &[u8; 4] = b"ACP1";
const MAGIC_VSR: &[u8; 4] = b"AVS1";
const MAGIC_CLIENT_TABLE: &[u8; 4] = b"ACT1";
/// The metadata op up to which this node's metadata group applied ops before it voted
/// again after losing its state (node.rs, `partition_replica`).
pub const REPLACED_UPTO_FILE: &str = "metadata-replaced-upto";
const MAGIC_REPLACED_UPTO: &[u8; 4] = b"ARU1";
/// The suffix never exceeds the DVC bitset width.
const SUFFIX_HEADERS_MAX: usize = replication::vsr::SUFFIX_MAX;

mod round;
mod vsr_superblock;

pub use round::{write_round, RoundWrite, SharedSync};
pub use vsr_superblock::{
    create_vsr_superblock, read_vsr_superblock, write_vsr_superblock, write_vsr_superblock_unsynced,
};

/// Why a side file could not be read or written.
#[derive(Debug)]
pub enum FileError {
    Io { path: String, error: std::io::Error },
    Corrupt { path: String, reason: &'static str },
}

impl FileError {
    /// The same error again (one failed sync fails every write it was to cover), with
    /// its OS code when it has one (a full disk is read from it).
    pub fn duplicate(&self) -> FileError {
        match self {
            FileError::Io { path, error } => FileError::Io {
                path: path.clone(),
                error: match error.raw_os_error() {
                    Some(code) => std::io::Error::from_raw_os_error(code),
                    None => std::io::Error::new(error.kind(), error.to_string()),
                },
            },
            FileError::Corrupt { path, reason } => FileError::Corrupt {
                path: path.clone(),
                reason,
            },
        }
    }
}

impl core::fmt::Display for FileError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FileError::Io { path, error } => write!(f, "{path}: {error}"),
            FileError::Corrupt { path, reason } => write!(f, "{path} is corrupt: {reason}"),
        }
    }
}

impl std::error::Error for FileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FileError::Io { error, .. } => Some(error),
            FileError::Corrupt { .. } => None,
        }
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> FileError + '_ {
    move |error| FileError::Io {
        path: path.display().to_string(),
        error,
    }
}

fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// Writes `payload` under `magic` durably: temp file, fsync, rename, fsync directory.
fn write_durable(path: &Path, magic: &[u8; 4], payload: &[u8]) -> Result<(), FileError> {
    replace_file(path, &framed(magic, payload))
}

/// `payload` under `magic` with its checksum trailer, as `read_checked` reads it.
fn framed(magic: &[u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(payload.len() + 12);
    bytes.extend_from_slice(magic);
    bytes.extend_from_slice(payload);
    let sum = checksum(&bytes);
    bytes.extend_from_slice(&sum.to_le_bytes());
    bytes
}

/// Reads a file written by `write_durable`; None when it does not exist.
fn read_checked(path: &Path, magic: &[u8; 4]) -> Result<Option<Vec<u8>>, FileError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path)(e)),
    };
    let corrupt = |reason| FileError::Corrupt {
        path: path.display().to_string(),
        reason,
    };
    if bytes.len() < 12 || &bytes[..4] != magic {
        return Err(corrupt("bad magic or too short"));
    }
    let (content, trailer) = bytes.split_at(bytes.len() - 8);
    let mut sum = [0u8; 8];
    sum.copy_from_slice(trailer);
    if checksum(content) != u64::from_le_bytes(sum) {
        return Err(corrupt("checksum mismatch"));
    }
    Ok(Some(content[4..].to_vec()))
}

/// Records the metadata op up to which partition groups created here count as lost
/// with the node's state.
pub fn write_replaced_upto(dir: &Path, op: u64) -> Result<(), FileError> {
    write_durable(
        &dir.join(REPLACED_UPTO_FILE),
        MAGIC_REPLACED_UPTO,
        &op.to_le_bytes(),
    )
}

/// The op `write_replaced_upto` stored (0 when never written).
pub fn read_replaced_upto(dir: &Path) -> Result<u64, FileError> {
    let path = dir.join(REPLACED_UPTO_FILE);
    match read_checked(&path, MAGIC_REPLACED_UPTO)? {
        None => Ok(0),
        Some(bytes) => <[u8; 8]>::try_from(bytes.as_slice())
            .map(u64::from_le_bytes)
            .map_err(|_| FileError::Corrupt {
                path: path.display().to_string(),
                reason: "not an op number",
            }),
    }
}

/// Writes the genesis metadata state (format only).
pub fn write_genesis(dir: &Path, state: &[u8]) -> Result<(), FileError> {
    write_durable(&dir.join(GENESIS_FILE), MAGIC_GENESIS, state)
}

/// The genesis metadata state; an error when missing (the directory is not ours).
pub fn read_genesis(dir: &Path) -> Result<Vec<u8>, FileError> {
    let path = dir.join(GENESIS_FILE);
    read_checked(&path, MAGIC_GENESIS)?.ok_or(FileError::Corrupt {
        path: path.display().to_string(),
        reason: "missing (format the directory with `appliance format`)",
    })
}

/// A partition group's checkpoint as stored: the commit op its segment log and offsets
/// reflect, the stamp position after it, and the encoded client table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredCheckpoint {
    pub op: u64,
    pub position: replication::wire::batch::PartitionPosition,
    pub clients: Vec<u8>,
}

/// Persists a partition group's checkpoint durably (replacing the previous one).
pub fn write_checkpoint(dir: &Path, checkpoint: &StoredCheckpoint) -> Result<(), FileError> {
    replace_file(
        &dir.join(CHECKPOINT_FILE),
        &checkpoint_file_bytes(checkpoint),
    )
}

/// Writes a partition group's checkpoint beside its file, unsynced, for a round of
/// checkpoints that shares its syncs: once a `SharedSync` made every staged
/// checkpoint durable, `commit_staged_checkpoint` renames each over its file, and a
/// second sync makes the renames durable. A crash anywhere in between leaves the
/// previous checkpoint (a leftover staged file is overwritten by the next one).
pub fn stage_checkpoint(dir: &Path, checkpoint: &StoredCheckpoint) -> Result<(), FileError> {
    let temp = dir.join(CHECKPOINT_FILE).with_extension("tmp");
    let mut file = File::create(&temp).map_err(io(&temp))?;
    file.write_all(&checkpoint_file_bytes(checkpoint))
        .map_err(io(&temp))
}

/// Renames a staged checkpoint (`stage_checkpoint`) over the partition's checkpoint.
pub fn commit_staged_checkpoint(dir: &Path) -> Result<(), FileError> {
    let path = dir.join(CHECKPOINT_FILE);
    std::fs::rename(path.with_extension("tmp"), &path).map_err(io(&path))
}

fn checkpoint_file_bytes(checkpoint: &StoredCheckpoint) -> Vec<u8> {
    let mut payload = Vec::with_capacity(32 + checkpoint.clients.len());
    payload.extend_from_slice(&checkpoint.op.to_le_bytes());
    payload.extend_from_slice(&checkpoint.position.partition_id.to_le_bytes());
    payload.extend_from_slice(&checkpoint.position.next_offset.to_le_bytes());
    payload.extend_from_slice(&checkpoint.position.last_timestamp.to_le_bytes());
    payload.extend_from_slice(&checkpoint.clients);
    framed(MAGIC_CHECKPOINT, &payload)
}

/// The partition group's checkpoint, or None when none was taken yet.
pub fn read_checkpoint(dir: &Path) -> Result<Option<StoredCheckpoint>, FileError> {
    let path = dir.join(CHECKPOINT_FILE);
    let Some(payload) = read_checked(&path, MAGIC_CHECKPOINT)? else {
        return Ok(None);
    };
    if payload.len() < 32 {
        return Err(FileError::Corrupt {
            path: path.display().to_string(),
            reason: "checkpoint shorter than its fixed fields",
        });
    }
    let u64_at = |at: usize| u64::from_le_bytes(payload[at..at + 8].try_into().unwrap_or([0; 8]));
    Ok(Some(StoredCheckpoint {
        op: u64_at(0),
        position: replication::wire::batch::PartitionPosition {
            partition_id: u64_at(8),
            next_offset: u64_at(16),
            last_timestamp: u64_at(24),
        },
        clients: payload[32..].to_vec(),
    }))
}

/// Writes `bytes` to a temporary name, syncs it, renames it to `path` and syncs the
/// directory: the file is never seen half written.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    let temp = path.with_extension("tmp");
    let mut file = File::create(&temp).map_err(io(&temp))?;
    file.write_all(bytes).map_err(io(&temp))?;
    file.sync_all().map_err(io(&temp))?;
    drop(file);
    std::fs::rename(&temp, path).map_err(io(path))?;
    sync_dir_of(path)
}

fn sync_dir_of(path: &Path) -> Result<(), FileError> {
    match path.parent() {
        Some(dir) => File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir)),
        None => Ok(()),
    }
}

/// Appends each part with its length (u32, little-endian) in front.
fn push_prefixed(out: &mut Vec<u8>, parts: &[&[u8]]) {
    for part in parts {
        out.extend_from_slice(&(part.len() as u32).to_le_bytes());
        out.extend_from_slice(part);
    }
}

/// Splits `bytes` into exactly N length-prefixed parts (`push_prefixed`): `truncated`
/// when one runs past the end, `trailing` when bytes are left over.
fn split_prefixed<'a, const N: usize>(
    bytes: &'a [u8],
    truncated: &'static str,
    trailing: &'static str,
) -> Result<[&'a [u8]; N], &'static str> {
    let mut parts = [&[][..]; N];
    let mut rest = bytes;
    for part in &mut parts {
        let len = rest
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or(truncated)? as usize;
        *part = rest.get(4..4 + len).ok_or(truncated)?;
        rest = &rest[4 + len..];
    }
    if !rest.is_empty() {
        return Err(trailing);
    }
    Ok(parts)
}

/// The metadata group's checkpoint payload (inside a journal snapshot file, which
/// checksums it): the state machine, the client table and the committed prepare of the
/// checkpoint op (the hash-chain anchor), each length-prefixed.
pub fn encode_metadata_checkpoint(state: &[u8], clients: &[u8], anchor: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + state.len() + clients.len() + anchor.len());
    push_prefixed(&mut out, &[state, clients, anchor]);
    out
}

/// The parts of a metadata checkpoint: state, client table, anchor prepare.
pub type MetadataCheckpointParts<'a> = (&'a [u8], &'a [u8], &'a [u8]);

/// Splits `encode_metadata_checkpoint`'s bytes into (state, clients, anchor).
pub fn decode_metadata_checkpoint(
    bytes: &[u8],
) -> Result<MetadataCheckpointParts<'_>, &'static str> {
    let [state, clients, anchor] = split_prefixed(
        bytes,
        "metadata checkpoint truncated",
        "metadata checkpoint has trailing bytes",
    )?;
    Ok((state, clients, anchor))
}

/// A group's CLIENT_TABLE state-transfer artifact: the checkpoint it was taken at
/// (commit op, stamp position), the encoded client table and the committed prepare of
/// the op (the hash-chain anchor the receiver restarts from). docs/state-transfer.md
/// lists the layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientTableArtifact {
    pub op: u64,
    pub position: replication::wire::batch::PartitionPosition,
    pub clients: Vec<u8>,
    pub anchor: Vec<u8>,
}

impl ClientTableArtifact {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(48 + self.clients.len() + self.anchor.len());
        out.extend_from_slice(MAGIC_CLIENT_TABLE);
        out.extend_from_slice(&self.op.to_le_bytes());
        out.extend_from_slice(&self.position.partition_id.to_le_bytes());
        out.extend_from_slice(&self.position.next_offset.to_le_bytes());
        out.extend_from_slice(&self.position.last_timestamp.to_le_bytes());
        push_prefixed(&mut out, &[&self.clients, &self.anchor]);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<ClientTableArtifact, &'static str> {
        let rest = bytes
            .strip_prefix(&MAGIC_CLIENT_TABLE[..])
            .ok_or("client table artifact: bad magic")?;
        let u64_at = |at: usize| -> Result<u64, &'static str> {
            rest.get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or("client table artifact truncated")
        };
        let (op, partition_id, next_offset, last_timestamp) =
            (u64_at(0)?, u64_at(8)?, u64_at(16)?, u64_at(24)?);
        let [clients, anchor] = split_prefixed(
            &rest[32..],
            "client table artifact truncated",
            "client table artifact has trailing bytes",
        )?;
        Ok(ClientTableArtifact {
            op,
            position: replication::wire::batch::PartitionPosition {
                partition_id,
                next_offset,
                last_timestamp,
            },
            clients: clients.to_vec(),
            anchor: anchor.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests;
