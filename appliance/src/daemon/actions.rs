//! The groups' actions executed in order (vsr/mod.rs, "Ordering contract"): sends,
//! journal appends (the metadata group's awaited here, a partition group's staged in its
//! lane), truncations, superblock writes (a partition group's beside the loop, in
//! superblocks.rs' rounds, their completions taken here), commits and replies; and the
//! metadata group's checkpoint once half its journal ring is used.

use std::time::Instant;

use replication::vsr::{self, Action};
use replication::wire::{Frame, METADATA_GROUP};

use super::files;
use super::DaemonError;

use super::node::Node;
use super::superblocks::RoundDone;
use super::system::slow_step;

impl Node {
    /// Executes queued actions until every group is quiet. A partition group's VSR
    /// superblock write holds back that group's later actions only, and runs beside the
    /// loop (superblocks.rs): the group goes on in its own order once it is durable.
    pub(super) async fn pump(&mut self) -> Result<(), DaemonError> {
        let mut actions = self.superblocks.take_released();
        actions.extend(self.groups.drain_actions());
        loop {
            if actions.is_empty() {
                self.superblocks.start_rounds();
                // The round's journal IO starts once its sends and replies are out.
                return self.start_journal_io().await;
            }
            for (group, action) in actions {
                let Some(action) = self.superblocks.hold(group, action) else {
                    continue;
                };
                // A group a full disk stops loses its pending actions with its replica,
                // as in a crash.
                if self.stopping.contains(&group) || self.paused.contains_key(&group) {
                    continue;
                }
                let ordered = self.order_before(group, &action).await;
                if ordered.is_err() {
                    self.absorb_no_space(ordered)?;
                    continue;
                }
                // A partition group's superblock is written beside the loop; the
                // metadata group's goes with its journal superblock (`execute`).
                if let Action::PersistSuperblock(superblock) = &action {
                    if group != METADATA_GROUP {
                        if let Some(partition) = self.partitions.by_group.get(&group) {
                            // Groups that journaled lately go in the busy lane.
                            let busy = self.partitions.prepares_open.contains(&group);
                            self.superblocks.queue(
                                group,
                                partition.dir.clone(),
                                superblock.clone(),
                                busy,
                            );
                        }
                        continue;
                    }
                }
                let kind = match &action {
                    Action::Send { .. } => "action send",
                    Action::Broadcast { .. } => "action broadcast",
                    Action::JournalAppend { .. } => "action journal append",
                    Action::JournalTruncate { .. } => "action journal truncate",
                    Action::PersistSuperblock(_) => "action superblock",
                    Action::Commit { .. } => "action commit",
                    Action::Reply { .. } => "action reply",
                    Action::Evict { .. } => "action evict",
                    Action::StateTransfer { .. } => "action state transfer",
                };
                let started = Instant::now();
                let executed = self.execute(group, action).await;
                self.absorb_no_space(executed)?;
                slow_step(kind, started);
            }
            actions = self.groups.drain_actions();
        }
    }

    async fn execute(&mut self, group: u64, action: Action) -> Result<(), DaemonError> {
        match action {
            Action::Send { to, frame } => {
                let _ = self.bus.send(to, frame);
            }
            Action::Broadcast { frame } => {
                self.bus.broadcast(frame);
            }
            Action::JournalAppend { op, frame } => {
                self.prepared_at.insert((group, op), Instant::now());
                if group != METADATA_GROUP {
                    // Staged, written and reported durable by the round's group commit.
                    return self.partition_append(group, op, frame).await;
                }
                let started = Instant::now();
                let checksum = self.journal_write(op, &frame).await?;
                let _ = self
                    .latencies
                    .journal_fsync
                    .record(started.elapsed().as_micros() as u64);
                if let (Some(replica), Some(checksum)) = (self.groups.get_mut(group), checksum) {
                    replica.on_journal_durable(op, checksum);
                }
            }
            Action::JournalTruncate { op_max } => {
                let discarded = self.prepared_requests.truncated(group, op_max);
                self.answer_discarded(group, discarded);
                if group == METADATA_GROUP {
                    self.data.journal.truncate_after(op_max).await.map_err(
                        DaemonError::journal(METADATA_GROUP, Some(op_max + 1), "journal truncate"),
                    )?;
                } else {
                    self.partition_truncate(group, op_max).await?;
                }
            }
            // Only the metadata group's: `pump` writes the partition groups' together.
            Action::PersistSuperblock(superblock) => {
                if group == METADATA_GROUP {
                    self.persist_superblock(&superblock).await?;
                }
            }
            Action::Commit { op, prepare } => {
                if let Some(at) = self.prepared_at.remove(&(group, op)) {
                    let _ = self
                        .latencies
                        .prepare_commit
                        .record(at.elapsed().as_micros() as u64);
                }
                if group == METADATA_GROUP {
                    self.commit_metadata(op, &prepare).await?;
                } else {
                    self.commit_partition(group, op, &prepare).await?;
                }
            }
            Action::Reply { client, frame } => self.send_reply(group, client, frame),
            Action::Evict { client, frame } => self.send_to_client(client, frame),
            Action::StateTransfer { from, op_min } => {
                tracing::info!(group, from, op_min, "group needs state transfer");
                self.start_state_transfer(group, from);
            }
        }
        Ok(())
    }

