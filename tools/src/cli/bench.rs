//! `bench produce|consume|roundtrip`: load generators with hdrhistogram latencies and
//! throughput, whose results are checked so that a wrong result fails the command.
//!
//! - produce: `--producers` threads, each with its own client (own connection, session
//!   and request numbers), send batches of `--batch` messages of `--size` bytes
//!   round-robin over `--partitions` partitions. With `--rate R` (messages/s in total)
//!   the load is open loop: batch k of producer w is due at
//!   `start + (w / producers + k) x interval`, and its latency runs from that due time to
//!   its ack, so a stalled server is charged for every batch it delayed (no coordinated
//!   omission). `--rate 0` is closed loop (each producer sends its next batch when the
//!   previous one is acked). Batches due during `--warmup` are sent but not counted.
//!   Checked: every ack covers exactly the batch's messages, no two acks share an
//!   offset, on a topic this run created the acks tile each partition from offset 0,
//!   and the first and last acked batch of each partition are read back and compared
//!   message by message (id and payload).
//! - consume: reads each partition from offset 0 to its committed end (or until
//!   `--duration` is over), threads split the partitions; checked: offsets run on without
//!   a gap or a repeat, every batch's checksums (the client verifies them), with
//!   `--verify` every id and payload, and with `--expect N` the total read.
//! - roundtrip: each producer sends a batch, then polls its partition at the acked offset
//!   until it sees the batch; the latency of the pair is recorded, and the batch read back
//!   must be the one sent (ids of its first and last message).
//!
//! Message ids and payloads follow cli::derive with message index
//! `producer << 40 | n`, so `consume --verify --seed` can check a bench's data later.
//! Throughput: MB/s are 10^6 bytes of payload per second.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use appliance::client::{Client, RetryPolicy};
use appliance::config::units::parse_duration;
use clap::{Args, Subcommand};
use hdrhistogram::Histogram;
use replication::wire::PartitionKey;
use serde_json::{json, Value};

use super::probe::{self, epoch_us, AckWindow, DiskProbe};
use super::produce::{build_batch, check_batch_shape};
use super::{connect_with, CliError, Global, Report};

mod acks;
mod reads;

use acks::check_acks;
use reads::{consume, roundtrip};

/// Threads one bench may start.
pub const THREADS_MAX: u32 = 256;
/// Bits of the message index a producer's own counter uses.
const INDEX_BITS: u32 = 40;
/// Messages asked for per poll by consume.
const POLL_COUNT: u32 = 100_000;
/// Highest latency the histograms hold (an hour, in microseconds).
const LATENCY_MAX_US: u64 = 3_600_000_000;
/// How long finding the stream and topic is retried (stale metadata on a backup).
const RESOLVE_RETRY: Duration = Duration::from_secs(3);
/// Wait between registering the producers' sessions and their first write.
const SESSION_SPREAD: Duration = Duration::from_millis(500);
/// How long roundtrip polls for a batch that was acked before calling it lost.
const ROUNDTRIP_SEEN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// Produce at a target rate (open loop) or flat out; latency per batch to its ack.
    Produce(BenchArgs),
    /// Read the partitions back from offset 0; MB/s and per-poll latency.
    Consume(BenchArgs),
    /// Produce a batch, poll until it is seen; latency of the pair.
    Roundtrip(BenchArgs),
}

fn duration_arg(text: &str) -> Result<Duration, String> {
    parse_duration(text)
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Stream id or name (a name is created if absent).
    #[arg(long, default_value = "bench")]
    pub stream: String,
    /// Topic id or name (a name is created if absent, with --partitions partitions).
    #[arg(long, default_value = "bench")]
    pub topic: String,
    /// Client threads, each with its own connection and session.
    #[arg(long, visible_alias = "consumers", default_value_t = 1)]
    pub producers: u32,
    /// Partitions used (the first N of the topic).
    #[arg(long, default_value_t = 4)]
    pub partitions: u32,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Messages per batch.
    #[arg(long, default_value_t = 1000)]
    pub batch: u32,
    /// Target messages per second over all producers (open loop); 0 = closed loop, flat out.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Measured time, e.g. "10s".
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    pub duration: Duration,
    /// Time before the measured window whose results are not counted.
    #[arg(long, default_value = "1s", value_parser = duration_arg)]
    pub warmup: Duration,
    /// Seed the ids and payloads derive from (cli::derive).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// consume: check every message's id and payload against --seed (client CPU heavy).
    #[arg(long)]
    pub verify: bool,
    /// consume: fail unless exactly this many messages are read in total.
    #[arg(long)]
    pub expect: Option<u64>,
    /// produce: write one line per ack to this file: ack and send time (µs since the
    /// epoch), the node that answered, partition, base offset, count.
    #[arg(long)]
    pub ack_log: Option<std::path::PathBuf>,
    /// produce: while producing, write 4 KiB and fdatasync every 50 ms to this new file
    /// (put it on the nodes' disk; it is removed at the end), and report every ack slower
    /// than 50 ms with whether the probe stalled at the same time.
    #[arg(long, value_name = "FILE")]
    pub disk_probe: Option<std::path::PathBuf>,
    /// Longest backoff between retries, milliseconds (short, so a failover is measured
    /// by the cluster's recovery rather than by the client's backoff).
    #[arg(long, default_value_t = 50)]
    pub backoff_max_ms: u64,
}

