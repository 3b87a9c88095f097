//! The `appliance` daemon (docs/architecture.md): the replica executor runs the bus,
//! every VSR group, the metadata journal, the partition stores and the client plane on
//! one glommio executor; a second thread serves the stats endpoint.
//!
//! - `node`: the event loop and the execution of consensus actions.
//! - `client`: the client plane (login, requests, reads).
//! - `partitions`: per-partition segment logs and consumer offsets.
//! - `files`: the genesis state and VSR superblock side files.
//! - `stats`: the stats executor and snapshot publishing.
//! - `system`: logging, signals, sd_notify, locked memory.
//! - `certificates`: TLS material of the client port and the replica plane, reloaded on
//!   SIGHUP.

pub mod files;
pub mod node;
pub mod partitions;
pub mod prepares;
pub mod stats;
pub mod system;
pub mod xfer;

mod actions;
mod apply;
mod certificates;
mod checkpoints;
mod client;
mod forward;
mod group_commit;
mod login;
mod messages;
mod metadata_reads;
mod partition_groups;
mod polls;
mod repair_windows;
mod retention;
mod start;
mod storage;
mod superblocks;
mod user_reads;
mod xfer_node;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use journal::segment::PartitionConfig;
use journal::{IntoIoError, JournalError, JournalLayout};
use replication::bus::{AuthConfig, Bus, BusConfig, BusError, NodeAddress};
use replication::vsr;
use replication::wire::batch::BatchError;
use replication::wire::{cluster_id, GroupKind, METADATA_GROUP};

use crate::config::Config;
use crate::state::{auth, MetadataState};
use crate::stats::NodeAddresses;
use node::{BusHandler, Node, Settings};

/// Threads of the replica executor's blocking pool.
const BLOCKING_THREADS: usize = 32;
/// One consensus tick.
pub const TICK: Duration = Duration::from_millis(10);
/// Largest metadata prepare body; larger requests are refused at ingress.
pub const METADATA_BODY_MAX: u64 = 64 * 1024 - 256;
/// The root user's name unless APPLIANCE_ROOT_USERNAME names another at format.
pub const ROOT_USERNAME: &str = "root";
/// Environment variable that names the root user at format (`iggy`, with
/// APPLIANCE_ROOT_PASSWORD=iggy, gives the Iggy server's default credentials).
pub const ROOT_USERNAME_ENV: &str = "APPLIANCE_ROOT_USERNAME";
/// Root password of the no-config development mode when APPLIANCE_ROOT_PASSWORD is
/// unset (documented in README.md; never used with a config file).
pub const DEV_ROOT_PASSWORD: &str = "appliance-root";
/// Environment variable that sets the root password at format.
pub const ROOT_PASSWORD_ENV: &str = "APPLIANCE_ROOT_PASSWORD";

/// Why the daemon stopped with an error, each with the exit code it maps to; or, for
/// `NoSpace`, why one partition group stops while the node goes on.
///
/// The runtime variants say where it happened (the consensus group, the op where one
/// is known, the step) and carry the failure they wrap as a typed source, so a full
/// disk or an exhausted descriptor table is read from the operating system's code
/// (`is_no_space`, `is_out_of_open_files`), not from a message.
#[derive(Debug)]
pub enum DaemonError {
    /// Bad usage or configuration, as text for the operator: exit 2.
    Config(String),
    /// The data directory is not one this command may use as it is.
    DataDir { path: PathBuf, reason: &'static str },
    /// An executor or thread of the daemon could not start.
    Start {
        what: &'static str,
        source: std::io::Error,
    },
    /// A listener of the daemon's own (the stats endpoint) could not bind.
    Listen {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The message bus could not start.
    Bus(BusError),
    /// A file-system call of the daemon's own (not the journal crate's) failed.
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The journal crate failed: the metadata journal, superblock and snapshots, or a
    /// partition's segment log and consumer offsets.
    Journal {
        group: u64,
        op: Option<u64>,
        what: &'static str,
        source: JournalError,
    },
    /// A side file failed: genesis, VSR superblock, checkpoint (files.rs).
    File {
        group: u64,
        what: &'static str,
        source: files::FileError,
    },
    /// A partition group's prepare log failed (prepares.rs).
    PrepareLog {
        group: u64,
        op: Option<u64>,
        source: prepares::PrepareLogError,
    },
    /// A batch read back, committed or transferred fails verification.
    Batch {
        group: u64,
        op: u64,
        what: &'static str,
        source: BatchError,
    },
    /// Other data read back, committed or transferred fails validation.
    Corrupt {
        group: u64,
        op: Option<u64>,
        detail: String,
    },
    /// The node's own bookkeeping broke: a bug, not input.
    Internal {
        group: u64,
        op: Option<u64>,
        detail: &'static str,
    },
    /// A partition group's write met a full disk: the group stops (as a crashed
    /// replica) until space returns; the node goes on (storage.rs). `source` is the
    /// write's error; None when the group's journal lane failed on it before.
    NoSpace {
        group: u64,
        source: Option<Box<DaemonError>>,
    },
}

impl DaemonError {
    pub fn exit_code(&self) -> u8 {
        match self {
            DaemonError::Config(_) => 2,
            _ => 1,
        }
    }

    /// A failure of the journal crate in `group` (at `op` when known) during `what`.
    pub(crate) fn journal(
        group: u64,
        op: Option<u64>,
        what: &'static str,
    ) -> impl Fn(JournalError) -> DaemonError + Copy {
        move |source| DaemonError::Journal {
            group,
            op,
            what,
            source,
        }
    }

    /// A side file's failure in `group` during `what`.
    pub(crate) fn file(
        group: u64,
        what: &'static str,
    ) -> impl Fn(files::FileError) -> DaemonError + Copy {
        move |source| DaemonError::File {
            group,
            what,
            source,
        }
    }

    /// A prepare log's failure in `group` (at `op` when known).
    pub(crate) fn prepare_log(
        group: u64,
        op: Option<u64>,
    ) -> impl Fn(prepares::PrepareLogError) -> DaemonError + Copy {
        move |source| DaemonError::PrepareLog { group, op, source }
    }

    /// A file-system call's failure on `path` during `what`.
    pub(crate) fn io<'a>(
        what: &'static str,
        path: &'a Path,
    ) -> impl Fn(std::io::Error) -> DaemonError + Copy + 'a {
        move |source| DaemonError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }

