//! The replica executor's node: every VSR group hosted here, the metadata journal, the
//! partition stores and the metadata state machine, driven by one task. Bus callbacks
//! and the tick only enqueue events; this task executes the groups' actions in order
//! (vsr/mod.rs, "Ordering contract"). Metadata journal writes are awaited before the
//! next action; partition journal writes run in each group's lane beside the loop
//! (group_commit.rs), and the loop drains the lanes before it stops, so no write is in
//! flight when it does.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::channels::local_channel::{LocalReceiver, LocalSender};
use glommio::channels::shared_channel::ConnectedSender;
use journal::data_dir::DataDir;
use journal::segment::PartitionConfig;
use journal::Durability;
use replication::bus::{Bus, ClientId, Handler, VerifiedFrame};
use replication::vsr::{self, Action, Applied, Groups, JournalEntry, Replica};
use replication::wire::{
    batch, Command, Frame, FrameBuf, Header, Operation, PartitionKey, PrepareHeader, ReplyHeader,
    RequestHeader, METADATA_GROUP,
};
use zerocopy::FromBytes;

use super::files;
use super::forward;
use super::partitions::{self, Partitions};
use super::repair_windows::RepairWindows;
use super::DaemonError;
use crate::protocol::codec::Reader;
use crate::protocol::reply::{
    with_result_section, RegisterReply, SendConfirmation, SendConfirmations,
};
use crate::protocol::users::RawTokenReply;
use crate::protocol::{Credentials, Status};
use crate::state::{Caller, MetadataOp, MetadataState};
use journal::segment::offsets::CONSUMERS_MAX;

/// What the node needs to know about itself and the cluster.
#[derive(Clone, Debug)]
pub struct Settings {
    pub cluster: u128,
    pub cluster_name: String,
    pub replica: u8,
    pub replica_count: u8,
    /// The metadata group's config; partition groups copy it with their group.
    pub vsr: vsr::Config,
    pub data_dir: PathBuf,
    pub partition: PartitionConfig,
    pub offset_durability: Durability,
    /// Client address ("ip:port") of every replica, by id.
    pub client_addresses: BTreeMap<u8, String>,
    /// Every member's addresses, reported in `/stats` as `nodes`.
    pub nodes: Vec<crate::stats::NodeAddresses>,
    pub tick: Duration,
    /// The client plane's own limits ([limits]).
    pub client_limits: super::client::ClientLimits,
    /// The storage budget ([storage]).
    pub budget: super::storage::Budget,
    /// The retention defaults and cadence ([retention]).
    pub retention: super::retention::RetentionSettings,
    /// `limits.stats_groups_max`: groups a bounded `/stats` or `/metrics` lists.
    pub stats_groups_max: usize,
    /// `limits.repair_memory_max`: committed partition prepares kept for repair.
    pub repair_memory_max: u64,
    /// Open files the partitions may hold: the open files limit less
    /// `OPEN_FILES_RESERVE` for connections and the node's own files. No partition
    /// starts past this less `prepare_files_min`.
    pub partition_files_max: usize,
    /// `cluster.spread_primaries`: topics this node creates as the metadata primary
    /// spread their partitions' first leaders over the nodes.
    pub spread_primaries: bool,
}

/// Open files kept free of partitions: connections, the stats server, directory syncs.
pub const OPEN_FILES_RESERVE: u64 = 1024;
/// Open files kept for the prepare logs of partitions being written, past which no
/// partition starts: 1,024, or an eighth of the partitions' files under a small limit.
/// A started partition holds one file (its active segment), and its prepare log while
/// written; with no file left, opening one closes the least recently written idle one
/// first.
pub fn prepare_files_min(partition_files: usize) -> usize {
    (partition_files / 8).min(1024)
}

/// Open files an open files limit of `limit` leaves the partitions (unbounded when the
/// limit is unknown, 0).
pub fn partition_files_by_limit(limit: u64) -> usize {
    if limit == 0 {
        return usize::MAX;
    }
    usize::try_from(limit.saturating_sub(OPEN_FILES_RESERVE)).unwrap_or(usize::MAX)
}

/// Partition groups an open files limit of `limit` leaves room for (unbounded when the
/// limit is unknown, 0).
pub fn partitions_max_by_files(limit: u64) -> usize {
    partitions_within(partition_files_by_limit(limit))
}

/// Partition groups that `files` open files (less `prepare_files_min`) hold.
fn partitions_within(files: usize) -> usize {
    match files {
        usize::MAX => usize::MAX,
        files => files.saturating_sub(prepare_files_min(files)),
    }
}

