//! Partition groups started and stopped: storage and a VSR group opened for each
//! partition the committed metadata holds, a tick's budget at a time and a few opens in
//! flight at once beside the loop; a group rebuilt from its checkpoint and prepare records;
//! idle prepare logs closed.

use std::time::{Duration, Instant};

use replication::vsr::{self, JournalEntry, Replica};
use replication::wire::{Frame, PartitionKey, PrepareHeader, METADATA_GROUP};
use zerocopy::FromBytes;

use super::partitions::{self};
use super::DaemonError;
use crate::protocol::Status;

use super::node::{Event, Node, OPENING_MAX};
use super::start::partitions_within;

impl Node {
    /// Opens storage and a VSR group for the partitions the committed metadata holds that
    /// have none yet, for at most `budget` (then the next tick goes on): a topic of
    /// thousands of partitions starts over many ticks instead of stalling the node loop,
    /// so no group's heartbeats or timeouts wait on it. Until its group starts, a
    /// partition answers its clients Unavailable (they retry).
    pub(super) async fn sync_partitions(&mut self, budget: Duration) -> Result<(), DaemonError> {
        if !self.partitions_pending {
            return Ok(());
        }
        // At start (no budget) the groups open here, in order. Later a new partition
        // (nothing on disk yet: a few files to create) opens here within the tick's
        // budget, so a small topic is writable when its creation is acknowledged; a
        // partition that holds data (its log's tail scan and records' read-back take a
        // while) opens in a task of its own, a few at a time, while the loop goes on.
        let inline = budget == Duration::MAX;
        let started = Instant::now();
        for key in self.state.partitions() {
            let Ok(group) = key.pack() else {
                continue;
            };
            if self.partitions.by_group.contains_key(&group)
                || self.partitions.opening.contains(&group)
            {
                continue;
            }
            let here = inline || !partitions::partition_dir(&self.settings.data_dir, key).exists();
            if (here && started.elapsed() >= budget)
                || (!here && self.partitions.opening.len() >= OPENING_MAX)
            {
                return Ok(());
            }
            let held = self.partitions.by_group.len() + self.partitions.opening.len();
            let partitions_max = partitions_within(self.settings.partition_files_max);
            if held >= partitions_max {
                // Out of file descriptors: the partition stays Unavailable here and its
                // start is tried again next tick; the node goes on serving the others.
                self.out_of_open_files(&format!(
                    "partition {key:?}: {held} partitions hold the files the open files \
                     limit leaves them (os error 24)"
                ));
                return Ok(());
            }
            if !here {
                self.spawn_open(key, group);
                continue;
            }
            match self.start_partition_group(key, group).await {
                Ok(()) => self.open_files_exhausted = false,
                Err(error) if error.is_out_of_open_files() => {
                    self.out_of_open_files(&error);
                    return Ok(());
                }
                Err(other) => return Err(other),
            }
        }
        if self.partitions.opening.is_empty() {
            self.partitions_pending = false;
        }
        Ok(())
    }

    /// The answer for a partition without storage here: Unavailable while its group is
    /// starting (the client retries), else NotFound.
    pub(super) fn missing_partition(&self, key: PartitionKey) -> Status {
        if self.partition_starting(key) {
            Status::Unavailable
        } else {
            Status::NotFound
        }
    }

    /// Whether `key` is a partition of the committed metadata whose group has not
    /// started here yet.
    pub(super) fn partition_starting(&self, key: PartitionKey) -> bool {
        self.partitions_pending
            && self.state.has_partition(key)
            && key
                .pack()
                .is_ok_and(|g| !self.partitions.by_group.contains_key(&g))
    }

    /// Opens a partition's storage and starts its VSR group as the storage left it
    /// (at start, when the metadata creates it, and after a state transfer).
    pub(super) async fn start_partition_group(
        &mut self,
        key: PartitionKey,
        group: u64,
    ) -> Result<(), DaemonError> {
        let opened = self.open_partition(key, group).await?;
        let entries = journal_entries(group, &opened).await?;
        self.install_partition_group(group, opened, &entries)
    }

