//! Gray failures: a primary routes the chain around a backup that is connected but not
//! keeping up (docs/protocol.md, "Replication": the chain skips disconnected peers; a
//! slow one is skipped the same way).
//!
//! A chain waits on its slowest link: with 0 -> 1 -> 2, a paused node 1 holds every
//! prepare away from node 2 although nodes 0 and 2 are a quorum. The primary watches,
//! per backup, how long the oldest pipeline op it has not acknowledged has waited. The
//! first backup in chain order whose wait passes the bound (`lag_bound_ticks`: a
//! multiple of the recent commit latency, at least `slow_lag_min_ticks`) is skipped: the
//! primary sends each prepare to the first fast backup after it as well, so the prepares
//! reach the rest of the quorum without passing through it. Later backups lag only
//! because of the first, so one is skipped per tick, and at most f at once (more could
//! not leave a quorum of fast replicas anyway); and only when the backup that takes its
//! place has acknowledged as far (else that one is the laggard, and the first is only
//! busy with it: a tail catching up after a stall keeps its predecessor serving repairs).
//!
//! A skipped backup still receives every prepare: from its chain predecessor when that
//! is a backup, else straight from the primary, after the chain's own sends, as a
//! RepairPrepare (journaled and acknowledged, never forwarded: the backup after it has
//! the prepare from the primary already). Its acks
//! still count toward the quorum; skipping changes routing only, never what commits, so
//! it cannot affect safety. It is readmitted once it has kept up (every op first sent
//! more than the bound ago acknowledged, committed ones included) for
//! `slow_readmit_ticks`, doubled for each time it was
//! skipped again soon after a readmission: a backup that stalls every second stays out,
//! one merely slower than the others never reaches the bound.

use super::replica::Replica;
use super::slow_peers::{LAG_LATENCY_FACTOR, READMIT_DOUBLINGS_MAX, STRIKES_FORGIVEN_AFTER};

impl Replica {
    /// Backups the chain skips as slow (bitmask; primary only, else 0).
    pub fn slow_peers(&self) -> u32 {
        self.slow.skipped
    }

    /// The tick `peer` was skipped as slow at, while it is.
    pub fn slow_since(&self, peer: u8) -> Option<u64> {
        self.slow.since(peer)
    }

    /// Backups skipped as slow and readmitted in this life.
    pub fn slow_counts(&self) -> (u64, u64) {
        (self.slow.skips, self.slow.readmissions)
    }

    /// Times `peer` was skipped as slow in this life.
    pub fn slow_skips_of(&self, peer: u8) -> u64 {
        self.slow.get(peer).skips
    }

    /// Whether skipped `peer` keeps up: it acknowledged every op first sent more than
    /// `bound` ticks ago (as far as its highest acknowledgement tells).
    fn keeps_up(&self, peer: u8, bound: u64) -> bool {
        let next = self.slow.get(peer).op_acked + 1;
        if next > self.log.op {
            return true;
        }
        let sent_at = match self.pipeline.get(&next) {
            Some(pending) if pending.prepared_at == super::replica::NOT_SENT => return true,
            Some(pending) => Some(pending.prepared_at),
            None => self.slow.committed_prepared_at(next),
        };
        sent_at.is_some_and(|at| self.now.saturating_sub(at) <= bound)
    }

    /// How long a backup may lag before it is skipped, in ticks.
    pub(crate) fn lag_bound_ticks(&self) -> u64 {
        let recent = (self.slow.commit_latency_x16 / 16) * LAG_LATENCY_FACTOR;
        recent.max(self.config.slow_lag_min_ticks)
    }

    /// Ticks `peer` has waited for the oldest pipeline op it has not acknowledged,
    /// counted from `floor` at the earliest (0 when it acknowledged every op).
    fn lag_ticks(&self, peer: u8, floor: u64) -> u64 {
        self.pipeline
            .values()
            .find(|pending| pending.acks & (1 << peer) == 0)
            .map_or(0, |pending| {
                self.now.saturating_sub(pending.prepared_at.max(floor))
            })
    }

    /// The next backup after `from` that is connected and not skipped; None once the
    /// chain would return to the primary.
    pub(crate) fn chain_next_fast(&self, from: u8) -> Option<u8> {
        let n = self.config.replica_count;
        let primary = self.config.primary_of(self.view);
        let mut next = (from + 1) % n;
        while next != primary {
            let bit = 1u32 << next;
            if next != self.config.replica
                && self.connected & bit != 0
                && self.slow.skipped & bit == 0
            {
                return Some(next);
            }
            next = (next + 1) % n;
        }
        None
    }

