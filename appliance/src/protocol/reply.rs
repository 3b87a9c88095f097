//! Reply bodies of the client protocol (docs/client-protocol.md, "Reply bodies"): one
//! codec shared by the daemon, which encodes them, and `appliance::client`, which
//! decodes them. Decoding never panics and bounds every list by the bytes present.

use std::borrow::Cow;

use replication::wire::batch::{self, BatchInfo, BATCH_HEADER_SIZE};
use replication::wire::Operation;

use super::codec::{BodyError, Reader, Writer};

/// Nodes a ClusterMetadata reply may list (replica ids are a u8).
pub const NODES_MAX: usize = 255;
/// Groups a ClusterMetadata reply may list.
pub const GROUPS_MAX: usize = 1 << 20;
/// Entries a ListStreams or ListTopics reply may list.
pub const LIST_MAX: usize = 1 << 20;
/// ClusterMetadata `primary` when a group's primary is not known to the answering node.
pub const PRIMARY_UNKNOWN: u8 = u8::MAX;

/// Refuses a list count that the remaining bytes cannot hold (each entry is at least
/// `entry_min` bytes) or that exceeds `max`, before anything is allocated for it.
fn list_len(
    r: &mut Reader<'_>,
    field: &'static str,
    entry_min: usize,
    max: usize,
) -> Result<usize, BodyError> {
    let count = r.u32(field)? as usize;
    if count > max {
        return Err(BodyError::TooMany {
            field,
            count: count as u64,
            max: max as u64,
        });
    }
    if count.saturating_mul(entry_min) > r.remaining() {
        return Err(BodyError::Truncated { field });
    }
    Ok(count)
}

fn decode_all<T>(
    body: &[u8],
    f: impl FnOnce(&mut Reader<'_>) -> Result<T, BodyError>,
) -> Result<T, BodyError> {
    let mut r = Reader::new(body);
    let value = f(&mut r)?;
    r.finish()?;
    Ok(value)
}

/// Whether an accepted reply to `operation` starts with a result section (Iggy's
/// framing): the metadata operations and the consumer offset writes. Register carries
/// its own (`RegisterReply`).
pub fn result_framed(operation: u8) -> bool {
    use Operation as O;
    match Operation::from_u8(operation) {
        Some(O::DeleteSegments) => false,
        Some(O::StoreConsumerOffset | O::DeleteConsumerOffset) => true,
        Some(o) => {
            o.is_internal()
                || (O::CreateStream as u8..=O::LeaveConsumerGroup as u8).contains(&(o as u8))
        }
        None => false,
    }
}

/// What an accepted reply to `operation` starts with: an empty result section
/// (`count u32` = 0) where `result_framed`, else nothing.
pub fn result_section(operation: u8) -> &'static [u8] {
    const EMPTY_SECTION: [u8; 4] = 0u32.to_le_bytes();
    if result_framed(operation) {
        &EMPTY_SECTION
    } else {
        &[]
    }
}

/// The body of an accepted reply to `operation` as it goes on the wire: after its
/// `result_section`; where that is empty, `body` itself, not copied (a poll's reply is
/// megabytes).
pub fn with_result_section(operation: u8, body: &[u8]) -> Cow<'_, [u8]> {
    let section = result_section(operation);
    if section.is_empty() {
        return Cow::Borrowed(body);
    }
    let mut framed = Vec::with_capacity(section.len() + body.len());
    framed.extend_from_slice(section);
    framed.extend_from_slice(body);
    Cow::Owned(framed)
}

/// The body of an accepted reply to `operation` after its result section.
pub fn strip_result_section(operation: u8, body: &[u8]) -> Result<&[u8], BodyError> {
    if !result_framed(operation) {
        return Ok(body);
    }
    let mut r = Reader::new(body);
    if r.u32("result_count")? != 0 {
        return Err(BodyError::Invalid {
            field: "result_count",
            rule: "an accepted reply has no result entries",
        });
    }
    Ok(r.rest())
}

/// Login: the user the credentials name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoginReply {
    pub user_id: u32,
}

impl LoginReply {
    pub fn encode(&self) -> Vec<u8> {
        Writer::default().u32(self.user_id).finish()
    }