    /// Starts the VSR group of a partition whose storage `opened` is, replaying `entries`
    /// (its prepare records read back).
    fn install_partition_group(
        &mut self,
        group: u64,
        opened: partitions::Opened,
        entries: &[JournalEntry],
    ) -> Result<(), DaemonError> {
        let key = opened.partition.key;
        let mut config = self.settings.vsr.clone();
        config.group = group;
        config.initial_view = self.state.initial_view(key, self.settings.replica_count);
        let mut replica = self.partition_replica(config, &opened, entries)?;
        for peer in (0..self.settings.replica_count).filter(|p| *p != self.settings.replica) {
            replica.set_connected(peer, self.bus.is_connected(peer));
        }
        tracing::info!(
            ?key,
            group,
            checkpoint = opened.partition.state.checkpoint_op,
            journaled = opened.records.len(),
            end = opened.partition.state.committed_end,
            "partition group started"
        );
        // The prepare of its checkpoint, read back, counts against the repair windows'
        // bound like the prepares it commits from now on.
        let anchor = opened.checkpoint.as_ref().and_then(|stored| {
            let frame = replica.log().slot(stored.op)?.frame.as_ref()?;
            Some((stored.op, frame.as_bytes().len() as u64))
        });
        self.groups.insert(replica);
        self.partitions.by_group.insert(group, opened.partition);
        self.repair_windows.remove(group);
        if let Some((op, bytes)) = anchor {
            self.repair_windows.hold_anchor(group, op, bytes);
        }
        // Segments below the retained offset may be left from before (a restart, a
        // state transfer): they go once the checkpoint allows.
        self.retention.to_delete.insert(group);
        Ok(())
    }

    /// Opens a partition's storage in a task of its own, off the node loop (the log's
    /// tail scan and the prepare records' read-back take a while for a partition that
    /// holds data); `Event::PartitionOpened` brings it back.
    fn spawn_open(&mut self, key: PartitionKey, group: u64) {
        self.partitions.opening.insert(group);
        let (data_dir, config, offsets) = (
            self.settings.data_dir.clone(),
            self.settings.partition,
            self.settings.offset_durability,
        );
        let events = self.events.clone();
        glommio::spawn_local(async move {
            let opened = async {
                let opened = partitions::open(&data_dir, key, group, config, offsets).await?;
                let entries = journal_entries(group, &opened).await?;
                Ok((opened, entries))
            }
            .await;
            // Unbounded: refused only once the node stopped.
            let _ = events.try_send(Event::PartitionOpened {
                group,
                opened: Box::new(opened),
            });
        })
        .detach();
    }