    /// An executor or thread that could not start (`what`); glommio's errors keep
    /// their OS code.
    pub(crate) fn start<E: IntoIoError>(what: &'static str) -> impl FnOnce(E) -> DaemonError {
        move |source| DaemonError::Start {
            what,
            source: source.into_io_error(),
        }
    }

    /// The operating system's code of the IO error this one comes from, if any: the
    /// first io::Error down the `source` chain that carries one.
    pub fn os_error(&self) -> Option<i32> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(error) = next {
            if let Some(code) = error
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::raw_os_error)
            {
                return Some(code);
            }
            next = error.source();
        }
        None
    }

    /// Whether a write met a full disk or quota (ENOSPC, EDQUOT), or a group stopped
    /// for it.
    pub fn is_no_space(&self) -> bool {
        matches!(self, DaemonError::NoSpace { .. })
            || matches!(self.os_error(), Some(libc::ENOSPC | libc::EDQUOT))
    }

    /// Whether the process or the system ran out of file descriptors (EMFILE, ENFILE).
    pub fn is_out_of_open_files(&self) -> bool {
        matches!(self.os_error(), Some(libc::EMFILE | libc::ENFILE))
    }

    /// The consensus group the error happened in, if it happened in one.
    pub fn group(&self) -> Option<u64> {
        match self {
            DaemonError::Journal { group, .. }
            | DaemonError::File { group, .. }
            | DaemonError::PrepareLog { group, .. }
            | DaemonError::Batch { group, .. }
            | DaemonError::Corrupt { group, .. }
            | DaemonError::Internal { group, .. }
            | DaemonError::NoSpace { group, .. } => Some(*group),
            _ => None,
        }
    }

    /// The op the error happened at, if it is known.
    pub fn op(&self) -> Option<u64> {
        match self {
            DaemonError::Journal { op, .. }
            | DaemonError::PrepareLog { op, .. }
            | DaemonError::Corrupt { op, .. }
            | DaemonError::Internal { op, .. } => *op,
            DaemonError::Batch { op, .. } => Some(*op),
            DaemonError::NoSpace {
                source: Some(source),
                ..
            } => source.op(),
            _ => None,
        }
    }

    /// What went wrong, without the group and op (`Display` puts them first).
    fn fmt_detail(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DaemonError::Config(text) => f.write_str(text),
            DaemonError::DataDir { path, reason } => write!(f, "{} {reason}", path.display()),
            DaemonError::Start { what, source } => write!(f, "{what}: {source}"),
            DaemonError::Listen { what, addr, source } => {
                write!(f, "cannot listen on {addr} ({what}): {source}")
            }
            DaemonError::Bus(source) => write!(f, "message bus: {source}"),
            DaemonError::Io { what, path, source } => {
                write!(f, "{}: {what}: {source}", path.display())
            }
            DaemonError::Journal { what, source, .. } => write!(f, "{what}: {source}"),
            DaemonError::File { what, source, .. } => write!(f, "{what}: {source}"),
            DaemonError::PrepareLog { source, .. } => write!(f, "{source}"),
            DaemonError::Batch { what, source, .. } => write!(f, "{what}: {source}"),
            DaemonError::Corrupt { detail, .. } => f.write_str(detail),
            DaemonError::Internal { detail, .. } => f.write_str(detail),
            DaemonError::NoSpace { source, .. } => {
                f.write_str("the disk is full: ")?;
                match source {
                    Some(source) => source.fmt_detail(f),
                    None => f.write_str("a journal write met it"),
                }
            }
        }
    }
}

