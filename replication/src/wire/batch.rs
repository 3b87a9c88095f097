//! The message batch (docs/protocol.md, "Message batch"): the SendMessages body, the
//! partition-plane prepare body, the segment record and the poll reply.
//!
//! `[batch header: 256 bytes][message frames]`, each frame
//! `[48-byte message header][payload][user headers]`. Message frames are packed, so
//! their headers are read with unaligned little-endian types.

use xxhash_rust::xxh3::{xxh3_64, Xxh3Default};
use zerocopy::little_endian::{U128, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Size of the batch header.
pub const BATCH_HEADER_SIZE: usize = 256;
/// Size of each message header.
pub const MESSAGE_HEADER_SIZE: usize = 48;

/// Batch header, bytes 0..256 of a batch.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
pub struct BatchHeader {
    pub partition_id: U64,
    pub base_offset: U64,
    pub base_timestamp: U64,
    pub origin_timestamp: U64,
    pub batch_length: U64,
    pub batch_checksum: U64,
    pub message_count: U32,
    pub reserved: [u8; 204],
}

/// Message header, bytes 0..48 of a message frame.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
pub struct MessageHeader {
    pub checksum: U64,
    pub id: U128,
    pub offset_delta: U32,
    pub timestamp_delta: U32,
    pub user_headers_length: U32,
    pub payload_length: U32,
    pub reserved: [u8; 8],
}

const _: () = {
    assert!(core::mem::size_of::<BatchHeader>() == BATCH_HEADER_SIZE);
    assert!(core::mem::offset_of!(BatchHeader, batch_checksum) == 40);
    assert!(core::mem::offset_of!(BatchHeader, message_count) == 48);
    assert!(core::mem::size_of::<MessageHeader>() == MESSAGE_HEADER_SIZE);
    assert!(core::mem::offset_of!(MessageHeader, offset_delta) == 24);
    assert!(core::mem::offset_of!(MessageHeader, payload_length) == 36);
};

/// Why a batch failed verification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchError {
    /// Fewer than 256 bytes.
    TooShort { len: usize },
    /// batch_length does not match the bytes.
    LengthMismatch { batch_length: u64, len: usize },
    /// Reserved bytes of the batch header or of a message header are not zero.
    ReservedNonZero { message: Option<u32> },
    /// A message header or its payload runs past the end of the batch.
    MessageOverrun { message: u32 },
    /// A message's checksum does not match its bytes.
    MessageChecksum { message: u32 },
    /// A message's offset_delta is not its index in the batch.
    OffsetDelta { message: u32, offset_delta: u32 },
    /// The frames do not tile the batch: bytes left over after message_count frames.
    TrailingBytes { message_count: u32, trailing: usize },
    /// batch_checksum does not match.
    BatchChecksum { stored: u64, computed: u64 },
    /// A batch with no messages.
    Empty,
    /// A stamp does not match the receiver's own position.
    StampMismatch {
        field: &'static str,
        expected: u64,
        found: u64,
    },
}

impl core::fmt::Display for BatchError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            BatchError::TooShort { len } => write!(
                f,
                "batch of {len} bytes is shorter than its 256-byte header"
            ),
            BatchError::LengthMismatch { batch_length, len } => {
                write!(f, "batch_length {batch_length} does not match {len} bytes")
            }
            BatchError::ReservedNonZero { message: None } => {
                write!(f, "batch header reserved bytes are not zero")
            }
            BatchError::ReservedNonZero { message: Some(m) } => {
                write!(f, "message {m} reserved bytes are not zero")
            }
            BatchError::MessageOverrun { message } => {
                write!(f, "message {message} runs past the end of the batch")
            }
            BatchError::MessageChecksum { message } => {
                write!(f, "message {message} checksum mismatch")
            }
            BatchError::OffsetDelta {
                message,
                offset_delta,
            } => write!(f, "message {message} has offset_delta {offset_delta}"),
            BatchError::TrailingBytes {
                message_count,
                trailing,
            } => write!(f, "{trailing} bytes follow the {message_count} messages"),
            BatchError::BatchChecksum { stored, computed } => {
                write!(f, "batch_checksum {stored:#x} != computed {computed:#x}")
            }
            BatchError::Empty => write!(f, "batch holds no messages"),
            BatchError::StampMismatch {
                field,
                expected,
                found,
            } => write!(f, "stamp {field} is {found}, expected {expected}"),
        }
    }
}

