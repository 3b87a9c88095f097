//! Journal benchmarks, printed side by side with the raw device figures they are judged
//! against, in one run on one file system (`target/bench-data` beside the workspace):
//!
//! 1. durable append throughput with 1 MiB bodies vs raw O_DIRECT sequential writes;
//! 2. 4 KiB durable append latency p50/p99 vs a raw 4 KiB write + fdatasync;
//! 3. recovery scan rate of a 1 GiB journal (cold page cache, then warm).
//!
//! `cargo bench -p journal --bench journal`. `JOURNAL_BENCH_MIB` shrinks the 1 GiB runs.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::io::{DmaFile, OpenOptions};
use hdrhistogram::Histogram;
use journal::layout::SECTOR_SIZE;
use journal::{Journal, JournalLayout};
use replication::wire::{Header, PrepareChain, PrepareHeader, METADATA_GROUP};

const MIB: u64 = 1024 * 1024;
const LATENCY_SAMPLES: u64 = 2000;
/// Prepares per group commit in the throughput run (a replication pipeline's depth);
/// `JOURNAL_BENCH_GROUP` overrides it.
const GROUP_DEFAULT: u64 = 8;

fn prepare(op: u64, body: &[u8]) -> Vec<u8> {
    let mut header = PrepareHeader::new();
    header.op = op;
    header.group = METADATA_GROUP;
    header.operation = 128;
    PrepareChain::after(0)
        .append(&mut header, body)
        .as_bytes()
        .to_vec()
}

fn bench_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create bench dir");
    dir
}

fn gbps(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64() / 1e9
}

async fn open_raw(path: &Path, dsync: bool) -> DmaFile {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .custom_flags(if dsync { libc::O_DSYNC } else { 0 })
        .dma_open(path)
        .await
        .expect("open raw");
    file
}

/// Raw O_DIRECT sequential 1 MiB writes into a preallocated file; one fdatasync at the end
/// (or O_DSYNC on every write).
async fn raw_sequential(path: &Path, total: u64, dsync: bool) -> f64 {
    let file = open_raw(path, dsync).await;
    file.pre_allocate(total, false).await.expect("fallocate");
    let mut buffer = file.alloc_dma_buffer(MIB as usize);
    buffer
        .as_bytes_mut()
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = i as u8);
    let buffer = Rc::new(buffer);
    let started = Instant::now();
    for i in 0..total / MIB {
        file.write_rc_at(buffer.clone(), i * MIB)
            .await
            .expect("write");
    }
    file.fdatasync().await.expect("fdatasync");
    let rate = gbps(total, started.elapsed());
    file.close().await.expect("close");
    rate
}

/// Raw 4 KiB O_DIRECT write + fdatasync latencies (µs).
async fn raw_latency(path: &Path) -> Histogram<u64> {
    let file = open_raw(path, false).await;
    file.pre_allocate(LATENCY_SAMPLES * SECTOR_SIZE, false)
        .await
        .expect("fallocate");
    let buffer = Rc::new(file.alloc_dma_buffer(SECTOR_SIZE as usize));
    let mut histogram = Histogram::new(3).expect("histogram");
    for i in 0..LATENCY_SAMPLES {
        let started = Instant::now();
        file.write_rc_at(buffer.clone(), i * SECTOR_SIZE)
            .await
            .expect("write");
        file.fdatasync().await.expect("fdatasync");
        histogram
            .record(started.elapsed().as_micros() as u64)
            .expect("record");
    }
    file.close().await.expect("close");
    histogram
}

/// Durable journal appends of `body_size` bodies in group commits of `group`; returns
/// GB/s over the time spent inside appends (building frames is not measured) and the
/// per-append-call latencies.
async fn journal_appends(
    path: &Path,
    slot_count: u64,
    body_size: u64,
    ops: u64,
    group: u64,
) -> (f64, Histogram<u64>, Journal) {
    let layout = JournalLayout::for_body_size(slot_count, body_size).expect("layout");
    let mut journal = Journal::create(path, layout).await.expect("create");
    let body = vec![0xA5u8; body_size as usize];
    let mut histogram = Histogram::new(3).expect("histogram");
    let mut bytes = 0u64;
    let mut busy = Duration::ZERO;
    let mut op = 1;
    while op <= ops {
        let frames: Vec<Vec<u8>> = (op..(op + group).min(ops + 1))
            .map(|o| prepare(o, &body))
            .collect();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let t = Instant::now();
        let _ = journal.append_batch(&refs).await.expect("append");
        let elapsed = t.elapsed();
        busy += elapsed;
        histogram
            .record(elapsed.as_micros() as u64)
            .expect("record");
        bytes += frames.iter().map(|f| f.len() as u64).sum::<u64>();
        op += frames.len() as u64;
    }
    (bytes as f64 / busy.as_secs_f64() / 1e9, histogram, journal)
}

