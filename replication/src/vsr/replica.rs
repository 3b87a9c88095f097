//! The replica value, message dispatch and normal operation: prepares along the chain,
//! PrepareOk after a durable append, commit on a replication quorum, the Commit heartbeat
//! and prepare retransmission (docs/protocol.md, "Replication").

use std::collections::{BTreeMap, VecDeque};

use crate::wire::batch::PartitionPosition;
use crate::wire::registry::EvictionReason;
use crate::wire::{
    decode, decode_trusted, Command, CommitHeader, Frame, Header, Limits, Message, Operation,
    PrepareHeader, PrepareOkHeader, METADATA_GROUP,
};

use super::client_table::ClientTable;
use super::log::{frame_header, Log};
use super::timeout::{Prng, Timeout};
use super::{Action, Config, Counters};

/// Where a replica stands in the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Normal,
    ViewChange,
    /// Restarted: probing with RequestStartView before trusting its state.
    Recovering,
}

/// What became of a client request handed to `on_request`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestOutcome {
    /// Prepared at this op.
    Prepared { op: u64 },
    /// Already committed: the cached reply was queued.
    Replied,
    /// Already in the pipeline, or committed and not applied yet; the reply follows
    /// the apply.
    InProgress,
    /// This replica is not the primary of a normal view; `primary` is its best guess.
    NotPrimary { primary: u8 },
    /// The pipeline is full; retry later.
    PipelineFull,
    /// Older than the client's latest request: dropped.
    Stale,
    /// Unknown or evicted session: an Eviction was queued.
    Evicted,
    /// The frame failed validation or is not a replicated request of this group.
    Rejected,
}

/// A DoViewChange as the forming primary keeps it.
#[derive(Clone, Debug)]
pub(crate) struct Dvc {
    pub log_view: u32,
    pub op: u64,
    pub commit: u64,
    /// Highest op first.
    pub headers: Vec<PrepareHeader>,
    pub nack: u128,
    pub present: u128,
}

/// An uncommitted op of a primary's pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pending {
    /// The replicas that acknowledged it (bitmask, the primary's own bit once durable).
    pub(crate) acks: u32,
    /// The tick it was last sent at (the prepare retransmit skips ops sent since).
    pub(crate) sent_at: u64,
    /// The tick it was first sent at in this view (`NOT_SENT` until then): how long a
    /// backup lags is measured from it (`slow.rs`).
    pub(crate) prepared_at: u64,
}

/// A backup's heartbeat timeout fires within 1/8 of it after the interval.
pub const HEARTBEAT_JITTER_DIVISOR: u64 = 8;

/// `Pending::prepared_at` of an op not sent in this view yet.
pub(crate) const NOT_SENT: u64 = u64::MAX;

