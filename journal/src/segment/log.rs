//! A partition's segment log: message batches appended with direct IO to segment files
//! named by base offset, rolled at a configured size, with sparse offset and timestamp
//! indexes, reads by offset and by timestamp, and deletion of old segments.
//!
//! Batches are packed; each append rewrites the last partial sector (kept in memory)
//! followed by the new batch, zero-padded to a sector, at a sector-aligned position.
//! When that write is forced to stable storage is the partition's `message_durability`.

use std::cell::RefCell;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use glommio::io::{DmaFile, OpenOptions};
use replication::wire::batch::{
    check_stamp, check_stamp_of_verified, verify, BatchInfo, PartitionPosition, BATCH_HEADER_SIZE,
};
use serde::Serialize;

use super::index::SparseIndex;
use super::read::{read_up_to, ReadFrom, ReadPlan, Span};
pub use super::scan::BATCH_SIZE_MAX;
use super::scan::{scan_segment, BatchEntry, SegmentScan, SegmentTail};
use crate::buffers::BufferPool;
use crate::durability::{Durability, SyncSchedule};
use crate::error::{JournalError, Result};
use crate::journal::sync_parent_dir;
use crate::layout::{sector_ceil, sector_floor, SECTOR_SIZE};

/// How much of a batch an append checks.
#[derive(Clone, Copy)]
enum Checks {
    /// Every message checksum and the batch checksum, then the stamp.
    Verify,
    /// The stamp only: the caller already verified the batch.
    StampOnly,
}

/// Smallest segment size accepted.
pub const SEGMENT_SIZE_MIN: u64 = 64 * 1024;
/// Largest segment size: index positions are u32.
pub const SEGMENT_SIZE_LIMIT: u64 = u32::MAX as u64;
/// Default bytes of log between sparse index entries.
pub const INDEX_INTERVAL_BYTES_DEFAULT: u64 = 4096;

const _: () = assert!(BATCH_SIZE_MAX < SEGMENT_SIZE_LIMIT && SEGMENT_SIZE_MIN >= SECTOR_SIZE);

/// Bytes of batches one coalesced write carries at most (a single larger batch goes
/// alone): bounds the write buffer of a group commit.
const RUN_BYTES_MAX: u64 = 8 << 20;
/// Extra room of a fresh coalesced-write buffer, so runs a little longer reuse it.
const RUN_SLACK_BYTES: usize = 256 << 10;

/// Per-partition storage settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PartitionConfig {
    /// A segment is rolled before an append would take it past this size.
    pub segment_size_max: u64,
    /// Bytes of log between sparse index entries.
    pub index_interval_bytes: u64,
    /// `message_durability`.
    pub durability: Durability,
}

impl PartitionConfig {
    /// Checks bounds.
    pub fn validate(&self) -> Result<()> {
        if !(SEGMENT_SIZE_MIN..=SEGMENT_SIZE_LIMIT).contains(&self.segment_size_max) {
            return Err(JournalError::Config {
                key: "segment_size",
                value: self.segment_size_max,
                rule: "must be within 64 KiB..=4 GiB - 1",
            });
        }
        if self.index_interval_bytes == 0 {
            return Err(JournalError::Config {
                key: "index_interval_bytes",
                value: 0,
                rule: "must be positive",
            });
        }
        Ok(())
    }
}

/// File name of the segment starting at `base_offset`.
pub fn segment_file_name(base_offset: u64, extension: &str) -> String {
    format!("{base_offset:020}.{extension}")
}

/// Parses a segment file name back to its base offset.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".log")?;
    (digits.len() == 20).then(|| digits.parse().ok()).flatten()
}

#[derive(Debug)]
struct Segment {
    base_offset: u64,
    next_offset: u64,
    len: u64,
    index: SparseIndex,
}

struct Active {
    /// Shared with a planned write or a sync in flight (`PlannedWrite`, `Syncer`).
    file: Rc<DmaFile>,
    /// Bytes of the last partial sector, rewritten by the next append.
    tail: Vec<u8>,
}

/// What opening a partition found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OpenReport {
    pub segments: usize,
    /// Base offsets of segments whose index files were missing or bad and were rebuilt.
    pub rebuilt_indexes: Vec<u64>,
    /// A torn tail truncated from the active segment: (base offset, position).
    pub truncated_tail: Option<(u64, u64)>,
}

/// What an append reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendReceipt {
    pub base_offset: u64,
    pub next_offset: u64,
    /// The batch's base_timestamp: the log's last timestamp once it is appended.
    pub last_timestamp: u64,
    /// Whether the batch is on stable storage now (always under `EveryBatch`).
    pub durable: bool,
}

/// What `plan_many_verified` planned.
pub enum Plan {
    Planned(Planned),
    /// The first batch does not fit the active segment: roll it, then plan again.
    RollFirst,
}

/// Batches planned into one write.
pub struct Planned {
    /// The batches planned, in order (a prefix of those given).
    pub receipts: Vec<AppendReceipt>,
    /// Why the batch after them was refused, when one was.
    pub refused: Option<JournalError>,
    /// The write to run (None when nothing was planned).
    pub write: Option<PlannedWrite>,
}

/// A planned write of a segment log: it holds the file and the buffer, not the log.
pub struct PlannedWrite {
    file: Rc<DmaFile>,
    buffer: Rc<glommio::io::DmaBuffer>,
    at: u64,
    path: PathBuf,
}

