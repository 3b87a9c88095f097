//! What a node reports about itself (docs/operations.md): one snapshot
//! type, rendered as JSON for `GET /stats` and as Prometheus text for `GET /metrics`,
//! and the health verdict for `GET /health`. The replica executor publishes snapshots;
//! the HTTP server only reads the latest, so a slow client never touches consensus.

pub mod http;
pub mod prometheus;

use std::collections::BTreeMap;

use serde::Serialize;

/// A group's VSR status as operators see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupStatus {
    Normal,
    ViewChange,
    Recovering,
    StateTransfer,
}

impl GroupStatus {
    pub fn name(self) -> &'static str {
        match self {
            GroupStatus::Normal => "normal",
            GroupStatus::ViewChange => "view_change",
            GroupStatus::Recovering => "recovering",
            GroupStatus::StateTransfer => "state_transfer",
        }
    }
}

/// One consensus group on this node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GroupStats {
    /// The group value (decimal string: u64 does not fit a JSON number safely).
    pub group: String,
    /// "metadata" or "stream/topic/partition".
    pub name: String,
    pub status: GroupStatus,
    pub view: u32,
    pub log_view: u32,
    pub primary: u8,
    pub is_primary: bool,
    pub op: u64,
    pub commit: u64,
    /// Whether a replication quorum is reachable (for /health).
    pub quorum: bool,
    /// Whether this replica votes; false while it recovers lost state (status
    /// `recovering`, with `recovery` saying what it waits for).
    pub voter: bool,
    /// What a replica that may not vote yet waits for, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery: Option<String>,
    /// The backups this primary's chain skips as slow.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped_slow: Vec<u8>,
    /// The highest commit this replica knows the group reached (its own on a primary).
    pub commit_max: u64,
    /// When this node last saw the group's view change (absent: not since it started).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub view_changed_unix_ms: Option<u64>,
    /// Idle, the node does not tick it until traffic or a silent primary wakes it.
    pub asleep: bool,
    /// Why the group is listed ahead of the healthy ones (absent when healthy).
    #[serde(skip_serializing_if = "Attention::is_none")]
    pub attention: Attention,
}

impl GroupStats {
    /// Ops this replica is behind the group: its highest op or the highest commit it
    /// knows of, less its own commit.
    pub fn commit_lag(&self) -> u64 {
        self.op.max(self.commit_max).saturating_sub(self.commit)
    }
}

/// Why a group needs an operator's eye, most urgent first; `groups` in `/stats` lists
/// groups in this order (the metadata group always first), so a bounded list keeps the
/// ones that matter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Attention {
    NoQuorum,
    /// Status other than normal: view change, recovering, state transfer.
    NotNormal,
    /// Its chain skips a backup as slow.
    SkipsSlowPeer,
    /// Its view changed within `VIEW_CHANGE_RECENT`.
    ViewChanged,
    /// Its commit is more than `COMMIT_LAG_LISTED` ops behind.
    CommitLag,
    #[default]
    None,
}

impl Attention {
    /// A view change this recent lists the group (the window of the views-rising alert).
    pub const VIEW_CHANGE_RECENT_MS: u64 = 15 * 60 * 1000;
    /// A commit lag above this lists the group (the commit-lag alert's threshold).
    pub const COMMIT_LAG_LISTED: u64 = 1000;

    pub fn is_none(&self) -> bool {
        *self == Attention::None
    }

    /// The most urgent reason `group` needs attention at `now_unix_ms`.
    pub fn of(group: &GroupStats, now_unix_ms: u64) -> Attention {
        let recent = group
            .view_changed_unix_ms
            .is_some_and(|at| now_unix_ms.saturating_sub(at) <= Self::VIEW_CHANGE_RECENT_MS);
        if !group.quorum {
            Attention::NoQuorum
        } else if group.status != GroupStatus::Normal {
            Attention::NotNormal
        } else if !group.skipped_slow.is_empty() {
            Attention::SkipsSlowPeer
        } else if recent {
            Attention::ViewChanged
        } else if group.commit_lag() > Self::COMMIT_LAG_LISTED {
            Attention::CommitLag
        } else {
            Attention::None
        }
    }
}

