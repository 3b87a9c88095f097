//! The metadata state machine: streams, topics, partitions, users and consumer groups.
//! `apply` is deterministic (ids are assigned in op order, no clocks, no randomness), so
//! every replica that applies the same ops holds the same state (metadata/apply.rs).
//! `prepare` runs on the primary only: it authorises the request and turns it into a
//! prepared `MetadataOp` (metadata/prepare.rs).

use std::collections::{BTreeMap, BTreeSet};

use replication::wire::PartitionKey;
use serde::{Deserialize, Serialize};

use super::auth;
use super::ops::MetadataOp;
use crate::protocol::reply::{
    ConsumerGroupDetailsReply, ConsumerGroupReply, StreamReply, TopicReply,
};
use crate::protocol::request::{GroupRef, Identifier};
use crate::protocol::users::{UserDetailsReply, UserReply, USER_ACTIVE};
use crate::protocol::{Status, StreamPermission};

mod apply;
mod prepare;

/// Streams a cluster may hold (stream ids are 20 bits; 0 is unused).
pub const STREAMS_MAX: u32 = (1 << 20) - 1;
/// Topics per stream (topic ids are 12 bits; 0 is unused).
pub const TOPICS_PER_STREAM_MAX: u32 = (1 << 12) - 1;
/// Partitions per topic.
pub const PARTITIONS_PER_TOPIC_MAX: u32 = 10_000;
/// Consumer groups per topic, and members per group.
pub const GROUPS_PER_TOPIC_MAX: u32 = 1_000;
pub const GROUP_MEMBERS_MAX: usize = 10_000;
/// Users a cluster may hold.
pub const USERS_MAX: u32 = 100_000;
/// The root user set at format time.
pub const ROOT_USER_ID: u32 = 1;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stream {
    pub name: String,
    pub created_at: u64,
    pub topics: BTreeMap<u32, Topic>,
    pub next_topic_id: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topic {
    pub name: String,
    pub created_at: u64,
    /// Partition ids, 0..partition_count.
    pub partition_count: u32,
    pub groups: BTreeMap<u32, ConsumerGroup>,
    pub next_group_id: u32,
    /// Retention: microseconds (0: the server default, u64::MAX: never) and bytes (0:
    /// the server default, u64::MAX: no limit).
    #[serde(default)]
    pub message_expiry: u64,
    #[serde(default)]
    pub max_topic_size: u64,
    /// Per partition: the first offset retained (TruncatePartition); absent: 0.
    #[serde(default)]
    pub retained_from: BTreeMap<u32, u64>,
    /// Spreads the partitions' first leaders over the nodes: partition p's group starts
    /// in view (first_primary + p) mod replica_count, whose primary is that replica.
    /// None (topics created before leaders were spread, or with
    /// `cluster.spread_primaries = false`): every partition's group starts in view 0.
    #[serde(default)]
    pub first_primary: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerGroup {
    pub name: String,
    /// Client ids, in the order partitions are assigned.
    pub members: BTreeSet<u128>,
    /// Counts membership changes: a member's assignment holds for one generation.
    #[serde(default)]
    pub generation: u64,
}

impl Stream {
    /// The stream as Iggy describes it, its sizes summed from its `topics`' headers.
    pub fn reply(&self, id: u32, topics: &[TopicReply]) -> StreamReply {
        StreamReply {
            id,
            created_at: self.created_at,
            topics_count: self.topics.len() as u32,
            size_bytes: topics.iter().map(|t| t.size_bytes).sum(),
            messages_count: topics.iter().map(|t| t.messages_count).sum(),
            name: self.name.clone(),
        }
    }
}

impl Topic {
    /// The topic's header as Iggy describes it, with the bytes and messages stored.
    pub fn reply(&self, id: u32, size_bytes: u64, messages_count: u64) -> TopicReply {
        TopicReply {
            id,
            created_at: self.created_at,
            partitions_count: self.partition_count,
            message_expiry: self.message_expiry,
            max_topic_size: self.max_topic_size,
            size_bytes,
            messages_count,
            name: self.name.clone(),
        }
    }

    /// A new partition count moves partitions between members: every group's
    /// assignments start a new generation.
    fn reassign_groups(&mut self) {
        for group in self.groups.values_mut() {
            group.generation += 1;
        }
    }
}

impl ConsumerGroup {
    /// The partitions of a topic of `partitions` that member `index` (in member
    /// order) reads: every partition p with p mod members = index.
    pub fn assignment(&self, index: usize, partitions: u32) -> Vec<u32> {
        let members = self.members.len().max(1) as u32;
        (0..partitions)
            .filter(|p| p % members == index as u32)
            .collect()
    }

    /// The partitions `client` reads, if it is a member.
    pub fn assignment_of(&self, client: u128, partitions: u32) -> Option<Vec<u32>> {
        let index = self.members.iter().position(|m| *m == client)?;
        Some(self.assignment(index, partitions))
    }

    /// The group as Iggy's GetConsumerGroup answers it: members numbered from 1.
    pub fn details(&self, id: u32, partitions: u32) -> ConsumerGroupDetailsReply {
        ConsumerGroupDetailsReply {
            group: ConsumerGroupReply {
                id,
                partitions_count: partitions,
                members_count: self.members.len() as u32,
                name: self.name.clone(),
            },
            members: (0..self.members.len())
                .map(|index| (index as u32 + 1, self.assignment(index, partitions)))
                .collect(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub username: String,
    pub password_hash: String,
    pub permissions: Vec<(u32, u8)>,
    pub root: bool,
    /// Microseconds since the Unix epoch (0: created before users kept it).
    #[serde(default)]
    pub created_at: u64,
    /// Iggy's status: 1 active, 2 inactive (an inactive user cannot log in).
    #[serde(default = "active")]
    pub status: u8,
    /// The user's options block, as given.
    #[serde(default)]
    pub options: Vec<u8>,
    /// Personal access tokens by name.
    #[serde(default)]
    pub tokens: BTreeMap<String, Token>,
}

fn active() -> u8 {
    USER_ACTIVE
}

/// A personal access token: only its hash is kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    pub hash: String,
    /// Microseconds since the Unix epoch; 0: never expires.
    pub expiry_at: u64,
}

impl User {
    pub fn is_active(&self) -> bool {
        self.status == USER_ACTIVE
    }

    fn permission_list(&self) -> Vec<StreamPermission> {
        self.permissions
            .iter()
            .map(|(stream_id, bits)| StreamPermission::from_bits(*stream_id, *bits))
            .collect()
    }

    /// The user as Iggy's GetUser answers it.
    pub fn details(&self, id: u32) -> UserDetailsReply {
        UserDetailsReply {
            user: self.reply(id),
            root: self.root,
            permissions: self.permission_list(),
        }
    }

    pub fn reply(&self, id: u32) -> UserReply {
        UserReply {
            id,
            created_at: self.created_at,
            status: self.status,
            username: self.username.clone(),
            options: self.options.clone(),
        }
    }
}

/// A CreateUser or ChangePassword waiting for its Argon2 work: the current password's
/// check (ChangePassword) and the new password's salted hash.
#[derive(Debug)]
pub struct PasswordWork {
    op: MetadataOp,
    /// The password given as current, and the user's hash it must match.
    verify: Option<(Vec<u8>, String)>,
    password: Vec<u8>,
}

impl PasswordWork {
    /// Checks and hashes (tens of milliseconds), then the op to prepare: the hash in
    /// place of the password. InvalidCredentials when the current password is wrong,
    /// InvalidRequest for a password too short.
    pub fn run(self) -> Result<MetadataOp, Status> {
        if let Some((given, hash)) = &self.verify {
            if !auth::verify_password(given, hash) {
                return Err(Status::InvalidCredentials);
            }
        }
        let hashed = auth::hash_password(&self.password).map_err(|_| Status::InvalidRequest)?;
        let mut op = self.op;
        if let MetadataOp::CreateUser { password_hash, .. }
        | MetadataOp::ChangePassword { password_hash, .. } = &mut op
        {
            *password_hash = hashed;
        }
        Ok(op)
    }
}

/// Who is asking: the session's user and client (from the prepare header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub user_id: u32,
    pub client: u128,
}

/// What applying an op produced: the reply status and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub status: Status,
    pub body: Vec<u8>,
}

impl Applied {
    fn ok(body: Vec<u8>) -> Applied {
        Applied {
            status: Status::Ok,
            body,
        }
    }

    fn fail(status: Status) -> Applied {
        Applied {
            status,
            body: Vec::new(),
        }
    }

    /// A delete's outcome: Ok when it found what it removed, NotFound otherwise.
    fn removed<T>(found: Option<T>) -> Applied {
        match found {
            Some(_) => Applied::ok(Vec::new()),
            None => Applied::fail(Status::NotFound),
        }
    }
}

/// The right a request needs on a stream (stream 0: every stream / cluster-wide).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Right {
    Read,
    Write,
    Manage,
}

/// The replicated metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataState {
    pub streams: BTreeMap<u32, Stream>,
    pub next_stream_id: u32,
    pub users: BTreeMap<u32, User>,
    pub next_user_id: u32,
}

