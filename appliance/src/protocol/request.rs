//! Client request bodies (docs/client-protocol.md): one variant per operation that a
//! client may send (docs/protocol.md, "Command registry"), and the NonReplicated reads.

use replication::wire::PartitionKey;

use super::codec::{BodyError, Reader, Writer};
pub use super::options::Retention;
pub use super::users::{StreamPermission, PERMISSIONS_MAX};

mod decode;
mod encode;

/// Messages a poll may ask for.
pub const POLL_COUNT_MAX: u32 = 100_000;

/// Whose consumer offset: a single consumer or a consumer group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Consumer {
    Single(u32),
    Group(u32),
}

/// Where a poll starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollStrategy {
    Offset(u64),
    /// The first message at or after this timestamp (microseconds).
    Timestamp(u64),
    /// The first retained message.
    First,
    /// The last `count` messages.
    Last,
    /// After the consumer's stored offset.
    Next,
}

impl PollStrategy {
    /// Iggy's PollingStrategy: kind u8 (1 offset, 2 timestamp, 3 first, 4 last, 5 next),
    /// value u64.
    fn read(r: &mut Reader<'_>) -> Result<PollStrategy, BodyError> {
        let kind = r.u8("strategy")?;
        let value = r.u64("strategy_value")?;
        Ok(match kind {
            1 => PollStrategy::Offset(value),
            2 => PollStrategy::Timestamp(value),
            3 => PollStrategy::First,
            4 => PollStrategy::Last,
            5 => PollStrategy::Next,
            _ => {
                return Err(BodyError::Invalid {
                    field: "strategy",
                    rule: "must be 1 (offset), 2 (timestamp), 3 (first), 4 (last) or 5 (next)",
                })
            }
        })
    }

    fn write(&self, w: &mut Writer) {
        let (kind, value) = match self {
            PollStrategy::Offset(offset) => (1, *offset),
            PollStrategy::Timestamp(timestamp) => (2, *timestamp),
            PollStrategy::First => (3, 0),
            PollStrategy::Last => (4, 0),
            PollStrategy::Next => (5, 0),
        };
        w.u8(kind).u64(value);
    }
}

/// The consumer a poll or an offset request names (Iggy's Consumer): kind u8 (1
/// consumer, 2 consumer group), then an Identifier.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConsumerRef {
    Single(Identifier),
    Group(Identifier),
}

impl ConsumerRef {
    fn read(r: &mut Reader<'_>) -> Result<ConsumerRef, BodyError> {
        match r.u8("consumer_kind")? {
            1 => Ok(ConsumerRef::Single(Identifier::read(r, "consumer_id")?)),
            2 => Ok(ConsumerRef::Group(Identifier::read(r, "consumer_id")?)),
            _ => Err(BodyError::Invalid {
                field: "consumer_kind",
                rule: "must be 1 (consumer) or 2 (consumer group)",
            }),
        }
    }

    fn write(&self, w: &mut Writer) {
        match self {
            ConsumerRef::Single(id) => {
                w.u8(1);
                id.write(w);
            }
            ConsumerRef::Group(id) => {
                w.u8(2);
                id.write(w);
            }
        }
    }

    /// A single consumer's offset key: its numeric id, or for a name the name's
    /// XxHash32 (seed 0). A group's by its id only (a name is resolved in the topic).
    pub fn single_key(&self) -> Option<Consumer> {
        match self {
            ConsumerRef::Single(Identifier::Id(id)) => Some(Consumer::Single(*id)),
            ConsumerRef::Single(Identifier::Name(name)) => Some(Consumer::Single(
                xxhash_rust::xxh32::xxh32(name.as_bytes(), 0),
            )),
            ConsumerRef::Group(Identifier::Id(id)) => Some(Consumer::Group(*id)),
            ConsumerRef::Group(Identifier::Name(_)) => None,
        }
    }
}

