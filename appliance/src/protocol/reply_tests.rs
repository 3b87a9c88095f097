//! Reply bodies round-trip, refuse truncation and padding, and never panic on bytes.

use proptest::prelude::*;
use replication::wire::batch::{BatchBuilder, NewMessage};
use replication::wire::METADATA_GROUP;

use super::codec::Writer;
use super::reply::*;
use super::BodyError;

fn metadata() -> ClusterMetadataReply {
    ClusterMetadataReply {
        nodes: vec![
            NodeInfo {
                replica_id: 0,
                address: "10.0.0.1:8090".into(),
            },
            NodeInfo {
                replica_id: 1,
                address: "10.0.0.2:8090".into(),
            },
        ],
        groups: vec![
            GroupInfo {
                group: METADATA_GROUP,
                view: 3,
                primary: 0,
            },
            GroupInfo {
                group: 1 << 32 | 1 << 20,
                view: 1,
                primary: PRIMARY_UNKNOWN,
            },
        ],
    }
}

fn stream(id: u32, name: &str) -> StreamReply {
    StreamReply {
        id,
        created_at: 1_700_000_000_000_000,
        topics_count: 0,
        size_bytes: 4096,
        messages_count: 12,
        name: name.into(),
    }
}

fn topic(id: u32, name: &str) -> TopicReply {
    TopicReply {
        id,
        created_at: 1_700_000_000_000_001,
        partitions_count: 3,
        message_expiry: 0,
        max_topic_size: u64::MAX,
        size_bytes: 2048,
        messages_count: 6,
        name: name.into(),
    }
}

