//! What a partition's log serves: its segments (for state transfer) and the batches
//! from an offset or a timestamp (for polls).

use std::path::PathBuf;

use super::{segment_file_name, PartitionLog, Segment};
use crate::error::{JournalError, Result};
use crate::segment::read::{ReadFrom, ReadPlan, Span};

impl PartitionLog {
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
    pub(super) fn batch_position(&self, segment: &Segment, offset: u64) -> Result<Option<u64>> {
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
}
