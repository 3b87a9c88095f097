//! The client against the fake cluster on loopback: sessions, redirects, failover with
//! the same request number, re-registration, bounded retries, and typed calls.

use std::time::{Duration, Instant};

use replication::wire::batch::{BatchBuilder, NewMessage};
use replication::wire::{Operation, PartitionKey, METADATA_GROUP};

use super::fake::FakeCluster;
use super::*;
use crate::protocol::reply::split_poll_body;
use crate::protocol::{Consumer, PollStrategy, Status};

fn options() -> ClientOptions {
    ClientOptions {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(2),
        retry: RetryPolicy {
            attempts_max: 10,
            total_timeout: Duration::from_secs(5),
            backoff_min: Duration::from_millis(1),
            backoff_max: Duration::from_millis(20),
        },
        ..ClientOptions::default()
    }
}

fn logged_in(cluster: &FakeCluster, first: usize) -> Client {
    let mut client = Client::connect(&cluster.addrs[first..], options()).unwrap();
    client.login("root", b"secret").unwrap();
    client
}

fn batch(count: u32) -> Vec<u8> {
    let mut b = BatchBuilder::with_capacity(64);
    for i in 0..count {
        b.push(NewMessage {
            id: u128::from(i) + 1,
            timestamp_delta: 0,
            payload: b"hello",
            user_headers: &[],
        });
    }
    b.finish(5)
}

/// A stream with one topic of two partitions; returns partition 0.
fn topic(client: &mut Client) -> PartitionKey {
    let stream = client.create_stream("orders").unwrap();
    let topic = client.create_topic(stream, "eu", 2).unwrap();
    PartitionKey {
        stream,
        topic,
        partition: 0,
    }
}

fn sends(cluster: &FakeCluster) -> Vec<(u8, u64, u64)> {
    cluster
        .state()
        .received
        .iter()
        .filter(|r| r.operation == Operation::SendMessages as u8)
        .map(|r| (r.node, r.session, r.request))
        .collect()
}

#[test]
fn login_then_register_gives_a_session_and_requests_count_up() {
    let cluster = FakeCluster::start(1).unwrap();
    let mut client = logged_in(&cluster, 0);
    assert_eq!(client.user_id(), Some(1));
    let session = client.register().unwrap();
    assert_ne!(session, 0);
    assert_eq!(client.last_request(), Some(0));
    topic(&mut client);
    assert_eq!(client.last_request(), Some(2));
    let received = cluster.state().received.clone();
    let register = received
        .iter()
        .find(|r| r.operation == Operation::Register as u8)
        .unwrap();
    assert_eq!((register.session, register.request), (0, 0));
    let writes: Vec<u64> = received
        .iter()
        .filter(|r| r.operation >= 128)
        .map(|r| r.request)
        .collect();
    assert_eq!(writes, vec![1, 2]);
    assert!(received.iter().all(|r| r.client == client.client_id()));
    // Reads (Login included) carry session 0 and request 0.
    assert!(received
        .iter()
        .filter(|r| r.operation == Operation::NonReplicated as u8)
        .all(|r| (r.session, r.request) == (0, 0)));
    client.logout().unwrap();
    assert_eq!(client.session(), None);
}

#[test]
fn wrong_password_is_refused_at_once() {
    let cluster = FakeCluster::start(1).unwrap();
    let mut client = Client::connect(&cluster.addrs, options()).unwrap();
    let error = client.login("root", b"wrong").unwrap_err();
    assert_eq!(error.status(), Some(Status::InvalidCredentials));
    assert_eq!(cluster.state().received.len(), 1);
}

#[test]
fn writes_without_login_are_unauthenticated() {
    let cluster = FakeCluster::start(1).unwrap();
    let mut client = Client::connect(&cluster.addrs, options()).unwrap();
    let error = client.create_stream("s").unwrap_err();
    assert_eq!(error.status(), Some(Status::Unauthenticated));
}

#[test]
fn not_primary_redirects_to_the_named_primary_and_caches_it() {
    let cluster = FakeCluster::start(3).unwrap();
    // Only the backup at node 2 is configured; the primary is node 0.
    let mut client = logged_in(&cluster, 2);
    topic(&mut client);
    assert_eq!(client.primary_of(METADATA_GROUP), Some(cluster.addrs[0]));
    let received = cluster.state().received.clone();
    let nodes: Vec<u8> = received
        .iter()
        .filter(|r| r.operation != Operation::NonReplicated as u8)
        .map(|r| r.node)
        .collect();
    // Register refused at 2, then everything at 0 without asking 2 again.
    assert_eq!(nodes, vec![2, 0, 0, 0]);
}