    /// Where the primary sends a new prepare, in order: the head of the chain, the first
    /// fast backup after each skipped one, then each skipped backup that no backup
    /// forwards to (its predecessor is the primary or skipped too).
    pub(crate) fn prepare_targets(&self) -> Vec<u8> {
        let primary = self.config.replica;
        let mut targets = Vec::new();
        let push = |targets: &mut Vec<u8>, to: Option<u8>| {
            if let Some(to) = to {
                if !targets.contains(&to) {
                    targets.push(to);
                }
            }
        };
        push(&mut targets, self.chain_next_fast(primary));
        if self.slow.skipped == 0 {
            return targets;
        }
        let n = self.config.replica_count;
        let skipped: Vec<u8> = (0..n)
            .filter(|p| self.slow.skipped & (1 << p) != 0)
            .collect();
        for &peer in &skipped {
            push(&mut targets, self.chain_next_fast(peer));
        }
        for &peer in &skipped {
            if self.connected & (1 << peer) == 0 {
                continue;
            }
            // The replica that forwards to `peer` along the chain (connected ones only).
            let mut before = (peer + n - 1) % n;
            while before != primary && self.connected & (1 << before) == 0 {
                before = (before + n - 1) % n;
            }
            if before == primary || self.slow.skipped & (1 << before) != 0 {
                push(&mut targets, Some(peer));
            }
        }
        targets
    }

    /// Primary, each tick: skips the first backup (in chain order) that lags past the
    /// bound, readmits skipped backups that kept up long enough.
    pub(crate) fn on_slow_tick(&mut self) {
        if !self.voter || !self.is_primary() || self.status != super::Status::Normal {
            return;
        }
        let bound = self.lag_bound_ticks();
        self.readmit_slow_peers(bound);
        let f = self.config.replica_count as usize - self.config.quorum_replication();
        if self.slow.skipped.count_ones() as usize >= f {
            return;
        }
        let mut peer = self.config.replica;
        while let Some(next) = self.chain_next_fast(peer) {
            if self.lag_ticks(next, self.slow.rerouted_at) > bound {
                // Only if the backup that takes its place is not further behind: when
                // the one after it is the real laggard (a tail catching up after a stall
                // keeps its predecessor busy serving repairs), going around the first
                // would route every prepare to the slower one, and twice.
                let keeps_pace = self.chain_next_fast(next).is_some_and(|after| {
                    self.slow.get(after).op_acked >= self.slow.get(next).op_acked
                });
                if keeps_pace {
                    self.skip_slow_peer(next);
                }
                return;
            }
            peer = next;
        }
    }

    fn skip_slow_peer(&mut self, peer: u8) {
        let now = self.now;
        let forgiven = STRIKES_FORGIVEN_AFTER * self.config.slow_readmit_ticks;
        let state = self.slow.peer(peer);
        if state.readmitted_at != 0 && now - state.readmitted_at > forgiven {
            state.strikes = 0;
        }
        state.strikes = (state.strikes + 1).min(READMIT_DOUBLINGS_MAX + 1);
        state.since = now;
        state.keeping_up_since = 0;
        state.skips += 1;
        self.slow.skipped |= 1 << peer;
        self.slow.rerouted_at = now;
        self.slow.skips += 1;
        self.resend_pipeline_around(peer);
    }

    /// After a backup is skipped, the pipeline's ops go at once to the replicas that now
    /// get prepares from the primary and have not acknowledged them.
    fn resend_pipeline_around(&mut self, skipped: u8) {
        let Some(to) = self.chain_next_fast(skipped) else {
            return;
        };
        let unacked: Vec<u64> = self
            .pipeline
            .iter()
            .filter(|(_, pending)| pending.acks & (1 << to) == 0)
            .map(|(op, _)| *op)
            .collect();
        for op in unacked {
            if let Some(frame) = self.prepare_in_view(op) {
                self.actions.push_back(super::Action::Send { to, frame });
            }
        }
    }

    fn readmit_slow_peers(&mut self, bound: u64) {
        let n = self.config.replica_count;
        let skipped = self.slow.skipped;
        for peer in (0..n).filter(|p| skipped & (1 << p) != 0) {
            let keeps_up = self.keeps_up(peer, bound);
            let (now, readmit) = (self.now, self.config.slow_readmit_ticks);
            let state = self.slow.peer(peer);
            if !keeps_up {
                state.keeping_up_since = 0;
                continue;
            }
            if state.keeping_up_since == 0 {
                state.keeping_up_since = now;
                continue;
            }
            let doublings = state.strikes.saturating_sub(1).min(READMIT_DOUBLINGS_MAX);
            if now - state.keeping_up_since >= readmit << doublings {
                state.readmitted_at = now;
                state.keeping_up_since = 0;
                self.slow.skipped &= !(1 << peer);
                self.slow.rerouted_at = now;
                self.slow.readmissions += 1;
            }
        }
        if self.slow.skipped == 0 && self.slow.recent.capacity() > 0 {
            self.slow.recent = std::collections::VecDeque::new();
        }
    }
}
