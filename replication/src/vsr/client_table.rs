//! Client sessions (the client table): Register mints a session epoch (the op that
//! committed it), request numbers deduplicate retries so a retried request is answered
//! from the table instead of being applied twice, and the oldest session is evicted past
//! a bound. Every replica updates the table on commit, so a new primary has it.
//!
//! A session's reply is sealed once the committed op is applied (`apply`): the status and
//! body the state machine gave, kept for retries and in checkpoints. Until then a retry
//! of that request is in progress, never answered without its result.
//!
//! The bodies kept are bounded together (`REPLY_BODIES_KEPT_MAX`): sealing a reply that
//! would pass the bound takes the bodies of the sessions committed longest ago, which
//! keep their status. Every replica seals the same replies in the same order, so they
//! keep the same bodies; a replica that restarted from a checkpoint taken while a reply
//! waited for its result holds that one as its status alone, and may keep a body the
//! others gave up (never the other way round for the reply it lacks).

use std::collections::BTreeMap;

use zerocopy::FromBytes;

use crate::wire::{Frame, ReplyHeader, HEADER_SIZE};

/// Sessions kept by default before the oldest is evicted.
pub const CLIENTS_MAX_DEFAULT: usize = 64;

/// The largest reply body a session keeps for retries (and checkpoints): the details of
/// a topic of the most partitions a topic may have fit with room. A larger one is kept
/// as its header alone (the status, no body).
pub const REPLY_BODY_KEPT_MAX: usize = 1 << 20;

/// The reply bodies one table keeps at most, all sessions together, so that a table and
/// its checkpoints stay bounded whatever its sessions' replies were.
pub const REPLY_BODIES_KEPT_MAX: usize = 32 << 20;

/// One client's session.
#[derive(Clone, Debug)]
pub struct Session {
    /// The session epoch: the op that committed the client's Register.
    pub session: u64,
    /// The highest request number committed for the session.
    pub request: u64,
    /// The op that committed `request` (for eviction order).
    pub op: u64,
    /// The reply to `request`, resent verbatim to a retry.
    pub reply: Frame,
    /// Whether `reply` carries the applied result (else the op committed and waits to
    /// be applied: a retry is in progress).
    pub applied: bool,
}

/// What the table says about an incoming request.
#[derive(Clone, Debug)]
pub enum Lookup<'a> {
    /// New request: prepare it.
    Fresh,
    /// Already committed: resend this reply.
    Replied(&'a Frame),
    /// Committed, not yet applied: the reply comes when it is.
    Applying,
    /// Older than the latest committed request: drop.
    Stale,
    /// No such session (never registered, or evicted): evict the client.
    NoSession,
}

/// The client table of one group.
#[derive(Clone, Debug)]
pub struct ClientTable {
    sessions: BTreeMap<u128, Session>,
    clients_max: usize,
    /// Body bytes of the sessions' replies together (at most `REPLY_BODIES_KEPT_MAX`).
    bodies: usize,
}

impl ClientTable {
    /// An empty table bounded to `clients_max` sessions.
    pub fn new(clients_max: usize) -> ClientTable {
        assert!(clients_max > 0);
        ClientTable {
            sessions: BTreeMap::new(),
            clients_max,
            bodies: 0,
        }
    }

    /// Body bytes of the replies kept, all sessions together.
    pub fn reply_bodies(&self) -> usize {
        self.bodies
    }

    /// Sessions held.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether no session is held.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// The session of `client`.
    pub fn get(&self, client: u128) -> Option<&Session> {
        self.sessions.get(&client)
    }

