//! Reply bodies of the client protocol (docs/client-protocol.md, "Reply bodies"): one
//! codec shared by the daemon, which encodes them, and `appliance::client`, which
//! decodes them. Decoding never panics and bounds every list by the bytes present.

use std::borrow::Cow;

use replication::wire::Operation;

use super::codec::{BodyError, Reader, Writer};

mod cluster;
mod groups;
mod poll;
mod streams;

pub use cluster::{
    ClusterMetadataReply, ClusterNode, ClusterNodesReply, GroupInfo, ListStreamsReply,
    ListTopicsReply, NodeInfo, PartitionRange, PollRoutingReply, StreamInfo, TopicInfo,
    CLUSTER_TEXT_MAX, GROUPS_MAX, LIST_MAX, NODES_MAX, NODE_HEALTHY, NODE_UNREACHABLE,
    PRIMARY_UNKNOWN, ROLE_FOLLOWER, ROLE_LEADER,
};
pub use groups::{ConsumerGroupDetailsReply, ConsumerGroupReply, GroupAssignmentReply};
pub use poll::{split_poll_body, PollBodyError, PollHeader};
pub use streams::{
    PartitionReply, StreamDetailsReply, StreamReply, StreamsReply, TopicDetailsReply, TopicReply,
    TopicsReply, COMPRESSION_NONE,
};

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

/// The text an InvalidRequest (reason) or LimitReached (key) body carries, for errors.
pub fn reason_text(body: &[u8]) -> String {
    const SHOWN_MAX: usize = 512;
    let text = String::from_utf8_lossy(&body[..body.len().min(SHOWN_MAX)]);
    text.chars().filter(|c| !c.is_control()).collect()
}
