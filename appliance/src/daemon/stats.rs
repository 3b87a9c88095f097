//! The stats executor: a second thread serving `GET /stats`, `/health` and `/metrics`
//! from the snapshot the replica executor publishes (every ~10 ticks), so a slow HTTP
//! client never touches the consensus path.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use replication::vsr::Status as VsrStatus;
use replication::wire::METADATA_GROUP;

use super::node::Node;
use super::DaemonError;
use crate::stats::http::{self, HttpLimits, HttpStats, SharedSnapshot};
use crate::stats::{
    GroupStats, GroupStatus, Latencies, Latency, PeerStats, RepairStats, Snapshot,
    StateTransferStats,
};

/// Starts the stats thread listening on `addr`; the listener is bound before this
/// returns, so a port conflict is reported at start.
pub fn start(addr: SocketAddr, shared: SharedSnapshot) -> Result<(), DaemonError> {
    let (bound_tx, bound_rx) = std::sync::mpsc::channel();
    let builder = journal::runtime::executor_builder().name("stats");
    builder
        .spawn(move || async move {
            let listener = match glommio::net::TcpListener::bind(addr) {
                Ok(listener) => {
                    let _ = bound_tx.send(Ok(()));
                    listener
                }
                Err(error) => {
                    let _ = bound_tx.send(Err(journal::IntoIoError::into_io_error(error)));
                    return;
                }
            };
            http::serve(
                listener,
                shared,
                HttpLimits::default(),
                Arc::new(HttpStats::default()),
            )
            .await;
        })
        .map_err(DaemonError::start("stats executor"))?;
    match bound_rx.recv() {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(DaemonError::Listen {
            what: "http",
            addr,
            source,
        }),
        Err(_) => Err(DaemonError::Start {
            what: "stats executor",
            source: std::io::Error::other("it exited before it listened"),
        }),
    }
}

/// A fresh shared snapshot.
pub fn shared() -> SharedSnapshot {
    Arc::new(Mutex::new(Snapshot::default()))
}

/// Builds the snapshot from the node's current state.
pub fn snapshot(node: &Node) -> Snapshot {
    let mut snapshot = node_figures(node);
    snapshot.groups = group_stats(node, connected_replicas(&snapshot));
    snapshot
}

/// Replicas this node reaches, itself included.
fn connected_replicas(snapshot: &Snapshot) -> usize {
    snapshot.peers.iter().filter(|p| p.connected).count() + 1
}

fn group_status(node: &Node, group: u64, replica: &replication::vsr::Replica) -> GroupStatus {
    match replica.status() {
        _ if node.transferring.contains_key(&group) => GroupStatus::StateTransfer,
        _ if !replica.is_voter() => GroupStatus::Recovering,
        VsrStatus::Normal => GroupStatus::Normal,
        VsrStatus::ViewChange => GroupStatus::ViewChange,
        VsrStatus::Recovering => GroupStatus::Recovering,
    }
}

/// A hash of everything `group_stats` shows of every group (but the view change times
/// the publisher tracks): equal fingerprints, equal group lists. Walks the groups
/// without allocating, so an idle node's publish need not rebuild thousands of entries.
fn groups_fingerprint(node: &Node, connected: usize) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    node.partitions.by_group.len().hash(&mut hasher);
    for (group, replica, asleep) in node.groups.iter() {
        (
            group,
            group_status(node, group, replica) as u8,
            replica.view(),
            replica.log_view(),
            replica.op(),
            replica.commit(),
            replica.commit_max(),
            connected >= replica.config().quorum_replication(),
            replica.is_voter(),
            replica.recovery_wait(),
            replica.slow_peers(),
            asleep,
        )
            .hash(&mut hasher);
    }
    hasher.finish()
}

