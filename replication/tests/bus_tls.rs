//! TLS on the replica plane: TLS 1.3 with mutual certificates from ca_file, and the
//! exporter folded into the handshake MACs so a relaying man-in-the-middle fails. And TLS
//! on the client listener: plaintext, idle and untrusted clients refused, a swap of the
//! certificate for new connections.

mod common;

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use futures_rustls::{TlsAcceptor, TlsConnector};
use glommio::net::{TcpListener, TcpStream};
use replication::bus::{Bus, BusConfig, TlsContext};
use replication::wire::Header;
use rustls::pki_types::ServerName;

const LINK_WAIT: Duration = Duration::from_secs(5);

fn tls_node(config: BusConfig, context: TlsContext, auth: bool) -> (Bus, Rc<Recorder>) {
    let seen = recorder();
    let keys = auth.then(|| keys(SECRET, None));
    let config = if auth {
        with_auth(config, SECRET, None)
    } else {
        config
    };
    let bus = Bus::start_with_tls(config, keys, Some(context), seen.clone()).expect("starts");
    (bus, seen)
}

/// Node 1 with `context`, authenticated, its replica port listening.
fn acceptor(context: TlsContext) -> (Bus, Rc<Recorder>) {
    tls_node(config(1, &[loopback(0), loopback(0)]), context, true)
}

/// Node 0 with `context`, authenticated, dialing `to`.
fn dialer(to: &Bus, context: TlsContext) -> (Bus, Rc<Recorder>) {
    tls_node(config(0, &[loopback(0), to.replica_addr()]), context, true)
}

/// Waits until `bus` counted at least `at_least` failed TLS handshakes.
async fn handshakes_failed(bus: &Bus, at_least: u64) -> bool {
    wait_until(LINK_WAIT, || {
        bus.stats().snapshot().rejected("tls_handshake_failed") >= at_least
    })
    .await
}

