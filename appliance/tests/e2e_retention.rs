//! Retention on three real `appliance` processes on 127.0.0.1: a topic limited by size
//! and a topic limited by age lose their oldest sealed segments, every replica ends with
//! the same first offset and the same segment files, polls start at the first retained
//! offset, and a node that lost its disk rejoins by state transfer with the same range.

mod common;

use std::time::{Duration, Instant};

use appliance::client::{Client, ClientOptions};
use appliance::protocol::reply::{split_poll_body, PartitionRange};
use appliance::protocol::{Consumer, PollStrategy, Retention};
use common::*;
use replication::wire::batch;
use replication::wire::PartitionKey;

const NODES: usize = 3;
/// 400 batches of 20 KiB: 8 MiB over 1 MiB segments, more ops than a partition keeps
/// for repair (so a wiped node needs a state transfer).
const BATCHES: u64 = 400;
const PER_BATCH: usize = 20;
const SIZE: usize = 1024;

fn client_of(files: &ClusterFiles, replica: usize) -> Option<Client> {
    let mut client =
        Client::connect(&[files.client_addr(replica)], ClientOptions::default()).ok()?;
    client.login("root", ROOT_PASSWORD.as_bytes()).ok()?;
    Some(client)
}

/// What node `replica` alone says it retains of `key`.
fn range_on(files: &ClusterFiles, replica: usize, key: PartitionKey) -> Option<PartitionRange> {
    let mut client = client_of(files, replica)?;
    let topics = client.list_topics(key.stream).ok()?.topics;
    let topic = topics.into_iter().find(|t| t.topic_id == key.topic)?;
    topic
        .stored
        .into_iter()
        .find(|p| p.partition == key.partition)
}

