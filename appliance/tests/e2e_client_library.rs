//! The real client library against a real single-node daemon: 100,000 messages across a
//! topic of 3 partitions, read back in order with contents verified, then again after
//! the node restarts.

mod common;

use std::time::Duration;

use appliance::client::{Client, ClientError, ClientOptions};
use appliance::protocol::reply::split_poll_body;
use appliance::protocol::{Consumer, PollStrategy, Status};
use common::*;
use replication::wire::batch::{self, BatchBuilder, NewMessage};
use replication::wire::PartitionKey;

const PARTITIONS: u32 = 3;
const MESSAGES: u64 = 100_000;
const PER_BATCH: u64 = 1_000;

fn payload(index: u64) -> Vec<u8> {
    let mut bytes = index.to_le_bytes().repeat(16);
    bytes[0] ^= 0x5a;
    bytes
}

/// Messages `first..first + count`: ids index + 1, payloads `payload(index)`.
fn numbered_batch(first: u64, count: u64) -> Vec<u8> {
    let mut builder = BatchBuilder::with_capacity(count as usize * 200);
    for index in first..first + count {
        builder.push(NewMessage {
            id: u128::from(index) + 1,
            timestamp_delta: 0,
            payload: &payload(index),
            user_headers: &[],
        });
    }
    builder.finish(1)
}

fn connect(files: &ClusterFiles) -> Client {
    let mut client =
        Client::connect(&[files.client_addr(0)], ClientOptions::default()).expect("connect");
    client
        .login("root", ROOT_PASSWORD.as_bytes())
        .expect("login");
    client.register().expect("register");
    client
}

/// Reads every message of `partition` and checks offsets are dense from 0 and each
/// payload is the one its global index implies; returns how many it read.
fn read_back(client: &mut Client, key: PartitionKey, indexes: &[u64]) -> usize {
    let mut offset = 0u64;
    while (offset as usize) < indexes.len() {
        let body = client
            .poll_messages(
                key,
                Consumer::Single(1),
                PollStrategy::Offset(offset),
                10_000,
            )
            .expect("poll");
        let batches = split_poll_body(&body).expect("verified batches");
        assert!(
            !batches.is_empty(),
            "partition {} ended at {offset} of {}",
            key.partition,
            indexes.len()
        );
        for (bytes, _) in batches {
            for message in batch::messages(bytes) {
                if message.offset < offset {
                    continue;
                }
                assert_eq!(
                    message.offset, offset,
                    "gap or duplicate in partition {}",
                    key.partition
                );
                let index = indexes[offset as usize];
                assert_eq!(message.id, u128::from(index) + 1);
                assert_eq!(
                    message.payload,
                    &payload(index)[..],
                    "payload of message {index}"
                );
                offset += 1;
            }
        }
    }
    offset as usize
}

#[test]
fn one_hundred_thousand_messages_survive_a_restart_through_the_client_library() {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));
    let mut client = connect(&files);
    let stream = client.create_stream("library").expect("stream");
    let topic = client.create_topic(stream, "t", PARTITIONS).expect("topic");
    let key = |partition| PartitionKey {
        stream,
        topic,
        partition,
    };

    // Batches go round-robin; remember which global index landed at which offset.
    let mut placed: Vec<Vec<u64>> = vec![Vec::new(); PARTITIONS as usize];
    for (b, first) in (0..MESSAGES).step_by(PER_BATCH as usize).enumerate() {
        let partition = b as u32 % PARTITIONS;
        let reply = client
            .send_messages(key(partition), &numbered_batch(first, PER_BATCH))
            .expect("send");
        let placed = &mut placed[partition as usize];
        assert_eq!(
            reply.base_offset,
            placed.len() as u64,
            "offsets are dense per partition"
        );
        placed.extend(first..first + PER_BATCH);
    }

    let total: usize = (0..PARTITIONS)
        .map(|p| read_back(&mut client, key(p), &placed[p as usize]))
        .sum();
    assert_eq!(total as u64, MESSAGES);

    assert_eq!(
        daemon.terminate(Duration::from_secs(20)),
        Some(0),
        "SIGTERM exits 0"
    );
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));
    let mut client = connect(&files);
    let total: usize = (0..PARTITIONS)
        .map(|p| read_back(&mut client, key(p), &placed[p as usize]))
        .sum();
    assert_eq!(
        total as u64, MESSAGES,
        "every acknowledged message is still there after a restart"
    );
}

