//! Producing and consuming through the official Apache Iggy Rust SDK (`iggy` 0.11.0)
//! against a real node: sends by each partitioning with user headers, polls by each
//! strategy, for a consumer by id and by name, with auto-commit.

mod common;
#[path = "common/sdk.rs"]
mod sdk;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use appliance::protocol::request::{
    Identifier as NodeIdentifier, Partitioning as NodePartitioning,
};
use bytes::Bytes;
use common::*;
use futures_lite::StreamExt;
use iggy::prelude::{
    AutoCommit, Consumer, ConsumerGroupClient, ConsumerOffsetClient, HeaderKey, HeaderValue,
    Identifier, IggyClient, IggyDuration, IggyError, IggyMessage, IggyTimestamp, MessageClient,
    NonZeroIggyDuration, Partitioning, PolledMessages, PollingStrategy, SegmentClient,
    StreamClient, TopicClient, TopicCreateOptions, UserClient,
};
use replication::wire::batch::{BatchBuilder, NewMessage};
use sdk::*;

const PARTITIONS: u32 = 3;

fn payload(batch: u64, index: u64) -> Vec<u8> {
    format!("batch {batch} message {index}").into_bytes()
}

/// A batch of `count` messages; every other one carries user headers.
fn messages(batch: u64, count: u64) -> Vec<IggyMessage> {
    (0..count)
        .map(|index| {
            let headers = (index % 2 == 0).then(|| {
                BTreeMap::from([
                    (
                        HeaderKey::try_from("trace").expect("key"),
                        HeaderValue::from(batch * 100 + index),
                    ),
                    (
                        HeaderKey::try_from("source").expect("key"),
                        HeaderValue::try_from("e2e").expect("value"),
                    ),
                ])
            });
            IggyMessage::builder()
                .payload(Bytes::from(payload(batch, index)))
                .maybe_user_headers(headers)
                .build()
                .expect("message")
        })
        .collect()
}

/// Creates stream "orders" and in it topic "eu" of `PARTITIONS` partitions: their ids.
async fn orders_topic(client: &IggyClient) -> (u32, u32) {
    let stream = client.create_stream("orders").await.expect("stream");
    let topic = client
        .create_topic(
            &Identifier::named("orders").expect("name"),
            "eu",
            &TopicCreateOptions {
                partitions_count: Some(PARTITIONS),
                ..Default::default()
            },
        )
        .await
        .expect("topic");
    (stream.id, topic.id)
}

/// (offset, payload) of each polled message.
fn offsets_and_payloads(polled: &PolledMessages) -> Vec<(u64, Vec<u8>)> {
    polled
        .messages
        .iter()
        .map(|m| (m.header.offset, m.payload.to_vec()))
        .collect()
}

async fn poll(
    client: &IggyClient,
    partition: u32,
    consumer: &Consumer,
    strategy: PollingStrategy,
    count: u32,
    auto_commit: bool,
) -> PolledMessages {
    client
        .poll_messages(
            &Identifier::named("orders").expect("name"),
            &Identifier::named("eu").expect("name"),
            Some(partition),
            consumer,
            &strategy,
            count,
            auto_commit,
        )
        .await
        .expect("poll")
}