impl PlannedWrite {
    /// Does the write; its buffer goes back to the thread's pool.
    pub async fn run(self) -> Result<()> {
        let total = self.buffer.len();
        let written = self
            .file
            .write_rc_at(self.buffer.clone(), self.at)
            .await
            .map_err(io("write", &self.path))?;
        SPARE_BUFFERS.with_borrow_mut(|pool| pool.keep(self.buffer));
        if written < total {
            return Err(JournalError::io(
                "write",
                &self.path,
                std::io::Error::new(std::io::ErrorKind::WriteZero, "short direct-IO write"),
            ));
        }
        Ok(())
    }
}

/// An fdatasync of a segment log's active file that holds only the file.
pub struct Syncer {
    file: Rc<DmaFile>,
    path: PathBuf,
}

impl Syncer {
    pub async fn run(self) -> Result<()> {
        self.file
            .fdatasync()
            .await
            .map_err(io("fdatasync", &self.path))
    }
}

/// A write buffer filled for the log's next write.
struct Filled {
    position: u64,
    new_tail: Vec<u8>,
    write: PlannedWrite,
}

/// An open partition log. Not `Send`: it lives on one glommio executor.
pub struct PartitionLog {
    dir: PathBuf,
    partition_id: u64,
    config: PartitionConfig,
    /// Every segment, oldest first; the last is the active one.
    segments: Vec<Segment>,
    active: Active,
    last_timestamp: u64,
    schedule: SyncSchedule,
}

thread_local! {
    /// Write buffers of earlier appends on this thread (an executor's logs share them).
    static SPARE_BUFFERS: RefCell<BufferPool> = const { RefCell::new(BufferPool::new(8, 16 << 20)) };
}

fn io<'a, E: crate::error::IntoIoError>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(E) -> JournalError + 'a {
    move |e| JournalError::io(op, path, e)
}