/// Every encoded sample with a decoder that re-encodes what it read.
#[allow(clippy::type_complexity)]
fn samples() -> Vec<(Vec<u8>, fn(&[u8]) -> Result<Vec<u8>, BodyError>)> {
    vec![
        (LoginReply { user_id: 7 }.encode(), |b| {
            LoginReply::decode(b).map(|r| r.encode())
        }),
        (
            RegisterReply {
                user_id: 1,
                session: 42,
                server_protocol_version: 11 << 10,
                server_version: "appliance 0.1.0".into(),
            }
            .encode(),
            |b| RegisterReply::decode(b).map(|r| r.encode()),
        ),
        (
            ClusterNodesReply {
                name: "appliance-1".into(),
                nodes: vec![
                    ClusterNode {
                        name: "node-0".into(),
                        ip: "127.0.0.1".into(),
                        tcp_port: 8090,
                        role: ROLE_LEADER,
                        status: NODE_HEALTHY,
                    },
                    ClusterNode {
                        name: "node-1".into(),
                        ip: "::1".into(),
                        tcp_port: 8091,
                        role: ROLE_FOLLOWER,
                        status: NODE_UNREACHABLE,
                    },
                ],
            }
            .encode(),
            |b| ClusterNodesReply::decode(b).map(|r| r.encode()),
        ),
        (stream(4, "orders").encode(), |b| {
            StreamReply::decode(b).map(|r| r.encode())
        }),
        (
            StreamsReply {
                streams: vec![stream(1, "a"), stream(2, "bb")],
            }
            .encode(),
            |b| StreamsReply::decode(b).map(|r| r.encode()),
        ),
        (
            StreamDetailsReply {
                stream: StreamReply {
                    topics_count: 2,
                    ..stream(4, "orders")
                },
                topics: vec![topic(1, "eu"), topic(2, "us")],
            }
            .encode(),
            |b| StreamDetailsReply::decode(b).map(|r| r.encode()),
        ),
        (IdReply { id: 3 }.encode(), |b| {
            IdReply::decode(b).map(|r| r.encode())
        }),
        (
            SendConfirmations {
                confirmations: vec![SendConfirmation {
                    stream_id: 1,
                    topic_id: 2,
                    partition_id: 3,
                    base_offset: 1 << 40,
                }],
            }
            .encode(),
            |b| SendConfirmations::decode(b).map(|r| r.encode()),
        ),
        (
            ConsumerOffsetReply {
                partition_id: 2,
                current_offset: 90,
                stored_offset: 77,
            }
            .encode(),
            |b| ConsumerOffsetReply::decode(b).map(|r| r.map_or(Vec::new(), |r| r.encode())),
        ),
        (
            ConsumerGroupDetailsReply {
                group: ConsumerGroupReply {
                    id: 4,
                    partitions_count: 3,
                    members_count: 2,
                    name: "readers".into(),
                },
                members: vec![(1, vec![0, 2]), (2, vec![1])],
            }
            .encode(),
            |b| ConsumerGroupDetailsReply::decode(b).map(|r| r.encode()),
        ),
        (
            ConsumerGroupReply::encode_all(&[
                ConsumerGroupReply {
                    id: 1,
                    partitions_count: 3,
                    members_count: 0,
                    name: "a".into(),
                },
                ConsumerGroupReply {
                    id: 2,
                    partitions_count: 3,
                    members_count: 5,
                    name: "b".into(),
                },
            ]),
            |b| ConsumerGroupReply::decode_all(b).map(|g| ConsumerGroupReply::encode_all(&g)),
        ),
        (
            GroupAssignmentReply {
                generation: 9,
                partitions: vec![0, 3, 6],
            }
            .encode(),
            |b| GroupAssignmentReply::decode(b).map(|r| r.encode()),
        ),
        (
            PollRoutingReply {
                client: u128::MAX - 9,
                session: 12,
                metadata_watermark: 40,
                primary: ClusterNode {
                    name: "node-2".into(),
                    ip: "127.0.0.1".into(),
                    tcp_port: 8092,
                    role: ROLE_FOLLOWER,
                    status: NODE_HEALTHY,
                },
            }
            .encode(),
            |b| PollRoutingReply::decode(b).map(|r| r.encode()),
        ),
        (
            NotPrimaryReply {
                primary: 2,
                address: "127.0.0.1:8092".into(),
            }
            .encode(),
            |b| NotPrimaryReply::decode(b).map(|r| r.encode()),
        ),
        (metadata().encode(), |b| {
            ClusterMetadataReply::decode(b).map(|r| r.encode())
        }),
        (
            ListStreamsReply {
                streams: vec![StreamInfo {
                    stream_id: 1,
                    name: "orders".into(),
                    topic_count: 2,
                }],
            }
            .encode(),
            |b| ListStreamsReply::decode(b).map(|r| r.encode()),
        ),
        (
            ListTopicsReply {
                topics: vec![
                    TopicInfo {
                        topic_id: 1,
                        name: "eu".into(),
                        partitions: 3,
                        message_expiry: 3_600_000_000,
                        max_topic_size: 1 << 30,
                        stored: vec![PartitionRange {
                            partition: 2,
                            first_offset: 1000,
                            end_offset: 5000,
                            bytes: 4 << 20,
                            segments: 4,
                        }],
                    },
                    TopicInfo {
                        topic_id: 2,
                        name: "us".into(),
                        partitions: 1,
                        message_expiry: 0,
                        max_topic_size: u64::MAX,
                        stored: Vec::new(),
                    },
                ],
            }
            .encode(),
            |b| ListTopicsReply::decode(b).map(|r| r.encode()),
        ),
    ]
}

#[test]
fn every_reply_body_round_trips_and_refuses_truncation_and_padding() {
    for (i, (body, decode)) in samples().into_iter().enumerate() {
        assert_eq!(decode(&body).as_ref(), Ok(&body), "sample {i}");
        assert!(decode(&body[..body.len() - 1]).is_err(), "sample {i}");
        let mut padded = body.clone();
        padded.push(0);
        assert!(decode(&padded).is_err(), "sample {i}");
    }
}

#[test]
fn cluster_metadata_names_node_addresses() {
    let m = ClusterMetadataReply::decode(&metadata().encode()).unwrap();
    assert_eq!(m, metadata());
    assert_eq!(m.address_of(1), Some("10.0.0.2:8090"));
    assert_eq!(m.address_of(9), None);
}

#[test]
fn a_list_count_beyond_the_body_is_refused_before_allocating() {
    let mut body = u32::MAX.to_le_bytes().to_vec();
    body.extend_from_slice(&[0; 16]);
    assert!(matches!(
        ListStreamsReply::decode(&body),
        Err(BodyError::TooMany { .. })
    ));
    let body = 1000u32.to_le_bytes().to_vec();
    assert_eq!(
        ListTopicsReply::decode(&body),
        Err(BodyError::Truncated { field: "topics" })
    );
}