/// Where an error happened: a consensus group and the op, when known.
struct Place {
    group: u64,
    op: Option<u64>,
}

impl core::fmt::Display for Place {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match replication::wire::group_kind(self.group) {
            Ok(GroupKind::Metadata) => f.write_str("metadata group")?,
            Ok(GroupKind::Partition(key)) => write!(
                f,
                "partition group {} ({}/{}/{})",
                self.group, key.stream, key.topic, key.partition
            )?,
            Err(_) => write!(f, "group {}", self.group)?,
        }
        match self.op {
            Some(op) => write!(f, " op {op}"),
            None => Ok(()),
        }
    }
}

impl core::fmt::Display for DaemonError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if let Some(group) = self.group() {
            let op = self.op();
            write!(f, "{}: ", Place { group, op })?;
        }
        self.fmt_detail(f)
    }
}

impl std::error::Error for DaemonError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DaemonError::Start { source, .. }
            | DaemonError::Listen { source, .. }
            | DaemonError::Io { source, .. } => Some(source),
            DaemonError::Bus(source) => Some(source),
            DaemonError::Journal { source, .. } => Some(source),
            DaemonError::File { source, .. } => Some(source),
            DaemonError::PrepareLog { source, .. } => Some(source),
            DaemonError::Batch { source, .. } => Some(source),
            DaemonError::NoSpace {
                source: Some(source),
                ..
            } => Some(source.as_ref()),
            DaemonError::Config(_)
            | DaemonError::DataDir { .. }
            | DaemonError::Corrupt { .. }
            | DaemonError::Internal { .. }
            | DaemonError::NoSpace { source: None, .. } => None,
        }
    }
}

/// How the root password is chosen when a data directory is formatted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootPassword {
    /// APPLIANCE_ROOT_PASSWORD, else generated and printed once to stderr.
    EnvOrGenerated,
    /// APPLIANCE_ROOT_PASSWORD, else DEV_ROOT_PASSWORD (no-config mode).
    EnvOrDevDefault,
}

/// APPLIANCE_ROOT_USERNAME if set (1 to 255 bytes, no control characters), else
/// `ROOT_USERNAME`.
fn root_username() -> Result<String, DaemonError> {
    match std::env::var(ROOT_USERNAME_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(ROOT_USERNAME.to_string()),
        Ok(name) if (1..=255).contains(&name.len()) && !name.chars().any(char::is_control) => {
            Ok(name)
        }
        _ => Err(DaemonError::Config(format!(
            "{ROOT_USERNAME_ENV}: the root user's name must be 1 to 255 bytes of UTF-8 \
             without control characters"
        ))),
    }
}

fn root_password(policy: RootPassword) -> String {
    if let Ok(password) = std::env::var(ROOT_PASSWORD_ENV) {
        if !password.is_empty() {
            return password;
        }
    }
    match policy {
        RootPassword::EnvOrDevDefault => DEV_ROOT_PASSWORD.to_string(),
        RootPassword::EnvOrGenerated => {
            let password: String = (0..24).map(|_| fastrand::alphanumeric()).collect();
            eprintln!(
                "appliance: generated root password (shown once): {password} \
                 (set {ROOT_PASSWORD_ENV} to choose it)"
            );
            password
        }
    }
}

fn replica_count(config: &Config) -> Result<u8, DaemonError> {
    u8::try_from(config.replica_count())
        .ok()
        .filter(|n| (1..=vsr::REPLICA_COUNT_MAX).contains(n))
        .ok_or_else(|| DaemonError::Config("cluster.nodes: 1 to 32 nodes".into()))
}

fn journal_layout(config: &Config) -> Result<JournalLayout, DaemonError> {
    let slot = journal::layout::sector_ceil(256 + METADATA_BODY_MAX);
    let slot_count = (config.storage.journal_size.0 / (slot + 256)).clamp(4, 1 << 20);
    JournalLayout::new(slot_count, slot)
        .map_err(|e| DaemonError::Config(format!("storage.journal_size: {e}")))
}

