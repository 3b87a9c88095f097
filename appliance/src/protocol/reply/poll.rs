//! A PollMessages reply: its head and its batches, split and checked.

use replication::wire::batch::{self, BatchInfo, BATCH_HEADER_SIZE};

use crate::protocol::codec::{BodyError, Reader, Writer};

/// The head of a PollMessages reply (Iggy's PolledMessages), before its batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollHeader {
    pub partition_id: u32,
    /// The partition's last committed offset (0 when it holds none).
    pub current_offset: u64,
    /// Messages in the batches that follow.
    pub messages_count: u32,
}

impl PollHeader {
    pub const SIZE: usize = 16;

    pub fn write(&self, w: &mut Writer) {
        w.u32(self.partition_id)
            .u64(self.current_offset)
            .u32(self.messages_count);
    }

    pub fn decode(body: &[u8]) -> Result<PollHeader, BodyError> {
        let mut r = Reader::new(body);
        Ok(PollHeader {
            partition_id: r.u32("partition_id")?,
            current_offset: r.u64("current_offset")?,
            messages_count: r.u32("messages_count")?,
        })
    }
}

/// Why a poll reply does not split into whole, valid batches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PollBodyError {
    /// Bytes at `at` are too few for a batch header, or batch_length overruns the body.
    Framing { at: usize, batch_length: u64 },
    /// The batch at `at` fails wire::batch::verify_served.
    Batch { at: usize, error: batch::BatchError },
    /// Shorter than the reply's header.
    Header,
    /// The header counts `counted` messages, the batches hold `held`.
    Count { counted: u32, held: u64 },
}

impl core::fmt::Display for PollBodyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PollBodyError::Framing { at, batch_length } => write!(
                f,
                "batch at byte {at} (batch_length {batch_length}) does not fit the reply"
            ),
            PollBodyError::Batch { at, error } => write!(f, "batch at byte {at}: {error}"),
            PollBodyError::Header => write!(f, "shorter than its 16-byte header"),
            PollBodyError::Count { counted, held } => {
                write!(
                    f,
                    "header counts {counted} messages, the batches hold {held}"
                )
            }
        }
    }
}

impl std::error::Error for PollBodyError {}

/// PollMessages: reads the reply's header, splits the rest (zero or more served
/// batches, concatenated) by each batch's batch_length and verifies every one (message
/// checksums, tiling, batch_checksum) and their count against the header. Returns each
/// batch's bytes with what verify read from it (base_offset: its first message's).
pub fn split_poll_body(body: &[u8]) -> Result<Vec<(&[u8], BatchInfo)>, PollBodyError> {
    let header = PollHeader::decode(body).map_err(|_| PollBodyError::Header)?;
    let batches = split_batches(&body[PollHeader::SIZE..])?;
    let held: u64 = batches
        .iter()
        .map(|(_, i)| u64::from(i.message_count))
        .sum();
    if held != u64::from(header.messages_count) {
        return Err(PollBodyError::Count {
            counted: header.messages_count,
            held,
        });
    }
    Ok(batches)
}

/// Splits served batches; `at` in errors counts from the start of the reply.
fn split_batches(body: &[u8]) -> Result<Vec<(&[u8], BatchInfo)>, PollBodyError> {
    let mut batches = Vec::new();
    let mut offset = 0;
    while offset < body.len() {
        let at = PollHeader::SIZE + offset;
        let rest = &body[offset..];
        let batch_length = rest
            .get(32..40)
            .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .unwrap_or(0);
        if rest.len() < BATCH_HEADER_SIZE
            || batch_length < BATCH_HEADER_SIZE as u64
            || batch_length > rest.len() as u64
        {
            return Err(PollBodyError::Framing { at, batch_length });
        }
        let bytes = &rest[..batch_length as usize];
        let info =
            batch::verify_served(bytes).map_err(|error| PollBodyError::Batch { at, error })?;
        batches.push((bytes, info));
        offset += bytes.len();
    }
    Ok(batches)
}
