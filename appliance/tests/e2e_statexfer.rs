//! State transfer between real daemons: a backup whose data directory is wiped
//! while the cluster holds far more partition data than the repair window rejoins by
//! state transfer while a producer keeps writing, and afterwards serves committed data
//! identical to the primary's; a fetcher killed mid-transfer completes after its
//! restart; chunks corrupted in flight (test hook) are caught and refetched; idle
//! partitions over `limits.repair_memory_max` give up the prepare of their commit point
//! and read it back from disk for a state transfer.
//!
//! STATEXFER_TEST_BYTES sets the payload the cluster holds before the wipe (default: 2 GiB
//! for the first test in a release build, 384 MiB otherwise; either is far beyond the
//! 256-prepare repair window).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use appliance::client::{Client, ClientOptions};
use appliance::protocol::reply::split_poll_body;
use appliance::protocol::{Consumer, PollStrategy};
use common::*;
use replication::wire::batch;
use replication::wire::PartitionKey;

const PARTITIONS: u32 = 2;
const MESSAGE_SIZE: usize = 1024;
const PER_BATCH: usize = 400;

fn wait_seconds() -> u64 {
    std::env::var("STATEXFER_TEST_WAIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600)
}

/// STATEXFER_TEST_BYTES, else `release` in an optimised build and `debug` otherwise
/// (an unoptimised daemon writes and hashes far slower; CI runs this file in release
/// too, with the full size).
fn test_bytes(release: u64, debug: u64) -> u64 {
    std::env::var("STATEXFER_TEST_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            debug
        } else {
            release
        })
}

/// A 3-node cluster with 64 MiB segments and frames large enough for 1 MiB chunks.
fn cluster() -> ClusterFiles {
    let files = ClusterFiles::new(3);
    files.edit_configs(&[
        ("segment_size = \"1 MiB\"", "segment_size = \"64 MiB\""),
        (
            "max_message_size = \"1 MiB\"",
            "max_message_size = \"2 MiB\"",
        ),
    ]);
    files
}

fn connect(files: &ClusterFiles, replicas: &[usize]) -> Client {
    library_client(files, replicas)
}

fn batch_of(first: u64) -> Vec<u8> {
    numbered_batch(first, PER_BATCH, MESSAGE_SIZE)
}

struct Setup {
    // Daemons go first (they print their logs on drop while the files still exist).
    daemons: Vec<Daemon>,
    files: ClusterFiles,
    keys: Vec<PartitionKey>,
    /// Acknowledged messages per partition.
    acked: Arc<Mutex<Vec<u64>>>,
    next_id: u64,
}

fn start(env: &[(&str, &str)]) -> Setup {
    start_with(cluster(), env)
}

fn start_with(files: ClusterFiles, env: &[(&str, &str)]) -> Setup {
    let (daemons, keys) = start_with_topic(&files, env, PARTITIONS);
    Setup {
        daemons,
        files,
        keys,
        acked: Arc::new(Mutex::new(vec![0; PARTITIONS as usize])),
        next_id: 0,
    }
}

impl Setup {
    /// Produces about `bytes` of payload (round robin over the partitions).
    fn produce(&mut self, bytes: u64) {
        let mut client = connect(&self.files, &[0, 1, 2]);
        client.register().expect("register");
        let batches = bytes / (PER_BATCH * MESSAGE_SIZE) as u64;
        for b in 0..batches {
            let partition = (b % u64::from(PARTITIONS)) as usize;
            let reply = client
                .send_messages(self.keys[partition], &batch_of(self.next_id))
                .expect("send");
            let mut acked = self.acked.lock().expect("lock");
            assert_eq!(reply.base_offset, acked[partition], "dense offsets");
            acked[partition] += PER_BATCH as u64;
            self.next_id += PER_BATCH as u64;
        }
    }

