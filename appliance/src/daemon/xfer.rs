//! The "statexfer" executor (docs/architecture.md; docs/protocol.md, "State transfer"):
//! its own thread, so reading, hashing and writing bulk state never stalls consensus.
//!
//! - Server: a RequestStateTransfer asks the replica executor to freeze the group at its
//!   commit point (hard links to the segment files and the committed length of each,
//!   the consumer offsets, the metadata snapshot and the client table as bytes); this
//!   thread hashes the frozen artifacts into a manifest and answers; until then it
//!   answers "unavailable, transient". Chunks are read from the frozen offer the
//!   requester's nonce was given, so a newer freeze never changes a transfer under way.
//! - Fetcher: one `statexfer::Fetcher` per group that asked, staging artifacts beside the
//!   live directory (sealed segments this node already holds are copied locally when
//!   they match the manifest), then turning the staged artifacts into a complete
//!   partition directory (segments, indexes rebuilt, consumer offsets, checkpoint and
//!   anchor prepare record), synced, before the replica executor swaps it in.
//!
//! The replica executor owns the bus: frames travel between the two threads over
//! bounded shared channels (`ToXfer`, `FromXfer`). The server's offers are in
//! `xfer/offers.rs`, the fetcher's staging and install in `xfer/staging.rs`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use glommio::channels::shared_channel::{ConnectedSender, SharedReceiver, SharedSender};
use journal::segment::log::SEALED_SCAN_WINDOW;
use journal::segment::PartitionConfig;
use replication::wire::{
    Command, Frame, FrameBuf, FrameHeader, RequestStateChunkHeader, RequestStateTransferHeader,
    StateChunkHeader, StateTransferTargetHeader, HEADER_SIZE,
};
use statexfer::install::FileSink;
use statexfer::{Fetcher, FetcherConfig, Manifest, Offers, Outcome, Server};
use zerocopy::FromBytes;

use super::files::{self};
use super::prepares::{self};
use super::DaemonError;
use crate::stats::StateTransferStats;

mod offers;
mod staging;

pub use offers::Links;
use offers::{offer_policy, Hashes};
use staging::{materialize_partition, sync_staged, StagingSink};

/// The statexfer executor's tick (fetcher stall detection, progress publishing).
pub const TICK: Duration = Duration::from_millis(50);
/// The tick of an idle statexfer thread (nothing fetched, served, frozen or offered).
const IDLE_TICK: Duration = Duration::from_secs(1);
/// A frozen offer is handed to new transfers for this long; then a fresh one is taken.
const OFFER_FRESH: Duration = Duration::from_secs(1);
/// A group's freezes replaced in a row because they were stale once hashed (the
/// cluster may grow the open segment faster than the paced hashing reads it).
const REFREEZES_MAX: u32 = 2;
/// A transfer that asked for no chunk for this long is forgotten (its offer released).
const TRANSFER_IDLE_MAX: Duration = Duration::from_secs(60);
/// Frames and requests queued between the two executors, each way.
pub const QUEUE_CAPACITY: usize = 1024;
/// Frozen offers live here (hard links), inside the data directory.
pub const OUT_DIR: &str = "statexfer-out";
/// The metadata group's staging directory, inside the data directory.
pub const METADATA_STAGING_DIR: &str = "statexfer-metadata";
/// Partition staging directories sit beside the live ones under this prefix.
pub const STAGING_PREFIX: &str = ".xfer-";
/// Test hook: the first N chunks this node receives have one byte flipped, so the
/// artifact check must catch them and refetch.
pub const CORRUPT_CHUNKS_ENV: &str = "STATEXFER_TEST_CORRUPT_CHUNKS";
/// Bytes read per step when hashing or copying local files. Small: a journal write or
/// fdatasync of the cluster that reaches the shared disk behind one of these reads
/// waits for all of it (1 MiB steps gave producer p99 of 6.2-11.6 ms during a transfer,
/// 64 KiB steps 3.0-9.4 ms, at the same 88-90 MB/s; docs/benchmarks.md, "State transfer").
const COPY_BUFFER: usize = 64 << 10;
/// Staged bytes of an artifact written between write-backs (no writeback burst at
/// install, and each write-back as short on the disk as a chunk).
const STAGING_WRITE_BACK_BYTES: u64 = 64 << 10;

