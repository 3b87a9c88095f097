//! `produce`: batches of generated messages (ids and payloads from cli::derive), sent
//! to one partition or round-robin by batch over all of them. Reports what was
//! acknowledged, also when it fails part way.

use std::collections::BTreeMap;
use std::time::Instant;

use appliance::client::Client;
use clap::Args;
use replication::wire::batch::{BatchBuilder, NewMessage};
use replication::wire::PartitionKey;
use serde_json::{json, Value};

use super::{connect, derive, stream_id, topic, CliError, Global, Report};

/// Messages one batch may hold (one SendMessages frame).
pub const BATCH_MAX: u32 = 100_000;
/// Largest --size: a batch must fit the 64 MiB frame.
pub const SIZE_MAX: usize = 16 * 1024 * 1024;
/// Bytes of batch (header, message headers, payloads) one SendMessages may carry,
/// leaving room under the 64 MiB frame for the frame header and partition key.
pub const BATCH_BYTES_MAX: u64 = 60 * 1024 * 1024;
const _: () = assert!((SIZE_MAX as u64) + 48 + 256 <= BATCH_BYTES_MAX);
const _: () = assert!(BATCH_BYTES_MAX < replication::wire::decode::MAX_MESSAGE_SIZE_DEFAULT as u64);

#[derive(Args, Debug)]
pub struct ProduceArgs {
    /// Stream id or name.
    #[arg(long)]
    pub stream: String,
    /// Topic id or name.
    #[arg(long)]
    pub topic: String,
    /// One partition; without it, batches go round-robin over every partition.
    #[arg(long)]
    pub partition: Option<u32>,
    /// Messages to send.
    #[arg(long)]
    pub count: u64,
    /// Payload bytes per message.
    #[arg(long)]
    pub size: usize,
    /// Messages per batch.
    #[arg(long)]
    pub batch: u32,
    /// Seed the ids and payloads derive from.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Index of the first message (to continue a run with the same seed).
    #[arg(long, default_value_t = 0)]
    pub start_index: u64,
}

/// Acknowledged messages of one partition.
#[derive(Clone, Copy, Debug, Default)]
struct Acked {
    count: u64,
    first_offset: Option<u64>,
    last_offset: Option<u64>,
}

fn check(args: &ProduceArgs) -> Result<(), CliError> {
    if args.count == 0 {
        return Err(CliError::Usage("--count must be at least 1".into()));
    }
    if args.batch == 0 || args.batch > BATCH_MAX {
        return Err(CliError::Usage(format!("--batch must be 1 to {BATCH_MAX}")));
    }
    if args.size > SIZE_MAX {
        return Err(CliError::Usage(format!(
            "--size must be at most {SIZE_MAX}"
        )));
    }
    if u64::from(args.batch) * (args.size as u64 + 48) + 256 > BATCH_BYTES_MAX {
        return Err(CliError::Usage(
            "--batch x --size exceeds the 64 MiB frame; use smaller batches".into(),
        ));
    }
    if args.start_index.checked_add(args.count).is_none() {
        return Err(CliError::Usage("--start-index + --count overflows".into()));
    }
    Ok(())
}