/// Formats `dir` for `replica_id`: the journal and superblock, then the genesis state
/// holding the root user. Refuses a directory that is not empty.
pub fn format(config: &Config, replica_id: u8, policy: RootPassword) -> Result<(), DaemonError> {
    let count = replica_count(config)?;
    if config.node(replica_id).is_none() {
        return Err(DaemonError::Config(format!(
            "replica id {replica_id} is not in cluster.nodes"
        )));
    }
    let dir = config.storage.data_dir.clone();
    if let Ok(mut entries) = std::fs::read_dir(&dir) {
        if entries.next().is_some() {
            return Err(DaemonError::DataDir {
                path: dir,
                reason: "is not empty; refusing to format it",
            });
        }
    }
    let layout = journal_layout(config)?;
    let password = root_password(policy);
    if password.len() < auth::PASSWORD_LEN_MIN {
        eprintln!(
            "appliance: the root password is shorter than {} bytes: change it before \
             exposing the node",
            auth::PASSWORD_LEN_MIN
        );
    }
    let hash = auth::hash_operator_password(password.as_bytes())
        .map_err(|e| DaemonError::Config(format!("root password: {e}")))?;
    let genesis = MetadataState::formatted(&root_username()?, hash).snapshot();
    let identity = journal::Superblock {
        cluster: cluster_id(&config.cluster.name),
        replica: replica_id,
        replica_count: count,
        ..Default::default()
    };
    std::fs::create_dir_all(&dir).map_err(DaemonError::io("create directory", &dir))?;
    // The genesis file goes first: the superblock (written last by format) marks done.
    files::write_genesis(&dir, &genesis).map_err(DaemonError::file(METADATA_GROUP, "genesis"))?;
    let executor = journal::runtime::executor_builder()
        .name("format")
        .make()
        .map_err(DaemonError::start("executor"))?;
    executor.run(async {
        journal::runtime::choose_disk_completions(&dir)
            .await
            .map_err(DaemonError::start("disk completions"))?;
        journal::data_dir::format(&dir, layout, identity)
            .await
            .map_err(DaemonError::journal(METADATA_GROUP, None, "format"))
    })?;
    tracing::info!(dir = %dir.display(), replica_id, "data directory formatted");
    Ok(())
}

/// Formats `dir` for a member that replaces one whose data was lost (a new disk): as
/// `format`, then marks the node a replacement, so every group it holds rejoins as a
/// non-voter and votes only once it caught up with the cluster (`vsr::Replica`'s
/// replacement rules). Refuses a single-node cluster: it has nobody to recover from.
pub fn recover(config: &Config, replica_id: u8, policy: RootPassword) -> Result<(), DaemonError> {
    if replica_count(config)? == 1 {
        return Err(DaemonError::Config(
            "recover: a single-node cluster has no other member to recover from; use \
             `appliance format`"
                .into(),
        ));
    }
    format(config, replica_id, policy)?;
    let superblock = vsr::Superblock {
        replacement: true,
        ..vsr::Superblock::default()
    };
    files::write_vsr_superblock(&config.storage.data_dir, &superblock)
        .map_err(DaemonError::file(METADATA_GROUP, "VSR superblock"))?;
    tracing::info!(
        dir = %config.storage.data_dir.display(),
        replica_id,
        "data directory formatted as a replacement: it rejoins once the cluster vouches for it"
    );
    Ok(())
}

fn ticks(duration: Duration) -> u64 {
    (duration.as_millis() / TICK.as_millis()).max(1) as u64
}