/// Work the statexfer executor asked for, done after the round's actions (so a freeze
/// sees the state exactly at the commit point).
#[derive(Default)]
pub(super) struct XferWork {
    pub freezes: Vec<u64>,
    pub installs: Vec<(u64, PathBuf, u64, Manifest)>,
}

/// Whether a replica-plane command belongs to state transfer.
pub(super) fn is_state_transfer(command: Command) -> bool {
    matches!(
        command,
        Command::RequestStateTransfer
            | Command::StateTransferTarget
            | Command::RequestStateChunk
            | Command::StateChunk
    )
}

/// What the replica executor sends this thread.
pub enum ToXfer {
    /// A state-transfer frame (commands 22 to 25) from a peer.
    Frame { peer: u8, frame: FrameBuf },
    /// The answer to `FromXfer::Freeze`.
    Frozen(Frozen),
    /// The group cannot be frozen now (`transient`) or is not held here.
    FreezeRefused { group: u64, transient: bool },
    /// Start fetching a group's state.
    Fetch(FetchRequest),
}

/// What this thread asks of the replica executor.
pub enum FromXfer {
    /// Send a frame to a peer over the bus.
    Send { to: u8, frame: Frame },
    /// Freeze a group at its commit point and answer with `ToXfer::Frozen`.
    Freeze { group: u64 },
    /// A verified state is staged in `staging`: swap it in and restart the group.
    Install {
        group: u64,
        staging: PathBuf,
        commit_op: u64,
        manifest: Manifest,
    },
    /// The transfer failed for good (every peer refused, stalled or served bad data).
    FetchFailed { group: u64, error: String },
}

/// Which state machine a group's artifacts rebuild.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    Metadata,
    Partition,
}

/// A transfer to start.
pub struct FetchRequest {
    pub group: u64,
    pub arm: Arm,
    /// Peers in preference order (the one that reported the range evicted first).
    pub peers: Vec<u8>,
    /// The live directory (partition arm: reused sealed segments are read from here).
    pub live: PathBuf,
    pub staging: PathBuf,
    /// Local segments whole below the local commit point: base offset and length.
    /// Their bytes never change, so a matching one is hard-linked, not copied.
    pub committed_segments: Vec<(u64, u64)>,
}

/// Where a frozen artifact's bytes are.
pub enum Content {
    Bytes(Vec<u8>),
    /// The first `len` bytes of a file (a hard link the offer owns).
    File {
        path: PathBuf,
        len: u64,
    },
}

impl statexfer::Content for Content {
    fn len(&self) -> u64 {
        match self {
            Content::Bytes(bytes) => bytes.len() as u64,
            Content::File { len, .. } => *len,
        }
    }
}

/// One group frozen at its commit point; it owns the directory of hard links its files
/// are read through (removed when the offer is released or the freeze abandoned).
pub type Frozen = statexfer::Freeze<Content, Links>;

/// Settings of the statexfer executor.
#[derive(Clone, Debug)]
pub struct XferSettings {
    pub cluster: u128,
    pub replica: u8,
    pub data_dir: PathBuf,
    pub partition: PartitionConfig,
    pub chunk_max: u32,
    pub max_message_size: u32,
    pub fetcher: FetcherConfig,
    /// Bytes per second fetched at most (0: no limit).
    pub rate_max: u64,
}

/// The fetcher bounds the daemon uses, in statexfer ticks.
pub fn fetcher_config() -> FetcherConfig {
    FetcherConfig {
        chunk_len: statexfer::server::CHUNK_MAX_DEFAULT,
        artifacts_in_flight_max: 4,
        // 2 s without an answer; 4 resends, then the next peer.
        stall_ticks: 40,
        retries_max: 4,
        refetches_max: 2,
        peer_rounds_max: 3,
        // 200 ms: a freeze (hard links, hashing what grew) is quick.
        transient_retry_ticks: 4,
    }
}

