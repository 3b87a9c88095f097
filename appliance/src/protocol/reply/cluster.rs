//! The appliance's cluster replies: Iggy's cluster metadata (nodes and their roles),
//! the appliance's own ClusterMetadata with every group's primary, the stream and topic
//! lists with their partition ranges, and a consumer offset's routing.

use super::{decode_all, list_len};
use crate::protocol::codec::{BodyError, Reader, Writer};

/// Nodes a ClusterMetadata reply may list (replica ids are a u8).
pub const NODES_MAX: usize = 255;
/// Groups a ClusterMetadata reply may list.
pub const GROUPS_MAX: usize = 1 << 20;
/// Entries any list of a reply may hold: streams, topics, consumer groups, partitions,
/// a member's partitions, the stored topics of a ListStreams or ListTopics reply.
pub const LIST_MAX: usize = 1 << 20;
/// ClusterMetadata `primary` when a group's primary is not known to the answering node.
pub const PRIMARY_UNKNOWN: u8 = u8::MAX;

/// A node's role in Iggy's cluster metadata: the metadata group's primary leads.
pub const ROLE_LEADER: u8 = 0;
pub const ROLE_FOLLOWER: u8 = 1;
/// A node's status in Iggy's cluster metadata, as the answering node sees it.
pub const NODE_HEALTHY: u8 = 0;
pub const NODE_UNREACHABLE: u8 = 3;
/// Bytes a name or address in Iggy's cluster metadata may hold.
pub const CLUSTER_TEXT_MAX: usize = 1024;

/// One node in Iggy's cluster metadata (GetClusterMetadata, code 12).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    pub name: String,
    /// The host clients dial (advertised_address, else ip).
    pub ip: String,
    pub tcp_port: u16,
    /// ROLE_LEADER or ROLE_FOLLOWER.
    pub role: u8,
    /// NODE_HEALTHY or NODE_UNREACHABLE.
    pub status: u8,
}

/// Iggy's GetClusterMetadata (code 12): the cluster's name and every node with its
/// address and role, which Iggy's SDKs read to find the leader. The QUIC, HTTP and
/// WebSocket ports are 0: the appliance serves TCP only.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterNodesReply {
    pub name: String,
    pub nodes: Vec<ClusterNode>,
}

impl ClusterNodesReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.text(&self.name).u32(self.nodes.len() as u32);
        for node in &self.nodes {
            node.write(&mut w);
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<ClusterNodesReply, BodyError> {
        decode_all(body, |r| {
            let name = r.text("name", CLUSTER_TEXT_MAX)?;
            let count = list_len(r, "nodes", 18, NODES_MAX)?;
            let nodes = (0..count)
                .map(|_| ClusterNode::read(r))
                .collect::<Result<Vec<_>, BodyError>>()?;
            Ok(ClusterNodesReply { name, nodes })
        })
    }
}

impl ClusterNode {
    /// name, ip (u32-length texts), tcp_port u16, then the QUIC, HTTP and WebSocket
    /// ports (u16 0: not served), role u8, status u8.
    fn write(&self, w: &mut Writer) {
        w.text(&self.name)
            .text(&self.ip)
            .u16(self.tcp_port)
            .u16(0)
            .u16(0)
            .u16(0)
            .u8(self.role)
            .u8(self.status);
    }

    fn read(r: &mut Reader<'_>) -> Result<ClusterNode, BodyError> {
        let name = r.text("node.name", CLUSTER_TEXT_MAX)?;
        let ip = r.text("node.ip", CLUSTER_TEXT_MAX)?;
        let tcp_port = r.u16("node.tcp_port")?;
        for field in ["node.quic_port", "node.http_port", "node.websocket_port"] {
            r.u16(field)?;
        }
        Ok(ClusterNode {
            name,
            ip,
            tcp_port,
            role: r.u8("node.role")?,
            status: r.u8("node.status")?,
        })
    }
}

/// GetPollRouting and GetConsumerOffsetRouting (Iggy's PollRoutingResponse): the
/// session a connection to the partition's primary attaches to (AttachConsumerSession:
/// client u128, session u64, metadata_watermark u64, the metadata commit that node must
/// have reached), then that primary as GetClusterMetadata lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PollRoutingReply {
    pub client: u128,
    pub session: u64,
    pub metadata_watermark: u64,
    pub primary: ClusterNode,
}

impl PollRoutingReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u128(self.client)
            .u64(self.session)
            .u64(self.metadata_watermark);
        self.primary.write(&mut w);
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<PollRoutingReply, BodyError> {
        decode_all(body, |r| {
            Ok(PollRoutingReply {
                client: r.u128("client")?,
                session: r.u64("session")?,
                metadata_watermark: r.u64("metadata_watermark")?,
                primary: ClusterNode::read(r)?,
            })
        })
    }
}

/// One node of the cluster as clients reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub replica_id: u8,
    /// advertised_address, else ip, with ports.tcp: "ip:port".
    pub address: String,
}

/// One consensus group and its primary as the answering node knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupInfo {
    /// METADATA_GROUP or a packed partition key.
    pub group: u64,
    pub view: u32,
    /// The primary's replica id, or PRIMARY_UNKNOWN.
    pub primary: u8,
}

