//! `bench consume` (every partition read back from offset 0) and `bench roundtrip`
//! (a batch produced, then polled until it is seen).

use std::time::Instant;

use appliance::client::Client;
use appliance::protocol::reply::split_poll_body;
use appliance::protocol::{Consumer, PollStrategy};
use hdrhistogram::Histogram;
use replication::wire::batch;
use replication::wire::PartitionKey;
use serde_json::json;

use super::{
    drive, histogram, latency_json, latency_text, producers_report, record, spawn_workers, Ack,
    BenchArgs, Target, POLL_COUNT, ROUNDTRIP_SEEN_TIMEOUT,
};
use crate::cli::{derive, CliError, Global, Report};

/// What one consumer thread read.
struct ConsumerResult {
    histogram: Histogram<u64>,
    messages: u64,
    payload_bytes: u64,
    wire_bytes: u64,
    finished: Instant,
}

pub(super) fn consume(
    global: &Global,
    args: &BenchArgs,
    target: &Target,
) -> Result<Report, CliError> {
    let a = args.clone();
    let threads = args.producers;
    let keys: Vec<PartitionKey> = target.partitions.iter().map(|p| target.key(*p)).collect();
    let (results, start) = spawn_workers(global, args, false, move |w, mut client, start| {
        let deadline = start + a.duration;
        let mut result = ConsumerResult {
            histogram: histogram(),
            messages: 0,
            payload_bytes: 0,
            wire_bytes: 0,
            finished: start,
        };
        let mut check = MessageCheck {
            verify: a.verify,
            seed: a.seed,
            tag: derive::tag(a.seed),
            expected: Vec::new(),
        };
        for key in keys.iter().skip(w as usize).step_by(threads as usize) {
            consume_partition(&mut client, *key, deadline, &mut check, &mut result)?;
        }
        result.finished = Instant::now();
        Ok(result)
    })?;
    let (mut report, messages) = consume_report(args, target, &results, start);
    if let Some(expect) = args.expect {
        if expect != messages {
            let message = format!("read {messages} messages, expected {expect}");
            report.json["error"] = json!(message);
            return Err(CliError::Runtime {
                message,
                report: Some(report),
            });
        }
    }
    if messages == 0 {
        return Err(CliError::Runtime {
            message: "nothing to read: the partitions are empty".into(),
            report: Some(report),
        });
    }
    Ok(report)
}

/// How a consumer checks the messages it reads: with `verify`, each payload against
/// the one its id derives from the run's seed.
struct MessageCheck {
    verify: bool,
    seed: u64,
    tag: u64,
    expected: Vec<u8>,
}

/// Reads one partition from offset 0 until the deadline or its end: every message at
/// the next offset, in order.
fn consume_partition(
    client: &mut Client,
    key: PartitionKey,
    deadline: Instant,
    check: &mut MessageCheck,
    result: &mut ConsumerResult,
) -> Result<(), String> {
    let mut next = 0u64;
    while Instant::now() < deadline {
        let sent = Instant::now();
        let body = client
            .poll_messages(
                key,
                Consumer::Single(0),
                PollStrategy::Offset(next),
                POLL_COUNT,
            )
            .map_err(|e| format!("partition {}: poll at {next}: {e}", key.partition))?;
        record(&mut result.histogram, sent.elapsed());
        let batches = split_poll_body(&body).map_err(|e| e.to_string())?;
        let before = next;
        for (bytes, _) in &batches {
            for m in batch::messages(bytes) {
                if m.offset < next && next == before {
                    continue;
                }
                if m.offset != next {
                    return Err(format!(
                        "partition {}: expected offset {next}, read offset {}",
                        key.partition, m.offset
                    ));
                }
                if check.verify {
                    let (t, index) = derive::split_id(m.id);
                    check.expected.resize(m.payload.len(), 0);
                    derive::fill_payload(check.seed, index, &mut check.expected);
                    if t != check.tag || m.payload != check.expected.as_slice() {
                        return Err(format!(
                            "partition {}: offset {next}: message does not match its id (seed {})",
                            key.partition, check.seed
                        ));
                    }
                }
                result.payload_bytes += m.payload.len() as u64;
                next += 1;
            }
            result.wire_bytes += bytes.len() as u64;
        }
        if next == before {
            break;
        }
        result.messages += next - before;
    }
    Ok(())
}

