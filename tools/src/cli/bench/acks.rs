//! A produce run's acks checked: each covers its batch, none overlap, they tile the
//! partitions of a new topic, and the first and last batch read back as sent.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use appliance::client::Client;
use appliance::protocol::reply::split_poll_body;
use appliance::protocol::{Consumer, PollStrategy};
use replication::wire::batch;
use replication::wire::PartitionKey;

use super::{bench_client, Ack, BenchArgs, Target, ROUNDTRIP_SEEN_TIMEOUT};
use crate::cli::{derive, Global};

pub(super) fn check_acks(
    global: &Global,
    args: &BenchArgs,
    target: &Target,
    acks: &[Ack],
) -> Result<usize, String> {
    let mut by_partition: BTreeMap<u32, Vec<Ack>> = BTreeMap::new();
    for a in acks {
        by_partition.entry(a.partition).or_default().push(*a);
    }
    let mut client = bench_client(global, args).map_err(|e| format!("{e:?}"))?;
    let mut read_back = 0;
    for (partition, list) in &mut by_partition {
        list.sort_by_key(|a| a.base_offset);
        let mut next = if target.created { Some(0) } else { None::<u64> };
        for a in list.iter() {
            if let Some(expected) = next {
                if a.base_offset < expected {
                    return Err(format!(
                        "partition {partition}: offset {} acknowledged twice",
                        a.base_offset
                    ));
                }
                if target.created && a.base_offset > expected {
                    return Err(format!(
                        "partition {partition}: gap, offsets {expected}..{} never acknowledged",
                        a.base_offset
                    ));
                }
            }
            next = Some(a.base_offset + u64::from(a.count));
        }
        // Retention may have deleted the oldest batches: the first one checked is the
        // first acknowledged at or above the partition's first retained offset.
        let retained = retained_from(&mut client, target, *partition);
        let mut ends: Vec<Ack> = list
            .iter()
            .find(|a| a.base_offset >= retained)
            .copied()
            .into_iter()
            .collect();
        if let Some(last) = list
            .last()
            .filter(|l| ends.first().map(|e| e.base_offset) != Some(l.base_offset))
        {
            ends.push(*last);
        }
        for a in ends {
            compare_batch(&mut client, args, target.key(*partition), &a)?;
            read_back += 1;
        }
    }
    Ok(read_back)
}

/// The first offset the cluster retains of a partition (0 when it cannot tell).
pub(super) fn retained_from(client: &mut Client, target: &Target, partition: u32) -> u64 {
    client
        .list_topics(target.stream)
        .ok()
        .and_then(|list| list.topics.into_iter().find(|t| t.topic_id == target.topic))
        .and_then(|t| t.stored.into_iter().find(|p| p.partition == partition))
        .map_or(0, |p| p.first_offset)
}

/// Reads the acked batch back and compares every message with what was sent.
pub(super) fn compare_batch(
    client: &mut Client,
    args: &BenchArgs,
    key: PartitionKey,
    ack: &Ack,
) -> Result<(), String> {
    let mut next = ack.base_offset;
    let end = ack.base_offset + u64::from(ack.count);
    let mut payload = vec![0u8; args.size];
    let started = Instant::now();
    while next < end {
        let body = client
            .poll_messages(
                key,
                Consumer::Single(0),
                PollStrategy::Offset(next),
                (end - next) as u32,
            )
            .map_err(|e| format!("partition {}: read back at {next}: {e}", key.partition))?;
        let batches = split_poll_body(&body).map_err(|e| e.to_string())?;
        let before = next;
        for (bytes, _) in &batches {
            for m in batch::messages(bytes) {
                if m.offset < next || m.offset >= end {
                    continue;
                }
                let index = ack.first_index + (m.offset - ack.base_offset);
                derive::fill_payload(args.seed, index, &mut payload);
                if m.offset != next
                    || m.id != derive::message_id(args.seed, index)
                    || m.payload != payload.as_slice()
                {
                    return Err(format!(
                        "partition {}: offset {} does not hold message index {index} that was acknowledged there",
                        key.partition, m.offset
                    ));
                }
                next += 1;
            }
        }
        if next == before {
            if started.elapsed() > ROUNDTRIP_SEEN_TIMEOUT {
                return Err(format!(
                    "partition {}: acknowledged offset {next} cannot be read back",
                    key.partition
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}
