//! Typed calls: one method per client operation, each encoding its request body,
//! routing it to its group and decoding the reply body (appliance::protocol::reply).

use std::net::SocketAddr;

use replication::wire::batch;
use replication::wire::{PartitionKey, METADATA_GROUP};

use super::engine::{resolve, short, Client};
use super::error::ClientError;
use crate::protocol::options::TopicOptions;
use crate::protocol::reply::{
    split_poll_body, ClusterMetadataReply, ConsumerGroupDetailsReply, ConsumerOffsetReply, IdReply,
    ListStreamsReply, ListTopicsReply, SendConfirmations, SendMessagesReply, StreamReply,
    TopicDetailsReply, PRIMARY_UNKNOWN,
};
use crate::protocol::request::{
    GroupRef, Identifier, OffsetTarget, Partitioning, PERMISSIONS_MAX, POLL_COUNT_MAX,
};
use crate::protocol::users::{UserDetailsReply, USER_ACTIVE};
use crate::protocol::{ClientRequest, Consumer, PollStrategy, Retention, Status, StreamPermission};

fn group_of(partition: PartitionKey) -> Result<u64, ClientError> {
    partition.pack().map_err(|e| ClientError::InvalidArgument {
        what: "partition",
        rule: e.to_string(),
    })
}

/// The server address for errors about a reply body (the group's primary if known).
fn server_of(client: &Client, group: u64) -> SocketAddr {
    client
        .primary_of(group)
        .or_else(|| client.nodes().first().copied())
        .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)))
}

fn permissions(list: &[StreamPermission]) -> Result<(), ClientError> {
    if list.len() > PERMISSIONS_MAX {
        return Err(ClientError::InvalidArgument {
            what: "permissions",
            rule: format!("at most {PERMISSIONS_MAX} entries, got {}", list.len()),
        });
    }
    Ok(())
}

impl Client {
    fn metadata_id(&mut self, request: ClientRequest<'_>, what: &str) -> Result<u32, ClientError> {
        let body = self.call(METADATA_GROUP, &request)?;
        IdReply::decode(&body)
            .map(|r| r.id)
            .map_err(|e| ClientError::body(server_of(self, METADATA_GROUP), what, e))
    }

    fn metadata_empty(&mut self, request: ClientRequest<'_>) -> Result<(), ClientError> {
        self.call(METADATA_GROUP, &request).map(|_| ())
    }

    /// Creates a stream; returns its id.
    pub fn create_stream(&mut self, name: &str) -> Result<u32, ClientError> {
        short("stream name", name.as_bytes())?;
        let request = ClientRequest::CreateStream { name: name.into() };
        let body = self.call(METADATA_GROUP, &request)?;
        StreamReply::decode(&body)
            .map(|r| r.id)
            .map_err(|e| ClientError::body(server_of(self, METADATA_GROUP), "CreateStream", e))
    }

    pub fn delete_stream(&mut self, stream_id: u32) -> Result<(), ClientError> {
        self.metadata_empty(ClientRequest::DeleteStream {
            stream: Identifier::Id(stream_id),
        })
    }

    /// Creates a topic with partitions 0..partitions and the server's retention
    /// defaults; returns its id.
    pub fn create_topic(
        &mut self,
        stream_id: u32,
        name: &str,
        partitions: u32,
    ) -> Result<u32, ClientError> {
        self.create_topic_with(stream_id, name, partitions, Retention::default())
    }

    /// As `create_topic`, with the topic's own retention.
    pub fn create_topic_with(
        &mut self,
        stream_id: u32,
        name: &str,
        partitions: u32,
        retention: Retention,
    ) -> Result<u32, ClientError> {
        short("topic name", name.as_bytes())?;
        let request = ClientRequest::CreateTopic {
            stream: Identifier::Id(stream_id),
            name: name.into(),
            partitions,
            options: TopicOptions::encode(retention),
        };
        let body = self.call(METADATA_GROUP, &request)?;
        TopicDetailsReply::decode(&body)
            .map(|r| r.topic.id)
            .map_err(|e| ClientError::body(server_of(self, METADATA_GROUP), "CreateTopic", e))
    }