#[test]
fn tls_peers_with_certificates_from_pem_files_connect_and_exchange_frames() {
    let pki = Pki::new("test ca");
    let dir = std::env::temp_dir().join(format!("bus-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, pki.ca_pem()).unwrap();
    let mut files = Vec::new();
    for node in 0..2 {
        let (cert, key) = pki.leaf_pem();
        let cert_file = dir.join(format!("node{node}.pem"));
        let key_file = dir.join(format!("node{node}.key"));
        std::fs::write(&cert_file, cert).unwrap();
        std::fs::write(&key_file, key).unwrap();
        files.push((cert_file, key_file));
    }
    let tls = move |mut config: BusConfig, node: usize| {
        config.tls.enabled = true;
        config.tls.cert_file = files[node].0.clone();
        config.tls.key_file = files[node].1.clone();
        config.tls.ca_file = ca_file.clone();
        with_auth(config, SECRET, None)
    };
    run(move || async move {
        let seen_1 = recorder();
        let bus_1 = Bus::start(
            tls(config(1, &[loopback(0), loopback(0)]), 1),
            seen_1.clone(),
        )
        .expect("node 1 starts");
        let bus_0 = Bus::start(
            tls(config(0, &[loopback(0), bus_1.replica_addr()]), 0),
            recorder(),
        )
        .expect("node 0 starts");
        assert!(wait_until(LINK_WAIT, || bus_0.is_connected(1) && bus_1.is_connected(0)).await);
        let body = vec![0xA5u8; 100_000];
        let mut header = replication::wire::StateChunkHeader::new();
        header.frame.cluster = replication::wire::cluster_id(CLUSTER);
        header.group = replication::wire::METADATA_GROUP;
        header.nonce = 1;
        let frame = replication::wire::Frame::build(&header, &body);
        bus_0.send(1, frame.clone()).unwrap();
        bus_0.send(1, commit_frame(0, 3)).unwrap();
        assert!(wait_until(LINK_WAIT, || seen_1.seen.borrow().frames.len() == 2).await);
        assert_eq!(seen_1.seen.borrow().frames[0].1, frame.as_bytes());
        bus_0.shutdown();
        bus_1.shutdown();
    });
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn peer_with_a_certificate_from_an_untrusted_ca_is_refused() {
    run(|| async {
        let trusted = Pki::new("cluster ca");
        let rogue = Pki::new("rogue ca");
        let (bus_1, seen_1) = acceptor(trusted.context(&trusted));
        // The rogue node trusts the cluster CA but its own certificate is not signed by it.
        let (bus_0, _) = dialer(&bus_1, rogue.context(&trusted));
        assert!(handshakes_failed(&bus_1, 2).await);
        assert!(!bus_1.is_connected(0));
        assert!(seen_1.seen.borrow().connected.is_empty());
        bus_0.shutdown();
        bus_1.shutdown();

        // The other way round: an acceptor with a rogue certificate is refused by the
        // dialer's verification against the cluster CA.
        let (bus_1, _) = acceptor(rogue.context(&trusted));
        let (bus_0, seen_0) = dialer(&bus_1, trusted.context(&trusted));
        assert!(handshakes_failed(&bus_0, 2).await);
        assert!(!bus_0.is_connected(1));
        assert!(seen_0.seen.borrow().connected.is_empty());
        bus_0.shutdown();
        bus_1.shutdown();
    });
}

#[test]
fn plaintext_dialer_cannot_reach_a_tls_node() {
    run(|| async {
        let pki = Pki::new("cluster ca");
        let (bus_1, _) = tls_node(
            config(1, &[loopback(0), loopback(0)]),
            pki.context(&pki),
            false,
        );
        let bus_0 = Bus::start(config(0, &[loopback(0), bus_1.replica_addr()]), recorder())
            .expect("starts");
        assert!(handshakes_failed(&bus_1, 1).await);
        assert!(!bus_1.is_connected(0));
        bus_0.shutdown();
        bus_1.shutdown();
    });
}

/// A man-in-the-middle holding a valid certificate: terminates the dialer's TLS, opens
/// its own TLS to the acceptor, and relays the bytes unchanged.
async fn relay_forever(listener: TcpListener, mitm: TlsContext, upstream: std::net::SocketAddr) {
    loop {
        let Ok(tcp) = listener.accept().await else {
            return;
        };
        let mitm = mitm.clone();
        glommio::spawn_local(async move {
            let Ok(down) = TlsAcceptor::from(mitm.server_config()).accept(tcp).await else {
                return;
            };
            let Ok(tcp) = TcpStream::connect(upstream).await else {
                return;
            };
            let name = ServerName::IpAddress(upstream.ip().into());
            let Ok(up) = TlsConnector::from(mitm.client_config())
                .connect(name, tcp)
                .await
            else {
                return;
            };
            let (mut down_r, mut down_w) = futures_lite::io::split(down);
            let (mut up_r, mut up_w) = futures_lite::io::split(up);
            let a = glommio::spawn_local(async move { pump(&mut down_r, &mut up_w).await });
            let b = glommio::spawn_local(async move { pump(&mut up_r, &mut down_w).await });
            futures_lite::future::or(a, b).await;
        })
        .detach();
    }
}

async fn pump(
    from: &mut (impl futures_lite::AsyncRead + Unpin),
    to: &mut (impl futures_lite::AsyncWrite + Unpin),
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() || to.flush().await.is_err() {
            return;
        }
    }
}

fn mitm_setup(auth: bool) -> (Bus, Rc<Recorder>, Bus, Rc<Recorder>) {
    let pki = Pki::new("cluster ca");
    let (bus_1, seen_1) = tls_node(
        config(1, &[loopback(0), loopback(0)]),
        pki.context(&pki),
        auth,
    );
    let listener = TcpListener::bind(loopback(0)).unwrap();
    let mitm_addr = listener.local_addr().unwrap();
    glommio::spawn_local(relay_forever(
        listener,
        pki.context(&pki),
        bus_1.replica_addr(),
    ))
    .detach();
    // Node 0's roster points at the man-in-the-middle.
    let (bus_0, seen_0) = tls_node(
        config(0, &[loopback(0), mitm_addr]),
        pki.context(&pki),
        auth,
    );
    (bus_0, seen_0, bus_1, seen_1)
}

#[test]
fn relaying_man_in_the_middle_fails_the_channel_binding() {
    run(|| async {
        let (bus_0, seen_0, bus_1, seen_1) = mitm_setup(true);
        assert!(
            wait_until(LINK_WAIT, || bus_0
                .stats()
                .snapshot()
                .rejected("handshake_mac_mismatch")
                >= 2)
            .await
        );
        settle(Duration::from_millis(50)).await;
        assert!(!bus_0.is_connected(1));
        assert!(!bus_1.is_connected(0));
        assert!(seen_0.seen.borrow().connected.is_empty());
        assert!(seen_1.seen.borrow().connected.is_empty());
        bus_0.shutdown();
        bus_1.shutdown();
    });
}

#[test]
fn the_relay_itself_works_when_auth_is_off() {
    // Control for the test above: without the MAC binding the same relay goes unnoticed.
    run(|| async {
        let (bus_0, _, bus_1, seen_1) = mitm_setup(false);
        assert!(wait_until(LINK_WAIT, || bus_0.is_connected(1) && bus_1.is_connected(0)).await);
        bus_0.send(1, commit_frame(0, 9)).unwrap();
        assert!(wait_until(LINK_WAIT, || seen_1.seen.borrow().frames.len() == 1).await);
        bus_0.shutdown();
        bus_1.shutdown();
    });
}

#[test]
fn tls_client_without_the_replica_alpn_is_refused() {
    run(|| async {
        let pki = Pki::new("cluster ca");
        let (bus_1, _) = acceptor(pki.context(&pki));
        let name = ServerName::IpAddress(bus_1.replica_addr().ip().into());
        for alpn in [Vec::new(), vec![b"h2".to_vec()]] {
            let mut client = (*pki.context(&pki).client_config()).clone();
            client.alpn_protocols = alpn;
            let tcp = TcpStream::connect(bus_1.replica_addr()).await.unwrap();
            if let Ok(mut tls) = TlsConnector::from(std::sync::Arc::new(client))
                .connect(name.clone(), tcp)
                .await
            {
                // Handshake finished on our side; the node must still hang up.
                let mut sink = Vec::new();
                let _ = tls.read_to_end(&mut sink).await;
                assert!(sink.is_empty());
            }
        }
        let stats = bus_1.stats().snapshot();
        assert!(
            wait_until(LINK_WAIT, || {
                let stats = bus_1.stats().snapshot();
                stats.rejected("tls_alpn_mismatch") + stats.rejected("tls_handshake_failed") == 2
            })
            .await,
            "{:?}",
            stats.rejected
        );
        assert_eq!(bus_1.stats().snapshot().rejected("tls_alpn_mismatch"), 1);
        bus_1.shutdown();
    });
}

/// The client port's TLS config for a leaf of `pki`, and a client config trusting `pki`.
fn client_port_tls(pki: &Pki) -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (cert, key) = pki.leaf_pem();
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("chain");
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
    let server = replication::bus::tls::client_port_config_from(chain, key).expect("server");
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(pki.ca_pem().as_bytes()) {
        roots.add(ca.expect("ca")).expect("root");
    }
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    (server, Arc::new(client))
}

fn client_request(client: u128) -> replication::wire::Frame {
    let mut header = replication::wire::RequestHeader::new();
    header.client = client;
    header.operation = replication::wire::Operation::Register as u8;
    replication::wire::Frame::build(&header, &[])
}

/// Reads until the peer closes (true) or `limit` passes (false).
async fn closed_within<S: futures_lite::AsyncRead + Unpin>(
    stream: &mut S,
    limit: Duration,
) -> bool {
    let read = async {
        let mut sink = [0u8; 4096];
        loop {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return Ok(()),
                Ok(_) => {}
            }
        }
    };
    glommio::timer::timeout(limit, read).await.is_ok()
}

