//! Normal operation (docs/protocol.md, "Replication"): prepares along the chain,
//! PrepareOk after a durable append, commit on a replication quorum, the Commit heartbeat
//! and prepare retransmission.

use crate::wire::registry::EvictionReason;
use crate::wire::{
    Command, CommitHeader, Frame, Header, Operation, PrepareHeader, PrepareOkHeader, METADATA_GROUP,
};

use super::log::frame_header;
use super::replica::{Replica, Status, NOT_SENT};
use super::Action;

impl Replica {
    /// The next replica of the chain after `from`, skipping disconnected peers; None once
    /// the chain would return to the primary.
    pub(super) fn chain_next(&self, from: u8) -> Option<u8> {
        let n = self.config.replica_count;
        let primary = self.config.primary_of(self.view);
        let mut next = (from + 1) % n;
        while next != primary {
            if next != self.config.replica && self.connected & (1 << next) != 0 {
                return Some(next);
            }
            next = (next + 1) % n;
        }
        None
    }

    /// A primary sends a new prepare down the chain (and around backups skipped as slow).
    /// A skipped backup the primary sends to gets it as a RepairPrepare, which it
    /// journals and acknowledges but does not forward: its successor has it already,
    /// from the primary, and would otherwise receive every prepare twice.
    pub(crate) fn send_chain(&mut self, frame: Frame) {
        let mut repair = None;
        for to in self.prepare_targets() {
            let frame = if self.slow.skipped & (1 << to) != 0 {
                repair
                    .get_or_insert_with(|| Frame::repair_of(frame.as_bytes()))
                    .clone()
            } else {
                frame.clone()
            };
            self.actions.push_back(Action::Send { to, frame });
        }
    }

    pub(super) fn on_prepare(
        &mut self,
        header: &PrepareHeader,
        body: &[u8],
        received: Option<&Frame>,
    ) {
        if header.frame.view > self.view {
            self.probe_view(header.frame.view);
            return;
        }
        if self.status != Status::Normal || header.frame.view < self.view || self.is_primary() {
            return;
        }
        self.primary_preparing = true;
        // Chain form: forward to our successor before our own (slower) journal write. A
        // received Prepare is byte for byte what sealing header and body again gives.
        let frame = match received {
            Some(frame) if frame.header().command == Command::Prepare as u8 => frame.clone(),
            _ => Frame::build(header, body),
        };
        let op = header.op;
        let identity = header.frame.checksum;
        // A prepare this replica holds already is not forwarded again: its successor had
        // it on the chain's first pass, or from the primary around a backup skipped as
        // slow (whose late forwards would otherwise reach every replica after it twice);
        // a successor that lost it is sent it by the primary's retransmit, which goes to
        // each replica that has not acknowledged.
        let held = op <= self.commit
            || op <= self.log.op_checkpoint
            || (op <= self.log.op
                && self.log.identity(op) == Some(identity)
                && self.log.slot(op).is_some_and(|slot| slot.frame.is_some()));
        if held {
            self.counters.prepares_received_again += 1;
        } else if let Some(to) = self.chain_next(self.config.replica) {
            self.actions.push_back(Action::Send {
                to,
                frame: frame.clone(),
            });
        }
        self.commit_max = self.commit_max.max(header.commit);
        if op <= self.commit || op <= self.log.op_checkpoint {
            self.commit_backup();
            return;
        }
        if op <= self.log.op {
            match self.log.identity(op) {
                Some(known) if known == identity => {
                    let slot = self.log.slot_mut(op);
                    if slot.frame.is_none() {
                        slot.frame = Some(frame.clone());
                        slot.header = Some(*header);
                        self.actions.push_back(Action::JournalAppend { op, frame });
                        self.walk_chain();
                    } else if slot.durable {
                        self.send_prepare_ok(op);
                    }
                }
                Some(_) => self.counters.prepares_refused += 1,
                None => {
                    // Inside a gap: the view's primary stamped it, so it is canonical.
                    self.log.set_canonical(header);
                    self.log.slot_mut(op).frame = Some(frame.clone());
                    self.actions.push_back(Action::JournalAppend { op, frame });
                    self.walk_chain();
                }
            }
        } else if !self.extend_log(header, body, frame) {
            return;
        }
        self.commit_backup();
    }

