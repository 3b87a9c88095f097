//! The replica port facing untrusted hosts: oversize frames, silent peers, floods of
//! garbage, the handshake limit, refused commands, corrupted frames, queue overruns and
//! the client plane gate. Every rejection is counted by reason.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use replication::bus::Bus;
use replication::wire::{
    cluster_id, EvictionHeader, Frame, Header, Operation, ReplicaHelloHeader, RequestHeader,
};

const LINK_WAIT: Duration = Duration::from_secs(5);

/// Connects as replica 0 without auth; the link is established once the hello is sent.
async fn raw_peer(addr: SocketAddr) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let mut hello = ReplicaHelloHeader::new();
    hello.frame.cluster = cluster_id(CLUSTER);
    hello.frame.replica = 0;
    tcp.write_all(Frame::build(&hello, &[]).as_bytes())
        .await
        .unwrap();
    tcp
}

/// Reads until the peer closes; true if it closed within `limit`.
async fn closed_within(tcp: &mut TcpStream, limit: Duration) -> bool {
    let read = async {
        let mut sink = [0u8; 4096];
        loop {
            match tcp.read(&mut sink).await {
                Ok(0) | Err(_) => return Ok(()),
                Ok(_) => {}
            }
        }
    };
    glommio::timer::timeout(limit, read).await.is_ok()
}

fn acceptor(
    tweak: impl FnOnce(replication::bus::BusConfig) -> replication::bus::BusConfig,
) -> (Bus, std::rc::Rc<Recorder>) {
    let seen = recorder();
    let bus = Bus::start(tweak(config(1, &[loopback(0), loopback(0)])), seen.clone())
        .expect("node 1 starts");
    (bus, seen)
}

#[test]
fn oversize_frame_closes_the_connection_and_is_counted() {
    run(|| async {
        let (bus, seen) = acceptor(|mut c| {
            c.max_message_size = 64 * 1024;
            c
        });
        let mut tcp = raw_peer(bus.replica_addr()).await;
        assert!(wait_until(LINK_WAIT, || bus.is_connected(0)).await);
        let mut header = commit_frame(0, 1).as_bytes().to_vec();
        header[48..52].copy_from_slice(&(64 * 1024 * 1024u32).to_le_bytes());
        tcp.write_all(&header).await.unwrap();
        assert!(closed_within(&mut tcp, LINK_WAIT).await);
        assert_eq!(bus.stats().snapshot().rejected("size_too_large"), 1);
        assert!(wait_until(LINK_WAIT, || !bus.is_connected(0)).await);
        assert!(seen.seen.borrow().frames.is_empty());
        bus.shutdown();
    });
}

#[test]
fn frame_just_under_the_limit_is_delivered() {
    run(|| async {
        let (bus, seen) = acceptor(|mut c| {
            c.max_message_size = 64 * 1024;
            c
        });
        let mut tcp = raw_peer(bus.replica_addr()).await;
        let mut header = replication::wire::StateChunkHeader::new();
        header.frame.cluster = cluster_id(CLUSTER);
        header.group = replication::wire::METADATA_GROUP;
        header.nonce = 1;
        let frame = Frame::build(&header, &vec![7u8; 64 * 1024 - 256]);
        tcp.write_all(frame.as_bytes()).await.unwrap();
        assert!(wait_until(LINK_WAIT, || seen.seen.borrow().frames.len() == 1).await);
        assert_eq!(seen.seen.borrow().frames[0].1, frame.as_bytes());
        bus.shutdown();
    });
}

