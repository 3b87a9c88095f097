//! Offline inspection for `appliance-inspect`: `journal verify|dump DIR`, `superblock DIR`,
//! `segment verify|dump FILE`. Read-only, plain IO and mmap (no executor), and every
//! report is serde-serializable (u128 values as decimal strings).

use std::path::Path;

use memmap2::Mmap;
use serde::{Serialize, Serializer};

use crate::error::{JournalError, Result};
use crate::format::{decode_meta_copies, scan_image, MetaFault};
use crate::journal::JOURNAL_FILE;
use crate::layout::{JournalLayout, HEADER_SIZE};
use crate::recovery::{recover, Recovery, SlotStatus};
use crate::slot::{read_header, CopyState};
use crate::superblock::{self, CopyReport, Superblock, SUPERBLOCK_FILE};

pub use crate::segment::inspect::{segment_dump, segment_verify, SegmentDump, SegmentReport};

/// Serializes a u128 as a decimal string (JSON numbers lose precision past 2^53).
pub fn u128_string<S: Serializer>(
    value: &u128,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    serializer.serialize_str(&value.to_string())
}

/// `journal verify DIR`: the recovery verdict on every slot.
#[derive(Clone, Debug, Serialize)]
pub struct JournalReport {
    pub path: String,
    pub layout: JournalLayout,
    /// Per meta copy: null when valid, else why not.
    pub meta_copies: Vec<Option<MetaFault>>,
    /// The superblock the checkpoint op came from, if readable.
    pub superblock: Option<Superblock>,
    /// Why the superblock could not be used (the scan then assumes checkpoint 0).
    pub superblock_error: Option<String>,
    pub recovery: Recovery,
    /// No faulty op, no misdirected or damaged slot: nothing to repair.
    pub ok: bool,
}

/// `superblock DIR`: the winning copy and each copy's state.
#[derive(Clone, Debug, Serialize)]
pub struct SuperblockReport {
    pub path: String,
    /// The newest valid copy; null if none is valid.
    pub current: Option<Superblock>,
    pub copies: Vec<CopyReport>,
    /// Every copy valid and at the same sequence.
    pub ok: bool,
}

/// One slot in `journal dump DIR`.
#[derive(Clone, Debug, Serialize)]
pub struct SlotDump {
    pub slot: u64,
    pub verdict: SlotStatus,
    pub header_copy: CopyState,
    pub prepare: CopyState,
    /// Fields of the prepare header as stored (unverified when the verdict is not valid).
    pub op: u64,
    pub view: u32,
    pub size: u32,
    pub commit: u64,
    pub operation: u8,
    #[serde(serialize_with = "u128_string")]
    pub parent: u128,
}

/// `journal dump DIR`: the verify report plus every non-empty slot.
#[derive(Clone, Debug, Serialize)]
pub struct JournalDump {
    pub report: JournalReport,
    pub slots: Vec<SlotDump>,
}

fn map_readonly(path: &Path) -> Result<Mmap> {
    let file = std::fs::File::open(path).map_err(|e| JournalError::io("open", path, e))?;
    // SAFETY: read-only map of a file this tool does not write; a concurrent writer could
    // change bytes under us, which only changes what the report says.
    unsafe { Mmap::map(&file) }.map_err(|e| JournalError::io("mmap", path, e))
}

fn verify_image(
    dir: &Path,
    image: &[u8],
) -> Result<(JournalReport, Vec<crate::slot::SlotEvidence>)> {
    let path = dir.join(JOURNAL_FILE);
    let (layout, meta_copies) = decode_meta_copies(image);
    let layout = layout.ok_or(JournalError::Format {
        path: path.clone(),
        reason: "neither journal meta copy is valid",
    })?;
    if (image.len() as u64) < layout.file_size() {
        return Err(JournalError::FileTruncated {
            path,
            size: image.len() as u64,
            expected: layout.file_size(),
        });
    }
    let (superblock, superblock_error) = match superblock::read(&dir.join(SUPERBLOCK_FILE)) {
        Ok((superblock, _)) => (Some(superblock), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let op_checkpoint = superblock.map_or(0, |s| s.op_checkpoint);
    let evidence = scan_image(image, &layout);
    let recovery = recover(&layout, &evidence, op_checkpoint);
    let ok = recovery.is_clean()
        && recovery.misdirected.is_empty()
        && !recovery.slots.iter().any(|s| {
            matches!(
                s,
                SlotStatus::Damaged { .. } | SlotStatus::Misdirected { .. }
            )
        });
    let report = JournalReport {
        path: path.display().to_string(),
        layout,
        meta_copies,
        superblock,
        superblock_error,
        recovery,
        ok,
    };
    Ok((report, evidence))
}

/// Verifies the journal in data directory `dir` against its superblock's checkpoint.
pub fn journal_verify(dir: &Path) -> Result<JournalReport> {
    let image = map_readonly(&dir.join(JOURNAL_FILE))?;
    Ok(verify_image(dir, &image)?.0)
}

/// Dumps every slot that is not empty, with its verdict and stored header fields.
pub fn journal_dump(dir: &Path) -> Result<JournalDump> {
    let image = map_readonly(&dir.join(JOURNAL_FILE))?;
    let (report, evidence) = verify_image(dir, &image)?;
    let layout = report.layout;
    let mut slots = Vec::new();
    for (slot, ev) in evidence.iter().enumerate() {
        let verdict = report.recovery.slots[slot];
        if verdict == SlotStatus::Empty && ev.header == CopyState::Zero {
            continue;
        }
        let at = layout.prepare_offset(slot as u64) as usize;
        let header = read_header(&image[at..at + HEADER_SIZE as usize]);
        slots.push(SlotDump {
            slot: slot as u64,
            verdict,
            header_copy: ev.header,
            prepare: ev.prepare,
            op: header.map_or(0, |h| h.op),
            view: header.map_or(0, |h| h.frame.view),
            size: header.map_or(0, |h| h.frame.size),
            commit: header.map_or(0, |h| h.commit),
            operation: header.map_or(0, |h| h.operation),
            parent: header.map_or(0, |h| h.parent),
        });
    }
    Ok(JournalDump { report, slots })
}

/// Reads every superblock copy in data directory `dir`.
pub fn superblock(dir: &Path) -> Result<SuperblockReport> {
    let path = dir.join(SUPERBLOCK_FILE);
    let image = std::fs::read(&path).map_err(|e| JournalError::io("read", &path, e))?;
    let (current, copies) = superblock::decode_copies(&image);
    let ok = copies.iter().all(|c| c.fault.is_none())
        && copies
            .iter()
            .all(|c| c.sequence == current.map(|s| s.sequence));
    Ok(SuperblockReport {
        path: path.display().to_string(),
        current,
        copies,
        ok,
    })
}
