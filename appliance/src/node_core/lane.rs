//! A partition group's lane: its journal work between the consensus asking for a
//! JournalAppend and the prepare being reported durable, as a value.
//!
//! A prepare that extends the journal is staged, not written where the action list
//! reaches it, so the round's later actions (the chain Send of a prepare above all) go
//! out without waiting for the disk. The lane then moves its prepares through:
//!
//! ```text
//! staged --planned--> writing --write done--> written --sync started--> syncing
//!                                  |                                       |
//!                                  +-- (no sync per batch) reported        +-- reported
//! ```
//!
//! - at most one write in flight: the staged prepares planned into one coalesced write
//!   (each segment write rewrites the last sector of the one before it); prepares staged
//!   meanwhile make the next write longer;
//! - at most one sync in flight: it covers the writes completed before it started, and
//!   runs beside the next write;
//! - a prepare is reported durable only once a sync that started after its write
//!   completed has completed (or, without a sync per batch, once it is written): the
//!   ordering contract of a JournalAppend that completes asynchronously.
//!
//! A prepare that does not extend the journal (a rewrite below the head, a gap) is
//! journaled on its own once the lane is idle, as `alone` decides. A write or sync that meets a full disk
//! fails the lane: the files no longer match what was planned, so it reports nothing
//! more. The daemon plans the writes and runs them (`daemon::group_commit`); this value
//! decides, and panics on a transition that cannot happen.

use std::time::Instant;

use replication::wire::Frame;

/// Prepares staged in one lane at most before the node waits for the lane to write
/// them (bounds the memory one partition's prepares hold while its disk is slow).
pub const STAGED_OPS_MAX: usize = 1024;

/// A lane's IO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Io {
    Write,
    Sync,
}

/// Ops (with their prepares' identities) in one write or sync, and when the oldest of
/// their writes started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InFlight {
    pub ops: Vec<(u64, u128)>,
    pub since: Instant,
}

/// Where the group's journal stands, as a JournalAppend's fate needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalAt {
    /// The highest op with a record (0 when `empty`).
    pub head: u64,
    pub empty: bool,
    /// The highest op applied.
    pub committed_op: u64,
    /// The identity of the record the journal holds for the op asked, if any.
    pub identity: Option<u128>,
}

/// What a JournalAppend became.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Append {
    /// The same prepare is staged already: it is reported with its write.
    StagedAlready,
    /// The journal holds it already: report it durable now (`report_now`), else it is
    /// reported when the sync in flight for it completes.
    Journaled { report_now: bool },
    /// Staged; `full`: the lane holds `STAGED_OPS_MAX` prepares, write them first.
    Staged { full: bool },
    /// It does not extend the journal: journal it on its own once the lane is idle.
    OnItsOwn,
}

/// One partition group's journal work not yet reported durable.
#[derive(Debug, Default)]
pub struct Lane {
    /// Prepares not yet planned into a write, in op order, each following the one
    /// before it.
    staged: Vec<(u64, Frame)>,
    writing: Option<InFlight>,
    /// Ops written, for the next sync; when the oldest of their writes started.
    written: Vec<(u64, u128)>,
    written_since: Option<Instant>,
    syncing: Option<InFlight>,
    failed: bool,
}

impl Lane {
    /// The JournalAppend of `op` (prepare `frame`), with the journal at `journal`.
    pub fn append(&mut self, op: u64, frame: Frame, journal: JournalAt) -> Append {
        assert!(!self.failed, "an append reached a failed lane");
        let checksum = frame.checksum();
        if let Some(at) = self.staged.iter().position(|(staged, _)| *staged >= op) {
            if self.staged[at].0 == op && self.staged[at].1.checksum() == checksum {
                return Append::StagedAlready;
            }
            // Replaces staged prepares never written (nor reported): they go.
            self.staged.truncate(at);
        }
        if journal.identity == Some(checksum) {
            // Journaled already (the core asks again for ops it never saw reported).
            return Append::Journaled {
                report_now: !self.in_flight(op),
            };
        }
        let head = self
            .staged
            .last()
            .map_or(journal.head, |(staged, _)| *staged);
        if !extends(op, head, journal.empty) || op <= journal.committed_op {
            return Append::OnItsOwn;
        }
        self.staged.push((op, frame));
        Append::Staged {
            full: self.staged.len() >= STAGED_OPS_MAX,
        }
    }

    /// A prepare journaled on its own, staged in the idle lane for its write.
    pub fn stage_alone(&mut self, op: u64, frame: Frame) {
        assert!(
            self.idle() && !self.failed,
            "a prepare journaled on its own needs an idle lane"
        );
        self.staged.push((op, frame));
    }

    /// Prepares staged, in op order, for the next write's plan.
    pub fn staged(&self) -> &[(u64, Frame)] {
        &self.staged
    }

