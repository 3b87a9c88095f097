//! The fetcher's side of a transfer on disk: artifacts staged as files beside the live
//! directory (a sealed segment this node holds already copied locally when it matches the
//! manifest, and every staged segment verified a step at a time), then turned into a
//! complete partition directory, synced, before the replica executor swaps it in.

use std::cell::RefCell;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use journal::segment::log::{segment_file_name, SealedScan};
use journal::segment::{PartitionConfig, PartitionLog};
use replication::wire::{batch, Operation, PrepareHeader};
use statexfer::install::{artifact_file, fsync_dir, write_back, FileSink};
use statexfer::{ArtifactKind, ArtifactSink, Manifest, ManifestEntry};
use xxhash_rust::xxh3::Xxh3Default;
use zerocopy::FromBytes;

use super::files::{self, ClientTableArtifact, StoredCheckpoint};
use super::prepares::{self, PrepareLog};
use super::DaemonError;

use super::*;

/// Stages artifacts as files, reusing local copies of matching sealed segments.
pub(super) struct StagingSink {
    pub(super) files: FileSink,
    pub(super) staging: PathBuf,
    pub(super) live: PathBuf,
    pub(super) arm: Arm,
    pub(super) group: u64,
    pub(super) partition: PartitionConfig,
    /// Completed sealed segments not yet verified and indexed (artifact index, base
    /// offset, length), oldest first; with `verify_paced`, `Xfer::verify_step` verifies
    /// a slice of the first each tick.
    pub(super) unindexed: std::collections::VecDeque<(u32, u64, u64)>,
    /// The scan of the first of `unindexed` (by artifact index), when begun.
    pub(super) verifying: Option<(u32, SealedScan)>,
    /// The read buffer of the scans, reused from one segment to the next.
    pub(super) scan_buffer: Vec<u8>,
    pub(super) verify_paced: bool,
    pub(super) committed_segments: Vec<(u64, u64)>,
    /// Checksums of local files by inode, shared with the server side: a segment linked
    /// into one transfer is not read again by the next.
    pub(super) hashes: Rc<RefCell<Hashes>>,
}

impl StagingSink {
    /// Verifies about `budget` more bytes of the oldest completed sealed segment, batch
    /// by batch, and writes its index files once it is whole (the staged log's open
    /// loads them), so that the work is spread over the transfer rather than done all
    /// at once before the install. False when no segment waits.
    pub(super) fn verify_next(&mut self, budget: u64) -> std::io::Result<bool> {
        let Some(&(index, base, _)) = self.unindexed.front() else {
            return Ok(false);
        };
        let scan = match &mut self.verifying {
            Some((scanning, scan)) if *scanning == index => scan,
            _ => {
                self.stop_verifying(None);
                let scan = SealedScan::open(
                    &self.staging.join(artifact_file(index)),
                    self.group,
                    base,
                    self.partition,
                    std::mem::take(&mut self.scan_buffer),
                )
                .map_err(std::io::Error::other)?;
                &mut self.verifying.insert((index, scan)).1
            }
        };
        if scan.step(budget).map_err(std::io::Error::other)?.is_some() {
            scan.write_index(&self.staging)
                .map_err(std::io::Error::other)?;
            self.stop_verifying(None);
            self.unindexed.pop_front();
        }
        Ok(true)
    }

    /// Ends the scan under way (only if it is of artifact `index`, when given), keeping
    /// its buffer.
    pub(super) fn stop_verifying(&mut self, index: Option<u32>) {
        if index.is_some() && self.verifying.as_ref().map(|(i, _)| *i) != index {
            return;
        }
        if let Some((_, scan)) = self.verifying.take() {
            self.scan_buffer = scan.into_buffer();
        }
    }

