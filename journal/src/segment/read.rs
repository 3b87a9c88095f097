//! Reads of a partition log away from its owner: `PartitionLog::read_plan` notes which
//! files and byte ranges a read covers (memory only, on the thread that owns the log);
//! `ReadPlan::read` then does the file IO and the verification on any thread, a window
//! at a time through one buffer, and hands each verified batch to the caller in place.
//!
//! A plan holds no handle on the log: the log may append, roll or delete segments
//! meanwhile. Bytes below a plan's ranges never change once written (a log only grows
//! at its end, and a truncation only cuts batches above the commit point, which a plan
//! stops before); a segment deleted by retention before the read opens it is
//! `JournalError::Io` with `NotFound`.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use replication::wire::batch::{verify, BatchInfo, BATCH_HEADER_SIZE};

use super::scan::{header_at, BATCH_SIZE_MAX};
use crate::error::{JournalError, Result};

/// Bytes a read asks the file for at a time (more only for a batch longer than this).
pub const READ_WINDOW: usize = 1 << 20;

/// Where a read starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFrom {
    /// The batch holding this offset.
    Offset(u64),
    /// The first batch stamped at or after this time (its base_timestamp).
    Timestamp(u64),
}

/// One segment's part of a read: its file and the byte range to scan.
#[derive(Clone, Debug)]
pub(super) struct Span {
    pub path: PathBuf,
    /// Where the scan starts (a batch boundary, from the sparse index).
    pub position: u64,
    /// The segment's length when the plan was made: the scan ends there.
    pub end: u64,
}

/// What a read covers, made by `PartitionLog::read_plan`; `read` carries it out.
#[derive(Clone, Debug)]
pub struct ReadPlan {
    pub(super) spans: Vec<Span>,
    pub(super) from: ReadFrom,
    /// Batches at or past this offset are not read (the commit point of the caller).
    pub(super) end_offset: u64,
    /// Batch bytes handed out at most (at least one batch).
    pub(super) bytes_max: u64,
}

impl ReadPlan {
    /// Reads the planned batches in order, verifying each (checksums and tiling), and
    /// hands each to `visit` with its info until `visit` returns false, `bytes_max`
    /// bytes were handed out, or the batches reach `end_offset`. Blocking file IO: run
    /// it where a blocked thread stalls nothing else.
    pub fn read(&self, visit: &mut dyn FnMut(&[u8], &BatchInfo) -> bool) -> Result<()> {
        let mut buffer = Vec::new();
        let mut total = 0u64;
        for span in &self.spans {
            let file = std::fs::File::open(&span.path).map_err(io("open", &span.path))?;
            let mut window = Window {
                file,
                span,
                buffer: &mut buffer,
                start: 0,
                len: 0,
            };
            let mut position = span.position;
            while position + BATCH_HEADER_SIZE as u64 <= span.end {
                let head = window.fill(position, BATCH_HEADER_SIZE)?;
                let header = header_at(head, 0).ok_or_else(|| corrupt(span, position))?;
                if header.base_offset.get() >= self.end_offset {
                    return Ok(());
                }
                let len = header.batch_length.get();
                if len < BATCH_HEADER_SIZE as u64
                    || len > BATCH_SIZE_MAX
                    || position + len > span.end
                {
                    return Err(corrupt(span, position));
                }
                let bytes = window.fill(position, len as usize)?;
                let info = verify(bytes).map_err(|_| corrupt(span, position))?;
                position += len;
                let wanted = match self.from {
                    ReadFrom::Offset(offset) => info.next_offset() > offset,
                    ReadFrom::Timestamp(timestamp) => info.base_timestamp >= timestamp,
                };
                if !wanted {
                    continue;
                }
                total += len;
                if !visit(bytes, &info) || total >= self.bytes_max {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// About the bytes the read hands out (for sizing a buffer).
    pub fn bytes_hint(&self) -> usize {
        let planned: u64 = self.spans.iter().map(|s| s.end - s.position).sum();
        usize::try_from(planned.min(self.bytes_max)).unwrap_or(usize::MAX)
    }

    /// The planned batches as owned buffers.
    pub fn read_all(&self) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        self.read(&mut |bytes, _| {
            out.push(bytes.to_vec());
            true
        })?;
        Ok(out)
    }
}

fn io<'a>(
    op: &'static str,
    path: &'a std::path::Path,
) -> impl Fn(std::io::Error) -> JournalError + 'a {
    move |e| JournalError::io(op, path, e)
}

/// Reads `buffer.len()` bytes of `file` at `at`, fewer only where the file ends: the
/// bytes read.
pub(super) fn read_up_to(
    file: &std::fs::File,
    buffer: &mut [u8],
    at: u64,
) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read_at(&mut buffer[filled..], at + filled as u64)? {
            0 => break,
            read => filled += read,
        }
    }
    Ok(filled)
}

fn corrupt(span: &Span, position: u64) -> JournalError {
    JournalError::SegmentCorrupt {
        path: span.path.clone(),
        position,
    }
}

/// The span's file bytes `[start, start + len)` in `buffer`, refilled a window at a time.
struct Window<'a> {
    file: std::fs::File,
    span: &'a Span,
    buffer: &'a mut Vec<u8>,
    start: u64,
    len: usize,
}

impl Window<'_> {
    /// The span's bytes `[from, from + len)`, reading a window (or `len` if larger) at
    /// `from` unless the buffer holds them. The caller keeps `from + len` within the span.
    fn fill(&mut self, from: u64, len: usize) -> Result<&[u8]> {
        if from < self.start || from + len as u64 > self.start + self.len as u64 {
            let want = len.max(READ_WINDOW.min((self.span.end - from) as usize));
            if self.buffer.len() < want {
                self.buffer.resize(want, 0);
            }
            let filled = read_up_to(&self.file, &mut self.buffer[..want], from)
                .map_err(io("read", &self.span.path))?;
            self.start = from;
            self.len = filled;
            if filled < len {
                // Shorter than when the plan was made: not a file this log wrote.
                return Err(corrupt(self.span, from));
            }
        }
        let at = (from - self.start) as usize;
        Ok(&self.buffer[at..at + len])
    }
}
