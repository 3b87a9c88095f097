//! One real `appliance` process: create a stream and a topic with 3 partitions, produce,
//! consume back in order, restart, and the data and metadata are still there. Bad client
//! input is answered or the connection closed, and the node keeps serving.

mod common;

use std::io::Read;
use std::time::Duration;

use appliance::protocol::reply::split_poll_body;
use appliance::protocol::request::OffsetTarget;
use appliance::protocol::{ClientRequest, Consumer, ReadCommand};
use common::*;
use replication::wire::batch::{self, BatchBuilder, NewMessage};
use replication::wire::{Operation, PartitionKey};

const PARTITIONS: u32 = 3;
const BATCHES: u64 = 20;
const PER_BATCH: u64 = 5;

fn payload(partition: u32, index: u64) -> Vec<u8> {
    format!("p{partition}-m{index}").into_bytes()
}

fn batch_for(partition: u32, first: u64) -> Vec<u8> {
    let mut builder = BatchBuilder::with_capacity(1024);
    let payloads: Vec<Vec<u8>> = (first..first + PER_BATCH)
        .map(|i| payload(partition, i))
        .collect();
    for (i, p) in payloads.iter().enumerate() {
        builder.push(NewMessage {
            id: u128::from(first + i as u64 + 1),
            timestamp_delta: 0,
            payload: p,
            user_headers: &[],
        });
    }
    builder.finish(1)
}

fn send(client: &mut Client, stream: u32, topic: u32, partition: u32, first: u64) -> Reply {
    let body = send_body(stream, topic, partition, &batch_for(partition, first));
    client
        .write(Operation::SendMessages, &body)
        .expect("send messages")
}

/// Polls a partition from offset 0 and returns every message payload in order.
fn consume(client: &mut Client, stream: u32, topic: u32, partition: u32) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut next = 0u64;
    loop {
        let body = poll_body(stream, topic, partition, next, 1000);
        let reply = client.read(POLL, &body).expect("poll");
        assert_eq!(reply.status(), Status::Ok, "poll status");
        let batches = split_poll_body(&reply.body).expect("verified batches");
        if batches.is_empty() {
            return out;
        }
        for (one, _) in batches {
            for message in batch::messages(one) {
                // Served from exactly the offset asked, in order.
                assert_eq!(message.offset, next, "partition {partition}");
                out.push((message.offset, message.payload.to_vec()));
                next = message.offset + 1;
            }
        }
    }
}

/// Creates stream `stream_name` and in it topic `topic_name` with `partitions`
/// partitions and the server's retention defaults; returns their ids.
fn create_topic(
    client: &mut Client,
    stream_name: &str,
    topic_name: &str,
    partitions: u32,
) -> (u32, u32) {
    let reply = client
        .write(Operation::CreateStream, &short(stream_name))
        .expect("create stream");
    assert_eq!(
        reply.status(),
        Status::Ok,
        "create stream: {:?}",
        reply.body
    );
    let stream = u32_at(&reply.body, 0);
    // No options: the server's retention defaults.
    let body = create_topic_body(stream, topic_name, partitions);
    let reply = client.write(Operation::CreateTopic, &body).expect("topic");
    assert_eq!(reply.status(), Status::Ok, "create topic: {:?}", reply.body);
    (stream, u32_at(&reply.body, 0))
}