    /// Copies the first `entry.len` bytes of the local segment at `frontier` into the
    /// staged artifact, hashing them; true when they match the manifest entry.
    pub(super) fn copy_local(
        &mut self,
        index: u32,
        entry: &ManifestEntry,
    ) -> std::io::Result<bool> {
        let path = self.live.join(segment_file_name(entry.frontier, "log"));
        let Ok(mut source) = open_without_readahead(&path) else {
            return Ok(false);
        };
        let file_len = source.metadata()?.len();
        if file_len < entry.len {
            return Ok(false);
        }
        let staged = self.staging.join(artifact_file(index));
        let immutable = self
            .committed_segments
            .iter()
            .any(|(base, len)| *base == entry.frontier && *len == file_len);
        if immutable && file_len == entry.len {
            // Committed and whole: share the file (verified by its checksum first).
            let (checksum, _) = self
                .hashes
                .borrow_mut()
                .advance(&path, entry.len, u64::MAX)?;
            if checksum != Some(entry.checksum) {
                return Ok(false);
            }
            let _ = std::fs::remove_file(&staged);
            std::fs::hard_link(&path, &staged)?;
            // Its index files too, when it has them (copied: the live ones may be
            // rewritten); without them the staged log's open rebuilds them.
            for extension in ["index", "timeindex"] {
                let name = segment_file_name(entry.frontier, extension);
                let _ = std::fs::copy(self.live.join(&name), self.staging.join(&name));
            }
            return Ok(true);
        }
        let mut target = File::create(&staged)?;
        let mut done = 0u64;
        let hasher = copy_hashing(&mut source, entry.len, |bytes| {
            target.write_all(bytes)?;
            done += bytes.len() as u64;
            if done.is_multiple_of(STAGING_WRITE_BACK_BYTES) {
                write_back(
                    &target,
                    done - STAGING_WRITE_BACK_BYTES,
                    STAGING_WRITE_BACK_BYTES,
                )?;
            }
            Ok(())
        })?;
        target.sync_data()?;
        Ok(hasher.digest() == entry.checksum)
    }
}

