//! State-transfer benchmark. In one run, on the disk that holds the data
//! directories ($TMPDIR):
//!
//! - limits: sequential O_DIRECT read rate of a file as large as the data, and the
//!   loopback TCP copy rate of the same number of bytes;
//! - a 3-node cluster on 127.0.0.1 filled with that much partition data; then a producer
//!   at a fixed rate (open loop: latency from the scheduled send time) for a while with
//!   no transfer, and again while node 2, its data directory wiped, rejoins by state
//!   transfer;
//! - prints the transfer rate next to the limits and the producer's p50/p99/p99.9/max
//!   without and with the transfer (target: p99 within 2x), as a table and as JSON in
//!   target/statexfer-bench.json.
//!
//! `cargo bench -p appliance --bench statexfer` (1 GiB, 10 s phases); `-- --short`
//! (256 MiB, 3 s) is what CI runs: it fails only on a crash or a wrong result (the
//! rejoined node must serve what the others serve), never on speed.
//! STATEXFER_BENCH_BYTES overrides the data size. To find what a stall came from:
//! STATEXFER_BENCH_TRACE=1 prints every producer ack slower than 20 ms (=N: N ms) with
//! its wall time, STATEXFER_BENCH_LOGS=DIR keeps the three nodes' logs there, and
//! E2E_RUST_LOG sets the nodes' log filter (e.g. `info,appliance::daemon::node=debug`
//! logs every replica or statexfer executor step slower than 15 ms).

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use appliance::client::Client;
use common::*;
use replication::wire::PartitionKey;

const PARTITIONS: u32 = 2;
const FILL_MESSAGES: usize = 400;
const PRODUCER_MESSAGES: usize = 100;
const MESSAGE_SIZE: usize = 1024;
/// Producer batches per second in the latency phases (about 5 MB/s).
const PRODUCER_RATE: f64 = 50.0;
const MB: f64 = 1e6;

