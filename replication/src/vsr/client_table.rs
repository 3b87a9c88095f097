//! Client sessions (the client table): Register mints a session epoch (the op that
//! committed it), request numbers deduplicate retries so a retried request is answered
//! from the table instead of being applied twice, and the oldest session is evicted past
//! a bound. Every replica updates the table on commit, so a new primary has it.

use std::collections::BTreeMap;

use zerocopy::FromBytes;

use crate::wire::{Frame, ReplyHeader, HEADER_SIZE};

/// Sessions kept by default before the oldest is evicted.
pub const CLIENTS_MAX_DEFAULT: usize = 64;

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
}

/// What the table says about an incoming request.
#[derive(Clone, Debug)]
pub enum Lookup<'a> {
    /// New request: prepare it.
    Fresh,
    /// Already committed: resend this reply.
    Replied(&'a Frame),
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
}

impl ClientTable {
    /// An empty table bounded to `clients_max` sessions.
    pub fn new(clients_max: usize) -> ClientTable {
        assert!(clients_max > 0);
        ClientTable {
            sessions: BTreeMap::new(),
            clients_max,
        }
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
                    Lookup::Replied(&s.reply)
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
            Some(s) if request == s.request => Lookup::Replied(&s.reply),
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
                self.sessions.remove(&oldest);
                evicted = Some(oldest);
            }
        }
        self.sessions.insert(
            client,
            Session {
                session: op,
                request: 0,
                op,
                reply,
            },
        );
        assert!(self.sessions.len() <= self.clients_max);
        evicted
    }

    /// Records a committed request; false when the session is gone or the request is not
    /// newer (the op is still committed, the table just does not cache it).
    pub fn commit(&mut self, client: u128, request: u64, op: u64, reply: Frame) -> bool {
        match self.sessions.get_mut(&client) {
            Some(s) if request > s.request => {
                s.request = request;
                s.op = op;
                s.reply = reply;
                true
            }
            _ => false,
        }
    }

    /// Ends a session (Logout).
    pub fn remove(&mut self, client: u128) {
        self.sessions.remove(&client);
    }

    /// The table as bytes for a checkpoint: a count, then per session client, epoch,
    /// request, op (little endian) and the 256-byte sealed reply header.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + self.sessions.len() * SESSION_ENCODED_LEN);
        out.extend_from_slice(&(self.sessions.len() as u32).to_le_bytes());
        for (client, s) in &self.sessions {
            out.extend_from_slice(&client.to_le_bytes());
            out.extend_from_slice(&s.session.to_le_bytes());
            out.extend_from_slice(&s.request.to_le_bytes());
            out.extend_from_slice(&s.op.to_le_bytes());
            out.extend_from_slice(&s.reply.as_bytes()[..HEADER_SIZE]);
        }
        out
    }

    /// Decodes `encode`'s bytes; every reply must be a Reply header as built and the
    /// sessions must fit `clients_max`. (Replies are client frames, which carry no
    /// checksum: the file holding the table must checksum it.)
    pub fn decode(bytes: &[u8], clients_max: usize) -> Result<ClientTable, &'static str> {
        let count = bytes
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or("client table: truncated count")? as usize;
        if count > clients_max {
            return Err("client table: more sessions than clients_max");
        }
        if bytes.len() != 4 + count * SESSION_ENCODED_LEN {
            return Err("client table: length does not match the session count");
        }
        let mut table = ClientTable::new(clients_max);
        for record in bytes[4..].chunks_exact(SESSION_ENCODED_LEN) {
            let u64_at =
                |at: usize| u64::from_le_bytes(record[at..at + 8].try_into().unwrap_or([0; 8]));
            let client = u128::from_le_bytes(record[..16].try_into().unwrap_or([0; 16]));
            let reply = &record[40..];
            // The header as sealed when it was built: rebuilding it must give the same
            // bytes (command, size and both checksums included).
            let rebuilt = ReplyHeader::read_from_bytes(reply)
                .ok()
                .map(|header| Frame::build(&header, &[]))
                .filter(|frame| frame.as_bytes() == reply);
            let Some(reply) = rebuilt else {
                return Err("client table: a reply is not a sealed Reply header");
            };
            table.sessions.insert(
                client,
                Session {
                    session: u64_at(16),
                    request: u64_at(24),
                    op: u64_at(32),
                    reply,
                },
            );
        }
        if table.sessions.len() != count {
            return Err("client table: a client appears twice");
        }
        Ok(table)
    }
}

/// Bytes of one encoded session.
const SESSION_ENCODED_LEN: usize = 16 + 8 + 8 + 8 + HEADER_SIZE;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Header, ReplyHeader};

    fn reply(op: u64) -> Frame {
        let mut header = ReplyHeader::new();
        header.op = op;
        Frame::build(&header, &[])
    }

    #[test]
    fn register_mints_the_session_epoch_and_retries_are_answered_from_the_table() {
        let mut table = ClientTable::new(4);
        assert_eq!(table.register(7, 10, reply(10)), None);
        assert_eq!(table.get(7).map(|s| s.session), Some(10));
        assert!(matches!(table.lookup(7, 10, 1), Lookup::Fresh));
        assert!(table.commit(7, 1, 11, reply(11)));
        assert!(
            matches!(table.lookup(7, 10, 1), Lookup::Replied(r) if r.checksum() == reply(11).checksum())
        );
        assert!(matches!(table.lookup(7, 10, 0), Lookup::Stale));
        assert!(matches!(table.lookup(7, 9, 2), Lookup::NoSession));
        // A retry of an already committed request is not applied again.
        assert!(!table.commit(7, 1, 12, reply(12)));
    }

    #[test]
    fn the_table_round_trips_through_its_encoding_and_damage_is_refused() {
        let mut table = ClientTable::new(4);
        table.register(7, 10, reply(10));
        assert!(table.commit(7, 3, 11, reply(11)));
        table.commit_request(9, 5, 12, reply(12));
        let bytes = table.encode();
        let back = ClientTable::decode(&bytes, 4).expect("decodes");
        assert_eq!(back.len(), 2);
        let s = back.get(7).expect("client 7");
        assert_eq!((s.session, s.request, s.op), (10, 3, 11));
        assert_eq!(s.reply.checksum(), reply(11).checksum());
        assert!(matches!(back.lookup_request(9, 5), Lookup::Replied(_)));
        assert!(ClientTable::decode(&bytes, 1).is_err(), "over the bound");
        assert!(ClientTable::decode(&bytes[..bytes.len() - 1], 4).is_err());
        let mut twice = bytes.clone();
        twice.copy_within(4..4 + SESSION_ENCODED_LEN, 4 + SESSION_ENCODED_LEN);
        assert!(ClientTable::decode(&twice, 4).is_err(), "a client twice");
        let mut not_reply = bytes.clone();
        not_reply[4 + 40 + 60] = 9; // the command byte: Commit
        assert!(
            ClientTable::decode(&not_reply, 4).is_err(),
            "not a Reply header"
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