impl From<Consumer> for ConsumerRef {
    fn from(consumer: Consumer) -> ConsumerRef {
        match consumer {
            Consumer::Single(id) => ConsumerRef::Single(Identifier::Id(id)),
            Consumer::Group(id) => ConsumerRef::Group(Identifier::Id(id)),
        }
    }
}

/// A consumer group: its stream, topic and group identifiers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GroupRef {
    pub stream: Identifier,
    pub topic: Identifier,
    pub group: Identifier,
}

impl GroupRef {
    fn read(r: &mut Reader<'_>) -> Result<GroupRef, BodyError> {
        Ok(GroupRef {
            stream: Identifier::read(r, "stream_id")?,
            topic: Identifier::read(r, "topic_id")?,
            group: Identifier::read(r, "group_id")?,
        })
    }

    fn write(&self, w: &mut Writer) {
        self.stream.write(w);
        self.topic.write(w);
        self.group.write(w);
    }

    /// A group named by numeric ids.
    pub fn ids(stream: u32, topic: u32, group: u32) -> GroupRef {
        GroupRef {
            stream: Identifier::Id(stream),
            topic: Identifier::Id(topic),
            group: Identifier::Id(group),
        }
    }
}

/// Whose offset in which partition (Iggy's consumer offset requests): the consumer,
/// the stream and topic, and a partition flag u8 (1: the u32 that follows names it)
/// with the partition id u32.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OffsetTarget {
    pub consumer: ConsumerRef,
    pub stream: Identifier,
    pub topic: Identifier,
    pub partition: Option<u32>,
}

impl OffsetTarget {
    fn read(r: &mut Reader<'_>) -> Result<OffsetTarget, BodyError> {
        Ok(OffsetTarget {
            consumer: ConsumerRef::read(r)?,
            stream: Identifier::read(r, "stream_id")?,
            topic: Identifier::read(r, "topic_id")?,
            partition: optional_partition(r)?,
        })
    }

    fn write(&self, w: &mut Writer) {
        self.consumer.write(w);
        self.stream.write(w);
        self.topic.write(w);
        write_optional_partition(w, self.partition);
    }

    /// The target of `consumer`'s offset in a partition named by numeric ids.
    pub fn of(partition: PartitionKey, consumer: Consumer) -> OffsetTarget {
        OffsetTarget {
            consumer: consumer.into(),
            stream: Identifier::Id(partition.stream),
            topic: Identifier::Id(partition.topic),
            partition: Some(partition.partition),
        }
    }
}

/// A poll's body: offset target, strategy, count (1 to `POLL_COUNT_MAX`), auto_commit.
fn poll(r: &mut Reader<'_>) -> Result<(OffsetTarget, PollStrategy, u32, bool), BodyError> {
    let target = OffsetTarget::read(r)?;
    let strategy = PollStrategy::read(r)?;
    let count = r.u32("count")?;
    if count == 0 || count > POLL_COUNT_MAX {
        return Err(BodyError::Invalid {
            field: "count",
            rule: "must be 1 to 100000",
        });
    }
    let auto_commit = r.u8("auto_commit")? != 0;
    Ok((target, strategy, count, auto_commit))
}

/// Iggy's optional partition: flag u8 (0 none, 1 the id), then the id u32 (0 if none).
fn optional_partition(r: &mut Reader<'_>) -> Result<Option<u32>, BodyError> {
    match (r.u8("partition_flag")?, r.u32("partition_id")?) {
        (0, _) => Ok(None),
        (1, id) => Ok(Some(id)),
        _ => Err(BodyError::Invalid {
            field: "partition_flag",
            rule: "must be 0 (none) or 1",
        }),
    }
}

fn write_optional_partition(w: &mut Writer, partition: Option<u32>) {
    w.u8(u8::from(partition.is_some()))
        .u32(partition.unwrap_or(0));
}

/// Iggy's ack level of an offset write: 0 none, 1 quorum.
const ACK_QUORUM: u8 = 1;

