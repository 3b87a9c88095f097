//! `BusConfig`: the bus's part of the node configuration, with the documented key names
//! (message_bus.*, cluster.auth.*, cluster.tls.*), and its checks at start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::auth::SECRET_LEN_MIN;
use crate::wire::decode::MAX_MESSAGE_SIZE_DEFAULT;
use crate::wire::HEADER_SIZE;

/// At most this many handshakes (TLS included) run at once on the replica listener; more
/// connections are closed at once and counted (a hardened replica port). The
/// default and the ceiling of message_bus.handshakes_max.
pub const HANDSHAKES_IN_FLIGHT_MAX: usize = 256;
/// Default bound of the bytes of client frames held at once (being read, or delivered
/// and not yet handed back): limits.frame_memory_max.
pub const CLIENT_FRAME_MEMORY_MAX_DEFAULT: usize = 1 << 30;
/// Client-listener connections beyond this are closed at accept and counted.
pub const CLIENT_CONNECTIONS_MAX_DEFAULT: usize = 4096;
/// Default bound on a client frame body's arrival (BusConfig::client_body_timeout).
pub const CLIENT_BODY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// A roster holds at most this many replicas (ids are a u8; DVC bitsets stay u128).
pub const REPLICA_COUNT_MAX: usize = 128;
/// The reconnect delay doubles per failed attempt up to this multiple of reconnect_period.
pub const RECONNECT_BACKOFF_FACTOR_MAX: u32 = 8;

const _: () = assert!(HANDSHAKES_IN_FLIGHT_MAX == 256);
const _: () = assert!(REPLICA_COUNT_MAX <= u8::MAX as usize);

/// One replica of the roster ([[cluster.nodes]]): where its replica port is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAddress {
    /// The node's replica_id in the roster.
    pub replica_id: u8,
    /// ip:tcp_replica.
    pub addr: SocketAddr,
    /// The name its TLS certificate carries; the ip when None.
    pub tls_server_name: Option<String>,
}

/// cluster.auth.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AuthConfig {
    /// cluster.auth.enabled: run the challenge/finish MAC handshake.
    pub enabled: bool,
    /// cluster.auth.shared_secret (32+ bytes): MACs are made and verified under it.
    pub shared_secret: Vec<u8>,
    /// cluster.auth.previous_shared_secret (32+ bytes): verifies only (rotation window).
    pub previous_shared_secret: Option<Vec<u8>>,
}

impl core::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("enabled", &self.enabled)
            .field("shared_secret", &"<redacted>")
            .field(
                "previous_shared_secret",
                &self.previous_shared_secret.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// cluster.tls: TLS 1.3 only, ALPN "iggy-replica", peers verified against ca_file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsConfig {
    /// cluster.tls.enabled.
    pub enabled: bool,
    /// PEM chain this node presents, as acceptor and as dialer.
    pub cert_file: PathBuf,
    /// PEM private key of cert_file.
    pub key_file: PathBuf,
    /// PEM CA bundle every peer's certificate must chain to.
    pub ca_file: PathBuf,
}

/// Everything the bus needs to run one node's replica and client listeners.
#[derive(Clone, Debug)]
pub struct BusConfig {
    /// cluster.name; its blake3 prefix goes in every frame's cluster field.
    pub cluster_name: String,
    /// This node's replica_id.
    pub replica_id: u8,
    /// Every node of [[cluster.nodes]], this one included.
    pub nodes: Vec<NodeAddress>,
    /// Where the replica listener binds (usually this node's ip:tcp_replica).
    pub replica_listen: SocketAddr,
    /// Where the client listener binds (ip:tcp); None runs no client listener.
    pub client_listen: Option<SocketAddr>,
    /// message_bus.max_message_size: larger frames close the connection.
    pub max_message_size: u32,
    /// message_bus.peer_queue_capacity: frames over SMALL_FRAME_MAX queued per peer, and
    /// SMALL_FRAME_SLOTS times that of all frames (`link.rs`); overruns are dropped.
    pub peer_queue_capacity: usize,
    /// message_bus.max_batch: frames per writev.
    pub max_batch: usize,
    /// message_bus.reconnect_period: base delay between dial attempts.
    pub reconnect_period: Duration,
    /// How long a connection may take from accept (or dial) to an established handshake.
    pub handshake_grace: Duration,
    /// Client connections beyond this are refused at accept.
    pub client_connections_max: usize,
    /// message_bus.handshakes_max: replica-listener handshakes in flight (1 to 256).
    pub handshakes_max: usize,
    /// Largest client frame, header included (limits.request_body_max + 256): a larger
    /// header closes the connection before any of its body is read. max_message_size
    /// bounds it too.
    pub client_frame_max: u32,
    /// limits.frame_memory_max: bytes of client frames held at once. A frame that would
    /// exceed it is skipped unread and refused (`Handler::on_client_refused`).
    pub client_frame_memory_max: usize,
    /// How long a client frame's body may take to arrive once its header has reserved
    /// frame memory; a slower sender is disconnected (counted client_body_timeout).
    pub client_body_timeout: Duration,
    /// cluster.auth.
    pub auth: AuthConfig,
    /// cluster.tls.
    pub tls: TlsConfig,
    /// tcp.tls: the client listener's acceptor config (`tls::client_port_config`); None
    /// serves plaintext. `Bus::set_client_tls` swaps it while running.
    pub client_tls: Option<std::sync::Arc<rustls::ServerConfig>>,
}

