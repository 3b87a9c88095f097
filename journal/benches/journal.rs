//! Journal benchmarks, printed side by side with the raw device figures they are judged
//! against, in one run on one file system (`target/bench-data` beside the workspace):
//!
//! 1. durable append throughput with 1 MiB bodies vs raw O_DIRECT sequential writes of
//!    the same size (the journal's padded slot), submitted in the same groups: without
//!    any fdatasync until the end of a round, and with one per group (the journal's
//!    cadence, alternating group by group with the appends); one-at-a-time appends vs
//!    raw write + fdatasync per write, alternating write by write;
//! 2. 4 KiB durable append latency p50/p99 vs a raw 4 KiB write + fdatasync;
//! 3. recovery scan rate of a 1 GiB journal (cold page cache, then warm).
//!
//! Every file (raw or journal) is preallocated and zero-filled before it is timed, so
//! every variant overwrites allocated blocks and none pays for file-system metadata. The
//! disk is shared with other work, so the throughput runs are split into rounds with
//! every variant in each round (order rotated) and the medians are reported, per-round
//! ratios included; the latency samples alternate raw and journal.
//! (The raw runs without fdatasync are not interleaved with the others: a flush is
//! device-wide, and it would charge their write-back to whichever run flushed next.)
//!
//! `cargo bench -p journal --bench journal`. `JOURNAL_BENCH_MIB` shrinks the 1 GiB runs,
//! `JOURNAL_BENCH_GROUP` sets the group commit size (8), `JOURNAL_BENCH_ROUNDS` the
//! rounds (8).

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::io::{DmaBuffer, DmaFile, OpenOptions};
use hdrhistogram::Histogram;
use journal::layout::SECTOR_SIZE;
use journal::{Journal, JournalLayout};
use replication::wire::{Header, PrepareChain, PrepareHeader, METADATA_GROUP};

const MIB: u64 = 1024 * 1024;
const LATENCY_SAMPLES: u64 = 2000;
/// Prepares per group commit in the throughput run (a replication pipeline's depth).
const GROUP_DEFAULT: u64 = 8;
const ROUNDS_DEFAULT: u64 = 8;

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

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// An O_DIRECT file of `size` bytes, preallocated and zero-filled durably (as
/// `Journal::create` formats the journal), so timed writes overwrite allocated blocks.
async fn raw_file(path: &Path, size: u64) -> DmaFile {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .dma_open(path)
        .await
        .expect("open raw");
    file.pre_allocate(size, false).await.expect("fallocate");
    let mut zero = file.alloc_dma_buffer(MIB as usize);
    zero.as_bytes_mut().fill(0);
    let zero = Rc::new(zero);
    let mut at = 0;
    while at < size {
        let len = MIB.min(size - at);
        let buffer = if len == MIB {
            zero.clone()
        } else {
            let mut tail = file.alloc_dma_buffer(len as usize);
            tail.as_bytes_mut().fill(0);
            Rc::new(tail)
        };
        file.write_rc_at(buffer, at).await.expect("zero fill");
        at += len;
    }
    file.fdatasync().await.expect("fdatasync");
    file
}

/// How a raw run syncs.
#[derive(Clone, Copy)]
enum Flush {
    /// One fdatasync at the end of the run.
    AtEnd,
    /// One fdatasync after each group of writes (the journal's cadence).
    EveryGroup,
}

/// Raw O_DIRECT writes of `buffer` at `first * len`, `count` of them in groups of `group`
/// submitted together (each group awaited before the next, like group commits); the time.
async fn raw_writes(
    file: &DmaFile,
    buffer: &Rc<DmaBuffer>,
    first: u64,
    count: u64,
    group: u64,
    flush: Flush,
) -> Duration {
    let len = buffer.len() as u64;
    let started = Instant::now();
    let mut i = first;
    while i < first + count {
        let end = (i + group).min(first + count);
        let writes: Vec<_> = (i..end)
            .map(|n| file.write_rc_at(buffer.clone(), n * len))
            .collect();
        for written in futures_join(writes).await {
            assert_eq!(written.expect("write") as u64, len);
        }
        if matches!(flush, Flush::EveryGroup) {
            file.fdatasync().await.expect("fdatasync");
        }
        i = end;
    }
    if matches!(flush, Flush::AtEnd) {
        file.fdatasync().await.expect("fdatasync");
    }
    started.elapsed()
}