    /// A prepare this view's primary stamped, above the log: appended when it chains
    /// onto the last op and (SendMessages) carries the stamp its position implies; above
    /// a gap, canonical all the same (the view's primary stamped it), so its identity is
    /// taken and the ops between are repaired by the hash chain. False when refused.
    pub(crate) fn extend_log(&mut self, header: &PrepareHeader, body: &[u8], frame: Frame) -> bool {
        let op = header.op;
        if op == self.log.op + 1 && self.log.identity(self.log.op) == Some(header.parent) {
            if !self.stamp_ok(header, body) {
                self.counters.batch_stamp_mismatch += 1;
                self.counters.prepares_refused += 1;
                return false;
            }
            self.note_position(op, &frame);
            self.log.append(frame.clone());
            self.actions.push_back(Action::JournalAppend { op, frame });
        } else if op > self.log.op + 1 {
            self.log.set_canonical(header);
            self.log.slot_mut(op).frame = Some(frame.clone());
            self.log.op = op;
            self.log.chain_floor = op;
            self.actions.push_back(Action::JournalAppend { op, frame });
            self.walk_chain();
        }
        true
    }

    pub(crate) fn send_prepare_ok(&mut self, op: u64) {
        if !self.voter {
            return;
        }
        let Some(slot) = self.log.slot(op) else {
            return;
        };
        if !slot.durable {
            return;
        }
        let Some(prepare) = slot.header else {
            return;
        };
        let mut header = PrepareOkHeader::new();
        header.frame.cluster = self.config.cluster;
        header.frame.view = self.view;
        header.frame.replica = self.config.replica;
        header.parent = prepare.parent;
        header.prepare_checksum = prepare.frame.checksum;
        header.op = op;
        header.commit = self.commit;
        header.timestamp = prepare.timestamp;
        header.request = prepare.request;
        header.operation = prepare.operation;
        header.group = self.config.group;
        let frame = Frame::build(&header, &[]);
        let to = self.config.primary_of(self.view);
        self.actions.push_back(Action::Send { to, frame });
    }

    pub(super) fn on_prepare_ok(&mut self, header: &PrepareOkHeader) {
        if self.status != Status::Normal || !self.is_primary() || header.frame.view != self.view {
            return;
        }
        if self.log.identity(header.op) != Some(header.prepare_checksum) {
            return;
        }
        if let Some(pending) = self.pipeline.get_mut(&header.op) {
            pending.acks |= 1 << header.frame.replica;
        }
        self.slow.on_ack(header.frame.replica, header.op);
        self.commit_pipeline();
    }

    pub(crate) fn commit_pipeline(&mut self) {
        assert!(self.is_primary() && self.status == Status::Normal);
        let committed = self.commit;
        loop {
            let op = self.commit + 1;
            let Some(pending) = self.pipeline.get(&op) else {
                break;
            };
            if (pending.acks.count_ones() as usize) < self.config.quorum_replication() {
                break;
            }
            if let Some(pending) = self.pipeline.remove(&op) {
                if pending.prepared_at != NOT_SENT {
                    self.slow.on_commit(op, pending.prepared_at, self.now);
                }
            }
            self.progress_tick = self.now;
            self.commit_max = self.commit_max.max(op);
            self.commit_op(op);
        }
        // A metadata op changes what the backups serve (a session forwarded through one
        // waits for it there; a new topic's partition groups open when it applies): the
        // backups learn the commit now rather than at the next heartbeat. While ops are
        // in flight, the commit that empties the pipeline announces theirs too.
        if self.config.group == METADATA_GROUP
            && self.commit > committed
            && self.pipeline.is_empty()
        {
            self.on_commit_broadcast_timeout();
        }
    }

