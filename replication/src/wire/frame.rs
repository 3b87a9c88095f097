//! Aligned frame buffers, the three seals, and builders that seal.
//!
//! A `FrameBuf` is any 16-byte-aligned byte buffer (what the bus reads into). A `Frame`
//! is a frame this node built and sealed: the only way to get one is through the
//! builders here, so an unsealed frame cannot be sent by mistake.

use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::header::{FrameHeader, Header, PrepareHeader, HEADER_SIZE};
use super::registry::{Command, SealKind, METADATA_GROUP};

/// Alignment unit of frame buffers (headers are 16-byte aligned, see docs/protocol.md,
/// "Framing").
#[repr(C, align(16))]
#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
struct Block([u8; 16]);

/// A growable byte buffer whose start is always 16-byte aligned, so a header at its
/// front is decoded by a cast.
#[derive(Clone, Default)]
pub struct FrameBuf {
    blocks: Vec<Block>,
    len: usize,
}

/// Storage of dropped large frame buffers, reused by the next large buffer this thread
/// fills whole (a frame read from a socket, a prepare built from a request): a fresh
/// megabyte costs its page faults and zeroing every time, and prepares are dropped by
/// the consensus core, not handed back to the bus's pool. Bounded per thread.
mod recycled {
    use std::cell::RefCell;

    use super::Block;

    /// Buffers smaller than this are left to the allocator.
    pub(super) const BLOCKS_MIN: usize = (64 << 10) / 16;
    const BUFFERS_MAX: usize = 16;
    const BLOCKS_MAX: usize = (64 << 20) / 16;

    thread_local! {
        static FREE: RefCell<Vec<Vec<Block>>> = const { RefCell::new(Vec::new()) };
    }

    /// Kept storage of at least `blocks` blocks (initialized; stale contents).
    pub(super) fn take(blocks: usize) -> Option<Vec<Block>> {
        FREE.try_with(|free| {
            let mut free = free.borrow_mut();
            let i = free.iter().position(|v| v.len() >= blocks)?;
            Some(free.swap_remove(i))
        })
        .ok()
        .flatten()
    }

    pub(super) fn keep(storage: Vec<Block>) {
        if storage.len() < BLOCKS_MIN || storage.len() > BLOCKS_MAX {
            return;
        }
        let _ = FREE.try_with(|free| {
            let mut free = free.borrow_mut();
            free.push(storage);
            while free.len() > BUFFERS_MAX || free.iter().map(Vec::len).sum::<usize>() > BLOCKS_MAX
            {
                free.remove(0);
            }
        });
    }
}

impl Drop for FrameBuf {
    fn drop(&mut self) {
        recycled::keep(std::mem::take(&mut self.blocks));
    }
}

impl FrameBuf {
    /// A buffer of `len` bytes whose every byte the caller overwrites: it may reuse the
    /// storage of a dropped buffer, stale contents and all (see `resize_for_overwrite`).
    pub fn for_overwrite(len: usize) -> FrameBuf {
        let mut buf = FrameBuf::default();
        buf.resize_for_overwrite(len);
        buf
    }

    /// A zero-filled buffer of `len` bytes.
    pub fn zeroed(len: usize) -> FrameBuf {
        let mut buf = FrameBuf::default();
        buf.resize(len);
        buf
    }

    /// An aligned copy of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> FrameBuf {
        let mut buf = FrameBuf::for_overwrite(bytes.len());
        buf.as_bytes_mut().copy_from_slice(bytes);
        buf
    }

    /// Grows or shrinks to `len` bytes; new bytes are zero. Keeps the allocation when
    /// shrinking, so a pooled buffer is reused without reallocating.
    pub fn resize(&mut self, len: usize) {
        let blocks = len.div_ceil(16);
        if blocks > self.blocks.len() {
            self.blocks.resize(blocks, Block([0; 16]));
        }
        if len > self.len {
            let old = self.len;
            self.len = len;
            self.as_bytes_mut()[old..].fill(0);
        }
        self.len = len;
    }

    /// Grows or shrinks to `len` bytes for a caller that overwrites them all (a read
    /// from a socket): bytes the allocation already holds keep their stale contents
    /// instead of being zero-filled again; only a new allocation is zeroed.
    pub fn resize_for_overwrite(&mut self, len: usize) {
        let blocks = len.div_ceil(16);
        if blocks > self.blocks.len() && blocks >= recycled::BLOCKS_MIN {
            if let Some(storage) = recycled::take(blocks) {
                // The held bytes move along: they were as good as stale ones.
                let held = self.len.min(storage.len() * 16);
                let old = std::mem::replace(&mut self.blocks, storage);
                let old_bytes: &[u8] = old.as_bytes();
                self.blocks.as_mut_bytes()[..held].copy_from_slice(&old_bytes[..held]);
                recycled::keep(old);
            }
        }
        if blocks > self.blocks.len() {
            self.blocks.resize(blocks, Block([0; 16]));
        }
        self.len = len;
    }

    /// Bytes in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, starting 16-byte aligned.
    pub fn as_bytes(&self) -> &[u8] {
        &self.blocks.as_bytes()[..self.len]
    }

    /// The bytes, mutable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.blocks.as_mut_bytes()[..self.len]
    }

    /// Appends bytes at the end (growing storage it already holds is not zeroed first:
    /// the bytes are overwritten at once).
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        let start = self.len;
        self.resize_for_overwrite(start + bytes.len());
        self.as_bytes_mut()[start..].copy_from_slice(bytes);
    }
}

