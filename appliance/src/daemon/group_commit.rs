//! Group commit of the partition groups' journals, pipelined. A partition group's
//! JournalAppend is staged in the group's lane, not written where the action list
//! reaches it, so the round's later actions (the chain Send of a prepare above all) go
//! out without waiting for the disk. Each lane then runs its IO beside the node loop:
//!
//! - at most one write in flight: the staged prepares planned into one coalesced
//!   segment write and one record write (`PartitionLog::plan_many_verified`,
//!   `PrepareLog::plan_many`), which run as a task holding only the files and buffers.
//!   One at a time because each segment write rewrites the last sector of the one
//!   before it; prepares staged meanwhile make the next write longer.
//! - at most one sync in flight (under `message_durability = "every"`): it covers the
//!   writes completed before it started, and runs beside the next write.
//!
//! Completions come back to the node loop as `IoDone`; a prepare is reported durable to
//! the consensus (which then sends its PrepareOk) only once a sync that started after
//! its write completed has completed (or, under an interval policy, once it is written).
//! That is the ordering contract of vsr/mod.rs: a JournalAppend completes
//! asynchronously.
//!
//! Whatever must not overlap a lane's IO waits for it first: applying a commit waits
//! for that op's write (reads serve what is committed), a truncation, a new view, a
//! checkpoint's compaction, a roll, a state-transfer install and shutdown drain the
//! lane. Prepares that do not extend the journal (a rewrite below the head, a gap) are
//! journaled one at a time after the lane is drained.

use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::channels::local_channel::LocalSender;
use journal::segment::Plan;
use replication::vsr::Action;
use replication::wire::{Frame, Operation, PrepareHeader};
use zerocopy::FromBytes;

use super::node::{IoDone, Node};
use super::partitions::Partition;
use super::prepares;
use super::DaemonError;
use crate::node_core::{lane, Alone, Append, Io, Lane};

/// What planning a lane's staged prepares produced.
struct PlannedLane {
    /// The ops planned (they leave `staged`), with identities.
    ops: Vec<(u64, u128)>,
    /// Staged ops dropped after them: one was refused (reasons for `rejected`).
    refused: Vec<&'static str>,
    drop_rest: bool,
    io: Option<LaneIo>,
}

/// A lane's planned write: the segment write and the record write, together.
type LaneIo = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), DaemonError>>>>;

impl Node {
    /// The JournalAppend of a partition group: staged in its lane when it extends the
    /// journal, else journaled one at a time.
    pub(super) async fn partition_append(
        &mut self,
        group: u64,
        op: u64,
        frame: Frame,
    ) -> Result<(), DaemonError> {
        let Some(partition) = self.partitions.by_group.get(&group) else {
            return Ok(());
        };
        let journal = partition.journal_at(op);
        let checksum = frame.checksum();
        match self
            .lanes
            .entry(group)
            .or_default()
            .append(op, frame.clone(), journal)
        {
            Append::StagedAlready | Append::Staged { full: false } => Ok(()),
            Append::Staged { full: true } => self.drain_lane(group).await,
            Append::Journaled { report_now } => {
                // The core asks again for ops it never saw reported: now, or when the
                // sync in flight for it completes.
                if let (true, Some(replica)) = (report_now, self.groups.get_mut(group)) {
                    replica.on_journal_durable(op, checksum);
                }
                Ok(())
            }
            Append::OnItsOwn => self.partition_journal(group, op, &frame).await.map(|_| ()),
        }
    }

    /// Before a commit of `op` is applied: its batch must be in the segment file (reads
    /// serve committed offsets), though not necessarily synced here (a quorum has it).
    pub(super) async fn wait_written(&mut self, group: u64, op: u64) -> Result<(), DaemonError> {
        loop {
            if self.lane_failed(group) {
                return Err(self.no_space(group));
            }
            if !self
                .lanes
                .get(&group)
                .is_some_and(|lane| lane.unwritten(op))
            {
                return Ok(());
            }
            self.start_lane_io(group).await?;
            self.await_io(group).await?;
        }
    }

    /// Waits until the lane of `group` has nothing staged, in flight or unreported.
    pub(super) async fn drain_lane(&mut self, group: u64) -> Result<(), DaemonError> {
        loop {
            if self.lane_failed(group) {
                return Err(self.no_space(group));
            }
            self.start_lane_io(group).await?;
            if self.lanes.get(&group).is_none_or(Lane::idle) {
                self.lanes.remove(&group);
                return Ok(());
            }
            self.await_io(group).await?;
        }
    }