fn check(args: &BenchArgs) -> Result<(), CliError> {
    if args.producers == 0 || args.producers > THREADS_MAX {
        return Err(CliError::Usage(format!(
            "--producers must be 1 to {THREADS_MAX}"
        )));
    }
    if args.partitions == 0 {
        return Err(CliError::Usage("--partitions must be at least 1".into()));
    }
    check_batch_shape(args.batch, args.size)?;
    if args.duration.is_zero() {
        return Err(CliError::Usage("--duration must be above zero".into()));
    }
    Ok(())
}

pub fn run(global: &Global, cmd: &BenchCmd) -> Result<Report, CliError> {
    let (mode, args) = match cmd {
        BenchCmd::Produce(a) => ("produce", a),
        BenchCmd::Consume(a) => ("consume", a),
        BenchCmd::Roundtrip(a) => ("roundtrip", a),
    };
    check(args)?;
    let mut client = bench_client(global, args)?;
    let target = Target::resolve(&mut client, args, mode != "consume")?;
    drop(client);
    match mode {
        "produce" => produce(global, args, &target),
        "consume" => consume(global, args, &target),
        _ => roundtrip(global, args, &target),
    }
}

/// A logged-in client with the global timeouts and a short retry backoff.
fn bench_client(global: &Global, args: &BenchArgs) -> Result<Client, CliError> {
    let backoff_max = Duration::from_millis(args.backoff_max_ms.max(1));
    connect_with(global, |retry| RetryPolicy {
        backoff_min: retry.backoff_min.min(backoff_max),
        backoff_max,
        ..retry
    })
}

/// The stream, topic and partitions a bench runs on.
#[derive(Clone, Debug)]
struct Target {
    stream: u32,
    topic: u32,
    partitions: Vec<u32>,
    /// This run created the topic: its partitions held nothing before.
    created: bool,
}

impl Target {
    /// Finds (or creates) the stream and topic. Lists may come from a node that has not
    /// applied the latest metadata yet (a stream just created elsewhere is missing, and
    /// creating it answers AlreadyExists): runtime failures are retried for a while.
    fn resolve(client: &mut Client, args: &BenchArgs, create: bool) -> Result<Target, CliError> {
        let started = Instant::now();
        loop {
            match Target::resolve_once(client, args, create) {
                Err(CliError::Runtime { .. }) if started.elapsed() < RESOLVE_RETRY => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                result => return result,
            }
        }
    }

    fn resolve_once(
        client: &mut Client,
        args: &BenchArgs,
        create: bool,
    ) -> Result<Target, CliError> {
        let stream = match args.stream.parse::<u32>() {
            Ok(id) => id,
            Err(_) if create => match super::find_stream(client, &args.stream)? {
                Some(id) => id,
                None => client.create_stream(&args.stream)?,
            },
            Err(_) => super::stream_id(client, &args.stream)?,
        };
        let (topic, count, created) = if create && args.topic.parse::<u32>().is_err() {
            match super::find_topic(client, stream, &args.topic)? {
                Some((topic, count)) => (topic, count, false),
                None => (
                    client.create_topic(stream, &args.topic, args.partitions)?,
                    args.partitions,
                    true,
                ),
            }
        } else {
            let (topic, count) = super::topic(client, stream, &args.topic)?;
            (topic, count, false)
        };
        if count < args.partitions {
            return Err(CliError::runtime(format!(
                "topic {:?} has {count} partitions, --partitions asks for {}",
                args.topic, args.partitions
            )));
        }
        Ok(Target {
            stream,
            topic,
            partitions: (0..args.partitions).collect(),
            created,
        })
    }

