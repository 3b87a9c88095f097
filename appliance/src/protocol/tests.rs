//! Request bodies round-trip and malformed bodies are refused with typed errors.

use proptest::prelude::*;
use replication::wire::{Operation, PartitionKey};

use super::request::{ConsumerRef, GroupRef, Identifier, OffsetTarget, Partitioning};
use super::*;

fn key() -> PartitionKey {
    PartitionKey {
        stream: 1,
        topic: 2,
        partition: 3,
    }
}

fn samples() -> Vec<ClientRequest<'static>> {
    let perm = StreamPermission {
        stream_id: 4,
        read: true,
        write: false,
        manage: true,
    };
    let global = StreamPermission {
        stream_id: 0,
        read: false,
        write: true,
        manage: false,
    };
    let version = ClientVersion {
        protocol_version: request::PROTOCOL_VERSION,
        sdk_name: "rust-sdk".into(),
        sdk_version: "0.11.0".into(),
    };
    vec![
        ClientRequest::Register {
            version: version.clone(),
            credentials: Credentials::Password {
                username: "iggy".into(),
                password: b"iggy".to_vec(),
            },
            context: Some("orders-service".into()),
        },
        ClientRequest::Register {
            version,
            credentials: Credentials::Token(b"token-1".to_vec()),
            context: None,
        },
        ClientRequest::Ping,
        ClientRequest::Logout,
        ClientRequest::CreateStream {
            name: "orders".into(),
        },
        ClientRequest::DeleteStream {
            stream: request::Identifier::Id(1),
        },
        ClientRequest::DeleteStream {
            stream: request::Identifier::Name("orders".into()),
        },
        ClientRequest::GetStream {
            stream: request::Identifier::Name("orders".into()),
        },
        ClientRequest::GetStreams,
        ClientRequest::ClusterNodes,
        ClientRequest::CreateTopic {
            stream: request::Identifier::Id(1),
            name: "eu".into(),
            partitions: 3,
            options: options::TopicOptions::encode(Retention {
                message_expiry: 7 * 86_400_000_000,
                max_topic_size: u64::MAX,
            }),
        },
        ClientRequest::CreateTopic {
            stream: request::Identifier::Name("orders".into()),
            name: "us".into(),
            partitions: 1,
            options: Vec::new(),
        },
        ClientRequest::UpdateTopic {
            stream: request::Identifier::Id(1),
            topic: request::Identifier::Name("eu".into()),
            name: "eu".into(),
            options: options::TopicOptions::encode_all(Retention {
                message_expiry: 0,
                max_topic_size: 10 << 30,
            }),
        },
        ClientRequest::DeleteTopic {
            stream: request::Identifier::Id(1),
            topic: request::Identifier::Id(2),
        },
        ClientRequest::GetTopic {
            stream: request::Identifier::Name("orders".into()),
            topic: request::Identifier::Id(2),
        },
        ClientRequest::GetTopics {
            stream: request::Identifier::Id(1),
        },
        ClientRequest::CreatePartitions {
            stream: request::Identifier::Id(1),
            topic: request::Identifier::Id(2),
            count: 4,
        },
        ClientRequest::DeletePartitions {
            stream: request::Identifier::Name("orders".into()),
            topic: request::Identifier::Name("eu".into()),
            count: 1,
        },
        ClientRequest::CreateUser {
            username: "ana".into(),
            password: b"pw-123".to_vec(),
            status: 2,
            permissions: vec![perm],
            options: Vec::new(),
        },
        ClientRequest::DeleteUser {
            user: Identifier::Id(7),
        },
        ClientRequest::UpdateUser {
            user: Identifier::Name("ana".into()),
            username: Some("bea".into()),
            status: None,
            options: Vec::new(),
        },
        ClientRequest::ChangePassword {
            user: Identifier::Id(7),
            current_password: b"old".to_vec(),
            new_password: b"new".to_vec(),
        },
        ClientRequest::UpdatePermissions {
            user: Identifier::Id(7),
            permissions: vec![global, perm],
        },
        ClientRequest::CreateToken {
            name: "ci".into(),
            expiry: 60_000_000,
        },
        ClientRequest::DeleteToken { name: "ci".into() },
        ClientRequest::UpdateStream {
            stream: Identifier::Id(3),
            name: "renamed".into(),
        },
        ClientRequest::PurgeStream {
            stream: Identifier::Name("orders".into()),
        },
        ClientRequest::PurgeTopic {
            stream: Identifier::Id(1),
            topic: Identifier::Id(2),
        },
        ClientRequest::GetUser {
            user: Identifier::Name("ana".into()),
        },
        ClientRequest::GetUsers,
        ClientRequest::GetTokens,
        ClientRequest::GetMe,
        ClientRequest::GetClient { client_id: 4 },
        ClientRequest::GetClients,
        ClientRequest::GetStats,
        ClientRequest::LoginWithToken {
            token: b"0123abcd".to_vec(),
        },
        ClientRequest::CreateConsumerGroup {
            stream: Identifier::Id(1),
            topic: Identifier::Name("t".into()),
            name: "g".into(),
        },
        ClientRequest::DeleteConsumerGroup {
            group: GroupRef::ids(1, 2, 5),
        },
        ClientRequest::JoinConsumerGroup {
            group: GroupRef {
                stream: Identifier::Name("s".into()),
                topic: Identifier::Id(2),
                group: Identifier::Name("readers".into()),
            },
        },
        ClientRequest::LeaveConsumerGroup {
            group: GroupRef::ids(1, 2, 5),
        },
        ClientRequest::GetConsumerGroup {
            group: GroupRef::ids(1, 2, 5),
        },
        ClientRequest::GetConsumerGroups {
            stream: Identifier::Id(1),
            topic: Identifier::Id(2),
        },
        ClientRequest::SyncConsumerGroup {
            group: GroupRef::ids(1, 2, 5),
        },
        ClientRequest::SendMessages {
            stream: Identifier::Id(1),
            topic: Identifier::Name("orders".into()),
            partitioning: Partitioning::PartitionId(3),
            messages_count: 4,
            batch: b"batch bytes",
        },
        ClientRequest::SendMessages {
            stream: Identifier::Name("s".into()),
            topic: Identifier::Id(2),
            partitioning: Partitioning::Balanced,
            messages_count: 1,
            batch: b"batch bytes",
        },
        ClientRequest::SendMessages {
            stream: Identifier::Id(1),
            topic: Identifier::Id(2),
            partitioning: Partitioning::MessagesKey(b"customer-7"),
            messages_count: 1,
            batch: b"batch bytes",
        },
        ClientRequest::StoreConsumerOffset {
            target: OffsetTarget::of(key(), Consumer::Group(5)),
            offset: 99,
        },
        ClientRequest::StoreConsumerOffset {
            target: OffsetTarget {
                consumer: ConsumerRef::Single(Identifier::Name("billing".into())),
                stream: Identifier::Name("s".into()),
                topic: Identifier::Id(2),
                partition: None,
            },
            offset: 0,
        },
        ClientRequest::DeleteConsumerOffset {
            target: OffsetTarget::of(key(), Consumer::Single(6)),
        },
        ClientRequest::DeleteSegments {
            stream: Identifier::Name("s".into()),
            topic: Identifier::Id(2),
            partition: 3,
            segments: 2,
        },
        ClientRequest::Login {
            username: "ana".into(),
            password: b"pw".to_vec(),
            version: Some("0.11.0".into()),
            context: None,
        },
        ClientRequest::ClusterMetadata,
        ClientRequest::ListStreams,
        ClientRequest::ListTopics { stream_id: 1 },
        ClientRequest::PollMessages {
            target: OffsetTarget::of(key(), Consumer::Single(1)),
            strategy: PollStrategy::Timestamp(5),
            count: 10,
            auto_commit: true,
        },
        ClientRequest::PollMessages {
            target: OffsetTarget {
                consumer: ConsumerRef::Group(Identifier::Name("g".into())),
                stream: Identifier::Name("s".into()),
                topic: Identifier::Name("t".into()),
                partition: None,
            },
            strategy: PollStrategy::Next,
            count: 1,
            auto_commit: false,
        },
        ClientRequest::GetConsumerOffset {
            target: OffsetTarget::of(key(), Consumer::Single(1)),
        },
        ClientRequest::GetPollRouting {
            target: OffsetTarget::of(key(), Consumer::Single(1)),
            strategy: PollStrategy::Next,
            count: 10,
            auto_commit: true,
        },
        ClientRequest::GetConsumerOffsetRouting {
            target: OffsetTarget::of(key(), Consumer::Group(3)),
        },
        ClientRequest::AttachConsumerSession {
            client: u128::MAX - 5,
            session: 7,
            metadata_watermark: 11,
        },
    ]
    .into_iter()
    .chain(
        [
            PollStrategy::First,
            PollStrategy::Last,
            PollStrategy::Offset(1 << 40),
        ]
        .map(|strategy| ClientRequest::PollMessages {
            target: OffsetTarget {
                consumer: ConsumerRef::Single(Identifier::Name("reader".into())),
                stream: Identifier::Id(1),
                topic: Identifier::Id(2),
                partition: Some(0),
            },
            strategy,
            count: 7,
            auto_commit: false,
        }),
    )
    .collect()
}