    /// Drains every lane (shutdown, before the files close).
    pub(super) async fn drain_lanes(&mut self) -> Result<(), DaemonError> {
        let groups: Vec<u64> = self.lanes.keys().copied().collect();
        for group in groups {
            self.drain_lane(group).await?;
        }
        Ok(())
    }

    /// Whether the lane of `group` met a full disk.
    pub(super) fn lane_failed(&self, group: u64) -> bool {
        self.lanes.get(&group).is_some_and(Lane::failed)
    }

    fn no_space(&self, group: u64) -> DaemonError {
        DaemonError::NoSpace {
            group,
            source: None,
        }
    }

    /// A lane's IO met a full disk: the lane fails, the node learns its disk is full.
    fn fail_lane(&mut self, group: u64, error: &DaemonError) {
        if let Some(lane) = self.lanes.get_mut(&group) {
            lane.fail();
        }
        self.storage.on_no_space(error);
        self.stopping.insert(group);
    }

    /// Waits for the IO a failed lane still has in flight (its tasks hold the files), so
    /// the partition can be closed and reopened.
    pub(super) async fn settle_lane(&mut self, group: u64) -> Result<(), DaemonError> {
        while self.lanes.get(&group).is_some_and(Lane::io_in_flight) {
            self.await_io(group).await?;
        }
        self.lanes.remove(&group);
        Ok(())
    }

    /// Takes the next IO completion (of any lane) while `group`'s lane waits on IO.
    async fn await_io(&mut self, group: u64) -> Result<(), DaemonError> {
        let mut waiting = self.lanes.get(&group).is_some_and(Lane::io_in_flight);
        if !waiting && self.waits_for_prepare_file(group) {
            // Every prepare file is held by a lane that is not idle: one frees when its
            // IO completes (started here if its round has not started it yet).
            if !self.lanes.values().any(Lane::io_in_flight) {
                self.start_journal_io().await?;
            }
            waiting = self.lanes.values().any(Lane::io_in_flight);
        }
        if !waiting {
            // Nothing in flight, yet work left that could not start: a bug, not input.
            return Err(DaemonError::Internal {
                group,
                op: None,
                detail: "journal work left with no IO in flight",
            });
        }
        let Some(done) = self.io_done.recv().await else {
            return Err(DaemonError::Internal {
                group,
                op: None,
                detail: "journal completions closed",
            });
        };
        self.on_io_done(done)
    }

    /// Before `action` of `group` runs: a truncation or a new view must not overtake
    /// that group's journal IO.
    pub(super) async fn order_before(
        &mut self,
        group: u64,
        action: &Action,
    ) -> Result<(), DaemonError> {
        let ordered = matches!(
            action,
            Action::JournalTruncate { .. } | Action::PersistSuperblock(_)
        );
        if ordered && self.lanes.contains_key(&group) {
            self.drain_lane(group).await?;
        }
        Ok(())
    }

    /// Starts what every lane can start: a sync of its completed writes, a write of its
    /// staged prepares.
    pub(super) async fn start_journal_io(&mut self) -> Result<(), DaemonError> {
        let groups: Vec<u64> = self
            .lanes
            .iter()
            .filter(|(_, lane)| lane.write_startable() || lane.sync_startable())
            .map(|(group, _)| *group)
            .collect();
        for group in groups {
            self.start_lane_io(group).await?;
        }
        Ok(())
    }