/// Input to the node task.
pub enum Event {
    Replica(u8, VerifiedFrame),
    Client(ClientId, VerifiedFrame),
    ClientRejected(ClientId, &'static str),
    /// A Request refused by a bus limit before its body was read.
    ClientRefused(ClientId, Box<RequestHeader>, &'static str),
    ClientClosed(ClientId),
    PeerConnected(u8, bool),
    /// A request from the statexfer executor.
    Xfer(super::xfer::FromXfer),
    /// A partition's storage opened in the background (`Node::spawn_open`).
    PartitionOpened {
        group: u64,
        opened: Box<Result<(partitions::Opened, Vec<JournalEntry>), DaemonError>>,
    },
    /// A password check finished on the blocking pool.
    LoginChecked {
        connection: ClientId,
        request: Box<RequestHeader>,
        user: Option<u32>,
        /// The credentials of a first check, for one more on a backup that fails it.
        retry: Option<Box<Credentials>>,
    },
    /// A CreateUser's or ChangePassword's Argon2 work finished on the blocking pool.
    PasswordWorkDone {
        connection: ClientId,
        request: Box<RequestHeader>,
        user: u32,
        op: Box<Result<MetadataOp, Status>>,
    },
    /// A poll's read finished on the blocking pool (polls.rs).
    PollRead {
        connection: ClientId,
        request: Box<RequestHeader>,
        reply: Box<super::polls::PollReply>,
    },
    /// A login a backup failed, checked once more after the failure delay (the user
    /// may have been created or changed in an op this node had not applied yet).
    LoginRetry {
        connection: ClientId,
        request: Box<RequestHeader>,
        credentials: Box<Credentials>,
    },
}

/// What wakes the node loop.
enum Input {
    Event(Event),
    Io(super::group_commit::IoDone),
    Superblocks(super::superblocks::RoundDone),
}

/// The bus's callbacks: enqueue, never block.
pub struct BusHandler {
    pub events: Rc<LocalSender<Event>>,
}

impl Handler for BusHandler {
    fn on_replica_frame(&self, peer: u8, frame: VerifiedFrame) {
        let _ = self.events.try_send(Event::Replica(peer, frame));
    }
    fn on_client_frame(&self, client: ClientId, frame: VerifiedFrame) {
        let _ = self.events.try_send(Event::Client(client, frame));
    }
    fn on_client_rejected(&self, client: ClientId, error: &replication::wire::FrameError) {
        let _ = self
            .events
            .try_send(Event::ClientRejected(client, error.reason()));
    }
    fn on_client_refused(&self, client: ClientId, header: &[u8], reason: &'static str) {
        if let Ok((header, _)) = RequestHeader::read_from_prefix(header) {
            let _ = self
                .events
                .try_send(Event::ClientRefused(client, Box::new(header), reason));
        }
    }
    fn on_peer_connected(&self, peer: u8) {
        let _ = self.events.try_send(Event::PeerConnected(peer, true));
    }
    fn on_peer_disconnected(&self, peer: u8) {
        let _ = self.events.try_send(Event::PeerConnected(peer, false));
    }
    fn on_client_closed(&self, client: ClientId) {
        let _ = self.events.try_send(Event::ClientClosed(client));
    }
}

/// One client connection's login state and its requests in flight.
#[derive(Default)]
pub(super) struct Connection {
    pub user: Option<u32>,
    /// Password checks running for it.
    pub logins: u32,
    /// Replicated requests awaiting their reply, by client id (one each: a client has
    /// one request in flight per session).
    pub pending: HashMap<u128, u64>,
}

/// Latency histograms (microseconds).
pub(super) struct Latencies {
    pub request: hdrhistogram::Histogram<u64>,
    pub prepare_commit: hdrhistogram::Histogram<u64>,
    pub journal_fsync: hdrhistogram::Histogram<u64>,
}

impl Latencies {
    fn new() -> Latencies {
        let histogram = || {
            hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 2)
                .unwrap_or_else(|_| hdrhistogram::Histogram::new(2).expect("valid sigfig"))
        };
        Latencies {
            request: histogram(),
            prepare_commit: histogram(),
            journal_fsync: histogram(),
        }
    }
}

/// Prepare records kept before a checkpoint compacts the prepare log.
pub(super) const PREPARE_RECORDS_KEPT: usize = 4096;

/// Events taken into one round of actions at most (bounds the latency of the first).
const EVENTS_PER_ROUND_MAX: usize = 256;

/// Ticks between partition checkpoint sweeps (with 10 ms ticks: one second). A sweep
/// checkpoints its partitions in rounds, one per tick (checkpoints.rs).
const CHECKPOINT_TICKS: u64 = 100;
/// A partition's prepare log file closes after this long without a record written
/// (an idle partition then holds one open file, its active segment).
const PREPARES_IDLE_CLOSE: Duration = Duration::from_secs(10);
/// Idle prepare logs closed per tick at most (each close syncs the file first).
const PREPARES_CLOSE_PER_TICK: usize = 4;
/// Ticks run per wakeup while the node has nothing in flight (`Node::ticks_may_wait`).
const IDLE_TICK_STRIDE: u32 = 5;

/// Time per tick (and per applied metadata op) spent starting partition groups: about
/// five groups, so a tick's heartbeats and timeouts are never late by more than this.
pub(super) const PARTITION_START_BUDGET: Duration = Duration::from_millis(10);
/// Partitions whose storage opens in the background at once: each task's file calls
/// between two yields hold the node loop up, so few.
const OPENING_MAX: usize = 4;

/// A request unanswered for this long no longer counts toward the request latency.
const REQUEST_LATENCY_AGE_MAX: Duration = Duration::from_secs(60);

pub struct Node {
    pub(super) settings: Settings,
    pub(super) bus: Bus,
    pub(super) groups: Groups,
    pub(super) data: DataDir,
    pub(super) state: MetadataState,
    pub(super) partitions: Partitions,
    pub(super) connections: HashMap<ClientId, Connection>,
    /// The connection each client id last spoke on (replies go there).
    pub(super) client_connections: HashMap<u128, ClientId>,
    /// Personal access tokens this node prepared, by hash, until their op commits: the
    /// reply carries the token, the replicated op only its hash.
    pub(super) pending_tokens: super::client::PendingTokens,
    /// When a request was received, by (group, client), for the request latency.
    pub(super) request_started: HashMap<(u64, u128), Instant>,
    pub(super) prepared_at: HashMap<(u64, u64), Instant>,
    pub(super) latencies: Latencies,
    pub(super) started: Instant,
    pub(super) ticks: u64,
    /// The node restarted from durable state (its groups may be behind their peers).
    pub(super) restarted: bool,
    /// For work that completes later (password checks on the blocking pool).
    pub(super) events: Rc<LocalSender<Event>>,
    pub(super) logins_in_flight: usize,
    /// Backup: Register/Logout requests forwarded to the primary, by nonce.
    pub(super) forwards: HashMap<u128, forward::PendingForward>,
    pub(super) forward_nonces: u64,
    /// Primary: clients whose forwarded Register/Logout is in flight here.
    pub(super) forwarded: HashMap<u128, forward::Forwarded>,
    /// Request numbers of internal auto-commit writes.
    pub(super) auto_commits: u64,
    /// Poll reads running on the blocking pool and waiting for a slot.
    pub(super) poll_reads: super::polls::PollReads,
    /// Per topic (stream id, topic id): the round-robin position of Balanced sends.
    pub(super) balanced: HashMap<(u32, u32), u32>,
    /// Each partition group's journal work in flight (group_commit.rs).
    pub(super) lanes: BTreeMap<u64, super::group_commit::Lane>,
    /// Completions of the lanes' IO tasks.
    pub(super) io_done_tx: Rc<LocalSender<super::group_commit::IoDone>>,
    pub(super) io_done: LocalReceiver<super::group_commit::IoDone>,
    /// Partition groups' superblock writes in flight, and the actions they hold back.
    pub(super) superblocks: super::superblocks::Superblocks,
    /// The statexfer executor's inbox (None: state transfer is off, e.g. in tools).
    pub(super) xfer: Option<Rc<ConnectedSender<super::xfer::ToXfer>>>,
    pub(super) xfer_work: super::xfer_node::XferWork,
    pub(super) xfer_freezes: u64,
    /// Groups fetching state, since when.
    pub(super) transferring: BTreeMap<u64, Instant>,
    /// The highest metadata op applied to `state`.
    pub(super) metadata_applied: u64,
    /// Committed prepares each partition group keeps in memory for repair.
    pub(super) repair_windows: RepairWindows,
    /// Commit-point prepares released from memory (`release_anchors`).
    pub(super) commit_prepares_released: u64,
    /// Prepares were released since the allocator last returned freed memory.
    pub(super) trim_pending: bool,
    /// Partition groups the current checkpoint sweep has yet to visit.
    pub(super) checkpoint_due: std::collections::BTreeSet<u64>,
    /// Groups whose prepare log the next ticks close (idle since a sweep found them).
    pub(super) prepares_closing: Vec<u64>,
    /// Free space, the storage budget and the write refusal (storage.rs).
    pub(super) storage: super::storage::StorageState,
    /// Partition groups whose write met a full disk, to be stopped; and those stopped
    /// until space returns.
    pub(super) stopping: std::collections::BTreeSet<u64>,
    pub(super) paused: BTreeMap<u64, PartitionKey>,
    /// Retention proposals in flight and deletions waiting for a checkpoint.
    pub(super) retention: super::retention::RetentionWork,
    /// Metadata ops up to this one were applied here before this node's metadata group
    /// voted again after losing its state (persisted before the group votes).
    pub(super) replaced_upto: u64,
    /// Partitions of the committed metadata may still wait for their group to start
    /// ([`Node::sync_partitions`] starts them a tick's budget at a time).
    pub(super) partitions_pending: bool,
    /// A partition group could not start for want of file descriptors (logged once
    /// until one starts again).
    pub(super) open_files_exhausted: bool,
}

impl Node {
    /// Rebuilds the node from its data directory: the genesis state, the metadata group
    /// from the VSR superblock and journal (it recovers via RequestStartView), and the
    /// partition groups of the metadata as it commits again.
    pub async fn open(
        settings: Settings,
        bus: Bus,
        data: DataDir,
        events: Rc<LocalSender<Event>>,
        xfer: Option<Rc<ConnectedSender<super::xfer::ToXfer>>>,
    ) -> Result<Node, DaemonError> {
        let repair_windows = RepairWindows::new(settings.repair_memory_max);
        let superblock = match files::read_vsr_superblock(&settings.data_dir) {
            Ok(superblock) => superblock,
            Err(error) if settings.replica_count > 1 => {
                // The promises the superblock held (views, the suffix it installed) are
                // unknown: rejoin as a replacement that votes once it caught up.
                tracing::error!(
                    %error,
                    "VSR superblock unreadable: the metadata group rejoins as a replacement"
                );
                bus.stats().reject("vsr_superblock_unreadable");
                vsr::Superblock {
                    replacement: true,
                    ..vsr::Superblock::default()
                }
            }
            Err(error) => return Err(DaemonError::file(METADATA_GROUP, "VSR superblock")(error)),
        };
        let journal = &data.journal;
        let mut entries = Vec::new();
        for op in journal.op_min().max(1)..=journal.op_head() {
            let bytes = journal.entry(op).ok().map(FrameBuf::from_bytes);
            entries.push(JournalEntry { op, bytes });
        }
        let fresh = entries.is_empty()
            && superblock == vsr::Superblock::default()
            && data.checkpoint.is_none();
        let restarted = !fresh;
        let metadata_applied = data.checkpoint.as_ref().map_or(0, |(info, _)| info.op);
        let (state, replica) = match &data.checkpoint {
            // The state at the last checkpoint, then the journal above it.
            Some((info, payload)) => {
                let fail = |e: String| DaemonError::Corrupt {
                    group: METADATA_GROUP,
                    op: Some(info.op),
                    detail: format!("metadata checkpoint: {e}"),
                };
                let (state, clients, anchor) =
                    files::decode_metadata_checkpoint(payload).map_err(|e| fail(e.into()))?;
                let state = MetadataState::restore(state).map_err(fail)?;
                let clients = vsr::ClientTable::decode(clients, settings.vsr.clients_max)
                    .map_err(|e| fail(e.into()))?;
                let anchor = PrepareHeader::read_from_prefix(anchor)
                    .map(|(header, body)| Frame::build(&header, body))
                    .map_err(|_| fail("anchor is not a prepare".into()))?;
                let checkpoint = vsr::Checkpoint {
                    op: info.op,
                    anchor,
                    // The metadata plane stamps no batches.
                    position: replication::wire::batch::PartitionPosition {
                        partition_id: METADATA_GROUP,
                        next_offset: 0,
                        last_timestamp: 0,
                    },
                    clients,
                };
                let replica = Replica::restart_from_checkpoint(
                    settings.vsr.clone(),
                    &superblock,
                    checkpoint,
                    &entries,
                )
                .ok_or_else(|| fail("anchor is not the prepare of the op".into()))?;
                (state, replica)
            }
            None => {
                let genesis = files::read_genesis(&settings.data_dir)
                    .map_err(DaemonError::file(METADATA_GROUP, "genesis"))?;
                let state = MetadataState::restore(&genesis).map_err(|e| DaemonError::Corrupt {
                    group: METADATA_GROUP,
                    op: None,
                    detail: format!("metadata genesis: {e}"),
                })?;
                let replica = if fresh {
                    // A formatted member: it forms a new cluster with the others only if
                    // none of them remembers anything, else it rejoins as a replacement.
                    Replica::unformed(settings.vsr.clone())
                } else {
                    Replica::restart(settings.vsr.clone(), &superblock, &entries)
                };
                (state, replica)
            }
        };
        tracing::info!(
            ops = entries.len(),
            view = superblock.view,
            fresh,
            "metadata group opened from the journal"
        );
        let mut groups = Groups::new();
        groups.insert(replica);
        // Idle partition groups sleep until traffic, or a silent primary node, wakes them.
        groups.hibernate(
            settings.replica,
            settings.replica_count,
            settings.vsr.heartbeat_timeout_ticks,
        );
        let (io_done_tx, io_done) = glommio::channels::local_channel::new_unbounded();
        let superblocks = super::superblocks::Superblocks::new(settings.data_dir.clone());
        let storage = super::storage::StorageState::open(&settings.data_dir, settings.budget);
        // Unreadable, it is taken as high as it may be: every partition group this node
        // starts empty then waits to catch up before it votes.
        let replaced_upto = files::read_replaced_upto(&settings.data_dir).unwrap_or_else(|error| {
            tracing::error!(%error, "metadata-replaced-upto unreadable");
            u64::MAX
        });
        let mut node = Node {
            settings,
            bus,
            groups,
            data,
            state,
            partitions: Partitions::default(),
            connections: HashMap::new(),
            client_connections: HashMap::new(),
            pending_tokens: Default::default(),
            request_started: HashMap::new(),
            prepared_at: HashMap::new(),
            latencies: Latencies::new(),
            started: Instant::now(),
            ticks: 0,
            restarted,
            events,
            logins_in_flight: 0,
            forwards: HashMap::new(),
            forward_nonces: 0,
            forwarded: HashMap::new(),
            auto_commits: 0,
            poll_reads: Default::default(),
            balanced: HashMap::new(),
            lanes: BTreeMap::new(),
            io_done_tx: Rc::new(io_done_tx),
            io_done,
            superblocks,
            xfer,
            xfer_work: Default::default(),
            xfer_freezes: 0,
            transferring: BTreeMap::new(),
            metadata_applied,
            repair_windows,
            commit_prepares_released: 0,
            trim_pending: false,
            checkpoint_due: std::collections::BTreeSet::new(),
            prepares_closing: Vec::new(),
            storage,
            stopping: std::collections::BTreeSet::new(),
            paused: BTreeMap::new(),
            retention: Default::default(),
            replaced_upto,
            partitions_pending: true,
            open_files_exhausted: false,
        };
        // At start every group opens before the node serves (nothing waits on it yet).
        while node.partitions_pending {
            node.sync_partitions(Duration::MAX).await?;
        }
        node.pump().await?;
        Ok(node)
    }

