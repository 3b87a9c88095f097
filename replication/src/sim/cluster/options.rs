//! What a simulated run is made of: its options and the fault mix, drawn from the seed.

use super::TRACE_LINES_MAX;
use crate::sim::network::NetworkFaults;
use crate::vsr::Prng;
use crate::wire::METADATA_GROUP;

/// What a run is made of.
#[derive(Clone, Debug)]
pub struct SimOptions {
    pub seed: u64,
    pub replica_count: u8,
    /// Ticks of the fault phase.
    pub ticks: u64,
    /// Bound on the liveness phase (faults stopped, healthy quorum).
    pub liveness_ticks: u64,
    pub clients: u16,
    pub group: u64,
    pub faults: Faults,
    /// Keep a trace of events (slower; used to replay a failing seed).
    pub trace: bool,
    /// Lines of trace kept (the last ones).
    pub trace_lines: usize,
    /// Restarted replicas resume from a checkpoint (the highest commit a chained local
    /// prepare carries, as the appliance's partition groups do) instead of replaying
    /// their journal from op 1.
    pub checkpoint_restarts: bool,
    /// Restarts that lose the replica's disk, out of 100 (0 = none).
    pub wipe_percent: u64,
    /// The cluster starts from formatted replicas that form it (`Replica::unformed`).
    pub formation: bool,
    /// Chance per tick, out of 10_000, that a slow stretch starts on a replica while
    /// none is slow (`sim/slow.rs`; 0 = none).
    pub slow_per_10k: u64,
    /// Keep each client request's latency (ticks from first send to reply).
    pub latency_samples: bool,
    /// Multiplies the replicas' timeouts (heartbeat, retransmits, view change, repair,
    /// the slow-backup bounds), so the network's latency is small beside them as on
    /// real links (1 = the defaults of `Config::new`).
    pub time_scale: u64,
    /// Quiescent replicas sleep (are not ticked) until a frame, request or completion
    /// arrives or their primary's node goes silent (`vsr/hibernate.rs`); every node sends
    /// a liveness packet to each peer per commit broadcast interval, standing for the
    /// Commits of the groups it keeps awake.
    pub hibernate: bool,
    /// Chance per tick of the fault phase, out of 10_000, that the clients pause for a
    /// stretch (so the group goes idle and sleeps under faults; 0 = never).
    pub idle_per_10k: u64,
    /// The view the group starts in (`Config::initial_view`): its primary leads first.
    pub initial_view: u32,
    /// With `checkpoint_restarts`: at each checkpoint a replica also drops committed ops
    /// from memory (`Replica::on_checkpoint`, a few below its commit point or all of
    /// them) and at times the body of the commit point itself (`release_anchor`), as the
    /// appliance's repair windows do under their memory budget. Peers that lack the
    /// dropped ops are answered RangeEvicted and catch up by state transfer.
    pub evict: bool,
    /// A replica's superblock write completes up to this many ticks after it is issued
    /// (0: at once). Meanwhile the replica goes on handling frames and ticks while its
    /// later actions wait for the write, as the appliance's partition groups do; a crash
    /// loses the write and what waited for it.
    pub superblock_lag_max: u64,
    /// A journal append past the head (the ops below it not journaled yet) is deferred,
    /// neither written nor reported, as the appliance's journals do; the core asks for
    /// it again (`sim/storage.rs`).
    pub defer_gaps: bool,
}

/// How a restart lost a replica's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wipe {
    /// The disk is new and the replica formatted itself (it must find out that its
    /// group formed).
    Formatted,
    /// The disk is new and the operator said it replaces a member (`appliance recover`).
    Replacement,
    /// Every superblock copy is unreadable; the journal and checkpoint are intact.
    SuperblockLost,
}

/// Wipes per run at most, on top of `replica_count`.
pub const WIPES_OVER_REPLICAS_MAX: u64 = 2;

/// The fault mix of a run (rates per tick are out of 10_000).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Faults {
    pub network: NetworkFaults,
    pub crash_per_10k: u64,
    pub partition_per_10k: u64,
    pub corrupt_per_10k: u64,
    pub restart_delay_max: u64,
}

impl Faults {
    /// A fault mix drawn from the seed: loss 0-30%, duplication, latency spread,
    /// partitions, crashes and corruption in varying proportions.
    pub fn from_seed(prng: &mut Prng) -> Faults {
        let latency_min_ticks = 1 + prng.below(3);
        Faults {
            network: NetworkFaults {
                loss_percent: prng.below(31),
                duplicate_percent: prng.below(10),
                latency_min_ticks,
                latency_max_ticks: latency_min_ticks + prng.below(20),
            },
            crash_per_10k: prng.below(30),
            partition_per_10k: prng.below(30),
            corrupt_per_10k: prng.below(40),
            restart_delay_max: 50 + prng.below(800),
        }
    }

    /// No faults at all.
    pub fn none() -> Faults {
        Faults {
            network: NetworkFaults::none(),
            crash_per_10k: 0,
            partition_per_10k: 0,
            corrupt_per_10k: 0,
            restart_delay_max: 100,
        }
    }
}

impl SimOptions {
    /// Options for `seed` with the fault mix drawn from it.
    pub fn from_seed(seed: u64, replica_count: u8, ticks: u64) -> SimOptions {
        let mut prng = Prng::new(seed ^ 0xfa17);
        SimOptions {
            seed,
            replica_count,
            ticks,
            liveness_ticks: 20_000,
            clients: 1 + prng.below(4) as u16,
            group: METADATA_GROUP,
            faults: Faults::from_seed(&mut prng),
            trace: false,
            trace_lines: TRACE_LINES_MAX,
            checkpoint_restarts: prng.chance(1, 2),
            // Drawn from a stream of their own, so the other faults of a seed stay as
            // they were without wipes.
            wipe_percent: Prng::new(seed ^ 0x0031_71e5).below(31),
            formation: Prng::new(seed ^ 0xf04d).chance(1, 4),
            slow_per_10k: Prng::new(seed ^ 0x0051_0e55).below(12),
            latency_samples: false,
            time_scale: 1,
            hibernate: Prng::new(seed ^ 0x0051_ee95).chance(1, 2),
            idle_per_10k: 10,
            initial_view: Prng::new(seed ^ 0x0f1e_57ed).below(2 * u64::from(replica_count)) as u32,
            evict: Prng::new(seed ^ 0x0e71_c7ed).chance(1, 2),
            superblock_lag_max: {
                let mut lag = Prng::new(seed ^ 0x05b1_a900);
                if lag.chance(1, 2) {
                    1 + lag.below(40)
                } else {
                    0
                }
            },
            defer_gaps: true,
        }
    }
}
