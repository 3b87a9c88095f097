//! A slow stretch of one simulated replica: which replica, paused or laggy, until when;
//! drawn from the seed during the fault phase. `SlowNodes` is what both simulators keep
//! of it: the stretch under way, the packets that wait for a paused node, the stream
//! that draws stretches and their count (`sim/slow.rs` and `sim/many/faults.rs` drive it).

use super::network::{Network, Node, Packet};
use crate::vsr::Prng;

/// The slow stretch of a simulated cluster (at most one at a time) and what waits for it.
#[derive(Debug)]
pub struct SlowNodes {
    stretch: Option<SlowStretch>,
    held: Vec<Packet>,
    prng: Prng,
    /// Stretches started.
    pub started: u64,
}

impl SlowNodes {
    pub fn new(prng: Prng) -> SlowNodes {
        SlowNodes {
            stretch: None,
            held: Vec::new(),
            prng,
            started: 0,
        }
    }

    /// The stretch under way.
    pub fn stretch(&self) -> Option<SlowStretch> {
        self.stretch
    }

    /// Whether a stretch is under way on replica `r`.
    pub fn slows(&self, r: u8) -> bool {
        self.stretch.is_some_and(|s| s.replica == r)
    }

    /// Whether the stretch under way is over at `now`.
    pub fn over(&self, now: u64) -> bool {
        self.stretch.is_some_and(|s| now >= s.until)
    }

    /// The stretch that starts at `now`, if one does: only while `faults_on` and none is
    /// under way, by the chance `per_10k` out of 10,000 a tick.
    pub fn draw(
        &mut self,
        faults_on: bool,
        per_10k: u64,
        replica_count: u8,
        now: u64,
    ) -> Option<SlowStretch> {
        let idle = faults_on && self.stretch.is_none();
        SlowStretch::maybe_start(&mut self.prng, idle, per_10k, replica_count, now)
    }

    /// Starts `stretch` (a laggy replica's packets take its extra ticks).
    pub fn begin(&mut self, stretch: SlowStretch, network: &mut Network) {
        if let Slowness::Laggy { extra_ticks } = stretch.kind {
            network.extra_latency[usize::from(stretch.replica)] = extra_ticks;
        }
        self.stretch = Some(stretch);
        self.started += 1;
    }

    /// Ends the stretch under way: its replica and the packets that waited for it, in
    /// order.
    pub fn end(&mut self, network: &mut Network) -> Option<(u8, Vec<Packet>)> {
        let stretch = self.stretch.take()?;
        network.extra_latency[usize::from(stretch.replica)] = 0;
        Some((stretch.replica, std::mem::take(&mut self.held)))
    }

    /// Whether replica `r` is paused now.
    pub fn pauses(&self, r: u8) -> bool {
        SlowStretch::pauses(self.stretch, r)
    }

    /// Extra ticks of a journal write on `r`.
    pub fn write_lag(&self, r: u8) -> u64 {
        SlowStretch::write_lag(self.stretch, r)
    }

    /// A packet for a paused replica waits for the end of the stretch; true if held.
    pub fn hold(&mut self, packet: &Packet) -> bool {
        match packet.to {
            Node::Replica(r) if self.pauses(r) => {
                self.held.push(packet.clone());
                true
            }
            _ => false,
        }
    }

    /// Drops the held packets `drop` picks (what a restarted replica's old connections
    /// carried).
    pub fn drop_held(&mut self, drop: impl Fn(&Packet) -> bool) {
        self.held.retain(|packet| !drop(packet));
    }
}

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
    fn maybe_start(
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
    fn pauses(slow: Option<SlowStretch>, r: u8) -> bool {
        slow.is_some_and(|s| s.replica == r && s.kind == Slowness::Paused)
    }

    /// Extra ticks `slow` adds to a journal write on replica `r`.
    fn write_lag(slow: Option<SlowStretch>, r: u8) -> u64 {
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
