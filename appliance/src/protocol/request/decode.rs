//! A request body read: each operation's layout checked field by field, internal
//! operations refused.

use replication::wire::Operation;

use super::{
    ack_level, poll, ClientRequest, ClientVersion, Credentials, GroupRef, Identifier, OffsetTarget,
    Partitioning, ReadCommand, LOGIN_TEXT_MAX,
};
use crate::protocol::codec::{BodyError, Reader};
use crate::protocol::{options, users};

/// Iggy's user status: 1 active, 2 inactive.
fn user_status(status: u8) -> Result<u8, BodyError> {
    match status {
        users::USER_ACTIVE | users::USER_INACTIVE => Ok(status),
        _ => Err(BodyError::Invalid {
            field: "status",
            rule: "must be 1 (active) or 2 (inactive)",
        }),
    }
}

/// The rest of the body as an options block that must be empty (as the Iggy server,
/// which takes no updatable key there either).
fn no_options(r: &mut Reader<'_>, rule: &'static str) -> Result<Vec<u8>, BodyError> {
    let block = options_block(r)?;
    if !block.is_empty() {
        return Err(BodyError::Invalid {
            field: "options",
            rule,
        });
    }
    Ok(block)
}

/// The rest of the body as an options block, checked for structure.
fn options_block(r: &mut Reader<'_>) -> Result<Vec<u8>, BodyError> {
    let block = r.rest();
    options::entries(block)?;
    Ok(block.to_vec())
}

fn register(body: &[u8]) -> Result<ClientRequest<'_>, BodyError> {
    let mut r = Reader::new(body);
    let version = ClientVersion {
        protocol_version: r.u32("protocol_version")?,
        sdk_name: r.name("sdk_name")?,
        sdk_version: r.name("sdk_version")?,
    };
    let tail = r.rest();
    // A password login names the user first; a token login has the token alone. The
    // password layout is tried first and must consume the body exactly.
    let password = |tail| {
        let mut r = Reader::new(tail);
        let credentials = Credentials::Password {
            username: r.name("username")?,
            password: r.secret("password")?,
        };
        let context = r.optional_text("client_context", LOGIN_TEXT_MAX)?;
        r.finish()?;
        Ok((credentials, context))
    };
    let token = |tail| {
        let mut r = Reader::new(tail);
        let credentials = Credentials::Token(r.secret("token")?);
        let context = r.optional_text("client_context", LOGIN_TEXT_MAX)?;
        r.finish()?;
        Ok::<_, BodyError>((credentials, context))
    };
    let (credentials, context) = password(tail).or_else(|error| token(tail).map_err(|_| error))?;
    Ok(ClientRequest::Register {
        version,
        credentials,
        context,
    })
}

impl<'a> ClientRequest<'a> {
    /// Parses a request body for `operation` (and `read_command` for NonReplicated).
    /// Internal operations are never accepted from a client.
    pub fn decode(
        operation: Operation,
        read_command: u32,
        body: &'a [u8],
    ) -> Result<ClientRequest<'a>, BodyError> {
        use Operation as O;
        if operation == O::Register {
            return register(body);
        }
        let mut r = Reader::new(body);
        let request = match operation {
            O::NonReplicated => read_request(read_command, &mut r)?,
            O::SendMessages | O::StoreConsumerOffset | O::DeleteConsumerOffset => {
                partition_write(operation, &mut r)?
            }
            O::Logout
            | O::CreateUser
            | O::DeleteUser
            | O::UpdateUser
            | O::ChangePassword
            | O::UpdatePermissions
            | O::CreatePersonalAccessToken
            | O::DeletePersonalAccessToken => user_write(operation, &mut r)?,
            O::CreateStream
            | O::DeleteStream
            | O::CreateTopic
            | O::UpdateTopic
            | O::DeleteTopic
            | O::CreatePartitions
            | O::DeletePartitions
            | O::UpdateStream
            | O::PurgeStream
            | O::PurgeTopic
            | O::CreateConsumerGroup
            | O::DeleteConsumerGroup
            | O::JoinConsumerGroup
            | O::LeaveConsumerGroup
            | O::DeleteSegments => metadata_write(operation, &mut r)?,
            _ => return Err(not_a_client_operation()),
        };
        r.finish()?;
        Ok(request)
    }
}

/// The error of an operation a client may not send.
fn not_a_client_operation() -> BodyError {
    BodyError::Invalid {
        field: "operation",
        rule: "not a client operation",
    }
}