fn main() {
    let short = std::env::args().any(|a| a == "--short" || a == "--quick");
    let bytes: u64 = std::env::var("STATEXFER_BENCH_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if short { 256 << 20 } else { 1 << 30 });
    let phase = Duration::from_secs(if short { 3 } else { 10 });

    let scratch = tempfile::tempdir().expect("scratch directory");
    let disk_read = disk_read_rate(&scratch.path().join("raw.dat"), bytes);
    drop(scratch);
    let loopback = loopback_rate(bytes);
    eprintln!(
        "limits: O_DIRECT read {:.0} MB/s, loopback copy {:.0} MB/s",
        disk_read / MB,
        loopback / MB
    );

    let files = ClusterFiles::new(3);
    files.edit_configs(&[
        ("segment_size = \"1 MiB\"", "segment_size = \"64 MiB\""),
        (
            "max_message_size = \"1 MiB\"",
            "max_message_size = \"2 MiB\"",
        ),
    ]);
    let (mut daemons, keys) = start_with_topic(&files, &[], PARTITIONS);
    let mut client = connect(&files, &[0, 1, 2]);
    client.register().expect("register");
    let filled = Instant::now();
    let mut id = 0u64;
    let per_batch = (FILL_MESSAGES * MESSAGE_SIZE) as u64;
    for b in 0..bytes / per_batch {
        let key = keys[(b % u64::from(PARTITIONS)) as usize];
        client
            .send_messages(key, &numbered_batch(id, FILL_MESSAGES, MESSAGE_SIZE))
            .expect("fill");
        id += FILL_MESSAGES as u64;
    }
    eprintln!(
        "filled {} MiB in {:.1} s",
        bytes >> 20,
        filled.elapsed().as_secs_f64()
    );

    let quiet = produce_for(&files, &keys, &mut id, phase, || true);
    let served_before = served_bytes(&files);
    daemons[2].kill();
    // The wipe moves the directory aside and deletes it after the measured phase: the
    // deletion of a gigabyte (online discard on a file system mounted with `discard`)
    // is the operator's doing, not the transfer's, and would load the shared disk.
    let wiped = files.data_dir(2).with_extension("wiped");
    std::fs::rename(files.data_dir(2), &wiped).expect("wipe node 2");
    daemons[2] = Daemon::start(&files, 2);
    let restarted = Instant::now();
    eprintln!(
        "node 2 wiped and restarted at unix {:.3}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64()
    );
    let mut transfer_seconds = None;
    let with_transfer = produce_for(&files, &keys, &mut id, phase, || {
        if transfer_seconds.is_none() && rejoined(&files, 2) {
            transfer_seconds = Some(restarted.elapsed().as_secs_f64());
        }
        transfer_seconds.is_some() || restarted.elapsed() > Duration::from_secs(600)
    });
    let transfer_seconds =
        transfer_seconds.expect("node 2 rejoined by state transfer within 10 minutes");
    std::fs::remove_dir_all(&wiped).expect("delete node 2's old data");
    let transferred = served_bytes(&files) - served_before;
    // The rate while fetching (the rejoin time also holds the start, the repair attempts
    // that find the range evicted, the install and the repair after it).
    let fetching = node_stats(&files, 2)
        .and_then(|s| s["state_transfer"]["fetching_seconds"].as_f64())
        .unwrap_or(transfer_seconds)
        .max(0.05);
    let rate = transferred as f64 / fetching;
    let node2 = node_stats(&files, 2);
    let fetched = |field: &str| {
        node2
            .as_ref()
            .and_then(|s| s["state_transfer"][field].as_u64())
            .unwrap_or(0)
    };
    let (transfers, reused) = (fetched("transfers_started"), fetched("bytes_reused"));

    // A wrong result fails the run: node 2 must serve what node 0 serves.
    let want = served_counts(&files, 0, &keys);
    let deadline = Instant::now() + Duration::from_secs(120);
    while served_counts(&files, 2, &keys) != want {
        assert!(Instant::now() < deadline, "node 2 did not catch up");
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(daemons);
    if let Some(keep) = std::env::var_os("STATEXFER_BENCH_LOGS") {
        // The nodes' logs, for a look at what ran when the producer waited.
        let keep = std::path::PathBuf::from(keep);
        let _ = std::fs::create_dir_all(&keep);
        for replica in 0..3 {
            let _ = std::fs::copy(files.log(replica), keep.join(format!("node{replica}.log")));
        }
    }

    let limit = disk_read.min(loopback);
    println!(
        "state transfer on loopback, {} MiB of partition data, 3 nodes on one disk",
        bytes >> 20
    );
    println!(
        "{:<44} {:>12} {:>12} {:>8}",
        "figure", "measured", "limit", "ratio"
    );
    println!(
        "{:<44} {:>9.0} MB/s {:>7.0} MB/s {:>8.2}",
        "transfer rate (min of disk read, loopback)",
        rate / MB,
        limit / MB,
        rate / limit
    );
    println!(
        "{:<44} {:>12} {:>12}",
        "  bytes transferred, seconds fetching",
        transferred,
        format!("{fetching:.1} s")
    );
    println!(
        "{:<44} {:>10.1} s",
        "  seconds from restart to rejoined", transfer_seconds
    );
    println!(
        "{:<44} {:>12}",
        "  transfers (one per partition is best)", transfers
    );
    println!("{:<44} {:>12}", "  bytes staged from local copies", reused);
    println!(
        "{:<44} {:>9.0} MB/s",
        "  O_DIRECT sequential read",
        disk_read / MB
    );
    println!("{:<44} {:>9.0} MB/s", "  loopback TCP copy", loopback / MB);
    for (name, quiet, busy) in [
        ("producer p50 (ms)", quiet.p50, with_transfer.p50),
        (
            "producer p99 (ms), target within 2x",
            quiet.p99,
            with_transfer.p99,
        ),
        ("producer p99.9 (ms)", quiet.p999, with_transfer.p999),
        ("producer max (ms)", quiet.max, with_transfer.max),
    ] {
        println!(
            "{:<44} {:>9.2} ms {:>9.2} ms {:>8.2}  (with transfer / without)",
            name,
            busy,
            quiet,
            busy / quiet.max(0.001)
        );
    }
    let json = serde_json::json!({
        "bytes": bytes,
        "transfer": {
            "bytes": transferred,
            "fetching_seconds": fetching,
            "rejoin_seconds": transfer_seconds,
            "transfers": transfers,
            "bytes_reused": reused,
            "rate_mb_s": rate / MB,
        },
        "limits": { "disk_read_mb_s": disk_read / MB, "loopback_mb_s": loopback / MB },
        "ratio_to_limit": rate / limit,
        "producer_without_transfer_ms": quiet.json(),
        "producer_with_transfer_ms": with_transfer.json(),
        "p99_ratio": with_transfer.p99 / quiet.p99.max(0.001),
    });
    let out =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/statexfer-bench.json");
    let _ = std::fs::write(&out, serde_json::to_vec_pretty(&json).unwrap_or_default());
    println!("{json}");
}

fn connect(files: &ClusterFiles, replicas: &[usize]) -> Client {
    library_client(files, replicas)
}

/// Writes `bytes` to `path` (synced), then reads it back sequentially with O_DIRECT in
/// 1 MiB requests: bytes per second of the read.
fn disk_read_rate(path: &std::path::Path, bytes: u64) -> f64 {
    const BLOCK: usize = 1 << 20;
    let mut file = std::fs::File::create(path).expect("create");
    let block = vec![0x5au8; BLOCK];
    for _ in 0..bytes / BLOCK as u64 {
        file.write_all(&block).expect("write");
    }
    file.sync_all().expect("fsync");
    drop(file);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .expect("open O_DIRECT");
    // O_DIRECT wants an aligned buffer: take the 4 KiB-aligned window of a larger one.
    let mut raw = vec![0u8; BLOCK + 4096];
    let skew = raw.as_ptr().align_offset(4096);
    let buffer = &mut raw[skew..skew + BLOCK];
    let started = Instant::now();
    let mut total = 0u64;
    loop {
        let n = file.read(buffer).expect("O_DIRECT read");
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    assert_eq!(
        total,
        bytes / BLOCK as u64 * BLOCK as u64,
        "read back what was written"
    );
    total as f64 / started.elapsed().as_secs_f64()
}

/// Copies `bytes` through a TCP connection on 127.0.0.1: bytes per second.
fn loopback_rate(bytes: u64) -> f64 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    let sender = std::thread::spawn(move || {
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        let block = vec![7u8; 1 << 20];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            stream.write_all(&block[..n]).expect("send");
            left -= n as u64;
        }
    });
    let (mut stream, _) = listener.accept().expect("accept");
    let mut buffer = vec![0u8; 1 << 20];
    let started = Instant::now();
    let mut total = 0u64;
    while total < bytes {
        let n = stream.read(&mut buffer).expect("receive");
        assert!(n > 0, "the sender stopped early");
        total += n as u64;
    }
    let rate = total as f64 / started.elapsed().as_secs_f64();
    sender.join().expect("sender");
    rate
}

#[derive(Clone, Copy)]
struct Latency {
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
    count: u64,
}

impl Latency {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({"p50": self.p50, "p99": self.p99, "p999": self.p999,
            "max": self.max, "count": self.count})
    }
}

