//! Three real `appliance` processes on 127.0.0.1. Backups forward sessions and redirect
//! writes to the primary, committed metadata reaches every node, a SIGKILLed primary is
//! replaced by a view change, a write retried with the same request number is applied
//! exactly once, and the old primary restarts and catches up.

mod common;

use appliance::protocol::reply::{ClusterMetadataReply, PRIMARY_UNKNOWN};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use replication::wire::Operation;

const NODES: usize = 3;

/// Starts every node and waits until each is healthy.
fn start_healthy(files: &ClusterFiles) -> Vec<Daemon> {
    let mut daemons: Vec<Daemon> = (0..NODES).map(|r| Daemon::start(files, r)).collect();
    for daemon in &mut daemons {
        wait_healthy(files, daemon, Duration::from_secs(60));
    }
    daemons
}

/// Stream names a node lists (empty on any error).
fn streams(files: &ClusterFiles, replica: usize, id: u128) -> Vec<String> {
    let Ok(mut client) = Client::connect(files.client_addr(replica), id) else {
        return Vec::new();
    };
    if !client
        .login("root", ROOT_PASSWORD)
        .is_ok_and(|r| r.status() == Status::Ok)
    {
        return Vec::new();
    }
    let Ok(reply) = client.read(3, &[]) else {
        return Vec::new();
    };
    if reply.status() != Status::Ok || reply.body.len() < 4 {
        return Vec::new();
    }
    let count = u32_at(&reply.body, 0) as usize;
    let mut names = Vec::new();
    let mut at = 4;
    for _ in 0..count {
        let len = reply.body[at + 4] as usize;
        names.push(String::from_utf8_lossy(&reply.body[at + 5..at + 5 + len]).to_string());
        at += 5 + len + 4;
    }
    names
}