    /// The next write was planned: `ops`, the first staged prepares, go into it (none:
    /// nothing to write); with `drop_rest` the staged prepares after them are dropped
    /// (one was refused). The write starts at `now`.
    pub fn planned(&mut self, ops: Vec<(u64, u128)>, drop_rest: bool, now: Instant) {
        assert!(
            self.write_startable() && !self.failed,
            "a write planned while one is in flight or nothing is staged"
        );
        assert!(
            ops.len() <= self.staged.len()
                && ops
                    .iter()
                    .zip(&self.staged)
                    .all(|((op, sum), (staged, frame))| op == staged && *sum == frame.checksum()),
            "a planned write is not the lane's staged prepares in order"
        );
        if drop_rest {
            self.staged.clear();
        } else {
            self.staged.drain(..ops.len());
        }
        if !ops.is_empty() {
            self.writing = Some(InFlight { ops, since: now });
        }
    }

    /// Starts a sync of the completed writes (at `now` if none had a start time).
    pub fn start_sync(&mut self, now: Instant) {
        assert!(
            self.sync_startable() && !self.failed,
            "a sync started while one is in flight or nothing is written"
        );
        let ops = std::mem::take(&mut self.written);
        let since = self.written_since.take().unwrap_or(now);
        self.syncing = Some(InFlight { ops, since });
    }

    /// The write in flight completed. With a sync per batch its ops wait for the next
    /// sync (None); without, they are durable as written (returned).
    pub fn write_done(&mut self, syncs_every_batch: bool) -> Option<InFlight> {
        let write = self.writing.take();
        let write = write.expect("a write completed that was not in flight");
        assert!(!self.failed, "a failed lane's completion is `failed_done`");
        if !syncs_every_batch {
            return Some(write);
        }
        self.written_since.get_or_insert(write.since);
        self.written.extend(write.ops);
        None
    }

    /// The sync in flight completed: the ops it covers are durable.
    pub fn sync_done(&mut self) -> InFlight {
        assert!(!self.failed, "a failed lane's completion is `failed_done`");
        self.syncing
            .take()
            .expect("a sync completed that was not in flight")
    }

    /// The lane met a full disk: it reports nothing more.
    pub fn fail(&mut self) {
        self.failed = true;
    }

    /// An IO of a failed lane completed (or the one that failed it): reported as nothing.
    pub fn failed_done(&mut self, io: Io) {
        let slot = match io {
            Io::Write => &mut self.writing,
            Io::Sync => &mut self.syncing,
        };
        assert!(
            slot.take().is_some(),
            "a {io:?} completed that was not in flight"
        );
    }

    pub fn failed(&self) -> bool {
        self.failed
    }

    /// A write or a sync is in flight.
    pub fn io_in_flight(&self) -> bool {
        self.writing.is_some() || self.syncing.is_some()
    }

    /// A write can start: prepares are staged and no write is in flight.
    pub fn write_startable(&self) -> bool {
        self.writing.is_none() && !self.staged.is_empty()
    }

    /// A sync can start: ops are written and no sync is in flight.
    pub fn sync_startable(&self) -> bool {
        self.syncing.is_none() && !self.written.is_empty()
    }

    /// Nothing staged, in flight or unreported.
    pub fn idle(&self) -> bool {
        self.staged.is_empty()
            && self.writing.is_none()
            && self.written.is_empty()
            && self.syncing.is_none()
    }

    /// Whether `op` is staged or in the write in flight (not yet in the segment file).
    pub fn unwritten(&self, op: u64) -> bool {
        self.staged.iter().any(|(o, _)| *o == op) || holds(self.writing.as_ref(), op)
    }

    /// Whether `op` is written or being written but not yet reported durable.
    pub fn in_flight(&self, op: u64) -> bool {
        holds(self.writing.as_ref(), op)
            || self.written.iter().any(|(o, _)| *o == op)
            || holds(self.syncing.as_ref(), op)
    }
}

/// What journaling a prepare on its own (the lane idle) does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alone {
    /// The journal holds this prepare already.
    Journaled,
    /// The op is applied: its record is never rewritten (refused and counted).
    Committed,
    /// The journal holds another prepare of `op` (and others above it), none applied:
    /// truncate them (after `op - 1`) and decide again.
    Truncate,
    /// It would leave a gap above the head: deferred (the core asks again).
    Deferred,
    /// Stage it in the idle lane and write it.
    Append,
}

/// Decides the fate of the prepare of `op` (identity `checksum`) journaled on its own,
/// with the journal at `journal`.
pub fn alone(op: u64, checksum: u128, journal: JournalAt) -> Alone {
    if journal.identity == Some(checksum) {
        return Alone::Journaled;
    }
    if op <= journal.committed_op {
        return Alone::Committed;
    }
    if journal.identity.is_some() {
        // Another prepare of `op`: truncating from it leaves the head below `op`, so
        // the decision after it is never a second truncation. An op below the journal's
        // first record is not held and truncates nothing: it is a gap, deferred.
        return Alone::Truncate;
    }
    if extends(op, journal.head, journal.empty) {
        Alone::Append
    } else {
        Alone::Deferred
    }
}

/// Whether `op` extends a journal whose highest op is `head` (`empty`: it holds none).
pub fn extends(op: u64, head: u64, empty: bool) -> bool {
    op == head + 1 || (head == 0 && empty && op == 1)
}

fn holds(io: Option<&InFlight>, op: u64) -> bool {
    io.is_some_and(|io| io.ops.iter().any(|(o, _)| *o == op))
}

#[cfg(test)]
mod tests;