fn ack_level(r: &mut Reader<'_>) -> Result<u8, BodyError> {
    match r.u8("ack")? {
        level @ (0 | ACK_QUORUM) => Ok(level),
        _ => Err(BodyError::Invalid {
            field: "ack",
            rule: "must be 0 (none) or 1 (quorum)",
        }),
    }
}

/// How a SendMessages picks its partition (Iggy's Partitioning): kind u8, length u8,
/// value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Partitioning<'a> {
    /// Round robin over the topic's partitions (kind 1, no value).
    Balanced,
    /// This partition (kind 2, a u32).
    PartitionId(u32),
    /// The key's XxHash32 (seed 0) modulo the partition count (kind 3, 1 to 255 bytes).
    MessagesKey(&'a [u8]),
}

impl<'a> Partitioning<'a> {
    fn read(r: &mut Reader<'a>) -> Result<Partitioning<'a>, BodyError> {
        let kind = r.u8("partitioning")?;
        let len = r.u8("partitioning_length")?;
        match (kind, len) {
            (1, 0) => Ok(Partitioning::Balanced),
            (2, 4) => Ok(Partitioning::PartitionId(r.u32("partition_id")?)),
            (3, 1..) => Ok(Partitioning::MessagesKey(
                r.bytes(usize::from(len), "messages_key")?,
            )),
            _ => Err(BodyError::Invalid {
                field: "partitioning",
                rule: "kind 1 (balanced, length 0), 2 (partition id, length 4) or 3 \
                       (messages key, length 1 to 255)",
            }),
        }
    }

    fn write(&self, w: &mut Writer) {
        match self {
            Partitioning::Balanced => {
                w.u8(1).u8(0);
            }
            Partitioning::PartitionId(id) => {
                w.u8(2).u8(4).u32(*id);
            }
            Partitioning::MessagesKey(key) => {
                w.u8(3).short_bytes(key);
            }
        }
    }

    /// The partition of a topic of `partitions` partitions this picks; a Balanced pick
    /// takes the next value of the topic's round-robin counter from `next_balanced`
    /// (called only for Balanced). None for an empty topic.
    pub fn pick(&self, partitions: u32, next_balanced: impl FnOnce() -> u32) -> Option<u32> {
        if partitions == 0 {
            return None;
        }
        Some(match self {
            Partitioning::Balanced => next_balanced() % partitions,
            Partitioning::PartitionId(id) => *id,
            Partitioning::MessagesKey(key) => xxhash_rust::xxh32::xxh32(key, 0) % partitions,
        })
    }
}

/// NonReplicated read commands (RequestHeader.read_command): the Apache Iggy command
/// codes (binary protocol 0.11.0) where the appliance serves Iggy's command, and the
/// appliance's own reads at codes Iggy leaves unused (2 to 4).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadCommand {
    Ping = 1,
    ClusterMetadata = 2,
    ListStreams = 3,
    ListTopics = 4,
    /// Iggy's AttachConsumerSession: this connection polls and stores offsets for a
    /// session (its routing reply named it).
    AttachConsumerSession = 14,
    PollMessages = 100,
    /// Where a poll with auto-commit goes: the partition's primary.
    GetPollRouting = 103,
    /// A poll sent to the partition's primary (as PollMessages).
    PollMessagesOnPrimary = 104,
    GetConsumerOffset = 120,
    /// Where a consumer offset write goes: the partition's primary.
    GetConsumerOffsetRouting = 123,
    GetConsumerGroup = 600,
    GetConsumerGroups = 601,
    /// A member's partitions and the group's generation.
    SyncConsumerGroup = 606,
    /// Iggy's GetClusterMetadata: every node, its address and role.
    ClusterNodes = 12,
    GetStream = 200,
    GetStreams = 201,
    GetTopic = 300,
    GetTopics = 301,
    /// Iggy's LoginUser: authenticates the connection without a new session.
    Login = 38,
    GetStats = 10,
    GetMe = 20,
    GetClient = 21,
    GetClients = 22,
    GetUser = 31,
    GetUsers = 32,
    GetTokens = 41,
    /// Iggy's LoginWithPersonalAccessToken: as Login, with a token.
    LoginWithToken = 44,
}

