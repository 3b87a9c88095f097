//! Prepared metadata operations: the bodies the primary puts in metadata-plane prepares.
//! They may differ from the client's request (docs/protocol.md, "Replication"): topic and
//! partition creation travel as the internal *WithAssignments operations, segment
//! deletion as TruncatePartition, and passwords only as salted hashes.

use replication::wire::{Operation, PartitionKey};

use crate::protocol::codec::{BodyError, Reader, Writer};
use crate::protocol::request::{permissions, write_permissions};
use crate::protocol::users::USER_ACTIVE;
use crate::protocol::StreamPermission;

/// Partitions one Purge op may name (its body stays within a metadata prepare).
pub const PURGE_PARTITIONS_MAX: usize = 3_000;

/// A metadata-plane operation as prepared and applied on every replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetadataOp {
    CreateStream {
        name: String,
        created_at: u64,
    },
    DeleteStream {
        stream_id: u32,
    },
    /// CreateTopicWithAssignments (64): partition ids 0..partitions are assigned.
    CreateTopic {
        stream_id: u32,
        name: String,
        partitions: u32,
        created_at: u64,
        message_expiry: u64,
        max_topic_size: u64,
        /// Where the partitions' first leaders start (`Topic::first_primary`); a body
        /// without it (written before first leaders were spread) is None.
        first_primary: Option<u32>,
    },
    UpdateTopic {
        stream_id: u32,
        topic_id: u32,
        message_expiry: u64,
        max_topic_size: u64,
    },
    DeleteTopic {
        stream_id: u32,
        topic_id: u32,
    },
    /// CreatePartitionsWithAssignments (65).
    CreatePartitions {
        stream_id: u32,
        topic_id: u32,
        count: u32,
    },
    DeletePartitions {
        stream_id: u32,
        topic_id: u32,
        count: u32,
    },
    /// TruncatePartition (68): the partition's first retained offset becomes
    /// `first_offset` (a segment boundary): DeleteSegments as the primary resolved it
    /// from its segments, or retention.
    TruncatePartition {
        partition: PartitionKey,
        first_offset: u64,
    },
    /// A body without the trailing `created_at`, `status` and options (written
    /// before users took them) reads as created at 0, active, no options.
    CreateUser {
        username: String,
        password_hash: String,
        permissions: Vec<StreamPermission>,
        created_at: u64,
        status: u8,
        options: Vec<u8>,
    },
    /// A new name and status where given; options replaced unless empty.
    UpdateUser {
        user_id: u32,
        username: Option<String>,
        status: Option<u8>,
        options: Vec<u8>,
    },
    /// A personal access token of the prepare's user: only the token's hash travels.
    CreateToken {
        name: String,
        hash: String,
        expiry_at: u64,
    },
    /// Deletes the prepare's user's token of this name.
    DeleteToken {
        name: String,
    },
    UpdateStream {
        stream_id: u32,
        name: String,
    },
    /// PurgeStream and PurgeTopic: each partition's first retained offset moves to
    /// the end the primary had committed (reads start there; whole segments below it
    /// are deleted as retention deletes them).
    Purge {
        partitions: Vec<(PartitionKey, u64)>,
    },
    DeleteUser {
        user_id: u32,
    },
    ChangePassword {
        user_id: u32,
        password_hash: String,
    },
    UpdatePermissions {
        user_id: u32,
        permissions: Vec<StreamPermission>,
    },
    CreateConsumerGroup {
        stream_id: u32,
        topic_id: u32,
        name: String,
    },
    DeleteConsumerGroup {
        stream_id: u32,
        topic_id: u32,
        group_id: u32,
    },
    /// The member is the prepare's client.
    JoinConsumerGroup {
        stream_id: u32,
        topic_id: u32,
        group_id: u32,
    },
    LeaveConsumerGroup {
        stream_id: u32,
        topic_id: u32,
        group_id: u32,
    },
}

