//! Handshake behaviour on loopback with real sockets (docs/protocol.md, "Handshake").

mod common;

use std::time::Duration;

use common::*;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use replication::bus::Bus;
use replication::wire::{
    cluster_id, Frame, Header, ReplicaChallengeHeader, ReplicaFinishHeader, ReplicaHelloHeader,
};
use zerocopy::FromBytes;

const LINK_WAIT: Duration = Duration::from_secs(5);

/// Starts node 1 (acceptor) then node 0 (dialer) with the given configs' tweaks.
fn pair(
    tweak_1: impl FnOnce(replication::bus::BusConfig) -> replication::bus::BusConfig,
    tweak_0: impl FnOnce(replication::bus::BusConfig) -> replication::bus::BusConfig,
) -> (Bus, std::rc::Rc<Recorder>, Bus, std::rc::Rc<Recorder>) {
    let seen_1 = recorder();
    let bus_1 = Bus::start(
        tweak_1(config(1, &[loopback(0), loopback(0)])),
        seen_1.clone(),
    )
    .expect("node 1 starts");
    let seen_0 = recorder();
    let bus_0 = Bus::start(
        tweak_0(config(0, &[loopback(0), bus_1.replica_addr()])),
        seen_0.clone(),
    )
    .expect("node 0 starts");
    (bus_0, seen_0, bus_1, seen_1)
}

#[test]
fn peers_connect_and_exchange_frames_both_ways_without_auth() {
    run(|| async {
        let (bus_0, seen_0, bus_1, seen_1) = pair(|c| c, |c| c);
        assert!(wait_until(LINK_WAIT, || bus_0.is_connected(1) && bus_1.is_connected(0)).await);
        bus_0.send(1, commit_frame(0, 7)).unwrap();
        bus_1.send(0, commit_frame(1, 8)).unwrap();
        assert!(
            wait_until(LINK_WAIT, || !seen_0.seen.borrow().frames.is_empty()
                && !seen_1.seen.borrow().frames.is_empty())
            .await
        );
        assert_eq!(seen_1.seen.borrow().frames[0].0, 0);
        assert_eq!(
            seen_1.seen.borrow().frames[0].1,
            commit_frame(0, 7).as_bytes()
        );
        assert_eq!(
            seen_0.seen.borrow().frames[0].1,
            commit_frame(1, 8).as_bytes()
        );
        assert_eq!(seen_1.seen.borrow().commits, [7]);
        assert_eq!(seen_0.seen.borrow().commits, [8]);
        let stats = bus_0.stats().snapshot();
        assert_eq!(stats.peer(1).unwrap().frames_sent, 1);
        assert!(stats.peer(1).unwrap().connected);
        bus_0.shutdown();
        bus_1.shutdown();
    });
}

#[test]
fn authenticated_peers_connect_and_exchange_frames() {
    run(|| async {
        let (bus_0, _, bus_1, seen_1) = pair(
            |c| with_auth(c, SECRET, None),
            |c| with_auth(c, SECRET, None),
        );
        assert!(wait_until(LINK_WAIT, || bus_0.is_connected(1) && bus_1.is_connected(0)).await);
        bus_0.send(1, commit_frame(0, 1)).unwrap();
        assert!(wait_until(LINK_WAIT, || seen_1.seen.borrow().frames.len() == 1).await);
        bus_0.shutdown();
        bus_1.shutdown();
    });
}

#[test]
fn node_of_another_cluster_is_refused_even_without_auth() {
    run(|| async {
        let (bus_0, _, bus_1, _) = pair(
            |c| c,
            |mut c| {
                c.cluster_name = "another-cluster".into();
                c
            },
        );
        assert!(
            wait_until(LINK_WAIT, || bus_1
                .stats()
                .snapshot()
                .rejected("handshake_cluster_mismatch")
                >= 2)
            .await
        );
        // The dialer sees status 2 and drops the link it thought was up.
        assert!(
            wait_until(LINK_WAIT, || bus_0
                .stats()
                .snapshot()
                .rejected("handshake_refused_by_peer")
                >= 1)
            .await
        );
        settle(Duration::from_millis(100)).await;
        assert!(!bus_1.is_connected(0));
        bus_0.shutdown();
        bus_1.shutdown();
    });
}

