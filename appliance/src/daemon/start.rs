//! How a node starts: its settings, the file-descriptor budget of partitions, and the
//! node rebuilt from its data directory (the genesis state, the metadata group from its
//! superblock, checkpoint and journal).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::channels::local_channel::LocalSender;
use glommio::channels::shared_channel::ConnectedSender;
use journal::data_dir::DataDir;
use journal::segment::PartitionConfig;
use journal::Durability;
use replication::bus::Bus;
use replication::vsr::{self, Groups, JournalEntry, Replica};
use replication::wire::{Frame, FrameBuf, PrepareHeader, METADATA_GROUP};
use zerocopy::FromBytes;

use super::files;
use super::partitions::Partitions;
use super::passwords::{PasswordThread, VerifiedLogins};
use super::repair_windows::RepairWindows;
use super::DaemonError;
use crate::node_core::forward::{ForwardedClients, Forwards};
use crate::state::MetadataState;

use super::node::{Event, Latencies, Node};

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
        let superblock = read_superblock(&settings, &bus)?;
        let (state, replica, entries, fresh) = open_metadata(&settings, &superblock, &data)?;
        let restarted = !fresh;
        let metadata_applied = data.checkpoint.as_ref().map_or(0, |(info, _)| info.op);
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
        let forwards = Forwards::new(settings.cluster, settings.replica);
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
            prepared_requests: Default::default(),
            request_started: HashMap::new(),
            prepared_at: HashMap::new(),
            latencies: Latencies::new(),
            started: Instant::now(),
            ticks: 0,
            restarted,
            events,
            logins_in_flight: 0,
            password_thread: PasswordThread::default(),
            verified_logins: VerifiedLogins::default(),
            login_counts: Default::default(),
            forwards,
            forwarded: ForwardedClients::default(),
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
}

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
    pub retention: crate::node_core::retention::RetentionSettings,
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
pub(super) fn partitions_within(files: usize) -> usize {
    match files {
        usize::MAX => usize::MAX,
        files => files.saturating_sub(prepare_files_min(files)),
    }
}

/// The metadata group's VSR superblock; unreadable on a member of a cluster, the node
/// rejoins as a replacement (counted), since the promises it held are unknown.
fn read_superblock(settings: &Settings, bus: &Bus) -> Result<vsr::Superblock, DaemonError> {
    match files::read_vsr_superblock(&settings.data_dir) {
        Ok(superblock) => Ok(superblock),
        Err(error) if settings.replica_count > 1 => {
            // The promises the superblock held (views, the suffix it installed) are
            // unknown: rejoin as a replacement that votes once it caught up.
            tracing::error!(
                %error,
                "VSR superblock unreadable: the metadata group rejoins as a replacement"
            );
            bus.stats().reject("vsr_superblock_unreadable");
            Ok(vsr::Superblock {
                replacement: true,
                ..vsr::Superblock::default()
            })
        }
        Err(error) => Err(DaemonError::file(METADATA_GROUP, "VSR superblock")(error)),
    }
}

/// The metadata state and replica as the data directory holds them: the state at the
/// last checkpoint (or the genesis) and the journal's entries above it. Also the
/// entries, and whether the node is fresh (formatted, never started).
fn open_metadata(
    settings: &Settings,
    superblock: &vsr::Superblock,
    data: &DataDir,
) -> Result<(MetadataState, Replica, Vec<JournalEntry>, bool), DaemonError> {
    let journal = &data.journal;
    let mut entries = Vec::new();
    for op in journal.op_min().max(1)..=journal.op_head() {
        let bytes = journal.entry(op).ok().map(FrameBuf::from_bytes);
        entries.push(JournalEntry { op, bytes });
    }
    let fresh = entries.is_empty()
        && *superblock == vsr::Superblock::default()
        && data.checkpoint.is_none();
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
                superblock,
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
                Replica::restart(settings.vsr.clone(), superblock, &entries)
            };
            (state, replica)
        }
    };
    Ok((state, replica, entries, fresh))
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