fn settings(config: &Config, replica_id: u8) -> Result<Settings, DaemonError> {
    let count = replica_count(config)?;
    let cluster = cluster_id(&config.cluster.name);
    let mut vsr_config = vsr::Config::new(cluster, METADATA_GROUP, replica_id, count);
    let c = &config.cluster;
    vsr_config.pipeline_max = u64::from(c.pipeline_max).clamp(1, vsr::PIPELINE_MAX);
    vsr_config.commit_broadcast_interval_ticks = ticks(c.commit_broadcast_interval.0);
    vsr_config.heartbeat_timeout_ticks =
        ticks(c.heartbeat_timeout.0).max(vsr_config.commit_broadcast_interval_ticks + 1);
    vsr_config.prepare_retransmit_interval_ticks = ticks(c.prepare_retransmit_interval.0);
    vsr_config.view_change_retransmit_interval_ticks = ticks(c.view_change_retransmit_interval.0);
    vsr_config.view_change_timeout_ticks = 2 * vsr_config.heartbeat_timeout_ticks;
    vsr_config.repair_interval_ticks = vsr_config.prepare_retransmit_interval_ticks;
    vsr_config.slow_lag_min_ticks = ticks(c.slow_peer_lag_min.0);
    vsr_config.slow_readmit_ticks = ticks(c.slow_peer_readmit.0);
    vsr_config.repair_chunk_max = u64::from(c.repair_chunk_max);
    vsr_config.peer_queue_capacity = u64::from(config.message_bus.peer_queue_capacity);
    // The client plane refuses a Register once sessions_max sessions exist; Registers
    // already in the pipeline may still commit, so the table has room for them and never
    // evicts an admitted session.
    vsr_config.clients_max = (config.limits.sessions_max.max(1) + c.pipeline_max) as usize;
    vsr_config.seed = fastrand::u64(..);
    vsr_config
        .validate()
        .map_err(|e| DaemonError::Config(format!("cluster: {e}")))?;
    let client_addresses: BTreeMap<u8, String> = config
        .cluster
        .nodes
        .iter()
        .map(|n| {
            let address = n
                .advertised_address
                .clone()
                .unwrap_or_else(|| SocketAddr::new(n.ip, n.ports.tcp).to_string());
            (n.replica_id, address)
        })
        .collect();
    let nodes = config
        .cluster
        .nodes
        .iter()
        .map(|n| NodeAddresses {
            replica: n.replica_id,
            name: n.name.clone(),
            client: client_addresses
                .get(&n.replica_id)
                .cloned()
                .unwrap_or_default(),
            http: SocketAddr::new(n.ip, n.ports.http).to_string(),
        })
        .collect();
    Ok(Settings {
        cluster,
        cluster_name: config.cluster.name.clone(),
        replica: replica_id,
        replica_count: count,
        vsr: vsr_config,
        data_dir: config.storage.data_dir.clone(),
        partition: PartitionConfig {
            segment_size_max: config.storage.segment_size.0,
            index_interval_bytes: 4096,
            durability: config.storage.message_durability,
        },
        offset_durability: config.storage.offset_durability,
        client_addresses,
        nodes,
        tick: TICK,
        client_limits: client::ClientLimits {
            requests_in_flight_per_session: config.limits.requests_in_flight_per_session,
            sessions_max: config.limits.sessions_max,
        },
        budget: storage::Budget {
            min_free_bytes: config.storage.min_free_bytes.0,
            max_used_bytes: config.storage.max_used_bytes.0,
            reserve_bytes: config.storage.reserve_bytes.0,
        },
        retention: retention::RetentionSettings {
            message_expiry: config.retention.message_expiry.0,
            max_topic_size: config.retention.max_topic_size.0,
            check_ticks: (config.retention.check_interval.0.as_millis() as u64
                / TICK.as_millis() as u64)
                .max(1),
        },
        stats_groups_max: config.limits.stats_groups_max as usize,
        repair_memory_max: config.limits.repair_memory_max.0,
        partition_files_max: node::partition_files_by_limit(system::open_files_limit()),
        spread_primaries: config.cluster.spread_primaries,
    })
}

fn bus_config(config: &Config, replica_id: u8) -> Result<BusConfig, DaemonError> {
    let nodes = config
        .cluster
        .nodes
        .iter()
        .map(|n| NodeAddress {
            replica_id: n.replica_id,
            addr: SocketAddr::new(n.ip, n.ports.tcp_replica),
            tls_server_name: None,
        })
        .collect();
    let node = config.node(replica_id).ok_or_else(|| {
        DaemonError::Config(format!("replica id {replica_id} is not in cluster.nodes"))
    })?;
    let mut bus = BusConfig::new(&config.cluster.name, replica_id, nodes);
    bus.client_listen = Some(SocketAddr::new(node.ip, node.ports.tcp));
    bus.max_message_size = u32::try_from(config.message_bus.max_message_size.0).unwrap_or(u32::MAX);
    bus.peer_queue_capacity = config.message_bus.peer_queue_capacity as usize;
    bus.max_batch = config.message_bus.max_batch as usize;
    bus.reconnect_period = config.message_bus.reconnect_period.0;
    bus.handshake_grace = config.message_bus.handshake_grace.0;
    bus.client_connections_max = config.limits.client_connections_max as usize;
    let tls = &config.cluster.tls;
    bus.tls = replication::bus::TlsConfig {
        enabled: tls.enabled,
        cert_file: tls.cert_file.clone().unwrap_or_default(),
        key_file: tls.key_file.clone().unwrap_or_default(),
        ca_file: tls.ca_file.clone().unwrap_or_default(),
    };
    bus.client_tls =
        certificates::load_at_start(certificates::ClientTlsFiles::of(&config.tcp.tls).as_ref())?;
    bus.handshakes_max = config.message_bus.handshakes_max as usize;
    bus.client_frame_max = u32::try_from(config.limits.request_body_max.0 + 256)
        .unwrap_or(u32::MAX)
        .min(bus.max_message_size);
    bus.client_frame_memory_max =
        usize::try_from(config.limits.frame_memory_max.0).unwrap_or(usize::MAX);
    bus.auth = AuthConfig {
        enabled: config.cluster.auth.enabled,
        shared_secret: config.cluster.auth.shared_secret.as_bytes().to_vec(),
        previous_shared_secret: config
            .cluster
            .auth
            .previous_shared_secret
            .as_ref()
            .map(|s| s.as_bytes().to_vec()),
    };
    Ok(bus)
}