    /// Applies ops up to commit_max that are in hand (a backup, or a primary catching up).
    pub(crate) fn commit_backup(&mut self) {
        while self.commit < self.commit_max {
            let op = self.commit + 1;
            if op > self.log.op || op < self.log.chain_floor {
                break;
            }
            if !self.log.slot(op).is_some_and(|slot| slot.ready()) {
                break;
            }
            self.commit_op(op);
        }
        self.prune_positions();
        self.try_become_voter();
    }

    /// Commits op `commit + 1`: the only place commit advances.
    pub(crate) fn commit_op(&mut self, op: u64) {
        assert_eq!(op, self.commit + 1, "commit in order");
        assert!(op <= self.commit_max);
        let slot = self.log.slot(op).expect("committing a held op");
        let frame = slot.frame.clone().expect("committing a held body");
        let header = frame_header(&frame);
        assert_eq!(Some(header.frame.checksum), slot.identity);
        assert_eq!(
            Some(header.parent),
            self.log.identity(op - 1).or(Some(header.parent))
        );
        self.commit = op;
        if self.log.released() == Some(op - 1) {
            // The released prepare is no longer the commit point: it is evicted like
            // the ops below it.
            self.log.checkpoint(op - 1);
        }
        if !self.positions.contains_key(&op) {
            self.note_position(op, &frame);
        }
        self.actions.push_back(Action::Commit {
            op,
            prepare: frame.clone(),
        });
        let reply = self.build_reply(&header);
        let primary = self.status == Status::Normal && self.is_primary();
        let client = header.client;
        // Until the op is applied the session holds the reply's header alone.
        let unapplied = Frame::build(&reply, &[]);
        if header.operation == Operation::Register as u8 {
            if let Some(evicted) = self.clients.register(client, op, unapplied) {
                if primary {
                    self.evict(evicted, EvictionReason::StaleClient);
                }
            }
        } else if header.operation == Operation::Logout as u8 {
            self.clients.remove(client);
        } else if self.config.group == METADATA_GROUP {
            self.clients.commit(client, header.request, op, unapplied);
        } else if client != 0 {
            if let Some(evicted) =
                self.clients
                    .commit_request(client, header.request, op, unapplied)
            {
                if primary {
                    self.evict(evicted, EvictionReason::StaleClient);
                }
            }
        }
        // The reply is sealed and sent once the driver reports the op applied.
        self.await_applied(op, reply);
    }

    pub(crate) fn on_commit_broadcast_timeout(&mut self) {
        if self.status != Status::Normal || !self.is_primary() {
            self.timeout_commit_broadcast.stop();
            return;
        }
        // A primary whose pipeline has not moved for a heartbeat timeout (it cannot hear
        // a quorum, though it may still be heard) stops its heartbeat so the backups
        // elect a primary that can make progress.
        if !self.pipeline.is_empty()
            && self.now - self.progress_tick > self.config.heartbeat_timeout_ticks
        {
            return;
        }
        self.heartbeat_sent = self.now.max(self.heartbeat_sent + 1);
        let mut header = CommitHeader::new();
        header.frame.cluster = self.config.cluster;
        header.frame.view = self.view;
        header.frame.replica = self.config.replica;
        header.timestamp_monotonic = self.heartbeat_sent;
        header.commit = self.commit;
        header.group = self.config.group;
        let frame = Frame::build(&header, &[]);
        self.actions.push_back(Action::Broadcast { frame });
        self.commit_broadcasts = match self.commit_broadcasts {
            _ if !self.pipeline.is_empty() => (self.commit, 0),
            (commit, sent) if commit == self.commit => (commit, sent + 1),
            _ => (self.commit, 1),
        };
    }

