//! Viewstamped Replication for one consensus group, sans-IO (docs/protocol.md,
//! "Replication", "View changes", "Journal repair"; docs/architecture.md).
//!
//! A [`Replica`] is a plain value. The driver (the glommio bus and journal in the
//! appliance, the simulator in tests) feeds it received frames (`on_message`), client
//! requests (`on_request`), completed journal writes (`on_journal_durable`) and ticks
//! (`on_tick`), then drains [`Action`]s in order. There are no sockets, files, clocks or
//! threads here: time is a tick count and randomness a seeded PRNG.
//!
//! Ordering contract for drivers: actions are executed in the order they are queued.
//! `JournalTruncate` and `PersistSuperblock` complete (durably) before any later action is
//! performed, so a replica never speaks in a view it has not persisted. `JournalAppend`
//! completes asynchronously and is reported back with `on_journal_durable`; a replica
//! never sends PrepareOk for an op before that report.
//!
//! What is persisted where, and why a restart is safe:
//! - The superblock holds view, log_view and the log_view's suffix headers (as installed
//!   from the StartView), written before the replica acts in a view.
//! - The journal holds every prepare the replica acknowledged (durable before PrepareOk).
//!   Entries above the superblock suffix stamped with log_view were appended in that view.
//! - A restarted replica rebuilds its log from both, marks unreadable entries "maybe
//!   prepared" (never nacked, repaired by identity), commits nothing, and probes with
//!   RequestStartView under a fresh incarnation. Every promise it made (acks, view
//!   numbers) is in that durable state, so when no primary answers (the cluster is itself
//!   changing views) it may join the view change from it.
//! - A DoViewChange vouches for a window (commit, top]: ops left out of its body were
//!   never prepared by the sender; the window ends below the lowest op it cannot vouch
//!   for, which stays unclaimed (never nacked) while repair fetches it.

mod applied;
mod client_table;
mod groups;
mod hibernate;
mod log;
mod merge;
mod normal;
mod partition;
mod recovery;
mod repair;
mod replacement;
mod replica;
mod request;
mod slow;
mod slow_peers;
mod timeout;
mod view_change;

pub use applied::Applied;
pub use client_table::{
    ClientTable, Session, CLIENTS_MAX_DEFAULT, REPLY_BODIES_KEPT_MAX, REPLY_BODY_KEPT_MAX,
};
pub use groups::{Groups, RouteError, SleepStats};
pub use hibernate::{PeerLiveness, Sleep, Woke, BROADCASTS_BEFORE_SLEEP, REFRESH_HEARTBEATS};
pub use log::{Log, Slot};
pub use recovery::{Checkpoint, JournalEntry, Superblock};
pub use replacement::RecoveryWait;
pub use replica::{Replica, RequestOutcome, Status};
pub use timeout::{Prng, Timeout};
pub use view_change::PROBE_ATTEMPTS_MAX;

use crate::wire::{Frame, PrepareHeader};

/// The DVC and StartView bitsets are u128: a suffix holds at most this many headers.
pub const SUFFIX_MAX: usize = crate::wire::decode::SUFFIX_MAX;
/// Upper bound of the configurable pipeline depth (uncommitted ops in flight).
pub const PIPELINE_MAX: u64 = 127;
/// Replica counts the core supports (the replica id is a u8; bitmasks are u32).
pub const REPLICA_COUNT_MAX: u8 = 32;

/// Default cluster.repair_chunk_max.
pub const REPAIR_CHUNK_MAX_DEFAULT: u64 = 16;
/// Default message_bus.peer_queue_capacity.
pub const PEER_QUEUE_CAPACITY_DEFAULT: u64 = 64;

const _: () = assert!(PIPELINE_MAX <= 127);
// Per-peer queues drop overruns silently: a repair chunk must fit.
const _: () = assert!(REPAIR_CHUNK_MAX_DEFAULT < PEER_QUEUE_CAPACITY_DEFAULT);
const _: () = assert!((PIPELINE_MAX as usize) < SUFFIX_MAX);
const _: () = assert!(SUFFIX_MAX <= 128);
const _: () = assert!(REPLICA_COUNT_MAX as u32 <= u32::BITS);

