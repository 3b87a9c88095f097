//! Sans-IO scan of a segment file image: the batches it holds, where the valid prefix
//! ends, and whether what follows is a clean end, a torn tail (the last append of a crash)
//! or damage before the end.
//!
//! Records are message batches packed back to back (`wire::batch`), each carrying its
//! own `batch_length` and `batch_checksum`; the file is zero-padded to a sector. A batch
//! that fails verification is damage in the middle if a valid batch of this partition
//! with a later offset follows it. A failing last batch is a torn tail only with evidence
//! of an incomplete write (its header or its last 512-byte blocks never landed, or it
//! runs past the end of the file with a length that is not itself the damage);
//! otherwise it is corruption of a complete batch and reported as such.

use replication::wire::batch::{
    verify, BatchError, BatchHeader, MessageHeader, BATCH_HEADER_SIZE, MESSAGE_HEADER_SIZE,
};

use serde::Serialize;
use zerocopy::FromBytes;

/// Largest batch accepted (message_bus.max_message_size): a record claiming more is not
/// a batch.
pub const BATCH_SIZE_MAX: u64 = 64 * 1024 * 1024;

/// One verified batch in a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BatchEntry {
    /// Byte position of the batch in the segment file.
    pub position: u64,
    pub len: u64,
    pub base_offset: u64,
    pub message_count: u32,
    pub base_timestamp: u64,
}

impl BatchEntry {
    /// The offset after this batch's last message.
    pub fn next_offset(&self) -> u64 {
        self.base_offset + u64::from(self.message_count)
    }
}

/// How the valid prefix of a segment ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum SegmentTail {
    /// Zero padding (or the end of the file) follows the last batch.
    Clean,
    /// An incomplete or failing last batch: the torn write of a crash; truncated.
    Torn { position: u64, reason: String },
    /// A failing batch that was completely written: damage, not a torn write.
    Corrupt {
        position: u64,
        reason: String,
        /// Position of the next valid batch after the damage (none if it was the last).
        resumes_at: Option<u64>,
    },
    /// A verified batch that does not follow its predecessor (wrong partition, offset
    /// gap, or time going backwards): never silently accepted.
    Discontinuity { position: u64, reason: String },
}

/// The scan of one segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentScan {
    pub batches: Vec<BatchEntry>,
    /// Bytes of the valid prefix.
    pub valid_len: u64,
    pub tail: SegmentTail,
}

impl SegmentScan {
    /// The offset after the last valid batch (`base_offset` when empty).
    pub fn next_offset(&self, base_offset: u64) -> u64 {
        self.batches
            .last()
            .map_or(base_offset, BatchEntry::next_offset)
    }
}

pub(crate) fn header_at(image: &[u8], position: usize) -> Option<BatchHeader> {
    BatchHeader::read_from_bytes(image.get(position..position + BATCH_HEADER_SIZE)?).ok()
}

/// Verifies the batch at `position`, returning its entry.
pub(crate) fn batch_at(image: &[u8], position: usize) -> Result<BatchEntry, String> {
    let header =
        header_at(image, position).ok_or_else(|| "batch header runs past the end".to_string())?;
    let len = header.batch_length.get();
    let end = (position as u64)
        .checked_add(len)
        .filter(|end| *end <= image.len() as u64);
    let Some(end) = end else {
        return Err(format!("batch_length {len} runs past the end of the file"));
    };
    if len < BATCH_HEADER_SIZE as u64 {
        return Err(BatchError::TooShort { len: len as usize }.to_string());
    }
    let info = verify(&image[position..end as usize]).map_err(|e| e.to_string())?;
    Ok(BatchEntry {
        position: position as u64,
        len,
        base_offset: info.base_offset,
        message_count: info.message_count,
        base_timestamp: info.base_timestamp,
    })
}

/// Looks past damage at `from` for a valid batch of `partition_id` at an offset at or
/// after `offset_min`. Cheap header filters run first; only candidates are verified.
fn find_resume(image: &[u8], from: usize, partition_id: u64, offset_min: u64) -> Option<usize> {
    (from + 1..image.len().saturating_sub(BATCH_HEADER_SIZE - 1)).find(|&position| {
        let Some(header) = header_at(image, position) else {
            return false;
        };
        header.partition_id.get() == partition_id
            && header.base_offset.get() >= offset_min
            && header.batch_length.get() >= BATCH_HEADER_SIZE as u64
            && header.message_count.get() > 0
            && batch_at(image, position).is_ok()
    })
}

/// Granularity of device writes that can go missing in a torn write.
const BLOCK_SIZE: usize = 512;

/// Whether the failing last batch at `position` shows signs of an incomplete write.
fn torn_evidence(image: &[u8], position: usize) -> bool {
    let Some(header) = header_at(image, position) else {
        return true; // the file ends inside the header
    };
    let head = &image[position..position + BATCH_HEADER_SIZE];
    if head.iter().all(|b| *b == 0) {
        return true; // the header never landed; later blocks of the write did
    }
    let len = header.batch_length.get();
    if len < BATCH_HEADER_SIZE as u64 || len > BATCH_SIZE_MAX {
        return false; // a complete header with an impossible length: damage
    }
    let end = position as u64 + len;
    if end > image.len() as u64 {
        // The write did not extend the file fully, unless the length field is what broke.
        return !retiles_with_other_length(image, position, &header);
    }
    // The batch's last device block (file-aligned) is still zero: never written.
    let end = end as usize;
    let block_start = ((end - 1) / BLOCK_SIZE * BLOCK_SIZE).max(position + BATCH_HEADER_SIZE);
    block_start < end && image[block_start..end].iter().all(|b| *b == 0)
}