/// Counts over every group of the node, however many `groups` lists.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GroupSummary {
    pub total: u64,
    /// Groups in `groups` (all of them with `?groups=all` or up to
    /// `limits.stats_groups_max`).
    pub listed: u64,
    pub normal: u64,
    pub view_change: u64,
    pub recovering: u64,
    pub state_transfer: u64,
    pub without_quorum: u64,
    /// Groups this node is primary of.
    pub primary: u64,
    /// Groups with a reason in `attention`.
    pub needing_attention: u64,
    /// Idle groups the node does not tick now; how many times groups fell asleep, and
    /// woke because the node of their primary went silent, since the node started.
    pub asleep: u64,
    pub sleeps: u64,
    pub silent_wakes: u64,
    /// View changes this node saw, summed over its groups, since it started.
    pub view_changes: u64,
}

/// One replica-plane peer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PeerStats {
    pub replica: u8,
    pub connected: bool,
    pub queue_depth: u64,
    pub dropped: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Whether a group this node leads skips the peer in its chain as slow (connected
    /// but not keeping up), how many groups do, and since when (Unix milliseconds, the
    /// earliest of them).
    pub skipped_slow: bool,
    pub skipped_slow_groups: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped_slow_since_unix_ms: Option<u64>,
    /// Times the groups this node leads skipped the peer as slow, since the groups
    /// started.
    pub slow_skips: u64,
}

/// Where a cluster member answers, from the config: lets `appliance-cli status` reach
/// every node's stats endpoint from any one node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NodeAddresses {
    pub replica: u8,
    pub name: String,
    /// Client plane "ip:port" (the advertised address when one is configured).
    pub client: String,
    /// Stats endpoint "ip:port".
    pub http: String,
}

/// Password logins: those checked (Argon2id, on the password thread) and those let in
/// because the same credentials checked out lately.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LoginStats {
    pub password_checks: u64,
    pub reused: u64,
    /// Password checks and hashes queued or running now.
    pub in_flight: u64,
}

/// Journal repair progress.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RepairStats {
    pub requests_sent: u64,
    pub prepares_received: u64,
    pub prepares_served: u64,
    pub ranges_evicted: u64,
}

/// State transfer progress (the statexfer executor publishes it).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StateTransferStats {
    /// This node is fetching state; the fields down to `rate_bytes_per_s` describe the
    /// transfers under way (summed over groups).
    pub active: bool,
    pub commit_op: u64,
    pub artifacts_total: u64,
    pub artifacts_done: u64,
    pub bytes_total: u64,
    pub bytes_done: u64,
    /// Bytes fetched over the network per second since the transfer started.
    pub rate_bytes_per_s: f64,
    /// Fetching, since start: transfers begun, installed, failed; whole artifacts
    /// refetched after a checksum mismatch; stalled requests; peer switches; bytes of
    /// sealed segments staged from local copies instead of fetched.
    pub transfers_started: u64,
    pub transfers_completed: u64,
    pub transfers_failed: u64,
    pub refetches: u64,
    pub stalls: u64,
    pub peer_switches: u64,
    pub bytes_reused: u64,
    /// Bytes and seconds of the last completed transfer.
    pub last_bytes: u64,
    pub last_seconds: f64,
    /// Seconds during which at least one transfer was fetching.
    pub fetching_seconds: f64,
    /// Serving: frozen offers held, transfers being served, targets offered and
    /// refused, chunks and bytes served, chunk requests refused (unknown transfer).
    pub offers: u64,
    pub transfers_serving: u64,
    pub targets_offered: u64,
    pub targets_refused: u64,
    pub chunks_served: u64,
    pub bytes_served: u64,
    pub chunks_refused: u64,
    /// Frames dropped because the queue to the replica executor was full.
    pub frames_dropped: u64,
    /// Freezes hashed too late to offer (the commit point had moved on), frozen again.
    pub refreezes: u64,
}