    /// A producer thread writing until `stop` is set, at most one batch per 20 ms.
    fn background_producer(&mut self, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
        let addrs: Vec<_> = (0..3).map(|r| self.files.client_addr(r)).collect();
        let keys = self.keys.clone();
        let acked = self.acked.clone();
        let mut next_id = self.next_id + 1_000_000_000;
        std::thread::spawn(move || {
            let mut client = Client::connect(&addrs, ClientOptions::default()).expect("connect");
            client
                .login("root", ROOT_PASSWORD.as_bytes())
                .expect("login");
            client.register().expect("register");
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let partition = (sent % u64::from(PARTITIONS)) as usize;
                let reply = client
                    .send_messages(keys[partition], &batch_of(next_id))
                    .expect("send while a backup rejoins");
                let mut acked = acked.lock().expect("lock");
                assert_eq!(reply.base_offset, acked[partition], "dense offsets");
                acked[partition] += PER_BATCH as u64;
                next_id += PER_BATCH as u64;
                sent += 1;
                drop(acked);
                std::thread::sleep(Duration::from_millis(20));
            }
            sent
        })
    }

    fn wipe(&mut self, replica: usize) {
        self.daemons[replica].kill();
        std::fs::remove_dir_all(self.files.data_dir(replica)).expect("wipe");
    }

    fn xfer_stats(&self, replica: usize) -> Option<serde_json::Value> {
        let (code, body) = http_get(self.files.http_addr(replica), "/stats")?;
        if code != 200 {
            return None;
        }
        let stats: serde_json::Value = serde_json::from_str(&body).ok()?;
        Some(stats["state_transfer"].clone())
    }

    /// Waits until `replica` installed at least `installs` transfers and every group
    /// there is normal.
    fn wait_transferred(&mut self, replica: usize, installs: u64, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(child) = self.daemons[replica].child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("node {replica} exited: {status}");
                }
            }
            let done = self
                .xfer_stats(replica)
                .is_some_and(|s| s["transfers_completed"].as_u64().unwrap_or(0) >= installs);
            let healthy = http_get(self.files.http_addr(replica), "/health")
                .is_some_and(|(code, _)| code == 200);
            if done && healthy {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {replica}: no state transfer within {within:?}: {:?}",
                self.xfer_stats(replica)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Per partition: (messages, XxHash3 of every offset, id and payload) that node
    /// `replica` alone serves.
    fn digest(&self, replica: usize) -> Vec<(u64, u64)> {
        let mut client = connect(&self.files, &[replica]);
        self.keys
            .iter()
            .map(|key| {
                let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
                let mut next = 0u64;
                loop {
                    let body = client
                        .poll_messages(
                            *key,
                            Consumer::Single(1),
                            PollStrategy::Offset(next),
                            20_000,
                        )
                        .expect("poll");
                    let batches = split_poll_body(&body).expect("verified batches");
                    let mut moved = false;
                    for (bytes, _) in batches {
                        for message in batch::messages(bytes) {
                            if message.offset < next {
                                continue;
                            }
                            assert_eq!(message.offset, next, "node {replica}: gap");
                            hasher.update(&message.offset.to_le_bytes());
                            hasher.update(&message.id.to_le_bytes());
                            hasher.update(message.payload);
                            next += 1;
                            moved = true;
                        }
                    }
                    if !moved {
                        break;
                    }
                }
                (next, hasher.digest())
            })
            .collect()
    }

    /// Every node serves exactly the acknowledged messages, with identical bytes.
    fn assert_identical(&self) {
        let want: Vec<u64> = self.acked.lock().expect("lock").clone();
        let deadline = Instant::now() + Duration::from_secs(120);
        let primary = loop {
            let digests: Vec<_> = (0..3).map(|r| self.digest(r)).collect();
            let counts: Vec<Vec<u64>> = digests
                .iter()
                .map(|d| d.iter().map(|(n, _)| *n).collect())
                .collect();
            if counts.iter().all(|c| *c == want) {
                assert_eq!(digests[1], digests[0], "node 1 differs from node 0");
                assert_eq!(digests[2], digests[0], "node 2 differs from node 0");
                break digests[0].clone();
            }
            assert!(
                Instant::now() < deadline,
                "nodes serve {counts:?}, acknowledged {want:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        };
        assert_eq!(primary.len(), PARTITIONS as usize);
    }
}

#[test]
fn a_wiped_backup_rejoins_by_state_transfer_while_a_producer_writes() {
    let bytes = test_bytes(2 << 30, 384 << 20);
    let mut setup = start(&[]);
    let started = Instant::now();
    setup.produce(bytes);
    eprintln!(
        "produced {} MiB in {:.1} s",
        bytes >> 20,
        started.elapsed().as_secs_f64()
    );
    setup.wipe(2);
    let stop = Arc::new(AtomicBool::new(false));
    let producer = setup.background_producer(stop.clone());
    std::thread::sleep(Duration::from_millis(500));
    let rejoin = Instant::now();
    setup.daemons[2] = Daemon::start(&setup.files, 2);
    setup.wait_transferred(2, 1, Duration::from_secs(wait_seconds()));
    eprintln!(
        "node 2 rejoined by state transfer in {:.1} s: {}",
        rejoin.elapsed().as_secs_f64(),
        setup.xfer_stats(2).unwrap_or_default()
    );
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let sent = producer.join().expect("producer");
    assert!(sent > 0, "the producer wrote while node 2 rejoined");
    let served = setup.xfer_stats(0).expect("stats")["bytes_served"]
        .as_u64()
        .unwrap_or(0)
        + setup.xfer_stats(1).expect("stats")["bytes_served"]
            .as_u64()
            .unwrap_or(0);
    assert!(
        served >= bytes / 2,
        "peers served {served} bytes of state for {bytes} bytes of data"
    );
    setup.assert_identical();
    // Nothing of the transfer is left behind on the fetcher.
    let partitions = setup.files.data_dir(2).join("partitions");
    let leftovers: Vec<_> = std::fs::read_dir(&partitions)
        .expect("partitions")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".xfer-"))
        .collect();
    assert!(leftovers.is_empty(), "staging left: {leftovers:?}");
}