/// ClusterMetadata: the nodes and the primary of each group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterMetadataReply {
    pub nodes: Vec<NodeInfo>,
    pub groups: Vec<GroupInfo>,
}

impl ClusterMetadataReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.nodes.len() as u32);
        for node in &self.nodes {
            w.u8(node.replica_id).short_bytes(node.address.as_bytes());
        }
        w.u32(self.groups.len() as u32);
        for group in &self.groups {
            w.u64(group.group).u32(group.view).u8(group.primary);
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<ClusterMetadataReply, BodyError> {
        decode_all(body, |r| {
            let count = list_len(r, "nodes", 3, NODES_MAX)?;
            let nodes = (0..count)
                .map(|_| {
                    Ok(NodeInfo {
                        replica_id: r.u8("node.replica_id")?,
                        address: r.name("node.address")?,
                    })
                })
                .collect::<Result<Vec<_>, BodyError>>()?;
            let count = list_len(r, "groups", 13, GROUPS_MAX)?;
            let groups = (0..count)
                .map(|_| {
                    Ok(GroupInfo {
                        group: r.u64("group.group")?,
                        view: r.u32("group.view")?,
                        primary: r.u8("group.primary")?,
                    })
                })
                .collect::<Result<Vec<_>, BodyError>>()?;
            Ok(ClusterMetadataReply { nodes, groups })
        })
    }

    /// The client address of `replica_id`, if listed.
    pub fn address_of(&self, replica_id: u8) -> Option<&str> {
        self.nodes
            .iter()
            .find(|n| n.replica_id == replica_id)
            .map(|n| n.address.as_str())
    }
}

/// One stream of a ListStreams reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    pub stream_id: u32,
    pub name: String,
    pub topic_count: u32,
}

/// One topic of a ListTopics reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicInfo {
    pub topic_id: u32,
    pub name: String,
    pub partitions: u32,
    /// The topic's own retention as set (0: the server default; u64::MAX: never / no
    /// limit).
    pub message_expiry: u64,
    pub max_topic_size: u64,
    /// What the answering node stores of each partition.
    pub stored: Vec<PartitionRange>,
}

/// The offsets a partition retains on the answering node: `first_offset` (what a poll
/// from offset 0 starts at) up to `end_offset` (committed), in `bytes` of `segments`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionRange {
    pub partition: u32,
    pub first_offset: u64,
    pub end_offset: u64,
    pub bytes: u64,
    pub segments: u32,
}

/// ListStreams: every stream the user may read, by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListStreamsReply {
    pub streams: Vec<StreamInfo>,
}

impl ListStreamsReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.streams.len() as u32);
        for s in &self.streams {
            w.u32(s.stream_id)
                .short_bytes(s.name.as_bytes())
                .u32(s.topic_count);
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<ListStreamsReply, BodyError> {
        decode_all(body, |r| {
            let count = list_len(r, "streams", 10, LIST_MAX)?;
            let streams = (0..count)
                .map(|_| {
                    Ok(StreamInfo {
                        stream_id: r.u32("stream.stream_id")?,
                        name: r.name("stream.name")?,
                        topic_count: r.u32("stream.topic_count")?,
                    })
                })
                .collect::<Result<Vec<_>, BodyError>>()?;
            Ok(ListStreamsReply { streams })
        })
    }
}

/// ListTopics: every topic of the stream, by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListTopicsReply {
    pub topics: Vec<TopicInfo>,
}

impl ListTopicsReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.topics.len() as u32);
        for t in &self.topics {
            w.u32(t.topic_id)
                .short_bytes(t.name.as_bytes())
                .u32(t.partitions)
                .u64(t.message_expiry)
                .u64(t.max_topic_size)
                .u32(t.stored.len() as u32);
            for p in &t.stored {
                w.u32(p.partition)
                    .u64(p.first_offset)
                    .u64(p.end_offset)
                    .u64(p.bytes)
                    .u32(p.segments);
            }
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<ListTopicsReply, BodyError> {
        decode_all(body, |r| {
            let count = list_len(r, "topics", 30, LIST_MAX)?;
            let topics = (0..count)
                .map(|_| {
                    let topic_id = r.u32("topic.topic_id")?;
                    let name = r.name("topic.name")?;
                    let partitions = r.u32("topic.partitions")?;
                    let message_expiry = r.u64("topic.message_expiry")?;
                    let max_topic_size = r.u64("topic.max_topic_size")?;
                    let stored = list_len(r, "topic.stored", 32, LIST_MAX)?;
                    let stored = (0..stored)
                        .map(|_| {
                            Ok(PartitionRange {
                                partition: r.u32("stored.partition")?,
                                first_offset: r.u64("stored.first_offset")?,
                                end_offset: r.u64("stored.end_offset")?,
                                bytes: r.u64("stored.bytes")?,
                                segments: r.u32("stored.segments")?,
                            })
                        })
                        .collect::<Result<Vec<_>, BodyError>>()?;
                    Ok(TopicInfo {
                        topic_id,
                        name,
                        partitions,
                        message_expiry,
                        max_topic_size,
                        stored,
                    })
                })
                .collect::<Result<Vec<_>, BodyError>>()?;
            Ok(ListTopicsReply { topics })
        })
    }
}
