//! The partition state machine: what a committed op of a partition group does to its
//! partition, as a value. The result (status and reply body) is decided from the applied
//! state alone, so every replica answers a retry alike; what the op changes on disk (the
//! committed end of the segment log, a consumer offset stored or deleted) is returned as
//! an effect for the daemon to perform.
//!
//! A partition group's ops: SendMessages (the batch was journaled at prepare time;
//! applying it moves the committed end, which is what reads serve),
//! StoreConsumerOffset and DeleteConsumerOffset. The log offset the next batch starts
//! at is `committed_end`; `checkpoint_op` is the op of the partition's last durable
//! checkpoint.

use replication::wire::{batch, Operation, PartitionKey};

use crate::protocol::codec::{Reader, Writer};
use crate::protocol::reply::{SendConfirmation, SendConfirmations};
use crate::protocol::{Consumer, Status};

/// Consumers one partition stores offsets for at most.
pub use journal::segment::offsets::CONSUMERS_MAX;

/// One partition's applied state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionState {
    /// The highest op applied here, and the log offset it ends at.
    pub committed_op: u64,
    pub committed_end: u64,
    /// The op of the last durable checkpoint (0: none).
    pub checkpoint_op: u64,
}

/// What the consumer-offset table holds, as applying an op needs it.
pub trait OffsetTable {
    /// Whether an offset is stored for `consumer` (a `consumer_key`).
    fn holds(&self, consumer: u64) -> bool;
    /// Consumers with a stored offset.
    fn consumers(&self) -> usize;
}

impl OffsetTable for journal::segment::ConsumerOffsets {
    fn holds(&self, consumer: u64) -> bool {
        self.get(consumer).is_some()
    }

    fn consumers(&self) -> usize {
        self.all().len()
    }
}

/// What an applied op changes beside the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Nothing (the batch is in the log already; a refused op).
    None,
    /// Store `offset` for `consumer` (a `consumer_key`).
    StoreOffset { consumer: u64, offset: u64 },
    /// Delete the offset of `consumer`.
    DeleteOffset { consumer: u64 },
}

/// A committed op applied: the client's result, and the change to perform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub status: Status,
    /// The reply's body (SendMessages: the confirmation with the batch's base offset).
    pub body: Vec<u8>,
    pub effect: Effect,
}

impl Applied {
    fn refused(status: Status, body: &[u8]) -> Applied {
        Applied {
            status,
            body: body.to_vec(),
            effect: Effect::None,
        }
    }
}

impl PartitionState {
    /// The state of a partition opened at `committed_op`, whose log ends (as far as
    /// committed) at `committed_end`; the op is its checkpoint's.
    pub fn opened(committed_op: u64, committed_end: u64) -> PartitionState {
        PartitionState {
            committed_op,
            committed_end,
            checkpoint_op: committed_op,
        }
    }

    /// Applies committed op `op` of `operation` with prepare body `body` to partition
    /// `key`; the batch of a SendMessages was verified when it was received or stamped
    /// (and journaled). An error is a batch that cannot be read: stored data the node
    /// must not apply.
    pub fn apply(
        &mut self,
        key: PartitionKey,
        op: u64,
        operation: u8,
        body: &[u8],
        offsets: &impl OffsetTable,
    ) -> Result<Applied, batch::BatchError> {
        assert!(
            op > self.committed_op,
            "partition {key:?}: op {op} applied again (committed {})",
            self.committed_op
        );
        let applied = match Operation::from_u8(operation) {
            Some(Operation::SendMessages) => {
                let info = batch::info_of_verified(body)?;
                self.committed_end = info.next_offset();
                let reply = SendConfirmations {
                    confirmations: vec![SendConfirmation {
                        stream_id: key.stream,
                        topic_id: key.topic,
                        partition_id: key.partition,
                        base_offset: info.base_offset,
                    }],
                };
                Applied {
                    status: Status::Ok,
                    body: reply.encode(),
                    effect: Effect::None,
                }
            }
            Some(Operation::StoreConsumerOffset) => store_offset(body, offsets),
            Some(Operation::DeleteConsumerOffset) => delete_offset(body, offsets),
            _ => Applied::refused(Status::InvalidRequest, &[]),
        };
        self.committed_op = op;
        Ok(applied)
    }

    /// A checkpoint at `op` is durable.
    pub fn on_checkpoint(&mut self, op: u64) {
        assert!(
            op <= self.committed_op,
            "checkpoint at op {op} past the committed op {}",
            self.committed_op
        );
        self.checkpoint_op = op;
    }

    /// Whether a checkpoint at the group's commit point `commit` would move this
    /// partition's: it committed past its checkpoint and applied every committed op.
    pub fn needs_checkpoint(&self, commit: u64) -> bool {
        commit == self.committed_op && self.applied_past_checkpoint()
    }

    /// Whether it applied an op its checkpoint does not hold: what `needs_checkpoint`
    /// asks first, answered without the group's commit point.
    pub fn applied_past_checkpoint(&self) -> bool {
        self.committed_op > self.checkpoint_op
    }
}

/// The consumer-offset table key: kind in the high half, id in the low.
pub fn consumer_key(consumer: Consumer) -> u64 {
    match consumer {
        Consumer::Single(id) => u64::from(id),
        Consumer::Group(id) => (1 << 32) | u64::from(id),
    }
}

/// The prepare body of a StoreConsumerOffset (with `offset`) or DeleteConsumerOffset:
/// consumer kind u8 (0 single, 1 group), id u32, then the offset u64.
pub fn offset_op_body(consumer: Consumer, offset: Option<u64>) -> Vec<u8> {
    let (kind, id) = match consumer {
        Consumer::Single(id) => (0u8, id),
        Consumer::Group(id) => (1u8, id),
    };
    let mut body = Writer::default();
    body.u8(kind).u32(id);
    if let Some(offset) = offset {
        body.u64(offset);
    }
    body.finish()
}

/// The consumer an offset op names (kind, id), None when the body does not name one.
fn consumer_of(r: &mut Reader) -> Option<u64> {
    let kind = r.u8("consumer_kind").ok()?;
    let id = r.u32("consumer_id").ok()?;
    match kind {
        0 => Some(consumer_key(Consumer::Single(id))),
        1 => Some(consumer_key(Consumer::Group(id))),
        _ => None,
    }
}

/// StoreConsumerOffset: a consumer past the partition's `CONSUMERS_MAX` is
/// LimitReached.
fn store_offset(body: &[u8], offsets: &impl OffsetTable) -> Applied {
    let mut r = Reader::new(body);
    let (Some(consumer), Ok(offset)) = (consumer_of(&mut r), r.u64("offset")) else {
        return Applied::refused(Status::InvalidRequest, &[]);
    };
    if !offsets.holds(consumer) && offsets.consumers() >= CONSUMERS_MAX {
        return Applied::refused(Status::LimitReached, b"consumers");
    }
    Applied {
        status: Status::Ok,
        body: Vec::new(),
        effect: Effect::StoreOffset { consumer, offset },
    }
}

/// DeleteConsumerOffset: deleting an offset that is not stored is NotFound.
fn delete_offset(body: &[u8], offsets: &impl OffsetTable) -> Applied {
    let Some(consumer) = consumer_of(&mut Reader::new(body)) else {
        return Applied::refused(Status::InvalidRequest, &[]);
    };
    if !offsets.holds(consumer) {
        return Applied::refused(Status::NotFound, &[]);
    }
    Applied {
        status: Status::Ok,
        body: Vec::new(),
        effect: Effect::DeleteOffset { consumer },
    }
}

#[cfg(test)]
mod tests;