    /// The node task: events and ticks until shutdown is requested.
    pub async fn run(
        mut self,
        events: LocalReceiver<Event>,
        publish: impl Fn(&Node),
    ) -> Result<Node, DaemonError> {
        let tick = self.settings.tick;
        let mut next_tick = Instant::now() + tick;
        loop {
            if super::system::shutdown_requested() {
                // No journal write is left in flight when the loop stops.
                self.drain_lanes().await?;
                return Ok(self);
            }
            // With nothing in flight the ticks come a stride at a time: one wakeup for
            // several ticks (an idle node's cost is mostly its wakeups). Any input wakes
            // the loop at once.
            let stride = if self.ticks_may_wait() {
                IDLE_TICK_STRIDE
            } else {
                1
            };
            let wake_at = next_tick + tick * (stride - 1);
            let wait = wake_at.saturating_duration_since(Instant::now());
            let input = futures_lite::future::or(
                async { events.recv().await.map(Input::Event) },
                futures_lite::future::or(
                    async { self.io_done.recv().await.map(Input::Io) },
                    futures_lite::future::or(
                        async { self.superblocks.done.recv().await.map(Input::Superblocks) },
                        async {
                            glommio::timer::sleep(wait).await;
                            None
                        },
                    ),
                ),
            )
            .await;
            if let Some(input) = input {
                let round = Instant::now();
                match input {
                    Input::Event(event) => self.on_event(event)?,
                    Input::Io(done) => self.on_io_done(done)?,
                    Input::Superblocks(done) => self.on_superblocks_done(done)?,
                }
                // Whatever else is already queued joins this round, so the journal
                // writes of many requests share one write and one sync (group commit).
                for _ in 0..EVENTS_PER_ROUND_MAX {
                    match futures_lite::future::poll_once(events.recv()).await {
                        Some(Some(event)) => self.on_event(event)?,
                        _ => break,
                    }
                }
                while let Some(Some(done)) =
                    futures_lite::future::poll_once(self.io_done.recv()).await
                {
                    self.on_io_done(done)?;
                }
                while let Some(Some(done)) =
                    futures_lite::future::poll_once(self.superblocks.done.recv()).await
                {
                    self.on_superblocks_done(done)?;
                }
                let events_done = Instant::now();
                self.pump().await?;
                let pumped = Instant::now();
                let xfer = self.xfer_round().await;
                self.absorb_no_space(xfer)?;
                self.pump().await?;
                self.stop_full_groups().await?;
                if round.elapsed() >= SLOW_STEP {
                    tracing::debug!(
                        events_ms = (events_done - round).as_secs_f64() * 1e3,
                        pump_ms = (pumped - events_done).as_secs_f64() * 1e3,
                        rest_ms = pumped.elapsed().as_secs_f64() * 1e3,
                        "slow step: round"
                    );
                }
            }
            // Busy, at most one tick per wakeup, as before: after a stall the ticks it
            // missed are dropped, not run back to back.
            let mut due = 0;
            while Instant::now() >= next_tick && due < stride {
                next_tick += tick;
                due += 1;
            }
            if next_tick < Instant::now() {
                next_tick = Instant::now() + tick;
            }
            for _ in 0..due {
                let started = Instant::now();
                let ticked = self.on_tick().await;
                self.absorb_no_space(ticked)?;
                self.pump().await?;
                self.stop_full_groups().await?;
                self.release_forwards();
                slow_step("tick", started);
                if self.ticks.is_multiple_of(10) {
                    self.forget_stale();
                }
                // Every 100 ms; with thousands of groups, every 100 ms per 500 of them (2 s
                // at 10,000): a snapshot walks every group.
                let publish_every = 10 * (self.partitions.by_group.len() as u64 / 500).max(1);
                if self.ticks.is_multiple_of(publish_every) {
                    publish(&self);
                }
            }
        }
    }

    /// Whether the next ticks may come late, a stride per wakeup: every group that
    /// ticks only waits on its timers (they keep counting ticks, and fire at most a
    /// stride late), and nothing of the node's own is in flight or due soon.
    fn ticks_may_wait(&self) -> bool {
        self.lanes.is_empty()
            && self.checkpoint_due.is_empty()
            && self.partitions.unsynced.is_empty()
            && !self.partitions_pending
            && self.forwards.is_empty()
            && self.forwarded.is_empty()
            && self.transferring.is_empty()
            && self.stopping.is_empty()
            && self.logins_in_flight == 0
            && self.groups.settled()
    }

