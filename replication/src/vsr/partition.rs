//! Partition planes (docs/protocol.md, "Message batch"): the primary stamps SendMessages
//! batches at journal append; each backup re-derives the stamp from its own position and
//! refuses a mismatch. Positions are kept per op from the commit point up.

use crate::wire::batch;
use crate::wire::{Frame, Operation, PrepareHeader, METADATA_GROUP};

use super::log::frame_header;
use super::replica::Replica;

impl Replica {
    /// A fresh partition group whose log already holds batches (the driver reopened the
    /// partition's segment log): the next batch is stamped after `position`. Only before
    /// the first op; false (and no change) otherwise or on the metadata plane.
    pub fn seed_partition_position(
        &mut self,
        position: crate::wire::batch::PartitionPosition,
    ) -> bool {
        if self.config.group == METADATA_GROUP || self.log.op != 0 || self.commit != 0 {
            return false;
        }
        self.positions.insert(0, position);
        true
    }

    /// Records the partition stamp position after `op` (partition plane only).
    pub(crate) fn note_position(&mut self, op: u64, frame: &Frame) {
        if self.config.group == METADATA_GROUP {
            return;
        }
        let header = frame_header(frame);
        let Some(before) = self.positions.get(&(op - 1)).copied() else {
            return;
        };
        let mut after = before;
        if header.operation == Operation::SendMessages as u8 {
            // Every frame in the log passed decode or was stamped here.
            if let Ok(info) = batch::info_of_verified(&frame.as_bytes()[256..]) {
                after.next_offset = info.next_offset();
                after.last_timestamp = info.base_timestamp;
            }
        }
        self.positions.insert(op, after);
    }

    /// A backup re-derives a partition prepare's stamp from its own position (the batch
    /// itself was verified when the prepare was decoded).
    pub(crate) fn stamp_ok(&mut self, header: &PrepareHeader, body: &[u8]) -> bool {
        if self.config.group == METADATA_GROUP || header.operation != Operation::SendMessages as u8
        {
            return true;
        }
        match self.positions.get(&(header.op - 1)) {
            Some(position) => batch::check_stamp_of_verified(body, position).is_ok(),
            None => true,
        }
    }

    pub(crate) fn prune_positions(&mut self) {
        if self.config.group == METADATA_GROUP || self.commit == 0 {
            return;
        }
        let keep = self.positions.split_off(&self.commit);
        self.positions = keep;
    }

    /// Recomputes partition stamp positions for the uncommitted ops in hand.
    pub(crate) fn rebuild_positions(&mut self) {
        if self.config.group == crate::wire::METADATA_GROUP {
            return;
        }
        let _ = self.positions.split_off(&(self.commit + 1));
        for op in self.commit + 1..=self.log.op {
            let Some(frame) = self.log.slot(op).and_then(|s| s.frame.clone()) else {
                break;
            };
            if !self.positions.contains_key(&(op - 1)) {
                break;
            }
            self.note_position(op, &frame);
        }
    }
}