#[test]
fn silent_peer_is_closed_after_handshake_grace() {
    run(|| async {
        let (bus, _) = acceptor(|c| with_auth(c, SECRET, None));
        let start = Instant::now();
        // One says nothing; one sends a valid hello and never finishes.
        let mut mute = TcpStream::connect(bus.replica_addr()).await.unwrap();
        let mut stalled = TcpStream::connect(bus.replica_addr()).await.unwrap();
        let mut hello = ReplicaHelloHeader::new();
        hello.frame.cluster = cluster_id(CLUSTER);
        hello.nonce_d = [9; 32];
        stalled
            .write_all(Frame::build(&hello, &[]).as_bytes())
            .await
            .unwrap();
        assert!(closed_within(&mut mute, Duration::from_secs(3)).await);
        assert!(closed_within(&mut stalled, Duration::from_secs(3)).await);
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_millis(450), "{elapsed:?}");
        assert!(
            wait_until(LINK_WAIT, || bus
                .stats()
                .snapshot()
                .rejected("handshake_timeout")
                == 2)
            .await
        );
        bus.shutdown();
    });
}

/// A few kinds of garbage a hostile host might send.
fn garbage(index: usize) -> Vec<u8> {
    let mut seed = (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed as u8
    };
    match index % 5 {
        0 => (0..256).map(|_| next()).collect(),
        1 => (0..100).map(|_| next()).collect(),
        2 => vec![0u8; 256],
        3 => {
            // A framed hello from a stranger cluster.
            let mut hello = ReplicaHelloHeader::new();
            hello.frame.cluster = u128::from(next());
            Frame::build(&hello, &[]).as_bytes().to_vec()
        }
        _ => {
            // A well-framed header claiming a huge body.
            let mut bytes: Vec<u8> = (0..256).map(|_| next()).collect();
            bytes[48..52].copy_from_slice(&u32::MAX.to_le_bytes());
            bytes[60] = 14;
            bytes
        }
    }
}

#[test]
fn legit_peer_still_connects_after_a_thousand_garbage_connections() {
    run(|| async {
        let start = Instant::now();
        let (bus_1, _) = acceptor(|mut c| {
            c.handshake_grace = Duration::from_millis(300);
            with_auth(c, SECRET, None)
        });
        let addr = bus_1.replica_addr();
        const CONNECTIONS: usize = 1000;
        const WAVE: usize = 250;
        let mut closed = 0;
        for wave in 0..CONNECTIONS / WAVE {
            let mut tasks = Vec::new();
            for i in 0..WAVE {
                let index = wave * WAVE + i;
                tasks.push(glommio::spawn_local(async move {
                    let Ok(mut tcp) = TcpStream::connect(addr).await else {
                        return false;
                    };
                    let _ = tcp.write_all(&garbage(index)).await;
                    closed_within(&mut tcp, Duration::from_secs(5)).await
                }));
            }
            for task in tasks {
                if task.await {
                    closed += 1;
                }
            }
        }
        assert_eq!(
            closed, CONNECTIONS,
            "every garbage connection is closed by the node"
        );
        let stats = bus_1.stats().snapshot();
        let counted: u64 = stats.rejected.values().sum();
        assert!(counted >= CONNECTIONS as u64, "{:?}", stats.rejected);
        eprintln!("rejections after the flood: {:?}", stats.rejected);
        assert!(!bus_1.is_connected(0));

        let bus_0 = Bus::start(
            with_auth(config(0, &[loopback(0), addr]), SECRET, None),
            recorder(),
        )
        .unwrap();
        assert!(wait_until(LINK_WAIT, || bus_0.is_connected(1) && bus_1.is_connected(0)).await);
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{:?}",
            start.elapsed()
        );
        bus_0.shutdown();
        bus_1.shutdown();
    });
}

/// Opens `count` connections that never say hello and waits until `refused` of them are
/// counted under handshake_limit; returns them (still open).
async fn silent_connections(bus: &Bus, count: usize, refused: u64) -> Vec<TcpStream> {
    let mut silent = Vec::new();
    for _ in 0..count {
        silent.push(TcpStream::connect(bus.replica_addr()).await.unwrap());
    }
    let counted = || bus.stats().snapshot().rejected("handshake_limit");
    assert!(
        wait_until(LINK_WAIT, || counted() == refused).await,
        "{:?}",
        bus.stats().snapshot().rejected
    );
    silent
}