    fn key(&self, partition: u32) -> PartitionKey {
        PartitionKey {
            stream: self.stream,
            topic: self.topic,
            partition,
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_US, 3).unwrap_or_else(|_| Histogram::new(3).unwrap())
}

fn record(h: &mut Histogram<u64>, latency: Duration) {
    let us = (latency.as_micros() as u64).clamp(1, LATENCY_MAX_US);
    let _ = h.record(us);
}

fn latency_json(h: &Histogram<u64>) -> Value {
    json!({
        "count": h.len(),
        "p50": h.value_at_quantile(0.50),
        "p90": h.value_at_quantile(0.90),
        "p99": h.value_at_quantile(0.99),
        "p999": h.value_at_quantile(0.999),
        "max": h.max(),
    })
}

fn latency_text(h: &Histogram<u64>) -> String {
    let ms = |us: u64| us as f64 / 1000.0;
    format!(
        "latency ms: p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}  ({} samples)",
        ms(h.value_at_quantile(0.50)),
        ms(h.value_at_quantile(0.90)),
        ms(h.value_at_quantile(0.99)),
        ms(h.value_at_quantile(0.999)),
        ms(h.max()),
        h.len()
    )
}

/// One acknowledged batch.
#[derive(Clone, Copy, Debug)]
struct Ack {
    partition: u32,
    base_offset: u64,
    count: u32,
    first_index: u64,
    /// When the batch was due (open loop: its latency runs from here), sent and acked.
    due_us: u64,
    sent_us: u64,
    acked_us: u64,
    /// Due after the warm-up: counted in the figures.
    measured: bool,
    node: std::net::SocketAddr,
}

/// What one producer thread measured.
struct ProducerResult {
    histogram: Histogram<u64>,
    acks: Vec<Ack>,
    measured_messages: u64,
    last_measured_ack: Option<Instant>,
}

/// When a producer's batches are due.
#[derive(Clone, Copy)]
struct Schedule {
    start: Instant,
    warm_end: Instant,
    end: Instant,
    /// Per producer, between its batches; None = closed loop.
    interval: Option<Duration>,
    /// This producer's phase within the interval.
    phase: Duration,
}

impl Schedule {
    fn new(args: &BenchArgs, worker: u32, start: Instant) -> Schedule {
        let interval = (args.rate > 0).then(|| {
            Duration::from_secs_f64(
                f64::from(args.batch) * f64::from(args.producers) / args.rate as f64,
            )
        });
        let phase = interval.map_or(Duration::ZERO, |i| {
            i.mul_f64(f64::from(worker) / f64::from(args.producers))
        });
        let warm_end = start + args.warmup;
        Schedule {
            start,
            warm_end,
            end: warm_end + args.duration,
            interval,
            phase,
        }
    }

    /// When batch `k` is due (open loop), or now (closed loop); None once the run is over.
    fn due(&self, k: u64) -> Option<Instant> {
        let due = match self.interval {
            Some(i) => self.start + self.phase + i.mul_f64(k as f64),
            None => Instant::now(),
        };
        (due < self.end).then_some(due)
    }
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// Starts `args.producers` threads, each with its own logged-in client, released
/// together; returns their results in worker order.
fn spawn_workers<T: Send + 'static>(
    global: &Global,
    args: &BenchArgs,
    register: bool,
    work: impl Fn(u32, Client, Instant) -> Result<T, String> + Send + Sync + 'static,
) -> Result<(Vec<T>, Instant), CliError> {
    let mut clients = Vec::new();
    for _ in 0..args.producers {
        let mut client = bench_client(global, args)?;
        if register {
            client.register()?;
        }
        // Every group's primary up front, as a long-running client knows them: the
        // partitions' leaders go round the nodes, and a first request to a node that
        // does not lead the partition costs a redirect and a second upload of the batch.
        client.cluster_metadata()?;
        clients.push(client);
    }
    if register {
        // A partition's primary learns sessions from committed metadata: on a node that
        // is not the metadata primary, up to cluster.commit_broadcast_interval after the
        // Register was answered, and until then it answers NoSession (the client then
        // registers again, restarting the wait). Let the sessions spread first.
        std::thread::sleep(SESSION_SPREAD);
    }
    let barrier = Arc::new(Barrier::new(clients.len() + 1));
    let work = Arc::new(work);
    let start_at = Arc::new(std::sync::OnceLock::<Instant>::new());
    let mut handles = Vec::new();
    for (w, client) in clients.into_iter().enumerate() {
        let barrier = barrier.clone();
        let work = work.clone();
        let start_at = start_at.clone();
        handles.push(std::thread::spawn(move || {
            barrier.wait();
            let start = *start_at.get().unwrap_or(&Instant::now());
            work(w as u32, client, start)
        }));
    }
    let start = Instant::now() + Duration::from_millis(5);
    let _ = start_at.set(start);
    barrier.wait();
    let mut out = Vec::new();
    let mut first_error = None;
    for (w, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(r)) => out.push(r),
            Ok(Err(e)) => {
                first_error.get_or_insert(format!("worker {w}: {e}"));
            }
            Err(_) => {
                first_error.get_or_insert(format!("worker {w} panicked"));
            }
        }
    }
    match first_error {
        Some(e) => Err(CliError::runtime(e)),
        None => Ok((out, start)),
    }
}

