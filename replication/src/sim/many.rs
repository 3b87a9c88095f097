//! A simulated cluster of many groups: every node hosts the metadata group and a number of
//! partition groups in one `vsr::Groups` (with idle groups sleeping, as the appliance runs
//! them), a few partition groups busy with clients and the rest idle but for a rare
//! request. Faults hit nodes, not groups: a crash takes every group of the node down at
//! once (each loses its unsynced journal writes, the last one may tear), a partition cuts
//! every group's links, and the network loses, duplicates and reorders frames of all of
//! them. A node may also be slow for a stretch (`sim/slow.rs`): paused (no ticks, no
//! deliveries, no disk completions, then all at once) or laggy (every frame from or to it
//! and every journal write late), and a journal entry of a committed op may be corrupted
//! on one node, within what the group can recover (as in the one-group simulator). Each
//! group's history is checked as in the one-group simulator (one committed history, no
//! acknowledged write lost, no request applied twice).
//!
//! After the faults stop and every group converged, the idle groups sleep; then the node
//! that leads most of them crashes, and every group it led must elect another primary
//! within the heartbeat timeout (plus the view change), asleep or not, and commit a
//! request sent to it. The node comes back and every group converges again.

use std::collections::{BTreeMap, BTreeSet};

use zerocopy::FromBytes;

use crate::vsr::{Action, Applied, Config, Groups, Prng, Replica, RequestOutcome, Status};
use crate::wire::{cluster_id, PartitionKey, PrepareHeader, METADATA_GROUP};

use super::checker::Checker;
use super::cluster::{
    applied_result, check_non_voter, describe, Failure, Faults, Trace, TRACE_LINES_MAX,
};
use super::network::{Network, NetworkFaults, Node, Packet};
use super::storage::Storage;
use super::stretch::SlowNodes;

mod clients;
mod faults;

use clients::Client;

/// What a many-group run is made of.
#[derive(Clone, Debug)]
pub struct ManyOptions {
    pub seed: u64,
    pub replica_count: u8,
    /// Partition groups on every node (besides the metadata group).
    pub partitions: u32,
    /// Of them, the ones with a client sending all the time.
    pub busy: u32,
    /// Chance per tick and idle group, out of 100_000, that its client sends a request.
    pub idle_request_per_100k: u64,
    /// Ticks of the fault phase.
    pub ticks: u64,
    /// Bound on each liveness phase (faults stopped; again after the failover check).
    pub liveness_ticks: u64,
    pub faults: Faults,
    /// Restarts of the fault phase that lose the node's disk, out of 100: every group
    /// comes back formatted again or as a replacement (`appliance recover`).
    pub wipe_percent: u64,
    /// Chance per tick, out of 10_000, that a slow stretch starts on a node while none
    /// is slow (0 = none).
    pub slow_per_10k: u64,
    pub trace: bool,
    pub trace_lines: usize,
}

impl ManyOptions {
    /// Options for `seed`, the fault mix drawn from it as in the one-group simulator.
    pub fn from_seed(seed: u64, replica_count: u8, ticks: u64) -> ManyOptions {
        let mut prng = Prng::new(seed ^ 0x0a4e_9109);
        let mut faults = Faults::from_seed(&mut prng);
        // A run stops losing disks once an entry is corrupted (`wipe_allowed`): half the
        // seeds corrupt nothing and keep their lost disks (a stream of its own again).
        if Prng::new(seed ^ 0x0c0e_ea72).chance(1, 2) {
            faults.corrupt_per_10k = 0;
        }
        ManyOptions {
            seed,
            replica_count,
            partitions: 24,
            busy: 1 + prng.below(3) as u32,
            idle_request_per_100k: 1 + prng.below(10),
            ticks,
            liveness_ticks: 20_000,
            faults,
            wipe_percent: prng.below(31),
            // Its own stream, so the rest of a seed's draws stay as they were.
            slow_per_10k: Prng::new(seed ^ 0x0051_0e57).below(12),
            trace: false,
            trace_lines: TRACE_LINES_MAX,
        }
    }

    /// The fault mix of seeds found before slow nodes and corruption joined the
    /// many-group simulator (`appliance-sim --groups N --no-slow`).
    pub fn without_slow_nodes_or_corruption(mut self) -> ManyOptions {
        self.slow_per_10k = 0;
        self.faults.corrupt_per_10k = 0;
        self
    }
}

