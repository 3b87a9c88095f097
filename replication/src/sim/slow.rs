//! Slow nodes (gray failures): a replica that is up and connected but slow for a long
//! stretch, its messages and disk completions delayed, never lost. Two kinds: paused (a
//! stopped process: it neither ticks nor receives, its disk completes nothing, and what
//! was sent to it waits) and laggy (every packet from or to it and every journal write
//! takes extra ticks).

use super::cluster::Cluster;
use super::network::Packet;
pub use super::stretch::{SlowStretch, Slowness};

impl Cluster {
    /// Starts `kind` on replica `r` until tick `until` (a scenario or the fault phase).
    pub fn slow_down(&mut self, r: u8, kind: Slowness, until: u64) {
        self.slow_end();
        if self.replicas[usize::from(r)].is_none() {
            return;
        }
        let stretch = SlowStretch {
            replica: r,
            kind,
            until,
        };
        self.slow.begin(stretch, &mut self.network);
        self.log(|| format!("r{r} slow ({kind:?}) until {until}"));
    }

    /// Ends the slow stretch: a paused replica receives what waited for it, in order.
    pub fn slow_end(&mut self) -> Vec<Packet> {
        let Some((r, held)) = self.slow.end(&mut self.network) else {
            return Vec::new();
        };
        self.log(|| format!("r{r} no longer slow"));
        held
    }

    /// Each tick of the fault phase: ends a stretch that is over, maybe starts one.
    pub(super) fn slow_tick(&mut self) -> Result<(), String> {
        if self.slow.over(self.now) {
            for packet in self.slow_end() {
                self.deliver(packet)?;
            }
        }
        let (n, rate) = (self.options.replica_count, self.options.slow_per_10k);
        if let Some(stretch) = self.slow.draw(self.faults_on, rate, n, self.now) {
            self.slow_down(stretch.replica, stretch.kind, stretch.until);
        }
        Ok(())
    }

    /// Whether replica `r` is paused now.
    pub fn paused(&self, r: u8) -> bool {
        self.slow.pauses(r)
    }
}

/// A fault-free run in which one replica is slow on a schedule, with figures to compare
/// against the same run without it (`run_slow_node` with `slow: None`).
#[derive(Clone, Copy, Debug)]
pub struct SlowNodeRun {
    pub seed: u64,
    pub replica_count: u8,
    /// The slow replica, by its distance from the primary along the chain (1: the
    /// primary's successor; 0: the primary itself); None for the baseline.
    pub slow: Option<u8>,
    pub kind: Slowness,
    /// The replica is slow for `slow_ticks` out of every `period_ticks`.
    pub slow_ticks: u64,
    pub period_ticks: u64,
    /// Ticks measured (after a warm-up) and client count.
    pub ticks: u64,
    pub clients: u16,
    /// A partition-plane group instead of the metadata plane.
    pub group: u64,
}

/// What a [`SlowNodeRun`] measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlowNodeReport {
    /// Ops committed by the primary during the measured ticks.
    pub commits: u64,
    /// Client request latency in ticks, median and 99th percentile.
    pub p50: u64,
    pub p99: u64,
    /// Backups the primary skipped as slow and readmitted.
    pub skips: u64,
    pub readmissions: u64,
    /// Backups still skipped once the schedule ended and the cluster ran clean.
    pub skipped_at_end: u32,
    pub view_changes: u64,
    /// Prepares the replicas received for ops they held already, during the measured
    /// ticks: a backup skipped in the middle of the chain still forwards late what the
    /// replica after it has from the primary.
    pub prepares_received_again: u64,
}

/// Ticks before measuring, and after the schedule to see a skipped replica readmitted.
pub const SLOW_RUN_WARMUP_TICKS: u64 = 300;
pub const SLOW_RUN_COOLDOWN_TICKS: u64 = 6_000;
/// Timeouts of a slow-node run are this many times the defaults: a heartbeat timeout of
/// 300 ticks and a prepare retransmit of 100 against 1-3 ticks a hop, nearer the ratios
/// of real links (1 s and 200 ms against well under a millisecond).
pub const SLOW_RUN_TIME_SCALE: u64 = 5;

/// Runs `run`; Err if a checker failed.
pub fn run_slow_node(run: SlowNodeRun) -> Result<SlowNodeReport, String> {
    let mut cluster = Cluster::scripted_scaled(
        run.replica_count,
        run.seed,
        run.clients,
        run.group,
        SLOW_RUN_TIME_SCALE,
    );
    cluster.options.latency_samples = true;
    // Appends past the head are written, not deferred: this network delays each packet
    // on its own, so most prepares overtake one another on every link, which the
    // appliance's links (TCP) never do; a deferred append then catches up one write at a
    // time, and the runs would measure that instead of the chain's routing.
    cluster.options.defer_gaps = false;
    for storage in &mut cluster.storages {
        storage.defer_gaps = false;
    }
    cluster.run_ticks(SLOW_RUN_WARMUP_TICKS)?;
    let primary = cluster.primary().ok_or("no primary after the warm-up")?;
    let commit_start = cluster.replica(primary).map_or(0, |r| r.commit());
    cluster.latencies.clear();
    let received_again = |cluster: &Cluster| -> u64 {
        let replicas = cluster.replicas.iter().flatten();
        replicas.map(|r| r.counters().prepares_received_again).sum()
    };
    let received_again_start = received_again(&cluster);
    let n = run.replica_count;
    let start = cluster.now;
    while cluster.now - start < run.ticks {
        let at = cluster.now - start;
        if let Some(distance) = run.slow {
            if at.is_multiple_of(run.period_ticks) {
                let r = (primary + distance) % n;
                let until = cluster.now + run.slow_ticks;
                cluster.slow_down(r, run.kind, until);
            }
        }
        cluster.step()?;
    }
    let commits = cluster
        .replica(primary)
        .map_or(0, |r| r.commit())
        .saturating_sub(commit_start);
    let prepares_received_again = received_again(&cluster) - received_again_start;
    let mut latencies = std::mem::take(&mut cluster.latencies);
    latencies.sort_unstable();
    let at = |q: f64| -> u64 {
        if latencies.is_empty() {
            return 0;
        }
        let i = ((latencies.len() - 1) as f64 * q).round() as usize;
        latencies[i]
    };
    let (p50, p99) = (at(0.50), at(0.99));
    for packet in cluster.slow_end() {
        cluster.deliver(packet)?;
    }
    cluster.run_ticks(SLOW_RUN_COOLDOWN_TICKS)?;
    let (skips, readmissions, skipped_at_end) = cluster
        .replicas
        .iter()
        .flatten()
        .map(|r| (r.slow_counts().0, r.slow_counts().1, r.slow_peers()))
        .fold((0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 | b.2));
    Ok(SlowNodeReport {
        commits,
        p50,
        p99,
        skips,
        readmissions,
        skipped_at_end,
        view_changes: cluster.view_changes(),
        prepares_received_again,
    })
}
