//! What this node prepared and waits on: personal access tokens until their op commits
//! (the reply carries the token, the replicated op only its hash), and client requests
//! until their op is applied here or discarded. Session forwarding's bookkeeping is
//! `node_core::forward`.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use replication::bus::ClientId;
use replication::wire::RequestHeader;

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

/// Client requests this node prepared as a primary, by group and op, until their op is
/// applied here or discarded by a view change. A request whose op another took, or that
/// a truncation removed, is handed back to be answered Unavailable: its client retries
/// at once (under the same number, so the client table answers it should it have
/// committed after all) instead of waiting out its own timeout.
#[derive(Default)]
pub(super) struct PreparedRequests {
    by_op: BTreeMap<(u64, u64), Prepared>,
}

/// A request prepared here: where its client waits, and the request as it sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Prepared {
    pub connection: ClientId,
    pub header: RequestHeader,
}

impl PreparedRequests {
    pub(super) fn insert(&mut self, group: u64, op: u64, prepared: Prepared) {
        self.by_op.insert((group, op), prepared);
    }

    /// Op `op` of `group` was applied here, carrying `carried` (the client and its own
    /// request number; None for an op of no client): the requests prepared at `op` or
    /// below that it does not answer (ops apply in order, so those below were installed
    /// over by a state transfer).
    pub(super) fn applied(
        &mut self,
        group: u64,
        op: u64,
        carried: Option<(u128, u64)>,
    ) -> Vec<Prepared> {
        self.take((group, 0)..=(group, op), |at, prepared| {
            at != op || carried != Some((prepared.header.client, prepared.header.request))
        })
    }

    /// `group`'s log was truncated above `op_max`: the requests prepared above it.
    pub(super) fn truncated(&mut self, group: u64, op_max: u64) -> Vec<Prepared> {
        if op_max == u64::MAX {
            return Vec::new();
        }
        self.take((group, op_max + 1)..=(group, u64::MAX), |_, _| true)
    }

    /// Forgets the requests of groups `keep` says are gone.
    pub(super) fn retain_groups(&mut self, keep: impl Fn(u64) -> bool) {
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
mod tests {
    use super::*;
    use replication::wire::Header;

    fn prepared(connection: u64, client: u128, request: u64) -> Prepared {
        let mut header = RequestHeader::new();
        header.client = client;
        header.request = request;
        Prepared {
            connection: ClientId(connection),
            header,
        }
    }

    fn clients(list: &[Prepared]) -> Vec<(u128, u64)> {
        list.iter()
            .map(|p| (p.header.client, p.header.request))
            .collect()
    }

    #[test]
    fn an_op_applied_with_its_own_request_hands_nothing_back() {
        let mut requests = PreparedRequests::default();
        requests.insert(7, 5, prepared(1, 0xa, 3));
        assert!(requests.applied(7, 5, Some((0xa, 3))).is_empty());
        // Settled once: a later op finds nothing left of it.
        assert!(requests.applied(7, 6, None).is_empty());
    }

    #[test]
    fn an_op_taken_by_another_request_or_installed_over_hands_the_request_back() {
        let mut requests = PreparedRequests::default();
        requests.insert(7, 5, prepared(1, 0xa, 3));
        requests.insert(7, 6, prepared(2, 0xb, 1));
        requests.insert(7, 9, prepared(3, 0xc, 4));
        requests.insert(8, 5, prepared(4, 0xd, 2));
        // Op 6 carries another client's request; op 5 was never reported (installed over).
        let back = requests.applied(7, 6, Some((0xe, 1)));
        assert_eq!(clients(&back), [(0xa, 3), (0xb, 1)]);
        // The same client with another request number is another request too.
        let back = requests.applied(7, 9, Some((0xc, 5)));
        assert_eq!(clients(&back), [(0xc, 4)]);
        // Other groups are untouched.
        assert_eq!(clients(&requests.applied(8, 5, None)), [(0xd, 2)]);
    }

    #[test]
    fn a_truncation_hands_back_what_was_prepared_above_it_in_that_group() {
        let mut requests = PreparedRequests::default();
        for (op, client) in [(4, 0xa), (5, 0xb), (6, 0xc)] {
            requests.insert(7, op, prepared(1, client, 1));
        }
        requests.insert(8, 6, prepared(2, 0xd, 1));
        assert_eq!(clients(&requests.truncated(7, 4)), [(0xb, 1), (0xc, 1)]);
        assert!(requests.truncated(7, u64::MAX).is_empty());
        assert_eq!(clients(&requests.applied(7, 4, Some((0xa, 1)))), []);
        requests.retain_groups(|group| group != 8);
        assert!(requests.truncated(8, 0).is_empty());
    }
}
