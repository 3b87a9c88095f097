//! The replica value: its state, accessors, inputs (ticks, frames, durable journal
//! appends) dispatched to the protocol's parts, and the invariants that hold between
//! inputs. Normal operation is in `normal.rs`, view changes in `view_change.rs`.

use std::collections::{BTreeMap, VecDeque};

use crate::wire::batch::PartitionPosition;
use crate::wire::{decode, decode_trusted, Frame, Limits, Message, PrepareHeader};

use super::client_table::ClientTable;
use super::log::Log;
use super::slow_peers::SlowPeers;
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

/// The census of a non-voter: what the other replicas answered (`replacement.rs`).
#[derive(Clone, Debug)]
pub(crate) struct Census {
    pub(crate) nonce: u128,
    /// Per replica: the view reported by a member that remembers.
    pub(crate) views: Vec<Option<u32>>,
    /// Replicas that answered as non-voters themselves (bitmask).
    pub(crate) blank: u32,
    /// Some frame showed that the group formed (a view above 0, an op or a commit).
    pub(crate) formed: bool,
    /// Still deciding between a new group and a replacement.
    pub(crate) formation: bool,
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
    pub(crate) slow: SlowPeers,
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
    pub(crate) census: Option<Census>,
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
}
