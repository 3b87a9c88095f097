//! Partition checkpoints: a partition group's commit op, stamp position and client table
//! in its `vsr-checkpoint` file, the point a restart replays its prepare records from,
//! below which those records are compacted away and retained segments may be deleted.
//!
//! Once a second (`CHECKPOINT_TICKS`) the node collects the partitions that applied
//! past their checkpoint, or whose retained segments wait for one, and checkpoints them
//! in rounds of at most `CHECKPOINTS_PER_ROUND`, one round per tick. A round first
//! drains each partition's lane and syncs its journal (every partition's fdatasyncs at
//! once), then writes the checkpoint files on the blocking pool, never on the node
//! loop. With 1,000 partitions produced at once, most of them need a checkpoint every
//! second: a round of `CHECKPOINTS_SYNCED_TOGETHER` or more writes its files beside
//! the old ones unsynced, makes them durable with one sync of the file system, renames
//! them over the old ones and makes the renames durable with a second sync: two device
//! flushes for the round instead of two per partition. A crash anywhere in a round
//! leaves each partition its old checkpoint or its new one, both whole.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::files::{self, FileError, StoredCheckpoint};
use super::node::{Node, PREPARE_RECORDS_KEPT};
use super::system::slow_step;
use super::DaemonError;

/// Partitions checkpointed in one round (one tick) at most: bounds how long a round
/// holds the node loop.
const CHECKPOINTS_PER_ROUND: usize = 256;
/// A round with at least this many checkpoints shares its file system syncs.
const CHECKPOINTS_SYNCED_TOGETHER: usize = 16;

/// A checkpoint of one partition whose journal is synced, ready to be written.
struct Ready {
    group: u64,
    dir: PathBuf,
    stored: StoredCheckpoint,
}

/// A covered checkpoint is staged beside the old one, for the round's shared syncs
/// and renames (`commit_staged`); any other is written durably on its own.
impl files::RoundWrite for Ready {
    fn dir(&self) -> &Path {
        &self.dir
    }

    fn write(&self, covered: bool) -> Result<(), FileError> {
        if covered {
            files::stage_checkpoint(&self.dir, &self.stored)
        } else {
            files::write_checkpoint(&self.dir, &self.stored)
        }
    }
}

impl Node {
    /// Starts a sweep: the partitions that committed past their checkpoint, or whose
    /// retained segments wait for one (what the sweep would pass over is left out).
    pub(super) fn sweep_checkpoints(&mut self) {
        let (groups, to_delete) = (&self.groups, &self.retention.to_delete);
        self.checkpoint_due = self
            .partitions
            .by_group
            .iter()
            .filter(|(group, partition)| {
                // Applied past its checkpoint before the group is looked up: an idle
                // partition costs no lookup among thousands of groups.
                to_delete.contains(group)
                    || (partition.state.applied_past_checkpoint()
                        && groups.get(**group).is_some_and(|replica| {
                            partition.state.needs_checkpoint(replica.commit())
                        }))
            })
            .map(|(group, _)| *group)
            .collect();
    }

    /// While the prepares the repair windows hold are over their node-wide bound, each
    /// partition checkpointed at its commit point gives up that prepare too (the
    /// consensus keeps its header; `restore_anchor` reads it back from disk for a state
    /// transfer): an idle partition then holds no batch in memory, however many were
    /// written since the node started. Touches no file and wakes no group. The first
    /// sweep that releases nothing after some that did (the writes moved on or ended)
    /// returns the freed memory to the kernel.
    pub(super) fn release_anchors(&mut self) {
        let mut released = 0u64;
        if self.repair_windows.over_bound() {
            for (&group, partition) in &self.partitions.by_group {
                if !self.repair_windows.over_bound() {
                    break;
                }
                let op = partition.state.checkpoint_op;
                if op == 0
                    || partition.state.committed_op != op
                    || !self.repair_windows.releasable(group, op)
                {
                    continue;
                }
                if self.groups.release_anchor(group, op) {
                    self.repair_windows.release(group, op);
                    released += 1;
                }
            }
        }
        self.commit_prepares_released += released;
        if released > 0 {
            self.trim_pending = true;
            tracing::debug!(
                released,
                held = self.repair_windows.bytes(),
                "commit point prepares released from memory"
            );
        } else if std::mem::take(&mut self.trim_pending) {
            let started = Instant::now();
            give_back_freed_memory();
            slow_step("freed memory returned to the kernel", started);
        }
    }

    /// Checkpoints the next round of the sweep's partitions, then deletes the retained
    /// segments their checkpoints released.
    pub(super) async fn checkpoint_round(&mut self) -> Result<(), DaemonError> {
        let mut round = Vec::new();
        while round.len() < CHECKPOINTS_PER_ROUND {
            let Some(group) = self.checkpoint_due.pop_first() else {
                break;
            };
            round.push(group);
        }
        if round.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let ready = self.ready_checkpoints(&round).await?;
        slow_step("partition checkpoints: journals synced", started);
        for (group, op, written) in self.write_checkpoints(ready).await {
            match written {
                Ok(()) => self.checkpointed(group, op).await?,
                Err(error) => self.skip_checkpoint(group, error)?,
            }
        }
        slow_step("partition checkpoints", started);
        for group in round {
            if self.retention.to_delete.contains(&group) {
                self.delete_retained(group)?;
            }
        }
        Ok(())
    }