#[test]
fn handshakes_beyond_256_in_flight_are_closed_at_once_and_counted() {
    run(|| async {
        let (bus, _) = acceptor(|mut c| {
            // Long enough that no silent handshake expires before all 300 are accepted.
            c.handshake_grace = Duration::from_secs(20);
            with_auth(c, SECRET, None)
        });
        let silent = silent_connections(&bus, 300, 44).await;
        drop(silent);
        bus.shutdown();
    });
}

#[test]
fn configured_handshake_limit_refuses_newcomers_and_an_established_link_keeps_working() {
    run(|| async {
        let (bus, seen) = acceptor(|mut c| {
            c.handshakes_max = 4;
            c.handshake_grace = Duration::from_secs(20);
            c
        });
        let mut peer = raw_peer(bus.replica_addr()).await;
        assert!(wait_until(LINK_WAIT, || bus.is_connected(0)).await);
        let silent = silent_connections(&bus, 10, 6).await;
        // The link admitted before is served while the limit is reached.
        peer.write_all(commit_frame(0, 1).as_bytes()).await.unwrap();
        assert!(wait_until(LINK_WAIT, || seen.seen.borrow().frames.len() == 1).await);
        assert!(bus.is_connected(0));
        drop(silent);
        bus.shutdown();
    });
}

#[test]
fn reply_and_eviction_are_refused_on_the_replica_plane() {
    run(|| async {
        let (bus, seen) = acceptor(|c| c);
        let mut tcp = raw_peer(bus.replica_addr()).await;
        let mut eviction = EvictionHeader::new();
        eviction.frame.cluster = cluster_id(CLUSTER);
        eviction.reason = 1;
        tcp.write_all(Frame::build(&eviction, &[]).as_bytes())
            .await
            .unwrap();
        assert!(closed_within(&mut tcp, LINK_WAIT).await);
        assert_eq!(
            bus.stats()
                .snapshot()
                .rejected("replica_plane_refused_command"),
            1
        );
        assert!(seen.seen.borrow().frames.is_empty());
        bus.shutdown();
    });
}

#[test]
fn corrupted_frame_is_dropped_and_counted_but_the_link_survives() {
    run(|| async {
        let (bus, seen) = acceptor(|c| c);
        let mut tcp = raw_peer(bus.replica_addr()).await;
        let mut bad = commit_frame(0, 1).as_bytes().to_vec();
        bad[152] ^= 1; // commit field, covered by the frame seal
        tcp.write_all(&bad).await.unwrap();
        tcp.write_all(commit_frame(0, 2).as_bytes()).await.unwrap();
        assert!(wait_until(LINK_WAIT, || seen.seen.borrow().frames.len() == 1).await);
        assert_eq!(
            seen.seen.borrow().frames[0].1,
            commit_frame(0, 2).as_bytes()
        );
        assert_eq!(bus.stats().snapshot().rejected("frame_seal_mismatch"), 1);
        assert!(bus.is_connected(0));
        bus.shutdown();
    });
}

#[test]
fn handshake_frame_after_establishment_closes_the_link() {
    run(|| async {
        let (bus, _) = acceptor(|c| c);
        let mut tcp = raw_peer(bus.replica_addr()).await;
        let mut hello = ReplicaHelloHeader::new();
        hello.frame.cluster = cluster_id(CLUSTER);
        tcp.write_all(Frame::build(&hello, &[]).as_bytes())
            .await
            .unwrap();
        assert!(closed_within(&mut tcp, LINK_WAIT).await);
        assert_eq!(
            bus.stats()
                .snapshot()
                .rejected("handshake_unexpected_command"),
            1
        );
        bus.shutdown();
    });
}