#[test]
fn polling_with_auto_commit_stores_the_consumer_offset() {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));
    let mut client = connect(&files);
    let stream = client.create_stream("auto").expect("stream");
    let topic = client.create_topic(stream, "t", 1).expect("topic");
    let key = PartitionKey {
        stream,
        topic,
        partition: 0,
    };
    for b in 0..5u64 {
        client
            .send_messages(key, &numbered_batch(b * 10, 10))
            .expect("send");
    }
    let consumer = Consumer::Single(9);
    let mut seen = Vec::new();
    // Each Next poll (ten messages at a time) continues where the last one stopped,
    // without the consumer storing anything itself.
    for _ in 0..5 {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let first = loop {
            let body = client
                .poll_messages_auto_commit(key, consumer, PollStrategy::Next, 10)
                .expect("poll");
            let batches = split_poll_body(&body).expect("batches");
            let first = batches
                .first()
                .and_then(|(bytes, _)| batch::messages(bytes).next())
                .map(|m| m.offset);
            // The offset commits just after the reply: a poll in between sees the same
            // messages again, never later ones.
            if first != seen.last().copied() {
                break first;
            }
            assert!(std::time::Instant::now() < deadline, "offset not stored");
            std::thread::sleep(Duration::from_millis(20));
        };
        seen.push(first.expect("a batch"));
    }
    assert_eq!(seen, [0, 10, 20, 30, 40]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while client.get_consumer_offset(key, consumer).expect("offset") != Some(49) {
        assert!(std::time::Instant::now() < deadline, "last offset stored");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn three_nodes_keep_every_acknowledged_message_when_the_primary_is_killed_mid_produce() {
    let files = ClusterFiles::new(3);
    let mut daemons: Vec<Daemon> = (0..3).map(|r| Daemon::start(&files, r)).collect();
    for daemon in &mut daemons {
        wait_healthy(&files, daemon, Duration::from_secs(60));
    }
    let addrs: Vec<_> = (0..3).map(|r| files.client_addr(r)).collect();
    let mut client = Client::connect(&addrs, ClientOptions::default()).expect("connect");
    client
        .login("root", ROOT_PASSWORD.as_bytes())
        .expect("login");
    client.register().expect("register");
    let stream = client.create_stream("failover").expect("stream");
    let topic = client.create_topic(stream, "t", PARTITIONS).expect("topic");
    let keys: Vec<PartitionKey> = (0..PARTITIONS)
        .map(|partition| PartitionKey {
            stream,
            topic,
            partition,
        })
        .collect();
    let mut placed: Vec<Vec<u64>> = vec![Vec::new(); PARTITIONS as usize];
    let mut killed = None;
    for (b, first) in (0..MESSAGES).step_by(PER_BATCH as usize).enumerate() {
        if b == 30 {
            // The primary of partition 0 dies between two acknowledged batches (its
            // pipeline may hold more): the client retries at the others.
            let metadata = client.cluster_metadata().expect("metadata");
            let group = keys[0].pack().expect("key");
            let primary = metadata
                .groups
                .iter()
                .find(|g| g.group == group)
                .map(|g| usize::from(g.primary))
                .filter(|p| *p < 3)
                .expect("partition 0 has a primary");
            daemons[primary].kill();
            killed = Some(primary);
        }
        let partition = b as u32 % PARTITIONS;
        let reply = client
            .send_messages(keys[partition as usize], &numbered_batch(first, PER_BATCH))
            .expect("send (the library fails over)");
        let placed = &mut placed[partition as usize];
        assert_eq!(
            reply.base_offset,
            placed.len() as u64,
            "exactly once, in order"
        );
        placed.extend(first..first + PER_BATCH);
    }
    let killed = killed.expect("a node was killed");
    daemons[killed] = Daemon::start(&files, killed);
    // Every node, the restarted one included, serves exactly the acknowledged messages.
    let want: Vec<u64> = placed.iter().map(|p| p.len() as u64).collect();
    for replica in 0..3 {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            let counts = served_counts(&files, replica, &keys);
            if counts == want {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node {replica} serves {counts:?} of {want:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let mut reader = Client::connect(&[files.client_addr(replica)], ClientOptions::default())
            .expect("connect");
        reader
            .login("root", ROOT_PASSWORD.as_bytes())
            .expect("login");
        let total: usize = (0..PARTITIONS as usize)
            .map(|p| read_back(&mut reader, keys[p], &placed[p]))
            .sum();
        assert_eq!(total as u64, MESSAGES, "node {replica}");
    }
    // A partition that does not exist: only the metadata primary says so (a backup may
    // not have the topic yet and answers Unavailable), and the library, moving on from
    // the backups, reports NotFound.
    let missing = PartitionKey {
        stream,
        topic,
        partition: PARTITIONS + 3,
    };
    match client.send_messages(missing, &numbered_batch(MESSAGES, PER_BATCH)) {
        Err(ClientError::Status { status, .. }) => assert_eq!(status, Status::NotFound),
        other => panic!("a missing partition answered {other:?}"),
    }
}