    pub fn decode(body: &[u8]) -> Result<LoginReply, BodyError> {
        decode_all(body, |r| {
            Ok(LoginReply {
                user_id: r.u32("user_id")?,
            })
        })
    }
}

/// Register: who logged in and the session the primary minted, after a result
/// section with no entries (an accepted metadata operation; docs/client-protocol.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterReply {
    pub user_id: u32,
    pub session: u64,
    pub server_protocol_version: u32,
    pub server_version: String,
}

impl RegisterReply {
    /// This server's reply: `user_id` logged in, `session` minted.
    pub fn of_this_server(user_id: u32, session: u64) -> RegisterReply {
        RegisterReply {
            user_id,
            session,
            server_protocol_version: super::request::PROTOCOL_VERSION,
            server_version: super::request::SERVER_VERSION.to_owned(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        Writer::default()
            .u32(0)
            .u32(self.user_id)
            .u64(self.session)
            .u32(self.server_protocol_version)
            .short_bytes(self.server_version.as_bytes())
            .finish()
    }

    pub fn decode(body: &[u8]) -> Result<RegisterReply, BodyError> {
        decode_all(body, |r| {
            if r.u32("result_count")? != 0 {
                return Err(BodyError::Invalid {
                    field: "result_count",
                    rule: "an accepted Register has no result entries",
                });
            }
            let user_id = r.u32("user_id")?;
            let session = r.u64("session")?;
            if session == 0 {
                return Err(BodyError::Invalid {
                    field: "session",
                    rule: "must not be 0",
                });
            }
            Ok(RegisterReply {
                user_id,
                session,
                server_protocol_version: r.u32("server_protocol_version")?,
                server_version: r.name("server_version")?,
            })
        })
    }
}

/// CreateStream, CreateUser and CreateConsumerGroup: the new object's id. Also the u32
/// that CreatePartitions (partitions now) and DeletePartitions (partitions left) answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdReply {
    pub id: u32,
}

impl IdReply {
    pub fn encode(&self) -> Vec<u8> {
        Writer::default().u32(self.id).finish()
    }

    pub fn decode(body: &[u8]) -> Result<IdReply, BodyError> {
        decode_all(body, |r| Ok(IdReply { id: r.u32("id")? }))
    }
}

/// Where a sent batch landed: offsets base_offset..base_offset + count (what the client
/// library returns; the wire carries `SendConfirmations`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendMessagesReply {
    pub base_offset: u64,
    pub count: u32,
}

/// One entry of a SendMessages reply: the partition a batch was appended to and the
/// offset of its first message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendConfirmation {
    pub stream_id: u32,
    pub topic_id: u32,
    pub partition_id: u32,
    pub base_offset: u64,
}

/// SendMessages reply (Iggy's SendMessagesResponse): `count u32`, then per entry
/// `stream_id u32, topic_id u32, partition_id u32, base_offset u64`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendConfirmations {
    pub confirmations: Vec<SendConfirmation>,
}

impl SendConfirmations {
    /// Entries a reply may hold (one per batch; a SendMessages carries one).
    const ENTRIES_MAX: u32 = 1024;

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.confirmations.len() as u32);
        for c in &self.confirmations {
            w.u32(c.stream_id)
                .u32(c.topic_id)
                .u32(c.partition_id)
                .u64(c.base_offset);
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<SendConfirmations, BodyError> {
        decode_all(body, |r| {
            let count = r.u32("confirmations")?;
            if count > Self::ENTRIES_MAX {
                return Err(BodyError::TooMany {
                    field: "confirmations",
                    count: count.into(),
                    max: Self::ENTRIES_MAX.into(),
                });
            }
            let confirmations = (0..count)
                .map(|_| {
                    Ok(SendConfirmation {
                        stream_id: r.u32("stream_id")?,
                        topic_id: r.u32("topic_id")?,
                        partition_id: r.u32("partition_id")?,
                        base_offset: r.u64("base_offset")?,
                    })
                })
                .collect::<Result<_, BodyError>>()?;
            Ok(SendConfirmations { confirmations })
        })
    }
}

/// GetConsumerOffset (Iggy's ConsumerOffsetResponse): the partition, its last committed
/// offset (0 when empty) and the consumer's stored offset. An empty body when the
/// consumer stores none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumerOffsetReply {
    pub partition_id: u32,
    pub current_offset: u64,
    pub stored_offset: u64,
}