#[test]
fn queue_overruns_are_dropped_and_counted() {
    run(|| async {
        let (bus_1, seen_1) = acceptor(|c| c);
        let mut config_0 = config(0, &[loopback(0), bus_1.replica_addr()]);
        config_0.peer_queue_capacity = 4;
        let bus_0 = Bus::start(config_0, recorder()).unwrap();
        assert!(wait_until(LINK_WAIT, || bus_0.is_connected(1)).await);
        // No await between sends: the writer cannot drain, so only 4 large frames fit,
        // and small ones (no prepare body) up to 8 per slot, 32 frames in all.
        let large = |nonce: u128| {
            let mut header = replication::wire::StateChunkHeader::new();
            header.frame.cluster = cluster_id(CLUSTER);
            header.group = replication::wire::METADATA_GROUP;
            header.nonce = nonce;
            Frame::build(&header, &[7u8; 8192])
        };
        let accepted = (0..10)
            .filter(|i| bus_0.send(1, large(*i + 1)).is_ok())
            .count();
        assert_eq!(accepted, 4);
        let accepted = (0..100)
            .filter(|i| bus_0.send(1, commit_frame(0, *i)).is_ok())
            .count();
        assert_eq!(accepted, 28);
        let stats = bus_0.stats().snapshot();
        assert_eq!(stats.peer(1).unwrap().dropped, 6 + 72);
        assert_eq!(stats.rejected("peer_queue_full"), 78);
        assert!(wait_until(LINK_WAIT, || seen_1.seen.borrow().frames.len() == 32).await);
        // Drained, the queue takes large frames again.
        assert!(bus_0.send(1, large(100)).is_ok());
        assert!(wait_until(LINK_WAIT, || seen_1.seen.borrow().frames.len() == 33).await);
        // Sends to a peer that is not connected are dropped and counted too.
        assert!(bus_1.send(0, commit_frame(1, 1)).is_ok());
        bus_0.shutdown();
        assert!(wait_until(LINK_WAIT, || !bus_1.is_connected(0)).await);
        assert!(bus_1.send(0, commit_frame(1, 2)).is_err());
        assert!(bus_1.stats().snapshot().peer(0).unwrap().dropped >= 1);
        bus_1.shutdown();
    });
}

#[test]
fn frames_arrive_in_order_in_writev_batches() {
    run(|| async {
        let (bus_1, seen_1) = acceptor(|c| c);
        let mut config_0 = config(0, &[loopback(0), bus_1.replica_addr()]);
        config_0.max_batch = 16;
        let bus_0 = Bus::start(config_0, recorder()).unwrap();
        assert!(wait_until(LINK_WAIT, || bus_0.is_connected(1)).await);
        for i in 0..1000u64 {
            bus_0.room(1).await;
            bus_0.send(1, commit_frame(0, i)).unwrap();
        }
        assert!(wait_until(LINK_WAIT, || seen_1.seen.borrow().frames.len() == 1000).await);
        for (i, (_, bytes)) in seen_1.seen.borrow().frames.iter().enumerate() {
            assert_eq!(bytes.as_slice(), commit_frame(0, i as u64).as_bytes());
        }
        // A burst queued before the writer runs leaves in writes of max_batch frames.
        let before = bus_0.stats().snapshot().peer(1).unwrap().batches_sent;
        for i in 0..160u64 {
            bus_0.send(1, commit_frame(0, 1000 + i)).unwrap();
        }
        assert!(wait_until(LINK_WAIT, || seen_1.seen.borrow().frames.len() == 1160).await);
        let peer = *bus_0.stats().snapshot().peer(1).unwrap();
        assert_eq!(peer.frames_sent, 1160);
        assert_eq!(
            peer.batches_sent - before,
            10,
            "160 frames in batches of 16"
        );
        bus_0.shutdown();
        bus_1.shutdown();
    });
}

fn request(client: u128) -> Frame {
    let mut header = RequestHeader::new();
    header.client = client;
    header.operation = Operation::Register as u8;
    Frame::build(&header, &[])
}

