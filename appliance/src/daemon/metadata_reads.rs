//! The NonReplicated reads of metadata: Iggy's (GetClusterMetadata, GetStreams,
//! GetStream, GetTopics, GetTopic, consumer groups) and the client plane's own
//! (ClusterMetadata, ListStreams, ListTopics), answered from this node's committed
//! metadata, with the sizes and offsets of what this node stores
//! (docs/client-protocol.md).

use replication::wire::PartitionKey;

use super::node::Node;
use crate::protocol::codec::Writer;
use crate::protocol::reply::{
    ClusterMetadataReply, ClusterNode, ClusterNodesReply, ConsumerGroupReply, GroupAssignmentReply,
    GroupInfo, ListTopicsReply, NodeInfo, PartitionRange, PartitionReply, StreamDetailsReply,
    StreamReply, StreamsReply, TopicDetailsReply, TopicInfo, TopicReply, TopicsReply, NODE_HEALTHY,
    NODE_UNREACHABLE, PRIMARY_UNKNOWN, ROLE_FOLLOWER, ROLE_LEADER,
};
use crate::protocol::request::{GroupRef, Identifier};
use crate::protocol::{ClientRequest, Status};
use crate::state::Right;

impl Node {
    /// NonReplicated reads, from committed state only.
    pub(super) fn read(&self, user: u32, request: &ClientRequest<'_>) -> (Status, Vec<u8>) {
        match request {
            ClientRequest::ClusterMetadata => (Status::Ok, self.cluster_metadata().encode()),
            ClientRequest::ClusterNodes
            | ClientRequest::GetStreams
            | ClientRequest::GetStream { .. }
            | ClientRequest::GetTopic { .. }
            | ClientRequest::GetTopics { .. }
            | ClientRequest::GetConsumerGroup { .. }
            | ClientRequest::GetConsumerGroups { .. } => self.metadata_read(user, request),
            ClientRequest::ListStreams => (Status::Ok, self.list_streams(user)),
            ClientRequest::ListTopics { stream_id } => self.list_topics(user, *stream_id),
            ClientRequest::GetConsumerOffset { target } => self.get_consumer_offset(user, target),
            _ => (Status::InvalidRequest, Vec::new()),
        }
    }

    /// The client plane's own ClusterMetadata: every node's client address and every
    /// group's view and primary (unknown while not normal). One codec for the daemon and
    /// the client (protocol::reply).
    fn cluster_metadata(&self) -> ClusterMetadataReply {
        let nodes = self
            .settings
            .client_addresses
            .iter()
            .map(|(replica, address)| NodeInfo {
                replica_id: *replica,
                address: address.clone(),
            })
            .collect();
        let groups = self
            .group_ids()
            .into_iter()
            .filter_map(|group| self.groups.get(group))
            .map(|replica| GroupInfo {
                group: replica.config().group,
                view: replica.view(),
                primary: if replica.status() == replication::vsr::Status::Normal {
                    replica.config().primary_of(replica.view())
                } else {
                    PRIMARY_UNKNOWN
                },
            })
            .collect();
        ClusterMetadataReply { nodes, groups }
    }

    /// The streams `user` may read: id, name and topic count of each.
    fn list_streams(&self, user: u32) -> Vec<u8> {
        let streams: Vec<_> = self
            .state
            .streams
            .iter()
            .filter(|(id, _)| self.state.allows(user, **id, Right::Read))
            .collect();
        let mut w = Writer::default();
        w.u32(streams.len() as u32);
        for (id, stream) in streams {
            w.u32(*id)
                .short_bytes(stream.name.as_bytes())
                .u32(stream.topics.len() as u32);
        }
        w.finish()
    }

    /// A stream's topics, each with what this node stores of its partitions.
    fn list_topics(&self, user: u32, stream_id: u32) -> (Status, Vec<u8>) {
        if !self.state.allows(user, stream_id, Right::Read) {
            return (Status::PermissionDenied, Vec::new());
        }
        let Some(stream) = self.state.streams.get(&stream_id) else {
            return (Status::NotFound, Vec::new());
        };
        let topics = stream
            .topics
            .iter()
            .map(|(id, topic)| TopicInfo {
                topic_id: *id,
                name: topic.name.clone(),
                partitions: topic.partition_count,
                message_expiry: topic.message_expiry,
                max_topic_size: topic.max_topic_size,
                stored: (0..topic.partition_count)
                    .filter_map(|partition| {
                        self.partition_range(PartitionKey {
                            stream: stream_id,
                            topic: *id,
                            partition,
                        })
                    })
                    .collect(),
            })
            .collect();
        (Status::Ok, ListTopicsReply { topics }.encode())
    }

