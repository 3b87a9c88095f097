//! Session forwarding's bookkeeping (docs/protocol.md, "Session forwarding"), as values:
//! what a backup owes the clients whose Register or Logout it forwarded to the metadata
//! primary, and which clients the primary prepared for a backup. The daemon sends and
//! receives the frames and answers the clients; these values decide who is answered
//! what, and when.
//!
//! A backup answers Ok only once its own metadata commit reaches the result's
//! watermark (the session it hands out is then in its own client table); a request
//! unanswered for `FORWARD_TIMEOUT` is answered Unavailable and the client retries.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use replication::vsr::RequestOutcome;
use replication::wire::RequestHeader;

use crate::protocol::Status;

/// Forwarded requests a backup waits on at once; more are answered Unavailable.
pub const FORWARDS_MAX: usize = 4096;
/// A forwarded request unanswered for this long is answered Unavailable (the client
/// retries with the same request).
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

/// The outcome of a forwarded Register or Logout, as its result frame carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    NotPrimary,
    /// Register only; reserved (never sent).
    NotCaughtUp,
    PipelineFull,
    /// In the primary's pipeline: the result follows.
    InProgress,
    Canceled,
    /// Register only.
    ClientIdOwnedByAnotherUser,
}

impl Outcome {
    /// The outcome byte of a ForwardRegisterResult (or, `logout`, ForwardLogoutResult).
    pub fn code(self, logout: bool) -> u8 {
        match (self, logout) {
            (Outcome::Ok, _) => 0,
            (Outcome::NotPrimary, _) => 1,
            (Outcome::NotCaughtUp, false) => 2,
            (Outcome::PipelineFull, false) => 3,
            (Outcome::InProgress, false) => 4,
            (Outcome::Canceled, false) => 5,
            (Outcome::ClientIdOwnedByAnotherUser, false) => 6,
            (Outcome::PipelineFull, true) => 2,
            (Outcome::InProgress, true) => 3,
            // A logout has no register-only outcome: it was canceled.
            (
                Outcome::Canceled | Outcome::NotCaughtUp | Outcome::ClientIdOwnedByAnotherUser,
                true,
            ) => 4,
        }
    }

    /// The outcome an outcome byte names; None for a byte out of range.
    pub fn decode(code: u8, logout: bool) -> Option<Outcome> {
        let outcome = match (code, logout) {
            (0, _) => Outcome::Ok,
            (1, _) => Outcome::NotPrimary,
            (2, false) => Outcome::NotCaughtUp,
            (3, false) => Outcome::PipelineFull,
            (4, false) => Outcome::InProgress,
            (5, false) => Outcome::Canceled,
            (6, false) => Outcome::ClientIdOwnedByAnotherUser,
            (2, true) => Outcome::PipelineFull,
            (3, true) => Outcome::InProgress,
            (4, true) => Outcome::Canceled,
            _ => return None,
        };
        Some(outcome)
    }

    /// Primary: what a backup is told when its forwarded request met `outcome` here;
    /// None when the result follows the commit (prepared, in progress, or replied from
    /// the client table).
    pub fn of_request(outcome: &RequestOutcome) -> Option<Outcome> {
        match outcome {
            RequestOutcome::Prepared { .. }
            | RequestOutcome::Replied
            | RequestOutcome::InProgress => None,
            RequestOutcome::NotPrimary { .. } => Some(Outcome::NotPrimary),
            RequestOutcome::PipelineFull => Some(Outcome::PipelineFull),
            RequestOutcome::Stale | RequestOutcome::Evicted | RequestOutcome::Rejected => {
                Some(Outcome::Canceled)
            }
        }
    }
}

/// A request a backup forwarded and still owes its client an answer for.
#[derive(Clone, Debug)]
pub struct Pending<C> {
    pub connection: C,
    pub request: RequestHeader,
    sent: Instant,
    /// The primary's Ok: (epoch, watermark), waiting for this node's commit.
    ok: Option<(u64, u64)>,
}

/// How a backup answers a forwarded request's client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Ok; a Register's session epoch is `epoch`.
    Ok { epoch: u64 },
    /// Refused or unanswered: the client retries.
    Refused(Status),
}

/// What a result frame from the primary does.
#[derive(Debug)]
pub enum OnResult<C> {
    /// No request waits under this nonce (answered already, timed out, or never sent).
    Unknown,
    /// The result follows (in progress), or the Ok waits for this node's commit.
    Waiting,
    /// Answer the client now.
    Answer(Box<Pending<C>>, Answer),
}

/// Backup: the forwarded requests, by nonce.
#[derive(Debug)]
pub struct Forwards<C> {
    pending: HashMap<u128, Pending<C>>,
    /// Nonces are this base xor a counter: unique per replica of a cluster.
    nonce_base: u128,
    sent: u64,
}

