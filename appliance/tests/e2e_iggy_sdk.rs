//! The official Apache Iggy Rust SDK (`iggy` 0.11.0) as a client of a real single-node
//! daemon, through its own calls: the client port speaks Iggy's binary protocol.

mod common;

use std::time::Duration;

use common::*;
use iggy::prelude::{
    Client as _, ClusterClient, ClusterNodeRole, ClusterNodeStatus, Identifier, IggyClient,
    IggyError, StreamClient, SystemClient, UserClient,
};

/// A client of the SDK for a node's client port (no automatic sign-in).
fn node_client(files: &ClusterFiles, replica: usize) -> IggyClient {
    IggyClient::builder()
        .with_tcp()
        .with_server_address(files.client_addr(replica).to_string())
        .build()
        .expect("the SDK builds a TCP client")
}

fn sdk_client(files: &ClusterFiles) -> IggyClient {
    node_client(files, 0)
}

/// A connected SDK client of node `replica`, logged in as root.
async fn root_client(files: &ClusterFiles, replica: usize) -> IggyClient {
    let client = node_client(files, replica);
    client.connect().await.expect("connect");
    client
        .login_user("root", ROOT_PASSWORD)
        .await
        .expect("login");
    client
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
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
        let unsupported = client.get_me().await;
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
    // The refusals are counted.
    assert_eq!(rejected(&files, 0, "login_failed", 1), 1);
    assert!(rejected(&files, 0, "command_unsupported", 1) >= 1);
    assert_eq!(daemon.terminate(Duration::from_secs(20)), Some(0));
}

#[test]
fn an_sdk_user_without_login_is_refused() {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    runtime().block_on(async {
        let client = sdk_client(&files);
        client.connect().await.expect("connect");
        // A write needs a session: the SDK refuses it before sending.
        let refused = client.create_stream("never-created").await;
        assert!(refused.is_err(), "{refused:?}");
        client.ping().await.expect("ping");
    });
    assert_eq!(daemon.terminate(Duration::from_secs(20)), Some(0));
}

#[test]
fn the_sdk_finds_the_leader_of_a_three_node_cluster_and_moves_to_it() {
    const NODES: usize = 3;
    let files = ClusterFiles::new(NODES);
    let mut daemons: Vec<Daemon> = (0..NODES).map(|r| Daemon::start(&files, r)).collect();
    for daemon in &mut daemons {
        wait_healthy(&files, daemon, Duration::from_secs(60));
    }
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
        let unsupported = client
            .update_stream(
                &Identifier::numeric(created.id).expect("id"),
                "renamed",
                &Default::default(),
            )
            .await;
        assert!(
            matches!(unsupported, Err(IggyError::FeatureUnavailable)),
            "{unsupported:?}"
        );
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