#[test]
fn every_request_body_round_trips() {
    for request in samples() {
        let (operation, read) = request.operation();
        let body = request.encode();
        assert_eq!(
            ClientRequest::decode(operation, read, &body),
            Ok(request.clone()),
            "{request:?}"
        );
    }
}

#[test]
fn truncated_and_padded_bodies_are_refused() {
    for request in samples() {
        let (operation, read) = request.operation();
        let body = request.encode();
        if !body.is_empty() && operation != Operation::SendMessages {
            assert!(
                ClientRequest::decode(operation, read, &body[..body.len() - 1]).is_err(),
                "{request:?}"
            );
            let mut padded = body.clone();
            padded.push(0);
            assert!(
                ClientRequest::decode(operation, read, &padded).is_err(),
                "{request:?}"
            );
        }
    }
}

#[test]
fn internal_operations_are_refused_and_unknown_reads_told_apart() {
    assert!(matches!(
        ClientRequest::decode(Operation::TruncatePartition, 0, &[]),
        Err(BodyError::Invalid {
            field: "operation",
            ..
        })
    ));
    assert_eq!(
        ClientRequest::decode(Operation::NonReplicated, 99, &[]),
        Ok(ClientRequest::Unsupported { code: 99 })
    );
}

#[test]
fn field_ranges_are_enforced() {
    // An empty name.
    assert!(ClientRequest::decode(Operation::CreateStream, 0, &[0]).is_err());
    // A name that is not UTF-8.
    assert_eq!(
        ClientRequest::decode(Operation::CreateStream, 0, &[2, 0xff, 0xfe]),
        Err(BodyError::NotUtf8 { field: "name" })
    );
    // An identifier of an unknown kind, and a numeric one of the wrong length.
    let mut body = vec![3, 4];
    body.extend_from_slice(&[0; 12]);
    assert!(ClientRequest::decode(Operation::DeleteSegments, 0, &body).is_err());
    body[0] = 1;
    body[1] = 2;
    assert!(ClientRequest::decode(Operation::DeleteSegments, 0, &body).is_err());
    // Too many permissions.
    let streams: Vec<(u32, [u8; 6])> = (1..=1025).map(|id| (id, READER)).collect();
    assert!(matches!(
        ClientRequest::decode(
            Operation::UpdatePermissions,
            0,
            &permissions_body(&streams, false)
        ),
        Err(BodyError::TooMany { .. })
    ));
    // A poll of zero messages.
    let poll = ClientRequest::PollMessages {
        target: OffsetTarget::of(key(), Consumer::Single(1)),
        strategy: PollStrategy::Offset(0),
        count: 0,
        auto_commit: false,
    };
    assert!(ClientRequest::decode(
        Operation::NonReplicated,
        ReadCommand::PollMessages as u32,
        &poll.encode()
    )
    .is_err());
}

