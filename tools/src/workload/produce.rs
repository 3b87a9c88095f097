//! The producer: one thread and one client per partition, each sending batches at a
//! steady rate until a stop file appears or the time limit passes, and writing one
//! line per batch (BatchRecord) to the acks file as soon as the batch is decided. A
//! batch that fails is never resent: the next batch carries new indices, so a message
//! can only be stored twice if the cluster stored it twice.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use appliance::client::{Client, ClientError};
use replication::wire::PartitionKey;

use super::check::{index_of, BatchRecord, Outcome};
use super::{connect_all, now_ms, ConnectArgs};
use crate::cli::produce::build_batch;

/// What the producer is told.
#[derive(Clone, Debug)]
pub struct ProduceParams {
    pub partitions: u32,
    /// Messages per second per partition.
    pub rate: u32,
    pub batch: u32,
    pub size: usize,
    pub seed: u64,
    pub stop_file: PathBuf,
    /// Hard limit on the run, whatever happens to the stop file.
    pub max_duration: Duration,
}

/// Creates the stream and topic if they are absent; returns (stream id, topic id).
pub fn ensure_topic(client: &mut Client, partitions: u32) -> Result<(u32, u32), ClientError> {
    let stream = match client
        .list_streams()?
        .streams
        .into_iter()
        .find(|s| s.name == super::STREAM)
    {
        Some(s) => s.stream_id,
        None => client.create_stream(super::STREAM)?,
    };
    let topic = match client
        .list_topics(stream)?
        .topics
        .into_iter()
        .find(|t| t.name == super::TOPIC)
    {
        Some(t) => t.topic_id,
        None => client.create_topic(stream, super::TOPIC, partitions)?,
    };
    Ok((stream, topic))
}

fn outcome_of(error: &ClientError) -> Outcome {
    match error {
        ClientError::RetriesExhausted {
            maybe_applied: false,
            ..
        } => Outcome::Refused,
        ClientError::Status { .. } | ClientError::InvalidArgument { .. } => Outcome::Refused,
        _ => Outcome::Unknown,
    }
}

type Sink = Arc<Mutex<BufWriter<File>>>;

fn record(sink: &Sink, r: &BatchRecord) {
    if let Ok(mut out) = sink.lock() {
        if let Ok(line) = serde_json::to_string(r) {
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }
}

fn partition_loop(
    conn: &ConnectArgs,
    params: &ProduceParams,
    key: PartitionKey,
    sink: &Sink,
    started: Instant,
) -> (u64, u64) {
    let mut client = None;
    let mut seq = 0u64;
    let (mut acked, mut failed) = (0u64, 0u64);
    let pause = Duration::from_secs_f64(f64::from(params.batch) / f64::from(params.rate.max(1)));
    let mut next = Instant::now();
    while !params.stop_file.exists() && started.elapsed() < params.max_duration {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        next = Instant::now().max(next) + pause;
        if client.is_none() {
            match connect_all(conn) {
                Ok(c) => client = Some(c),
                Err(e) => {
                    eprintln!("partition {}: connect: {e}", key.partition);
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            }
        }
        let Some(c) = client.as_mut() else { continue };
        let first_index = index_of(key.partition, seq);
        let bytes = build_batch(params.seed, first_index, params.batch, params.size);
        let sent_ms = now_ms();
        let result = c.send_messages(key, &bytes);
        let mut r = BatchRecord {
            partition: key.partition,
            first_index,
            count: params.batch,
            outcome: Outcome::Acked,
            base_offset: None,
            sent_ms,
            done_ms: now_ms(),
            error: None,
        };
        match result {
            Ok(reply) => {
                r.base_offset = Some(reply.base_offset);
                acked += u64::from(params.batch);
            }
            Err(e) => {
                eprintln!(
                    "partition {}: batch at index {first_index}: {e}",
                    key.partition
                );
                r.outcome = outcome_of(&e);
                r.error = Some(e.to_string());
                failed += u64::from(params.batch);
                if matches!(e, ClientError::Evicted { .. }) {
                    client = None;
                }
            }
        }
        record(sink, &r);
        seq += u64::from(params.batch);
    }
    (acked, failed)
}

/// Runs the producer threads to the end; returns (acked, failed) message counts.
pub fn run(conn: &ConnectArgs, params: &ProduceParams, acks: &Path) -> Result<(u64, u64), String> {
    let mut client = connect_all(conn).map_err(|e| format!("connect: {e}"))?;
    let (stream, topic) =
        ensure_topic(&mut client, params.partitions).map_err(|e| format!("create topic: {e}"))?;
    let file = File::create(acks).map_err(|e| format!("{}: {e}", acks.display()))?;
    let sink: Sink = Arc::new(Mutex::new(BufWriter::new(file)));
    let started = Instant::now();
    let handles: Vec<_> = (0..params.partitions)
        .map(|partition| {
            let (conn, params, sink) = (conn.clone(), params.clone(), sink.clone());
            let key = PartitionKey {
                stream,
                topic,
                partition,
            };
            std::thread::spawn(move || partition_loop(&conn, &params, key, &sink, started))
        })
        .collect();
    let mut totals = (0, 0);
    for h in handles {
        let (a, f) = h
            .join()
            .map_err(|_| "a producer thread panicked".to_string())?;
        totals.0 += a;
        totals.1 += f;
    }
    Ok(totals)
}
