//! Authorisation against a real daemon: per-stream rights are checked on
//! every operation, a deleted user's session ends on its next request, and a failed
//! login never reveals whether the user exists (identical reply, delayed, counted).

mod common;

use std::time::{Duration, Instant};

use appliance::client::{Client as Library, ClientOptions};
use appliance::protocol::StreamPermission;
use common::*;
use replication::wire::batch::{BatchBuilder, NewMessage};
use replication::wire::{Operation, PartitionKey};

const PERMISSION_DENIED: Status = Status::PermissionDenied;
const UNAUTHENTICATED: Status = Status::Unauthenticated;
const INVALID_CREDENTIALS: Status = Status::InvalidCredentials;
/// The daemon answers a failed login after 500 ms (daemon/client.rs); a floor a little
/// under it, so the check is that the delay exists, not how precise it is.
const FAILED_LOGIN_DELAY_FLOOR: Duration = Duration::from_millis(450);

fn node() -> (ClusterFiles, Daemon) {
    let files = ClusterFiles::new(1);
    let mut daemon = Daemon::start(&files, 0);
    wait_healthy(&files, &mut daemon, Duration::from_secs(30));
    (files, daemon)
}

fn root(files: &ClusterFiles) -> Library {
    let mut root =
        Library::connect(&[files.client_addr(0)], ClientOptions::default()).expect("connect");
    root.login("root", ROOT_PASSWORD.as_bytes()).expect("login");
    root.register().expect("register");
    root
}

fn session_of(files: &ClusterFiles, id: u128, user: &str, password: &str) -> Client {
    let mut client = Client::connect(files.client_addr(0), id).expect("connect");
    let reply = client.login(user, password).expect("login");
    assert_eq!(reply.status(), Status::Ok, "login of {user}");
    let reply = client.register().expect("register");
    assert_eq!(reply.status(), Status::Ok, "register of {user}");
    client
}

fn one_batch() -> Vec<u8> {
    let mut builder = BatchBuilder::with_capacity(256);
    builder.push(NewMessage {
        id: 1,
        timestamp_delta: 0,
        payload: b"written by root",
        user_headers: &[],
    });
    builder.finish(1)
}

fn poll_of(key: PartitionKey) -> Vec<u8> {
    poll_body(key.stream, key.topic, key.partition, 0, 100)
}

fn read_only(stream_id: u32) -> StreamPermission {
    StreamPermission {
        stream_id,
        read: true,
        write: false,
        manage: false,
    }
}

#[test]
fn a_user_without_write_permission_cannot_produce_and_reads_only_when_granted() {
    let (files, _daemon) = node();
    let mut root = root(&files);
    let stream = root.create_stream("permissions").expect("stream");
    let topic = root.create_topic(stream, "t", 1).expect("topic");
    let key = PartitionKey {
        stream,
        topic,
        partition: 0,
    };
    root.send_messages(key, &one_batch())
        .expect("root produces");
    root.create_user("reader", b"reader-password", &[read_only(stream)])
        .expect("reader");
    root.create_user("nobody", b"nobody-password", &[])
        .expect("nobody");

    let mut reader = session_of(&files, 11, "reader", "reader-password");
    let produce = send_body(stream, topic, 0, &one_batch());
    let reply = reader
        .write(Operation::SendMessages, &produce)
        .expect("produce");
    assert_eq!(reply.status(), PERMISSION_DENIED, "reader produced");
    let reply = reader.read(POLL, &poll_of(key)).expect("poll");
    assert_eq!(reply.status(), Status::Ok, "reader cannot read");
    assert!(
        reply
            .body
            .windows(b"written by root".len())
            .any(|w| w == b"written by root"),
        "the reader sees root's message"
    );

    let mut nobody = session_of(&files, 12, "nobody", "nobody-password");
    let reply = nobody.read(POLL, &poll_of(key)).expect("poll");
    assert_eq!(reply.status(), PERMISSION_DENIED, "read without a grant");
    let reply = nobody
        .write(Operation::SendMessages, &produce)
        .expect("produce");
    assert_eq!(reply.status(), PERMISSION_DENIED);
    assert!(rejected(&files, 0, "permission_denied", 2) >= 2);

    // Nothing the reader or nobody sent was appended: the partition holds root's batch.
    let reply = reader.read(POLL, &poll_of(key)).expect("poll");
    let count = reply
        .body
        .windows(b"written by root".len())
        .filter(|w| *w == b"written by root")
        .count();
    assert_eq!(count, 1);
}

#[test]
fn a_deleted_users_session_is_refused_on_its_next_request() {
    let (files, _daemon) = node();
    let mut root = root(&files);
    let stream = root.create_stream("deleted").expect("stream");
    let user = root
        .create_user("temp", b"temp-password", &[read_only(stream)])
        .expect("temp");
    let mut temp = session_of(&files, 21, "temp", "temp-password");
    assert_eq!(temp.read(2, &[]).expect("metadata").status(), Status::Ok);

    root.delete_user(user).expect("delete user");
    let reply = temp.read(2, &[]).expect("metadata after delete");
    assert_eq!(reply.status(), UNAUTHENTICATED, "{:?}", reply.body);
    let reply = temp
        .write(Operation::CreateStream, &short("by-a-ghost"))
        .expect("write after delete");
    assert_eq!(reply.status(), UNAUTHENTICATED);
    assert!(rejected(&files, 0, "user_deleted", 1) >= 1);
    // And it cannot come back.
    let reply = temp.login("temp", "temp-password").expect("login again");
    assert_eq!(reply.status(), INVALID_CREDENTIALS);
}

#[test]
fn a_wrong_password_and_an_unknown_user_get_the_same_delayed_reply() {
    let (files, _daemon) = node();
    let attempt = |id: u128, user: &str, password: &str| {
        let mut client = Client::connect(files.client_addr(0), id).expect("connect");
        let started = Instant::now();
        let reply = client.login(user, password).expect("login reply");
        (reply, started.elapsed())
    };
    let (wrong_password, took_wrong) = attempt(31, "root", "not-the-password");
    let (unknown_user, took_unknown) = attempt(31, "no-such-user", "not-the-password");
    assert_eq!(wrong_password.status(), INVALID_CREDENTIALS);
    assert_eq!(wrong_password.status(), unknown_user.status());
    assert_eq!(wrong_password.body, unknown_user.body);
    // Every header field but the checksums and timestamps is the same too.
    let (a, b) = (&wrong_password.header, &unknown_user.header);
    assert_eq!(
        (a.frame.size, a.operation, a.request, a.client, a.status),
        (b.frame.size, b.operation, b.request, b.client, b.status)
    );
    assert!(took_wrong >= FAILED_LOGIN_DELAY_FLOOR, "{took_wrong:?}");
    assert!(took_unknown >= FAILED_LOGIN_DELAY_FLOOR, "{took_unknown:?}");
    assert!(rejected(&files, 0, "login_failed", 2) >= 2);
    // The right password still works.
    let (ok, _) = attempt(32, "root", ROOT_PASSWORD);
    assert_eq!(ok.status(), Status::Ok);
}