impl core::fmt::Debug for FrameBuf {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FrameBuf").field("len", &self.len).finish()
    }
}

/// XxHash3-64 (seed 0) widened to the u128 seal fields.
pub fn seal_of(bytes: &[u8]) -> u128 {
    u128::from(xxh3_64(bytes))
}

/// The body seal of a control frame (DoViewChange, StartView): XxHash3-64 of the body,
/// and zero for an empty body, as the reference implementation seals an empty suffix.
pub fn control_body_seal(body: &[u8]) -> u128 {
    if body.is_empty() {
        0
    } else {
        seal_of(body)
    }
}

/// Frame seal: XxHash3-64 over header bytes 16..256.
pub fn frame_seal(header: &[u8; HEADER_SIZE]) -> u128 {
    seal_of(&header[16..])
}

/// Prepare identity: XxHash3-64 over the whole header with checksum = 0, view = 0 and
/// command = Prepare, so retransmits under a new view and RepairPrepare keep it.
pub fn prepare_identity(header: &PrepareHeader) -> u128 {
    let mut copy = *header;
    copy.frame.checksum = 0;
    copy.frame.view = 0;
    copy.frame.command = Command::Prepare as u8;
    seal_of(copy.as_bytes())
}

/// Whether a prepare's body is sealed with checksum_body (metadata plane) or left zero
/// (partition plane, integrity from the batch's own checksums).
pub fn prepare_body_sealed(header: &PrepareHeader) -> bool {
    header.group == METADATA_GROUP
}

/// A frame built and sealed by this node, ready to send or journal. Immutable once
/// built, so clones share one buffer: a prepare is held in the log, handed to the
/// journal, broadcast and committed without copying its (up to 64 MiB) bytes.
#[derive(Clone, Debug)]
pub struct Frame {
    buf: Arc<FrameBuf>,
}

impl Frame {
    /// Builds a frame from `header` and `body`: stamps size, keeps the header's command if
    /// it belongs to this layout (else stamps the layout's first), then applies the
    /// command's seals. Only the seal fields and size/command are written.
    pub fn build<H: Header>(header: &H, body: &[u8]) -> Frame {
        let mut buf = FrameBuf::for_overwrite(HEADER_SIZE + body.len());
        buf.as_bytes_mut()[HEADER_SIZE..].copy_from_slice(body);
        Frame::build_in(header, buf)
    }

    /// As `build`, with the body already in place after the first HEADER_SIZE bytes of
    /// `buf` (written there by the caller, e.g. a batch stamped in place), so it is not
    /// copied again. A `buf` shorter than a header is zero-extended to one.
    pub fn build_in<H: Header>(header: &H, mut buf: FrameBuf) -> Frame {
        if buf.len() < HEADER_SIZE {
            buf.resize(HEADER_SIZE);
        }
        buf.as_bytes_mut()[..HEADER_SIZE].copy_from_slice(header.as_bytes());
        let len = buf.len();
        let frame = FrameHeader::mut_from_prefix(buf.as_bytes_mut())
            .map(|(frame, _)| frame)
            .unwrap_or_else(|_| unreachable!("FrameBuf is 16-aligned and >= 256 bytes"));
        let size = u32::try_from(len).unwrap_or(u32::MAX);
        frame.size = size;
        if !H::COMMANDS.iter().any(|c| *c as u8 == frame.command) {
            frame.command = H::COMMANDS[0] as u8;
        }
        seal_in_place(buf.as_bytes_mut());
        Frame { buf: Arc::new(buf) }
    }

    /// A frame that passed `decode` as received (the bus's verified frames): its seals
    /// hold, so it is kept as is, neither copied nor sealed again.
    pub(crate) fn from_verified(buf: FrameBuf) -> Frame {
        Frame { buf: Arc::new(buf) }
    }

    /// RepairPrepare from a journaled Prepare: byte-identical but for the command byte,
    /// so the identity (computed as command Prepare) is retained.
    pub fn repair_of(prepare: &[u8]) -> Frame {
        let mut buf = FrameBuf::from_bytes(prepare);
        buf.as_bytes_mut()[60] = Command::RepairPrepare as u8;
        Frame { buf: Arc::new(buf) }
    }