    /// Changes a topic's retention (both values; 0 for the server default). The
    /// request names the topic by its own name (Iggy's UpdateTopic renames otherwise),
    /// which a ListTopics read finds first.
    pub fn update_topic(
        &mut self,
        stream_id: u32,
        topic_id: u32,
        retention: Retention,
    ) -> Result<(), ClientError> {
        let topics = self.list_topics(stream_id)?;
        let Some(topic) = topics.topics.iter().find(|t| t.topic_id == topic_id) else {
            return Err(ClientError::Status {
                status: Status::NotFound,
                reason: format!("no topic {topic_id} in stream {stream_id}"),
            });
        };
        self.metadata_empty(ClientRequest::UpdateTopic {
            stream: Identifier::Id(stream_id),
            topic: Identifier::Id(topic_id),
            name: topic.name.clone(),
            options: TopicOptions::encode_all(retention),
        })
    }

    pub fn delete_topic(&mut self, stream_id: u32, topic_id: u32) -> Result<(), ClientError> {
        self.metadata_empty(ClientRequest::DeleteTopic {
            stream: Identifier::Id(stream_id),
            topic: Identifier::Id(topic_id),
        })
    }

    /// Adds `count` partitions; returns the topic's partition count now.
    pub fn create_partitions(
        &mut self,
        stream_id: u32,
        topic_id: u32,
        count: u32,
    ) -> Result<u32, ClientError> {
        self.metadata_id(
            ClientRequest::CreatePartitions {
                stream: Identifier::Id(stream_id),
                topic: Identifier::Id(topic_id),
                count,
            },
            "CreatePartitions",
        )
    }

    /// Removes the last `count` partitions; returns the partitions left.
    pub fn delete_partitions(
        &mut self,
        stream_id: u32,
        topic_id: u32,
        count: u32,
    ) -> Result<u32, ClientError> {
        self.metadata_id(
            ClientRequest::DeletePartitions {
                stream: Identifier::Id(stream_id),
                topic: Identifier::Id(topic_id),
                count,
            },
            "DeletePartitions",
        )
    }

    /// Deletes the oldest `segments` sealed segments of a partition.
    pub fn delete_segments(
        &mut self,
        partition: PartitionKey,
        segments: u32,
    ) -> Result<(), ClientError> {
        group_of(partition)?;
        self.metadata_empty(ClientRequest::DeleteSegments {
            stream: Identifier::Id(partition.stream),
            topic: Identifier::Id(partition.topic),
            partition: partition.partition,
            segments,
        })
    }

    /// Creates an active user; returns its id.
    pub fn create_user(
        &mut self,
        username: &str,
        password: &[u8],
        permissions_list: &[StreamPermission],
    ) -> Result<u32, ClientError> {
        short("username", username.as_bytes())?;
        short("password", password)?;
        permissions(permissions_list)?;
        let request = ClientRequest::CreateUser {
            username: username.into(),
            password: password.to_vec(),
            status: USER_ACTIVE,
            permissions: permissions_list.to_vec(),
            options: Vec::new(),
        };
        let body = self.call(METADATA_GROUP, &request)?;
        UserDetailsReply::decode(&body)
            .map(|r| r.user.id)
            .map_err(|e| ClientError::body(server_of(self, METADATA_GROUP), "CreateUser", e))
    }

    pub fn delete_user(&mut self, user_id: u32) -> Result<(), ClientError> {
        self.metadata_empty(ClientRequest::DeleteUser {
            user: Identifier::Id(user_id),
        })
    }

    /// Changes a user's password; `current_password` must be its password now.
    pub fn change_password(
        &mut self,
        user_id: u32,
        current_password: &[u8],
        new_password: &[u8],
    ) -> Result<(), ClientError> {
        short("current password", current_password)?;
        short("new password", new_password)?;
        self.metadata_empty(ClientRequest::ChangePassword {
            user: Identifier::Id(user_id),
            current_password: current_password.to_vec(),
            new_password: new_password.to_vec(),
        })
    }

    pub fn update_permissions(
        &mut self,
        user_id: u32,
        permissions_list: &[StreamPermission],
    ) -> Result<(), ClientError> {
        permissions(permissions_list)?;
        self.metadata_empty(ClientRequest::UpdatePermissions {
            user: Identifier::Id(user_id),
            permissions: permissions_list.to_vec(),
        })
    }

