//! Journal benchmarks, printed side by side with the raw device figures they are judged
//! against, in one run on one file system (`target/bench-data` beside the workspace):
//!
//! 1. durable append throughput with 1 MiB bodies vs raw O_DIRECT sequential writes of
//!    the same size (the journal's padded slot), submitted in the same groups: without
//!    any fdatasync until the end of a round, and with one per group (the journal's
//!    cadence, alternating group by group with the appends); one-at-a-time appends vs
//!    raw write + fdatasync per write, alternating write by write. The appends run both
//!    ways: copied from the caller's frames (`append_batch`) and built in the journal's
//!    own write buffers (`append_buffers`, no copy). The raw writes cycle through `group`
//!    distinct buffers, as fio's iodepth buffers do (rewriting one cache-hot buffer
//!    would flatter the device);
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
/// Raw variants, each with a region of its own in the raw file.
const RAW_REGIONS: u64 = 5;

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

/// Raw O_DIRECT writes of `buffers` (in turn) at `first * len`, `count` of them in groups
/// of `group` submitted together (each group awaited before the next, like group
/// commits); the time spent writing. Before each group (untimed) the buffers are
/// rewritten, as a writer's data is produced just before it is written: on this
/// virtualized disk a write of cache-cold memory is measurably slower than one of data
/// just produced, and the journal only ever writes the latter.
async fn raw_writes(
    file: &DmaFile,
    buffers: &mut [Rc<DmaBuffer>],
    first: u64,
    count: u64,
    group: u64,
    flush: Flush,
) -> Duration {
    assert!(group as usize <= buffers.len());
    let len = buffers[0].len() as u64;
    let mut elapsed = Duration::ZERO;
    let mut i = first;
    while i < first + count {
        let end = (i + group).min(first + count);
        let count = buffers.len() as u64;
        for n in i..end {
            // No write of the previous group holds it any more.
            Rc::get_mut(&mut buffers[(n % count) as usize])
                .expect("buffer not in flight")
                .as_bytes_mut()
                .fill(n as u8);
        }
        let started = Instant::now();
        let writes: Vec<_> = (i..end)
            .map(|n| file.write_rc_at(buffers[(n % count) as usize].clone(), n * len))
            .collect();
        for written in futures_join(writes).await {
            assert_eq!(written.expect("write") as u64, len);
        }
        if matches!(flush, Flush::EveryGroup) {
            file.fdatasync().await.expect("fdatasync");
        }
        elapsed += started.elapsed();
        i = end;
    }
    if matches!(flush, Flush::AtEnd) {
        let started = Instant::now();
        file.fdatasync().await.expect("fdatasync");
        elapsed += started.elapsed();
    }
    elapsed
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
    zero_copy: bool,
    raw: &DmaFile,
    raw_base: u64,
    buffers: &mut [Rc<DmaBuffer>],
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
                let elapsed = if zero_copy {
                    // Built in the journal's buffers, as a receive path would (untimed).
                    let owned: Vec<_> = frames
                        .iter()
                        .map(|f| {
                            let mut buffer = journal.prepare_buffer(f.len()).expect("buffer");
                            buffer.as_bytes_mut().copy_from_slice(f);
                            buffer
                        })
                        .collect();
                    let t = Instant::now();
                    let _ = journal.append_buffers(owned).await.expect("append");
                    t.elapsed()
                } else {
                    let t = Instant::now();
                    let _ = journal.append_batch(&refs).await.expect("append");
                    t.elapsed()
                };
                journal_time += elapsed;
                histogram
                    .record(elapsed.as_micros() as u64)
                    .expect("record");
                journal_bytes += frames.iter().map(|f| f.len() as u64).sum::<u64>();
            } else {
                raw_time +=
                    raw_writes(raw, buffers, raw_base + op - 1, n, group, Flush::EveryGroup).await;
                raw_bytes += n * buffers[0].len() as u64;
            }
        }
        turn += 1;
        op += n;
    }
    (gbps(journal_bytes, journal_time), gbps(raw_bytes, raw_time))
}