/// One replica of one consensus group.
#[derive(Debug)]
pub struct Replica {
    pub(crate) config: Config,
    pub(crate) limits: Limits,
    pub(crate) status: Status,
    pub(crate) view: u32,
    pub(crate) log_view: u32,
    pub(crate) log: Log,
    /// Ops applied (commit_min).
    pub(crate) commit: u64,
    /// Highest commit point learned.
    pub(crate) commit_max: u64,
    /// Primary: uncommitted ops, the replicas that acknowledged them, and when they
    /// were last sent.
    pub(crate) pipeline: BTreeMap<u64, Pending>,
    pub(crate) timestamp_last: u64,
    /// Primary: when the pipeline last made progress (abdication when it stalls).
    pub(crate) progress_tick: u64,
    /// The superblock as last persisted.
    pub(crate) superblock: super::Superblock,
    /// The superblock of the last PersistSuperblock this replica issued: persisting the
    /// same one again is skipped (that write completes before any later action).
    pub(crate) superblock_issued: Option<super::Superblock>,
    pub(crate) heartbeat_sent: u64,
    pub(crate) heartbeat_seen: u64,
    /// Primary: the commit point of its latest Commit broadcasts with an empty pipeline,
    /// and how many carried it (`hibernate.rs`).
    pub(crate) commit_broadcasts: (u64, u32),
    /// Backup: a Prepare of this view arrived since the primary's last Commit, so the
    /// primary is at work and must be heard by its own Commits (`hibernate.rs`).
    pub(crate) primary_preparing: bool,
    pub(crate) now: u64,
    pub(crate) prng: Prng,
    pub(crate) actions: VecDeque<Action>,
    pub(crate) counters: Counters,
    /// Peers the bus reports connected (bitmask); chain replication skips the others.
    pub(crate) connected: u32,
    /// Primary: backups the chain skips because they do not keep up (`slow.rs`).
    pub(crate) slow: super::slow::SlowPeers,
    pub(crate) clients: ClientTable,
    /// Committed ops whose result the driver has not reported yet (`applied.rs`).
    pub(crate) applying: VecDeque<super::applied::Applying>,
    pub(crate) svc_from: u32,
    pub(crate) dvcs: BTreeMap<u8, Dvc>,
    pub(crate) dvc_sent: bool,
    /// Forming primary: the merged log is installed and bodies are being repaired.
    pub(crate) merged: bool,
    /// Highest commit reported by the DVC quorum (forming primary).
    pub(crate) merge_commit: u64,
    pub(crate) incarnation: u128,
    pub(crate) probe_attempts: u32,
    /// Highest journal op above the log found at restart that could not be placed.
    pub(crate) faulty_above_op: u64,
    pub(crate) repair_peer_next: u8,
    /// Nonce of the latest RequestPrepares (its RepairDone continues the repair).
    pub(crate) repair_nonce: u128,
    pub(crate) state_transfer_requested: bool,
    /// Peers that answered RangeEvicted (bitmask) since commit was at the first value.
    pub(crate) evicted: (u64, u32),
    /// Partition plane: the stamp position after each op (pruned below commit).
    pub(crate) positions: BTreeMap<u64, PartitionPosition>,
    pub(crate) timeout_commit_broadcast: Timeout,
    pub(crate) timeout_heartbeat: Timeout,
    pub(crate) timeout_prepare_retransmit: Timeout,
    pub(crate) timeout_view_change_retransmit: Timeout,
    pub(crate) timeout_view_change: Timeout,
    pub(crate) timeout_repair: Timeout,
    pub(crate) timeout_probe: Timeout,
    /// Whether this replica votes (acks, view changes, primary); false for a replica
    /// that lost its state until it caught up (`replacement.rs`).
    pub(crate) voter: bool,
    /// The commit point at which this replica, having lost its state, became a voter
    /// again (0: it never was a replacement in this life).
    pub(crate) voter_since: u64,
    /// A non-voter's census of the other replicas, while it runs.
    pub(crate) census: Option<super::replacement::Census>,
    /// A non-voter installs only StartViews of this view or later (the census bound).
    pub(crate) view_min: u32,
    /// A non-voter in a view: the (op, commit) of the StartView it installed first.
    pub(crate) recover: Option<(u64, u64)>,
    /// A member of a new group: the peers not yet seen voting (bitmask) and the nonce it
    /// asks them with. It prepares nothing until a quorum of members formed the group.
    pub(crate) formation_wait: (u32, u128),
}

impl Replica {
    /// A replica of a new group: its initial view (`Config::initial_view`), empty log, Normal.
    pub fn new(config: Config) -> Replica {
        let mut replica = Replica::empty(config);
        replica.view = replica.config.initial_view;
        replica.log_view = replica.config.initial_view;
        replica.enter_normal_fresh();
        replica
    }