#[test]
fn client_listener_admits_only_requests() {
    run(|| async {
        let (bus, seen) = acceptor(|mut c| {
            c.client_listen = Some(loopback(0));
            c
        });
        let addr = bus.client_addr().unwrap();
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(request(42).as_bytes()).await.unwrap();
        assert!(wait_until(LINK_WAIT, || seen.seen.borrow().client_frames.len() == 1).await);
        // A reply goes back on the same connection.
        let client = seen.seen.borrow().client_frames[0].0;
        let mut reply = replication::wire::ReplyHeader::new();
        reply.client = 42;
        let reply = Frame::build(&reply, &[]);
        bus.send_to_client(client, reply.clone()).unwrap();
        let mut answer = vec![0u8; 256];
        tcp.read_exact(&mut answer).await.unwrap();
        assert_eq!(answer, reply.as_bytes());
        // A well-framed but invalid Request (client 0) is dropped, counted, link kept.
        tcp.write_all(request(0).as_bytes()).await.unwrap();
        tcp.write_all(request(43).as_bytes()).await.unwrap();
        assert!(wait_until(LINK_WAIT, || seen.seen.borrow().client_frames.len() == 2).await);
        assert_eq!(bus.stats().snapshot().rejected("client_zero"), 1);
        // Replica commands are refused on the client plane and close the connection.
        for frame in [
            commit_frame(0, 1),
            Frame::build(&ReplicaHelloHeader::new(), &[]),
        ] {
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            tcp.write_all(frame.as_bytes()).await.unwrap();
            assert!(closed_within(&mut tcp, LINK_WAIT).await);
        }
        assert_eq!(
            bus.stats().snapshot().rejected("client_plane_not_request"),
            2
        );
        assert_eq!(seen.seen.borrow().client_frames.len(), 2);
        bus.shutdown();
    });
}

#[test]
fn multi_megabyte_frame_arrives_intact_and_a_truncated_one_is_counted() {
    run(|| async {
        let (bus, seen) = acceptor(|c| c);
        let mut tcp = raw_peer(bus.replica_addr()).await;
        let mut header = replication::wire::StateChunkHeader::new();
        header.frame.cluster = cluster_id(CLUSTER);
        header.group = replication::wire::METADATA_GROUP;
        header.nonce = 1;
        let body: Vec<u8> = (0..3 * 1024 * 1024 + 17).map(|i| (i % 251) as u8).collect();
        let frame = Frame::build(&header, &body);
        tcp.write_all(frame.as_bytes()).await.unwrap();
        assert!(wait_until(LINK_WAIT, || seen.seen.borrow().frames.len() == 1).await);
        assert!(seen.seen.borrow().frames[0].1 == frame.as_bytes());
        // Announce the same frame again, send half of it, and hang up.
        tcp.write_all(&frame.as_bytes()[..frame.as_bytes().len() / 2])
            .await
            .unwrap();
        drop(tcp);
        assert!(
            wait_until(LINK_WAIT, || bus
                .stats()
                .snapshot()
                .rejected("truncated_frame")
                == 1)
            .await
        );
        assert_eq!(seen.seen.borrow().frames.len(), 1);
        bus.shutdown();
    });
}

#[test]
fn a_newer_link_from_the_same_replica_replaces_the_older_one() {
    run(|| async {
        let (bus, seen) = acceptor(|c| c);
        let mut first = raw_peer(bus.replica_addr()).await;
        assert!(wait_until(LINK_WAIT, || bus.is_connected(0)).await);
        let mut second = raw_peer(bus.replica_addr()).await;
        assert!(
            closed_within(&mut first, LINK_WAIT).await,
            "old link closed"
        );
        assert!(
            wait_until(LINK_WAIT, || bus
                .stats()
                .snapshot()
                .link_failures
                .get("connection_replaced")
                == Some(&1))
            .await
        );
        assert!(bus.is_connected(0));
        // Traffic flows on the new link both ways.
        second
            .write_all(commit_frame(0, 4).as_bytes())
            .await
            .unwrap();
        assert!(wait_until(LINK_WAIT, || seen.seen.borrow().frames.len() == 1).await);
        bus.send(0, commit_frame(1, 5)).unwrap();
        let mut answer = vec![0u8; 256];
        second.read_exact(&mut answer).await.unwrap();
        assert_eq!(answer, commit_frame(1, 5).as_bytes());
        assert!(seen.seen.borrow().disconnected.is_empty());
        bus.shutdown();
    });
}

