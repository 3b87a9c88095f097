//! What the fake cluster answers: a write applied to the shared state (streams, topics,
//! users, offsets, messages) and a read served from it, as the appliance would.

use std::collections::BTreeMap;

use replication::wire::batch::{self, BatchBuilder, NewMessage};
use replication::wire::{PartitionKey, METADATA_GROUP};

use super::{fail, ok, Answer, FakePartition, FakeState, FakeStream};
use crate::protocol::codec::Writer;
use crate::protocol::options::TopicOptions;
use crate::protocol::reply::*;
use crate::protocol::request::{Identifier, OffsetTarget, Partitioning};
use crate::protocol::{ClientRequest, Consumer, PollStrategy, Status};

pub(super) fn apply(s: &mut FakeState, request: &ClientRequest<'_>) -> Answer {
    use ClientRequest as R;
    match request {
        R::Logout => ok(Vec::new()),
        R::CreateStream { name } => {
            if s.streams.values().any(|st| st.name == *name) {
                return fail(Status::AlreadyExists);
            }
            let id = s.streams.keys().last().map_or(1, |k| k + 1);
            s.streams.insert(
                id,
                FakeStream {
                    name: name.clone(),
                    topics: BTreeMap::new(),
                    retention: BTreeMap::new(),
                },
            );
            let reply = StreamReply {
                id,
                created_at: 0,
                topics_count: 0,
                size_bytes: 0,
                messages_count: 0,
                name: name.clone(),
            };
            ok(reply.encode())
        }
        R::CreateTopic {
            stream: Identifier::Id(stream_id),
            name,
            partitions,
            options,
        } => {
            let Ok(options) = TopicOptions::parse(options) else {
                return fail(Status::InvalidOptionValue);
            };
            let Some(stream) = s.streams.get_mut(stream_id) else {
                return fail(Status::NotFound);
            };
            if stream.topics.values().any(|(n, _)| n == name) {
                return fail(Status::AlreadyExists);
            }
            if *partitions == 0 || *partitions > 1000 {
                return fail(Status::InvalidRequest);
            }
            let topic_id = stream.topics.keys().last().map_or(1, |k| k + 1);
            stream.topics.insert(topic_id, (name.clone(), *partitions));
            let retention = options.retention;
            stream.retention.insert(
                topic_id,
                (retention.message_expiry, retention.max_topic_size),
            );
            for partition in 0..*partitions {
                s.partitions.insert(
                    PartitionKey {
                        stream: *stream_id,
                        topic: topic_id,
                        partition,
                    },
                    FakePartition::default(),
                );
            }
            // The fake lists no partitions: its header says none follow.
            let reply = TopicDetailsReply {
                topic: TopicReply {
                    id: topic_id,
                    created_at: 0,
                    partitions_count: 0,
                    message_expiry: retention.message_expiry,
                    max_topic_size: retention.max_topic_size,
                    size_bytes: 0,
                    messages_count: 0,
                    name: name.clone(),
                },
                partitions: Vec::new(),
            };
            ok(reply.encode())
        }
        R::UpdateTopic {
            stream: Identifier::Id(stream_id),
            topic: Identifier::Id(topic_id),
            options,
            ..
        } => {
            let Ok(options) = TopicOptions::parse(options) else {
                return fail(Status::InvalidOptionValue);
            };
            match s.streams.get_mut(stream_id) {
                Some(stream) if stream.topics.contains_key(topic_id) => {
                    let retention = options.retention;
                    stream.retention.insert(
                        *topic_id,
                        (retention.message_expiry, retention.max_topic_size),
                    );
                    ok(Vec::new())
                }
                _ => fail(Status::NotFound),
            }
        }
        R::SendMessages {
            stream,
            topic,
            partitioning: Partitioning::PartitionId(partition),
            batch: bytes,
            ..
        } => {
            let gap_at = s.faults.gap_at;
            let Some(partition) = &numeric_key(stream, topic, *partition) else {
                return fail(Status::NotFound);
            };
            let Some(p) = s.partitions.get_mut(partition) else {
                return fail(Status::NotFound);
            };
            let mut stored = bytes.to_vec();
            let Ok(info) = batch::verify(&stored) else {
                return fail(Status::InvalidRequest);
            };
            let mut base = p.next_offset;
            if gap_at.is_some_and(|at| base >= at) {
                base += 1;
                s.faults.gap_at = None;
            }
            let group = partition.pack().unwrap_or(0);
            if batch::stamp(&mut stored, group, base, 1_000 + base).is_err() {
                return fail(Status::InvalidRequest);
            }
            p.batches.push(stored);
            p.next_offset = base + u64::from(info.message_count);
            ok(SendConfirmations {
                confirmations: vec![SendConfirmation {
                    stream_id: partition.stream,
                    topic_id: partition.topic,
                    partition_id: partition.partition,
                    base_offset: base,
                }],
            }
            .encode())
        }
        R::StoreConsumerOffset { target, offset } => {
            let Some(key) = offset_key(target).filter(|(p, _)| s.partitions.contains_key(p)) else {
                return fail(Status::NotFound);
            };
            s.offsets.insert(key, *offset);
            ok(Vec::new())
        }
        R::DeleteConsumerOffset { target } => {
            match offset_key(target).and_then(|key| s.offsets.remove(&key)) {
                Some(_) => ok(Vec::new()),
                None => fail(Status::NotFound),
            }
        }
        _ => Answer::Reply(
            Status::InvalidRequest,
            b"not supported by the fake".to_vec(),
        ),
    }
}