    pub(crate) fn empty(config: Config) -> Replica {
        if let Err(error) = config.validate() {
            panic!("invalid vsr config: {error}");
        }
        let prng = Prng::new(config.seed);
        let all = if config.replica_count >= 32 {
            u32::MAX
        } else {
            (1u32 << config.replica_count) - 1
        };
        let position = PartitionPosition {
            partition_id: config.group,
            next_offset: 0,
            last_timestamp: 0,
        };
        Replica {
            limits: Limits::default(),
            status: Status::Recovering,
            view: 0,
            log_view: 0,
            log: Log::default(),
            commit: 0,
            commit_max: 0,
            pipeline: BTreeMap::new(),
            timestamp_last: 0,
            progress_tick: 0,
            superblock: super::Superblock::default(),
            superblock_issued: None,
            heartbeat_sent: 0,
            heartbeat_seen: 0,
            commit_broadcasts: (0, 0),
            primary_preparing: false,
            now: 0,
            prng,
            actions: VecDeque::new(),
            counters: Counters::default(),
            connected: all & !(1u32 << config.replica),
            slow: Default::default(),
            clients: ClientTable::new(config.clients_max),
            applying: VecDeque::new(),
            svc_from: 0,
            dvcs: BTreeMap::new(),
            dvc_sent: false,
            merged: false,
            merge_commit: 0,
            incarnation: 0,
            probe_attempts: 0,
            faulty_above_op: 0,
            repair_peer_next: 0,
            repair_nonce: 0,
            state_transfer_requested: false,
            evicted: (0, 0),
            positions: BTreeMap::from([(0, position)]),
            timeout_commit_broadcast: Timeout::new(
                "commit_broadcast",
                config.commit_broadcast_interval_ticks,
            ),
            // Little jitter: view changes have no competing candidates (the primary of a
            // view is fixed), and every tick of it is failover time.
            timeout_heartbeat: Timeout::with_jitter(
                "heartbeat",
                config.heartbeat_timeout_ticks,
                HEARTBEAT_JITTER_DIVISOR,
            ),
            timeout_prepare_retransmit: Timeout::new(
                "prepare_retransmit",
                config.prepare_retransmit_interval_ticks,
            ),
            timeout_view_change_retransmit: Timeout::new(
                "view_change_retransmit",
                config.view_change_retransmit_interval_ticks,
            ),
            timeout_view_change: Timeout::new("view_change", config.view_change_timeout_ticks),
            timeout_repair: Timeout::new("repair", config.repair_interval_ticks),
            timeout_probe: Timeout::new("probe", config.view_change_retransmit_interval_ticks),
            voter: true,
            voter_since: 0,
            census: None,
            view_min: 0,
            recover: None,
            formation_wait: (0, 0),
            config,
        }
    }

    fn enter_normal_fresh(&mut self) {
        self.status = Status::Normal;
        self.start_normal_timeouts();
    }

    // ---- accessors -------------------------------------------------------------------