/// Sends a hello as `replica` and returns the acceptor's answer (None on close).
async fn hello_from(
    addr: std::net::SocketAddr,
    replica: u8,
    cluster: u128,
    nonce_d: [u8; 32],
) -> (TcpStream, Option<ReplicaChallengeHeader>) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let mut hello = ReplicaHelloHeader::new();
    hello.frame.cluster = cluster;
    hello.frame.replica = replica;
    hello.nonce_d = nonce_d;
    tcp.write_all(Frame::build(&hello, &[]).as_bytes())
        .await
        .unwrap();
    let mut answer = [0u8; 256];
    let challenge = match tcp.read_exact(&mut answer).await {
        Ok(()) => ReplicaChallengeHeader::read_from_bytes(&answer).ok(),
        Err(_) => None,
    };
    (tcp, challenge)
}

#[test]
fn dial_in_the_wrong_direction_is_refused_with_status_3() {
    run(|| async {
        // Node 1 of a 3-node roster accepts only from replica 0.
        let seen = recorder();
        let bus = Bus::start(config(1, &[loopback(0), loopback(0), loopback(0)]), seen).unwrap();
        for (replica, expected) in [(2u8, 3u8), (1, 3), (9, 3)] {
            let (_, challenge) =
                hello_from(bus.replica_addr(), replica, cluster_id(CLUSTER), [0; 32]).await;
            let challenge = challenge.expect("status answered");
            assert_eq!(challenge.status, expected, "replica {replica}");
            assert_eq!(challenge.frame.command, 15);
        }
        let stats = bus.stats().snapshot();
        assert_eq!(stats.rejected("handshake_directional_rule"), 3);
        assert!(!bus.is_connected(2));
        bus.shutdown();
    });
}

#[test]
fn first_frame_other_than_hello_is_refused_with_status_1() {
    run(|| async {
        let seen = recorder();
        let bus = Bus::start(config(1, &[loopback(0), loopback(0)]), seen.clone()).unwrap();
        let mut tcp = TcpStream::connect(bus.replica_addr()).await.unwrap();
        tcp.write_all(commit_frame(0, 1).as_bytes()).await.unwrap();
        let mut answer = [0u8; 256];
        tcp.read_exact(&mut answer).await.unwrap();
        assert_eq!(answer[60], 15);
        assert_eq!(answer[192], 1);
        let mut rest = Vec::new();
        assert_eq!(
            tcp.read_to_end(&mut rest).await.unwrap_or(0),
            0,
            "closed after status"
        );
        assert_eq!(
            bus.stats().snapshot().rejected("handshake_unknown_command"),
            1
        );
        assert!(seen.seen.borrow().frames.is_empty());
        bus.shutdown();
    });
}

#[test]
fn different_secrets_fail_with_a_mac_mismatch() {
    run(|| async {
        let (bus_0, _, bus_1, _) = pair(
            |c| with_auth(c, SECRET, None),
            |c| with_auth(c, OTHER_SECRET, None),
        );
        assert!(
            wait_until(LINK_WAIT, || bus_0
                .stats()
                .snapshot()
                .rejected("handshake_mac_mismatch")
                >= 2)
            .await
        );
        assert!(!bus_0.is_connected(1));
        assert!(!bus_1.is_connected(0));
        bus_0.shutdown();
        bus_1.shutdown();
    });
}

#[test]
fn acceptor_mac_replayed_as_the_dialer_mac_is_refused() {
    run(|| async {
        let bus = Bus::start(
            with_auth(config(1, &[loopback(0), loopback(0)]), SECRET, None),
            recorder(),
        )
        .unwrap();
        let (mut tcp, challenge) =
            hello_from(bus.replica_addr(), 0, cluster_id(CLUSTER), [5; 32]).await;
        let challenge = challenge.expect("challenge");
        assert_eq!(challenge.status, 0);
        // An attacker without the secret reflects mac_a back as mac_d.
        let mut finish = ReplicaFinishHeader::new();
        finish.frame.cluster = cluster_id(CLUSTER);
        finish.frame.replica = 0;
        finish.mac_d = challenge.mac_a;
        tcp.write_all(Frame::build(&finish, &[]).as_bytes())
            .await
            .unwrap();
        tcp.write_all(commit_frame(0, 1).as_bytes()).await.unwrap();
        let mut rest = Vec::new();
        let _ = tcp.read_to_end(&mut rest).await;
        assert!(rest.is_empty(), "nothing is sent after a failed finish");
        assert!(
            wait_until(LINK_WAIT, || bus
                .stats()
                .snapshot()
                .rejected("handshake_mac_mismatch")
                == 1)
            .await
        );
        assert!(!bus.is_connected(0));
        bus.shutdown();
    });
}