/// Figures of a many-group run that passed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ManySummary {
    /// Ops committed, all groups together.
    pub commits: u64,
    pub replies: u64,
    pub crashes: u64,
    /// Restarts that lost the node's disk.
    pub wipes: u64,
    /// Times a group fell asleep, and woke because its primary's node was silent (all
    /// nodes, all incarnations).
    pub sleeps: u64,
    pub silent_wakes: u64,
    /// Groups the crashed node of the failover check led, how many of them slept when it
    /// crashed, and the ticks until the last of them was normal under another primary.
    pub failover_groups: u64,
    pub failover_asleep: u64,
    pub failover_ticks: u64,
    pub view_changes: u64,
    /// Slow stretches of nodes, and backups the primaries skipped as slow.
    pub slow_stretches: u64,
    pub slow_skips: u64,
    /// Journal entries corrupted.
    pub corruptions: u64,
}

const CLIENT_RETRY_TICKS: u64 = 150;
/// Ticks clients keep loading the healed cluster before they only finish what they sent.
const LOAD_TICKS: u64 = 1_000;

/// The many-group cluster.
pub struct ManyCluster {
    options: ManyOptions,
    prng: Prng,
    now: u64,
    groups: Vec<u64>,
    /// Per node and group: the replica's configuration.
    configs: Vec<BTreeMap<u64, Config>>,
    nodes: Vec<Option<Groups>>,
    storages: Vec<BTreeMap<u64, Storage>>,
    checkers: BTreeMap<u64, Checker>,
    /// Per node: the links to each peer as its replicas were last told.
    links: Vec<Vec<bool>>,
    restart_at: Vec<u64>,
    incarnations: Vec<u64>,
    network: Network,
    clients: Vec<Client>,
    faults_on: bool,
    clients_on: bool,
    partition_until: u64,
    crashes: u64,
    wipes: u64,
    /// Counts of the nodes' earlier incarnations.
    sleeps_retired: u64,
    silent_wakes_retired: u64,
    view_changes_retired: u64,
    slow_skips_retired: u64,
    /// The slow stretch under way, the packets that wait for a paused node, the stream
    /// that decides stretches, and how many there were.
    slow: SlowNodes,
    /// Per group, the ops whose journal entry was corrupted on some node (one at most),
    /// and the stream that decides corruption.
    corrupted: BTreeMap<u64, BTreeSet<u64>>,
    corrupt_prng: Prng,
    trace: Trace,
}

/// The partition group of partition `p` (stream 1, topic 1).
fn partition_group(p: u32) -> u64 {
    PartitionKey {
        stream: 1,
        topic: 1,
        partition: p + 1,
    }
    .pack()
    .unwrap_or(u64::from(p) + 1)
}

