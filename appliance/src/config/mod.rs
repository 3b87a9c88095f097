//! The appliance's configuration (README.md, "Configuration essentials"): TOML with the
//! protocol's keys, an environment override for every key, and validation at start that
//! names the key, the value and the rule it broke. With no file, a single node on
//! loopback.

mod env;
pub mod units;
mod validate;

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use env::ENV_PREFIX;
pub use units::{ByteSize, ConfigDuration};

/// A configuration that failed to load or validate: which key, what value, which rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted key path (`cluster.nodes[1].ports.tcp`), or the file or variable read.
    pub key: String,
    /// The offending value as written (may be empty when the key is missing).
    pub value: String,
    /// The rule, in words an operator can act on.
    pub rule: String,
}

impl ConfigError {
    pub(crate) fn new(
        key: impl Into<String>,
        value: impl Into<String>,
        rule: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            key: key.into(),
            value: value.into(),
            rule: rule.into(),
        }
    }
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.value.is_empty() {
            write!(f, "config {}: {}", self.key, self.rule)
        } else {
            write!(f, "config {} = {:?}: {}", self.key, self.value, self.rule)
        }
    }
}

impl std::error::Error for ConfigError {}

/// The whole configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Which [[cluster.nodes]] entry this node is (`--replica-id` overrides); may be
    /// left out when the cluster has one node.
    pub replica_id: Option<u8>,
    pub cluster: ClusterConfig,
    pub tcp: TcpConfig,
    pub message_bus: MessageBusConfig,
    pub storage: StorageConfig,
    pub retention: RetentionConfig,
    pub limits: LimitsConfig,
    pub runtime: RuntimeConfig,
    pub log: LogConfig,
}

/// `[cluster]`: membership, consensus timing and peer authentication.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// blake3(name) is the cluster id on every replica frame.
    pub name: String,
    /// The Commit broadcast, the only heartbeat.
    pub commit_broadcast_interval: ConfigDuration,
    /// A backup that hears no newer Commit for this long starts a view change.
    pub heartbeat_timeout: ConfigDuration,
    pub prepare_retransmit_interval: ConfigDuration,
    pub view_change_retransmit_interval: ConfigDuration,
    /// A backup that has not acknowledged a prepare for this long (or for four times
    /// the recent commit latency, if longer) while the chain waits on it is skipped by
    /// the chain as slow, like a disconnected peer.
    pub slow_peer_lag_min: ConfigDuration,
    /// How long a skipped backup must keep up before the chain takes it back (doubled
    /// each time it is skipped again soon after).
    pub slow_peer_readmit: ConfigDuration,
    /// Prepares per repair chunk; must stay below message_bus.peer_queue_capacity.
    pub repair_chunk_max: u32,
    /// Prepares in flight per group (at most 127: the DVC bitsets are u128).
    pub pipeline_max: u32,
    /// Bytes per second a state transfer fetches at most (0: no limit), so a rejoining
    /// node leaves its peers' disks and CPUs to the cluster's commits.
    pub state_transfer_rate_max: ByteSize,
    /// A new topic's partitions are first led by the nodes in turn (partition groups
    /// start in different views); false: node 0 first leads every partition. Decided by
    /// the node that leads the metadata group when the topic is created, and recorded
    /// with the topic, so nodes may differ in this setting.
    pub spread_primaries: bool,
    pub auth: AuthConfig,
    pub tls: TlsConfig,
    pub nodes: Vec<NodeConfig>,
}

/// `[cluster.auth]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub enabled: bool,
    /// At least 32 bytes.
    pub shared_secret: String,
    /// Accepted for verification during a rotation window.
    pub previous_shared_secret: Option<String>,
}

/// `[cluster.tls]`: TLS 1.3 on the replica plane. SIGHUP reloads the three files.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    pub enabled: bool,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
}

/// `[tcp]`: the client port (each node's `ports.tcp`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TcpConfig {
    pub tls: ClientTlsConfig,
}

/// `[tcp.tls]`: TLS 1.3 on the client port. When enabled, every client connection must
/// open with TLS; plaintext ones are refused. SIGHUP reloads cert_file and key_file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientTlsConfig {
    pub enabled: bool,
    /// PEM certificate chain the client port presents.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of cert_file.
    pub key_file: Option<PathBuf>,
}

/// `[[cluster.nodes]]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    pub name: String,
    /// The roster address for the replica plane, and the clients' fallback address.
    pub ip: IpAddr,
    pub replica_id: u8,
    pub ports: Ports,
    /// The address clients are redirected to, when it differs from `ip`.
    #[serde(default)]
    pub advertised_address: Option<String>,
}