/// Whether the message frames after the header tile a batch that verifies once its
/// `batch_length` is replaced: then the stored length was damaged in a complete batch.
fn retiles_with_other_length(image: &[u8], position: usize, header: &BatchHeader) -> bool {
    let mut at = position + BATCH_HEADER_SIZE;
    for _ in 0..header.message_count.get() {
        let Some(frame) = image.get(at..at + MESSAGE_HEADER_SIZE) else {
            return false;
        };
        let Ok(message) = MessageHeader::read_from_bytes(frame) else {
            return false;
        };
        at += MESSAGE_HEADER_SIZE
            + message.payload_length.get() as usize
            + message.user_headers_length.get() as usize;
        if at > image.len() {
            return false;
        }
    }
    let mut copy = image[position..at].to_vec();
    copy[32..40].copy_from_slice(&((at - position) as u64).to_le_bytes());
    verify(&copy).is_ok()
}

/// The partition a segment belongs to, for tools that are handed only a file: that of
/// the first batch that verifies (0 if none does).
pub fn guess_partition(image: &[u8]) -> u64 {
    (0..image.len().saturating_sub(BATCH_HEADER_SIZE - 1))
        .find_map(|position| {
            let header = header_at(image, position)?;
            let plausible = header.batch_length.get() >= BATCH_HEADER_SIZE as u64
                && header.message_count.get() > 0
                && position as u64 + header.batch_length.get() <= image.len() as u64;
            (plausible && batch_at(image, position).is_ok()).then(|| header.partition_id.get())
        })
        .unwrap_or(0)
}