    /// What this node stores of a partition: offsets, bytes and segments.
    fn partition_range(&self, key: PartitionKey) -> Option<PartitionRange> {
        let stored = self.stored(key)?;
        Some(PartitionRange {
            partition: key.partition,
            first_offset: stored.first_offset,
            end_offset: stored.committed_end,
            bytes: stored.bytes,
            segments: self.segment_count(key),
        })
    }

    /// The segment files this node holds of a partition (0 when it holds none).
    fn segment_count(&self, key: PartitionKey) -> u32 {
        key.pack()
            .ok()
            .and_then(|group| self.partitions.by_group.get(&group))
            .map_or(0, |p| p.log.segment_count() as u32)
    }

    /// Answers one of Iggy's metadata reads for `user`. An unknown stream or topic in
    /// GetStream and GetTopic is an empty answer (the SDK's "none").
    pub(super) fn metadata_read(
        &self,
        user: u32,
        request: &ClientRequest<'_>,
    ) -> (Status, Vec<u8>) {
        let readable = |stream_id: u32| self.state.allows(user, stream_id, Right::Read);
        match request {
            ClientRequest::ClusterNodes => (Status::Ok, self.cluster_nodes().encode()),
            ClientRequest::GetStreams => {
                let streams = self
                    .state
                    .streams
                    .keys()
                    .filter(|id| readable(**id))
                    .filter_map(|id| self.stream_reply(*id, &self.topic_replies(*id)))
                    .collect();
                (Status::Ok, StreamsReply { streams }.encode())
            }
            ClientRequest::GetStream { stream } => {
                let Some(stream_id) = self.state.stream_id(stream) else {
                    return (Status::Ok, Vec::new());
                };
                if !readable(stream_id) {
                    return (Status::PermissionDenied, Vec::new());
                }
                let topics = self.topic_replies(stream_id);
                let Some(head) = self.stream_reply(stream_id, &topics) else {
                    return (Status::Ok, Vec::new());
                };
                let reply = StreamDetailsReply {
                    stream: head,
                    topics,
                };
                (Status::Ok, reply.encode())
            }
            ClientRequest::GetTopics { stream } => {
                let Some(stream_id) = self.state.stream_id(stream) else {
                    return (Status::NotFound, Vec::new());
                };
                if !readable(stream_id) {
                    return (Status::PermissionDenied, Vec::new());
                }
                let topics = self.topic_replies(stream_id);
                (Status::Ok, TopicsReply { topics }.encode())
            }
            ClientRequest::GetTopic { stream, topic } => self.get_topic(stream, topic, readable),
            ClientRequest::GetConsumerGroup { group } => {
                let Some((stream_id, topic_id, group_id)) = self.state.group_id(group) else {
                    return (Status::Ok, Vec::new());
                };
                if !readable(stream_id) {
                    return (Status::PermissionDenied, Vec::new());
                }
                let topic = self.state.topic(stream_id, topic_id);
                match topic.and_then(|t| Some((t, t.groups.get(&group_id)?))) {
                    Some((topic, g)) => (
                        Status::Ok,
                        g.details(group_id, topic.partition_count).encode(),
                    ),
                    None => (Status::Ok, Vec::new()),
                }
            }
            ClientRequest::GetConsumerGroups { stream, topic } => {
                let Some((stream_id, topic_id)) = self.state.topic_id(stream, topic) else {
                    return (Status::NotFound, Vec::new());
                };
                if !readable(stream_id) {
                    return (Status::PermissionDenied, Vec::new());
                }
                let groups: Vec<ConsumerGroupReply> = self
                    .state
                    .topic(stream_id, topic_id)
                    .map(|topic| {
                        topic
                            .groups
                            .iter()
                            .map(|(id, g)| g.details(*id, topic.partition_count).group)
                            .collect()
                    })
                    .unwrap_or_default();
                (Status::Ok, ConsumerGroupReply::encode_all(&groups))
            }
            _ => (Status::InvalidRequest, Vec::new()),
        }
    }

    fn get_topic(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        readable: impl Fn(u32) -> bool,
    ) -> (Status, Vec<u8>) {
        let Some((stream_id, topic_id)) = self.state.topic_id(stream, topic) else {
            return (Status::Ok, Vec::new());
        };
        if !readable(stream_id) {
            return (Status::PermissionDenied, Vec::new());
        }
        let Some(head) = self.topic_reply(stream_id, topic_id) else {
            return (Status::Ok, Vec::new());
        };
        let created_at = head.created_at;
        let partitions = (0..head.partitions_count)
            .map(|partition| {
                let key = PartitionKey {
                    stream: stream_id,
                    topic: topic_id,
                    partition,
                };
                let stored = self.stored(key);
                let (first, end, bytes) =
                    stored.map_or((0, 0, 0), |s| (s.first_offset, s.committed_end, s.bytes));
                PartitionReply {
                    id: partition,
                    created_at,
                    segments_count: self.segment_count(key),
                    current_offset: end.saturating_sub(1),
                    size_bytes: bytes,
                    messages_count: end.saturating_sub(first),
                }
            })
            .collect();
        let reply = TopicDetailsReply {
            topic: head,
            partitions,
        };
        (Status::Ok, reply.encode())
    }