impl ConsumerOffsetReply {
    pub fn encode(&self) -> Vec<u8> {
        Writer::default()
            .u32(self.partition_id)
            .u64(self.current_offset)
            .u64(self.stored_offset)
            .finish()
    }

    /// None for the empty body of a consumer without a stored offset.
    pub fn decode(body: &[u8]) -> Result<Option<ConsumerOffsetReply>, BodyError> {
        if body.is_empty() {
            return Ok(None);
        }
        decode_all(body, |r| {
            Ok(Some(ConsumerOffsetReply {
                partition_id: r.u32("partition_id")?,
                current_offset: r.u64("current_offset")?,
                stored_offset: r.u64("stored_offset")?,
            }))
        })
    }
}

/// NotPrimary (status 1): who the primary of the request's group is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotPrimaryReply {
    pub primary: u8,
    /// The primary's client address, "ip:port".
    pub address: String,
}

impl NotPrimaryReply {
    pub fn encode(&self) -> Vec<u8> {
        Writer::default()
            .u8(self.primary)
            .short_bytes(self.address.as_bytes())
            .finish()
    }

    pub fn decode(body: &[u8]) -> Result<NotPrimaryReply, BodyError> {
        decode_all(body, |r| {
            Ok(NotPrimaryReply {
                primary: r.u8("primary")?,
                address: r.name("address")?,
            })
        })
    }
}

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

/// Iggy's consumer group: `id u32, partitions_count u32, members_count u32`, name
/// (short string). GetConsumerGroups lists them one after another (no count).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerGroupReply {
    pub id: u32,
    pub partitions_count: u32,
    pub members_count: u32,
    pub name: String,
}

impl ConsumerGroupReply {
    fn write(&self, w: &mut Writer) {
        w.u32(self.id)
            .u32(self.partitions_count)
            .u32(self.members_count)
            .short_bytes(self.name.as_bytes());
    }

    fn read(r: &mut Reader<'_>) -> Result<ConsumerGroupReply, BodyError> {
        Ok(ConsumerGroupReply {
            id: r.u32("group.id")?,
            partitions_count: r.u32("group.partitions_count")?,
            members_count: r.u32("group.members_count")?,
            name: r.name("group.name")?,
        })
    }

    /// GetConsumerGroups: the groups, concatenated.
    pub fn encode_all(groups: &[ConsumerGroupReply]) -> Vec<u8> {
        let mut w = Writer::default();
        for group in groups {
            group.write(&mut w);
        }
        w.finish()
    }

    pub fn decode_all(body: &[u8]) -> Result<Vec<ConsumerGroupReply>, BodyError> {
        decode_all(body, |r| {
            let mut groups = Vec::new();
            while r.remaining() > 0 {
                if groups.len() >= STREAMS_MAX {
                    return Err(BodyError::TooMany {
                        field: "groups",
                        count: groups.len() as u64 + 1,
                        max: STREAMS_MAX as u64,
                    });
                }
                groups.push(ConsumerGroupReply::read(r)?);
            }
            Ok(groups)
        })
    }
}

/// Iggy's consumer group details (CreateConsumerGroup, GetConsumerGroup): the group,
/// then per member (`members_count` of them) `id u32, partitions_count u32`, then its
/// partition ids (u32 each).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerGroupDetailsReply {
    pub group: ConsumerGroupReply,
    /// Per member: its id (1-based, in the group's member order) and partitions.
    pub members: Vec<(u32, Vec<u32>)>,
}

impl ConsumerGroupDetailsReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        self.group.write(&mut w);
        for (id, partitions) in &self.members {
            w.u32(*id).u32(partitions.len() as u32);
            for partition in partitions {
                w.u32(*partition);
            }
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<ConsumerGroupDetailsReply, BodyError> {
        decode_all(body, |r| {
            let group = ConsumerGroupReply::read(r)?;
            // Each member is at least 8 bytes: refuse a count the body cannot hold
            // before anything is allocated for it.
            if (group.members_count as usize).saturating_mul(8) > r.remaining() {
                return Err(BodyError::Truncated { field: "members" });
            }
            let members = (0..group.members_count)
                .map(|_| {
                    let id = r.u32("member.id")?;
                    let count = list_len(r, "member.partitions", 4, LIST_MAX)?;
                    let partitions = (0..count)
                        .map(|_| r.u32("member.partition"))
                        .collect::<Result<Vec<_>, _>>()?;
                    Ok((id, partitions))
                })
                .collect::<Result<Vec<_>, BodyError>>()?;
            Ok(ConsumerGroupDetailsReply { group, members })
        })
    }
}

