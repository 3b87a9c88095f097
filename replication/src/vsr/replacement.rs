//! A replica that may not vote: one whose durable state is gone or cannot be trusted (a
//! replaced disk, a wiped data directory, an unreadable superblock), and a formatted
//! replica that does not know yet whether its group ever formed.
//!
//! Such a replica may have made promises before it lost its state (PrepareOks, view
//! numbers, DoViewChanges) that it no longer remembers. Voting from an empty log would
//! break them: its DoViewChange would nack prepares it once acknowledged, and a quorum
//! counting it could truncate a committed op. So it is a non-voter (no PrepareOk, no
//! StartViewChange or DoViewChange, never primary) until it holds a state that the
//! current view vouches for:
//!
//! 1. Census. It asks every peer with a RequestPrepares (ops 1..=1, one nonce) and
//!    records the view of each answer from a member that remembers. A non-voter answers
//!    every RequestPrepares with RangeEvicted op 0 ("I retain nothing": op 0 is never a
//!    real op), so it is told apart and never counted. Answers carry the census nonce, so
//!    they were sent after this replica lost its state.
//! 2. Once `quorum_nack` members that remember answered (n - quorum + 1: every quorum
//!    this replica was part of before the loss has one of them), the highest view
//!    reported bounds every view in which a lost promise of this replica mattered.
//! 3. It probes with RequestStartView and installs the first StartView, answering its
//!    own incarnation, of a view at least that high. That StartView's op covers every
//!    prepare this replica acknowledged before the loss (its primary prepared them
//!    before answering) and every committed op (they are in that view's log).
//! 4. It repairs (or transfers state) until it has applied every op of the view's log up
//!    to that StartView's op. Then it persists that it votes again and acknowledges what
//!    it holds.
//!
//! A formatted replica first decides whether it forms a new group or replaces a member:
//! any evidence of a formed group (a frame naming an op, a peer that checkpointed) makes
//! it a replacement; it forms a new group only when every other replica answered and none
//! remembers anything, which is the case of a new cluster whose members all start.

use crate::wire::{Frame, Header, Message, RepairResultHeader, RequestPreparesHeader};

use super::replica::{Census, Replica, Status};
use super::Action;

/// What a replica that may not vote yet waits for (stats and logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecoveryWait {
    /// A formatted replica: whether its group formed. `answered` of `peers` replied.
    Formation { answered: u32, peers: u32 },
    /// Answers from members that remember: `heard` of the `needed`.
    Census { heard: u32, needed: u32 },
    /// A StartView of view `view_min` or later from that view's primary.
    StartView { view_min: u32 },
    /// Applying every op up to `op` (the first StartView's; `commit` was its commit).
    CatchUp { commit: u64, op: u64 },
}

impl Replica {
    /// A replica whose durable state was lost, rejoining a group that formed (the
    /// operator said so, e.g. `appliance recover`): it persists that it is a replacement
    /// and may vote only once it caught up (see the module doc).
    pub fn replacement(config: super::Config) -> Replica {
        assert!(
            config.replica_count > 1,
            "a group of one replica has nobody to recover from"
        );
        let mut replica = Replica::empty(config);
        replica.superblock.replacement = true;
        replica.persist_superblock();
        replica.start_census(false);
        replica
    }

    /// A freshly formatted replica that does not know whether its group formed: it forms
    /// a new group with the others if none of them remembers anything, and otherwise
    /// rejoins as a replacement. A one-replica group forms at once.
    pub fn unformed(config: super::Config) -> Replica {
        if config.replica_count == 1 {
            return Replica::new(config);
        }
        let mut replica = Replica::empty(config);
        // Durably undecided: a crash before the census decides restarts it unformed
        // again, never as a member with an empty (and so unvouched) state.
        replica.superblock.unformed = true;
        replica.persist_superblock();
        replica.start_census(true);
        replica
    }

    /// Whether this replica takes part in consensus (acks, view changes, primary).
    pub fn is_voter(&self) -> bool {
        self.voter
    }

    /// The commit point at which this replica, having lost its state, became a voter
    /// again; 0 when it never was a replacement since it started. Ops at or below it were
    /// committed before it voted: the driver treats what they created (partition groups)
    /// as lost with its state.
    pub fn voter_since(&self) -> u64 {
        self.voter_since
    }