/// `ports = { tcp, quic, http, websocket, tcp_replica }`; `quic` and `websocket` may be
/// left out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ports {
    /// The client plane.
    pub tcp: u16,
    /// Optional; accepted and reported as not served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quic: Option<u16>,
    /// The stats endpoint.
    pub http: u16,
    /// Optional; accepted and reported as not served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub websocket: Option<u16>,
    /// The replica plane.
    pub tcp_replica: u16,
}

/// `[message_bus]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MessageBusConfig {
    pub max_message_size: ByteSize,
    /// Frames over 4 KiB queued per peer, and 8 times that of all frames; overruns are
    /// dropped and counted.
    pub peer_queue_capacity: u32,
    /// Frames per writev.
    pub max_batch: u32,
    pub reconnect_period: ConfigDuration,
    /// How long an inbound handshake may take.
    pub handshake_grace: ConfigDuration,
    /// Inbound replica handshakes in flight.
    pub handshakes_max: u32,
}

/// When written data reaches stable storage before an ack: the journal's own type, parsed
/// by the journal's own parser (one set of spellings and one interval bound).
pub use journal::Durability;

/// `"every"`, `"none"` or an interval, through `journal::Durability::parse`.
mod durability_text {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::{units, Durability};

    pub fn serialize<S: Serializer>(value: &Durability, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Durability::EveryBatch => serializer.serialize_str("every"),
            Durability::None => serializer.serialize_str("none"),
            Durability::Interval { interval } => {
                serializer.serialize_str(&units::format_duration(*interval))
            }
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Durability, D::Error> {
        let text = String::deserialize(deserializer)?;
        Durability::parse("durability", &text).map_err(|_| {
            serde::de::Error::custom(format!(
                "\"{text}\" is not \"every\", \"none\" or an interval like \"10ms\" (at most 60s)"
            ))
        })
    }
}

/// `[storage]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    pub data_dir: PathBuf,
    /// The preallocated metadata journal.
    pub journal_size: ByteSize,
    /// Partition segments roll at this size.
    pub segment_size: ByteSize,
    #[serde(with = "durability_text")]
    pub message_durability: Durability,
    #[serde(with = "durability_text")]
    pub offset_durability: Durability,
    /// Free space the node keeps on the data directory's file system: below it, new
    /// writes are refused (StorageFull) until retention or an operator frees space.
    pub min_free_bytes: ByteSize,
    /// The most the node's data may take (0: no limit besides `min_free_bytes`).
    pub max_used_bytes: ByteSize,
    /// Space held in `data_dir/storage-reserve` and given back when a write meets a
    /// full disk, so superblocks, checkpoints and view changes still find room.
    pub reserve_bytes: ByteSize,
}

/// `[retention]`: the defaults of topics created without their own (a topic's own
/// values are set at create time and changed with UpdateTopic).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Sealed segments whose newest message is older than this are deleted ("0s":
    /// never).
    pub message_expiry: ConfigDuration,
    /// Oldest sealed segments are deleted while a topic holds more than this (0: no
    /// limit).
    pub max_topic_size: ByteSize,
    /// How often the metadata primary looks for segments to delete.
    pub check_interval: ConfigDuration,
}

/// `[limits]`: every bound on what clients and peers may make the node hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub client_connections_max: u32,
    pub requests_in_flight_per_session: u32,
    pub request_body_max: ByteSize,
    /// Sessions in the client table; a Register beyond this is refused (LimitReached),
    /// admitted sessions are never evicted for it.
    pub sessions_max: u32,
    /// Memory for buffered frames across all connections.
    pub frame_memory_max: ByteSize,
    /// Groups listed one by one in `GET /stats`, `GET /metrics` and `appliance-cli
    /// status`: the metadata group and the groups that need attention first; counts by
    /// status cover every group. `?groups=all` lists every group.
    pub stats_groups_max: u32,
    /// Committed partition prepares kept in memory to serve repair, over all partitions
    /// together. Past it the largest partitions' windows give up their oldest
    /// prepares, and partitions checkpointed at their commit point its prepare too.
    pub repair_memory_max: ByteSize,
}

/// `[runtime]`: executors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Pin executors to CPUs where the host allows.
    pub pin_cpus: bool,
    /// io_uring registered memory per executor (locked; see LimitMEMLOCK).
    pub io_memory: ByteSize,
    /// Spin this long before parking the reactor (0 disables).
    pub spin_before_park: ConfigDuration,
}

/// `[log]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// error, warn, info, debug or trace.
    pub level: String,
}

const fn ms(n: u64) -> ConfigDuration {
    ConfigDuration(Duration::from_millis(n))
}

impl Default for ClusterConfig {
    fn default() -> ClusterConfig {
        ClusterConfig {
            name: "appliance".into(),
            commit_broadcast_interval: ms(100),
            heartbeat_timeout: ms(1000),
            prepare_retransmit_interval: ms(200),
            view_change_retransmit_interval: ms(300),
            slow_peer_lag_min: ms(50),
            slow_peer_readmit: ms(2000),
            repair_chunk_max: 64,
            pipeline_max: 64,
            state_transfer_rate_max: ByteSize(128 << 20),
            spread_primaries: true,
            auth: AuthConfig::default(),
            tls: TlsConfig::default(),
            nodes: vec![NodeConfig::loopback()],
        }
    }
}