impl MetadataState {
    /// The first offset retained of a partition (0 until retention or DeleteSegments
    /// moved it).
    pub fn retained_from(&self, key: PartitionKey) -> u64 {
        self.streams
            .get(&key.stream)
            .and_then(|s| s.topics.get(&key.topic))
            .and_then(|t| t.retained_from.get(&key.partition).copied())
            .unwrap_or(0)
    }

    /// The state a freshly formatted cluster starts with: only the root user.
    pub fn formatted(root_username: &str, root_password_hash: String) -> MetadataState {
        let mut state = MetadataState {
            next_stream_id: 1,
            next_user_id: ROOT_USER_ID + 1,
            ..Default::default()
        };
        state.users.insert(
            ROOT_USER_ID,
            User {
                username: root_username.to_string(),
                password_hash: root_password_hash,
                permissions: Vec::new(),
                root: true,
                created_at: 0,
                status: USER_ACTIVE,
                options: Vec::new(),
                tokens: BTreeMap::new(),
            },
        );
        state
    }

    /// The active user a login names, with its password hash.
    pub fn account(&self, username: &str) -> Option<(u32, &str)> {
        self.users
            .iter()
            .find(|(_, u)| u.username == username && u.is_active())
            .map(|(id, u)| (*id, u.password_hash.as_str()))
    }