#[test]
fn zero_session_and_empty_send_reply_are_refused() {
    let zero = RegisterReply {
        user_id: 1,
        session: 0,
        server_protocol_version: 11 << 10,
        server_version: "appliance".into(),
    };
    assert!(RegisterReply::decode(&zero.encode()).is_err());
    // A result section with an entry is a refusal, not a session.
    let mut refused = zero.encode();
    refused[0] = 1;
    assert!(RegisterReply::decode(&refused).is_err());
    // No stored offset: an empty body.
    assert_eq!(ConsumerOffsetReply::decode(&[]), Ok(None));
    // Two confirmations counted, one present.
    let mut body = 2u32.to_le_bytes().to_vec();
    body.extend_from_slice(&[0; 20]);
    assert!(SendConfirmations::decode(&body).is_err());
}

fn batch(ids: std::ops::Range<u128>) -> Vec<u8> {
    let mut b = BatchBuilder::with_capacity(64);
    for id in ids {
        b.push(NewMessage {
            id,
            timestamp_delta: 0,
            payload: b"payload",
            user_headers: &[],
        });
    }
    b.finish(1)
}

fn poll_reply(messages_count: u32, batches: &[u8]) -> Vec<u8> {
    let mut w = Writer::default();
    PollHeader {
        partition_id: 2,
        current_offset: 9,
        messages_count,
    }
    .write(&mut w);
    w.raw(batches);
    w.finish()
}

#[test]
fn poll_body_splits_into_verified_batches() {
    assert!(split_poll_body(&poll_reply(0, &[])).unwrap().is_empty());
    let mut batches = batch(0..3);
    batches.extend_from_slice(&batch(3..4));
    let body = poll_reply(4, &batches);
    let split = split_poll_body(&body).unwrap();
    assert_eq!(split.len(), 2);
    assert_eq!(split[0].1.message_count, 3);
    assert_eq!(split[1].1.message_count, 1);
    let header = PollHeader::decode(&body).unwrap();
    assert_eq!((header.partition_id, header.current_offset), (2, 9));
    // A flipped payload byte fails verification; a cut batch fails framing.
    let mut bad = body.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(matches!(
        split_poll_body(&bad),
        Err(PollBodyError::Batch { .. })
    ));
    assert!(matches!(
        split_poll_body(&body[..body.len() - 1]),
        Err(PollBodyError::Framing { .. })
    ));
    assert!(matches!(
        split_poll_body(&poll_reply(0, &[0; 10])),
        Err(PollBodyError::Framing { at: 16, .. })
    ));
    // The header must count what the batches hold, and be there.
    assert!(matches!(
        split_poll_body(&poll_reply(5, &batches)),
        Err(PollBodyError::Count {
            counted: 5,
            held: 4
        })
    ));
    assert_eq!(split_poll_body(&[0; 15]), Err(PollBodyError::Header));
}

#[test]
fn reason_text_is_bounded_and_printable() {
    assert_eq!(reason_text(b"name: too long\n"), "name: too long");
    assert_eq!(reason_text(&[b'a'; 2000]).len(), 512);
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_a_reply_decoder(
        body in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        for (_, decode) in samples() {
            let _ = decode(&body);
        }
        let _ = split_poll_body(&body);
    }
}

#[test]
fn metadata_replies_carry_an_empty_result_section() {
    use replication::wire::Operation;
    let create = Operation::CreateStream as u8;
    let framed = with_result_section(create, &[9, 9]);
    assert_eq!(&*framed, [0, 0, 0, 0, 9, 9]);
    assert_eq!(strip_result_section(create, &framed), Ok(&[9u8, 9][..]));
    // A refusal entry is not an accepted reply; a cut section is refused.
    assert!(strip_result_section(create, &[1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0]).is_err());
    assert!(strip_result_section(create, &[0, 0]).is_err());
    // Reads, sends, DeleteSegments, Register and Logout are not framed; offsets writes are.
    for operation in [
        Operation::NonReplicated,
        Operation::SendMessages,
        Operation::DeleteSegments,
        Operation::Register,
        Operation::Logout,
    ] {
        assert!(!result_framed(operation as u8), "{operation:?}");
        assert!(matches!(
            with_result_section(operation as u8, &[7]),
            std::borrow::Cow::Borrowed([7])
        ));
    }
    for operation in [
        Operation::StoreConsumerOffset,
        Operation::DeleteConsumerOffset,
        Operation::LeaveConsumerGroup,
        Operation::CreateTopicWithAssignments,
    ] {
        assert!(result_framed(operation as u8), "{operation:?}");
    }
}
