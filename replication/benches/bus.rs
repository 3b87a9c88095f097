//! Bus throughput and latency on loopback: 64 KiB frames between two nodes,
//! plaintext and TLS, next to raw loopback TCP copying in the same run; and 256-byte
//! frame round-trip latency p50/p99. Each node runs on its own glommio executor thread.
//!
//! `cargo bench -p replication --bench bus`; BUS_BENCH_FRAMES sets the frame count.

use std::cell::{Cell, RefCell};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::task::Waker;
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use replication::bus::{Bus, BusConfig, Handler, Keys, NodeAddress, TlsContext, VerifiedFrame};
use replication::wire::{
    cluster_id, CommitHeader, Frame, Header, StateChunkHeader, METADATA_GROUP,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::RootCertStore;

const FRAME_SIZE: usize = 64 * 1024;
const CLUSTER: &str = "bench";
const SECRET: &[u8] = b"benchmark shared secret of 32+ bytes....";
const ROUND_TRIPS: usize = 20_000;
const ROUNDS: usize = 3;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn frames() -> usize {
    std::env::var("BUS_BENCH_FRAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16 * 1024)
}

fn mb_per_s(bytes: usize, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64() / 1e6
}

/// Raw loopback TCP: one thread writes `write_size` buffers, another reads 64 KiB frames
/// into a buffer.
fn raw_tcp(count: usize, write_size: usize) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let reader = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; FRAME_SIZE];
        let start = Instant::now();
        for _ in 0..count {
            stream.read_exact(&mut buf).unwrap();
        }
        start.elapsed()
    });
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_nodelay(true).unwrap();
    let frames_per_write = (write_size / FRAME_SIZE).max(1);
    let buf = vec![0x5Au8; FRAME_SIZE * frames_per_write];
    let mut left = count;
    while left > 0 {
        let frames = left.min(frames_per_write);
        stream.write_all(&buf[..frames * FRAME_SIZE]).unwrap();
        left -= frames;
    }
    let elapsed = reader.join().unwrap();
    mb_per_s(count * FRAME_SIZE, elapsed)
}

fn nodes(addr_1: SocketAddr) -> Vec<NodeAddress> {
    vec![
        NodeAddress {
            replica_id: 0,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls_server_name: None,
        },
        NodeAddress {
            replica_id: 1,
            addr: addr_1,
            tls_server_name: None,
        },
    ]
}

fn node_config(replica_id: u8, addr_1: SocketAddr) -> BusConfig {
    let mut config = BusConfig::new(CLUSTER, replica_id, nodes(addr_1));
    config.replica_listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.reconnect_period = Duration::from_millis(20);
    config.peer_queue_capacity = 256;
    config.max_batch = 64;
    config
}

/// Security of one run: keys and a TLS context per node.
#[derive(Clone)]
struct Security {
    keys: Option<Keys>,
    tls: Option<(TlsContext, TlsContext)>,
}

fn tls_contexts() -> (TlsContext, TlsContext) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = params.self_signed(&ca_key).unwrap();
    let context = || {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(CertificateDer::from(ca.der().to_vec())).unwrap();
        TlsContext::new(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            roots,
        )
        .unwrap()
    };
    (context(), context())
}

/// Counts received bytes; echoes if asked.
struct Sink {
    bytes: Arc<AtomicU64>,
    frames: Arc<AtomicU64>,
    echo: bool,
    bus: RefCell<Option<Bus>>,
    arrived: Cell<u64>,
    waker: RefCell<Option<Waker>>,
}

impl Handler for Sink {
    fn on_replica_frame(&self, peer: u8, frame: VerifiedFrame) {
        self.bytes
            .fetch_add(frame.as_bytes().len() as u64, Ordering::Relaxed);
        self.frames.fetch_add(1, Ordering::Release);
        self.arrived.set(self.arrived.get() + 1);
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
        let bus = self.bus.borrow();
        if let Some(bus) = bus.as_ref() {
            if self.echo {
                let _ = bus.send(peer, frame);
            } else {
                bus.recycle(frame.into_buf());
            }
        }
    }
}

fn sink(echo: bool) -> (Rc<Sink>, Arc<AtomicU64>) {
    let frames = Arc::new(AtomicU64::new(0));
    (
        Rc::new(Sink {
            bytes: Arc::new(AtomicU64::new(0)),
            frames: frames.clone(),
            echo,
            bus: RefCell::new(None),
            arrived: Cell::new(0),
            waker: RefCell::new(None),
        }),
        frames,
    )
}

fn executor() -> LocalExecutorBuilder {
    LocalExecutorBuilder::new(Placement::Unbound).io_memory(1 << 20)
}

/// Node 1 on its own thread: receives (or echoes) until it has seen `until` frames.
fn spawn_node_1(
    security: Security,
    echo: bool,
    until: u64,
) -> (SocketAddr, Arc<AtomicU64>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        executor()
            .spawn(move || async move {
                let (handler, frames) = sink(echo);
                let config = node_config(1, SocketAddr::from(([127, 0, 0, 1], 0)));
                let tls = security.tls.map(|(_, one)| one);
                let bus = Bus::start_with_tls(config, security.keys, tls, handler.clone())
                    .expect("node 1 starts");
                *handler.bus.borrow_mut() = Some(bus.clone());
                tx.send((bus.replica_addr(), frames.clone())).unwrap();
                while frames.load(Ordering::Acquire) < until {
                    glommio::timer::sleep(Duration::from_millis(1)).await;
                }
                // Let the last echo leave before closing.
                glommio::timer::sleep(Duration::from_millis(50)).await;
                handler.bus.borrow_mut().take();
                bus.shutdown();
            })
            .unwrap()
            .join()
            .unwrap();
    });
    let (addr, frames) = rx.recv().unwrap();
    (addr, frames, handle)
}