async fn open_segment_file(path: &Path, create: bool) -> Result<DmaFile> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(create)
        .dma_open(path)
        .await
        .map_err(|e| JournalError::io("open (O_DIRECT)", path, e))
}

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
        std::fs::create_dir_all(dir).map_err(io("create directory", dir))?;
        let mut bases: Vec<u64> = std::fs::read_dir(dir)
            .map_err(io("list", dir))?
            .filter_map(|e| e.ok())
            .filter_map(|e| parse_segment_name(&e.file_name().to_string_lossy()))
            .collect();
        bases.sort_unstable();
        let mut report = OpenReport::default();
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
        let mut segments = Vec::with_capacity(bases.len());
        let mut last_timestamp = None;
        let active_base = *bases.last().unwrap_or(&0);
        let mut active_tail = Vec::new();
        for &base in &bases {
            let path = dir.join(segment_file_name(base, "log"));
            let is_active = base == active_base;
            if let Some(expected) = segments.last().map(|s: &Segment| s.next_offset) {
                if expected != base {
                    return Err(JournalError::SegmentCorrupt { path, position: 0 });
                }
            }
            // A sealed segment with a valid index is not read (only its length is
            // needed); the active one and any without an index are read and scanned.
            let loaded = if is_active {
                None
            } else {
                let len = std::fs::metadata(&path).map_err(io("stat", &path))?.len();
                load_index(dir, base, len).map(|loaded| (loaded, len))
            };
            let segment = match loaded {
                Some(((index, next_offset), len)) => Segment {
                    base_offset: base,
                    next_offset,
                    len,
                    index,
                },
                None if !is_active => {
                    let segment = scan_sealed(&path, partition_id, base, config)?;
                    report.rebuilt_indexes.push(base);
                    write_index(dir, &segment)?;
                    segment
                }
                None => {
                    // The usual case, a clean end, is verified a window at a time; only
                    // damage or a torn tail reads the file whole to tell which it is.
                    let mut windowed =
                        SealedScan::open(&path, partition_id, base, config, Vec::new())?;
                    let clean = match windowed.step(u64::MAX) {
                        Ok(_) => true,
                        Err(JournalError::SegmentCorrupt { .. }) => false,
                        Err(other) => return Err(other),
                    };
                    if clean {
                        let segment = windowed.segment();
                        last_timestamp = windowed.batches.last().map(|b| b.base_timestamp);
                        let tail_start = sector_floor(segment.len);
                        active_tail = vec![0u8; (segment.len - tail_start) as usize];
                        windowed
                            .file
                            .read_exact_at(&mut active_tail, tail_start)
                            .map_err(io("read", &path))?;
                        segments.push(segment);
                        continue;
                    }
                    let image = std::fs::read(&path).map_err(io("read", &path))?;
                    let scan = scan_segment(&image, partition_id, base);
                    match &scan.tail {
                        SegmentTail::Clean => {}
                        SegmentTail::Torn { position, .. } => {
                            report.truncated_tail = Some((base, *position));
                        }
                        SegmentTail::Corrupt { position, .. }
                        | SegmentTail::Discontinuity { position, .. } => {
                            return Err(JournalError::SegmentCorrupt {
                                path,
                                position: *position,
                            })
                        }
                    }
                    last_timestamp = scan.batches.last().map(|b| b.base_timestamp);
                    let tail_start = sector_floor(scan.valid_len) as usize;
                    active_tail = image[tail_start..scan.valid_len as usize].to_vec();
                    segment_of(base, &scan, config)
                }
            };
            segments.push(segment);
        }
        let active_segment = segments
            .last()
            .unwrap_or_else(|| unreachable!("one segment at least"));
        let path = dir.join(segment_file_name(active_segment.base_offset, "log"));
        let file = open_segment_file(&path, false).await?;
        if report.truncated_tail.is_some() {
            // Drop the torn bytes so they cannot be mistaken for data later.
            file.truncate(active_segment.len)
                .await
                .map_err(io("truncate", &path))?;
            file.fdatasync().await.map_err(io("fdatasync", &path))?;
        }
        let tail = active_tail;
        let last_timestamp = last_timestamp
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
                tail,
            },
            last_timestamp,
            schedule: SyncSchedule::new(config.durability),
        };
        Ok((log, report))
    }

    /// The first offset still stored.
    pub fn start_offset(&self) -> u64 {
        self.segments.first().map_or(0, |s| s.base_offset)
    }

    /// The offset the next batch must start at.
    pub fn next_offset(&self) -> u64 {
        self.active_segment().next_offset
    }

    /// The stamp position a backup checks the next batch against.
    pub fn position(&self) -> PartitionPosition {
        PartitionPosition {
            partition_id: self.partition_id,
            next_offset: self.next_offset(),
            last_timestamp: self.last_timestamp,
        }
    }

    /// Bytes of batches the segments hold.
    pub fn stored_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.len).sum()
    }

    /// The number of segment files (the last one being written).
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// The number of segment files and the memory their sparse indexes hold.
    pub fn index_memory(&self) -> (usize, usize) {
        let bytes = self.segments.iter().map(|s| s.index.memory_bytes()).sum();
        (self.segments.len(), bytes)
    }

    /// Base offsets and byte lengths of the segments, oldest first (state-transfer
    /// artifacts; the last one is still being written).
    pub fn segments(&self) -> Vec<(u64, PathBuf, u64)> {
        self.segments
            .iter()
            .map(|s| {
                (
                    s.base_offset,
                    self.dir.join(segment_file_name(s.base_offset, "log")),
                    s.len,
                )
            })
            .collect()
    }

    /// The segments holding the offsets below `end` (a batch boundary, such as the
    /// commit point) with their byte lengths up to `end`, oldest first: what a state
    /// transfer freezes. Bytes below a committed `end` never change (truncation stays
    /// above it), so these prefixes can be read while the log goes on. An empty range
    /// gives the segment `end` falls in, with length 0, so the base offset travels.
    pub fn segments_until(&self, end: u64) -> Result<Vec<(u64, PathBuf, u64)>> {
        let (start, next) = (self.start_offset(), self.next_offset());
        if end < start || end > next {
            return Err(JournalError::OffsetOutOfRange {
                offset: end,
                start,
                end: next,
            });
        }
        let path = |s: &Segment| self.dir.join(segment_file_name(s.base_offset, "log"));
        let mut out = Vec::new();
        for segment in self.segments.iter().filter(|s| s.base_offset < end) {
            if segment.next_offset <= end {
                out.push((segment.base_offset, path(segment), segment.len));
                continue;
            }
            let len =
                self.batch_position(segment, end)?
                    .ok_or_else(|| JournalError::BatchRejected {
                        base_offset: end,
                        reason: "not a batch boundary".into(),
                    })?;
            out.push((segment.base_offset, path(segment), len));
        }
        if out.is_empty() {
            let holder = self.segments.partition_point(|s| s.base_offset <= end);
            let segment = &self.segments[holder.saturating_sub(1)];
            out.push((segment.base_offset, path(segment), 0));
        }
        Ok(out)
    }

    /// The byte position in `segment` of the batch starting at `offset`, if one does.
    fn batch_position(&self, segment: &Segment, offset: u64) -> Result<Option<u64>> {
        let position = segment
            .index
            .position_for_offset(offset - segment.base_offset);
        let plan = ReadPlan {
            spans: vec![Span {
                path: self.dir.join(segment_file_name(segment.base_offset, "log")),
                position,
                end: segment.len,
            }],
            from: ReadFrom::Offset(0),
            end_offset: offset + 1,
            bytes_max: u64::MAX,
        };
        let (mut at, mut found) = (position, None);
        plan.read(&mut |bytes, info| {
            if info.base_offset == offset {
                found = Some(at);
            }
            at += bytes.len() as u64;
            info.base_offset < offset
        })?;
        Ok(found)
    }

    fn active_segment(&self) -> &Segment {
        self.segments
            .last()
            .unwrap_or_else(|| unreachable!("one segment at least"))
    }

    fn active_path(&self) -> PathBuf {
        self.dir
            .join(segment_file_name(self.active_segment().base_offset, "log"))
    }

    /// Appends a stamped batch (it must verify and follow the log), rolling the segment
    /// first if it would grow past `segment_size_max`. Synced per `message_durability`.
    pub async fn append(&mut self, batch: &[u8]) -> Result<AppendReceipt> {
        self.append_inner(batch, true, Checks::Verify).await
    }

    /// As `append`, but never syncs: the caller groups several appends under one
    /// `sync` (group commit) and must call it before treating them as durable (under
    /// `EveryBatch`; the interval policies sync on `tick` as usual).
    pub async fn append_deferred(&mut self, batch: &[u8]) -> Result<AppendReceipt> {
        self.append_inner(batch, false, Checks::Verify).await
    }

    /// As `append_deferred`, for a batch that `wire::batch::verify` already accepted
    /// (a prepare that passed `wire::decode`, a batch this node stamped): its messages
    /// are not hashed again; the stamp, size and order are still checked. The caller
    /// vouches for the body, as recovery re-verifies every batch it scans.
    pub async fn append_verified_deferred(&mut self, batch: &[u8]) -> Result<AppendReceipt> {
        self.append_inner(batch, false, Checks::StampOnly).await
    }

    /// Whether the policy wants every write synced before it is acknowledged.
    pub fn syncs_every_batch(&self) -> bool {
        self.config.durability == Durability::EveryBatch
    }

    /// The stamp (and, with `Checks::Verify`, every checksum) and size of `batch` as the
    /// next batch after `position`.
    fn check_batch(
        &self,
        batch: &[u8],
        position: &PartitionPosition,
        checks: Checks,
    ) -> Result<BatchInfo> {
        let checked = match checks {
            Checks::Verify => check_stamp(batch, position),
            Checks::StampOnly => check_stamp_of_verified(batch, position),
        };
        let info = checked.map_err(|e| JournalError::BatchRejected {
            base_offset: position.next_offset,
            reason: e.to_string(),
        })?;
        if batch.len() as u64 > BATCH_SIZE_MAX {
            return Err(JournalError::BatchRejected {
                base_offset: info.base_offset,
                reason: format!("{} bytes exceeds {BATCH_SIZE_MAX}", batch.len()),
            });
        }
        Ok(info)
    }

    /// Checks `batch` and writes it after the log's end in one direct-IO write (the last
    /// partial sector kept in memory, the batch, zero padding to a sector), rolling the
    /// segment first when the batch would take it past `segment_size_max`.
    async fn append_inner(
        &mut self,
        batch: &[u8],
        sync_now: bool,
        checks: Checks,
    ) -> Result<AppendReceipt> {
        let info = self.check_batch(batch, &self.position(), checks)?;
        let len = self.active_segment().len;
        if len > 0 && len + batch.len() as u64 > self.config.segment_size_max {
            self.roll().await?;
        }
        let Filled {
            position,
            new_tail,
            write,
        } = self.fill(&[batch]);
        write.run().await?;
        let mut receipt = self
            .advance(position, new_tail, &[batch], &[info])
            .pop()
            .unwrap_or_else(|| unreachable!("one receipt per batch written"));
        let due = self.schedule.written(Instant::now());
        receipt.durable = if due && sync_now {
            self.sync().await?;
            true
        } else {
            !self.schedule.is_dirty()
        };
        Ok(receipt)
    }

    /// Plans the next write of `batches` (the appends of a group commit, each verified
    /// already) without doing it: the batches that fit the active segment and one write's
    /// bound are checked and copied into a write buffer, and the log's position, index
    /// and tail count them at once. The caller runs the returned write (it shares only
    /// the file and the buffer, not the log) and must let it complete before planning the
    /// next one (the next write rewrites its last sector), before reads rely on the
    /// batches, and before a roll, truncation or close. A first batch that does not fit
    /// the non-empty active segment gives `Plan::RollFirst`: call `roll` (with nothing in
    /// flight), then plan again. Batches past the bound are left for the next plan
    /// (`receipts` is shorter than `batches`); a refused batch ends the plan with its
    /// error, and those after it are not planned.
    pub fn plan_many_verified(&mut self, batches: &[&[u8]]) -> Result<Plan> {
        let Some(first) = batches.first() else {
            return Ok(Plan::Planned(Planned {
                receipts: Vec::new(),
                refused: None,
                write: None,
            }));
        };
        let segment_len = self.active_segment().len;
        if segment_len > 0 && segment_len + first.len() as u64 > self.config.segment_size_max {
            return Ok(Plan::RollFirst);
        }
        let (infos, refused) = self.check_run(batches, segment_len);
        let run = infos.len();
        if run == 0 {
            return Ok(Plan::Planned(Planned {
                receipts: Vec::new(),
                refused,
                write: None,
            }));
        }
        let Filled {
            position,
            new_tail,
            write,
        } = self.fill(&batches[..run]);
        let mut receipts = self.advance(position, new_tail, &batches[..run], &infos);
        let _ = self.schedule.written(Instant::now());
        for receipt in &mut receipts {
            receipt.durable = false;
        }
        Ok(Plan::Planned(Planned {
            receipts,
            refused,
            write: Some(write),
        }))
    }

    /// The longest prefix of `batches` that follows the log's end, fits the segment (of
    /// `segment_len` bytes now) and one write's bound (a first batch always does), with
    /// the error of the batch that stopped it when one was refused.
    fn check_run(
        &self,
        batches: &[&[u8]],
        segment_len: u64,
    ) -> (Vec<BatchInfo>, Option<JournalError>) {
        let mut position = self.position();
        let mut infos = Vec::new();
        let mut run_bytes = 0u64;
        for (i, batch) in batches.iter().enumerate() {
            let info = match self.check_batch(batch, &position, Checks::StampOnly) {
                Ok(info) => info,
                Err(error) => return (infos, Some(error)),
            };
            let grown = run_bytes + batch.len() as u64;
            if i > 0
                && (segment_len + grown > self.config.segment_size_max || grown > RUN_BYTES_MAX)
            {
                break;
            }
            run_bytes = grown;
            position.next_offset = info.next_offset();
            position.last_timestamp = info.base_timestamp;
            infos.push(info);
        }
        (infos, None)
    }

    /// The write buffer of `batches` after the log's end: the kept partial sector, the
    /// batches, zero padding; and the new partial sector.
    fn fill(&self, batches: &[&[u8]]) -> Filled {
        let run_len: u64 = batches.iter().map(|b| b.len() as u64).sum();
        let position = self.active_segment().len;
        let write_at = sector_floor(position);
        let tail_len = self.active.tail.len();
        assert_eq!(write_at + tail_len as u64, position);
        let end = position + run_len;
        let total = (sector_ceil(end) - write_at) as usize;
        let mut buffer = SPARE_BUFFERS.with_borrow_mut(|pool| {
            if batches.len() == 1 {
                pool.take(&self.active.file, total)
            } else {
                pool.take_at_least(&self.active.file, total, RUN_SLACK_BYTES)
            }
        });
        {
            let bytes = Rc::get_mut(&mut buffer)
                .unwrap_or_else(|| unreachable!("pooled buffers are not shared"))
                .as_bytes_mut();
            bytes[..tail_len].copy_from_slice(&self.active.tail);
            let mut at = tail_len;
            for batch in batches {
                bytes[at..at + batch.len()].copy_from_slice(batch);
                at += batch.len();
            }
            bytes[at..].fill(0);
        }
        let new_tail_start = (sector_floor(end) - write_at) as usize;
        let new_tail = buffer.as_bytes()[new_tail_start..(end - write_at) as usize].to_vec();
        Filled {
            position,
            new_tail,
            write: PlannedWrite {
                file: self.active.file.clone(),
                buffer,
                at: write_at,
                path: self.active_path(),
            },
        }
    }

    /// Counts `batches` (written, or planned to be) in the log: tail, index, lengths.
    fn advance(
        &mut self,
        position: u64,
        new_tail: Vec<u8>,
        batches: &[&[u8]],
        infos: &[BatchInfo],
    ) -> Vec<AppendReceipt> {
        self.active.tail = new_tail;
        let interval = self.config.index_interval_bytes;
        let segment = self
            .segments
            .last_mut()
            .unwrap_or_else(|| unreachable!("one segment at least"));
        let mut receipts = Vec::with_capacity(batches.len());
        let mut at = position;
        for (batch, info) in batches.iter().zip(infos) {
            let entry = BatchEntry {
                position: at,
                len: batch.len() as u64,
                base_offset: info.base_offset,
                message_count: info.message_count,
                base_timestamp: info.base_timestamp,
            };
            segment.index.observe(segment.base_offset, &entry, interval);
            at += batch.len() as u64;
            segment.len = at;
            segment.next_offset = entry.next_offset();
            self.last_timestamp = info.base_timestamp;
            receipts.push(AppendReceipt {
                base_offset: info.base_offset,
                next_offset: entry.next_offset(),
                last_timestamp: info.base_timestamp,
                durable: false,
            });
        }
        receipts
    }

    /// An fdatasync of the active segment that does not hold the log (run it beside a
    /// planned write; it covers the writes completed before it starts). Call
    /// `note_synced` once it completed.
    pub fn syncer(&self) -> Syncer {
        Syncer {
            file: self.active.file.clone(),
            path: self.active_path(),
        }
    }

    /// Whether anything appended is not yet synced.
    pub fn is_dirty(&self) -> bool {
        self.schedule.is_dirty()
    }

    /// A `Syncer` of this log completed.
    pub fn note_synced(&mut self) {
        self.schedule.synced();
    }

    /// Forces everything appended so far to stable storage.
    pub async fn sync(&mut self) -> Result<()> {
        let path = self.active_path();
        self.active
            .file
            .fdatasync()
            .await
            .map_err(io("fdatasync", &path))?;
        self.schedule.synced();
        Ok(())
    }

    /// Syncs if the interval policy says one is due; call periodically. Returns whether
    /// it synced.
    pub async fn tick(&mut self) -> Result<bool> {
        // Nothing unsynced (every idle partition): no clock read.
        if self.schedule.is_dirty() && self.schedule.due(Instant::now()) {
            self.sync().await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Seals the active segment (synced, trimmed, indexes written) and starts a new one.
    pub async fn roll(&mut self) -> Result<()> {
        let path = self.active_path();
        self.sync().await?;
        let segment = self.active_segment();
        self.active
            .file
            .truncate(segment.len)
            .await
            .map_err(io("truncate", &path))?;
        self.active
            .file
            .fdatasync()
            .await
            .map_err(io("fdatasync", &path))?;
        write_index(&self.dir, segment)?;
        let base = segment.next_offset;
        let new_path = self.dir.join(segment_file_name(base, "log"));
        let file = open_segment_file(&new_path, true).await?;
        sync_parent_dir(&new_path)?;
        let old = std::mem::replace(
            &mut self.active,
            Active {
                file: Rc::new(file),
                tail: Vec::new(),
            },
        );
        close_file(old.file, &path).await?;
        self.segments.push(Segment {
            base_offset: base,
            next_offset: base,
            len: 0,
            index: SparseIndex::default(),
        });
        Ok(())
    }

    /// Takes whole sealed segments that hold only offsets below `offset` out of the log
    /// (retention) and returns their files (log first, then the index files) for the
    /// caller to remove off the IO thread: nothing reads them once taken, and a crash
    /// before they are removed leaves files below the start that the caller removes
    /// again. The active segment is never taken.
    pub fn take_segments_before(&mut self, offset: u64) -> Vec<PathBuf> {
        let mut files = Vec::new();
        while self.segments.len() > 1 && self.segments[0].next_offset <= offset {
            let base = self.segments.remove(0).base_offset;
            for extension in ["log", "index", "timeindex"] {
                files.push(self.dir.join(segment_file_name(base, extension)));
            }
        }
        files
    }

    /// Deletes whole sealed segments that hold only offsets below `offset` (retention).
    /// The active segment is never deleted. Returns how many were removed.
    pub fn delete_segments_before(&mut self, offset: u64) -> Result<usize> {
        let mut removed = 0;
        while self.segments.len() > 1 && self.segments[0].next_offset <= offset {
            let base = self.segments[0].base_offset;
            for extension in ["index", "timeindex", "log"] {
                let path = self.dir.join(segment_file_name(base, extension));
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && extension != "log" => {}
                    Err(e) => return Err(JournalError::io("remove", &path, e)),
                }
            }
            self.segments.remove(0);
            removed += 1;
        }
        if removed > 0 {
            sync_parent_dir(&self.dir.join("x"))?;
        }
        Ok(removed)
    }

    /// Removes every batch at or after `offset`, which must be a batch boundary at or
    /// above the first stored offset (consensus truncating an uncommitted suffix). Whole
    /// newer segments are deleted, the segment holding `offset` is cut there and becomes
    /// the active one again, and the log is reopened from disk.
    pub async fn truncate_from(&mut self, offset: u64) -> Result<()> {
        if offset >= self.next_offset() {
            return Ok(());
        }
        let start = self.start_offset();
        if offset < start {
            return Err(JournalError::OffsetOutOfRange {
                offset,
                start,
                end: self.next_offset(),
            });
        }
        self.sync().await?;
        let holder = self.segments.partition_point(|s| s.base_offset <= offset) - 1;
        let segment = &self.segments[holder];
        let cut = if offset == segment.base_offset {
            0
        } else {
            self.batch_position(segment, offset)?
                .ok_or_else(|| JournalError::BatchRejected {
                    base_offset: offset,
                    reason: "truncation point is not a batch boundary".into(),
                })?
        };
        let keep = if cut == 0 && holder > 0 {
            holder - 1
        } else {
            holder
        };
        for segment in &self.segments[keep + 1..] {
            let path = self.dir.join(segment_file_name(segment.base_offset, "log"));
            std::fs::remove_file(&path).map_err(io("remove", &path))?;
        }
        for extension in ["index", "timeindex"] {
            for segment in &self.segments[keep..] {
                let path = self
                    .dir
                    .join(segment_file_name(segment.base_offset, extension));
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(JournalError::io("remove", &path, e)),
                }
            }
        }
        let kept = &self.segments[keep];
        let len = if keep == holder { cut } else { kept.len };
        let path = self.dir.join(segment_file_name(kept.base_offset, "log"));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(io("open", &path))?;
        file.set_len(len).map_err(io("truncate", &path))?;
        file.sync_all().map_err(io("fsync", &path))?;
        sync_parent_dir(&path)?;
        let (reopened, _) = PartitionLog::open(&self.dir, self.partition_id, self.config).await?;
        let old = std::mem::replace(self, reopened);
        let old_path = old.active_path();
        close_file(old.active.file, &old_path).await
    }

    /// Batches holding `offset` and after, up to about `bytes_max` bytes (at least one
    /// batch). Every batch read is verified.
    pub fn read_from_offset(&self, offset: u64, bytes_max: u64) -> Result<Vec<Vec<u8>>> {
        self.read_plan(ReadFrom::Offset(offset), self.next_offset(), bytes_max)?
            .read_all()
    }

    /// Batches from the first one stamped at or after `timestamp` (batch base_timestamp,
    /// the primary's clock), up to about `bytes_max` bytes. Empty when none is that late.
    pub fn read_from_timestamp(&self, timestamp: u64, bytes_max: u64) -> Result<Vec<Vec<u8>>> {
        self.read_plan(
            ReadFrom::Timestamp(timestamp),
            self.next_offset(),
            bytes_max,
        )?
        .read_all()
    }

    /// What a read from `from` of the batches below `end_offset`, up to about
    /// `bytes_max` bytes, covers: the segment files and byte ranges, from the index in
    /// memory (no IO). `ReadPlan::read` carries it out, on any thread. An offset outside
    /// the log is `OffsetOutOfRange`.
    pub fn read_plan(&self, from: ReadFrom, end_offset: u64, bytes_max: u64) -> Result<ReadPlan> {
        let first = match from {
            ReadFrom::Offset(offset) => {
                let (start, end) = (self.start_offset(), self.next_offset());
                if offset < start || offset >= end {
                    return Err(JournalError::OffsetOutOfRange { offset, start, end });
                }
                // offset >= start_offset() = segments[0].base_offset: at least 1.
                self.segments.partition_point(|s| s.base_offset <= offset) - 1
            }
            // The last segment whose first batch is older, or the first segment.
            ReadFrom::Timestamp(timestamp) => self
                .segments
                .partition_point(|s| s.index.first_timestamp().is_some_and(|t| t < timestamp))
                .saturating_sub(1),
        };
        let mut spans = Vec::new();
        // Bytes of the segments after the first: every batch of theirs is wanted, while
        // the first may hold only batches before `from` (a timestamp poll's first
        // segment may even end before it), so it does not count toward `bytes_max`.
        let mut planned = 0u64;
        for (i, segment) in self.segments.iter().enumerate().skip(first) {
            if segment.base_offset >= end_offset || planned >= bytes_max {
                break;
            }
            let position = match from {
                ReadFrom::Offset(offset) if i == first => segment
                    .index
                    .position_for_offset(offset - segment.base_offset),
                ReadFrom::Timestamp(timestamp) => segment.index.position_for_timestamp(timestamp),
                ReadFrom::Offset(_) => 0,
            };
            if i > first {
                planned += segment.len - position;
            }
            spans.push(Span {
                path: self.dir.join(segment_file_name(segment.base_offset, "log")),
                position,
                end: segment.len,
            });
        }
        Ok(ReadPlan {
            spans,
            from,
            end_offset,
            bytes_max,
        })
    }

    /// Trims the active file's sector padding, syncs (whatever the policy) and closes.
    pub async fn close(mut self) -> Result<()> {
        let path = self.active_path();
        let len = self.active_segment().len;
        self.active
            .file
            .truncate(len)
            .await
            .map_err(io("truncate", &path))?;
        self.sync().await?;
        close_file(self.active.file, &path).await
    }
}

