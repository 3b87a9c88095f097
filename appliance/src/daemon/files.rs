//! Small durable side files of a data directory that the journal crate does not own:
//! the genesis metadata state written at format (the root user), and the VSR superblock
//! suffix headers (vsr::Superblock carries the log_view's suffix, which the journal
//! superblock has no room for). The side files are XxHash3-64 trailed, written to a
//! temporary name, fsync'd, renamed and the directory fsync'd before they are trusted;
//! the VSR superblock instead keeps two slots written in turn in place (below).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use replication::vsr::Superblock as VsrSuperblock;
use replication::wire::PrepareHeader;
use zerocopy::{FromBytes, IntoBytes};

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

/// Flag bits after the suffix headers of the VSR superblock file.
const VSR_FLAG_REPLACEMENT: u32 = 1;
/// Formatted, not yet known whether the cluster formed (`vsr::Superblock::unformed`).
const VSR_FLAG_UNFORMED: u32 = 2;

/// The VSR superblock file holds two slots, written in turn in place: a view change
/// costs one write and one `fdatasync`, not a temp file, its sync, a rename and the
/// directory's sync. Each slot is `MAGIC_VSR_SLOT`, a sequence number (u64), the payload
/// length (u32), the payload and an XxHash3-64 of all of it; the valid slot with the
/// higher sequence is the superblock. A write always goes to the slot that does not hold
/// the newest valid copy, so a torn or lost write leaves that copy (nothing was promised
/// on the new one before its sync returned).
const MAGIC_VSR_SLOT: &[u8; 4] = b"AVS2";
/// magic, sequence, payload length.
const VSR_SLOT_HEAD: usize = 16;
/// view, log_view, count, the largest suffix, flags.
const VSR_PAYLOAD_MAX: usize = 12 + SUFFIX_HEADERS_MAX * 256 + 4;
const VSR_SLOT_BLOCK: usize = 4096;
/// Room for the largest slot, in whole blocks, so a slot's write never shares a block
/// with the other slot.
const VSR_SLOT_SIZE: usize =
    (VSR_SLOT_HEAD + VSR_PAYLOAD_MAX + 8).div_ceil(VSR_SLOT_BLOCK) * VSR_SLOT_BLOCK;

/// Persists the VSR superblock (view, log_view, suffix headers, then a flags word whose
/// bit 0 marks a replacement that may not vote yet) durably: in place into the slot
/// not holding the newest valid copy, or as a whole new file when there is none.
pub fn write_vsr_superblock(dir: &Path, superblock: &VsrSuperblock) -> Result<(), FileError> {
    write_vsr_superblock_with(dir, superblock, true)
}

/// As `write_vsr_superblock`, but an in-place write is left to the caller's sync of the
/// whole file system (`SharedSync`): many groups' superblocks, one device flush.
/// A file written whole (the first write, or one replacing an unreadable file) is
/// still synced here.
pub fn write_vsr_superblock_unsynced(
    dir: &Path,
    superblock: &VsrSuperblock,
) -> Result<(), FileError> {
    write_vsr_superblock_with(dir, superblock, false)
}

/// One sync of a file system shared by a round of writes (syncfs: one journal commit
/// and one device flush for all of them).
pub struct SharedSync {
    handle: File,
    device: u64,
    path: String,
}

impl SharedSync {
    /// A sync of `dir`'s file system, opened before the writes it is to cover: the
    /// kernel reports a write-back error to a sync through a handle opened before the
    /// error, so one that struck a write before the sync is not missed.
    pub fn open(dir: &Path) -> Result<SharedSync, FileError> {
        let handle = File::open(dir).map_err(io(dir))?;
        let device = handle.metadata().map_err(io(dir))?;
        Ok(SharedSync {
            handle,
            device: std::os::unix::fs::MetadataExt::dev(&device),
            path: dir.display().to_string(),
        })
    }

    /// The file system's device: a directory on it is covered by the sync
    /// (`write_round`).
    pub fn device(&self) -> u64 {
        self.device
    }

