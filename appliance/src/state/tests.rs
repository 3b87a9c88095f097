//! The metadata state machine: determinism, authorisation, and prepared bodies.

use proptest::prelude::*;
use replication::wire::PartitionKey;

use super::metadata::{ConsumerGroup, ROOT_USER_ID};
use super::*;
use crate::protocol::reply::ConsumerGroupDetailsReply;
use crate::protocol::request::{Identifier, Retention};
use crate::protocol::{ClientRequest, Status, StreamPermission};

const ROOT: Caller = Caller {
    user_id: ROOT_USER_ID,
    client: 1,
};

fn formatted() -> MetadataState {
    MetadataState::formatted("root", auth::hash_password(b"root-password").unwrap())
}

/// Prepares on the "primary", ships the body, decodes and applies on `replicas`.
fn run(
    primary: &MetadataState,
    replicas: &mut [&mut MetadataState],
    caller: Caller,
    request: ClientRequest<'_>,
) -> Applied {
    let op = primary.prepare(caller, &request, 1_000).expect("prepare");
    let body = op.encode();
    let decoded = MetadataOp::decode(op.operation(), &body).expect("prepared body decodes");
    assert_eq!(decoded, op);
    let mut results = replicas
        .iter_mut()
        .map(|state| state.apply(caller, &decoded));
    let first = results.next().expect("at least one replica");
    for other in results {
        assert_eq!(other, first, "replicas disagree on the outcome");
    }
    first
}

#[test]
fn replicas_applying_the_same_ops_hold_the_same_state_and_ids() {
    let mut a = formatted();
    let mut b = a.clone();
    let create = |name: &str| ClientRequest::CreateStream { name: name.into() };
    let primary = a.clone();
    let r1 = run(&primary, &mut [&mut a, &mut b], ROOT, create("orders"));
    let r2 = run(&primary, &mut [&mut a, &mut b], ROOT, create("payments"));
    let stream = |body: &[u8]| {
        let reply = crate::protocol::reply::StreamReply::decode(body).expect("a stream");
        (reply.id, reply.name, reply.topics_count)
    };
    assert_eq!(
        (stream(&r1.body), stream(&r2.body)),
        ((1, "orders".into(), 0), (2, "payments".into(), 0))
    );
    let topic = ClientRequest::CreateTopic {
        stream: Identifier::Id(1),
        name: "eu".into(),
        partitions: 3,
        options: Vec::new(),
    };
    let r = run(&a.clone(), &mut [&mut a, &mut b], ROOT, topic);
    assert_eq!(r.status, Status::Ok);
    assert_eq!(a, b);
    assert_eq!(
        a.partitions(),
        (0..3)
            .map(|partition| PartitionKey {
                stream: 1,
                topic: 1,
                partition
            })
            .collect::<Vec<_>>()
    );
    assert_eq!(MetadataState::restore(&a.snapshot()), Ok(a.clone()));
}

#[test]
fn two_creates_of_one_name_resolve_the_same_way_everywhere() {
    let mut a = formatted();
    let mut b = a.clone();
    let primary = a.clone();
    // Both prepared against the same (pre-pipeline) state: the second fails at apply.
    let first = run(
        &primary,
        &mut [&mut a, &mut b],
        ROOT,
        ClientRequest::CreateStream { name: "dup".into() },
    );
    let second = run(
        &primary,
        &mut [&mut a, &mut b],
        ROOT,
        ClientRequest::CreateStream { name: "dup".into() },
    );
    assert_eq!(first.status, Status::Ok);
    assert_eq!(second.status, Status::AlreadyExists);
    assert_eq!(a, b);
}

#[test]
fn passwords_are_replicated_only_as_salted_hashes() {
    let state = formatted();
    let request = ClientRequest::CreateUser {
        username: "ana".into(),
        password: b"s3cret-pass".to_vec(),
        status: 1,
        permissions: vec![],
        options: Vec::new(),
    };
    let op = state.prepare(ROOT, &request, 0).unwrap();
    let body = op.encode();
    assert!(
        !body.windows(11).any(|w| w == b"s3cret-pass"),
        "plaintext password in a prepared body"
    );
    let mut state = state;
    let applied = state.apply(ROOT, &op);
    let id = u32::from_le_bytes(applied.body[..4].try_into().unwrap());
    assert_eq!(state.login("ana", b"s3cret-pass"), Some(id));
    assert_eq!(state.login("ana", b"wrong-pass"), None);
    assert_eq!(state.login("nobody", b"s3cret-pass"), None);
}