impl ManyCluster {
    pub fn new(options: ManyOptions) -> ManyCluster {
        let n = options.replica_count;
        let cluster = cluster_id("sim-many");
        let mut groups = vec![METADATA_GROUP];
        groups.extend((0..options.partitions).map(partition_group));
        let configs: Vec<BTreeMap<u64, Config>> = (0..n)
            .map(|r| {
                groups
                    .iter()
                    .enumerate()
                    .map(|(i, group)| {
                        let mut config = Config::new(cluster, *group, r, n);
                        config.seed = options
                            .seed
                            .wrapping_mul(31)
                            .wrapping_add(u64::from(r))
                            .wrapping_add((i as u64) << 8);
                        // Primaries spread over the nodes, as the appliance starts them.
                        config.initial_view = (i as u32) % u32::from(n);
                        (*group, config)
                    })
                    .collect()
            })
            .collect();
        let clients = groups
            .iter()
            .skip(1)
            .enumerate()
            .map(|(p, group)| Client {
                group: *group,
                id: (u128::from(options.seed) << 32) | (p as u128 + 1),
                busy: (p as u32) < options.busy,
                request_last: 0,
                outstanding: None,
                wanted: 0,
                sent_at: 0,
                target: (p as u8) % n,
                redirected: false,
            })
            .collect();
        let mut cluster = ManyCluster {
            prng: Prng::new(options.seed ^ 0x3a11),
            now: 0,
            checkers: groups.iter().map(|g| (*g, Checker::new(n))).collect(),
            groups,
            configs,
            nodes: (0..n).map(|_| None).collect(),
            storages: (0..n).map(|_| BTreeMap::new()).collect(),
            links: vec![vec![false; usize::from(n)]; usize::from(n)],
            restart_at: vec![0; usize::from(n)],
            incarnations: vec![0; usize::from(n)],
            network: Network::new(n, options.faults.network),
            clients,
            faults_on: true,
            clients_on: true,
            partition_until: 0,
            crashes: 0,
            wipes: 0,
            sleeps_retired: 0,
            silent_wakes_retired: 0,
            view_changes_retired: 0,
            slow_skips_retired: 0,
            slow: SlowNodes::new(Prng::new(options.seed ^ 0x0051_0e58)),
            corrupted: BTreeMap::new(),
            // Its own stream, so the rest of a seed's draws stay as they were.
            corrupt_prng: Prng::new(options.seed ^ 0x0c0e_ea71),
            trace: Trace::default(),
            options,
        };
        for r in 0..n {
            let mut node = cluster.new_node(r);
            for group in cluster.groups.clone() {
                let config = cluster.configs[usize::from(r)][&group].clone();
                node.insert(Replica::new(config));
                // Journals defer appends past their head, as the appliance's do.
                cluster.storages[usize::from(r)].insert(group, Storage::new(true));
            }
            cluster.nodes[usize::from(r)] = Some(node);
        }
        cluster.sync_links();
        cluster
    }

    fn new_node(&self, r: u8) -> Groups {
        let mut node = Groups::new();
        let timeout = self.configs[usize::from(r)][&METADATA_GROUP].heartbeat_timeout_ticks;
        node.hibernate(r, self.options.replica_count, timeout);
        node
    }

    fn heartbeat_timeout(&self) -> u64 {
        self.configs[0][&METADATA_GROUP].heartbeat_timeout_ticks
    }

    fn log(&mut self, line: impl FnOnce() -> String) {
        let (on, max) = (self.options.trace, self.options.trace_lines);
        self.trace.push(on, max, self.now, line);
    }

    fn fail(&self, reason: String) -> Failure {
        self.trace.failure(self.options.seed, self.now, reason)
    }

    /// The fault phase, the liveness phase, the failover of sleeping groups and the
    /// liveness phase after it.
    pub fn run(mut self) -> Result<ManySummary, Failure> {
        for _ in 0..self.options.ticks {
            self.step().map_err(|r| self.fail(r))?;
        }
        self.faults_on = false;
        for packet in self.slow_end() {
            self.deliver(packet).map_err(|e| self.fail(e))?;
        }
        self.network.heal();
        self.network.faults = NetworkFaults::none();
        for r in 0..self.options.replica_count {
            if self.nodes[usize::from(r)].is_none() {
                self.restart(r).map_err(|e| self.fail(e))?;
            }
        }
        self.sync_links();
        self.converge("after the faults stopped")
            .map_err(|e| self.fail(e))?;
        let (groups, asleep, ticks) = self.failover().map_err(|e| self.fail(e))?;
        self.converge("after the failover")
            .map_err(|e| self.fail(e))?;
        let mut summary = ManySummary {
            replies: self.checkers.values().map(|c| c.replies).sum(),
            commits: self.checkers.values().map(Checker::commit_max).sum(),
            crashes: self.crashes,
            wipes: self.wipes,
            sleeps: self.sleeps_retired,
            silent_wakes: self.silent_wakes_retired,
            failover_groups: groups,
            failover_asleep: asleep,
            failover_ticks: ticks,
            view_changes: self.view_changes_retired,
            slow_stretches: self.slow.started,
            slow_skips: self.slow_skips_retired,
            corruptions: self.corrupted.values().map(|ops| ops.len() as u64).sum(),
        };
        for node in self.nodes.iter().flatten() {
            let (sleeps, silent_wakes, view_changes, slow_skips) = node_counts(node);
            summary.sleeps += sleeps;
            summary.silent_wakes += silent_wakes;
            summary.view_changes += view_changes;
            summary.slow_skips += slow_skips;
        }
        Ok(summary)
    }