#[test]
fn single_node_produces_consumes_and_keeps_data_across_a_restart() {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));

    let mut client = logged_in(&files, 0xc1);
    let (stream, topic) = create_topic(&mut client, "orders", "events", PARTITIONS);

    for partition in 0..PARTITIONS {
        for b in 0..BATCHES {
            let reply = send(&mut client, stream, topic, partition, b * PER_BATCH);
            assert_eq!(
                reply.status(),
                Status::Ok,
                "send: {:?}",
                String::from_utf8_lossy(&reply.body)
            );
            assert_eq!(sent_offset(&reply.body), b * PER_BATCH, "base offset");
            assert_eq!(u32_at(&reply.body, 12), partition, "partition");
        }
    }
    // A retry with the same request number is answered, not applied twice: the last
    // write again, with other bytes, gets the first reply.
    let last = client.request;
    let retried = send_body(
        stream,
        topic,
        PARTITIONS - 1,
        &batch_for(PARTITIONS - 1, 999),
    );
    let first_reply = |client: &mut Client, what: &str| {
        let retry = client
            .call(Operation::SendMessages as u8, 0, last, &retried)
            .expect(what);
        assert_eq!(retry.status(), Status::Ok, "{what}");
        assert_eq!(
            sent_offset(&retry.body),
            (BATCHES - 1) * PER_BATCH,
            "{what}"
        );
    };
    first_reply(&mut client, "retry");

    let check = |client: &mut Client| {
        for partition in 0..PARTITIONS {
            let messages = consume(client, stream, topic, partition);
            assert_eq!(
                messages.len() as u64,
                BATCHES * PER_BATCH,
                "partition {partition}"
            );
            for (i, (offset, bytes)) in messages.iter().enumerate() {
                assert_eq!(*offset, i as u64);
                assert_eq!(bytes, &payload(partition, i as u64));
            }
        }
    };
    check(&mut client);

    // Consumer offsets round-trip.
    let target = OffsetTarget::of(
        PartitionKey {
            stream,
            topic,
            partition: 1,
        },
        Consumer::Single(7),
    );
    let body = ClientRequest::StoreConsumerOffset {
        target: target.clone(),
        offset: 41,
    }
    .encode();
    let reply = client
        .write(Operation::StoreConsumerOffset, &body)
        .expect("store offset");
    assert_eq!(reply.status(), Status::Ok);

    // The partitions' checkpoint (once a second) covers the writes before the stop.
    std::thread::sleep(Duration::from_millis(2_500));
    let session = client.session;
    // Graceful stop: SIGTERM exits 0.
    assert_eq!(daemon.terminate(Duration::from_secs(20)), Some(0));
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));
    // A write retried after the restart, below the checkpoint, gets its first reply,
    // body included, from the checkpointed client table: applied once.
    let mut again = Client::connect(files.client_addr(0), 0xc1).expect("connect");
    let login = again.login("root", ROOT_PASSWORD).expect("login");
    assert_eq!(login.status(), Status::Ok);
    again.session = session;
    first_reply(&mut again, "retry after the restart");
    let mut client = logged_in(&files, 0xc2);
    let list = client.read(3, &[]).expect("list streams");
    assert_eq!(list.status(), Status::Ok);
    assert_eq!(u32_at(&list.body, 0), 1, "one stream after restart");
    check(&mut client);
    let body = ClientRequest::GetConsumerOffset { target }.encode();
    let offset = client
        .read(ReadCommand::GetConsumerOffset as u32, &body)
        .expect("get offset");
    assert_eq!(offset.status(), Status::Ok);
    // partition_id u32, current_offset u64, stored_offset u64.
    assert_eq!(u32_at(&offset.body, 0), 1);
    assert_eq!(u64_at(&offset.body, 12), 41);
    // Appends continue after the restored offsets.
    let reply = send(&mut client, stream, topic, 2, BATCHES * PER_BATCH);
    assert_eq!(reply.status(), Status::Ok);
    assert_eq!(sent_offset(&reply.body), BATCHES * PER_BATCH);

    // SIGKILL, restart: acknowledged data survives.
    daemon.kill();
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));
    let mut client = logged_in(&files, 0xc3);
    let messages = consume(&mut client, stream, topic, 2);
    assert_eq!(messages.len() as u64, (BATCHES + 1) * PER_BATCH);
}