/// Scans a segment image whose first batch must start at `base_offset` and belong to
/// `partition_id`.
pub fn scan_segment(image: &[u8], partition_id: u64, base_offset: u64) -> SegmentScan {
    let mut batches: Vec<BatchEntry> = Vec::new();
    let mut position = 0usize;
    let mut next_offset = base_offset;
    let mut last_timestamp = 0u64;
    let tail = loop {
        let rest = &image[position..];
        let head = &rest[..rest.len().min(BATCH_HEADER_SIZE)];
        if head.iter().all(|b| *b == 0) {
            // Zero padding; anything non-zero beyond is an append whose header tore.
            if rest.iter().all(|b| *b == 0) {
                break SegmentTail::Clean;
            }
        }
        match batch_at(image, position) {
            Ok(entry) => {
                let header = header_at(image, position);
                let partition = header.map_or(0, |h| h.partition_id.get());
                let broken = if partition != partition_id {
                    Some(format!("partition_id {partition}, expected {partition_id}"))
                } else if entry.base_offset != next_offset {
                    Some(format!(
                        "base_offset {}, expected {next_offset}",
                        entry.base_offset
                    ))
                } else if entry.base_timestamp < last_timestamp {
                    Some(format!(
                        "base_timestamp {} before {last_timestamp}",
                        entry.base_timestamp
                    ))
                } else {
                    None
                };
                if let Some(reason) = broken {
                    break SegmentTail::Discontinuity {
                        position: position as u64,
                        reason,
                    };
                }
                next_offset = entry.next_offset();
                last_timestamp = entry.base_timestamp;
                position += entry.len as usize;
                batches.push(entry);
            }
            Err(reason) => {
                let resumes_at = find_resume(image, position, partition_id, next_offset);
                break if resumes_at.is_none() && torn_evidence(image, position) {
                    SegmentTail::Torn {
                        position: position as u64,
                        reason,
                    }
                } else {
                    SegmentTail::Corrupt {
                        position: position as u64,
                        reason,
                        resumes_at: resumes_at.map(|r| r as u64),
                    }
                };
            }
        }
    };
    SegmentScan {
        batches,
        valid_len: position as u64,
        tail,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use replication::wire::batch::{stamp, BatchBuilder, NewMessage};

    /// A stamped batch of `count` messages at `base_offset`.
    pub(crate) fn batch(
        partition_id: u64,
        base_offset: u64,
        timestamp: u64,
        count: u32,
    ) -> Vec<u8> {
        let mut builder = BatchBuilder::with_capacity(1024);
        for i in 0..count {
            let payload = vec![(base_offset as u8).wrapping_add(i as u8); 40 + i as usize];
            builder.push(NewMessage {
                id: u128::from(base_offset + u64::from(i)),
                timestamp_delta: i,
                payload: &payload,
                user_headers: &[],
            });
        }
        let mut bytes = builder.finish(timestamp);
        stamp(&mut bytes, partition_id, base_offset, timestamp).unwrap();
        bytes
    }

    fn image(batches: &[Vec<u8>], pad: usize) -> Vec<u8> {
        let mut image: Vec<u8> = batches.concat();
        image.resize(image.len() + pad, 0);
        image
    }

    fn three() -> Vec<Vec<u8>> {
        vec![
            batch(9, 100, 1000, 3),
            batch(9, 103, 1001, 2),
            batch(9, 105, 1005, 4),
        ]
    }

    #[test]
    fn clean_segment_scans_every_batch() {
        let scan = scan_segment(&image(&three(), 700), 9, 100);
        assert_eq!(scan.tail, SegmentTail::Clean);
        assert_eq!(scan.batches.len(), 3);
        assert_eq!(scan.next_offset(100), 109);
        assert_eq!(
            scan.valid_len,
            three().iter().map(|b| b.len() as u64).sum::<u64>()
        );
    }

    #[test]
    fn cut_last_batch_is_a_torn_tail() {
        let mut bytes = image(&three(), 0);
        // The write's last 512-byte block never landed.
        let cut = (bytes.len() - 1) / 512 * 512;
        bytes.truncate(cut);
        bytes.resize(cut + 1000, 0);
        let scan = scan_segment(&bytes, 9, 100);
        assert!(
            matches!(scan.tail, SegmentTail::Torn { .. }),
            "{:?}",
            scan.tail
        );
        assert_eq!(scan.next_offset(100), 105);
    }

    #[test]
    fn damaged_middle_batch_is_corrupt_not_torn() {
        let batches = three();
        let mut bytes = image(&batches, 100);
        let middle = batches[0].len() + 300;
        bytes[middle] ^= 0x04;
        let scan = scan_segment(&bytes, 9, 100);
        assert!(
            matches!(scan.tail, SegmentTail::Corrupt { resumes_at: Some(r), .. } if r as usize == batches[0].len() + batches[1].len()),
            "{:?}",
            scan.tail
        );
        assert_eq!(scan.batches.len(), 1);
    }

    #[test]
    fn damaged_length_field_in_the_middle_is_still_found() {
        let batches = three();
        let mut bytes = image(&batches, 0);
        bytes[batches[0].len() + 33] ^= 0x7F; // batch_length of the second batch
        let scan = scan_segment(&bytes, 9, 100);
        assert!(
            matches!(scan.tail, SegmentTail::Corrupt { .. }),
            "{:?}",
            scan.tail
        );
    }

    #[test]
    fn flipped_byte_in_a_complete_last_batch_is_corrupt_not_torn() {
        let batches = three();
        let mut bytes = image(&batches, 300);
        let at = bytes.len() - 300 - 20;
        bytes[at] ^= 0x01;
        let scan = scan_segment(&bytes, 9, 100);
        assert!(
            matches!(
                scan.tail,
                SegmentTail::Corrupt {
                    resumes_at: None,
                    ..
                }
            ),
            "{:?}",
            scan.tail
        );
    }

    #[test]
    fn damaged_length_of_the_last_batch_is_corrupt_not_torn() {
        let batches = three();
        let mut bytes = image(&batches, 300);
        let at = batches[0].len() + batches[1].len() + 33;
        bytes[at] ^= 0x40; // batch_length now runs far past the end
        let scan = scan_segment(&bytes, 9, 100);
        assert!(
            matches!(
                scan.tail,
                SegmentTail::Corrupt {
                    resumes_at: None,
                    ..
                }
            ),
            "{:?}",
            scan.tail
        );
    }

    #[test]
    fn last_batch_missing_its_final_blocks_is_torn() {
        let batches = vec![batch(9, 0, 1, 2), batch(9, 2, 2, 40)];
        let mut bytes = image(&batches, 0);
        let end = bytes.len();
        bytes[end - 700..].fill(0);
        let scan = scan_segment(&bytes, 9, 0);
        assert!(
            matches!(scan.tail, SegmentTail::Torn { .. }),
            "{:?}",
            scan.tail
        );
        assert_eq!(scan.batches.len(), 1);
    }

    #[test]
    fn zeroed_sector_in_the_middle_is_corrupt() {
        let batches = vec![
            batch(9, 0, 1, 60),
            batch(9, 60, 2, 60),
            batch(9, 120, 3, 60),
        ];
        let mut bytes = image(&batches, 0);
        let at = batches[0].len() + 512;
        bytes[at..at + 512].fill(0);
        let scan = scan_segment(&bytes, 9, 0);
        assert!(
            matches!(scan.tail, SegmentTail::Corrupt { .. }),
            "{:?}",
            scan.tail
        );
    }

    #[test]
    fn batch_of_another_partition_or_offset_is_a_discontinuity() {
        let bytes = image(&[batch(9, 100, 1, 1), batch(8, 101, 1, 1)], 0);
        assert!(matches!(
            scan_segment(&bytes, 9, 100).tail,
            SegmentTail::Discontinuity { .. }
        ));
        let bytes = image(&[batch(9, 100, 1, 1), batch(9, 150, 1, 1)], 0);
        assert!(matches!(
            scan_segment(&bytes, 9, 100).tail,
            SegmentTail::Discontinuity { .. }
        ));
    }
}