    /// Clients load the cluster, then finish what they sent; every group must converge
    /// within the liveness bound.
    fn converge(&mut self, when: &str) -> Result<(), String> {
        let start = self.now;
        self.clients_on = true;
        while self.now - start < self.options.liveness_ticks {
            self.step()?;
            if self.clients_on && self.now - start >= LOAD_TICKS {
                self.clients_on = false;
            }
            if !self.clients_on && self.converged() {
                return Ok(());
            }
        }
        Err(format!(
            "no convergence within {} ticks {when}: {}",
            self.options.liveness_ticks,
            self.status_line()
        ))
    }

    /// Every node up, every group Normal in one view on all of them, everything
    /// committed, no request outstanding.
    fn converged(&self) -> bool {
        if self
            .clients
            .iter()
            .any(|c| c.outstanding.is_some() || c.wanted > 0)
        {
            return false;
        }
        self.groups.iter().all(|group| {
            let mut seen = None;
            self.nodes.iter().all(|node| {
                let Some(replica) = node.as_ref().and_then(|n| n.get(*group)) else {
                    return false;
                };
                let this = (replica.view(), replica.commit());
                replica.status() == Status::Normal
                    && replica.is_voter()
                    && replica.commit() == replica.op()
                    && *seen.get_or_insert(this) == this
            }) && seen.is_some_and(|(_, commit)| commit >= self.checkers[group].reply_op_max)
        })
    }

    /// The groups not converged, one line each (at most a few).
    fn status_line(&self) -> String {
        let mut line = String::new();
        let mut shown = 0;
        for group in &self.groups {
            let mut states = Vec::new();
            for (r, node) in self.nodes.iter().enumerate() {
                match node.as_ref().and_then(|n| n.get(*group)) {
                    Some(x) => states.push(format!(
                        "r{r} {:?} v{} op{} c{}{}",
                        x.status(),
                        x.view(),
                        x.op(),
                        x.commit(),
                        if node.as_ref().is_some_and(|n| n.asleep(*group)) {
                            " asleep"
                        } else {
                            ""
                        }
                    )),
                    None => states.push(format!("r{r} down")),
                }
            }
            let pending = self
                .clients
                .iter()
                .any(|c| c.group == *group && c.outstanding.is_some());
            let up: Vec<&str> = states
                .iter()
                .filter(|s| !s.ends_with("down"))
                .map(|s| s.split_once(' ').map_or("", |(_, rest)| rest))
                .collect();
            let all_same = up.windows(2).all(|w| w[0] == w[1]);
            if pending || !all_same {
                let pending = if pending { " request pending" } else { "" };
                line.push_str(&format!(
                    "[group {group:x}{pending}: {}] ",
                    states.join(", ")
                ));
                shown += 1;
                if shown == 4 {
                    break;
                }
            }
        }
        line
    }

