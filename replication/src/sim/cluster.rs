//! A simulated cluster: replicas of the real `vsr` code, their storage, clients and the
//! network, driven tick by tick from one seed, with faults injected and checkers run
//! after every step.

use zerocopy::FromBytes;

use crate::vsr::{
    Action, Applied, Config, PeerLiveness, Prng, Replica, RequestOutcome, Sleep, Status,
    Superblock, Woke,
};
use crate::wire::{
    cluster_id, decode, Frame, FrameBuf, Limits, Message, PrepareHeader, METADATA_GROUP,
};

use super::checker::Checker;
use super::network::{Network, NetworkFaults, Node, Packet};
use super::storage::Storage;

mod clients;
mod lifecycle;
mod options;
mod trace;

use clients::Client;
pub(super) use clients::{applied_result, check_reply_result, one_message_batch, request_frame};
pub use options::{Faults, SimOptions, Wipe, WIPES_OVER_REPLICAS_MAX};
pub use trace::Failure;
pub(super) use trace::{check_non_voter, describe, Trace};

/// Lines of trace kept for a failure report.
pub const TRACE_LINES_MAX: usize = 400;
/// Ticks clients keep loading the healed cluster before they only finish what they sent.
pub const LIVENESS_LOAD_TICKS: u64 = 1_000;

/// A superblock write in flight, and the replica's actions that wait for it.
struct SuperblockWrite {
    due: u64,
    superblock: crate::vsr::Superblock,
    after: Vec<Action>,
}

/// Figures of a run that passed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub commit: u64,
    pub replies: u64,
    pub view: u32,
    pub crashes: u64,
    pub view_changes: u64,
    pub ticks_to_converge: u64,
    /// Restarts that resumed from a checkpoint, and state transfers installed.
    pub checkpoint_restarts: u64,
    pub state_transfers: u64,
    /// Commit points whose prepare a replica released from memory (`SimOptions::evict`).
    pub anchors_released: u64,
    /// Restarts that lost the disk or the superblock.
    pub wipes: u64,
    /// Slow stretches, and backups the primaries skipped as slow.
    pub slow_stretches: u64,
    pub slow_skips: u64,
    /// Times a replica fell asleep, and woke because its primary's node went silent.
    pub sleeps: u64,
    pub silent_wakes: u64,
    /// Journal appends past the head, deferred until the core asked again.
    pub deferred_appends: u64,
}

/// The simulated cluster.
pub struct Cluster {
    pub options: SimOptions,
    pub(super) prng: Prng,
    pub now: u64,
    configs: Vec<Config>,
    pub replicas: Vec<Option<Replica>>,
    pub storages: Vec<Storage>,
    restart_at: Vec<u64>,
    /// State transfers asked for: (replica, source), installed on the next step.
    transfers: Vec<(u8, u8)>,
    checkpoint_restarts: u64,
    state_transfers: u64,
    incarnations: Vec<u64>,
    pub network: Network,
    clients: Vec<Client>,
    pub checker: Checker,
    trace: Trace,
    /// Ops whose journal entry was corrupted somewhere (each on one replica at most).
    pub(super) corrupted_ops: std::collections::BTreeSet<u64>,
    pub(super) partition_until: u64,
    pub(super) faults_on: bool,
    pub(super) clients_on: bool,
    pub crashes: u64,
    view_changes_retired: u64,
    /// Scenario control: drop every Reply on its way to a client.
    pub drop_replies: bool,
    /// Restarts that lost the disk (or the superblock), and the stream that decides them.
    pub wipes: u64,
    wipe_prng: Prng,
    /// The slow stretch under way, packets waiting for a paused replica, the stream
    /// that decides stretches, and how many there were.
    pub slow: super::stretch::SlowNodes,
    slow_skips_retired: u64,
    /// Latency of each client request in ticks (with `latency_samples`).
    pub latencies: Vec<u64>,
    /// With `hibernate`: each replica's sleep, each node's view of its peers, and counts.
    pub(super) sleeps: Vec<Sleep>,
    liveness: Vec<PeerLiveness>,
    pub sleeps_count: u64,
    pub silent_wakes: u64,
    /// Clients send nothing new before this tick (an idle stretch), and the stream that
    /// decides the stretches.
    clients_idle_until: u64,
    idle_prng: Prng,
    /// Decides how much each checkpoint drops from memory (`SimOptions::evict`).
    evict_prng: Prng,
    pub anchors_released: u64,
    /// Each replica's superblock write in flight (`SimOptions::superblock_lag_max`), and
    /// the stream that decides how long each takes.
    superblock_writes: Vec<Option<SuperblockWrite>>,
    superblock_prng: Prng,
}

