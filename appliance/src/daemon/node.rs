//! The replica executor's node: every VSR group hosted here, the metadata journal, the
//! partition stores and the metadata state machine, driven by one task. Bus callbacks
//! and the tick only enqueue events; this task executes the groups' actions in order
//! (actions.rs; vsr/mod.rs, "Ordering contract"). Metadata journal writes are awaited
//! before the next action; partition journal writes run in each group's lane beside the
//! loop (group_commit.rs), and the loop drains the lanes before it stops, so no write is
//! in flight when it does. How a node starts is in start.rs, how committed ops are
//! applied and answered in apply.rs, how partition groups start and stop in
//! partition_groups.rs.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::channels::local_channel::{LocalReceiver, LocalSender};
use glommio::channels::shared_channel::ConnectedSender;
use journal::data_dir::DataDir;
use replication::bus::{Bus, ClientId, Handler, VerifiedFrame};
use replication::vsr::{self, Groups, JournalEntry, Replica};
use replication::wire::{
    Command, Frame, Header, PartitionKey, ReplyHeader, RequestHeader, METADATA_GROUP,
};
use zerocopy::FromBytes;

use super::partitions::{self, Partitions};
use super::passwords::{Digest, PasswordThread, VerifiedLogins};
use super::repair_windows::RepairWindows;
use super::system::{slow_step, SLOW_STEP};
use super::DaemonError;
use crate::node_core::forward::{ForwardedClients, Forwards};
use crate::node_core::pending::{PendingTokens, PreparedRequests};
use crate::protocol::{Credentials, Status};
use crate::state::{MetadataOp, MetadataState};

pub use super::start::{
    partition_files_by_limit, partitions_max_by_files, prepare_files_min, Settings,
    OPEN_FILES_RESERVE,
};

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
        /// Kept in `verified_logins` when the check passed.
        remember: Option<Box<Digest>>,
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

/// A lane's IO that completed.
pub(super) struct IoDone {
    pub(super) group: u64,
    pub(super) kind: crate::node_core::Io,
    pub(super) result: Result<(), DaemonError>,
}

/// What wakes the node loop.
enum Input {
    Event(Event),
    Io(IoDone),
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
    pub(super) fn new() -> Latencies {
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
pub(super) const OPENING_MAX: usize = 4;

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
    pub(super) pending_tokens: PendingTokens,
    /// Client requests this node prepared, until their op is applied or discarded.
    pub(super) prepared_requests: PreparedRequests,
    /// When a request was received, by (group, client), for the request latency.
    pub(super) request_started: HashMap<(u64, u128), Instant>,
    pub(super) prepared_at: HashMap<(u64, u64), Instant>,
    pub(super) latencies: Latencies,
    pub(super) started: Instant,
    pub(super) ticks: u64,
    /// The node restarted from durable state (its groups may be behind their peers).
    pub(super) restarted: bool,
    /// For work that completes later (password checks on the password thread).
    pub(super) events: Rc<LocalSender<Event>>,
    pub(super) logins_in_flight: usize,
    /// Runs password checks and hashes, one at a time.
    pub(super) password_thread: PasswordThread,
    /// Logins that checked out lately: the same credentials skip the check.
    pub(super) verified_logins: VerifiedLogins,
    /// Password logins checked and reused (`logins` in /stats).
    pub(super) login_counts: crate::stats::LoginStats,
    /// Backup: Register/Logout requests forwarded to the primary, by nonce.
    pub(super) forwards: Forwards<ClientId>,
    /// Primary: clients whose forwarded Register/Logout is in flight here.
    pub(super) forwarded: ForwardedClients,
    /// Request numbers of internal auto-commit writes.
    pub(super) auto_commits: u64,
    /// Poll reads running on the blocking pool and waiting for a slot.
    pub(super) poll_reads: super::polls::PollReads,
    /// Per topic (stream id, topic id): the round-robin position of Balanced sends.
    pub(super) balanced: HashMap<(u32, u32), u32>,
    /// Each partition group's journal work in flight (group_commit.rs).
    pub(super) lanes: BTreeMap<u64, crate::node_core::Lane>,
    /// Completions of the lanes' IO tasks.
    pub(super) io_done_tx: Rc<LocalSender<IoDone>>,
    pub(super) io_done: LocalReceiver<IoDone>,
    /// Partition groups' superblock writes in flight, and the actions they hold back.
    pub(super) superblocks: super::superblocks::Superblocks,
    /// The statexfer executor's inbox (None: state transfer is off, e.g. in tools).
    pub(super) xfer: Option<Rc<ConnectedSender<super::xfer::ToXfer>>>,
    pub(super) xfer_work: super::xfer::XferWork,
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
    pub(super) retention: crate::node_core::retention::RetentionWork,
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
            if let Some(input) = self.next_input(&events, wake_at).await {
                self.round(input, &events).await?;
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
                self.tick_round(&publish).await?;
            }
        }
    }

    /// The next input of any kind, or None at `wake_at`.
    async fn next_input(&self, events: &LocalReceiver<Event>, wake_at: Instant) -> Option<Input> {
        let wait = wake_at.saturating_duration_since(Instant::now());
        futures_lite::future::or(
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
        .await
    }

    /// One round: `input` and whatever else is already queued, then the actions they
    /// produced.
    async fn round(
        &mut self,
        input: Input,
        events: &LocalReceiver<Event>,
    ) -> Result<(), DaemonError> {
        let round = Instant::now();
        match input {
            Input::Event(event) => self.on_event(event)?,
            Input::Io(done) => self.on_io_done(done)?,
            Input::Superblocks(done) => self.on_superblocks_done(done)?,
        }
        // Whatever else is already queued joins this round, so the journal writes of
        // many requests share one write and one sync (group commit).
        for _ in 0..EVENTS_PER_ROUND_MAX {
            match futures_lite::future::poll_once(events.recv()).await {
                Some(Some(event)) => self.on_event(event)?,
                _ => break,
            }
        }
        while let Some(Some(done)) = futures_lite::future::poll_once(self.io_done.recv()).await {
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
        Ok(())
    }

    /// One tick of every group and of the node's own timers, then its actions.
    async fn tick_round(&mut self, publish: &impl Fn(&Node)) -> Result<(), DaemonError> {
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
        // Every 100 ms; with thousands of groups, every 100 ms per 500 of them (2 s at
        // 10,000): a snapshot walks every group.
        let publish_every = 10 * (self.partitions.by_group.len() as u64 / 500).max(1);
        if self.ticks.is_multiple_of(publish_every) {
            publish(self);
        }
        Ok(())
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
                if super::xfer::is_state_transfer(frame.command()) {
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
                remember,
            } => self.on_login_checked(connection, &request, user, retry, remember),
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
        self.prepared_requests
            .retain_groups(|group| groups.get(group).is_some());
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
        self.close_idle_prepare_logs().await?;
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
        self.sync_partition_files().await
    }

    /// Closes the prepare logs of groups idle for `PREPARES_IDLE_CLOSE` (a few a tick;
    /// the candidates are gathered every `CHECKPOINT_TICKS`), so idle partitions hold no
    /// descriptor.
    async fn close_idle_prepare_logs(&mut self) -> Result<(), DaemonError> {
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
        Ok(())
    }

    /// The tick's syncs of partition logs and consumer offsets not synced per write; a
    /// group that meets a full disk stops, the others go on.
    async fn sync_partition_files(&mut self) -> Result<(), DaemonError> {
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