/// Node 0 streams `count` 64 KiB frames to node 1; MB/s from first send to last receipt.
fn bus_throughput(security: Security, count: usize) -> f64 {
    let (addr_1, received, node_1) = spawn_node_1(security.clone(), false, count as u64);
    let elapsed = executor()
        .spawn(move || async move {
            let (handler, _) = sink(false);
            let tls = security.tls.map(|(zero, _)| zero);
            let bus = Bus::start_with_tls(node_config(0, addr_1), security.keys, tls, handler)
                .expect("node 0 starts");
            while !bus.is_connected(1) {
                glommio::timer::sleep(Duration::from_millis(1)).await;
            }
            let mut header = StateChunkHeader::new();
            header.frame.cluster = cluster_id(CLUSTER);
            header.group = METADATA_GROUP;
            header.nonce = 1;
            let frame = Rc::new(Frame::build(&header, &vec![0x5Au8; FRAME_SIZE - 256]));
            let start = Instant::now();
            let mut sent = 0;
            while sent < count {
                bus.room(1).await;
                if bus.send(1, frame.clone()).is_ok() {
                    sent += 1;
                }
            }
            while received.load(Ordering::Acquire) < count as u64 {
                glommio::timer::sleep(Duration::from_micros(200)).await;
            }
            let elapsed = start.elapsed();
            bus.shutdown();
            elapsed
        })
        .unwrap()
        .join()
        .unwrap();
    node_1.join().unwrap();
    mb_per_s(count * FRAME_SIZE, elapsed)
}

/// 256-byte Commit frames echoed by node 1; returns (p50, p99, max) in microseconds.
fn bus_round_trip(security: Security) -> (u64, u64, u64) {
    let warmup = 1_000;
    let total = (ROUND_TRIPS + warmup) as u64;
    let (addr_1, _, node_1) = spawn_node_1(security.clone(), true, total);
    let histogram = executor()
        .spawn(move || async move {
            let (handler, _) = sink(false);
            let tls = security.tls.map(|(zero, _)| zero);
            let bus =
                Bus::start_with_tls(node_config(0, addr_1), security.keys, tls, handler.clone())
                    .expect("node 0 starts");
            while !bus.is_connected(1) {
                glommio::timer::sleep(Duration::from_millis(1)).await;
            }
            let mut histogram = hdrhistogram::Histogram::<u64>::new(3).unwrap();
            for i in 0..total {
                let mut header = CommitHeader::new();
                header.frame.cluster = cluster_id(CLUSTER);
                header.commit = i;
                header.group = METADATA_GROUP;
                let frame = Frame::build(&header, &[]);
                let start = Instant::now();
                bus.send(1, frame).unwrap();
                let target = handler.arrived.get() + 1;
                std::future::poll_fn(|cx| {
                    if handler.arrived.get() >= target {
                        std::task::Poll::Ready(())
                    } else {
                        *handler.waker.borrow_mut() = Some(cx.waker().clone());
                        std::task::Poll::Pending
                    }
                })
                .await;
                if i >= warmup as u64 {
                    let _ = histogram.record(start.elapsed().as_micros() as u64);
                }
            }
            bus.shutdown();
            histogram
        })
        .unwrap()
        .join()
        .unwrap();
    node_1.join().unwrap();
    (
        histogram.value_at_quantile(0.5),
        histogram.value_at_quantile(0.99),
        histogram.max(),
    )
}

fn main() {
    let count = frames();
    let plain = Security {
        keys: None,
        tls: None,
    };
    let tls = Security {
        keys: Some(Keys::new(SECRET, None).unwrap()),
        tls: Some(tls_contexts()),
    };
    println!(
        "bus benchmark: {count} frames of 64 KiB ({} MiB) per throughput run, {ROUND_TRIPS} round trips",
        count * FRAME_SIZE / (1024 * 1024)
    );
    // The host is shared: interleave the runs and report medians, so raw TCP and the bus
    // see the same background load.
    let _ = raw_tcp(count / 8 + 1, FRAME_SIZE);
    let (mut raw, mut raw_batched) = (Vec::new(), Vec::new());
    let (mut plaintext, mut encrypted) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        raw.push(raw_tcp(count, FRAME_SIZE));
        // The bus writes up to max_batch (64) frames per writev: this is raw TCP doing the
        // same, for an honest ceiling.
        raw_batched.push(raw_tcp(count, 64 * FRAME_SIZE));
        plaintext.push(bus_throughput(plain.clone(), count));
        encrypted.push(bus_throughput(tls.clone(), count));
    }
    let (raw, raw_batched) = (median(raw), median(raw_batched));
    let (plaintext, encrypted) = (median(plaintext), median(encrypted));
    println!("raw loopback TCP copy, 64 KiB writes : {raw:8.0} MB/s (medians of {ROUNDS} interleaved rounds)");
    println!("raw loopback TCP copy, 4 MiB writes  : {raw_batched:8.0} MB/s");
    println!(
        "bus plaintext, 64 KiB frames         : {plaintext:8.0} MB/s  ({:.2} of raw, {:.2} of raw 4 MiB writes)",
        plaintext / raw,
        plaintext / raw_batched
    );
    println!(
        "bus TLS 1.3 + auth, 64 KiB frames    : {encrypted:8.0} MB/s  ({:.2} of raw)",
        encrypted / raw
    );
    let (p50, p99, max) = bus_round_trip(plain);
    println!("bus plaintext round trip, 256 B      : p50 {p50} us, p99 {p99} us, max {max} us");
    let (p50, p99, max) = bus_round_trip(tls);
    println!("bus TLS round trip, 256 B            : p50 {p50} us, p99 {p99} us, max {max} us");
}