impl Cluster {
    pub fn new(options: SimOptions) -> Cluster {
        let n = options.replica_count;
        let cluster = cluster_id("sim");
        let configs: Vec<Config> = (0..n)
            .map(|r| {
                let mut config = Config::new(cluster, options.group, r, n);
                config.seed = options.seed.wrapping_mul(31).wrapping_add(u64::from(r));
                let scale = options.time_scale.max(1);
                config.heartbeat_timeout_ticks *= scale;
                config.prepare_retransmit_interval_ticks *= scale;
                config.view_change_retransmit_interval_ticks *= scale;
                config.view_change_timeout_ticks *= scale;
                config.repair_interval_ticks *= scale;
                config.slow_lag_min_ticks *= scale;
                config.slow_readmit_ticks *= scale;
                config.initial_view = options.initial_view;
                config
            })
            .collect();
        let replicas = configs
            .iter()
            .map(|c| {
                Some(if options.formation {
                    Replica::unformed(c.clone())
                } else {
                    Replica::new(c.clone())
                })
            })
            .collect();
        let clients = (0..options.clients)
            .map(|c| Client {
                id: (u128::from(options.seed) << 32) | (u128::from(c) + 1),
                // Partition groups take no Register (sessions live on the metadata plane).
                session: u64::from(options.group != METADATA_GROUP),
                request: 0,
                request_last: 0,
                outstanding: None,
                sent_at: 0,
                started_at: 0,
                target: (c as u8) % n,
                done: 0,
            })
            .collect();
        Cluster {
            prng: Prng::new(options.seed),
            now: 0,
            replicas,
            storages: vec![Storage::new(options.defer_gaps); usize::from(n)],
            restart_at: vec![0; usize::from(n)],
            transfers: Vec::new(),
            checkpoint_restarts: 0,
            state_transfers: 0,
            incarnations: vec![0; usize::from(n)],
            network: Network::new(n, options.faults.network),
            clients,
            checker: Checker::new(n),
            trace: Trace::default(),
            corrupted_ops: Default::default(),
            partition_until: 0,
            faults_on: true,
            clients_on: true,
            crashes: 0,
            view_changes_retired: 0,
            drop_replies: false,
            wipes: 0,
            wipe_prng: Prng::new(options.seed ^ 0x0007_7195),
            slow: super::stretch::SlowNodes::new(Prng::new(options.seed ^ 0x0051_0e56)),
            slow_skips_retired: 0,
            latencies: Vec::new(),
            sleeps: vec![Sleep::default(); usize::from(n)],
            liveness: configs
                .iter()
                .map(|c| PeerLiveness::new(n, c.heartbeat_timeout_ticks, 0))
                .collect(),
            sleeps_count: 0,
            silent_wakes: 0,
            clients_idle_until: 0,
            idle_prng: Prng::new(options.seed ^ 0x001d_1e55),
            evict_prng: Prng::new(options.seed ^ 0x0e71_c7e5),
            anchors_released: 0,
            superblock_writes: (0..n).map(|_| None).collect(),
            superblock_prng: Prng::new(options.seed ^ 0x05b1_a901),
            configs,
            options,
        }
    }

    pub(super) fn log(&mut self, line: impl FnOnce() -> String) {
        let (on, max) = (self.options.trace, self.options.trace_lines);
        self.trace.push(on, max, self.now, line);
    }

    fn fail(&self, reason: String) -> Failure {
        self.trace.failure(self.options.seed, self.now, reason)
    }