impl<C> Forwards<C> {
    pub fn new(cluster: u128, replica: u8) -> Forwards<C> {
        Forwards {
            pending: HashMap::new(),
            nonce_base: (u128::from(replica) << 120) ^ (u128::from(cluster as u64) << 64),
            sent: 0,
        }
    }

    /// A request to forward: its nonce, or None when the table is full (answer
    /// Unavailable).
    pub fn begin(&mut self, connection: C, request: RequestHeader, now: Instant) -> Option<u128> {
        if self.pending.len() >= FORWARDS_MAX {
            return None;
        }
        self.sent += 1;
        let nonce = self.nonce_base ^ u128::from(self.sent);
        let pending = Pending {
            connection,
            request,
            sent: now,
            ok: None,
        };
        self.pending.insert(nonce, pending);
        Some(nonce)
    }

    /// The forward could not be sent: the request is handed back to answer.
    pub fn cancel(&mut self, nonce: u128) -> Option<Pending<C>> {
        self.pending.remove(&nonce)
    }

    /// The primary's result for `nonce` (`code`, the outcome byte) arrived; `commit` is
    /// this node's metadata commit.
    pub fn on_result(
        &mut self,
        nonce: u128,
        code: u8,
        logout: bool,
        epoch: u64,
        watermark: u64,
        commit: u64,
    ) -> OnResult<C> {
        let Some(pending) = self.pending.get_mut(&nonce) else {
            return OnResult::Unknown;
        };
        let status = match Outcome::decode(code, logout) {
            Some(Outcome::Ok) if watermark <= commit => {
                let pending = self.pending.remove(&nonce).expect("held");
                return OnResult::Answer(Box::new(pending), Answer::Ok { epoch });
            }
            Some(Outcome::Ok) => {
                pending.ok = Some((epoch, watermark));
                return OnResult::Waiting;
            }
            Some(Outcome::InProgress) => return OnResult::Waiting,
            Some(Outcome::PipelineFull) => Status::PipelineFull,
            _ => Status::Unavailable,
        };
        let pending = self.pending.remove(&nonce).expect("held");
        OnResult::Answer(Box::new(pending), Answer::Refused(status))
    }

    /// The requests to answer now: those whose Ok's watermark this node's `commit` has
    /// reached, and those unanswered past the timeout.
    pub fn release(&mut self, commit: u64, now: Instant) -> Vec<(Pending<C>, Answer)> {
        let ready: Vec<u128> = self
            .pending
            .iter()
            .filter(|(_, p)| {
                p.ok.is_some_and(|(_, watermark)| watermark <= commit)
                    || now.saturating_duration_since(p.sent) >= FORWARD_TIMEOUT
            })
            .map(|(nonce, _)| *nonce)
            .collect();
        let mut answers = Vec::with_capacity(ready.len());
        for nonce in ready {
            let Some(pending) = self.pending.remove(&nonce) else {
                continue;
            };
            let answer = match pending.ok {
                Some((epoch, watermark)) if watermark <= commit => Answer::Ok { epoch },
                _ => Answer::Refused(Status::Unavailable),
            };
            answers.push((pending, answer));
        }
        answers
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

/// Primary: a client whose forwarded Register or Logout is prepared here for a backup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forwarded {
    pub backup: u8,
    pub nonce: u128,
    pub logout: bool,
    at: Instant,
}

/// Primary: the clients prepared for a backup, by client id.
#[derive(Debug, Default)]
pub struct ForwardedClients {
    by_client: HashMap<u128, Forwarded>,
}

impl ForwardedClients {
    /// `client`'s request, from `backup` under `nonce`, is about to be prepared (before
    /// the request: a cached reply is queued as an action right away).
    pub fn insert(&mut self, client: u128, backup: u8, nonce: u128, logout: bool, now: Instant) {
        let forwarded = Forwarded {
            backup,
            nonce,
            logout,
            at: now,
        };
        self.by_client.insert(client, forwarded);
    }

    /// The backup `client`'s reply goes to, if it was forwarded (forgotten then).
    pub fn take(&mut self, client: u128) -> Option<Forwarded> {
        self.by_client.remove(&client)
    }

    /// Forgets clients whose op will not commit (a view change discarded it); their
    /// backup has answered its client Unavailable by then.
    pub fn expire(&mut self, now: Instant) {
        self.by_client
            .retain(|_, f| now.saturating_duration_since(f.at) < FORWARD_TIMEOUT * 2);
    }

    pub fn is_empty(&self) -> bool {
        self.by_client.is_empty()
    }
}

#[cfg(test)]
mod tests;