/// A stream, topic, partition or consumer group write.
fn metadata_write<'a>(
    operation: Operation,
    r: &mut Reader<'a>,
) -> Result<ClientRequest<'a>, BodyError> {
    use Operation as O;
    Ok(match operation {
        O::CreateStream => ClientRequest::CreateStream {
            name: r.name("name")?,
        },
        O::DeleteStream => ClientRequest::DeleteStream {
            stream: Identifier::read(r, "stream_id")?,
        },
        O::CreateTopic => ClientRequest::CreateTopic {
            stream: Identifier::read(r, "stream_id")?,
            partitions: r.u32("partitions_count")?,
            name: r.name("name")?,
            options: options_block(r)?,
        },
        O::UpdateTopic => ClientRequest::UpdateTopic {
            stream: Identifier::read(r, "stream_id")?,
            topic: Identifier::read(r, "topic_id")?,
            name: r.name("name")?,
            options: options_block(r)?,
        },
        O::DeleteTopic => ClientRequest::DeleteTopic {
            stream: Identifier::read(r, "stream_id")?,
            topic: Identifier::read(r, "topic_id")?,
        },
        O::CreatePartitions | O::DeletePartitions => {
            let stream = Identifier::read(r, "stream_id")?;
            let topic = Identifier::read(r, "topic_id")?;
            let count = r.u32("partitions_count")?;
            if operation == O::CreatePartitions {
                ClientRequest::CreatePartitions {
                    stream,
                    topic,
                    count,
                }
            } else {
                ClientRequest::DeletePartitions {
                    stream,
                    topic,
                    count,
                }
            }
        }
        O::UpdateStream => {
            let stream = Identifier::read(r, "stream_id")?;
            let name = r.name("name")?;
            no_options(r, "a stream takes no options")?;
            ClientRequest::UpdateStream { stream, name }
        }
        O::PurgeStream => ClientRequest::PurgeStream {
            stream: Identifier::read(r, "stream_id")?,
        },
        O::PurgeTopic => ClientRequest::PurgeTopic {
            stream: Identifier::read(r, "stream_id")?,
            topic: Identifier::read(r, "topic_id")?,
        },
        O::CreateConsumerGroup => ClientRequest::CreateConsumerGroup {
            stream: Identifier::read(r, "stream_id")?,
            topic: Identifier::read(r, "topic_id")?,
            name: r.name("name")?,
        },
        O::DeleteConsumerGroup | O::JoinConsumerGroup | O::LeaveConsumerGroup => {
            let group = GroupRef::read(r)?;
            match operation {
                O::DeleteConsumerGroup => ClientRequest::DeleteConsumerGroup { group },
                O::JoinConsumerGroup => ClientRequest::JoinConsumerGroup { group },
                _ => ClientRequest::LeaveConsumerGroup { group },
            }
        }
        O::DeleteSegments => ClientRequest::DeleteSegments {
            stream: Identifier::read(r, "stream_id")?,
            topic: Identifier::read(r, "topic_id")?,
            partition: r.u32("partition_id")?,
            segments: r.u32("segments")?,
        },
        _ => return Err(not_a_client_operation()),
    })
}

/// A user, password, permissions or personal access token write, or a Logout.
fn user_write<'a>(
    operation: Operation,
    r: &mut Reader<'a>,
) -> Result<ClientRequest<'a>, BodyError> {
    use Operation as O;
    Ok(match operation {
        O::Logout => ClientRequest::Logout,
        O::CreateUser => ClientRequest::CreateUser {
            username: r.name("username")?,
            password: r.secret("password")?,
            status: user_status(r.u8("status")?)?,
            permissions: users::read_permissions(r)?,
            options: no_options(r, "users take no options")?,
        },
        O::DeleteUser => ClientRequest::DeleteUser {
            user: Identifier::read(r, "user_id")?,
        },
        O::UpdateUser => ClientRequest::UpdateUser {
            user: Identifier::read(r, "user_id")?,
            username: match r.u8("has_username")? {
                0 => None,
                _ => Some(r.name("username")?),
            },
            status: match r.u8("has_status")? {
                0 => None,
                _ => Some(user_status(r.u8("status")?)?),
            },
            options: no_options(r, "users take no options")?,
        },
        O::ChangePassword => ClientRequest::ChangePassword {
            user: Identifier::read(r, "user_id")?,
            current_password: r.secret("current_password")?,
            new_password: r.secret("new_password")?,
        },
        O::UpdatePermissions => ClientRequest::UpdatePermissions {
            user: Identifier::read(r, "user_id")?,
            permissions: users::read_permissions(r)?,
        },
        O::CreatePersonalAccessToken => ClientRequest::CreateToken {
            name: r.name("name")?,
            expiry: r.u64("expiry")?,
        },
        O::DeletePersonalAccessToken => ClientRequest::DeleteToken {
            name: r.name("name")?,
        },
        _ => return Err(not_a_client_operation()),
    })
}

