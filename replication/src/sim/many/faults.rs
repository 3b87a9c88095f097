//! Faults of the many-group simulator, which hit whole nodes: crashes and restarts (lost
//! disks included), partitions, corrupted journal entries and slow stretches.

use super::{node_counts, ManyCluster};
use crate::sim::faults::cut_links;
use crate::sim::network::Packet;
use crate::sim::storage::Storage;
use crate::vsr::Replica;

impl ManyCluster {
    pub(super) fn inject_faults(&mut self) {
        let n = self.options.replica_count;
        let f = (n - 1) / 2;
        let faults = self.options.faults;
        if self.prng.chance(faults.crash_per_10k, 10_000) {
            let down = self.nodes.iter().filter(|x| x.is_none()).count() as u8;
            let r = self.prng.below(u64::from(n)) as u8;
            if down < f && self.nodes[usize::from(r)].is_some() {
                self.crash(r);
                let delay = 1 + self.prng.below(faults.restart_delay_max);
                self.restart_at[usize::from(r)] = self.now + delay;
            }
        }
        if self.partition_until != 0 && self.now >= self.partition_until {
            self.partition_until = 0;
            self.network.heal();
            self.log(|| "network healed".to_string());
            self.sync_links();
        }
        if self.partition_until == 0 && self.prng.chance(faults.partition_per_10k, 10_000) {
            // The node cut off (kinds 2 and 3) leads some groups and backs up others.
            let node = self.prng.below(u64::from(n)) as u8;
            let kind = cut_links(&mut self.network, &mut self.prng, n, Some(node));
            self.partition_until = self.now + 50 + self.prng.below(1500);
            self.log(|| format!("network partition kind {kind}"));
            self.sync_links();
        }
        if self.corrupt_prng.chance(faults.corrupt_per_10k, 10_000) {
            self.corrupt_one();
        }
        // Idle groups get a request now and then (and wake for it).
        for c in 0..self.clients.len() {
            if !self.clients[c].busy
                && self
                    .prng
                    .chance(self.options.idle_request_per_100k, 100_000)
            {
                self.clients[c].wanted += 1;
            }
        }
    }

    /// Tells each node's replicas which links changed since they were last told: a link
    /// is up when both directions pass and both nodes are up.
    pub(super) fn sync_links(&mut self) {
        let n = self.options.replica_count;
        for a in 0..n {
            for b in (0..n).filter(|b| *b != a) {
                let up = self.network.link(a, b)
                    && self.network.link(b, a)
                    && self.nodes[usize::from(b)].is_some();
                let (ai, bi) = (usize::from(a), usize::from(b));
                let Some(node) = self.nodes[ai].as_mut() else {
                    continue;
                };
                if self.links[ai][bi] != up {
                    self.links[ai][bi] = up;
                    node.set_connected(b, up);
                }
            }
        }
    }

    /// Node `r` crashes: every group's memory is gone, each journal loses its unsynced
    /// writes and may tear its last one.
    pub(super) fn crash(&mut self, r: u8) {
        let i = usize::from(r);
        if let Some(node) = self.nodes[i].take() {
            let (sleeps, silent_wakes, view_changes, slow_skips) = node_counts(&node);
            self.sleeps_retired += sleeps;
            self.silent_wakes_retired += silent_wakes;
            self.view_changes_retired += view_changes;
            self.slow_skips_retired += slow_skips;
        }
        // A slow node that crashes is slow no more; what waited for it is gone with it.
        if self.slow.slows(r) {
            let _ = self.slow_end();
        }
        for group in self.groups.clone() {
            let tail = self.storages[i][&group].tail();
            // As in the one-group simulator: while a replica of the group may not vote the
            // group has no fault to spare (a torn entry would be a prepare one voter may
            // hold and the other never had, which only the non-voter could settle), and
            // no torn entry at an op whose entry is unreadable on another replica.
            let every_replica_votes =
                (0..self.options.replica_count).all(|x| self.remembers(x, group));
            let tear = every_replica_votes
                && tail.is_none_or(|op| {
                    (0..self.options.replica_count)
                        .filter(|x| *x != r)
                        .all(|x| !self.storages[usize::from(x)][&group].faulty_at(op))
                });
            let storage = self.storages[i].get_mut(&group).expect("every group");
            storage.crash(&mut self.prng, tear);
        }
        self.links[i].iter_mut().for_each(|up| *up = false);
        self.crashes += 1;
        self.log(|| format!("r{r} crashed"));
        self.sync_links();
    }

    /// Whether replica `x` of `group` votes (up) or will when it restarts (down, state
    /// kept).
    pub(super) fn remembers(&self, x: u8, group: u64) -> bool {
        match &self.nodes[usize::from(x)] {
            Some(node) => node.get(group).is_some_and(Replica::is_voter),
            None => {
                let superblock = &self.storages[usize::from(x)][&group].superblock;
                !superblock.replacement && !superblock.unformed
            }
        }
    }

