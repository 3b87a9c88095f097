//! Configuration: the defaults, TOML, environment overrides, and every validation rule
//! naming its key.

use std::time::Duration;

use appliance::config::{Config, ConfigError, Durability};

const THREE_NODES: &str = r#"
[cluster]
name = "prod-east"
commit_broadcast_interval = "50ms"
heartbeat_timeout = "500ms"
repair_chunk_max = 32

[cluster.auth]
enabled = true
shared_secret = "0123456789abcdef0123456789abcdef"

[[cluster.nodes]]
name = "a"
ip = "127.0.0.1"
replica_id = 0
ports = { tcp = 8090, quic = 8080, http = 3000, websocket = 8092, tcp_replica = 9090 }

[[cluster.nodes]]
name = "b"
ip = "127.0.0.1"
replica_id = 1
ports = { tcp = 8091, quic = 8081, http = 3001, websocket = 8093, tcp_replica = 9091 }

[[cluster.nodes]]
name = "c"
ip = "127.0.0.1"
replica_id = 2
ports = { tcp = 8094, quic = 8082, http = 3002, websocket = 8095, tcp_replica = 9092 }
advertised_address = "c.example:8094"

[message_bus]
max_message_size = "16 MiB"
peer_queue_capacity = 256

[storage]
data_dir = "/var/lib/appliance"
segment_size = "64 MiB"
message_durability = "every"
offset_durability = "10ms"
"#;