    /// The idle groups sleep; the node leading most partition groups crashes; each group
    /// it led must be Normal under another primary on every other node within the bound,
    /// and commit a request. Returns (groups it led, of them asleep, ticks to the last).
    fn failover(&mut self) -> Result<(u64, u64, u64), String> {
        let n = self.options.replica_count;
        let timeout = self.heartbeat_timeout();
        for _ in 0..3 * timeout + 300 {
            self.step()?;
        }
        // Each node keeps at most one group it leads awake (its beacon).
        for (r, node) in self.nodes.iter().enumerate() {
            let asleep = node.as_ref().map_or(0, |n| n.sleep_stats().asleep);
            let expected = u64::from(self.options.partitions).saturating_sub(u64::from(n));
            if asleep < expected {
                return Err(format!(
                    "r{r}: {asleep} groups asleep once idle, expected {expected} at least: {}",
                    self.status_line()
                ));
            }
        }
        let led = |cluster: &ManyCluster, r: u8| -> Vec<u64> {
            let node = cluster.nodes[usize::from(r)].as_ref().expect("all up");
            node.iter()
                .filter(|(_, replica, _)| replica.is_primary())
                .map(|(group, _, _)| group)
                .collect()
        };
        let victim = (0..n)
            .max_by_key(|r| (led(self, *r).len(), *r))
            .expect("replicas");
        let groups = led(self, victim);
        let asleep = {
            let node = self.nodes[usize::from(victim)].as_ref().expect("all up");
            groups.iter().filter(|g| node.asleep(**g)).count() as u64
        };
        let views: BTreeMap<u64, u32> = groups
            .iter()
            .map(|g| {
                let node = self.nodes[usize::from(victim)].as_ref().expect("up");
                (*g, node.get(*g).map_or(0, Replica::view))
            })
            .collect();
        self.log(|| format!("failover check: r{victim} crashes, leading {groups:x?}"));
        self.crash(victim);
        let bound = timeout + timeout / 4 + 100;
        let start = self.now;
        loop {
            self.step()?;
            let elected = groups.iter().all(|group| {
                let mut seen = None;
                (0..n).filter(|r| *r != victim).all(|r| {
                    let Some(replica) = self.nodes[usize::from(r)]
                        .as_ref()
                        .and_then(|node| node.get(*group))
                    else {
                        return false;
                    };
                    replica.status() == Status::Normal
                        && replica.view() > views[group]
                        && replica.config().primary_of(replica.view()) != victim
                        && *seen.get_or_insert(replica.view()) == replica.view()
                })
            });
            if elected {
                break;
            }
            if self.now - start > bound {
                return Err(format!(
                    "groups led by r{victim} ({} of {} asleep) not failed over within {bound} \
                     ticks (heartbeat timeout {timeout}): {}",
                    asleep,
                    groups.len(),
                    self.status_line()
                ));
            }
        }
        let ticks = self.now - start;
        // Every partition group commits a request without the victim.
        for client in &mut self.clients {
            client.wanted += 1;
        }
        let start = self.now;
        while self
            .clients
            .iter()
            .any(|c| c.wanted > 0 || c.outstanding.is_some())
        {
            self.step()?;
            if self.now - start > 4 * timeout + 4 * CLIENT_RETRY_TICKS {
                return Err(format!(
                    "a request to every group was not committed within {} ticks of the \
                     failover of r{victim}: {}",
                    4 * timeout + 4 * CLIENT_RETRY_TICKS,
                    self.status_line()
                ));
            }
        }
        self.restart(victim)?;
        Ok((groups.len() as u64, asleep, ticks))
    }

    /// One tick of every node.
    fn step(&mut self) -> Result<(), String> {
        self.now += 1;
        if self.faults_on {
            self.inject_faults();
        }
        self.slow_tick()?;
        for r in 0..self.options.replica_count {
            let i = usize::from(r);
            if self.nodes[i].is_none() && self.restart_at[i] != 0 && self.now >= self.restart_at[i]
            {
                self.restart(r)?;
            }
        }
        for packet in self.network.deliver(self.now) {
            if !self.slow.hold(&packet) {
                self.deliver(packet)?;
            }
        }
        for r in 0..self.options.replica_count {
            let i = usize::from(r);
            if self.paused(r) {
                continue;
            }
            let Some(node) = self.nodes[i].as_mut() else {
                continue;
            };
            for (group, storage) in self.storages[i].iter_mut() {
                let done = storage.sync(self.now);
                if done.is_empty() {
                    continue;
                }
                if let Some(replica) = node.get_mut(*group) {
                    for (op, checksum) in done {
                        replica.on_journal_durable(op, checksum);
                    }
                }
            }
            node.on_tick();
            self.drain(r)?;
        }
        self.clients_tick();
        Ok(())
    }

    fn deliver(&mut self, packet: Packet) -> Result<(), String> {
        match packet.to {
            Node::Replica(r) => {
                let i = usize::from(r);
                let Some(node) = self.nodes[i].as_mut() else {
                    return Ok(());
                };
                match packet.from {
                    Node::Replica(_) => {
                        // A frame of a group this node does not host cannot happen; an
                        // invalid one (none are corrupted here) would be a bug.
                        if let Err(e) = node.on_message(packet.bytes.as_bytes()) {
                            return Err(format!("r{r} could not route a frame: {e:?}"));
                        }
                    }
                    Node::Client(c) => {
                        let group = self.clients[usize::from(c)].group;
                        let Some(replica) = node.get_mut(group) else {
                            return Ok(());
                        };
                        let outcome = replica.on_request(packet.bytes.as_bytes());
                        if let RequestOutcome::NotPrimary { primary } = outcome {
                            let client = &mut self.clients[usize::from(c)];
                            client.redirected = client.target != primary;
                            client.target = primary;
                        }
                        self.log(|| format!("r{r} group {group:x} request: {outcome:?}"));
                    }
                }
                self.drain(r)
            }
            Node::Client(c) => self.client_receive(c, packet.bytes),
        }
    }