/// The consumers' figures together (messages, bytes, rates and poll latency), and the
/// messages read.
fn consume_report(
    args: &BenchArgs,
    target: &Target,
    results: &[ConsumerResult],
    start: Instant,
) -> (Report, u64) {
    let mut histogram = histogram();
    let (mut messages, mut payload, mut wire) = (0u64, 0u64, 0u64);
    let mut finished = start;
    for r in results {
        let _ = histogram.add(&r.histogram);
        messages += r.messages;
        payload += r.payload_bytes;
        wire += r.wire_bytes;
        finished = finished.max(r.finished);
    }
    let elapsed = finished.saturating_duration_since(start);
    let secs = elapsed.as_secs_f64();
    let rate = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    let json = json!({
        "mode": "consume",
        "stream": target.stream,
        "topic": target.topic,
        "consumers": args.producers,
        "partitions": target.partitions.len(),
        "verified": args.verify,
        "messages": messages,
        "bytes": payload,
        "wire_bytes": wire,
        "elapsed_s": secs,
        "msgs_per_s": rate(messages).round(),
        "mb_per_s": (rate(payload) / 1e6 * 100.0).round() / 100.0,
        "wire_mb_per_s": (rate(wire) / 1e6 * 100.0).round() / 100.0,
        "latency_us": latency_json(&histogram),
    });
    let report = Report {
        text: format!(
            "consume: {messages} messages ({payload} payload bytes) in {secs:.2} s: {:.0} msg/s, {:.1} MB/s{}\nper poll {}",
            rate(messages),
            rate(payload) / 1e6,
            if args.verify { ", content verified" } else { "" },
            latency_text(&histogram)
        ),
        json,
    };
    (report, messages)
}

pub(super) fn roundtrip(
    global: &Global,
    args: &BenchArgs,
    target: &Target,
) -> Result<Report, CliError> {
    let (a, t) = (args.clone(), target.clone());
    let (results, start) = spawn_workers(global, args, true, move |w, mut client, start| {
        drive(&a, w, &mut client, start, &t, |client, key, ack| {
            poll_until_seen(&a, client, key, ack)
        })
    })?;
    producers_report("roundtrip", global, args, target, results, start)
}

/// Polls the acked batch's partition at its offset until its last message is readable;
/// the ids found at its first and last offset must be the ones sent.
fn poll_until_seen(
    a: &BenchArgs,
    client: &mut Client,
    key: PartitionKey,
    ack: &Ack,
) -> Result<(), String> {
    let partition = key.partition;
    let end = ack.base_offset + u64::from(ack.count);
    let first_id = derive::message_id(a.seed, ack.first_index);
    let last_id = derive::message_id(a.seed, ack.first_index + u64::from(ack.count) - 1);
    let polling = Instant::now();
    loop {
        let body = client
            .poll_messages(
                key,
                Consumer::Single(0),
                PollStrategy::Offset(ack.base_offset),
                ack.count,
            )
            .map_err(|e| format!("partition {partition}: poll: {e}"))?;
        let mut seen_last = false;
        for (bytes, _) in split_poll_body(&body).map_err(|e| e.to_string())? {
            for m in batch::messages(bytes) {
                let expected = if m.offset == ack.base_offset {
                    first_id
                } else if m.offset == end - 1 {
                    last_id
                } else {
                    continue;
                };
                seen_last |= m.offset == end - 1;
                if m.id != expected {
                    return Err(format!(
                        "partition {partition}: offset {} holds another message than the one acked there",
                        m.offset
                    ));
                }
            }
        }
        if seen_last {
            return Ok(());
        }
        if polling.elapsed() > ROUNDTRIP_SEEN_TIMEOUT {
            return Err(format!(
                "partition {partition}: acked batch at {} not readable after {ROUNDTRIP_SEEN_TIMEOUT:?}",
                ack.base_offset
            ));
        }
    }
}
