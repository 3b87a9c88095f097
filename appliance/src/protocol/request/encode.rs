//! A request as it travels: its operation and its body written in the layout `decode`
//! reads.

use replication::wire::Operation;

use super::{ClientRequest, Credentials, ReadCommand, ACK_QUORUM};
use crate::protocol::codec::Writer;
use crate::protocol::users;

impl ClientRequest<'_> {
    /// The operation byte and read command this request travels under.
    pub fn operation(&self) -> (Operation, u32) {
        use ClientRequest as R;
        let read = |c: ReadCommand| (Operation::NonReplicated, c as u32);
        match self {
            R::Register { .. } => (Operation::Register, 0),
            R::Logout => (Operation::Logout, 0),
            R::CreateStream { .. } => (Operation::CreateStream, 0),
            R::DeleteStream { .. } => (Operation::DeleteStream, 0),
            R::CreateTopic { .. } => (Operation::CreateTopic, 0),
            R::UpdateTopic { .. } => (Operation::UpdateTopic, 0),
            R::DeleteTopic { .. } => (Operation::DeleteTopic, 0),
            R::CreatePartitions { .. } => (Operation::CreatePartitions, 0),
            R::DeletePartitions { .. } => (Operation::DeletePartitions, 0),
            R::CreateUser { .. } => (Operation::CreateUser, 0),
            R::DeleteUser { .. } => (Operation::DeleteUser, 0),
            R::ChangePassword { .. } => (Operation::ChangePassword, 0),
            R::UpdatePermissions { .. } => (Operation::UpdatePermissions, 0),
            R::UpdateUser { .. } => (Operation::UpdateUser, 0),
            R::CreateToken { .. } => (Operation::CreatePersonalAccessToken, 0),
            R::DeleteToken { .. } => (Operation::DeletePersonalAccessToken, 0),
            R::UpdateStream { .. } => (Operation::UpdateStream, 0),
            R::PurgeStream { .. } => (Operation::PurgeStream, 0),
            R::PurgeTopic { .. } => (Operation::PurgeTopic, 0),
            R::GetUser { .. } => read(ReadCommand::GetUser),
            R::GetUsers => read(ReadCommand::GetUsers),
            R::GetTokens => read(ReadCommand::GetTokens),
            R::LoginWithToken { .. } => read(ReadCommand::LoginWithToken),
            R::GetMe => read(ReadCommand::GetMe),
            R::GetClient { .. } => read(ReadCommand::GetClient),
            R::GetClients => read(ReadCommand::GetClients),
            R::GetStats => read(ReadCommand::GetStats),
            R::CreateConsumerGroup { .. } => (Operation::CreateConsumerGroup, 0),
            R::DeleteConsumerGroup { .. } => (Operation::DeleteConsumerGroup, 0),
            R::JoinConsumerGroup { .. } => (Operation::JoinConsumerGroup, 0),
            R::LeaveConsumerGroup { .. } => (Operation::LeaveConsumerGroup, 0),
            R::SendMessages { .. } => (Operation::SendMessages, 0),
            R::StoreConsumerOffset { .. } => (Operation::StoreConsumerOffset, 0),
            R::DeleteConsumerOffset { .. } => (Operation::DeleteConsumerOffset, 0),
            R::DeleteSegments { .. } => (Operation::DeleteSegments, 0),
            R::Login { .. } => read(ReadCommand::Login),
            R::Ping => read(ReadCommand::Ping),
            R::Unsupported { code } => (Operation::NonReplicated, *code),
            R::ClusterMetadata => read(ReadCommand::ClusterMetadata),
            R::ClusterNodes => read(ReadCommand::ClusterNodes),
            R::GetStream { .. } => read(ReadCommand::GetStream),
            R::GetStreams => read(ReadCommand::GetStreams),
            R::GetTopic { .. } => read(ReadCommand::GetTopic),
            R::GetTopics { .. } => read(ReadCommand::GetTopics),
            R::ListStreams => read(ReadCommand::ListStreams),
            R::ListTopics { .. } => read(ReadCommand::ListTopics),
            R::PollMessages { .. } => read(ReadCommand::PollMessages),
            R::GetConsumerOffset { .. } => read(ReadCommand::GetConsumerOffset),
            R::GetPollRouting { .. } => read(ReadCommand::GetPollRouting),
            R::GetConsumerGroup { .. } => read(ReadCommand::GetConsumerGroup),
            R::GetConsumerGroups { .. } => read(ReadCommand::GetConsumerGroups),
            R::SyncConsumerGroup { .. } => read(ReadCommand::SyncConsumerGroup),
            R::GetConsumerOffsetRouting { .. } => read(ReadCommand::GetConsumerOffsetRouting),
            R::AttachConsumerSession { .. } => read(ReadCommand::AttachConsumerSession),
        }
    }

    /// Encodes the body.
    pub fn encode(&self) -> Vec<u8> {
        use ClientRequest as R;
        let mut w = Writer::default();
        match self {
            R::Logout
            | R::ClusterMetadata
            | R::ClusterNodes
            | R::GetStreams
            | R::ListStreams
            | R::Ping
            | R::GetUsers
            | R::GetTokens
            | R::GetMe
            | R::GetClients
            | R::GetStats
            | R::Unsupported { .. } => {}
            R::Register {
                version,
                credentials,
                context,
            } => {
                w.u32(version.protocol_version)
                    .short_bytes(version.sdk_name.as_bytes())
                    .short_bytes(version.sdk_version.as_bytes());
                match credentials {
                    Credentials::Password { username, password } => {
                        w.short_bytes(username.as_bytes()).short_bytes(password);
                    }
                    Credentials::Token(token) => {
                        w.short_bytes(token);
                    }
                }
                w.optional_text(context.as_deref());
            }
            R::CreateStream { name } => {
                w.short_bytes(name.as_bytes());
            }
            R::DeleteStream { stream } | R::GetStream { stream } => stream.write(&mut w),
            R::ListTopics { stream_id } => {
                w.u32(*stream_id);
            }
            R::CreateTopic {
                stream,
                name,
                partitions,
                options,
            } => {
                stream.write(&mut w);
                w.u32(*partitions).short_bytes(name.as_bytes()).raw(options);
            }
            R::UpdateTopic {
                stream,
                topic,
                name,
                options,
            } => {
                stream.write(&mut w);
                topic.write(&mut w);
                w.short_bytes(name.as_bytes()).raw(options);
            }
            R::DeleteTopic { stream, topic } | R::GetTopic { stream, topic } => {
                stream.write(&mut w);
                topic.write(&mut w);
            }
            R::GetTopics { stream } => stream.write(&mut w),
            R::CreatePartitions {
                stream,
                topic,
                count,
            }
            | R::DeletePartitions {
                stream,
                topic,
                count,
            } => {
                stream.write(&mut w);
                topic.write(&mut w);
                w.u32(*count);
            }
            R::CreateUser {
                username,
                password,
                status,
                permissions,
                options,
            } => {
                w.short_bytes(username.as_bytes())
                    .short_bytes(password)
                    .u8(*status);
                users::write_permissions(&mut w, permissions);
                w.raw(options);
            }
            R::DeleteUser { user } | R::GetUser { user } => user.write(&mut w),
            R::UpdateUser {
                user,
                username,
                status,
                options,
            } => {
                user.write(&mut w);
                match username {
                    Some(name) => w.u8(1).short_bytes(name.as_bytes()),
                    None => w.u8(0),
                };
                match status {
                    Some(status) => w.u8(1).u8(*status),
                    None => w.u8(0),
                };
                w.raw(options);
            }
            R::ChangePassword {
                user,
                current_password,
                new_password,
            } => {
                user.write(&mut w);
                w.short_bytes(current_password).short_bytes(new_password);
            }
            R::UpdatePermissions { user, permissions } => {
                user.write(&mut w);
                users::write_permissions(&mut w, permissions);
            }
            R::CreateToken { name, expiry } => {
                w.short_bytes(name.as_bytes()).u64(*expiry);
            }
            R::DeleteToken { name } => {
                w.short_bytes(name.as_bytes());
            }
            R::UpdateStream { stream, name } => {
                stream.write(&mut w);
                w.short_bytes(name.as_bytes());
            }
            R::PurgeStream { stream } => stream.write(&mut w),
            R::PurgeTopic { stream, topic } => {
                stream.write(&mut w);
                topic.write(&mut w);
            }
            R::GetClient { client_id } => {
                w.u32(*client_id);
            }
            R::LoginWithToken { token } => {
                w.short_bytes(token);
            }
            R::CreateConsumerGroup {
                stream,
                topic,
                name,
            } => {
                stream.write(&mut w);
                topic.write(&mut w);
                w.short_bytes(name.as_bytes());
            }
            R::DeleteConsumerGroup { group }
            | R::JoinConsumerGroup { group }
            | R::LeaveConsumerGroup { group }
            | R::GetConsumerGroup { group }
            | R::SyncConsumerGroup { group } => group.write(&mut w),
            R::GetConsumerGroups { stream, topic } => {
                stream.write(&mut w);
                topic.write(&mut w);
            }
            R::SendMessages {
                stream,
                topic,
                partitioning,
                messages_count,
                batch,
            } => {
                let mut m = Writer::default();
                stream.write(&mut m);
                topic.write(&mut m);
                partitioning.write(&mut m);
                m.u32(*messages_count);
                let metadata = m.finish();
                w.u32(metadata.len() as u32).raw(&metadata).raw(batch);
            }
            R::StoreConsumerOffset { target, offset } => {
                target.write(&mut w);
                w.u64(*offset).u8(ACK_QUORUM);
            }
            R::DeleteConsumerOffset { target } => {
                target.write(&mut w);
                w.u8(ACK_QUORUM);
            }
            R::GetConsumerOffset { target } => target.write(&mut w),
            R::DeleteSegments {
                stream,
                topic,
                partition,
                segments,
            } => {
                stream.write(&mut w);
                topic.write(&mut w);
                w.u32(*partition).u32(*segments);
            }
            R::Login {
                username,
                password,
                version,
                context,
            } => {
                w.short_bytes(username.as_bytes())
                    .short_bytes(password)
                    .optional_text(version.as_deref())
                    .optional_text(context.as_deref());
            }
            R::PollMessages {
                target,
                strategy,
                count,
                auto_commit,
            }
            | R::GetPollRouting {
                target,
                strategy,
                count,
                auto_commit,
            } => {
                target.write(&mut w);
                strategy.write(&mut w);
                w.u32(*count).u8(u8::from(*auto_commit));
            }
            R::GetConsumerOffsetRouting { target } => target.write(&mut w),
            R::AttachConsumerSession {
                client,
                session,
                metadata_watermark,
            } => {
                w.u128(*client).u64(*session).u64(*metadata_watermark);
            }
        }
        w.finish()
    }
}