/// Reads the first `len` bytes of `source` a COPY_BUFFER at a time, hashing them and
/// handing each piece to `write`; returns the running checksum of the `len` bytes.
pub(super) fn copy_hashing(
    source: &mut File,
    len: u64,
    mut write: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<Xxh3Default> {
    let mut hasher = Xxh3Default::new();
    let mut buffer = vec![0u8; COPY_BUFFER];
    let mut left = len;
    while left > 0 {
        let n = (left as usize).min(buffer.len());
        source.read_exact(&mut buffer[..n])?;
        hasher.update(&buffer[..n]);
        write(&buffer[..n])?;
        left -= n as u64;
    }
    Ok(hasher)
}

impl ArtifactSink for StagingSink {
    fn begin(&mut self, index: u32) -> std::io::Result<()> {
        // A new target (another peer) stages this artifact again: a verification queued
        // for its earlier bytes would read the new ones half written.
        self.unindexed.retain(|(queued, ..)| *queued != index);
        self.stop_verifying(Some(index));
        self.files.begin(index)
    }

    fn append(&mut self, index: u32, bytes: &[u8]) -> std::io::Result<()> {
        self.files.append(index, bytes)
    }

    /// Syncs the artifact; a sealed segment is then queued to be verified batch by
    /// batch and indexed (`verify_next`).
    fn finish(&mut self, index: u32, manifest: &Manifest) -> std::io::Result<()> {
        self.files.finish(index, manifest)?;
        let Some(entry) = manifest.entries.get(index as usize) else {
            return Ok(());
        };
        if self.arm != Arm::Partition || entry.kind != ArtifactKind::SegmentLog {
            return Ok(());
        }
        // The newest segment is the log's active one: the open scans it.
        let newest = manifest
            .entries
            .iter()
            .filter(|e| e.kind == ArtifactKind::SegmentLog)
            .map(|e| e.frontier)
            .max();
        if newest == Some(entry.frontier) {
            return Ok(());
        }
        self.unindexed.push_back((index, entry.frontier, entry.len));
        if self.verify_paced {
            return Ok(());
        }
        while self.verify_next(u64::MAX)? {}
        Ok(())
    }

    fn reuse(&mut self, index: u32, entry: &ManifestEntry) -> bool {
        self.unindexed.retain(|(queued, ..)| *queued != index);
        self.stop_verifying(Some(index));
        if self.arm != Arm::Partition || entry.kind != ArtifactKind::SegmentLog {
            return false;
        }
        match self.copy_local(index, entry) {
            Ok(true) => true,
            // A local copy that differs (or cannot be read) is fetched instead.
            _ => false,
        }
    }

    /// The segment this node holds shorter than the manifest's (the server's open
    /// segment, of which an earlier round installed a part here): its bytes are staged
    /// and only the rest is fetched. A later round of a rejoin under load then costs
    /// what the cluster wrote since the last one, not a whole segment again. Bytes
    /// that differ from the server's are caught by the whole-artifact check.
    fn reuse_prefix(&mut self, index: u32, entry: &ManifestEntry) -> Option<(u64, Xxh3Default)> {
        if self.arm != Arm::Partition || entry.kind != ArtifactKind::SegmentLog {
            return None;
        }
        let path = self.live.join(segment_file_name(entry.frontier, "log"));
        let mut source = open_without_readahead(&path).ok()?;
        let held = source.metadata().ok()?.len();
        if held == 0 || held >= entry.len {
            return None;
        }
        let staged = self.begin(index).and_then(|()| {
            let files = &mut self.files;
            copy_hashing(&mut source, held, |bytes| files.append(index, bytes))
        });
        match staged {
            Ok(hasher) => Some((held, hasher)),
            Err(error) => {
                tracing::debug!(path = %path.display(), %error,
                    "state transfer: a held segment prefix cannot be staged; fetching it whole");
                None
            }
        }
    }
}

/// Syncs every staged artifact and the staging directory.
pub(super) fn sync_staged(staging: &Path, manifest: &Manifest) -> Result<(), DaemonError> {
    for index in 0..manifest.entries.len() as u32 {
        let path = staging.join(artifact_file(index));
        File::open(&path)
            .and_then(|f| f.sync_all())
            .map_err(DaemonError::io("sync", &path))?;
    }
    fsync_dir(staging).map_err(DaemonError::io("sync", staging))
}

/// Turns a verified partition transfer into a partition directory: segment files under
/// their names, the consumer offsets file, the checkpoint and the anchor's prepare
/// record; then opens the log once (rebuilding its indexes, checking every batch) and
/// syncs everything.
pub(super) async fn materialize_partition(
    staging: &Path,
    manifest: &Manifest,
    group: u64,
    config: PartitionConfig,
) -> Result<(), DaemonError> {
    let checkpoint = place_artifacts(staging, manifest, group)?;
    let op = checkpoint.op;
    let position = checkpoint.position;
    let record = anchor_record(group, &checkpoint)?;
    check_staged_log_end(staging, group, config, op, position.next_offset).await?;
    let (mut records, _) = PrepareLog::open(staging)
        .await
        .map_err(DaemonError::prepare_log(group, Some(op)))?;
    records
        .append(&record)
        .await
        .map_err(DaemonError::prepare_log(group, Some(op)))?;
    records
        .close()
        .await
        .map_err(DaemonError::prepare_log(group, Some(op)))?;
    files::write_checkpoint(
        staging,
        &StoredCheckpoint {
            op,
            position,
            clients: checkpoint.clients,
        },
    )
    .map_err(DaemonError::file(group, "checkpoint"))?;
    sync_partition_dir(staging)
}

fn corrupt(group: u64, op: Option<u64>, detail: String) -> DaemonError {
    DaemonError::Corrupt { group, op, detail }
}

/// Renames the staged segments and offsets file to their names in a partition
/// directory and returns the transfer's client table (checked to be this group's).
fn place_artifacts(
    staging: &Path,
    manifest: &Manifest,
    group: u64,
) -> Result<ClientTableArtifact, DaemonError> {
    let mut checkpoint = None;
    for (index, entry) in manifest.entries.iter().enumerate() {
        let path = staging.join(artifact_file(index as u32));
        match entry.kind {
            ArtifactKind::SegmentLog => {
                let target = staging.join(segment_file_name(entry.frontier, "log"));
                std::fs::rename(&path, &target).map_err(DaemonError::io("segment", &path))?;
            }
            ArtifactKind::ConsumerOffsets => {
                let bytes = std::fs::read(&path).map_err(DaemonError::io("offsets", &path))?;
                journal::segment::offsets::decode(&bytes)
                    .map_err(|e| corrupt(group, None, format!("offsets: {e}")))?;
                let target = staging.join(journal::segment::offsets::OFFSETS_FILE);
                std::fs::rename(&path, &target).map_err(DaemonError::io("offsets", &path))?;
            }
            ArtifactKind::ClientTable => {
                let bytes = std::fs::read(&path).map_err(DaemonError::io("client table", &path))?;
                std::fs::remove_file(&path).map_err(DaemonError::io("client table", &path))?;
                checkpoint = Some(
                    ClientTableArtifact::decode(&bytes)
                        .map_err(|e| corrupt(group, None, format!("client table: {e}")))?,
                );
            }
            ArtifactKind::MetadataSnapshot => {
                return Err(corrupt(
                    group,
                    None,
                    "a partition transfer carried a metadata snapshot".into(),
                ))
            }
        }
    }
    let checkpoint = checkpoint
        .ok_or_else(|| corrupt(group, None, "the transfer carried no client table".into()))?;
    if checkpoint.position.partition_id != group {
        return Err(corrupt(
            group,
            Some(checkpoint.op),
            format!(
                "the checkpoint belongs to group {}, not {group}",
                checkpoint.position.partition_id
            ),
        ));
    }
    Ok(checkpoint)
}

/// The prepare record of the checkpoint's anchor (the prepare of its op), checked
/// against the checkpoint's position.
fn anchor_record(
    group: u64,
    checkpoint: &ClientTableArtifact,
) -> Result<prepares::Record, DaemonError> {
    let op = Some(checkpoint.op);
    let (header, body) = PrepareHeader::read_from_prefix(&checkpoint.anchor)
        .map_err(|_| corrupt(group, op, "the anchor is not a prepare".into()))?;
    if header.op != checkpoint.op {
        return Err(corrupt(
            group,
            op,
            format!(
                "the anchor is op {}, the checkpoint op {}",
                header.op, checkpoint.op
            ),
        ));
    }
    let body = body
        .get(..(header.frame.size as usize).saturating_sub(256))
        .ok_or_else(|| corrupt(group, op, "the anchor is truncated".into()))?;
    let position = checkpoint.position;
    if header.operation != Operation::SendMessages as u8 {
        return Ok(prepares::Record {
            header,
            base_offset: position.next_offset,
            next_offset: position.next_offset,
            last_timestamp: position.last_timestamp,
            inline: body.to_vec(),
        });
    }
    let info = batch::verify(body).map_err(|source| DaemonError::Batch {
        group,
        op: checkpoint.op,
        what: "anchor batch",
        source,
    })?;
    if info.next_offset() != position.next_offset {
        return Err(corrupt(
            group,
            op,
            "the anchor batch does not end at the checkpoint position".into(),
        ));
    }
    Ok(prepares::Record {
        header,
        base_offset: info.base_offset,
        next_offset: info.next_offset(),
        last_timestamp: position.last_timestamp,
        inline: Vec::new(),
    })
}

/// Opens the staged log once (rebuilding its indexes, checking every batch) and checks
/// that it ends where the checkpoint does.
async fn check_staged_log_end(
    staging: &Path,
    group: u64,
    config: PartitionConfig,
    op: u64,
    next_offset: u64,
) -> Result<(), DaemonError> {
    let (log, _) = PartitionLog::open(staging, group, config)
        .await
        .map_err(DaemonError::journal(group, None, "staged log"))?;
    let end = log.next_offset();
    log.close()
        .await
        .map_err(DaemonError::journal(group, None, "staged log"))?;
    if end != next_offset {
        return Err(corrupt(
            group,
            Some(op),
            format!("the staged log ends at offset {end}, the checkpoint at {next_offset}"),
        ));
    }
    Ok(())
}

/// Syncs a materialized partition directory's files and the directory itself.
fn sync_partition_dir(staging: &Path) -> Result<(), DaemonError> {
    // Data syncs only: the directory sync below makes the names durable, and a file
    // whose data the sink already synced costs nothing (a full fsync would commit the
    // filesystem journal once per file for the timestamps alone, each commit a disk
    // flush the cluster's own fsyncs queue behind). Segment indexes are rebuilt if lost,
    // so, as in the live log, they are not synced.
    let entries = std::fs::read_dir(staging).map_err(DaemonError::io("staging", staging))?;
    for entry in entries.filter_map(|e| e.ok()) {
        let path = entry.path();
        let extension = path.extension().and_then(|e| e.to_str());
        if matches!(extension, Some("index" | "timeindex")) {
            continue;
        }
        File::open(&path)
            .and_then(|f| f.sync_data())
            .map_err(DaemonError::io("sync", &path))?;
    }
    fsync_dir(staging).map_err(DaemonError::io("staging", staging))
}