#[test]
fn status_codes_round_trip() {
    use status::{code, PIPELINE_FULL_REASON};
    let all = [
        Status::Ok,
        Status::NotPrimary,
        Status::InvalidRequest,
        Status::NotFound,
        Status::AlreadyExists,
        Status::PermissionDenied,
        Status::Unauthenticated,
        Status::InvalidCredentials,
        Status::LimitReached,
        Status::PipelineFull,
        Status::NoSession,
        Status::StaleRequest,
        Status::Unavailable,
        Status::StorageFull,
        Status::FeatureUnavailable,
        Status::IncompatibleProtocol,
        Status::UnsupportedOption,
        Status::InvalidOptionValue,
    ];
    let not_primary = reply::NotPrimaryReply {
        primary: 2,
        address: "127.0.0.1:8092".into(),
    }
    .encode();
    for operation in Operation::ALL {
        for status in all {
            let body: &[u8] = match status {
                Status::NotPrimary => &not_primary,
                Status::PipelineFull => PIPELINE_FULL_REASON,
                _ => &[],
            };
            let wire = status.wire_code(*operation as u8);
            assert_eq!(
                Status::from_reply(wire, body),
                Some(status),
                "{status:?} in a reply to {operation:?} ({wire})"
            );
        }
    }
    // The codes the Iggy SDK maps to its own errors.
    let create_stream = Operation::CreateStream as u8;
    assert_eq!(Status::Unauthenticated.wire_code(0), 40);
    assert_eq!(Status::InvalidCredentials.wire_code(0), 42);
    assert_eq!(Status::NotPrimary.wire_code(0), 58);
    assert_eq!(Status::Unavailable.wire_code(0), 58);
    assert_eq!(Status::AlreadyExists.wire_code(create_stream), 1012);
    assert_eq!(
        Status::AlreadyExists.wire_code(Operation::CreateUser as u8),
        code::USER_ALREADY_EXISTS
    );
    assert_eq!(Status::FeatureUnavailable.wire_code(0), 5);
    assert_eq!(Status::from_wire(999), None);
    assert!(!Status::StorageFull.is_retryable());
    assert!(Status::NotPrimary.is_retryable());
    assert!(!Status::PermissionDenied.is_retryable());
}

