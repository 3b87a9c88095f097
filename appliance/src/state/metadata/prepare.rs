//! The primary's side of a metadata op: a client request, checked against the state
//! and the caller's rights, becomes the `MetadataOp` that the cluster commits.

use replication::wire::PartitionKey;

use super::{Caller, MetadataState, PasswordWork, Right};
use crate::protocol::options::{self, TopicOptions};
use crate::protocol::request::Identifier;
use crate::protocol::{ClientRequest, Status};
use crate::state::ops::{MetadataOp, PURGE_PARTITIONS_MAX};

impl MetadataState {
    /// Turns a client's request into the metadata op the primary prepares, once the
    /// caller's rights and the names it uses are checked against this state.
    pub fn prepare(
        &self,
        caller: Caller,
        request: &ClientRequest<'_>,
        now: u64,
    ) -> Result<MetadataOp, Status> {
        use ClientRequest as R;
        match request {
            R::CreateStream { .. }
            | R::DeleteStream { .. }
            | R::PurgeStream { .. }
            | R::UpdateStream { .. } => self.prepare_stream_op(caller, request, now),
            R::CreateTopic { .. }
            | R::DeleteTopic { .. }
            | R::CreatePartitions { .. }
            | R::DeletePartitions { .. }
            | R::DeleteSegments { .. }
            | R::UpdateTopic { .. }
            | R::PurgeTopic { .. } => self.prepare_topic_op(caller, request, now),
            R::CreateUser { .. }
            | R::ChangePassword { .. }
            | R::DeleteUser { .. }
            | R::UpdateUser { .. }
            | R::UpdatePermissions { .. }
            | R::DeleteToken { .. } => self.prepare_user_op(caller, request, now),
            R::CreateConsumerGroup { .. }
            | R::DeleteConsumerGroup { .. }
            | R::JoinConsumerGroup { .. }
            | R::LeaveConsumerGroup { .. } => self.prepare_group_op(caller, request),
            // Sessions, partition-plane writes and reads are not metadata ops.
            _ => Err(Status::InvalidRequest),
        }
    }

    /// Whether the caller holds `right` on `stream` (stream 0: a cluster-wide right).
    fn need(&self, caller: Caller, stream: u32, right: Right) -> Result<(), Status> {
        if self.allows(caller.user_id, stream, right) {
            Ok(())
        } else {
            Err(Status::PermissionDenied)
        }
    }

    /// The id of an existing stream the caller may manage.
    fn managed_stream(&self, caller: Caller, stream: &Identifier) -> Result<u32, Status> {
        let stream_id = self.stream_id(stream).ok_or(Status::NotFound)?;
        self.need(caller, stream_id, Right::Manage)?;
        Ok(stream_id)
    }

    /// The ids of an existing topic the caller may manage (a right on its stream).
    fn managed_topic(
        &self,
        caller: Caller,
        stream: &Identifier,
        topic: &Identifier,
    ) -> Result<(u32, u32), Status> {
        let (stream_id, topic_id) = self.topic_id(stream, topic).ok_or(Status::NotFound)?;
        self.need(caller, stream_id, Right::Manage)?;
        Ok((stream_id, topic_id))
    }

    /// A stream op.
    fn prepare_stream_op(
        &self,
        caller: Caller,
        request: &ClientRequest<'_>,
        now: u64,
    ) -> Result<MetadataOp, Status> {
        use ClientRequest as R;
        Ok(match request {
            R::CreateStream { name } => {
                self.need(caller, 0, Right::Manage)?;
                MetadataOp::CreateStream {
                    name: name.clone(),
                    created_at: now,
                }
            }
            R::DeleteStream { stream } => {
                let stream_id = self.managed_stream(caller, stream)?;
                MetadataOp::DeleteStream { stream_id }
            }
            R::PurgeStream { stream } => {
                let stream_id = self.managed_stream(caller, stream)?;
                self.purge(|key| key.stream == stream_id)?
            }
            R::UpdateStream { stream, name } => {
                let stream_id = self.managed_stream(caller, stream)?;
                MetadataOp::UpdateStream {
                    stream_id,
                    name: name.clone(),
                }
            }
            _ => return Err(Status::InvalidRequest),
        })
    }