    fn on_event(&mut self, event: Event) -> Result<(), DaemonError> {
        match event {
            Event::Replica(peer, frame) => {
                if super::xfer_node::is_state_transfer(frame.command()) {
                    self.route_to_xfer(peer, frame);
                    return Ok(());
                }
                if self.on_forward_frame(peer, &frame) {
                    self.bus.recycle(frame.into_buf());
                    return Ok(());
                }
                // A Prepare is kept by the core as received (no copy); other frames are
                // read and their buffers reused.
                let routed = if frame.command() == Command::Prepare {
                    self.groups.on_frame(frame.into_frame())
                } else {
                    let routed = self.groups.on_message(frame.as_bytes());
                    self.bus.recycle(frame.into_buf());
                    routed
                };
                if let Err(error) = routed {
                    self.reject(match error {
                        vsr::RouteError::Invalid => "replica_frame_invalid",
                        vsr::RouteError::NoGroup => "replica_frame_no_group",
                        vsr::RouteError::UnknownGroup { .. } => "replica_frame_unknown_group",
                    });
                }
            }
            Event::Client(connection, frame) => {
                self.on_client_frame(connection, &frame);
                self.bus.recycle(frame.into_buf());
            }
            Event::ClientRejected(connection, reason) => {
                // The bus counted it; the client learns why (docs/client-protocol.md).
                let mut header = ReplyHeader::new();
                header.frame.cluster = self.settings.cluster;
                header.frame.replica = self.settings.replica;
                header.status = Status::InvalidRequest.wire_code(0);
                let frame = Frame::build(&header, reason.as_bytes());
                let _ = self.bus.send_to_client(connection, frame);
            }
            Event::ClientRefused(connection, header, reason) => {
                self.on_client_refused(connection, &header, reason)
            }
            Event::ClientClosed(connection) => {
                self.connections.remove(&connection);
                self.client_connections.retain(|_, c| *c != connection);
            }
            Event::LoginChecked {
                connection,
                request,
                user,
                retry,
            } => self.on_login_checked(connection, &request, user, retry),
            Event::LoginRetry {
                connection,
                request,
                credentials,
            } => self.on_login_retry(connection, &request, *credentials),
            Event::PasswordWorkDone {
                connection,
                request,
                user,
                op,
            } => self.on_password_work_done(connection, &request, user, *op),
            Event::PollRead {
                connection,
                request,
                reply,
            } => self.on_poll_read(connection, &request, *reply),
            Event::Xfer(message) => self.on_xfer(message),
            Event::PeerConnected(peer, up) => self.groups.set_connected(peer, up),
            Event::PartitionOpened { group, opened } => {
                return self.on_partition_opened(group, *opened);
            }
        }
        Ok(())
    }

    /// Bounds the latency bookkeeping: ops that will not commit here (truncated by a view
    /// change) and requests whose client went away are forgotten.
    fn forget_stale(&mut self) {
        let groups = &self.groups;
        self.prepared_at
            .retain(|(group, op), _| groups.get(*group).is_some_and(|r| *op > r.commit()));
        self.request_started
            .retain(|_, at| at.elapsed() < REQUEST_LATENCY_AGE_MAX);
        self.forget_forwarded();
    }

    /// Counts rejected input by reason (shown under `rejected` in /stats).
    pub(super) fn reject(&self, reason: &'static str) {
        self.bus.stats().reject(reason);
    }

    pub(super) fn group_ids(&self) -> Vec<u64> {
        let mut ids = vec![METADATA_GROUP];
        ids.extend(self.partitions.by_group.keys().copied());
        ids
    }

    async fn on_tick(&mut self) -> Result<(), DaemonError> {
        self.ticks += 1;
        if self.ticks.is_multiple_of(super::storage::REFRESH_TICKS) {
            self.refresh_storage().await?;
        }
        // Before the tick's own actions: every Commit so far has been applied.
        if self.ticks.is_multiple_of(CHECKPOINT_TICKS) && self.checkpoint_due.is_empty() {
            self.sweep_checkpoints();
            self.release_anchors();
        }
        self.checkpoint_round().await?;
        self.retention_tick();
        if self.ticks.is_multiple_of(CHECKPOINT_TICKS) && self.prepares_closing.is_empty() {
            self.partitions.forget_closed_prepares();
            let (lanes, by_group) = (&self.lanes, &self.partitions.by_group);
            self.prepares_closing = self
                .partitions
                .prepares_open
                .iter()
                .filter(|group| {
                    lanes.get(group).is_none_or(|lane| lane.idle())
                        && by_group[group]
                            .prepares
                            .open_since_write()
                            .is_some_and(|at| at.elapsed() >= PREPARES_IDLE_CLOSE)
                })
                .copied()
                .collect();
        }
        for _ in 0..PREPARES_CLOSE_PER_TICK {
            let Some(group) = self.prepares_closing.pop() else {
                break;
            };
            let closed = self.close_idle_prepares(group, PREPARES_IDLE_CLOSE).await;
            self.absorb_no_space(closed.map(|_| ()))?;
        }
        let started = Instant::now();
        self.checkpoint_metadata().await?;
        slow_step("metadata checkpoint", started);
        // Redundant headers of the last appends ride on the next append's flush; an idle
        // journal writes them within two ticks (once per tick: a second call would always
        // find the journal idle and flush a busy journal every tick).
        self.data
            .journal
            .tick()
            .await
            .map_err(DaemonError::journal(
                METADATA_GROUP,
                None,
                "journal header flush",
            ))?;
        self.groups.on_tick();
        self.sync_partitions(PARTITION_START_BUDGET).await?;
        let mut full = Vec::new();
        if self.ticks.is_multiple_of(CHECKPOINT_TICKS) {
            // Every write marks its group (the lanes, applied offsets); this sweep only
            // keeps a write that did not from waiting for a checkpoint.
            for (group, partition) in &self.partitions.by_group {
                if partition.log.is_dirty() || partition.offsets.is_dirty() {
                    self.partitions.unsynced.insert(*group);
                }
            }
        }
        let unsynced: Vec<u64> = self.partitions.unsynced.iter().copied().collect();
        for group in unsynced {
            let Some(partition) = self.partitions.by_group.get_mut(&group) else {
                self.partitions.unsynced.remove(&group);
                continue;
            };
            if self.paused.contains_key(&group) {
                continue;
            }
            // Under "every" the group's lane syncs each write (group_commit.rs); a tick's
            // sync would only wait on the disk beside it.
            if !partition.log.syncs_every_batch() {
                if let Err(error) = partition.log.tick().await {
                    match DaemonError::journal(group, None, "partition sync")(error)
                        .stops_group_when_full()
                    {
                        error @ DaemonError::NoSpace { .. } => full.push(error),
                        other => return Err(other),
                    }
                }
            }
            if let Err(error) = partition.offsets.tick() {
                match DaemonError::journal(group, None, "consumer offsets sync")(error)
                    .stops_group_when_full()
                {
                    error @ DaemonError::NoSpace { .. } => full.push(error),
                    other => return Err(other),
                }
            }
            if !partition.log.is_dirty() && !partition.offsets.is_dirty() {
                self.partitions.unsynced.remove(&group);
            }
        }
        for error in full {
            self.absorb_no_space(Err(error))?;
        }
        Ok(())
    }