    /// The checkpoints of `round` that are due, each with its lane drained and its
    /// journal synced (all the partitions' syncs in flight at once).
    async fn ready_checkpoints(&mut self, round: &[u64]) -> Result<Vec<Ready>, DaemonError> {
        let mut syncing = Vec::with_capacity(round.len());
        for &group in round {
            let (Some(partition), Some(replica)) =
                (self.partitions.by_group.get(&group), self.groups.get(group))
            else {
                continue;
            };
            if !partition.state.needs_checkpoint(replica.commit()) {
                continue;
            }
            let Some(checkpoint) = replica.checkpoint() else {
                continue;
            };
            // The compaction after it rewrites the prepare log: no record write may be
            // in flight.
            self.drain_lane(group).await?;
            let Some(partition) = self.partitions.by_group.get(&group) else {
                continue;
            };
            let ready = Ready {
                group,
                dir: partition.dir.clone(),
                stored: StoredCheckpoint {
                    op: checkpoint.op,
                    position: checkpoint.position,
                    clients: checkpoint.clients.encode(),
                },
            };
            // A task, so every sync is in flight before the first is awaited.
            syncing.push((ready, glommio::spawn_local(partition.journal_syncer(group))));
        }
        let mut kept = Vec::with_capacity(syncing.len());
        for (r, sync) in syncing {
            if let Err(error) = sync.await {
                self.skip_checkpoint(r.group, error.stops_group_when_full())?;
                continue;
            }
            let Some(partition) = self.partitions.by_group.get_mut(&r.group) else {
                continue;
            };
            partition.log.note_synced();
            // Offsets unchanged since their last flush are on stable storage already.
            if partition.offsets.is_dirty() {
                if let Err(error) = partition.offsets.flush() {
                    let error = DaemonError::journal(r.group, None, "partition checkpoint")(error);
                    self.skip_checkpoint(r.group, error.stops_group_when_full())?;
                    continue;
                }
            }
            kept.push(r);
        }
        Ok(kept)
    }

    /// Writes the round's checkpoint files on the blocking pool, a round of
    /// `CHECKPOINTS_SYNCED_TOGETHER` or more sharing two file system syncs (module
    /// doc). Returns each group's op and whether its checkpoint is durable.
    async fn write_checkpoints(
        &mut self,
        ready: Vec<Ready>,
    ) -> Vec<(u64, u64, Result<(), DaemonError>)> {
        let shared = (ready.len() >= CHECKPOINTS_SYNCED_TOGETHER)
            .then(|| files::SharedSync::open(&self.settings.data_dir).ok())
            .flatten();
        // A covered checkpoint is staged beside the old one (`Ready::write`).
        let mut writes = files::write_round(ready, shared.as_ref()).await;
        if let Some(shared) = shared {
            let staged: Vec<PathBuf> = writes
                .iter()
                .filter(|(_, staged, written)| *staged && written.is_ok())
                .map(|(r, _, _)| r.dir.clone())
                .collect();
            let committed = glommio::executor()
                .spawn_blocking(move || commit_staged(&shared, &staged))
                .await;
            if let Err(error) = committed {
                // Which of them reached the disk is unknown: none counts as written.
                for (_, staged, written) in &mut writes {
                    if *staged && written.is_ok() {
                        *written = Err(error.duplicate());
                    }
                }
            }
        }
        let mut outcomes = Vec::with_capacity(writes.len());
        for (r, _, written) in writes {
            let fail = DaemonError::file(r.group, "partition checkpoint");
            let written = match written.map_err(fail) {
                Err(error) if error.is_no_space() => {
                    // The reserve goes back to the file system, and the write is tried
                    // once more on its own: retention waits for this checkpoint to free
                    // the disk.
                    let (dir, stored) = (&r.dir, &r.stored);
                    self.with_room(|| files::write_checkpoint(dir, stored).map_err(fail))
                }
                written => written,
            };
            let written = written.map_err(DaemonError::stops_group_when_full);
            outcomes.push((r.group, r.stored.op, written));
        }
        outcomes
    }

    /// The checkpoint at `op` of `group` is durable: its prepare records below it may go.
    async fn checkpointed(&mut self, group: u64, op: u64) -> Result<(), DaemonError> {
        let Some(partition) = self.partitions.by_group.get_mut(&group) else {
            return Ok(());
        };
        partition.state.on_checkpoint(op);
        if partition.prepares.len() > PREPARE_RECORDS_KEPT {
            if let Err(error) = partition.prepares.compact(op).await {
                let error = DaemonError::prepare_log(group, Some(op))(error);
                return self.skip_checkpoint(group, error.stops_group_when_full());
            }
        }
        Ok(())
    }
}

/// Returns the allocator's free pages to the kernel: the batches just released were
/// freed amid live allocations, where the allocator would keep them for good (a node
/// that wrote 1,000 partitions kept about 1 GiB resident with 256 MiB of prepares held).
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; it only madvises free heap pages away.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Makes the staged checkpoints in `dirs` durable and renames each over its
/// partition's checkpoint, durably: a sync of the file system, the renames, a second
/// sync (`shared` was opened before the checkpoints were written).
fn commit_staged(shared: &files::SharedSync, dirs: &[PathBuf]) -> Result<(), FileError> {
    shared.sync()?;
    for dir in dirs {
        files::commit_staged_checkpoint(dir)?;
    }
    shared.sync()
}
