//! View change (docs/protocol.md, "View changes"): StartViewChange on heartbeat
//! timeout, DoViewChange to the new primary once a quorum suspects the old one, the
//! merge of a DVC quorum (`merge`: highest log_view canonical, truncation by nack
//! quorum, repair of suffix bodies from peers that hold them) and StartView.

use crate::wire::{
    DoViewChangeHeader, Frame, Header, PrepareHeader, RequestStartViewHeader,
    StartViewChangeHeader, StartViewHeader,
};

use super::replica::{Dvc, Replica, Status};
use super::{headers_body, Action, SUFFIX_MAX};

/// RequestStartView probes a restarted replica sends before it joins a view change itself.
pub const PROBE_ATTEMPTS_MAX: u32 = 4;

/// A DVC whose op runs further than this past its commit is refused: the merge examines
/// every op of that span, so it is bounded (a real one spans at most the pipeline plus
/// the unreadable entries above a log).
pub const DVC_SPAN_MAX: u64 = 4 * SUFFIX_MAX as u64;

const _: () = assert!(DVC_SPAN_MAX >= 2 * (super::PIPELINE_MAX + SUFFIX_MAX as u64));

impl Replica {
    /// Moves to view `view` in ViewChange status and broadcasts StartViewChange.
    pub(crate) fn start_view_change(&mut self, view: u32) {
        assert!(view > self.view || self.status != super::Status::ViewChange);
        let was_changing = self.status == Status::ViewChange;
        self.view = view;
        self.status = Status::ViewChange;
        self.svc_from = 1 << self.config.replica;
        self.dvcs.clear();
        self.dvc_sent = false;
        self.merged = false;
        self.merge_commit = 0;
        self.pipeline.clear();
        self.heartbeat_seen = 0;
        self.counters.view_changes += 1;
        self.persist_superblock();
        self.broadcast_start_view_change();
        let now = self.now;
        self.timeout_heartbeat.stop();
        self.timeout_commit_broadcast.stop();
        self.timeout_prepare_retransmit.stop();
        self.timeout_probe.stop();
        self.timeout_view_change_retransmit
            .start(now, &mut self.prng);
        if !was_changing {
            self.timeout_view_change.start(now, &mut self.prng);
        }
        self.timeout_repair.start(now, &mut self.prng);
        self.maybe_send_do_view_change();
    }

    /// Writes view, log_view and the log_view's suffix headers (TigerBeetle keeps these
    /// "view headers" in its superblock too) before acting in the view.
    pub(crate) fn persist_superblock(&mut self) {
        if self.superblock.log_view != self.log_view {
            self.superblock.headers = self.log.suffix(SUFFIX_MAX);
        }
        self.superblock.view = self.view;
        self.superblock.log_view = self.log_view;
        // A forming primary that starts its view right after the merge persists what
        // the merge did: one write, not two.
        if self.superblock_issued.as_ref() == Some(&self.superblock) {
            return;
        }
        self.superblock_issued = Some(self.superblock.clone());
        self.actions
            .push_back(Action::PersistSuperblock(self.superblock.clone()));
    }

    fn broadcast_start_view_change(&mut self) {
        let mut header = StartViewChangeHeader::new();
        header.frame.cluster = self.config.cluster;
        header.frame.view = self.view;
        header.frame.replica = self.config.replica;
        header.group = self.config.group;
        let frame = Frame::build(&header, &[]);
        self.actions.push_back(Action::Broadcast { frame });
    }

    pub(crate) fn on_start_view_change(&mut self, header: &StartViewChangeHeader) {
        let view = header.frame.view;
        if view > self.view {
            self.start_view_change(view);
        }
        if view == self.view && self.status == Status::ViewChange {
            self.svc_from |= 1 << header.frame.replica;
            self.maybe_send_do_view_change();
        }
    }

    /// The commit point a DVC reports, the top op of its body and the low end of the
    /// window below it.
    /// Every op of the window (low, top] that the body leaves out is claimed never
    /// prepared, so the window ends below the lowest op we cannot vouch for
    /// (`dvc_unvouched`): that op and the ones above it are left unclaimed, neither
    /// nacked nor offered.
    fn dvc_bounds(&self) -> (u64, u64, u64) {
        let (commit, mut top, mut low) = self.dvc_full_bounds();
        while let Some(op) = self.unvouched_in(low, top).next() {
            top = self.top_below(op);
            low = dvc_window_low(self.dvc_floor(), top);
        }
        (commit, top, low)
    }