/// A partition-plane write: messages, or a consumer offset stored or deleted.
fn partition_write<'a>(
    operation: Operation,
    r: &mut Reader<'a>,
) -> Result<ClientRequest<'a>, BodyError> {
    use Operation as O;
    Ok(match operation {
        O::SendMessages => {
            let metadata_length = r.u32("metadata_length")?;
            let mut m = Reader::new(r.bytes(metadata_length as usize, "metadata")?);
            let stream = Identifier::read(&mut m, "stream_id")?;
            let topic = Identifier::read(&mut m, "topic_id")?;
            let partitioning = Partitioning::read(&mut m)?;
            let messages_count = m.u32("messages_count")?;
            m.finish()?;
            ClientRequest::SendMessages {
                stream,
                topic,
                partitioning,
                messages_count,
                batch: r.rest(),
            }
        }
        O::StoreConsumerOffset => {
            let target = OffsetTarget::read(r)?;
            let offset = r.u64("offset")?;
            ack_level(r)?;
            ClientRequest::StoreConsumerOffset { target, offset }
        }
        O::DeleteConsumerOffset => {
            let target = OffsetTarget::read(r)?;
            ack_level(r)?;
            ClientRequest::DeleteConsumerOffset { target }
        }
        _ => return Err(not_a_client_operation()),
    })
}

/// A NonReplicated request: a read (or Login, Ping), by `read_command`; an unknown one
/// is answered whatever its body holds.
fn read_request<'a>(read_command: u32, r: &mut Reader<'a>) -> Result<ClientRequest<'a>, BodyError> {
    Ok(match ReadCommand::from_u32(read_command) {
        Some(ReadCommand::Login) => ClientRequest::Login {
            username: r.name("username")?,
            password: r.secret("password")?,
            version: r.optional_text("version", LOGIN_TEXT_MAX)?,
            context: r.optional_text("context", LOGIN_TEXT_MAX)?,
        },
        Some(ReadCommand::Ping) => ClientRequest::Ping,
        Some(ReadCommand::ClusterMetadata) => ClientRequest::ClusterMetadata,
        Some(ReadCommand::ClusterNodes) => ClientRequest::ClusterNodes,
        Some(ReadCommand::GetStream) => ClientRequest::GetStream {
            stream: Identifier::read(r, "stream_id")?,
        },
        Some(ReadCommand::GetStreams) => ClientRequest::GetStreams,
        Some(ReadCommand::GetTopic) => ClientRequest::GetTopic {
            stream: Identifier::read(r, "stream_id")?,
            topic: Identifier::read(r, "topic_id")?,
        },
        Some(ReadCommand::GetTopics) => ClientRequest::GetTopics {
            stream: Identifier::read(r, "stream_id")?,
        },
        Some(ReadCommand::ListStreams) => ClientRequest::ListStreams,
        Some(ReadCommand::ListTopics) => ClientRequest::ListTopics {
            stream_id: r.u32("stream_id")?,
        },
        Some(ReadCommand::PollMessages | ReadCommand::PollMessagesOnPrimary) => {
            let (target, strategy, count, auto_commit) = poll(r)?;
            ClientRequest::PollMessages {
                target,
                strategy,
                count,
                auto_commit,
            }
        }
        Some(ReadCommand::GetPollRouting) => {
            let (target, strategy, count, auto_commit) = poll(r)?;
            ClientRequest::GetPollRouting {
                target,
                strategy,
                count,
                auto_commit,
            }
        }
        Some(ReadCommand::GetConsumerOffsetRouting) => ClientRequest::GetConsumerOffsetRouting {
            target: OffsetTarget::read(r)?,
        },
        Some(ReadCommand::GetConsumerGroup) => ClientRequest::GetConsumerGroup {
            group: GroupRef::read(r)?,
        },
        Some(ReadCommand::GetConsumerGroups) => ClientRequest::GetConsumerGroups {
            stream: Identifier::read(r, "stream_id")?,
            topic: Identifier::read(r, "topic_id")?,
        },
        Some(ReadCommand::SyncConsumerGroup) => ClientRequest::SyncConsumerGroup {
            group: GroupRef::read(r)?,
        },
        Some(ReadCommand::AttachConsumerSession) => ClientRequest::AttachConsumerSession {
            client: r.u128("client_id")?,
            session: r.u64("session")?,
            metadata_watermark: r.u64("metadata_watermark")?,
        },
        Some(ReadCommand::GetConsumerOffset) => ClientRequest::GetConsumerOffset {
            target: OffsetTarget::read(r)?,
        },
        Some(ReadCommand::GetUser) => ClientRequest::GetUser {
            user: Identifier::read(r, "user_id")?,
        },
        Some(ReadCommand::GetUsers) => ClientRequest::GetUsers,
        Some(ReadCommand::GetTokens) => ClientRequest::GetTokens,
        Some(ReadCommand::LoginWithToken) => ClientRequest::LoginWithToken {
            token: r.secret("token")?,
        },
        Some(ReadCommand::GetMe) => ClientRequest::GetMe,
        Some(ReadCommand::GetClient) => ClientRequest::GetClient {
            client_id: r.u32("client_id")?,
        },
        Some(ReadCommand::GetClients) => ClientRequest::GetClients,
        Some(ReadCommand::GetStats) => ClientRequest::GetStats,
        None => {
            // Answered whatever the body holds.
            r.rest();
            ClientRequest::Unsupported { code: read_command }
        }
    })
}