#[test]
fn permissions_are_checked_per_stream_and_right() {
    let mut state = formatted();
    state.apply(
        ROOT,
        &MetadataOp::CreateStream {
            name: "s1".into(),
            created_at: 0,
        },
    );
    state.apply(
        ROOT,
        &MetadataOp::CreateStream {
            name: "s2".into(),
            created_at: 0,
        },
    );
    let reader = StreamPermission {
        stream_id: 1,
        read: true,
        write: false,
        manage: false,
    };
    let op = MetadataOp::CreateUser {
        username: "r".into(),
        password_hash: auth::hash_password(b"reader-pass").unwrap(),
        permissions: vec![reader],
        created_at: 0,
        status: 1,
        options: Vec::new(),
    };
    let id = u32::from_le_bytes(state.apply(ROOT, &op).body[..4].try_into().unwrap());
    assert!(state.allows(id, 1, Right::Read));
    assert!(!state.allows(id, 1, Right::Write));
    assert!(!state.allows(id, 2, Right::Read));
    let caller = Caller {
        user_id: id,
        client: 9,
    };
    let topic = ClientRequest::CreateTopic {
        stream: Identifier::Id(1),
        name: "t".into(),
        partitions: 1,
        options: Vec::new(),
    };
    assert_eq!(
        state.prepare(caller, &topic, 0),
        Err(Status::PermissionDenied)
    );
    assert_eq!(
        state.prepare(caller, &ClientRequest::CreateStream { name: "x".into() }, 0),
        Err(Status::PermissionDenied)
    );
    // A user may change their own password, not another's.
    let own = ClientRequest::ChangePassword {
        user: Identifier::Id(id),
        current_password: b"reader-pass".to_vec(),
        new_password: b"new-password".to_vec(),
    };
    assert!(state.prepare(caller, &own, 0).is_ok());
    // The current password must match.
    let guessed = ClientRequest::ChangePassword {
        user: Identifier::Name("r".into()),
        current_password: b"guessed-pass".to_vec(),
        new_password: b"new-password".to_vec(),
    };
    assert_eq!(
        state.prepare(caller, &guessed, 0),
        Err(Status::InvalidCredentials)
    );
    let other = ClientRequest::ChangePassword {
        user: Identifier::Id(ROOT_USER_ID),
        current_password: b"reader-pass".to_vec(),
        new_password: b"new-password".to_vec(),
    };
    assert_eq!(
        state.prepare(caller, &other, 0),
        Err(Status::PermissionDenied)
    );
    // A deleted user holds no rights.
    state.apply(ROOT, &MetadataOp::DeleteUser { user_id: id });
    assert!(!state.allows(id, 1, Right::Read));
    assert_eq!(
        state
            .apply(
                ROOT,
                &MetadataOp::DeleteUser {
                    user_id: ROOT_USER_ID
                }
            )
            .status,
        Status::PermissionDenied
    );
}

#[test]
fn partitions_grow_shrink_and_bound() {
    let mut state = with_topic(2);
    assert_eq!(
        state
            .apply(
                ROOT,
                &MetadataOp::CreatePartitions {
                    stream_id: 1,
                    topic_id: 1,
                    count: 3
                }
            )
            .status,
        Status::Ok
    );
    assert!(state.partition_exists(PartitionKey {
        stream: 1,
        topic: 1,
        partition: 4
    }));
    assert_eq!(
        state
            .apply(
                ROOT,
                &MetadataOp::DeletePartitions {
                    stream_id: 1,
                    topic_id: 1,
                    count: 5
                }
            )
            .status,
        Status::InvalidRequest
    );
    assert_eq!(
        state
            .apply(
                ROOT,
                &MetadataOp::DeletePartitions {
                    stream_id: 1,
                    topic_id: 1,
                    count: 4
                }
            )
            .status,
        Status::Ok
    );
    assert!(!state.partition_exists(PartitionKey {
        stream: 1,
        topic: 1,
        partition: 1
    }));
    let too_many = MetadataOp::CreateTopic {
        stream_id: 1,
        name: "big".into(),
        partitions: 10_001,
        created_at: 0,
        message_expiry: 0,
        max_topic_size: 0,
        first_primary: None,
    };
    assert_eq!(state.apply(ROOT, &too_many).status, Status::InvalidRequest);
    assert_eq!(
        state
            .apply(
                ROOT,
                &MetadataOp::DeleteTopic {
                    stream_id: 1,
                    topic_id: 9
                }
            )
            .status,
        Status::NotFound
    );
}

