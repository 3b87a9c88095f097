//! What the node owes clients across events: requests a backup forwarded to the
//! metadata primary (session forwarding, forward.rs), clients whose forwarded request
//! this primary prepared, and personal access tokens prepared here until their op
//! commits (the reply carries the token, the replicated op only its hash).

use std::time::Instant;

use replication::bus::ClientId;
use replication::wire::RequestHeader;

/// A request this backup forwarded and still owes its client an answer for.
pub(super) struct PendingForward {
    pub connection: ClientId,
    pub request: RequestHeader,
    pub sent: Instant,
    /// The primary's Ok, waiting for this node's commit to reach `watermark`.
    pub ok: Option<(u64, u64)>,
}

/// A client whose Register or Logout this primary prepared for a backup.
#[derive(Clone, Copy)]
pub(super) struct Forwarded {
    pub backup: u8,
    pub nonce: u128,
    pub logout: bool,
    pub at: Instant,
}

/// Tokens prepared here whose ops have not committed yet, oldest dropped past a bound
/// (an op lost to a view change never commits).
#[derive(Default)]
pub(super) struct PendingTokens {
    tokens: std::collections::HashMap<String, String>,
    order: std::collections::VecDeque<String>,
}

impl PendingTokens {
    const MAX: usize = 1024;

    pub(super) fn insert(&mut self, hash: String, token: String) {
        if self.order.len() >= Self::MAX {
            if let Some(oldest) = self.order.pop_front() {
                self.tokens.remove(&oldest);
            }
        }
        self.order.push_back(hash.clone());
        self.tokens.insert(hash, token);
    }

    pub(super) fn take(&mut self, hash: &str) -> Option<String> {
        let token = self.tokens.remove(hash)?;
        self.order.retain(|h| h != hash);
        Some(token)
    }
}
