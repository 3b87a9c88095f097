//! The official Apache Iggy Rust SDK (`iggy` 0.11.0) pointed at the harness's nodes.

#![allow(dead_code)]

use iggy::prelude::{Client as _, IggyClient, IggyMessage, UserClient};

use super::{wait_healthy, ClusterFiles, Daemon, ROOT_PASSWORD};

/// A client of the SDK for a node's client port (no automatic sign-in).
pub fn node_client(files: &ClusterFiles, replica: usize) -> IggyClient {
    IggyClient::builder()
        .with_tcp()
        .with_server_address(files.client_addr(replica).to_string())
        .build()
        .expect("the SDK builds a TCP client")
}

/// A connected SDK client of node `replica`, logged in as root.
pub async fn root_client(files: &ClusterFiles, replica: usize) -> IggyClient {
    let client = node_client(files, replica);
    client.connect().await.expect("connect");
    client
        .login_user("root", ROOT_PASSWORD)
        .await
        .expect("login");
    client
}

/// Every node of `files` started, each healthy.
pub fn cluster(files: &ClusterFiles) -> Vec<Daemon> {
    let mut daemons: Vec<Daemon> = (0..files.ports.len())
        .map(|r| Daemon::start(files, r))
        .collect();
    for daemon in &mut daemons {
        wait_healthy(files, daemon, std::time::Duration::from_secs(60));
    }
    daemons
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// `count` messages that all carry `payload` (shared, not copied).
pub fn repeated(payload: &bytes::Bytes, count: u32) -> Vec<IggyMessage> {
    (0..count)
        .map(|_| {
            IggyMessage::builder()
                .payload(payload.clone())
                .build()
                .expect("message")
        })
        .collect()
}
