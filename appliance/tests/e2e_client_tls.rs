//! TLS on the client port (`[tcp.tls]`) with real daemons and certificates made here:
//! the official Iggy SDK with TLS on 1 and 3 nodes, plaintext and untrusted clients
//! refused and counted, a SIGHUP reload that swaps the certificate for new connections
//! while open ones go on (the replica plane's material with it), no password on the wire, appliance-cli's --tls, and the start
//! refused with a clear error for a key that does not match its certificate.

mod common;
#[path = "common/sdk.rs"]
mod sdk;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use iggy::prelude::{
    Client as _, Consumer, Identifier, IggyClient, MessageClient, Partitioning, PollingStrategy,
    StreamClient, TopicClient, TopicCreateOptions, UserClient,
};
use sdk::*;

/// The name every test certificate carries besides 127.0.0.1.
const DOMAIN: &str = "localhost";

/// Appends `[tcp.tls]` with `leaf` to node `replica`'s config.
fn enable_client_tls(files: &ClusterFiles, replica: usize, leaf: &LeafFiles) {
    files.append_config(replica, &leaf.client_tls_table());
}

/// An SDK client of `addr` with TLS, trusting `ca`.
fn tls_client(addr: String, ca: &std::path::Path) -> IggyClient {
    IggyClient::builder()
        .with_tcp()
        .with_server_address(addr)
        .with_tls_enabled(true)
        .with_tls_domain(DOMAIN.to_string())
        .with_tls_ca_file(ca.display().to_string())
        .with_tls_validate_certificate(true)
        .with_reconnection_max_retries(Some(1))
        .build()
        .expect("the SDK builds a TLS client")
}

/// Connects and logs in as root within 20 s; Err when either fails.
async fn login(client: &IggyClient) -> Result<(), String> {
    let attempt = async {
        client
            .connect()
            .await
            .map_err(|e| format!("connect: {e}"))?;
        client
            .login_user("root", ROOT_PASSWORD)
            .await
            .map_err(|e| format!("login: {e}"))?;
        Ok(())
    };
    tokio::time::timeout(Duration::from_secs(20), attempt)
        .await
        .unwrap_or_else(|_| Err("no answer within 20 s".into()))
}

/// Creates stream "tls" with topic "t" of `partitions` partitions.
async fn tls_topic(client: &IggyClient, partitions: u32) -> (Identifier, Identifier) {
    client.create_stream("tls").await.expect("stream");
    let stream = Identifier::named("tls").expect("name");
    client
        .create_topic(
            &stream,
            "t",
            &TopicCreateOptions {
                partitions_count: Some(partitions),
                ..Default::default()
            },
        )
        .await
        .expect("topic");
    (stream, Identifier::named("t").expect("name"))
}

/// Sends `count` copies of `payload` to `partition` and reads the partition back from
/// offset 0: every payload comes back as sent.
async fn send_and_read_back(
    client: &IggyClient,
    stream: &Identifier,
    topic: &Identifier,
    partition: u32,
    payload: &Bytes,
    count: u32,
) -> u64 {
    let mut messages = repeated(payload, count);
    client
        .send_messages(
            stream,
            topic,
            &Partitioning::partition_id(partition),
            &mut messages,
        )
        .await
        .expect("send over TLS");
    let polled = client
        .poll_messages(
            stream,
            topic,
            Some(partition),
            &Consumer::new(Identifier::numeric(7).expect("id")),
            &PollingStrategy::offset(0),
            10_000,
            false,
        )
        .await
        .expect("poll over TLS");
    for message in &polled.messages {
        assert_eq!(message.payload, *payload, "payload read back over TLS");
    }
    polled.messages.len() as u64
}

/// Waits until `/stats` of node `replica` says `client_tls.<field>` reached `at_least`.
fn wait_client_tls(files: &ClusterFiles, replica: usize, field: &str, at_least: u64) -> u64 {
    wait_tls(files, replica, "client_tls", field, at_least)
}