fn no_env() -> Vec<(String, String)> {
    Vec::new()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn load(text: &str, vars: Vec<(String, String)>) -> Result<Config, ConfigError> {
    Config::from_toml(text, "test.toml", vars)
}

fn error_of(text: &str, vars: Vec<(String, String)>) -> ConfigError {
    load(text, vars).expect_err("config should be refused")
}

#[test]
fn no_config_is_a_single_node_on_loopback_with_local_data() {
    let config = load("", no_env()).unwrap();
    assert_eq!(config.replica_count(), 1);
    let node = config.node(0).unwrap();
    assert_eq!(node.ip.to_string(), "127.0.0.1");
    assert_eq!(
        (node.ports.tcp, node.ports.http, node.ports.tcp_replica),
        (8090, 3000, 9090)
    );
    assert_eq!(config.storage.data_dir.to_str(), Some("./appliance-data"));
    assert_eq!(config.storage.message_durability, Durability::EveryBatch);
}

#[test]
fn three_node_file_parses_with_units() {
    let config = load(THREE_NODES, no_env()).unwrap();
    assert_eq!(config.replica_count(), 3);
    assert_eq!(config.cluster.name, "prod-east");
    assert_eq!(
        config.cluster.heartbeat_timeout.0,
        Duration::from_millis(500)
    );
    assert_eq!(config.message_bus.max_message_size.0, 16 << 20);
    assert_eq!(
        config.storage.offset_durability,
        Durability::Interval {
            interval: Duration::from_millis(10)
        }
    );
    assert_eq!(
        config.node(2).unwrap().advertised_address.as_deref(),
        Some("c.example:8094")
    );
}

#[test]
fn environment_overrides_every_kind_of_key() {
    let config = load(
        THREE_NODES,
        env(&[
            (
                "APPLIANCE_CLUSTER__AUTH__SHARED_SECRET",
                "ffffffffffffffffffffffffffffffffffff",
            ),
            ("APPLIANCE_CLUSTER__NODES__1__PORTS__TCP", "7001"),
            ("APPLIANCE_STORAGE__DATA_DIR", "/srv/data"),
            ("APPLIANCE_CLUSTER__HEARTBEAT_TIMEOUT", "2s"),
            ("APPLIANCE_RUNTIME__PIN_CPUS", "true"),
            ("OTHER_VARIABLE", "ignored"),
        ]),
    )
    .unwrap();
    assert_eq!(config.cluster.auth.shared_secret.len(), 36);
    assert_eq!(config.node(1).unwrap().ports.tcp, 7001);
    assert_eq!(config.storage.data_dir.to_str(), Some("/srv/data"));
    assert_eq!(config.cluster.heartbeat_timeout.0, Duration::from_secs(2));
    assert!(config.runtime.pin_cpus);
}

#[test]
fn environment_can_override_the_default_config() {
    let config = load(
        "",
        env(&[("APPLIANCE_CLUSTER__NODES__0__PORTS__HTTP", "3999")]),
    )
    .unwrap();
    assert_eq!(config.node(0).unwrap().ports.http, 3999);
}

#[test]
fn an_unknown_environment_key_is_refused_by_name() {
    let e = error_of("", env(&[("APPLIANCE_CLUSTER__HEARTBEAT", "1s")]));
    assert!(e.key.contains("heartbeat"), "{e}");
    assert!(e.rule.contains("unknown field"), "{e}");
}

#[test]
fn unknown_keys_and_bad_types_name_the_key_path() {
    let e = error_of("[cluster]\nnmae = \"x\"\n", no_env());
    assert!(e.rule.contains("unknown field `nmae`"), "{e}");
    let bad_port = THREE_NODES.replace("tcp = 8091", "tcp = \"high\"");
    let e = error_of(&bad_port, no_env());
    assert_eq!(e.key, "cluster.nodes[1].ports.tcp");
    let bad_duration = THREE_NODES.replace("\"500ms\"", "\"500\"");
    let e = error_of(&bad_duration, no_env());
    assert_eq!(e.key, "cluster.heartbeat_timeout");
    assert!(e.rule.contains("unit"), "{e}");
    let e = error_of("[cluster\n", no_env());
    assert_eq!(e.key, "test.toml");
}

#[test]
fn replica_ids_must_be_unique_and_dense() {
    let e = error_of(
        &THREE_NODES.replace("replica_id = 2", "replica_id = 1"),
        no_env(),
    );
    assert_eq!(e.key, "cluster.nodes[2].replica_id");
    assert!(e.rule.contains("unique"));
    let e = error_of(
        &THREE_NODES.replace("replica_id = 2", "replica_id = 5"),
        no_env(),
    );
    assert_eq!(
        (e.key.as_str(), e.value.as_str()),
        ("cluster.nodes[2].replica_id", "5")
    );
    assert!(e.rule.contains("dense"));
}

#[test]
fn quic_and_websocket_ports_may_be_left_out() {
    let text = THREE_NODES
        .replace("quic = 8080, ", "")
        .replace(", websocket = 8092", "")
        .replace("quic = 8081, ", "")
        .replace(", websocket = 8093", "");
    assert!(!text.contains("quic = 8080") && !text.contains("websocket = 8093"));
    let config = load(&text, no_env()).expect("a config without quic and websocket ports");
    let node = config.node(0).expect("node 0");
    assert_eq!((node.ports.quic, node.ports.websocket), (None, None));
    assert_eq!(
        (node.ports.tcp, node.ports.http, node.ports.tcp_replica),
        (8090, 3000, 9090)
    );
    assert_eq!(config.node(2).expect("node 2").ports.quic, Some(8082));
    // Given, they are still checked: distinct from the other ports of the address.
    let e = error_of(&THREE_NODES.replace("quic = 8080", "quic = 8090"), no_env());
    assert_eq!(e.key.as_str(), "cluster.nodes[0].ports.quic");
}

#[test]
fn ports_must_be_distinct_on_one_address() {
    let e = error_of(&THREE_NODES.replace("http = 3001", "http = 3000"), no_env());
    assert_eq!(
        (e.key.as_str(), e.value.as_str()),
        ("cluster.nodes[1].ports.http", "3000")
    );
    assert!(e.rule.contains("distinct"));
    // The same port on different hosts is fine.
    let other_host = THREE_NODES
        .replacen(
            "ip = \"127.0.0.1\"\nreplica_id = 1",
            "ip = \"127.0.0.2\"\nreplica_id = 1",
            1,
        )
        .replace("http = 3001", "http = 3000");
    assert!(load(&other_host, no_env()).is_ok());
}

#[test]
fn a_short_secret_is_refused_without_printing_it() {
    let e = error_of(
        &THREE_NODES.replace("0123456789abcdef0123456789abcdef", "short-secret"),
        no_env(),
    );
    assert_eq!(e.key, "cluster.auth.shared_secret");
    assert!(!e.to_string().contains("short-secret"), "{e}");
    assert!(e.rule.contains("32 bytes"));
}

#[test]
fn repair_chunk_must_stay_below_peer_queue_capacity() {
    let e = error_of(
        &THREE_NODES.replace("repair_chunk_max = 32", "repair_chunk_max = 256"),
        no_env(),
    );
    assert_eq!(
        (e.key.as_str(), e.value.as_str()),
        ("cluster.repair_chunk_max", "256")
    );
    assert!(e.rule.contains("peer_queue_capacity"));
}

#[test]
fn intervals_must_be_consistent() {
    let e = error_of(
        &THREE_NODES.replace(
            "heartbeat_timeout = \"500ms\"",
            "heartbeat_timeout = \"80ms\"",
        ),
        no_env(),
    );
    assert_eq!(
        (e.key.as_str(), e.value.as_str()),
        ("cluster.heartbeat_timeout", "80ms")
    );
    assert!(e.rule.contains("twice"));
    let e = error_of(
        &THREE_NODES.replace(
            "repair_chunk_max = 32",
            "repair_chunk_max = 32\nprepare_retransmit_interval = \"900ms\"",
        ),
        no_env(),
    );
    assert_eq!(e.key, "cluster.prepare_retransmit_interval");
    // A backup may not lag for a heartbeat timeout before the chain skips it, and a
    // skipped one is readmitted after some time.
    let e = error_of(
        &THREE_NODES.replace(
            "repair_chunk_max = 32",
            "repair_chunk_max = 32\nslow_peer_lag_min = \"2s\"",
        ),
        no_env(),
    );
    assert_eq!(
        (e.key.as_str(), e.value.as_str()),
        ("cluster.slow_peer_lag_min", "2s")
    );
    let e = error_of(
        &THREE_NODES.replace(
            "repair_chunk_max = 32",
            "repair_chunk_max = 32\nslow_peer_readmit = \"0ms\"",
        ),
        no_env(),
    );
    assert_eq!(e.key, "cluster.slow_peer_readmit");
}

#[test]
fn tls_needs_its_files() {
    let e = error_of(
        &format!("{THREE_NODES}\n[cluster.tls]\nenabled = true\n"),
        no_env(),
    );
    assert_eq!(e.key, "cluster.tls.cert_file");
    let e = error_of(
        &format!(
            "{THREE_NODES}\n[cluster.tls]\nenabled = true\ncert_file = \"/nonexistent/c.pem\"\nkey_file = \"/nonexistent/k.pem\"\nca_file = \"/nonexistent/ca.pem\"\n"
        ),
        no_env(),
    );
    assert_eq!(
        (e.key.as_str(), e.value.as_str()),
        ("cluster.tls.cert_file", "/nonexistent/c.pem")
    );
}

#[test]
fn client_tls_needs_its_files() {
    let e = error_of(
        &format!("{THREE_NODES}\n[tcp.tls]\nenabled = true\n"),
        no_env(),
    );
    assert_eq!(e.key, "tcp.tls.cert_file");
    assert!(
        e.to_string().contains("must be set when tcp.tls.enabled"),
        "{e}"
    );
    let e = error_of(
        &format!(
            "{THREE_NODES}\n[tcp.tls]\nenabled = true\ncert_file = \"/nonexistent/c.pem\"\nkey_file = \"/nonexistent/k.pem\"\n"
        ),
        no_env(),
    );
    assert_eq!(
        (e.key.as_str(), e.value.as_str()),
        ("tcp.tls.cert_file", "/nonexistent/c.pem")
    );
    // Unknown keys in the section are refused like everywhere else.
    let e = error_of(
        &format!("{THREE_NODES}\n[tcp.tls]\nenabled = false\nca_file = \"x\"\n"),
        no_env(),
    );
    assert!(e.to_string().contains("ca_file"), "{e}");
    // Off, it needs nothing.
    let config = load(
        &format!("{THREE_NODES}\n[tcp.tls]\nenabled = false\n"),
        no_env(),
    )
    .expect("tcp.tls off");
    assert!(!config.tcp.tls.enabled);
}

#[test]
fn sizes_and_limits_are_bounded() {
    let e = error_of(
        &THREE_NODES.replace("segment_size = \"64 MiB\"", "segment_size = \"1 MiB\""),
        no_env(),
    );
    assert_eq!(e.key, "storage.segment_size");
    let e = error_of(
        &format!("{THREE_NODES}\n[limits]\nsessions_max = 0\n"),
        no_env(),
    );
    assert_eq!(e.key, "limits.sessions_max");
    let e = error_of(
        &format!("{THREE_NODES}\n[limits]\nrequest_body_max = \"16 MiB\"\n"),
        no_env(),
    );
    assert_eq!(e.key, "limits.request_body_max");
    let e = error_of(
        &format!("{THREE_NODES}\n[log]\nlevel = \"loud\"\n"),
        no_env(),
    );
    assert_eq!(e.key, "log.level");
    let e = error_of(
        &THREE_NODES.replace(
            "offset_durability = \"10ms\"",
            "offset_durability = \"sometimes\"",
        ),
        no_env(),
    );
    assert_eq!(e.key, "storage.offset_durability");
}

#[test]
fn the_error_line_names_key_value_and_rule() {
    let e = error_of(
        &THREE_NODES.replace("repair_chunk_max = 32", "repair_chunk_max = 0"),
        no_env(),
    );
    let line = e.to_string();
    assert!(
        line.starts_with("config cluster.repair_chunk_max = \"0\": must be at least 1"),
        "{line}"
    );
    assert_eq!(line.lines().count(), 1);
}

#[test]
fn the_shipped_example_config_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../systemd/appliance.toml");
    let text = std::fs::read_to_string(path).unwrap();
    let config = load(&text, no_env()).unwrap();
    assert_eq!(config.replica_count(), 3);
    assert!(config.cluster.auth.enabled);
}