    /// Whether the restart of `r` may lose its disk: at the seed's rate, at most
    /// replica_count + 2 times a run, never once an entry was corrupted, and only while,
    /// in every group, every other replica votes (or will) and holds no torn entry (the
    /// one-group simulator's rule: a lost disk is the one fault the group survives).
    pub(super) fn wipe_allowed(&mut self, r: u8) -> bool {
        let cap = u64::from(self.options.replica_count) + 2;
        if self.options.wipe_percent == 0 || self.wipes >= cap || !self.corrupted.is_empty() {
            return false;
        }
        let others_remember = (0..self.options.replica_count)
            .filter(|x| *x != r)
            .all(|x| {
                self.groups.iter().all(|g| {
                    self.remembers(x, *g) && !self.storages[usize::from(x)][g].holds_faulty()
                })
            });
        others_remember && self.prng.chance(self.options.wipe_percent, 100)
    }

    /// Corrupts one journal entry of a random group on one node, at a committed op, as
    /// the one-group simulator does: never an op already corrupted elsewhere, only if
    /// another voter holds the committed prepare, and while a replica of the group may
    /// not vote, only the committed prepare itself.
    pub(super) fn corrupt_one(&mut self) {
        let n = self.options.replica_count;
        let group = self.groups[self.corrupt_prng.below(self.groups.len() as u64) as usize];
        let checker = &self.checkers[&group];
        let commit = checker.commit_max();
        if commit == 0 {
            return;
        }
        let op = 1 + self.corrupt_prng.below(commit);
        let r = self.corrupt_prng.below(u64::from(n)) as u8;
        let Some(identity) = checker.get(op).map(|c| c.identity) else {
            return;
        };
        if self
            .corrupted
            .get(&group)
            .is_some_and(|ops| ops.contains(&op))
        {
            return;
        }
        let holds = |x: u8| self.storages[usize::from(x)][&group].holds_identity(op, identity);
        let holders = (0..n)
            .filter(|x| *x != r && self.remembers(*x, group) && holds(*x))
            .count();
        if holders == 0 {
            return;
        }
        let every_replica_votes = (0..n).all(|x| self.remembers(x, group));
        if !every_replica_votes && !holds(r) {
            return;
        }
        let storage = self.storages[usize::from(r)]
            .get_mut(&group)
            .expect("every group");
        if storage.corrupt(op, &mut self.corrupt_prng) {
            self.corrupted.entry(group).or_default().insert(op);
            self.log(|| format!("r{r} group {group:x} journal op {op} corrupted"));
        }
    }

    /// Node `r` restarts every group from its journal and superblock, or, having lost
    /// its disk, every group formatted again or as a replacement.
    pub(super) fn restart(&mut self, r: u8) -> Result<(), String> {
        let i = usize::from(r);
        self.incarnations[i] += 1;
        let wipe = if self.faults_on && self.wipe_allowed(r) {
            self.wipes += 1;
            Some(self.prng.chance(1, 2))
        } else {
            None
        };
        let mut node = self.new_node(r);
        for group in self.groups.clone() {
            let mut config = self.configs[i][&group].clone();
            config.seed = config
                .seed
                .wrapping_add(self.incarnations[i].wrapping_mul(0x9e37));
            let replica = match wipe {
                Some(formatted) => {
                    self.storages[i].insert(group, Storage::new(true));
                    if formatted {
                        Replica::unformed(config)
                    } else {
                        Replica::replacement(config)
                    }
                }
                None => {
                    let storage = &self.storages[i][&group];
                    let journal = storage.read_journal();
                    Replica::restart(config, &storage.superblock, &journal)
                }
            };
            let from = replica.commit();
            node.insert(replica);
            self.checkers
                .get_mut(&group)
                .expect("every group")
                .restarted(r, from);
        }
        self.nodes[i] = Some(node);
        // What the old incarnation's connections carried is gone with them.
        self.network.drop_from(r);
        self.restart_at[i] = 0;
        self.links[i].iter_mut().for_each(|up| *up = false);
        // Its new replicas start out told every link is down.
        let node = self.nodes[i].as_mut().expect("just set");
        for peer in (0..self.options.replica_count).filter(|p| *p != r) {
            node.set_connected(peer, false);
        }
        self.log(|| match wipe {
            None => format!("r{r} restarted"),
            Some(true) => format!("r{r} lost its disk, restarted formatted again"),
            Some(false) => format!("r{r} lost its disk, restarted as a replacement"),
        });
        self.sync_links();
        self.drain(r)
    }

    /// Each tick: ends a slow stretch that is over (a paused node receives what waited
    /// for it, in order), and during the fault phase maybe starts one on a node that is up.
    pub(super) fn slow_tick(&mut self) -> Result<(), String> {
        if self.slow.over(self.now) {
            for packet in self.slow_end() {
                self.deliver(packet)?;
            }
        }
        let (n, rate) = (self.options.replica_count, self.options.slow_per_10k);
        let Some(stretch) = self.slow.draw(self.faults_on, rate, n, self.now) else {
            return Ok(());
        };
        let r = stretch.replica;
        if self.nodes[usize::from(r)].is_none() {
            return Ok(());
        }
        self.slow.begin(stretch, &mut self.network);
        self.log(|| format!("r{r} slow ({:?}) until {}", stretch.kind, stretch.until));
        Ok(())
    }

    /// Ends the slow stretch; returns the packets that waited for a paused node.
    pub(super) fn slow_end(&mut self) -> Vec<Packet> {
        let Some((r, held)) = self.slow.end(&mut self.network) else {
            return Vec::new();
        };
        self.log(|| format!("r{r} no longer slow"));
        held
    }

    pub(super) fn paused(&self, r: u8) -> bool {
        self.slow.pauses(r)
    }
}