/// Polls `Next` for `consumer` in `partition` without committing until it starts at
/// `offset` (an auto-commit commits after its poll is answered, and a backup serving
/// the poll applies the commit a moment after the primary).
async fn next_starts_at(client: &IggyClient, partition: u32, consumer: &Consumer, offset: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let polled = poll(
            client,
            partition,
            consumer,
            PollingStrategy::next(),
            1,
            false,
        )
        .await;
        let first = polled.messages.first().map(|m| m.header.offset);
        if first == Some(offset) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "next stayed at {first:?}, not {offset}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn the_sdk_sends_by_each_partitioning_and_polls_by_each_strategy() {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    let mut raw = logged_in(&files, 0x3e);
    runtime().block_on(async {
        let client = root_client(&files, 0).await;
        let (stream, topic) = orders_topic(&client).await;
        let stream_id = Identifier::named("orders").expect("name");
        let topic_id = Identifier::named("eu").expect("name");

        // By partition id: four batches of five, confirmed at their offsets.
        let mut timestamps = Vec::new();
        for batch in 0..4u64 {
            let mut batch_messages = messages(batch, 5);
            let sent = client
                .send_messages(
                    &stream_id,
                    &topic_id,
                    &Partitioning::partition_id(1),
                    &mut batch_messages,
                )
                .await
                .expect("send");
            let confirmation = sent.confirmations.first().expect("a confirmation");
            assert_eq!(
                (
                    confirmation.stream_id,
                    confirmation.topic_id,
                    confirmation.partition_id,
                    confirmation.base_offset
                ),
                (stream, topic, 1, batch * 5)
            );
            let polled = poll(
                &client,
                1,
                &Consumer::new(Identifier::numeric(1).expect("id")),
                PollingStrategy::offset(batch * 5),
                1,
                false,
            )
            .await;
            timestamps.push(polled.messages[0].header.timestamp);
        }
        let all: Vec<(u64, Vec<u8>)> = (0..20)
            .map(|offset| (offset, payload(offset / 5, offset % 5)))
            .collect();

        // Offset: exactly the messages asked for, from inside a batch, across batches.
        let reader = Consumer::new(Identifier::numeric(7).expect("id"));
        let polled = poll(&client, 1, &reader, PollingStrategy::offset(3), 4, false).await;
        assert_eq!(offsets_and_payloads(&polled), all[3..7].to_vec());
        assert_eq!((polled.partition_id, polled.current_offset), (1, 19));
        assert_eq!(polled.count, 4);
        // User headers arrive as sent.
        let headers = polled.messages[1]
            .user_headers_map()
            .expect("headers")
            .expect("message 4 has headers");
        let trace = &headers[&HeaderKey::try_from("trace").expect("key")];
        assert_eq!(trace.as_uint64().expect("a u64"), 4);
        assert!(polled.messages[0].user_headers.is_none());
        // First, last and timestamp.
        let polled = poll(&client, 1, &reader, PollingStrategy::first(), 2, false).await;
        assert_eq!(offsets_and_payloads(&polled), all[0..2].to_vec());
        let polled = poll(&client, 1, &reader, PollingStrategy::last(), 3, false).await;
        assert_eq!(offsets_and_payloads(&polled), all[17..20].to_vec());
        let at = IggyTimestamp::from(timestamps[2]);
        let polled = poll(
            &client,
            1,
            &reader,
            PollingStrategy::timestamp(at),
            7,
            false,
        )
        .await;
        assert_eq!(offsets_and_payloads(&polled), all[10..17].to_vec());
        // Past the end: nothing, and the partition's current offset.
        let polled = poll(&client, 1, &reader, PollingStrategy::offset(20), 5, false).await;
        assert!(polled.messages.is_empty());
        assert_eq!(polled.current_offset, 19);

        // Next with auto-commit walks the partition once, for a consumer by id and,
        // separately, one by name.
        let named = Consumer::new(Identifier::named("billing").expect("name"));
        for consumer in [&reader, &named] {
            let polled = poll(&client, 1, consumer, PollingStrategy::next(), 6, true).await;
            assert_eq!(offsets_and_payloads(&polled), all[0..6].to_vec());
            next_starts_at(&client, 1, consumer, 6).await;
            let polled = poll(&client, 1, consumer, PollingStrategy::next(), 6, true).await;
            assert_eq!(offsets_and_payloads(&polled), all[6..12].to_vec());
            next_starts_at(&client, 1, consumer, 12).await;
        }

        // Consumer offsets: store, get, a Next poll after it, delete.
        let ledger = Consumer::new(Identifier::named("ledger").expect("name"));
        let stored = client
            .get_consumer_offset(&ledger, &stream_id, &topic_id, Some(1))
            .await
            .expect("get offset");
        assert!(stored.is_none(), "{stored:?}");
        client
            .store_consumer_offset(&ledger, &stream_id, &topic_id, Some(1), 13)
            .await
            .expect("store offset");
        let stored = client
            .get_consumer_offset(&ledger, &stream_id, &topic_id, Some(1))
            .await
            .expect("get offset")
            .expect("an offset");
        assert_eq!(
            (
                stored.partition_id,
                stored.current_offset,
                stored.stored_offset
            ),
            (1, 19, 13)
        );
        let polled = poll(&client, 1, &ledger, PollingStrategy::next(), 2, false).await;
        assert_eq!(offsets_and_payloads(&polled), all[14..16].to_vec());
        client
            .delete_consumer_offset(&ledger, &stream_id, &topic_id, Some(1))
            .await
            .expect("delete offset");
        let stored = client
            .get_consumer_offset(&ledger, &stream_id, &topic_id, Some(1))
            .await
            .expect("get offset");
        assert!(stored.is_none(), "{stored:?}");
        let deleted = client
            .delete_consumer_offset(&ledger, &stream_id, &topic_id, Some(1))
            .await;
        assert!(
            matches!(deleted, Err(IggyError::ConsumerOffsetNotFound(..))),
            "{deleted:?}"
        );

        // Messages key: the SDK picks the partition by the key's hash, the same one the
        // node picks for a raw request that leaves it to the node.
        let key = b"customer-7";
        let expected = xxhash_rust::xxh32::xxh32(key, 0) % PARTITIONS;
        let mut keyed = messages(10, 1);
        let sent = client
            .send_messages(
                &stream_id,
                &topic_id,
                &Partitioning::messages_key(key).expect("key"),
                &mut keyed,
            )
            .await
            .expect("send by key");
        assert_eq!(sent.confirmations[0].partition_id, expected);
        let reply = raw
            .write(
                replication::wire::Operation::SendMessages,
                &send_body_by(stream, topic, NodePartitioning::MessagesKey(key)),
            )
            .expect("raw send by key");
        assert_eq!(reply.status(), Status::Ok);
        assert_eq!(u32_at(&reply.body, 12), expected, "the node's pick");

        // Balanced: the SDK spreads its sends over every partition; so does the node.
        let mut partitions = Vec::new();
        for batch in 0..PARTITIONS {
            let mut balanced = messages(20 + u64::from(batch), 1);
            let sent = client
                .send_messages(
                    &stream_id,
                    &topic_id,
                    &Partitioning::balanced(),
                    &mut balanced,
                )
                .await
                .expect("balanced send");
            partitions.push(sent.confirmations[0].partition_id);
        }
        partitions.sort_unstable();
        assert_eq!(partitions, (0..PARTITIONS).collect::<Vec<_>>());
        let mut partitions = Vec::new();
        for _ in 0..PARTITIONS {
            let reply = raw
                .write(
                    replication::wire::Operation::SendMessages,
                    &send_body_by(stream, topic, NodePartitioning::Balanced),
                )
                .expect("raw balanced send");
            assert_eq!(reply.status(), Status::Ok);
            partitions.push(u32_at(&reply.body, 12));
        }
        partitions.sort_unstable();
        assert_eq!(partitions, (0..PARTITIONS).collect::<Vec<_>>());

        // A partition the topic does not have, a topic that does not exist.
        let missing = client
            .send_messages(
                &stream_id,
                &topic_id,
                &Partitioning::partition_id(PARTITIONS),
                &mut messages(30, 1),
            )
            .await;
        assert!(
            matches!(missing, Err(IggyError::PartitionNotFound(..))),
            "{missing:?}"
        );
        let missing = client
            .poll_messages(
                &stream_id,
                &Identifier::named("nowhere").expect("name"),
                Some(0),
                &reader,
                &PollingStrategy::first(),
                1,
                false,
            )
            .await;
        assert!(missing.is_err(), "{missing:?}");
    });
}