/// fio, the standard tool, doing the same writes on the same file system: O_DIRECT
/// sequential writes of `bs` bytes, `iodepth` in flight, one fdatasync at the end, over a
/// file of its own that a first pass lays out (so the timed passes overwrite allocated
/// blocks, as every other variant here does). One pass per round, in the rotation.
struct Fio {
    file: PathBuf,
    size: u64,
    bs: u64,
    iodepth: u64,
    available: bool,
}

impl Fio {
    fn new(dir: &Path, size: u64, bs: u64, iodepth: u64) -> Fio {
        let mut fio = Fio {
            file: dir.join("fio.dat"),
            size,
            bs,
            iodepth,
            available: true,
        };
        fio.available = fio.pass().is_some();
        fio
    }

    /// One pass's bandwidth (GB/s); None when fio is not installed or fails.
    fn pass(&self) -> Option<f64> {
        if !self.available {
            return None;
        }
        let output = std::process::Command::new("fio")
            .args([
                "--name=seqwrite",
                "--rw=write",
                "--direct=1",
                "--ioengine=io_uring",
                "--end_fsync=1",
                "--output-format=json",
            ])
            .arg(format!("--filename={}", self.file.display()))
            .arg(format!("--size={}", self.size))
            .arg(format!("--bs={}", self.bs))
            .arg(format!("--iodepth={}", self.iodepth))
            .output()
            .ok()?;
        if !output.status.success() {
            return None;
        }
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
        json["jobs"][0]["write"]["bw_bytes"]
            .as_f64()
            .map(|bytes| bytes / 1e9)
    }
}

impl Drop for Fio {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
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
    /// The raw runs paired with the no-copy appends (fdatasync per group).
    raw_group_sync_buffers: Vec<f64>,
    journal_group_buffers: Vec<f64>,
    journal_single: Vec<f64>,
    fio: Vec<f64>,
}