    /// This replica's id.
    pub fn replica(&self) -> u8 {
        self.config.replica
    }
    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }
    /// Protocol status.
    pub fn status(&self) -> Status {
        self.status
    }
    /// Current view.
    pub fn view(&self) -> u32 {
        self.view
    }
    /// View of the last Normal status.
    pub fn log_view(&self) -> u32 {
        self.log_view
    }
    /// Highest op in the log.
    pub fn op(&self) -> u64 {
        self.log.op
    }
    /// Ops applied.
    pub fn commit(&self) -> u64 {
        self.commit
    }
    /// Highest commit point learned.
    pub fn commit_max(&self) -> u64 {
        self.commit_max
    }
    /// Whether a StateTransfer action was emitted and no transfer has finished since.
    pub fn state_transfer_requested(&self) -> bool {
        self.state_transfer_requested
    }
    /// The driver's transfer failed: repair goes on, and the next RangeEvicted quorum
    /// asks for a state transfer again.
    pub fn on_state_transfer_failed(&mut self) {
        self.state_transfer_requested = false;
        self.evicted = (0, 0);
    }
    /// The log.
    pub fn log(&self) -> &Log {
        &self.log
    }
    /// Counters of rejected input and protocol events.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    /// The client table.
    pub fn clients(&self) -> &ClientTable {
        &self.clients
    }
    /// Whether this replica is the primary of its view.
    pub fn is_primary(&self) -> bool {
        self.config.primary_of(self.view) == self.config.replica
    }
    /// Ticks seen.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// The next queued action.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// All queued actions, in order.
    pub fn drain_actions(&mut self) -> Vec<Action> {
        self.actions.drain(..).collect()
    }

    /// Whether actions are queued (what [`Replica::drain_actions`] would return).
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// The bus reports a peer's link up or down (chain replication skips down peers).
    pub fn set_connected(&mut self, peer: u8, connected: bool) {
        if peer >= self.config.replica_count || peer == self.config.replica {
            return;
        }
        if connected {
            self.connected |= 1 << peer;
        } else {
            self.connected &= !(1 << peer);
        }
    }

    // ---- inputs ----------------------------------------------------------------------

    /// Advances time by one tick and fires due timeouts.
    pub fn on_tick(&mut self) {
        self.now += 1;
        let now = self.now;
        if self.timeout_commit_broadcast.fired(now) {
            self.timeout_commit_broadcast.reset(now, &mut self.prng);
            self.on_commit_broadcast_timeout();
        }
        self.on_slow_tick();
        if self.timeout_prepare_retransmit.fired(now) {
            self.timeout_prepare_retransmit.reset(now, &mut self.prng);
            self.on_prepare_retransmit_timeout();
        }
        if self.timeout_heartbeat.fired(now) {
            self.timeout_heartbeat.stop();
            self.on_heartbeat_timeout();
        }
        if self.timeout_view_change_retransmit.fired(now) {
            self.timeout_view_change_retransmit
                .reset(now, &mut self.prng);
            self.on_view_change_retransmit_timeout();
        }
        if self.timeout_view_change.fired(now) {
            self.timeout_view_change.backoff(now, &mut self.prng);
            self.on_view_change_timeout();
        }
        if self.timeout_repair.fired(now) {
            self.timeout_repair.reset(now, &mut self.prng);
            self.on_repair_timeout();
        }
        if self.timeout_probe.fired(now) {
            // A fixed interval (with jitter): after a whole-cluster restart nobody answers,
            // and backing off would stretch the PROBE_ATTEMPTS_MAX unanswered probes
            // that precede the election to many seconds per group.
            self.timeout_probe.reset(now, &mut self.prng);
            self.on_probe_timeout();
        }
        self.check_invariants();
    }

    /// A frame from a peer (16-byte aligned, exactly one frame). Invalid frames, frames of
    /// another cluster or group are counted and dropped.
    pub fn on_message(&mut self, bytes: &[u8]) {
        match decode(bytes, &self.limits) {
            Ok(message) => self.on_decoded(message, None),
            Err(_) => self.counters.frames_rejected += 1,
        }
    }

    /// As `on_message`, for a frame that already passed `wire::decode` (a verified frame
    /// of the bus): its body is not verified again, and a Prepare enters the log as the
    /// frame received, not a copy.
    pub fn on_frame(&mut self, frame: Frame) {
        match decode_trusted(frame.as_bytes(), &self.limits) {
            Ok(message) => self.on_decoded(message, Some(&frame)),
            Err(_) => self.counters.frames_rejected += 1,
        }
    }

    /// A decoded frame from a peer; `received` is the frame itself when it is sealed as
    /// it came (no need to rebuild it).
    fn on_decoded(&mut self, message: Message<'_>, received: Option<&Frame>) {
        let frame = match &message {
            Message::Prepare(h, _) | Message::RepairPrepare(h, _) => h.frame,
            Message::PrepareOk(h) => h.frame,
            Message::Commit(h) => h.frame,
            Message::StartViewChange(h) => h.frame,
            Message::DoViewChange(h, _) => h.frame,
            Message::StartView(h, _) => h.frame,
            Message::RequestStartView(h) => h.frame,
            Message::RequestPrepares(h) => h.frame,
            Message::RepairDone(h) | Message::RangeEvicted(h) => h.frame,
            _ => {
                self.counters.frames_rejected += 1;
                return;
            }
        };
        if frame.cluster != self.config.cluster {
            self.counters.frames_wrong_cluster += 1;
            return;
        }
        if crate::wire::decode::group_of(&message) != Some(self.config.group) {
            self.counters.frames_wrong_group += 1;
            return;
        }
        if frame.replica >= self.config.replica_count {
            self.counters.frames_rejected += 1;
            return;
        }
        if !self.voter && self.on_decoded_non_voter(&message) {
            self.check_invariants();
            return;
        }
        if self.formation_wait.0 != 0 && self.on_formation_answer(&message) {
            return;
        }
        match message {
            Message::Prepare(h, body) => self.on_prepare(h, body, received),
            Message::RepairPrepare(h, body) => self.on_repair_prepare(h, body),
            Message::PrepareOk(h) => self.on_prepare_ok(h),
            Message::Commit(h) => self.on_commit_message(h),
            Message::StartViewChange(h) => self.on_start_view_change(h),
            Message::DoViewChange(h, headers) => self.on_do_view_change(h, headers),
            Message::StartView(h, headers) => self.on_start_view(h, headers),
            Message::RequestStartView(h) => self.on_request_start_view(h),
            Message::RequestPrepares(h) => self.on_request_prepares(h),
            Message::RepairDone(h) => self.on_repair_done(h),
            Message::RangeEvicted(h) => self.on_range_evicted(h),
            _ => {}
        }
        self.check_invariants();
    }

    /// The journal finished writing the prepare `checksum` at `op` durably.
    pub fn on_journal_durable(&mut self, op: u64, checksum: u128) {
        if op < self.log.op_min() {
            return;
        }
        let Some(slot) = self.log.slot(op) else {
            return;
        };
        if slot.identity != Some(checksum)
            || slot.frame.as_ref().map(Frame::checksum) != Some(checksum)
        {
            return;
        }
        let slot = self.log.slot_mut(op);
        slot.durable = true;
        slot.prepared = true;
        match self.status {
            Status::Normal if self.is_primary() => {
                if let Some(pending) = self.pipeline.get_mut(&op) {
                    pending.acks |= 1 << self.config.replica;
                }
                self.commit_pipeline();
            }
            Status::Normal => {
                if op > self.commit {
                    self.send_prepare_ok(op);
                }
                self.commit_backup();
                self.try_become_voter();
            }
            Status::ViewChange => self.forming_try_start_view(),
            Status::Recovering => {}
        }
        self.check_invariants();
    }

    // ---- normal operation ------------------------------------------------------------

    /// The next replica of the chain after `from`, skipping disconnected peers; None once
    /// the chain would return to the primary.
    fn chain_next(&self, from: u8) -> Option<u8> {
        let n = self.config.replica_count;
        let primary = self.config.primary_of(self.view);
        let mut next = (from + 1) % n;
        while next != primary {
            if next != self.config.replica && self.connected & (1 << next) != 0 {
                return Some(next);
            }
            next = (next + 1) % n;
        }
        None
    }

    /// A primary sends a new prepare down the chain (and around backups skipped as slow).
    /// A skipped backup the primary sends to gets it as a RepairPrepare, which it
    /// journals and acknowledges but does not forward: its successor has it already,
    /// from the primary, and would otherwise receive every prepare twice.
    pub(crate) fn send_chain(&mut self, frame: Frame) {
        let mut repair = None;
        for to in self.prepare_targets() {
            let frame = if self.slow.skipped & (1 << to) != 0 {
                repair
                    .get_or_insert_with(|| Frame::repair_of(frame.as_bytes()))
                    .clone()
            } else {
                frame.clone()
            };
            self.actions.push_back(Action::Send { to, frame });
        }
    }

    fn on_prepare(&mut self, header: &PrepareHeader, body: &[u8], received: Option<&Frame>) {
        if header.frame.view > self.view {
            self.probe_view(header.frame.view);
            return;
        }
        if self.status != Status::Normal || header.frame.view < self.view || self.is_primary() {
            return;
        }
        self.primary_preparing = true;
        // Chain form: forward to our successor before our own (slower) journal write. A
        // received Prepare is byte for byte what sealing header and body again gives.
        let frame = match received {
            Some(frame) if frame.header().command == Command::Prepare as u8 => frame.clone(),
            _ => Frame::build(header, body),
        };
        let op = header.op;
        let identity = header.frame.checksum;
        // A prepare this replica holds already is not forwarded again: its successor had
        // it on the chain's first pass, or from the primary around a backup skipped as
        // slow (whose late forwards would otherwise reach every replica after it twice);
        // a successor that lost it is sent it by the primary's retransmit, which goes to
        // each replica that has not acknowledged.
        let held = op <= self.commit
            || op <= self.log.op_checkpoint
            || (op <= self.log.op
                && self.log.identity(op) == Some(identity)
                && self.log.slot(op).is_some_and(|slot| slot.frame.is_some()));
        if held {
            self.counters.prepares_received_again += 1;
        } else if let Some(to) = self.chain_next(self.config.replica) {
            self.actions.push_back(Action::Send {
                to,
                frame: frame.clone(),
            });
        }
        self.commit_max = self.commit_max.max(header.commit);
        if op <= self.commit || op <= self.log.op_checkpoint {
            self.commit_backup();
            return;
        }
        if op <= self.log.op {
            match self.log.identity(op) {
                Some(known) if known == identity => {
                    let slot = self.log.slot_mut(op);
                    if slot.frame.is_none() {
                        slot.frame = Some(frame.clone());
                        slot.header = Some(*header);
                        self.actions.push_back(Action::JournalAppend { op, frame });
                        self.walk_chain();
                    } else if slot.durable {
                        self.send_prepare_ok(op);
                    }
                }
                Some(_) => self.counters.prepares_refused += 1,
                None => {
                    // Inside a gap: the view's primary stamped it, so it is canonical.
                    self.log.set_canonical(header);
                    self.log.slot_mut(op).frame = Some(frame.clone());
                    self.actions.push_back(Action::JournalAppend { op, frame });
                    self.walk_chain();
                }
            }
        } else if !self.extend_log(header, body, frame) {
            return;
        }
        self.commit_backup();
    }

    /// A prepare this view's primary stamped, above the log: appended when it chains
    /// onto the last op and (SendMessages) carries the stamp its position implies; above
    /// a gap, canonical all the same (the view's primary stamped it), so its identity is
    /// taken and the ops between are repaired by the hash chain. False when refused.
    pub(crate) fn extend_log(&mut self, header: &PrepareHeader, body: &[u8], frame: Frame) -> bool {
        let op = header.op;
        if op == self.log.op + 1 && self.log.identity(self.log.op) == Some(header.parent) {
            if !self.stamp_ok(header, body) {
                self.counters.batch_stamp_mismatch += 1;
                self.counters.prepares_refused += 1;
                return false;
            }
            self.note_position(op, &frame);
            self.log.append(frame.clone());
            self.actions.push_back(Action::JournalAppend { op, frame });
        } else if op > self.log.op + 1 {
            self.log.set_canonical(header);
            self.log.slot_mut(op).frame = Some(frame.clone());
            self.log.op = op;
            self.log.chain_floor = op;
            self.actions.push_back(Action::JournalAppend { op, frame });
            self.walk_chain();
        }
        true
    }

    pub(crate) fn send_prepare_ok(&mut self, op: u64) {
        if !self.voter {
            return;
        }
        let Some(slot) = self.log.slot(op) else {
            return;
        };
        if !slot.durable {
            return;
        }
        let Some(prepare) = slot.header else {
            return;
        };
        let mut header = PrepareOkHeader::new();
        header.frame.cluster = self.config.cluster;
        header.frame.view = self.view;
        header.frame.replica = self.config.replica;
        header.parent = prepare.parent;
        header.prepare_checksum = prepare.frame.checksum;
        header.op = op;
        header.commit = self.commit;
        header.timestamp = prepare.timestamp;
        header.request = prepare.request;
        header.operation = prepare.operation;
        header.group = self.config.group;
        let frame = Frame::build(&header, &[]);
        let to = self.config.primary_of(self.view);
        self.actions.push_back(Action::Send { to, frame });
    }

    fn on_prepare_ok(&mut self, header: &PrepareOkHeader) {
        if self.status != Status::Normal || !self.is_primary() || header.frame.view != self.view {
            return;
        }
        if self.log.identity(header.op) != Some(header.prepare_checksum) {
            return;
        }
        if let Some(pending) = self.pipeline.get_mut(&header.op) {
            pending.acks |= 1 << header.frame.replica;
        }
        self.slow.on_ack(header.frame.replica, header.op);
        self.commit_pipeline();
    }

    pub(crate) fn commit_pipeline(&mut self) {
        assert!(self.is_primary() && self.status == Status::Normal);
        let committed = self.commit;
        loop {
            let op = self.commit + 1;
            let Some(pending) = self.pipeline.get(&op) else {
                break;
            };
            if (pending.acks.count_ones() as usize) < self.config.quorum_replication() {
                break;
            }
            if let Some(pending) = self.pipeline.remove(&op) {
                if pending.prepared_at != NOT_SENT {
                    self.slow.on_commit(op, pending.prepared_at, self.now);
                }
            }
            self.progress_tick = self.now;
            self.commit_max = self.commit_max.max(op);
            self.commit_op(op);
        }
        // A metadata op changes what the backups serve (a session forwarded through one
        // waits for it there; a new topic's partition groups open when it applies): the
        // backups learn the commit now rather than at the next heartbeat. While ops are
        // in flight, the commit that empties the pipeline announces theirs too.
        if self.config.group == METADATA_GROUP
            && self.commit > committed
            && self.pipeline.is_empty()
        {
            self.on_commit_broadcast_timeout();
        }
    }

    /// Applies ops up to commit_max that are in hand (a backup, or a primary catching up).
    pub(crate) fn commit_backup(&mut self) {
        while self.commit < self.commit_max {
            let op = self.commit + 1;
            if op > self.log.op || op < self.log.chain_floor {
                break;
            }
            if !self.log.slot(op).is_some_and(|slot| slot.ready()) {
                break;
            }
            self.commit_op(op);
        }
        self.prune_positions();
        self.try_become_voter();
    }

    /// Commits op `commit + 1`: the only place commit advances.
    pub(crate) fn commit_op(&mut self, op: u64) {
        assert_eq!(op, self.commit + 1, "commit in order");
        assert!(op <= self.commit_max);
        let slot = self.log.slot(op).expect("committing a held op");
        let frame = slot.frame.clone().expect("committing a held body");
        let header = frame_header(&frame);
        assert_eq!(Some(header.frame.checksum), slot.identity);
        assert_eq!(
            Some(header.parent),
            self.log.identity(op - 1).or(Some(header.parent))
        );
        self.commit = op;
        if self.log.released() == Some(op - 1) {
            // The released prepare is no longer the commit point: it is evicted like
            // the ops below it.
            self.log.checkpoint(op - 1);
        }
        if !self.positions.contains_key(&op) {
            self.note_position(op, &frame);
        }
        self.actions.push_back(Action::Commit {
            op,
            prepare: frame.clone(),
        });
        let reply = self.build_reply(&header);
        let primary = self.status == Status::Normal && self.is_primary();
        let client = header.client;
        // Until the op is applied the session holds the reply's header alone.
        let unapplied = Frame::build(&reply, &[]);
        if header.operation == Operation::Register as u8 {
            if let Some(evicted) = self.clients.register(client, op, unapplied) {
                if primary {
                    self.evict(evicted, EvictionReason::StaleClient);
                }
            }
        } else if header.operation == Operation::Logout as u8 {
            self.clients.remove(client);
        } else if self.config.group == METADATA_GROUP {
            self.clients.commit(client, header.request, op, unapplied);
        } else if client != 0 {
            if let Some(evicted) =
                self.clients
                    .commit_request(client, header.request, op, unapplied)
            {
                if primary {
                    self.evict(evicted, EvictionReason::StaleClient);
                }
            }
        }
        // The reply is sealed and sent once the driver reports the op applied.
        self.await_applied(op, reply);
    }

    pub(crate) fn on_commit_broadcast_timeout(&mut self) {
        if self.status != Status::Normal || !self.is_primary() {
            self.timeout_commit_broadcast.stop();
            return;
        }
        // A primary whose pipeline has not moved for a heartbeat timeout (it cannot hear
        // a quorum, though it may still be heard) stops its heartbeat so the backups
        // elect a primary that can make progress.
        if !self.pipeline.is_empty()
            && self.now - self.progress_tick > self.config.heartbeat_timeout_ticks
        {
            return;
        }
        self.heartbeat_sent = self.now.max(self.heartbeat_sent + 1);
        let mut header = CommitHeader::new();
        header.frame.cluster = self.config.cluster;
        header.frame.view = self.view;
        header.frame.replica = self.config.replica;
        header.timestamp_monotonic = self.heartbeat_sent;
        header.commit = self.commit;
        header.group = self.config.group;
        let frame = Frame::build(&header, &[]);
        self.actions.push_back(Action::Broadcast { frame });
        self.commit_broadcasts = match self.commit_broadcasts {
            _ if !self.pipeline.is_empty() => (self.commit, 0),
            (commit, sent) if commit == self.commit => (commit, sent + 1),
            _ => (self.commit, 1),
        };
    }

    fn on_commit_message(&mut self, header: &CommitHeader) {
        if header.frame.view > self.view {
            self.probe_view(header.frame.view);
            return;
        }
        if self.status != Status::Normal
            || header.frame.view < self.view
            || self.is_primary()
            || header.frame.replica != self.config.primary_of(self.view)
        {
            return;
        }
        if header.timestamp_monotonic > self.heartbeat_seen {
            self.heartbeat_seen = header.timestamp_monotonic;
            self.timeout_heartbeat.start(self.now, &mut self.prng);
            self.primary_preparing = false;
        }
        self.commit_max = self.commit_max.max(header.commit);
        self.commit_backup();
    }

    fn on_prepare_retransmit_timeout(&mut self) {
        if self.status != Status::Normal || !self.is_primary() {
            self.timeout_prepare_retransmit.stop();
            return;
        }
        let all = self.all_replicas();
        // Only prepares sent at least half an interval ago: one sent just before the
        // timer fired is not late, and under load every 1 MiB batch in the pipeline would
        // otherwise go out again on each firing.
        let due_before = self
            .now
            .saturating_sub(self.config.prepare_retransmit_interval_ticks / 2);
        let now = self.now;
        let due: Vec<(u64, u32)> = self
            .pipeline
            .iter_mut()
            .filter(|(_, pending)| pending.sent_at <= due_before)
            .map(|(op, pending)| {
                pending.sent_at = now;
                if pending.prepared_at == NOT_SENT {
                    pending.prepared_at = now;
                }
                (*op, pending.acks)
            })
            .collect();
        for (op, acks) in due {
            let Some(frame) = self.prepare_in_view(op) else {
                continue;
            };
            for to in 0..self.config.replica_count {
                if to != self.config.replica && acks & (1 << to) == 0 && all & (1 << to) != 0 {
                    self.actions.push_back(Action::Send {
                        to,
                        frame: frame.clone(),
                    });
                }
            }
        }
    }

    /// The prepare of `op` as the primary sends it in this view: re-stamped in the
    /// current view (the identity leaves view out); in the view it was built in, the
    /// frame as it is.
    pub(crate) fn prepare_in_view(&self, op: u64) -> Option<Frame> {
        let frame = self.log.slot(op).and_then(|s| s.frame.as_ref())?;
        let mut header = frame_header(frame);
        Some(if header.frame.view == self.view {
            frame.clone()
        } else {
            header.frame.view = self.view;
            Frame::build(&header, &frame.as_bytes()[256..])
        })
    }

    pub(crate) fn all_replicas(&self) -> u32 {
        if self.config.replica_count >= 32 {
            u32::MAX
        } else {
            (1u32 << self.config.replica_count) - 1
        }
    }

    pub(crate) fn on_heartbeat_timeout(&mut self) {
        if !self.voter {
            if self.status == Status::Normal && self.census.is_none() {
                self.probe_as_non_voter();
            }
            return;
        }
        if self.status == Status::Normal && !self.is_primary() {
            self.start_view_change(self.view + 1);
        }
    }

    /// Invariants that hold between inputs; a violation is a bug, never bad input.
    pub(crate) fn check_invariants(&self) {
        assert!(self.log_view <= self.view);
        assert!(self.commit <= self.commit_max);
        assert!(self.commit <= self.log.op || self.commit <= self.log.op_checkpoint);
        if self.status == Status::Normal {
            assert_eq!(self.log_view, self.view, "normal status is in log_view");
        }
        if !self.voter {
            assert!(
                self.status != Status::ViewChange,
                "a non-voter never changes views"
            );
            assert!(self.pipeline.is_empty(), "a non-voter is never primary");
            assert!(self.status != Status::Normal || !self.is_primary());
            assert!(self.census.is_none() || self.status == Status::Recovering);
        }
        if let (Some(first), Some(last)) =
            (self.pipeline.keys().next(), self.pipeline.keys().last())
        {
            assert!(self.status == Status::Normal && self.is_primary());
            assert!(*first > self.commit && *last <= self.log.op);
            assert!(self.pipeline.len() as u64 <= super::PIPELINE_MAX);
        }
    }

    /// Timeouts of a Normal replica (primary or backup).
    pub(crate) fn start_normal_timeouts(&mut self) {
        let now = self.now;
        self.primary_preparing = false;
        // Broadcasts of an earlier view told nobody of this one: a primary that led
        // before at the same commit point still owes the new view's backups its Commits
        // before it may sleep.
        self.commit_broadcasts = (0, 0);
        self.slow.reset(now);
        self.timeout_view_change.stop();
        self.timeout_view_change_retransmit.stop();
        self.timeout_probe.stop();
        self.timeout_repair.start(now, &mut self.prng);
        if self.is_primary() {
            self.timeout_heartbeat.stop();
            self.timeout_commit_broadcast.start(now, &mut self.prng);
            self.timeout_prepare_retransmit.start(now, &mut self.prng);
        } else {
            self.timeout_commit_broadcast.stop();
            self.timeout_prepare_retransmit.stop();
            self.timeout_heartbeat.start(now, &mut self.prng);
        }
    }
}
