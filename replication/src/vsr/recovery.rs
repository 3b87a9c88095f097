//! Restart (docs/protocol.md, "View changes"; docs/architecture.md): a restarted replica
//! rebuilds its log from the superblock and the durable journal, marks unreadable
//! entries faulty (repaired, never trusted), and probes with RequestStartView under a
//! fresh incarnation instead of acting on its old view.

use zerocopy::FromBytes;

use crate::wire::{decode, Frame, FrameBuf, Limits, Message, PrepareHeader};

use super::client_table::ClientTable;
use super::replica::{Replica, Status};
use super::{Action, Config};
use crate::wire::batch::PartitionPosition;

/// What a replica persists before acting in a view: view, log_view and the log_view's
/// suffix headers (highest op first), so a restart knows the canonical suffix it held.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Superblock {
    pub view: u32,
    pub log_view: u32,
    pub headers: Vec<PrepareHeader>,
    /// This replica lost its state and has not caught up since: it may not vote.
    pub replacement: bool,
    /// This replica was formatted and has not yet learned whether its group formed: a
    /// restart finds that out again before it votes (`Replica::unformed`).
    pub unformed: bool,
}

/// The consensus state that goes with a driver's checkpoint of its state machine.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// The commit point the state reflects.
    pub op: u64,
    /// The committed prepare of `op`: anchors the hash chain of the ops above.
    pub anchor: Frame,
    /// The partition stamp position after `op` (partition plane).
    pub position: PartitionPosition,
    /// The client table as of `op` (sessions and their last replies).
    pub clients: ClientTable,
}

/// One journal slot as read back at startup.
#[derive(Clone, Debug)]
pub struct JournalEntry {
    pub op: u64,
    /// The bytes read; None when the read failed. Anything that does not validate as the
    /// Prepare of `op` is treated as faulty.
    pub bytes: Option<FrameBuf>,
}

/// The ops above a committed `anchor` at `op` whose journal entry provably lies off the
/// committed chain, given the canonical headers above it that chain from the anchor
/// (`canonical`, from the superblock suffix).
///
/// An entry is off the chain when the canonical header of its op differs, when the
/// canonical op below it is known and is not its parent, or when it extends an entry
/// already found off the chain. Any other entry stays: a prepare of a later view past a
/// stale one, an entry above a gap or an unreadable one may be a promise (an
/// acknowledged prepare), and forgetting a promise is what loses committed writes.
fn off_chain(
    op: u64,
    anchor: u128,
    canonical: &std::collections::BTreeMap<u64, u128>,
    entries: impl Iterator<Item = (u64, Option<PrepareHeader>)>,
) -> std::collections::BTreeSet<u64> {
    let mut dropped = std::collections::BTreeSet::new();
    let mut below: Option<(u64, u128, bool)> = None;
    for (at, header) in entries {
        let Some(header) = header else {
            below = None;
            continue;
        };
        let identity = header.frame.checksum;
        let canonical_below = if at == op + 1 {
            Some(anchor)
        } else {
            canonical.get(&(at - 1)).copied()
        };
        let off = match (canonical.get(&at), canonical_below) {
            (Some(known), _) => *known != identity,
            (None, Some(parent)) => header.parent != parent,
            (None, None) => below.is_some_and(|(prev_op, prev_identity, prev_off)| {
                prev_off && prev_op + 1 == at && header.parent == prev_identity
            }),
        };
        if off {
            dropped.insert(at);
        }
        below = Some((at, identity, off));
    }
    dropped
}

/// Walking up from a committed `anchor` at `op`: the first op whose header provably
/// does not chain from it (contiguous ops, parent links). Stops at a gap, which cannot
/// be checked.
fn first_conflict(
    op: u64,
    anchor: u128,
    headers: impl Iterator<Item = (u64, Option<PrepareHeader>)>,
) -> Option<u64> {
    let (mut expected, mut parent) = (op + 1, anchor);
    for (at, header) in headers {
        let header = header.filter(|_| at == expected)?;
        if header.parent != parent {
            return Some(at);
        }
        parent = header.frame.checksum;
        expected += 1;
    }
    None
}

/// The header of the prepare the log holds for `op`, if any.
fn stamped_anchor(replica: &Replica, op: u64) -> Option<PrepareHeader> {
    let frame = replica.log.slot(op)?.frame.as_ref()?;
    PrepareHeader::read_from_prefix(frame.as_bytes())
        .ok()
        .map(|(h, _)| h)
}