impl BusConfig {
    /// A configuration with the documented defaults for one node of `nodes`.
    pub fn new(cluster_name: &str, replica_id: u8, nodes: Vec<NodeAddress>) -> BusConfig {
        let replica_listen = nodes
            .iter()
            .find(|node| node.replica_id == replica_id)
            .map(|node| node.addr)
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        BusConfig {
            cluster_name: cluster_name.to_owned(),
            replica_id,
            nodes,
            replica_listen,
            client_listen: None,
            max_message_size: MAX_MESSAGE_SIZE_DEFAULT,
            peer_queue_capacity: 1024,
            max_batch: 64,
            reconnect_period: Duration::from_millis(500),
            handshake_grace: Duration::from_secs(5),
            client_connections_max: CLIENT_CONNECTIONS_MAX_DEFAULT,
            handshakes_max: HANDSHAKES_IN_FLIGHT_MAX,
            client_frame_max: MAX_MESSAGE_SIZE_DEFAULT,
            client_frame_memory_max: CLIENT_FRAME_MEMORY_MAX_DEFAULT,
            client_body_timeout: CLIENT_BODY_TIMEOUT_DEFAULT,
            auth: AuthConfig::default(),
            tls: TlsConfig::default(),
            client_tls: None,
        }
    }

    /// The number of replicas in the roster.
    pub fn replica_count(&self) -> u8 {
        self.nodes.len().min(REPLICA_COUNT_MAX) as u8
    }

