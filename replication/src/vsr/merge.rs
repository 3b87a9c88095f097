//! The merge of a view change (docs/protocol.md, "View changes"): from a quorum of
//! DoViewChange messages, the new primary takes the headers of the highest log_view as
//! canonical, truncates what a nack quorum proves never committed, and waits until every
//! kept op above the commit point can be served before it installs the merged log.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

use crate::wire::PrepareHeader;

use super::replica::{Dvc, Replica};
use super::view_change::dvc_window_low;
use super::Action;

impl Replica {
    pub(super) fn try_merge(&mut self) {
        if self.merged || self.dvcs.len() < self.config.quorum_view_change() {
            return;
        }
        if !self.dvcs.contains_key(&self.config.replica) {
            return;
        }
        let log_view = self.dvcs.values().map(|d| d.log_view).max().unwrap_or(0);
        let Some((mut canonical, op_canonical)) = self.canonical_headers(log_view) else {
            // Two replicas normal in one view disagree: not a state VSR allows.
            self.counters.frames_rejected += 1;
            return;
        };
        self.name_parents(&mut canonical);
        // A prepare's commit field was its primary's commit point: committed for good.
        // It also bounds the new pipeline, since a primary prepares op k only while
        // k - commit <= pipeline_max.
        let commit_max = self
            .dvcs
            .values()
            .map(|d| d.commit)
            .chain(canonical.values().map(|h| h.commit))
            .max()
            .unwrap_or(0)
            .max(self.commit_max.min(op_canonical));
        let op_new = self.merged_head(&canonical, commit_max, op_canonical, log_view);
        // The new head's header must be known (identities below follow by the chain),
        // and every kept uncommitted op must be servable by someone (or ourselves); else
        // wait for more DVCs.
        if op_new > self.log.op_checkpoint && !canonical.contains_key(&op_new) {
            return;
        }
        if !self.kept_ops_servable(&canonical, commit_max, op_new) {
            return;
        }
        self.install_merge(&canonical, commit_max, op_new);
    }

    /// The headers of the DVCs of the newest `log_view`, and the highest op among those
    /// DVCs; None when two of them name different prepares at one op.
    fn canonical_headers(&self, log_view: u32) -> Option<(BTreeMap<u64, PrepareHeader>, u64)> {
        let mut canonical: BTreeMap<u64, PrepareHeader> = BTreeMap::new();
        let mut op_canonical = 0;
        for dvc in self.dvcs.values().filter(|d| d.log_view == log_view) {
            op_canonical = op_canonical.max(dvc.op);
            for header in &dvc.headers {
                if let Some(other) = canonical.get(&header.op) {
                    if other.frame.checksum != header.frame.checksum {
                        return None;
                    }
                }
                canonical.insert(header.op, *header);
            }
        }
        Some((canonical, op_canonical))
    }

    /// Below a canonical header, the op its parent names is canonical too, whichever DVC
    /// holds its header: a replica of the newest log view may know an op only by
    /// identity (restarted from a checkpoint below it, say) while an older-view DVC holds
    /// that very prepare. Counting the older DVC as a nack there would truncate an op
    /// that may have committed.
    fn name_parents(&self, canonical: &mut BTreeMap<u64, PrepareHeader>) {
        let mut below = canonical.keys().next_back().copied();
        while let Some(op) = below.filter(|op| *op > 1) {
            let parent = canonical[&op].parent;
            let named = match canonical.entry(op - 1) {
                Entry::Occupied(_) => true,
                Entry::Vacant(vacant) => self
                    .dvcs
                    .values()
                    .flat_map(|d| d.headers.iter())
                    .find(|h| h.op == op - 1 && h.frame.checksum == parent)
                    .map(|header| vacant.insert(*header))
                    .is_some(),
            };
            // Past a gap, go on from the next canonical header below it.
            below = if named {
                Some(op - 1)
            } else {
                canonical.range(..op - 1).next_back().map(|(o, _)| *o)
            };
        }
    }

    /// The merged log's head. Truncation: an op nacked by enough replicas cannot have
    /// reached a replication quorum, so it and everything after it was never committed.
    fn merged_head(
        &self,
        canonical: &BTreeMap<u64, PrepareHeader>,
        commit_max: u64,
        op_canonical: u64,
        log_view: u32,
    ) -> u64 {
        for op in commit_max + 1..=op_canonical {
            let header = canonical.get(&op);
            let nacks = self
                .dvcs
                .values()
                .filter(|d| nacks_op(d, op, header, log_view))
                .count();
            if nacks >= self.config.quorum_nack() {
                return op - 1;
            }
        }
        op_canonical.max(commit_max)
    }

