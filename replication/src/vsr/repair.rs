//! Journal repair (docs/protocol.md, "Journal repair"): RequestPrepares for ops
//! whose body is missing or faulty, RepairPrepare streamed in op order and accepted only
//! when its identity is the canonical one (or, above the log, when the view's primary
//! stamped it: then it extends the log as a Prepare would, unforwarded), RepairDone /
//! RangeEvicted, and the hand-off to state transfer when peers no longer hold what is
//! needed.

use crate::wire::{Frame, Header, PrepareHeader, RepairResultHeader, RequestPreparesHeader};

use super::log::frame_header;
use super::replica::{Replica, Status};
use super::Action;

/// Ops asked to be journaled again per repair timeout at most.
const JOURNAL_AGAIN_MAX: usize = 64;

impl Replica {
    /// Extends the known chain down to the commit point and journals promoted candidates.
    pub(crate) fn walk_chain(&mut self) {
        for op in self.log.walk_chain(self.commit) {
            if let Some(frame) = self.log.slot(op).and_then(|s| s.frame.clone()) {
                self.counters.repairs_accepted += 1;
                self.actions.push_back(Action::JournalAppend { op, frame });
            }
        }
    }

    /// Periodic repair: ask a peer for the first range of ops we lack.
    pub(crate) fn on_repair_timeout(&mut self) {
        let forming = self.status == Status::ViewChange && self.merged && self.is_primary();
        // In a view change, an op our DVC cannot vouch for is repaired from any peer.
        let blocked =
            self.status == Status::ViewChange && !forming && self.dvc_unvouched().is_some();
        if self.status != Status::Normal && !forming && !blocked {
            return;
        }
        if self.status == Status::Normal {
            self.journal_again();
            self.ask_formation_peers();
        }
        self.walk_chain();
        let top = if blocked {
            self.log.op
        } else {
            self.log.op.max(self.commit_max)
        };
        // Below chain_floor identities are unknown: local entries there wait for the walk,
        // which is blocked by the first known op without a body at or above it.
        let floor = self.log.chain_floor.max(self.commit + 1);
        let blocked = (floor..=top)
            .find(|op| *op > self.log.op || self.log.slot(*op).is_none_or(|s| s.frame.is_none()));
        let chunk = self.config.repair_chunk_max;
        let (from, to) = match blocked {
            // The walk is blocked here: fetch it and the ops below it, which the walk
            // then verifies one by one as candidates.
            Some(op) if op == self.log.chain_floor && op > self.commit + 1 => {
                (op.saturating_sub(chunk - 1).max(self.commit + 1), op)
            }
            Some(op) => (op, top.min(op + chunk - 1)),
            None if self.log.chain_floor > self.commit + 1 => (
                self.log
                    .chain_floor
                    .saturating_sub(chunk)
                    .max(self.commit + 1),
                self.log.chain_floor - 1,
            ),
            None => return,
        };
        self.request_prepares(from, to);
    }

    /// Asks the driver again to journal ops whose bodies are here but not reported
    /// durable. A driver defers an append past its journal's head (the prepare arrived
    /// before the ops below it); repair then brings the ops below, but the deferred op has
    /// its body, so it would never be asked for again: above the commit point it is never
    /// acknowledged (a view whose quorum needs it cannot commit), and at or below it, once
    /// committed from memory, it stays a hole in the journal (a replacement waits for
    /// every op it stands in for to be durable before it votes). Journaling a held op
    /// again is idempotent for the driver.
    fn journal_again(&mut self) {
        let mut asked = 0;
        for op in self.log.op_min()..=self.log.op {
            if asked == JOURNAL_AGAIN_MAX {
                break;
            }
            let Some(frame) = self
                .log
                .slot(op)
                .filter(|s| !s.durable)
                .and_then(|s| s.frame.clone().filter(|f| s.identity == Some(f.checksum())))
            else {
                continue;
            };
            self.counters.journal_again += 1;
            self.actions.push_back(Action::JournalAppend { op, frame });
            asked += 1;
        }
    }