/// A raw SendMessages body of one message to topic `topic`, partitioned by the node.
fn send_body_by(stream: u32, topic: u32, partitioning: NodePartitioning<'_>) -> Vec<u8> {
    let mut builder = BatchBuilder::with_capacity(64);
    builder.push(NewMessage {
        id: 1,
        timestamp_delta: 0,
        payload: b"left to the node",
        user_headers: &[],
    });
    appliance::protocol::ClientRequest::SendMessages {
        stream: NodeIdentifier::Id(stream),
        topic: NodeIdentifier::Id(topic),
        partitioning,
        messages_count: 1,
        batch: &builder.finish(1),
    }
    .encode()
}

/// Every node of `files` started and healthy, the metadata group with a primary.
/// The nodes and each group's primary, as the client library reads them, once the answering node lists `partitions` partition groups
/// (a node may not have applied a topic just created).
fn cluster_metadata(
    files: &ClusterFiles,
    partitions: usize,
) -> appliance::protocol::reply::ClusterMetadataReply {
    let addrs: Vec<_> = (0..files.ports.len())
        .map(|r| files.client_addr(r))
        .collect();
    let mut library =
        appliance::client::Client::connect(&addrs, appliance::client::ClientOptions::default())
            .expect("connect");
    library
        .login("root", ROOT_PASSWORD.as_bytes())
        .expect("login");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let metadata = library.cluster_metadata().expect("cluster metadata");
        let listed = metadata
            .groups
            .iter()
            .filter(|g| g.group != replication::wire::METADATA_GROUP)
            .count();
        if listed >= partitions || std::time::Instant::now() > deadline {
            return metadata;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn on_three_nodes_the_sdk_routes_auto_commit_polls_and_offsets_to_each_primary() {
    const NODES: usize = 3;
    let files = ClusterFiles::new(NODES);
    let mut daemons = cluster(&files);
    runtime().block_on(async {
        let client = root_client(&files, 0).await;
        orders_topic(&client).await;
        let stream_id = Identifier::named("orders").expect("name");
        let topic_id = Identifier::named("eu").expect("name");
        // The partitions' primaries are spread over the nodes: sends, routed polls and
        // offset writes reach each of them.
        let metadata = cluster_metadata(&files, PARTITIONS as usize);
        let mut primaries: Vec<u8> = metadata
            .groups
            .iter()
            .filter(|g| g.group != replication::wire::METADATA_GROUP)
            .map(|g| g.primary)
            .collect();
        primaries.sort_unstable();
        assert_eq!(primaries, [0, 1, 2], "{metadata:?}");
        // Each partition's primary takes its sends, wherever it is.
        for partition in 0..PARTITIONS {
            for batch in 0..2u64 {
                let sent = client
                    .send_messages(
                        &stream_id,
                        &topic_id,
                        &Partitioning::partition_id(partition),
                        &mut messages(batch, 5),
                    )
                    .await
                    .expect("send");
                assert_eq!(sent.confirmations[0].base_offset, batch * 5);
            }
        }
        let all: Vec<(u64, Vec<u8>)> = (0..10)
            .map(|offset| (offset, payload(offset / 5, offset % 5)))
            .collect();
        for partition in 0..PARTITIONS {
            // Auto-commit polls are routed to the partition's primary; the offset they
            // store is read back through the same routing.
            let reader = Consumer::new(Identifier::named("audit").expect("name"));
            let polled = poll(
                &client,
                partition,
                &reader,
                PollingStrategy::next(),
                4,
                true,
            )
            .await;
            assert_eq!(offsets_and_payloads(&polled), all[0..4].to_vec());
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let stored = client
                    .get_consumer_offset(&reader, &stream_id, &topic_id, Some(partition))
                    .await
                    .expect("get offset");
                if stored.as_ref().map(|s| s.stored_offset) == Some(3) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "partition {partition}: {stored:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let polled = poll(
                &client,
                partition,
                &reader,
                PollingStrategy::next(),
                10,
                true,
            )
            .await;
            assert_eq!(offsets_and_payloads(&polled), all[4..10].to_vec());
            // Offset writes go to the primary too.
            client
                .store_consumer_offset(&reader, &stream_id, &topic_id, Some(partition), 1)
                .await
                .expect("store offset");
            next_starts_at(&client, partition, &reader, 2).await;
            client
                .delete_consumer_offset(&reader, &stream_id, &topic_id, Some(partition))
                .await
                .expect("delete offset");
        }
    });
    for daemon in &mut daemons {
        assert_eq!(daemon.terminate(Duration::from_secs(20)), Some(0));
    }
}

#[test]
fn the_sdks_producer_and_consumer_keep_every_acknowledged_message_across_a_primary_kill() {
    const NODES: usize = 3;
    const BATCHES: u64 = 60;
    let files = ClusterFiles::new(NODES);
    let mut daemons = cluster(&files);
    let acked = runtime().block_on(async {
        let client = root_client(&files, 0).await;
        orders_topic(&client).await;
        // The node that leads partition 0 is killed mid-produce.
        let partition_group = replication::wire::PartitionKey {
            stream: 1,
            topic: 1,
            partition: 0,
        }
        .pack()
        .expect("group");
        let victim = cluster_metadata(&files, PARTITIONS as usize)
            .groups
            .iter()
            .find(|g| g.group == partition_group)
            .map(|g| usize::from(g.primary))
            .expect("partition 0 has a primary");

        let producer = client
            .producer("orders", "eu")
            .expect("producer")
            .partitioning(Partitioning::partition_id(0))
            .send_retries(
                Some(30),
                Some(NonZeroIggyDuration::new(Duration::from_millis(200)).expect("interval")),
            )
            .build();
        producer.init().await.expect("producer init");
        let mut acked = Vec::new();
        for batch in 0..BATCHES {
            if batch == BATCHES / 3 {
                daemons[victim].kill();
            }
            let sent = producer.send(messages(batch, 10)).await;
            if sent.is_ok() {
                acked.extend((0..10).map(|index| payload(batch, index)));
            }
        }
        eprintln!(
            "node {victim} killed: {} of {} messages acknowledged",
            acked.len(),
            BATCHES * 10
        );
        assert!(
            acked.len() as u64 >= BATCHES * 10 / 2,
            "most sends were acknowledged: {} of {}",
            acked.len(),
            BATCHES * 10
        );
        acked
    });
    // A new client of a surviving node reads the partition back with the SDK's consumer.
    let survivor = daemons
        .iter()
        .position(|d| d.pid() != 0)
        .expect("a surviving node");
    runtime().block_on(async {
        let client = root_client(&files, survivor).await;
        let mut consumer = client
            .consumer("verifier", "orders", "eu", 0)
            .expect("consumer")
            .polling_strategy(PollingStrategy::offset(0))
            .auto_commit(AutoCommit::Disabled)
            .batch_length(100)
            .poll_interval(IggyDuration::from(Duration::from_millis(10)))
            .build();
        consumer.init().await.expect("consumer init");
        let mut read = std::collections::HashSet::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !acked.iter().all(|p| read.contains(p)) {
            assert!(
                Instant::now() < deadline,
                "{} acknowledged messages never read back",
                acked.iter().filter(|p| !read.contains(*p)).count()
            );
            let next = tokio::time::timeout(Duration::from_secs(1), consumer.next()).await;
            if let Ok(Some(received)) = next {
                let received = received.expect("a polled message");
                read.insert(received.message.payload.to_vec());
            }
        }
    });
}

#[test]
fn the_sdk_manages_consumer_groups_and_their_members_share_the_partitions() {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    runtime().block_on(async {
        let first = root_client(&files, 0).await;
        let second = root_client(&files, 0).await;
        orders_topic(&first).await;
        let stream_id = Identifier::named("orders").expect("name");
        let topic_id = Identifier::named("eu").expect("name");
        let readers = Identifier::named("readers").expect("name");
        for partition in 0..PARTITIONS {
            first
                .send_messages(
                    &stream_id,
                    &topic_id,
                    &Partitioning::partition_id(partition),
                    &mut messages(u64::from(partition), 4),
                )
                .await
                .expect("send");
        }
        let created = first
            .create_consumer_group(&stream_id, &topic_id, "readers")
            .await
            .expect("create group");
        assert_eq!(
            (
                created.name.as_str(),
                created.partitions_count,
                created.members_count
            ),
            ("readers", PARTITIONS, 0)
        );
        let duplicate = first
            .create_consumer_group(&stream_id, &topic_id, "readers")
            .await;
        assert!(
            matches!(
                duplicate,
                Err(IggyError::ConsumerGroupNameAlreadyExists(..))
            ),
            "{duplicate:?}"
        );
        let groups = first
            .get_consumer_groups(&stream_id, &topic_id)
            .await
            .expect("groups");
        assert_eq!(groups.len(), 1);
        let missing = Identifier::named("nobody").expect("name");
        let none = first
            .get_consumer_group(&stream_id, &topic_id, &missing)
            .await
            .expect("get missing group");
        assert!(none.is_none());

        // Two members split the three partitions between them.
        for client in [&first, &second] {
            client
                .join_consumer_group(&stream_id, &topic_id, &readers)
                .await
                .expect("join");
        }
        let details = first
            .get_consumer_group(&stream_id, &topic_id, &readers)
            .await
            .expect("get group")
            .expect("the group");
        assert_eq!(details.members_count, 2);
        let mut assigned: Vec<u32> = details
            .members
            .iter()
            .flat_map(|m| m.partitions.clone())
            .collect();
        assigned.sort_unstable();
        assert_eq!(assigned, (0..PARTITIONS).collect::<Vec<_>>());

        // Each member polls its own partitions (the SDK asks for its assignment); between
        // them they read every message once, with auto-commit.
        let group = Consumer::group(readers.clone());
        let mut read = Vec::new();
        for client in [&first, &second] {
            for _ in 0..4 {
                let polled = client
                    .poll_messages(
                        &stream_id,
                        &topic_id,
                        None,
                        &group,
                        &PollingStrategy::next(),
                        10,
                        true,
                    )
                    .await
                    .expect("group poll");
                read.extend(polled.messages.iter().map(|m| m.payload.to_vec()));
            }
        }
        read.sort();
        read.dedup();
        let mut sent: Vec<Vec<u8>> = (0..PARTITIONS)
            .flat_map(|p| (0..4).map(move |i| payload(u64::from(p), i)))
            .collect();
        sent.sort();
        assert_eq!(read, sent);

        // Leaving hands the partitions to the remaining member; deleting ends the group.
        second
            .leave_consumer_group(&stream_id, &topic_id, &readers)
            .await
            .expect("leave");
        let details = first
            .get_consumer_group(&stream_id, &topic_id, &readers)
            .await
            .expect("get group")
            .expect("the group");
        assert_eq!(details.members_count, 1);
        assert_eq!(
            details.members[0].partitions,
            (0..PARTITIONS).collect::<Vec<_>>()
        );
        // A member that logs out leaves too.
        first.logout_user().await.expect("logout");
        let details = second
            .get_consumer_group(&stream_id, &topic_id, &readers)
            .await
            .expect("get group")
            .expect("the group");
        assert_eq!(details.members_count, 0);
        second
            .delete_consumer_group(&stream_id, &topic_id, &readers)
            .await
            .expect("delete group");
        let gone = second
            .get_consumer_group(&stream_id, &topic_id, &readers)
            .await
            .expect("get deleted group");
        assert!(gone.is_none());
    });
}

#[test]
fn the_sdk_deletes_a_partitions_oldest_segments() {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    runtime().block_on(async {
        let client = root_client(&files, 0).await;
        orders_topic(&client).await;
        let stream_id = Identifier::named("orders").expect("name");
        let topic_id = Identifier::named("eu").expect("name");
        // 3.2 MiB over the test nodes' 1 MiB segments.
        let payload = Bytes::from(vec![7u8; 1024]);
        for _ in 0..8 {
            let mut batch = repeated(&payload, 400);
            client
                .send_messages(
                    &stream_id,
                    &topic_id,
                    &Partitioning::partition_id(0),
                    &mut batch,
                )
                .await
                .expect("send");
        }
        let reader = Consumer::new(Identifier::numeric(1).expect("id"));
        let first = poll(&client, 0, &reader, PollingStrategy::first(), 1, false).await;
        assert_eq!(first.messages[0].header.offset, 0);
        client
            .delete_segments(&stream_id, &topic_id, 0, 1)
            .await
            .expect("delete the oldest segment");
        let first = poll(&client, 0, &reader, PollingStrategy::first(), 1, false).await;
        let retained = first.messages[0].header.offset;
        assert!(
            retained > 0 && retained < 3200,
            "first retained offset {retained}"
        );
        // Polls below it start there; the rest of the partition is intact.
        let polled = poll(&client, 0, &reader, PollingStrategy::offset(0), 5, false).await;
        assert_eq!(polled.messages[0].header.offset, retained);
        let last = poll(&client, 0, &reader, PollingStrategy::last(), 1, false).await;
        assert_eq!(last.messages[0].header.offset, 3199);
        let missing = client
            .delete_segments(&stream_id, &topic_id, PARTITIONS, 1)
            .await;
        assert!(missing.is_err(), "{missing:?}");
    });
}