/// Produces PRODUCER_RATE batches per second, open loop, for at least `at_least` and
/// until `done()` says so; latency from each batch's scheduled send time to its reply.
fn produce_for(
    files: &ClusterFiles,
    keys: &[PartitionKey],
    id: &mut u64,
    at_least: Duration,
    mut done: impl FnMut() -> bool,
) -> Latency {
    let mut client = connect(files, &[0, 1, 2]);
    client.register().expect("register");
    let mut histogram =
        hdrhistogram::Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("histogram");
    let started = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / PRODUCER_RATE);
    let mut sent = 0u32;
    let mut last_check = Instant::now();
    // STATEXFER_BENCH_TRACE=1 (20 ms) or =N (N ms): the slowest acks, with their times.
    let trace = std::env::var("STATEXFER_BENCH_TRACE")
        .ok()
        .map(|v| Duration::from_millis(v.parse().ok().filter(|ms| *ms > 1).unwrap_or(20)));
    loop {
        let scheduled = started + interval * sent;
        if let Some(wait) = scheduled.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let key = keys[sent as usize % keys.len()];
        client
            .send_messages(key, &numbered_batch(*id, PRODUCER_MESSAGES, MESSAGE_SIZE))
            .expect("produce");
        *id += PRODUCER_MESSAGES as u64;
        let latency = scheduled.elapsed();
        let _ = histogram.record(latency.as_micros() as u64);
        if trace.is_some_and(|slow| latency > slow) {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            eprintln!(
                "slow ack: {:.3} ms, acked at unix {}.{:06}, batch {sent} key {key:?}",
                latency.as_secs_f64() * 1e3,
                now.as_secs(),
                now.subsec_micros()
            );
        }
        sent += 1;
        if started.elapsed() >= at_least && last_check.elapsed() >= Duration::from_millis(200) {
            last_check = Instant::now();
            if done() {
                break;
            }
        }
    }
    let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    Latency {
        p50: ms(0.5),
        p99: ms(0.99),
        p999: ms(0.999),
        max: histogram.max() as f64 / 1000.0,
        count: histogram.len(),
    }
}

fn node_stats(files: &ClusterFiles, replica: usize) -> Option<serde_json::Value> {
    let (code, body) = http_get(files.http_addr(replica), "/stats")?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

/// Every partition group of `replica` was installed by a transfer and is back to normal
/// (a group whose installed state fell out of its peers' repair windows transfers
/// again; it is not rejoined until that one is installed and repaired).
fn rejoined(files: &ClusterFiles, replica: usize) -> bool {
    let Some(stats) = node_stats(files, replica) else {
        return false;
    };
    let transfer = &stats["state_transfer"];
    let installed = transfer["transfers_completed"].as_u64().unwrap_or(0);
    let partitions_normal = stats["groups"].as_array().is_some_and(|groups| {
        groups
            .iter()
            .filter(|g| g["name"].as_str() != Some("metadata"))
            .filter(|g| g["status"].as_str() == Some("normal"))
            .count()
            >= PARTITIONS as usize
    });
    installed >= u64::from(PARTITIONS)
        && transfer["active"].as_bool() == Some(false)
        && partitions_normal
}

/// State-transfer bytes served by nodes 0 and 1.
fn served_bytes(files: &ClusterFiles) -> u64 {
    (0..2)
        .filter_map(|r| node_stats(files, r))
        .filter_map(|s| s["state_transfer"]["bytes_served"].as_u64())
        .sum()
}