/// SyncConsumerGroup (Iggy's): the group's generation u64 (it changes with every
/// membership change), then count u32 and the requesting member's partition ids. An
/// empty body when the requester is not a member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupAssignmentReply {
    pub generation: u64,
    pub partitions: Vec<u32>,
}

impl GroupAssignmentReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u64(self.generation).u32(self.partitions.len() as u32);
        for partition in &self.partitions {
            w.u32(*partition);
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<GroupAssignmentReply, BodyError> {
        decode_all(body, |r| {
            let generation = r.u64("generation")?;
            let count = list_len(r, "partitions", 4, LIST_MAX)?;
            let partitions = (0..count)
                .map(|_| r.u32("partition"))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(GroupAssignmentReply {
                generation,
                partitions,
            })
        })
    }
}

/// Iggy's compression code for "none", the only one the appliance stores.
pub const COMPRESSION_NONE: u8 = 1;
/// Streams or topics a GetStreams or GetStream reply may list.
pub const STREAMS_MAX: usize = 1 << 20;

/// Iggy's stream (CreateStream's reply, each entry of GetStreams, the head of
/// GetStream). Sizes count what the answering node stores; options are empty (the
/// appliance takes none for streams).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamReply {
    pub id: u32,
    /// Microseconds since the Unix epoch.
    pub created_at: u64,
    pub topics_count: u32,
    pub size_bytes: u64,
    pub messages_count: u64,
    pub name: String,
}

impl StreamReply {
    fn write(&self, w: &mut Writer) {
        w.u32(self.id)
            .u64(self.created_at)
            .u32(self.topics_count)
            .u64(self.size_bytes)
            .u64(self.messages_count)
            .short_bytes(self.name.as_bytes())
            .u32(0);
    }

    fn read(r: &mut Reader<'_>) -> Result<StreamReply, BodyError> {
        let reply = StreamReply {
            id: r.u32("stream.id")?,
            created_at: r.u64("stream.created_at")?,
            topics_count: r.u32("stream.topics_count")?,
            size_bytes: r.u64("stream.size_bytes")?,
            messages_count: r.u64("stream.messages_count")?,
            name: r.name("stream.name")?,
        };
        empty_options(r, "stream.options")?;
        Ok(reply)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        self.write(&mut w);
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<StreamReply, BodyError> {
        decode_all(body, StreamReply::read)
    }
}

/// An options block the appliance sends: always empty (u32 length 0).
fn empty_options(r: &mut Reader<'_>, field: &'static str) -> Result<(), BodyError> {
    match r.u32(field)? {
        0 => Ok(()),
        _ => Err(BodyError::Invalid {
            field,
            rule: "the appliance sends no options",
        }),
    }
}

/// GetStreams: every stream the user may read, one after another.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamsReply {
    pub streams: Vec<StreamReply>,
}

impl StreamsReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        for stream in &self.streams {
            stream.write(&mut w);
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<StreamsReply, BodyError> {
        decode_all(body, |r| {
            let streams = r.until_end("streams", STREAMS_MAX, StreamReply::read)?;
            Ok(StreamsReply { streams })
        })
    }
}

/// Iggy's topic header, as GetStream lists a stream's topics. `message_expiry` and
/// `max_topic_size` as set (0 the server default, u64::MAX never / unlimited).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicReply {
    pub id: u32,
    pub created_at: u64,
    pub partitions_count: u32,
    pub message_expiry: u64,
    pub max_topic_size: u64,
    pub size_bytes: u64,
    pub messages_count: u64,
    pub name: String,
}