    /// The user an Identifier names: by id, or by username.
    pub fn user_id(&self, user: &Identifier) -> Option<u32> {
        match user {
            Identifier::Id(id) => self.users.contains_key(id).then_some(*id),
            Identifier::Name(name) => self
                .users
                .iter()
                .find(|(_, u)| u.username == *name)
                .map(|(id, _)| *id),
        }
    }

    /// Whether `user_id` exists and may use the cluster.
    pub fn is_active(&self, user_id: u32) -> bool {
        self.users.get(&user_id).is_some_and(User::is_active)
    }

    /// The active user holding a personal access token of this hash, unexpired at
    /// `now`.
    pub fn token_user(&self, hash: &str, now: u64) -> Option<u32> {
        self.users.iter().find_map(|(id, user)| {
            let valid = user.is_active()
                && user
                    .tokens
                    .values()
                    .any(|t| t.hash == hash && (t.expiry_at == 0 || t.expiry_at > now));
            valid.then_some(*id)
        })
    }

    /// The active user a login names, if the password matches. Unknown names (and
    /// inactive users) verify against a decoy hash so timing does not reveal whether a user exists.
    pub fn login(&self, username: &str, password: &[u8]) -> Option<u32> {
        match self.account(username) {
            Some((id, hash)) => auth::verify_password(password, hash).then_some(id),
            None => {
                auth::verify_password(password, auth::decoy_hash());
                None
            }
        }
    }

    /// Whether `user_id` holds `right` on `stream_id` (stream 0 asks for a cluster-wide
    /// right). Root holds every right; a deleted user holds none.
    pub fn allows(&self, user_id: u32, stream_id: u32, right: Right) -> bool {
        let Some(user) = self.users.get(&user_id) else {
            return false;
        };
        if user.root {
            return true;
        }
        let bit = match right {
            Right::Read => 1,
            Right::Write => 2,
            Right::Manage => 4,
        };
        user.permissions
            .iter()
            .any(|(stream, b)| (*stream == 0 || *stream == stream_id) && b & bit != 0)
    }

    /// The topic of a partition key, if the partition exists.
    pub fn partition_exists(&self, key: PartitionKey) -> bool {
        self.topic(key.stream, key.topic)
            .is_some_and(|t| key.partition < t.partition_count)
    }

    pub fn topic(&self, stream_id: u32, topic_id: u32) -> Option<&Topic> {
        self.streams.get(&stream_id)?.topics.get(&topic_id)
    }

    fn topic_mut(&mut self, stream_id: u32, topic_id: u32) -> Option<&mut Topic> {
        self.streams.get_mut(&stream_id)?.topics.get_mut(&topic_id)
    }

