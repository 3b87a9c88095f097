//! Committed metadata ops applied to the state: every replica applies the same ops in
//! the same order and reaches the same state and the same result.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    Applied, Caller, ConsumerGroup, MetadataState, Stream, Token, Topic, User,
    GROUPS_PER_TOPIC_MAX, GROUP_MEMBERS_MAX, PARTITIONS_PER_TOPIC_MAX, ROOT_USER_ID, STREAMS_MAX,
    TOPICS_PER_STREAM_MAX, USERS_MAX,
};
use crate::protocol::reply::{PartitionReply, TopicDetailsReply};
use crate::protocol::users::{TOKENS_PER_USER_MAX, USER_INACTIVE};
use crate::protocol::Status;
use crate::state::metadata::StreamPermission;
use crate::state::ops::MetadataOp;
use replication::wire::PartitionKey;

impl MetadataState {
    /// Applies a committed op. Deterministic: validation against the state at this op
    /// decides the outcome, so two racing creates of one name resolve the same way on
    /// every replica.
    pub fn apply(&mut self, caller: Caller, op: &MetadataOp) -> Applied {
        use MetadataOp as M;
        match op {
            M::CreateStream { .. }
            | M::DeleteStream { .. }
            | M::CreateTopic { .. }
            | M::UpdateTopic { .. }
            | M::DeleteTopic { .. }
            | M::CreatePartitions { .. }
            | M::DeletePartitions { .. }
            | M::TruncatePartition { .. }
            | M::Purge { .. }
            | M::UpdateStream { .. } => self.apply_stream_op(op),
            M::CreateUser { .. }
            | M::UpdateUser { .. }
            | M::CreateToken { .. }
            | M::DeleteToken { .. }
            | M::DeleteUser { .. }
            | M::ChangePassword { .. }
            | M::UpdatePermissions { .. } => self.apply_user_op(caller, op),
            M::CreateConsumerGroup { .. }
            | M::DeleteConsumerGroup { .. }
            | M::JoinConsumerGroup { .. }
            | M::LeaveConsumerGroup { .. } => self.apply_group_op(caller, op),
        }
    }

    /// A stream, topic or partition op.
    fn apply_stream_op(&mut self, op: &MetadataOp) -> Applied {
        use MetadataOp as M;
        match op {
            M::CreateStream { name, created_at } => self.create_stream(name, *created_at),
            M::DeleteStream { stream_id } => Applied::removed(self.streams.remove(stream_id)),
            M::CreateTopic {
                stream_id,
                name,
                partitions,
                created_at,
                message_expiry,
                max_topic_size,
                first_primary,
            } => self.create_topic(
                *stream_id,
                Topic {
                    name: name.clone(),
                    created_at: *created_at,
                    partition_count: *partitions,
                    groups: BTreeMap::new(),
                    next_group_id: 1,
                    message_expiry: *message_expiry,
                    max_topic_size: *max_topic_size,
                    retained_from: BTreeMap::new(),
                    first_primary: *first_primary,
                },
            ),
            M::UpdateTopic {
                stream_id,
                topic_id,
                message_expiry,
                max_topic_size,
            } => self.set_topic_limits(*stream_id, *topic_id, *message_expiry, *max_topic_size),
            M::DeleteTopic {
                stream_id,
                topic_id,
            } => Applied::removed(
                self.streams
                    .get_mut(stream_id)
                    .and_then(|s| s.topics.remove(topic_id)),
            ),
            M::CreatePartitions {
                stream_id,
                topic_id,
                count,
            } => self.create_partitions(*stream_id, *topic_id, *count),
            M::DeletePartitions {
                stream_id,
                topic_id,
                count,
            } => self.delete_partitions(*stream_id, *topic_id, *count),
            M::TruncatePartition {
                partition,
                first_offset,
            } => {
                if self.retain_from(*partition, *first_offset) {
                    Applied::ok(Vec::new())
                } else {
                    Applied::fail(Status::NotFound)
                }
            }
            M::Purge { partitions } => {
                for (key, offset) in partitions {
                    self.retain_from(*key, *offset);
                }
                Applied::ok(Vec::new())
            }
            M::UpdateStream { stream_id, name } => self.update_stream(*stream_id, name),
            _ => Applied::fail(Status::InvalidRequest),
        }
    }