/// The channel ends each executor keeps.
pub struct Channels {
    pub to_xfer: (SharedSender<ToXfer>, SharedReceiver<ToXfer>),
    pub from_xfer: (SharedSender<FromXfer>, SharedReceiver<FromXfer>),
}

pub fn channels() -> Channels {
    Channels {
        to_xfer: glommio::channels::shared_channel::new_bounded(QUEUE_CAPACITY),
        from_xfer: glommio::channels::shared_channel::new_bounded(QUEUE_CAPACITY),
    }
}

/// Clears what a crash left: frozen offers and staging directories (a staged state
/// not yet swapped in, or an old state swapped out but not yet removed).
pub fn clean_data_dir(data_dir: &Path) -> std::io::Result<()> {
    statexfer::install::recover(&data_dir.join(OUT_DIR))?;
    statexfer::install::recover(&data_dir.join(METADATA_STAGING_DIR))?;
    let partitions = data_dir.join(journal::data_dir::PARTITIONS_DIR);
    let Ok(entries) = std::fs::read_dir(&partitions) else {
        return Ok(());
    };
    for entry in entries.filter_map(|e| e.ok()) {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(STAGING_PREFIX)
        {
            statexfer::install::recover(&entry.path())?;
        }
    }
    Ok(())
}

/// Starts the statexfer executor thread.
pub fn start(
    settings: XferSettings,
    inbox: SharedReceiver<ToXfer>,
    outbox: SharedSender<FromXfer>,
    stats: Arc<Mutex<StateTransferStats>>,
) -> Result<(), DaemonError> {
    journal::runtime::executor_builder()
        .name("statexfer")
        .spawn(move || async move {
            let inbox = inbox.connect().await;
            let outbox = outbox.connect().await;
            lower_thread_priority();
            if let Err(error) = journal::runtime::choose_disk_completions(&settings.data_dir).await
            {
                tracing::warn!(%error, "statexfer executor: disk completions left to glommio");
            }
            let mut xfer = Xfer::new(settings, outbox, stats);
            let mut ticked = Instant::now();
            loop {
                // Idle (no transfer fetched, served, frozen or offered), the thread wakes
                // once a second instead of every tick: a message wakes it at once.
                let period = if xfer.idle() { IDLE_TICK } else { TICK };
                let next_tick = ticked + period;
                let wait = next_tick.saturating_duration_since(Instant::now());
                let message = futures_lite::future::or(async { Some(inbox.recv().await) }, async {
                    glommio::timer::sleep(wait).await;
                    None
                })
                .await;
                let started = Instant::now();
                match message {
                    Some(None) => break,
                    Some(Some(message)) => xfer.on_message(message),
                    None => {}
                }
                super::system::slow_step("statexfer message", started);
                if Instant::now() >= next_tick {
                    ticked = Instant::now();
                    let started = Instant::now();
                    xfer.on_tick();
                    super::system::slow_step("statexfer tick", started);
                }
                let started = Instant::now();
                xfer.finish_fetches().await;
                super::system::slow_step("statexfer finish", started);
                xfer.flush();
            }
        })
        .map(|_| ())
        .map_err(DaemonError::start("statexfer executor"))
}

/// The nice value of the statexfer thread: its bulk work (hashing, verifying a staged
/// log, copying) yields the CPU to the replica executor, whose commit path a transfer
/// must not slow (on a small machine the two compete for the same cores), yet keeps a
/// share of it under sustained load (SCHED_IDLE could starve it).
const THREAD_NICE: libc::c_int = 10;

