//! A partition's segment log: message batches appended with direct IO to segment files
//! named by base offset, rolled at a configured size, with sparse offset and timestamp
//! indexes, reads by offset and by timestamp, and deletion of old segments.
//!
//! Batches are packed; each append rewrites the last partial sector (kept in memory)
//! followed by the new batch, zero-padded to a sector, at a sector-aligned position.
//! When that write is forced to stable storage is the partition's `message_durability`.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use glommio::io::{DmaFile, OpenOptions};
use replication::wire::batch::{
    check_stamp, check_stamp_of_verified, BatchInfo, PartitionPosition,
};
use serde::Serialize;

use super::index::SparseIndex;
use super::scan::BatchEntry;
pub use super::scan::BATCH_SIZE_MAX;
pub use super::sealed::{index_sealed_segment, SealedScan, SEALED_SCAN_WINDOW};
use crate::buffers::BufferPool;
use crate::durability::{Durability, SyncSchedule};
use crate::error::{JournalError, Result};
use crate::journal::sync_parent_dir;
use crate::layout::{sector_ceil, sector_floor, SECTOR_SIZE};

mod open;
mod reads;

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
pub(super) struct Segment {
    pub(super) base_offset: u64,
    pub(super) next_offset: u64,
    pub(super) len: u64,
    pub(super) index: SparseIndex,
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

pub(super) fn io<'a, E: crate::error::IntoIoError>(
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

/// Writes both index files of a sealed segment. They are rebuilt if lost, so a plain
/// write (no fsync) is enough.
pub(super) fn write_index(dir: &Path, segment: &Segment) -> Result<()> {
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
