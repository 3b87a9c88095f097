//! The in-memory view of the journal: per op, the canonical identity (when known), its
//! header, the prepare frame and whether the journal holds it durably.
//!
//! Identities are learned top-down: a view's suffix headers (StartView, DVC merge) and each
//! header's parent link name the identity of the op below, so a stale local entry is
//! found by the hash chain and replaced by repair, never trusted.

use std::collections::BTreeMap;

use crate::wire::{Frame, PrepareHeader};

/// One op of the log.
#[derive(Clone, Debug, Default)]
pub struct Slot {
    /// The canonical identity of this op in the current view, once known.
    pub identity: Option<u128>,
    /// The canonical header, once known.
    pub header: Option<PrepareHeader>,
    /// The prepare (command Prepare) whose identity is `identity`.
    pub frame: Option<Frame>,
    /// The journal reported `frame` durable.
    pub durable: bool,
    /// This replica may have durably prepared this identity (so it must never nack it):
    /// set on a durable write and kept for faulty entries whose content is unknown.
    pub prepared: bool,
    /// A repaired frame whose identity is not yet known (waits for the chain walk).
    pub candidate: Option<Frame>,
}

impl Slot {
    /// Whether the body is in hand and matches the canonical identity.
    pub fn ready(&self) -> bool {
        self.frame.is_some() && self.identity.is_some()
    }
}

/// The log of one group.
#[derive(Clone, Debug, Default)]
pub struct Log {
    slots: BTreeMap<u64, Slot>,
    /// Highest op with a known identity (0 = empty).
    pub(crate) op: u64,
    /// Every op in [chain_floor, op] has a known identity (0 has identity 0).
    pub(crate) chain_floor: u64,
    /// Ops at or below this were dropped from memory after a checkpoint.
    pub(crate) op_checkpoint: u64,
    /// The op whose body was released (0 = none): the commit point just above
    /// `op_checkpoint`, its header and identity kept, its frame on the driver's disk only.
    released: u64,
}

fn header_of(frame: &Frame) -> PrepareHeader {
    use zerocopy::FromBytes;
    PrepareHeader::read_from_prefix(frame.as_bytes())
        .map(|(header, _)| header)
        .unwrap_or_else(|_| unreachable!("a prepare frame starts with its header"))
}

/// The prepare header of a frame this log holds.
pub fn frame_header(frame: &Frame) -> PrepareHeader {
    header_of(frame)
}

impl Log {
    /// The slot of `op`, if any.
    pub fn slot(&self, op: u64) -> Option<&Slot> {
        self.slots.get(&op)
    }

    /// The slot of `op`, created empty if absent.
    pub(crate) fn slot_mut(&mut self, op: u64) -> &mut Slot {
        assert!(op > self.op_checkpoint);
        self.slots.entry(op).or_default()
    }

    /// The canonical identity of `op`, if known.
    pub fn identity(&self, op: u64) -> Option<u128> {
        if op == 0 {
            return Some(0);
        }
        self.slots.get(&op).and_then(|slot| slot.identity)
    }

    /// The canonical header of `op`, if known.
    pub fn header(&self, op: u64) -> Option<&PrepareHeader> {
        self.slots.get(&op).and_then(|slot| slot.header.as_ref())
    }

    /// The frame of `op` if it is canonical and durable (what repair may serve).
    /// A prepare the journal holds durably and that read back valid, its identity known
    /// or not (a receiver accepts it only by identity).
    pub fn held_frame(&self, op: u64) -> Option<&Frame> {
        self.slots
            .get(&op)
            .filter(|slot| slot.durable)
            .and_then(|slot| slot.frame.as_ref())
    }

    pub fn durable_frame(&self, op: u64) -> Option<&Frame> {
        self.slots
            .get(&op)
            .filter(|slot| slot.durable && slot.identity.is_some())
            .and_then(|slot| slot.frame.as_ref())
    }

    /// Appends the next op on top of the chain (the caller checked the parent link).
    pub(crate) fn append(&mut self, frame: Frame) {
        let header = header_of(&frame);
        assert_eq!(header.op, self.op + 1);
        assert_eq!(Some(header.parent), self.identity(self.op));
        let slot = self.slot_mut(header.op);
        let same = slot.identity == Some(header.frame.checksum);
        *slot = Slot {
            identity: Some(header.frame.checksum),
            header: Some(header),
            durable: same && slot.durable,
            prepared: same && slot.prepared,
            frame: Some(frame),
            candidate: None,
        };
        self.op = header.op;
    }

    /// Sets the canonical header of `op`, dropping a local frame that disagrees.
    pub(crate) fn set_canonical(&mut self, header: &PrepareHeader) {
        let slot = self.slot_mut(header.op);
        let identity = header.frame.checksum;
        if slot.identity != Some(identity) {
            let faulty = slot.identity.is_none() && slot.prepared && slot.frame.is_none();
            let keep = slot
                .frame
                .as_ref()
                .is_some_and(|frame| frame.checksum() == identity);
            if !keep {
                slot.frame = None;
                slot.durable = false;
                slot.prepared = faulty;
            }
            slot.identity = Some(identity);
        }
        slot.header = Some(*header);
        // A matching candidate is promoted (and journaled) by the chain walk.
        if slot
            .candidate
            .as_ref()
            .is_some_and(|c| c.checksum() != identity)
        {
            slot.candidate = None;
        }
    }