    /// A user or personal access token op (a token is the caller's own).
    fn apply_user_op(&mut self, caller: Caller, op: &MetadataOp) -> Applied {
        use MetadataOp as M;
        match op {
            M::CreateUser {
                username,
                password_hash,
                permissions,
                created_at,
                status,
                options,
            } => self.create_user(User {
                username: username.clone(),
                password_hash: password_hash.clone(),
                permissions: permissions
                    .iter()
                    .map(|p| (p.stream_id, p.bits()))
                    .collect(),
                root: false,
                created_at: *created_at,
                status: *status,
                options: options.clone(),
                tokens: BTreeMap::new(),
            }),
            M::UpdateUser {
                user_id,
                username,
                status,
                options,
            } => self.update_user(*user_id, username.as_deref(), *status, options),
            M::CreateToken {
                name,
                hash,
                expiry_at,
            } => self.create_token(caller, name, hash, *expiry_at),
            M::DeleteToken { name } => {
                let removed = self
                    .users
                    .get_mut(&caller.user_id)
                    .and_then(|user| user.tokens.remove(name));
                Applied::removed(removed)
            }
            M::DeleteUser { user_id } => {
                if *user_id == ROOT_USER_ID {
                    return Applied::fail(Status::PermissionDenied);
                }
                Applied::removed(self.users.remove(user_id))
            }
            M::ChangePassword {
                user_id,
                password_hash,
            } => match self.users.get_mut(user_id) {
                Some(user) => {
                    user.password_hash = password_hash.clone();
                    Applied::ok(Vec::new())
                }
                None => Applied::fail(Status::NotFound),
            },
            M::UpdatePermissions {
                user_id,
                permissions,
            } => self.update_permissions(*user_id, permissions),
            _ => Applied::fail(Status::InvalidRequest),
        }
    }

    /// A consumer group op (joining and leaving are the caller's own).
    fn apply_group_op(&mut self, caller: Caller, op: &MetadataOp) -> Applied {
        use MetadataOp as M;
        match op {
            M::CreateConsumerGroup {
                stream_id,
                topic_id,
                name,
            } => self.create_consumer_group(*stream_id, *topic_id, name),
            M::DeleteConsumerGroup {
                stream_id,
                topic_id,
                group_id,
            } => Applied::removed(
                self.topic_mut(*stream_id, *topic_id)
                    .and_then(|t| t.groups.remove(group_id)),
            ),
            M::JoinConsumerGroup {
                stream_id,
                topic_id,
                group_id,
            } => self.join_consumer_group(*stream_id, *topic_id, *group_id, caller.client),
            M::LeaveConsumerGroup {
                stream_id,
                topic_id,
                group_id,
            } => self.leave_consumer_group(*stream_id, *topic_id, *group_id, caller.client),
            _ => Applied::fail(Status::InvalidRequest),
        }
    }

    fn set_topic_limits(
        &mut self,
        stream_id: u32,
        topic_id: u32,
        message_expiry: u64,
        max_topic_size: u64,
    ) -> Applied {
        let Some(topic) = self.topic_mut(stream_id, topic_id) else {
            return Applied::fail(Status::NotFound);
        };
        topic.message_expiry = message_expiry;
        topic.max_topic_size = max_topic_size;
        Applied::ok(Vec::new())
    }

    fn create_partitions(&mut self, stream_id: u32, topic_id: u32, count: u32) -> Applied {
        let Some(topic) = self.topic_mut(stream_id, topic_id) else {
            return Applied::fail(Status::NotFound);
        };
        match topic.partition_count.checked_add(count) {
            Some(total) if count > 0 && total <= PARTITIONS_PER_TOPIC_MAX => {
                topic.partition_count = total;
                topic.reassign_groups();
                Applied::ok(total.to_le_bytes().to_vec())
            }
            _ => Applied::fail(Status::InvalidRequest),
        }
    }