    /// Checks the configuration; the error names the key, the value and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_transport()?;
        self.validate_security()
    }

    /// Everything but cluster.auth and cluster.tls (for callers that supply keys and TLS
    /// material themselves).
    pub fn validate_transport(&self) -> Result<(), ConfigError> {
        let count = self.nodes.len();
        if count == 0 || count > REPLICA_COUNT_MAX {
            return Err(ConfigError::new("cluster.nodes", count, "1 to 128 nodes"));
        }
        let mut seen = [false; REPLICA_COUNT_MAX];
        for node in &self.nodes {
            let id = usize::from(node.replica_id);
            if id >= count || seen[id] {
                return Err(ConfigError::new(
                    "cluster.nodes.replica_id",
                    id,
                    "replica ids are distinct and 0..node count",
                ));
            }
            seen[id] = true;
        }
        if usize::from(self.replica_id) >= count {
            return Err(ConfigError::new(
                "replica_id",
                self.replica_id,
                "must name a node of cluster.nodes",
            ));
        }
        if (self.max_message_size as usize) < HEADER_SIZE {
            return Err(ConfigError::new(
                "message_bus.max_message_size",
                self.max_message_size,
                "at least one 256-byte header",
            ));
        }
        if self.handshakes_max == 0 || self.handshakes_max > HANDSHAKES_IN_FLIGHT_MAX {
            return Err(ConfigError::new(
                "message_bus.handshakes_max",
                self.handshakes_max,
                "1 to 256",
            ));
        }
        if (self.client_frame_max as usize) < HEADER_SIZE {
            return Err(ConfigError::new(
                "limits.request_body_max",
                self.client_frame_max,
                "a client frame holds at least its 256-byte header",
            ));
        }
        let client_frame_max = self.client_frame_max.min(self.max_message_size) as usize;
        if self.client_frame_memory_max < client_frame_max {
            return Err(ConfigError::new(
                "limits.frame_memory_max",
                self.client_frame_memory_max,
                "at least one largest client frame (limits.request_body_max + 256)",
            ));
        }
        if self.peer_queue_capacity == 0 {
            return Err(ConfigError::new(
                "message_bus.peer_queue_capacity",
                0,
                "at least 1",
            ));
        }
        if self.max_batch == 0 || self.max_batch > 1024 {
            return Err(ConfigError::new(
                "message_bus.max_batch",
                self.max_batch,
                "1 to 1024 frames (the writev iovec limit)",
            ));
        }
        if self.reconnect_period.is_zero() {
            return Err(ConfigError::new(
                "message_bus.reconnect_period",
                "0s",
                "must be positive",
            ));
        }
        if self.handshake_grace.is_zero() {
            return Err(ConfigError::new(
                "message_bus.handshake_grace",
                "0s",
                "must be positive",
            ));
        }
        Ok(())
    }

    fn validate_security(&self) -> Result<(), ConfigError> {
        if self.auth.enabled {
            let len = self.auth.shared_secret.len();
            if len < SECRET_LEN_MIN {
                return Err(ConfigError::new(
                    "cluster.auth.shared_secret",
                    format_args!("<{len} bytes>"),
                    "at least 32 bytes",
                ));
            }
            if let Some(previous) = &self.auth.previous_shared_secret {
                if previous.len() < SECRET_LEN_MIN {
                    return Err(ConfigError::new(
                        "cluster.auth.previous_shared_secret",
                        format_args!("<{} bytes>", previous.len()),
                        "at least 32 bytes",
                    ));
                }
            }
        }
        if self.tls.enabled {
            for (key, path) in [
                ("cluster.tls.cert_file", &self.tls.cert_file),
                ("cluster.tls.key_file", &self.tls.key_file),
                ("cluster.tls.ca_file", &self.tls.ca_file),
            ] {
                if path.as_os_str().is_empty() {
                    return Err(ConfigError::new(
                        key,
                        "\"\"",
                        "required when TLS is enabled",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A configuration value broke a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The config key, e.g. "message_bus.max_batch".
    pub key: &'static str,
    /// The offending value (secrets are shown by length only).
    pub value: String,
    /// The rule it broke.
    pub rule: &'static str,
}

impl ConfigError {
    fn new(key: &'static str, value: impl core::fmt::Display, rule: &'static str) -> ConfigError {
        ConfigError {
            key,
            value: value.to_string(),
            rule,
        }
    }
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} = {}: {}", self.key, self.value, self.rule)
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(count: u8) -> Vec<NodeAddress> {
        (0..count)
            .map(|replica_id| NodeAddress {
                replica_id,
                addr: SocketAddr::from(([127, 0, 0, 1], 9090 + u16::from(replica_id))),
                tls_server_name: None,
            })
            .collect()
    }

    #[test]
    fn defaults_validate() {
        let config = BusConfig::new("c", 1, nodes(3));
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.replica_listen.port(), 9091);
        assert_eq!(config.replica_count(), 3);
    }

    #[test]
    fn bad_values_name_their_key() {
        let mut config = BusConfig::new("c", 1, nodes(3));
        config.auth.enabled = true;
        config.auth.shared_secret = b"short".to_vec();
        assert_eq!(
            config.validate().unwrap_err().key,
            "cluster.auth.shared_secret"
        );
        let mut config = BusConfig::new("c", 3, nodes(3));
        assert_eq!(config.validate().unwrap_err().key, "replica_id");
        config.replica_id = 0;
        config.max_batch = 0;
        assert_eq!(config.validate().unwrap_err().key, "message_bus.max_batch");
        config.max_batch = 64;
        config.handshakes_max = 257;
        assert_eq!(
            config.validate().unwrap_err().key,
            "message_bus.handshakes_max"
        );
        config.handshakes_max = 256;
        config.client_frame_max = 255;
        assert_eq!(
            config.validate().unwrap_err().key,
            "limits.request_body_max"
        );
        config.client_frame_max = 4096;
        config.client_frame_memory_max = 4095;
        assert_eq!(
            config.validate().unwrap_err().key,
            "limits.frame_memory_max"
        );
        config.client_frame_memory_max = 4096;
        assert_eq!(config.validate(), Ok(()));
        let mut duplicate = nodes(3);
        duplicate[2].replica_id = 1;
        let config = BusConfig::new("c", 0, duplicate);
        assert_eq!(
            config.validate().unwrap_err().key,
            "cluster.nodes.replica_id"
        );
        let mut config = BusConfig::new("c", 0, nodes(2));
        config.tls.enabled = true;
        assert_eq!(config.validate().unwrap_err().key, "cluster.tls.cert_file");
    }
}
