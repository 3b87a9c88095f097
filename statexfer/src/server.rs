//! The state-transfer server (docs/protocol.md, "State transfer", steps 1-4): answers
//! RequestStateTransfer with StateTransferTarget and RequestStateChunk with StateChunk,
//! clamping each chunk to its maximum and the frame limit. Sans-IO: frames in, frames
//! out; it runs on the "statexfer" executor so bulk reads never stall consensus.

use replication::wire::{
    Frame, Header, RequestStateChunkHeader, RequestStateTransferHeader, StateChunkHeader,
    StateTransferTargetHeader, HEADER_SIZE,
};

use crate::artifact::{ArtifactSource, Unavailable};

/// Default chunk size a server sends (and a fetcher asks for): each chunk is one read on
/// the serving node and one write on the fetching one, and the cluster's journal writes
/// on the same disk wait behind whole ones, so they are kept short.
pub const CHUNK_MAX_DEFAULT: u32 = 64 << 10;

/// Counters for the stats endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    pub targets_offered: u64,
    pub targets_refused: u64,
    pub chunks_served: u64,
    pub bytes_served: u64,
    pub chunks_refused: u64,
}

/// Serves artifacts of one node.
#[derive(Debug)]
pub struct Server {
    cluster: u128,
    replica: u8,
    chunk_max: u32,
    max_message_size: u32,
    buffer: Vec<u8>,
    pub stats: ServerStats,
}

impl Server {
    /// A server that never sends a chunk over `chunk_max` bytes nor a frame over
    /// `max_message_size`.
    pub fn new(cluster: u128, replica: u8, chunk_max: u32, max_message_size: u32) -> Server {
        let chunk_max = chunk_max
            .min(max_message_size.saturating_sub(HEADER_SIZE as u32))
            .max(1);
        Server {
            cluster,
            replica,
            chunk_max,
            max_message_size,
            buffer: Vec::new(),
            stats: ServerStats::default(),
        }
    }

    /// The largest chunk this server sends.
    pub fn chunk_max(&self) -> u32 {
        self.chunk_max
    }

    fn stamp<H: Header>(&self, header: &mut H) {
        header.frame_mut().cluster = self.cluster;
        header.frame_mut().replica = self.replica;
    }

    /// RequestStateTransfer -> StateTransferTarget: the manifest, or a header-only
    /// refusal (available = 0) saying whether to ask again.
    pub fn on_request_transfer(
        &mut self,
        request: &RequestStateTransferHeader,
        source: &mut dyn ArtifactSource,
    ) -> Frame {
        let mut target = StateTransferTargetHeader::new();
        self.stamp(&mut target);
        target.nonce = request.nonce;
        target.group = request.group;
        match source.offer(request.group) {
            Ok(offer) => {
                let manifest = offer.manifest.encode();
                if manifest.len() + HEADER_SIZE <= self.max_message_size as usize {
                    self.stats.targets_offered += 1;
                    target.available = 1;
                    target.commit_op = offer.commit_op;
                    target.commit_max = offer.commit_max;
                    return Frame::build(&target, &manifest);
                }
                // A manifest too large for one frame cannot be offered.
                self.stats.targets_refused += 1;
            }
            Err(Unavailable::Transient) => {
                self.stats.targets_refused += 1;
                target.unavailable_transient = 1;
            }
            Err(Unavailable::Permanent) => self.stats.targets_refused += 1,
        }
        Frame::build(&target, &[])
    }

    /// RequestStateChunk -> StateChunk with up to min(len, chunk_max) bytes from
    /// `offset`; `None` when the artifact is not in the current offer.
    pub fn on_request_chunk(
        &mut self,
        request: &RequestStateChunkHeader,
        source: &mut dyn ArtifactSource,
    ) -> Option<Frame> {
        let len = request.len.min(self.chunk_max) as usize;
        self.buffer.resize(len, 0);
        let Some(n) = source.read(
            request.group,
            request.artifact,
            request.offset,
            &mut self.buffer,
        ) else {
            self.stats.chunks_refused += 1;
            return None;
        };
        let mut chunk = StateChunkHeader::new();
        self.stamp(&mut chunk);
        chunk.nonce = request.nonce;
        chunk.offset = request.offset;
        chunk.group = request.group;
        chunk.artifact = request.artifact;
        self.stats.chunks_served += 1;
        self.stats.bytes_served += n as u64;
        Some(Frame::build(&chunk, &self.buffer[..n]))
    }
}