impl std::error::Error for BatchError {}

/// A message as the builder takes it.
#[derive(Clone, Copy, Debug)]
pub struct NewMessage<'a> {
    pub id: u128,
    pub timestamp_delta: u32,
    pub payload: &'a [u8],
    pub user_headers: &'a [u8],
}

/// Encodes messages into a batch; the result is unstamped until `stamp`.
#[derive(Debug)]
pub struct BatchBuilder {
    bytes: Vec<u8>,
    count: u32,
}

impl BatchBuilder {
    /// A builder with room for `capacity` bytes of messages.
    pub fn with_capacity(capacity: usize) -> BatchBuilder {
        let mut bytes = Vec::with_capacity(BATCH_HEADER_SIZE + capacity);
        bytes.resize(BATCH_HEADER_SIZE, 0);
        BatchBuilder { bytes, count: 0 }
    }

    /// Appends one message, computing its checksum.
    pub fn push(&mut self, message: NewMessage<'_>) {
        let start = self.bytes.len();
        let header = MessageHeader {
            checksum: U64::new(0),
            id: U128::new(message.id),
            offset_delta: U32::new(self.count),
            timestamp_delta: U32::new(message.timestamp_delta),
            user_headers_length: U32::new(len_u32(message.user_headers.len())),
            payload_length: U32::new(len_u32(message.payload.len())),
            reserved: [0; 8],
        };
        self.bytes.extend_from_slice(header.as_bytes());
        self.bytes.extend_from_slice(message.payload);
        self.bytes.extend_from_slice(message.user_headers);
        let checksum = xxh3_64(&self.bytes[start + 8..]);
        self.bytes[start..start + 8].copy_from_slice(&checksum.to_le_bytes());
        self.count += 1;
    }

    /// Messages pushed so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Writes the header (with the producer's origin timestamp) and returns the batch,
    /// unstamped: partition_id, base_offset and base_timestamp are zero.
    pub fn finish(mut self, origin_timestamp: u64) -> Vec<u8> {
        let batch_length = self.bytes.len() as u64;
        let header = BatchHeader::mut_from_prefix(&mut self.bytes[..])
            .map(|(h, _)| h)
            .unwrap_or_else(|_| unreachable!("buffer starts with 256 header bytes"));
        header.origin_timestamp = U64::new(origin_timestamp);
        header.batch_length = U64::new(batch_length);
        header.message_count = U32::new(self.count);
        let count = self.count;
        let checksum = batch_checksum(&self.bytes, count).unwrap_or(0);
        set_batch_checksum(&mut self.bytes, checksum);
        self.bytes
    }
}

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

fn header_of(batch: &[u8]) -> Result<&BatchHeader, BatchError> {
    BatchHeader::ref_from_prefix(batch)
        .map(|(h, _)| h)
        .map_err(|_| BatchError::TooShort { len: batch.len() })
}

fn set_batch_checksum(batch: &mut [u8], checksum: u64) {
    batch[40..48].copy_from_slice(&checksum.to_le_bytes());
}

/// Walks the message frames of a batch without hashing payloads, handing each message's
/// index, byte range and header to `visit`. Checks tiling and bounds.
fn walk(
    batch: &[u8],
    message_count: u32,
    mut visit: impl FnMut(u32, &[u8], &MessageHeader) -> Result<(), BatchError>,
) -> Result<(), BatchError> {
    let mut at = BATCH_HEADER_SIZE;
    for index in 0..message_count {
        let overrun = BatchError::MessageOverrun { message: index };
        let rest = batch.get(at..).ok_or(overrun.clone())?;
        let (header, _) = MessageHeader::ref_from_prefix(rest).map_err(|_| overrun.clone())?;
        let frame_len = MESSAGE_HEADER_SIZE as u64
            + u64::from(header.payload_length.get())
            + u64::from(header.user_headers_length.get());
        if frame_len > rest.len() as u64 {
            return Err(overrun);
        }
        let frame_len = frame_len as usize;
        visit(index, &rest[..frame_len], header)?;
        at += frame_len;
    }
    if at != batch.len() {
        return Err(BatchError::TrailingBytes {
            message_count,
            trailing: batch.len() - at,
        });
    }
    Ok(())
}