impl Replica {
    /// A replica restarting from its superblock and journal. It starts Recovering and
    /// broadcasts RequestStartView; it commits nothing until a StartView tells it the view.
    pub fn restart(config: Config, superblock: &Superblock, journal: &[JournalEntry]) -> Replica {
        if superblock.unformed {
            // Formatted and undecided when it stopped: it holds no promise and no op, and
            // must not take its empty state for that of a member that remembers.
            return Replica::unformed(config);
        }
        Replica::restart_inner(config, superblock, journal, None)
    }

    /// A replica restarting from a checkpoint: the driver's state (a partition's segment
    /// log and offsets) already reflects every op up to `checkpoint.op`, so it resumes
    /// with commit = that op, the client table as it was there, and replays nothing below
    /// it. `journal` holds the durable entries above it (entries at or below are
    /// ignored). Returns None when the anchor is not the valid prepare of the op.
    pub fn restart_from_checkpoint(
        config: Config,
        superblock: &Superblock,
        checkpoint: Checkpoint,
        journal: &[JournalEntry],
    ) -> Option<Replica> {
        // A formatted replica takes no checkpoint before it knows its group formed; were
        // one there anyway, the state would be vouched for by nobody: a replacement.
        let replacement;
        let superblock = if superblock.unformed {
            replacement = Superblock {
                replacement: true,
                ..Superblock::default()
            };
            &replacement
        } else {
            superblock
        };
        let limits = Limits::default();
        let anchor = match decode(checkpoint.anchor.as_bytes(), &limits) {
            Ok(Message::Prepare(h, _)) if h.op == checkpoint.op && h.op > 0 => h.frame.checksum,
            _ => return None,
        };
        let mut above: Vec<&JournalEntry> =
            journal.iter().filter(|e| e.op > checkpoint.op).collect();
        above.sort_by_key(|e| e.op);
        // The anchor is committed, so whatever does not chain from it (a branch that a
        // later view truncated, e.g. when the checkpoint came by state transfer) was never
        // committed: the superblock suffix is cut from the first op that conflicts, and
        // each journal entry that provably lies off the committed chain is dropped. Only
        // those: an entry of a later view above a stale one is a promise and stays.
        let header_of =
            |e: &JournalEntry| match e.bytes.as_ref().map(|b| decode(b.as_bytes(), &limits)) {
                Some(Ok(Message::Prepare(h, _))) if h.op == e.op => Some(*h),
                _ => None,
            };
        let mut suffix: Vec<&PrepareHeader> = superblock
            .headers
            .iter()
            .filter(|h| h.op > checkpoint.op)
            .collect();
        suffix.sort_by_key(|h| h.op);
        let suffix_conflict = first_conflict(
            checkpoint.op,
            anchor,
            suffix.iter().map(|h| (h.op, Some(**h))),
        );
        let mut superblock = superblock.clone();
        if let Some(op) = suffix_conflict {
            superblock.headers.retain(|h| h.op < op);
        }
        // The suffix headers that chain from the anchor without a gap are canonical.
        let mut canonical = std::collections::BTreeMap::new();
        let mut parent = (checkpoint.op, anchor);
        for header in suffix
            .iter()
            .filter(|h| suffix_conflict.is_none_or(|op| h.op < op))
        {
            if header.op != parent.0 + 1 || header.parent != parent.1 {
                break;
            }
            canonical.insert(header.op, header.frame.checksum);
            parent = (header.op, header.frame.checksum);
        }
        let dropped = off_chain(
            checkpoint.op,
            anchor,
            &canonical,
            above.iter().map(|e| (e.op, header_of(e))),
        );
        let mut entries = vec![JournalEntry {
            op: checkpoint.op,
            bytes: Some(FrameBuf::from_bytes(checkpoint.anchor.as_bytes())),
        }];
        entries.extend(
            above
                .into_iter()
                .filter(|e| !dropped.contains(&e.op))
                .cloned(),
        );
        let mut replica = Replica::restart_inner(
            config,
            &superblock,
            &entries,
            Some((checkpoint.op, checkpoint.position)),
        );
        replica.clients = checkpoint.clients;
        Some(replica)
    }