/// Every group's entry, in `Node::group_ids` order.
fn group_stats(node: &Node, connected: usize) -> Vec<GroupStats> {
    let mut groups = Vec::new();
    for group in node.group_ids() {
        let Some(replica) = node.groups.get(group) else {
            continue;
        };
        let status = group_status(node, group, replica);
        let name = if group == METADATA_GROUP {
            "metadata".to_string()
        } else {
            match Node::partition_key(group) {
                Some(key) => format!("{}/{}/{}", key.stream, key.topic, key.partition),
                None => group.to_string(),
            }
        };
        groups.push(GroupStats {
            group: group.to_string(),
            name,
            status,
            view: replica.view(),
            log_view: replica.log_view(),
            primary: replica.config().primary_of(replica.view()),
            is_primary: replica.is_primary(),
            op: replica.op(),
            commit: replica.commit(),
            quorum: connected >= replica.config().quorum_replication(),
            voter: replica.is_voter(),
            recovery: replica.recovery_wait().map(describe_recovery),
            skipped_slow: (0..replica.config().replica_count)
                .filter(|p| replica.slow_peers() & (1 << p) != 0)
                .collect(),
            commit_max: replica.commit_max(),
            view_changed_unix_ms: None,
            asleep: node.groups.asleep(group),
            attention: Default::default(),
        });
    }
    groups
}

/// The snapshot but its group list: the node's own figures and the sums over groups.
fn node_figures(node: &Node) -> Snapshot {
    let bus = node.bus.stats().snapshot();
    let mut repair = replication::vsr::Counters::default();
    for (_, replica, _) in node.groups.iter() {
        let counters = replica.counters();
        repair.repairs_accepted += counters.repairs_accepted;
        repair.repair_requests_sent += counters.repair_requests_sent;
        repair.repairs_served += counters.repairs_served;
        repair.ranges_evicted += counters.ranges_evicted;
    }
    let slow = slow_peers(node);
    let peers = bus
        .peers
        .iter()
        .map(|p| {
            let slow = slow.get(&p.replica).copied().unwrap_or_default();
            PeerStats {
                replica: p.replica,
                connected: p.connected,
                queue_depth: p.queue_depth,
                dropped: p.dropped,
                bytes_sent: p.bytes_sent,
                bytes_received: p.bytes_received,
                skipped_slow: slow.groups > 0,
                skipped_slow_groups: slow.groups,
                skipped_slow_since_unix_ms: slow.since_unix_ms,
                slow_skips: slow.skips,
            }
        })
        .collect();
    let rejected = bus
        .rejected
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    let mut storage = crate::stats::StorageStats::default();
    for partition in node.partitions.by_group.values() {
        let (segments, bytes) = partition.log.index_memory();
        storage.partitions += 1;
        storage.segments += segments as u64;
        storage.index_bytes += bytes as u64;
        storage.prepare_index_bytes += partition.prepares.memory_bytes() as u64;
    }
    storage.repair_window_bytes = node.repair_windows.bytes();
    storage.commit_prepares_released = node.commit_prepares_released;
    let disk = &node.storage;
    storage.free_bytes = disk.free_bytes;
    storage.total_bytes = disk.total_bytes;
    storage.used_bytes = disk.used_bytes;
    storage.min_free_bytes = node.settings.budget.min_free_bytes;
    storage.max_used_bytes = node.settings.budget.max_used_bytes;
    storage.reserve_bytes = disk.reserve_held;
    storage.full = disk.full().is_some();
    storage.full_reason = disk.full().map(|f| f.reason().to_string());
    storage.no_space_errors = disk.no_space_errors;
    storage.writes_refused = disk.refused;
    storage.stopped_groups = node.paused.len() as u64;
    Snapshot {
        storage,
        replica_id: node.settings.replica,
        cluster: node.settings.cluster_name.clone(),
        uptime_s: node.started.elapsed().as_secs(),
        peers,
        nodes: node.settings.nodes.clone(),
        rejected,
        // Summed over the node's groups.
        repair: RepairStats {
            requests_sent: repair.repair_requests_sent,
            prepares_received: repair.repairs_accepted,
            prepares_served: repair.repairs_served,
            ranges_evicted: repair.ranges_evicted,
        },
        latency_us: Latencies {
            request: Latency::of(&node.latencies.request),
            prepare_commit: Latency::of(&node.latencies.prepare_commit),
            journal_fsync: Latency::of(&node.latencies.journal_fsync),
        },
        client_connections: node.connections.len() as u64,
        sessions: node.metadata().map_or(0, |r| r.clients().len() as u64),
        logins: crate::stats::LoginStats {
            in_flight: node.logins_in_flight as u64,
            ..node.login_counts.clone()
        },
        groups_max: node.settings.stats_groups_max,
        group_summary: {
            let sleep = node.groups.sleep_stats();
            crate::stats::GroupSummary {
                sleeps: sleep.sleeps,
                silent_wakes: sleep.silent_wakes,
                ..Default::default()
            }
        },
        ..Snapshot::default()
    }
}