    /// Executes queued actions until every group is quiet. A partition group's VSR
    /// superblock write holds back that group's later actions only, and runs beside the
    /// loop (superblocks.rs): the group goes on in its own order once it is durable.
    pub(super) async fn pump(&mut self) -> Result<(), DaemonError> {
        let mut actions = self.superblocks.take_released();
        actions.extend(self.groups.drain_actions());
        loop {
            if actions.is_empty() {
                self.superblocks.start_rounds();
                // The round's journal IO starts once its sends and replies are out.
                return self.start_journal_io().await;
            }
            for (group, action) in actions {
                let Some(action) = self.superblocks.hold(group, action) else {
                    continue;
                };
                // A group a full disk stops loses its pending actions with its replica,
                // as in a crash.
                if self.stopping.contains(&group) || self.paused.contains_key(&group) {
                    continue;
                }
                let ordered = self.order_before(group, &action).await;
                if ordered.is_err() {
                    self.absorb_no_space(ordered)?;
                    continue;
                }
                // A partition group's superblock is written beside the loop; the
                // metadata group's goes with its journal superblock (`execute`).
                if let Action::PersistSuperblock(superblock) = &action {
                    if group != METADATA_GROUP {
                        if let Some(partition) = self.partitions.by_group.get(&group) {
                            // Groups that journaled lately go in the busy lane.
                            let busy = self.partitions.prepares_open.contains(&group);
                            self.superblocks.queue(
                                group,
                                partition.dir.clone(),
                                superblock.clone(),
                                busy,
                            );
                        }
                        continue;
                    }
                }
                let kind = match &action {
                    Action::Send { .. } => "action send",
                    Action::Broadcast { .. } => "action broadcast",
                    Action::JournalAppend { .. } => "action journal append",
                    Action::JournalTruncate { .. } => "action journal truncate",
                    Action::PersistSuperblock(_) => "action superblock",
                    Action::Commit { .. } => "action commit",
                    Action::Reply { .. } => "action reply",
                    Action::Evict { .. } => "action evict",
                    Action::StateTransfer { .. } => "action state transfer",
                };
                let started = Instant::now();
                let executed = self.execute(group, action).await;
                self.absorb_no_space(executed)?;
                slow_step(kind, started);
            }
            actions = self.groups.drain_actions();
        }
    }

    async fn execute(&mut self, group: u64, action: Action) -> Result<(), DaemonError> {
        match action {
            Action::Send { to, frame } => {
                let _ = self.bus.send(to, frame);
            }
            Action::Broadcast { frame } => {
                self.bus.broadcast(frame);
            }
            Action::JournalAppend { op, frame } => {
                self.prepared_at.insert((group, op), Instant::now());
                if group != METADATA_GROUP {
                    // Staged, written and reported durable by the round's group commit.
                    return self.partition_append(group, op, frame).await;
                }
                let started = Instant::now();
                let checksum = self.journal_write(op, &frame).await?;
                let _ = self
                    .latencies
                    .journal_fsync
                    .record(started.elapsed().as_micros() as u64);
                if let (Some(replica), Some(checksum)) = (self.groups.get_mut(group), checksum) {
                    replica.on_journal_durable(op, checksum);
                }
            }
            Action::JournalTruncate { op_max } => {
                if group == METADATA_GROUP {
                    self.data.journal.truncate_after(op_max).await.map_err(
                        DaemonError::journal(METADATA_GROUP, Some(op_max + 1), "journal truncate"),
                    )?;
                } else {
                    self.partition_truncate(group, op_max).await?;
                }
            }
            // Only the metadata group's: `pump` writes the partition groups' together.
            Action::PersistSuperblock(superblock) => {
                if group == METADATA_GROUP {
                    self.persist_superblock(&superblock).await?;
                }
            }
            Action::Commit { op, prepare } => {
                if let Some(at) = self.prepared_at.remove(&(group, op)) {
                    let _ = self
                        .latencies
                        .prepare_commit
                        .record(at.elapsed().as_micros() as u64);
                }
                if group == METADATA_GROUP {
                    self.commit_metadata(op, &prepare).await?;
                } else {
                    self.commit_partition(group, op, &prepare).await?;
                }
            }
            Action::Reply { client, frame } => self.send_reply(group, client, frame),
            Action::Evict { client, frame } => self.send_to_client(client, frame),
            Action::StateTransfer { from, op_min } => {
                tracing::info!(group, from, op_min, "group needs state transfer");
                self.start_state_transfer(group, from);
            }
        }
        Ok(())
    }

    /// Writes the prepare of `op` durably: the next op appends; an op at or below the
    /// head rewrites a faulty slot or replaces a discarded suffix.
    async fn journal_write(&mut self, op: u64, frame: &Frame) -> Result<Option<u128>, DaemonError> {
        let journal = &mut self.data.journal;
        let fail = DaemonError::journal(METADATA_GROUP, Some(op), "journal write");
        if op <= journal.op_head() {
            let faulty = journal.faulty().any(|f| f == op);
            // Asked again for an op it holds (the core re-asks ops it never saw reported
            // durable): already durable, nothing to write.
            if !faulty
                && journal
                    .header(op)
                    .is_some_and(|h| h.frame.checksum == frame.checksum())
            {
                return Ok(Some(frame.checksum()));
            }
            if faulty {
                let durable = journal.write_repair(frame.as_bytes()).await.map_err(fail)?;
                return Ok(Some(durable.checksum));
            }
            journal.truncate_after(op - 1).await.map_err(fail)?;
        }
        if op != journal.op_head() + 1 {
            // A gap: the core asked for an op past our head. It is not reported durable,
            // so no PrepareOk goes out for it; repair brings the ops below it first.
            let head = journal.op_head();
            self.reject("journal_append_gap");
            tracing::warn!(op, head, "journal append past the head deferred");
            return Ok(None);
        }
        let durable = journal.append(frame.as_bytes()).await.map_err(fail)?;
        Ok(Some(durable.checksum))
    }

    async fn persist_superblock(
        &mut self,
        superblock: &vsr::Superblock,
    ) -> Result<(), DaemonError> {
        let dir = self.settings.data_dir.clone();
        // Before the group may vote: the ops it applied as a non-voter are on record, so
        // a restart still starts the partition groups they created as replacements.
        let voter_since = self
            .groups
            .get(METADATA_GROUP)
            .map_or(0, |replica| replica.voter_since());
        if !superblock.replacement && voter_since > self.replaced_upto {
            self.with_room(|| {
                files::write_replaced_upto(&dir, voter_since)
                    .map_err(DaemonError::file(METADATA_GROUP, "metadata-replaced-upto"))
            })?;
            self.replaced_upto = voter_since;
        }
        // The reserve is this write's room on a full disk (storage.rs).
        self.with_room(|| {
            files::write_vsr_superblock(&dir, superblock)
                .map_err(DaemonError::file(METADATA_GROUP, "VSR superblock"))
        })?;
        let commit = self
            .groups
            .get(METADATA_GROUP)
            .map_or(0, |replica| replica.commit());
        let current = *self.data.superblock.current();
        let next = journal::Superblock {
            view: superblock.view,
            log_view: superblock.log_view,
            commit: commit.max(current.commit),
            ..current
        };
        self.data
            .superblock
            .write(next)
            .await
            .map_err(DaemonError::journal(
                METADATA_GROUP,
                None,
                "superblock write",
            ))
    }

    async fn commit_metadata(&mut self, op: u64, prepare: &Frame) -> Result<(), DaemonError> {
        let Ok((header, _)) = PrepareHeader::read_from_prefix(prepare.as_bytes()) else {
            return Err(not_a_prepare(METADATA_GROUP, op));
        };
        let body = prepare.as_bytes().get(256..).unwrap_or(&[]);
        let (status, reply_body) = match Operation::from_u8(header.operation) {
            Some(Operation::Register) => (
                Status::Ok,
                RegisterReply::of_this_server(header.user_id, op).encode(),
            ),
            Some(Operation::Logout) => {
                // A client that logs out leaves its consumer groups: its partitions go to
                // the members that remain.
                self.state.leave_groups(header.client);
                (Status::Ok, Vec::new())
            }
            Some(operation) => match MetadataOp::decode(operation, body) {
                Ok(metadata_op) => {
                    let caller = Caller {
                        user_id: header.user_id,
                        client: header.client,
                    };
                    let mut applied = self.state.apply(caller, &metadata_op);
                    if let MetadataOp::CreateToken { hash, .. } = &metadata_op {
                        if let Some(token) = self.pending_tokens.take(hash) {
                            if applied.status == Status::Ok {
                                applied.body = RawTokenReply { token }.encode();
                            }
                        }
                    }
                    let truncated: Vec<PartitionKey> = match &metadata_op {
                        MetadataOp::TruncatePartition { partition, .. } => vec![*partition],
                        MetadataOp::Purge { partitions } => {
                            partitions.iter().map(|(key, _)| *key).collect()
                        }
                        _ => Vec::new(),
                    };
                    for partition in truncated {
                        self.on_retention_commit(partition);
                        if let Ok(group) = partition.pack() {
                            self.delete_retained(group)?;
                        }
                    }
                    (applied.status, applied.body)
                }
                Err(error) => {
                    // Every replica decodes the same bytes the same way: a refusal here
                    // is deterministic and leaves the state unchanged everywhere.
                    tracing::error!(op, %error, "committed metadata op does not decode");
                    (Status::InvalidRequest, Vec::new())
                }
            },
            None => (Status::InvalidRequest, Vec::new()),
        };
        self.on_applied(METADATA_GROUP, op, header.operation, status, reply_body);
        self.metadata_applied = op;
        self.partitions_pending = true;
        self.sync_partitions(PARTITION_START_BUDGET).await
    }

