//! Users and personal access tokens in Iggy's layouts (docs/client-protocol.md,
//! "Users"): the permission tree of CreateUser, UpdatePermissions and GetUser, and the
//! user and token replies.
//!
//! The appliance holds a user's rights as read, write and manage per stream (stream 0:
//! every stream). Iggy's tree names finer rights; a request is taken only where it maps
//! exactly, so no user ever holds more than it was granted: each group of Iggy's flags
//! below is granted whole or not at all, and topic-level entries are refused.

use super::codec::{BodyError, Reader, Writer};

/// Permission entries a user may hold.
pub const PERMISSIONS_MAX: usize = 1024;

const READ: u8 = 1;
const WRITE: u8 = 2;
const MANAGE: u8 = 4;

/// Rights on one stream (stream_id 0: every stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamPermission {
    pub stream_id: u32,
    pub read: bool,
    pub write: bool,
    pub manage: bool,
}

impl StreamPermission {
    /// The rights as one byte: read 1, write 2, manage 4.
    pub(crate) fn bits(&self) -> u8 {
        (u8::from(self.read) * READ)
            | (u8::from(self.write) * WRITE)
            | (u8::from(self.manage) * MANAGE)
    }

    pub(crate) fn from_bits(stream_id: u32, bits: u8) -> StreamPermission {
        StreamPermission {
            stream_id,
            read: bits & READ != 0,
            write: bits & WRITE != 0,
            manage: bits & MANAGE != 0,
        }
    }
}

/// Iggy's global flags in wire order: manage_servers, read_servers, manage_users,
/// read_users, manage_streams, read_streams, manage_topics, read_topics, poll_messages,
/// send_messages; and which of them make up each appliance right.
const GLOBAL_FLAGS: usize = 10;
const GLOBAL_GROUPS: [(u8, &[usize]); 3] = [
    (READ, &[1, 3, 5, 7, 8]),
    (WRITE, &[9]),
    (MANAGE, &[0, 2, 4, 6]),
];
/// A stream's flags in wire order: manage_stream, read_stream, manage_topics,
/// read_topics, poll_messages, send_messages.
const STREAM_FLAGS: usize = 6;
const STREAM_GROUPS: [(u8, &[usize]); 3] = [(READ, &[1, 3, 4]), (WRITE, &[5]), (MANAGE, &[0, 2])];

/// Iggy's user status codes.
pub const USER_ACTIVE: u8 = 1;
pub const USER_INACTIVE: u8 = 2;

/// Tokens a user may hold.
pub const TOKENS_PER_USER_MAX: usize = 100;

fn rights(flags: &[bool], groups: &[(u8, &[usize])], field: &'static str) -> Result<u8, BodyError> {
    let mut bits = 0;
    for (bit, members) in groups {
        let set = members.iter().filter(|i| flags[**i]).count();
        if set == members.len() {
            bits |= bit;
        } else if set != 0 {
            return Err(BodyError::Invalid {
                field,
                rule: "a right is granted whole: read (every read and poll flag), write \
                       (send_messages) or manage (every manage flag)",
            });
        }
    }
    Ok(bits)
}

fn flags(bits: u8, groups: &[(u8, &[usize])], count: usize) -> Vec<bool> {
    let mut flags = vec![false; count];
    for (bit, members) in groups {
        if bits & bit != 0 {
            for i in *members {
                flags[*i] = true;
            }
        }
    }
    flags
}

fn flag(r: &mut Reader<'_>, field: &'static str) -> Result<bool, BodyError> {
    Ok(r.u8(field)? != 0)
}

fn flag_list(
    r: &mut Reader<'_>,
    count: usize,
    field: &'static str,
) -> Result<Vec<bool>, BodyError> {
    (0..count).map(|_| flag(r, field)).collect()
}

