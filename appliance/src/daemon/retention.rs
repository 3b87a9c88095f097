//! Retention (docs/operations.md, "Disk space"): whole sealed segments are deleted,
//! oldest first, never the active one, when their newest message is older than the
//! topic's message expiry or while the topic holds more than its size limit.
//!
//! Every replica deletes the same segments. The metadata primary decides, from the
//! segments it stores and its clock, and commits the decision as TruncatePartition (a
//! partition's new first offset, a segment boundary) through the metadata group; each
//! replica applies it from committed state: polls start at that offset at once, and the
//! segment files below it are removed once the partition's checkpoint is past them
//! (a restart replays from the checkpoint's own batch, which must stay readable).
//! The primary proposes under an internal session of this node (`RETENTION_CLIENT`),
//! so retried proposals are deduplicated by the client table like any request.

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime};

use replication::vsr::{RequestOutcome, Status as VsrStatus};
use replication::wire::{Frame, Header, Operation, PartitionKey, RequestHeader, METADATA_GROUP};

use super::node::Node;
use super::DaemonError;
use crate::node_core::retention::{
    decide, resolve, Sealed, Stored, PROPOSAL_TIMEOUT, RETENTION_CLIENT,
};
use crate::state::metadata::ROOT_USER_ID;
use crate::state::MetadataOp;

impl Node {
    /// What this node stores of a partition, for the decision and ListTopics.
    pub(super) fn stored(&self, key: PartitionKey) -> Option<Stored> {
        let partition = self.partitions.by_group.get(&key.pack().ok()?)?;
        let first_offset = self
            .state
            .retained_from(key)
            .max(partition.log.start_offset());
        let mut sealed = Vec::new();
        let mut bytes = 0;
        if partition.log.segment_count() == 1 {
            // Only the active segment, which retention never deletes: its bytes count
            // toward the topic's size, without a file name built per partition per check.
            if partition.log.next_offset() > first_offset {
                bytes = partition.log.stored_bytes();
            }
        } else {
            let segments = partition.log.segments();
            for (i, (_, path, len)) in segments.iter().enumerate() {
                let next_offset = segments
                    .get(i + 1)
                    .map_or(partition.log.next_offset(), |s| s.0);
                if next_offset <= first_offset {
                    continue;
                }
                bytes += len;
                if i + 1 < segments.len() {
                    let written = std::fs::metadata(path)
                        .and_then(|m| m.modified())
                        .unwrap_or_else(|_| SystemTime::now());
                    sealed.push(Sealed {
                        next_offset,
                        bytes: *len,
                        written,
                    });
                }
            }
        }
        Some(Stored {
            key,
            first_offset,
            committed_end: partition.state.committed_end,
            sealed,
            bytes,
        })
    }

    /// The offset DeleteSegments of `segments` resolves to here: the end of the
    /// `segments`-th committed sealed segment above the retained offset, or of the last
    /// one when there are fewer (None: no sealed segment to delete).
    pub(super) fn resolve_delete_segments(&self, key: PartitionKey, segments: u32) -> Option<u64> {
        let stored = self.stored(key)?;
        stored
            .sealed
            .iter()
            .take_while(|s| s.next_offset <= stored.committed_end)
            .take(segments.max(1) as usize)
            .last()
            .map(|s| s.next_offset)
    }

    /// On the metadata primary, every `[retention] check_interval`: decides what each
    /// topic's retention deletes and proposes it.
    pub(super) fn retention_tick(&mut self) {
        if !self
            .ticks
            .is_multiple_of(self.settings.retention.check_ticks)
        {
            return;
        }
        let Some(metadata) = self.groups.get(METADATA_GROUP) else {
            return;
        };
        if !metadata.is_primary()
            || metadata.status() != VsrStatus::Normal
            || !metadata.is_voter()
            || metadata.op() != metadata.commit()
        {
            return;
        }
        let now = SystemTime::now();
        self.retention
            .pending
            .retain(|_, at| at.elapsed() < PROPOSAL_TIMEOUT);
        // Only a sealed segment can go (the active one never does): a topic none of
        // whose partitions here has one is passed over without reading its partitions'
        // sizes, so an idle node's check costs one pass over its partitions, not a
        // look at each partition's segments.
        let sealed: BTreeSet<(u32, u32)> = self
            .partitions
            .by_group
            .values()
            .filter(|p| p.log.segment_count() > 1)
            .map(|p| (p.key.stream, p.key.topic))
            .collect();
        if sealed.is_empty() {
            return;
        }
        let defaults = self.settings.retention;
        let mut proposals = Vec::new();
        for (stream_id, stream) in &self.state.streams {
            for (topic_id, topic) in &stream.topics {
                if !sealed.contains(&(*stream_id, *topic_id)) {
                    continue;
                }
                let expiry = resolve(
                    topic.message_expiry,
                    defaults.message_expiry.as_micros() as u64,
                )
                .map(Duration::from_micros);
                let max_size = resolve(topic.max_topic_size, defaults.max_topic_size);
                if expiry.is_none() && max_size.is_none() {
                    continue;
                }
                let stored: Vec<Stored> = (0..topic.partition_count)
                    .filter_map(|partition| {
                        self.stored(PartitionKey {
                            stream: *stream_id,
                            topic: *topic_id,
                            partition,
                        })
                    })
                    .collect();
                proposals.extend(decide(&stored, expiry, max_size, now));
            }
        }
        for (key, first_offset) in proposals {
            if self.retention.pending.contains_key(&key) {
                continue;
            }
            if !self.propose_truncate(key, first_offset) {
                return;
            }
        }
    }