/// A LoginRegister body laid out field by field as Iggy's SDK 0.11.0 sends it.
fn iggy_login_register(username: &str, password: &str, context: &str) -> Vec<u8> {
    let mut body = (11u32 << 10).to_le_bytes().to_vec();
    for name in ["rust-sdk", "0.11.0", username] {
        body.push(name.len() as u8);
        body.extend_from_slice(name.as_bytes());
    }
    body.push(password.len() as u8);
    body.extend_from_slice(password.as_bytes());
    body.extend_from_slice(&(context.len() as u32).to_le_bytes());
    body.extend_from_slice(context.as_bytes());
    body
}

#[test]
fn iggy_login_bodies_decode() {
    let body = iggy_login_register("iggy", "secret", "");
    let ClientRequest::Register {
        version,
        credentials,
        context,
    } = ClientRequest::decode(Operation::Register, 0, &body).unwrap()
    else {
        panic!("not a Register");
    };
    assert_eq!(version.protocol_version, 11 << 10);
    assert!(request::protocol_compatible(version.protocol_version));
    assert!(!request::protocol_compatible(12 << 10));
    assert!(!request::protocol_compatible(1 << 20 | 11 << 10));
    assert_eq!(version.sdk_name, "rust-sdk");
    assert_eq!(
        credentials,
        Credentials::Password {
            username: "iggy".into(),
            password: b"secret".to_vec()
        }
    );
    assert_eq!(context, None);
    // A token login: the version prefix, then the token alone.
    let mut token = body[..4 + 9 + 7].to_vec();
    token.push(5);
    token.extend_from_slice(b"abcde");
    token.extend_from_slice(&3u32.to_le_bytes());
    token.extend_from_slice(b"ctx");
    let decoded = ClientRequest::decode(Operation::Register, 0, &token).unwrap();
    assert!(matches!(
        decoded,
        ClientRequest::Register { credentials: Credentials::Token(ref t), context: Some(ref c), .. }
            if t == b"abcde" && c == "ctx"
    ));
    // An empty Register (no credentials) and a cut body are refused.
    assert!(ClientRequest::decode(Operation::Register, 0, &[]).is_err());
    assert!(ClientRequest::decode(Operation::Register, 0, &body[..body.len() - 2]).is_err());
    // Iggy's read codes the appliance does not serve are told apart, body and all.
    assert_eq!(
        ClientRequest::decode(Operation::NonReplicated, 11, &[1, 2, 3]),
        Ok(ClientRequest::Unsupported { code: 11 })
    );
    assert_eq!(
        ClientRequest::decode(Operation::NonReplicated, 1, &[]),
        Ok(ClientRequest::Ping)
    );
    // UpdateStream takes a name and no options.
    assert_eq!(
        ClientRequest::decode(Operation::UpdateStream, 0, &[1, 4, 7, 0, 0, 0, 1, b'x']),
        Ok(ClientRequest::UpdateStream {
            stream: request::Identifier::Id(7),
            name: "x".into()
        })
    );
}