    pub(super) fn on_commit_message(&mut self, header: &CommitHeader) {
        if header.frame.view > self.view {
            self.probe_view(header.frame.view);
            return;
        }
        if self.status != Status::Normal
            || header.frame.view < self.view
            || self.is_primary()
            || header.frame.replica != self.config.primary_of(self.view)
        {
            return;
        }
        if header.timestamp_monotonic > self.heartbeat_seen {
            self.heartbeat_seen = header.timestamp_monotonic;
            self.timeout_heartbeat.start(self.now, &mut self.prng);
            self.primary_preparing = false;
        }
        self.commit_max = self.commit_max.max(header.commit);
        self.commit_backup();
    }

    pub(super) fn on_prepare_retransmit_timeout(&mut self) {
        if self.status != Status::Normal || !self.is_primary() {
            self.timeout_prepare_retransmit.stop();
            return;
        }
        let all = self.all_replicas();
        // Only prepares sent at least half an interval ago: one sent just before the
        // timer fired is not late, and under load every 1 MiB batch in the pipeline would
        // otherwise go out again on each firing.
        let due_before = self
            .now
            .saturating_sub(self.config.prepare_retransmit_interval_ticks / 2);
        let now = self.now;
        let due: Vec<(u64, u32)> = self
            .pipeline
            .iter_mut()
            .filter(|(_, pending)| pending.sent_at <= due_before)
            .map(|(op, pending)| {
                pending.sent_at = now;
                if pending.prepared_at == NOT_SENT {
                    pending.prepared_at = now;
                }
                (*op, pending.acks)
            })
            .collect();
        for (op, acks) in due {
            let Some(frame) = self.prepare_in_view(op) else {
                continue;
            };
            for to in 0..self.config.replica_count {
                if to != self.config.replica && acks & (1 << to) == 0 && all & (1 << to) != 0 {
                    self.actions.push_back(Action::Send {
                        to,
                        frame: frame.clone(),
                    });
                }
            }
        }
    }

    /// The prepare of `op` as the primary sends it in this view: re-stamped in the
    /// current view (the identity leaves view out); in the view it was built in, the
    /// frame as it is.
    pub(crate) fn prepare_in_view(&self, op: u64) -> Option<Frame> {
        let frame = self.log.slot(op).and_then(|s| s.frame.as_ref())?;
        let mut header = frame_header(frame);
        Some(if header.frame.view == self.view {
            frame.clone()
        } else {
            header.frame.view = self.view;
            Frame::build(&header, &frame.as_bytes()[256..])
        })
    }

    pub(crate) fn all_replicas(&self) -> u32 {
        if self.config.replica_count >= 32 {
            u32::MAX
        } else {
            (1u32 << self.config.replica_count) - 1
        }
    }

    pub(crate) fn on_heartbeat_timeout(&mut self) {
        if !self.voter {
            if self.status == Status::Normal && self.census.is_none() {
                self.probe_as_non_voter();
            }
            return;
        }
        if self.status == Status::Normal && !self.is_primary() {
            self.start_view_change(self.view + 1);
        }
    }

    /// Timeouts of a Normal replica (primary or backup).
    pub(crate) fn start_normal_timeouts(&mut self) {
        let now = self.now;
        self.primary_preparing = false;
        // Broadcasts of an earlier view told nobody of this one: a primary that led
        // before at the same commit point still owes the new view's backups its Commits
        // before it may sleep.
        self.commit_broadcasts = (0, 0);
        self.slow.reset(now);
        self.timeout_view_change.stop();
        self.timeout_view_change_retransmit.stop();
        self.timeout_probe.stop();
        self.timeout_repair.start(now, &mut self.prng);
        if self.is_primary() {
            self.timeout_heartbeat.stop();
            self.timeout_commit_broadcast.start(now, &mut self.prng);
            self.timeout_prepare_retransmit.start(now, &mut self.prng);
        } else {
            self.timeout_commit_broadcast.stop();
            self.timeout_prepare_retransmit.stop();
            self.timeout_heartbeat.start(now, &mut self.prng);
        }
    }
}