    /// Whether every kept op above `commit_max` up to `op_new` can be served: held here
    /// or presented by a peer's DVC.
    fn kept_ops_servable(
        &self,
        canonical: &BTreeMap<u64, PrepareHeader>,
        commit_max: u64,
        op_new: u64,
    ) -> bool {
        let own = self.config.replica;
        for op in commit_max + 1..=op_new {
            let Some(header) = canonical.get(&op) else {
                // No DVC has this op's header, so none presents its body. Merged around
                // the hole, the view starts only if a peer's unverified copy turns up,
                // and its superblock suffix ends at the hole: restarted, the merged log
                // could vouch for nothing. While DVCs are missing, wait for them: they
                // bring the header or nack the op away.
                if self.dvcs.len() < usize::from(self.config.replica_count) {
                    return false;
                }
                continue;
            };
            let held_here = self.log.slot(op).is_some_and(|s| {
                s.frame
                    .as_ref()
                    .is_some_and(|f| f.checksum() == header.frame.checksum)
            });
            let held_elsewhere = self
                .dvcs
                .iter()
                .any(|(r, d)| *r != own && presents_op(d, header));
            if !held_here && !held_elsewhere {
                return false;
            }
        }
        true
    }

    /// Installs the merged log (canonical headers up to `op_new`) as the new view's,
    /// persists it and starts repairing what it lacks.
    fn install_merge(
        &mut self,
        canonical: &BTreeMap<u64, PrepareHeader>,
        commit_max: u64,
        op_new: u64,
    ) {
        self.merged = true;
        self.merge_commit = commit_max;
        self.commit_max = self.commit_max.max(commit_max);
        self.log.truncate_above(op_new.max(self.commit));
        for header in canonical.range(..=op_new).map(|(_, h)| h) {
            if header.op > self.log.op_checkpoint {
                self.log.set_canonical(header);
            }
        }
        self.log.op = op_new;
        self.log.chain_floor = op_new;
        self.walk_chain();
        // Below the chain, above our commit, a header no canonical DVC gave is one of our
        // own from an older log view: the merged view does not vouch for it.
        for op in self.commit.max(self.log.op_checkpoint) + 1..self.log.chain_floor {
            if !canonical.contains_key(&op) {
                self.log.forget_identity(op);
            }
        }
        self.rebuild_positions();
        // The merged log is the new view's canonical log from here on, whether or not
        // the view starts: a DVC of a later view must say so, or it would present these
        // headers under the older log_view, where a replica normal in that view may hold
        // other prepares at the same ops, and no merge could decide between them.
        self.log_view = self.view;
        self.persist_superblock();
        // What the merge cut off goes from the journal too, as a StartView's receiver
        // drops it: a forming primary that crashed before its view started would
        // otherwise read an older view's prepare above the merged log back at restart,
        // claim that op as possibly acknowledged, and no merge without it could end.
        self.actions.push_back(Action::JournalTruncate {
            op_max: self.log.op,
        });
        self.on_repair_timeout();
        self.forming_try_start_view();
    }
}

/// Whether a DVC proves its sender is in no replication quorum that could have committed
/// the op `op` whose canonical header is `header` (if any replica of the quorum knows it).
/// A replica that acknowledged a committed prepare keeps it at its op for good (journal
/// entries are durable, an unreadable one still counts as held, and no later view
/// truncates a committed op), so it nacks when:
/// - it holds that header but never prepared it (nack bit);
/// - it holds a different header there (a later view replaced it: never committed then);
/// - its log (unreadable entries included) ends below the op;
/// - the op lies in its DVC window but not in its body (the sender vouched for that).
///
/// An op no DVC of the canonical log_view has a header for was prepared in that view
/// (a replica normal in it knows every older op's header from its StartView, unreadable
/// or not), and only replicas normal in a view acknowledge its prepares: a DVC from an
/// older log_view nacks it.
pub(super) fn nacks_op(dvc: &Dvc, op: u64, header: Option<&PrepareHeader>, log_view: u32) -> bool {
    if op > dvc.op || (header.is_none() && dvc.log_view < log_view) {
        return true;
    }
    if let Some(i) = dvc.headers.iter().position(|h| h.op == op) {
        return match header {
            Some(header) if dvc.headers[i].frame.checksum == header.frame.checksum => {
                dvc.nack & (1 << i) != 0
            }
            Some(_) => true,
            None => false,
        };
    }
    let Some(top) = dvc.headers.first().map(|h| h.op) else {
        return false;
    };
    op <= top && op > dvc_window_low(dvc.commit, top)
}

/// Whether a DVC's sender can serve `header`'s body.
pub(super) fn presents_op(dvc: &Dvc, header: &PrepareHeader) -> bool {
    dvc.headers
        .iter()
        .position(|h| h.op == header.op && h.frame.checksum == header.frame.checksum)
        .is_some_and(|i| dvc.present & (1 << i) != 0)
}