#[test]
fn a_new_primary_is_followed_with_the_same_request_number() {
    let cluster = FakeCluster::start(3).unwrap();
    let mut client = logged_in(&cluster, 0);
    let partition = topic(&mut client);
    cluster.state().primary = 1;
    client.send_messages(partition, &batch(3)).unwrap();
    let sends = sends(&cluster);
    assert_eq!(sends.len(), 2);
    assert_eq!((sends[0].0, sends[1].0), (0, 1));
    assert_eq!(
        sends[0].2, sends[1].2,
        "the redirected retry keeps its number"
    );
}

#[test]
fn a_dropped_reply_is_retried_with_the_same_number_and_applied_once() {
    let cluster = FakeCluster::start(2).unwrap();
    let mut client = logged_in(&cluster, 0);
    let partition = topic(&mut client);
    cluster.state().faults.drop_reply_after_apply = Some(Operation::SendMessages);
    let reply = client.send_messages(partition, &batch(4)).unwrap();
    assert_eq!((reply.base_offset, reply.count), (0, 4));
    let sends = sends(&cluster);
    assert!(sends.len() >= 2, "{sends:?}");
    assert!(sends.iter().all(|s| s.1 == sends[0].1 && s.2 == sends[0].2));
    let state = cluster.state();
    let applied = state
        .applied
        .iter()
        .filter(|a| a.0 == Operation::SendMessages as u8)
        .count();
    assert_eq!(applied, 1);
    assert_eq!(state.stored_messages(partition), 4);
}

#[test]
fn a_primary_crash_after_apply_fails_over_and_the_new_primary_answers_from_its_table() {
    let cluster = FakeCluster::start(3).unwrap();
    let mut client = logged_in(&cluster, 0);
    let partition = topic(&mut client);
    cluster.state().faults.crash_primary_after_apply = Some(Operation::SendMessages);
    let reply = client.send_messages(partition, &batch(2)).unwrap();
    assert_eq!(reply.count, 2);
    let sends = sends(&cluster);
    assert_eq!(sends.first().map(|s| s.0), Some(0));
    assert_eq!(sends.last().map(|s| s.0), Some(1));
    assert!(sends.iter().all(|s| s.2 == sends[0].2));
    assert_eq!(cluster.state().stored_messages(partition), 2);
    // Later requests go on at the new primary with the next number.
    let next = client.send_messages(partition, &batch(1)).unwrap();
    assert_eq!(next.base_offset, 2);
    let sends = self::sends(&cluster);
    assert_eq!(sends.last().map(|s| (s.0, s.2)), Some((1, sends[0].2 + 1)));
}

#[test]
fn no_session_on_a_first_delivery_registers_again_and_resends() {
    let cluster = FakeCluster::start(1).unwrap();
    let mut client = logged_in(&cluster, 0);
    let partition = topic(&mut client);
    let old = client.session().unwrap();
    cluster.state().faults.no_session_once = true;
    client.send_messages(partition, &batch(1)).unwrap();
    let new = client.session().unwrap();
    assert_ne!(old, new);
    // Request numbers continue across sessions of a client id (never reused).
    assert_eq!(client.last_request(), Some(4));
    assert_eq!(cluster.state().stored_messages(partition), 1);
}

#[test]
fn no_session_after_a_possible_delivery_reports_session_lost() {
    let cluster = FakeCluster::start(1).unwrap();
    let mut client = logged_in(&cluster, 0);
    let partition = topic(&mut client);
    // Applied, reply lost, and the session gone before the retry: the outcome of the
    // request is unknown, so it must not be resent under a new session.
    cluster.state().faults.lose_session_after_apply = Some(Operation::SendMessages);
    let error = client.send_messages(partition, &batch(1)).unwrap_err();
    assert_eq!(error, ClientError::SessionLost { request: 3 });
    assert_eq!(client.session(), None);
    assert_eq!(cluster.state().stored_messages(partition), 1);
    // The next call registers a new session and continues above request 3.
    client.send_messages(partition, &batch(1)).unwrap();
    assert_eq!(client.last_request(), Some(4));
    assert_eq!(cluster.state().stored_messages(partition), 2);
}