impl TopicReply {
    fn write(&self, w: &mut Writer) {
        w.u32(self.id)
            .u64(self.created_at)
            .u32(self.partitions_count)
            .u64(self.message_expiry)
            .u8(COMPRESSION_NONE)
            .u64(self.max_topic_size)
            .u64(self.size_bytes)
            .u64(self.messages_count)
            .short_bytes(self.name.as_bytes())
            .u32(0)
            .u32(0);
    }

    fn read(r: &mut Reader<'_>) -> Result<TopicReply, BodyError> {
        let id = r.u32("topic.id")?;
        let created_at = r.u64("topic.created_at")?;
        let partitions_count = r.u32("topic.partitions_count")?;
        let message_expiry = r.u64("topic.message_expiry")?;
        if r.u8("topic.compression")? != COMPRESSION_NONE {
            return Err(BodyError::Invalid {
                field: "topic.compression",
                rule: "the appliance stores messages uncompressed",
            });
        }
        let reply = TopicReply {
            id,
            created_at,
            partitions_count,
            message_expiry,
            max_topic_size: r.u64("topic.max_topic_size")?,
            size_bytes: r.u64("topic.size_bytes")?,
            messages_count: r.u64("topic.messages_count")?,
            name: r.name("topic.name")?,
        };
        empty_options(r, "topic.options")?;
        empty_options(r, "topic.derived_options")?;
        Ok(reply)
    }
}

/// A partition in Iggy's GetTopic and CreateTopic replies, as the answering node stores
/// it: `current_offset` is the offset of its last message (0 when empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionReply {
    pub id: u32,
    pub created_at: u64,
    pub segments_count: u32,
    pub current_offset: u64,
    pub size_bytes: u64,
    pub messages_count: u64,
}

/// GetTopic and CreateTopic: the topic header, then its `partitions_count` partitions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicDetailsReply {
    pub topic: TopicReply,
    pub partitions: Vec<PartitionReply>,
}

impl TopicDetailsReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        self.topic.write(&mut w);
        for p in &self.partitions {
            w.u32(p.id)
                .u64(p.created_at)
                .u32(p.segments_count)
                .u64(p.current_offset)
                .u64(p.size_bytes)
                .u64(p.messages_count);
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<TopicDetailsReply, BodyError> {
        decode_all(body, |r| {
            let topic = TopicReply::read(r)?;
            let count = topic.partitions_count as usize;
            if count.saturating_mul(40) > r.remaining() {
                return Err(BodyError::Truncated {
                    field: "partitions",
                });
            }
            let partitions = (0..count)
                .map(|_| {
                    Ok(PartitionReply {
                        id: r.u32("partition.id")?,
                        created_at: r.u64("partition.created_at")?,
                        segments_count: r.u32("partition.segments_count")?,
                        current_offset: r.u64("partition.current_offset")?,
                        size_bytes: r.u64("partition.size_bytes")?,
                        messages_count: r.u64("partition.messages_count")?,
                    })
                })
                .collect::<Result<Vec<_>, BodyError>>()?;
            Ok(TopicDetailsReply { topic, partitions })
        })
    }
}

/// GetTopics: `count u32`, then the topic headers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicsReply {
    pub topics: Vec<TopicReply>,
}

impl TopicsReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.topics.len() as u32);
        for topic in &self.topics {
            topic.write(&mut w);
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<TopicsReply, BodyError> {
        decode_all(body, |r| {
            let count = list_len(r, "topics", 59, STREAMS_MAX)?;
            let topics = (0..count)
                .map(|_| TopicReply::read(r))
                .collect::<Result<Vec<_>, BodyError>>()?;
            Ok(TopicsReply { topics })
        })
    }
}

/// GetStream: the stream, then its `topics_count` topics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamDetailsReply {
    pub stream: StreamReply,
    pub topics: Vec<TopicReply>,
}

