//! Simulated storage of one replica: the superblock (written synchronously), and a journal
//! whose writes become durable only after a sync delay. A crash loses unsynced writes and
//! may tear the last one; corruption flips bytes of a durable entry.
//!
//! With `defer_gaps`, as the appliance's journals do (the metadata journal's ring and a
//! partition's prepare records alike), the journal extends only at its head: an append
//! past the head (the ops below it not journaled yet) is deferred, neither written nor
//! reported durable, and the core asks for it again once repair brought the ops below.

use std::collections::BTreeMap;

use crate::vsr::{Checkpoint, JournalEntry, Prng, Superblock};
use crate::wire::{Frame, FrameBuf};

#[derive(Clone, Debug)]
struct Pending {
    op: u64,
    checksum: u128,
    bytes: FrameBuf,
    sync_at: u64,
}

/// One replica's disk.
#[derive(Clone, Debug, Default)]
pub struct Storage {
    pub superblock: Superblock,
    /// The last checkpoint taken (written synchronously, like the superblock).
    pub checkpoint: Option<Checkpoint>,
    durable: BTreeMap<u64, FrameBuf>,
    pending: Vec<Pending>,
    pub writes: u64,
    pub torn: u64,
    pub corrupted: u64,
    /// Appends past the head are deferred (`SimOptions::defer_gaps`).
    pub defer_gaps: bool,
    /// Appends deferred because they were past the head.
    pub deferred: u64,
}

impl Storage {
    /// An empty disk; `defer_gaps` as `SimOptions::defer_gaps`.
    pub fn new(defer_gaps: bool) -> Storage {
        Storage {
            defer_gaps,
            ..Storage::default()
        }
    }

    /// The highest op the journal holds or is writing (the checkpoint's at least: its
    /// prepare is kept with it).
    pub fn head(&self) -> u64 {
        let durable = self.durable.keys().next_back().copied().unwrap_or(0);
        let pending = self.pending.iter().map(|p| p.op).max().unwrap_or(0);
        let checkpoint = self.checkpoint.as_ref().map_or(0, |c| c.op);
        durable.max(pending).max(checkpoint)
    }

    /// Starts a journal write that becomes durable at `sync_at`; false (nothing written)
    /// when `op` is past the head and gaps are deferred.
    pub fn append(&mut self, op: u64, frame: &Frame, sync_at: u64) -> bool {
        if self.defer_gaps && op > self.head() + 1 {
            self.deferred += 1;
            return false;
        }
        self.writes += 1;
        // Writes complete in order: never before an earlier one.
        let sync_at = self
            .pending
            .last()
            .map_or(sync_at, |p| p.sync_at.max(sync_at));
        self.pending.push(Pending {
            op,
            checksum: frame.checksum(),
            bytes: FrameBuf::from_bytes(frame.as_bytes()),
            sync_at,
        });
        true
    }

    /// Durably drops every entry above `op_max` (synchronous).
    pub fn truncate(&mut self, op_max: u64) {
        let _ = self.durable.split_off(&(op_max + 1));
        self.pending.retain(|p| p.op <= op_max);
    }

    /// Completes due writes; returns (op, checksum) of each, in order.
    pub fn sync(&mut self, now: u64) -> Vec<(u64, u128)> {
        let due = self.pending.iter().take_while(|p| p.sync_at <= now).count();
        let mut done = Vec::with_capacity(due);
        for pending in self.pending.drain(..due) {
            done.push((pending.op, pending.checksum));
            self.durable.insert(pending.op, pending.bytes);
        }
        done
    }

    /// A crash: unsynced writes are lost; the last one may be torn into its slot (when
    /// `tear`).
    pub fn crash(&mut self, prng: &mut Prng, tear: bool) {
        if let Some(last) = self.pending.last() {
            if prng.chance(1, 2) && tear {
                let mut bytes = last.bytes.clone();
                let len = bytes.len();
                let cut = 1 + prng.below(len as u64 - 1) as usize;
                bytes.as_bytes_mut()[cut..].fill(0);
                self.durable.insert(last.op, bytes);
                self.torn += 1;
            }
        }
        self.pending.clear();
    }

    /// The op of the write a crash would tear (the last one not yet durable), if any.
    pub fn tail(&self) -> Option<u64> {
        self.pending.last().map(|p| p.op)
    }

    /// Whether the durable entry at `op` does not read back as a valid prepare.
    pub fn faulty_at(&self, op: u64) -> bool {
        self.durable.get(&op).is_some_and(unreadable)
    }

    /// Flips a byte of the durable entry of `op`; false if there is none.
    pub fn corrupt(&mut self, op: u64, prng: &mut Prng) -> bool {
        let Some(bytes) = self.durable.get_mut(&op) else {
            return false;
        };
        let at = prng.below(bytes.len() as u64) as usize;
        bytes.as_bytes_mut()[at] ^= 0x5a;
        self.corrupted += 1;
        true
    }

    /// A state-transfer install: the source's checkpoint becomes this replica's; writes
    /// in flight are abandoned.
    pub fn install(&mut self, checkpoint: Checkpoint) {
        self.pending.clear();
        self.checkpoint = Some(checkpoint);
    }

    /// The durable bytes of `op`, if any.
    pub fn entry(&self, op: u64) -> Option<&FrameBuf> {
        self.durable.get(&op)
    }

    /// Whether some durable entry does not read back as a valid prepare (torn or
    /// corrupted): the replica cannot tell whether it acknowledged that op.
    pub fn holds_faulty(&self) -> bool {
        self.durable.values().any(unreadable)
    }

    /// Whether the durable entry at `op` reads back as the prepare `identity` (another
    /// prepare at that op, uncommitted and discarded later, is not a copy of it).
    pub fn holds_identity(&self, op: u64, identity: u128) -> bool {
        let limits = crate::wire::Limits::default();
        self.durable.get(&op).is_some_and(|bytes| {
            matches!(
                crate::wire::decode(bytes.as_bytes(), &limits),
                Ok(crate::wire::Message::Prepare(h, _)) if h.frame.checksum == identity
            )
        })
    }

    /// The journal as a restarting replica reads it.
    pub fn read_journal(&self) -> Vec<JournalEntry> {
        self.durable
            .iter()
            .map(|(op, bytes)| JournalEntry {
                op: *op,
                bytes: Some(bytes.clone()),
            })
            .collect()
    }
}

/// Whether durable bytes do not read back as a valid prepare (torn or corrupted).
fn unreadable(bytes: &FrameBuf) -> bool {
    crate::wire::decode(bytes.as_bytes(), &crate::wire::Limits::default()).is_err()
}