pub fn build_batch(seed: u64, first_index: u64, count: u32, size: usize) -> Vec<u8> {
    let mut builder = BatchBuilder::with_capacity(count as usize * (48 + size));
    let mut payload = vec![0u8; size];
    for i in 0..u64::from(count) {
        let index = first_index + i;
        derive::fill_payload(seed, index, &mut payload);
        builder.push(NewMessage {
            id: derive::message_id(seed, index),
            timestamp_delta: 0,
            payload: &payload,
            user_headers: &[],
        });
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    builder.finish(now)
}

fn report(acked: &BTreeMap<u32, Acked>, started: Instant, error: Option<&str>) -> Report {
    let total: u64 = acked.values().map(|a| a.count).sum();
    let first = acked.values().filter_map(|a| a.first_offset).min();
    let last = acked.values().filter_map(|a| a.last_offset).max();
    let elapsed = started.elapsed();
    let elapsed_ms = elapsed.as_millis() as u64;
    let msgs_per_s = if elapsed.as_secs_f64() > 0.0 {
        (total as f64 / elapsed.as_secs_f64()).round() as u64
    } else {
        0
    };
    let partitions: Vec<Value> = acked
        .iter()
        .map(|(p, a)| {
            json!({"partition": p, "acked": a.count, "first_offset": a.first_offset, "last_offset": a.last_offset})
        })
        .collect();
    let mut json = json!({
        "acked": total,
        "first_offset": first,
        "last_offset": last,
    });
    if acked.len() == 1 {
        if let Some(p) = acked.keys().next() {
            json["partition"] = json!(p);
        }
    }
    json["partitions"] = Value::Array(partitions);
    json["elapsed_ms"] = json!(elapsed_ms);
    json["msgs_per_s"] = json!(msgs_per_s);
    if let Some(error) = error {
        json["error"] = json!(error);
    }
    let offsets = |a: &Acked| match (a.first_offset, a.last_offset) {
        (Some(f), Some(l)) => format!("first offset {f}, last offset {l}"),
        _ => "no offsets".into(),
    };
    let mut text = format!("acked {total} messages in {elapsed_ms} ms ({msgs_per_s} msg/s)");
    for (p, a) in acked {
        text.push_str(&format!(
            "\npartition {p}: acked {}, {}",
            a.count,
            offsets(a)
        ));
    }
    Report { text, json }
}

pub fn run(global: &Global, args: &ProduceArgs) -> Result<Report, CliError> {
    check(args)?;
    let mut client = connect(global)?;
    let stream = stream_id(&mut client, &args.stream)?;
    let (topic_id, partition_count) = topic(&mut client, stream, &args.topic)?;
    let partitions: Vec<u32> = match args.partition {
        Some(p) if p >= partition_count => {
            return Err(CliError::runtime(format!(
                "partition {p} does not exist (the topic has {partition_count})"
            )))
        }
        Some(p) => vec![p],
        None => (0..partition_count).collect(),
    };
    if partitions.is_empty() {
        return Err(CliError::runtime("the topic has no partitions"));
    }
    let mut acked: BTreeMap<u32, Acked> =
        partitions.iter().map(|p| (*p, Acked::default())).collect();
    let started = Instant::now();
    let result = send_all(&mut client, args, stream, topic_id, &partitions, &mut acked);
    match result {
        Ok(()) => Ok(report(&acked, started, None)),
        Err(message) => Err(CliError::Runtime {
            report: Some(report(&acked, started, Some(&message))),
            message,
        }),
    }
}

fn send_all(
    client: &mut Client,
    args: &ProduceArgs,
    stream: u32,
    topic_id: u32,
    partitions: &[u32],
    acked: &mut BTreeMap<u32, Acked>,
) -> Result<(), String> {
    let mut sent = 0u64;
    let mut batch_no = 0usize;
    while sent < args.count {
        let count = (args.count - sent).min(u64::from(args.batch)) as u32;
        let partition = partitions[batch_no % partitions.len()];
        let key = PartitionKey {
            stream,
            topic: topic_id,
            partition,
        };
        let first_index = args.start_index + sent;
        let batch = build_batch(args.seed, first_index, count, args.size);
        let reply = client.send_messages(key, &batch).map_err(|e| {
            format!(
                "partition {partition}, messages {first_index}..{}: {e}",
                first_index + u64::from(count)
            )
        })?;
        let entry = acked.entry(partition).or_default();
        entry.count += u64::from(reply.count);
        entry.first_offset.get_or_insert(reply.base_offset);
        entry.last_offset = Some(reply.base_offset + u64::from(reply.count) - 1);
        sent += u64::from(count);
        batch_no += 1;
    }
    Ok(())
}