    fn drain(&mut self, r: u8) -> Result<(), String> {
        let i = usize::from(r);
        let Some(node) = self.nodes[i].as_mut() else {
            return Ok(());
        };
        let n = self.options.replica_count;
        let actions = node.drain_actions();
        for (group, action) in &actions {
            if !node.get(*group).is_some_and(Replica::is_voter) {
                check_non_voter(r, std::slice::from_ref(action))
                    .map_err(|e| format!("group {group:x}: {e}"))?;
            }
        }
        for (group, action) in actions {
            match action {
                Action::Send { to, frame } => {
                    self.log(|| format!("r{r} -> r{to} {group:x} {}", describe(&frame)));
                    let (bytes, to) = (frame.into_buf(), Node::Replica(to));
                    self.network
                        .send_between(self.now, r, to, bytes, &mut self.prng);
                }
                Action::Broadcast { frame } => {
                    self.log(|| format!("r{r} -> all {group:x} {}", describe(&frame)));
                    self.network
                        .broadcast(self.now, r, n, frame.as_bytes(), &mut self.prng);
                }
                Action::JournalAppend { op, frame } => {
                    let delay = 1 + self.prng.below(6) + self.slow.write_lag(r);
                    let storage = self.storages[i].get_mut(&group).expect("every group");
                    // Past the head: deferred (the core asks again).
                    let _ = storage.append(op, &frame, self.now + delay);
                }
                Action::JournalTruncate { op_max } => {
                    let storage = self.storages[i].get_mut(&group).expect("every group");
                    storage.truncate(op_max);
                }
                Action::PersistSuperblock(superblock) => {
                    let storage = self.storages[i].get_mut(&group).expect("every group");
                    storage.superblock = superblock;
                }
                Action::Commit { op, prepare } => {
                    let header = PrepareHeader::read_from_prefix(prepare.as_bytes())
                        .map(|(h, _)| h)
                        .map_err(|_| format!("r{r} committed a frame that is not a prepare"))?;
                    let checker = self.checkers.get_mut(&group).expect("every group");
                    checker
                        .on_commit(r, op, &header)
                        .map_err(|e| format!("group {group:x}: {e}"))?;
                    let (status, body) = applied_result(&header);
                    let applied = Applied {
                        status,
                        body: &body,
                        keep_body: true,
                        reply_as: None,
                    };
                    let replica = self.nodes[i].as_mut().and_then(|node| node.get_mut(group));
                    if let Some((client, frame)) =
                        replica.and_then(|replica| replica.on_applied(op, applied))
                    {
                        if let Some(c) = self.clients.iter().position(|x| x.id == client) {
                            let (bytes, to) = (frame.into_buf(), Node::Client(c as u16));
                            self.network
                                .send_between(self.now, r, to, bytes, &mut self.prng);
                        }
                    }
                }
                Action::Reply { client, frame } | Action::Evict { client, frame } => {
                    if let Some(c) = self.clients.iter().position(|x| x.id == client) {
                        let (bytes, to) = (frame.into_buf(), Node::Client(c as u16));
                        self.network
                            .send_between(self.now, r, to, bytes, &mut self.prng);
                    }
                }
                Action::StateTransfer { from, op_min } => {
                    return Err(format!(
                        "r{r} group {group:x} asked for state transfer from r{from} (op_min \
                         {op_min}): the simulator keeps every op, so repair must suffice"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A node's counts: times its groups fell asleep, woke for a silent primary, changed
/// views, and skipped a backup as slow.
fn node_counts(node: &Groups) -> (u64, u64, u64, u64) {
    let stats = node.sleep_stats();
    let (view_changes, slow_skips) = node
        .iter()
        .map(|(_, replica, _)| (replica.counters().view_changes, replica.slow_counts().0))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    (stats.sleeps, stats.silent_wakes, view_changes, slow_skips)
}

/// Runs one many-group seed.
pub fn run_many(options: ManyOptions) -> Result<ManySummary, Failure> {
    ManyCluster::new(options).run()
}