    async fn commit_partition(
        &mut self,
        group: u64,
        op: u64,
        prepare: &Frame,
    ) -> Result<(), DaemonError> {
        let Ok((header, _)) = PrepareHeader::read_from_prefix(prepare.as_bytes()) else {
            return Err(not_a_prepare(group, op));
        };
        if !self.partitions.by_group.contains_key(&group) {
            self.on_applied(group, op, header.operation, Status::NotFound, Vec::new());
            return Ok(());
        }
        // Normally journaled at prepare time (its write may still be in flight: reads
        // serve what is committed, so it lands first); an op whose append was deferred
        // (a gap) is journaled now, in order, before it is applied.
        self.wait_written(group, op).await?;
        if !self.journaled(group, op, prepare.checksum())
            && self.partition_journal(group, op, prepare).await?.is_none()
        {
            return Err(DaemonError::Internal {
                group,
                op: Some(op),
                detail: "the committed op cannot be journaled",
            });
        }
        let Some(partition) = self.partitions.by_group.get_mut(&group) else {
            return Ok(());
        };
        let body = prepare.as_bytes().get(256..).unwrap_or(&[]);
        let invalid = |source| DaemonError::Batch {
            group,
            op,
            what: "committed batch",
            source,
        };
        let offsets_failed = DaemonError::journal(group, Some(op), "consumer offsets");
        let (status, reply_body) = match Operation::from_u8(header.operation) {
            Some(Operation::SendMessages) => {
                // Verified when it was received or stamped, and again when journaled.
                let info = batch::info_of_verified(body).map_err(invalid)?;
                partition.committed_end = info.next_offset();
                let key = partition.key;
                let reply = SendConfirmations {
                    confirmations: vec![SendConfirmation {
                        stream_id: key.stream,
                        topic_id: key.topic,
                        partition_id: key.partition,
                        base_offset: info.base_offset,
                    }],
                };
                (Status::Ok, reply.encode())
            }
            Some(Operation::StoreConsumerOffset) | Some(Operation::DeleteConsumerOffset) => {
                self.partitions.unsynced.insert(group);
                self.partitions.grown = true;
                apply_offset_op(partition, header.operation, body).map_err(offsets_failed)?
            }
            _ => (Status::InvalidRequest, Vec::new()),
        };
        partition.committed_op = op;
        self.on_applied(group, op, header.operation, status, reply_body);
        // Committed prepares are in the segment log now: keep only a repair window of
        // them in memory (older ones are answered RangeEvicted).
        let ops_min = self.settings.vsr.pipeline_max + 1;
        let bytes = prepare.as_bytes().len() as u64;
        for (group, floor) in self.repair_windows.push(group, op, bytes, ops_min) {
            if let Some(replica) = self.groups.get_mut(group) {
                let floor = floor.min(replica.commit());
                if floor > replica.log().op_min() {
                    replica.on_checkpoint(floor);
                }
            }
        }
        Ok(())
    }

    /// Hands a committed op's result to its group's core (every committed op, in
    /// order): the core seals the reply with it, keeps it in the client table for
    /// retries (checkpointed with the table), and returns it when this node is the
    /// primary. The status and body are the client's: its own operation's wire code and
    /// result section. A token's secret is not kept (a retry gets the status alone).
    fn on_applied(&mut self, group: u64, op: u64, operation: u8, status: Status, body: Vec<u8>) {
        let operation = client_operation(operation);
        let body = if status == Status::Ok {
            with_result_section(operation, &body).into_owned()
        } else {
            body
        };
        let applied = Applied {
            status: status.wire_code(operation),
            body: &body,
            keep_body: operation != Operation::CreatePersonalAccessToken as u8,
        };
        let reply = self
            .groups
            .get_mut(group)
            .and_then(|replica| replica.on_applied(op, applied));
        if let Some((client, frame)) = reply {
            self.send_reply(group, client, frame);
        }
    }

    /// A reply of the core (sealed at apply, or a retry's copy from the client table),
    /// to the client waiting for it: a forwarded session's result goes back to the
    /// backup that forwarded it.
    fn send_reply(&mut self, group: u64, client: u128, frame: Frame) {
        let frame = client_reply(group, frame);
        if group == METADATA_GROUP && self.forward_reply(client, &frame) {
            return;
        }
        if let Some(at) = self.request_started.remove(&(group, client)) {
            let _ = self
                .latencies
                .request
                .record(at.elapsed().as_micros() as u64);
        }
        self.reply_to_waiting(client, frame);
    }

    /// Sends a reply only where the client waits for it: on its connection with that
    /// request pending. A commit reached while the request is only on its way (a new
    /// primary committing the old view's pipeline) is not sent: the request, when it
    /// arrives, gets the client table's copy, the one reply the client reads for it. Sent
    /// twice, the second would be read as the answer to the client's next request.
    fn reply_to_waiting(&mut self, client: u128, frame: Frame) {
        let Ok((header, _)) = ReplyHeader::read_from_prefix(frame.as_bytes()) else {
            return;
        };
        let waiting = self
            .client_connections
            .get(&client)
            .and_then(|connection| self.connections.get(connection))
            .is_some_and(|entry| entry.pending.get(&client) == Some(&header.request));
        if waiting {
            self.send_to_client(client, frame);
        }
    }

    pub(super) fn send_to_client(&mut self, client: u128, frame: Frame) {
        if let Some(connection) = self.client_connections.get(&client) {
            if let Some(entry) = self.connections.get_mut(connection) {
                entry.pending.remove(&client);
            }
            let _ = self.bus.send_to_client(*connection, frame);
        }
    }

    /// Opens storage and a VSR group for the partitions the committed metadata holds that
    /// have none yet, for at most `budget` (then the next tick goes on): a topic of
    /// thousands of partitions starts over many ticks instead of stalling the node loop,
    /// so no group's heartbeats or timeouts wait on it. Until its group starts, a
    /// partition answers its clients Unavailable (they retry).
    pub(super) async fn sync_partitions(&mut self, budget: Duration) -> Result<(), DaemonError> {
        if !self.partitions_pending {
            return Ok(());
        }
        // At start (no budget) the groups open here, in order. Later a new partition
        // (nothing on disk yet: a few files to create) opens here within the tick's
        // budget, so a small topic is writable when its creation is acknowledged; a
        // partition that holds data (its log's tail scan and records' read-back take a
        // while) opens in a task of its own, a few at a time, while the loop goes on.
        let inline = budget == Duration::MAX;
        let started = Instant::now();
        for key in self.state.partitions() {
            let Ok(group) = key.pack() else {
                continue;
            };
            if self.partitions.by_group.contains_key(&group)
                || self.partitions.opening.contains(&group)
            {
                continue;
            }
            let here = inline || !partitions::partition_dir(&self.settings.data_dir, key).exists();
            if (here && started.elapsed() >= budget)
                || (!here && self.partitions.opening.len() >= OPENING_MAX)
            {
                return Ok(());
            }
            let held = self.partitions.by_group.len() + self.partitions.opening.len();
            let partitions_max = partitions_within(self.settings.partition_files_max);
            if held >= partitions_max {
                // Out of file descriptors: the partition stays Unavailable here and its
                // start is tried again next tick; the node goes on serving the others.
                self.out_of_open_files(&format!(
                    "partition {key:?}: {held} partitions hold the files the open files \
                     limit leaves them (os error 24)"
                ));
                return Ok(());
            }
            if !here {
                self.spawn_open(key, group);
                continue;
            }
            match self.start_partition_group(key, group).await {
                Ok(()) => self.open_files_exhausted = false,
                Err(error) if error.is_out_of_open_files() => {
                    self.out_of_open_files(&error);
                    return Ok(());
                }
                Err(other) => return Err(other),
            }
        }
        if self.partitions.opening.is_empty() {
            self.partitions_pending = false;
        }
        Ok(())
    }

    /// The answer for a partition without storage here: Unavailable while its group is
    /// starting (the client retries), else NotFound.
    pub(super) fn missing_partition(&self, key: PartitionKey) -> Status {
        if self.partition_starting(key) {
            Status::Unavailable
        } else {
            Status::NotFound
        }
    }