/// Percentiles of one latency histogram, microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Latency {
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

impl Latency {
    /// Summarises an hdrhistogram of microseconds.
    pub fn of(histogram: &hdrhistogram::Histogram<u64>) -> Latency {
        if histogram.is_empty() {
            return Latency::default();
        }
        Latency {
            count: histogram.len(),
            p50: histogram.value_at_quantile(0.50),
            p99: histogram.value_at_quantile(0.99),
            p999: histogram.value_at_quantile(0.999),
            max: histogram.max(),
        }
    }
}

/// The three latency figures of docs/operations.md.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Latencies {
    /// Client request received to reply sent.
    pub request: Latency,
    /// Prepare sent to committed (primary).
    pub prepare_commit: Latency,
    /// Journal write to durable.
    pub journal_fsync: Latency,
}

/// Everything `GET /stats` returns.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Snapshot {
    pub replica_id: u8,
    pub cluster: String,
    pub uptime_s: u64,
    pub groups: Vec<GroupStats>,
    pub peers: Vec<PeerStats>,
    /// Every cluster member (this node included) and its addresses.
    pub nodes: Vec<NodeAddresses>,
    /// Rejected frames and requests by reason label.
    pub rejected: BTreeMap<String, u64>,
    pub repair: RepairStats,
    pub state_transfer: StateTransferStats,
    pub latency_us: Latencies,
    pub client_connections: u64,
    pub sessions: u64,
    pub logins: LoginStats,
    pub storage: StorageStats,
    pub group_summary: GroupSummary,
    /// TLS on the client port (`tcp.tls`).
    pub client_tls: TlsStats,
    /// TLS on the replica plane (`cluster.tls`).
    pub replica_tls: TlsStats,
    /// `limits.stats_groups_max`: how many groups a bounded answer lists.
    #[serde(skip)]
    pub groups_max: usize,
}

/// TLS on a port (client or replica plane): whether it is on, when the certificate in
/// use was loaded, and how SIGHUP reloads went.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TlsStats {
    pub enabled: bool,
    /// When the certificate the client port presents now was read (0: TLS off).
    pub loaded_unix_ms: u64,
    /// Reloads that replaced the certificate.
    pub reloads: u64,
    /// Reloads that failed (the previous certificate stays in use).
    pub reload_failures: u64,
    /// Why the last reload failed, until one succeeds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The partition logs' segments and what their in-memory indexes take.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StorageStats {
    pub partitions: u64,
    pub segments: u64,
    /// Memory of the sparse offset/time indexes (grows with the data kept).
    pub index_bytes: u64,
    /// Memory of the prepare records' in-memory index (bounded by the records kept
    /// between checkpoint compactions).
    pub prepare_index_bytes: u64,
    /// Memory of the committed prepares kept to serve repair to lagging replicas
    /// (bounded per partition and node-wide).
    pub repair_window_bytes: u64,
    /// Times a partition checkpointed at its commit point gave up that prepare too
    /// while the repair windows were over `limits.repair_memory_max` (read back from
    /// disk when a state transfer asks for it).
    pub commit_prepares_released: u64,
    /// Free and total bytes of the data directory's file system, and the bytes of the
    /// node's data (segments and the metadata journal).
    pub free_bytes: u64,
    pub total_bytes: u64,
    pub used_bytes: u64,
    /// The budget: `storage.min_free_bytes` and `storage.max_used_bytes` (0: none).
    pub min_free_bytes: u64,
    pub max_used_bytes: u64,
    /// Bytes the reserve file holds now (given back when a write meets a full disk).
    pub reserve_bytes: u64,
    /// New writes are refused (StorageFull); `full_reason` says why.
    pub full: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub full_reason: Option<String>,
    /// Writes that met a full disk, requests refused for storage, and partition groups
    /// stopped until space returns.
    pub no_space_errors: u64,
    pub writes_refused: u64,
    pub stopped_groups: u64,
}