#[test]
fn a_fetcher_killed_mid_transfer_completes_after_restart_and_corrupt_chunks_are_refetched() {
    let bytes = test_bytes(384 << 20, 384 << 20);
    let mut setup = start(&[]);
    setup.produce(bytes);
    setup.wipe(2);
    setup.daemons[2] = Daemon::start(&setup.files, 2);
    // Kill it once it has fetched some, but not all, of the state.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(s) = setup.xfer_stats(2) {
            let (done, total) = (
                s["bytes_done"].as_u64().unwrap_or(0),
                s["bytes_total"].as_u64().unwrap_or(0),
            );
            if s["active"].as_bool() == Some(true) && done > 0 && done < total {
                break;
            }
            assert_eq!(
                s["transfers_completed"].as_u64(),
                Some(0),
                "the transfer ended before it could be interrupted"
            );
        }
        assert!(Instant::now() < deadline, "no transfer started");
        std::thread::sleep(Duration::from_millis(10));
    }
    setup.daemons[2].kill();
    let staged = std::fs::read_dir(setup.files.data_dir(2).join("partitions"))
        .expect("partitions")
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().starts_with(".xfer-"));
    assert!(staged, "the killed fetcher had staged part of the state");
    setup.daemons[2] =
        Daemon::start_with_env(&setup.files, 2, &[("STATEXFER_TEST_CORRUPT_CHUNKS", "3")]);
    setup.wait_transferred(2, 1, Duration::from_secs(300));
    let stats = setup.xfer_stats(2).expect("stats");
    assert!(
        stats["refetches"].as_u64().unwrap_or(0) >= 1,
        "corrupted chunks were caught and refetched: {stats}"
    );
    setup.produce(4 << 20);
    setup.assert_identical();
}

/// Streams node `replica` lists (its own committed metadata), or None when it cannot
/// answer yet.
fn streams_listed(files: &ClusterFiles, replica: usize) -> Option<u32> {
    let addr = [files.client_addr(replica)];
    let mut client = Client::connect(&addr, appliance::client::ClientOptions::default()).ok()?;
    client.login("root", ROOT_PASSWORD.as_bytes()).ok()?;
    Some(client.list_streams().ok()?.streams.len() as u32)
}