    fn delete_partitions(&mut self, stream_id: u32, topic_id: u32, count: u32) -> Applied {
        let Some(topic) = self.topic_mut(stream_id, topic_id) else {
            return Applied::fail(Status::NotFound);
        };
        if count == 0 || count >= topic.partition_count {
            return Applied::fail(Status::InvalidRequest);
        }
        topic.partition_count -= count;
        topic.reassign_groups();
        let remaining = topic.partition_count;
        topic.retained_from.retain(|p, _| *p < remaining);
        Applied::ok(remaining.to_le_bytes().to_vec())
    }

    /// Raises the first offset a partition retains to `offset`; false when the partition
    /// does not exist. Never moves back: a later op naming a lower offset changes nothing.
    fn retain_from(&mut self, partition: PartitionKey, offset: u64) -> bool {
        let Some(topic) = self.topic_mut(partition.stream, partition.topic) else {
            return false;
        };
        if partition.partition >= topic.partition_count {
            return false;
        }
        let from = topic.retained_from.entry(partition.partition).or_default();
        *from = (*from).max(offset);
        true
    }

    fn create_token(&mut self, caller: Caller, name: &str, hash: &str, expiry_at: u64) -> Applied {
        let Some(user) = self.users.get_mut(&caller.user_id) else {
            return Applied::fail(Status::NotFound);
        };
        if user.tokens.contains_key(name) {
            return Applied::fail(Status::AlreadyExists);
        }
        if user.tokens.len() >= TOKENS_PER_USER_MAX {
            return Applied::fail(Status::LimitReached);
        }
        let token = Token {
            hash: hash.to_string(),
            expiry_at,
        };
        user.tokens.insert(name.to_string(), token);
        Applied::ok(Vec::new())
    }

    fn update_stream(&mut self, stream_id: u32, name: &str) -> Applied {
        let taken = self
            .streams
            .iter()
            .any(|(id, s)| *id != stream_id && s.name == name);
        if taken {
            return Applied::fail(Status::AlreadyExists);
        }
        match self.streams.get_mut(&stream_id) {
            Some(stream) => {
                stream.name = name.to_string();
                Applied::ok(Vec::new())
            }
            None => Applied::fail(Status::NotFound),
        }
    }

    fn update_permissions(&mut self, user_id: u32, permissions: &[StreamPermission]) -> Applied {
        match self.users.get_mut(&user_id) {
            Some(user) if !user.root => {
                user.permissions = permissions
                    .iter()
                    .map(|p| (p.stream_id, p.bits()))
                    .collect();
                Applied::ok(Vec::new())
            }
            Some(_) => Applied::fail(Status::PermissionDenied),
            None => Applied::fail(Status::NotFound),
        }
    }

    fn create_stream(&mut self, name: &str, created_at: u64) -> Applied {
        if self.streams.values().any(|s| s.name == name) {
            return Applied::fail(Status::AlreadyExists);
        }
        if self.next_stream_id == 0 {
            self.next_stream_id = 1;
        }
        if self.streams.len() as u32 >= STREAMS_MAX || self.next_stream_id > STREAMS_MAX {
            return Applied::fail(Status::LimitReached);
        }
        let id = self.next_stream_id;
        self.next_stream_id += 1;
        let stream = Stream {
            name: name.to_owned(),
            created_at,
            topics: BTreeMap::new(),
            next_topic_id: 1,
        };
        // The new stream as Iggy's CreateStream answers it: no topics, nothing stored.
        let reply = stream.reply(id, &[]);
        self.streams.insert(id, stream);
        Applied::ok(reply.encode())
    }

    /// Adds `topic`, new and empty, to stream `stream_id`.
    fn create_topic(&mut self, stream_id: u32, topic: Topic) -> Applied {
        let Some(stream) = self.streams.get_mut(&stream_id) else {
            return Applied::fail(Status::NotFound);
        };
        if stream.topics.values().any(|t| t.name == topic.name) {
            return Applied::fail(Status::AlreadyExists);
        }
        let partitions = topic.partition_count;
        if partitions == 0 || partitions > PARTITIONS_PER_TOPIC_MAX {
            return Applied::fail(Status::InvalidRequest);
        }
        if stream.next_topic_id > TOPICS_PER_STREAM_MAX {
            return Applied::fail(Status::LimitReached);
        }
        let id = stream.next_topic_id;
        stream.next_topic_id += 1;
        // The new topic as Iggy's CreateTopic answers it: nothing stored yet.
        let reply = TopicDetailsReply {
            topic: topic.reply(id, 0, 0),
            partitions: (0..partitions)
                .map(|partition| PartitionReply {
                    id: partition,
                    created_at: topic.created_at,
                    segments_count: 0,
                    current_offset: 0,
                    size_bytes: 0,
                    messages_count: 0,
                })
                .collect(),
        };
        stream.topics.insert(id, topic);
        Applied::ok(reply.encode())
    }