/// Raw O_DIRECT sequential 1 MiB reads of a whole file (the scan's device ceiling),
/// with plain pread: glommio's polled reads are not supported on every device.
async fn raw_read(path: &Path) -> f64 {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .expect("open O_DIRECT");
    let size = file.metadata().expect("stat").len();
    let layout =
        std::alloc::Layout::from_size_align(MIB as usize, SECTOR_SIZE as usize).expect("layout");
    // SAFETY: a non-zero-size layout; freed below with the same layout.
    let buffer = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!buffer.is_null());
    // SAFETY: `buffer` points to MIB initialized (zeroed) bytes owned here.
    let slice = unsafe { std::slice::from_raw_parts_mut(buffer, MIB as usize) };
    let started = Instant::now();
    let mut at = 0;
    while at < size {
        let read = file.read_at(slice, at).expect("read");
        assert!(read > 0);
        at += read as u64;
    }
    let rate = gbps(size, started.elapsed());
    // SAFETY: allocated above with this layout and no longer borrowed.
    unsafe { std::alloc::dealloc(buffer, layout) };
    rate
}

fn drop_cache(path: &Path) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).expect("open");
    // SAFETY: advisory call on a file descriptor we own.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

async fn run() {
    let dir = bench_dir();
    let mib: u64 = std::env::var("JOURNAL_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let group: u64 = std::env::var("JOURNAL_BENCH_GROUP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(GROUP_DEFAULT)
        .clamp(1, journal::journal::APPEND_BATCH_MAX);
    println!("journal benchmarks in {} ({} MiB runs)", dir.display(), mib);

    // 1. Throughput, 1 MiB bodies.
    let raw = raw_sequential(&dir.join("raw-seq"), mib * MIB, false).await;
    let raw_dsync = raw_sequential(&dir.join("raw-seq-dsync"), mib * MIB, true).await;
    let _ = std::fs::remove_file(dir.join("raw-seq"));
    let _ = std::fs::remove_file(dir.join("raw-seq-dsync"));
    let (single_rate, single_latency, journal) = journal_appends(
        &dir.join("journal-1m-single"),
        mib.min(256),
        MIB,
        mib.min(256),
        1,
    )
    .await;
    journal.close().await.expect("close");
    let _ = std::fs::remove_file(dir.join("journal-1m-single"));
    let journal_path = dir.join("journal-1m");
    let (append_rate, append_latency, journal) =
        journal_appends(&journal_path, mib, MIB, mib, group).await;
    journal.close().await.expect("close");
    // The disk is shared: measure raw again after the journal runs and use the mean.
    let raw_after = raw_sequential(&dir.join("raw-seq"), mib * MIB, false).await;
    let _ = std::fs::remove_file(dir.join("raw-seq"));
    println!("raw O_DIRECT sequential 1 MiB writes: {raw:.3} GB/s before, {raw_after:.3} GB/s after (one fdatasync at the end)");
    let raw = (raw + raw_after) / 2.0;
    println!("raw O_DIRECT|O_DSYNC 1 MiB writes   : {raw_dsync:.3} GB/s");
    println!(
        "1 MiB durable append, group of {group:<3}  : {append_rate:.3} GB/s = {:.2} x raw O_DIRECT; per group p50/p99 {} / {} us",
        append_rate / raw,
        append_latency.value_at_quantile(0.5),
        append_latency.value_at_quantile(0.99)
    );
    println!(
        "1 MiB durable append, one at a time  : {single_rate:.3} GB/s = {:.2} x raw O_DIRECT; p50/p99 {} / {} us",
        single_rate / raw,
        single_latency.value_at_quantile(0.5),
        single_latency.value_at_quantile(0.99)
    );

    // 3. Recovery scan of the ~1 GiB journal just written, cold then warm.
    let size = std::fs::metadata(&journal_path).expect("stat").len();
    drop_cache(&journal_path);
    let started = Instant::now();
    let (journal, recovery) = Journal::open(&journal_path, 0).await.expect("open");
    let cold = started.elapsed();
    assert!(recovery.is_clean() && recovery.op_head == mib);
    journal.close().await.expect("close");
    let started = Instant::now();
    let (journal, _) = Journal::open(&journal_path, 0).await.expect("open");
    let warm = started.elapsed();
    journal.close().await.expect("close");
    drop_cache(&journal_path);
    let raw_read = raw_read(&journal_path).await;
    println!(
        "recovery scan of {:.2} GiB journal  : {:.2} GB/s cold ({:?}), {:.2} GB/s second open ({:?}); raw O_DIRECT read of the file {raw_read:.2} GB/s",
        size as f64 / (1u64 << 30) as f64,
        gbps(size, cold),
        cold,
        gbps(size, warm),
        warm
    );
    let _ = std::fs::remove_file(&journal_path);

    // 2. Latency, 4 KiB bodies.
    let raw = raw_latency(&dir.join("raw-4k")).await;
    let (_, latency, journal) = journal_appends(
        &dir.join("journal-4k"),
        LATENCY_SAMPLES,
        4096,
        LATENCY_SAMPLES,
        1,
    )
    .await;
    journal.close().await.expect("close");
    println!(
        "4 KiB durable append latency p50/p99 : {} / {} us",
        latency.value_at_quantile(0.5),
        latency.value_at_quantile(0.99)
    );
    println!(
        "raw 4 KiB write + fdatasync p50/p99  : {} / {} us",
        raw.value_at_quantile(0.5),
        raw.value_at_quantile(0.99)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    journal::runtime::raise_memlock(64 << 20);
    journal::runtime::block_on(run()).expect("executor");
}