    /// The window a DVC would cover if every op of it could be vouched for.
    fn dvc_full_bounds(&self) -> (u64, u64, u64) {
        let commit = self.dvc_commit();
        let top = self.top_below(self.log.op + 1);
        (commit, top, dvc_window_low(self.dvc_floor(), top))
    }

    fn dvc_commit(&self) -> u64 {
        self.commit_max.min(self.log.op).max(self.commit)
    }

    fn dvc_floor(&self) -> u64 {
        self.dvc_commit().max(self.log.op_checkpoint)
    }

    /// The highest op below `op` (and at most `SUFFIX_MAX` below the log's head) whose
    /// header we know, or the floor of the window.
    fn top_below(&self, op: u64) -> u64 {
        let floor = self.dvc_floor();
        (floor + 1..op.min(self.log.op + 1))
            .rev()
            .take(SUFFIX_MAX)
            .find(|op| self.log.header(*op).is_some())
            .unwrap_or(floor)
    }

    /// Ops of the window (low, top], lowest first, without a header that we may have
    /// prepared (an unreadable entry, or a body held unverified).
    fn unvouched_in(&self, low: u64, top: u64) -> impl Iterator<Item = u64> + '_ {
        (low + 1..=top).filter(|op| {
            self.log.header(*op).is_none()
                && self
                    .log
                    .slot(*op)
                    .is_some_and(|slot| slot.prepared || slot.frame.is_some())
        })
    }

    /// This replica's DVC: the headers it knows in its window, highest op first, with
    /// nack (never prepared) and present (body held) bits.
    pub(crate) fn own_do_view_change(&self) -> Dvc {
        let (commit, top, _) = self.dvc_bounds();
        // Below the window (committed ops) headers are sent too, so the new primary
        // learns the canonical identity of every op it must hold.
        let bottom = top
            .saturating_sub(SUFFIX_MAX as u64)
            .max(self.log.op_checkpoint);
        let headers: Vec<PrepareHeader> = (bottom + 1..=top)
            .rev()
            .filter_map(|op| self.log.header(op).copied())
            .collect();
        assert!(headers.len() <= SUFFIX_MAX);
        let mut nack = 0u128;
        let mut present = 0u128;
        for (i, header) in headers.iter().enumerate() {
            let slot = self.log.slot(header.op).expect("suffix slot");
            if !slot.prepared {
                nack |= 1 << i;
            }
            if slot.durable
                && slot
                    .frame
                    .as_ref()
                    .is_some_and(|f| f.checksum() == header.frame.checksum)
            {
                present |= 1 << i;
            }
        }
        Dvc {
            log_view: self.log_view,
            // An unreadable entry above the log may be a prepare we acknowledged: claim
            // it as our op (without a header) so nobody counts us as never having it.
            op: self.log.op.max(self.faulty_above_op),
            commit,
            headers,
            nack,
            present,
        }
    }

    fn maybe_send_do_view_change(&mut self) {
        if self.status != Status::ViewChange
            || self.dvc_sent
            || (self.svc_from.count_ones() as usize) < self.config.quorum_view_change()
        {
            return;
        }
        self.dvc_sent = true;
        self.send_do_view_change();
    }

    /// An op we cannot vouch for in the window our DVC would cover in full: no header to
    /// send, yet maybe prepared. Our DVC leaves it and the ops above it unclaimed, and
    /// repair keeps fetching it during the view change, so that a later DVC covers more.
    pub(crate) fn dvc_unvouched(&self) -> Option<u64> {
        let (_, top, low) = self.dvc_full_bounds();
        self.unvouched_in(low, top).next()
    }

    fn send_do_view_change(&mut self) {
        let dvc = self.own_do_view_change();
        if self.is_primary() {
            if !self.merged {
                self.dvcs.insert(self.config.replica, dvc);
                self.try_merge();
            }
            return;
        }
        let mut header = DoViewChangeHeader::new();
        header.frame.cluster = self.config.cluster;
        header.frame.view = self.view;
        header.frame.replica = self.config.replica;
        header.op = dvc.op;
        header.commit = dvc.commit;
        header.group = self.config.group;
        header.log_view = dvc.log_view;
        header.nack_bitset = dvc.nack;
        header.present_bitset = dvc.present;
        let frame = Frame::build(&header, &headers_body(&dvc.headers));
        // Broadcast (docs/protocol.md, "View changes"): the new primary merges it, the
        // others learn that a quorum suspects the old primary and join the view.
        self.actions.push_back(Action::Broadcast { frame });
    }

    pub(crate) fn on_do_view_change(
        &mut self,
        header: &DoViewChangeHeader,
        headers: &[PrepareHeader],
    ) {
        let view = header.frame.view;
        if view > self.view {
            self.start_view_change(view);
        }
        if view != self.view {
            return;
        }
        let from = header.frame.replica;
        if self.status == Status::Normal && self.is_primary() {
            // The sender missed our StartView.
            self.send_start_view(Some(from), 0);
            return;
        }
        if self.status != Status::ViewChange || !self.is_primary() || self.merged {
            return;
        }
        let (headers, nack, present) =
            without_placeholders(headers, header.nack_bitset, header.present_bitset);
        let headers = &headers[..];
        if !suffix_well_formed(headers, header.op, false)
            || header.op - header.commit > DVC_SPAN_MAX
        {
            self.counters.frames_rejected += 1;
            return;
        }
        self.svc_from |= 1 << from;
        self.dvcs.insert(
            from,
            Dvc {
                log_view: header.log_view,
                op: header.op,
                commit: header.commit,
                headers: headers.to_vec(),
                nack,
                present,
            },
        );
        self.maybe_send_do_view_change();
        self.try_merge();
    }

    /// Merges a DVC quorum into this (forming) primary's log.
    /// A forming primary starts the view once every op after its commit is in hand.
    pub(crate) fn forming_try_start_view(&mut self) {
        if self.status != Status::ViewChange || !self.merged || !self.is_primary() {
            return;
        }
        self.walk_chain();
        if self.log.chain_floor > self.commit + 1 && self.log.op > self.commit {
            return;
        }
        if self.log.missing(self.commit, self.log.op).next().is_some() {
            return;
        }
        self.status = Status::Normal;
        self.log_view = self.view;
        // The suffix as started: repair may have placed headers the merge did not know.
        self.superblock.headers = self.log.suffix(SUFFIX_MAX);
        self.persist_superblock();
        self.actions.push_back(Action::JournalTruncate {
            op_max: self.log.op,
        });
        self.pipeline.clear();
        let own = 1u32 << self.config.replica;
        for op in self.commit_max + 1..=self.log.op {
            let durable = self.log.slot(op).is_some_and(|s| s.durable);
            // Never sent in this view: due at the first retransmit.
            let pending = super::replica::Pending {
                acks: if durable { own } else { 0 },
                sent_at: 0,
                prepared_at: super::replica::NOT_SENT,
            };
            self.pipeline.insert(op, pending);
        }
        self.progress_tick = self.now;
        self.timestamp_last = self.timestamp_last.max(
            self.log
                .header(self.log.op)
                .map(|h| h.timestamp)
                .unwrap_or(0),
        );
        self.send_start_view(None, 0);
        self.start_normal_timeouts();
        self.commit_backup();
        self.commit_pipeline();
    }

    /// StartView: broadcast when a view starts, unicast (echoing `incarnation`) when
    /// answering a probe or a late DVC.
    pub(crate) fn send_start_view(&mut self, to: Option<u8>, incarnation: u128) {
        let headers = self.log.suffix(SUFFIX_MAX);
        let mut header = StartViewHeader::new();
        header.frame.cluster = self.config.cluster;
        header.frame.view = self.view;
        header.frame.replica = self.config.replica;
        header.op = self.log.op;
        header.commit = self.commit_max.min(self.log.op);
        header.group = self.config.group;
        header.incarnation = incarnation;
        let frame = Frame::build(&header, &headers_body(&headers));
        match to {
            Some(to) => self.actions.push_back(Action::Send { to, frame }),
            None => self.actions.push_back(Action::Broadcast { frame }),
        }
    }

    pub(crate) fn on_start_view(&mut self, header: &StartViewHeader, headers: &[PrepareHeader]) {
        let view = header.frame.view;
        let from = header.frame.replica;
        if from != self.config.primary_of(view) || from == self.config.replica {
            return;
        }
        if view < self.view || (view == self.view && self.status == Status::Normal) {
            return;
        }
        if header.incarnation != 0 && header.incarnation != self.incarnation {
            return;
        }
        if !self.voter && !self.non_voter_accepts_start_view(view, header.incarnation) {
            return;
        }
        if !suffix_well_formed(headers, header.op, true) || (headers.is_empty() && header.op != 0) {
            self.counters.frames_rejected += 1;
            return;
        }
        if header.op < self.commit {
            // Our commit is ahead of that view's log: not a log this view could hold.
            self.counters.frames_rejected += 1;
            return;
        }
        self.view = view;
        self.status = Status::Normal;
        self.log_view = view;
        self.faulty_above_op = 0;
        self.log.truncate_above(header.op);
        for prepare in headers.iter().rev() {
            if prepare.op > self.log.op_checkpoint {
                self.log.set_canonical(prepare);
            }
        }
        self.log.op = header.op;
        self.log.chain_floor = header.op;
        self.walk_chain();
        self.persist_superblock();
        self.actions
            .push_back(Action::JournalTruncate { op_max: header.op });
        self.commit_max = self.commit_max.max(header.commit);
        self.pipeline.clear();
        self.svc_from = 0;
        self.dvcs.clear();
        self.dvc_sent = false;
        self.merged = false;
        self.heartbeat_seen = 0;
        self.rebuild_positions();
        self.start_normal_timeouts();
        for op in self.commit_max + 1..=self.log.op {
            self.send_prepare_ok(op);
        }
        self.commit_backup();
        if !self.voter && self.recover.is_none() {
            self.recover = Some((header.op, header.commit));
        }
        self.try_become_voter();
        self.on_repair_timeout();
    }

    pub(crate) fn on_view_change_retransmit_timeout(&mut self) {
        if self.status != Status::ViewChange {
            self.timeout_view_change_retransmit.stop();
            return;
        }
        self.broadcast_start_view_change();
        if self.dvc_sent && !self.is_primary() {
            self.send_do_view_change();
        } else if !self.dvc_sent {
            self.maybe_send_do_view_change();
        }
    }

    pub(crate) fn on_view_change_timeout(&mut self) {
        if self.status != Status::ViewChange {
            self.timeout_view_change.stop();
            return;
        }
        self.start_view_change(self.view + 1);
    }

    /// Asks the primary of `view` (a newer view we heard of) for its StartView.
    pub(crate) fn probe_view(&mut self, view: u32) {
        if self.timeout_probe.ticking() {
            return;
        }
        self.incarnation = self.prng.next_u128();
        let to = self.config.primary_of(view);
        let frame = self.request_start_view_frame(view);
        if to != self.config.replica {
            self.actions.push_back(Action::Send { to, frame });
        }
        self.timeout_probe.start(self.now, &mut self.prng);
    }

    pub(crate) fn request_start_view_frame(&self, view: u32) -> Frame {
        let mut header = RequestStartViewHeader::new();
        header.frame.cluster = self.config.cluster;
        header.frame.view = view;
        header.frame.replica = self.config.replica;
        header.group = self.config.group;
        header.incarnation = self.incarnation;
        Frame::build(&header, &[])
    }

    pub(crate) fn on_request_start_view(&mut self, header: &RequestStartViewHeader) {
        if self.status == Status::Normal
            && self.is_primary()
            && header.frame.view <= self.view
            && header.frame.replica != self.config.replica
        {
            self.send_start_view(Some(header.frame.replica), header.incarnation);
        }
    }

    pub(crate) fn on_probe_timeout(&mut self) {
        if !self.voter {
            if self.status == Status::Recovering {
                self.on_probe_timeout_non_voter();
            } else {
                self.timeout_probe.stop();
            }
            return;
        }
        match self.status {
            Status::Recovering => {
                self.probe_attempts += 1;
                if self.probe_attempts > PROBE_ATTEMPTS_MAX {
                    // Nobody answers: the cluster has no normal primary. Our superblock
                    // and durable journal hold every promise we made, so we may take
                    // part in electing one.
                    self.start_view_change(self.view + 1);
                } else {
                    let frame = self.request_start_view_frame(self.view);
                    self.actions.push_back(Action::Broadcast { frame });
                }
            }
            _ => self.timeout_probe.stop(),
        }
    }
}