/// Feeds message checksum fields to the batch hasher in blocks: one streaming update
/// per 8-byte field costs about a tenth of verify's time on 1 KiB messages.
struct ChecksumFeed {
    hasher: Xxh3Default,
    block: [u8; CHECKSUM_FEED_BLOCK],
    len: usize,
}

const CHECKSUM_FEED_BLOCK: usize = 8 * 256;

impl ChecksumFeed {
    fn new(header: &BatchHeader) -> ChecksumFeed {
        let mut hasher = Xxh3Default::new();
        let mut stamp = [0u8; 44];
        stamp[0..8].copy_from_slice(&header.partition_id.get().to_le_bytes());
        stamp[8..16].copy_from_slice(&header.base_offset.get().to_le_bytes());
        stamp[16..24].copy_from_slice(&header.base_timestamp.get().to_le_bytes());
        stamp[24..32].copy_from_slice(&header.origin_timestamp.get().to_le_bytes());
        stamp[32..40].copy_from_slice(&header.batch_length.get().to_le_bytes());
        stamp[40..44].copy_from_slice(&header.message_count.get().to_le_bytes());
        hasher.update(&stamp);
        ChecksumFeed {
            hasher,
            block: [0; CHECKSUM_FEED_BLOCK],
            len: 0,
        }
    }

    fn push(&mut self, checksum: &[u8]) {
        self.block[self.len..self.len + 8].copy_from_slice(&checksum[..8]);
        self.len += 8;
        if self.len == CHECKSUM_FEED_BLOCK {
            self.hasher.update(&self.block);
            self.len = 0;
        }
    }

    fn digest(mut self) -> u64 {
        self.hasher.update(&self.block[..self.len]);
        self.hasher.digest()
    }
}

/// batch_checksum over the stamp fields and every message's checksum field.
fn batch_checksum(batch: &[u8], message_count: u32) -> Result<u64, BatchError> {
    let mut feed = ChecksumFeed::new(header_of(batch)?);
    walk(batch, message_count, |_, frame, _| {
        feed.push(frame);
        Ok(())
    })?;
    Ok(feed.digest())
}

/// Stamps a batch at journal append: partition_id, base_offset, base_timestamp, and the
/// recomputed batch_checksum. Only message checksums are re-read, not payloads.
pub fn stamp(
    batch: &mut [u8],
    partition_id: u64,
    base_offset: u64,
    base_timestamp: u64,
) -> Result<(), BatchError> {
    let count = {
        let header = BatchHeader::mut_from_prefix(&mut *batch)
            .map(|(h, _)| h)
            .map_err(|_| BatchError::TooShort { len: 0 })?;
        header.partition_id = U64::new(partition_id);
        header.base_offset = U64::new(base_offset);
        header.base_timestamp = U64::new(base_timestamp);
        header.message_count.get()
    };
    let checksum = batch_checksum(batch, count)?;
    set_batch_checksum(batch, checksum);
    Ok(())
}

/// What a verified batch holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchInfo {
    pub partition_id: u64,
    pub base_offset: u64,
    pub base_timestamp: u64,
    pub origin_timestamp: u64,
    pub message_count: u32,
}

impl BatchInfo {
    /// The offset after this batch's last message.
    pub fn next_offset(&self) -> u64 {
        self.base_offset + u64::from(self.message_count)
    }
}

/// Verifies a batch: header, every message checksum, tiling of exactly message_count
/// frames, then batch_checksum.
pub fn verify(batch: &[u8]) -> Result<BatchInfo, BatchError> {
    verify_from(batch, Some(0))
}

/// Verifies a served batch (a poll reply's, `append_served`): as `verify`, except that
/// its messages may start at any offset_delta, consecutive from there. The info's
/// base_offset is the first message's offset.
pub fn verify_served(batch: &[u8]) -> Result<BatchInfo, BatchError> {
    let first_delta = batch
        .get(BATCH_HEADER_SIZE..)
        .and_then(|rest| MessageHeader::ref_from_prefix(rest).ok())
        .map_or(0, |(m, _)| m.offset_delta.get());
    let mut info = verify_from(batch, Some(first_delta))?;
    info.base_offset += u64::from(first_delta);
    Ok(info)
}