/// Lowers this thread's CPU priority to THREAD_NICE and its IO priority to the lowest
/// best-effort level (honoured by IO schedulers with priority levels, e.g. bfq). A
/// refusal is logged: the transfer then runs at the normal priority.
fn lower_thread_priority() {
    // SAFETY: gettid, setpriority and ioprio_set on this thread's own id, no pointers.
    let (nice, ioprio) = unsafe {
        let tid = libc::gettid();
        let nice = libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, THREAD_NICE);
        // IOPRIO_WHO_PROCESS = 1; IOPRIO_CLASS_BE (2) << IOPRIO_CLASS_SHIFT (13), level 7.
        let ioprio = libc::syscall(libc::SYS_ioprio_set, 1, tid, (2 << 13) | 7);
        (nice, ioprio)
    };
    if nice != 0 || ioprio != 0 {
        tracing::warn!(
            error = %std::io::Error::last_os_error(),
            "statexfer: cannot lower the thread's priority"
        );
    }
}

/// Opens a file for the bulk reads of a transfer (hashing an offer, serving chunks,
/// copying a local segment) with the kernel's readahead off, so the disk sees the
/// megabyte reads asked for rather than readahead windows of up to `read_ahead_kb`
/// (8 MiB on a virtio disk): the cluster's fsyncs on the same disk queue behind those.
/// On this host a reader at 134 MB/s took a neighbour's fdatasync p99 from 0.9 to
/// 11-23 ms with readahead, 3.2 ms without it.
fn open_without_readahead(path: &Path) -> std::io::Result<File> {
    let file = File::open(path)?;
    // SAFETY: advisory call on a descriptor we own, no pointers.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    if rc != 0 {
        tracing::debug!(path = %path.display(), rc, "state transfer: readahead left on");
    }
    Ok(file)
}

/// A transfer this node is fetching.
struct Fetch {
    request: FetchRequest,
    fetcher: Fetcher,
    sink: StagingSink,
    started: Instant,
    /// A received segment failed its batch-by-batch verification.
    bad_segment: Option<String>,
}

struct Xfer {
    settings: XferSettings,
    outbox: ConnectedSender<FromXfer>,
    pending: RefCell<Vec<FromXfer>>,
    stats: Arc<Mutex<StateTransferStats>>,
    server: Server,
    hashes: Rc<RefCell<Hashes>>,
    /// Offers frozen, hashed, served and released.
    offers: Offers<Content, Links>,
    fetches: BTreeMap<u64, Fetch>,
    ticks: u64,
    corrupt_left: u64,
    totals: StateTransferStats,
    /// Pacing (with `rate_max`): bytes the fetchers may still ask for now, and chunk
    /// requests held until the budget allows them.
    budget: f64,
    held: std::collections::VecDeque<(u8, Frame)>,
    /// When the last tick ran: pacing and the fetch time count the time that passed,
    /// not ticks (a tick comes late when a step before it ran long).
    last_tick: Instant,
}