#[test]
fn consumer_group_membership_follows_the_client() {
    let mut state = formatted();
    state.apply(
        ROOT,
        &MetadataOp::CreateStream {
            name: "s".into(),
            created_at: 0,
        },
    );
    state.apply(
        ROOT,
        &MetadataOp::CreateTopic {
            stream_id: 1,
            name: "t".into(),
            partitions: 1,
            created_at: 0,
            message_expiry: 0,
            max_topic_size: 0,
            first_primary: None,
        },
    );
    let group = state.apply(
        ROOT,
        &MetadataOp::CreateConsumerGroup {
            stream_id: 1,
            topic_id: 1,
            name: "g".into(),
        },
    );
    let created = ConsumerGroupDetailsReply::decode(&group.body).unwrap();
    assert_eq!((created.group.id, created.group.name.as_str()), (1, "g"));
    assert_eq!(created.group.members_count, 0);
    let join = MetadataOp::JoinConsumerGroup {
        stream_id: 1,
        topic_id: 1,
        group_id: 1,
    };
    let leave = MetadataOp::LeaveConsumerGroup {
        stream_id: 1,
        topic_id: 1,
        group_id: 1,
    };
    let alice = Caller {
        user_id: ROOT_USER_ID,
        client: 77,
    };
    let generation = |state: &MetadataState| state.topic(1, 1).unwrap().groups[&1].generation;
    assert_eq!(state.apply(alice, &join).status, Status::Ok);
    assert!(state.topic(1, 1).unwrap().groups[&1].members.contains(&77));
    assert_eq!(generation(&state), 1);
    // Joining again changes nothing, not even the generation.
    assert_eq!(state.apply(alice, &join).status, Status::Ok);
    assert_eq!(generation(&state), 1);
    assert_eq!(
        state.apply(ROOT, &leave).status,
        Status::NotFound,
        "client 1 never joined"
    );
    assert_eq!(generation(&state), 1);
    assert_eq!(state.apply(alice, &leave).status, Status::Ok);
    assert_eq!(generation(&state), 2);
    // A client's logout takes it out of its groups.
    assert_eq!(state.apply(alice, &join).status, Status::Ok);
    state.leave_groups(77);
    assert!(state.topic(1, 1).unwrap().groups[&1].members.is_empty());
    assert_eq!(generation(&state), 4);
    state.leave_groups(77);
    assert_eq!(generation(&state), 4, "nothing to leave");
}

#[test]
fn a_groups_members_share_its_partitions_and_resolve_by_name() {
    let mut group = ConsumerGroup {
        name: "g".into(),
        members: [30u128, 10, 20].into_iter().collect(),
        generation: 0,
    };
    // Members in client id order; partition p goes to member p mod 3.
    assert_eq!(group.assignment_of(10, 7), Some(vec![0, 3, 6]));
    assert_eq!(group.assignment_of(20, 7), Some(vec![1, 4]));
    assert_eq!(group.assignment_of(30, 7), Some(vec![2, 5]));
    assert_eq!(group.assignment_of(40, 7), None);
    let details = group.details(5, 7);
    assert_eq!(
        details.members,
        vec![(1, vec![0, 3, 6]), (2, vec![1, 4]), (3, vec![2, 5])]
    );
    // More members than partitions: the last hold none.
    group.members.extend([40, 50, 60, 70, 80]);
    assert_eq!(group.assignment_of(80, 7), Some(vec![]));
}