#[test]
fn a_final_error_after_a_possible_delivery_never_lets_the_number_be_reused() {
    let cluster = FakeCluster::start(1).unwrap();
    let mut client = logged_in(&cluster, 0);
    let partition = topic(&mut client);
    {
        // Applied, reply lost, and the retry's new connection cannot log in.
        let mut state = cluster.state();
        state.faults.drop_reply_after_apply = Some(Operation::SendMessages);
        state.set_password("root", b"changed");
    }
    let error = client.send_messages(partition, &batch(1)).unwrap_err();
    assert_eq!(error.status(), Some(Status::InvalidCredentials));
    assert_eq!(
        client.session(),
        None,
        "the unknown outcome drops the session"
    );
    cluster.state().set_password("root", b"secret");
    // A reused number would be answered with the lost request's reply; a new session
    // applies the new batch.
    let reply = client.send_messages(partition, &batch(2)).unwrap();
    assert_eq!((reply.base_offset, reply.count), (1, 2));
    assert_eq!(cluster.state().stored_messages(partition), 3);
}

#[test]
fn an_eviction_for_no_session_registers_again_other_evictions_are_final() {
    let cluster = FakeCluster::start(1).unwrap();
    let mut client = logged_in(&cluster, 0);
    let partition = topic(&mut client);
    let old = client.session();
    cluster.state().faults.evict_once = Some(1);
    client.send_messages(partition, &batch(1)).unwrap();
    assert_ne!(client.session(), old);
    cluster.state().faults.evict_once = Some(13);
    let error = client.send_messages(partition, &batch(1)).unwrap_err();
    assert_eq!(
        error,
        ClientError::Evicted {
            reason: 13,
            name: "StaleClient"
        }
    );
    assert_eq!(client.session(), None);
    assert_eq!(cluster.state().stored_messages(partition), 1);
}

#[test]
fn unavailable_is_retried_until_it_clears() {
    let cluster = FakeCluster::start(1).unwrap();
    let mut client = logged_in(&cluster, 0);
    let partition = topic(&mut client);
    let logins_before = logins(&cluster);
    cluster.state().faults.unavailable = 3;
    client.send_messages(partition, &batch(1)).unwrap();
    let sends = sends(&cluster);
    assert_eq!(sends.len(), 4);
    assert!(sends.iter().all(|s| s.2 == sends[0].2));
    // The node answered: its connection stays, no new login per retry.
    assert_eq!(logins(&cluster), logins_before);
}

#[test]
fn pipeline_full_is_retried_at_the_same_primary() {
    let cluster = FakeCluster::start(2).unwrap();
    let mut client = logged_in(&cluster, 0);
    let partition = topic(&mut client);
    cluster.state().faults.pipeline_full = 2;
    client.send_messages(partition, &batch(1)).unwrap();
    let sends = sends(&cluster);
    assert_eq!(sends.len(), 3);
    assert!(sends.iter().all(|s| s.0 == 0 && s.2 == sends[0].2));
}

#[test]
fn unauthenticated_logs_in_again_and_resends() {
    let cluster = FakeCluster::start(1).unwrap();
    let mut client = logged_in(&cluster, 0);
    let partition = topic(&mut client);
    let logins_before = logins(&cluster);
    cluster.state().faults.unauthenticated = 1;
    client.send_messages(partition, &batch(1)).unwrap();
    assert_eq!(logins(&cluster), logins_before + 1);
    assert_eq!(cluster.state().stored_messages(partition), 1);
    let sends = sends(&cluster);
    assert_eq!(sends.len(), 2);
    assert_eq!(sends[0].2, sends[1].2);
}

fn is_login(r: &super::fake::Received) -> bool {
    r.operation == Operation::NonReplicated as u8
        && r.read_command == crate::protocol::ReadCommand::Login as u32
}

fn logins(cluster: &FakeCluster) -> usize {
    cluster
        .state()
        .received
        .iter()
        .filter(|r| is_login(r))
        .count()
}

fn logins_at(cluster: &FakeCluster, node: u8) -> usize {
    cluster
        .state()
        .received
        .iter()
        .filter(|r| r.node == node && is_login(r))
        .count()
}

/// A client of every node that waits `timeout` for a reply, and its partition.
fn impatient(cluster: &FakeCluster, timeout: Duration) -> (Client, PartitionKey) {
    let mut options = options();
    options.request_timeout = timeout;
    options.login_timeout = timeout;
    options.retry.attempts_max = 200;
    let mut client = Client::connect(&cluster.addrs, options).unwrap();
    client.login("root", b"secret").unwrap();
    let partition = topic(&mut client);
    (client, partition)
}