    /// Forces every write so far on the file system to stable storage; fails when a
    /// write-back failed since the sync was opened.
    pub fn sync(&self) -> Result<(), FileError> {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid open descriptor; syncfs takes no pointers.
        if unsafe { libc::syncfs(self.handle.as_raw_fd()) } != 0 {
            return Err(FileError::Io {
                path: self.path.clone(),
                error: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }
}

/// Whether `dir` is on `device` (a directory on another file system syncs its own).
fn on_device(dir: &Path, device: u64) -> bool {
    std::fs::metadata(dir).is_ok_and(|m| std::os::unix::fs::MetadataExt::dev(&m) == device)
}

/// One file write of a round (`write_round`).
pub trait RoundWrite: Send + 'static {
    /// The directory the file is in.
    fn dir(&self) -> &Path;
    /// Writes the file: `covered`, to be made durable by the round's shared sync;
    /// otherwise durable on its own.
    fn write(&self, covered: bool) -> Result<(), FileError>;
}

/// A partition group's VSR superblock: written in place unsynced when covered.
impl RoundWrite for (u64, std::path::PathBuf, VsrSuperblock) {
    fn dir(&self) -> &Path {
        &self.1
    }

    fn write(&self, covered: bool) -> Result<(), FileError> {
        if covered {
            write_vsr_superblock_unsynced(&self.1, &self.2)
        } else {
            write_vsr_superblock(&self.1, &self.2)
        }
    }
}

/// Does the writes of a round on the blocking pool, every one in flight before the
/// first is awaited. A write whose directory is on `shared`'s file system is covered:
/// the caller makes it durable with that sync. Returns each write in order, whether it
/// is covered, and its outcome. Under a shared sync the writes only reach the page
/// cache, so they go `SHARED_CHUNK` to a blocking task (a task per write cost more in
/// hand-offs than the writes themselves); each write that syncs itself gets its own.
pub async fn write_round<W: RoundWrite>(
    writes: Vec<W>,
    shared: Option<&SharedSync>,
) -> Vec<(W, bool, Result<(), FileError>)> {
    let device = shared.map(SharedSync::device);
    let chunk = if shared.is_some() { SHARED_CHUNK } else { 1 };
    let mut chunks: Vec<Vec<W>> = Vec::new();
    for w in writes {
        match chunks.last_mut() {
            Some(last) if last.len() < chunk => last.push(w),
            _ => chunks.push(vec![w]),
        }
    }
    let tasks: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            glommio::spawn_local(glommio::executor().spawn_blocking(move || {
                chunk
                    .into_iter()
                    .map(|w| {
                        let covered = device.is_some_and(|device| on_device(w.dir(), device));
                        let written = w.write(covered);
                        (w, covered, written)
                    })
                    .collect::<Vec<_>>()
            }))
        })
        .collect();
    let mut done = Vec::new();
    for task in tasks {
        done.extend(task.await);
    }
    done
}

/// Writes a blocking task does in a round under a shared sync (`write_round`).
const SHARED_CHUNK: usize = 128;

fn write_vsr_superblock_with(
    dir: &Path,
    superblock: &VsrSuperblock,
    sync: bool,
) -> Result<(), FileError> {
    let payload = encode_vsr_superblock(superblock);
    let path = dir.join(VSR_SUPERBLOCK_FILE);
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return replace_file(&path, &vsr_slot(1, &payload));
        }
        Err(e) => return Err(io(&path)(e)),
    };
    let Some((slot, sequence, _)) = newest_vsr_slot(&file).map_err(io(&path))? else {
        // A file from before the slots (or one with no valid slot, which reading
        // refuses): replaced whole, so it stays readable until the new one is in place.
        drop(file);
        return replace_file(&path, &vsr_slot(1, &payload));
    };
    let target = 1 - slot;
    let bytes = vsr_slot(sequence + 1, &payload);
    file.write_all_at(&bytes, (target * VSR_SLOT_SIZE) as u64)
        .map_err(io(&path))?;
    if sync {
        file.sync_data().map_err(io(&path))?;
    }
    Ok(())
}