fn long_string(r: &mut Reader<'_>, field: &'static str) -> Result<String, BodyError> {
    let len = r.u32(field)? as usize;
    if len > 4096 {
        return Err(BodyError::Invalid {
            field,
            rule: "longer than 4096 bytes",
        });
    }
    let mut bytes = Vec::with_capacity(len);
    for _ in 0..len {
        bytes.push(r.u8(field)?);
    }
    String::from_utf8(bytes).map_err(|_| BodyError::NotUtf8 { field })
}

impl MetadataOp {
    /// The operation byte this op is prepared under.
    pub fn operation(&self) -> Operation {
        use MetadataOp as M;
        match self {
            M::CreateStream { .. } => Operation::CreateStream,
            M::DeleteStream { .. } => Operation::DeleteStream,
            M::CreateTopic { .. } => Operation::CreateTopicWithAssignments,
            M::UpdateTopic { .. } => Operation::UpdateTopic,
            M::DeleteTopic { .. } => Operation::DeleteTopic,
            M::CreatePartitions { .. } => Operation::CreatePartitionsWithAssignments,
            M::DeletePartitions { .. } => Operation::DeletePartitions,
            M::TruncatePartition { .. } => Operation::TruncatePartition,
            M::CreateUser { .. } => Operation::CreateUser,
            M::DeleteUser { .. } => Operation::DeleteUser,
            M::ChangePassword { .. } => Operation::ChangePassword,
            M::UpdatePermissions { .. } => Operation::UpdatePermissions,
            M::UpdateUser { .. } => Operation::UpdateUser,
            M::CreateToken { .. } => Operation::CreatePersonalAccessToken,
            M::DeleteToken { .. } => Operation::DeletePersonalAccessToken,
            M::UpdateStream { .. } => Operation::UpdateStream,
            M::Purge { .. } => Operation::PurgeTopic,
            M::CreateConsumerGroup { .. } => Operation::CreateConsumerGroup,
            M::DeleteConsumerGroup { .. } => Operation::DeleteConsumerGroup,
            M::JoinConsumerGroup { .. } => Operation::JoinConsumerGroup,
            M::LeaveConsumerGroup { .. } => Operation::LeaveConsumerGroup,
        }
    }

    /// Encodes the prepared body.
    pub fn encode(&self) -> Vec<u8> {
        use MetadataOp as M;
        let mut w = Writer::default();
        match self {
            M::CreateStream { name, created_at } => {
                w.short_bytes(name.as_bytes()).u64(*created_at);
            }
            M::DeleteStream { stream_id } => {
                w.u32(*stream_id);
            }
            M::CreateTopic {
                stream_id,
                name,
                partitions,
                created_at,
                message_expiry,
                max_topic_size,
                first_primary,
            } => {
                w.u32(*stream_id)
                    .short_bytes(name.as_bytes())
                    .u32(*partitions)
                    .u64(*created_at)
                    .u64(*message_expiry)
                    .u64(*max_topic_size);
                if let Some(first) = first_primary {
                    w.u32(*first);
                }
            }
            M::UpdateTopic {
                stream_id,
                topic_id,
                message_expiry,
                max_topic_size,
            } => {
                w.u32(*stream_id)
                    .u32(*topic_id)
                    .u64(*message_expiry)
                    .u64(*max_topic_size);
            }
            M::DeleteTopic {
                stream_id,
                topic_id,
            } => {
                w.u32(*stream_id).u32(*topic_id);
            }
            M::CreatePartitions {
                stream_id,
                topic_id,
                count,
            }
            | M::DeletePartitions {
                stream_id,
                topic_id,
                count,
            } => {
                w.u32(*stream_id).u32(*topic_id).u32(*count);
            }
            M::TruncatePartition {
                partition,
                first_offset,
            } => {
                w.u32(partition.stream)
                    .u32(partition.topic)
                    .u32(partition.partition)
                    .u64(*first_offset);
            }
            M::CreateUser {
                username,
                password_hash,
                permissions,
                created_at,
                status,
                options,
            } => {
                w.short_bytes(username.as_bytes())
                    .u32(password_hash.len() as u32)
                    .raw(password_hash.as_bytes());
                write_permissions(&mut w, permissions);
                w.u64(*created_at)
                    .u8(*status)
                    .u32(options.len() as u32)
                    .raw(options);
            }
            M::UpdateUser {
                user_id,
                username,
                status,
                options,
            } => {
                w.u32(*user_id);
                match username {
                    Some(name) => w.u8(1).short_bytes(name.as_bytes()),
                    None => w.u8(0),
                };
                w.u8(status.unwrap_or(0))
                    .u32(options.len() as u32)
                    .raw(options);
            }
            M::CreateToken {
                name,
                hash,
                expiry_at,
            } => {
                w.short_bytes(name.as_bytes())
                    .short_bytes(hash.as_bytes())
                    .u64(*expiry_at);
            }
            M::DeleteToken { name } => {
                w.short_bytes(name.as_bytes());
            }
            M::UpdateStream { stream_id, name } => {
                w.u32(*stream_id).short_bytes(name.as_bytes());
            }
            M::Purge { partitions } => {
                w.u32(partitions.len() as u32);
                for (key, offset) in partitions {
                    w.u32(key.stream)
                        .u32(key.topic)
                        .u32(key.partition)
                        .u64(*offset);
                }
            }
            M::DeleteUser { user_id } => {
                w.u32(*user_id);
            }
            M::ChangePassword {
                user_id,
                password_hash,
            } => {
                w.u32(*user_id)
                    .u32(password_hash.len() as u32)
                    .raw(password_hash.as_bytes());
            }
            M::UpdatePermissions {
                user_id,
                permissions,
            } => {
                w.u32(*user_id);
                write_permissions(&mut w, permissions);
            }
            M::CreateConsumerGroup {
                stream_id,
                topic_id,
                name,
            } => {
                w.u32(*stream_id)
                    .u32(*topic_id)
                    .short_bytes(name.as_bytes());
            }
            M::DeleteConsumerGroup {
                stream_id,
                topic_id,
                group_id,
            }
            | M::JoinConsumerGroup {
                stream_id,
                topic_id,
                group_id,
            }
            | M::LeaveConsumerGroup {
                stream_id,
                topic_id,
                group_id,
            } => {
                w.u32(*stream_id).u32(*topic_id).u32(*group_id);
            }
        }
        w.finish()
    }