    async fn start_lane_io(&mut self, group: u64) -> Result<(), DaemonError> {
        // A prepare log closed while its group was idle opens for the write. Without a
        // file free, the prepares stay staged (unacknowledged) until a later round
        // finds one (its file is open while any record waits for a sync).
        if self.waits_for_prepare_file(group) && !self.open_prepares(group).await? {
            return Ok(());
        }
        let Some(lane) = self.lanes.get_mut(&group) else {
            return Ok(());
        };
        let Some(partition) = self.partitions.by_group.get_mut(&group) else {
            // The partition is gone (deleted with its topic): nothing left to journal.
            self.lanes.remove(&group);
            return Ok(());
        };
        if lane.failed() {
            return Ok(());
        }
        if lane.sync_startable() {
            lane.start_sync(Instant::now());
            let io = partition.journal_syncer(group);
            spawn_io(&self.io_done_tx, group, Io::Sync, io);
        }
        if !lane.write_startable() {
            return Ok(());
        }
        self.partitions.unsynced.insert(group);
        self.partitions.grown = true;
        let planned = match plan_lane(partition, group, lane.staged())? {
            Some(planned) => planned,
            None => {
                // The first batch starts a new segment: roll with nothing in flight.
                if lane.io_in_flight() {
                    return Ok(());
                }
                if let Err(error) = partition.log.roll().await {
                    let error = DaemonError::journal(group, None, "segment roll")(error);
                    if error.is_no_space() {
                        self.fail_lane(group, &error);
                        return Ok(());
                    }
                    return Err(error);
                }
                plan_lane(partition, group, lane.staged())?.ok_or(DaemonError::Internal {
                    group,
                    op: None,
                    detail: "roll did not make room",
                })?
            }
        };
        lane.planned(planned.ops, planned.drop_rest, Instant::now());
        if let Some(io) = planned.io {
            spawn_io(&self.io_done_tx, group, Io::Write, io);
        }
        for reason in planned.refused {
            self.bus.stats().reject(reason);
        }
        Ok(())
    }

    /// Whether the lane of `group` has prepares to write and waits for its prepare log
    /// to open (no file free).
    fn waits_for_prepare_file(&self, group: u64) -> bool {
        self.lanes
            .get(&group)
            .is_some_and(|lane| !lane.failed() && lane.write_startable())
            && self
                .partitions
                .by_group
                .get(&group)
                .is_some_and(|partition| !partition.prepares.is_open())
    }