    fn request_prepares(&mut self, from: u64, to: u64) {
        assert!(from >= 1 && from <= to);
        let Some(peer) = self.repair_peer(from) else {
            return;
        };
        let mut header = RequestPreparesHeader::new();
        header.frame.cluster = self.config.cluster;
        header.frame.view = self.view;
        header.frame.replica = self.config.replica;
        header.nonce = self.prng.next_u128();
        self.repair_nonce = header.nonce;
        header.from_op = from;
        header.to_op = to;
        header.group = self.config.group;
        let frame = Frame::build(&header, &[]);
        self.counters.repair_requests_sent += 1;
        self.actions.push_back(Action::Send { to: peer, frame });
    }

    fn repair_peer(&mut self, op: u64) -> Option<u8> {
        let n = self.config.replica_count;
        let own = self.config.replica;
        if self.status == Status::ViewChange {
            // Forming primary: a DVC sender that presents the body; else one that committed
            // past it, every other round (it may not hold the body: the others, a
            // non-voter among them, get their turn in the rotation below).
            let header = self.log.header(op).copied();
            let presents = |d: &super::replica::Dvc| {
                header.is_some_and(|h| {
                    d.headers
                        .iter()
                        .position(|x| x.op == op && x.frame.checksum == h.frame.checksum)
                        .is_some_and(|i| d.present & (1 << i) != 0)
                })
            };
            let presenters: Vec<u8> = self
                .dvcs
                .iter()
                .filter(|(r, d)| **r != own && presents(d))
                .map(|(r, _)| *r)
                .collect();
            let committed: Vec<u8> = self
                .dvcs
                .iter()
                .filter(|(r, d)| **r != own && d.commit >= op)
                .map(|(r, _)| *r)
                .collect();
            self.repair_peer_next = self.repair_peer_next.wrapping_add(1);
            let turn = usize::from(self.repair_peer_next);
            if !presenters.is_empty() {
                return Some(presenters[turn % presenters.len()]);
            }
            if !committed.is_empty() && turn % 2 == 0 {
                return Some(committed[(turn / 2) % committed.len()]);
            }
            // Else every other replica in turn, by the same counter. (The rotation below
            // reduces the counter modulo the replica count, which breaks the alternation:
            // in a cluster of 3, replica 0 asked only 1, 1 only 2 and 2 only 0, never the
            // peer whose DVC showed it committed past the op.)
            let others: Vec<u8> = (0..n).filter(|r| *r != own).collect();
            return others.get((turn / 2) % others.len().max(1)).copied();
        } else if op > self.log.op && !self.is_primary() {
            // Above our log only the view's primary stamps what we may append.
            return Some(self.config.primary_of(self.view));
        }
        for _ in 0..n {
            self.repair_peer_next = (self.repair_peer_next + 1) % n;
            let peer = self.repair_peer_next;
            if peer != own {
                return Some(peer);
            }
        }
        None
    }

    /// Serves a peer's RequestPrepares from the durable journal, in op order.
    pub(crate) fn on_request_prepares(&mut self, header: &RequestPreparesHeader) {
        if self.status == Status::Recovering {
            return;
        }
        let to = header.frame.replica;
        if to == self.config.replica {
            return;
        }
        let mut result = RepairResultHeader::new();
        result.frame.cluster = self.config.cluster;
        result.frame.view = self.view;
        result.frame.replica = self.config.replica;
        result.nonce = header.nonce;
        result.group = self.config.group;
        if header.from_op < self.log.served_min() {
            result.frame.command = crate::wire::Command::RangeEvicted as u8;
            result.op = self.log.served_min();
            let frame = Frame::build(&result, &[]);
            self.counters.ranges_evicted += 1;
            self.actions.push_back(Action::Send { to, frame });
            return;
        }
        let to_op = header
            .to_op
            .min(header.from_op + self.config.repair_chunk_max - 1);
        let mut served = header.from_op - 1;
        // Every prepare the journal holds durably, its identity known here or not: the
        // requester takes one only by the identity its own chain gives that op, so serving
        // is no vote. A restarted replica learns identities only down to its highest
        // faulty entry; if it served only those, two replicas whose holes interleave
        // would each wait on the other for a prepare both have.
        for op in header.from_op..=to_op {
            let Some(frame) = self.log.held_frame(op) else {
                continue;
            };
            let frame = Frame::repair_of(frame.as_bytes());
            self.counters.repairs_served += 1;
            self.actions.push_back(Action::Send { to, frame });
            served = op;
        }
        if served < header.from_op && self.log.op >= header.from_op {
            // The range is in our log but nothing of it is durable yet: an empty
            // RepairDone would say we hold nothing there (a formatted replica's census
            // reads it so). Silence: the requester asks again.
            return;
        }
        result.op = served;
        let frame = Frame::build(&result, &[]);
        self.actions.push_back(Action::Send { to, frame });
    }

