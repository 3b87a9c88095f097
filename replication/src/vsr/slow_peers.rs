//! The primary's record of which backups keep up: per backup its acknowledgements and
//! skips, the recent commit latency the lag bound follows, and the recent commits a
//! skipped backup is measured against. `slow.rs` decides from it whom the chain skips.

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
pub(super) struct Peer {
    /// The tick it was skipped at (while skipped).
    pub(super) since: u64,
    /// The tick since which it keeps up while skipped (0: it does not).
    pub(super) keeping_up_since: u64,
    /// Times it was skipped soon after a readmission (readmission backs off).
    pub(super) strikes: u32,
    /// The tick it was last readmitted (0: never in this life).
    pub(super) readmitted_at: u64,
    /// The highest op it acknowledged in this view.
    pub(super) op_acked: u64,
    /// Times it was skipped in this life.
    pub(super) skips: u64,
}

/// The primary's view of which backups keep up (reset on every entry to Normal).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlowPeers {
    /// Backups skipped by the chain (bitmask).
    pub(crate) skipped: u32,
    /// Per replica id (sized on first use).
    pub(super) peers: Vec<Peer>,
    /// The tick the routing last changed: a backup's wait counts from it at the earliest.
    pub(super) rerouted_at: u64,
    /// Recent prepare-to-commit latency in ticks, times 16 (an exponential average).
    pub(super) commit_latency_x16: u64,
    /// While a backup is skipped: (op, tick first sent) of the latest committed ops, in
    /// op order, at most RECENT_OPS_MAX (empty, unallocated, otherwise).
    pub(super) recent: std::collections::VecDeque<(u64, u64)>,
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

    pub(super) fn peer(&mut self, peer: u8) -> &mut Peer {
        let i = usize::from(peer);
        if self.peers.len() <= i {
            self.peers.resize(i + 1, Peer::default());
        }
        &mut self.peers[i]
    }

    pub(super) fn get(&self, peer: u8) -> Peer {
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
    pub(super) fn committed_prepared_at(&self, op: u64) -> Option<u64> {
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