#[test]
fn a_silent_primary_is_not_gone_back_to_on_a_backups_say_so() {
    let cluster = FakeCluster::start(3).unwrap();
    let (mut client, partition) = impatient(&cluster, Duration::from_millis(300));
    client.send_messages(partition, &batch(1)).unwrap();
    // The primary's host goes silent; the backups keep naming it until, a while after
    // the client gave up on it, node 1 takes over.
    cluster.state().silent[0] = true;
    let sent_before = sends(&cluster).len();
    let cluster_ref = &cluster;
    let takeover = std::thread::scope(|scope| {
        scope.spawn(move || {
            let started = Instant::now();
            while sends(cluster_ref).len() == sent_before {
                assert!(started.elapsed() < Duration::from_secs(5));
                std::thread::sleep(Duration::from_millis(5));
            }
            // The client times out at 300 ms and then asks the backups.
            std::thread::sleep(Duration::from_millis(500));
            cluster_ref.state().primary = 1;
        });
        client.send_messages(partition, &batch(2))
    });
    takeover.unwrap();
    let sends = sends(&cluster);
    let last = sends.last().unwrap().2;
    let attempts: Vec<u8> = sends.iter().filter(|s| s.2 == last).map(|s| s.0).collect();
    assert_eq!(
        attempts.iter().filter(|n| **n == 0).count(),
        1,
        "the silent node was asked once: {attempts:?}"
    );
    assert_eq!(attempts.last(), Some(&1), "{attempts:?}");
    assert!(
        attempts.iter().filter(|n| **n == 2).count() >= 1,
        "the other backup was asked meanwhile: {attempts:?}"
    );
    assert_eq!(cluster.state().stored_messages(partition), 3);
}

#[test]
fn a_failed_node_is_asked_again_when_no_other_is_left() {
    let cluster = FakeCluster::start(2).unwrap();
    let (mut client, partition) = impatient(&cluster, Duration::from_millis(200));
    // Node 0, the primary, misses one reply; node 1 names it: with no third node to
    // ask, the client goes back to it at once.
    cluster.state().silent[0] = true;
    let cluster_ref = &cluster;
    let result = std::thread::scope(|scope| {
        scope.spawn(move || {
            let started = Instant::now();
            while sends(cluster_ref).is_empty() {
                assert!(started.elapsed() < Duration::from_secs(5));
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(100));
            cluster_ref.state().silent[0] = false;
        });
        let started = Instant::now();
        let result = client.send_messages(partition, &batch(1));
        (result, started.elapsed())
    });
    result.0.unwrap();
    assert!(
        result.1 < Duration::from_millis(900),
        "no pause while node 1 is the only other: {:?}",
        result.1
    );
    let nodes: Vec<u8> = sends(&cluster).iter().map(|s| s.0).collect();
    assert_eq!(nodes, vec![0, 1, 0], "{nodes:?}");
}

#[test]
fn standby_logins_make_a_failover_need_no_new_login() {
    let cluster = FakeCluster::start(3).unwrap();
    let mut options = options();
    options.standby_logins = true;
    let mut client = Client::connect(&cluster.addrs, options).unwrap();
    client.login("root", b"secret").unwrap();
    assert_eq!(
        (0..3).map(|n| logins_at(&cluster, n)).collect::<Vec<_>>(),
        vec![1, 1, 1]
    );
    let partition = topic(&mut client);
    cluster.state().primary = 2;
    client.send_messages(partition, &batch(1)).unwrap();
    assert_eq!(
        logins(&cluster),
        3,
        "the new primary's connection was ready"
    );
    // Without them, the failover logs in at the new primary.
    let plain = FakeCluster::start(3).unwrap();
    let mut client = Client::connect(&plain.addrs, self::options()).unwrap();
    client.login("root", b"secret").unwrap();
    let partition = topic(&mut client);
    assert_eq!(logins(&plain), 1);
    plain.state().primary = 2;
    client.send_messages(partition, &batch(1)).unwrap();
    assert_eq!(logins_at(&plain, 2), 1);
}

#[test]
fn connect_skips_nodes_that_do_not_answer() {
    let cluster = FakeCluster::start(2).unwrap();
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let mut client = Client::connect(&[dead, cluster.addrs[1]], options()).unwrap();
    client.login("root", b"secret").unwrap();
    topic(&mut client);
    assert_eq!(client.primary_of(METADATA_GROUP), Some(cluster.addrs[0]));
}