fn verify_from(batch: &[u8], first_delta: Option<u32>) -> Result<BatchInfo, BatchError> {
    let (header, info) = checked_header(batch)?;
    let mut feed = ChecksumFeed::new(header);
    let first_delta = first_delta.unwrap_or(0);
    walk(batch, info.message_count, |index, frame, message| {
        if message.reserved != [0; 8] {
            return Err(BatchError::ReservedNonZero {
                message: Some(index),
            });
        }
        if Some(message.offset_delta.get()) != first_delta.checked_add(index) {
            return Err(BatchError::OffsetDelta {
                message: index,
                offset_delta: message.offset_delta.get(),
            });
        }
        if xxh3_64(&frame[8..]) != message.checksum.get() {
            return Err(BatchError::MessageChecksum { message: index });
        }
        feed.push(frame);
        Ok(())
    })?;
    let computed = feed.digest();
    let stored = header.batch_checksum.get();
    if computed != stored {
        return Err(BatchError::BatchChecksum { stored, computed });
    }
    Ok(info)
}

/// Where `append_served` writes: a growable byte buffer.
pub trait ServedOut {
    /// Bytes held.
    fn held(&self) -> usize;
    /// Appends `bytes`.
    fn extend_from_slice(&mut self, bytes: &[u8]);
    /// The bytes from `from` on, to patch what was appended.
    fn tail_mut(&mut self, from: usize) -> &mut [u8];
}

impl ServedOut for Vec<u8> {
    fn held(&self) -> usize {
        self.len()
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        Vec::extend_from_slice(self, bytes);
    }
    fn tail_mut(&mut self, from: usize) -> &mut [u8] {
        &mut self[from..]
    }
}

impl ServedOut for super::FrameBuf {
    fn held(&self) -> usize {
        self.len()
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        super::FrameBuf::extend_from_slice(self, bytes);
    }
    fn tail_mut(&mut self, from: usize) -> &mut [u8] {
        &mut self.as_bytes_mut()[from..]
    }
}

/// Appends to `out` the messages of a stored batch (one `verify` accepted) whose offsets
/// fall in `from..to`, as a served batch: the batch itself when all of it is in range,
/// else those frames unchanged (their checksums and offset_delta stay, so each offset is
/// still base_offset + offset_delta) under a copy of the header with their
/// message_count, batch_length and batch_checksum. Returns the messages appended.
pub fn append_served<O: ServedOut + ?Sized>(
    batch: &[u8],
    from: u64,
    to: u64,
    out: &mut O,
) -> Result<u32, BatchError> {
    let info = info_of_verified(batch)?;
    let (base, next) = (info.base_offset, info.next_offset());
    if from <= base && to >= next {
        out.extend_from_slice(batch);
        return Ok(info.message_count);
    }
    let (lo, hi) = (from.max(base) - base, to.min(next).saturating_sub(base));
    if lo >= hi {
        return Ok(0);
    }
    let (lo, hi) = (lo as u32, hi as u32);
    let (mut start, mut end, mut at) = (0, 0, BATCH_HEADER_SIZE);
    walk(batch, info.message_count, |index, frame, _| {
        if index == lo {
            start = at;
        }
        at += frame.len();
        if index + 1 == hi {
            end = at;
        }
        Ok(())
    })?;
    let header_at = out.held();
    out.extend_from_slice(&batch[..BATCH_HEADER_SIZE]);
    out.extend_from_slice(&batch[start..end]);
    let served = out.tail_mut(header_at);
    let count = hi - lo;
    {
        let (header, _) = BatchHeader::mut_from_prefix(&mut *served)
            .map_err(|_| BatchError::TooShort { len: 0 })?;
        header.message_count = U32::new(count);
        header.batch_length = U64::new((BATCH_HEADER_SIZE + end - start) as u64);
    }
    let checksum = batch_checksum(served, count)?;
    set_batch_checksum(served, checksum);
    Ok(count)
}

/// The header fields of a batch that `verify` already accepted (a prepare that passed
/// `wire::decode`, a batch this node stamped), without hashing its messages again.
/// Checks only the header's own rules.
pub fn info_of_verified(batch: &[u8]) -> Result<BatchInfo, BatchError> {
    checked_header(batch).map(|(_, info)| info)
}