/// Static configuration of one replica of one group. Durations are in ticks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub cluster: u128,
    pub group: u64,
    pub replica: u8,
    pub replica_count: u8,
    /// Uncommitted ops the primary keeps in flight, 1..=PIPELINE_MAX.
    pub pipeline_max: u64,
    /// cluster.commit_broadcast_interval: the primary's heartbeat.
    pub commit_broadcast_interval_ticks: u64,
    /// cluster.heartbeat_timeout: a backup suspects the primary after this much silence.
    pub heartbeat_timeout_ticks: u64,
    /// cluster.prepare_retransmit_interval.
    pub prepare_retransmit_interval_ticks: u64,
    /// cluster.view_change_retransmit_interval (SVC/DVC resend, RSV probe resend).
    pub view_change_retransmit_interval_ticks: u64,
    /// A view change that does not finish within this moves on to the next view.
    pub view_change_timeout_ticks: u64,
    /// Interval between repair rounds.
    pub repair_interval_ticks: u64,
    /// cluster.repair_chunk_max: prepares served per RequestPrepares.
    pub repair_chunk_max: u64,
    /// message_bus.peer_queue_capacity: repair_chunk_max must stay below it.
    pub peer_queue_capacity: u64,
    /// Sessions kept in the client table before the oldest is evicted.
    pub clients_max: usize,
    /// cluster.slow_peer_lag_min: a backup lagging less than this is never skipped as
    /// slow (the bound is a multiple of the recent commit latency, at least this).
    pub slow_lag_min_ticks: u64,
    /// cluster.slow_peer_readmit: how long a skipped backup must keep up before the
    /// chain takes it back (doubled for a backup skipped again soon after).
    pub slow_readmit_ticks: u64,
    /// Seed of the replica's PRNG (timeout jitter, nonces, incarnations).
    pub seed: u64,
    /// The view a fresh group starts in, Normal with an empty log, on every replica
    /// alike: its primary is the group's first leader (groups spread their first leaders
    /// over the nodes by starting in different views). Every replica of the group must
    /// be given the same value; a replica restarted before it persisted any view is in
    /// this view.
    pub initial_view: u32,
}

impl Config {
    /// Defaults sized for tests and the simulator; the appliance maps its TOML onto these.
    pub fn new(cluster: u128, group: u64, replica: u8, replica_count: u8) -> Config {
        Config {
            cluster,
            group,
            replica,
            replica_count,
            pipeline_max: 8,
            commit_broadcast_interval_ticks: 10,
            heartbeat_timeout_ticks: 60,
            prepare_retransmit_interval_ticks: 20,
            view_change_retransmit_interval_ticks: 20,
            view_change_timeout_ticks: 100,
            repair_interval_ticks: 15,
            repair_chunk_max: REPAIR_CHUNK_MAX_DEFAULT,
            peer_queue_capacity: PEER_QUEUE_CAPACITY_DEFAULT,
            clients_max: CLIENTS_MAX_DEFAULT,
            slow_lag_min_ticks: 10,
            slow_readmit_ticks: 200,
            seed: u64::from(replica) + 1,
            initial_view: 0,
        }
    }

    /// Checks the relations between the values; a bad config is refused at start.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.replica_count == 0 || self.replica_count > REPLICA_COUNT_MAX {
            return Err(ConfigError::ReplicaCount(self.replica_count));
        }
        if self.replica >= self.replica_count {
            return Err(ConfigError::ReplicaId(self.replica));
        }
        if self.pipeline_max == 0 || self.pipeline_max > PIPELINE_MAX {
            return Err(ConfigError::PipelineMax(self.pipeline_max));
        }
        if self.repair_chunk_max == 0 || self.repair_chunk_max >= self.peer_queue_capacity {
            return Err(ConfigError::RepairChunkMax {
                repair_chunk_max: self.repair_chunk_max,
                peer_queue_capacity: self.peer_queue_capacity,
            });
        }
        if self.commit_broadcast_interval_ticks == 0
            || self.heartbeat_timeout_ticks <= self.commit_broadcast_interval_ticks
        {
            return Err(ConfigError::HeartbeatTimeout);
        }
        if self.clients_max == 0 {
            return Err(ConfigError::ClientsMax);
        }
        if self.slow_lag_min_ticks == 0 || self.slow_readmit_ticks == 0 {
            return Err(ConfigError::SlowPeer);
        }
        Ok(())
    }

    /// Replication quorum: PrepareOks (the primary's own included) that commit an op.
    pub fn quorum_replication(&self) -> usize {
        usize::from(self.replica_count) / 2 + 1
    }

    /// View-change quorum: SVCs and DVCs needed to move to a view.
    pub fn quorum_view_change(&self) -> usize {
        usize::from(self.replica_count) / 2 + 1
    }

    /// Nacks that prove an op cannot have reached a replication quorum.
    pub fn quorum_nack(&self) -> usize {
        usize::from(self.replica_count) - self.quorum_replication() + 1
    }

    /// The primary of `view`.
    pub fn primary_of(&self, view: u32) -> u8 {
        (view % u32::from(self.replica_count)) as u8
    }
}

