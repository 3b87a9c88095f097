//! Sealed segments verified whole before they are trusted: every batch's checksums,
//! the partition id, offsets following on from the base, timestamps that never go
//! back and nothing but zeros after the last batch. Opening a log uses it for a sealed
//! segment without index files; state transfer for each segment it receives, a window
//! at a time.

use std::path::{Path, PathBuf};

use replication::wire::batch::BATCH_HEADER_SIZE;

use super::index::SparseIndex;
use super::log::{io, write_index, PartitionConfig, Segment};
use super::read::read_up_to;
use super::scan::{BatchEntry, BATCH_SIZE_MAX};
use crate::error::{JournalError, Result};

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
pub(super) fn scan_sealed(
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
    pub(super) file: std::fs::File,
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
    pub(super) batches: Vec<BatchEntry>,
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

    pub(super) fn segment(&self) -> Segment {
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
