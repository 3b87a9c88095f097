//! Every client-plane limit against a real daemon: the newcomer past a limit
//! is refused with a clear error (a LimitReached reply naming the key, or a close counted
//! under its reason in /stats), and a session admitted before keeps being served. The
//! limits are set through `APPLIANCE_LIMITS__*` overrides, so the environment path of
//! the config is exercised too.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use replication::wire::{Frame, Header, Operation, RequestHeader};

const LIMIT_REACHED: Status = Status::LimitReached;

fn node(env: &[(&str, &str)]) -> (ClusterFiles, Daemon) {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start_with_env(&files, 0, env);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));
    (files, daemon)
}

fn logged_in(files: &ClusterFiles, id: u128) -> Client {
    let mut client = Client::connect(files.client_addr(0), id).expect("connect");
    let reply = client.login("root", ROOT_PASSWORD).expect("login");
    assert_eq!(reply.status(), Status::Ok, "login");
    client
}

fn registered(files: &ClusterFiles, id: u128) -> Client {
    let mut client = logged_in(files, id);
    let reply = client.register().expect("register");
    assert_eq!(reply.status(), Status::Ok, "register: {:?}", reply.body);
    client
}

/// The admitted session still gets a replicated write through.
fn still_served(client: &mut Client, name: &str) {
    let reply = client
        .write(Operation::CreateStream, &short(name))
        .expect("create stream");
    assert_eq!(
        reply.status(),
        Status::Ok,
        "admitted session refused: {:?}",
        reply.body
    );
}