/// Closes a segment file no planned write or sync still holds.
async fn close_file(file: Rc<DmaFile>, path: &Path) -> Result<()> {
    match Rc::try_unwrap(file) {
        Ok(file) => file.close().await.map_err(io("close", path)),
        Err(_) => Err(JournalError::io(
            "close",
            path,
            std::io::Error::other("a planned write or sync of the file has not completed"),
        )),
    }
}

fn load_index(dir: &Path, base: u64, log_len: u64) -> Option<(SparseIndex, u64)> {
    let offsets = std::fs::read(dir.join(segment_file_name(base, "index"))).ok()?;
    let times = std::fs::read(dir.join(segment_file_name(base, "timeindex"))).ok()?;
    let (index, next_offset) = SparseIndex::decode(&offsets, false, base, log_len)?;
    let (time, time_next) = SparseIndex::decode(&times, true, base, log_len)?;
    (time_next == next_offset && next_offset >= base).then_some(())?;
    Some((index.with_timestamps(&time)?, next_offset))
}

/// Verifies a sealed segment file whole (every batch's checksums, the partition id, the
/// offsets following on from `base`, timestamps that never go back, nothing after the
/// last batch) and writes its index files into `dir` under `base`, so that opening the
/// log there loads them instead of scanning it. Returns the offset after its last
/// batch. A caller that must spread the work (state transfer verifies each received
/// segment while the cluster commits) uses `SealedScan` a step at a time instead.
pub fn index_sealed_segment(
    path: &Path,
    dir: &Path,
    partition_id: u64,
    base: u64,
    config: PartitionConfig,
) -> Result<u64> {
    let segment = scan_sealed(path, partition_id, base, config)?;
    write_index(dir, &segment)?;
    Ok(segment.next_offset)
}