    /// What a checkpoint needs from this replica now (commit point, its prepare, the
    /// client table and the partition stamp position), or None when the prepare of the
    /// commit point is not in memory (`release_anchor`: restore it first). The driver
    /// must pair it with its own state as of the same commit (take it when every Commit
    /// action has been executed).
    pub fn checkpoint(&self) -> Option<Checkpoint> {
        let op = self.commit;
        let anchor = self.log.slot(op)?.frame.clone()?;
        let position = self
            .positions
            .get(&op)
            .copied()
            .unwrap_or(PartitionPosition {
                partition_id: self.config.group,
                next_offset: 0,
                last_timestamp: 0,
            });
        Some(Checkpoint {
            op,
            anchor,
            position,
            clients: self.clients.settled(),
        })
    }

    fn restart_inner(
        config: Config,
        superblock: &Superblock,
        journal: &[JournalEntry],
        checkpoint: Option<(u64, PartitionPosition)>,
    ) -> Replica {
        let superblock = &in_initial_view(superblock, config.initial_view);
        let mut replica = Replica::empty(config);
        if let Some((op, position)) = checkpoint {
            // Ops below the checkpoint's own are gone; its slot stays as the chain anchor.
            replica.log.checkpoint(op - 1);
            replica.commit = op;
            replica.positions.clear();
            replica.positions.insert(op, position);
        }
        replica.status = Status::Recovering;
        replica.view = superblock.view;
        replica.log_view = superblock.log_view;
        replica.superblock = superblock.clone();
        let read = replica.load_journal(journal, superblock.log_view);
        replica.place_headers(superblock, read.stamped, checkpoint.is_some());
        let op = replica.log.op;
        // An unreadable entry above what we can place may be a prepare we acknowledged in
        // log_view: until a StartView decides the log we must not claim we never had it.
        replica.faulty_above_op = journal
            .iter()
            .filter(|e| e.op > op)
            .map(|e| e.op)
            .max()
            .unwrap_or(0);
        // Slots above the log stay in memory as "maybe prepared" markers (no identity), so
        // a later merge that learns their header does not take them for never prepared.
        replica.log.chain_floor = op;
        // Ops without a known identity above chain_floor cannot exist; below it the walk
        // learns identities from parent links.
        replica.walk_chain();
        replica.commit_max = read.commit_known.min(replica.log.op).max(replica.commit);
        replica.rebuild_positions();
        replica.incarnation = replica.prng.next_u128();
        replica.start_recovering();
        replica
    }

    /// Puts the journal's entries in their slots: a readable prepare with its frame (and
    /// durable), any other entry as faulty. Every entry counts as prepared: a faulty one
    /// may have been acknowledged, so it is never nacked.
    fn load_journal(&mut self, journal: &[JournalEntry], log_view: u32) -> JournalRead {
        let limits = Limits::default();
        let mut read = JournalRead {
            stamped: Vec::new(),
            commit_known: 0,
        };
        for entry in journal.iter().filter(|e| e.op != 0) {
            let frame =
                entry
                    .bytes
                    .as_ref()
                    .and_then(|bytes| match decode(bytes.as_bytes(), &limits) {
                        Ok(Message::Prepare(h, body)) if h.op == entry.op => {
                            Some(Frame::build(h, body))
                        }
                        _ => None,
                    });
            let slot = self.log.slot_mut(entry.op);
            slot.durable = frame.is_some();
            slot.prepared = true;
            let Some(frame) = frame else {
                continue;
            };
            if let Ok((prepare, _)) = PrepareHeader::read_from_prefix(frame.as_bytes()) {
                // Its primary had committed this far when it prepared it.
                read.commit_known = read.commit_known.max(prepare.commit);
                if prepare.frame.view == log_view {
                    read.stamped.push(prepare);
                }
            }
            slot.frame = Some(frame);
        }
        read
    }

    /// Sets the canonical headers the restart can vouch for: the superblock's suffix,
    /// the checkpoint's anchor, and the prepares stamped with log_view that extend them.
    fn place_headers(
        &mut self,
        superblock: &Superblock,
        mut stamped: Vec<PrepareHeader>,
        from_checkpoint: bool,
    ) {
        // Ops at or below a checkpoint are applied: only the headers above it matter. The
        // checkpoint op's own header is its anchor, never a suffix header (a stale suffix
        // may name another prepare there, and would displace the committed one).
        let floor = if from_checkpoint {
            self.commit
        } else {
            self.log.op_checkpoint
        };
        let top = superblock.headers.first().map(|h| h.op).unwrap_or(0);
        for header in superblock.headers.iter().rev().filter(|h| h.op > floor) {
            self.log.set_canonical(header);
        }
        self.log.op = top;
        if from_checkpoint {
            // The checkpoint op is committed: its local prepare is canonical by the
            // driver's contract, and anchors the chain of everything above.
            if let Some(header) = stamped_anchor(self, self.commit) {
                self.log.set_canonical(&header);
            }
            self.log.op = self.log.op.max(self.commit);
        }
        // Prepares stamped with log_view above the superblock suffix were appended in
        // that view after it was installed: they are that view's log.
        for header in stamped.iter().filter(|h| h.op > top.max(floor)) {
            self.log.set_canonical(header);
            self.log.op = self.log.op.max(header.op);
        }
        // Below that, a suffix ends at the first op this replica never received: the ops
        // under such a hole that it did receive (and may have acknowledged) are known by
        // their own prepares, stamped with log_view and chained onto the op below.
        stamped.sort_by_key(|h| h.op);
        for header in stamped.iter().filter(|h| h.op > floor && h.op <= top) {
            let below = self.log.identity(header.op - 1);
            if self.log.header(header.op).is_none() && below == Some(header.parent) {
                self.log.set_canonical(header);
            }
        }
    }