    /// What a non-voter waits for; None for a voter.
    pub fn recovery_wait(&self) -> Option<RecoveryWait> {
        if self.voter {
            return None;
        }
        if let Some(census) = &self.census {
            let peers = u32::from(self.config.replica_count) - 1;
            let heard = census.views.iter().filter(|v| v.is_some()).count() as u32;
            if census.formation {
                return Some(RecoveryWait::Formation {
                    answered: heard + census.blank.count_ones(),
                    peers,
                });
            }
            return Some(RecoveryWait::Census {
                heard,
                needed: self.config.quorum_nack() as u32,
            });
        }
        match self.recover {
            Some((op, commit)) if self.status == Status::Normal => {
                Some(RecoveryWait::CatchUp { commit, op })
            }
            _ => Some(RecoveryWait::StartView {
                view_min: self.view_min.max(self.view),
            }),
        }
    }

    /// Enters the census (status Recovering, not a voter) and asks every peer.
    pub(crate) fn start_census(&mut self, formation: bool) {
        self.voter = false;
        self.status = Status::Recovering;
        self.recover = None;
        self.pipeline.clear();
        self.census = Some(Census {
            nonce: self.prng.next_u128() | 1,
            views: vec![None; usize::from(self.config.replica_count)],
            blank: 0,
            formed: false,
            formation,
        });
        self.incarnation = self.prng.next_u128() | 1;
        let now = self.now;
        self.timeout_heartbeat.stop();
        self.timeout_commit_broadcast.stop();
        self.timeout_prepare_retransmit.stop();
        self.timeout_view_change.stop();
        self.timeout_view_change_retransmit.stop();
        self.timeout_repair.stop();
        self.timeout_probe.start(now, &mut self.prng);
        self.send_census_requests();
    }

    /// A frame from a peer while this replica may not vote. Returns true when it was
    /// handled here (census answers, repair requests, votes it takes no part in); the
    /// others (prepares, repairs, commits, StartViews) go through the usual handlers.
    pub(crate) fn on_decoded_non_voter(&mut self, message: &Message<'_>) -> bool {
        let evidence = match message {
            Message::Prepare(h, _) | Message::RepairPrepare(h, _) => Some(h.op),
            Message::PrepareOk(h) => Some(h.op),
            Message::Commit(h) => Some(h.commit),
            Message::DoViewChange(h, _) => Some(h.op),
            Message::StartView(h, _) => Some(h.op),
            _ => None,
        };
        if let Some(op) = evidence {
            if self.census.as_ref().is_some_and(|c| c.formation) {
                self.note_formation_evidence(op);
            }
        }
        match message {
            Message::RepairDone(h) => self.on_census_answer(h, false),
            Message::RangeEvicted(h) => self.on_census_answer(h, true),
            Message::RequestPrepares(h) => {
                self.answer_as_non_voter(h);
                true
            }
            Message::StartViewChange(h) => {
                self.non_voter_heard_view(h.frame.view);
                true
            }
            Message::DoViewChange(h, _) => {
                self.non_voter_heard_view(h.frame.view);
                true
            }
            Message::RequestStartView(_) | Message::PrepareOk(_) => true,
            _ => false,
        }
    }

    /// A member of a new group asks the peers it has not seen voting yet.
    pub(crate) fn ask_formation_peers(&mut self) {
        let (waiting, nonce) = self.formation_wait;
        for to in (0..self.config.replica_count).filter(|r| waiting & (1 << r) != 0) {
            self.send_census_request(to, nonce);
        }
    }

    /// The census question: RequestPrepares of op 1 under the census nonce.
    fn send_census_request(&mut self, to: u8, nonce: u128) {
        let mut header = RequestPreparesHeader::new();
        header.frame.cluster = self.config.cluster;
        header.frame.view = self.view;
        header.frame.replica = self.config.replica;
        header.nonce = nonce;
        header.from_op = 1;
        header.to_op = 1;
        header.group = self.config.group;
        let frame = Frame::build(&header, &[]);
        self.actions.push_back(Action::Send { to, frame });
    }

    /// An answer to `ask_formation_peers`: a RepairDone (or a RangeEvicted naming an op)
    /// comes from a peer that votes. Returns whether the frame was one.
    pub(crate) fn on_formation_answer(&mut self, message: &Message<'_>) -> bool {
        let (header, evicted) = match message {
            Message::RepairDone(h) => (h, false),
            Message::RangeEvicted(h) => (h, true),
            _ => return false,
        };
        if header.nonce != self.formation_wait.1 {
            return false;
        }
        if !evicted || header.op > 0 {
            self.formation_wait.0 &= !(1u32 << header.frame.replica);
            self.formation_settle();
        }
        true
    }

    /// A new group is formed once a replication quorum of its members (this one
    /// included) votes: the members still deciding then find a group that can take them
    /// in as replacements. Waiting for every member would leave a new group unusable if
    /// one of them died right after deciding.
    fn formation_settle(&mut self) {
        let peers = u32::from(self.config.replica_count) - 1;
        let voting = peers - self.formation_wait.0.count_ones() + 1;
        if voting as usize >= self.config.quorum_replication() {
            self.formation_wait = (0, 0);
        }
    }