/// Awaits every future, polled together.
async fn futures_join<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// Durable journal appends of ops `first..first + count` in group commits of `group`,
/// each followed or preceded (alternately) by the same raw writes with an fdatasync per
/// group, so both see the same disk; returns (journal GB/s, raw GB/s). The journal's time
/// is spent inside appends (building frames is not measured); per-append-call latencies
/// (µs) go into `histogram`.
#[allow(clippy::too_many_arguments)]
async fn paired_appends(
    journal: &mut Journal,
    raw: &DmaFile,
    buffer: &Rc<DmaBuffer>,
    body: &[u8],
    first: u64,
    count: u64,
    group: u64,
    histogram: &mut Histogram<u64>,
) -> (f64, f64) {
    let (mut journal_bytes, mut journal_time) = (0u64, Duration::ZERO);
    let (mut raw_bytes, mut raw_time) = (0u64, Duration::ZERO);
    let mut op = first;
    let mut turn = 0;
    while op < first + count {
        let frames: Vec<Vec<u8>> = (op..(op + group).min(first + count))
            .map(|o| prepare(o, body))
            .collect();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let n = frames.len() as u64;
        for step in 0..2 {
            if (step + turn) % 2 == 0 {
                let t = Instant::now();
                let _ = journal.append_batch(&refs).await.expect("append");
                let elapsed = t.elapsed();
                journal_time += elapsed;
                histogram
                    .record(elapsed.as_micros() as u64)
                    .expect("record");
                journal_bytes += frames.iter().map(|f| f.len() as u64).sum::<u64>();
            } else {
                raw_time += raw_writes(raw, buffer, op - 1, n, group, Flush::EveryGroup).await;
                raw_bytes += n * buffer.len() as u64;
            }
        }
        turn += 1;
        op += n;
    }
    (gbps(journal_bytes, journal_time), gbps(raw_bytes, raw_time))
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

/// Per-round figures of the throughput runs (GB/s).
#[derive(Default)]
struct Rounds {
    raw_stream: Vec<f64>,
    raw_qd1: Vec<f64>,
    raw_group_sync: Vec<f64>,
    raw_each_sync: Vec<f64>,
    journal_group: Vec<f64>,
    journal_single: Vec<f64>,
}

async fn throughput(dir: &Path, mib: u64, group: u64, rounds: u64) -> PathBuf {
    let layout = JournalLayout::for_body_size(mib, MIB).expect("layout");
    // The journal writes each 1 MiB-body prepare as one slot-sized (sector-padded) write.
    let io = layout.slot_size;
    let per_round = mib / rounds;
    let ops = per_round * rounds;
    // One raw file for every raw variant (disk space): each round's variants overwrite
    // the same region, in rotated order.
    let raw = raw_file(&dir.join("raw"), ops * io).await;
    let journal_path = dir.join("journal-1m");
    let mut journal = Journal::create(&journal_path, layout)
        .await
        .expect("create");
    // One-at-a-time appends reuse a one-round ring, checkpointed between rounds.
    let single_layout = JournalLayout::for_body_size(per_round.max(4), MIB).expect("layout");
    let mut single = Journal::create(&dir.join("journal-1m-single"), single_layout)
        .await
        .expect("create");
    let mut buffer = raw.alloc_dma_buffer(io as usize);
    buffer
        .as_bytes_mut()
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = i as u8);
    let buffer = Rc::new(buffer);
    let body = vec![0xA5u8; MIB as usize];
    let mut group_latency = Histogram::<u64>::new(3).expect("histogram");
    let mut single_latency = Histogram::<u64>::new(3).expect("histogram");
    let mut figures = Rounds::default();
    for round in 0..rounds {
        let first = round * per_round;
        single.set_checkpoint(single.op_head()).expect("checkpoint");
        let rate = |time: Duration| gbps(per_round * io, time);
        for variant in 0..4 {
            match (variant + round) % 4 {
                0 => figures.raw_stream.push(rate(
                    raw_writes(&raw, &buffer, first, per_round, group, Flush::AtEnd).await,
                )),
                1 => figures.raw_qd1.push(rate(
                    raw_writes(&raw, &buffer, first, per_round, 1, Flush::AtEnd).await,
                )),
                2 => {
                    let (journal_rate, raw_rate) = paired_appends(
                        &mut journal,
                        &raw,
                        &buffer,
                        &body,
                        first + 1,
                        per_round,
                        group,
                        &mut group_latency,
                    )
                    .await;
                    figures.journal_group.push(journal_rate);
                    figures.raw_group_sync.push(raw_rate);
                }
                _ => {
                    let (journal_rate, raw_rate) = paired_appends(
                        &mut single,
                        &raw,
                        &buffer,
                        &body,
                        first + 1,
                        per_round,
                        1,
                        &mut single_latency,
                    )
                    .await;
                    figures.journal_single.push(journal_rate);
                    figures.raw_each_sync.push(raw_rate);
                }
            }
        }
    }
    raw.close().await.expect("close");
    journal.close().await.expect("close");
    single.close().await.expect("close");
    for name in ["raw", "journal-1m-single"] {
        let _ = std::fs::remove_file(dir.join(name));
    }

    let f = &figures;
    let per_round_ratio = |journal: &[f64], raw: &dyn Fn(usize) -> f64| -> Vec<f64> {
        journal
            .iter()
            .enumerate()
            .map(|(r, j)| j / raw(r))
            .collect()
    };
    let vs_best_stream = per_round_ratio(&f.journal_group, &|r| f.raw_stream[r].max(f.raw_qd1[r]));
    let vs_group_sync = per_round_ratio(&f.journal_group, &|r| f.raw_group_sync[r]);
    let single_vs_each_sync = per_round_ratio(&f.journal_single, &|r| f.raw_each_sync[r]);
    let list = |values: &[f64]| {
        values
            .iter()
            .map(|v| format!("{v:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "throughput: {rounds} rounds of {per_round} x {} KiB writes per variant, medians (per round)",
        io / 1024
    );
    let stream = format!("raw O_DIRECT, groups of {group} in flight, no fdatasync until round end");
    let group_sync = format!("raw O_DIRECT, groups of {group}, fdatasync per group");
    let appends = format!("1 MiB durable append, group of {group}");
    let rows: [(&str, &[f64], String); 6] = [
        (&stream, &f.raw_stream, String::new()),
        (
            "raw O_DIRECT, one write in flight, no fdatasync until round end",
            &f.raw_qd1,
            String::new(),
        ),
        (&group_sync, &f.raw_group_sync, String::new()),
        (
            "raw O_DIRECT, fdatasync per write",
            &f.raw_each_sync,
            String::new(),
        ),
        (
            &appends,
            &f.journal_group,
            format!(
                "; per group p50/p99 {} / {} us",
                group_latency.value_at_quantile(0.5),
                group_latency.value_at_quantile(0.99)
            ),
        ),
        (
            "1 MiB durable append, one at a time",
            &f.journal_single,
            format!(
                "; p50/p99 {} / {} us",
                single_latency.value_at_quantile(0.5),
                single_latency.value_at_quantile(0.99)
            ),
        ),
    ];
    for (label, values, extra) in rows {
        println!(
            "  {label:<66}: {:.3} GB/s ({}){extra}",
            median(values),
            list(values)
        );
    }
    let ratios: [(&str, &[f64]); 3] = [
        ("group append / best raw without fdatasync", &vs_best_stream),
        ("group append / raw fdatasync per group", &vs_group_sync),
        (
            "single append / raw fdatasync per write",
            &single_vs_each_sync,
        ),
    ];
    for (label, values) in ratios {
        println!(
            "  {label:<42}: {:.2} x (median of rounds: {})",
            median(values),
            list(values)
        );
    }
    journal_path
}

/// 4 KiB appends and raw 4 KiB write + fdatasync, alternating sample by sample.
async fn latency(dir: &Path) {
    let raw = raw_file(&dir.join("raw-4k"), LATENCY_SAMPLES * SECTOR_SIZE).await;
    let buffer = Rc::new(raw.alloc_dma_buffer(SECTOR_SIZE as usize));
    let layout = JournalLayout::for_body_size(LATENCY_SAMPLES, 4096).expect("layout");
    let mut journal = Journal::create(&dir.join("journal-4k"), layout)
        .await
        .expect("create");
    let body = vec![0x5Au8; 4096];
    let mut raw_histogram = Histogram::<u64>::new(3).expect("histogram");
    let mut journal_histogram = Histogram::<u64>::new(3).expect("histogram");
    for i in 0..LATENCY_SAMPLES {
        let started = Instant::now();
        raw.write_rc_at(buffer.clone(), i * SECTOR_SIZE)
            .await
            .expect("write");
        raw.fdatasync().await.expect("fdatasync");
        raw_histogram
            .record(started.elapsed().as_micros() as u64)
            .expect("record");
        let frame = prepare(i + 1, &body);
        let started = Instant::now();
        let _ = journal.append(&frame).await.expect("append");
        journal_histogram
            .record(started.elapsed().as_micros() as u64)
            .expect("record");
    }
    raw.close().await.expect("close");
    journal.close().await.expect("close");
    println!(
        "4 KiB durable append latency p50/p99 : {} / {} us",
        journal_histogram.value_at_quantile(0.5),
        journal_histogram.value_at_quantile(0.99)
    );
    println!(
        "raw 4 KiB write + fdatasync p50/p99  : {} / {} us (samples alternate with the appends)",
        raw_histogram.value_at_quantile(0.5),
        raw_histogram.value_at_quantile(0.99)
    );
}

async fn run() {
    let dir = bench_dir();
    let rounds = env_u64("JOURNAL_BENCH_ROUNDS", ROUNDS_DEFAULT).max(1);
    let mib = env_u64("JOURNAL_BENCH_MIB", 1024).max(rounds.max(4));
    let group =
        env_u64("JOURNAL_BENCH_GROUP", GROUP_DEFAULT).clamp(1, journal::journal::APPEND_BATCH_MAX);
    println!("journal benchmarks in {} ({} MiB runs)", dir.display(), mib);

    // 1. Throughput, 1 MiB bodies.
    let journal_path = throughput(&dir, mib, group, rounds).await;

    // 3. Recovery scan of the ~1 GiB journal just written, cold then warm.
    let size = std::fs::metadata(&journal_path).expect("stat").len();
    drop_cache(&journal_path);
    let started = Instant::now();
    let (journal, recovery) = Journal::open(&journal_path, 0).await.expect("open");
    let cold = started.elapsed();
    assert!(recovery.is_clean() && recovery.op_head == mib / rounds * rounds);
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
    latency(&dir).await;
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    journal::runtime::raise_memlock(64 << 20);
    journal::runtime::block_on(run()).expect("executor");
}