#[test]
fn identifiers_decode_as_iggy_lays_them_out() {
    use request::Identifier;
    let by_id = [1, 4, 7, 0, 0, 0];
    let by_name = [2, 6, b'o', b'r', b'd', b'e', b'r', b's'];
    fn decode(body: &[u8]) -> Result<ClientRequest<'_>, BodyError> {
        ClientRequest::decode(Operation::DeleteStream, 0, body)
    }
    assert_eq!(
        decode(&by_id),
        Ok(ClientRequest::DeleteStream {
            stream: Identifier::Id(7)
        })
    );
    assert_eq!(
        decode(&by_name),
        Ok(ClientRequest::DeleteStream {
            stream: Identifier::Name("orders".into())
        })
    );
    // A numeric id of another length, an empty name, a kind 3, a cut name.
    for bad in [
        &[1, 2, 7, 0][..],
        &[2, 0],
        &[3, 4, 7, 0, 0, 0],
        &by_name[..5],
    ] {
        assert!(decode(bad).is_err(), "{bad:?}");
    }
}

proptest! {
    #[test]
    fn arbitrary_bodies_never_panic_any_decoder(
        body in proptest::collection::vec(any::<u8>(), 0..256),
        read in proptest::sample::select(vec![0u32, 1, 2, 3, 4, 5, 6, 12, 38, 200, 201, 300, 301, 999]),
    ) {
        for operation in Operation::ALL {
            let _ = ClientRequest::decode(*operation, read, &body);
        }
    }
}

#[test]
fn a_poll_sent_to_the_primary_reads_as_a_poll() {
    let poll = ClientRequest::PollMessages {
        target: OffsetTarget::of(key(), Consumer::Single(4)),
        strategy: PollStrategy::Next,
        count: 3,
        auto_commit: true,
    };
    let body = poll.encode();
    let decoded = ClientRequest::decode(
        Operation::NonReplicated,
        ReadCommand::PollMessagesOnPrimary as u32,
        &body,
    );
    assert_eq!(decoded, Ok(poll));
}

/// A stream's read flags in Iggy's order (manage_stream, read_stream, manage_topics,
/// read_topics, poll_messages, send_messages).
const READER: [u8; 6] = [0, 1, 0, 1, 1, 0];

