//! A node that lost its disk never costs the cluster an acknowledged write: three real
//! `appliance` processes on 127.0.0.1. Backup S is down while the quorum {P, W} of the
//! partition acknowledges 20,000 messages; then P and W die and one of them comes back
//! with an empty data directory next to S. The two may not serve (the one that lost its
//! disk does not vote, and S never had the messages); once the other member of the
//! quorum returns, the cluster serves again and every node reads back every acknowledged
//! message.

mod common;

use std::time::{Duration, Instant};

use appliance::client::{Client, ClientOptions, RetryPolicy};
use appliance::protocol::{Consumer, PollStrategy};
use common::*;
use replication::wire::PartitionKey;

const NODES: usize = 3;
const BATCHES: u64 = 200;
const PER_BATCH: usize = 100;
const SIZE: usize = 64;

/// The partition's primary, as the nodes that answer agree on it.
fn partition_primary(files: &ClusterFiles, key: PartitionKey) -> usize {
    let name = format!("{}/{}/{}", key.stream, key.topic, key.partition);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for replica in 0..NODES {
            let Some((200, body)) = http_get(files.http_addr(replica), "/stats") else {
                continue;
            };
            let stats: serde_json::Value = serde_json::from_str(&body).expect("/stats JSON");
            let groups = stats["groups"].as_array().cloned().unwrap_or_default();
            for group in groups {
                if group["name"] == name.as_str()
                    && group["status"] == "normal"
                    && group["is_primary"] == true
                {
                    return replica;
                }
            }
        }
        assert!(Instant::now() < deadline, "no primary of {name}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every message node `replica` alone serves: (offset, id, payload).
fn read_all(files: &ClusterFiles, replica: usize, key: PartitionKey) -> Vec<(u64, u128, Vec<u8>)> {
    let Ok(mut client) = Client::connect(&[files.client_addr(replica)], ClientOptions::default())
    else {
        return Vec::new();
    };
    if client.login("root", ROOT_PASSWORD.as_bytes()).is_err() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut next = 0u64;
    loop {
        let Ok(body) =
            client.poll_messages(key, Consumer::Single(1), PollStrategy::Offset(next), 10_000)
        else {
            return out;
        };
        let Ok(batches) = appliance::protocol::reply::split_poll_body(&body) else {
            return out;
        };
        let before = out.len();
        for (bytes, _) in batches {
            if replication::wire::batch::verify(bytes).is_err() {
                return out;
            }
            for message in replication::wire::batch::messages(bytes) {
                if message.offset >= next {
                    out.push((message.offset, message.id, message.payload.to_vec()));
                    next = message.offset + 1;
                }
            }
        }
        if out.len() == before {
            return out;
        }
    }
}

/// The messages `numbered_batch` made for batches 0..BATCHES, as a reader sees them.
fn expected() -> Vec<(u64, u128, Vec<u8>)> {
    let mut out = Vec::new();
    for b in 0..BATCHES {
        let batch = numbered_batch(b * PER_BATCH as u64, PER_BATCH, SIZE);
        for message in replication::wire::batch::messages(&batch) {
            let offset = b * PER_BATCH as u64 + message.offset;
            out.push((offset, message.id, message.payload.to_vec()));
        }
    }
    out
}

/// A client that gives up after a few seconds (used to show that writes are refused).
fn impatient_client(files: &ClusterFiles, replicas: &[usize]) -> Option<Client> {
    let options = ClientOptions {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(2),
        retry: RetryPolicy {
            attempts_max: 2,
            total_timeout: Duration::from_secs(5),
            ..RetryPolicy::default()
        },
        ..ClientOptions::default()
    };
    let addrs: Vec<_> = replicas.iter().map(|r| files.client_addr(*r)).collect();
    let mut client = Client::connect(&addrs, options).ok()?;
    client.login("root", ROOT_PASSWORD.as_bytes()).ok()?;
    Some(client)
}

/// Group statuses of node `replica`: (name, status, voter).
fn group_states(files: &ClusterFiles, replica: usize) -> Vec<(String, String, bool)> {
    let Some((_, body)) = http_get(files.http_addr(replica), "/stats") else {
        return Vec::new();
    };
    let Ok(stats) = serde_json::from_str::<serde_json::Value>(&body) else {
        return Vec::new();
    };
    stats["groups"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|g| {
            (
                g["name"].as_str().unwrap_or("").to_string(),
                g["status"].as_str().unwrap_or("").to_string(),
                g["voter"].as_bool().unwrap_or(true),
            )
        })
        .collect()
}

/// The scenario; `wipe_primary` picks whether the node that loses its disk is the
/// partition's primary P or its backup W.
fn lost_disk_scenario(wipe_primary: bool) {
    let files = ClusterFiles::new(NODES);
    let (mut daemons, keys) = start_with_topic(&files, &[], 1);
    let key = keys[0];
    let p = partition_primary(&files, key);
    let (w, s) = ((p + 1) % NODES, (p + 2) % NODES);
    daemons[s].kill();
    // 20,000 messages acknowledged by {P, W}.
    let mut client = library_client(&files, &[p, w]);
    for b in 0..BATCHES {
        let batch = numbered_batch(b * PER_BATCH as u64, PER_BATCH, SIZE);
        let reply = client.send_messages(key, &batch).expect("acknowledged");
        assert_eq!(reply.base_offset, b * PER_BATCH as u64, "batch {b}");
    }
    drop(client);
    let (wiped, other) = if wipe_primary { (p, w) } else { (w, p) };
    daemons[p].kill();
    daemons[w].kill();
    std::fs::remove_dir_all(files.data_dir(wiped)).expect("delete the data directory");
    daemons[wiped] = Daemon::start(&files, wiped);
    daemons[s] = Daemon::start(&files, s);
    // The node with the new disk and the one that never had the messages: no view forms.
    std::thread::sleep(Duration::from_secs(6));
    let states = group_states(&files, wiped);
    assert!(
        states
            .iter()
            .any(|(name, status, voter)| name == "metadata" && status == "recovering" && !voter),
        "node {wiped} with a new disk shows its metadata group recovering: {states:?}"
    );
    assert!(
        http_get(files.http_addr(wiped), "/health").is_some_and(|(code, _)| code == 503),
        "node {wiped} reports healthy while it may not vote"
    );
    if let Some(mut client) = impatient_client(&files, &[wiped, s]) {
        let batch = numbered_batch(1_000_000, 10, SIZE);
        assert!(
            client.send_messages(key, &batch).is_err(),
            "a write was acknowledged by a node without its data and one without the messages"
        );
    }
    let log = log_of(&files.log(wiped));
    assert!(
        log.contains("may not vote"),
        "the log of node {wiped} says why it waits"
    );
    // The other member of the quorum returns: the cluster serves again.
    daemons[other] = Daemon::start(&files, other);
    for daemon in &mut daemons {
        wait_healthy(&files, daemon, Duration::from_secs(120));
    }
    let want = expected();
    for replica in 0..NODES {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = read_all(&files, replica, key);
            if got == want {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {replica} serves {} of {} acknowledged messages{}",
                got.len(),
                want.len(),
                if got.len() <= want.len() && got[..] == want[..got.len()] {
                    " (a prefix)"
                } else {
                    " (diverged)"
                }
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // Writes go on after every acknowledged message.
    let mut client = library_client(&files, &[0, 1, 2]);
    let batch = numbered_batch(BATCHES * PER_BATCH as u64, PER_BATCH, SIZE);
    let reply = client
        .send_messages(key, &batch)
        .expect("write after recovery");
    assert_eq!(reply.base_offset, BATCHES * PER_BATCH as u64);
    for (replica, daemon) in daemons.iter_mut().enumerate() {
        assert_eq!(
            daemon.terminate(Duration::from_secs(30)),
            Some(0),
            "node {replica} exits cleanly"
        );
    }
}

#[test]
fn a_wiped_backup_and_a_stale_one_wait_for_the_primary_and_lose_nothing() {
    lost_disk_scenario(false);
}

#[test]
fn a_wiped_old_primary_and_a_stale_backup_wait_for_the_backup_and_lose_nothing() {
    lost_disk_scenario(true);
}