impl StreamDetailsReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        self.stream.write(&mut w);
        for topic in &self.topics {
            topic.write(&mut w);
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<StreamDetailsReply, BodyError> {
        decode_all(body, |r| {
            let stream = StreamReply::read(r)?;
            // Each topic header holds at least 59 bytes.
            let count = stream.topics_count as usize;
            if count.saturating_mul(59) > r.remaining() {
                return Err(BodyError::Truncated { field: "topics" });
            }
            let topics = (0..count)
                .map(|_| TopicReply::read(r))
                .collect::<Result<Vec<_>, BodyError>>()?;
            Ok(StreamDetailsReply { stream, topics })
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

/// The head of a PollMessages reply (Iggy's PolledMessages), before its batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollHeader {
    pub partition_id: u32,
    /// The partition's last committed offset (0 when it holds none).
    pub current_offset: u64,
    /// Messages in the batches that follow.
    pub messages_count: u32,
}

impl PollHeader {
    pub const SIZE: usize = 16;

    pub fn write(&self, w: &mut Writer) {
        w.u32(self.partition_id)
            .u64(self.current_offset)
            .u32(self.messages_count);
    }

    pub fn decode(body: &[u8]) -> Result<PollHeader, BodyError> {
        let mut r = super::codec::Reader::new(body);
        Ok(PollHeader {
            partition_id: r.u32("partition_id")?,
            current_offset: r.u64("current_offset")?,
            messages_count: r.u32("messages_count")?,
        })
    }
}

/// Why a poll reply does not split into whole, valid batches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PollBodyError {
    /// Bytes at `at` are too few for a batch header, or batch_length overruns the body.
    Framing { at: usize, batch_length: u64 },
    /// The batch at `at` fails wire::batch::verify_served.
    Batch { at: usize, error: batch::BatchError },
    /// Shorter than the reply's header.
    Header,
    /// The header counts `counted` messages, the batches hold `held`.
    Count { counted: u32, held: u64 },
}

impl core::fmt::Display for PollBodyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PollBodyError::Framing { at, batch_length } => write!(
                f,
                "batch at byte {at} (batch_length {batch_length}) does not fit the reply"
            ),
            PollBodyError::Batch { at, error } => write!(f, "batch at byte {at}: {error}"),
            PollBodyError::Header => write!(f, "shorter than its 16-byte header"),
            PollBodyError::Count { counted, held } => {
                write!(
                    f,
                    "header counts {counted} messages, the batches hold {held}"
                )
            }
        }
    }
}

impl std::error::Error for PollBodyError {}

/// PollMessages: reads the reply's header, splits the rest (zero or more served
/// batches, concatenated) by each batch's batch_length and verifies every one (message
/// checksums, tiling, batch_checksum) and their count against the header. Returns each
/// batch's bytes with what verify read from it (base_offset: its first message's).
pub fn split_poll_body(body: &[u8]) -> Result<Vec<(&[u8], BatchInfo)>, PollBodyError> {
    let header = PollHeader::decode(body).map_err(|_| PollBodyError::Header)?;
    let batches = split_batches(&body[PollHeader::SIZE..])?;
    let held: u64 = batches
        .iter()
        .map(|(_, i)| u64::from(i.message_count))
        .sum();
    if held != u64::from(header.messages_count) {
        return Err(PollBodyError::Count {
            counted: header.messages_count,
            held,
        });
    }
    Ok(batches)
}

/// Splits served batches; `at` in errors counts from the start of the reply.
fn split_batches(body: &[u8]) -> Result<Vec<(&[u8], BatchInfo)>, PollBodyError> {
    let mut batches = Vec::new();
    let mut offset = 0;
    while offset < body.len() {
        let at = PollHeader::SIZE + offset;
        let rest = &body[offset..];
        let batch_length = rest
            .get(32..40)
            .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .unwrap_or(0);
        if rest.len() < BATCH_HEADER_SIZE
            || batch_length < BATCH_HEADER_SIZE as u64
            || batch_length > rest.len() as u64
        {
            return Err(PollBodyError::Framing { at, batch_length });
        }
        let bytes = &rest[..batch_length as usize];
        let info =
            batch::verify_served(bytes).map_err(|error| PollBodyError::Batch { at, error })?;
        batches.push((bytes, info));
        offset += bytes.len();
    }
    Ok(batches)
}

/// The text an InvalidRequest (reason) or LimitReached (key) body carries, for errors.
pub fn reason_text(body: &[u8]) -> String {
    const SHOWN_MAX: usize = 512;
    let text = String::from_utf8_lossy(&body[..body.len().min(SHOWN_MAX)]);
    text.chars().filter(|c| !c.is_control()).collect()
}
