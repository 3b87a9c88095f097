//! What this node prepared and waits on: personal access tokens until their op commits
//! (the reply carries the token, the replicated op only its hash), and client requests
//! until their op is applied here or discarded. Session forwarding's bookkeeping is
//! `forward`.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use replication::bus::ClientId;
use replication::wire::RequestHeader;

/// Tokens prepared here whose ops have not committed yet, oldest dropped past a bound
/// (an op lost to a view change never commits).
#[derive(Default)]
pub struct PendingTokens {
    tokens: std::collections::HashMap<String, String>,
    order: std::collections::VecDeque<String>,
}

impl PendingTokens {
    const MAX: usize = 1024;

    pub fn insert(&mut self, hash: String, token: String) {
        if self.order.len() >= Self::MAX {
            if let Some(oldest) = self.order.pop_front() {
                self.tokens.remove(&oldest);
            }
        }
        self.order.push_back(hash.clone());
        self.tokens.insert(hash, token);
    }

    pub fn take(&mut self, hash: &str) -> Option<String> {
        let token = self.tokens.remove(hash)?;
        self.order.retain(|h| h != hash);
        Some(token)
    }
}

/// Client requests this node prepared as a primary, by group and op, until their op is
/// applied here or discarded by a view change. A request whose op another took, or that
/// a truncation removed, is handed back to be answered Unavailable: its client retries
/// at once (under the same number, so the client table answers it should it have
/// committed after all) instead of waiting out its own timeout.
#[derive(Default)]
pub struct PreparedRequests {
    by_op: BTreeMap<(u64, u64), Prepared>,
}

/// A request prepared here: where its client waits, and the request as it sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prepared {
    pub connection: ClientId,
    pub header: RequestHeader,
}

impl PreparedRequests {
    pub fn insert(&mut self, group: u64, op: u64, prepared: Prepared) {
        self.by_op.insert((group, op), prepared);
    }

    /// Op `op` of `group` was applied here, carrying `carried` (the client and its own
    /// request number; None for an op of no client): the requests prepared at `op` or
    /// below that it does not answer (ops apply in order, so those below were installed
    /// over by a state transfer).
    pub fn applied(&mut self, group: u64, op: u64, carried: Option<(u128, u64)>) -> Vec<Prepared> {
        self.take((group, 0)..=(group, op), |at, prepared| {
            at != op || carried != Some((prepared.header.client, prepared.header.request))
        })
    }

    /// `group`'s log was truncated above `op_max`: the requests prepared above it.
    pub fn truncated(&mut self, group: u64, op_max: u64) -> Vec<Prepared> {
        if op_max == u64::MAX {
            return Vec::new();
        }
        self.take((group, op_max + 1)..=(group, u64::MAX), |_, _| true)
    }

    /// Forgets the requests of groups `keep` says are gone.
    pub fn retain_groups(&mut self, keep: impl Fn(u64) -> bool) {
        self.by_op.retain(|(group, _), _| keep(*group));
    }

    /// Removes the requests in `range` and hands back those `back(op, request)` picks
    /// (nothing is allocated when it picks none: the primary's every applied op).
    fn take(
        &mut self,
        range: RangeInclusive<(u64, u64)>,
        mut back: impl FnMut(u64, &Prepared) -> bool,
    ) -> Vec<Prepared> {
        let mut handed = Vec::new();
        while let Some((&key, _)) = self.by_op.range(range.clone()).next() {
            if let Some(prepared) = self.by_op.remove(&key) {
                if back(key.1, &prepared) {
                    handed.push(prepared);
                }
            }
        }
        handed
    }
}

#[cfg(test)]
mod tests;