/// Where the replica executor runs: with `runtime.pin_cpus`, on the last CPU this
/// process may use (the stats thread and the kernel keep the others), else unbound.
fn replica_placement(pin_cpus: bool) -> glommio::Placement {
    if !pin_cpus {
        return glommio::Placement::Unbound;
    }
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity only writes into it.
    let allowed: Vec<usize> = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return glommio::Placement::Unbound;
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|cpu| libc::CPU_ISSET(*cpu, &set))
            .collect()
    };
    match allowed.last() {
        Some(cpu) => {
            tracing::info!(cpu, "replica executor pinned");
            glommio::Placement::Fixed(*cpu)
        }
        None => glommio::Placement::Unbound,
    }
}

/// Runs the daemon until SIGTERM/SIGINT. Formats the data directory first when it is
/// absent (`policy` chooses the root password).
pub fn run(config: Config, replica_id: u8, policy: RootPassword) -> Result<(), DaemonError> {
    system::install_signal_handlers();
    system::tune_allocator();
    let open_files = system::raise_open_files_limit();
    tracing::info!(
        open_files,
        partitions_max = node::partitions_max_by_files(open_files),
        "open files limit (one per partition, two while written, one per connection)"
    );
    let settings = settings(&config, replica_id)?;
    let bus_config = bus_config(&config, replica_id)?;
    let client_tls_config = config.tcp.tls.clone();
    let replica_tls = bus_config.tls.clone();
    let node_config = config.node(replica_id).ok_or_else(|| {
        DaemonError::Config(format!("replica id {replica_id} is not in cluster.nodes"))
    })?;
    let dir = config.storage.data_dir.clone();
    if !journal::data_dir::is_formatted(&dir) {
        let absent_or_empty = std::fs::read_dir(&dir).map_or(true, |mut e| e.next().is_none());
        if !absent_or_empty {
            return Err(DaemonError::DataDir {
                path: dir,
                reason: "is not a formatted data directory and not empty",
            });
        }
        format(&config, replica_id, policy)?;
    }
    for (name, port) in [
        ("quic", node_config.ports.quic),
        ("websocket", node_config.ports.websocket),
    ]
    .into_iter()
    .filter_map(|(name, port)| Some((name, port?)))
    {
        tracing::info!(port, "{name} is configured but not served by this build");
    }
    let io_memory = system::io_memory_bytes(config.runtime.io_memory.0);
    let shared = stats::shared();
    stats::start(
        SocketAddr::new(node_config.ip, node_config.ports.http),
        shared.clone(),
    )?;
    let placement = replica_placement(config.runtime.pin_cpus);
    let mut builder = journal::runtime::executor_builder_on(placement)
        .io_memory(io_memory)
        // File writes that wait on the disk (the groups' superblocks of a view change,
        // segment removal, password checks) run on these threads; the file system
        // merges their syncs.
        .blocking_thread_pool_placement(glommio::PoolPlacement::Unbound(BLOCKING_THREADS))
        .name("replica");
    if !config.runtime.spin_before_park.0.is_zero() {
        builder = builder.spin_before_park(config.runtime.spin_before_park.0);
    }
    let executor = builder
        .make()
        .map_err(DaemonError::start("replica executor"))?;
    xfer::clean_data_dir(&dir).map_err(DaemonError::io("state-transfer leftovers", &dir))?;
    let xfer_stats = Arc::new(Mutex::new(crate::stats::StateTransferStats::default()));
    let channels = xfer::channels();
    let (to_xfer, xfer_inbox) = channels.to_xfer;
    let (xfer_outbox, from_xfer) = channels.from_xfer;
    xfer::start(
        xfer::XferSettings {
            cluster: settings.cluster,
            replica: settings.replica,
            data_dir: dir.clone(),
            partition: settings.partition,
            chunk_max: statexfer::server::CHUNK_MAX_DEFAULT,
            max_message_size: bus_config.max_message_size,
            fetcher: xfer::fetcher_config(),
            rate_max: config.cluster.state_transfer_rate_max.0,
        },
        xfer_inbox,
        xfer_outbox,
        xfer_stats.clone(),
    )?;
    executor.run(async move {
        let completions = journal::runtime::choose_disk_completions(&dir)
            .await
            .map_err(DaemonError::start("disk completions"))?;
        tracing::info!(
            completions = completions.name(),
            "disk IO completions on the replica executor"
        );
        let data = journal::data_dir::open(&dir)
            .await
            .map_err(DaemonError::journal(METADATA_GROUP, None, "data directory"))?;
        check_identity(&data.superblock.current().clone(), &settings, &dir)?;
        let (events_tx, events_rx) = glommio::channels::local_channel::new_unbounded();
        let events_tx = Rc::new(events_tx);
        let to_xfer = Rc::new(to_xfer.connect().await);
        let from_xfer = from_xfer.connect().await;
        let forward_to = events_tx.clone();
        glommio::spawn_local(async move {
            while let Some(message) = from_xfer.recv().await {
                let _ = forward_to.try_send(node::Event::Xfer(message));
            }
        })
        .detach();
        let handler = BusHandler {
            events: events_tx.clone(),
        };
        let bus = Bus::start(bus_config, Rc::new(handler)).map_err(DaemonError::Bus)?;
        let node = Node::open(settings, bus.clone(), data, events_tx, Some(to_xfer)).await?;
        let client_files = certificates::ClientTlsFiles::of(&client_tls_config);
        let client_status = certificates::initial_status(client_files.is_some());
        let replica_status = certificates::initial_status(replica_tls.enabled);
        let reload = glommio::spawn_local(certificates::reload_on_sighup(
            bus.clone(),
            certificates::Reloads {
                client: client_files,
                client_status: client_status.clone(),
                replica: replica_tls.enabled.then(|| replica_tls.clone()),
                replica_status: replica_status.clone(),
            },
        ))
        .detach();
        let transitions = stats::Transitions::default();
        let tls_status = || stats::TlsStatus {
            client: client_status.borrow().clone(),
            replica: replica_status.borrow().clone(),
        };
        stats::publish(&shared, &node, &transitions, &xfer_stats, tls_status());
        tracing::info!(
            replica = bus.replica_addr().to_string(),
            replica_tls = replica_tls.enabled,
            client = bus.client_addr().map(|a| a.to_string()),
            client_tls = bus.client_tls_enabled(),
            "appliance ready"
        );
        system::sd_notify("READY=1");
        let result = node
            .run(events_rx, |node| {
                stats::publish(&shared, node, &transitions, &xfer_stats, tls_status())
            })
            .await;
        reload.cancel();
        system::sd_notify("STOPPING=1");
        bus.shutdown();
        let node = result?;
        node.close().await?;
        tracing::info!("appliance stopped");
        Ok(())
    })
}