#[test]
fn bad_client_input_is_answered_or_closed_and_the_node_keeps_serving() {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));

    // Not logged in.
    let mut anonymous = Client::connect(files.client_addr(0), 0xa1).expect("connect");
    let reply = anonymous.read(3, &[]).expect("reply");
    assert_eq!(reply.status(), Status::Unauthenticated, "unauthenticated");
    // Wrong password.
    let reply = anonymous.login("root", "wrong").expect("reply");
    assert_eq!(
        reply.status(),
        Status::InvalidCredentials,
        "invalid credentials"
    );

    let mut client = logged_in(&files, 0xa2);
    // Unknown operation, internal operation: InvalidRequest with the reason.
    for operation in [250u8, 64] {
        let frame = client.frame(operation, 0, 0, &[]);
        client.send_raw(frame.as_bytes()).expect("send");
        let reply = client.read_reply().expect("reply");
        assert_eq!(
            reply.status(),
            Status::InvalidRequest,
            "operation {operation}"
        );
        assert!(!reply.body.is_empty(), "a reason");
    }
    // A body that does not parse.
    let reply = client
        .write(Operation::CreateStream, &[200, 1])
        .expect("reply");
    assert_eq!(reply.status(), Status::InvalidRequest);
    // A batch that fails its checksum.
    let mut bad = BatchBuilder::with_capacity(64);
    bad.push(NewMessage {
        id: 1,
        timestamp_delta: 0,
        payload: b"x",
        user_headers: &[],
    });
    let mut bad = bad.finish(1);
    let end = bad.len() - 1;
    bad[end] ^= 0xff;
    let body = send_body(1, 1, 0, &bad);
    let reply = client.write(Operation::SendMessages, &body).expect("reply");
    assert_eq!(reply.status(), Status::InvalidRequest);

    // Garbage bytes, a replica command, an oversize frame: each connection is refused.
    let garbage = |bytes: Vec<u8>| {
        let mut bad = Client::connect(files.client_addr(0), 0xbad).expect("connect");
        bad.stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let _ = bad.send_raw(&bytes);
        let mut sink = Vec::new();
        // Closed (EOF or reset) rather than answered with a Reply.
        let result = bad.stream.read_to_end(&mut sink);
        let timed_out = matches!(
            &result,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
        );
        assert!(!timed_out, "the connection is closed, not left open");
    };
    garbage(vec![0xab; 4096]);
    let mut commit = [0u8; 256];
    commit[48..52].copy_from_slice(&256u32.to_le_bytes());
    commit[52] = 9; // wherever the command byte lives, this is not a Request
    commit[56] = 9;
    garbage(commit.to_vec());
    let mut huge = client
        .frame(Operation::CreateStream as u8, 0, 9, b"x")
        .as_bytes()
        .to_vec();
    huge[48..52].copy_from_slice(&(512u32 << 20).to_le_bytes());
    garbage(huge);

    // The node still serves the good client.
    let reply = client
        .write(Operation::CreateStream, &short("still-here"))
        .expect("create");
    assert_eq!(reply.status(), Status::Ok);
    std::thread::sleep(Duration::from_millis(300));
    let (code, stats) = http_get(files.http_addr(0), "/stats").expect("stats");
    assert_eq!(code, 200);
    eprintln!("{stats}");
    for reason in [
        "request_body_invalid",
        "login_failed",
        "unauthenticated",
        "batch_invalid",
        "operation_invalid",
        "command_invalid",
        "size_too_large",
    ] {
        assert!(stats.contains(reason), "{reason} counted in {stats}");
    }
}

/// Names of the streams node 0 lists.
fn stream_count(client: &mut Client) -> u32 {
    let reply = client.read(3, &[]).expect("list streams");
    assert_eq!(reply.status(), Status::Ok);
    u32_at(&reply.body, 0)
}