/// Reads and scans a sealed segment whole: anything but a clean end (a torn, corrupt or
/// discontinuous batch) is an error, since a sealed segment is never written again.
fn scan_sealed(
    path: &Path,
    partition_id: u64,
    base: u64,
    config: PartitionConfig,
) -> Result<Segment> {
    let mut scan = SealedScan::open(path, partition_id, base, config, Vec::new())?;
    scan.step(u64::MAX)?;
    Ok(scan.segment())
}

/// Bytes a `SealedScan` reads at a time (more only for a batch longer than this).
pub const SEALED_SCAN_WINDOW: usize = 1 << 20;

/// The verification of a sealed segment (what `index_sealed_segment` checks), a window
/// at a time through one reused buffer. No read copies more than a window (or one
/// batch): a single read of a whole segment is tens of milliseconds in the kernel, long
/// enough to delay the fsyncs of other writers on a small machine.
pub struct SealedScan {
    path: PathBuf,
    file: std::fs::File,
    file_len: u64,
    partition_id: u64,
    base: u64,
    config: PartitionConfig,
    /// File bytes from `buffer_start`, `buffer_len` of them valid.
    buffer: Vec<u8>,
    buffer_start: u64,
    buffer_len: usize,
    /// Where the next batch starts (or the zero padding, once `padding`).
    position: u64,
    next_offset: u64,
    last_timestamp: u64,
    batches: Vec<BatchEntry>,
    /// Past the last batch: the rest must be zero; checked up to here.
    padding: Option<u64>,
    done: bool,
}