    /// Asks each peer that has not answered yet.
    fn send_census_requests(&mut self) {
        let Some(census) = &self.census else {
            return;
        };
        let nonce = census.nonce;
        let missing: Vec<u8> = (0..self.config.replica_count)
            .filter(|r| {
                // A peer that answered as a non-voter is asked again: it may vote by now.
                *r != self.config.replica && census.views[usize::from(*r)].is_none()
            })
            .collect();
        for to in missing {
            self.send_census_request(to, nonce);
        }
    }

    /// Any frame of the group that names an op is evidence that the group formed (stale
    /// frames too: a group that formed stays formed). Views alone are not: a group in
    /// which no op was ever prepared holds nothing to lose, and the first members of a
    /// new group may change views while the last ones still decide.
    pub(crate) fn note_formation_evidence(&mut self, op: u64) {
        if let Some(census) = self.census.as_mut() {
            if op > 0 {
                census.formed = true;
            }
        }
        self.census_decide();
    }

    /// A RepairDone or RangeEvicted: a census answer when it carries the census nonce.
    /// Returns whether it was one.
    pub(crate) fn on_census_answer(&mut self, header: &RepairResultHeader, evicted: bool) -> bool {
        let Some(census) = self.census.as_mut() else {
            return false;
        };
        if header.nonce != census.nonce {
            return false;
        }
        let peer = header.frame.replica;
        if evicted && header.op == 0 {
            census.blank |= 1 << peer;
        } else {
            census.blank &= !(1 << peer);
            let view = header.frame.view;
            let known = census.views[usize::from(peer)].unwrap_or(0);
            census.views[usize::from(peer)] = Some(known.max(view));
            // RangeEvicted: the peer checkpointed ops away.
            if header.op > 0 || evicted {
                census.formed = true;
            }
        }
        self.census_decide();
        true
    }