/// A DVC suffix without its blank placeholders (`wire::decode::is_suffix_placeholder`),
/// the nack and present bits moved along with the entries that stay. A placeholder names
/// no prepare; its op, inside the DVC's window and out of its body, still counts as
/// nacked by the window rule (`nacks_op`), and at the top of the body as unknown.
pub(crate) fn without_placeholders(
    headers: &[PrepareHeader],
    nack: u128,
    present: u128,
) -> (Vec<PrepareHeader>, u128, u128) {
    let mut kept = Vec::with_capacity(headers.len());
    let (mut kept_nack, mut kept_present) = (0u128, 0u128);
    for (i, header) in headers.iter().enumerate().take(SUFFIX_MAX) {
        if crate::wire::decode::is_suffix_placeholder(header) {
            continue;
        }
        let j = kept.len();
        if nack & (1 << i) != 0 {
            kept_nack |= 1 << j;
        }
        if present & (1 << i) != 0 {
            kept_present |= 1 << j;
        }
        kept.push(*header);
    }
    (kept, kept_nack, kept_present)
}

/// StartView suffixes: descending contiguous ops from `op`, chained by parent. DVC
/// bodies (`start_view == false`) may skip ops (never prepared) and start below `op`
/// (unreadable top entries); adjacent ops must still chain.
fn suffix_well_formed(headers: &[PrepareHeader], op: u64, start_view: bool) -> bool {
    if let Some(first) = headers.first() {
        if first.op > op || (start_view && first.op != op) {
            return false;
        }
    }
    headers.windows(2).all(|w| {
        if w[1].op + 1 == w[0].op {
            w[0].parent == w[1].frame.checksum
        } else {
            !start_view && w[1].op < w[0].op
        }
    })
}

