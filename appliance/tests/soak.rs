//! Hostile-load soak: a 3-node cluster on 127.0.0.1, one producer at a steady
//! rate through the client library, first alone, then while other threads hold 2,000
//! client connections and keep sending garbage, oversize frames and replica-only commands
//! to the client ports and bad handshakes to the replica ports.
//!
//! Checked: no acknowledged message is lost (consumed back and verified), the loaded
//! throughput is at least half the unloaded one measured here, every node's RSS stays
//! bounded, and the rejections show in /stats. The loaded phase lasts `SOAK_SECONDS`
//! (default 20, so `cargo test --workspace` runs it); the figures are printed.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use appliance::client::{Client as Library, ClientOptions};
use appliance::protocol::reply::split_poll_body;
use appliance::protocol::{Consumer, PollStrategy};
use common::*;
use replication::wire::batch::{self, BatchBuilder, NewMessage};
use replication::wire::{
    cluster_id, CommitHeader, Frame, Header, PartitionKey, ReplicaHelloHeader, RequestHeader,
};
use zerocopy::IntoBytes;

const NODES: usize = 3;
/// Connections the attackers hold open (fewer if RLIMIT_NOFILE's hard limit forbids).
const HELD_CONNECTIONS: u64 = 2_000;
const PER_BATCH: u64 = 10;
/// The producer's steady rate.
const BATCHES_PER_SECOND: u64 = 40;
const MIB: u64 = 1 << 20;

fn soak_seconds() -> u64 {
    std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s| *s > 0)
        .unwrap_or(20)
}

/// Raises the soft RLIMIT_NOFILE towards `want` (within the hard limit); returns it.
fn raise_nofile(want: u64) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        let raised = want.min(limit.rlim_max).max(limit.rlim_cur);
        if raised > limit.rlim_cur {
            limit.rlim_cur = raised;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
            }
        }
    }
    limit.rlim_cur
}

fn payload(index: u64) -> Vec<u8> {
    let mut bytes = (index.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .to_le_bytes()
        .repeat(12);
    bytes[0] = (index % 251) as u8;
    bytes
}

fn batch_of(first: u64) -> Vec<u8> {
    let payloads: Vec<Vec<u8>> = (first..first + PER_BATCH).map(payload).collect();
    let mut builder = BatchBuilder::with_capacity(PER_BATCH as usize * 200);
    for (i, p) in payloads.iter().enumerate() {
        builder.push(NewMessage {
            id: u128::from(first + i as u64) + 1,
            timestamp_delta: 0,
            payload: p,
            user_headers: &[],
        });
    }
    builder.finish(1)
}

/// Produces at BATCHES_PER_SECOND for `duration`; returns the first index of every
/// acknowledged batch and the acknowledged messages per second.
fn produce(
    client: &mut Library,
    key: PartitionKey,
    next: &mut u64,
    duration: Duration,
) -> (Vec<u64>, f64, u64) {
    let started = Instant::now();
    let interval = Duration::from_secs(1) / BATCHES_PER_SECOND as u32;
    let mut acked = Vec::new();
    let mut failed = 0;
    let mut slot = started;
    while started.elapsed() < duration {
        let first = *next;
        *next += PER_BATCH;
        match client.send_messages(key, &batch_of(first)) {
            Ok(_) => acked.push(first),
            Err(_) => failed += 1,
        }
        slot += interval;
        if let Some(wait) = slot.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    let rate = (acked.len() as u64 * PER_BATCH) as f64 / started.elapsed().as_secs_f64();
    (acked, rate, failed)
}

/// VmRSS of a process in bytes.
fn rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kb| kb * 1024)
}

/// Samples every node's RSS every 250 ms: (when, per-node bytes).
type Samples = Arc<Mutex<Vec<(Instant, Vec<u64>)>>>;

fn sample_rss(pids: Vec<i32>, stop: Arc<AtomicBool>, samples: Samples) -> JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Relaxed) {
            let now: Vec<u64> = pids.iter().map(|pid| rss(*pid)).collect();
            samples
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((Instant::now(), now));
            std::thread::sleep(Duration::from_millis(250));
        }
    })
}