#[test]
fn the_client_port_with_tls_serves_tls_and_refuses_plaintext_idle_and_untrusted_clients() {
    let pki = Pki::new("client port ca");
    let (server, trusting) = client_port_tls(&pki);
    let (rotated, trusting_rotated) = client_port_tls(&Pki::new("rotated ca"));
    run(move || async move {
        let mut config = config(0, &[loopback(0)]);
        config.client_listen = Some(loopback(0));
        config.handshake_grace = Duration::from_millis(300);
        config.client_tls = Some(server);
        let seen = recorder();
        let bus = Bus::start(config, seen.clone()).expect("starts");
        assert!(bus.client_tls_enabled());
        let addr = bus.client_addr().expect("client listener");
        let name = ServerName::try_from("localhost").expect("name");

        // TLS: the Request reaches the handler, the reply comes back encrypted.
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let mut tls = TlsConnector::from(trusting.clone())
            .connect(name.clone(), tcp)
            .await
            .expect("TLS handshake");
        tls.write_all(client_request(42).as_bytes())
            .await
            .expect("send");
        tls.flush().await.expect("flush");
        assert!(wait_until(LINK_WAIT, || seen.seen.borrow().client_frames.len() == 1).await);
        let client = seen.seen.borrow().client_frames[0].0;
        let mut reply = replication::wire::ReplyHeader::new();
        reply.client = 42;
        let reply = replication::wire::Frame::build(&reply, &[]);
        bus.send_to_client(client, reply.clone()).expect("queued");
        let mut answer = vec![0u8; 256];
        tls.read_exact(&mut answer).await.expect("reply");
        assert_eq!(answer, reply.as_bytes());

        // Plaintext: a Request header is never read as a frame; closed and counted.
        let mut plain = TcpStream::connect(addr).await.expect("connect");
        plain
            .write_all(client_request(43).as_bytes())
            .await
            .expect("send");
        assert!(closed_within(&mut plain, LINK_WAIT).await);
        // Idle: closed after handshake_grace.
        let mut idle = TcpStream::connect(addr).await.expect("connect");
        let started = std::time::Instant::now();
        assert!(closed_within(&mut idle, LINK_WAIT).await);
        assert!(started.elapsed() >= Duration::from_millis(250));
        // A client trusting another CA fails its handshake.
        let tcp = TcpStream::connect(addr).await.expect("connect");
        assert!(TlsConnector::from(trusting_rotated.clone())
            .connect(name.clone(), tcp)
            .await
            .is_err());
        assert!(
            wait_until(LINK_WAIT, || {
                let stats = bus.stats().snapshot();
                stats.rejected("client_plaintext") == 1
                    && stats.rejected("client_tls_handshake_timeout") == 1
                    && stats.rejected("client_tls_handshake_failed") == 1
            })
            .await
        );
        assert_eq!(seen.seen.borrow().client_frames.len(), 1);

        // A swap: new connections get the new certificate, the open one goes on.
        bus.set_client_tls(Some(rotated));
        let tcp = TcpStream::connect(addr).await.expect("connect");
        assert!(TlsConnector::from(trusting_rotated)
            .connect(name.clone(), tcp)
            .await
            .is_ok());
        let tcp = TcpStream::connect(addr).await.expect("connect");
        assert!(TlsConnector::from(trusting)
            .connect(name, tcp)
            .await
            .is_err());
        tls.write_all(client_request(42).as_bytes())
            .await
            .expect("send");
        tls.flush().await.expect("flush");
        assert!(wait_until(LINK_WAIT, || seen.seen.borrow().client_frames.len() == 2).await);
        bus.shutdown();
    });
}

