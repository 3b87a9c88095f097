//! Invariant checkers, run after every step and at the end: one committed history, no
//! acknowledged write lost, hash chain intact, commit never going backwards, no request
//! applied twice.

use std::collections::BTreeMap;

use crate::wire::{Operation, PrepareHeader};

/// What the history records of a committed op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Committed {
    pub identity: u128,
    pub parent: u128,
    pub client: u128,
    pub request: u64,
    pub operation: u8,
}

/// The cluster-wide committed history and per-replica progress.
#[derive(Clone, Debug, Default)]
pub struct Checker {
    history: BTreeMap<u64, Committed>,
    /// Per replica: the last op it committed in its current incarnation.
    commit_last: Vec<u64>,
    /// (client, request) -> op, for requests other than Register.
    applied: BTreeMap<(u128, u64), u64>,
    pub replies: u64,
    pub reply_op_max: u64,
}

impl Checker {
    pub fn new(replica_count: u8) -> Checker {
        Checker {
            commit_last: vec![0; usize::from(replica_count)],
            ..Checker::default()
        }
    }

    /// The highest op committed anywhere.
    pub fn commit_max(&self) -> u64 {
        self.history.keys().next_back().copied().unwrap_or(0)
    }

    /// The history entry of `op`.
    pub fn get(&self, op: u64) -> Option<&Committed> {
        self.history.get(&op)
    }

    /// A replica restarted: it replays from its checkpoint (op 0 without one). A
    /// checkpoint must be an op committed with the identity the replica holds.
    pub fn restarted(&mut self, replica: u8, checkpoint: u64) {
        self.commit_last[usize::from(replica)] = checkpoint;
    }

    /// A replica committed `op`.
    pub fn on_commit(
        &mut self,
        replica: u8,
        op: u64,
        header: &PrepareHeader,
    ) -> Result<(), String> {
        let last = &mut self.commit_last[usize::from(replica)];
        if op != *last + 1 {
            return Err(format!(
                "replica {replica} committed op {op} after op {last} (commit not in order)"
            ));
        }
        *last = op;
        let entry = Committed {
            identity: header.frame.checksum,
            parent: header.parent,
            client: header.client,
            request: header.request,
            operation: header.operation,
        };
        if header.op != op {
            return Err(format!(
                "replica {replica} committed op {op} holding op {}",
                header.op
            ));
        }
        if let Some(known) = self.history.get(&op) {
            if known.identity != entry.identity {
                return Err(format!(
                    "replica {replica} committed op {op} with identity {:032x}, history has \
                     {:032x} (divergent histories)",
                    entry.identity, known.identity
                ));
            }
            return Ok(());
        }
        let parent_identity = if op == 1 {
            Some(0)
        } else {
            self.history.get(&(op - 1)).map(|c| c.identity)
        };
        if let Some(parent_identity) = parent_identity {
            if parent_identity != entry.parent {
                return Err(format!("hash chain broken at op {op} (replica {replica})"));
            }
        }
        if let Some(next) = self.history.get(&(op + 1)) {
            if next.parent != entry.identity {
                return Err(format!(
                    "hash chain broken at op {} (replica {replica})",
                    op + 1
                ));
            }
        }
        if entry.client != 0 && entry.operation != Operation::Register as u8 {
            if let Some(other) = self.applied.insert((entry.client, entry.request), op) {
                return Err(format!(
                    "client {:x} request {} applied twice (ops {other} and {op})",
                    entry.client, entry.request
                ));
            }
        }
        self.history.insert(op, entry);
        Ok(())
    }

    /// A client received a reply: the op must be committed with that request.
    pub fn on_reply(&mut self, client: u128, request: u64, op: u64) -> Result<(), String> {
        self.replies += 1;
        self.reply_op_max = self.reply_op_max.max(op);
        match self.history.get(&op) {
            Some(c) if c.client == client && c.request == request => Ok(()),
            Some(c) => Err(format!(
                "client {client:x} got a reply for request {request} at op {op}, which holds \
                 client {:x} request {}",
                c.client, c.request
            )),
            None => Err(format!(
                "client {client:x} got a reply for request {request} at op {op}, not committed"
            )),
        }
    }
}