    /// Runs the fault phase, then the liveness phase; Ok with figures or the failure.
    pub fn run(mut self) -> Result<Summary, Failure> {
        for _ in 0..self.options.ticks {
            self.step().map_err(|r| self.fail(r))?;
        }
        // Liveness: faults stop, every replica restarts, links heal, clients resume.
        self.faults_on = false;
        self.clients_idle_until = 0;
        for packet in self.slow_end() {
            self.deliver(packet).map_err(|r| self.fail(r))?;
        }
        self.network.heal();
        self.network.faults = NetworkFaults::none();
        for r in 0..self.options.replica_count {
            if self.replicas[usize::from(r)].is_none() {
                self.restart(r).map_err(|e| self.fail(e))?;
            }
        }
        self.sync_links();
        let start = self.now;
        let mut clients_stopped_at = None;
        while self.now - start < self.options.liveness_ticks {
            self.step().map_err(|r| self.fail(r))?;
            if clients_stopped_at.is_none()
                && self.now - start >= (self.options.liveness_ticks / 4).min(LIVENESS_LOAD_TICKS)
            {
                self.clients_on = false;
                clients_stopped_at = Some(self.now);
            }
            if !self.clients_on && self.converged() {
                let view_changes = self.view_changes();
                let replica = self.replicas[0].as_ref().expect("all up");
                return Ok(Summary {
                    commit: replica.commit(),
                    replies: self.checker.replies,
                    view: replica.view(),
                    crashes: self.crashes,
                    view_changes,
                    ticks_to_converge: self.now - start,
                    checkpoint_restarts: self.checkpoint_restarts,
                    state_transfers: self.state_transfers,
                    anchors_released: self.anchors_released,
                    wipes: self.wipes,
                    slow_stretches: self.slow.started,
                    slow_skips: self.slow_skips(),
                    sleeps: self.sleeps_count,
                    silent_wakes: self.silent_wakes,
                    deferred_appends: self.storages.iter().map(|s| s.deferred).sum(),
                });
            }
        }
        Err(self.fail(format!(
            "no convergence within {} ticks after faults stopped: {}",
            self.options.liveness_ticks,
            self.status_line()
        )))
    }

    /// Backups skipped as slow by any primary in this run.
    pub fn slow_skips(&self) -> u64 {
        self.slow_skips_retired
            + self
                .replicas
                .iter()
                .flatten()
                .map(|r| r.slow_counts().0)
                .sum::<u64>()
    }

    pub fn view_changes(&self) -> u64 {
        self.view_changes_retired
            + self
                .replicas
                .iter()
                .flatten()
                .map(|r| r.counters().view_changes)
                .sum::<u64>()
    }

    /// One line per replica: status, view, op, commit.
    pub fn status_line(&self) -> String {
        let mut line = String::new();
        for (r, replica) in self.replicas.iter().enumerate() {
            match replica {
                Some(x) => line.push_str(&format!(
                    "[r{r} {:?}{} v{} lv{} op{} c{} cmax{}] ",
                    x.status(),
                    if x.is_voter() { "" } else { " non-voter" },
                    x.view(),
                    x.log_view(),
                    x.op(),
                    x.commit(),
                    x.commit_max()
                )),
                None => line.push_str(&format!("[r{r} down] ")),
            }
        }
        let pending = self
            .clients
            .iter()
            .filter(|c| c.outstanding.is_some())
            .count();
        line.push_str(&format!(
            "clients pending {pending}, highest op replied {}",
            self.checker.reply_op_max
        ));
        line
    }

    /// All replicas up, Normal in one view, every op committed everywhere, clients idle.
    pub fn converged(&self) -> bool {
        if self.clients.iter().any(|c| c.outstanding.is_some()) {
            return false;
        }
        let mut commit = None;
        let mut view = None;
        for replica in &self.replicas {
            let Some(replica) = replica else {
                return false;
            };
            if replica.status() != Status::Normal
                || !replica.is_voter()
                || replica.commit() != replica.op()
            {
                return false;
            }
            if *commit.get_or_insert(replica.commit()) != replica.commit()
                || *view.get_or_insert(replica.view()) != replica.view()
            {
                return false;
            }
        }
        commit.is_some_and(|c| c >= self.checker.reply_op_max)
    }

