//! The official Apache Iggy Rust SDK (`iggy` 0.11.0) as a client of a real single-node
//! daemon, through its own calls: the client port speaks Iggy's binary protocol.

mod common;
#[path = "common/sdk.rs"]
mod sdk;

use std::time::Duration;

use common::*;
use iggy::prelude::{
    Client as _, ClusterClient, ClusterNodeRole, ClusterNodeStatus, Consumer, Identifier,
    IggyByteSize, IggyClient, IggyError, IggyExpiry, IggyMessage, MaxTopicSize, MessageClient,
    PartitionClient, Partitioning, PollingStrategy, StreamClient, SystemClient, TopicClient,
    TopicCreateOptions, TopicUpdateOptions, UserClient,
};
use sdk::*;

fn sdk_client(files: &ClusterFiles) -> IggyClient {
    node_client(files, 0)
}

#[test]
fn the_sdk_connects_pings_logs_in_and_out() {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    // Root's user id as a LoginUser on a raw connection reports it.
    let mut raw = Client::connect(files.client_addr(0), 0x5d).expect("connect");
    let login = raw.login("root", ROOT_PASSWORD).expect("login");
    assert_eq!(login.status(), Status::Ok);
    let root_id = u32_at(&login.body, 0);
    runtime().block_on(async {
        let client = sdk_client(&files);
        client.connect().await.expect("connect");
        client.ping().await.expect("ping before login");

        // A wrong password is refused with the SDK's own error, and the connection
        // stays usable.
        let refused = client.login_user("root", "not-the-password").await;
        assert!(
            matches!(refused, Err(IggyError::InvalidCredentials)),
            "{refused:?}"
        );
        let identity = client
            .login_user("root", ROOT_PASSWORD)
            .await
            .expect("login with the root password");
        assert_eq!(identity.user_id, root_id);
        client.ping().await.expect("ping after login");

        // A command the appliance does not serve gets an answer, not a dropped
        // connection: FeatureUnavailable.
        let unsupported = client
            .snapshot(
                iggy::prelude::SnapshotCompression::Stored,
                vec![iggy::prelude::SystemSnapshotType::Test],
            )
            .await;
        assert!(
            matches!(unsupported, Err(IggyError::FeatureUnavailable)),
            "{unsupported:?}"
        );
        client.ping().await.expect("the connection survives it");

        client.logout_user().await.expect("logout");
        client
            .login_user("root", ROOT_PASSWORD)
            .await
            .expect("a second login on the same client");
        client.logout_user().await.expect("second logout");
    });
    // Every command code the appliance does not serve gets FeatureUnavailable (the
    // SDK's "feature unavailable"), body and all: snapshot, describe options, flush.
    let mut raw = logged_in(&files, 0x5e);
    for code in [11, 13, 102] {
        let reply = raw.read(code, &[1, 2, 3]).expect("read");
        assert_eq!(reply.status(), Status::FeatureUnavailable, "code {code}");
    }
    // The refusals are counted.
    assert_eq!(rejected(&files, 0, "login_failed", 1), 1);
    assert!(rejected(&files, 0, "command_unsupported", 1) >= 1);
    assert_eq!(daemon.terminate(Duration::from_secs(20)), Some(0));
}