    /// The frame's bytes (16-byte aligned).
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.as_bytes()
    }

    /// The identity of a Prepare frame (its checksum field).
    pub fn checksum(&self) -> u128 {
        self.header().checksum
    }

    /// The common frame header.
    pub fn header(&self) -> &FrameHeader {
        FrameHeader::ref_from_prefix(self.buf.as_bytes())
            .map(|(h, _)| h)
            .unwrap_or_else(|_| unreachable!("a Frame always holds an aligned header"))
    }

    /// Gives the buffer back (for pooling); a copy while clones of the frame live on.
    pub fn into_buf(self) -> FrameBuf {
        Arc::try_unwrap(self.buf).unwrap_or_else(|shared| (*shared).clone())
    }
}

/// Applies the seals of the frame's command to `bytes` (header + body), in place.
/// Size and command must already be set; unknown commands are left unsealed.
pub fn seal_in_place(bytes: &mut [u8]) {
    let Some(command) = Command::from_u8(bytes[60]) else {
        return;
    };
    let (head, body) = bytes.split_at_mut(HEADER_SIZE);
    match command.seal_kind() {
        SealKind::Unsealed => {}
        SealKind::Identity => {
            let Ok(header) = PrepareHeader::mut_from_bytes(head) else {
                return;
            };
            header.frame.checksum_body = if prepare_body_sealed(header) {
                seal_of(body)
            } else {
                0
            };
            header.frame.checksum = prepare_identity(header);
        }
        SealKind::Frame => {
            let checksum_body = if command.has_body_seal() {
                control_body_seal(body)
            } else {
                0
            };
            head[16..32].copy_from_slice(&checksum_body.to_le_bytes());
            let head: &mut [u8; HEADER_SIZE] = head
                .try_into()
                .unwrap_or_else(|_| unreachable!("split at HEADER_SIZE"));
            let checksum = frame_seal(head);
            head[..16].copy_from_slice(&checksum.to_le_bytes());
        }
    }
}

/// Parent chaining: each prepare's parent is the previous prepare's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrepareChain {
    parent: u128,
}

impl PrepareChain {
    /// A chain whose next prepare follows the prepare with identity `parent`.
    pub fn after(parent: u128) -> PrepareChain {
        PrepareChain { parent }
    }

    /// The identity the next prepare will name as its parent.
    pub fn parent(&self) -> u128 {
        self.parent
    }

    /// Links `header` to the chain, seals it with `body` and advances the chain.
    pub fn append(&mut self, header: &mut PrepareHeader, body: &[u8]) -> Frame {
        header.parent = self.parent;
        let frame = Frame::build(header, body);
        self.parent = frame.checksum();
        frame
    }
}

#[cfg(test)]
mod tests {
    use super::FrameBuf;

    #[test]
    fn resizing_for_overwrite_zeroes_only_new_memory_and_resize_zeroes_every_new_byte() {
        let mut buf = FrameBuf::default();
        buf.resize_for_overwrite(100);
        assert_eq!(buf.len(), 100);
        assert!(
            buf.as_bytes().iter().all(|&b| b == 0),
            "a new allocation is zero"
        );
        buf.as_bytes_mut().fill(7);
        buf.resize_for_overwrite(10);
        assert_eq!(buf.len(), 10);
        buf.resize_for_overwrite(100);
        assert!(
            buf.as_bytes()[10..].iter().all(|&b| b == 7),
            "held bytes are not zero-filled again"
        );
        buf.resize_for_overwrite(200);
        assert!(buf.as_bytes()[112..].iter().all(|&b| b == 0));
        buf.resize(10);
        buf.resize(100);
        assert!(
            buf.as_bytes()[10..].iter().all(|&b| b == 0),
            "resize still zeroes every byte it adds"
        );
    }

    #[test]
    fn storage_of_a_dropped_large_buffer_is_reused_only_by_buffers_filled_whole() {
        let len = 1 << 20;
        let mut big = FrameBuf::zeroed(len);
        big.as_bytes_mut().fill(7);
        let address = big.as_bytes().as_ptr();
        drop(big);
        let zeroed = FrameBuf::zeroed(len);
        assert!(zeroed.as_bytes().iter().all(|&b| b == 0), "zeroed is zero");
        let reused = FrameBuf::for_overwrite(len - 100);
        assert_eq!(reused.len(), len - 100);
        assert_eq!(
            reused.as_bytes().as_ptr(),
            address,
            "the dropped storage came back"
        );
        assert!(reused.as_bytes().iter().all(|&b| b == 7));
        // A growing read keeps the bytes it already held when it moves to kept storage.
        drop(reused);
        let mut growing = FrameBuf::for_overwrite(300);
        growing.as_bytes_mut().fill(9);
        growing.resize_for_overwrite(len);
        assert_eq!(growing.as_bytes().as_ptr(), address);
        assert!(growing.as_bytes()[..300].iter().all(|&b| b == 9));
        drop(zeroed);
    }
}