fn wait_streams(files: &ClusterFiles, replica: usize, want: &[&str], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let names = streams(files, replica, 0x5000 + replica as u128);
        if names == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {replica} lists {names:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `replica`'s /stats shows every peer link up (a backup forwards sessions
/// only over a connected link; before that it redirects).
fn wait_peers_connected(files: &ClusterFiles, replica: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let peers = stats(files, replica)["peers"].clone();
        let up = peers.as_array().map_or(0, |p| {
            p.iter()
                .filter(|p| p["connected"].as_bool() == Some(true))
                .count()
        });
        if up == NODES - 1 {
            return;
        }
        assert!(Instant::now() < deadline, "node {replica} peers: {peers}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends the write (fixed request number) to each live node in turn until one answers
/// Ok; follows NotPrimary, retries Unavailable, PipelineFull and connection failures.
/// One client write: who sends it, under which session and request number.
struct Write<'a> {
    id: u128,
    session: u64,
    request: u64,
    operation: Operation,
    body: &'a [u8],
}

fn write_somewhere(
    files: &ClusterFiles,
    live: &[usize],
    write: Write<'_>,
    within: Duration,
) -> Reply {
    let Write {
        id,
        session,
        request,
        operation,
        body,
    } = write;
    let deadline = Instant::now() + within;
    let mut last = String::new();
    while Instant::now() < deadline {
        for &replica in live {
            let Ok(mut client) = Client::connect(files.client_addr(replica), id) else {
                continue;
            };
            let _ = client.stream.set_read_timeout(Some(Duration::from_secs(3)));
            if !client
                .login("root", ROOT_PASSWORD)
                .is_ok_and(|r| r.status() == Status::Ok)
            {
                continue;
            }
            client.session = session;
            match client.call(operation as u8, 0, request, body) {
                Ok(reply) if reply.status() == Status::Ok => return reply,
                Ok(reply) => last = format!("node {replica}: status {:?}", reply.status()),
                Err(e) => last = format!("node {replica}: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("no node accepted the write within {within:?}; last: {last}");
}

/// The metadata primary every node reports (ClusterMetadata), once they agree.
fn agreed_primary(files: &ClusterFiles, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    // The same answer from every node on consecutive polls spanning more than the
    // 500 ms heartbeat timeout: right after start a backup whose links came up late may
    // still time out and move the cluster to the next view.
    let mut stable: Option<(usize, u32)> = None;
    loop {
        let mut seen = Vec::new();
        for replica in 0..NODES {
            let Ok(mut client) = Client::connect(files.client_addr(replica), 0x9000) else {
                continue;
            };
            if !client
                .login("root", ROOT_PASSWORD)
                .is_ok_and(|r| r.status() == Status::Ok)
            {
                continue;
            }
            if let Ok(reply) = client.read(2, &[]) {
                let metadata = ClusterMetadataReply::decode(&reply.body)
                    .ok()
                    .and_then(|m| m.groups.into_iter().find(|g| g.group == 1 << 63));
                if let Some(group) = metadata.filter(|g| g.primary != PRIMARY_UNKNOWN) {
                    seen.push(usize::from(group.primary));
                }
            }
        }
        if seen.len() == NODES && seen.iter().all(|p| *p == seen[0]) {
            stable = match stable {
                Some((primary, polls)) if primary == seen[0] => Some((primary, polls + 1)),
                _ => Some((seen[0], 1)),
            };
            if let Some((primary, 4)) = stable {
                return primary;
            }
        } else {
            stable = None;
        }
        assert!(Instant::now() < deadline, "no agreed primary: {seen:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn three_nodes_redirect_replicate_survive_a_primary_kill_and_catch_up() {
    let files = ClusterFiles::new(NODES);
    let mut daemons = start_healthy(&files);

    // The nodes may have changed views while their links came up: ask who leads.
    let primary = agreed_primary(&files, Duration::from_secs(30));
    let others: Vec<usize> = (0..NODES).filter(|r| *r != primary).collect();

    // A backup forwards Register, and redirects a write to the primary with its address.
    wait_peers_connected(&files, others[0]);
    let mut backup = Client::connect(files.client_addr(others[0]), 0x77).expect("connect");
    assert_eq!(
        backup.login("root", ROOT_PASSWORD).expect("login").status(),
        Status::Ok
    );
    assert_eq!(
        backup.register().expect("register").status(),
        Status::Ok,
        "forwarded"
    );
    let reply = backup
        .call(Operation::CreateStream as u8, 0, 1, &short("redirected"))
        .expect("reply");
    assert_eq!(reply.status(), Status::NotPrimary, "NotPrimary");
    assert_eq!(usize::from(reply.body[0]), primary, "primary id");
    let address = String::from_utf8_lossy(&reply.body[2..]).to_string();
    assert_eq!(address, files.client_addr(primary).to_string());

    // Register and write (a client retries on any node when the primary moves).
    let id = 0x1234;
    let all: Vec<usize> = (0..NODES).collect();
    let registered = write_somewhere(
        &files,
        &all,
        Write {
            id,
            session: 0,
            request: 0,
            operation: Operation::Register,
            body: &login_register_body("root", ROOT_PASSWORD),
        },
        Duration::from_secs(60),
    );
    let session = u64_at(&registered.body, REGISTER_SESSION_AT);
    write_somewhere(
        &files,
        &all,
        Write {
            id,
            session,
            request: 1,
            operation: Operation::CreateStream,
            body: &short("a"),
        },
        Duration::from_secs(60),
    );
    for replica in 0..NODES {
        wait_streams(&files, replica, &["a"], Duration::from_secs(20));
    }

    // The primary dies with a write in flight; the client retries the same request
    // number against the others until the new primary answers.
    let primary = agreed_primary(&files, Duration::from_secs(30));
    let others: Vec<usize> = (0..NODES).filter(|r| *r != primary).collect();
    let mut client = Client::connect(files.client_addr(primary), id).expect("connect");
    assert_eq!(
        client.login("root", ROOT_PASSWORD).expect("login").status(),
        Status::Ok
    );
    client.session = session;
    let frame = client.frame(Operation::CreateStream as u8, 0, 2, &short("b"));
    let _ = client.send_raw(frame.as_bytes());
    daemons[primary].kill();
    let reply = write_somewhere(
        &files,
        &others,
        Write {
            id,
            session,
            request: 2,
            operation: Operation::CreateStream,
            body: &short("b"),
        },
        Duration::from_secs(60),
    );
    assert_eq!(reply.header.request, 2);
    for &replica in &others {
        wait_streams(&files, replica, &["a", "b"], Duration::from_secs(20));
    }

    // The old primary restarts from its journal and catches up; a new write reaches all.
    daemons[primary] = Daemon::start(&files, primary);
    wait_streams(&files, primary, &["a", "b"], Duration::from_secs(60));
    write_somewhere(
        &files,
        &[0, 1, 2],
        Write {
            id,
            session,
            request: 3,
            operation: Operation::CreateStream,
            body: &short("c"),
        },
        Duration::from_secs(60),
    );
    for replica in 0..NODES {
        wait_streams(&files, replica, &["a", "b", "c"], Duration::from_secs(30));
    }
}

/// Messages of partition 0 of (stream, topic) a node serves from offset 0, in order.
fn poll_all(files: &ClusterFiles, replica: usize, stream: u32, topic: u32) -> Vec<Vec<u8>> {
    let Ok(mut client) = Client::connect(files.client_addr(replica), 0x6000) else {
        return Vec::new();
    };
    if !client
        .login("root", ROOT_PASSWORD)
        .is_ok_and(|r| r.status() == Status::Ok)
    {
        return Vec::new();
    }
    let mut out = Vec::new();
    loop {
        let body = poll_body(stream, topic, 0, out.len() as u64, 1000);
        let Ok(reply) = client.read(POLL, &body) else {
            return out;
        };
        // Past the header: partition id, current offset, messages count.
        if reply.status() != Status::Ok || reply.body.len() < 16 || u32_at(&reply.body, 12) == 0 {
            return out;
        }
        let mut at = 16;
        while at + 256 <= reply.body.len() {
            let length = u64_at(&reply.body, at + 32) as usize;
            let Some(one) = reply.body.get(at..at + length) else {
                return out;
            };
            for message in replication::wire::batch::messages(one) {
                if message.offset == out.len() as u64 {
                    out.push(message.payload.to_vec());
                }
            }
            at += length;
        }
    }
}

/// A write of client `id` to whichever node accepts it (`write_somewhere` over every
/// node): (request, operation, body, session) -> the Ok reply.
fn writer(files: &ClusterFiles, id: u128) -> impl Fn(u64, Operation, &[u8], u64) -> Reply + '_ {
    move |request, operation, body, session| {
        let all: Vec<usize> = (0..NODES).collect();
        write_somewhere(
            files,
            &all,
            Write {
                id,
                session,
                request,
                operation,
                body,
            },
            Duration::from_secs(60),
        )
    }
}

/// A 3-node cluster with a session of client `id`, a stream `name` and a one-partition
/// topic in it: the daemons, the session, the stream and the topic ids.
fn cluster_with_topic(files: &ClusterFiles, id: u128, name: &str) -> (Vec<Daemon>, u64, u32, u32) {
    let mut daemons: Vec<Daemon> = (0..NODES).map(|r| Daemon::start(files, r)).collect();
    for daemon in &mut daemons {
        wait_healthy(files, daemon, Duration::from_secs(60));
    }
    let write = writer(files, id);
    let register = login_register_body("root", ROOT_PASSWORD);
    let session = u64_at(
        &write(0, Operation::Register, &register, 0).body,
        REGISTER_SESSION_AT,
    );
    let stream = u32_at(
        &write(1, Operation::CreateStream, &short(name), session).body,
        0,
    );
    // No options: the server's retention defaults.
    let body = create_topic_body(stream, "t", 1u32);
    let topic = u32_at(&write(2, Operation::CreateTopic, &body, session).body, 0);
    (daemons, session, stream, topic)
}

/// Batch `b` of partition 0: four messages with payloads "{tag}{b}m{i}" and ids 4b+i+1;
/// the payloads and the SendMessages body.
fn numbered_batch(stream: u32, topic: u32, tag: &str, b: u64) -> (Vec<Vec<u8>>, Vec<u8>) {
    use replication::wire::batch::{BatchBuilder, NewMessage};
    let payloads: Vec<Vec<u8>> = (0..4)
        .map(|i| format!("{tag}{b}m{i}").into_bytes())
        .collect();
    let mut builder = BatchBuilder::with_capacity(256);
    for (i, p) in payloads.iter().enumerate() {
        builder.push(NewMessage {
            id: u128::from(b * 4 + i as u64 + 1),
            timestamp_delta: 0,
            payload: p,
            user_headers: &[],
        });
    }
    let body = send_body(stream, topic, 0, &builder.finish(1));
    (payloads, body)
}

#[test]
fn three_nodes_replicate_a_partition_and_every_node_serves_it() {
    let files = ClusterFiles::new(NODES);
    let id = 0x4321;
    let (mut daemons, session, stream, topic) = cluster_with_topic(&files, id, "s");
    let write = writer(&files, id);
    let batch = |b: u64| numbered_batch(stream, topic, "b", b);
    let mut expected = Vec::new();
    let mut partition_primary = 0;
    for b in 0..10u64 {
        let (payloads, body) = batch(b);
        expected.extend(payloads);
        let reply = write(3 + b, Operation::SendMessages, &body, session);
        assert_eq!(sent_offset(&reply.body), b * 4, "base offset of batch {b}");
        partition_primary = usize::from(reply.header.frame.replica);
    }

    // The partition's primary dies with a batch in flight; the retry (same request
    // number) on the others is applied exactly once.
    let others: Vec<usize> = (0..NODES).filter(|r| *r != partition_primary).collect();
    let (payloads, body) = batch(10);
    expected.extend(payloads);
    let mut client = Client::connect(files.client_addr(partition_primary), id).expect("connect");
    assert_eq!(
        client.login("root", ROOT_PASSWORD).expect("login").status(),
        Status::Ok
    );
    client.session = session;
    let frame = client.frame(Operation::SendMessages as u8, 0, 13, &body);
    let _ = client.send_raw(frame.as_bytes());
    daemons[partition_primary].kill();
    let reply = write_somewhere(
        &files,
        &others,
        Write {
            id,
            session,
            request: 13,
            operation: Operation::SendMessages,
            body: &body,
        },
        Duration::from_secs(60),
    );
    assert_eq!(sent_offset(&reply.body), 40);
    for b in 11..14u64 {
        let (payloads, body) = batch(b);
        expected.extend(payloads);
        let reply = write_somewhere(
            &files,
            &others,
            Write {
                id,
                session,
                request: 3 + b,
                operation: Operation::SendMessages,
                body: &body,
            },
            Duration::from_secs(60),
        );
        assert_eq!(sent_offset(&reply.body), b * 4, "base offset of batch {b}");
    }
    // The old primary restarts and catches up from its peers.
    daemons[partition_primary] = Daemon::start(&files, partition_primary);
    for replica in 0..NODES {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let got = poll_all(&files, replica, stream, topic);
            if got == expected {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node {replica} serves {} of {} messages",
                got.len(),
                expected.len()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // It caught up by journal repair, and /stats says so on both sides.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let restarted = stats(&files, partition_primary)["repair"].clone();
        let served: u64 = others
            .iter()
            .map(|r| {
                stats(&files, *r)["repair"]["prepares_served"]
                    .as_u64()
                    .unwrap_or(0)
            })
            .sum();
        let sent = restarted["requests_sent"].as_u64().unwrap_or(0);
        let received = restarted["prepares_received"].as_u64().unwrap_or(0);
        if sent > 0 && received > 0 && served > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "repair figures: restarted node {restarted}, served by the others {served}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn every_node_killed_at_once_restarts_with_every_acknowledged_batch() {
    let files = ClusterFiles::new(NODES);
    let id = 0x7777;
    let (mut daemons, session, stream, topic) = cluster_with_topic(&files, id, "k");
    let write = writer(&files, id);
    let batch = |b: u64| numbered_batch(stream, topic, "k", b);
    // The first batch finds the partition's primary; the rest go to it on one
    // connection (spanning several checkpoints: one a second).
    let mut expected = Vec::new();
    let (payloads, body) = batch(0);
    expected.extend(payloads);
    let reply = write(3, Operation::SendMessages, &body, session);
    let primary = usize::from(reply.header.frame.replica);
    let mut client = Client::connect(files.client_addr(primary), id).expect("connect");
    assert_eq!(
        client.login("root", ROOT_PASSWORD).expect("login").status(),
        Status::Ok
    );
    client.session = session;
    let started = Instant::now();
    let mut b = 1u64;
    while b < 300 || started.elapsed() < Duration::from_millis(2_500) {
        let (payloads, body) = batch(b);
        let reply = client
            .call(Operation::SendMessages as u8, 0, 3 + b, &body)
            .expect("reply");
        assert_eq!(reply.status(), Status::Ok, "batch {b}");
        assert_eq!(sent_offset(&reply.body), b * 4, "base offset of batch {b}");
        expected.extend(payloads);
        b += 1;
    }
    // Every node dies at once: acknowledged batches were durable on a quorum.
    for daemon in &mut daemons {
        daemon.kill();
    }
    let mut daemons = start_healthy(&files);
    // The cluster takes writes again, after every acknowledged batch.
    let (payloads, body) = batch(b);
    let reply = write(3 + b, Operation::SendMessages, &body, session);
    assert_eq!(
        sent_offset(&reply.body),
        b * 4,
        "the log continues after the restart"
    );
    expected.extend(payloads);
    for replica in 0..NODES {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = poll_all(&files, replica, stream, topic);
            if got == expected {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {replica} serves {} of {} messages after restarting every node{}",
                got.len(),
                expected.len(),
                if got.len() <= expected.len() && got[..] == expected[..got.len()] {
                    " (a prefix)"
                } else {
                    " (diverged)"
                }
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    for (replica, daemon) in daemons.iter_mut().enumerate() {
        assert_eq!(
            daemon.terminate(Duration::from_secs(30)),
            Some(0),
            "node {replica} exits cleanly"
        );
    }
    let checkpoints = (0..NODES)
        .filter(|r| {
            std::fs::read_dir(files.data_dir(*r).join("partitions"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|d| d.path().join("vsr-checkpoint").exists())
        })
        .count();
    assert_eq!(checkpoints, NODES, "every node checkpointed the partition");
}

#[test]
fn register_and_logout_through_a_backup_are_forwarded_to_the_primary() {
    let files = ClusterFiles::new(NODES);
    let _daemons = start_healthy(&files);
    let primary = agreed_primary(&files, Duration::from_secs(60));
    let backup = (primary + 1) % NODES;
    wait_peers_connected(&files, backup);
    let id = 0xf0f0;
    let mut client = Client::connect(files.client_addr(backup), id).expect("connect");
    let _ = client
        .stream
        .set_read_timeout(Some(Duration::from_secs(20)));
    assert_eq!(
        client.login("root", ROOT_PASSWORD).expect("login").status(),
        Status::Ok
    );
    let reply = client.register().expect("register reply");
    assert_eq!(
        reply.status(),
        Status::Ok,
        "Register through a backup: {:?}",
        reply.body
    );
    // After the empty result section (4 bytes) and the user id (4): the session.
    let session = u64_at(&reply.body, 8);
    assert!(session > 0);
    // The session is the cluster's: the primary accepts a write under it at once.
    let mut on_primary = Client::connect(files.client_addr(primary), id).expect("connect");
    assert_eq!(
        on_primary
            .login("root", ROOT_PASSWORD)
            .expect("login")
            .status(),
        Status::Ok
    );
    on_primary.session = session;
    let reply = on_primary
        .call(Operation::CreateStream as u8, 0, 1, &short("fwd"))
        .expect("reply");
    assert_eq!(
        reply.status(),
        Status::Ok,
        "write under the forwarded session"
    );
    // A backup still redirects ordinary writes.
    client.session = session;
    let reply = client
        .call(Operation::CreateStream as u8, 0, 2, &short("other"))
        .expect("reply");
    assert_eq!(
        reply.status(),
        Status::NotPrimary,
        "NotPrimary from the backup"
    );
    // Logout through the backup ends the session everywhere.
    let reply = client
        .call(Operation::Logout as u8, 0, 2, &[])
        .expect("reply");
    assert_eq!(reply.status(), Status::Ok, "Logout through a backup");
    let frame = on_primary.frame(Operation::CreateStream as u8, 0, 3, &short("late"));
    on_primary.send_raw(frame.as_bytes()).expect("send");
    let evicted = on_primary.read_reply().expect("a frame");
    assert_eq!(
        evicted.header.frame.command,
        replication::wire::Command::Eviction as u8,
        "the session ended by the forwarded Logout is evicted"
    );
    let log = log_of(&files.log(primary));
    assert!(!log.contains("panicked"), "primary log: {log}");
}

/// A commit's reply goes only to a connection on which that request waits. Client `id`
/// sends a write to the primary while both backups are stopped (no quorum), then reads
/// on a second connection with the same client id; once the write commits, the second
/// connection's next frame answers its own read (a reply it never asked for would be
/// read as its next request's answer), and the retried write gets the one cached reply.
#[test]
fn a_reply_goes_only_where_its_request_waits() {
    let files = ClusterFiles::new(NODES);
    let daemons = start_healthy(&files);
    let primary = agreed_primary(&files, Duration::from_secs(60));
    let id = 0xa11e;
    let mut writing = logged_in_at(&files, primary, id);
    let backups: Vec<usize> = (0..NODES).filter(|r| *r != primary).collect();
    for backup in &backups {
        // SAFETY: a signal to a child process this test started.
        unsafe { libc::kill(daemons[*backup].pid(), libc::SIGSTOP) };
    }
    let create = writing.frame(Operation::CreateStream as u8, 0, 1, &short("awaited"));
    writing.send_raw(create.as_bytes()).expect("send");
    let mut reading = Client::connect(files.client_addr(primary), id).expect("connect");
    assert_eq!(
        reading
            .login("root", ROOT_PASSWORD)
            .expect("login")
            .status(),
        Status::Ok
    );
    assert_eq!(
        reading.read(3, &[]).expect("list streams").status(),
        Status::Ok
    );
    std::thread::sleep(Duration::from_millis(200));
    for backup in &backups {
        // SAFETY: as above.
        unsafe { libc::kill(daemons[*backup].pid(), libc::SIGCONT) };
    }
    wait_streams(&files, primary, &["awaited"], Duration::from_secs(30));
    let frame = reading.frame(NON_REPLICATED, 3, 0, &[]);
    reading.send_raw(frame.as_bytes()).expect("send");
    let next = reading.read_reply().expect("a frame");
    assert_eq!(
        (next.header.request, next.header.operation, next.status()),
        (0, NON_REPLICATED, Status::Ok),
        "the reading connection's next frame answers its read"
    );
    // The write's retry gets the reply the client table keeps, applied once.
    let retried = writing
        .call(Operation::CreateStream as u8, 0, 1, &short("awaited"))
        .expect("retried write");
    assert_eq!(
        retried.status(),
        Status::Ok,
        "the cached reply: {:?}",
        retried.body
    );
    assert_eq!(streams(&files, primary, 0xa11f), ["awaited"]);
    let log = log_of(&files.log(primary));
    assert!(!log.contains("panicked"), "primary log: {log}");
}

/// A primary that loses its primacy while a client waits on it answers that client
/// once the write commits in the new view. With both backups stopped the metadata
/// primary prepares a write and sends it down the chain, then its replica-plane links
/// are cut, so the backups receive the prepare but their acknowledgements never reach
/// it. They elect another primary, which commits the write; when the old primary's
/// links come back it learns the new view and commits the write as a backup, and the
/// client waiting on it gets its reply (without that, nothing: the client would wait
/// for its own timeout).
#[test]
fn a_primary_replaced_while_a_write_waits_answers_it_once_it_commits() {
    let files = ClusterFiles::new(NODES);
    let gates = gated_links(&files);
    let daemons = start_healthy(&files);
    let primary = agreed_primary(&files, Duration::from_secs(60));
    let mut writing = logged_in_at(&files, primary, 0xde70);
    let backups: Vec<usize> = (0..NODES).filter(|r| *r != primary).collect();
    for backup in &backups {
        // SAFETY: a signal to a child process this test started.
        unsafe { libc::kill(daemons[*backup].pid(), libc::SIGSTOP) };
    }
    let create = writing.frame(Operation::CreateStream as u8, 0, 1, &short("handed-over"));
    writing.send_raw(create.as_bytes()).expect("send");
    // The prepare reaches the stopped backups' sockets; then the primary is cut off.
    std::thread::sleep(Duration::from_millis(300));
    gates[primary].store(false, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(100));
    for backup in &backups {
        // SAFETY: as above.
        unsafe { libc::kill(daemons[*backup].pid(), libc::SIGCONT) };
    }
    for backup in &backups {
        wait_streams(&files, *backup, &["handed-over"], Duration::from_secs(30));
    }
    gates[primary].store(true, Ordering::SeqCst);
    let rejoined = Instant::now();
    writing
        .stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    let reply = writing
        .read_reply()
        .expect("the replaced primary answers the write that waits on it");
    assert_eq!(
        (reply.header.request, reply.header.operation, reply.status()),
        (1, Operation::CreateStream as u8, Status::Ok),
        "the write's own reply, {:.1} s after the old primary's links came back",
        rejoined.elapsed().as_secs_f64()
    );
    assert_ne!(
        agreed_primary(&files, Duration::from_secs(30)),
        primary,
        "the old primary was replaced"
    );
    assert_eq!(streams(&files, primary, 0xde71), ["handed-over"]);
    let log = log_of(&files.log(primary));
    assert!(!log.contains("panicked"), "the old primary's log: {log}");
}

/// A write prepared by a primary that is cut off before the write leaves it is
/// discarded by the view change that replaces it; when its links come back and it
/// learns the new view, the client waiting on it is answered Unavailable at once (not
/// left to its own timeout), and its retry under the same number, at the new primary,
/// is applied once.
#[test]
fn a_write_discarded_by_a_view_change_is_answered_unavailable_and_its_retry_applies_once() {
    let files = ClusterFiles::new(NODES);
    let gates = gated_links(&files);
    let _daemons = start_healthy(&files);
    let primary = agreed_primary(&files, Duration::from_secs(60));
    let id = 0xd15c;
    let mut writing = logged_in_at(&files, primary, id);
    gates[primary].store(false, Ordering::SeqCst);
    let create = writing.frame(Operation::CreateStream as u8, 0, 1, &short("retried"));
    writing.send_raw(create.as_bytes()).expect("send");
    // The other two elect a primary and commit a write of their own at that op.
    let backups: Vec<usize> = (0..NODES).filter(|r| *r != primary).collect();
    let mut others = library_client(&files, &backups);
    others.register().expect("register");
    others
        .create_stream("meanwhile")
        .expect("a stream through the new primary");
    gates[primary].store(true, Ordering::SeqCst);
    let rejoined = Instant::now();
    writing
        .stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    let reply = writing
        .read_reply()
        .expect("the old primary answers the write that waits on it");
    assert_eq!(
        (reply.header.request, reply.status()),
        (1, Status::Unavailable),
        "the discarded write's answer, {:.1} s after the old primary's links came back",
        rejoined.elapsed().as_secs_f64()
    );
    let new_primary = agreed_primary(&files, Duration::from_secs(30));
    assert_ne!(new_primary, primary, "the old primary was replaced");
    assert_eq!(streams(&files, new_primary, 0xd15d), ["meanwhile"]);
    // The client retries under the same number at the new primary: applied once.
    let mut retrying = Client::connect(files.client_addr(new_primary), id).expect("connect");
    assert_eq!(
        retrying
            .login("root", ROOT_PASSWORD)
            .expect("login")
            .status(),
        Status::Ok
    );
    retrying.session = writing.session;
    let retried = retrying
        .call(Operation::CreateStream as u8, 0, 1, &short("retried"))
        .expect("retried write");
    assert_eq!(retried.status(), Status::Ok, "{:?}", retried.body);
    for replica in 0..NODES {
        wait_streams(
            &files,
            replica,
            &["meanwhile", "retried"],
            Duration::from_secs(30),
        );
    }
    let log = log_of(&files.log(primary));
    assert!(!log.contains("panicked"), "the old primary's log: {log}");
}

/// Routes every replica-plane link through a proxy that the gate of either of its two
/// nodes can cut; the gates, all open, by node.
fn gated_links(files: &ClusterFiles) -> Vec<Arc<AtomicBool>> {
    let gates: Vec<Arc<AtomicBool>> = (0..NODES)
        .map(|_| Arc::new(AtomicBool::new(true)))
        .collect();
    route_links(files, |replica, peer| {
        let both = [gates[replica].clone(), gates[peer].clone()];
        let open = move || both.iter().all(|gate| gate.load(Ordering::SeqCst));
        proxy(files.ports[peer].tcp_replica, open, |_| {})
    });
    gates
}

/// Routes every replica-plane connection of the cluster through capturing proxies;
/// returns the capture.
fn capture_replica_plane(files: &ClusterFiles) -> std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
    let capture = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    route_links(files, |_, peer| {
        capturing_proxy(files.ports[peer].tcp_replica, capture.clone())
    });
    capture
}

/// Routes each replica-plane link, from `replica` to `peer`, through the port
/// `proxy(replica, peer)` gives it.
fn route_links(files: &ClusterFiles, mut proxy: impl FnMut(usize, usize) -> u16) {
    for peer in 0..NODES {
        for replica in (0..NODES).filter(|r| *r != peer) {
            let port = proxy(replica, peer);
            files.route_replica_plane(replica, peer, port);
        }
    }
}

#[test]
fn login_through_a_backup_never_sends_the_password_over_the_replica_plane() {
    let files = ClusterFiles::new(NODES);
    // Every replica-plane connection goes through a capturing proxy.
    let capture = capture_replica_plane(&files);
    let _daemons = start_healthy(&files);
    let primary = agreed_primary(&files, Duration::from_secs(60));
    let backup = (primary + 2) % NODES;
    wait_peers_connected(&files, backup);
    let id: u128 = 0x5eed_c0de_0000_0000_0000_0000_1234_5678;
    let mut client = Client::connect(files.client_addr(backup), id).expect("connect");
    let _ = client
        .stream
        .set_read_timeout(Some(Duration::from_secs(20)));
    assert_eq!(
        client
            .login("root", "not-the-password")
            .expect("reply")
            .status(),
        Status::InvalidCredentials
    );
    assert_eq!(
        client.login("root", ROOT_PASSWORD).expect("login").status(),
        Status::Ok
    );
    let reply = client.register().expect("register reply");
    assert_eq!(reply.status(), Status::Ok, "Register through the backup");
    let captured = capture.lock().expect("capture").clone();
    let contains = |needle: &[u8]| captured.windows(needle.len()).any(|w| w == needle);
    assert!(
        contains(&id.to_le_bytes()),
        "the forwarded Register crossed the proxies ({} bytes captured)",
        captured.len()
    );
    for secret in [ROOT_PASSWORD, "not-the-password"] {
        assert!(
            !contains(secret.as_bytes()),
            "{secret:?} crossed the replica plane"
        );
    }
}

#[test]
fn replica_plane_tls_encrypts_replication_and_keeps_out_a_foreign_certificate() {
    let files = ClusterFiles::new(NODES);
    let capture = capture_replica_plane(&files);
    // The cluster forms with one CA (a new cluster forms once every member started);
    // then node 2 comes back with a certificate from another CA.
    let cluster_ca = TestPki::new("cluster ca");
    let foreign_ca = TestPki::new("foreign ca");
    let configs: Vec<String> = (0..NODES)
        .map(|replica| std::fs::read_to_string(files.config(replica)).expect("config"))
        .collect();
    let with_tls = |replica: usize, pki: &TestPki| {
        let table = pki
            .leaf(files.dir.path(), &format!("node{replica}"), &["127.0.0.1"])
            .cluster_tls_table();
        std::fs::write(
            files.config(replica),
            format!("{}{table}", configs[replica]),
        )
        .expect("config");
    };
    for replica in 0..NODES {
        with_tls(replica, &cluster_ca);
    }
    let mut daemons: Vec<Daemon> = (0..NODES).map(|r| Daemon::start(&files, r)).collect();
    for daemon in daemons.iter_mut() {
        wait_healthy(&files, daemon, Duration::from_secs(60));
    }
    daemons[2].kill();
    with_tls(2, &foreign_ca);
    daemons[2] = Daemon::start(&files, 2);
    let secret_name = "tls-only-stream-name";
    let write = writer(&files, 0x715);
    let register = login_register_body("root", ROOT_PASSWORD);
    let session = u64_at(
        &write(0, Operation::Register, &register, 0).body,
        REGISTER_SESSION_AT,
    );
    write(1, Operation::CreateStream, &short(secret_name), session);
    for replica in 0..2 {
        wait_streams(&files, replica, &[secret_name], Duration::from_secs(30));
    }
    // The foreign node never joins: it learns nothing of the committed stream.
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        streams(&files, 2, 0x716).is_empty(),
        "a node with a foreign certificate received committed metadata"
    );
    let captured = capture.lock().expect("capture").clone();
    assert!(captured.len() > 1000, "replica traffic crossed the proxies");
    assert!(
        !captured
            .windows(secret_name.len())
            .any(|w| w == secret_name.as_bytes()),
        "the stream name crossed the replica plane in the clear"
    );
    assert_eq!(
        daemons[2]
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok())
            .flatten(),
        None
    );
}
