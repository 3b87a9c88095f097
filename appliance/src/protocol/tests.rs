//! Request bodies round-trip and malformed bodies are refused with typed errors.

use proptest::prelude::*;
use replication::wire::{Operation, PartitionKey};

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
    vec![
        ClientRequest::Register,
        ClientRequest::Logout,
        ClientRequest::CreateStream {
            name: "orders".into(),
        },
        ClientRequest::DeleteStream { stream_id: 1 },
        ClientRequest::CreateTopic {
            stream_id: 1,
            name: "eu".into(),
            partitions: 3,
            message_expiry: 7 * 86_400_000_000,
            max_topic_size: u64::MAX,
        },
        ClientRequest::UpdateTopic {
            stream_id: 1,
            topic_id: 2,
            message_expiry: 0,
            max_topic_size: 10 << 30,
        },
        ClientRequest::DeleteTopic {
            stream_id: 1,
            topic_id: 2,
        },
        ClientRequest::CreatePartitions {
            stream_id: 1,
            topic_id: 2,
            count: 4,
        },
        ClientRequest::DeletePartitions {
            stream_id: 1,
            topic_id: 2,
            count: 1,
        },
        ClientRequest::CreateUser {
            username: "ana".into(),
            password: b"pw-123".to_vec(),
            permissions: vec![perm],
        },
        ClientRequest::DeleteUser { user_id: 7 },
        ClientRequest::ChangePassword {
            user_id: 7,
            new_password: b"new".to_vec(),
        },
        ClientRequest::UpdatePermissions {
            user_id: 7,
            permissions: vec![perm, perm],
        },
        ClientRequest::CreateConsumerGroup {
            stream_id: 1,
            topic_id: 2,
            name: "g".into(),
        },
        ClientRequest::DeleteConsumerGroup {
            stream_id: 1,
            topic_id: 2,
            group_id: 5,
        },
        ClientRequest::JoinConsumerGroup {
            stream_id: 1,
            topic_id: 2,
            group_id: 5,
        },
        ClientRequest::LeaveConsumerGroup {
            stream_id: 1,
            topic_id: 2,
            group_id: 5,
        },
        ClientRequest::SendMessages {
            partition: key(),
            batch: b"batch bytes",
        },
        ClientRequest::StoreConsumerOffset {
            partition: key(),
            consumer: Consumer::Group(5),
            offset: 99,
        },
        ClientRequest::DeleteConsumerOffset {
            partition: key(),
            consumer: Consumer::Single(6),
        },
        ClientRequest::DeleteSegments {
            partition: key(),
            segments: 2,
        },
        ClientRequest::Login {
            username: "ana".into(),
            password: b"pw".to_vec(),
        },
        ClientRequest::ClusterMetadata,
        ClientRequest::ListStreams,
        ClientRequest::ListTopics { stream_id: 1 },
        ClientRequest::PollMessages {
            partition: key(),
            consumer: Consumer::Single(1),
            strategy: PollStrategy::Timestamp(5),
            count: 10,
            auto_commit: true,
        },
        ClientRequest::PollMessages {
            partition: key(),
            consumer: Consumer::Group(1),
            strategy: PollStrategy::Next,
            count: 1,
            auto_commit: false,
        },
        ClientRequest::GetConsumerOffset {
            partition: key(),
            consumer: Consumer::Single(1),
        },
    ]
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
fn internal_operations_and_unknown_reads_are_refused() {
    assert!(matches!(
        ClientRequest::decode(Operation::TruncatePartition, 0, &[]),
        Err(BodyError::Invalid {
            field: "operation",
            ..
        })
    ));
    assert!(matches!(
        ClientRequest::decode(Operation::NonReplicated, 99, &[]),
        Err(BodyError::Invalid {
            field: "read_command",
            ..
        })
    ));
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
    // A partition key that does not fit 20 bits of stream.
    let mut body = Vec::new();
    body.extend_from_slice(&(1u32 << 20).to_le_bytes());
    body.extend_from_slice(&[0; 8]);
    body.extend_from_slice(&1u32.to_le_bytes());
    assert!(ClientRequest::decode(Operation::DeleteSegments, 0, &body).is_err());
    // Too many permissions.
    let mut body = 7u32.to_le_bytes().to_vec();
    body.extend_from_slice(&5000u32.to_le_bytes());
    assert!(matches!(
        ClientRequest::decode(Operation::UpdatePermissions, 0, &body),
        Err(BodyError::TooMany { .. })
    ));
    // A poll of zero messages.
    let poll = ClientRequest::PollMessages {
        partition: key(),
        consumer: Consumer::Single(1),
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
    for value in 0..=13 {
        assert_eq!(Status::from_u32(value).map(|s| s as u32), Some(value));
    }
    assert!(Status::from_u32(14).is_none());
    assert!(!Status::StorageFull.is_retryable());
    assert!(Status::NotPrimary.is_retryable());
    assert!(!Status::PermissionDenied.is_retryable());
}

proptest! {
    #[test]
    fn arbitrary_bodies_never_panic_any_decoder(
        body in proptest::collection::vec(any::<u8>(), 0..256),
        read in 0u32..8,
    ) {
        for operation in Operation::ALL {
            let _ = ClientRequest::decode(*operation, read, &body);
        }
    }
}
