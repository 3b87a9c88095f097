//! Opening a partition's log: sealed segments load their index files or are verified
//! and indexed again, the active segment is scanned and a torn tail cut off.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::rc::Rc;

use replication::wire::batch::{verify, BATCH_HEADER_SIZE};

use super::{
    io, open_segment_file, parse_segment_name, segment_file_name, write_index, Active, OpenReport,
    PartitionConfig, PartitionLog, Segment,
};
use crate::durability::SyncSchedule;
use crate::error::{JournalError, Result};
use crate::journal::sync_parent_dir;
use crate::layout::sector_floor;
use crate::segment::index::SparseIndex;
use crate::segment::scan::{scan_segment, SegmentScan, SegmentTail};
use crate::segment::sealed::{scan_sealed, SealedScan};

impl PartitionLog {
    /// Opens (creating if absent) the log of `partition_id` in `dir`. Sealed segments load
    /// their index files or rebuild them; the active segment is scanned and a torn tail
    /// truncated. Damage before a segment's end is an error: repair needs a peer.
    pub async fn open(
        dir: &Path,
        partition_id: u64,
        config: PartitionConfig,
    ) -> Result<(PartitionLog, OpenReport)> {
        config.validate()?;
        let bases = segment_bases(dir).await?;
        let mut report = OpenReport::default();
        let mut segments: Vec<Segment> = Vec::with_capacity(bases.len());
        let (&active_base, sealed) = bases
            .split_last()
            .unwrap_or_else(|| unreachable!("one segment at least"));
        for &base in sealed {
            check_continues(dir, &segments, base)?;
            segments.push(open_sealed(dir, base, partition_id, config, &mut report)?);
        }
        check_continues(dir, &segments, active_base)?;
        let path = dir.join(segment_file_name(active_base, "log"));
        let found = scan_active(&path, partition_id, active_base, config)?;
        if let Some(position) = found.torn_at {
            report.truncated_tail = Some((active_base, position));
        }
        segments.push(found.segment);
        let active_segment = &segments[segments.len() - 1];
        let file = open_segment_file(&path, false).await?;
        if report.truncated_tail.is_some() {
            // Drop the torn bytes so they cannot be mistaken for data later.
            file.truncate(active_segment.len)
                .await
                .map_err(io("truncate", &path))?;
            file.fdatasync().await.map_err(io("fdatasync", &path))?;
        }
        let last_timestamp = found
            .last_timestamp
            .or_else(|| {
                segments
                    .iter()
                    .rev()
                    .find_map(|s| last_batch_timestamp(dir, s))
            })
            .unwrap_or(0);
        report.segments = segments.len();
        let log = PartitionLog {
            dir: dir.into(),
            partition_id,
            config,
            segments,
            active: Active {
                file: Rc::new(file),
                tail: found.tail,
            },
            last_timestamp,
            schedule: SyncSchedule::new(config.durability),
        };
        Ok((log, report))
    }
}

/// The base offsets of the segments in `dir`, ascending; an empty log gets its first
/// segment file (base 0) created and made durable.
async fn segment_bases(dir: &Path) -> Result<Vec<u64>> {
    std::fs::create_dir_all(dir).map_err(io("create directory", dir))?;
    let mut bases: Vec<u64> = std::fs::read_dir(dir)
        .map_err(io("list", dir))?
        .filter_map(|e| e.ok())
        .filter_map(|e| parse_segment_name(&e.file_name().to_string_lossy()))
        .collect();
    bases.sort_unstable();
    if bases.is_empty() {
        let path = dir.join(segment_file_name(0, "log"));
        open_segment_file(&path, true)
            .await?
            .close()
            .await
            .map_err(io("close", &path))?;
        sync_parent_dir(&path)?;
        bases.push(0);
    }
    Ok(bases)
}

/// A segment must start where the one before it ends.
fn check_continues(dir: &Path, segments: &[Segment], base: u64) -> Result<()> {
    match segments.last() {
        Some(before) if before.next_offset != base => Err(JournalError::SegmentCorrupt {
            path: dir.join(segment_file_name(base, "log")),
            position: 0,
        }),
        _ => Ok(()),
    }
}