    /// Classifies a request of a registered client.
    pub fn lookup(&self, client: u128, session: u64, request: u64) -> Lookup<'_> {
        match self.sessions.get(&client) {
            Some(s) if s.session == session => {
                if request > s.request {
                    Lookup::Fresh
                } else if request == s.request {
                    s.replied()
                } else {
                    Lookup::Stale
                }
            }
            _ => Lookup::NoSession,
        }
    }

    /// Partition planes: sessions belong to the metadata plane, so a partition group
    /// deduplicates by client and request number alone.
    pub fn lookup_request(&self, client: u128, request: u64) -> Lookup<'_> {
        match self.sessions.get(&client) {
            Some(s) if request == s.request => s.replied(),
            Some(s) if request < s.request => Lookup::Stale,
            _ => Lookup::Fresh,
        }
    }

    /// Partition planes: records a committed request, creating the client's entry (and
    /// evicting the oldest past the bound); returns the evicted client.
    pub fn commit_request(
        &mut self,
        client: u128,
        request: u64,
        op: u64,
        reply: Frame,
    ) -> Option<u128> {
        if self.commit(client, request, op, reply.clone()) {
            return None;
        }
        if self.sessions.contains_key(&client) {
            return None;
        }
        let evicted = self.register(client, 0, reply);
        if let Some(s) = self.sessions.get_mut(&client) {
            s.request = request;
            s.op = op;
        }
        evicted
    }

    /// Records a committed Register at `op`; returns the client evicted to make room.
    pub fn register(&mut self, client: u128, op: u64, reply: Frame) -> Option<u128> {
        let mut evicted = None;
        if !self.sessions.contains_key(&client) && self.sessions.len() >= self.clients_max {
            let oldest = self
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.op)
                .map(|(client, _)| *client);
            if let Some(oldest) = oldest {
                self.remove(oldest);
                evicted = Some(oldest);
            }
        }
        self.bodies += body_len(&reply);
        let session = Session {
            session: op,
            request: 0,
            op,
            reply,
            applied: false,
        };
        if let Some(replaced) = self.sessions.insert(client, session) {
            self.bodies -= body_len(&replaced.reply);
        }
        assert!(self.sessions.len() <= self.clients_max);
        self.make_room(client);
        evicted
    }

    /// Records a committed request; false when the session is gone or the request is not
    /// newer (the op is still committed, the table just does not cache it).
    pub fn commit(&mut self, client: u128, request: u64, op: u64, reply: Frame) -> bool {
        match self.sessions.get_mut(&client) {
            Some(s) if request > s.request => {
                self.bodies = self.bodies - body_len(&s.reply) + body_len(&reply);
                s.request = request;
                s.op = op;
                s.reply = reply;
                s.applied = false;
                self.make_room(client);
                true
            }
            _ => false,
        }
    }

    /// Seals the reply of `client`'s op `op` once the op is applied; false when the
    /// session is gone or has moved on to a later op. A body over `REPLY_BODY_KEPT_MAX`
    /// is kept as the header alone; one that would take the table's bodies past
    /// `REPLY_BODIES_KEPT_MAX` takes the bodies of the sessions committed longest ago.
    pub fn apply(&mut self, client: u128, op: u64, reply: Frame) -> bool {
        let reply = if body_len(&reply) > REPLY_BODY_KEPT_MAX {
            header_only(&reply)
        } else {
            reply
        };
        match self.sessions.get_mut(&client) {
            Some(s) if s.op == op => {
                self.bodies = self.bodies - body_len(&s.reply) + body_len(&reply);
                s.reply = reply;
                s.applied = true;
            }
            _ => return false,
        }
        self.make_room(client);
        true
    }

    /// Ends a session (Logout).
    pub fn remove(&mut self, client: u128) {
        if let Some(session) = self.sessions.remove(&client) {
            self.bodies -= body_len(&session.reply);
        }
    }

    /// Takes reply bodies, from the session committed longest ago on, until the table's
    /// bodies are within `REPLY_BODIES_KEPT_MAX`, never `client`'s own: the bound is
    /// above `REPLY_BODY_KEPT_MAX`, so the session just sealed always keeps its body.
    fn make_room(&mut self, client: u128) {
        if self.bodies <= REPLY_BODIES_KEPT_MAX {
            return;
        }
        let mut oldest: Vec<(u64, u128)> = self
            .sessions
            .iter()
            .filter(|(c, s)| **c != client && body_len(&s.reply) > 0)
            .map(|(c, s)| (s.op, *c))
            .collect();
        oldest.sort_unstable();
        for (_, other) in oldest {
            if self.bodies <= REPLY_BODIES_KEPT_MAX {
                break;
            }
            if let Some(s) = self.sessions.get_mut(&other) {
                self.bodies -= body_len(&s.reply);
                s.reply = header_only(&s.reply);
            }
        }
        assert!(self.bodies <= REPLY_BODIES_KEPT_MAX);
    }

    /// The table as a checkpoint keeps it: a reply not applied yet is taken as applied
    /// with its header alone (an op below a checkpoint is never applied again, so a
    /// session waiting for it would wait for good). A driver checkpoints once every
    /// Commit action is executed, when there is none.
    pub fn settled(&self) -> ClientTable {
        let mut table = self.clone();
        for session in table.sessions.values_mut() {
            session.applied = true;
        }
        table
    }

    /// The table as bytes for a checkpoint: a count, then per session client, epoch,
    /// request, op (little endian) and the reply frame (its 256-byte sealed header, then
    /// the body the header's size gives). A reply not yet applied is stored as its
    /// header alone and reads back as applied (an op below a checkpoint is never applied
    /// again).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + self.sessions.len() * SESSION_HEAD_LEN + self.bodies);
        out.extend_from_slice(&(self.sessions.len() as u32).to_le_bytes());
        for (client, s) in &self.sessions {
            out.extend_from_slice(&client.to_le_bytes());
            out.extend_from_slice(&s.session.to_le_bytes());
            out.extend_from_slice(&s.request.to_le_bytes());
            out.extend_from_slice(&s.op.to_le_bytes());
            if s.applied {
                out.extend_from_slice(s.reply.as_bytes());
            } else {
                out.extend_from_slice(&s.reply.as_bytes()[..HEADER_SIZE]);
            }
        }
        out
    }

    /// Decodes `encode`'s bytes; every reply must be a Reply frame as built, with a body
    /// of at most `REPLY_BODY_KEPT_MAX` and all of them together within
    /// `REPLY_BODIES_KEPT_MAX`, and the sessions must fit `clients_max`.
    /// (Replies are client frames, which carry no checksum: the file holding the table
    /// must checksum it.)
    pub fn decode(bytes: &[u8], clients_max: usize) -> Result<ClientTable, &'static str> {
        let count = bytes
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or("client table: truncated count")? as usize;
        if count > clients_max {
            return Err("client table: more sessions than clients_max");
        }
        let mut table = ClientTable::new(clients_max);
        let mut rest = &bytes[4..];
        for _ in 0..count {
            let head = rest
                .get(..SESSION_HEAD_LEN)
                .ok_or("client table: truncated session")?;
            let u64_at =
                |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().unwrap_or([0; 8]));
            let client = u128::from_le_bytes(head[..16].try_into().unwrap_or([0; 16]));
            let header = ReplyHeader::read_from_bytes(&head[40..])
                .map_err(|_| "client table: a reply is not a sealed Reply header")?;
            let size = header.frame.size as usize;
            if !(HEADER_SIZE..=HEADER_SIZE + REPLY_BODY_KEPT_MAX).contains(&size) {
                return Err("client table: a reply's size is out of range");
            }
            let reply = rest
                .get(40..40 + size)
                .ok_or("client table: truncated reply")?;
            // The frame as sealed when it was built: rebuilding it must give the same
            // bytes (command, size and both checksums included).
            let rebuilt = Frame::build(&header, &reply[HEADER_SIZE..]);
            if rebuilt.as_bytes() != reply {
                return Err("client table: a reply is not a sealed Reply frame");
            }
            table.bodies += size - HEADER_SIZE;
            if table.bodies > REPLY_BODIES_KEPT_MAX {
                return Err("client table: reply bodies over the bound");
            }
            let session = Session {
                session: u64_at(16),
                request: u64_at(24),
                op: u64_at(32),
                reply: rebuilt,
                applied: true,
            };
            if table.sessions.insert(client, session).is_some() {
                return Err("client table: a client appears twice");
            }
            rest = &rest[40 + size..];
        }
        if !rest.is_empty() {
            return Err("client table: bytes after the last session");
        }
        Ok(table)
    }
}