    /// One tick of the whole cluster.
    pub fn step(&mut self) -> Result<(), String> {
        self.now += 1;
        if self.faults_on {
            self.inject_faults()?;
            if self.options.hibernate
                && self.now >= self.clients_idle_until
                && self.idle_prng.chance(self.options.idle_per_10k, 10_000)
            {
                self.clients_idle_until = self.now + 200 + self.idle_prng.below(3_000);
                self.log(|| "clients pause".to_string());
            }
        }
        if self.options.hibernate {
            self.send_liveness();
        }
        self.slow_tick()?;
        for (r, from) in std::mem::take(&mut self.transfers) {
            self.state_transfer(r, from)?;
        }
        if self.options.checkpoint_restarts && self.now.is_multiple_of(97) {
            self.take_checkpoints();
        }
        for r in 0..self.options.replica_count {
            if self.replicas[usize::from(r)].is_none()
                && self.restart_at[usize::from(r)] != 0
                && self.now >= self.restart_at[usize::from(r)]
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
            if self.paused(r) {
                continue;
            }
            let i = usize::from(r);
            self.complete_superblock_write(r)?;
            let done = self.storages[i].sync(self.now);
            if let Some(replica) = self.replicas[i].as_mut() {
                if !done.is_empty() {
                    self.sleeps[i].wake(replica, &self.liveness[i], self.now);
                }
                for (op, checksum) in done {
                    replica.on_journal_durable(op, checksum);
                }
            }
            if let Some(replica) = self.replicas[i].as_mut() {
                if !self.options.hibernate {
                    replica.on_tick();
                } else {
                    match self.sleeps[i].check(replica, &self.liveness[i], self.now) {
                        Some(Woke::PrimarySilent) => {
                            self.silent_wakes += 1;
                            self.log(|| format!("r{r} wakes: its primary's node is silent"));
                        }
                        Some(Woke::Refreshed) => {
                            self.log(|| format!("r{r} broadcasts its Commit asleep"))
                        }
                        Some(Woke::PrimaryReconnected) => {
                            self.log(|| format!("r{r} wakes: its primary's node reconnected"))
                        }
                        None => {}
                    }
                    if !self.sleeps[i].asleep() {
                        let replica = self.replicas[i].as_mut().expect("checked above");
                        replica.on_tick();
                        if self.sleeps[i].after_tick(replica, &self.liveness[i], self.now) {
                            self.sleeps_count += 1;
                            self.log(|| format!("r{r} sleeps"));
                        }
                    }
                }
            }
            self.drain(r)?;
        }
        self.clients_tick()?;
        Ok(())
    }

    /// Every live node tells each peer it is up, once per commit broadcast interval (the
    /// Commits of the groups a node keeps awake, `hibernate`).
    fn send_liveness(&mut self) {
        let n = self.options.replica_count;
        let interval = self.configs[0].commit_broadcast_interval_ticks;
        if !self.now.is_multiple_of(interval) {
            return;
        }
        for from in 0..n {
            if self.replicas[usize::from(from)].is_none() || self.paused(from) {
                continue;
            }
            for to in (0..n).filter(|to| *to != from) {
                let packet = Packet {
                    from: Node::Replica(from),
                    to: Node::Replica(to),
                    bytes: FrameBuf::from_bytes(&[]),
                };
                self.network.send(self.now, packet, &mut self.prng);
            }
        }
    }