#[test]
fn frames_of_mixed_sizes_split_at_arbitrary_points_arrive_intact_and_in_order() {
    run(|| async {
        let (bus, seen) = acceptor(|c| c);
        let mut tcp = raw_peer(bus.replica_addr()).await;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let sizes = [0usize, 44, 1000, 4_000, 16_000, 20_000, 70_000, 200_000];
        let mut frames = Vec::new();
        for nonce in 0..600u128 {
            let body_len = sizes[(next() % sizes.len() as u64) as usize];
            if body_len == 0 {
                frames.push(commit_frame(0, nonce as u64));
                continue;
            }
            let mut header = replication::wire::StateChunkHeader::new();
            header.frame.cluster = cluster_id(CLUSTER);
            header.group = replication::wire::METADATA_GROUP;
            header.nonce = nonce + 1;
            let body: Vec<u8> = (0..body_len).map(|i| (i as u128 + nonce) as u8).collect();
            frames.push(Frame::build(&header, &body));
        }
        let stream: Vec<u8> = frames.iter().flat_map(|f| f.as_bytes().to_vec()).collect();
        let mut at = 0;
        while at < stream.len() {
            let chunk = (1 + next() % 90_000) as usize;
            let end = stream.len().min(at + chunk);
            tcp.write_all(&stream[at..end]).await.unwrap();
            at = end;
            if next() % 4 == 0 {
                glommio::timer::sleep(Duration::from_micros(200)).await;
            }
        }
        assert!(
            wait_until(Duration::from_secs(20), || seen.seen.borrow().frames.len()
                == frames.len())
            .await
        );
        for (i, frame) in frames.iter().enumerate() {
            assert!(
                seen.seen.borrow().frames[i].1 == frame.as_bytes(),
                "frame {i}"
            );
        }
        assert!(bus.stats().snapshot().rejected.is_empty());
        bus.shutdown();
    });
}

#[test]
fn client_connections_beyond_the_limit_are_closed_and_counted() {
    run(|| async {
        let (bus, _) = acceptor(|mut c| {
            c.client_listen = Some(loopback(0));
            c.client_connections_max = 2;
            c
        });
        let addr = bus.client_addr().unwrap();
        let _first = TcpStream::connect(addr).await.unwrap();
        let _second = TcpStream::connect(addr).await.unwrap();
        let mut third = TcpStream::connect(addr).await.unwrap();
        assert!(closed_within(&mut third, LINK_WAIT).await);
        assert_eq!(
            bus.stats().snapshot().rejected("client_connection_limit"),
            1
        );
        // A slot frees when a client leaves.
        drop(_first);
        settle(Duration::from_millis(100)).await;
        let mut fourth = TcpStream::connect(addr).await.unwrap();
        fourth.write_all(request(7).as_bytes()).await.unwrap();
        assert!(!closed_within(&mut fourth, Duration::from_millis(200)).await);
        bus.shutdown();
    });
}

#[test]
fn a_client_that_stalls_a_frame_body_is_cut_off_and_others_are_served() {
    run(|| async {
        let (bus, seen) = acceptor(|mut c| {
            c.client_listen = Some(loopback(0));
            c.client_body_timeout = Duration::from_millis(300);
            c
        });
        let addr = bus.client_addr().unwrap();
        // A header announcing 64 KiB of body, then a few bytes and silence.
        let mut header = RequestHeader::new();
        header.client = 9;
        header.session = 1;
        header.request = 1;
        header.operation = Operation::CreateStream as u8;
        let frame = Frame::build(&header, &vec![0u8; 64 * 1024]);
        let mut staller = TcpStream::connect(addr).await.unwrap();
        staller
            .write_all(&frame.as_bytes()[..256 + 10])
            .await
            .unwrap();
        assert!(closed_within(&mut staller, Duration::from_secs(5)).await);
        assert_eq!(bus.stats().snapshot().rejected("client_body_timeout"), 1);
        assert_eq!(bus.client_frame_memory(), 0, "its reservation was released");
        let mut other = TcpStream::connect(addr).await.unwrap();
        other.write_all(request(7).as_bytes()).await.unwrap();
        assert!(wait_until(LINK_WAIT, || seen.seen.borrow().client_frames.len() == 1).await);
        bus.shutdown();
    });
}