/// An UpdatePermissions body for user 7: no global rights, these streams, and one
/// topic entry on the first stream if `topic_level`.
fn permissions_body(streams: &[(u32, [u8; 6])], topic_level: bool) -> Vec<u8> {
    let mut tree = vec![0u8; 10];
    tree.push(u8::from(!streams.is_empty()));
    for (i, (id, flags)) in streams.iter().enumerate() {
        tree.extend_from_slice(&id.to_le_bytes());
        tree.extend_from_slice(flags);
        if topic_level && i == 0 {
            tree.push(1);
            tree.extend_from_slice(&1u32.to_le_bytes());
            tree.extend_from_slice(&[1, 1, 1, 1, 0]);
        } else {
            tree.push(0);
        }
        tree.push(u8::from(i + 1 < streams.len()));
    }
    let mut body = vec![1, 4, 7, 0, 0, 0, 1];
    body.extend_from_slice(&(tree.len() as u32).to_le_bytes());
    body.extend_from_slice(&tree);
    body
}

#[test]
fn iggy_permission_trees_map_to_stream_rights_or_are_refused() {
    use request::Identifier;
    fn decode(body: &[u8]) -> Result<ClientRequest<'_>, BodyError> {
        ClientRequest::decode(Operation::UpdatePermissions, 0, body)
    }
    // Whole groups map to rights: read on 3, read + write + manage on 9.
    let body = permissions_body(&[(3, READER), (9, [1, 1, 1, 1, 1, 1])], false);
    let expected = vec![
        StreamPermission {
            stream_id: 3,
            read: true,
            write: false,
            manage: false,
        },
        StreamPermission {
            stream_id: 9,
            read: true,
            write: true,
            manage: true,
        },
    ];
    assert_eq!(
        decode(&body),
        Ok(ClientRequest::UpdatePermissions {
            user: Identifier::Id(7),
            permissions: expected,
        })
    );
    // Half a right (poll without read_stream) would widen or narrow: refused.
    let half = permissions_body(&[(3, [0, 0, 0, 1, 1, 0])], false);
    assert!(matches!(decode(&half), Err(BodyError::Invalid { .. })));
    // A topic-level grant: refused, not widened to the stream.
    let topic = permissions_body(&[(3, READER)], true);
    assert!(matches!(
        decode(&topic),
        Err(BodyError::Invalid {
            field: "permissions.topics",
            ..
        })
    ));
    // Stream 0 is the appliance's "every stream" and never a stream entry; a stream
    // appears once.
    assert!(decode(&permissions_body(&[(0, READER)], false)).is_err());
    assert!(decode(&permissions_body(&[(3, READER), (3, READER)], false)).is_err());
    // No permissions at all.
    assert_eq!(
        decode(&[1, 4, 7, 0, 0, 0, 0]),
        Ok(ClientRequest::UpdatePermissions {
            user: Identifier::Id(7),
            permissions: vec![],
        })
    );
}

#[test]
fn user_details_encode_roots_rights_and_an_empty_list_as_iggy_does() {
    use super::users::{UserDetailsReply, UserReply};
    let user = UserReply {
        id: 2,
        created_at: 5,
        status: 1,
        username: "ana".into(),
        options: Vec::new(),
    };
    // No permissions: a u32 0 after the user.
    let none = UserDetailsReply {
        user: user.clone(),
        root: false,
        permissions: vec![],
    }
    .encode();
    assert_eq!(&none[none.len() - 4..], &[0, 0, 0, 0]);
    assert_eq!(UserDetailsReply::decode(&none).unwrap().permissions, vec![]);
    // Root: every global flag set, no stream entries.
    let root = UserDetailsReply {
        user,
        root: true,
        permissions: vec![],
    }
    .encode();
    let tree = &root[root.len() - 11..];
    assert_eq!(tree, &[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]);
    let read_back = UserDetailsReply::decode(&root).unwrap().permissions;
    assert_eq!(
        read_back,
        vec![StreamPermission {
            stream_id: 0,
            read: true,
            write: true,
            manage: true,
        }]
    );
}