#[test]
fn retries_are_bounded_in_attempts() {
    let cluster = FakeCluster::start(1).unwrap();
    let mut client = logged_in(&cluster, 0);
    let partition = topic(&mut client);
    cluster.state().faults.unavailable = 1_000;
    let started = Instant::now();
    let error = client.send_messages(partition, &batch(1)).unwrap_err();
    match error {
        ClientError::RetriesExhausted {
            attempts,
            maybe_applied,
            ..
        } => {
            assert_eq!(attempts, 10);
            assert!(!maybe_applied);
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    // Nothing may have been applied, so the session is kept.
    assert!(client.session().is_some());
}

#[test]
fn a_dead_cluster_fails_within_the_total_timeout() {
    let cluster = FakeCluster::start(2).unwrap();
    let mut client = logged_in(&cluster, 0);
    let partition = topic(&mut client);
    {
        let mut state = cluster.state();
        state.down = vec![true, true];
        state.faults.drop_reply_after_apply = Some(Operation::SendMessages);
    }
    let started = Instant::now();
    let error = client.send_messages(partition, &batch(1)).unwrap_err();
    assert!(
        matches!(error, ClientError::RetriesExhausted { .. }),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(7));
}

#[test]
fn send_poll_offsets_and_listing_round_trip() {
    let cluster = FakeCluster::start(1).unwrap();
    let mut client = logged_in(&cluster, 0);
    let partition = topic(&mut client);
    let first = client.send_messages(partition, &batch(3)).unwrap();
    let second = client.send_messages(partition, &batch(2)).unwrap();
    assert_eq!((first.base_offset, second.base_offset), (0, 3));
    let body = client
        .poll_messages(partition, Consumer::Single(1), PollStrategy::Offset(3), 10)
        .unwrap();
    let batches = split_poll_body(&body).unwrap();
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].1.base_offset, 3);
    assert_eq!(
        client
            .get_consumer_offset(partition, Consumer::Single(1))
            .unwrap(),
        None
    );
    client
        .store_consumer_offset(partition, Consumer::Single(1), 4)
        .unwrap();
    assert_eq!(
        client
            .get_consumer_offset(partition, Consumer::Single(1))
            .unwrap(),
        Some(4)
    );
    let streams = client.list_streams().unwrap();
    assert_eq!(streams.streams[0].name, "orders");
    let topics = client.list_topics(partition.stream).unwrap();
    assert_eq!(topics.topics[0].partitions, 2);
    let metadata = client.cluster_metadata().unwrap();
    assert_eq!(metadata.nodes.len(), 1);
    assert_eq!(
        client.create_stream("orders").unwrap_err().status(),
        Some(Status::AlreadyExists)
    );
}

#[test]
fn bad_arguments_are_refused_before_sending() {
    let cluster = FakeCluster::start(1).unwrap();
    let mut client = logged_in(&cluster, 0);
    let before = cluster.state().received.len();
    assert!(matches!(
        client.create_stream(&"x".repeat(256)),
        Err(ClientError::InvalidArgument { .. })
    ));
    let partition = PartitionKey {
        stream: 1 << 20,
        topic: 0,
        partition: 0,
    };
    assert!(client.send_messages(partition, &batch(1)).is_err());
    let mut corrupt = batch(1);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 1;
    let good = PartitionKey {
        stream: 1,
        topic: 1,
        partition: 0,
    };
    assert!(matches!(
        client.send_messages(good, &corrupt),
        Err(ClientError::InvalidArgument { what: "batch", .. })
    ));
    assert_eq!(cluster.state().received.len(), before);
}

#[test]
fn server_lists_resolve_comma_separated_and_refuse_garbage() {
    let addrs = resolve("127.0.0.1:1, 127.0.0.1:2,").unwrap();
    assert_eq!(addrs.len(), 2);
    assert!(matches!(
        resolve("no-port"),
        Err(ClientError::InvalidArgument { what: "server", .. })
    ));
    assert_eq!(
        Client::connect(&[], options()).unwrap_err(),
        ClientError::NoServers
    );
}