fn check_identity(
    superblock: &journal::Superblock,
    settings: &Settings,
    dir: &Path,
) -> Result<(), DaemonError> {
    if superblock.cluster != settings.cluster
        || superblock.replica != settings.replica
        || superblock.replica_count != settings.replica_count
    {
        return Err(DaemonError::Config(format!(
            "{} belongs to replica {} of a {}-node cluster {:#x}, not replica {} of this \
             {}-node cluster",
            dir.display(),
            superblock.replica,
            superblock.replica_count,
            superblock.cluster,
            settings.replica,
            settings.replica_count
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use replication::wire::PartitionKey;

    fn partition_group() -> u64 {
        PartitionKey {
            stream: 1,
            topic: 2,
            partition: 3,
        }
        .pack()
        .unwrap()
    }

    fn write_error(group: u64, code: i32) -> DaemonError {
        DaemonError::journal(group, Some(9), "partition sync")(JournalError::io(
            "fdatasync",
            "/data/partitions/1-2-3/00000000000000000000.log",
            std::io::Error::from_raw_os_error(code),
        ))
    }

    #[test]
    fn messages_say_where_first_and_keep_the_source_text() {
        let group = partition_group();
        let error = write_error(group, libc::EIO);
        assert_eq!(
            error.to_string(),
            format!(
                "partition group {group} (1/2/3) op 9: partition sync: fdatasync \
                 /data/partitions/1-2-3/00000000000000000000.log: {}",
                std::io::Error::from_raw_os_error(libc::EIO)
            )
        );
        let stopped = DaemonError::NoSpace {
            group,
            source: Some(Box::new(write_error(group, libc::ENOSPC))),
        };
        let text = stopped.to_string();
        assert!(
            text.starts_with(&format!(
                "partition group {group} (1/2/3) op 9: the disk is full: partition sync: "
            )),
            "{text}"
        );
        let metadata = DaemonError::Internal {
            group: METADATA_GROUP,
            op: None,
            detail: "journal completions closed",
        };
        assert_eq!(
            metadata.to_string(),
            "metadata group: journal completions closed"
        );
        let refused = DaemonError::DataDir {
            path: PathBuf::from("/data"),
            reason: "is not empty; refusing to format it",
        };
        assert_eq!(
            refused.to_string(),
            "/data is not empty; refusing to format it"
        );
    }

    #[test]
    fn the_source_chain_reaches_the_io_error_and_only_config_exits_2() {
        let error = DaemonError::NoSpace {
            group: partition_group(),
            source: Some(Box::new(write_error(partition_group(), libc::ENOSPC))),
        };
        let mut chain = Vec::new();
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&error);
        while let Some(error) = next {
            chain.push(error.to_string());
            next = error.source();
        }
        assert_eq!(chain.len(), 4, "{chain:#?}");
        let io = std::error::Error::source(&error)
            .and_then(std::error::Error::source)
            .and_then(std::error::Error::source)
            .and_then(|e| e.downcast_ref::<std::io::Error>())
            .expect("the io::Error at the end of the chain");
        assert_eq!(io.raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(error.exit_code(), 1);
        assert_eq!(DaemonError::Config("bad".into()).exit_code(), 2);
    }

    fn os(code: i32) -> std::io::Error {
        std::io::Error::from_raw_os_error(code)
    }

    /// A partition group's IO failing with `code` through each layer that meets the
    /// disk or the descriptor table.
    fn layered_errors(code: i32) -> Vec<DaemonError> {
        let group = partition_group();
        // As glommio reports a DMA file's failure (the segment log's writes and opens).
        let dma = glommio::GlommioError::<()>::EnhancedIoError {
            source: os(code),
            op: "Writing",
            path: Some(PathBuf::from("/d/00000000000000318000.log")),
            fd: Some(7),
        };
        vec![
            DaemonError::journal(group, Some(3), "journal write")(JournalError::io(
                "write",
                "/d/00000000000000318000.log",
                dma,
            )),
            DaemonError::journal(group, None, "consumer offsets sync")(JournalError::io(
                "write",
                "/d/consumer-offsets.tmp",
                os(code),
            )),
            DaemonError::file(group, "partition checkpoint")(files::FileError::Io {
                path: "/d/vsr-checkpoint".into(),
                error: os(code),
            }),
            // One failed shared sync fails each write it was to cover.
            DaemonError::file(group, "partition VSR superblock")(
                files::FileError::Io {
                    path: "/d".into(),
                    error: os(code),
                }
                .duplicate(),
            ),
            DaemonError::prepare_log(group, None)(prepares::PrepareLogError::Io {
                op: "open",
                path: "/d/vsr-prepares".into(),
                source: os(code),
            }),
            DaemonError::Io {
                what: "sync",
                path: "/d".into(),
                source: os(code),
            },
        ]
    }

    #[test]
    fn a_full_disk_and_running_out_of_descriptors_are_read_from_the_os_code() {
        // (code, a full disk, out of descriptors)
        let cases = [
            (libc::ENOSPC, true, false),
            (libc::EDQUOT, true, false),
            (libc::EMFILE, false, true),
            (libc::ENFILE, false, true),
            (libc::EIO, false, false),
        ];
        for (code, full, out_of_files) in cases {
            for error in layered_errors(code) {
                assert_eq!(error.os_error(), Some(code), "{error}");
                assert_eq!(error.is_no_space(), full, "{error}");
                assert_eq!(error.is_out_of_open_files(), out_of_files, "{error}");
            }
        }
        let text = DaemonError::Corrupt {
            group: partition_group(),
            op: None,
            detail: "No space left on device (os error 28)".into(),
        };
        assert!(!text.is_no_space(), "a message is not an OS code");
        let lane = DaemonError::NoSpace {
            group: partition_group(),
            source: None,
        };
        assert!(lane.is_no_space() && !lane.is_out_of_open_files());
    }

    #[test]
    fn a_full_disk_stops_the_group_and_any_other_error_passes() {
        for error in layered_errors(libc::ENOSPC) {
            let text = error.to_string();
            match error.stops_group_when_full() {
                DaemonError::NoSpace {
                    group,
                    source: Some(source),
                } => {
                    assert_eq!(group, partition_group());
                    assert_eq!(source.to_string(), text);
                }
                // Not a group's: nothing to stop.
                DaemonError::Io { .. } => {}
                other => panic!("not a group's stop: {other}"),
            }
        }
        for error in layered_errors(libc::EIO) {
            let passed = error.stops_group_when_full();
            assert!(!matches!(passed, DaemonError::NoSpace { .. }), "{passed}");
        }
    }
}