proptest! {
    #[test]
    fn arbitrary_prepared_bodies_never_panic_the_decoder(body in proptest::collection::vec(any::<u8>(), 0..200)) {
        for operation in replication::wire::Operation::ALL {
            let _ = MetadataOp::decode(*operation, &body);
        }
    }

    #[test]
    fn arbitrary_snapshots_are_an_error_not_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = MetadataState::restore(&bytes);
    }
}

#[test]
fn prepared_permission_lists_are_as_strict_as_client_ones() {
    // One codec serves both: unknown permission bits are refused in a prepared body too.
    let op = MetadataOp::UpdatePermissions {
        user_id: 7,
        permissions: vec![StreamPermission {
            stream_id: 1,
            read: true,
            write: false,
            manage: false,
        }],
    };
    let mut body = op.encode();
    let last = body.len() - 1;
    body[last] |= 0b1000;
    assert!(MetadataOp::decode(op.operation(), &body).is_err());
    body[last] &= 0b0111;
    assert_eq!(MetadataOp::decode(op.operation(), &body), Ok(op));
}

/// A stream with one topic of `partitions` partitions.
fn with_topic(partitions: u32) -> MetadataState {
    let mut state = formatted();
    state.apply(
        ROOT,
        &MetadataOp::CreateStream {
            name: "s".into(),
            created_at: 0,
        },
    );
    let create = MetadataOp::CreateTopic {
        stream_id: 1,
        name: "t".into(),
        partitions,
        created_at: 0,
        message_expiry: 0,
        max_topic_size: 0,
        first_primary: None,
    };
    assert_eq!(state.apply(ROOT, &create).status, Status::Ok);
    state
}

#[test]
fn retention_offsets_only_move_forward_whatever_order_their_ops_commit_in() {
    let key = PartitionKey {
        stream: 1,
        topic: 1,
        partition: 1,
    };
    let truncate = |first_offset| MetadataOp::TruncatePartition {
        partition: key,
        first_offset,
    };
    // Two primaries in turn proposed 900 and 500 (the older one's decision committed
    // after a view change, or a retry): every replica keeps 900, in either order, and
    // a repeated op changes nothing.
    let mut a = with_topic(2);
    let mut b = a.clone();
    for op in [truncate(900), truncate(500), truncate(900)] {
        assert_eq!(a.apply(ROOT, &op).status, Status::Ok);
    }
    for op in [truncate(500), truncate(900)] {
        assert_eq!(b.apply(ROOT, &op).status, Status::Ok);
    }
    assert_eq!(a, b);
    assert_eq!(a.retained_from(key), 900);
    assert_eq!(
        a.retained_from(PartitionKey {
            partition: 0,
            ..key
        }),
        0
    );
    // A partition that does not exist is refused, and changes nothing.
    let missing = MetadataOp::TruncatePartition {
        partition: PartitionKey {
            partition: 2,
            ..key
        },
        first_offset: 10,
    };
    assert_eq!(a.apply(ROOT, &missing).status, Status::NotFound);
    assert_eq!(a, b);
    // Deleting the partition forgets its offset; created again, it starts at 0.
    let shrink = MetadataOp::DeletePartitions {
        stream_id: 1,
        topic_id: 1,
        count: 1,
    };
    assert_eq!(a.apply(ROOT, &shrink).status, Status::Ok);
    let grow = MetadataOp::CreatePartitions {
        stream_id: 1,
        topic_id: 1,
        count: 1,
    };
    assert_eq!(a.apply(ROOT, &grow).status, Status::Ok);
    assert_eq!(a.retained_from(key), 0);
}