impl Xfer {
    fn new(
        settings: XferSettings,
        outbox: ConnectedSender<FromXfer>,
        stats: Arc<Mutex<StateTransferStats>>,
    ) -> Xfer {
        let server = Server::new(
            settings.cluster,
            settings.replica,
            settings.chunk_max,
            settings.max_message_size,
        );
        let corrupt_left = std::env::var(CORRUPT_CHUNKS_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        Xfer {
            offers: Offers::new(offer_policy(&settings)),
            settings,
            outbox,
            pending: RefCell::new(Vec::new()),
            stats,
            server,
            hashes: Rc::new(RefCell::new(Hashes::default())),
            fetches: BTreeMap::new(),
            ticks: 0,
            corrupt_left,
            totals: StateTransferStats::default(),
            budget: 0.0,
            held: std::collections::VecDeque::new(),
            last_tick: Instant::now(),
        }
    }

    fn send(&self, message: FromXfer) {
        self.pending.borrow_mut().push(message);
    }

    /// Hands queued messages to the replica executor (a full queue drops frames, which
    /// the lockstep protocol resends; control messages wait for room).
    fn flush(&mut self) {
        let pending = std::mem::take(&mut *self.pending.borrow_mut());
        let mut kept = Vec::new();
        for message in pending {
            let Err(error) = self.outbox.try_send(message) else {
                continue;
            };
            let (glommio::GlommioError::WouldBlock(glommio::ResourceType::Channel(message))
            | glommio::GlommioError::Closed(glommio::ResourceType::Channel(message))) = error
            else {
                continue;
            };
            match message {
                FromXfer::Send { .. } => self.totals.frames_dropped += 1,
                other => kept.push(other),
            }
        }
        *self.pending.borrow_mut() = kept;
    }

    fn on_message(&mut self, message: ToXfer) {
        match message {
            ToXfer::Frame { peer, frame } => self.on_frame(peer, frame),
            ToXfer::Frozen(frozen) => self.on_frozen(frozen),
            ToXfer::FreezeRefused { group, transient } => {
                self.offers.on_refused(group, transient, Instant::now());
            }
            ToXfer::Fetch(request) => self.start_fetch(request),
        }
    }

    fn on_frame(&mut self, peer: u8, frame: FrameBuf) {
        let bytes = frame.as_bytes();
        let Ok((header, _)) = FrameHeader::read_from_prefix(bytes) else {
            return;
        };
        let end = (header.size as usize).min(bytes.len());
        let body = bytes.get(HEADER_SIZE..end).unwrap_or(&[]);
        match Command::from_u8(header.command) {
            Some(Command::RequestStateTransfer) => {
                if let Ok((request, _)) = RequestStateTransferHeader::read_from_prefix(bytes) {
                    self.on_request_transfer(peer, &request);
                }
            }
            Some(Command::RequestStateChunk) => {
                if let Ok((request, _)) = RequestStateChunkHeader::read_from_prefix(bytes) {
                    self.on_request_chunk(peer, &request);
                }
            }
            Some(Command::StateTransferTarget) => {
                if let Ok((target, _)) = StateTransferTargetHeader::read_from_prefix(bytes) {
                    if let Some(fetch) = self.fetches.get_mut(&target.group) {
                        fetch.fetcher.on_target(&target, body, &mut fetch.sink);
                    }
                }
            }
            Some(Command::StateChunk) => {
                if let Ok((chunk, _)) = StateChunkHeader::read_from_prefix(bytes) {
                    let Some(fetch) = self.fetches.get_mut(&chunk.group) else {
                        return;
                    };
                    if self.corrupt_left > 0 && !body.is_empty() {
                        self.corrupt_left -= 1;
                        let mut damaged = body.to_vec();
                        damaged[body.len() / 2] ^= 0x40;
                        fetch.fetcher.on_chunk(&chunk, &damaged, &mut fetch.sink);
                    } else {
                        fetch.fetcher.on_chunk(&chunk, body, &mut fetch.sink);
                    }
                }
            }
            _ => {}
        }
        self.drain_fetchers();
    }

    fn start_fetch(&mut self, request: FetchRequest) {
        if self.fetches.contains_key(&request.group) {
            return;
        }
        let sink = match FileSink::create(&request.staging) {
            Ok(files) => StagingSink {
                files: files.write_back_every(STAGING_WRITE_BACK_BYTES),
                staging: request.staging.clone(),
                live: request.live.clone(),
                arm: request.arm,
                group: request.group,
                partition: self.settings.partition,
                unindexed: Default::default(),
                verifying: None,
                scan_buffer: Vec::new(),
                verify_paced: self.settings.rate_max > 0,
                committed_segments: request.committed_segments.clone(),
                hashes: self.hashes.clone(),
            },
            Err(error) => {
                self.send(FromXfer::FetchFailed {
                    group: request.group,
                    error: format!("{}: {error}", request.staging.display()),
                });
                return;
            }
        };
        tracing::info!(group = request.group, peers = ?request.peers, "state transfer: fetching");
        self.totals.transfers_started += 1;
        let fetcher = Fetcher::start(
            self.settings.cluster,
            self.settings.replica,
            request.group,
            request.peers.clone(),
            self.settings.fetcher,
            fastrand::u128(..),
            self.ticks,
        );
        self.fetches.insert(
            request.group,
            Fetch {
                request,
                fetcher,
                sink,
                started: Instant::now(),
                bad_segment: None,
            },
        );
        self.drain_fetchers();
    }

    fn drain_fetchers(&mut self) {
        let paced = self.settings.rate_max > 0;
        let mut out = Vec::new();
        for fetch in self.fetches.values_mut() {
            while let Some((to, frame)) = fetch.fetcher.poll_send() {
                if paced && frame.header().command == Command::RequestStateChunk as u8 {
                    self.held.push_back((to, frame));
                } else {
                    out.push(FromXfer::Send { to, frame });
                }
            }
        }
        for message in out {
            self.send(message);
        }
        self.release_held();
    }

    /// Sends held chunk requests while the pacing budget lasts (each asks for up to a
    /// chunk). A request held longer than the stall bound is resent by its fetcher;
    /// the budget refills each tick, so held requests go out within a few ticks.
    fn release_held(&mut self) {
        let chunk = f64::from(self.settings.fetcher.chunk_len);
        while self.budget >= chunk {
            let Some((to, frame)) = self.held.pop_front() else {
                break;
            };
            self.budget -= chunk;
            self.send(FromXfer::Send { to, frame });
        }
    }

    /// Verifies received segments at twice the transfer's rate (it keeps up with the
    /// fetch), a slice each tick: a 64 MiB segment verified in one go is tens of
    /// milliseconds of CPU and reads, and several back to back (the fetcher completes the
    /// artifacts it has in flight together) would take a core from the replica
    /// executors for long enough to stall commits on a small machine.
    fn verify_step(&mut self) {
        let slice = (2.0 * self.settings.rate_max as f64 * TICK.as_secs_f64()) as u64;
        let Some(fetch) = self
            .fetches
            .values_mut()
            .find(|f| !f.sink.unindexed.is_empty() && f.bad_segment.is_none())
        else {
            return;
        };
        if let Err(error) = fetch.sink.verify_next(slice.max(SEALED_SCAN_WINDOW as u64)) {
            fetch.bad_segment = Some(format!("a received segment: {error}"));
        }
    }

    /// Nothing to pace, hash, verify, retry or release: the tick has no work.
    fn idle(&self) -> bool {
        self.fetches.is_empty() && self.offers.idle() && self.held.is_empty()
    }

    fn on_tick(&mut self) {
        self.ticks += 1;
        let now = Instant::now();
        let elapsed = now.duration_since(self.last_tick).as_secs_f64();
        self.last_tick = now;
        if self.settings.rate_max > 0 {
            // At most a second's worth may accumulate (no burst after an idle spell).
            let rate = self.settings.rate_max as f64;
            let burst = rate.max(f64::from(self.settings.fetcher.chunk_len));
            self.budget = (self.budget + rate * elapsed).min(burst);
        }
        if !self.fetches.is_empty() {
            self.totals.fetching_seconds += elapsed;
        }
        for fetch in self.fetches.values_mut() {
            fetch.fetcher.tick(self.ticks);
        }
        self.drain_fetchers();
        self.verify_step();
        self.hash_step();
        // An offer nobody uses is released (its hard links removed) once stale.
        self.offers.expire(now);
        self.publish();
    }

    /// Finished transfers: a complete one is materialized and handed over for install;
    /// a failed one is reported so the group asks again later.
    async fn finish_fetches(&mut self) {
        let finished: Vec<u64> = self
            .fetches
            .iter()
            .filter(|(_, f)| {
                f.bad_segment.is_some()
                    || match f.fetcher.outcome() {
                        Outcome::InProgress => false,
                        // Installed once every received segment is verified.
                        Outcome::Complete { .. } => f.sink.unindexed.is_empty(),
                        Outcome::Failed(_) => true,
                    }
            })
            .map(|(g, _)| *g)
            .collect();
        for group in finished {
            let Some(fetch) = self.fetches.remove(&group) else {
                continue;
            };
            self.totals.refetches += fetch.fetcher.progress.refetches;
            self.totals.stalls += fetch.fetcher.progress.stalls;
            self.totals.peer_switches += fetch.fetcher.progress.peer_switches;
            self.totals.bytes_reused += fetch.fetcher.progress.bytes_reused;
            if let Some(error) = fetch.bad_segment {
                // Verified whole by its checksum yet its batches are wrong: the peer's
                // copy is bad; the group asks again later.
                self.fail_fetch(group, &fetch.request.staging, error);
                continue;
            }
            match fetch.fetcher.outcome() {
                Outcome::Complete {
                    commit_op,
                    manifest,
                } => {
                    self.stage_complete(group, &fetch, commit_op, manifest)
                        .await
                }
                Outcome::Failed(error) => {
                    let progress = fetch.fetcher.progress;
                    let error = format!(
                        "{error} (refetches {}, stalls {}, peer switches {}, stale frames {}, \
                         {} of {} bytes)",
                        progress.refetches,
                        progress.stalls,
                        progress.peer_switches,
                        progress.stale_frames,
                        progress.bytes_done,
                        progress.bytes_total
                    );
                    self.fail_fetch(group, &fetch.request.staging, error);
                }
                Outcome::InProgress => {}
            }
        }
    }

    /// A complete transfer: materialized (a partition) or synced (the metadata), then
    /// handed over for install; a staged state that does not check out is reported.
    async fn stage_complete(
        &mut self,
        group: u64,
        fetch: &Fetch,
        commit_op: u64,
        manifest: Manifest,
    ) {
        let staging = fetch.request.staging.clone();
        let result = match fetch.request.arm {
            Arm::Partition => {
                materialize_partition(&staging, &manifest, group, self.settings.partition).await
            }
            Arm::Metadata => sync_staged(&staging, &manifest),
        };
        let progress = fetch.fetcher.progress;
        let seconds = fetch.started.elapsed().as_secs_f64();
        match result {
            Ok(()) => {
                tracing::info!(
                    group,
                    commit_op,
                    bytes = progress.bytes_total,
                    reused = progress.bytes_reused,
                    seconds,
                    "state transfer: state staged and verified"
                );
                self.totals.transfers_completed += 1;
                self.totals.last_bytes = progress.bytes_total;
                self.totals.last_seconds = seconds;
                self.send(FromXfer::Install {
                    group,
                    staging,
                    commit_op,
                    manifest,
                });
            }
            Err(error) => self.fail_fetch(group, &staging, error.to_string()),
        }
    }

    /// A transfer that failed: counted, what it staged cleared, and the group told (it
    /// asks again later).
    fn fail_fetch(&mut self, group: u64, staging: &Path, error: String) {
        self.totals.transfers_failed += 1;
        let _ = statexfer::install::recover(staging);
        self.send(FromXfer::FetchFailed { group, error });
    }

    fn publish(&self) {
        let mut stats = self.totals.clone();
        stats.active = !self.fetches.is_empty();
        let mut rate_bytes = 0u64;
        let mut rate_seconds = 0f64;
        for fetch in self.fetches.values() {
            let p = fetch.fetcher.progress;
            stats.commit_op = stats.commit_op.max(p.commit_op);
            stats.artifacts_total += p.artifacts_total;
            stats.artifacts_done += p.artifacts_done;
            stats.bytes_total += p.bytes_total;
            stats.bytes_done += p.bytes_done;
            stats.refetches += p.refetches;
            stats.stalls += p.stalls;
            rate_bytes += p.bytes_done.saturating_sub(p.bytes_reused);
            rate_seconds = rate_seconds.max(fetch.started.elapsed().as_secs_f64());
        }
        if rate_seconds > 0.0 {
            stats.rate_bytes_per_s = rate_bytes as f64 / rate_seconds;
        }
        stats.offers = self.offers.offers_len() as u64;
        stats.transfers_serving = self.offers.serving_len() as u64;
        stats.targets_offered = self.server.stats.targets_offered;
        stats.targets_refused = self.server.stats.targets_refused;
        stats.chunks_served = self.server.stats.chunks_served;
        stats.bytes_served = self.server.stats.bytes_served;
        stats.chunks_refused = self.server.stats.chunks_refused;
        match self.stats.lock() {
            Ok(mut guard) => *guard = stats,
            Err(poisoned) => *poisoned.into_inner() = stats,
        }
    }
}

#[cfg(test)]
mod tests;