/// The segment files of `key` in node `replica`'s data directory, by name.
fn segment_files(files: &ClusterFiles, replica: usize, key: PartitionKey) -> Vec<String> {
    let dir = files
        .data_dir(replica)
        .join("partitions")
        .join(format!("{}-{}-{}", key.stream, key.topic, key.partition));
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".log"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Waits until every node retains the same range of `key` from a first offset above 0
/// and holds the same segment files starting there, and `settled` accepts the range.
fn converged(
    files: &ClusterFiles,
    key: PartitionKey,
    settled: impl Fn(&PartitionRange, &[String]) -> bool,
    within: Duration,
) -> (PartitionRange, Vec<String>) {
    let deadline = Instant::now() + within;
    loop {
        let ranges: Vec<Option<PartitionRange>> =
            (0..NODES).map(|r| range_on(files, r, key)).collect();
        let segments: Vec<Vec<String>> = (0..NODES).map(|r| segment_files(files, r, key)).collect();
        if let Some(Some(first)) = ranges.first() {
            let same = ranges.iter().all(|r| r.as_ref() == Some(first))
                && segments.iter().all(|s| *s == segments[0]);
            let starts_there = segments[0]
                .first()
                .is_some_and(|name| *name == format!("{:020}.log", first.first_offset));
            if same && starts_there && first.first_offset > 0 && settled(first, &segments[0]) {
                return (first.clone(), segments[0].clone());
            }
        }
        assert!(
            Instant::now() < deadline,
            "{key:?} did not converge: {ranges:?} {segments:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Polls `key` on node `replica` from offset 0: the first message delivered is at
/// `first`, and every message up to `end` follows with the id it was sent with.
fn reads_from(files: &ClusterFiles, replica: usize, key: PartitionKey, first: u64, end: u64) {
    let mut client = client_of(files, replica).expect("client");
    let mut next = 0u64;
    let mut seen_first = None;
    while next < end {
        let body = client
            .poll_messages(key, Consumer::Single(1), PollStrategy::Offset(next), 1000)
            .expect("poll");
        let batches = split_poll_body(&body).expect("batches");
        assert!(
            !batches.is_empty(),
            "node {replica}: nothing at {next} of {end}"
        );
        for (bytes, _) in batches {
            for message in batch::messages(bytes) {
                if message.offset < next {
                    continue;
                }
                seen_first.get_or_insert(message.offset);
                assert!(next == 0 || message.offset == next, "a gap at {next}");
                assert_eq!(message.id, u128::from(message.offset) + 1);
                next = message.offset + 1;
            }
        }
    }
    assert_eq!(
        seen_first,
        Some(first),
        "node {replica}: polls start at the first offset"
    );
}

fn produce(client: &mut Client, key: PartitionKey, batches: u64) -> u64 {
    let mut offset = 0;
    for _ in 0..batches {
        let reply = client
            .send_messages(key, &numbered_batch(offset, PER_BATCH, SIZE))
            .expect("send");
        assert_eq!(reply.base_offset, offset);
        offset += PER_BATCH as u64;
    }
    offset
}

#[test]
fn retention_by_size_and_age_leaves_every_replica_the_same_range() {
    let files = ClusterFiles::new(NODES);
    files.edit_configs(&[(
        "[storage]\n",
        "[retention]\ncheck_interval = \"200ms\"\n\n[storage]\n",
    )]);
    let mut daemons: Vec<Daemon> = (0..NODES).map(|r| Daemon::start(&files, r)).collect();
    for daemon in &mut daemons {
        wait_healthy(&files, daemon, Duration::from_secs(30));
    }
    let addresses: Vec<_> = (0..NODES).map(|r| files.client_addr(r)).collect();
    let mut client = Client::connect(&addresses, ClientOptions::default()).expect("connect");
    client
        .login("root", ROOT_PASSWORD.as_bytes())
        .expect("login");
    client.register().expect("register");
    let stream = client.create_stream("retention").expect("stream");
    let sized = client
        .create_topic_with(
            stream,
            "sized",
            1,
            Retention {
                message_expiry: Retention::NEVER,
                max_topic_size: 3 << 20,
            },
        )
        .expect("sized topic");
    let aged = client
        .create_topic_with(
            stream,
            "aged",
            1,
            Retention {
                message_expiry: Retention::NEVER,
                max_topic_size: Retention::NEVER,
            },
        )
        .expect("aged topic");
    let key = |topic| PartitionKey {
        stream,
        topic,
        partition: 0,
    };

    // By size: 8 MiB into a topic of at most 3 MiB.
    let end = produce(&mut client, key(sized), BATCHES);
    let (range, segments) = converged(
        &files,
        key(sized),
        |r, _| r.bytes <= 3 << 20 && r.end_offset == end,
        Duration::from_secs(30),
    );
    assert!(range.bytes > 1 << 20, "only the excess goes: {range:?}");
    for replica in 0..NODES {
        reads_from(&files, replica, key(sized), range.first_offset, end);
    }

    // By age: written, then its expiry set to one second; every sealed segment goes.
    let aged_end = produce(&mut client, key(aged), BATCHES / 4);
    assert!(range_on(&files, 0, key(aged)).is_some_and(|r| r.segments > 1));
    std::thread::sleep(Duration::from_millis(1500));
    client
        .update_topic(
            stream,
            aged,
            Retention {
                message_expiry: 1_000_000,
                max_topic_size: Retention::NEVER,
            },
        )
        .expect("update topic");
    let (aged_range, _) = converged(
        &files,
        key(aged),
        |r, files| r.segments == 1 && files.len() == 1,
        Duration::from_secs(30),
    );
    assert_eq!(aged_range.end_offset, aged_end);

    // A node that lost its disk rejoins by state transfer with the same range.
    let wiped = 2;
    daemons[wiped].kill();
    std::fs::remove_dir_all(files.data_dir(wiped)).expect("wipe");
    daemons[wiped] = Daemon::start(&files, wiped);
    let (rejoined, rejoined_segments) = converged(
        &files,
        key(sized),
        |r, _| r.end_offset == end,
        Duration::from_secs(60),
    );
    assert_eq!(rejoined.first_offset, range.first_offset);
    assert_eq!(rejoined_segments, segments);
    reads_from(&files, wiped, key(sized), range.first_offset, end);
    // /stats is a snapshot published about every 100 ms, and the transfer's counter
    // reaches it from the transfer executor: the data may be served before the counter
    // shows, so give it a moment.
    let counted = Instant::now() + Duration::from_secs(5);
    loop {
        let transfers = stats(&files, wiped)["state_transfer"]["transfers_completed"]
            .as_u64()
            .unwrap_or(0);
        if transfers >= 1 {
            break;
        }
        assert!(
            Instant::now() < counted,
            "the wiped node caught up by state transfer"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
