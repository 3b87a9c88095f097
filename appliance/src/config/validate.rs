//! Start-up validation: every rule names the key, the value and the rule.

use std::collections::HashSet;

use super::{AuthConfig, Config, ConfigError, NodeConfig};

/// Replicas a cluster may have.
pub const REPLICAS_MAX: usize = 16;
/// The DVC nack/present bitsets are u128 and the suffix holds 128 headers.
pub const PIPELINE_MAX: u32 = 127;
/// writev takes at most IOV_MAX (1024) buffers; each frame may need two.
pub const MAX_BATCH_MAX: u32 = 512;
const SECRET_LEN_MIN: usize = 32;

fn err<T>(
    key: impl Into<String>,
    value: impl ToString,
    rule: impl Into<String>,
) -> Result<T, ConfigError> {
    Err(ConfigError::new(key, value.to_string(), rule))
}

pub fn validate(config: &Config) -> Result<(), ConfigError> {
    validate_cluster(config)?;
    validate_timing(config)?;
    validate_bus_and_storage(config)?;
    validate_limits(config)
}

fn validate_cluster(config: &Config) -> Result<(), ConfigError> {
    let cluster = &config.cluster;
    if cluster.name.trim().is_empty() {
        return err(
            "cluster.name",
            &cluster.name,
            "must not be empty: it derives the cluster id",
        );
    }
    let ids = validate_nodes(&cluster.nodes)?;
    if let Some(id) = config.replica_id {
        if !ids.contains(&id) {
            return err(
                "replica_id",
                id,
                "must be the replica_id of one of cluster.nodes",
            );
        }
    }
    validate_auth(&cluster.auth)?;
    let tls = &cluster.tls;
    if tls.enabled {
        tls_files(
            "cluster.tls",
            &[
                ("cert_file", &tls.cert_file),
                ("key_file", &tls.key_file),
                ("ca_file", &tls.ca_file),
            ],
        )?;
    }
    let client_tls = &config.tcp.tls;
    if client_tls.enabled {
        tls_files(
            "tcp.tls",
            &[
                ("cert_file", &client_tls.cert_file),
                ("key_file", &client_tls.key_file),
            ],
        )?;
    }
    Ok(())
}

/// The cluster's nodes: 1 to `REPLICAS_MAX`, dense unique replica ids, unique names,
/// non-zero ports distinct across the cluster. Returns the replica ids.
fn validate_nodes(nodes: &[NodeConfig]) -> Result<HashSet<u8>, ConfigError> {
    if nodes.is_empty() || nodes.len() > REPLICAS_MAX {
        return err(
            "cluster.nodes",
            nodes.len(),
            format!("must list 1 to {REPLICAS_MAX} nodes"),
        );
    }
    let mut ids = HashSet::new();
    let mut names = HashSet::new();
    let mut endpoints = HashSet::new();
    for (i, node) in nodes.iter().enumerate() {
        let key = |field: &str| format!("cluster.nodes[{i}].{field}");
        if !ids.insert(node.replica_id) {
            return err(
                key("replica_id"),
                node.replica_id,
                "replica ids must be unique",
            );
        }
        if usize::from(node.replica_id) >= nodes.len() {
            return err(
                key("replica_id"),
                node.replica_id,
                format!(
                    "replica ids must be dense: 0 to {} for {} nodes",
                    nodes.len() - 1,
                    nodes.len()
                ),
            );
        }
        if node.name.trim().is_empty() || !names.insert(node.name.as_str()) {
            return err(
                key("name"),
                &node.name,
                "node names must be non-empty and unique",
            );
        }
        let p = node.ports;
        let configured = [
            ("tcp", Some(p.tcp)),
            ("quic", p.quic),
            ("http", Some(p.http)),
            ("websocket", p.websocket),
            ("tcp_replica", Some(p.tcp_replica)),
        ];
        for (field, port) in configured
            .into_iter()
            .filter_map(|(field, port)| Some((field, port?)))
        {
            if port == 0 {
                return err(
                    key(&format!("ports.{field}")),
                    port,
                    "ports must be non-zero",
                );
            }
            if !endpoints.insert((node.ip, port)) {
                return err(
                    key(&format!("ports.{field}")),
                    port,
                    format!("ports must be distinct: {}:{port} is already used", node.ip),
                );
            }
        }
    }
    Ok(ids)
}