/// A sealed segment: with a valid index it is not read (only its length is needed);
/// without one it is verified and indexed again, and the index written.
fn open_sealed(
    dir: &Path,
    base: u64,
    partition_id: u64,
    config: PartitionConfig,
    report: &mut OpenReport,
) -> Result<Segment> {
    let path = dir.join(segment_file_name(base, "log"));
    let len = std::fs::metadata(&path).map_err(io("stat", &path))?.len();
    if let Some((index, next_offset)) = load_index(dir, base, len) {
        return Ok(Segment {
            base_offset: base,
            next_offset,
            len,
            index,
        });
    }
    let segment = scan_sealed(&path, partition_id, base, config)?;
    report.rebuilt_indexes.push(base);
    write_index(dir, &segment)?;
    Ok(segment)
}

/// What scanning the active segment found.
struct ActiveScan {
    segment: Segment,
    /// The bytes of its last, partial sector (what the next write rewrites).
    tail: Vec<u8>,
    last_timestamp: Option<u64>,
    /// Where a torn tail starts, to be truncated.
    torn_at: Option<u64>,
}

/// Scans the active segment. The usual case, a clean end, is verified a window at a
/// time; only damage or a torn tail reads the file whole to tell which it is. Damage
/// before the end is an error.
fn scan_active(
    path: &Path,
    partition_id: u64,
    base: u64,
    config: PartitionConfig,
) -> Result<ActiveScan> {
    let mut windowed = SealedScan::open(path, partition_id, base, config, Vec::new())?;
    match windowed.step(u64::MAX) {
        Ok(_) => {
            let segment = windowed.segment();
            let tail_start = sector_floor(segment.len);
            let mut tail = vec![0u8; (segment.len - tail_start) as usize];
            windowed
                .file
                .read_exact_at(&mut tail, tail_start)
                .map_err(io("read", path))?;
            return Ok(ActiveScan {
                segment,
                tail,
                last_timestamp: windowed.batches.last().map(|b| b.base_timestamp),
                torn_at: None,
            });
        }
        Err(JournalError::SegmentCorrupt { .. }) => {}
        Err(other) => return Err(other),
    }
    let image = std::fs::read(path).map_err(io("read", path))?;
    let scan = scan_segment(&image, partition_id, base);
    let torn_at = match &scan.tail {
        SegmentTail::Clean => None,
        SegmentTail::Torn { position, .. } => Some(*position),
        SegmentTail::Corrupt { position, .. } | SegmentTail::Discontinuity { position, .. } => {
            return Err(JournalError::SegmentCorrupt {
                path: path.into(),
                position: *position,
            })
        }
    };
    let tail_start = sector_floor(scan.valid_len) as usize;
    Ok(ActiveScan {
        tail: image[tail_start..scan.valid_len as usize].to_vec(),
        last_timestamp: scan.batches.last().map(|b| b.base_timestamp),
        segment: segment_of(base, &scan, config),
        torn_at,
    })
}

fn load_index(dir: &Path, base: u64, log_len: u64) -> Option<(SparseIndex, u64)> {
    let offsets = std::fs::read(dir.join(segment_file_name(base, "index"))).ok()?;
    let times = std::fs::read(dir.join(segment_file_name(base, "timeindex"))).ok()?;
    let (index, next_offset) = SparseIndex::decode(&offsets, false, base, log_len)?;
    let (time, time_next) = SparseIndex::decode(&times, true, base, log_len)?;
    (time_next == next_offset && next_offset >= base).then_some(())?;
    Some((index.with_timestamps(&time)?, next_offset))
}

/// The segment a scan found: its batches up to the first bad one, indexed.
fn segment_of(base: u64, scan: &SegmentScan, config: PartitionConfig) -> Segment {
    Segment {
        base_offset: base,
        next_offset: scan.next_offset(base),
        len: scan.valid_len,
        index: SparseIndex::build(base, &scan.batches, config.index_interval_bytes),
    }
}

fn last_batch_timestamp(dir: &Path, segment: &Segment) -> Option<u64> {
    let path = dir.join(segment_file_name(segment.base_offset, "log"));
    let file = std::fs::File::open(path).ok()?;
    // Walk from the last index point (batches are self-delimiting), reading only that.
    let from = segment
        .index
        .entries()
        .last()
        .map_or(0, |e| u64::from(e.position));
    let mut image = vec![0u8; segment.len.checked_sub(from)? as usize];
    file.read_exact_at(&mut image, from).ok()?;
    let mut position = 0;
    let mut last = None;
    while position + BATCH_HEADER_SIZE <= image.len() {
        let len = u64::from_le_bytes(image.get(position + 32..position + 40)?.try_into().ok()?);
        let info = verify(image.get(position..position + len as usize)?).ok()?;
        last = Some(info.base_timestamp);
        position += len as usize;
    }
    last
}
