//! The simulated network: per-packet loss, duplication, latency spread (which reorders),
//! and directional links for symmetric and asymmetric partitions.

use std::collections::BTreeMap;

use crate::vsr::Prng;
use crate::wire::FrameBuf;

/// An endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Node {
    Replica(u8),
    Client(u16),
}

/// A frame in flight.
#[derive(Clone, Debug)]
pub struct Packet {
    pub from: Node,
    pub to: Node,
    pub bytes: FrameBuf,
}

impl Packet {
    /// Whether it goes from replica `r` to another replica (over `r`'s connections).
    pub fn from_replica_to_replica(&self, r: u8) -> bool {
        self.from == Node::Replica(r) && matches!(self.to, Node::Replica(_))
    }
}

/// Fault rates of the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetworkFaults {
    /// Packets dropped, in percent (0..=30 in the sweeps).
    pub loss_percent: u64,
    /// Packets delivered twice, in percent.
    pub duplicate_percent: u64,
    pub latency_min_ticks: u64,
    pub latency_max_ticks: u64,
}

impl NetworkFaults {
    /// No faults, short latency.
    pub fn none() -> NetworkFaults {
        NetworkFaults {
            loss_percent: 0,
            duplicate_percent: 0,
            latency_min_ticks: 1,
            latency_max_ticks: 3,
        }
    }
}

/// Packets in flight ordered by delivery tick.
#[derive(Debug)]
pub struct Network {
    pub faults: NetworkFaults,
    replica_count: u8,
    /// links[from][to]: whether replica `from` can reach replica `to`.
    links: Vec<Vec<bool>>,
    queue: BTreeMap<(u64, u64), Packet>,
    sequence: u64,
    pub sent: u64,
    pub dropped: u64,
    /// Extra ticks on every packet from or to each replica (a slow node, `sim/slow.rs`).
    pub extra_latency: Vec<u64>,
}

impl Network {
    pub fn new(replica_count: u8, faults: NetworkFaults) -> Network {
        let n = usize::from(replica_count);
        Network {
            faults,
            replica_count,
            links: vec![vec![true; n]; n],
            queue: BTreeMap::new(),
            sequence: 0,
            sent: 0,
            dropped: 0,
            extra_latency: vec![0; n],
        }
    }

    /// Whether replica `from` can currently reach replica `to`.
    pub fn link(&self, from: u8, to: u8) -> bool {
        self.links[usize::from(from)][usize::from(to)]
    }

    /// Heals every link.
    pub fn heal(&mut self) {
        for row in &mut self.links {
            row.fill(true);
        }
    }

    /// Cuts `from -> to` (one direction).
    pub fn cut(&mut self, from: u8, to: u8) {
        self.links[usize::from(from)][usize::from(to)] = false;
    }

    /// Splits the replicas into two sides that cannot talk to each other.
    pub fn partition_symmetric(&mut self, side_a: u32) {
        self.heal();
        for a in 0..self.replica_count {
            for b in 0..self.replica_count {
                if (side_a >> a) & 1 != (side_a >> b) & 1 {
                    self.cut(a, b);
                }
            }
        }
    }

    /// Queues a packet, applying loss, duplication and latency.
    pub fn send(&mut self, now: u64, packet: Packet, prng: &mut Prng) {
        self.sent += 1;
        if let (Node::Replica(a), Node::Replica(b)) = (packet.from, packet.to) {
            if !self.link(a, b) {
                self.dropped += 1;
                return;
            }
        }
        if prng.chance(self.faults.loss_percent, 100) {
            self.dropped += 1;
            return;
        }
        let copies = if prng.chance(self.faults.duplicate_percent, 100) {
            2
        } else {
            1
        };
        let extra = [packet.from, packet.to]
            .iter()
            .map(|node| match node {
                Node::Replica(r) => self.extra_latency[usize::from(*r)],
                Node::Client(_) => 0,
            })
            .sum::<u64>();
        for _ in 0..copies {
            let spread = self.faults.latency_max_ticks - self.faults.latency_min_ticks;
            let at = now + extra + self.faults.latency_min_ticks + prng.below(spread + 1);
            self.sequence += 1;
            self.queue.insert((at, self.sequence), packet.clone());
        }
    }

    /// Queues `bytes` from replica `from` to `to` (`send`).
    pub fn send_between(&mut self, now: u64, from: u8, to: Node, bytes: FrameBuf, prng: &mut Prng) {
        let packet = Packet {
            from: Node::Replica(from),
            to,
            bytes,
        };
        self.send(now, packet, prng);
    }

    /// Queues a copy of `bytes` from replica `from` to each other of `n` replicas.
    pub fn broadcast(&mut self, now: u64, from: u8, n: u8, bytes: &[u8], prng: &mut Prng) {
        for to in (0..n).filter(|to| *to != from) {
            self.send_between(
                now,
                from,
                Node::Replica(to),
                FrameBuf::from_bytes(bytes),
                prng,
            );
        }
    }

    /// Packets due at `now`, in delivery order.
    pub fn deliver(&mut self, now: u64) -> Vec<Packet> {
        let later = self.queue.split_off(&(now + 1, 0));
        let due = std::mem::replace(&mut self.queue, later);
        due.into_values().collect()
    }

    /// Drops every packet in flight from replica `r` to the other replicas: its
    /// connections of before a restart are gone, and nothing sent on them arrives once
    /// the restarted replica is connected again.
    pub fn drop_from(&mut self, r: u8) {
        let before = self.queue.len();
        self.queue
            .retain(|_, packet| !packet.from_replica_to_replica(r));
        self.dropped += (before - self.queue.len()) as u64;
    }

    /// Packets in flight.
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }
}