impl Snapshot {
    /// Marks every group's `attention` at `now_unix_ms`, orders `groups` the metadata
    /// group first, then by attention (most urgent first), then by group, and counts
    /// them into `group_summary` (`view_changes` is the publisher's).
    pub fn rank_groups(&mut self, now_unix_ms: u64) {
        let summary = &mut self.group_summary;
        summary.total = self.groups.len() as u64;
        summary.listed = summary.total;
        for g in &mut self.groups {
            g.attention = Attention::of(g, now_unix_ms);
            match g.status {
                GroupStatus::Normal => summary.normal += 1,
                GroupStatus::ViewChange => summary.view_change += 1,
                GroupStatus::Recovering => summary.recovering += 1,
                GroupStatus::StateTransfer => summary.state_transfer += 1,
            }
            summary.without_quorum += u64::from(!g.quorum);
            summary.primary += u64::from(g.is_primary);
            summary.needing_attention += u64::from(!g.attention.is_none());
            summary.asleep += u64::from(g.asleep);
        }
        // Stable: groups keep their id order within a class.
        self.groups
            .sort_by_key(|g| (g.name != "metadata", g.attention));
    }

    /// The snapshot as a bounded answer: `groups` cut to `groups_max` (the most urgent
    /// first, see `rank_groups`) unless `all`.
    pub fn bounded(mut self, all: bool) -> Snapshot {
        if !all {
            self.groups.truncate(self.groups_max.max(1));
        }
        self.group_summary.listed = self.groups.len() as u64;
        self
    }