#[test]
fn topic_retention_is_set_at_create_and_changed_by_update() {
    let mut state = with_topic(1);
    let update = MetadataOp::UpdateTopic {
        stream_id: 1,
        topic_id: 1,
        message_expiry: 3_600_000_000,
        max_topic_size: 1 << 30,
    };
    assert_eq!(state.apply(ROOT, &update).status, Status::Ok);
    let topic = &state.streams[&1].topics[&1];
    assert_eq!(
        (topic.message_expiry, topic.max_topic_size),
        (3_600_000_000, 1 << 30)
    );
    let missing = MetadataOp::UpdateTopic {
        stream_id: 1,
        topic_id: 9,
        message_expiry: 0,
        max_topic_size: 0,
    };
    assert_eq!(state.apply(ROOT, &missing).status, Status::NotFound);
    // Prepared UpdateTopic round-trips through the metadata body.
    let body = update.encode();
    assert_eq!(
        MetadataOp::decode(replication::wire::Operation::UpdateTopic, &body),
        Ok(update)
    );
}

#[test]
fn first_leaders_of_new_partitions_go_round_the_nodes() {
    let mut a = formatted();
    let primary = a.clone();
    run(
        &primary,
        &mut [&mut a],
        ROOT,
        ClientRequest::CreateStream { name: "s".into() },
    );
    let topic = |name: &str, partitions| ClientRequest::CreateTopic {
        stream: Identifier::Id(1),
        name: name.into(),
        partitions,
        options: Vec::new(),
    };
    // Two partitions, then three: the second topic starts where the first left off.
    run(&a.clone(), &mut [&mut a], ROOT, topic("first", 2));
    run(&a.clone(), &mut [&mut a], ROOT, topic("second", 3));
    let views = |state: &MetadataState, topic, partitions: u32, nodes| {
        (0..partitions)
            .map(|partition| {
                let key = PartitionKey {
                    stream: 1,
                    topic,
                    partition,
                };
                state.initial_view(key, nodes)
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(views(&a, 1, 2, 3), [0, 1]);
    assert_eq!(views(&a, 2, 3, 3), [2, 0, 1]);
    assert_eq!(views(&a, 2, 3, 5), [2, 3, 4]);
    assert_eq!(views(&a, 2, 3, 1), [0, 0, 0]);
    // Partitions added later continue the topic's turn.
    let grow = MetadataOp::CreatePartitions {
        stream_id: 1,
        topic_id: 1,
        count: 2,
    };
    assert_eq!(a.apply(ROOT, &grow).status, Status::Ok);
    assert_eq!(views(&a, 1, 4, 3), [0, 1, 2, 0]);
    // The turn survives a snapshot; a topic without one (spreading off, or created by a
    // build before it) starts every partition in view 0.
    let restored = MetadataState::restore(&a.snapshot()).expect("snapshot");
    assert_eq!(views(&restored, 2, 3, 3), [2, 0, 1]);
    let mut unspread = MetadataOp::decode(
        replication::wire::Operation::CreateTopicWithAssignments,
        &primary_body(&a, topic("third", 3)),
    )
    .expect("decodes");
    if let MetadataOp::CreateTopic { first_primary, .. } = &mut unspread {
        assert_eq!(*first_primary, Some(7), "after 4 + 3 partitions");
        *first_primary = None;
    }
    assert_eq!(a.apply(ROOT, &unspread).status, Status::Ok);
    assert_eq!(views(&a, 3, 3, 3), [0, 0, 0]);
    let mut json: serde_json::Value = serde_json::from_slice(&a.snapshot()).expect("json");
    json["streams"]["1"]["topics"]["2"]
        .as_object_mut()
        .expect("topic 2")
        .remove("first_primary");
    let old = MetadataState::restore(&serde_json::to_vec(&json).expect("json")).expect("old");
    assert_eq!(views(&old, 2, 3, 3), [0, 0, 0]);
}

/// The body the primary prepares for `request`.
fn primary_body(state: &MetadataState, request: ClientRequest<'_>) -> Vec<u8> {
    state
        .prepare(ROOT, &request, 1_000)
        .expect("prepare")
        .encode()
}

#[test]
fn create_topic_bodies_with_and_without_first_leaders_round_trip() {
    let op = |first_primary| MetadataOp::CreateTopic {
        stream_id: 7,
        name: "t".into(),
        partitions: 4,
        created_at: 5,
        message_expiry: 6,
        max_topic_size: 7,
        first_primary,
    };
    let with = op(Some(11)).encode();
    let without = op(None).encode();
    // The body of a build before spreading is the one without: 4 bytes shorter.
    assert_eq!(with.len(), without.len() + 4);
    let decode = |body: &[u8]| {
        MetadataOp::decode(
            replication::wire::Operation::CreateTopicWithAssignments,
            body,
        )
    };
    assert_eq!(decode(&with), Ok(op(Some(11))));
    assert_eq!(decode(&without), Ok(op(None)));
    // Anything else after the fields is refused, never read as a turn.
    assert!(decode(&with[..with.len() - 1]).is_err());
    let mut longer = with.clone();
    longer.push(0);
    assert!(decode(&longer).is_err());
}

#[test]
fn topics_are_named_by_id_or_name_and_updates_patch_the_options_they_name() {
    let mut state = formatted();
    let primary = state.clone();
    run(
        &primary,
        &mut [&mut state],
        ROOT,
        ClientRequest::CreateStream {
            name: "orders".into(),
        },
    );
    let primary = state.clone();
    let created = run(
        &primary,
        &mut [&mut state],
        ROOT,
        ClientRequest::CreateTopic {
            stream: Identifier::Name("orders".into()),
            name: "eu".into(),
            partitions: 2,
            options: crate::protocol::options::TopicOptions::encode(Retention {
                message_expiry: 60_000_000,
                max_topic_size: 1 << 30,
            }),
        },
    );
    let reply = crate::protocol::reply::TopicDetailsReply::decode(&created.body).unwrap();
    assert_eq!((reply.topic.id, reply.partitions.len()), (1, 2));
    assert_eq!(reply.topic.message_expiry, 60_000_000);
    let by_name = (
        Identifier::Name("orders".into()),
        Identifier::Name("eu".into()),
    );
    assert_eq!(state.topic_id(&by_name.0, &by_name.1), Some((1, 1)));
    assert_eq!(state.topic_id(&by_name.0, &Identifier::Id(2)), None);
    // An update that names only the size keeps the expiry.
    let mut size_only = Vec::new();
    size_only.extend_from_slice(&[2, 14, 0, 0, 0]);
    size_only.extend_from_slice(b"max_topic_size");
    size_only.extend_from_slice(&[12, 8, 0, 0, 0]);
    size_only.extend_from_slice(&(2u64 << 30).to_le_bytes());
    let update = |name: &str, options: Vec<u8>| ClientRequest::UpdateTopic {
        stream: by_name.0.clone(),
        topic: by_name.1.clone(),
        name: name.into(),
        options,
    };
    let primary = state.clone();
    let updated = run(&primary, &mut [&mut state], ROOT, update("eu", size_only));
    assert_eq!(updated.status, Status::Ok);
    let topic = &state.streams[&1].topics[&1];
    assert_eq!(
        (topic.message_expiry, topic.max_topic_size),
        (60_000_000, 2 << 30)
    );
    // Renaming and options the appliance does not take are refused before preparing.
    assert_eq!(
        state.prepare(ROOT, &update("us", Vec::new()), 0),
        Err(Status::FeatureUnavailable)
    );
    let mut segment_size = Vec::new();
    segment_size.extend_from_slice(&[2, 12, 0, 0, 0]);
    segment_size.extend_from_slice(b"segment_size");
    segment_size.extend_from_slice(&[12, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        state.prepare(ROOT, &update("eu", segment_size), 0),
        Err(Status::UnsupportedOption)
    );
    // A topic deleted by name.
    let primary = state.clone();
    let deleted = run(
        &primary,
        &mut [&mut state],
        ROOT,
        ClientRequest::DeleteTopic {
            stream: by_name.0.clone(),
            topic: by_name.1.clone(),
        },
    );
    assert_eq!(deleted.status, Status::Ok);
    assert!(state.streams[&1].topics.is_empty());
}

#[test]
fn users_tokens_renames_and_purges_apply_alike_on_every_replica() {
    use crate::protocol::users::{UserDetailsReply, USER_ACTIVE, USER_INACTIVE};
    let primary = formatted();
    let mut a = primary.clone();
    let mut b = primary.clone();
    let created = run(
        &primary,
        &mut [&mut a, &mut b],
        ROOT,
        ClientRequest::CreateUser {
            username: "ana".into(),
            password: b"ana-password".to_vec(),
            status: USER_ACTIVE,
            permissions: vec![],
            options: Vec::new(),
        },
    );
    let details = UserDetailsReply::decode(&created.body).expect("the created user");
    assert_eq!(details.user.username, "ana");
    assert_eq!(details.user.created_at, 1_000);
    let ana = details.user.id;
    let ana_caller = Caller {
        user_id: ana,
        client: 11,
    };
    assert_eq!(a.user_id(&Identifier::Name("ana".into())), Some(ana));

    // Deactivated: no login, no rights as a session; renamed; reactivated.
    let primary = a.clone();
    let update = ClientRequest::UpdateUser {
        user: Identifier::Id(ana),
        username: Some("bea".into()),
        status: Some(USER_INACTIVE),
        options: Vec::new(),
    };
    assert_eq!(
        run(&primary, &mut [&mut a, &mut b], ROOT, update).status,
        Status::Ok
    );
    assert!(!a.is_active(ana));
    assert_eq!(a.login("bea", b"ana-password"), None);
    assert_eq!(a.users[&ana].username, "bea");
    // Root is never deactivated.
    let root_off = MetadataOp::UpdateUser {
        user_id: ROOT_USER_ID,
        username: None,
        status: Some(USER_INACTIVE),
        options: Vec::new(),
    };
    assert_eq!(a.apply(ROOT, &root_off).status, Status::PermissionDenied);
    assert_eq!(b.apply(ROOT, &root_off).status, Status::PermissionDenied);

    // A token: only its hash is replicated, it logs in until it expires.
    let (token, hash) = auth::new_token();
    let op = a
        .prepare_token(ana_caller, "ci", hash.clone(), 5_000, 1_000)
        .expect("token op");
    let body = op.encode();
    assert!(!body.windows(token.len()).any(|w| w == token.as_bytes()));
    let decoded = MetadataOp::decode(op.operation(), &body).unwrap();
    assert_eq!(decoded, op);
    assert_eq!(a.apply(ana_caller, &decoded).status, Status::Ok);
    assert_eq!(b.apply(ana_caller, &decoded).status, Status::Ok);
    let reactivate = MetadataOp::UpdateUser {
        user_id: ana,
        username: None,
        status: Some(USER_ACTIVE),
        options: Vec::new(),
    };
    a.apply(ROOT, &reactivate);
    b.apply(ROOT, &reactivate);
    assert_eq!(a.login("bea", b"ana-password"), Some(ana));
    assert_eq!(
        a.token_user(&auth::token_hash(token.as_bytes()), 5_999),
        Some(ana)
    );
    assert_eq!(
        a.token_user(&auth::token_hash(token.as_bytes()), 6_000),
        None
    );
    assert_eq!(a.token_user(&auth::token_hash(b"guess"), 0), None);
    assert_eq!(
        a.prepare_token(ana_caller, "ci", hash, 0, 0),
        Err(Status::AlreadyExists)
    );
    let delete = ClientRequest::DeleteToken { name: "ci".into() };
    assert_eq!(
        run(
            &a.clone(),
            &mut [&mut a, &mut b],
            ana_caller,
            delete.clone()
        )
        .status,
        Status::Ok
    );
    assert_eq!(
        run(&a.clone(), &mut [&mut a, &mut b], ana_caller, delete).status,
        Status::NotFound
    );

    // A stream renamed, then purged at the primary's committed ends.
    let stream = ClientRequest::CreateStream { name: "s".into() };
    run(&a.clone(), &mut [&mut a, &mut b], ROOT, stream);
    let topic = ClientRequest::CreateTopic {
        stream: Identifier::Id(1),
        name: "t".into(),
        partitions: 2,
        options: Vec::new(),
    };
    run(&a.clone(), &mut [&mut a, &mut b], ROOT, topic);
    let rename = ClientRequest::UpdateStream {
        stream: Identifier::Id(1),
        name: "s2".into(),
    };
    run(&a.clone(), &mut [&mut a, &mut b], ROOT, rename);
    assert_eq!(a.stream_id(&Identifier::Name("s2".into())), Some(1));
    let purge = ClientRequest::PurgeStream {
        stream: Identifier::Name("s2".into()),
    };
    let MetadataOp::Purge { mut partitions } = a.prepare(ROOT, &purge, 0).unwrap() else {
        panic!("a purge op");
    };
    assert_eq!(partitions.len(), 2);
    partitions[0].1 = 40;
    partitions[1].1 = 7;
    let op = MetadataOp::Purge { partitions };
    let decoded = MetadataOp::decode(op.operation(), &op.encode()).unwrap();
    assert_eq!(decoded, op);
    a.apply(ROOT, &decoded);
    b.apply(ROOT, &decoded);
    let key = |partition| PartitionKey {
        stream: 1,
        topic: 1,
        partition,
    };
    assert_eq!(a.retained_from(key(0)), 40);
    assert_eq!(a.retained_from(key(1)), 7);
    assert_eq!(a, b);
    // A reader may not purge.
    assert_eq!(
        a.prepare(
            ana_caller,
            &ClientRequest::PurgeStream {
                stream: Identifier::Id(1)
            },
            0
        ),
        Err(Status::PermissionDenied)
    );
}

#[test]
fn password_work_is_checked_before_any_hashing_and_done_apart() {
    let mut state = formatted();
    let ana = u32::from_le_bytes(
        state
            .apply(
                ROOT,
                &MetadataOp::CreateUser {
                    username: "ana".into(),
                    password_hash: auth::hash_password(b"ana-password").unwrap(),
                    permissions: vec![],
                    created_at: 0,
                    status: 1,
                    options: Vec::new(),
                },
            )
            .body[..4]
            .try_into()
            .unwrap(),
    );
    let as_ana = Caller {
        user_id: ana,
        client: 5,
    };
    let create = ClientRequest::CreateUser {
        username: "bo".into(),
        password: b"bo-password".to_vec(),
        status: 1,
        permissions: vec![],
        options: Vec::new(),
    };
    // Rights and the user are checked first: refused work costs no Argon2.
    assert_eq!(
        state.password_work(as_ana, &create, 0).err(),
        Some(Status::PermissionDenied)
    );
    let missing = ClientRequest::ChangePassword {
        user: Identifier::Name("nobody".into()),
        current_password: b"whatever-pass".to_vec(),
        new_password: b"new-password".to_vec(),
    };
    assert_eq!(
        state.password_work(ROOT, &missing, 0).err(),
        Some(Status::NotFound)
    );
    assert!(matches!(
        state.password_work(ROOT, &ClientRequest::GetUsers, 0),
        Ok(None)
    ));
    // The work yields the op with the new password's salted hash.
    let work = state.password_work(ROOT, &create, 7).unwrap().unwrap();
    let MetadataOp::CreateUser {
        password_hash,
        created_at,
        ..
    } = work.run().unwrap()
    else {
        panic!("a CreateUser op");
    };
    assert!(auth::verify_password(b"bo-password", &password_hash));
    assert_eq!(created_at, 7);
    // A new password too short is refused by the work itself.
    let short = ClientRequest::ChangePassword {
        user: Identifier::Id(ana),
        current_password: b"ana-password".to_vec(),
        new_password: b"short".to_vec(),
    };
    let work = state.password_work(as_ana, &short, 0).unwrap().unwrap();
    assert_eq!(work.run().err(), Some(Status::InvalidRequest));
}

#[test]
fn a_create_user_body_without_its_later_fields_still_decodes() {
    let op = MetadataOp::CreateUser {
        username: "ana".into(),
        password_hash: "hash".into(),
        permissions: vec![],
        created_at: 9,
        status: 2,
        options: Vec::new(),
    };
    let body = op.encode();
    // The body as written before users kept created_at, status and options.
    let old = &body[..body.len() - (8 + 1 + 4)];
    assert_eq!(
        MetadataOp::decode(op.operation(), old),
        Ok(MetadataOp::CreateUser {
            username: "ana".into(),
            password_hash: "hash".into(),
            permissions: vec![],
            created_at: 0,
            status: 1,
            options: Vec::new(),
        })
    );
}