impl ReadCommand {
    pub fn from_u32(value: u32) -> Option<ReadCommand> {
        Some(match value {
            1 => ReadCommand::Ping,
            2 => ReadCommand::ClusterMetadata,
            3 => ReadCommand::ListStreams,
            4 => ReadCommand::ListTopics,
            14 => ReadCommand::AttachConsumerSession,
            100 => ReadCommand::PollMessages,
            103 => ReadCommand::GetPollRouting,
            104 => ReadCommand::PollMessagesOnPrimary,
            120 => ReadCommand::GetConsumerOffset,
            123 => ReadCommand::GetConsumerOffsetRouting,
            600 => ReadCommand::GetConsumerGroup,
            601 => ReadCommand::GetConsumerGroups,
            606 => ReadCommand::SyncConsumerGroup,
            12 => ReadCommand::ClusterNodes,
            200 => ReadCommand::GetStream,
            201 => ReadCommand::GetStreams,
            300 => ReadCommand::GetTopic,
            301 => ReadCommand::GetTopics,
            38 => ReadCommand::Login,
            10 => ReadCommand::GetStats,
            20 => ReadCommand::GetMe,
            21 => ReadCommand::GetClient,
            22 => ReadCommand::GetClients,
            31 => ReadCommand::GetUser,
            32 => ReadCommand::GetUsers,
            41 => ReadCommand::GetTokens,
            44 => ReadCommand::LoginWithToken,
            _ => return None,
        })
    }
}

/// The Iggy protocol version (major << 20 | minor << 10 | patch) this client port
/// speaks: 0.11.0.
pub const PROTOCOL_VERSION: u32 = 11 << 10;

/// The server version a Register reply names.
pub const SERVER_VERSION: &str = concat!("appliance ", env!("CARGO_PKG_VERSION"));

/// Whether a client of `version` speaks this port's protocol: the same minor version
/// (patch releases never change the wire).
pub fn protocol_compatible(version: u32) -> bool {
    version >> 10 == PROTOCOL_VERSION >> 10
}

/// Bytes an optional text of a login (SDK version, client context) may hold.
pub const LOGIN_TEXT_MAX: usize = 1024;

/// The client's protocol version and SDK, at the head of a Register body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientVersion {
    pub protocol_version: u32,
    pub sdk_name: String,
    pub sdk_version: String,
}

/// How a Register proves who the client is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credentials {
    Password {
        username: String,
        password: Vec<u8>,
    },
    /// A personal access token.
    Token(Vec<u8>),
}

/// Iggy's Identifier: a stream (or topic, group, user) by numeric id or by name. On
/// the wire: kind u8 (1 numeric, 2 name), length u8, then the value (u32 for an id,
/// 1 to 255 bytes of UTF-8 for a name).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Identifier {
    Id(u32),
    Name(String),
}

impl Identifier {
    pub(crate) fn read(r: &mut Reader<'_>, field: &'static str) -> Result<Identifier, BodyError> {
        let kind = r.u8(field)?;
        let len = r.u8(field)?;
        match (kind, len) {
            (1, 4) => Ok(Identifier::Id(r.u32(field)?)),
            (2, 1..) => {
                let bytes = r.bytes(usize::from(len), field)?;
                String::from_utf8(bytes.to_vec())
                    .map(Identifier::Name)
                    .map_err(|_| BodyError::NotUtf8 { field })
            }
            _ => Err(BodyError::Invalid {
                field,
                rule: "an identifier is kind 1 with 4 bytes or kind 2 with 1 to 255 bytes",
            }),
        }
    }

    pub(crate) fn write(&self, w: &mut Writer) {
        match self {
            Identifier::Id(id) => {
                w.u8(1).u8(4).u32(*id);
            }
            Identifier::Name(name) => {
                w.u8(2).short_bytes(name.as_bytes());
            }
        }
    }
}