    pub(super) fn deliver(&mut self, packet: Packet) -> Result<(), String> {
        match packet.to {
            Node::Replica(r) => {
                let i = usize::from(r);
                let Some(replica) = self.replicas[i].as_mut() else {
                    return Ok(());
                };
                if let Node::Replica(from) = packet.from {
                    // An empty packet is a node's liveness (`send_liveness`); a Commit
                    // of the group counts the same.
                    let bytes = packet.bytes.as_bytes();
                    if bytes.is_empty() {
                        self.liveness[i].heard(from, self.now);
                        return Ok(());
                    }
                    if matches!(decode(bytes, &Limits::default()), Ok(Message::Commit(_))) {
                        self.liveness[i].heard(from, self.now);
                    }
                }
                match packet.from {
                    Node::Replica(_) => {
                        let bytes = packet.bytes.as_bytes();
                        let (sleep, peers) = (&mut self.sleeps[i], &self.liveness[i]);
                        sleep.on_message(replica, peers, self.now, |replica| {
                            replica.on_message(bytes)
                        });
                    }
                    Node::Client(c) => {
                        self.sleeps[i].wake(replica, &self.liveness[i], self.now);
                        let outcome = replica.on_request(packet.bytes.as_bytes());
                        if let RequestOutcome::NotPrimary { primary } = outcome {
                            // The redirect a backup answers with.
                            self.clients[usize::from(c)].target = primary;
                        }
                    }
                }
                self.drain(r)
            }
            Node::Client(c) => self.client_receive(c, packet.bytes),
        }
    }

    fn drain(&mut self, r: u8) -> Result<(), String> {
        let Some(replica) = self.replicas[usize::from(r)].as_mut() else {
            return Ok(());
        };
        let voter = replica.is_voter();
        let actions = replica.drain_actions();
        if !voter {
            check_non_voter(r, &actions)?;
        }
        self.execute(r, actions)
    }

    /// Runs `r`'s actions in order; those after a superblock write still in flight wait
    /// for it.
    fn execute(&mut self, r: u8, actions: Vec<Action>) -> Result<(), String> {
        let n = self.options.replica_count;
        for action in actions {
            if let Some(write) = self.superblock_writes[usize::from(r)].as_mut() {
                write.after.push(action);
                continue;
            }
            match action {
                Action::Send { to, frame } => {
                    self.log(|| format!("r{r} -> r{to} {}", describe(&frame)));
                    let (bytes, to) = (frame.into_buf(), Node::Replica(to));
                    self.network
                        .send_between(self.now, r, to, bytes, &mut self.prng);
                }
                Action::Broadcast { frame } => {
                    self.log(|| format!("r{r} -> all {}", describe(&frame)));
                    self.network
                        .broadcast(self.now, r, n, frame.as_bytes(), &mut self.prng);
                }
                Action::JournalAppend { op, frame } => {
                    let delay = 1 + self.prng.below(6) + self.slow.write_lag(r);
                    if !self.storages[usize::from(r)].append(op, &frame, self.now + delay) {
                        self.log(|| {
                            format!("r{r} journal append of op {op} past the head deferred")
                        });
                    }
                }
                Action::JournalTruncate { op_max } => {
                    self.storages[usize::from(r)].truncate(op_max);
                }
                Action::PersistSuperblock(superblock) => self.persist_superblock(r, superblock),
                Action::Commit { op, prepare } => self.commit(r, op, &prepare)?,
                Action::Reply { client, frame } => {
                    if !self.drop_replies {
                        self.send_to_client(r, client, frame);
                    }
                }
                Action::Evict { client, frame } => self.send_to_client(r, client, frame),
                Action::StateTransfer { from, op_min } => {
                    if !self.options.checkpoint_restarts {
                        return Err(format!(
                            "r{r} asked for state transfer from r{from} (op_min {op_min}): \
                             without checkpoints the simulator keeps every op, so repair \
                             must suffice"
                        ));
                    }
                    self.log(|| format!("r{r} state transfer from r{from} (op_min {op_min})"));
                    self.transfers.push((r, from));
                }
            }
        }
        Ok(())
    }

    /// `r` writes its superblock: at once, or (with a superblock lag) due a few ticks
    /// later, the actions after it waiting until then.
    fn persist_superblock(&mut self, r: u8, superblock: Superblock) {
        self.log(|| {
            format!(
                "r{r} superblock view {} log_view {} headers {}",
                superblock.view,
                superblock.log_view,
                superblock.headers.len()
            )
        });
        let lag = self.options.superblock_lag_max;
        if lag == 0 {
            self.storages[usize::from(r)].superblock = superblock;
        } else {
            let due = self.now + 1 + self.superblock_prng.below(lag);
            self.superblock_writes[usize::from(r)] = Some(SuperblockWrite {
                due,
                superblock,
                after: Vec::new(),
            });
        }
    }