    /// Moves on once the census decides.
    fn census_decide(&mut self) {
        let Some(census) = self.census.as_ref() else {
            return;
        };
        let peers = u32::from(self.config.replica_count) - 1;
        let views: Vec<u32> = census.views.iter().flatten().copied().collect();
        let answered = views.len() as u32 + census.blank.count_ones();
        if census.formation {
            if census.formed {
                // A member that lost its state: from now on a replacement, durably.
                if let Some(census) = self.census.as_mut() {
                    census.formation = false;
                }
                self.superblock.replacement = true;
                self.superblock.unformed = false;
                self.persist_superblock();
            } else if answered == peers {
                // Every other replica answered and none remembers anything: a new group.
                // It prepares nothing until a quorum of members formed it as well: with
                // fewer, the members still deciding would see its ops, take themselves
                // for replacements, and no quorum would vote.
                let nonce = census.nonce;
                let all = self.all_replicas() & !(1u32 << self.config.replica);
                let voting = census
                    .views
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.is_some())
                    .fold(0u32, |bits, (r, _)| bits | 1 << r);
                // The highest view a member that remembers reported: a group that never
                // prepared an op may still have changed views, and this replica may have
                // voted in them before it lost its state (a StartView it sent, a
                // DoViewChange). Every quorum it was part of has a member among the
                // answers, so no such promise lies above this view.
                let view_reported = views.iter().copied().max().unwrap_or(0);
                self.census = None;
                // A new group is in its initial view, as if it had started there.
                self.view = self.view.max(self.config.initial_view);
                self.log_view = self.log_view.max(self.config.initial_view);
                self.superblock.unformed = false;
                self.voter = true;
                self.formation_wait = (all & !voting, nonce);
                self.formation_settle();
                if view_reported > self.view {
                    // It never votes below that view: like a member restarting in it, it
                    // asks for the view's StartView, and after its probes starts a view
                    // change above it. Its log stays of the initial view (empty), so its
                    // DoViewChange outweighs no member's.
                    self.view = view_reported;
                    self.persist_superblock();
                    self.status = Status::Recovering;
                    self.incarnation = self.prng.next_u128();
                    let frame = self.request_start_view_frame(self.view);
                    self.actions.push_back(Action::Broadcast { frame });
                    let now = self.now;
                    self.timeout_probe.start(now, &mut self.prng);
                    return;
                }
                self.persist_superblock();
                self.status = Status::Normal;
                self.start_normal_timeouts();
                return;
            } else {
                return;
            }
        }
        let census = self.census.as_ref().expect("census in progress");
        if views.len() < self.config.quorum_nack() {
            return;
        }
        let view_min = census.views.iter().flatten().copied().max().unwrap_or(0);
        self.view_min = self.view_min.max(view_min);
        self.census = None;
        self.probe_as_non_voter();
    }

    /// A non-voter that knows its census asks for a StartView (any primary of a view at
    /// least `view_min` answers).
    pub(crate) fn probe_as_non_voter(&mut self) {
        assert!(!self.voter && self.census.is_none());
        self.status = Status::Recovering;
        self.incarnation = self.prng.next_u128() | 1;
        let frame = self.request_start_view_frame(self.view.max(self.view_min));
        self.actions.push_back(Action::Broadcast { frame });
        let now = self.now;
        self.timeout_heartbeat.stop();
        self.timeout_repair.stop();
        self.timeout_probe.start(now, &mut self.prng);
    }

    /// The probe timeout of a non-voter: ask again.
    pub(crate) fn on_probe_timeout_non_voter(&mut self) {
        if self.census.is_some() {
            self.send_census_requests();
        } else {
            let frame = self.request_start_view_frame(self.view.max(self.view_min));
            self.actions.push_back(Action::Broadcast { frame });
        }
    }

    /// Whether a non-voter may install this StartView: solicited by its current probe,
    /// after its census, of a view at least what the census reported.
    pub(crate) fn non_voter_accepts_start_view(&self, view: u32, incarnation: u128) -> bool {
        self.census.is_none()
            && incarnation == self.incarnation
            && view >= self.view_min
            && (view > self.view || self.status != Status::Normal)
    }

    /// A non-voter learned of a newer view (a StartViewChange or DoViewChange): it does
    /// not vote in it, it asks for that view's StartView once it starts.
    pub(crate) fn non_voter_heard_view(&mut self, view: u32) {
        if view > self.view && self.census.is_none() && self.status == Status::Normal {
            self.probe_as_non_voter();
        }
    }

    /// Answers a RequestPrepares as a non-voter: it serves the prepares its journal holds
    /// (a receiver takes each only by its identity: serving is no vote), then says it
    /// vouches for nothing (RangeEvicted op 0), so no census counts it. A replica that
    /// lost only its superblock may hold the one intact copy of a committed op.
    pub(crate) fn answer_as_non_voter(&mut self, header: &RequestPreparesHeader) {
        let to = header.frame.replica;
        if to == self.config.replica || to >= self.config.replica_count {
            return;
        }
        if header.from_op >= 1 && header.from_op <= header.to_op {
            let to_op = header
                .to_op
                .min(header.from_op + self.config.repair_chunk_max - 1);
            for op in header.from_op..=to_op {
                if let Some(frame) = self.log.held_frame(op) {
                    let frame = Frame::repair_of(frame.as_bytes());
                    self.counters.repairs_served += 1;
                    self.actions.push_back(Action::Send { to, frame });
                }
            }
        }
        let mut result = RepairResultHeader::new();
        result.frame.cluster = self.config.cluster;
        result.frame.command = crate::wire::Command::RangeEvicted as u8;
        result.frame.view = self.view;
        result.frame.replica = self.config.replica;
        result.nonce = header.nonce;
        result.op = 0;
        result.group = self.config.group;
        let frame = Frame::build(&result, &[]);
        self.actions.push_back(Action::Send { to, frame });
    }

    /// A non-voter in a view becomes a voter once it applied every op up to the first
    /// StartView's op that the log still holds (ops truncated since were never
    /// committed). Applied, not only held: a driver that creates state from committed ops
    /// (the metadata plane creating partition groups) then knows that whatever it creates
    /// afterwards is newer than anything the lost state held. And durable in its journal:
    /// the replacement stands in for the acknowledgements its lost state gave, and a
    /// voter that restarts without one of them would nack it in a view change, letting a
    /// quorum that never saw a committed op truncate it.
    pub(crate) fn try_become_voter(&mut self) {
        if self.voter || self.status != Status::Normal {
            return;
        }
        let Some((op, commit)) = self.recover else {
            return;
        };
        let target = commit.max(op.min(self.log.op));
        if self.commit < target {
            return;
        }
        if (self.log.op_min()..=target).any(|o| !self.log.slot(o).is_some_and(|s| s.durable)) {
            return;
        }
        self.voter = true;
        self.voter_since = self.commit;
        self.recover = None;
        self.superblock.replacement = false;
        // Durable before the first vote: a restart now recovers as a voter.
        self.persist_superblock();
        for o in self.commit + 1..=self.log.op {
            self.send_prepare_ok(o);
        }
    }
}