    /// A topic or partition op.
    fn prepare_topic_op(
        &self,
        caller: Caller,
        request: &ClientRequest<'_>,
        now: u64,
    ) -> Result<MetadataOp, Status> {
        use ClientRequest as R;
        Ok(match request {
            R::CreateTopic {
                stream,
                name,
                partitions,
                options,
            } => {
                let stream_id = self.managed_stream(caller, stream)?;
                let options = TopicOptions::parse(options).map_err(|refusal| refusal.status)?;
                MetadataOp::CreateTopic {
                    stream_id,
                    name: name.clone(),
                    partitions: *partitions,
                    created_at: now,
                    message_expiry: options.retention.message_expiry,
                    max_topic_size: options.retention.max_topic_size,
                    // The next node in turn after every partition that exists: first
                    // leaders stay balanced over the nodes across topics.
                    first_primary: Some(self.partition_total()),
                }
            }
            R::DeleteTopic { stream, topic } => {
                let (stream_id, topic_id) = self.managed_topic(caller, stream, topic)?;
                MetadataOp::DeleteTopic {
                    stream_id,
                    topic_id,
                }
            }
            R::CreatePartitions {
                stream,
                topic,
                count,
            } => {
                let (stream_id, topic_id) = self.managed_topic(caller, stream, topic)?;
                MetadataOp::CreatePartitions {
                    stream_id,
                    topic_id,
                    count: *count,
                }
            }
            R::DeletePartitions {
                stream,
                topic,
                count,
            } => {
                let (stream_id, topic_id) = self.managed_topic(caller, stream, topic)?;
                MetadataOp::DeletePartitions {
                    stream_id,
                    topic_id,
                    count: *count,
                }
            }
            R::DeleteSegments {
                stream,
                topic,
                partition,
                ..
            } => {
                let (stream, topic) = self.topic_id(stream, topic).ok_or(Status::NotFound)?;
                let partition = &PartitionKey {
                    stream,
                    topic,
                    partition: *partition,
                };
                self.need(caller, partition.stream, Right::Manage)?;
                // The node resolves the segment count to an offset from its own
                // segments (daemon/retention.rs) before it prepares this.
                MetadataOp::TruncatePartition {
                    partition: *partition,
                    first_offset: 0,
                }
            }
            R::UpdateTopic {
                stream,
                topic,
                name,
                options,
            } => {
                let (stream_id, topic_id) = self.managed_topic(caller, stream, topic)?;
                self.update_topic(stream_id, topic_id, name, options)?
            }
            R::PurgeTopic { stream, topic } => {
                let (stream_id, topic_id) = self.managed_topic(caller, stream, topic)?;
                self.purge(|key| key.stream == stream_id && key.topic == topic_id)?
            }
            _ => return Err(Status::InvalidRequest),
        })
    }

    /// A user or personal access token op.
    fn prepare_user_op(
        &self,
        caller: Caller,
        request: &ClientRequest<'_>,
        now: u64,
    ) -> Result<MetadataOp, Status> {
        use ClientRequest as R;
        Ok(match request {
            R::CreateUser { .. } | R::ChangePassword { .. } => {
                let work = self.password_work(caller, request, now)?;
                return work.map_or(Err(Status::InvalidRequest), PasswordWork::run);
            }
            R::DeleteUser { user } => {
                self.need(caller, 0, Right::Manage)?;
                let user_id = self.user_id(user).ok_or(Status::NotFound)?;
                MetadataOp::DeleteUser { user_id }
            }
            R::UpdateUser {
                user,
                username,
                status,
                options,
            } => {
                self.need(caller, 0, Right::Manage)?;
                let user_id = self.user_id(user).ok_or(Status::NotFound)?;
                MetadataOp::UpdateUser {
                    user_id,
                    username: username.clone(),
                    status: *status,
                    options: options.clone(),
                }
            }
            R::UpdatePermissions { user, permissions } => {
                self.need(caller, 0, Right::Manage)?;
                let user_id = self.user_id(user).ok_or(Status::NotFound)?;
                MetadataOp::UpdatePermissions {
                    user_id,
                    permissions: permissions.clone(),
                }
            }
            R::DeleteToken { name } => MetadataOp::DeleteToken { name: name.clone() },
            _ => return Err(Status::InvalidRequest),
        })
    }

    /// A consumer group op.
    fn prepare_group_op(
        &self,
        caller: Caller,
        request: &ClientRequest<'_>,
    ) -> Result<MetadataOp, Status> {
        use ClientRequest as R;
        Ok(match request {
            R::CreateConsumerGroup {
                stream,
                topic,
                name,
            } => {
                let (stream_id, topic_id) = self.managed_topic(caller, stream, topic)?;
                MetadataOp::CreateConsumerGroup {
                    stream_id,
                    topic_id,
                    name: name.clone(),
                }
            }
            R::DeleteConsumerGroup { group } => {
                let (stream_id, topic_id, group_id) =
                    self.group_id(group).ok_or(Status::NotFound)?;
                self.need(caller, stream_id, Right::Manage)?;
                MetadataOp::DeleteConsumerGroup {
                    stream_id,
                    topic_id,
                    group_id,
                }
            }
            R::JoinConsumerGroup { group } => {
                let (stream_id, topic_id, group_id) =
                    self.group_id(group).ok_or(Status::NotFound)?;
                self.need(caller, stream_id, Right::Read)?;
                MetadataOp::JoinConsumerGroup {
                    stream_id,
                    topic_id,
                    group_id,
                }
            }
            R::LeaveConsumerGroup { group } => {
                let (stream_id, topic_id, group_id) =
                    self.group_id(group).ok_or(Status::NotFound)?;
                self.need(caller, stream_id, Right::Read)?;
                MetadataOp::LeaveConsumerGroup {
                    stream_id,
                    topic_id,
                    group_id,
                }
            }
            _ => return Err(Status::InvalidRequest),
        })
    }