/// The header's own rules: length, reserved bytes, at least one message.
fn checked_header(batch: &[u8]) -> Result<(&BatchHeader, BatchInfo), BatchError> {
    let header = header_of(batch)?;
    let batch_length = header.batch_length.get();
    if batch_length != batch.len() as u64 {
        return Err(BatchError::LengthMismatch {
            batch_length,
            len: batch.len(),
        });
    }
    if header.reserved.iter().any(|b| *b != 0) {
        return Err(BatchError::ReservedNonZero { message: None });
    }
    let message_count = header.message_count.get();
    if message_count == 0 {
        return Err(BatchError::Empty);
    }
    let info = BatchInfo {
        partition_id: header.partition_id.get(),
        base_offset: header.base_offset.get(),
        base_timestamp: header.base_timestamp.get(),
        origin_timestamp: header.origin_timestamp.get(),
        message_count,
    };
    Ok((header, info))
}

/// Where a backup's partition log stands, to re-derive the stamp a primary must have put
/// on the next batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionPosition {
    pub partition_id: u64,
    /// The offset the next batch must start at.
    pub next_offset: u64,
    /// base_timestamp of the last batch appended (stamps never go backwards).
    pub last_timestamp: u64,
}

/// The backup's check: the batch verifies and its stamp is the one its own position
/// implies (same partition, base_offset = next offset, timestamp not going backwards).
pub fn check_stamp(batch: &[u8], position: &PartitionPosition) -> Result<BatchInfo, BatchError> {
    stamp_follows(verify(batch)?, position)
}

/// As `check_stamp`, for a batch `verify` already accepted: the stamp only.
pub fn check_stamp_of_verified(
    batch: &[u8],
    position: &PartitionPosition,
) -> Result<BatchInfo, BatchError> {
    stamp_follows(info_of_verified(batch)?, position)
}

fn stamp_follows(info: BatchInfo, position: &PartitionPosition) -> Result<BatchInfo, BatchError> {
    let mismatch = |field, expected, found| BatchError::StampMismatch {
        field,
        expected,
        found,
    };
    if info.partition_id != position.partition_id {
        return Err(mismatch(
            "partition_id",
            position.partition_id,
            info.partition_id,
        ));
    }
    if info.base_offset != position.next_offset {
        return Err(mismatch(
            "base_offset",
            position.next_offset,
            info.base_offset,
        ));
    }
    if info.base_timestamp < position.last_timestamp {
        return Err(mismatch(
            "base_timestamp",
            position.last_timestamp,
            info.base_timestamp,
        ));
    }
    Ok(info)
}

/// A message read out of a verified batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageRef<'a> {
    pub offset: u64,
    pub timestamp: u64,
    pub id: u128,
    pub payload: &'a [u8],
    pub user_headers: &'a [u8],
}

/// Iterates the messages of a batch that `verify` accepted.
pub fn messages(batch: &[u8]) -> impl Iterator<Item = MessageRef<'_>> {
    let header = header_of(batch).ok();
    let (base_offset, origin, count) = header
        .map(|h| {
            (
                h.base_offset.get(),
                h.origin_timestamp.get(),
                h.message_count.get(),
            )
        })
        .unwrap_or((0, 0, 0));
    let mut at = BATCH_HEADER_SIZE;
    (0..count).map_while(move |_| {
        let (message, _) = MessageHeader::ref_from_prefix(batch.get(at..)?).ok()?;
        let payload_len = message.payload_length.get() as usize;
        let headers_len = message.user_headers_length.get() as usize;
        let payload_at = at + MESSAGE_HEADER_SIZE;
        let payload = batch.get(payload_at..payload_at + payload_len)?;
        let user_headers =
            batch.get(payload_at + payload_len..payload_at + payload_len + headers_len)?;
        at = payload_at + payload_len + headers_len;
        Some(MessageRef {
            offset: base_offset + u64::from(message.offset_delta.get()),
            timestamp: origin + u64::from(message.timestamp_delta.get()),
            id: message.id.get(),
            payload,
            user_headers,
        })
    })
}
