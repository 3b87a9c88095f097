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

/// Multiple of the recent commit latency a backup may lag before it is skipped.
pub const LAG_LATENCY_FACTOR: u64 = 4;
/// Doublings of the readmission delay for a backup skipped again and again.
pub const READMIT_DOUBLINGS_MAX: u32 = 5;
/// A backup that kept up this many readmission delays is forgiven its earlier skips.
pub const STRIKES_FORGIVEN_AFTER: u64 = 16;
/// Committed ops whose prepare tick the primary keeps while a backup is skipped (to tell
/// whether the skipped backup acknowledged what was prepared more than the bound ago);
/// a backup further behind than this does not keep up.
pub const RECENT_OPS_MAX: usize = 256;

/// What the primary keeps of one backup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Peer {
    /// The tick it was skipped at (while skipped).
    since: u64,
    /// The tick since which it keeps up while skipped (0: it does not).
    keeping_up_since: u64,
    /// Times it was skipped soon after a readmission (readmission backs off).
    strikes: u32,
    /// The tick it was last readmitted (0: never in this life).
    readmitted_at: u64,
    /// The highest op it acknowledged in this view.
    op_acked: u64,
    /// Times it was skipped in this life.
    skips: u64,
}

/// The primary's view of which backups keep up (reset on every entry to Normal).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlowPeers {
    /// Backups skipped by the chain (bitmask).
    pub(crate) skipped: u32,
    /// Per replica id (sized on first use).
    peers: Vec<Peer>,
    /// The tick the routing last changed: a backup's wait counts from it at the earliest.
    rerouted_at: u64,
    /// Recent prepare-to-commit latency in ticks, times 16 (an exponential average).
    commit_latency_x16: u64,
    /// While a backup is skipped: (op, tick first sent) of the latest committed ops, in
    /// op order, at most RECENT_OPS_MAX (empty, unallocated, otherwise).
    recent: std::collections::VecDeque<(u64, u64)>,
    /// Backups skipped and readmitted in this life.
    pub(crate) skips: u64,
    pub(crate) readmissions: u64,
}

impl SlowPeers {
    /// A new view: every backup is in the chain again (strikes are kept).
    pub(crate) fn reset(&mut self, now: u64) {
        self.skipped = 0;
        self.recent = std::collections::VecDeque::new();
        for peer in &mut self.peers {
            peer.keeping_up_since = 0;
            peer.op_acked = 0;
        }
        self.rerouted_at = now;
    }

    fn peer(&mut self, peer: u8) -> &mut Peer {
        let i = usize::from(peer);
        if self.peers.len() <= i {
            self.peers.resize(i + 1, Peer::default());
        }
        &mut self.peers[i]
    }

    fn get(&self, peer: u8) -> Peer {
        self.peers
            .get(usize::from(peer))
            .copied()
            .unwrap_or_default()
    }

    /// Op `op`, first sent at `prepared_at`, committed at `now`.
    pub(crate) fn on_commit(&mut self, op: u64, prepared_at: u64, now: u64) {
        self.on_commit_latency(now - prepared_at);
        if self.skipped != 0 {
            if self.recent.len() == RECENT_OPS_MAX {
                self.recent.pop_front();
            }
            self.recent.push_back((op, prepared_at));
        }
    }

    /// The tick committed op `op` was first sent at, if it is recent enough to be known.
    fn committed_prepared_at(&self, op: u64) -> Option<u64> {
        let first = self.recent.front()?.0;
        let i = op.checked_sub(first)? as usize;
        self.recent
            .get(i)
            .filter(|(o, _)| *o == op)
            .map(|(_, at)| *at)
    }

    /// An op committed `latency` ticks after it was first prepared.
    fn on_commit_latency(&mut self, latency: u64) {
        let sample = latency.saturating_mul(16);
        // Down fast, up slowly: the bound follows the latency of a healthy chain, and a
        // stall (the very thing being detected) barely raises it. Integer arithmetic, so
        // a run replays exactly.
        let average = self.commit_latency_x16;
        self.commit_latency_x16 = if sample < average {
            average - (average - sample) / 4
        } else {
            average + (sample - average) / 32
        };
    }

    /// `peer` acknowledged `op` in this view.
    pub(crate) fn on_ack(&mut self, peer: u8, op: u64) {
        let acked = &mut self.peer(peer).op_acked;
        *acked = (*acked).max(op);
    }

    /// The tick `peer` was skipped at, while it is.
    pub fn since(&self, peer: u8) -> Option<u64> {
        (self.skipped & (1 << peer) != 0).then(|| self.get(peer).since)
    }
}

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
