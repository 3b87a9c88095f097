//! Client sessions (the client table): Register mints a session epoch (the op that
//! committed it), request numbers deduplicate retries so a retried request is answered
//! from the table instead of being applied twice, and the oldest session is evicted past
//! a bound. Every replica updates the table on commit, so a new primary has it.

use std::collections::BTreeMap;

use crate::wire::Frame;

/// Sessions kept by default before the oldest is evicted.
pub const CLIENTS_MAX_DEFAULT: usize = 64;

/// One client's session.
#[derive(Clone, Debug)]
pub struct Session {
    /// The session epoch: the op that committed the client's Register.
    pub session: u64,
    /// The highest request number committed for this session.
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
}

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