/// How the groups this node leads see one peer: skipping it as slow or not.
#[derive(Clone, Copy, Default)]
struct SlowPeer {
    groups: u64,
    since_unix_ms: Option<u64>,
    skips: u64,
}

/// Per peer: the groups that skip it as slow now, since when, and how often they did.
fn slow_peers(node: &Node) -> BTreeMap<u8, SlowPeer> {
    let now_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let tick_ms = node.settings.tick.as_millis() as u64;
    let mut peers: BTreeMap<u8, SlowPeer> = BTreeMap::new();
    for (_, replica, _) in node.groups.iter() {
        let (skips, _) = replica.slow_counts();
        let skipped = replica.slow_peers();
        if skips == 0 && skipped == 0 {
            continue;
        }
        for peer in 0..replica.config().replica_count {
            let entry = peers.entry(peer).or_default();
            entry.skips += replica.slow_skips_of(peer);
            if skipped & (1 << peer) != 0 {
                entry.groups += 1;
                if let Some(since) = replica.slow_since(peer) {
                    let age_ms = replica.now().saturating_sub(since) * tick_ms;
                    let at = now_unix_ms.saturating_sub(age_ms);
                    entry.since_unix_ms = Some(entry.since_unix_ms.map_or(at, |s| s.min(at)));
                }
            }
        }
    }
    peers
}

/// What the logs say of a group: status, view, primary, quorum, what it recovers for.
type GroupLook = (GroupStatus, u32, u8, bool, Option<String>);

/// What each group looked like at the last publish, to log changes once.
#[derive(Default)]
pub struct Transitions {
    seen: RefCell<BTreeMap<String, GroupLook>>,
    /// Peers skipped as slow at the last publish.
    slow: RefCell<BTreeMap<u8, bool>>,
    /// Per group: its view at the last publish and when this node saw it change.
    views: RefCell<HashMap<String, (u32, Option<u64>)>>,
    /// View changes seen since start, summed over the groups.
    view_changes: Cell<u64>,
    /// The groups' fingerprint at the last publish (`groups_fingerprint`).
    fingerprint: Cell<Option<u64>>,
}

impl Transitions {
    /// Fills each group's `view_changed_unix_ms` and the summary's `view_changes` from
    /// the views seen at earlier publishes; forgets deleted groups.
    fn track_views(&self, snapshot: &mut Snapshot, now_unix_ms: u64) {
        let mut views = self.views.borrow_mut();
        let mut next = HashMap::with_capacity(snapshot.groups.len());
        for g in &mut snapshot.groups {
            let changed_at = match views.remove(&g.group) {
                Some((view, at)) if view == g.view => at,
                Some((view, _)) => {
                    let changes = u64::from(g.view.saturating_sub(view));
                    self.view_changes.set(self.view_changes.get() + changes);
                    Some(now_unix_ms)
                }
                None => None,
            };
            g.view_changed_unix_ms = changed_at;
            next.insert(g.group.clone(), (g.view, changed_at));
        }
        *views = next;
        snapshot.group_summary.view_changes = self.view_changes.get();
        self.seen
            .borrow_mut()
            .retain(|group, _| views.contains_key(group));
    }