/// Writes the default superblock (view 0) into `dir` (created if absent) when it has
/// none, so the group's first view change writes in place like every later one. An
/// absent or empty file reads as the same value, so the file needs no sync of its own:
/// the first write into it syncs its data. A crash before then leaves it empty (or cut
/// short after its first block, which holds the whole first slot); a file system that
/// shows unwritten blocks as zeros leaves a file with no valid slot, which reads as
/// unreadable (the group rejoins as a replacement: slower, never unsafe). Its directory
/// entry must be durable before that first write: synced here when `sync_dir`, else by
/// the caller's next sync of `dir` (a new partition log's first segment) before the
/// group runs.
pub fn create_vsr_superblock(dir: &Path, sync_dir: bool) -> Result<(), FileError> {
    let path = dir.join(VSR_SUPERBLOCK_FILE);
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut file = match File::create_new(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(io(&path)(e)),
    };
    let payload = encode_vsr_superblock(&VsrSuperblock::default());
    file.write_all(&vsr_slot(1, &payload)).map_err(io(&path))?;
    // The second slot's first block is allocated too (zeros: no valid slot), so a view
    // change's write into it changes no file size or extent and its sync is data only.
    // The rest of the first slot stays a hole: 8 KiB on disk per file.
    file.write_all_at(&[0; VSR_SLOT_BLOCK], VSR_SLOT_SIZE as u64)
        .map_err(io(&path))?;
    if sync_dir {
        sync_dir_of(&path)?;
    }
    Ok(())
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

fn vsr_slot(sequence: u64, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(VSR_SLOT_HEAD + payload.len() + 8);
    bytes.extend_from_slice(MAGIC_VSR_SLOT);
    bytes.extend_from_slice(&sequence.to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(payload);
    let sum = checksum(&bytes);
    bytes.extend_from_slice(&sum.to_le_bytes());
    bytes
}

/// The valid slot with the higher sequence: its index, sequence and payload.
fn newest_vsr_slot(file: &File) -> std::io::Result<Option<(usize, u64, Vec<u8>)>> {
    let first = read_vsr_slot(file, 0)?.map(|(sequence, payload)| (0, sequence, payload));
    let second = read_vsr_slot(file, 1)?.map(|(sequence, payload)| (1, sequence, payload));
    Ok([first, second]
        .into_iter()
        .flatten()
        .max_by_key(|(_, sequence, _)| *sequence))
}

/// Reads one slot of an open superblock file, its head and then as much as the head
/// says: its sequence and payload, or None when the slot is absent, torn or damaged.
fn read_vsr_slot(file: &File, slot: usize) -> std::io::Result<Option<(u64, Vec<u8>)>> {
    let at = (slot * VSR_SLOT_SIZE) as u64;
    let mut bytes = vec![0u8; VSR_SLOT_HEAD];
    if !read_whole_at(file, &mut bytes, at)? || &bytes[..4] != MAGIC_VSR_SLOT {
        return Ok(None);
    }
    let sequence = u64::from_le_bytes(bytes[4..12].try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes")) as usize;
    if len > VSR_PAYLOAD_MAX {
        return Ok(None);
    }
    bytes.resize(VSR_SLOT_HEAD + len + 8, 0);
    if !read_whole_at(file, &mut bytes[VSR_SLOT_HEAD..], at + VSR_SLOT_HEAD as u64)? {
        return Ok(None);
    }
    let (content, sum) = bytes.split_at(VSR_SLOT_HEAD + len);
    if checksum(content) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
        return Ok(None);
    }
    Ok(Some((sequence, content[VSR_SLOT_HEAD..].to_vec())))
}

/// Fills `buf` from `at`; false when the file ends first.
fn read_whole_at(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<bool> {
    match file.read_exact_at(buf, at) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

fn encode_vsr_superblock(superblock: &VsrSuperblock) -> Vec<u8> {
    let mut payload = Vec::with_capacity(16 + superblock.headers.len() * 256);
    payload.extend_from_slice(&superblock.view.to_le_bytes());
    payload.extend_from_slice(&superblock.log_view.to_le_bytes());
    payload.extend_from_slice(&(superblock.headers.len() as u32).to_le_bytes());
    for header in &superblock.headers {
        payload.extend_from_slice(header.as_bytes());
    }
    let mut flags = 0;
    if superblock.replacement {
        flags |= VSR_FLAG_REPLACEMENT;
    }
    if superblock.unformed {
        flags |= VSR_FLAG_UNFORMED;
    }
    payload.extend_from_slice(&flags.to_le_bytes());
    payload
}

/// The persisted VSR superblock, or the default (view 0) when none was written yet.
pub fn read_vsr_superblock(dir: &Path) -> Result<VsrSuperblock, FileError> {
    let path = dir.join(VSR_SUPERBLOCK_FILE);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(VsrSuperblock::default()),
        Err(e) => return Err(io(&path)(e)),
    };
    if let Some((_, _, payload)) = newest_vsr_slot(&file).map_err(io(&path))? {
        return decode_vsr_superblock(&path, &payload);
    }
    if file.metadata().map_err(io(&path))?.len() == 0 {
        // Created and not yet synced when the host went down (`create_vsr_superblock`).
        return Ok(VsrSuperblock::default());
    }
    // Written whole before the slots existed.
    let Some(payload) = read_checked(&path, MAGIC_VSR)? else {
        return Ok(VsrSuperblock::default());
    };
    decode_vsr_superblock(&path, &payload)
}

fn decode_vsr_superblock(path: &Path, payload: &[u8]) -> Result<VsrSuperblock, FileError> {
    let corrupt = |reason| FileError::Corrupt {
        path: path.display().to_string(),
        reason,
    };
    let u32_at = |at: usize| -> Option<u32> {
        let bytes: [u8; 4] = payload.get(at..at + 4)?.try_into().ok()?;
        Some(u32::from_le_bytes(bytes))
    };
    let (Some(view), Some(log_view), Some(count)) = (u32_at(0), u32_at(4), u32_at(8)) else {
        return Err(corrupt("truncated"));
    };
    let count = count as usize;
    let headers_end = 12 + count * 256;
    // The flags word is absent in files written before it existed.
    let flags = match payload.len().checked_sub(headers_end) {
        Some(0) => 0,
        Some(4) => u32_at(headers_end).unwrap_or(0),
        _ => return Err(corrupt("header count does not match the length")),
    };
    if count > SUFFIX_HEADERS_MAX || flags & !(VSR_FLAG_REPLACEMENT | VSR_FLAG_UNFORMED) != 0 {
        return Err(corrupt("header count or flags out of range"));
    }
    let mut headers = Vec::with_capacity(count);
    for chunk in payload[12..headers_end].chunks_exact(256) {
        let header = PrepareHeader::read_from_bytes(chunk).map_err(|_| corrupt("bad header"))?;
        headers.push(header);
    }
    Ok(VsrSuperblock {
        view,
        log_view,
        headers,
        replacement: flags & VSR_FLAG_REPLACEMENT != 0,
        unformed: flags & VSR_FLAG_UNFORMED != 0,
    })
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
mod tests {
    use super::*;
    use replication::wire::Header;

    #[test]
    fn metadata_checkpoint_payload_round_trips_and_truncation_is_refused() {
        let bytes = encode_metadata_checkpoint(b"state", b"", b"anchor bytes");
        let (state, clients, anchor) = decode_metadata_checkpoint(&bytes).unwrap();
        assert_eq!(
            (state, clients, anchor),
            (&b"state"[..], &b""[..], &b"anchor bytes"[..])
        );
        assert!(decode_metadata_checkpoint(&bytes[..bytes.len() - 1]).is_err());
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_metadata_checkpoint(&longer).is_err());
    }

    #[test]
    fn vsr_superblock_round_trips_and_damage_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(
            read_vsr_superblock(dir.path()).expect("absent is default"),
            VsrSuperblock::default()
        );
        let mut header = PrepareHeader::new();
        header.op = 3;
        let mut superblock = VsrSuperblock {
            view: 4,
            log_view: 4,
            headers: vec![header],
            replacement: false,
            unformed: false,
        };
        write_vsr_superblock(dir.path(), &superblock).expect("write");
        assert_eq!(read_vsr_superblock(dir.path()).expect("read"), superblock);
        superblock.replacement = true;
        write_vsr_superblock(dir.path(), &superblock).expect("write");
        assert_eq!(read_vsr_superblock(dir.path()).expect("read"), superblock);
        superblock.replacement = false;
        superblock.unformed = true;
        write_vsr_superblock(dir.path(), &superblock).expect("write");
        assert_eq!(read_vsr_superblock(dir.path()).expect("read"), superblock);
        // Three writes: slot 0, slot 1, slot 0 again. Damage to the newest copy leaves the
        // one before it; damage to both is refused.
        let path = dir.path().join(VSR_SUPERBLOCK_FILE);
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[VSR_SLOT_HEAD + 2] ^= 1;
        std::fs::write(&path, &bytes).expect("write");
        let previous = read_vsr_superblock(dir.path()).expect("older copy");
        assert!(previous.replacement && !previous.unformed);
        bytes[VSR_SLOT_SIZE + VSR_SLOT_HEAD + 2] ^= 1;
        std::fs::write(&path, &bytes).expect("write");
        assert!(read_vsr_superblock(dir.path()).is_err());
    }

    fn superblock_of_view(view: u32, headers: usize) -> VsrSuperblock {
        VsrSuperblock {
            view,
            log_view: view,
            headers: (0..headers)
                .map(|op| {
                    let mut header = PrepareHeader::new();
                    header.op = op as u64 + 1;
                    header.frame.view = view;
                    header
                })
                .collect(),
            replacement: false,
            unformed: false,
        }
    }

    #[test]
    fn vsr_superblocks_written_unsynced_are_read_after_one_file_system_sync() {
        let root = tempfile::tempdir().expect("tempdir");
        let shared = SharedSync::open(root.path()).expect("handle");
        let dirs: Vec<_> = (0..3).map(|g| root.path().join(format!("g{g}"))).collect();
        for (g, dir) in dirs.iter().enumerate() {
            create_vsr_superblock(dir, true).expect("create");
            // The first write of an empty file, then one in place: both unsynced.
            write_vsr_superblock_unsynced(dir, &superblock_of_view(1, 1)).expect("write");
            write_vsr_superblock_unsynced(dir, &superblock_of_view(2 + g as u32, 2))
                .expect("write");
        }
        shared.sync().expect("syncfs");
        for (g, dir) in dirs.iter().enumerate() {
            assert_eq!(
                read_vsr_superblock(dir).expect("read"),
                superblock_of_view(2 + g as u32, 2)
            );
        }
        let missing = root.path().join("missing");
        assert!(SharedSync::open(&missing).is_err());
    }

    #[test]
    fn staged_checkpoints_replace_the_old_only_when_committed() {
        let root = tempfile::tempdir().expect("tempdir");
        let checkpoint = |op: u64| StoredCheckpoint {
            op,
            position: replication::wire::batch::PartitionPosition {
                partition_id: 7,
                next_offset: op * 100,
                last_timestamp: op * 1_000,
            },
            clients: vec![op as u8; 40],
        };
        let shared = SharedSync::open(root.path()).expect("handle");
        let dirs: Vec<_> = (0..3).map(|g| root.path().join(format!("g{g}"))).collect();
        for dir in &dirs {
            std::fs::create_dir(dir).expect("dir");
            write_checkpoint(dir, &checkpoint(1)).expect("write");
            stage_checkpoint(dir, &checkpoint(2)).expect("stage");
            // Staged only: a crash here finds the old checkpoint.
            assert_eq!(read_checkpoint(dir).expect("read"), Some(checkpoint(1)));
        }
        shared.sync().expect("syncfs");
        for dir in &dirs[..2] {
            commit_staged_checkpoint(dir).expect("commit");
        }
        shared.sync().expect("syncfs");
        for dir in &dirs[..2] {
            assert_eq!(read_checkpoint(dir).expect("read"), Some(checkpoint(2)));
        }
        assert_eq!(
            read_checkpoint(&dirs[2]).expect("read"),
            Some(checkpoint(1))
        );
        // A leftover staged file is overwritten by the next one.
        stage_checkpoint(&dirs[2], &checkpoint(3)).expect("stage");
        commit_staged_checkpoint(&dirs[2]).expect("commit");
        assert_eq!(
            read_checkpoint(&dirs[2]).expect("read"),
            Some(checkpoint(3))
        );
        // Nothing staged: the commit fails and the checkpoint stays.
        assert!(commit_staged_checkpoint(&dirs[2]).is_err());
        assert_eq!(
            read_checkpoint(&dirs[2]).expect("read"),
            Some(checkpoint(3))
        );
    }

    #[test]
    fn vsr_superblock_torn_write_keeps_the_newest_durable_copy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(VSR_SUPERBLOCK_FILE);
        create_vsr_superblock(dir.path(), true).expect("create");
        assert_eq!(
            read_vsr_superblock(dir.path()).expect("read"),
            VsrSuperblock::default()
        );
        // Each slot's first block is written, the rest of the first slot is a hole.
        let created = std::fs::metadata(&path).expect("metadata");
        assert_eq!(created.len(), (VSR_SLOT_SIZE + VSR_SLOT_BLOCK) as u64);
        use std::os::unix::fs::MetadataExt;
        assert!(created.blocks() * 512 <= 2 * VSR_SLOT_BLOCK as u64);
        for view in 1..=4 {
            let superblock = superblock_of_view(view, (view as usize * 40).min(SUFFIX_HEADERS_MAX));
            write_vsr_superblock(dir.path(), &superblock).expect("write");
            assert_eq!(read_vsr_superblock(dir.path()).expect("read"), superblock);
        }
        // View 4 is in slot 0 (sequence 5, after the default and three views); a write
        // of view 5 into slot 1 tears after every possible prefix: view 4 stays the
        // superblock.
        let newest = superblock_of_view(4, 128);
        let torn = vsr_slot(6, &encode_vsr_superblock(&superblock_of_view(5, 3)));
        let clean = std::fs::read(&path).expect("read");
        for cut in [1, VSR_SLOT_HEAD, VSR_SLOT_HEAD + 100, torn.len() - 1] {
            let mut bytes = clean.clone();
            bytes[VSR_SLOT_SIZE..VSR_SLOT_SIZE + cut].copy_from_slice(&torn[..cut]);
            std::fs::write(&path, &bytes).expect("write");
            assert_eq!(
                read_vsr_superblock(dir.path()).expect("read"),
                newest,
                "cut {cut}"
            );
            // The next write goes over the torn slot again, never over view 4.
            let mut next = superblock_of_view(6, 2);
            next.unformed = true;
            write_vsr_superblock(dir.path(), &next).expect("write");
            assert_eq!(read_vsr_superblock(dir.path()).expect("read"), next);
            let after = std::fs::read(&path).expect("read");
            assert_eq!(after[..VSR_SLOT_SIZE], clean[..VSR_SLOT_SIZE], "cut {cut}");
        }
    }

    #[test]
    fn vsr_superblock_written_whole_is_read_and_replaced_by_slots() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(VSR_SUPERBLOCK_FILE);
        let old = superblock_of_view(7, 5);
        write_durable(&path, MAGIC_VSR, &encode_vsr_superblock(&old)).expect("write");
        assert_eq!(read_vsr_superblock(dir.path()).expect("read"), old);
        let new = superblock_of_view(8, 1);
        write_vsr_superblock(dir.path(), &new).expect("write");
        assert_eq!(&std::fs::read(&path).expect("read")[..4], MAGIC_VSR_SLOT);
        assert_eq!(read_vsr_superblock(dir.path()).expect("read"), new);
        // An empty file (created, never synced) is view 0; creating keeps a file there.
        std::fs::write(&path, b"").expect("write");
        assert_eq!(
            read_vsr_superblock(dir.path()).expect("read"),
            VsrSuperblock::default()
        );
        create_vsr_superblock(dir.path(), true).expect("create");
        assert!(std::fs::read(&path).expect("read").is_empty());
        write_vsr_superblock(dir.path(), &new).expect("write");
        assert_eq!(read_vsr_superblock(dir.path()).expect("read"), new);
        create_vsr_superblock(dir.path(), true).expect("create");
        assert_eq!(read_vsr_superblock(dir.path()).expect("read"), new);
        // A file with neither layout is refused, not taken for view 0.
        std::fs::write(&path, vec![7u8; 100]).expect("write");
        assert!(read_vsr_superblock(dir.path()).is_err());
    }

    #[test]
    fn client_table_artifact_round_trips_and_damage_is_refused() {
        let artifact = ClientTableArtifact {
            op: 42,
            position: replication::wire::batch::PartitionPosition {
                partition_id: 7,
                next_offset: 1000,
                last_timestamp: 99,
            },
            clients: b"clients".to_vec(),
            anchor: vec![5; 300],
        };
        let bytes = artifact.encode();
        assert_eq!(ClientTableArtifact::decode(&bytes), Ok(artifact));
        for cut in [0, 3, 20, 40, bytes.len() - 1] {
            assert!(
                ClientTableArtifact::decode(&bytes[..cut]).is_err(),
                "cut {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(ClientTableArtifact::decode(&longer).is_err());
        let mut magic = bytes;
        magic[0] ^= 1;
        assert!(ClientTableArtifact::decode(&magic).is_err());
    }

    #[test]
    fn genesis_round_trips_and_missing_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(read_genesis(dir.path()).is_err());
        write_genesis(dir.path(), b"state").expect("write");
        assert_eq!(read_genesis(dir.path()).expect("read"), b"state");
    }
}