    /// Decodes a prepared body; a journaled or repaired prepare goes through here, so
    /// it is as strict as client input.
    pub fn decode(operation: Operation, body: &[u8]) -> Result<MetadataOp, BodyError> {
        use Operation as O;
        let mut r = Reader::new(body);
        let op = match operation {
            O::CreateStream => MetadataOp::CreateStream {
                name: r.name("name")?,
                created_at: r.u64("created_at")?,
            },
            O::DeleteStream => MetadataOp::DeleteStream {
                stream_id: r.u32("stream_id")?,
            },
            O::CreateTopicWithAssignments => MetadataOp::CreateTopic {
                stream_id: r.u32("stream_id")?,
                name: r.name("name")?,
                partitions: r.u32("partitions")?,
                created_at: r.u64("created_at")?,
                message_expiry: r.u64("message_expiry")?,
                max_topic_size: r.u64("max_topic_size")?,
                first_primary: if r.remaining() == 0 {
                    None
                } else {
                    Some(r.u32("first_primary")?)
                },
            },
            O::UpdateTopic => MetadataOp::UpdateTopic {
                stream_id: r.u32("stream_id")?,
                topic_id: r.u32("topic_id")?,
                message_expiry: r.u64("message_expiry")?,
                max_topic_size: r.u64("max_topic_size")?,
            },
            O::DeleteTopic => MetadataOp::DeleteTopic {
                stream_id: r.u32("stream_id")?,
                topic_id: r.u32("topic_id")?,
            },
            O::CreatePartitionsWithAssignments | O::DeletePartitions => {
                let (stream_id, topic_id, count) =
                    (r.u32("stream_id")?, r.u32("topic_id")?, r.u32("count")?);
                if operation == O::DeletePartitions {
                    MetadataOp::DeletePartitions {
                        stream_id,
                        topic_id,
                        count,
                    }
                } else {
                    MetadataOp::CreatePartitions {
                        stream_id,
                        topic_id,
                        count,
                    }
                }
            }
            O::TruncatePartition => MetadataOp::TruncatePartition {
                partition: PartitionKey {
                    stream: r.u32("stream_id")?,
                    topic: r.u32("topic_id")?,
                    partition: r.u32("partition_id")?,
                },
                first_offset: r.u64("first_offset")?,
            },
            O::CreateUser => {
                let username = r.name("username")?;
                let password_hash = long_string(&mut r, "password_hash")?;
                let permissions = permissions(&mut r)?;
                let (created_at, status, options) = if r.remaining() == 0 {
                    (0, USER_ACTIVE, Vec::new())
                } else {
                    let created_at = r.u64("created_at")?;
                    let status = r.u8("status")?;
                    let length = r.u32("options_length")? as usize;
                    (created_at, status, r.bytes(length, "options")?.to_vec())
                };
                MetadataOp::CreateUser {
                    username,
                    password_hash,
                    permissions,
                    created_at,
                    status,
                    options,
                }
            }
            O::UpdateUser => {
                let user_id = r.u32("user_id")?;
                let username = match r.u8("has_username")? {
                    0 => None,
                    _ => Some(r.name("username")?),
                };
                let status = Some(r.u8("status")?).filter(|s| *s != 0);
                let length = r.u32("options_length")? as usize;
                MetadataOp::UpdateUser {
                    user_id,
                    username,
                    status,
                    options: r.bytes(length, "options")?.to_vec(),
                }
            }
            O::CreatePersonalAccessToken => MetadataOp::CreateToken {
                name: r.name("name")?,
                hash: r.name("hash")?,
                expiry_at: r.u64("expiry_at")?,
            },
            O::DeletePersonalAccessToken => MetadataOp::DeleteToken {
                name: r.name("name")?,
            },
            O::PurgeStream | O::PurgeTopic => {
                let count = r.u32("partitions_count")? as usize;
                if count > PURGE_PARTITIONS_MAX {
                    return Err(BodyError::TooMany {
                        field: "partitions",
                        count: count as u64,
                        max: PURGE_PARTITIONS_MAX as u64,
                    });
                }
                let partitions = (0..count)
                    .map(|_| {
                        let key = PartitionKey {
                            stream: r.u32("stream_id")?,
                            topic: r.u32("topic_id")?,
                            partition: r.u32("partition_id")?,
                        };
                        Ok((key, r.u64("offset")?))
                    })
                    .collect::<Result<_, BodyError>>()?;
                MetadataOp::Purge { partitions }
            }
            O::UpdateStream => MetadataOp::UpdateStream {
                stream_id: r.u32("stream_id")?,
                name: r.name("name")?,
            },
            O::DeleteUser => MetadataOp::DeleteUser {
                user_id: r.u32("user_id")?,
            },
            O::ChangePassword => MetadataOp::ChangePassword {
                user_id: r.u32("user_id")?,
                password_hash: long_string(&mut r, "password_hash")?,
            },
            O::UpdatePermissions => MetadataOp::UpdatePermissions {
                user_id: r.u32("user_id")?,
                permissions: permissions(&mut r)?,
            },
            O::CreateConsumerGroup => MetadataOp::CreateConsumerGroup {
                stream_id: r.u32("stream_id")?,
                topic_id: r.u32("topic_id")?,
                name: r.name("name")?,
            },
            O::DeleteConsumerGroup | O::JoinConsumerGroup | O::LeaveConsumerGroup => {
                let (stream_id, topic_id, group_id) =
                    (r.u32("stream_id")?, r.u32("topic_id")?, r.u32("group_id")?);
                match operation {
                    O::DeleteConsumerGroup => MetadataOp::DeleteConsumerGroup {
                        stream_id,
                        topic_id,
                        group_id,
                    },
                    O::JoinConsumerGroup => MetadataOp::JoinConsumerGroup {
                        stream_id,
                        topic_id,
                        group_id,
                    },
                    _ => MetadataOp::LeaveConsumerGroup {
                        stream_id,
                        topic_id,
                        group_id,
                    },
                }
            }
            _ => {
                return Err(BodyError::Invalid {
                    field: "operation",
                    rule: "not a prepared metadata operation",
                })
            }
        };
        r.finish()?;
        Ok(op)
    }
}