/// A parsed client request body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientRequest<'a> {
    /// Login and Register in one (Iggy's LoginRegister): the node checks the
    /// credentials, then the metadata primary mints the session.
    Register {
        version: ClientVersion,
        credentials: Credentials,
        context: Option<String>,
    },
    Logout,
    CreateStream {
        name: String,
    },
    DeleteStream {
        stream: Identifier,
    },
    /// A topic of `partitions` partitions; `options` is Iggy's options block
    /// (`options::TopicOptions`: retention, compression, durability).
    CreateTopic {
        stream: Identifier,
        name: String,
        partitions: u32,
        options: Vec<u8>,
    },
    /// Changes the options a topic's block names (the others keep their values);
    /// `name` must be the topic's own (the appliance does not rename topics).
    UpdateTopic {
        stream: Identifier,
        topic: Identifier,
        name: String,
        options: Vec<u8>,
    },
    DeleteTopic {
        stream: Identifier,
        topic: Identifier,
    },
    CreatePartitions {
        stream: Identifier,
        topic: Identifier,
        count: u32,
    },
    DeletePartitions {
        stream: Identifier,
        topic: Identifier,
        count: u32,
    },
    /// Iggy's CreateUser: username, password, status (1 active, 2 inactive), the
    /// permission tree (`users::read_permissions`), then the user's options block.
    CreateUser {
        username: String,
        password: Vec<u8>,
        status: u8,
        permissions: Vec<StreamPermission>,
        options: Vec<u8>,
    },
    DeleteUser {
        user: Identifier,
    },
    /// Iggy's UpdateUser: a new name and status where given, and the options block.
    UpdateUser {
        user: Identifier,
        username: Option<String>,
        status: Option<u8>,
        options: Vec<u8>,
    },
    /// Iggy's ChangePassword: the current password must match.
    ChangePassword {
        user: Identifier,
        current_password: Vec<u8>,
        new_password: Vec<u8>,
    },
    UpdatePermissions {
        user: Identifier,
        permissions: Vec<StreamPermission>,
    },
    /// A personal access token for the caller; `expiry` in microseconds (0: the
    /// server's default, never; u64::MAX: never).
    CreateToken {
        name: String,
        expiry: u64,
    },
    DeleteToken {
        name: String,
    },
    /// Iggy's UpdateStream: a new name (and its options block, which must be empty).
    UpdateStream {
        stream: Identifier,
        name: String,
    },
    PurgeStream {
        stream: Identifier,
    },
    PurgeTopic {
        stream: Identifier,
        topic: Identifier,
    },
    CreateConsumerGroup {
        stream: Identifier,
        topic: Identifier,
        name: String,
    },
    DeleteConsumerGroup {
        group: GroupRef,
    },
    /// The member is the request's client.
    JoinConsumerGroup {
        group: GroupRef,
    },
    LeaveConsumerGroup {
        group: GroupRef,
    },
    /// Iggy's SendMessages: `metadata_length u32`, then stream and topic Identifiers,
    /// the partitioning and `messages_count u32` (`metadata_length` bytes in all), then
    /// the batch, verified separately (wire::batch::verify) at ingress.
    SendMessages {
        stream: Identifier,
        topic: Identifier,
        partitioning: Partitioning<'a>,
        messages_count: u32,
        batch: &'a [u8],
    },
    /// Iggy's StoreConsumerOffset; its trailing ack level (0 none, 1 quorum) is read
    /// and every store is acknowledged at quorum.
    StoreConsumerOffset {
        target: OffsetTarget,
        offset: u64,
    },
    /// Iggy's DeleteConsumerOffset (with its ack level, as above).
    DeleteConsumerOffset {
        target: OffsetTarget,
    },
    /// Delete the oldest `segments` sealed segments of a partition (Iggy's
    /// DeleteSegments: stream and topic identifiers, partition id u32, segments u32).
    DeleteSegments {
        stream: Identifier,
        topic: Identifier,
        partition: u32,
        segments: u32,
    },
    /// Iggy's LoginWithPersonalAccessToken: as Login, with a token.
    LoginWithToken {
        token: Vec<u8>,
    },
    /// Authenticates the connection (Iggy's LoginUser); the session goes on.
    Login {
        username: String,
        password: Vec<u8>,
        version: Option<String>,
        context: Option<String>,
    },
    Ping,
    /// A NonReplicated read whose code the appliance does not serve (answered
    /// FeatureUnavailable).
    Unsupported {
        code: u32,
    },
    ClusterMetadata,
    /// Iggy's GetClusterMetadata.
    ClusterNodes,
    /// Iggy's GetStream: the stream and its topics.
    GetStream {
        stream: Identifier,
    },
    /// Iggy's GetStreams.
    GetStreams,
    /// Iggy's GetTopic: the topic and its partitions.
    GetTopic {
        stream: Identifier,
        topic: Identifier,
    },
    /// Iggy's GetTopics: a stream's topics.
    GetTopics {
        stream: Identifier,
    },
    ListStreams,
    ListTopics {
        stream_id: u32,
    },
    /// Iggy's PollMessages: a partition of `None` is partition 0 for a single consumer
    /// (a consumer group's member names its assigned partition).
    PollMessages {
        target: OffsetTarget,
        strategy: PollStrategy,
        count: u32,
        auto_commit: bool,
    },
    GetConsumerOffset {
        target: OffsetTarget,
    },
    /// Iggy's GetPollRouting: the body of the poll to route.
    GetPollRouting {
        target: OffsetTarget,
        strategy: PollStrategy,
        count: u32,
        auto_commit: bool,
    },
    /// Iggy's GetConsumerOffsetRouting: whose offset, where.
    GetConsumerOffsetRouting {
        target: OffsetTarget,
    },
    /// Iggy's GetConsumerGroup: empty when there is no such group.
    GetConsumerGroup {
        group: GroupRef,
    },
    /// Iggy's GetConsumerGroups: a topic's groups.
    GetConsumerGroups {
        stream: Identifier,
        topic: Identifier,
    },
    /// Iggy's SyncConsumerGroup: the requesting member's partitions.
    SyncConsumerGroup {
        group: GroupRef,
    },
    /// Iggy's AttachConsumerSession: the session a routing reply named.
    AttachConsumerSession {
        client: u128,
        session: u64,
        metadata_watermark: u64,
    },
    GetUser {
        user: Identifier,
    },
    GetUsers,
    /// The caller's personal access tokens.
    GetTokens,
    /// Iggy's GetMe: this connection as GetClient describes it.
    GetMe,
    GetClient {
        client_id: u32,
    },
    GetClients,
    /// Iggy's GetStats: this node's figures.
    GetStats,
}

/// Reads a permission list (`count u32`, then `stream_id u32, bits u8` per entry): the
/// layout of client requests and of prepared metadata ops alike.
pub(crate) fn permissions(r: &mut Reader<'_>) -> Result<Vec<StreamPermission>, BodyError> {
    let count = r.u32("permission_count")?;
    if count as usize > PERMISSIONS_MAX {
        return Err(BodyError::TooMany {
            field: "permissions",
            count: count.into(),
            max: PERMISSIONS_MAX as u64,
        });
    }
    (0..count)
        .map(|_| {
            let stream_id = r.u32("permission.stream_id")?;
            let bits = r.u8("permission.bits")?;
            if bits & !0b111 != 0 {
                return Err(BodyError::Invalid {
                    field: "permission.bits",
                    rule: "only bits 0-2 (read, write, manage)",
                });
            }
            Ok(StreamPermission::from_bits(stream_id, bits))
        })
        .collect()
}

/// Writes a permission list in the layout `permissions` reads.
pub(crate) fn write_permissions(w: &mut Writer, permissions: &[StreamPermission]) {
    w.u32(permissions.len() as u32);
    for p in permissions {
        w.u32(p.stream_id).u8(p.bits());
    }
}