impl SealedScan {
    /// Opens the segment at `path`, whose first batch must be `base` of `partition_id`.
    /// `buffer` is reused as the read buffer (pass back `into_buffer` of an earlier scan).
    pub fn open(
        path: &Path,
        partition_id: u64,
        base: u64,
        config: PartitionConfig,
        mut buffer: Vec<u8>,
    ) -> Result<SealedScan> {
        let file = std::fs::File::open(path).map_err(io("open", path))?;
        let file_len = file.metadata().map_err(io("stat", path))?.len();
        if buffer.len() < SEALED_SCAN_WINDOW {
            buffer.resize(SEALED_SCAN_WINDOW, 0);
        }
        Ok(SealedScan {
            path: path.to_path_buf(),
            file,
            file_len,
            partition_id,
            base,
            config,
            buffer,
            buffer_start: 0,
            buffer_len: 0,
            position: 0,
            next_offset: base,
            last_timestamp: 0,
            batches: Vec::new(),
            padding: None,
            done: false,
        })
    }

    /// Verifies about `budget` more bytes (at least one batch or window): the offset
    /// after the last batch once the whole file is verified, None while bytes remain
    /// (never with a budget of `u64::MAX`, which verifies the whole file).
    /// A torn, corrupt or discontinuous batch, or anything but zeros after the last
    /// batch, is `SegmentCorrupt` at its position.
    pub fn step(&mut self, budget: u64) -> Result<Option<u64>> {
        let mut scanned = 0u64;
        while !self.done {
            if scanned >= budget {
                return Ok(None);
            }
            if let Some(checked) = self.padding {
                if checked >= self.file_len {
                    self.done = true;
                    break;
                }
                let want = (self.file_len - checked).min(SEALED_SCAN_WINDOW as u64) as usize;
                let at = self.fill(checked, want)?;
                if self.buffer[at..at + want].iter().any(|b| *b != 0) {
                    return Err(self.corrupt());
                }
                self.padding = Some(checked + want as u64);
                scanned += want as u64;
                continue;
            }
            let left = self.file_len - self.position;
            if left == 0 {
                self.done = true;
                break;
            }
            let head_len = left.min(BATCH_HEADER_SIZE as u64) as usize;
            let at = self.fill(self.position, head_len)?;
            if self.buffer[at..at + head_len].iter().all(|b| *b == 0) {
                self.padding = Some(self.position);
                continue;
            }
            let header = super::scan::header_at(&self.buffer[..self.buffer_len], at)
                .ok_or_else(|| self.corrupt())?;
            let len = header.batch_length.get();
            if len < BATCH_HEADER_SIZE as u64 || len > BATCH_SIZE_MAX || len > left {
                return Err(self.corrupt());
            }
            let at = self.fill(self.position, len as usize)?;
            let mut entry = super::scan::batch_at(&self.buffer[at..at + len as usize], 0)
                .map_err(|_| self.corrupt())?;
            if header.partition_id.get() != self.partition_id
                || entry.base_offset != self.next_offset
                || entry.base_timestamp < self.last_timestamp
            {
                return Err(self.corrupt());
            }
            entry.position = self.position;
            self.next_offset = entry.next_offset();
            self.last_timestamp = entry.base_timestamp;
            self.position += len;
            scanned += len;
            self.batches.push(entry);
        }
        Ok(Some(self.next_offset))
    }