#[test]
fn unauthenticated_peer_cannot_join_an_authenticated_node() {
    run(|| async {
        let (bus_0, seen_0, bus_1, seen_1) = pair(|c| with_auth(c, SECRET, None), |c| c);
        assert!(
            wait_until(LINK_WAIT, || bus_1
                .stats()
                .snapshot()
                .rejected("handshake_auth_required")
                >= 2)
            .await
        );
        // The unauthenticated dialer believes its hello went through and sends traffic;
        // none of it is delivered.
        let _ = bus_0.send(1, commit_frame(0, 1));
        settle(Duration::from_millis(100)).await;
        assert!(!bus_1.is_connected(0));
        assert!(seen_1.seen.borrow().frames.is_empty());
        assert!(seen_1.seen.borrow().connected.is_empty());
        assert!(seen_0.seen.borrow().frames.is_empty());
        bus_0.shutdown();
        bus_1.shutdown();
    });
}

#[test]
fn authenticated_dialer_refuses_an_unauthenticated_acceptor() {
    run(|| async {
        let (bus_0, seen_0, bus_1, _) = pair(|c| c, |c| with_auth(c, SECRET, None));
        // The acceptor (no auth) sends no challenge; the dialer times out waiting.
        assert!(
            wait_until(LINK_WAIT, || bus_0
                .stats()
                .snapshot()
                .rejected("handshake_timeout")
                >= 1)
            .await
        );
        assert!(seen_0.seen.borrow().connected.is_empty());
        bus_0.shutdown();
        bus_1.shutdown();
    });
}

#[test]
fn rotation_window_accepts_the_old_secret_only_as_previous() {
    run(|| async {
        // Mid-rotation: node 1 already MACs under the new secret, node 0 still under the
        // old one; each holds the other's as previous.
        let (bus_0, _, bus_1, _) = pair(
            |c| with_auth(c, OTHER_SECRET, Some(SECRET)),
            |c| with_auth(c, SECRET, Some(OTHER_SECRET)),
        );
        assert!(wait_until(LINK_WAIT, || bus_0.is_connected(1) && bus_1.is_connected(0)).await);
        bus_0.shutdown();
        bus_1.shutdown();

        // The old secret as the only secret is refused by a node that moved on.
        let (bus_0, _, bus_1, _) = pair(
            |c| with_auth(c, OTHER_SECRET, None),
            |c| with_auth(c, SECRET, Some(OTHER_SECRET)),
        );
        assert!(
            wait_until(LINK_WAIT, || bus_1
                .stats()
                .snapshot()
                .rejected("handshake_mac_mismatch")
                >= 2)
            .await
        );
        assert!(!bus_1.is_connected(0));
        bus_0.shutdown();
        bus_1.shutdown();

        // Previous is only for verification: a node holding the old secret only as
        // previous never MACs with it, so a peer holding only the old secret fails.
        let (bus_0, _, bus_1, _) = pair(
            |c| with_auth(c, OTHER_SECRET, Some(SECRET)),
            |c| with_auth(c, SECRET, None),
        );
        assert!(
            wait_until(LINK_WAIT, || bus_0
                .stats()
                .snapshot()
                .rejected("handshake_mac_mismatch")
                >= 2)
            .await
        );
        assert!(!bus_0.is_connected(1));
        bus_0.shutdown();
        bus_1.shutdown();
    });
}

#[test]
fn dialer_reconnects_after_the_acceptor_restarts() {
    run(|| async {
        let (bus_0, seen_0, bus_1, _) = pair(|c| c, |c| c);
        assert!(wait_until(LINK_WAIT, || bus_0.is_connected(1)).await);
        let addr = bus_1.replica_addr();
        bus_1.shutdown();
        drop(bus_1);
        assert!(wait_until(LINK_WAIT, || !bus_0.is_connected(1)).await);
        let mut config_1 = config(1, &[loopback(0), loopback(0)]);
        config_1.replica_listen = addr;
        let bus_1 = Bus::start(config_1, recorder()).expect("restart on the same port");
        assert!(wait_until(LINK_WAIT, || bus_0.is_connected(1) && bus_1.is_connected(0)).await);
        assert!(seen_0.seen.borrow().connected[&1] >= 2);
        bus_0.shutdown();
        bus_1.shutdown();
    });
}