    /// Opens the prepare log of `group` for its lane's next write, first closing the
    /// least recently written idle one when the partitions' open files are all taken.
    /// Returns whether it is open.
    async fn open_prepares(&mut self, group: u64) -> Result<bool, DaemonError> {
        let held = self.partitions.by_group.len() + self.partitions.opening.len();
        let room = self.settings.partition_files_max.saturating_sub(held);
        if self.partitions.prepares_open.len() >= room {
            self.partitions.forget_closed_prepares();
        }
        while self.partitions.prepares_open.len() >= room {
            let (lanes, by_group, paused) = (&self.lanes, &self.partitions.by_group, &self.paused);
            let idlest = self
                .partitions
                .prepares_open
                .iter()
                .filter(|g| !paused.contains_key(g) && lanes.get(g).is_none_or(Lane::idle))
                .filter_map(|g| Some((by_group.get(g)?.prepares.open_since_write()?, *g)))
                .min();
            let Some((_, idle)) = idlest else {
                self.out_of_open_files(&format!(
                    "partition group {group}: {} prepare logs written at once hold the \
                     open files left to partitions (os error 24)",
                    self.partitions.prepares_open.len()
                ));
                return Ok(false);
            };
            match self.close_idle_prepares(idle, Duration::ZERO).await {
                Ok(true) => {}
                // Its file is still shared with IO: a later round tries again.
                Ok(false) => return Ok(false),
                Err(error) => {
                    self.absorb_no_space(Err(error))?;
                    return Ok(false);
                }
            }
        }
        let Some(partition) = self.partitions.by_group.get_mut(&group) else {
            return Ok(false);
        };
        let opened = partition.prepares.open_for_writes().await;
        match opened.map_err(DaemonError::prepare_log(group, None)) {
            Ok(()) => {
                self.partitions.prepares_open.insert(group);
                Ok(true)
            }
            Err(error) if error.is_out_of_open_files() => {
                self.out_of_open_files(&error);
                Ok(false)
            }
            Err(error) if error.is_no_space() => {
                self.fail_lane(group, &error);
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// A lane's write or sync completed: its prepares move on, and those a completed
    /// sync covers (or, without syncs per batch, those written) are reported durable.
    pub(super) fn on_io_done(&mut self, done: IoDone) -> Result<(), DaemonError> {
        let group = done.group;
        let failed = self.lane_failed(group);
        let no_space = done.result.as_ref().is_err_and(|e| e.is_no_space());
        if let (true, Some(lane)) = (failed || no_space, self.lanes.get_mut(&group)) {
            // A failed lane reports nothing durable, this completion included.
            lane.failed_done(done.kind);
            if let (false, Err(error)) = (failed, &done.result) {
                self.fail_lane(group, error);
            }
            return Ok(());
        }
        done.result?;
        let (Some(lane), Some(partition)) = (
            self.lanes.get_mut(&group),
            self.partitions.by_group.get_mut(&group),
        ) else {
            return Err(DaemonError::Internal {
                group,
                op: None,
                detail: "journal IO completed for no lane",
            });
        };
        let durable = match done.kind {
            Io::Write => match lane.write_done(partition.log.syncs_every_batch()) {
                Some(written) => written,
                None => return Ok(()),
            },
            Io::Sync => {
                let synced = lane.sync_done();
                partition.log.note_synced();
                synced
            }
        };
        let _ = self
            .latencies
            .journal_fsync
            .record(durable.since.elapsed().as_micros() as u64);
        if let Some(replica) = self.groups.get_mut(group) {
            for (op, checksum) in durable.ops {
                replica.on_journal_durable(op, checksum);
            }
        }
        Ok(())
    }

    /// Journals the prepare of `op` of a partition group on its own, after its lane is
    /// drained: its batch into the segment log, its record into the prepare log, synced
    /// per `message_durability` by the lane before it is reported. Returns the identity
    /// when it is journaled (or was), None when it cannot be yet (a gap below it) or
    /// must not be (it would rewrite a committed op).
    pub(super) async fn partition_journal(
        &mut self,
        group: u64,
        op: u64,
        frame: &Frame,
    ) -> Result<Option<u128>, DaemonError> {
        self.drain_lane(group).await?;
        let checksum = frame.checksum();
        let mut truncated = false;
        loop {
            let Some(partition) = self.partitions.by_group.get_mut(&group) else {
                return Ok(None);
            };
            let journal = partition.journal_at(op);
            match lane::alone(op, checksum, journal) {
                Alone::Journaled => return Ok(Some(checksum)),
                Alone::Committed => {
                    self.bus.stats().reject("partition_rewrite_committed");
                    tracing::error!(group, op, "refused to rewrite a committed partition op");
                    return Ok(None);
                }
                Alone::Truncate if truncated => {
                    // Truncating from `op` leaves it unheld; held still, the journal did
                    // not truncate: not journaled (never acked), rather than ask forever.
                    self.bus.stats().reject("journal_truncate_failed");
                    tracing::error!(group, op, "prepare still held after truncation");
                    return Ok(None);
                }
                Alone::Truncate => {
                    partition.truncate_after(group, op - 1).await?;
                    truncated = true;
                }
                Alone::Deferred => {
                    // Counted (`rejected.journal_append_gap` in /stats), logged at
                    // debug: a group that is repairing or fetching its state defers
                    // every prepare its primary sends, and the core asks again on each
                    // repair timeout (thousands of lines a second at warn, into the
                    // journal of the host).
                    self.bus.stats().reject("journal_append_gap");
                    tracing::debug!(
                        group,
                        op,
                        head = journal.head,
                        "partition journal append past the head deferred"
                    );
                    return Ok(None);
                }
                Alone::Append => break,
            }
        }
        // Through the lane, which is empty: planned, written, then synced and reported
        // like any other.
        self.lanes
            .entry(group)
            .or_default()
            .stage_alone(op, frame.clone());
        self.wait_written(group, op).await?;
        Ok(self.journaled(group, op, checksum).then_some(checksum))
    }

    /// Whether the prepare of `op` with identity `checksum` is in the group's journal
    /// (written or planned).
    pub(super) fn journaled(&self, group: u64, op: u64, checksum: u128) -> bool {
        self.partitions
            .by_group
            .get(&group)
            .and_then(|p| p.prepares.get(op))
            .is_some_and(|e| e.identity == checksum)
    }
}

/// Starts `io` as a task of the executor; its completion comes back as an `IoDone`.
fn spawn_io(
    done: &Rc<LocalSender<IoDone>>,
    group: u64,
    kind: Io,
    io: impl std::future::Future<Output = Result<(), DaemonError>> + 'static,
) {
    let done = done.clone();
    glommio::spawn_local(async move {
        let result = io.await;
        // Unbounded: never refused while the node holds the receiver.
        let _ = done.try_send(IoDone {
            group,
            kind,
            result,
        });
    })
    .detach();
}

/// The headers of a lane's staged prepares and their batches, as far as the first
/// inline body too large.
struct StagedHeaders<'a> {
    headers: Vec<PrepareHeader>,
    batches: Vec<&'a [u8]>,
    /// An inline body too large ended the list (before anything is planned: batches
    /// past it would be in the log without records).
    body_too_large: bool,
}

fn staged_headers(group: u64, staged: &[(u64, Frame)]) -> Result<StagedHeaders<'_>, DaemonError> {
    let mut headers = Vec::with_capacity(staged.len());
    let mut batches = Vec::new();
    for (op, frame) in staged {
        let Ok((header, _)) = PrepareHeader::read_from_prefix(frame.as_bytes()) else {
            return Err(DaemonError::Corrupt {
                group,
                op: Some(*op),
                detail: "the frame is not a prepare".into(),
            });
        };
        let body = frame.as_bytes().get(256..).unwrap_or(&[]);
        if header.operation == Operation::SendMessages as u8 {
            batches.push(body);
        } else if body.len() > prepares::INLINE_BODY_MAX {
            return Ok(StagedHeaders {
                headers,
                batches,
                body_too_large: true,
            });
        }
        headers.push(header);
    }
    Ok(StagedHeaders {
        headers,
        batches,
        body_too_large: false,
    })
}

/// Plans the next write of a lane's `staged` prepares (each following the one before
/// it and the journal's head): their batches into one segment write, their records into
/// one record write, as far as the segment and one write's bound allow. A batch the log
/// refuses, or an inline body too large, ends the plan there and drops the rest. None:
/// the first batch needs a roll first.
fn plan_lane(
    partition: &mut Partition,
    group: u64,
    staged: &[(u64, Frame)],
) -> Result<Option<PlannedLane>, DaemonError> {
    let mut refused = Vec::new();
    let StagedHeaders {
        headers,
        batches,
        body_too_large: mut drop_rest,
    } = staged_headers(group, staged)?;
    if drop_rest {
        refused.push("partition_prepare_body_too_large");
    }
    let before = partition.log.position();
    let planned = match partition
        .log
        .plan_many_verified(&batches)
        .map_err(DaemonError::journal(group, None, "journal plan"))?
    {
        Plan::RollFirst => return Ok(None),
        Plan::Planned(planned) => planned,
    };
    let mut records = Vec::with_capacity(headers.len());
    let mut ops = Vec::with_capacity(headers.len());
    let mut receipts = planned.receipts.into_iter();
    let (mut next_offset, mut last_timestamp) = (before.next_offset, before.last_timestamp);
    for ((op, frame), header) in staged.iter().zip(headers) {
        let record = if header.operation == Operation::SendMessages as u8 {
            let Some(receipt) = receipts.next() else {
                if let Some(error) = &planned.refused {
                    // The core checked the stamp against its own position: a refusal
                    // here means the log and the core disagree; do not acknowledge.
                    tracing::error!(group, op, %error, "partition batch not journaled");
                    refused.push("partition_append_refused");
                    drop_rest = true;
                }
                // Else past one write's bound or the segment's end: the next write.
                break;
            };
            next_offset = receipt.next_offset;
            last_timestamp = receipt.last_timestamp;
            prepares::Record {
                header,
                base_offset: receipt.base_offset,
                next_offset: receipt.next_offset,
                last_timestamp: receipt.last_timestamp,
                inline: Vec::new(),
            }
        } else {
            prepares::Record {
                header,
                base_offset: next_offset,
                next_offset,
                last_timestamp,
                inline: frame.as_bytes().get(256..).unwrap_or(&[]).to_vec(),
            }
        };
        records.push(record);
        ops.push((*op, frame.checksum()));
    }
    let io = if records.is_empty() {
        None
    } else {
        let records = partition
            .prepares
            .plan_many(&records)
            .map_err(DaemonError::prepare_log(group, None))?;
        let write = planned.write;
        let io = async move {
            let segment = async {
                match write {
                    Some(write) => write.run().await,
                    None => Ok(()),
                }
            };
            let (segment, records) = futures_lite::future::zip(segment, records.run()).await;
            segment.map_err(DaemonError::journal(group, None, "journal write"))?;
            records.map_err(DaemonError::prepare_log(group, None))
        };
        Some(Box::pin(io) as LaneIo)
    };
    Ok(Some(PlannedLane {
        ops,
        refused,
        drop_rest,
        io,
    }))
}

#[cfg(test)]
mod tests;
