//! TLS on the replica plane: TLS 1.3 with mutual certificates from ca_file, and the
//! exporter folded into the handshake MACs so a relaying man-in-the-middle fails.

mod common;

use std::rc::Rc;
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
        let (bus_1, seen_1) = tls_node(
            config(1, &[loopback(0), loopback(0)]),
            trusted.context(&trusted),
            true,
        );
        // The rogue node trusts the cluster CA but its own certificate is not signed by it.
        let (bus_0, _) = tls_node(
            config(0, &[loopback(0), bus_1.replica_addr()]),
            rogue.context(&trusted),
            true,
        );
        assert!(
            wait_until(LINK_WAIT, || bus_1
                .stats()
                .snapshot()
                .rejected("tls_handshake_failed")
                >= 2)
            .await
        );
        assert!(!bus_1.is_connected(0));
        assert!(seen_1.seen.borrow().connected.is_empty());
        bus_0.shutdown();
        bus_1.shutdown();

        // The other way round: an acceptor with a rogue certificate is refused by the
        // dialer's verification against the cluster CA.
        let (bus_1, _) = tls_node(
            config(1, &[loopback(0), loopback(0)]),
            rogue.context(&trusted),
            true,
        );
        let (bus_0, seen_0) = tls_node(
            config(0, &[loopback(0), bus_1.replica_addr()]),
            trusted.context(&trusted),
            true,
        );
        assert!(
            wait_until(LINK_WAIT, || bus_0
                .stats()
                .snapshot()
                .rejected("tls_handshake_failed")
                >= 2)
            .await
        );
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
        assert!(
            wait_until(LINK_WAIT, || bus_1
                .stats()
                .snapshot()
                .rejected("tls_handshake_failed")
                >= 1)
            .await
        );
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
        let (bus_1, _) = tls_node(
            config(1, &[loopback(0), loopback(0)]),
            pki.context(&pki),
            true,
        );
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