impl NodeConfig {
    /// The node `appliance` runs with no config: 127.0.0.1, the default ports.
    pub fn loopback() -> NodeConfig {
        NodeConfig {
            name: "node-0".into(),
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            replica_id: 0,
            ports: Ports {
                tcp: 8090,
                quic: Some(8080),
                http: 3000,
                websocket: Some(8092),
                tcp_replica: 9090,
            },
            advertised_address: None,
        }
    }
}

impl Default for MessageBusConfig {
    fn default() -> MessageBusConfig {
        MessageBusConfig {
            max_message_size: ByteSize(64 << 20),
            peer_queue_capacity: 1024,
            max_batch: 64,
            reconnect_period: ms(500),
            handshake_grace: ms(2000),
            handshakes_max: 256,
        }
    }
}

impl Default for StorageConfig {
    fn default() -> StorageConfig {
        StorageConfig {
            data_dir: PathBuf::from("./appliance-data"),
            journal_size: ByteSize(256 << 20),
            segment_size: ByteSize(1 << 30),
            message_durability: Durability::EveryBatch,
            offset_durability: Durability::EveryBatch,
            min_free_bytes: ByteSize(1 << 30),
            max_used_bytes: ByteSize(0),
            reserve_bytes: ByteSize(64 << 20),
        }
    }
}

impl Default for RetentionConfig {
    fn default() -> RetentionConfig {
        RetentionConfig {
            message_expiry: ConfigDuration(Duration::from_secs(7 * 86_400)),
            max_topic_size: ByteSize(0),
            check_interval: ms(1000),
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> LimitsConfig {
        LimitsConfig {
            client_connections_max: 10_000,
            requests_in_flight_per_session: 64,
            request_body_max: ByteSize(8 << 20),
            sessions_max: 10_000,
            frame_memory_max: ByteSize(1 << 30),
            stats_groups_max: 1_000,
            repair_memory_max: ByteSize(256 << 20),
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> RuntimeConfig {
        RuntimeConfig {
            pin_cpus: false,
            io_memory: ByteSize(4 << 20),
            spin_before_park: ms(0),
        }
    }
}

impl Default for LogConfig {
    fn default() -> LogConfig {
        LogConfig {
            level: "info".into(),
        }
    }
}

/// Merges `over` into `base`: tables key by key, anything else (arrays included)
/// replaced whole.
fn merge(base: &mut toml::Value, over: toml::Value) {
    match (base, over) {
        (toml::Value::Table(base), toml::Value::Table(over)) => {
            for (key, value) in over {
                match base.get_mut(&key) {
                    Some(slot) => merge(slot, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (slot, value) => *slot = value,
    }
}

impl Config {
    /// Parses TOML text, applies `APPLIANCE_*` overrides from `vars`, and validates.
    pub fn from_toml(
        text: &str,
        source: &str,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let file: toml::Value = toml::from_str(text).map_err(|e| {
            ConfigError::new(source, "", format!("is not valid TOML: {}", e.message()))
        })?;
        // Defaults first, the file over them, the environment over both: so an override
        // can reach a key the file leaves out (APPLIANCE_CLUSTER__NODES__0__PORTS__HTTP
        // with no file at all).
        let mut value = toml::Value::try_from(Config::default())
            .map_err(|e| ConfigError::new("(defaults)", "", e.to_string()))?;
        merge(&mut value, file);
        env::apply_overrides(&mut value, vars)?;
        let config: Config = serde_path_to_error::deserialize(value).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            ConfigError::new(
                if key == "." { source.to_string() } else { key },
                "",
                inner.message().to_string(),
            )
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Loads `path` (or, with `None`, the single-node loopback default) with the process
    /// environment's overrides.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let vars = std::env::vars().filter(|(k, _)| k.starts_with(ENV_PREFIX));
        match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    ConfigError::new(
                        path.display().to_string(),
                        "",
                        format!("cannot be read: {e}"),
                    )
                })?;
                Config::from_toml(&text, &path.display().to_string(), vars)
            }
            None => Config::from_toml("", "(default config)", vars),
        }
    }

    /// Checks every rule; the first broken one is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate::validate(self)
    }

    /// The node entry of `replica_id`.
    pub fn node(&self, replica_id: u8) -> Option<&NodeConfig> {
        self.cluster
            .nodes
            .iter()
            .find(|n| n.replica_id == replica_id)
    }

    /// Replicas in the cluster.
    pub fn replica_count(&self) -> usize {
        self.cluster.nodes.len()
    }
}