    /// Creates a consumer group; returns its id.
    pub fn create_consumer_group(
        &mut self,
        stream_id: u32,
        topic_id: u32,
        name: &str,
    ) -> Result<u32, ClientError> {
        short("group name", name.as_bytes())?;
        let request = ClientRequest::CreateConsumerGroup {
            stream: Identifier::Id(stream_id),
            topic: Identifier::Id(topic_id),
            name: name.into(),
        };
        let body = self.call(METADATA_GROUP, &request)?;
        ConsumerGroupDetailsReply::decode(&body)
            .map(|r| r.group.id)
            .map_err(|e| {
                ClientError::body(server_of(self, METADATA_GROUP), "CreateConsumerGroup", e)
            })
    }

    pub fn delete_consumer_group(
        &mut self,
        stream_id: u32,
        topic_id: u32,
        group_id: u32,
    ) -> Result<(), ClientError> {
        let group = GroupRef::ids(stream_id, topic_id, group_id);
        self.metadata_empty(ClientRequest::DeleteConsumerGroup { group })
    }

    /// Joins this client to a consumer group.
    pub fn join_consumer_group(
        &mut self,
        stream_id: u32,
        topic_id: u32,
        group_id: u32,
    ) -> Result<(), ClientError> {
        let group = GroupRef::ids(stream_id, topic_id, group_id);
        self.metadata_empty(ClientRequest::JoinConsumerGroup { group })
    }

    pub fn leave_consumer_group(
        &mut self,
        stream_id: u32,
        topic_id: u32,
        group_id: u32,
    ) -> Result<(), ClientError> {
        let group = GroupRef::ids(stream_id, topic_id, group_id);
        self.metadata_empty(ClientRequest::LeaveConsumerGroup { group })
    }

    /// Appends a batch (built with wire::batch::BatchBuilder, verified here before it is
    /// sent) to a partition; returns where it landed.
    pub fn send_messages(
        &mut self,
        partition: PartitionKey,
        batch_bytes: &[u8],
    ) -> Result<SendMessagesReply, ClientError> {
        let group = group_of(partition)?;
        let info = batch::verify(batch_bytes).map_err(|e| ClientError::InvalidArgument {
            what: "batch",
            rule: e.to_string(),
        })?;
        let body = self.call(
            group,
            &ClientRequest::SendMessages {
                stream: Identifier::Id(partition.stream),
                topic: Identifier::Id(partition.topic),
                partitioning: Partitioning::PartitionId(partition.partition),
                messages_count: info.message_count,
                batch: batch_bytes,
            },
        )?;
        let server = server_of(self, group);
        let reply = SendConfirmations::decode(&body)
            .map_err(|e| ClientError::body(server, "SendMessages", e))?;
        match reply.confirmations[..] {
            [c] if (c.stream_id, c.topic_id, c.partition_id)
                == (partition.stream, partition.topic, partition.partition) =>
            {
                Ok(SendMessagesReply {
                    base_offset: c.base_offset,
                    count: info.message_count,
                })
            }
            _ => Err(ClientError::UnexpectedReply {
                server,
                what: format!(
                    "SendMessages to {partition:?} confirmed {:?}",
                    reply.confirmations
                ),
            }),
        }
    }

    /// Reads up to `count` messages: the reply's header (`reply::PollHeader`), then zero
    /// or more batches, each already verified (wire::batch::verify_served); split them
    /// with `protocol::reply::split_poll_body`.
    pub fn poll_messages(
        &mut self,
        partition: PartitionKey,
        consumer: Consumer,
        strategy: PollStrategy,
        count: u32,
    ) -> Result<Vec<u8>, ClientError> {
        self.poll(partition, consumer, strategy, count, false)
    }

    /// As `poll_messages`, and the partition's primary stores `consumer`'s offset as the
    /// last offset delivered (auto_commit; it commits after the reply, so a poll right
    /// after may still see the older offset for a moment).
    pub fn poll_messages_auto_commit(
        &mut self,
        partition: PartitionKey,
        consumer: Consumer,
        strategy: PollStrategy,
        count: u32,
    ) -> Result<Vec<u8>, ClientError> {
        self.poll(partition, consumer, strategy, count, true)
    }