    /// Logs one line per group whose status, view, primary or quorum changed since the
    /// last snapshot (view changes, elections, quorum lost and regained), with the
    /// group, view and op.
    fn log_changes(&self, snapshot: &Snapshot, groups_changed: bool) {
        let mut slow = self.slow.borrow_mut();
        for p in &snapshot.peers {
            let before = slow.insert(p.replica, p.skipped_slow).unwrap_or(false);
            if before == p.skipped_slow {
                continue;
            }
            if p.skipped_slow {
                tracing::warn!(
                    peer = p.replica,
                    groups = p.skipped_slow_groups,
                    queue_depth = p.queue_depth,
                    "peer skipped by the chain as slow: connected but not keeping up"
                );
            } else {
                tracing::info!(peer = p.replica, "peer keeps up again: back in the chain");
            }
        }
        if !groups_changed {
            return;
        }
        let mut seen = self.seen.borrow_mut();
        for g in &snapshot.groups {
            let now = (g.status, g.view, g.primary, g.quorum, g.recovery.clone());
            let before = seen.insert(g.group.clone(), now.clone());
            if before == Some(now) {
                continue;
            }
            let role = if g.is_primary { "primary" } else { "backup" };
            if let Some(recovery) = &g.recovery {
                tracing::warn!(
                    group = %g.name, view = g.view, op = g.op, commit = g.commit,
                    "group may not vote: {recovery}"
                );
            } else if g.quorum {
                tracing::info!(
                    group = %g.name, view = g.view, op = g.op, commit = g.commit,
                    status = %g.status.name(), primary = g.primary, role = %role,
                    "group state"
                );
            } else {
                tracing::warn!(
                    group = %g.name, view = g.view, op = g.op, commit = g.commit,
                    status = %g.status.name(), primary = g.primary, role = %role,
                    "group state: no replication quorum"
                );
            }
        }
    }
}

/// The TLS material's status of both ports, for one publish.
pub struct TlsStatus {
    pub client: crate::stats::TlsStats,
    pub replica: crate::stats::TlsStats,
}

/// Publishes the node's snapshot for the stats thread, logging group state changes.
/// When no group changed since the last publish (the groups' fingerprint is the same),
/// the published group list is kept and only the node's own figures are rebuilt.
pub fn publish(
    shared: &SharedSnapshot,
    node: &Node,
    transitions: &Transitions,
    state_transfer: &Mutex<StateTransferStats>,
    tls: TlsStatus,
) {
    let mut next = node_figures(node);
    next.client_tls = tls.client;
    next.replica_tls = tls.replica;
    next.state_transfer = match state_transfer.lock() {
        Ok(guard) => guard.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    };
    let now_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let connected = connected_replicas(&next);
    let fingerprint = groups_fingerprint(node, connected);
    let unchanged = transitions.fingerprint.replace(Some(fingerprint)) == Some(fingerprint);
    let mut guard = match shared.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    };
    if unchanged {
        // Back in id order (the order `group_stats` builds), which ranking sorts within
        // each class.
        next.groups = std::mem::take(&mut guard.groups);
        next.groups
            .sort_by_cached_key(|g| g.group.parse::<u64>().unwrap_or(u64::MAX));
        next.group_summary.view_changes = transitions.view_changes.get();
    } else {
        next.groups = group_stats(node, connected);
        transitions.track_views(&mut next, now_unix_ms);
    }
    next.rank_groups(now_unix_ms);
    transitions.log_changes(&next, !unchanged);
    *guard = next;
}

/// What a replica that may not vote waits for, as /stats and the logs say it.
pub fn describe_recovery(wait: replication::vsr::RecoveryWait) -> String {
    use replication::vsr::RecoveryWait;
    match wait {
        RecoveryWait::Formation { answered, peers } => format!(
            "formatted: waiting for every member to answer whether the cluster formed \
             ({answered} of {peers} answered)"
        ),
        RecoveryWait::Census { heard, needed } => {
            format!("lost its state: waiting for {needed} members that remember ({heard} answered)")
        }
        RecoveryWait::StartView { view_min } => {
            format!("lost its state: waiting for the primary of view {view_min} or later")
        }
        RecoveryWait::CatchUp { commit, op } => format!(
            "lost its state: catching up to op {} before it votes (committed {commit})",
            op.max(commit)
        ),
    }
}