    /// `GET /health`: healthy when every group is normal with a quorum; otherwise the
    /// first reason it is not.
    pub fn health(&self) -> Result<(), String> {
        if self.groups.is_empty() {
            return Err("no consensus group is running yet".into());
        }
        if self.storage.full {
            let reason = self
                .storage
                .full_reason
                .as_deref()
                .unwrap_or("storage full");
            return Err(format!("storage full, new writes refused: {reason}"));
        }
        for group in &self.groups {
            if group.status != GroupStatus::Normal {
                return Err(format!("group {} is {}", group.name, group.status.name()));
            }
            if !group.quorum {
                return Err(format!("group {} has no replication quorum", group.name));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A snapshot with every kind of field filled, for renderer tests.
    pub fn sample() -> Snapshot {
        let mut rejected = BTreeMap::new();
        rejected.insert("frame_seal_mismatch".to_string(), 3);
        rejected.insert("size_too_large".to_string(), 1);
        let mut histogram = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        for v in 1..=1000 {
            histogram.record(v).unwrap();
        }
        Snapshot {
            replica_id: 1,
            cluster: "prod".into(),
            uptime_s: 42,
            logins: LoginStats {
                password_checks: 7,
                reused: 40,
                in_flight: 1,
            },
            groups: vec![
                GroupStats {
                    group: (1u64 << 63).to_string(),
                    name: "metadata".into(),
                    status: GroupStatus::Normal,
                    view: 3,
                    log_view: 3,
                    primary: 0,
                    is_primary: false,
                    op: 120,
                    commit: 118,
                    quorum: true,
                    voter: true,
                    recovery: None,
                    skipped_slow: Vec::new(),
                    commit_max: 118,
                    view_changed_unix_ms: None,
                    asleep: false,
                    attention: Attention::None,
                },
                GroupStats {
                    group: (1u64 << 32 | 1 << 20).to_string(),
                    name: "1/1/0".into(),
                    status: GroupStatus::Normal,
                    view: 3,
                    log_view: 3,
                    primary: 0,
                    is_primary: false,
                    op: 5000,
                    commit: 4999,
                    quorum: true,
                    voter: true,
                    recovery: None,
                    skipped_slow: Vec::new(),
                    commit_max: 4999,
                    view_changed_unix_ms: Some(1_700_000_000_000),
                    asleep: true,
                    attention: Attention::None,
                },
            ],
            peers: vec![
                PeerStats {
                    replica: 0,
                    connected: true,
                    queue_depth: 2,
                    dropped: 0,
                    bytes_sent: 100,
                    bytes_received: 900,
                    skipped_slow: true,
                    skipped_slow_groups: 3,
                    skipped_slow_since_unix_ms: Some(1_700_000_000_000),
                    slow_skips: 4,
                },
                PeerStats {
                    replica: 2,
                    connected: false,
                    queue_depth: 0,
                    dropped: 7,
                    bytes_sent: 10,
                    bytes_received: 0,
                    ..PeerStats::default()
                },
            ],
            nodes: (0..3)
                .map(|r| NodeAddresses {
                    replica: r,
                    name: format!("n{r}"),
                    client: format!("127.0.0.1:{}", 8090 + u16::from(r)),
                    http: format!("127.0.0.1:{}", 3000 + u16::from(r)),
                })
                .collect(),
            rejected,
            repair: RepairStats {
                requests_sent: 2,
                prepares_received: 40,
                prepares_served: 0,
                ranges_evicted: 0,
            },
            state_transfer: StateTransferStats::default(),
            latency_us: Latencies {
                request: Latency::of(&histogram),
                ..Default::default()
            },
            client_connections: 5,
            sessions: 4,
            client_tls: TlsStats {
                enabled: true,
                loaded_unix_ms: 1_700_000_000_000,
                reloads: 1,
                reload_failures: 2,
                last_error: None,
            },
            replica_tls: TlsStats::default(),
            storage: StorageStats {
                partitions: 2,
                segments: 7,
                index_bytes: 4096,
                prepare_index_bytes: 8192,
                repair_window_bytes: 1 << 20,
                free_bytes: 3 << 30,
                total_bytes: 8 << 30,
                used_bytes: 1 << 30,
                min_free_bytes: 1 << 30,
                ..StorageStats::default()
            },
            group_summary: GroupSummary {
                total: 2,
                listed: 2,
                normal: 2,
                view_changes: 6,
                ..GroupSummary::default()
            },
            groups_max: 1000,
        }
    }

    #[test]
    fn health_is_503_while_storage_refuses_writes() {
        let mut s = sample();
        s.storage.full = true;
        s.storage.full_reason = Some("a write met a full disk".into());
        assert_eq!(
            s.health(),
            Err("storage full, new writes refused: a write met a full disk".into())
        );
    }

    #[test]
    fn health_names_the_first_group_that_is_not_normal() {
        let mut s = sample();
        assert_eq!(s.health(), Ok(()));
        s.groups[1].status = GroupStatus::ViewChange;
        assert_eq!(s.health(), Err("group 1/1/0 is view_change".into()));
        s.groups[1].status = GroupStatus::Normal;
        s.groups[0].quorum = false;
        assert!(s.health().unwrap_err().contains("quorum"));
        assert!(Snapshot::default().health().is_err());
    }

    /// A partition group named after `partition`, healthy unless changed.
    fn partition_group(partition: u32) -> GroupStats {
        let mut g = sample().groups[1].clone();
        g.group = (1u64 << 32 | u64::from(partition)).to_string();
        g.name = format!("1/1/{partition}");
        g.view_changed_unix_ms = None;
        g
    }

    #[test]
    fn a_bounded_answer_keeps_metadata_and_the_groups_needing_attention() {
        let now = 1_800_000_000_000;
        let mut s = sample();
        s.groups.truncate(1);
        s.groups.extend((0..10).map(partition_group));
        // Listed in id order; the urgent ones sit at the end.
        s.groups[9].view_changed_unix_ms = Some(now - 60_000);
        s.groups[10].quorum = false;
        s.groups[8].status = GroupStatus::StateTransfer;
        s.groups[7].commit_max = s.groups[7].commit + Attention::COMMIT_LAG_LISTED + 1;
        s.groups[6].skipped_slow = vec![2];
        // A view change past the window no longer counts.
        s.groups[5].view_changed_unix_ms = Some(now - Attention::VIEW_CHANGE_RECENT_MS - 1);
        s.groups[0].quorum = false;
        s.group_summary = GroupSummary::default();
        s.groups_max = 4;
        s.rank_groups(now);

        let summary = &s.group_summary;
        assert_eq!(
            (summary.total, summary.normal, summary.state_transfer),
            (11, 10, 1)
        );
        assert_eq!(summary.without_quorum, 2);
        assert_eq!(summary.needing_attention, 6);
        let order: Vec<(&str, Attention)> = s
            .groups
            .iter()
            .map(|g| (g.name.as_str(), g.attention))
            .collect();
        assert_eq!(
            order[..7],
            [
                ("metadata", Attention::NoQuorum),
                ("1/1/9", Attention::NoQuorum),
                ("1/1/7", Attention::NotNormal),
                ("1/1/5", Attention::SkipsSlowPeer),
                ("1/1/8", Attention::ViewChanged),
                ("1/1/6", Attention::CommitLag),
                ("1/1/0", Attention::None),
            ]
        );

        let bounded = s.clone().bounded(false);
        assert_eq!(bounded.groups.len(), 4);
        assert_eq!(bounded.group_summary.listed, 4);
        assert_eq!(bounded.group_summary.total, 11);
        assert_eq!(bounded.groups[..], s.groups[..4]);
        let all = s.clone().bounded(true);
        assert_eq!(all.groups.len(), 11);
        assert_eq!(all.group_summary.listed, 11);
        // Health still sees every group: it is asked of the whole snapshot.
        assert!(s.health().unwrap_err().contains("metadata"));
    }

    #[test]
    fn latency_summary_reads_percentiles() {
        let l = sample().latency_us.request;
        assert_eq!(l.count, 1000);
        assert!((495..=505).contains(&l.p50), "{l:?}");
        assert!((985..=995).contains(&l.p99), "{l:?}");
        assert_eq!(l.max, 1000);
    }

    #[test]
    fn json_has_every_documented_field() {
        let json: serde_json::Value = serde_json::to_value(sample()).unwrap();
        for key in [
            "replica_id",
            "cluster",
            "uptime_s",
            "groups",
            "peers",
            "nodes",
            "rejected",
            "repair",
            "state_transfer",
            "latency_us",
            "group_summary",
            "client_tls",
            "replica_tls",
        ] {
            assert!(json.get(key).is_some(), "missing {key}");
        }
        for key in [
            "group",
            "status",
            "view",
            "log_view",
            "primary",
            "op",
            "commit",
            "commit_max",
        ] {
            assert!(
                json["groups"][0].get(key).is_some(),
                "groups[] missing {key}"
            );
        }
        for key in [
            "replica",
            "connected",
            "queue_depth",
            "dropped",
            "bytes_sent",
            "bytes_received",
            "skipped_slow",
            "skipped_slow_groups",
            "skipped_slow_since_unix_ms",
            "slow_skips",
        ] {
            assert!(json["peers"][0].get(key).is_some(), "peers[] missing {key}");
        }
        assert_eq!(json["peers"][1]["skipped_slow"], false);
        assert!(json["peers"][1].get("skipped_slow_since_unix_ms").is_none());
        for figure in ["request", "prepare_commit", "journal_fsync"] {
            for key in ["p50", "p99", "p999", "max"] {
                assert!(
                    json["latency_us"][figure].get(key).is_some(),
                    "latency_us.{figure} missing {key}"
                );
            }
        }
        assert_eq!(json["groups"][0]["status"], "normal");
    }
}