#[test]
fn nodes_that_disagree_about_the_primary_are_bounded() {
    let cluster = FakeCluster::start(2).unwrap();
    let mut client = logged_in(&cluster, 0);
    topic(&mut client);
    // Node 0 believes node 1 is primary; node 1 is down: every attempt fails.
    {
        let mut state = cluster.state();
        state.primary = 1;
        state.down[1] = true;
    }
    let started = Instant::now();
    let error = client.create_stream("other").unwrap_err();
    assert!(
        matches!(
            error,
            ClientError::RetriesExhausted {
                attempts: 10,
                maybe_applied: false,
                ..
            }
        ),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A server that answers every request frame with `answer(request)` bytes (and never
/// anything valid unless `answer` builds it).
fn hostile(answer: fn(&replication::wire::RequestHeader) -> Vec<u8>) -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || loop {
                let mut buf = replication::wire::FrameBuf::zeroed(256);
                if stream.read_exact(buf.as_bytes_mut()).is_err() {
                    return;
                }
                let size = u32::from_le_bytes(buf.as_bytes()[48..52].try_into().unwrap());
                buf.resize(size as usize);
                if stream.read_exact(&mut buf.as_bytes_mut()[256..]).is_err() {
                    return;
                }
                let Ok(header) = replication::wire::decode_as::<replication::wire::RequestHeader>(
                    buf.as_bytes(),
                    &replication::wire::Limits::default(),
                ) else {
                    return;
                };
                let bytes = answer(header);
                if bytes.is_empty() || stream.write_all(&bytes).is_err() {
                    return;
                }
            });
        }
    });
    addr
}

fn reply_to(
    request: &replication::wire::RequestHeader,
    edit: impl FnOnce(&mut replication::wire::ReplyHeader),
    body: &[u8],
) -> Vec<u8> {
    use replication::wire::Header;
    let mut reply = replication::wire::ReplyHeader::new();
    reply.client = request.client;
    reply.request = request.request;
    reply.operation = request.operation;
    edit(&mut reply);
    replication::wire::Frame::build(&reply, body)
        .as_bytes()
        .to_vec()
}

#[test]
fn hostile_replies_are_errors_never_panics() {
    let answers: [fn(&replication::wire::RequestHeader) -> Vec<u8>; 10] = [
        // Bytes that are no frame at all.
        |_| (0..300u32).map(|i| (i * 7919 % 251) as u8).collect(),
        // A size field far beyond max_message_size.
        |r| {
            let mut b = reply_to(r, |_| {}, &[]);
            b[48..52].copy_from_slice(&u32::MAX.to_le_bytes());
            b
        },
        // A valid Reply to another request number.
        |r| reply_to(r, |h| h.request = 99, &[]),
        // A valid Reply to another client.
        |r| reply_to(r, |h| h.client ^= 1, &[]),
        // A status no version defines.
        |r| reply_to(r, |h| h.status = 77, &[]),
        // A sealed replica-plane frame.
        |_| {
            use replication::wire::Header;
            let mut commit = replication::wire::CommitHeader::new();
            commit.group = METADATA_GROUP;
            replication::wire::Frame::build(&commit, &[])
                .as_bytes()
                .to_vec()
        },
        // Ok with a body that does not parse as the read's reply.
        |r| reply_to(r, |_| {}, &[1, 2, 3]),
        // NotPrimary naming an address that does not parse.
        |r| reply_to(r, |h| h.status = 1, &[1, 3, b'x', b'y', b'z']),
        // A Reply whose checksum (left zero by the unsealed Reply) is set.
        |r| {
            let mut b = reply_to(r, |_| {}, &[]);
            b[0] = 1;
            b
        },
        // Silence, then a close.
        |_| Vec::new(),
    ];
    for (i, answer) in answers.into_iter().enumerate() {
        let addr = hostile(answer);
        let mut options = options();
        options.request_timeout = Duration::from_millis(200);
        options.retry.attempts_max = 3;
        let mut client = Client::connect(&[addr], options).unwrap();
        let result = client.list_streams();
        assert!(result.is_err(), "answer {i}: {result:?}");
        let result = client.register();
        assert!(result.is_err(), "answer {i}: {result:?}");
    }
}

#[test]
fn a_silent_server_times_out_within_the_request_timeout() {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 256];
            let _ = stream.read(&mut buf);
            held.push(stream);
        }
    });
    let mut options = options();
    options.request_timeout = Duration::from_millis(100);
    options.retry.attempts_max = 2;
    let mut client = Client::connect(&[addr], options).unwrap();
    let started = Instant::now();
    match client.list_streams().unwrap_err() {
        ClientError::RetriesExhausted { attempts, last, .. } => {
            assert_eq!(attempts, 2);
            assert!(matches!(*last, ClientError::Timeout { .. }), "{last:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(2));
}