#[test]
fn a_node_that_missed_a_wrapped_metadata_ring_catches_up_by_metadata_state_transfer() {
    // 16 MiB journals of 64 KiB slots: about 250 metadata ops before a ring wraps.
    let files = ClusterFiles::new(3);
    let (mut daemons, _) = start_with_topic(&files, &[], 1);
    daemons[2].kill();
    let mut client = library_client(&files, &[0, 1]);
    client.register().expect("register");
    for i in 0..400 {
        client
            .create_stream(&format!("m{i}"))
            .expect("create stream");
    }
    // 400 streams and the one start_with_topic made, once node 0 has applied them all.
    let want = 401;
    let deadline = Instant::now() + Duration::from_secs(30);
    while streams_listed(&files, 0) != Some(want) {
        assert!(Instant::now() < deadline, "node 0 lists {want} streams");
        std::thread::sleep(Duration::from_millis(100));
    }
    daemons[2] = Daemon::start(&files, 2);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let listed = streams_listed(&files, 2);
        let completed = http_get(files.http_addr(2), "/stats")
            .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
            .and_then(|s| s["state_transfer"]["transfers_completed"].as_u64())
            .unwrap_or(0);
        if listed == Some(want) && completed >= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 2 lists {listed:?} of {want} streams after {completed} transfers"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // It keeps up afterwards: a new stream reaches it through the normal path.
    client.create_stream("after").expect("create stream");
    let deadline = Instant::now() + Duration::from_secs(30);
    while streams_listed(&files, 2) != Some(want + 1) {
        assert!(
            Instant::now() < deadline,
            "node 2 follows after the install"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let snapshots = std::fs::read_dir(files.data_dir(2).join("snapshots"))
        .expect("snapshots")
        .count();
    assert_eq!(
        snapshots, 1,
        "the installed snapshot is node 2's checkpoint"
    );
}

/// `storage` of node `replica`'s `/stats`.
fn storage_stats(files: &ClusterFiles, replica: usize) -> Option<serde_json::Value> {
    let (code, body) = http_get(files.http_addr(replica), "/stats")?;
    let stats: serde_json::Value = serde_json::from_str(&body).ok()?;
    (code == 200).then(|| stats["storage"].clone())
}

#[test]
fn commit_prepares_released_over_the_repair_memory_bound_are_read_back_for_a_transfer() {
    // One batch (400 KiB) is over the bound: once idle and checkpointed, every
    // partition of every node keeps its last batch on disk only.
    let files = cluster();
    files.edit_configs(&[("[limits]\n", "[limits]\nrepair_memory_max = \"256 KiB\"\n")]);
    let mut setup = start_with(files, &[]);
    setup.produce(24 * (PER_BATCH * MESSAGE_SIZE) as u64);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let storage: Vec<_> = (0..3).map(|r| storage_stats(&setup.files, r)).collect();
        let released = storage.iter().all(|s| {
            s.as_ref().is_some_and(|s| {
                s["commit_prepares_released"].as_u64().unwrap_or(0) >= u64::from(PARTITIONS)
                    && s["repair_window_bytes"].as_u64() == Some(0)
            })
        });
        if released {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "commit prepares still held: {storage:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // A wiped node: its peers evict every op it asks for, and serve their state with
    // the commit point's prepare read back from disk.
    setup.wipe(2);
    setup.daemons[2] = Daemon::start(&setup.files, 2);
    setup.wait_transferred(
        2,
        u64::from(PARTITIONS),
        Duration::from_secs(wait_seconds()),
    );
    let served: u64 = (0..2)
        .map(|r| {
            setup.xfer_stats(r).expect("stats")["bytes_served"]
                .as_u64()
                .unwrap_or(0)
        })
        .sum();
    assert!(served > 0, "no state served");
    setup.assert_identical();
    // The restored prepares leave memory again, and the cluster still takes writes.
    setup.produce(2 * (PER_BATCH * MESSAGE_SIZE) as u64);
    setup.assert_identical();
}
