//! The official Apache Iggy Rust SDK (`iggy` 0.11.0) as a client of a real single-node
//! daemon, through its own calls: the client port speaks Iggy's binary protocol.

mod common;

use std::time::Duration;

use common::*;
use iggy::prelude::{
    Client as _, ClusterClient, ClusterNodeRole, ClusterNodeStatus, IggyClient, IggyError,
    StreamClient, SystemClient, UserClient,
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
            let client = node_client(&files, 0);
            client.connect().await.expect("connect");
            client
                .login_user("root", ROOT_PASSWORD)
                .await
                .expect("login");
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