#[test]
fn metadata_checkpoints_let_the_journal_wrap_across_restarts() {
    // 16 MiB of 64 KiB slots: about 250 ops before the ring would wrap.
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));
    // A topic of many partitions: its CreateTopic reply body is over 4 KiB. It stays
    // client 0xc3's last write, below the checkpoint the streams below cause.
    let mut wide = logged_in(&files, 0xc3);
    let (stream, _) = create_topic(&mut wide, "wide", "many", 1);
    let wide_body = create_topic_body(stream, "partitions", 150);
    let wide_reply = wide
        .write(Operation::CreateTopic, &wide_body)
        .expect("create topic");
    assert_eq!(wide_reply.status(), Status::Ok);
    assert!(wide_reply.body.len() > 4096, "{}", wide_reply.body.len());
    let (wide_session, wide_request) = (wide.session, wide.request);
    let mut client = logged_in(&files, 0xc4);
    let mut request = 1;
    let mut create = |client: &mut Client, n: u64| {
        for _ in 0..n {
            let name = format!("s{request}");
            let reply = client
                .call(Operation::CreateStream as u8, 0, request, &short(&name))
                .expect("reply");
            assert_eq!(
                reply.status(),
                Status::Ok,
                "CreateStream {name}: {:?}",
                reply.body
            );
            request += 1;
        }
    };
    create(&mut client, 400);
    assert_eq!(stream_count(&mut client), 401);
    // SIGKILL: the node restarts from its checkpoint and the journal above it.
    daemon.kill();
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));
    let mut client = logged_in(&files, 0xc5);
    assert_eq!(stream_count(&mut client), 401);
    // The retried CreateTopic, older than the checkpoint, gets its first reply whole from
    // the checkpointed client table: the topic is not created twice.
    let mut again = Client::connect(files.client_addr(0), 0xc3).expect("connect");
    assert_eq!(
        again.login("root", ROOT_PASSWORD).expect("login").status(),
        Status::Ok
    );
    again.session = wide_session;
    let retry = again
        .call(Operation::CreateTopic as u8, 0, wide_request, &wide_body)
        .expect("retried create topic");
    assert_eq!(retry.status(), Status::Ok);
    assert_eq!(retry.body, wide_reply.body, "the whole first reply");
    create(&mut client, 300);
    assert_eq!(stream_count(&mut client), 701);
    let snapshots: Vec<_> = std::fs::read_dir(files.data_dir(0).join("snapshots"))
        .expect("snapshots folder")
        .flatten()
        .collect();
    assert_eq!(
        snapshots.len(),
        1,
        "older snapshots are removed: {snapshots:?}"
    );
    assert_eq!(daemon.terminate(Duration::from_secs(30)), Some(0));
    let log = log_of(&files.log(0));
    assert!(log.contains("metadata checkpoint"), "log: {log}");
}

#[test]
fn runtime_pin_cpus_pins_the_replica_executor_to_one_cpu() {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start_with_env(
        &files,
        0,
        &[
            ("APPLIANCE_RUNTIME__PIN_CPUS", "true"),
            ("APPLIANCE_RUNTIME__SPIN_BEFORE_PARK", "50us"),
        ],
    );
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));
    // The replica executor runs on the daemon's main thread.
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid()))
        .expect("status of the daemon");
    let cpus = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or("")
        .trim()
        .to_owned();
    assert!(
        cpus.parse::<usize>().is_ok(),
        "the replica executor is pinned to one CPU, not {cpus:?}"
    );
    // It still serves.
    let mut client = logged_in(&files, 0xd1);
    let reply = client
        .call(Operation::CreateStream as u8, 0, 1, &short("pinned"))
        .expect("reply");
    assert_eq!(reply.status(), Status::Ok);
}

#[test]
fn a_new_sessions_request_numbers_are_never_taken_for_an_old_sessions_retries() {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));
    let mut client = logged_in(&files, 0xe1);
    let stream = u32_at(
        &client
            .write(Operation::CreateStream, &short("s"))
            .expect("stream")
            .body,
        0,
    );
    // No options: the server's retention defaults.
    let body = create_topic_body(stream, "t", 1u32);
    let topic = u32_at(
        &client
            .write(Operation::CreateTopic, &body)
            .expect("topic")
            .body,
        0,
    );
    // Session 1 writes batches under request numbers 3 and 4.
    for first in [0, PER_BATCH] {
        let reply = send(&mut client, stream, topic, 0, first);
        assert_eq!(
            (reply.status(), sent_offset(&reply.body)),
            (Status::Ok, first)
        );
    }
    // The client registers again (e.g. after its session was lost) and numbers its
    // requests from 1: the same numbers are new writes of the new session, not retries
    // answered from the old session's cached replies.
    assert_eq!(client.register().expect("register").status(), Status::Ok);
    for (request, first) in [
        (1u64, 2 * PER_BATCH),
        (2, 3 * PER_BATCH),
        (3, 4 * PER_BATCH),
        (4, 5 * PER_BATCH),
    ] {
        let body = send_body(stream, topic, 0, &batch_for(0, first));
        let reply = client
            .call(Operation::SendMessages as u8, 0, request, &body)
            .expect("reply");
        assert_eq!(
            reply.status(),
            Status::Ok,
            "request {request} of the new session"
        );
        assert_eq!(
            reply.header.request, request,
            "the reply names the client's number"
        );
        assert_eq!(
            sent_offset(&reply.body),
            first,
            "request {request} was applied"
        );
    }
    let stored = consume(&mut client, stream, topic, 0);
    assert_eq!(
        stored.len() as u64,
        6 * PER_BATCH,
        "every write applied once"
    );
}