/// The cluster's shared secrets: long enough, and the previous one (during a rotation)
/// not the same as the current.
fn validate_auth(auth: &AuthConfig) -> Result<(), ConfigError> {
    if auth.enabled && auth.shared_secret.len() < SECRET_LEN_MIN {
        return err(
            "cluster.auth.shared_secret",
            format!("({} bytes)", auth.shared_secret.len()),
            format!("must be at least {SECRET_LEN_MIN} bytes when cluster.auth.enabled"),
        );
    }
    if let Some(previous) = &auth.previous_shared_secret {
        if previous.len() < SECRET_LEN_MIN {
            return err(
                "cluster.auth.previous_shared_secret",
                format!("({} bytes)", previous.len()),
                format!("must be at least {SECRET_LEN_MIN} bytes"),
            );
        }
        if *previous == auth.shared_secret {
            return err(
                "cluster.auth.previous_shared_secret",
                "(same as shared_secret)",
                "must differ from shared_secret",
            );
        }
    }
    Ok(())
}

/// Each of a TLS section's files is set and names a file.
fn tls_files(
    section: &str,
    files: &[(&str, &Option<std::path::PathBuf>)],
) -> Result<(), ConfigError> {
    for (field, path) in files {
        let key = format!("{section}.{field}");
        match path {
            None => return err(key, "", format!("must be set when {section}.enabled")),
            Some(path) if !path.is_file() => {
                return err(key, path.display(), "must name a readable file")
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn validate_timing(config: &Config) -> Result<(), ConfigError> {
    let c = &config.cluster;
    let heartbeat = c.heartbeat_timeout.0;
    let commit = c.commit_broadcast_interval.0;
    if commit.is_zero() {
        return err(
            "cluster.commit_broadcast_interval",
            c.commit_broadcast_interval,
            "must be greater than zero",
        );
    }
    if heartbeat < commit * 2 {
        return err(
            "cluster.heartbeat_timeout",
            c.heartbeat_timeout,
            format!(
                "must be at least twice cluster.commit_broadcast_interval ({}), so one lost Commit does not start a view change",
                c.commit_broadcast_interval
            ),
        );
    }
    for (key, value) in [
        (
            "cluster.prepare_retransmit_interval",
            c.prepare_retransmit_interval,
        ),
        (
            "cluster.view_change_retransmit_interval",
            c.view_change_retransmit_interval,
        ),
        ("cluster.slow_peer_lag_min", c.slow_peer_lag_min),
    ] {
        if value.0.is_zero() || value.0 >= heartbeat {
            return err(
                key,
                value,
                format!(
                    "must be greater than zero and below cluster.heartbeat_timeout ({})",
                    c.heartbeat_timeout
                ),
            );
        }
    }
    if c.slow_peer_readmit.0.is_zero() {
        return err(
            "cluster.slow_peer_readmit",
            c.slow_peer_readmit,
            "must be greater than zero",
        );
    }
    if c.pipeline_max == 0 || c.pipeline_max > PIPELINE_MAX {
        return err(
            "cluster.pipeline_max",
            c.pipeline_max,
            format!("must be 1 to {PIPELINE_MAX}"),
        );
    }
    let bus = &config.message_bus;
    if c.repair_chunk_max == 0 || c.repair_chunk_max >= bus.peer_queue_capacity {
        return err(
            "cluster.repair_chunk_max",
            c.repair_chunk_max,
            format!(
                "must be at least 1 and below message_bus.peer_queue_capacity ({}): per-peer queues drop overruns",
                bus.peer_queue_capacity
            ),
        );
    }
    if bus.reconnect_period.0.is_zero() {
        return err(
            "message_bus.reconnect_period",
            bus.reconnect_period,
            "must be greater than zero",
        );
    }
    if bus.handshake_grace.0.is_zero() {
        return err(
            "message_bus.handshake_grace",
            bus.handshake_grace,
            "must be greater than zero",
        );
    }
    Ok(())
}

fn validate_bus_and_storage(config: &Config) -> Result<(), ConfigError> {
    let bus = &config.message_bus;
    let max = bus.max_message_size.0;
    if !(64 << 10..=1 << 30).contains(&max) {
        return err(
            "message_bus.max_message_size",
            bus.max_message_size,
            "must be 64 KiB to 1 GiB",
        );
    }
    if bus.max_batch == 0 || bus.max_batch > MAX_BATCH_MAX {
        return err(
            "message_bus.max_batch",
            bus.max_batch,
            format!("must be 1 to {MAX_BATCH_MAX}"),
        );
    }
    if bus.handshakes_max == 0 || bus.handshakes_max > 256 {
        return err(
            "message_bus.handshakes_max",
            bus.handshakes_max,
            "must be 1 to 256",
        );
    }
    let storage = &config.storage;
    if storage.data_dir.as_os_str().is_empty() {
        return err("storage.data_dir", "", "must not be empty");
    }
    if storage.segment_size.0 < max {
        return err(
            "storage.segment_size",
            storage.segment_size,
            format!(
                "must be at least message_bus.max_message_size ({}) so any batch fits a segment",
                bus.max_message_size
            ),
        );
    }
    let slots_needed = u64::from(config.cluster.pipeline_max) * 2;
    if storage.journal_size.0 < slots_needed * (1 << 20) {
        return err(
            "storage.journal_size",
            storage.journal_size,
            format!(
                "must hold at least 2 x cluster.pipeline_max one-MiB slots ({} MiB)",
                slots_needed
            ),
        );
    }
    if storage.reserve_bytes.0 > 1 << 30 {
        return err(
            "storage.reserve_bytes",
            storage.reserve_bytes,
            "must be at most 1 GiB",
        );
    }
    if storage.max_used_bytes.0 != 0 && storage.max_used_bytes.0 < storage.journal_size.0 {
        return err(
            "storage.max_used_bytes",
            storage.max_used_bytes,
            format!(
                "must be 0 (no limit) or at least storage.journal_size ({})",
                storage.journal_size
            ),
        );
    }
    let retention = &config.retention;
    if retention.check_interval.0 < std::time::Duration::from_millis(100)
        || retention.check_interval.0 > std::time::Duration::from_secs(3600)
    {
        return err(
            "retention.check_interval",
            retention.check_interval,
            "must be 100ms to 1h",
        );
    }
    if !["error", "warn", "info", "debug", "trace"].contains(&config.log.level.as_str()) {
        return err(
            "log.level",
            &config.log.level,
            "must be error, warn, info, debug or trace",
        );
    }
    Ok(())
}

fn validate_limits(config: &Config) -> Result<(), ConfigError> {
    let limits = &config.limits;
    for (key, value) in [
        (
            "limits.client_connections_max",
            limits.client_connections_max,
        ),
        (
            "limits.requests_in_flight_per_session",
            limits.requests_in_flight_per_session,
        ),
        ("limits.sessions_max", limits.sessions_max),
        ("limits.stats_groups_max", limits.stats_groups_max),
    ] {
        if value == 0 {
            return err(key, value, "must be at least 1");
        }
    }
    let max = config.message_bus.max_message_size.0;
    if limits.request_body_max.0 == 0 || limits.request_body_max.0 + 256 > max {
        return err(
            "limits.request_body_max",
            limits.request_body_max,
            format!("must be non-zero and leave room for the 256-byte header within message_bus.max_message_size ({})", config.message_bus.max_message_size),
        );
    }
    if limits.frame_memory_max.0 < max {
        return err(
            "limits.frame_memory_max",
            limits.frame_memory_max,
            format!(
                "must be at least message_bus.max_message_size ({})",
                config.message_bus.max_message_size
            ),
        );
    }
    Ok(())
}