/// Whether the server closed `stream` (EOF or reset) within a few seconds.
fn closed_by_server(stream: &mut TcpStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(error) => !matches!(
            error.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

fn request_frame(client: u128, request: u64, operation: Operation, body: &[u8]) -> Frame {
    let mut header = RequestHeader::new();
    header.client = client;
    header.request = request;
    header.operation = operation as u8;
    Frame::build(&header, body)
}

#[test]
fn connections_past_the_limit_are_closed_and_counted() {
    let (files, _daemon) = node(&[("APPLIANCE_LIMITS__CLIENT_CONNECTIONS_MAX", "3")]);
    let mut admitted = registered(&files, 1);
    let _second = TcpStream::connect(files.client_addr(0)).expect("second");
    let _third = TcpStream::connect(files.client_addr(0)).expect("third");
    std::thread::sleep(Duration::from_millis(200));
    let mut fourth = TcpStream::connect(files.client_addr(0)).expect("tcp connect");
    assert!(
        closed_by_server(&mut fourth),
        "the 4th connection stays open"
    );
    assert!(rejected(&files, 0, "client_connection_limit", 1) >= 1);
    still_served(&mut admitted, "after-connection-limit");
}

#[test]
fn requests_past_the_in_flight_limit_are_refused_with_the_key() {
    let (files, _daemon) = node(&[("APPLIANCE_LIMITS__REQUESTS_IN_FLIGHT_PER_SESSION", "2")]);
    // Three logins in one write, the node's first: the password checks take
    // milliseconds (a login of credentials that checked out lately takes none, so no
    // other client logs in first), so two are in flight when the third arrives.
    let mut greedy = Client::connect(files.client_addr(0), 2).expect("connect");
    let mut body = short("root");
    body.extend_from_slice(&short(ROOT_PASSWORD));
    body.extend_from_slice(&[0; 8]); // LoginUser: no version, no context
    let login = greedy.frame(NON_REPLICATED, 38, 0, &body);
    let three = [login.as_bytes(), login.as_bytes(), login.as_bytes()].concat();
    greedy.send_raw(&three).expect("send");
    let replies: Vec<Reply> = (0..3)
        .map(|_| greedy.read_reply().expect("reply"))
        .collect();
    let refused: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status() == LIMIT_REACHED)
        .collect();
    assert_eq!(refused.len(), 1, "{:?}", replies);
    assert_eq!(
        refused[0].body,
        b"limits.requests_in_flight_per_session".to_vec()
    );
    assert_eq!(
        replies.iter().filter(|r| r.status() == Status::Ok).count(),
        2
    );
    assert!(rejected(&files, 0, "requests_in_flight_limit", 1) >= 1);
    let mut admitted = registered(&files, 1);
    // The refusal did not end the greedy connection either: it is logged in and served.
    let reply = greedy.register().expect("register");
    assert_eq!(reply.status(), Status::Ok);
    still_served(&mut admitted, "after-in-flight-limit");
}

#[test]
fn a_request_past_the_body_limit_closes_its_connection_before_the_body() {
    // The harness config sets limits.request_body_max = 512 KiB.
    let (files, _daemon) = node(&[]);
    let mut admitted = registered(&files, 1);
    let mut big = logged_in(&files, 2);
    // Only the header of a 600 KiB frame: refused on its size field, body never read.
    let frame = request_frame(2, 1, Operation::CreateStream, &vec![7u8; 600 << 10]);
    big.send_raw(&frame.as_bytes()[..256]).expect("send header");
    assert!(
        closed_by_server(&mut big.stream),
        "oversize request kept open"
    );
    assert!(rejected(&files, 0, "size_too_large", 1) >= 1);
    // A request exactly at the limit is read and answered (here: refused as a stream
    // name, but answered on an open connection).
    let mut at_limit = registered(&files, 3);
    let frame = at_limit.frame(Operation::CreateStream as u8, 0, 1, &vec![7u8; 512 << 10]);
    at_limit.send_raw(frame.as_bytes()).expect("send");
    let reply = at_limit.read_reply().expect("a reply, not a close");
    assert_eq!(
        reply.header.request,
        1,
        "{:?} {}",
        reply.status(),
        String::from_utf8_lossy(&reply.body)
    );
    still_served(&mut admitted, "after-body-limit");
}

#[test]
fn a_frame_past_the_frame_memory_limit_is_refused_and_the_connection_kept() {
    // 1 MiB of client frames at once: two 512 KiB requests do not fit together.
    let (files, _daemon) = node(&[("APPLIANCE_LIMITS__FRAME_MEMORY_MAX", "1 MiB")]);
    let mut admitted = registered(&files, 1);
    let body = vec![1u8; 512 << 10];
    // The holder's frame is half sent: its 512 KiB stay reserved while the body trickles.
    let mut holder = registered(&files, 2);
    let held = holder.frame(Operation::CreateStream as u8, 0, 1, &body);
    holder
        .send_raw(&held.as_bytes()[..256 + 1000])
        .expect("send part");
    std::thread::sleep(Duration::from_millis(300));
    let mut newcomer = registered(&files, 3);
    let refused = newcomer.frame(Operation::CreateStream as u8, 0, 1, &body);
    newcomer.send_raw(refused.as_bytes()).expect("send");
    let reply = newcomer.read_reply().expect("a reply");
    assert_eq!(reply.status(), LIMIT_REACHED);
    assert_eq!(reply.header.request, 1);
    assert_eq!(reply.body, b"limits.frame_memory_max".to_vec());
    assert!(rejected(&files, 0, "frame_memory_limit", 1) >= 1);
    // The admitted session is served meanwhile, and so is the refused connection once
    // it sends something that fits.
    still_served(&mut admitted, "during-frame-memory-limit");
    let reply = newcomer.read(2, &[]).expect("cluster metadata");
    assert_eq!(reply.status(), Status::Ok);
    // The holder finishes its frame and is answered: its memory was never taken away.
    holder
        .stream
        .write_all(&held.as_bytes()[256 + 1000..])
        .expect("send rest");
    let reply = holder.read_reply().expect("holder's reply");
    assert_eq!(reply.header.request, 1);
    assert_ne!(reply.status(), LIMIT_REACHED);
}

#[test]
fn a_register_past_the_session_limit_is_refused_and_no_session_is_evicted() {
    let (files, _daemon) = node(&[("APPLIANCE_LIMITS__SESSIONS_MAX", "2")]);
    let mut first = registered(&files, 1);
    let mut second = registered(&files, 2);
    let mut third = logged_in(&files, 3);
    let reply = third.register().expect("register");
    assert_eq!(reply.status(), LIMIT_REACHED);
    assert_eq!(reply.body, b"limits.sessions_max".to_vec());
    assert!(rejected(&files, 0, "session_limit", 1) >= 1);
    assert_eq!(stats(&files, 0)["sessions"].as_u64(), Some(2));
    still_served(&mut first, "first-after-session-limit");
    still_served(&mut second, "second-after-session-limit");
}

#[test]
fn partitions_past_the_open_files_limit_wait_and_written_ones_share_what_is_left() {
    // 1,024 files are the node's own; of the 120 left, an eighth is kept for the
    // prepare logs of partitions being written: 105 partitions start.
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start_with_open_files(&files, 0, 1_024 + 120);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));
    let mut client = library_client(&files, &[0]);
    client.register().expect("register");
    let stream = client.create_stream("files").expect("stream");
    let topic = client.create_topic(stream, "t", 105).expect("topic");
    let key = |topic, partition| replication::wire::PartitionKey {
        stream,
        topic,
        partition,
    };
    // Each partition is written, three times over: 105 prepare logs in turn through
    // the 15 files left, each opening one closing the idlest first, so no write waits
    // for a file.
    for round in 0..2u64 {
        for partition in 0..105 {
            let batch = numbered_batch(round * 1_000 + u64::from(partition), 1, 64);
            let reply = client
                .send_messages(key(topic, partition), &batch)
                .unwrap_or_else(|e| panic!("round {round}, partition {partition}: {e:?}"));
            assert_eq!(reply.base_offset, round, "partition {partition}");
        }
    }
    // A third round by four writers at once, each on its own partitions.
    std::thread::scope(|scope| {
        for writer in 0..4u32 {
            let files = &files;
            scope.spawn(move || {
                let mut client = library_client(files, &[0]);
                client.register().expect("register");
                for partition in (writer..105).step_by(4) {
                    let batch = numbered_batch(2_000 + u64::from(partition), 1, 64);
                    let reply = client
                        .send_messages(key(topic, partition), &batch)
                        .unwrap_or_else(|e| {
                            panic!("writer {writer}, partition {partition}: {e:?}")
                        });
                    assert_eq!(reply.base_offset, 2, "partition {partition}");
                }
            });
        }
    });
    assert_eq!(
        rejected(&files, 0, "open_files_limit", 0),
        0,
        "a write waited for a file"
    );
    for partition in 0..105 {
        let read = client
            .poll_messages(
                key(topic, partition),
                appliance::protocol::Consumer::Single(1),
                appliance::protocol::PollStrategy::Offset(0),
                3,
            )
            .expect("poll");
        let batches = appliance::protocol::reply::split_poll_body(&read).expect("poll body");
        let payloads: Vec<Vec<u8>> = batches
            .iter()
            .flat_map(|(batch, _)| {
                replication::wire::batch::messages(batch).map(|m| m.payload.to_vec())
            })
            .collect();
        assert_eq!(
            payloads,
            [
                numbered_payload(u64::from(partition), 64),
                numbered_payload(1_000 + u64::from(partition), 64),
                numbered_payload(2_000 + u64::from(partition), 64)
            ],
            "partition {partition}"
        );
    }
    // Partitions past the limit wait to start, counted; the node goes on.
    client.create_topic(stream, "more", 5).expect("topic");
    assert!(rejected(&files, 0, "open_files_limit", 1) >= 1);
    let reply = client
        .send_messages(key(topic, 0), &numbered_batch(3_000, 1, 64))
        .expect("send");
    assert_eq!(reply.base_offset, 3);
    let fds = std::fs::read_dir(format!("/proc/{}/fd", daemon.pid())).map_or(0, |d| d.count());
    assert!(fds <= 1_024 + 120, "{fds} open files");
    assert_eq!(
        daemon.terminate(Duration::from_secs(10)),
        Some(0),
        "the node shuts down cleanly"
    );
}