/// The exclusive low end of a DVC window whose body tops at `top`.
pub(super) fn dvc_window_low(commit: u64, top: u64) -> u64 {
    commit.max(top.saturating_sub(SUFFIX_MAX as u64))
}

#[cfg(test)]
mod tests {
    use super::super::merge::{nacks_op, presents_op};
    use super::*;
    use zerocopy::FromZeros;

    fn placeholder(op: u64) -> PrepareHeader {
        let mut header = PrepareHeader::new_zeroed();
        header.frame.command = crate::wire::Command::Prepare as u8;
        header.op = op;
        header
    }

    fn prepared(op: u64) -> PrepareHeader {
        let mut header = PrepareHeader::new();
        header.op = op;
        header.operation = crate::wire::Operation::SendMessages as u8;
        header.frame.checksum = crate::wire::frame::prepare_identity(&header);
        header
    }

    #[test]
    fn a_placeholder_is_never_taken_for_a_prepared_op() {
        // Ops 9 (prepared, present), 8 (placeholder, nacked), 7 (prepared, nacked).
        let headers = [prepared(9), placeholder(8), prepared(7)];
        let (kept, nack, present) = without_placeholders(&headers, 0b110, 0b001);
        assert_eq!(kept.iter().map(|h| h.op).collect::<Vec<_>>(), vec![9, 7]);
        assert_eq!(
            (nack, present),
            (0b10, 0b01),
            "bits follow the entries that stay"
        );
        // Op 8 is out of the body inside the window: the DVC nacks it.
        let dvc = Dvc {
            log_view: 1,
            op: 9,
            commit: 6,
            headers: kept,
            nack,
            present,
        };
        assert!(nacks_op(&dvc, 8, Some(&prepared(8)), 1));
        assert!(!presents_op(&dvc, &prepared(8)));
        assert!(!nacks_op(&dvc, 9, Some(&prepared(9)), 1));
    }
}