    /// Makes the buffer hold the file's bytes `[from, from + len)`, reading a window
    /// (or `len` if larger) from `from`; their index in the buffer.
    fn fill(&mut self, from: u64, len: usize) -> Result<usize> {
        let end = self.buffer_start + self.buffer_len as u64;
        if from >= self.buffer_start && from + len as u64 <= end {
            return Ok((from - self.buffer_start) as usize);
        }
        let want = len
            .max(SEALED_SCAN_WINDOW)
            .min((self.file_len - from) as usize);
        if self.buffer.len() < want {
            self.buffer.resize(want, 0);
        }
        let filled = read_up_to(&self.file, &mut self.buffer[..want], from)
            .map_err(io("read", &self.path))?;
        if filled < want {
            // Shorter than it was at the open: it changed under the scan.
            self.buffer_len = 0;
            return Err(self.corrupt());
        }
        self.buffer_start = from;
        self.buffer_len = want;
        Ok(0)
    }

    fn corrupt(&self) -> JournalError {
        JournalError::SegmentCorrupt {
            path: self.path.clone(),
            position: self.padding.unwrap_or(self.position),
        }
    }

    fn segment(&self) -> Segment {
        Segment {
            base_offset: self.base,
            next_offset: self.next_offset,
            len: self.position,
            index: SparseIndex::build(self.base, &self.batches, self.config.index_interval_bytes),
        }
    }

    /// Writes the index files of the verified segment into `dir` (after `step` returned
    /// the next offset).
    pub fn write_index(&self, dir: &Path) -> Result<()> {
        if !self.done {
            return Err(JournalError::io(
                "index",
                &self.path,
                std::io::Error::other("the segment is not verified yet"),
            ));
        }
        write_index(dir, &self.segment())
    }

    /// The read buffer, for the next scan.
    pub fn into_buffer(self) -> Vec<u8> {
        self.buffer
    }
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

/// Writes both index files of a sealed segment. They are rebuilt if lost, so a plain
/// write (no fsync) is enough.
fn write_index(dir: &Path, segment: &Segment) -> Result<()> {
    for (time, extension) in [(false, "index"), (true, "timeindex")] {
        let path = dir.join(segment_file_name(segment.base_offset, extension));
        let bytes =
            segment
                .index
                .encode(time, segment.base_offset, segment.next_offset, segment.len);
        std::fs::write(&path, bytes).map_err(io("write", &path))?;
    }
    Ok(())
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