    /// A partition's storage opened by `spawn_open`: its group starts now. A partition
    /// that met the open files limit waits for the next tick, as in `sync_partitions`.
    pub(super) fn on_partition_opened(
        &mut self,
        group: u64,
        opened: Result<(partitions::Opened, Vec<JournalEntry>), DaemonError>,
    ) -> Result<(), DaemonError> {
        self.partitions.opening.remove(&group);
        match opened {
            Ok((opened, entries)) => {
                self.open_files_exhausted = false;
                self.install_partition_group(group, opened, &entries)
            }
            Err(error) if error.is_out_of_open_files() => {
                self.out_of_open_files(&error);
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    pub(super) fn out_of_open_files(&mut self, error: &dyn std::fmt::Display) {
        self.reject("open_files_limit");
        if !std::mem::replace(&mut self.open_files_exhausted, true) {
            tracing::error!(
                %error,
                "out of open files: partition groups wait to start until files \
                 are free (raise LimitNOFILE: one per partition, two while written)"
            );
        }
    }

    /// Opens a partition's storage (partitions::open) with this node's settings.
    pub(super) async fn open_partition(
        &self,
        key: PartitionKey,
        group: u64,
    ) -> Result<partitions::Opened, DaemonError> {
        partitions::open(
            &self.settings.data_dir,
            key,
            group,
            self.settings.partition,
            self.settings.offset_durability,
        )
        .await
    }

    /// The consensus group of a partition as its storage left it: fresh; restarted from
    /// its checkpoint with the prepares recorded above it; or replaying its records from
    /// op 1 when it never checkpointed.
    fn partition_replica(
        &self,
        config: vsr::Config,
        opened: &partitions::Opened,
        entries: &[JournalEntry],
    ) -> Result<Replica, DaemonError> {
        let group = config.group;
        if let Some(stored) = &opened.checkpoint {
            let fail = |detail: String| DaemonError::Corrupt {
                group,
                op: Some(stored.op),
                detail,
            };
            let anchor = entries
                .iter()
                .find(|e| e.op == stored.op)
                .and_then(|e| e.bytes.as_ref())
                .and_then(|b| {
                    let (header, body) = PrepareHeader::read_from_prefix(b.as_bytes()).ok()?;
                    Some(Frame::build(&header, body))
                })
                .ok_or_else(|| fail("the checkpoint has no prepare".into()))?;
            let clients = vsr::ClientTable::decode(&stored.clients, config.clients_max)
                .map_err(|e| fail(format!("checkpoint client table: {e}")))?;
            let checkpoint = vsr::Checkpoint {
                op: stored.op,
                anchor,
                position: stored.position,
                clients,
            };
            return Replica::restart_from_checkpoint(
                config,
                &opened.superblock,
                checkpoint,
                entries,
            )
            .ok_or_else(|| fail("the checkpoint's anchor is invalid".into()));
        }
        let metadata = self.groups.get(METADATA_GROUP);
        let metadata_votes = metadata.is_none_or(|replica| replica.is_voter());
        // The core may have become a voter while the commits it made as a non-voter are
        // still being applied: those ops count as applied before it voted.
        let replaced_upto = self
            .replaced_upto
            .max(metadata.map_or(0, |replica| replica.voter_since()));
        let before_voting =
            !metadata_votes || (replaced_upto > 0 && self.metadata_applied <= replaced_upto);
        if entries.is_empty()
            && opened.superblock == vsr::Superblock::default()
            && before_voting
            && self.settings.replica_count > 1
        {
            // Created while this node's metadata group catches up after losing its
            // state: the lost state may have held this group and made promises in it.
            return Ok(Replica::replacement(config));
        }
        if !entries.is_empty()
            || opened.superblock != vsr::Superblock::default()
            || (self.settings.replica_count > 1 && self.restarted)
        {
            // Recorded prepares replay from op 1 (their batches are already in the log);
            // with none, a restarted member of a cluster probes for the view and repairs.
            return Ok(Replica::restart(config, &opened.superblock, entries));
        }
        let mut replica = Replica::new(config);
        replica.seed_partition_position(opened.partition.log.position());
        Ok(replica)
    }

    /// Closes the prepare log file of `group` if it is still idle (its lane has
    /// nothing in flight, no record written for `idle`). Returns whether it closed.
    pub(super) async fn close_idle_prepares(
        &mut self,
        group: u64,
        idle: Duration,
    ) -> Result<bool, DaemonError> {
        if self.paused.contains_key(&group) || self.lanes.get(&group).is_some_and(|l| !l.idle()) {
            return Ok(false);
        }
        let Some(partition) = self.partitions.by_group.get_mut(&group) else {
            self.partitions.prepares_open.remove(&group);
            return Ok(true);
        };
        match partition.prepares.close_idle(idle).await {
            Ok(true) => {
                self.partitions.prepares_open.remove(&group);
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(error) => Err(DaemonError::prepare_log(group, None)(error).stops_group_when_full()),
        }
    }
}

/// The prepare records of an opened partition with their frames read back from its
/// log, for its replica to replay. Yields after each read: a partition that holds many
/// records does not hold up the node loop.
async fn journal_entries(
    group: u64,
    opened: &partitions::Opened,
) -> Result<Vec<JournalEntry>, DaemonError> {
    let mut entries = Vec::with_capacity(opened.records.len());
    for record in &opened.records {
        let bytes = partitions::frame_of(group, &opened.partition.log, record)?;
        entries.push(JournalEntry {
            op: record.op(),
            bytes: Some(bytes),
        });
        futures_lite::future::yield_now().await;
    }
    Ok(entries)
}