    fn poll(
        &mut self,
        partition: PartitionKey,
        consumer: Consumer,
        strategy: PollStrategy,
        count: u32,
        auto_commit: bool,
    ) -> Result<Vec<u8>, ClientError> {
        let group = group_of(partition)?;
        if count == 0 || count > POLL_COUNT_MAX {
            return Err(ClientError::InvalidArgument {
                what: "count",
                rule: format!("must be 1 to {POLL_COUNT_MAX}"),
            });
        }
        let body = self.read(
            group,
            &ClientRequest::PollMessages {
                target: OffsetTarget::of(partition, consumer),
                strategy,
                count,
                auto_commit,
            },
        )?;
        if let Err(e) = split_poll_body(&body) {
            return Err(ClientError::UnexpectedReply {
                server: server_of(self, group),
                what: format!("PollMessages: {e}"),
            });
        }
        Ok(body)
    }

    pub fn store_consumer_offset(
        &mut self,
        partition: PartitionKey,
        consumer: Consumer,
        offset: u64,
    ) -> Result<(), ClientError> {
        let group = group_of(partition)?;
        self.call(
            group,
            &ClientRequest::StoreConsumerOffset {
                target: OffsetTarget::of(partition, consumer),
                offset,
            },
        )
        .map(|_| ())
    }

    /// The stored offset, or None when the consumer has none.
    pub fn get_consumer_offset(
        &mut self,
        partition: PartitionKey,
        consumer: Consumer,
    ) -> Result<Option<u64>, ClientError> {
        let group = group_of(partition)?;
        let body = self.read(
            group,
            &ClientRequest::GetConsumerOffset {
                target: OffsetTarget::of(partition, consumer),
            },
        )?;
        ConsumerOffsetReply::decode(&body)
            .map(|r| r.map(|r| r.stored_offset))
            .map_err(|e| ClientError::body(server_of(self, group), "GetConsumerOffset", e))
    }

    pub fn delete_consumer_offset(
        &mut self,
        partition: PartitionKey,
        consumer: Consumer,
    ) -> Result<(), ClientError> {
        let group = group_of(partition)?;
        self.call(
            group,
            &ClientRequest::DeleteConsumerOffset {
                target: OffsetTarget::of(partition, consumer),
            },
        )
        .map(|_| ())
    }

    /// The nodes and each group's primary; also learns them, so later requests go
    /// straight to each primary.
    pub fn cluster_metadata(&mut self) -> Result<ClusterMetadataReply, ClientError> {
        let body = self.read(METADATA_GROUP, &ClientRequest::ClusterMetadata)?;
        let reply = ClusterMetadataReply::decode(&body).map_err(|e| {
            ClientError::body(server_of(self, METADATA_GROUP), "ClusterMetadata", e)
        })?;
        for node in &reply.nodes {
            if let Some(addr) = resolve(&node.address)
                .ok()
                .and_then(|a| a.into_iter().next())
            {
                self.add_node(addr);
            }
        }
        for group in &reply.groups {
            if group.primary == PRIMARY_UNKNOWN {
                continue;
            }
            let addr = reply
                .address_of(group.primary)
                .and_then(|a| resolve(a).ok())
                .and_then(|a| a.into_iter().next());
            if let Some(addr) = addr {
                self.set_primary(group.group, addr);
            }
        }
        Ok(reply)
    }

    pub fn list_streams(&mut self) -> Result<ListStreamsReply, ClientError> {
        let body = self.read(METADATA_GROUP, &ClientRequest::ListStreams)?;
        ListStreamsReply::decode(&body)
            .map_err(|e| ClientError::body(server_of(self, METADATA_GROUP), "ListStreams", e))
    }

    pub fn list_topics(&mut self, stream_id: u32) -> Result<ListTopicsReply, ClientError> {
        let body = self.read(METADATA_GROUP, &ClientRequest::ListTopics { stream_id })?;
        ListTopicsReply::decode(&body)
            .map_err(|e| ClientError::body(server_of(self, METADATA_GROUP), "ListTopics", e))
    }
}