    /// Writes the prepare of `op` durably: the next op appends; an op at or below the
    /// head rewrites a faulty slot or replaces a discarded suffix.
    async fn journal_write(&mut self, op: u64, frame: &Frame) -> Result<Option<u128>, DaemonError> {
        let journal = &mut self.data.journal;
        let fail = DaemonError::journal(METADATA_GROUP, Some(op), "journal write");
        if op <= journal.op_head() {
            let faulty = journal.faulty().any(|f| f == op);
            // Asked again for an op it holds (the core re-asks ops it never saw reported
            // durable): already durable, nothing to write.
            if !faulty
                && journal
                    .header(op)
                    .is_some_and(|h| h.frame.checksum == frame.checksum())
            {
                return Ok(Some(frame.checksum()));
            }
            if faulty {
                let durable = journal.write_repair(frame.as_bytes()).await.map_err(fail)?;
                return Ok(Some(durable.checksum));
            }
            journal.truncate_after(op - 1).await.map_err(fail)?;
        }
        if op != journal.op_head() + 1 {
            // A gap: the core asked for an op past our head. It is not reported durable,
            // so no PrepareOk goes out for it; repair brings the ops below it first.
            let head = journal.op_head();
            self.reject("journal_append_gap");
            tracing::warn!(op, head, "journal append past the head deferred");
            return Ok(None);
        }
        let durable = journal.append(frame.as_bytes()).await.map_err(fail)?;
        Ok(Some(durable.checksum))
    }

    async fn persist_superblock(
        &mut self,
        superblock: &vsr::Superblock,
    ) -> Result<(), DaemonError> {
        let dir = self.settings.data_dir.clone();
        // Before the group may vote: the ops it applied as a non-voter are on record, so
        // a restart still starts the partition groups they created as replacements.
        let voter_since = self
            .groups
            .get(METADATA_GROUP)
            .map_or(0, |replica| replica.voter_since());
        if !superblock.replacement && voter_since > self.replaced_upto {
            self.with_room(|| {
                files::write_replaced_upto(&dir, voter_since)
                    .map_err(DaemonError::file(METADATA_GROUP, "metadata-replaced-upto"))
            })?;
            self.replaced_upto = voter_since;
        }
        // The reserve is this write's room on a full disk (storage.rs).
        self.with_room(|| {
            files::write_vsr_superblock(&dir, superblock)
                .map_err(DaemonError::file(METADATA_GROUP, "VSR superblock"))
        })?;
        let commit = self
            .groups
            .get(METADATA_GROUP)
            .map_or(0, |replica| replica.commit());
        let current = *self.data.superblock.current();
        let next = journal::Superblock {
            view: superblock.view,
            log_view: superblock.log_view,
            commit: commit.max(current.commit),
            ..current
        };
        self.data
            .superblock
            .write(next)
            .await
            .map_err(DaemonError::journal(
                METADATA_GROUP,
                None,
                "superblock write",
            ))
    }

    /// Truncates a partition group's journal above `op_max` (a view change discarded
    /// the uncommitted suffix).
    async fn partition_truncate(&mut self, group: u64, op_max: u64) -> Result<(), DaemonError> {
        let Some(partition) = self.partitions.by_group.get_mut(&group) else {
            return Ok(());
        };
        if op_max < partition.state.committed_op {
            self.bus.stats().reject("partition_truncate_committed");
            tracing::error!(group, op_max, "refused to truncate committed partition ops");
            return Ok(());
        }
        partition.truncate_after(group, op_max).await
    }