    /// Proposes TruncatePartition under this node's internal session (registering it
    /// first when the client table does not hold it); false when no more can be
    /// proposed now.
    fn propose_truncate(&mut self, key: PartitionKey, first_offset: u64) -> bool {
        let client = RETENTION_CLIENT - u128::from(self.settings.replica);
        let Some(metadata) = self.groups.get_mut(METADATA_GROUP) else {
            return false;
        };
        let mut header = RequestHeader::new();
        header.frame.cluster = self.settings.cluster;
        header.client = client;
        header.user_id = ROOT_USER_ID;
        let Some(session) = metadata.clients().get(client) else {
            let registering = self.retention.registering;
            if registering.is_some_and(|at| at.elapsed() < PROPOSAL_TIMEOUT) {
                return false;
            }
            header.operation = Operation::Register as u8;
            let frame = Frame::build(&header, &[]);
            if matches!(
                metadata.on_request(frame.as_bytes()),
                RequestOutcome::Prepared { .. }
            ) {
                self.retention.registering = Some(Instant::now());
            }
            return false;
        };
        let work = &mut self.retention;
        work.registering = None;
        if work.session != session.session {
            work.session = session.session;
            work.next_request = 0;
        }
        // Above every committed request; proposals in flight take the numbers after.
        work.next_request = work.next_request.max(session.request + 1);
        header.session = session.session;
        header.request = work.next_request;
        header.operation = Operation::DeleteSegments as u8;
        let body = MetadataOp::TruncatePartition {
            partition: key,
            first_offset,
        }
        .encode();
        let frame = Frame::build(&header, &[]);
        match metadata.on_request_prepared(frame.as_bytes(), Operation::TruncatePartition, &body) {
            RequestOutcome::Prepared { .. } => {
                tracing::info!(
                    ?key,
                    first_offset,
                    "retention: proposing the segments below"
                );
                work.pending.insert(key, Instant::now());
                work.next_request += 1;
                true
            }
            RequestOutcome::PipelineFull | RequestOutcome::InProgress => false,
            _ => {
                // A session gone meanwhile: registered again at the next check.
                self.reject("retention_not_prepared");
                false
            }
        }
    }

    /// After a TruncatePartition commits: the proposal is settled and the partition's
    /// files below the new offset go once its checkpoint allows.
    pub(super) fn on_retention_commit(&mut self, key: PartitionKey) {
        self.retention.pending.remove(&key);
        if let Ok(group) = key.pack() {
            self.retention.to_delete.insert(group);
        }
    }

    /// Removes the segment files of `group` below its retained offset that no restart
    /// needs: wholly below the batch of the partition's checkpoint op.
    pub(super) fn delete_retained(&mut self, group: u64) -> Result<(), DaemonError> {
        let Some(key) = Node::partition_key(group) else {
            return Ok(());
        };
        let from = self.state.retained_from(key);
        let Some(partition) = self.partitions.by_group.get_mut(&group) else {
            self.retention.to_delete.remove(&group);
            return Ok(());
        };
        let anchor = match partition.state.checkpoint_op {
            0 => 0,
            op => partition.prepares.get(op).map_or(0, |e| e.base_offset),
        };
        let below = from.min(anchor);
        if below <= partition.log.start_offset() {
            if from <= partition.log.start_offset() {
                self.retention.to_delete.remove(&group);
            }
            return Ok(());
        }
        let files = partition.log.take_segments_before(below);
        if !files.is_empty() {
            tracing::info!(
                ?key,
                segments = files.len() / 3,
                first_offset = partition.log.start_offset(),
                "retention: segments deleted"
            );
            // Unlinking and the directory sync run on the blocking pool, never in the
            // node loop; what a crash leaves is removed after the restart.
            let dir = partition.dir.clone();
            let removal = glommio::executor().spawn_blocking(move || remove_files(&dir, &files));
            glommio::spawn_local(removal).detach();
        }
        if from <= partition.log.start_offset() || partition.log.segments().len() == 1 {
            self.retention.to_delete.remove(&group);
        }
        Ok(())
    }
}

/// Removes segment files retention took (a missing index file is no error) and syncs
/// their directory.
fn remove_files(dir: &std::path::Path, files: &[std::path::PathBuf]) {
    for path in files {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::error!(path = %path.display(), %error, "retention: cannot remove");
            }
        }
    }
    if let Err(error) = std::fs::File::open(dir).and_then(|d| d.sync_all()) {
        tracing::error!(dir = %dir.display(), %error, "retention: cannot sync the directory");
    }
}