    /// The restarted replica's first step: a replacement catches up without a vote, a
    /// lone replica elects itself, any other probes its peers with RequestStartView.
    fn start_recovering(&mut self) {
        if self.superblock.replacement && self.config.replica_count > 1 {
            // Still a replacement: what it holds helps it catch up, but it votes only
            // once a view vouched for it again. (One replica is the whole group: there
            // is nobody to catch up from.)
            self.start_census(false);
            return;
        }
        if self.config.replica_count == 1 {
            // A one-replica cluster has nobody to probe: its superblock and durable
            // journal are the whole cluster's state, so it elects itself at once rather
            // than waiting out the probe attempts.
            let view = self.view + 1;
            self.start_view_change(view);
            return;
        }
        let frame = self.request_start_view_frame(self.view);
        self.actions.push_back(Action::Broadcast { frame });
        let now = self.now;
        self.timeout_probe.start(now, &mut self.prng);
    }

    /// Ops at or below `op` are in a checkpoint: drop them from memory. Repair requests
    /// for them are answered RangeEvicted from now on.
    ///
    /// The prepare of the commit point itself stays: its identity is the parent every
    /// next prepare links to (`release_anchor` lets its body go, keeping the header).
    pub fn on_checkpoint(&mut self, op: u64) {
        assert!(op <= self.commit, "checkpoint beyond commit");
        self.log.checkpoint(op.min(self.commit.saturating_sub(1)));
    }

    /// Drops the body of the commit point's prepare from memory when nothing below it is
    /// held (`on_checkpoint` reached it) and the journal holds it durably: the driver can
    /// read it back (`restore_anchor`) for a checkpoint or a state transfer. Its header
    /// and identity stay (the parent of the next op); repair requests for it are
    /// answered RangeEvicted. A group that keeps no prepare in memory then costs headers
    /// only. Returns whether it was released.
    pub fn release_anchor(&mut self) -> bool {
        let op = self.commit;
        if op == 0 || self.log.op_min() != op || self.log.released().is_some() {
            return false;
        }
        if self.log.durable_frame(op).is_none() {
            return false;
        }
        self.log.release(op);
        true
    }

    /// The op whose prepare `release_anchor` dropped from memory, if any.
    pub fn released_anchor(&self) -> Option<u64> {
        self.log.released()
    }

    /// Puts back the released prepare, as the driver read it from its disk. Returns
    /// false (and keeps nothing) when `bytes` are not that valid prepare.
    pub fn restore_anchor(&mut self, bytes: &[u8]) -> bool {
        let Some(op) = self.log.released() else {
            return false;
        };
        let Ok(Message::Prepare(header, body)) = decode(bytes, &Limits::default()) else {
            return false;
        };
        if header.op != op || self.log.identity(op) != Some(header.frame.checksum) {
            return false;
        }
        self.log.restore(Frame::build(header, body));
        true
    }
}

/// What a restart learned from its journal's readable prepares.
struct JournalRead {
    /// The prepares stamped with the superblock's log_view.
    stamped: Vec<PrepareHeader>,
    /// The highest commit point a readable prepare carries.
    commit_known: u64,
}

/// A group starts in its initial view without writing it: a superblock of a lower view
/// (never written, or written only as a default) stands for that view.
fn in_initial_view(superblock: &Superblock, initial_view: u32) -> Superblock {
    let mut superblock = superblock.clone();
    if !superblock.replacement && !superblock.unformed && superblock.log_view < initial_view {
        superblock.view = superblock.view.max(initial_view);
        superblock.log_view = initial_view;
    }
    superblock
}