    /// Whether `key` is a partition of the committed metadata whose group has not
    /// started here yet.
    pub(super) fn partition_starting(&self, key: PartitionKey) -> bool {
        self.partitions_pending
            && self.state.has_partition(key)
            && key
                .pack()
                .is_ok_and(|g| !self.partitions.by_group.contains_key(&g))
    }

    /// Opens a partition's storage and starts its VSR group as the storage left it
    /// (at start, when the metadata creates it, and after a state transfer).
    pub(super) async fn start_partition_group(
        &mut self,
        key: PartitionKey,
        group: u64,
    ) -> Result<(), DaemonError> {
        let opened = self.open_partition(key, group).await?;
        let entries = journal_entries(group, &opened).await?;
        self.install_partition_group(group, opened, &entries)
    }

    /// Starts the VSR group of a partition whose storage `opened` is, replaying `entries`
    /// (its prepare records read back).
    fn install_partition_group(
        &mut self,
        group: u64,
        opened: partitions::Opened,
        entries: &[JournalEntry],
    ) -> Result<(), DaemonError> {
        let key = opened.partition.key;
        let mut config = self.settings.vsr.clone();
        config.group = group;
        config.initial_view = self.state.initial_view(key, self.settings.replica_count);
        let mut replica = self.partition_replica(config, &opened, entries)?;
        for peer in (0..self.settings.replica_count).filter(|p| *p != self.settings.replica) {
            replica.set_connected(peer, self.bus.is_connected(peer));
        }
        tracing::info!(
            ?key,
            group,
            checkpoint = opened.partition.checkpoint_op,
            journaled = opened.records.len(),
            end = opened.partition.committed_end,
            "partition group started"
        );
        // The prepare of its checkpoint, read back, counts against the repair windows'
        // bound like the prepares it commits from now on.
        let anchor = opened.checkpoint.as_ref().and_then(|stored| {
            let frame = replica.log().slot(stored.op)?.frame.as_ref()?;
            Some((stored.op, frame.as_bytes().len() as u64))
        });
        self.groups.insert(replica);
        self.partitions.by_group.insert(group, opened.partition);
        self.repair_windows.remove(group);
        if let Some((op, bytes)) = anchor {
            self.repair_windows.hold_anchor(group, op, bytes);
        }
        // Segments below the retained offset may be left from before (a restart, a
        // state transfer): they go once the checkpoint allows.
        self.retention.to_delete.insert(group);
        Ok(())
    }

    /// Opens a partition's storage in a task of its own, off the node loop (the log's
    /// tail scan and the prepare records' read-back take a while for a partition that
    /// holds data); `Event::PartitionOpened` brings it back.
    fn spawn_open(&mut self, key: PartitionKey, group: u64) {
        self.partitions.opening.insert(group);
        let (data_dir, config, offsets) = (
            self.settings.data_dir.clone(),
            self.settings.partition,
            self.settings.offset_durability,
        );
        let events = self.events.clone();
        glommio::spawn_local(async move {
            let opened = async {
                let opened = partitions::open(&data_dir, key, group, config, offsets).await?;
                let entries = journal_entries(group, &opened).await?;
                Ok((opened, entries))
            }
            .await;
            // Unbounded: refused only once the node stopped.
            let _ = events.try_send(Event::PartitionOpened {
                group,
                opened: Box::new(opened),
            });
        })
        .detach();
    }

