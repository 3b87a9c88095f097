//! The `appliance` daemon (docs/architecture.md): the replica executor runs the bus,
//! every VSR group, the metadata journal, the partition stores and the client plane on
//! one glommio executor; a second thread serves the stats endpoint.
//!
//! - `node`: the node and its event loop; `start` how it starts, `actions` the execution
//!   of consensus actions, `apply` committed ops applied and answered,
//!   `partition_groups` partition groups started and stopped.
//! - `client`: the client plane (requests, reads); `login` its logins.
//! - `error`: the daemon's typed errors.
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
mod error;
mod forward;
mod full_disk;
mod group_commit;
mod login;
mod messages;
mod metadata_reads;
mod partition_groups;
mod passwords;
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
use std::path::Path;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use journal::segment::PartitionConfig;
use journal::JournalLayout;
use replication::bus::{AuthConfig, Bus, BusConfig, NodeAddress};
use replication::vsr;
use replication::wire::{cluster_id, METADATA_GROUP};

use crate::config::Config;
use crate::state::{auth, MetadataState};
use crate::stats::NodeAddresses;
pub use error::DaemonError;
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
        retention: crate::node_core::retention::RetentionSettings {
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
    let node_config = config.node(replica_id).ok_or_else(|| {
        DaemonError::Config(format!("replica id {replica_id} is not in cluster.nodes"))
    })?;
    let dir = config.storage.data_dir.clone();
    format_if_absent(&config, replica_id, policy)?;
    for (name, port) in [
        ("quic", node_config.ports.quic),
        ("websocket", node_config.ports.websocket),
    ]
    .into_iter()
    .filter_map(|(name, port)| Some((name, port?)))
    {
        tracing::info!(port, "{name} is configured but not served by this build");
    }
    let shared = stats::shared();
    stats::start(
        SocketAddr::new(node_config.ip, node_config.ports.http),
        shared.clone(),
    )?;
    let executor = replica_executor(&config)?;
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
    executor.run(serve(Serve {
        settings,
        bus_config,
        client_tls: config.tcp.tls.clone(),
        dir,
        shared,
        xfer_stats,
        to_xfer,
        from_xfer,
    }))
}

/// Formats the data directory when it is absent or empty; refuses one that is neither
/// formatted nor empty.
fn format_if_absent(
    config: &Config,
    replica_id: u8,
    policy: RootPassword,
) -> Result<(), DaemonError> {
    let dir = &config.storage.data_dir;
    if journal::data_dir::is_formatted(dir) {
        return Ok(());
    }
    let absent_or_empty = std::fs::read_dir(dir).map_or(true, |mut e| e.next().is_none());
    if !absent_or_empty {
        return Err(DaemonError::DataDir {
            path: dir.clone(),
            reason: "is not a formatted data directory and not empty",
        });
    }
    format(config, replica_id, policy)
}

/// The replica executor: the node loop, the bus and the journals run on it.
fn replica_executor(config: &Config) -> Result<glommio::LocalExecutor, DaemonError> {
    let io_memory = system::io_memory_bytes(config.runtime.io_memory.0);
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
    builder
        .make()
        .map_err(DaemonError::start("replica executor"))
}

/// What the replica executor's task starts from.
struct Serve {
    settings: Settings,
    bus_config: BusConfig,
    client_tls: crate::config::ClientTlsConfig,
    dir: std::path::PathBuf,
    shared: crate::stats::http::SharedSnapshot,
    xfer_stats: Arc<Mutex<crate::stats::StateTransferStats>>,
    to_xfer: glommio::channels::shared_channel::SharedSender<xfer::ToXfer>,
    from_xfer: glommio::channels::shared_channel::SharedReceiver<xfer::FromXfer>,
}

/// The replica executor's task: opens the data directory and the node, serves until
/// shutdown, then closes the node.
async fn serve(start: Serve) -> Result<(), DaemonError> {
    let Serve {
        settings,
        bus_config,
        client_tls,
        dir,
        shared,
        xfer_stats,
        to_xfer,
        from_xfer,
    } = start;
    let replica_tls = bus_config.tls.clone();
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
    let client_files = certificates::ClientTlsFiles::of(&client_tls);
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