impl Session {
    fn replied(&self) -> Lookup<'_> {
        if self.applied {
            Lookup::Replied(&self.reply)
        } else {
            Lookup::Applying
        }
    }
}

/// The body bytes of a reply frame.
fn body_len(reply: &Frame) -> usize {
    reply.as_bytes().len() - HEADER_SIZE
}

/// `reply` (a Reply frame, as every kept reply is) with its status and no body.
fn header_only(reply: &Frame) -> Frame {
    let header = ReplyHeader::read_from_bytes(&reply.as_bytes()[..HEADER_SIZE])
        .expect("a 256-byte prefix reads as a ReplyHeader");
    Frame::build(&header, &[])
}

/// Bytes of one encoded session before its reply's body.
const SESSION_HEAD_LEN: usize = 16 + 8 + 8 + 8 + HEADER_SIZE;

const _: () = assert!(REPLY_BODY_KEPT_MAX < REPLY_BODIES_KEPT_MAX);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Header, ReplyHeader};

    fn reply(op: u64) -> Frame {
        let mut header = ReplyHeader::new();
        header.op = op;
        Frame::build(&header, &[])
    }

    /// `reply(op)` with the status and body of the applied op.
    fn applied(op: u64, body: &[u8]) -> Frame {
        let mut header = ReplyHeader::new();
        header.op = op;
        header.status = 7;
        Frame::build(&header, body)
    }

    #[test]
    fn register_mints_the_session_epoch_and_retries_are_answered_from_the_table() {
        let mut table = ClientTable::new(4);
        assert_eq!(table.register(7, 10, reply(10)), None);
        assert_eq!(table.get(7).map(|s| s.session), Some(10));
        assert!(matches!(table.lookup(7, 10, 1), Lookup::Fresh));
        assert!(table.commit(7, 1, 11, reply(11)));
        // Committed, not applied yet: a retry waits for the result.
        assert!(matches!(table.lookup(7, 10, 1), Lookup::Applying));
        assert!(!table.apply(7, 10, applied(10, b"old")), "an earlier op");
        assert!(table.apply(7, 11, applied(11, b"result")));
        assert!(
            matches!(table.lookup(7, 10, 1), Lookup::Replied(r) if r.checksum() == applied(11, b"result").checksum())
        );
        assert!(matches!(table.lookup(7, 10, 0), Lookup::Stale));
        assert!(matches!(table.lookup(7, 9, 2), Lookup::NoSession));
        // A retry of an already committed request is not applied again.
        assert!(!table.commit(7, 1, 12, reply(12)));
        assert!(!table.apply(8, 11, applied(11, b"result")), "no session");
    }

    #[test]
    fn the_table_round_trips_through_its_encoding_and_damage_is_refused() {
        let mut table = ClientTable::new(4);
        table.register(7, 10, reply(10));
        assert!(table.commit(7, 3, 11, reply(11)));
        assert!(table.apply(7, 11, applied(11, b"the result of op 11")));
        table.commit_request(9, 5, 12, reply(12));
        let bytes = table.encode();
        let back = ClientTable::decode(&bytes, 4).expect("decodes");
        assert_eq!(back.len(), 2);
        let s = back.get(7).expect("client 7");
        assert_eq!((s.session, s.request, s.op), (10, 3, 11));
        assert_eq!(
            s.reply.as_bytes(),
            applied(11, b"the result of op 11").as_bytes()
        );
        // One not applied when the table was taken reads back applied, header only.
        assert!(
            matches!(back.lookup_request(9, 5), Lookup::Replied(r) if r.as_bytes() == reply(12).as_bytes())
        );
        assert!(ClientTable::decode(&bytes, 1).is_err(), "over the bound");
        for cut in [1, 5, 300] {
            assert!(ClientTable::decode(&bytes[..bytes.len() - cut], 4).is_err());
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(ClientTable::decode(&trailing, 4).is_err(), "trailing bytes");
        // Client 7 sorts first: its record is the head and the 19-byte body.
        let first = SESSION_HEAD_LEN + 19;
        let mut twice = bytes[..4].to_vec();
        twice.extend_from_slice(&bytes[4..4 + first]);
        twice.extend_from_slice(&bytes[4..4 + first]);
        assert!(ClientTable::decode(&twice, 4).is_err(), "a client twice");
        let mut not_reply = bytes.clone();
        not_reply[4 + 40 + 60] = 9; // the command byte: Commit
        assert!(
            ClientTable::decode(&not_reply, 4).is_err(),
            "not a Reply header"
        );
    }

    #[test]
    fn a_settled_table_answers_a_session_that_waited_for_its_result() {
        let mut table = ClientTable::new(4);
        table.register(7, 10, reply(10));
        assert!(table.apply(7, 10, reply(10)));
        assert!(table.commit(7, 1, 11, reply(11)));
        assert!(matches!(table.lookup(7, 10, 1), Lookup::Applying));
        let settled = table.settled();
        assert!(
            matches!(settled.lookup(7, 10, 1), Lookup::Replied(r) if r.as_bytes() == reply(11).as_bytes())
        );
        // The live table still waits for the result.
        assert!(matches!(table.lookup(7, 10, 1), Lookup::Applying));
    }

    #[test]
    fn a_table_of_header_only_replies_reads_as_before() {
        // Tables written when replies kept no body: fixed-size sessions.
        let mut table = ClientTable::new(4);
        table.register(7, 10, reply(10));
        assert!(table.apply(7, 10, reply(10)));
        table.commit_request(9, 5, 12, reply(12));
        let bytes = table.encode();
        assert_eq!(bytes.len(), 4 + 2 * SESSION_HEAD_LEN);
        let back = ClientTable::decode(&bytes, 4).expect("decodes");
        assert!(back
            .get(7)
            .is_some_and(|s| s.applied && s.reply.as_bytes() == reply(10).as_bytes()));
    }

    #[test]
    fn large_bodies_are_kept_within_the_tables_bound_oldest_given_up_first() {
        let mut table = ClientTable::new(64);
        let body = |i: u8| vec![i; REPLY_BODY_KEPT_MAX];
        let sessions = REPLY_BODIES_KEPT_MAX / REPLY_BODY_KEPT_MAX;
        // Client i commits op 100 + i; all their bodies fit the bound exactly.
        for i in 0..sessions as u8 {
            let (client, op) = (u128::from(i), 100 + u64::from(i));
            table.register(client, op, reply(op));
            assert!(table.apply(client, op, applied(op, &body(i))));
        }
        assert_eq!(table.reply_bodies(), REPLY_BODIES_KEPT_MAX);
        // One more byte anywhere takes the oldest session's body (client 0), not the
        // sealing one's, and not the others'.
        let last = sessions as u128;
        table.register(last, 500, reply(500));
        assert!(table.apply(last, 500, applied(500, b"x")));
        let body_of =
            |table: &ClientTable, client: u128| table.get(client).map(|s| body_len(&s.reply));
        assert_eq!(body_of(&table, 0), Some(0), "the oldest keeps its status");
        assert_eq!(body_of(&table, 1), Some(REPLY_BODY_KEPT_MAX));
        assert_eq!(body_of(&table, last), Some(1));
        assert_eq!(
            table.reply_bodies(),
            REPLY_BODIES_KEPT_MAX - REPLY_BODY_KEPT_MAX + 1
        );
        let status = table
            .get(0)
            .map(|s| ReplyHeader::read_from_prefix(s.reply.as_bytes()));
        assert!(matches!(status, Some(Ok((h, _))) if h.status == 7 && h.op == 100));
        // The bytes round-trip, and a table past the bound is refused.
        let bytes = table.encode();
        let back = ClientTable::decode(&bytes, 64).expect("decodes");
        assert_eq!(back.reply_bodies(), table.reply_bodies());
        let mut over = table.clone();
        over.sessions.get_mut(&0).expect("client 0").reply = applied(100, &body(0));
        assert!(
            ClientTable::decode(&over.encode(), 64).is_err(),
            "over the bound"
        );
        // A body past the per-reply bound is kept as its status; a new request, a
        // logout and an eviction give their bodies' room back.
        assert!(table.commit(last, 1, 501, reply(501)));
        assert!(table.apply(last, 501, applied(501, &vec![1; REPLY_BODY_KEPT_MAX + 1])));
        assert_eq!(body_of(&table, last), Some(0));
        assert!(table.commit(1, 1, 502, reply(502)));
        table.remove(2);
        assert_eq!(
            table.reply_bodies(),
            REPLY_BODIES_KEPT_MAX - 3 * REPLY_BODY_KEPT_MAX
        );
    }

    #[test]
    fn the_oldest_session_is_evicted_past_the_bound() {
        let mut table = ClientTable::new(2);
        assert_eq!(table.register(1, 1, reply(1)), None);
        assert_eq!(table.register(2, 2, reply(2)), None);
        assert!(table.commit(1, 1, 3, reply(3)));
        // Client 2 is now the least recently committed.
        assert_eq!(table.register(3, 4, reply(4)), Some(2));
        assert_eq!(table.len(), 2);
        assert!(matches!(table.lookup(2, 2, 1), Lookup::NoSession));
    }
}
