//! The VSR superblock file of a group: view, log_view, the suffix headers and flags, in
//! two slots written in turn in place.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use replication::vsr::Superblock as VsrSuperblock;
use replication::wire::PrepareHeader;
use zerocopy::{FromBytes, IntoBytes};

use super::{
    checksum, io, read_checked, replace_file, sync_dir_of, FileError, MAGIC_VSR,
    SUFFIX_HEADERS_MAX, VSR_SUPERBLOCK_FILE,
};

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
pub(super) const MAGIC_VSR_SLOT: &[u8; 4] = b"AVS2";
/// magic, sequence, payload length.
pub(super) const VSR_SLOT_HEAD: usize = 16;
/// view, log_view, count, the largest suffix, flags.
const VSR_PAYLOAD_MAX: usize = 12 + SUFFIX_HEADERS_MAX * 256 + 4;
pub(super) const VSR_SLOT_BLOCK: usize = 4096;
/// Room for the largest slot, in whole blocks, so a slot's write never shares a block
/// with the other slot.
pub(super) const VSR_SLOT_SIZE: usize =
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

pub(super) fn vsr_slot(sequence: u64, payload: &[u8]) -> Vec<u8> {
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

pub(super) fn encode_vsr_superblock(superblock: &VsrSuperblock) -> Vec<u8> {
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