    /// Iggy's topic header, its sizes as this node stores them.
    fn topic_reply(&self, stream_id: u32, topic_id: u32) -> Option<TopicReply> {
        let topic = self.state.topic(stream_id, topic_id)?;
        let (size_bytes, messages_count) = self.topic_sizes(stream_id, topic_id);
        Some(topic.reply(topic_id, size_bytes, messages_count))
    }

    /// Bytes and messages this node stores of a topic's partitions.
    pub(super) fn topic_sizes(&self, stream: u32, topic: u32) -> (u64, u64) {
        let count = self
            .state
            .streams
            .get(&stream)
            .and_then(|s| s.topics.get(&topic))
            .map_or(0, |t| t.partition_count);
        (0..count)
            .filter_map(|partition| {
                self.stored(PartitionKey {
                    stream,
                    topic,
                    partition,
                })
            })
            .fold((0, 0), |(bytes, messages), stored| {
                (
                    bytes + stored.bytes,
                    messages + stored.committed_end.saturating_sub(stored.first_offset),
                )
            })
    }

    /// Iggy's headers of a stream's topics (none for an unknown stream).
    fn topic_replies(&self, stream_id: u32) -> Vec<TopicReply> {
        self.state
            .streams
            .get(&stream_id)
            .map_or_else(Vec::new, |stream| {
                stream
                    .topics
                    .keys()
                    .filter_map(|topic| self.topic_reply(stream_id, *topic))
                    .collect()
            })
    }

    /// Iggy's view of a stream, its sizes summed from its topics' (`topic_replies`).
    fn stream_reply(&self, stream_id: u32, topics: &[TopicReply]) -> Option<StreamReply> {
        let stream = self.state.streams.get(&stream_id)?;
        Some(stream.reply(stream_id, topics))
    }

    /// Iggy's cluster metadata: every node with the address clients dial; the metadata
    /// group's primary leads (no node does during a view change); a peer this node has
    /// no link to is reported unreachable.
    pub(super) fn cluster_nodes(&self) -> ClusterNodesReply {
        let nodes = self
            .settings
            .client_addresses
            .keys()
            .map(|replica| self.cluster_node(*replica))
            .collect();
        ClusterNodesReply {
            name: self.settings.cluster_name.clone(),
            nodes,
        }
    }

    /// Iggy's SyncConsumerGroup for `client`: the group's generation and the client's
    /// partitions; an empty body when the client is not a member.
    pub(super) fn group_assignment(
        &self,
        user: u32,
        group: &GroupRef,
        client: u128,
    ) -> (Status, Vec<u8>) {
        let Some((stream_id, topic_id, group_id)) = self.state.group_id(group) else {
            return (Status::NotFound, Vec::new());
        };
        if !self.state.allows(user, stream_id, Right::Read) {
            return (Status::PermissionDenied, Vec::new());
        }
        let found = self
            .state
            .topic(stream_id, topic_id)
            .and_then(|t| Some((t, t.groups.get(&group_id)?)));
        let Some((topic, group)) = found else {
            return (Status::NotFound, Vec::new());
        };
        match group.assignment_of(client, topic.partition_count) {
            Some(partitions) => {
                let reply = GroupAssignmentReply {
                    generation: group.generation,
                    partitions,
                };
                (Status::Ok, reply.encode())
            }
            None => (Status::Ok, Vec::new()),
        }
    }

    /// Node `replica` as GetClusterMetadata lists it.
    pub(super) fn cluster_node(&self, replica: u8) -> ClusterNode {
        let leader = self
            .metadata()
            .filter(|r| r.status() == replication::vsr::Status::Normal)
            .map(|r| r.config().primary_of(r.view()));
        let address = self
            .settings
            .client_addresses
            .get(&replica)
            .map_or("", String::as_str);
        // "host:port" or "[v6]:port": the port follows the last colon.
        let (host, port) = address.rsplit_once(':').unwrap_or((address, "0"));
        let reachable = replica == self.settings.replica || self.bus.is_connected(replica);
        ClusterNode {
            name: format!("node-{replica}"),
            ip: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            tcp_port: port.parse().unwrap_or(0),
            role: if leader == Some(replica) {
                ROLE_LEADER
            } else {
                ROLE_FOLLOWER
            },
            status: if reachable {
                NODE_HEALTHY
            } else {
                NODE_UNREACHABLE
            },
        }
    }
}
