//! The node on a full disk (docs/operations.md, "Disk space"): a partition group
//! whose write met a full disk stops as a crashed replica would and restarts from its
//! storage once the budget is met again; writes are refused meanwhile; the view of the
//! disk (storage.rs) is refreshed on the tick, and a small write that meets a full disk
//! runs once more after the reserve went back to the file system.

use super::node::Node;
use super::storage::{Full, REFRESH_TICKS};
use super::DaemonError;

impl Node {
    /// Turns a partition group's full-disk error into the stop of that group (done by
    /// `stop_full_groups`); any other error passes.
    pub(super) fn absorb_no_space(
        &mut self,
        result: Result<(), DaemonError>,
    ) -> Result<(), DaemonError> {
        match result {
            Err(DaemonError::NoSpace { group, source }) => {
                if !self.stopping.contains(&group) && !self.paused.contains_key(&group) {
                    self.note_no_space(group, source.as_deref());
                }
                self.stopping.insert(group);
                Ok(())
            }
            other => other,
        }
    }

    /// Tells the storage state that a write of `group` met a full disk (`source`: the
    /// write's error, when the group has it).
    fn note_no_space(&mut self, group: u64, source: Option<&DaemonError>) {
        match source {
            Some(source) => self.storage.on_no_space(source),
            None => self
                .storage
                .on_no_space(format_args!("partition group {group}: a journal write")),
        }
    }

    /// Stops every partition group whose write met a full disk, as a crash would stop
    /// it: its replica and what it held in memory go (nothing it had not made durable
    /// was acknowledged); its storage stays open for reads until it restarts.
    pub(super) async fn stop_full_groups(&mut self) -> Result<(), DaemonError> {
        while let Some(group) = self.stopping.pop_first() {
            self.settle_lane(group).await?;
            self.settle_superblock(group).await?;
            self.groups.remove(group);
            self.repair_windows.remove(group);
            self.checkpoint_due.remove(&group);
            let Some(old) = self.partitions.by_group.remove(&group) else {
                continue;
            };
            tracing::warn!(
                group,
                key = ?old.key,
                "partition group stopped: the disk is full (it restarts from its storage \
                 once space returns)"
            );
            self.paused.insert(group, old.key);
            // What the failed write planned is in memory only: the storage is opened
            // again from what is on disk, and keeps serving what was committed (every
            // committed batch was written before it was applied). Its files are dropped,
            // not closed: closing would write the planned state.
            let (key, committed_op, committed_end) =
                (old.key, old.state.committed_op, old.state.committed_end);
            drop(old);
            match self.open_partition(key, group).await {
                Ok(opened) => {
                    let mut partition = opened.partition;
                    partition.state.committed_op = committed_op;
                    partition.state.committed_end = committed_end.min(partition.log.next_offset());
                    self.partitions.by_group.insert(group, partition);
                }
                Err(error) => {
                    // Not readable until it restarts; the node goes on.
                    tracing::error!(group, ?key, %error, "stopped partition cannot be opened");
                }
            }
        }
        Ok(())
    }

    /// Bytes of the node's data: the partitions' segments and the metadata journal.
    fn used_bytes(&self) -> u64 {
        let partitions: u64 = self
            .partitions
            .by_group
            .values()
            .map(|p| p.log.stored_bytes())
            .sum();
        partitions + self.data.journal.file_bytes()
    }

    /// Reads the free space, decides whether writes are refused, and restarts the
    /// groups a full disk stopped once the budget is met again.
    pub(super) async fn refresh_storage(&mut self) -> Result<(), DaemonError> {
        // Summing every partition is the one cost here that grows with the partition
        // count: done at once after writes (what fills the budget), and otherwise (what
        // retention, truncation or a transfer freed) once per 250 partitions' refreshes.
        let every = REFRESH_TICKS * (self.partitions.by_group.len() as u64 / 250).max(1);
        let used = if self.partitions.grown || self.ticks.is_multiple_of(every) {
            self.partitions.grown = false;
            self.used_bytes()
        } else {
            self.storage.used_bytes
        };
        self.storage.refresh(used);
        if self.storage.full() == Some(Full::NoSpace) || self.paused.is_empty() {
            return Ok(());
        }
        for (group, key) in std::mem::take(&mut self.paused) {
            if let Some(partition) = self.partitions.by_group.remove(&group) {
                // Only reads used it since it was opened again: nothing to write.
                let _ = partition.prepares.close().await;
                let _ = partition.log.close().await;
            }
            self.lanes.remove(&group);
            match self.start_partition_group(key, group).await {
                Ok(()) => tracing::info!(group, ?key, "partition group restarted: space returned"),
                Err(error) if error.is_no_space() => {
                    self.storage.on_no_space(format_args!("restarting {error}"));
                    self.paused.insert(group, key);
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Runs a write the consensus state needs; when it meets a full disk, the reserve
    /// goes back to the file system and the write runs once more.
    pub(super) fn with_room<T>(
        &mut self,
        mut write: impl FnMut() -> Result<T, DaemonError>,
    ) -> Result<T, DaemonError> {
        match write() {
            Err(error) if error.is_no_space() => {
                self.storage.on_no_space(&error);
                write()
            }
            other => other,
        }
    }

    /// A partition checkpoint that met a full disk is skipped (the next sweep tries
    /// again); any other failure is returned.
    pub(super) fn skip_checkpoint(
        &mut self,
        group: u64,
        error: DaemonError,
    ) -> Result<(), DaemonError> {
        match error {
            DaemonError::NoSpace { source, .. } => {
                self.note_no_space(group, source.as_deref());
                self.reject("partition_checkpoint_no_space");
                Ok(())
            }
            other => Err(other),
        }
    }

    /// Whether a new write must be refused here; the StorageFull body when it must.
    pub(super) fn storage_refusal(&mut self) -> Option<&'static str> {
        self.storage.full()?;
        let reason = self.storage.refuse();
        self.reject("storage_full");
        Some(reason)
    }
}