#[test]
fn a_swapped_replica_certificate_meets_new_handshakes_while_links_go_on() {
    run(|| async {
        let cluster = Pki::new("cluster ca");
        let rogue = Pki::new("rogue ca");
        let (bus_1, seen_1) = acceptor(cluster.context(&cluster));
        let (bus_0, _) = dialer(&bus_1, cluster.context(&cluster));
        assert!(wait_until(LINK_WAIT, || bus_0.is_connected(1) && bus_1.is_connected(0)).await);
        // Node 1 now presents a certificate node 0 does not trust; the link it has goes on.
        assert!(bus_1.set_replica_tls(rogue.context(&cluster)));
        bus_0.send(1, commit_frame(0, 7)).unwrap();
        assert!(wait_until(LINK_WAIT, || seen_1.seen.borrow().frames.len() == 1).await);
        // A new handshake (node 0 restarted) meets the new certificate and fails.
        bus_0.shutdown();
        let (bus_0, _) = dialer(&bus_1, cluster.context(&cluster));
        assert!(handshakes_failed(&bus_0, 1).await);
        assert!(!bus_0.is_connected(1));
        // Swapped back to a certificate of the cluster's CA, the next dial gets in.
        assert!(bus_1.set_replica_tls(cluster.context(&cluster)));
        assert!(wait_until(Duration::from_secs(10), || bus_0.is_connected(1)).await);
        bus_0.shutdown();
        bus_1.shutdown();
        // A bus that started in plaintext stays so.
        let plain = Bus::start(config(0, &[loopback(0)]), recorder()).expect("starts");
        assert!(!plain.set_replica_tls(cluster.context(&cluster)));
        plain.shutdown();
    });
}