    /// Forgets the identity and header of `op`, which no view vouches for; a body held
    /// stays, to be kept if the chain walk later names it.
    pub(crate) fn forget_identity(&mut self, op: u64) {
        if let Some(slot) = self.slots.get_mut(&op) {
            slot.identity = None;
            slot.header = None;
        }
    }

    /// Drops the frame of `op`, the lowest op held (its header and identity stay: the
    /// parent of the op above). Repair answers it RangeEvicted from now on.
    pub(crate) fn release(&mut self, op: u64) {
        assert_eq!(op, self.op_min(), "only the lowest op held is released");
        let slot = self.slots.get_mut(&op).expect("a released op is held");
        assert!(slot.durable && slot.identity.is_some());
        slot.frame = None;
        slot.candidate = None;
        self.released = op;
    }

    /// Puts back the frame of the released op (read back from the driver's disk).
    pub(crate) fn restore(&mut self, frame: Frame) {
        let op = self.released;
        let slot = self.slots.get_mut(&op).expect("a released op is held");
        assert_eq!(slot.identity, Some(frame.checksum()));
        slot.frame = Some(frame);
        self.released = 0;
    }

    /// The op whose frame was released, if any.
    pub fn released(&self) -> Option<u64> {
        (self.released != 0).then_some(self.released)
    }

    /// The oldest op whose frame repair may still serve from memory.
    pub fn served_min(&self) -> u64 {
        if self.released == self.op_min() {
            self.released + 1
        } else {
            self.op_min()
        }
    }

    /// Forgets every op above `op_max`.
    pub(crate) fn truncate_above(&mut self, op_max: u64) {
        if self.released > op_max {
            self.released = 0;
        }
        let _ = self.slots.split_off(&(op_max + 1));
        self.op = self.op.min(op_max);
        self.chain_floor = self.chain_floor.min(self.op);
    }

    /// Extends the known chain downwards from `chain_floor` towards `op_floor` using
    /// parent links. Returns the ops whose frame (local or candidate) became canonical and
    /// must be journaled (candidates) or were already in place.
    pub(crate) fn walk_chain(&mut self, op_floor: u64) -> Vec<u64> {
        let mut promoted = Vec::new();
        while self.chain_floor > op_floor && self.chain_floor > self.op_checkpoint {
            let above = self.chain_floor;
            let Some(parent) = self.header(above).map(|h| h.parent) else {
                break;
            };
            let op = above - 1;
            if op == 0 || op <= self.op_checkpoint {
                self.chain_floor = op;
                break;
            }
            let slot = self.slot_mut(op);
            if slot.identity != Some(parent) {
                let keep = slot.frame.as_ref().is_some_and(|f| f.checksum() == parent);
                if !keep {
                    let faulty = slot.prepared && slot.frame.is_none();
                    slot.frame = None;
                    slot.durable = false;
                    slot.prepared = faulty;
                    slot.header = None;
                }
                slot.identity = Some(parent);
            }
            if slot.frame.is_none()
                && slot
                    .candidate
                    .as_ref()
                    .is_some_and(|c| c.checksum() == parent)
            {
                slot.frame = slot.candidate.take();
                promoted.push(op);
            }
            if slot.header.is_none() {
                if let Some(frame) = slot.frame.as_ref() {
                    slot.header = Some(header_of(frame));
                }
            }
            self.chain_floor = op;
            if self.header(op).is_none() {
                break;
            }
        }
        promoted
    }

    /// Ops in (from, to] whose identity is known but whose body is missing or not durable.
    pub fn missing(&self, from: u64, to: u64) -> impl Iterator<Item = u64> + '_ {
        (from + 1..=to).filter(move |op| {
            self.slots
                .get(op)
                .is_none_or(|slot| slot.frame.is_none() || slot.identity.is_none())
        })
    }

    /// The top headers, highest op first, up to `max`, stopping at the first unknown one.
    pub fn suffix(&self, max: usize) -> Vec<PrepareHeader> {
        let mut headers = Vec::new();
        let mut op = self.op;
        while op > self.op_checkpoint && headers.len() < max {
            match self.header(op) {
                Some(header) => headers.push(*header),
                None => break,
            }
            op -= 1;
        }
        headers
    }

    /// Drops ops at or below `op` from memory (they are in a checkpoint).
    pub(crate) fn checkpoint(&mut self, op: u64) {
        let keep = self.slots.split_off(&(op + 1));
        self.slots = keep;
        if self.released <= op {
            self.released = 0;
        }
        self.op_checkpoint = self.op_checkpoint.max(op);
        self.chain_floor = self.chain_floor.max(self.op_checkpoint);
    }

    /// Highest op with a known identity.
    pub fn op(&self) -> u64 {
        self.op
    }

    /// Every op from here up to `op()` has a known identity.
    pub fn chain_floor(&self) -> u64 {
        self.chain_floor
    }

    /// The oldest op still held in memory.
    pub fn op_min(&self) -> u64 {
        self.op_checkpoint + 1
    }
}