#[test]
fn the_sdk_finds_the_leader_of_a_three_node_cluster_and_moves_to_it() {
    const NODES: usize = 3;
    let files = ClusterFiles::new(NODES);
    let mut daemons = cluster(&files);
    runtime().block_on(async {
        // Every node answers with the same roster: each node's client address, one
        // leader, every node reachable (once the links are up).
        let mut leader = None;
        for _ in 0..100 {
            let client = root_client(&files, 0).await;
            let metadata = client.get_cluster_metadata().await.expect("metadata");
            assert_eq!(metadata.nodes.len(), NODES);
            for (replica, node) in metadata.nodes.iter().enumerate() {
                let addr = files.client_addr(replica);
                assert_eq!(node.ip, addr.ip().to_string());
                assert_eq!(node.endpoints.tcp, addr.port());
            }
            let leaders: Vec<usize> = (0..NODES)
                .filter(|r| metadata.nodes[*r].role == ClusterNodeRole::Leader)
                .collect();
            let healthy = metadata
                .nodes
                .iter()
                .all(|n| n.status == ClusterNodeStatus::Healthy);
            if leaders.len() == 1 && healthy {
                leader = Some(leaders[0]);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let leader = leader.expect("one leader and every node healthy");
        // A client that dials a follower is moved to the leader by the SDK itself.
        let follower = (leader + 1) % NODES;
        let client = node_client(&files, follower);
        client.connect().await.expect("connect");
        client
            .login_user("root", ROOT_PASSWORD)
            .await
            .expect("login through a follower");
        let info = client.get_connection_info().await;
        assert_eq!(
            info.server_address,
            files.client_addr(leader).to_string(),
            "redirected to the leader"
        );
        client.ping().await.expect("ping at the leader");
        client.logout_user().await.expect("logout");
    });
    for daemon in &mut daemons {
        assert_eq!(daemon.terminate(Duration::from_secs(20)), Some(0));
    }
}

#[test]
fn the_sdk_creates_lists_gets_and_deletes_streams() {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    // A topic with messages, written through the client library, so the SDK's view of
    // the stream has sizes to report.
    let mut library = appliance::client::Client::connect(
        &[files.client_addr(0)],
        appliance::client::ClientOptions::default(),
    )
    .expect("connect");
    library
        .login("root", ROOT_PASSWORD.as_bytes())
        .expect("login");
    let stream_id = runtime().block_on(async {
        let client = root_client(&files, 0).await;
        let created = client.create_stream("orders").await.expect("create");
        assert_eq!((created.name.as_str(), created.topics_count), ("orders", 0));
        assert!(created.created_at.as_micros() > 0);
        let duplicate = client.create_stream("orders").await;
        assert!(
            matches!(duplicate, Err(IggyError::StreamNameAlreadyExists(_))),
            "{duplicate:?}"
        );
        client
            .update_stream(
                &Identifier::numeric(created.id).expect("id"),
                "renamed",
                &Default::default(),
            )
            .await
            .expect("rename");
        let renamed = client
            .get_stream(&Identifier::named("renamed").expect("name"))
            .await
            .expect("get stream")
            .expect("found by its new name");
        assert_eq!(renamed.id, created.id);
        client
            .update_stream(
                &Identifier::named("renamed").expect("name"),
                "orders",
                &Default::default(),
            )
            .await
            .expect("rename back");
        created.id
    });
    let topic = library
        .create_topic(stream_id, "eu", 2)
        .expect("create topic");
    let key = replication::wire::PartitionKey {
        stream: stream_id,
        topic,
        partition: 1,
    };
    let mut builder = replication::wire::batch::BatchBuilder::with_capacity(4096);
    for id in 1..=10u128 {
        builder.push(replication::wire::batch::NewMessage {
            id,
            timestamp_delta: 0,
            payload: b"an order",
            user_headers: &[],
        });
    }
    library
        .send_messages(key, &builder.finish(0))
        .expect("send");
    runtime().block_on(async {
        let client = root_client(&files, 0).await;
        let streams = client.get_streams().await.expect("list");
        assert_eq!(streams.len(), 1);
        assert_eq!(
            (
                streams[0].id,
                streams[0].name.as_str(),
                streams[0].topics_count
            ),
            (stream_id, "orders", 1)
        );
        assert_eq!(streams[0].messages_count, 10);
        for identifier in [
            Identifier::numeric(stream_id).expect("id"),
            Identifier::named("orders").expect("name"),
        ] {
            let details = client
                .get_stream(&identifier)
                .await
                .expect("get")
                .expect("the stream exists");
            assert_eq!(details.id, stream_id);
            assert_eq!(details.topics.len(), 1);
            let eu = &details.topics[0];
            assert_eq!(
                (eu.id, eu.name.as_str(), eu.partitions_count),
                (topic, "eu", 2)
            );
            assert_eq!(eu.messages_count, 10);
            assert!(eu.size.as_bytes_u64() > 10 * 8, "{:?}", eu.size);
        }
        let missing = client
            .get_stream(&Identifier::named("missing").expect("name"))
            .await
            .expect("an answer");
        assert!(missing.is_none());
        client
            .delete_stream(&Identifier::named("orders").expect("name"))
            .await
            .expect("delete by name");
        assert!(client.get_streams().await.expect("list").is_empty());
        let gone = client
            .delete_stream(&Identifier::numeric(stream_id).expect("id"))
            .await;
        assert!(
            matches!(gone, Err(IggyError::StreamIdNotFound(_))),
            "{gone:?}"
        );
    });
    assert_eq!(daemon.terminate(Duration::from_secs(20)), Some(0));
}

#[test]
fn the_sdk_manages_topics_and_partitions_with_their_options() {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    runtime().block_on(async {
        let client = root_client(&files, 0).await;
        let stream = client.create_stream("orders").await.expect("stream");
        let stream_id = Identifier::named("orders").expect("name");
        let options = TopicCreateOptions {
            partitions_count: Some(2),
            message_expiry: Some(IggyExpiry::from(60_000_000u64)),
            max_topic_size: Some(MaxTopicSize::from(1u64 << 30)),
            ..Default::default()
        };
        let created = client
            .create_topic(&stream_id, "eu", &options)
            .await
            .expect("create topic");
        assert_eq!((created.name.as_str(), created.partitions_count), ("eu", 2));
        assert_eq!(created.partitions.len(), 2);
        assert_eq!(created.message_expiry, IggyExpiry::from(60_000_000u64));
        assert_eq!(created.max_topic_size, MaxTopicSize::from(1u64 << 30));
        let duplicate = client.create_topic(&stream_id, "eu", &options).await;
        assert!(
            matches!(duplicate, Err(IggyError::TopicNameAlreadyExists(..))),
            "{duplicate:?}"
        );
        // An option the appliance does not take is refused by name, nothing created.
        let segmented = TopicCreateOptions {
            segment_size: Some(IggyByteSize::from(1u64 << 20)),
            ..Default::default()
        };
        let refused = client.create_topic(&stream_id, "us", &segmented).await;
        assert!(
            matches!(refused, Err(IggyError::UnsupportedOptionKey(_))),
            "{refused:?}"
        );

        let topic_id = Identifier::named("eu").expect("name");
        client
            .create_partitions(&stream_id, &topic_id, 2)
            .await
            .expect("create partitions");
        client
            .delete_partitions(&stream_id, &topic_id, 1)
            .await
            .expect("delete a partition");
        let update = TopicUpdateOptions {
            message_expiry: Some(IggyExpiry::NeverExpire),
            ..Default::default()
        };
        client
            .update_topic(&stream_id, &topic_id, "eu", &update)
            .await
            .expect("update");
        let renamed = client
            .update_topic(&stream_id, &topic_id, "emea", &update)
            .await;
        assert!(
            matches!(renamed, Err(IggyError::FeatureUnavailable)),
            "{renamed:?}"
        );
        let details = client
            .get_topic(
                &Identifier::numeric(stream.id).expect("id"),
                &Identifier::numeric(created.id).expect("id"),
            )
            .await
            .expect("get")
            .expect("the topic exists");
        assert_eq!(details.partitions_count, 3);
        assert_eq!(details.partitions.len(), 3);
        assert_eq!(details.message_expiry, IggyExpiry::NeverExpire);
        assert_eq!(
            details.max_topic_size,
            MaxTopicSize::from(1u64 << 30),
            "kept"
        );
        let topics = client.get_topics(&stream_id).await.expect("list");
        assert_eq!(topics.len(), 1);
        assert_eq!((topics[0].id, topics[0].partitions_count), (created.id, 3));
        let missing = client
            .get_topic(&stream_id, &Identifier::named("us").expect("name"))
            .await
            .expect("an answer");
        assert!(missing.is_none());
        client
            .delete_topic(&stream_id, &topic_id)
            .await
            .expect("delete topic");
        assert!(client
            .get_topics(&stream_id)
            .await
            .expect("list")
            .is_empty());
    });
    assert_eq!(daemon.terminate(Duration::from_secs(20)), Some(0));
}

#[test]
fn a_node_formatted_with_iggys_default_credentials_serves_the_sdks_getting_started_flow() {
    let files = ClusterFiles::new(1);
    // A root user named other than the rules allow stops the format, nothing created.
    let refused = std::process::Command::new(binary())
        .arg("--config")
        .arg(files.config(0))
        .arg("--replica-id")
        .arg("0")
        .env("APPLIANCE_ROOT_USERNAME", "")
        .output()
        .expect("run the daemon");
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("APPLIANCE_ROOT_USERNAME"),
        "{refused:?}"
    );
    let mut daemon = Daemon::start_with_env(
        &files,
        0,
        &[
            ("APPLIANCE_ROOT_USERNAME", "iggy"),
            ("APPLIANCE_ROOT_PASSWORD", "iggy"),
        ],
    );
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    runtime().block_on(async {
        let client = sdk_client(&files);
        client.connect().await.expect("connect");
        client.login_user("iggy", "iggy").await.expect("iggy/iggy");
        client.create_stream("sample-stream").await.expect("stream");
        let stream = Identifier::named("sample-stream").expect("name");
        let topic = Identifier::named("sample-topic").expect("name");
        client
            .create_topic(&stream, "sample-topic", &TopicCreateOptions::default())
            .await
            .expect("topic");
        let mut messages: Vec<IggyMessage> = (0..10)
            .map(|i| IggyMessage::from(format!("message-{i}")))
            .collect();
        client
            .send_messages(
                &stream,
                &topic,
                &Partitioning::partition_id(0),
                &mut messages,
            )
            .await
            .expect("send");
        let polled = client
            .poll_messages(
                &stream,
                &topic,
                Some(0),
                &Consumer::new(Identifier::numeric(1).expect("id")),
                &PollingStrategy::next(),
                10,
                true,
            )
            .await
            .expect("poll");
        let payloads: Vec<String> = polled
            .messages
            .iter()
            .map(|m| m.payload_as_string().expect("text"))
            .collect();
        let sent: Vec<String> = (0..10).map(|i| format!("message-{i}")).collect();
        assert_eq!(payloads, sent);
    });
}