fn peak(samples: &Samples, from: Instant, to: Instant) -> Vec<u64> {
    let samples = samples.lock().unwrap_or_else(|p| p.into_inner());
    let mut peak = vec![0u64; NODES];
    for (at, values) in samples.iter().filter(|(at, _)| *at >= from && *at <= to) {
        let _ = at;
        for (p, v) in peak.iter_mut().zip(values) {
            *p = (*p).max(*v);
        }
    }
    peak
}

/// Sends `bytes` on a fresh connection and waits (briefly) for the server to close it.
fn hit(addr: SocketAddr, bytes: &[u8]) -> bool {
    let Ok(mut tcp) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(3)));
    let _ = tcp.write_all(bytes);
    let mut sink = [0u8; 1024];
    loop {
        match tcp.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(_) => return false,
        }
    }
}

/// A thread that sends `make(i)` to the addresses in turn until `stop`; counts hits.
fn attacker(
    addrs: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    make: impl Fn(u64) -> Vec<u8> + Send + 'static,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut i = 0u64;
        while !stop.load(Relaxed) {
            let addr = addrs[i as usize % addrs.len()];
            hit(addr, &make(i));
            sent.fetch_add(1, Relaxed);
            i += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

fn garbage(seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let len = 256 + rng.usize(..2048);
    (0..len).map(|_| rng.u8(..)).collect()
}

/// A Request header announcing a 100 MiB frame (the client limit is 512 KiB here).
fn oversize() -> Vec<u8> {
    let mut header = RequestHeader::new();
    header.client = 77;
    header.frame.size = 100 << 20;
    header.as_bytes().to_vec()
}

/// A Commit: a replica-plane command, refused on the client plane.
fn replica_only() -> Vec<u8> {
    let mut header = CommitHeader::new();
    header.frame.cluster = cluster_id("e2e");
    Frame::build(&header, &[]).as_bytes().to_vec()
}

/// Bad handshakes for the replica port: garbage, another cluster's hello, a hello
/// followed by junk.
fn bad_handshake(i: u64) -> Vec<u8> {
    match i % 3 {
        0 => garbage(i ^ 0xbad),
        1 => {
            let mut hello = ReplicaHelloHeader::new();
            hello.frame.cluster = cluster_id("another-cluster");
            Frame::build(&hello, &[]).as_bytes().to_vec()
        }
        _ => {
            let mut hello = ReplicaHelloHeader::new();
            hello.frame.cluster = cluster_id("e2e");
            hello.frame.replica = 200;
            let mut bytes = Frame::build(&hello, &[]).as_bytes().to_vec();
            bytes.extend_from_slice(&garbage(i)[..256]);
            bytes
        }
    }
}

/// Reads partition 0 back and checks every acknowledged batch is there, intact.
fn verify_acked(client: &mut Library, key: PartitionKey, acked: &[u64]) -> usize {
    let mut found: HashMap<u128, Vec<u8>> = HashMap::new();
    let mut offset = 0u64;
    loop {
        let body = client
            .poll_messages(key, Consumer::Single(1), PollStrategy::Offset(offset), 1000)
            .expect("poll");
        let batches = split_poll_body(&body).expect("verified batches");
        if batches.is_empty() {
            break;
        }
        for (bytes, _) in batches {
            for message in batch::messages(bytes) {
                if message.offset >= offset {
                    found.insert(message.id, message.payload.to_vec());
                    offset = message.offset + 1;
                }
            }
        }
    }
    for first in acked {
        for index in *first..first + PER_BATCH {
            let stored = found
                .get(&(u128::from(index) + 1))
                .unwrap_or_else(|| panic!("acknowledged message {index} is lost"));
            assert_eq!(stored, &payload(index), "payload of message {index}");
        }
    }
    found.len()
}

fn rejections(files: &ClusterFiles) -> HashMap<String, u64> {
    let mut total = HashMap::new();
    for replica in 0..NODES {
        if let Some(map) = stats(files, replica)["rejected"].as_object() {
            for (label, count) in map {
                *total.entry(label.clone()).or_insert(0) += count.as_u64().unwrap_or(0);
            }
        }
    }
    total
}

#[test]
fn producer_keeps_its_rate_and_every_ack_under_hostile_load() {
    let loaded_for = Duration::from_secs(soak_seconds());
    let unloaded_for = Duration::from_secs((soak_seconds() / 4).clamp(5, 15));
    // Each held connection costs one descriptor here and one in a daemon (the daemons
    // inherit this limit); leave room for everything else.
    let nofile = raise_nofile(HELD_CONNECTIONS + 1_024);
    let held_target = HELD_CONNECTIONS.min(nofile.saturating_sub(512));
    eprintln!("soak: RLIMIT_NOFILE soft {nofile}; holding {held_target} connections");

    let files = ClusterFiles::new(NODES);
    let mut daemons: Vec<Daemon> = (0..NODES).map(|r| Daemon::start(&files, r)).collect();
    for daemon in &mut daemons {
        wait_healthy(&files, daemon, Duration::from_secs(60));
    }
    let servers: Vec<SocketAddr> = (0..NODES).map(|r| files.client_addr(r)).collect();
    let mut client = Library::connect(&servers, ClientOptions::default()).expect("connect");
    client
        .login("root", ROOT_PASSWORD.as_bytes())
        .expect("login");
    client.register().expect("register");
    let stream = client.create_stream("soak").expect("stream");
    let topic = client.create_topic(stream, "t", 1).expect("topic");
    let key = PartitionKey {
        stream,
        topic,
        partition: 0,
    };
    // Warm up: the partition group elects, the client learns its primary.
    let mut next = 0u64;
    let (warm, _, _) = produce(&mut client, key, &mut next, Duration::from_secs(2));
    assert!(!warm.is_empty(), "the producer cannot produce at all");

    let stop_sampling = Arc::new(AtomicBool::new(false));
    let samples: Samples = Arc::default();
    let sampler = sample_rss(
        daemons.iter().map(Daemon::pid).collect(),
        stop_sampling.clone(),
        samples.clone(),
    );

    let unloaded_at = Instant::now();
    let (acked_unloaded, unloaded_rate, unloaded_failed) =
        produce(&mut client, key, &mut next, unloaded_for);
    let unloaded_end = Instant::now();
    let before = rejections(&files);

    // The attack.
    let stop = Arc::new(AtomicBool::new(false));
    let held = Arc::new(Mutex::new(Vec::new()));
    let opened = Arc::new(AtomicU64::new(0));
    let holder = {
        let (servers, held, opened) = (servers.clone(), held.clone(), opened.clone());
        std::thread::spawn(move || {
            for i in 0..held_target {
                let addr = servers[i as usize % servers.len()];
                if let Ok(tcp) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                    held.lock().unwrap_or_else(|p| p.into_inner()).push(tcp);
                    opened.fetch_add(1, Relaxed);
                }
            }
        })
    };
    let replica_ports: Vec<SocketAddr> = files
        .ports
        .iter()
        .map(|p| SocketAddr::from(([127, 0, 0, 1], p.tcp_replica)))
        .collect();
    let sent = Arc::new(AtomicU64::new(0));
    let attackers = vec![
        attacker(servers.clone(), stop.clone(), sent.clone(), garbage),
        attacker(servers.clone(), stop.clone(), sent.clone(), |_| oversize()),
        attacker(servers.clone(), stop.clone(), sent.clone(), |_| {
            replica_only()
        }),
        attacker(replica_ports, stop.clone(), sent.clone(), bad_handshake),
    ];
    let loaded_at = Instant::now();
    let (acked_loaded, loaded_rate, loaded_failed) =
        produce(&mut client, key, &mut next, loaded_for);
    let loaded_end = Instant::now();
    stop.store(true, Relaxed);
    holder.join().expect("holder thread");
    for attacker in attackers {
        attacker.join().expect("attacker thread");
    }
    let held_open = opened.load(Relaxed);
    drop(held);
    stop_sampling.store(true, Relaxed);
    let _ = sampler.join();

    // A node that stopped (a crash, or the host's disk filling up) is reported as such.
    for daemon in &mut daemons {
        if let Some(child) = daemon.child.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                let log = log_of(&daemon.log);
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                panic!(
                    "node {} exited ({status}) under load: {tail:?}",
                    daemon.replica
                );
            }
        }
    }

    // Figures.
    let after = rejections(&files);
    let mut delta: Vec<(String, u64)> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect();
    delta.sort();
    let rss_unloaded = peak(&samples, unloaded_at, unloaded_end);
    let rss_loaded = peak(&samples, loaded_at, loaded_end);
    let ratio = loaded_rate / unloaded_rate;
    eprintln!(
        "soak: unloaded {unloaded_for:?}: {unloaded_rate:.0} msg/s ({} batches acked, {unloaded_failed} failed)",
        acked_unloaded.len()
    );
    eprintln!(
        "soak: loaded {loaded_for:?}: {loaded_rate:.0} msg/s ({} batches acked, {loaded_failed} failed), ratio {ratio:.2}",
        acked_loaded.len()
    );
    eprintln!(
        "soak: {held_open} connections held, {} hostile connections made",
        sent.load(Relaxed)
    );
    eprintln!(
        "soak: peak RSS MiB unloaded {:?}, loaded {:?}",
        rss_unloaded.iter().map(|b| b / MIB).collect::<Vec<_>>(),
        rss_loaded.iter().map(|b| b / MIB).collect::<Vec<_>>()
    );
    let third = (loaded_end - loaded_at) / 3;
    let thirds: Vec<Vec<u64>> = (0..3u32)
        .map(|i| {
            let from = loaded_at + third * i;
            peak(&samples, from, from + third)
                .iter()
                .map(|b| b / MIB)
                .collect()
        })
        .collect();
    eprintln!("soak: peak RSS MiB per third of the load: {thirds:?}");
    eprintln!("soak: rejected during the load: {delta:?}");

    // Checks.
    let mut all_acked = warm;
    all_acked.extend(&acked_unloaded);
    all_acked.extend(&acked_loaded);
    let stored = verify_acked(&mut client, key, &all_acked);
    eprintln!(
        "soak: {} acknowledged messages verified ({stored} stored)",
        all_acked.len() as u64 * PER_BATCH
    );
    assert!(
        ratio >= 0.5,
        "loaded throughput {loaded_rate:.0} msg/s is below half of {unloaded_rate:.0}"
    );
    for (node, (loaded, unloaded)) in rss_loaded.iter().zip(&rss_unloaded).enumerate() {
        let bound = (unloaded * 2).max(unloaded + 256 * MIB);
        assert!(
            *loaded <= bound,
            "node {node} RSS grew from {} MiB to {} MiB under load",
            unloaded / MIB,
            loaded / MIB
        );
    }
    assert!(held_open >= held_target * 9 / 10, "only {held_open} held");
    let count = |label: &str| {
        delta
            .iter()
            .find(|(l, _)| l == label)
            .map_or(0, |(_, v)| *v)
    };
    assert!(count("size_too_large") > 0, "oversize frames not counted");
    assert!(
        count("client_plane_not_request") > 0,
        "replica-only commands on the client port not counted"
    );
    let handshakes: u64 = delta
        .iter()
        .filter(|(l, _)| l.starts_with("handshake"))
        .map(|(_, v)| v)
        .sum();
    assert!(handshakes > 0, "bad handshakes not counted");
    let total: u64 = delta.iter().map(|(_, v)| v).sum();
    assert!(
        total >= sent.load(Relaxed) / 2,
        "most hostile input uncounted"
    );
}
