//! Shared helpers for the bus integration tests: an executor per test, a recording
//! handler, loopback configs, in-memory certificates and raw-socket peers.
#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use replication::bus::{
    BusConfig, ClientId, Handler, Keys, NodeAddress, StatsSnapshot, TlsContext, VerifiedFrame,
};
use replication::wire::{cluster_id, CommitHeader, Frame, Header, METADATA_GROUP};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::RootCertStore;

pub const CLUSTER: &str = "bus-test";
pub const SECRET: &[u8] = b"the cluster's shared secret, 32+ bytes long";
pub const OTHER_SECRET: &[u8] = b"another cluster's secret, also 32+ bytes";

/// Runs `test` on a fresh single-threaded glommio executor (small io_memory: tests run in
/// parallel under the default 8 MiB RLIMIT_MEMLOCK).
pub fn run<F, Fut>(test: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(1 << 20)
        .ring_depth(256)
        .spawn(test)
        .expect("executor starts")
        .join()
        .expect("test executor finished");
}

/// What a node's handler saw.
#[derive(Default)]
pub struct Seen {
    pub frames: Vec<(u8, Vec<u8>)>,
    /// The commit field of every Commit received, read through `VerifiedFrame::header`.
    pub commits: Vec<u64>,
    pub client_frames: Vec<(ClientId, Vec<u8>)>,
    pub connected: BTreeMap<u8, u32>,
    pub disconnected: BTreeMap<u8, u32>,
}

#[derive(Default)]
pub struct Recorder {
    pub seen: RefCell<Seen>,
}

impl Handler for Recorder {
    fn on_replica_frame(&self, peer: u8, frame: VerifiedFrame) {
        let mut seen = self.seen.borrow_mut();
        if let Some(commit) = frame.header::<CommitHeader>() {
            assert!(frame
                .header::<replication::wire::PrepareOkHeader>()
                .is_none());
            assert!(frame.body().is_empty());
            seen.commits.push(commit.commit);
        }
        seen.frames.push((peer, frame.as_bytes().to_vec()));
    }

    fn on_client_frame(&self, client: ClientId, frame: VerifiedFrame) {
        self.seen
            .borrow_mut()
            .client_frames
            .push((client, frame.as_bytes().to_vec()));
    }

    fn on_peer_connected(&self, peer: u8) {
        *self.seen.borrow_mut().connected.entry(peer).or_insert(0) += 1;
    }

    fn on_peer_disconnected(&self, peer: u8) {
        *self.seen.borrow_mut().disconnected.entry(peer).or_insert(0) += 1;
    }
}

pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A roster of `count` nodes whose addresses are `addrs` (port 0 for ones not yet known).
pub fn roster(addrs: &[SocketAddr]) -> Vec<NodeAddress> {
    addrs
        .iter()
        .enumerate()
        .map(|(replica_id, addr)| NodeAddress {
            replica_id: replica_id as u8,
            addr: *addr,
            tls_server_name: None,
        })
        .collect()
}

/// A loopback config with short timers for tests.
pub fn config(replica_id: u8, addrs: &[SocketAddr]) -> BusConfig {
    let mut config = BusConfig::new(CLUSTER, replica_id, roster(addrs));
    config.replica_listen = loopback(0);
    config.reconnect_period = Duration::from_millis(50);
    config.handshake_grace = Duration::from_millis(500);
    config
}

pub fn with_auth(mut config: BusConfig, secret: &[u8], previous: Option<&[u8]>) -> BusConfig {
    config.auth.enabled = true;
    config.auth.shared_secret = secret.to_vec();
    config.auth.previous_shared_secret = previous.map(<[u8]>::to_vec);
    config
}

pub fn keys(secret: &[u8], previous: Option<&[u8]>) -> Keys {
    Keys::new(secret, previous).expect("test secrets are long enough")
}

/// Polls `condition` every 5 ms until it holds or `limit` passes.
pub async fn wait_until(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if condition() {
            return true;
        }
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    condition()
}

pub async fn settle(duration: Duration) {
    glommio::timer::sleep(duration).await;
}

/// A sealed header-only Commit from `replica`, tagged by `commit`.
pub fn commit_frame(replica: u8, commit: u64) -> Frame {
    let mut header = CommitHeader::new();
    header.frame.cluster = cluster_id(CLUSTER);
    header.frame.replica = replica;
    header.commit = commit;
    header.timestamp_monotonic = commit;
    header.group = METADATA_GROUP;
    Frame::build(&header, &[])
}

pub fn rejected(stats: &StatsSnapshot, reason: &str) -> u64 {
    stats.rejected(reason)
}

/// A certificate authority and the material of nodes it signs.
pub struct Pki {
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let ca = params.self_signed(&ca_key).expect("ca");
        Pki { ca, ca_key }
    }

    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// A leaf for 127.0.0.1 (server and client auth) signed by this CA: (cert PEM, key PEM).
    pub fn leaf_pem(&self) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .expect("params");
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params
            .signed_by(&key, &self.ca, &self.ca_key)
            .expect("leaf");
        (cert.pem(), key.serialize_pem())
    }

    /// A TLS context for one node: its own leaf, trusting `trust` as CA.
    pub fn context(&self, trust: &Pki) -> TlsContext {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .expect("params");
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params
            .signed_by(&key, &self.ca, &self.ca_key)
            .expect("leaf");
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from(trust.ca.der().to_vec()))
            .expect("root");
        TlsContext::new(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            roots,
        )
        .expect("tls context")
    }
}

/// A handler shared with the test body.
pub fn recorder() -> Rc<Recorder> {
    Rc::new(Recorder::default())
}
