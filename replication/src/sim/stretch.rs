//! A slow stretch of one simulated replica: which replica, paused or laggy, until when;
//! drawn from the seed during the fault phase (`sim/slow.rs` applies it to a cluster).

use crate::vsr::Prng;

/// How a slow replica is slow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slowness {
    /// Stopped: no ticks, no deliveries, no disk completions until the stretch ends.
    Paused,
    /// Running, with this many extra ticks on each packet from or to it and each write.
    Laggy { extra_ticks: u64 },
}

/// A slow stretch of one replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowStretch {
    pub replica: u8,
    pub kind: Slowness,
    /// The tick the stretch ends at.
    pub until: u64,
}

impl SlowStretch {
    /// The stretch that starts at `now`, if one does: only while `idle` (faults on and no
    /// stretch under way), by the chance `per_10k` out of 10,000 a tick.
    pub(super) fn maybe_start(
        prng: &mut Prng,
        idle: bool,
        per_10k: u64,
        replica_count: u8,
        now: u64,
    ) -> Option<SlowStretch> {
        if !idle || per_10k == 0 || !prng.chance(per_10k, 10_000) {
            return None;
        }
        Some(SlowStretch::draw(prng, replica_count, now))
    }

    /// A random stretch of one of `replica_count` replicas, starting at `now`.
    fn draw(prng: &mut Prng, replica_count: u8, now: u64) -> SlowStretch {
        let replica = prng.below(u64::from(replica_count)) as u8;
        let kind = if prng.chance(1, 2) {
            Slowness::Paused
        } else {
            Slowness::Laggy {
                extra_ticks: 1 + prng.below(LAG_EXTRA_TICKS_MAX),
            }
        };
        let until = now + STRETCH_TICKS_MIN + prng.below(STRETCH_TICKS_SPREAD);
        SlowStretch {
            replica,
            kind,
            until,
        }
    }

    /// Whether `slow` pauses replica `r`.
    pub(super) fn pauses(slow: Option<SlowStretch>, r: u8) -> bool {
        slow.is_some_and(|s| s.replica == r && s.kind == Slowness::Paused)
    }

    /// Extra ticks `slow` adds to a journal write on replica `r`.
    pub(super) fn write_lag(slow: Option<SlowStretch>, r: u8) -> u64 {
        match slow {
            Some(SlowStretch {
                replica,
                kind: Slowness::Laggy { extra_ticks },
                ..
            }) if replica == r => extra_ticks,
            _ => 0,
        }
    }
}

/// Ticks a random slow stretch lasts at least, and at most on top.
pub const STRETCH_TICKS_MIN: u64 = 50;
pub const STRETCH_TICKS_SPREAD: u64 = 1_500;
/// Extra ticks of a laggy replica at most.
pub const LAG_EXTRA_TICKS_MAX: u64 = 40;