/// Every `vsr-checkpoint` under `dir` with its op, and whether any staged one is left.
fn partition_checkpoints(dir: &std::path::Path, found: &mut Vec<u64>, staged: &mut usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            partition_checkpoints(&path, found, staged);
        } else if path.file_name().is_some_and(|n| n == "vsr-checkpoint.tmp") {
            *staged += 1;
        } else if path.file_name().is_some_and(|n| n == "vsr-checkpoint") {
            let dir = path.parent().expect("a partition directory");
            if let Ok(Some(checkpoint)) = appliance::daemon::files::read_checkpoint(dir) {
                found.push(checkpoint.op);
            }
        }
    }
}

/// Tries `attempt` every `pause` until it succeeds; fails with its last error after
/// `within`.
fn eventually(within: Duration, pause: Duration, mut attempt: impl FnMut() -> Result<(), String>) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let Err(error) = attempt() else {
            return;
        };
        assert!(std::time::Instant::now() < deadline, "{error}");
        std::thread::sleep(pause);
    }
}

#[test]
fn a_round_of_many_partition_checkpoints_is_durable_across_a_kill() {
    // 40 partitions written at once need a checkpoint in the same second: one round,
    // sharing its file system syncs.
    const MANY: u32 = 40;
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));
    let mut client = logged_in(&files, 0xd1);
    let (stream, topic) = create_topic(&mut client, "many", "checkpointed", MANY);
    // Until every partition's checkpoint holds at least `op` (each batch is one op).
    let checkpointed = |op: u64| {
        eventually(Duration::from_secs(20), Duration::from_millis(100), || {
            let (mut found, mut staged) = (Vec::new(), 0);
            partition_checkpoints(&files.data_dir(0), &mut found, &mut staged);
            if found.len() == MANY as usize && found.iter().all(|o| *o >= op) {
                assert_eq!(staged, 0, "a staged checkpoint left after its round");
                return Ok(());
            }
            Err(format!("checkpoints at op {op}: {found:?}"))
        });
    };
    for round in 0..2 {
        for partition in 0..MANY {
            let reply = send(&mut client, stream, topic, partition, round * PER_BATCH);
            assert_eq!(reply.status(), Status::Ok, "send");
            assert_eq!(sent_offset(&reply.body), round * PER_BATCH);
        }
        checkpointed(round + 1);
    }
    // SIGKILL right after: the checkpoints and the batches above them are recovered.
    for partition in 0..MANY {
        let reply = send(&mut client, stream, topic, partition, 2 * PER_BATCH);
        assert_eq!(reply.status(), Status::Ok, "send");
    }
    daemon.kill();
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));
    let mut client = logged_in(&files, 0xd2);
    for partition in 0..MANY {
        // The partition groups start after the node is healthy: Unavailable until then.
        eventually(Duration::from_secs(30), Duration::from_millis(50), || {
            let body = poll_body(stream, topic, partition, 0, 1);
            let status = client.read(POLL, &body).expect("poll").status();
            if status == Status::Unavailable {
                return Err(format!("partition {partition} unavailable"));
            }
            assert_eq!(status, Status::Ok, "poll partition {partition}");
            Ok(())
        });
        let messages = consume(&mut client, stream, topic, partition);
        let want: Vec<(u64, Vec<u8>)> = (0..3 * PER_BATCH)
            .map(|i| (i, payload(partition, i)))
            .collect();
        assert_eq!(messages, want, "partition {partition}");
        let reply = send(&mut client, stream, topic, partition, 3 * PER_BATCH);
        assert_eq!(reply.status(), Status::Ok, "send after the restart");
        assert_eq!(sent_offset(&reply.body), 3 * PER_BATCH);
    }
    assert_eq!(daemon.terminate(Duration::from_secs(20)), Some(0));
}