    /// A partition's storage opened by `spawn_open`: its group starts now. A partition
    /// that met the open files limit waits for the next tick, as in `sync_partitions`.
    fn on_partition_opened(
        &mut self,
        group: u64,
        opened: Result<(partitions::Opened, Vec<JournalEntry>), DaemonError>,
    ) -> Result<(), DaemonError> {
        self.partitions.opening.remove(&group);
        match opened {
            Ok((opened, entries)) => {
                self.open_files_exhausted = false;
                self.install_partition_group(group, opened, &entries)
            }
            Err(error) if error.is_out_of_open_files() => {
                self.out_of_open_files(&error);
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    pub(super) fn out_of_open_files(&mut self, error: &dyn std::fmt::Display) {
        self.reject("open_files_limit");
        if !std::mem::replace(&mut self.open_files_exhausted, true) {
            tracing::error!(
                %error,
                "out of open files: partition groups wait to start until files \
                 are free (raise LimitNOFILE: one per partition, two while written)"
            );
        }
    }

    /// Opens a partition's storage (partitions::open) with this node's settings.
    pub(super) async fn open_partition(
        &self,
        key: PartitionKey,
        group: u64,
    ) -> Result<partitions::Opened, DaemonError> {
        partitions::open(
            &self.settings.data_dir,
            key,
            group,
            self.settings.partition,
            self.settings.offset_durability,
        )
        .await
    }

    /// The consensus group of a partition as its storage left it: fresh; restarted from
    /// its checkpoint with the prepares recorded above it; or replaying its records from
    /// op 1 when it never checkpointed.
    fn partition_replica(
        &self,
        config: vsr::Config,
        opened: &partitions::Opened,
        entries: &[JournalEntry],
    ) -> Result<Replica, DaemonError> {
        let group = config.group;
        if let Some(stored) = &opened.checkpoint {
            let fail = |detail: String| DaemonError::Corrupt {
                group,
                op: Some(stored.op),
                detail,
            };
            let anchor = entries
                .iter()
                .find(|e| e.op == stored.op)
                .and_then(|e| e.bytes.as_ref())
                .and_then(|b| {
                    let (header, body) = PrepareHeader::read_from_prefix(b.as_bytes()).ok()?;
                    Some(Frame::build(&header, body))
                })
                .ok_or_else(|| fail("the checkpoint has no prepare".into()))?;
            let clients = vsr::ClientTable::decode(&stored.clients, config.clients_max)
                .map_err(|e| fail(format!("checkpoint client table: {e}")))?;
            let checkpoint = vsr::Checkpoint {
                op: stored.op,
                anchor,
                position: stored.position,
                clients,
            };
            return Replica::restart_from_checkpoint(
                config,
                &opened.superblock,
                checkpoint,
                entries,
            )
            .ok_or_else(|| fail("the checkpoint's anchor is invalid".into()));
        }
        let metadata = self.groups.get(METADATA_GROUP);
        let metadata_votes = metadata.is_none_or(|replica| replica.is_voter());
        // The core may have become a voter while the commits it made as a non-voter are
        // still being applied: those ops count as applied before it voted.
        let replaced_upto = self
            .replaced_upto
            .max(metadata.map_or(0, |replica| replica.voter_since()));
        let before_voting =
            !metadata_votes || (replaced_upto > 0 && self.metadata_applied <= replaced_upto);
        if entries.is_empty()
            && opened.superblock == vsr::Superblock::default()
            && before_voting
            && self.settings.replica_count > 1
        {
            // Created while this node's metadata group catches up after losing its
            // state: the lost state may have held this group and made promises in it.
            return Ok(Replica::replacement(config));
        }
        if !entries.is_empty()
            || opened.superblock != vsr::Superblock::default()
            || (self.settings.replica_count > 1 && self.restarted)
        {
            // Recorded prepares replay from op 1 (their batches are already in the log);
            // with none, a restarted member of a cluster probes for the view and repairs.
            return Ok(Replica::restart(config, &opened.superblock, entries));
        }
        let mut replica = Replica::new(config);
        replica.seed_partition_position(opened.partition.log.position());
        Ok(replica)
    }

    /// Truncates a partition group's journal above `op_max` (a view change discarded
    /// the uncommitted suffix).
    async fn partition_truncate(&mut self, group: u64, op_max: u64) -> Result<(), DaemonError> {
        let Some(partition) = self.partitions.by_group.get_mut(&group) else {
            return Ok(());
        };
        if op_max < partition.committed_op {
            self.bus.stats().reject("partition_truncate_committed");
            tracing::error!(group, op_max, "refused to truncate committed partition ops");
            return Ok(());
        }
        partition.truncate_after(group, op_max).await
    }

    /// Checkpoints the metadata state once half the journal ring is used since the last
    /// checkpoint, so the ring wraps instead of filling: the state machine, the client
    /// table and the anchor prepare go into a snapshot, then the superblock names it.
    /// Called only when every Commit action has been executed.
    async fn checkpoint_metadata(&mut self) -> Result<(), DaemonError> {
        let journal = &self.data.journal;
        let slots = journal.layout().slot_count;
        let (op_checkpoint, op_head) = (journal.op_checkpoint(), journal.op_head());
        let Some(replica) = self.groups.get(METADATA_GROUP) else {
            return Ok(());
        };
        let commit = replica.commit().min(op_head);
        if op_head.saturating_sub(op_checkpoint) < slots / 2 || commit <= op_checkpoint {
            return Ok(());
        }
        if commit != replica.commit() || journal.faulty().any(|op| op <= commit) {
            return Ok(());
        }
        let Some(checkpoint) = replica.checkpoint() else {
            return Ok(());
        };
        let payload = files::encode_metadata_checkpoint(
            &self.state.snapshot(),
            &checkpoint.clients.encode(),
            checkpoint.anchor.as_bytes(),
        );
        let fail = DaemonError::journal(METADATA_GROUP, Some(checkpoint.op), "metadata checkpoint");
        let mut written = self
            .data
            .checkpoint(checkpoint.op, &payload)
            .await
            .map_err(fail);
        if let Err(error) = &written {
            if !error.is_no_space() {
                return written.map(|_| ());
            }
            // The reserve is this write's room (storage.rs); without it, the next tick
            // tries again while the journal still has free slots.
            self.storage.on_no_space(error);
            written = self
                .data
                .checkpoint(checkpoint.op, &payload)
                .await
                .map_err(fail);
        }
        let info = match written {
            Ok(info) => info,
            Err(error) if error.is_no_space() => {
                self.reject("metadata_checkpoint_no_space");
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        tracing::info!(
            group = METADATA_GROUP,
            op = info.op,
            bytes = info.len,
            "metadata checkpoint"
        );
        // Prepares the journal no longer holds cannot be served from memory either.
        let floor = self.data.journal.op_min().saturating_sub(1);
        if let Some(replica) = self.groups.get_mut(METADATA_GROUP) {
            if floor > replica.log().op_min() && floor <= replica.commit() {
                replica.on_checkpoint(floor);
            }
        }
        Ok(())
    }

    /// Closes the prepare log file of `group` if it is still idle (its lane has
    /// nothing in flight, no record written for `idle`). Returns whether it closed.
    pub(super) async fn close_idle_prepares(
        &mut self,
        group: u64,
        idle: Duration,
    ) -> Result<bool, DaemonError> {
        if self.paused.contains_key(&group) || self.lanes.get(&group).is_some_and(|l| !l.idle()) {
            return Ok(false);
        }
        let Some(partition) = self.partitions.by_group.get_mut(&group) else {
            self.partitions.prepares_open.remove(&group);
            return Ok(true);
        };
        match partition.prepares.close_idle(idle).await {
            Ok(true) => {
                self.partitions.prepares_open.remove(&group);
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(error) => Err(DaemonError::prepare_log(group, None)(error).stops_group_when_full()),
        }
    }

    /// Flushes and closes storage (shutdown).
    pub async fn close(mut self) -> Result<(), DaemonError> {
        self.drain_lanes().await?;
        for (group, mut partition) in self.partitions.by_group {
            let _ = partition.offsets.flush();
            partition
                .prepares
                .close()
                .await
                .map_err(DaemonError::prepare_log(group, None))?;
            partition.log.close().await.map_err(DaemonError::journal(
                group,
                None,
                "partition close",
            ))?;
        }
        self.data
            .close()
            .await
            .map_err(DaemonError::journal(METADATA_GROUP, None, "journal close"))
    }

    pub(super) fn metadata(&self) -> Option<&Replica> {
        self.groups.get(METADATA_GROUP)
    }

    pub(super) fn partition_key(group: u64) -> Option<PartitionKey> {
        match replication::wire::group_kind(group) {
            Ok(replication::wire::GroupKind::Partition(key)) => Some(key),
            _ => None,
        }
    }
}

/// A step of the replica executor longer than this is logged at debug (what held up
/// commits, when an operator looks for it).
const SLOW_STEP: Duration = Duration::from_millis(15);

/// The prepare records of an opened partition with their frames read back from its
/// log, for its replica to replay. Yields after each read: a partition that holds many
/// records does not hold up the node loop.
async fn journal_entries(
    group: u64,
    opened: &partitions::Opened,
) -> Result<Vec<JournalEntry>, DaemonError> {
    let mut entries = Vec::with_capacity(opened.records.len());
    for record in &opened.records {
        let bytes = partitions::frame_of(group, &opened.partition.log, record)?;
        entries.push(JournalEntry {
            op: record.op(),
            bytes: Some(bytes),
        });
        futures_lite::future::yield_now().await;
    }
    Ok(entries)
}

/// A committed frame of `group` at `op` that is not a prepare.
fn not_a_prepare(group: u64, op: u64) -> DaemonError {
    DaemonError::Corrupt {
        group,
        op: Some(op),
        detail: "the committed frame is not a prepare".into(),
    }
}

/// Logs `step` at debug if it took SLOW_STEP or longer since `started`.
pub(super) fn slow_step(step: &'static str, started: Instant) {
    let took = started.elapsed();
    if took >= SLOW_STEP {
        tracing::debug!(step, ms = took.as_secs_f64() * 1e3, "slow step");
    }
}

/// Applies a committed StoreConsumerOffset or DeleteConsumerOffset: a delete of an
/// offset that is not stored is NotFound; a store for a consumer past the partition's
/// `CONSUMERS_MAX` is LimitReached.
fn apply_offset_op(
    partition: &mut partitions::Partition,
    operation: u8,
    body: &[u8],
) -> journal::Result<(Status, Vec<u8>)> {
    let mut r = Reader::new(body);
    let kind = r.u8("consumer_kind");
    let id = r.u32("consumer_id");
    let consumer = match (kind, id) {
        (Ok(0), Ok(id)) => crate::protocol::Consumer::Single(id),
        (Ok(1), Ok(id)) => crate::protocol::Consumer::Group(id),
        _ => return Ok((Status::InvalidRequest, Vec::new())),
    };
    let key = partitions::consumer_key(consumer);
    // Decided from the applied state alone, so every replica answers alike (what
    // store and delete return is whether the table is synced now, not the outcome).
    let known = partition.offsets.get(key).is_some();
    if operation == Operation::StoreConsumerOffset as u8 {
        let Ok(offset) = r.u64("offset") else {
            return Ok((Status::InvalidRequest, Vec::new()));
        };
        if !known && partition.offsets.all().len() >= CONSUMERS_MAX {
            return Ok((Status::LimitReached, b"consumers".to_vec()));
        }
        partition.offsets.store(key, offset)?;
    } else {
        if !known {
            return Ok((Status::NotFound, Vec::new()));
        }
        partition.offsets.delete(key)?;
    }
    Ok((Status::Ok, Vec::new()))
}

/// The client-facing operation of a prepared one (docs/protocol.md, "Replication": the
/// primary replaces some requests with internal operations).
/// A reply as the client reads it: its own operation, and on a partition group its own
/// request number (the core numbers a partition's requests per session).
fn client_reply(group: u64, frame: Frame) -> Frame {
    let Ok((mut header, body)) = ReplyHeader::read_from_prefix(frame.as_bytes()) else {
        return frame;
    };
    header.operation = client_operation(header.operation);
    if group != METADATA_GROUP {
        header.request = super::client::client_request_number(header.request);
    }
    Frame::build(&header, body)
}

fn client_operation(operation: u8) -> u8 {
    match Operation::from_u8(operation) {
        Some(Operation::CreateTopicWithAssignments) => Operation::CreateTopic as u8,
        Some(Operation::CreatePartitionsWithAssignments) => Operation::CreatePartitions as u8,
        Some(Operation::TruncatePartition) => Operation::DeleteSegments as u8,
        _ => operation,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_open_files_limit_leaves_room_for_connections_before_partitions() {
        assert_eq!(
            super::partitions_max_by_files(0),
            usize::MAX,
            "unknown limit"
        );
        assert_eq!(super::partitions_max_by_files(20_000), 17_952);
        assert_eq!(super::partitions_max_by_files(65_536), 63_488);
        assert_eq!(super::partition_files_by_limit(20_000), 18_976);
        assert_eq!(
            super::partitions_max_by_files(1_024 + 120),
            105,
            "small limit"
        );
        assert_eq!(
            super::partitions_max_by_files(1_000),
            0,
            "below the reserve"
        );
    }
}