#[test]
fn three_nodes_form_one_link_per_pair_and_broadcast_reaches_all() {
    run(|| async {
        let seen_2 = recorder();
        let bus_2 = Bus::start(
            config(2, &[loopback(0), loopback(0), loopback(0)]),
            seen_2.clone(),
        )
        .unwrap();
        let seen_1 = recorder();
        let bus_1 = Bus::start(
            config(1, &[loopback(0), loopback(0), bus_2.replica_addr()]),
            seen_1.clone(),
        )
        .unwrap();
        let seen_0 = recorder();
        let bus_0 = Bus::start(
            config(
                0,
                &[loopback(0), bus_1.replica_addr(), bus_2.replica_addr()],
            ),
            seen_0.clone(),
        )
        .unwrap();
        let buses = [&bus_0, &bus_1, &bus_2];
        assert!(
            wait_until(LINK_WAIT, || {
                (0..3u8).all(|a| {
                    (0..3u8)
                        .filter(|b| *b != a)
                        .all(|b| buses[a as usize].is_connected(b))
                })
            })
            .await
        );
        assert_eq!(bus_1.broadcast(commit_frame(1, 5)), 2);
        assert!(
            wait_until(LINK_WAIT, || seen_0.seen.borrow().frames.len() == 1
                && seen_2.seen.borrow().frames.len() == 1)
            .await
        );
        assert_eq!(seen_0.seen.borrow().frames[0].0, 1);
        assert_eq!(seen_2.seen.borrow().frames[0].0, 1);
        settle(Duration::from_millis(100)).await;
        // Exactly one handshake per pair: nobody reconnected or replaced a link.
        for (seen, expected) in [(&seen_0, 2usize), (&seen_1, 2), (&seen_2, 2)] {
            let seen = seen.seen.borrow();
            assert_eq!(seen.connected.len(), expected);
            assert!(seen.connected.values().all(|count| *count == 1));
            assert!(seen.disconnected.is_empty());
        }
        for bus in buses {
            assert!(!bus
                .stats()
                .snapshot()
                .link_failures
                .contains_key("connection_replaced"));
            bus.shutdown();
        }
    });
}

#[test]
fn a_node_never_dials_a_lower_replica() {
    run(|| async {
        // Replica 0's address is a listener that records connections.
        let listener = glommio::net::TcpListener::bind(loopback(0)).unwrap();
        let addr_0 = listener.local_addr().unwrap();
        let accepted = std::rc::Rc::new(std::cell::Cell::new(0u32));
        let counter = accepted.clone();
        let task = glommio::spawn_local(async move {
            while listener.accept().await.is_ok() {
                counter.set(counter.get() + 1);
            }
        })
        .detach();
        let bus_1 = Bus::start(config(1, &[addr_0, loopback(0)]), recorder()).unwrap();
        settle(Duration::from_millis(300)).await;
        assert_eq!(accepted.get(), 0, "replica 1 dialed replica 0");
        assert!(!bus_1.is_connected(0));
        bus_1.shutdown();
        task.cancel();
    });
}

/// A fake acceptor that answers every hello with a challenge carrying `status`.
fn fake_acceptor(status: u8) -> std::net::SocketAddr {
    let listener = glommio::net::TcpListener::bind(loopback(0)).unwrap();
    let addr = listener.local_addr().unwrap();
    glommio::spawn_local(async move {
        while let Ok(mut tcp) = listener.accept().await {
            let mut hello = [0u8; 256];
            if tcp.read_exact(&mut hello).await.is_err() {
                continue;
            }
            let mut challenge = ReplicaChallengeHeader::new();
            challenge.frame.cluster = cluster_id(CLUSTER);
            challenge.frame.replica = 1;
            challenge.nonce_a = [3; 32];
            challenge.status = status;
            let _ = tcp
                .write_all(Frame::build(&challenge, &[]).as_bytes())
                .await;
        }
    })
    .detach();
    addr
}

#[test]
fn dialer_treats_unknown_and_log_only_status_bytes_as_refusals() {
    run(|| async {
        for (status, reason) in [
            (77u8, "handshake_status_unknown"),
            (255, "handshake_status_unknown"),
            (4, "handshake_refused_by_peer"),
            (5, "handshake_refused_by_peer"),
            (3, "handshake_refused_by_peer"),
        ] {
            let addr = fake_acceptor(status);
            let seen = recorder();
            let bus_0 = Bus::start(
                with_auth(config(0, &[loopback(0), addr]), SECRET, None),
                seen.clone(),
            )
            .unwrap();
            assert!(
                wait_until(LINK_WAIT, || bus_0.stats().snapshot().rejected(reason) >= 1).await,
                "status {status}"
            );
            assert!(!bus_0.is_connected(1));
            assert!(seen.seen.borrow().connected.is_empty());
            bus_0.shutdown();
        }
    });
}