/// The partition and consumer an offset request names by numeric identifiers.
fn offset_key(target: &OffsetTarget) -> Option<(PartitionKey, Consumer)> {
    Some((
        numeric_key(&target.stream, &target.topic, target.partition?)?,
        target.consumer.single_key()?,
    ))
}

/// The partition a request names by numeric identifiers (the client library's).
fn numeric_key(stream: &Identifier, topic: &Identifier, partition: u32) -> Option<PartitionKey> {
    match (stream, topic) {
        (Identifier::Id(stream), Identifier::Id(topic)) => Some(PartitionKey {
            stream: *stream,
            topic: *topic,
            partition,
        }),
        _ => None,
    }
}

pub(super) fn read(s: &mut FakeState, request: &ClientRequest<'_>) -> Answer {
    use ClientRequest as R;
    match request {
        R::ClusterMetadata => {
            let primary = s.primary;
            let mut groups = vec![GroupInfo {
                group: METADATA_GROUP,
                view: 1,
                primary,
            }];
            groups.extend(s.partitions.keys().filter_map(|k| {
                Some(GroupInfo {
                    group: k.pack().ok()?,
                    view: 1,
                    primary,
                })
            }));
            let nodes = s
                .addrs
                .iter()
                .enumerate()
                .map(|(i, a)| NodeInfo {
                    replica_id: i as u8,
                    address: a.to_string(),
                })
                .collect();
            ok(ClusterMetadataReply { nodes, groups }.encode())
        }
        R::ListStreams => ok(ListStreamsReply {
            streams: s
                .streams
                .iter()
                .map(|(id, st)| StreamInfo {
                    stream_id: *id,
                    name: st.name.clone(),
                    topic_count: st.topics.len() as u32,
                })
                .collect(),
        }
        .encode()),
        R::ListTopics { stream_id } => match s.streams.get(stream_id) {
            Some(st) => ok(ListTopicsReply {
                topics: st
                    .topics
                    .iter()
                    .map(|(id, (name, partitions))| {
                        let (message_expiry, max_topic_size) =
                            st.retention.get(id).copied().unwrap_or_default();
                        TopicInfo {
                            topic_id: *id,
                            name: name.clone(),
                            partitions: *partitions,
                            message_expiry,
                            max_topic_size,
                            stored: (0..*partitions)
                                .map(|partition| {
                                    let key = PartitionKey {
                                        stream: *stream_id,
                                        topic: *id,
                                        partition,
                                    };
                                    let end = s.partitions.get(&key).map_or(0, |p| p.next_offset);
                                    PartitionRange {
                                        partition,
                                        end_offset: end,
                                        segments: 1,
                                        ..PartitionRange::default()
                                    }
                                })
                                .collect(),
                        }
                    })
                    .collect(),
            }
            .encode()),
            None => fail(Status::NotFound),
        },
        R::GetConsumerOffset { target } => match offset_key(target) {
            Some(key) => match s.offsets.get(&key) {
                Some(offset) => ok(ConsumerOffsetReply {
                    partition_id: key.0.partition,
                    current_offset: 0,
                    stored_offset: *offset,
                }
                .encode()),
                None => ok(Vec::new()),
            },
            None => fail(Status::NotFound),
        },
        R::PollMessages {
            target,
            strategy,
            count,
            ..
        } => {
            let Some((partition, consumer)) = offset_key(target) else {
                return fail(Status::NotFound);
            };
            let corrupt = s.faults.corrupt_payload_at;
            let Some(p) = s.partitions.get(&partition) else {
                return fail(Status::NotFound);
            };
            let from = match strategy {
                PollStrategy::Offset(o) => *o,
                PollStrategy::Next => s.offsets.get(&(partition, consumer)).map_or(0, |o| o + 1),
                PollStrategy::Last => p.next_offset.saturating_sub(u64::from(*count)),
                PollStrategy::Timestamp(_) | PollStrategy::First => 0,
            };
            let end = from.saturating_add(u64::from(*count));
            let mut batches = Vec::new();
            let mut served = 0;
            for stored in &p.batches {
                let damaged;
                let stored = match corrupt {
                    Some(at)
                        if batch::verify(stored)
                            .is_ok_and(|i| at >= i.base_offset && at < i.next_offset()) =>
                    {
                        // Served as the damaged bytes a bad disk would return.
                        damaged = corrupted(stored, at);
                        &damaged
                    }
                    _ => stored,
                };
                served += batch::append_served(stored, from, end, &mut batches).unwrap_or(0);
            }
            let mut body = Writer::default();
            PollHeader {
                partition_id: partition.partition,
                current_offset: p.next_offset.saturating_sub(1),
                messages_count: served,
            }
            .write(&mut body);
            body.raw(&batches);
            ok(body.finish())
        }
        _ => Answer::Reply(
            Status::InvalidRequest,
            b"not supported by the fake".to_vec(),
        ),
    }
}

/// The batch with the payload of the message at `offset` changed and every checksum
/// recomputed, so only a content check can tell.
fn corrupted(stored: &[u8], offset: u64) -> Vec<u8> {
    let Ok(info) = batch::verify(stored) else {
        return stored.to_vec();
    };
    let mut builder = BatchBuilder::with_capacity(stored.len());
    let mut payloads: Vec<Vec<u8>> = Vec::new();
    let messages: Vec<_> = batch::messages(stored).collect();
    for m in &messages {
        let mut payload = m.payload.to_vec();
        if m.offset == offset {
            if let Some(b) = payload.first_mut() {
                *b ^= 0xff;
            } else {
                payload.push(1);
            }
        }
        payloads.push(payload);
    }
    for (m, payload) in messages.iter().zip(&payloads) {
        builder.push(NewMessage {
            id: m.id,
            timestamp_delta: (m.timestamp - info.origin_timestamp) as u32,
            payload,
            user_headers: m.user_headers,
        });
    }
    let mut out = builder.finish(info.origin_timestamp);
    let _ = batch::stamp(
        &mut out,
        info.partition_id,
        info.base_offset,
        info.base_timestamp,
    );
    out
}