async fn throughput(dir: &Path, mib: u64, group: u64, rounds: u64) -> PathBuf {
    let layout = JournalLayout::for_body_size(mib, MIB).expect("layout");
    // The journal writes each 1 MiB-body prepare as one slot-sized (sector-padded) write.
    let io = layout.slot_size;
    let per_round = mib / rounds;
    let ops = per_round * rounds;
    // One raw file with a region per raw variant, so no write overwrites blocks written
    // moments before (on a virtualized disk that waits on the host's write-back of
    // them, which no journal write ever does).
    let raw = raw_file(&dir.join("raw"), RAW_REGIONS * ops * io).await;
    let region = |r: u64| r * ops;
    let journal_path = dir.join("journal-1m");
    let mut journal = Journal::create(&journal_path, layout)
        .await
        .expect("create");
    // No-copy appends (`append_buffers`) get a journal of their own.
    let mut buffers_journal = Journal::create(&dir.join("journal-1m-buffers"), layout)
        .await
        .expect("create");
    // One-at-a-time appends reuse a one-round ring, checkpointed between rounds.
    let single_layout = JournalLayout::for_body_size(per_round.max(4), MIB).expect("layout");
    let mut single = Journal::create(&dir.join("journal-1m-single"), single_layout)
        .await
        .expect("create");
    let mut buffers: Vec<Rc<DmaBuffer>> = (0..group)
        .map(|_| Rc::new(raw.alloc_dma_buffer(io as usize)))
        .collect();
    let body = vec![0xA5u8; MIB as usize];
    let mut group_latency = Histogram::<u64>::new(3).expect("histogram");
    let mut buffers_latency = Histogram::<u64>::new(3).expect("histogram");
    let mut single_latency = Histogram::<u64>::new(3).expect("histogram");
    let mut figures = Rounds::default();
    let fio = Fio::new(dir, (per_round * io).max(64 * MIB), io, group);
    for round in 0..rounds {
        let first = round * per_round;
        single.set_checkpoint(single.op_head()).expect("checkpoint");
        let rate = |time: Duration| gbps(per_round * io, time);
        for variant in 0..6 {
            match (variant + round) % 6 {
                5 => figures.fio.extend(fio.pass()),
                0 => figures.raw_stream.push(rate(
                    raw_writes(
                        &raw,
                        &mut buffers,
                        region(0) + first,
                        per_round,
                        group,
                        Flush::AtEnd,
                    )
                    .await,
                )),
                1 => figures.raw_qd1.push(rate(
                    raw_writes(
                        &raw,
                        &mut buffers,
                        region(1) + first,
                        per_round,
                        1,
                        Flush::AtEnd,
                    )
                    .await,
                )),
                2 => {
                    let (journal_rate, raw_rate) = paired_appends(
                        &mut journal,
                        false,
                        &raw,
                        region(2),
                        &mut buffers,
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
                3 => {
                    let (journal_rate, raw_rate) = paired_appends(
                        &mut buffers_journal,
                        true,
                        &raw,
                        region(3),
                        &mut buffers,
                        &body,
                        first + 1,
                        per_round,
                        group,
                        &mut buffers_latency,
                    )
                    .await;
                    figures.journal_group_buffers.push(journal_rate);
                    figures.raw_group_sync_buffers.push(raw_rate);
                }
                _ => {
                    let (journal_rate, raw_rate) = paired_appends(
                        &mut single,
                        false,
                        &raw,
                        region(4),
                        &mut buffers,
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
    buffers_journal.close().await.expect("close");
    single.close().await.expect("close");
    for name in ["raw", "journal-1m-single", "journal-1m-buffers"] {
        let _ = std::fs::remove_file(dir.join(name));
    }

    drop(fio);
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
    let buffers_vs_best_stream = per_round_ratio(&f.journal_group_buffers, &|r| {
        f.raw_stream[r].max(f.raw_qd1[r])
    });
    let buffers_vs_group_sync =
        per_round_ratio(&f.journal_group_buffers, &|r| f.raw_group_sync_buffers[r]);
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
    let appends = format!("1 MiB durable append, group of {group}, copied");
    let buffer_appends = format!("1 MiB durable append, group of {group}, no copy");
    let rows: [(&str, &[f64], String); 7] = [
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
            &buffer_appends,
            &f.journal_group_buffers,
            format!(
                "; per group p50/p99 {} / {} us",
                buffers_latency.value_at_quantile(0.5),
                buffers_latency.value_at_quantile(0.99)
            ),
        ),
        (
            "1 MiB durable append, one at a time, copied",
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
    if f.fio.len() == f.journal_group.len() {
        println!(
            "  {:<66}: {:.3} GB/s ({})",
            format!("fio O_DIRECT write, bs {} KiB, iodepth {group}", io / 1024),
            median(&f.fio),
            list(&f.fio)
        );
    } else {
        println!("  fio: not installed or failed (apt-get install fio)");
    }
    let vs_fio = per_round_ratio(&f.journal_group, &|r| {
        f.fio.get(r).copied().unwrap_or(f64::NAN)
    });
    let buffers_vs_fio = per_round_ratio(&f.journal_group_buffers, &|r| {
        f.fio.get(r).copied().unwrap_or(f64::NAN)
    });
    let ratios: [(&str, &[f64]); 7] = [
        ("group append / fio", &vs_fio),
        ("no-copy group append / fio", &buffers_vs_fio),
        ("group append / best raw without fdatasync", &vs_best_stream),
        ("group append / raw fdatasync per group", &vs_group_sync),
        (
            "no-copy group append / best raw without fdatasync",
            &buffers_vs_best_stream,
        ),
        (
            "no-copy group append / raw fdatasync per group",
            &buffers_vs_group_sync,
        ),
        (
            "single append / raw fdatasync per write",
            &single_vs_each_sync,
        ),
    ];
    for (label, values) in ratios {
        println!(
            "  {label:<50}: {:.2} x (median of rounds: {})",
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