/// Sends producer `w`'s scheduled batches round-robin over the partitions. After each
/// ack, `settle` runs (roundtrip polls there) and says when the batch is done; the
/// latency runs from the batch's due time to then.
fn drive(
    a: &BenchArgs,
    w: u32,
    client: &mut Client,
    start: Instant,
    target: &Target,
    mut settle: impl FnMut(&mut Client, PartitionKey, &Ack) -> Result<(), String>,
) -> Result<ProducerResult, String> {
    let schedule = Schedule::new(a, w, start);
    let mut result = ProducerResult {
        histogram: histogram(),
        acks: Vec::new(),
        measured_messages: 0,
        last_measured_ack: None,
    };
    let parts = &target.partitions;
    let mut k = 0u64;
    let mut next_index = u64::from(w) << INDEX_BITS;
    let mut prepared = build_batch(a.seed, next_index, a.batch, a.size);
    while let Some(due) = schedule.due(k) {
        let partition = parts[((u64::from(w) + k) % parts.len() as u64) as usize];
        let key = target.key(partition);
        sleep_until(due);
        let sent_us = epoch_us();
        let due_us = sent_us.saturating_sub(due.elapsed().as_micros() as u64);
        let measured = due >= schedule.warm_end;
        let reply = client.send_messages(key, &prepared).map_err(|e| {
            format!("partition {partition}, batch {k} (message index {next_index}): {e}")
        })?;
        if reply.count != a.batch {
            return Err(format!(
                "partition {partition}: acked {} messages of a batch of {}",
                reply.count, a.batch
            ));
        }
        let ack = Ack {
            partition,
            base_offset: reply.base_offset,
            count: reply.count,
            first_index: next_index,
            due_us,
            sent_us,
            acked_us: epoch_us(),
            measured,
            node: client.target(key.pack().map_err(|e| e.to_string())?),
        };
        settle(client, key, &ack)?;
        let done = Instant::now();
        result.acks.push(ack);
        if measured {
            record(&mut result.histogram, done - due);
            result.measured_messages += u64::from(reply.count);
            result.last_measured_ack = Some(done);
        }
        next_index += u64::from(a.batch);
        k += 1;
        // Build the next batch before its due time, so building is not charged to its
        // latency unless the producer is behind.
        prepared = build_batch(a.seed, next_index, a.batch, a.size);
    }
    Ok(result)
}

fn produce(global: &Global, args: &BenchArgs, target: &Target) -> Result<Report, CliError> {
    let (a, t) = (args.clone(), target.clone());
    let probe = args
        .disk_probe
        .as_deref()
        .map(DiskProbe::start)
        .transpose()?;
    let workers = spawn_workers(global, args, true, move |w, mut client, start| {
        drive(&a, w, &mut client, start, &t, |_, _, _| Ok(()))
    });
    let samples = probe.map(DiskProbe::stop).transpose()?;
    let (results, start) = workers?;
    let windows: Vec<AckWindow> = results
        .iter()
        .flat_map(|r| &r.acks)
        .filter(|a| a.measured)
        .map(|a| AckWindow {
            due_us: a.due_us,
            acked_us: a.acked_us,
        })
        .collect();
    let mut report = producers_report("produce", global, args, target, results, start);
    if let Some(samples) = samples {
        let attributed = probe::attribute(&samples, &windows);
        let line = format!(
            "\ndisk probe: {} writes, p99 {} ms, {} stalls; {} acks over {} ms, {} of them during a probe stall; slowest ack with the probe quiet {} ms",
            attributed["probe"]["samples"],
            attributed["probe"]["p99_ms"],
            attributed["probe"]["stalls"],
            attributed["slow_acks"],
            attributed["stall_ms"],
            attributed["slow_acks_with_host_stall"],
            attributed["max_quiet_ms"],
        );
        let add = |r: &mut Report| {
            r.text.push_str(&line);
            r.json["disk_probe"] = attributed.clone();
        };
        match &mut report {
            Ok(r) => add(r),
            Err(CliError::Runtime {
                report: Some(r), ..
            }) => add(r),
            Err(_) => {}
        }
    }
    report
}

