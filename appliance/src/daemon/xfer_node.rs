//! The replica executor's side of state transfer (xfer.rs runs the rest on the
//! "statexfer" executor): routing state-transfer frames to it, freezing a group at its
//! commit point for the server, starting a fetch when a group's range was evicted, and
//! installing a staged state (swap the directory, restart the group from the
//! transferred checkpoint; it then repairs from there and rejoins).

use std::path::Path;
use std::time::Instant;

use replication::bus::VerifiedFrame;
use replication::vsr::{self, Replica};
use replication::wire::{Frame, PrepareHeader, METADATA_GROUP};
use statexfer::install::artifact_file;
use statexfer::{ArtifactKind, Manifest};
use zerocopy::FromBytes;

use super::files::{self, ClientTableArtifact};
use super::node::{Node, PARTITION_START_BUDGET};
use super::xfer::{self, Arm, Content, FetchRequest, FromXfer, Frozen, Links, ToXfer};
use super::DaemonError;
use crate::state::MetadataState;

impl Node {
    fn to_xfer(&self, message: ToXfer) -> bool {
        match &self.xfer {
            Some(sender) => sender.try_send(message).is_ok(),
            None => false,
        }
    }

    /// Hands a state-transfer frame to the statexfer executor (dropped and counted when
    /// its queue is full: the lockstep protocol asks again).
    pub(super) fn route_to_xfer(&mut self, peer: u8, frame: VerifiedFrame) {
        if !self.to_xfer(ToXfer::Frame {
            peer,
            frame: frame.into_buf(),
        }) {
            self.reject("state_transfer_queue_full");
        }
    }

    pub(super) fn on_xfer(&mut self, message: FromXfer) {
        match message {
            FromXfer::Send { to, frame } => {
                let _ = self.bus.send(to, frame);
            }
            FromXfer::Freeze { group } => self.xfer_work.freezes.push(group),
            FromXfer::Install {
                group,
                staging,
                commit_op,
                manifest,
            } => self
                .xfer_work
                .installs
                .push((group, staging, commit_op, manifest)),
            FromXfer::FetchFailed { group, error } => {
                tracing::warn!(group, %error, "state transfer failed; the group will ask again");
                self.transferring.remove(&group);
                if let Some(replica) = self.groups.get_mut(group) {
                    replica.on_state_transfer_failed();
                }
            }
        }
    }