#[test]
fn replica_id_from_the_environment_must_name_a_node() {
    let config = load(THREE_NODES, env(&[("APPLIANCE_REPLICA_ID", "2")])).unwrap();
    assert_eq!(config.replica_id, Some(2));
    let e = error_of(THREE_NODES, env(&[("APPLIANCE_REPLICA_ID", "3")]));
    assert_eq!((e.key.as_str(), e.value.as_str()), ("replica_id", "3"));
}

#[test]
fn the_tools_password_variables_are_not_config_keys() {
    // Regression: a shell with APPLIANCE_PASSWORD set for appliance-cli stopped the
    // daemon from starting ("unknown field `password`").
    let vars = env(&[
        ("APPLIANCE_PASSWORD", "x"),
        ("APPLIANCE_ROOT_PASSWORD", "y"),
    ]);
    assert!(load(THREE_NODES, vars).is_ok());
}

#[test]
fn durability_intervals_are_bounded_by_the_journal_at_start() {
    // The journal refuses intervals over 60 s; the config now parses with the journal's
    // parser, so such a value stops the start naming its key instead of reaching it.
    let e = error_of(
        &THREE_NODES.replace("offset_durability = \"10ms\"", "offset_durability = \"5m\""),
        no_env(),
    );
    assert_eq!(e.key, "storage.offset_durability");
    let ok = load(
        &THREE_NODES.replace(
            "offset_durability = \"10ms\"",
            "offset_durability = \"60s\"",
        ),
        no_env(),
    )
    .unwrap();
    assert_eq!(
        ok.storage.offset_durability,
        Durability::Interval {
            interval: Duration::from_secs(60)
        }
    );
}