/// Reads an optional permission tree: `has u8` (0 none), then `length u32` and the tree.
pub(crate) fn read_permissions(r: &mut Reader<'_>) -> Result<Vec<StreamPermission>, BodyError> {
    match r.u8("has_permissions")? {
        0 => Ok(Vec::new()),
        1 => {
            let length = r.u32("permissions_length")?;
            let mut tree = Reader::new(r.bytes(length as usize, "permissions")?);
            let list = permission_tree(&mut tree)?;
            tree.finish()?;
            Ok(list)
        }
        _ => Err(BodyError::Invalid {
            field: "has_permissions",
            rule: "must be 0 or 1",
        }),
    }
}

fn permission_tree(r: &mut Reader<'_>) -> Result<Vec<StreamPermission>, BodyError> {
    let global = flag_list(r, GLOBAL_FLAGS, "permissions.global")?;
    let mut list = Vec::new();
    let global = rights(&global, &GLOBAL_GROUPS, "permissions.global")?;
    if global != 0 {
        list.push(StreamPermission::from_bits(0, global));
    }
    if !flag(r, "permissions.has_streams")? {
        return Ok(list);
    }
    loop {
        if list.len() >= PERMISSIONS_MAX {
            return Err(BodyError::TooMany {
                field: "permissions",
                count: list.len() as u64 + 1,
                max: PERMISSIONS_MAX as u64,
            });
        }
        let stream_id = r.u32("permissions.stream_id")?;
        if stream_id == 0 || list.iter().any(|p| p.stream_id == stream_id) {
            return Err(BodyError::Invalid {
                field: "permissions.stream_id",
                rule: "a stream id is not 0 and appears once",
            });
        }
        let stream = flag_list(r, STREAM_FLAGS, "permissions.stream")?;
        let stream = rights(&stream, &STREAM_GROUPS, "permissions.stream")?;
        if flag(r, "permissions.has_topics")? {
            return Err(BodyError::Invalid {
                field: "permissions.topics",
                rule: "topic-level permissions are not supported: grant on the stream",
            });
        }
        if stream != 0 {
            list.push(StreamPermission::from_bits(stream_id, stream));
        }
        if !flag(r, "permissions.has_next_stream")? {
            return Ok(list);
        }
    }
}

/// Writes the tree `permission_tree` reads; `root` holds every right.
fn write_permission_tree(w: &mut Writer, list: &[StreamPermission], root: bool) {
    let global = if root {
        READ | WRITE | MANAGE
    } else {
        list.iter()
            .find(|p| p.stream_id == 0)
            .map_or(0, StreamPermission::bits)
    };
    for f in flags(global, &GLOBAL_GROUPS, GLOBAL_FLAGS) {
        w.u8(u8::from(f));
    }
    let streams: Vec<&StreamPermission> = if root {
        Vec::new()
    } else {
        list.iter().filter(|p| p.stream_id != 0).collect()
    };
    w.u8(u8::from(!streams.is_empty()));
    for (i, p) in streams.iter().enumerate() {
        w.u32(p.stream_id);
        for f in flags(p.bits(), &STREAM_GROUPS, STREAM_FLAGS) {
            w.u8(u8::from(f));
        }
        w.u8(0); // no topic entries
        w.u8(u8::from(i + 1 < streams.len()));
    }
}

/// Writes an optional tree in the layout `read_permissions` reads (none when empty).
pub(crate) fn write_permissions(w: &mut Writer, list: &[StreamPermission]) {
    if list.is_empty() {
        w.u8(0);
        return;
    }
    let mut tree = Writer::default();
    write_permission_tree(&mut tree, list, false);
    let tree = tree.finish();
    w.u8(1).u32(tree.len() as u32).raw(&tree);
}

/// Iggy's user header (UserResponse): id u32, created_at u64, status u8, username
/// (u8 length), options (u32 length).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserReply {
    pub id: u32,
    pub created_at: u64,
    pub status: u8,
    pub username: String,
    pub options: Vec<u8>,
}