    /// Adds `user`, a new user that is not root, under the next user id.
    fn create_user(&mut self, user: User) -> Applied {
        if self.users.values().any(|u| u.username == user.username) {
            return Applied::fail(Status::AlreadyExists);
        }
        if self.users.len() as u32 >= USERS_MAX {
            return Applied::fail(Status::LimitReached);
        }
        let id = self.next_user_id.max(ROOT_USER_ID + 1);
        self.next_user_id = id + 1;
        let reply = user.details(id);
        self.users.insert(id, user);
        Applied::ok(reply.encode())
    }

    /// Renames user `user_id`, sets its status or its options (each when given).
    fn update_user(
        &mut self,
        user_id: u32,
        username: Option<&str>,
        status: Option<u8>,
        options: &[u8],
    ) -> Applied {
        let taken = username.is_some_and(|name| {
            self.users
                .iter()
                .any(|(id, u)| *id != user_id && u.username == name)
        });
        if taken {
            return Applied::fail(Status::AlreadyExists);
        }
        let Some(user) = self.users.get_mut(&user_id) else {
            return Applied::fail(Status::NotFound);
        };
        if user.root && status == Some(USER_INACTIVE) {
            return Applied::fail(Status::PermissionDenied);
        }
        if let Some(name) = username {
            user.username = name.to_owned();
        }
        if let Some(status) = status {
            user.status = status;
        }
        if !options.is_empty() {
            user.options = options.to_vec();
        }
        Applied::ok(Vec::new())
    }

    fn create_consumer_group(&mut self, stream_id: u32, topic_id: u32, name: &str) -> Applied {
        let Some(topic) = self.topic_mut(stream_id, topic_id) else {
            return Applied::fail(Status::NotFound);
        };
        if topic.groups.values().any(|g| g.name == name) {
            return Applied::fail(Status::AlreadyExists);
        }
        if topic.groups.len() as u32 >= GROUPS_PER_TOPIC_MAX {
            return Applied::fail(Status::LimitReached);
        }
        let id = topic.next_group_id;
        topic.next_group_id += 1;
        let group = ConsumerGroup {
            name: name.to_owned(),
            members: BTreeSet::new(),
            generation: 0,
        };
        let reply = group.details(id, topic.partition_count);
        topic.groups.insert(id, group);
        Applied::ok(reply.encode())
    }

    /// `client` joins the group (a member already changes nothing; a new member starts a
    /// new generation of the group's assignment).
    fn join_consumer_group(
        &mut self,
        stream_id: u32,
        topic_id: u32,
        group_id: u32,
        client: u128,
    ) -> Applied {
        let group = self.group_mut(stream_id, topic_id, group_id);
        match group {
            Some(group)
                if group.members.len() < GROUP_MEMBERS_MAX || group.members.contains(&client) =>
            {
                if group.members.insert(client) {
                    group.generation += 1;
                }
                Applied::ok(Vec::new())
            }
            Some(_) => Applied::fail(Status::LimitReached),
            None => Applied::fail(Status::NotFound),
        }
    }

    /// `client` leaves the group, which starts a new generation of its assignment; one
    /// that is not a member gets NotFound.
    fn leave_consumer_group(
        &mut self,
        stream_id: u32,
        topic_id: u32,
        group_id: u32,
        client: u128,
    ) -> Applied {
        let removed = self
            .group_mut(stream_id, topic_id, group_id)
            .is_some_and(|group| {
                let removed = group.members.remove(&client);
                group.generation += u64::from(removed);
                removed
            });
        if removed {
            Applied::ok(Vec::new())
        } else {
            Applied::fail(Status::NotFound)
        }
    }
}