/// Merges the producers' results, writes --ack-log, checks the acks and reports.
fn producers_report(
    mode: &str,
    global: &Global,
    args: &BenchArgs,
    target: &Target,
    results: Vec<ProducerResult>,
    start: Instant,
) -> Result<Report, CliError> {
    let warm_end = start + args.warmup;
    let mut histogram = histogram();
    let mut acks = Vec::new();
    let mut measured = 0u64;
    let mut last_ack = None::<Instant>;
    for r in results {
        let _ = histogram.add(&r.histogram);
        acks.extend(r.acks);
        measured += r.measured_messages;
        last_ack = last_ack.max(r.last_measured_ack);
    }
    let elapsed = last_ack.map_or(Duration::ZERO, |t| t.saturating_duration_since(warm_end));
    if let Some(path) = &args.ack_log {
        let mut text = String::new();
        for a in &acks {
            text.push_str(&format!(
                "{} {} {} {} {} {}\n",
                a.acked_us, a.sent_us, a.node, a.partition, a.base_offset, a.count
            ));
        }
        std::fs::write(path, text)
            .map_err(|e| CliError::runtime(format!("--ack-log {}: {e}", path.display())))?;
    }
    let total_acked: u64 = acks.iter().map(|a| u64::from(a.count)).sum();
    let checked = check_acks(global, args, target, &acks);
    let mut report = throughput_report(mode, args, target, measured, elapsed, &histogram);
    report.json["acked_total"] = json!(total_acked);
    report.json["checked_batches"] = json!(checked.as_ref().ok());
    report
        .text
        .push_str(&format!("\nacked {total_acked} messages in total"));
    match checked {
        Ok(n) => {
            report
                .text
                .push_str(&format!("; {n} batches read back and compared"));
            Ok(report)
        }
        Err(message) => {
            report.json["error"] = json!(message);
            Err(CliError::Runtime {
                message,
                report: Some(report),
            })
        }
    }
}

fn throughput_report(
    mode: &str,
    args: &BenchArgs,
    target: &Target,
    messages: u64,
    elapsed: Duration,
    histogram: &Histogram<u64>,
) -> Report {
    let secs = elapsed.as_secs_f64();
    let bytes = messages * args.size as u64;
    let (msgs_per_s, mb_per_s) = if secs > 0.0 {
        (messages as f64 / secs, bytes as f64 / secs / 1e6)
    } else {
        (0.0, 0.0)
    };
    let json = json!({
        "mode": mode,
        "stream": target.stream,
        "topic": target.topic,
        "producers": args.producers,
        "partitions": target.partitions.len(),
        "size": args.size,
        "batch": args.batch,
        "rate": args.rate,
        "open_loop": args.rate > 0,
        "duration_s": args.duration.as_secs_f64(),
        "warmup_s": args.warmup.as_secs_f64(),
        "messages": messages,
        "bytes": bytes,
        "elapsed_s": secs,
        "msgs_per_s": msgs_per_s.round(),
        "mb_per_s": (mb_per_s * 100.0).round() / 100.0,
        "latency_us": latency_json(histogram),
    });
    let text = format!(
        "{mode}: {messages} messages of {} bytes in {secs:.2} s: {msgs_per_s:.0} msg/s, {mb_per_s:.1} MB/s ({} {})\n{}",
        args.size,
        if args.rate > 0 { "open loop at" } else { "closed loop" },
        if args.rate > 0 { format!("{} msg/s", args.rate) } else { String::new() },
        latency_text(histogram)
    );
    Report { text, json }
}