    /// Checkpoints the metadata state once half the journal ring is used since the last
    /// checkpoint, so the ring wraps instead of filling: the state machine, the client
    /// table and the anchor prepare go into a snapshot, then the superblock names it.
    /// Called only when every Commit action has been executed.
    pub(super) async fn checkpoint_metadata(&mut self) -> Result<(), DaemonError> {
        let journal = &self.data.journal;
        let slots = journal.layout().slot_count;
        let (op_checkpoint, op_head) = (journal.op_checkpoint(), journal.op_head());
        let Some(replica) = self.groups.get(METADATA_GROUP) else {
            return Ok(());
        };
        let commit = replica.commit().min(op_head);
        if op_head.saturating_sub(op_checkpoint) < slots / 2 || commit <= op_checkpoint {
            return Ok(());
        }
        if commit != replica.commit() || journal.faulty().any(|op| op <= commit) {
            return Ok(());
        }
        let Some(checkpoint) = replica.checkpoint() else {
            return Ok(());
        };
        let payload = files::encode_metadata_checkpoint(
            &self.state.snapshot(),
            &checkpoint.clients.encode(),
            checkpoint.anchor.as_bytes(),
        );
        let fail = DaemonError::journal(METADATA_GROUP, Some(checkpoint.op), "metadata checkpoint");
        let mut written = self
            .data
            .checkpoint(checkpoint.op, &payload)
            .await
            .map_err(fail);
        if let Err(error) = &written {
            if !error.is_no_space() {
                return written.map(|_| ());
            }
            // The reserve is this write's room (storage.rs); without it, the next tick
            // tries again while the journal still has free slots.
            self.storage.on_no_space(error);
            written = self
                .data
                .checkpoint(checkpoint.op, &payload)
                .await
                .map_err(fail);
        }
        let info = match written {
            Ok(info) => info,
            Err(error) if error.is_no_space() => {
                self.reject("metadata_checkpoint_no_space");
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        tracing::info!(
            group = METADATA_GROUP,
            op = info.op,
            bytes = info.len,
            "metadata checkpoint"
        );
        // Prepares the journal no longer holds cannot be served from memory either.
        let floor = self.data.journal.op_min().saturating_sub(1);
        if let Some(replica) = self.groups.get_mut(METADATA_GROUP) {
            if floor > replica.log().op_min() && floor <= replica.commit() {
                replica.on_checkpoint(floor);
            }
        }
        Ok(())
    }
}

impl Node {
    /// A round of superblock writes completed: the groups written go on (their held
    /// actions run at the next pump); a write that met a full disk runs once more after
    /// the reserve went back to the file system, and a group whose write failed loses
    /// its held actions (the messages that promise what was not written).
    pub(super) fn on_superblocks_done(&mut self, done: RoundDone) -> Result<(), DaemonError> {
        for ((group, dir, superblock), outcome) in self.superblocks.complete(done) {
            if !self.superblocks.holds(group) {
                continue;
            }
            let fail = DaemonError::file(group, "partition VSR superblock");
            let outcome = outcome.map_err(fail).or_else(|error| {
                if !error.is_no_space() {
                    return Err(error);
                }
                // As `with_room`: the reserve goes back to the file system, once more.
                self.storage.on_no_space(&error);
                files::write_vsr_superblock(&dir, &superblock).map_err(fail)
            });
            match outcome {
                Ok(()) => self.superblocks.release(group),
                Err(error) => {
                    self.superblocks.drop_held(group);
                    self.absorb_no_space(Err(error.stops_group_when_full()))?;
                }
            }
        }
        // What queued meanwhile is the lane's next round.
        self.superblocks.start_rounds();
        Ok(())
    }

    /// Waits until `group` has no superblock write in flight (before its replica is
    /// stopped or replaced). Its held actions run at the next pump, if it still runs.
    pub(super) async fn settle_superblock(&mut self, group: u64) -> Result<(), DaemonError> {
        while self.superblocks.holds(group) {
            self.superblocks.start_rounds();
            let Some(done) = self.superblocks.done.recv().await else {
                return Err(DaemonError::Internal {
                    group,
                    op: None,
                    detail: "superblock completions closed",
                });
            };
            self.on_superblocks_done(done)?;
        }
        Ok(())
    }
}