/// Waits until `/stats` of node `replica` says `<port>.<field>` reached `at_least`.
fn wait_tls(files: &ClusterFiles, replica: usize, port: &str, field: &str, at_least: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let value = stats(files, replica)[port][field].as_u64().unwrap_or(0);
        if value >= at_least || Instant::now() > deadline {
            return value;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sighup(daemon: &Daemon) {
    // SAFETY: kill(2) on the PID of our own child.
    let rc = unsafe { libc::kill(daemon.pid(), libc::SIGHUP) };
    assert_eq!(rc, 0, "SIGHUP");
}

#[test]
fn the_sdk_works_over_tls_and_plaintext_or_untrusted_clients_are_refused() {
    let files = ClusterFiles::new(1);
    let pki = TestPki::new("client port ca");
    let leaf = pki.leaf(files.dir.path(), "node0", &[DOMAIN, "127.0.0.1"]);
    enable_client_tls(&files, 0, &leaf);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    assert_eq!(stats(&files, 0)["client_tls"]["enabled"], true);
    assert!(
        log_of(&daemon.log).contains("client_tls=true"),
        "the start log says the client port is TLS"
    );
    let addr = files.client_addr(0).to_string();
    runtime().block_on(async {
        let client = tls_client(addr.clone(), &leaf.ca);
        login(&client).await.expect("login over TLS");
        let (stream, topic) = tls_topic(&client, 1).await;
        let payload = Bytes::from(vec![0x5a; 1000]);
        let read = send_and_read_back(&client, &stream, &topic, 0, &payload, 50).await;
        assert_eq!(read, 50);

        // A client that trusts another CA fails its handshake and is counted.
        let other = TestPki::new("another ca");
        let stranger = other.leaf(files.dir.path(), "stranger", &[DOMAIN]);
        let untrusted = tls_client(addr.clone(), &stranger.ca);
        assert!(
            login(&untrusted).await.is_err(),
            "a client that does not trust the certificate got in"
        );
    });
    assert!(rejected(&files, 0, "client_tls_handshake_failed", 1) >= 1);

    // A plaintext client (our raw one, then the SDK without TLS) is never served.
    let mut raw = Client::connect(files.client_addr(0), 0x71).expect("tcp connect");
    let _ = raw.stream.set_read_timeout(Some(Duration::from_secs(5)));
    assert!(
        raw.login("root", ROOT_PASSWORD).is_err(),
        "a plaintext login got a reply"
    );
    runtime().block_on(async {
        let plain = IggyClient::builder()
            .with_tcp()
            .with_server_address(addr.clone())
            .with_reconnection_max_retries(Some(1))
            .build()
            .expect("client");
        assert!(
            login(&plain).await.is_err(),
            "a plaintext SDK client got in"
        );
    });
    assert!(rejected(&files, 0, "client_plaintext", 2) >= 2);
    assert!(
        log_of(&daemon.log).contains("refused a plaintext connection"),
        "the log names the plaintext client"
    );
}

#[test]
fn a_tls_login_puts_no_password_on_the_wire() {
    let files = ClusterFiles::new(1);
    let pki = TestPki::new("client port ca");
    let leaf = pki.leaf(files.dir.path(), "node0", &[DOMAIN]);
    enable_client_tls(&files, 0, &leaf);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    let capture = Arc::new(Mutex::new(Vec::new()));
    let proxy = capturing_proxy(files.ports[0].tcp, capture.clone());
    let stream_name = "secret-stream-name-on-tls";
    runtime().block_on(async {
        let client = tls_client(format!("127.0.0.1:{proxy}"), &leaf.ca);
        login(&client).await.expect("login through the proxy");
        client.create_stream(stream_name).await.expect("stream");
        client.logout_user().await.expect("logout");
    });
    let captured = capture.lock().expect("capture").clone();
    assert!(
        captured.len() > 1000,
        "the TLS session crossed the proxy ({} bytes)",
        captured.len()
    );
    let contains = |needle: &[u8]| captured.windows(needle.len()).any(|w| w == needle);
    assert!(
        !contains(ROOT_PASSWORD.as_bytes()),
        "the password crossed the client port in the clear"
    );
    assert!(
        !contains(stream_name.as_bytes()),
        "a stream name crossed the client port in the clear"
    );
    // TLS records: a handshake record first, then application data.
    assert_eq!(captured[0], 0x16, "the session opens with a TLS handshake");
}

#[test]
fn sighup_swaps_the_certificate_for_new_connections_and_open_ones_go_on() {
    let files = ClusterFiles::new(1);
    let first = TestPki::new("first ca");
    let leaf = first.leaf(files.dir.path(), "node0", &[DOMAIN]);
    let first_ca = files.dir.path().join("first-ca.pem");
    std::fs::copy(&leaf.ca, &first_ca).expect("keep the first CA");
    enable_client_tls(&files, 0, &leaf);
    // The replica plane's TLS material is reloaded by the same SIGHUP.
    let replica = first.leaf(files.dir.path(), "replica0", &["127.0.0.1"]);
    files.append_config(0, &replica.cluster_tls_table());
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    let addr = files.client_addr(0).to_string();
    let rt = runtime();
    let old = rt.block_on(async {
        let old = tls_client(addr.clone(), &first_ca);
        login(&old).await.expect("login with the first certificate");
        old
    });
    let (stream, topic) = rt.block_on(tls_topic(&old, 1));
    let loaded_before = wait_client_tls(&files, 0, "loaded_unix_ms", 1);

    // Rotate: a new CA's certificate in the same files, then SIGHUP.
    let second = TestPki::new("second ca");
    let rotated = second.leaf(files.dir.path(), "node0", &[DOMAIN]);
    sighup(&daemon);
    assert_eq!(wait_client_tls(&files, 0, "reloads", 1), 1, "one reload");
    assert_eq!(wait_tls(&files, 0, "replica_tls", "reloads", 1), 1);
    assert!(wait_client_tls(&files, 0, "loaded_unix_ms", loaded_before + 1) > loaded_before);
    let payload = Bytes::from_static(b"across a certificate rotation");
    rt.block_on(async {
        let new = tls_client(addr.clone(), &rotated.ca);
        login(&new)
            .await
            .expect("a new connection gets the new certificate");
        let stale = tls_client(addr.clone(), &first_ca);
        assert!(
            login(&stale).await.is_err(),
            "a new connection still got the old certificate"
        );
        // The connection opened before the rotation goes on.
        let read = send_and_read_back(&old, &stream, &topic, 0, &payload, 10).await;
        assert_eq!(read, 10);
    });

    // A reload from a broken file keeps the certificate in use and is counted.
    std::fs::write(&rotated.cert, "not a certificate").expect("break the cert file");
    sighup(&daemon);
    assert_eq!(wait_client_tls(&files, 0, "reload_failures", 1), 1);
    let status = stats(&files, 0)["client_tls"].clone();
    assert_eq!(status["reloads"], 1, "{status}");
    // Each port's material is reloaded on its own: the replica plane's is fine.
    assert_eq!(wait_tls(&files, 0, "replica_tls", "reloads", 2), 2);
    let replica_status = stats(&files, 0)["replica_tls"].clone();
    assert_eq!(
        (
            &replica_status["reloads"],
            &replica_status["reload_failures"]
        ),
        (&serde_json::json!(2), &serde_json::json!(0)),
        "{replica_status}"
    );
    assert!(
        status["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("tcp.tls.cert_file")),
        "{status}"
    );
    rt.block_on(async {
        let new = tls_client(addr.clone(), &rotated.ca);
        login(&new)
            .await
            .expect("the certificate in use survives a failed reload");
    });
    assert!(
        daemon
            .child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none()),
        "the node runs on"
    );
}

#[test]
fn the_sdk_routes_across_three_tls_nodes() {
    let files = ClusterFiles::new(3);
    let pki = TestPki::new("cluster client ca");
    let mut ca = None;
    for replica in 0..3 {
        let leaf = pki.leaf(files.dir.path(), &format!("node{replica}"), &[DOMAIN]);
        enable_client_tls(&files, replica, &leaf);
        ca = Some(leaf.ca);
    }
    let ca = ca.expect("a CA file");
    let _daemons = cluster(&files);
    runtime().block_on(async {
        let client = tls_client(files.client_addr(0).to_string(), &ca);
        login(&client).await.expect("login over TLS");
        // Spread primaries: the three partitions are led by three nodes, so the sends
        // and polls reach every node through the SDK's routing, each over TLS.
        let (stream, topic) = tls_topic(&client, 3).await;
        wait_topic_everywhere(&files);
        for partition in 0..3 {
            let payload = Bytes::from(format!("partition {partition} over TLS").into_bytes());
            let read = send_and_read_back(&client, &stream, &topic, partition, &payload, 5).await;
            assert_eq!(read, 5, "partition {partition}");
        }
    });
    for replica in 0..3 {
        assert_eq!(stats(&files, replica)["client_tls"]["enabled"], true);
    }
}

/// Waits until every node's /stats lists the topic's three partition groups.
fn wait_topic_everywhere(files: &ClusterFiles) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for replica in 0..files.ports.len() {
        loop {
            let partitions = stats(files, replica)["storage"]["partitions"]
                .as_u64()
                .unwrap_or(0);
            if partitions >= 3 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {replica} has no partitions"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn appliance_cli_speaks_tls_and_names_what_is_wrong() {
    let files = ClusterFiles::new(1);
    let pki = TestPki::new("cli ca");
    let leaf = pki.leaf(files.dir.path(), "node0", &[DOMAIN, "127.0.0.1"]);
    enable_client_tls(&files, 0, &leaf);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    let cli = cli_binary();
    let server = files.client_addr(0).to_string();
    let run = |extra: &[&str]| {
        let mut command = Command::new(&cli);
        command
            .args([
                "--server",
                &server,
                "--attempts",
                "2",
                "--retry-timeout-ms",
                "3000",
            ])
            .args(extra)
            .env("APPLIANCE_PASSWORD", ROOT_PASSWORD);
        command.output().expect("run appliance-cli")
    };
    let ca = leaf.ca.display().to_string();
    // By IP (the certificate carries 127.0.0.1) and by name.
    let made = run(&["--tls-ca", &ca, "stream", "create", "over-tls"]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let made = run(&[
        "--tls",
        "--tls-ca",
        &ca,
        "--tls-domain",
        DOMAIN,
        "stream",
        "create",
        "by-name",
    ]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    // Without --tls the node closes the connection; with a name the certificate does
    // not carry, the handshake fails and says so.
    let plain = run(&["stream", "create", "plain"]);
    assert!(!plain.status.success());
    let wrong = run(&[
        "--tls-ca",
        &ca,
        "--tls-domain",
        "elsewhere.example",
        "stream",
        "create",
        "x",
    ]);
    assert!(!wrong.status.success());
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(stderr.contains("TLS"), "{stderr}");
    // A CA file that is not there is a usage error (exit 2).
    let missing = run(&["--tls-ca", "/nonexistent/ca.pem", "stream", "create", "y"]);
    assert_eq!(missing.status.code(), Some(2));
}

#[test]
fn a_key_that_does_not_match_its_certificate_stops_the_start() {
    let files = ClusterFiles::new(1);
    let pki = TestPki::new("mismatch ca");
    let leaf = pki.leaf(files.dir.path(), "node0", &[DOMAIN]);
    let other = pki.leaf(files.dir.path(), "other", &[DOMAIN]);
    enable_client_tls(
        &files,
        0,
        &LeafFiles {
            cert: leaf.cert.clone(),
            key: other.key.clone(),
            ca: leaf.ca.clone(),
        },
    );
    let mut daemon = Daemon::start(&files, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(status) = daemon
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            break status.code();
        }
        assert!(
            Instant::now() < deadline,
            "the node started with a mismatched key"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_ne!(code, Some(0));
    let log = log_of(&daemon.log);
    assert!(
        log.contains("tcp.tls") && log.contains("does not match"),
        "{log}"
    );
}