    /// A repaired prepare: accepted only by identity or, above the log, by the view's stamp
    /// and the parent chain.
    pub(crate) fn on_repair_prepare(&mut self, header: &PrepareHeader, body: &[u8]) {
        if self.status == Status::Recovering {
            return;
        }
        let mut prepare = *header;
        prepare.frame.command = crate::wire::Command::Prepare as u8;
        let frame = Frame::build(&prepare, body);
        debug_assert_eq!(frame.checksum(), header.frame.checksum);
        let op = header.op;
        if op <= self.commit || op <= self.log.op_checkpoint {
            return;
        }
        let identity = header.frame.checksum;
        match self.log.identity(op) {
            Some(known) if known == identity => {
                let slot = self.log.slot_mut(op);
                if slot.frame.is_none() {
                    slot.frame = Some(frame.clone());
                    slot.header = Some(frame_header(&frame));
                    self.counters.repairs_accepted += 1;
                    self.actions.push_back(Action::JournalAppend { op, frame });
                    self.walk_chain();
                }
            }
            Some(_) => {}
            // Above the log, stamped in this view: taken as a Prepare is (a backup the
            // primary skips as slow gets new prepares this way), but never forwarded.
            None if op > self.log.op
                && self.status == Status::Normal
                && header.frame.view == self.view =>
            {
                self.primary_preparing = true;
                let before = self.log.op;
                if self.extend_log(&prepare, body, frame) && self.log.op > before {
                    self.counters.repairs_accepted += 1;
                }
            }
            None if op > self.log.op => {}
            None => {
                self.log.slot_mut(op).candidate = Some(frame);
                self.walk_chain();
            }
        }
        match self.status {
            Status::Normal => {
                self.rebuild_positions();
                self.commit_backup();
                self.try_become_voter();
                if self.is_primary() {
                    self.commit_pipeline();
                }
            }
            Status::ViewChange => self.forming_try_start_view(),
            Status::Recovering => {}
        }
    }

    /// A peer finished serving a chunk: ask for the next one at once rather than at the
    /// next repair tick, so a far-behind replica catches up at round-trip pace.
    pub(crate) fn on_repair_done(&mut self, header: &RepairResultHeader) {
        // Only the latest request continues, so at most one chain of requests runs.
        if header.nonce == self.repair_nonce && header.op > self.commit {
            self.on_repair_timeout();
        }
    }

    /// A peer no longer holds the front of what we asked for.
    pub(crate) fn on_range_evicted(&mut self, header: &RepairResultHeader) {
        if header.op <= self.commit + 1
            || self.state_transfer_requested
            || self.status == Status::Recovering
        {
            return;
        }
        // Another peer may still hold the range (peers checkpoint independently): repair
        // rotates through peers, and state transfer starts once half of the other
        // replicas (or every connected one) evicted what we lack since commit last moved.
        if self.evicted.0 != self.commit {
            self.evicted = (self.commit, 0);
        }
        let peer = header.frame.replica;
        if peer < self.config.replica_count {
            self.evicted.1 |= 1 << peer;
        }
        let others = u32::from(self.config.replica_count) - 1;
        let enough = self.evicted.1.count_ones() >= (others / 2).max(1);
        if enough || self.connected & !self.evicted.1 == 0 {
            self.state_transfer_requested = true;
            self.counters.state_transfers_requested += 1;
            self.actions.push_back(Action::StateTransfer {
                from: header.frame.replica,
                op_min: header.op,
            });
        }
    }
}
