//! Random fault injection of the fault phase: crashes (at most f at once), symmetric and
//! asymmetric partitions, isolation of the primary, and journal corruption bounded to
//! what the cluster can recover.

use super::cluster::Cluster;
use super::network::Network;
use crate::vsr::Prng;

/// Cuts links of a network of `n` nodes at random, one of four kinds: a symmetric split,
/// some directed links, `node` (the primary) able to send but not to receive, `node`
/// isolated (the last two nothing without a node). Returns the kind.
pub(super) fn cut_links(network: &mut Network, prng: &mut Prng, n: u8, node: Option<u8>) -> u64 {
    let kind = prng.below(4);
    match kind {
        0 => {
            let side = 1 + prng.below((1u64 << n) - 2) as u32;
            network.partition_symmetric(side);
        }
        1 => {
            for a in 0..n {
                for b in 0..n {
                    if a != b && prng.chance(1, 3) {
                        network.cut(a, b);
                    }
                }
            }
        }
        2 => {
            if let Some(p) = node {
                for b in (0..n).filter(|b| *b != p) {
                    network.cut(b, p);
                }
            }
        }
        _ => {
            if let Some(p) = node {
                network.partition_symmetric(1 << p);
            }
        }
    }
    kind
}

impl Cluster {
    pub(super) fn inject_faults(&mut self) -> Result<(), String> {
        let n = self.options.replica_count;
        let f = (n - 1) / 2;
        let faults = self.options.faults;
        if self.prng.chance(faults.crash_per_10k, 10_000) {
            let down = self.replicas.iter().filter(|r| r.is_none()).count() as u8;
            if down < f {
                let r = self.prng.below(u64::from(n)) as u8;
                if self.replicas[usize::from(r)].is_some() {
                    self.crash(r);
                }
            }
        }
        if self.partition_until != 0 && self.now >= self.partition_until {
            self.partition_until = 0;
            self.network.heal();
            self.log(|| "network healed".to_string());
            self.sync_links();
        }
        if self.partition_until == 0 && self.prng.chance(faults.partition_per_10k, 10_000) {
            let primary = self.primary_guess();
            let kind = cut_links(&mut self.network, &mut self.prng, n, primary);
            self.partition_until = self.now + 50 + self.prng.below(1500);
            self.log(|| format!("network partition kind {kind}"));
            self.sync_links();
        }
        if self.prng.chance(faults.corrupt_per_10k, 10_000) {
            self.corrupt_one();
        }
        Ok(())
    }

    /// Corrupts one journal entry on one replica at a committed op, never an op already
    /// corrupted elsewhere, and only if another replica holds the committed prepare (and,
    /// while a replica may not vote, only the committed prepare itself): never more than
    /// the cluster can recover.
    fn corrupt_one(&mut self) {
        let commit = self.checker.commit_max();
        if commit == 0 {
            return;
        }
        let op = 1 + self.prng.below(commit);
        if self.corrupted_ops.contains(&op) {
            return;
        }
        let n = self.options.replica_count;
        let r = self.prng.below(u64::from(n)) as u8;
        let Some(identity) = self.checker.get(op).map(|c| c.identity) else {
            return;
        };
        // Copies on a replica that may not vote do not count: it serves no repair. Nor
        // does another prepare at that op (one its primary never committed).
        let holders = (0..n)
            .filter(|x| {
                *x != r
                    && self.remembers(*x)
                    && self.storages[usize::from(*x)].holds_identity(op, identity)
            })
            .count();
        if holders == 0 {
            return;
        }
        // The entry on `r` may be another prepare at that op (a deposed primary's, never
        // committed) whose only copy it is. Like a torn write (`crash`), the cluster
        // survives losing it only while every replica votes: with a non-voter, it would
        // hold back the DVC of one of the only voters for good.
        if !self.every_replica_votes()
            && !self.storages[usize::from(r)].holds_identity(op, identity)
        {
            return;
        }
        if self.storages[usize::from(r)].corrupt(op, &mut self.prng) {
            self.corrupted_ops.insert(op);
            self.log(|| format!("r{r} journal op {op} corrupted"));
        }
    }
}