    fn group_mut(
        &mut self,
        stream_id: u32,
        topic_id: u32,
        group_id: u32,
    ) -> Option<&mut ConsumerGroup> {
        self.topic_mut(stream_id, topic_id)?
            .groups
            .get_mut(&group_id)
    }

    /// Whether the cluster holds this partition.
    pub fn has_partition(&self, key: PartitionKey) -> bool {
        self.streams
            .get(&key.stream)
            .and_then(|s| s.topics.get(&key.topic))
            .is_some_and(|t| key.partition < t.partition_count)
    }

    /// Partitions over every topic (wrapping; only spreads first leaders).
    fn partition_total(&self) -> u32 {
        self.streams
            .values()
            .flat_map(|s| s.topics.values())
            .fold(0u32, |total, t| total.wrapping_add(t.partition_count))
    }

    /// The view a partition's group starts in on every replica of a cluster of
    /// `replica_count` (`Topic::first_primary`); 0 for an unknown partition.
    pub fn initial_view(&self, key: PartitionKey, replica_count: u8) -> u32 {
        let first = self
            .streams
            .get(&key.stream)
            .and_then(|s| s.topics.get(&key.topic))
            .and_then(|t| t.first_primary);
        match first {
            Some(first) if replica_count > 0 => {
                ((u64::from(first) + u64::from(key.partition)) % u64::from(replica_count)) as u32
            }
            _ => 0,
        }
    }

    /// Every partition key the cluster holds, in order (one VSR group each).
    pub fn partitions(&self) -> Vec<PartitionKey> {
        let mut keys = Vec::new();
        for (stream, s) in &self.streams {
            for (topic, t) in &s.topics {
                keys.extend((0..t.partition_count).map(|partition| PartitionKey {
                    stream: *stream,
                    topic: *topic,
                    partition,
                }));
            }
        }
        keys
    }

    /// The primary's step: authorise `request` for `caller` and prepare it. Errors are
    /// answered to the client without preparing anything.
    /// The id of the stream `identifier` names, if it exists.
    pub fn stream_id(&self, identifier: &Identifier) -> Option<u32> {
        match identifier {
            Identifier::Id(id) => self.streams.contains_key(id).then_some(*id),
            Identifier::Name(name) => self
                .streams
                .iter()
                .find(|(_, s)| s.name == *name)
                .map(|(id, _)| *id),
        }
    }

    /// The ids of the topic `topic` names in the stream `stream` names, if both exist.
    pub fn topic_id(&self, stream: &Identifier, topic: &Identifier) -> Option<(u32, u32)> {
        let stream_id = self.stream_id(stream)?;
        let topics = &self.streams.get(&stream_id)?.topics;
        let topic_id = match topic {
            Identifier::Id(id) => topics.contains_key(id).then_some(*id)?,
            Identifier::Name(name) => *topics.iter().find(|(_, t)| t.name == *name)?.0,
        };
        Some((stream_id, topic_id))
    }

    /// Removes `client` from every consumer group it is a member of (each such group
    /// starts a new generation). Applied with its Logout on every replica alike.
    pub fn leave_groups(&mut self, client: u128) {
        let groups = self
            .streams
            .values_mut()
            .flat_map(|s| s.topics.values_mut())
            .flat_map(|t| t.groups.values_mut());
        for group in groups {
            if group.members.remove(&client) {
                group.generation += 1;
            }
        }
    }

    /// The ids of the consumer group `group` names, if its stream, topic and group exist.
    pub fn group_id(&self, group: &GroupRef) -> Option<(u32, u32, u32)> {
        let (stream_id, topic_id) = self.topic_id(&group.stream, &group.topic)?;
        let groups = &self.streams.get(&stream_id)?.topics.get(&topic_id)?.groups;
        let group_id = match &group.group {
            Identifier::Id(id) => groups.contains_key(id).then_some(*id)?,
            Identifier::Name(name) => *groups.iter().find(|(_, g)| g.name == *name)?.0,
        };
        Some((stream_id, topic_id, group_id))
    }

    /// The snapshot of this state, as checkpoints and state transfer ship it.
    pub fn snapshot(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Restores a snapshot; a snapshot that does not parse is an error, never a panic.
    pub fn restore(bytes: &[u8]) -> Result<MetadataState, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("metadata snapshot does not parse: {e}"))
    }
}