    /// `r` committed `op`: the checker sees it, the replica gets its result, and the
    /// reply (if `r` is the primary) goes to the client.
    fn commit(&mut self, r: u8, op: u64, prepare: &Frame) -> Result<(), String> {
        let header = PrepareHeader::read_from_prefix(prepare.as_bytes())
            .map(|(h, _)| h)
            .map_err(|_| format!("r{r} committed a frame that is not a prepare"))?;
        self.checker.on_commit(r, op, &header)?;
        let (status, body) = applied_result(&header);
        let replica = self.replicas[usize::from(r)].as_mut();
        let reply = replica.and_then(|replica| {
            let applied = Applied {
                status,
                body: &body,
                keep_body: true,
                reply_as: None,
            };
            replica.on_applied(op, applied)
        });
        if let Some((client, frame)) = reply.filter(|_| !self.drop_replies) {
            self.send_to_client(r, client, frame);
        }
        Ok(())
    }

    /// Sends `frame` from `r` to the simulated client `client`, if it is one of ours.
    fn send_to_client(&mut self, r: u8, client: u128, frame: Frame) {
        if let Some(c) = self.client_index(client) {
            let (bytes, to) = (frame.into_buf(), Node::Client(c));
            self.network
                .send_between(self.now, r, to, bytes, &mut self.prng);
        }
    }

    /// Completes `r`'s superblock write if it is due: it is durable, and the actions
    /// that waited for it run.
    fn complete_superblock_write(&mut self, r: u8) -> Result<(), String> {
        let i = usize::from(r);
        if self.superblock_writes[i]
            .as_ref()
            .is_none_or(|w| w.due > self.now)
        {
            return Ok(());
        }
        let write = self.superblock_writes[i].take().expect("checked above");
        self.log(|| format!("r{r} superblock durable"));
        self.storages[i].superblock = write.superblock;
        self.execute(r, write.after)
    }

    fn client_index(&self, client: u128) -> Option<u16> {
        self.clients
            .iter()
            .position(|c| c.id == client)
            .map(|i| i as u16)
    }

    /// Tells every replica which peers its bus would see connected.
    pub fn sync_links(&mut self) {
        let n = self.options.replica_count;
        for a in 0..n {
            for b in 0..n {
                let up = a != b
                    && self.network.link(a, b)
                    && self.network.link(b, a)
                    && self.replicas[usize::from(b)].is_some();
                if let Some(replica) = self.replicas[usize::from(a)].as_mut() {
                    replica.set_connected(b, up);
                }
            }
        }
    }

    /// Whether every replica is a voter (a down one: kept its state).
    pub(super) fn every_replica_votes(&self) -> bool {
        (0..self.options.replica_count).all(|x| self.remembers(x))
    }

    /// Whether replica `x` votes (up) and will when it restarts (its durable superblock
    /// says so: a write in flight that made it a voter is lost in a crash).
    pub(super) fn remembers(&self, x: u8) -> bool {
        let superblock = &self.storages[usize::from(x)].superblock;
        let durable = !superblock.replacement && !superblock.unformed;
        match &self.replicas[usize::from(x)] {
            Some(replica) => replica.is_voter() && durable,
            None => durable,
        }
    }

    /// The Normal primary of the highest view, if any.
    pub fn primary(&self) -> Option<u8> {
        self.primary_guess()
    }

    pub(super) fn primary_guess(&self) -> Option<u8> {
        self.replicas
            .iter()
            .flatten()
            .filter(|r| r.status() == Status::Normal && r.is_primary())
            .max_by_key(|r| r.view())
            .map(|r| r.replica())
    }
}

/// Runs one seed.
pub fn run_seed(options: SimOptions) -> Result<Summary, Failure> {
    Cluster::new(options).run()
}