impl UserReply {
    fn write(&self, w: &mut Writer) {
        w.u32(self.id)
            .u64(self.created_at)
            .u8(self.status)
            .short_bytes(self.username.as_bytes())
            .u32(self.options.len() as u32)
            .raw(&self.options);
    }

    fn read(r: &mut Reader<'_>) -> Result<UserReply, BodyError> {
        let id = r.u32("user.id")?;
        let created_at = r.u64("user.created_at")?;
        let status = r.u8("user.status")?;
        let username = r.name("user.username")?;
        let length = r.u32("user.options_length")?;
        let options = r.bytes(length as usize, "user.options")?.to_vec();
        Ok(UserReply {
            id,
            created_at,
            status,
            username,
            options,
        })
    }

    /// GetUsers: the users one after another.
    pub fn encode_all(users: &[UserReply]) -> Vec<u8> {
        let mut w = Writer::default();
        for user in users {
            user.write(&mut w);
        }
        w.finish()
    }

    pub fn decode_all(body: &[u8]) -> Result<Vec<UserReply>, BodyError> {
        let mut r = Reader::new(body);
        let mut users = Vec::new();
        while r.remaining() > 0 {
            users.push(UserReply::read(&mut r)?);
        }
        Ok(users)
    }
}

/// Iggy's GetUser and CreateUser reply: the user, then its permissions (flag 1, tree
/// length u32, tree) or, with none, a u32 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserDetailsReply {
    pub user: UserReply,
    pub root: bool,
    pub permissions: Vec<StreamPermission>,
}

impl UserDetailsReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        self.user.write(&mut w);
        if self.permissions.is_empty() && !self.root {
            w.u32(0);
        } else {
            let mut tree = Writer::default();
            write_permission_tree(&mut tree, &self.permissions, self.root);
            let tree = tree.finish();
            w.u8(1).u32(tree.len() as u32).raw(&tree);
        }
        w.finish()
    }

    /// Reads the reply back (a root user's tree reads as the global rights).
    pub fn decode(body: &[u8]) -> Result<UserDetailsReply, BodyError> {
        let mut r = Reader::new(body);
        let user = UserReply::read(&mut r)?;
        let permissions = match r.u8("has_permissions")? {
            0 => {
                r.bytes(3, "permissions_padding")?;
                Vec::new()
            }
            _ => {
                let length = r.u32("permissions_length")?;
                let mut tree = Reader::new(r.bytes(length as usize, "permissions")?);
                let list = permission_tree(&mut tree)?;
                tree.finish()?;
                list
            }
        };
        r.finish()?;
        Ok(UserDetailsReply {
            user,
            root: false,
            permissions,
        })
    }
}

/// Iggy's token listing (GetPersonalAccessTokens): name (u8 length), expiry_at u64
/// (microseconds since the Unix epoch, 0: never), one after another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenReply {
    pub name: String,
    pub expiry_at: u64,
}

impl TokenReply {
    pub fn encode_all(tokens: &[TokenReply]) -> Vec<u8> {
        let mut w = Writer::default();
        for token in tokens {
            w.short_bytes(token.name.as_bytes()).u64(token.expiry_at);
        }
        w.finish()
    }

    pub fn decode_all(body: &[u8]) -> Result<Vec<TokenReply>, BodyError> {
        let mut r = Reader::new(body);
        let mut tokens = Vec::new();
        while r.remaining() > 0 {
            tokens.push(TokenReply {
                name: r.name("token.name")?,
                expiry_at: r.u64("token.expiry_at")?,
            });
        }
        Ok(tokens)
    }
}

/// Iggy's CreatePersonalAccessToken reply: the token (u8 length), shown once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawTokenReply {
    pub token: String,
}

impl RawTokenReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.short_bytes(self.token.as_bytes());
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<RawTokenReply, BodyError> {
        let mut r = Reader::new(body);
        let token = r.name("token")?;
        r.finish()?;
        Ok(RawTokenReply { token })
    }
}