    /// An UpdateTopic of an existing topic: a patch, so the options the block names
    /// change and the rest keep their current values. Topics keep the name they were
    /// created with (FeatureUnavailable for another).
    fn update_topic(
        &self,
        stream_id: u32,
        topic_id: u32,
        name: &str,
        options: &[u8],
    ) -> Result<MetadataOp, Status> {
        let current = &self.streams[&stream_id].topics[&topic_id];
        if current.name != name {
            return Err(Status::FeatureUnavailable);
        }
        let entries = options::entries(options).map_err(|_| Status::InvalidRequest)?;
        let names = |key: &str| entries.iter().any(|e| e.key == key);
        let parsed = TopicOptions::parse(options).map_err(|refusal| refusal.status)?;
        Ok(MetadataOp::UpdateTopic {
            stream_id,
            topic_id,
            message_expiry: if names(options::MESSAGE_EXPIRY) {
                parsed.retention.message_expiry
            } else {
                current.message_expiry
            },
            max_topic_size: if names(options::MAX_TOPIC_SIZE) {
                parsed.retention.max_topic_size
            } else {
                current.max_topic_size
            },
        })
    }

    /// A Purge of the partitions `chosen` picks, their offsets to be filled in by the
    /// primary (its committed ends); LimitReached past `PURGE_PARTITIONS_MAX`.
    fn purge(&self, chosen: impl Fn(PartitionKey) -> bool) -> Result<MetadataOp, Status> {
        let partitions: Vec<(PartitionKey, u64)> = self
            .partitions()
            .into_iter()
            .filter(|key| chosen(*key))
            .map(|key| (key, 0))
            .collect();
        if partitions.len() > PURGE_PARTITIONS_MAX {
            return Err(Status::LimitReached);
        }
        Ok(MetadataOp::Purge { partitions })
    }

    /// The Argon2 work a CreateUser or ChangePassword needs before it can be prepared
    /// (None for any other request), once the caller's rights and the user are checked.
    /// `PasswordWork::run` does it: slow, so the daemon runs it off its node loop.
    pub fn password_work(
        &self,
        caller: Caller,
        request: &ClientRequest<'_>,
        now: u64,
    ) -> Result<Option<PasswordWork>, Status> {
        let manager = self.allows(caller.user_id, 0, Right::Manage);
        Ok(Some(match request {
            ClientRequest::CreateUser {
                username,
                password,
                status,
                permissions,
                options,
            } => {
                if !manager {
                    return Err(Status::PermissionDenied);
                }
                PasswordWork {
                    op: MetadataOp::CreateUser {
                        username: username.clone(),
                        password_hash: String::new(),
                        permissions: permissions.clone(),
                        created_at: now,
                        status: *status,
                        options: options.clone(),
                    },
                    verify: None,
                    password: password.clone(),
                }
            }
            ClientRequest::ChangePassword {
                user,
                current_password,
                new_password,
            } => {
                let user_id = self.user_id(user).ok_or(Status::NotFound)?;
                if user_id != caller.user_id && !manager {
                    return Err(Status::PermissionDenied);
                }
                PasswordWork {
                    op: MetadataOp::ChangePassword {
                        user_id,
                        password_hash: String::new(),
                    },
                    verify: Some((
                        current_password.clone(),
                        self.users[&user_id].password_hash.clone(),
                    )),
                    password: new_password.clone(),
                }
            }
            _ => return Ok(None),
        }))
    }

    /// A CreateToken op for `caller`: the token's hash, expiring `expiry`
    /// microseconds after `now` (0 and u64::MAX: never).
    pub fn prepare_token(
        &self,
        caller: Caller,
        name: &str,
        hash: String,
        expiry: u64,
        now: u64,
    ) -> Result<MetadataOp, Status> {
        let user = self.users.get(&caller.user_id).ok_or(Status::NotFound)?;
        if user.tokens.contains_key(name) {
            return Err(Status::AlreadyExists);
        }
        Ok(MetadataOp::CreateToken {
            name: name.to_string(),
            hash,
            expiry_at: match expiry {
                0 | u64::MAX => 0,
                expiry => now.saturating_add(expiry),
            },
        })
    }
}