/// Why a [`Config`] was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    ReplicaCount(u8),
    ReplicaId(u8),
    PipelineMax(u64),
    RepairChunkMax {
        repair_chunk_max: u64,
        peer_queue_capacity: u64,
    },
    HeartbeatTimeout,
    ClientsMax,
    SlowPeer,
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ConfigError::ReplicaCount(n) => write!(f, "replica_count {n} is not in 1..=32"),
            ConfigError::ReplicaId(r) => write!(f, "replica id {r} is not below replica_count"),
            ConfigError::PipelineMax(p) => write!(f, "pipeline_max {p} is not in 1..=127"),
            ConfigError::RepairChunkMax {
                repair_chunk_max,
                peer_queue_capacity,
            } => write!(
                f,
                "repair_chunk_max {repair_chunk_max} must be in 1..peer_queue_capacity \
                 ({peer_queue_capacity})"
            ),
            ConfigError::HeartbeatTimeout => write!(
                f,
                "heartbeat_timeout must exceed a non-zero commit_broadcast_interval"
            ),
            ConfigError::ClientsMax => write!(f, "clients_max must be at least 1"),
            ConfigError::SlowPeer => write!(
                f,
                "slow_peer_lag_min and slow_peer_readmit must be at least one tick"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// What a replica asks its driver to do, in order.
#[derive(Clone, Debug)]
pub enum Action {
    /// Send a sealed frame to one peer (per-peer queues may drop it).
    Send { to: u8, frame: Frame },
    /// Send a sealed frame to every other replica.
    Broadcast { frame: Frame },
    /// Write a prepare to the journal slot of `op` (overwriting); report completion with
    /// `on_journal_durable(op, checksum)`.
    JournalAppend { op: u64, frame: Frame },
    /// Durably forget every journal entry above `op_max` before any later action.
    JournalTruncate { op_max: u64 },
    /// Durably write the superblock before any later action.
    PersistSuperblock(Superblock),
    /// Apply committed op `op` to the state machine (ops arrive strictly in order).
    Commit { op: u64, prepare: Frame },
    /// Reply to a client (primary only, after commit or from the client table).
    Reply { client: u128, frame: Frame },
    /// The client's session was evicted (oldest past clients_max) or is unknown.
    Evict { client: u128, frame: Frame },
    /// Too far behind for journal repair: fetch state from `from` (statexfer hand-off).
    /// `op_min` is the oldest op any peer still offered.
    StateTransfer { from: u8, op_min: u64 },
}

/// Counters of expected errors (bad input from the network), by reason.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub frames_rejected: u64,
    pub frames_wrong_cluster: u64,
    pub frames_wrong_group: u64,
    pub prepares_refused: u64,
    pub batch_stamp_mismatch: u64,
    pub repairs_accepted: u64,
    pub view_changes: u64,
    /// RequestPrepares sent, prepares served to peers by repair, and RangeEvicted answers.
    pub repair_requests_sent: u64,
    pub repairs_served: u64,
    pub ranges_evicted: u64,
    /// StateTransfer actions emitted.
    pub state_transfers_requested: u64,
    /// Ops asked to be journaled again because they were never reported durable.
    pub journal_again: u64,
    /// Prepares received for ops held already (not forwarded down the chain again).
    pub prepares_received_again: u64,
}

/// The headers a DVC or StartView carries, highest op first.
pub(crate) fn headers_body(headers: &[PrepareHeader]) -> Vec<u8> {
    use zerocopy::IntoBytes;
    let mut body = Vec::with_capacity(headers.len() * 256);
    for header in headers {
        body.extend_from_slice(header.as_bytes());
    }
    body
}