    /// A group's range was evicted by enough peers: fetch its state from them, `from`
    /// first.
    pub(super) fn start_state_transfer(&mut self, group: u64, from: u8) {
        if self.transferring.contains_key(&group) {
            return;
        }
        let mut committed_segments = Vec::new();
        let (arm, live, staging) = if group == METADATA_GROUP {
            (
                Arm::Metadata,
                self.settings.data_dir.clone(),
                self.settings.data_dir.join(xfer::METADATA_STAGING_DIR),
            )
        } else {
            let Some(partition) = self.partitions.by_group.get(&group) else {
                return;
            };
            let name = partition
                .dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| group.to_string());
            let staging = partition
                .dir
                .with_file_name(format!("{}{name}", xfer::STAGING_PREFIX));
            if let Ok(segments) = partition.log.segments_until(partition.state.committed_end) {
                committed_segments = segments
                    .iter()
                    .map(|(base, _, len)| (*base, *len))
                    .collect();
            }
            (Arm::Partition, partition.dir.clone(), staging)
        };
        let mut peers = vec![from];
        peers.extend(
            (0..self.settings.replica_count).filter(|p| *p != from && *p != self.settings.replica),
        );
        tracing::info!(
            group,
            from,
            "state transfer: range evicted by peers; fetching state"
        );
        let started = self.to_xfer(ToXfer::Fetch(FetchRequest {
            group,
            arm,
            peers,
            live,
            staging,
            committed_segments,
        }));
        if started {
            self.transferring.insert(group, Instant::now());
        } else if let Some(replica) = self.groups.get_mut(group) {
            self.bus.stats().reject("state_transfer_queue_full");
            replica.on_state_transfer_failed();
        }
    }

    /// Freezes and installs asked for during the round.
    pub(super) async fn xfer_round(&mut self) -> Result<(), DaemonError> {
        for group in std::mem::take(&mut self.xfer_work.freezes) {
            let message = match self.freeze(group) {
                Ok(frozen) => ToXfer::Frozen(frozen),
                Err(transient) => ToXfer::FreezeRefused { group, transient },
            };
            if !self.to_xfer(message) {
                self.reject("state_transfer_queue_full");
            }
        }
        for (group, staging, commit_op, manifest) in std::mem::take(&mut self.xfer_work.installs) {
            let result = if group == METADATA_GROUP {
                self.install_metadata(&staging, commit_op, &manifest).await
            } else {
                self.install_partition(group, &staging, commit_op).await
            };
            self.transferring.remove(&group);
            match result {
                Ok(()) => tracing::info!(group, commit_op, "state transfer installed"),
                Err(Refusal::Skip(reason)) => {
                    tracing::warn!(group, commit_op, %reason, "state transfer not installed");
                    let _ = statexfer::install::recover(&staging);
                    if let Some(replica) = self.groups.get_mut(group) {
                        replica.on_state_transfer_failed();
                    }
                }
                Err(Refusal::Fatal(error)) => return Err(error),
            }
        }
        Ok(())
    }

    /// Puts the prepare of a partition group's commit point back in memory when it left
    /// (`release_anchors`), read back from its prepare record and segment log.
    fn restore_anchor(&mut self, group: u64) -> Result<(), DaemonError> {
        let (Some(replica), Some(partition)) =
            (self.groups.get(group), self.partitions.by_group.get(&group))
        else {
            return Ok(());
        };
        let Some(op) = replica.released_anchor() else {
            return Ok(());
        };
        let record = partition
            .prepares
            .read_record(op)
            .map_err(DaemonError::prepare_log(group, Some(op)))?;
        let frame = super::partitions::frame_of(group, &partition.log, &record)?;
        let restored = self
            .groups
            .get_mut(group)
            .is_some_and(|replica| replica.restore_anchor(frame.as_bytes()));
        if !restored {
            return Err(DaemonError::Corrupt {
                group,
                op: Some(op),
                detail: "the prepare read back is not the committed one".into(),
            });
        }
        Ok(())
    }

    /// The group's committed state, frozen: Err(true) when it cannot be frozen now,
    /// Err(false) when this node does not hold the group (or is fetching it itself).
    fn freeze(&mut self, group: u64) -> Result<Frozen, bool> {
        if self.transferring.contains_key(&group) {
            return Err(false);
        }
        if group != METADATA_GROUP {
            self.restore_anchor(group).map_err(|error| {
                tracing::warn!(group, %error, "state transfer source: commit point unreadable");
                true
            })?;
        }
        let replica = self.groups.get(group).ok_or(false)?;
        let commit_max = replica.commit_max();
        let checkpoint = replica.checkpoint().ok_or(true)?;
        let client_table = ClientTableArtifact {
            op: checkpoint.op,
            position: checkpoint.position,
            clients: checkpoint.clients.encode(),
            anchor: checkpoint.anchor.as_bytes().to_vec(),
        }
        .encode();
        if group == METADATA_GROUP {
            if self.metadata_applied != checkpoint.op {
                return Err(true);
            }
            return Ok(Frozen {
                group,
                commit_op: checkpoint.op,
                commit_max,
                artifacts: vec![
                    (
                        ArtifactKind::ClientTable,
                        checkpoint.op,
                        Content::Bytes(client_table),
                    ),
                    (
                        ArtifactKind::MetadataSnapshot,
                        checkpoint.op,
                        Content::Bytes(self.state.snapshot()),
                    ),
                ],
                keep: Links(None),
            });
        }
        let (op, end) = (checkpoint.op, checkpoint.position.next_offset);
        self.freeze_partition(group, op, end, commit_max, client_table)
    }

    /// A partition group's artifacts at its checkpoint (`op`, log end `end`): the client
    /// table, the consumer offsets and hard links of its segments up to `end`.
    fn freeze_partition(
        &mut self,
        group: u64,
        op: u64,
        end: u64,
        commit_max: u64,
        client_table: Vec<u8>,
    ) -> Result<Frozen, bool> {
        let partition = self.partitions.by_group.get(&group).ok_or(false)?;
        if partition.state.committed_op != op || partition.state.committed_end != end {
            return Err(true);
        }
        let segments = partition
            .log
            .segments_until(partition.state.committed_end)
            .map_err(|error| {
                tracing::warn!(group, %error, "state transfer: cannot list segments");
                true
            })?;
        self.xfer_freezes += 1;
        let dir = self
            .settings
            .data_dir
            .join(xfer::OUT_DIR)
            .join(format!("{group}-{}", self.xfer_freezes));
        // Owned from here: dropped, and the directory removed, unless the freeze is made.
        let links = Links(Some(dir.clone()));
        let linked = (|| -> std::io::Result<Vec<(ArtifactKind, u64, Content)>> {
            std::fs::create_dir_all(&dir)?;
            let mut artifacts = vec![
                (ArtifactKind::ClientTable, op, Content::Bytes(client_table)),
                (
                    ArtifactKind::ConsumerOffsets,
                    op,
                    Content::Bytes(journal::segment::offsets::encode(partition.offsets.all())),
                ),
            ];
            for (base, path, len) in segments {
                let link = dir.join(path.file_name().unwrap_or_default());
                std::fs::hard_link(&path, &link)?;
                artifacts.push((
                    ArtifactKind::SegmentLog,
                    base,
                    Content::File { path: link, len },
                ));
            }
            Ok(artifacts)
        })();
        match linked {
            Ok(artifacts) => Ok(Frozen {
                group,
                commit_op: op,
                commit_max,
                artifacts,
                keep: links,
            }),
            Err(error) => {
                tracing::warn!(group, %error, "state transfer: cannot freeze segments");
                Err(true)
            }
        }
    }

    /// Swaps a staged partition directory in and restarts the group from its checkpoint.
    async fn install_partition(
        &mut self,
        group: u64,
        staging: &Path,
        commit_op: u64,
    ) -> Result<(), Refusal> {
        let Some(partition) = self.partitions.by_group.get(&group) else {
            return Err(Refusal::Skip("the partition is gone".into()));
        };
        if partition.state.committed_op >= commit_op {
            return Err(Refusal::Skip(format!(
                "already committed op {} here",
                partition.state.committed_op
            )));
        }
        if partition.prepares.head() > commit_op {
            // Journaled prepares above the transferred state may be promises: repair
            // them instead (a later transfer brings a newer state).
            return Err(Refusal::Skip(format!(
                "prepares up to op {} are journaled here",
                partition.prepares.head()
            )));
        }
        if self.superblocks.holds(group) {
            // Its view promise is being written: the copy below would miss it.
            return Err(Refusal::Skip(
                "its VSR superblock write is in flight".into(),
            ));
        }
        let live = partition.dir.clone();
        let key = partition.key;
        let fatal = |what| move |e| Refusal::Fatal(DaemonError::file(group, what)(e));
        // This replica's view promises move to the new directory.
        let superblock = files::read_vsr_superblock(&live).map_err(fatal("VSR superblock"))?;
        files::write_vsr_superblock(staging, &superblock)
            .map_err(fatal("staged VSR superblock"))?;
        // Its files close: no journal IO of the group may be in flight.
        self.drain_lane(group).await.map_err(Refusal::Fatal)?;
        let Some(partition) = self.partitions.by_group.remove(&group) else {
            return Err(Refusal::Skip("the partition is gone".into()));
        };
        partition
            .prepares
            .close()
            .await
            .map_err(|e| Refusal::Fatal(DaemonError::prepare_log(group, None)(e)))?;
        partition
            .log
            .close()
            .await
            .map_err(|e| Refusal::Fatal(DaemonError::journal(group, None, "partition close")(e)))?;
        let swapped = statexfer::install::swap(staging, &live, false);
        if let Err(error) = &swapped {
            tracing::error!(group, %error, "state transfer: swap failed; reopening the old state");
        }
        self.prepared_at.retain(|(g, _), _| *g != group);
        self.start_partition_group(key, group)
            .await
            .map_err(Refusal::Fatal)?;
        swapped.map_err(|e| Refusal::Skip(format!("swap: {e}")))
    }

    /// Installs a transferred metadata state: the snapshot becomes the journal's
    /// checkpoint, the state machine and the group restart from it, and the partitions
    /// it names are opened.
    async fn install_metadata(
        &mut self,
        staging: &Path,
        commit_op: u64,
        manifest: &Manifest,
    ) -> Result<(), Refusal> {
        let skip = |e: String| Refusal::Skip(e);
        if self.metadata_applied >= commit_op {
            return Err(skip(format!(
                "already applied op {}",
                self.metadata_applied
            )));
        }
        let read = |kind: ArtifactKind| -> Result<Vec<u8>, Refusal> {
            let index = manifest
                .entries
                .iter()
                .position(|e| e.kind == kind)
                .ok_or_else(|| Refusal::Skip(format!("no {kind:?} artifact")))?;
            std::fs::read(staging.join(artifact_file(index as u32)))
                .map_err(|e| Refusal::Skip(format!("{kind:?}: {e}")))
        };
        let snapshot = read(ArtifactKind::MetadataSnapshot)?;
        let table = ClientTableArtifact::decode(&read(ArtifactKind::ClientTable)?)
            .map_err(|e| skip(e.to_string()))?;
        if table.op != commit_op {
            return Err(skip(format!("client table at op {}", table.op)));
        }
        let state = MetadataState::restore(&snapshot).map_err(skip)?;
        let clients = vsr::ClientTable::decode(&table.clients, self.settings.vsr.clients_max)
            .map_err(|e| skip(e.to_string()))?;
        let anchor = PrepareHeader::read_from_prefix(&table.anchor)
            .map(|(header, body)| Frame::build(&header, body))
            .map_err(|_| skip("the anchor is not a prepare".into()))?;
        let superblock = files::read_vsr_superblock(&self.settings.data_dir).map_err(|e| {
            Refusal::Fatal(DaemonError::file(METADATA_GROUP, "metadata install")(e))
        })?;
        let checkpoint = vsr::Checkpoint {
            op: commit_op,
            anchor,
            position: table.position,
            clients,
        };
        // Prepares this journal holds above the new checkpoint stay (they may be
        // promises); the rest of the log is repaired from peers.
        let journal = &self.data.journal;
        let mut entries = Vec::new();
        for op in commit_op + 1..=journal.op_head() {
            let bytes = journal
                .entry(op)
                .ok()
                .map(replication::wire::FrameBuf::from_bytes);
            entries.push(vsr::JournalEntry { op, bytes });
        }
        let mut replica = Replica::restart_from_checkpoint(
            self.settings.vsr.clone(),
            &superblock,
            checkpoint,
            &entries,
        )
        .ok_or_else(|| skip("the anchor is not the prepare of the op".into()))?;
        let payload = files::encode_metadata_checkpoint(&snapshot, &table.clients, &table.anchor);
        self.data
            .install_checkpoint(commit_op, &payload)
            .await
            .map_err(|e| {
                Refusal::Fatal(DaemonError::journal(
                    METADATA_GROUP,
                    Some(commit_op),
                    "metadata install",
                )(e))
            })?;
        let _ = statexfer::install::recover(staging);
        for peer in (0..self.settings.replica_count).filter(|p| *p != self.settings.replica) {
            replica.set_connected(peer, self.bus.is_connected(peer));
        }
        self.groups.insert(replica);
        self.state = state;
        self.metadata_applied = commit_op;
        self.prepared_at.retain(|(g, _), _| *g != METADATA_GROUP);
        self.partitions_pending = true;
        self.sync_partitions(PARTITION_START_BUDGET)
            .await
            .map_err(Refusal::Fatal)
    }
}

/// Why an install did not happen.
pub(super) enum Refusal {
    /// Not installed; the group goes on (and may ask again).
    Skip(String),
    /// Storage failed: the daemon stops.
    Fatal(DaemonError),
}
