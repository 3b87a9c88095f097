//! Partition storage on one node: the segment log and consumer offsets of every
//! partition group, opened when the metadata op that creates the partition commits.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use journal::segment::{ConsumerOffsets, PartitionConfig, PartitionLog};
use journal::Durability;
use replication::wire::PartitionKey;

use replication::wire::FrameBuf;
use zerocopy::IntoBytes;

use super::files::{self, StoredCheckpoint};
use super::prepares::{self, PrepareLog, Record};
use super::DaemonError;
use crate::node_core::JournalAt;
use crate::state::partition::PartitionState;

/// Bytes of log a poll reads at most (whole batches; the reply stays far below the
/// frame limit).
pub const POLL_BYTES_MAX: u64 = 4 << 20;

/// One partition's data and the consensus state stored beside it.
pub struct Partition {
    pub key: PartitionKey,
    pub dir: PathBuf,
    /// Batches of every journaled prepare, committed or not (reads stop at
    /// `state.committed_end`).
    pub log: PartitionLog,
    pub offsets: ConsumerOffsets,
    /// The group's prepare records (prepares.rs).
    pub prepares: PrepareLog,
    /// What its committed ops made of it: the op and log offset applied up to, the
    /// last durable checkpoint's op.
    pub state: PartitionState,
    /// Whether the partition has applied everything its group had committed, once
    /// since it was opened: until then it serves no reads (`Node::catching_up`).
    pub caught_up: std::cell::Cell<bool>,
}

impl Partition {
    /// Where the group's journal stands, for the JournalAppend of `op`.
    pub fn journal_at(&self, op: u64) -> JournalAt {
        JournalAt {
            head: self.prepares.head(),
            empty: self.prepares.is_empty(),
            committed_op: self.state.committed_op,
            identity: self.prepares.get(op).map(|e| e.identity),
        }
    }

    /// Forces the segment log and the prepare records to stable storage, as a task that
    /// holds only the files (the two fdatasyncs overlap, and many partitions' can run at
    /// once). Once it succeeded, call `log.note_synced()`. `group` is the partition's.
    pub fn journal_syncer(
        &self,
        group: u64,
    ) -> impl std::future::Future<Output = Result<(), DaemonError>> + 'static {
        let (log, prepares) = (self.log.syncer(), self.prepares.syncer());
        async move {
            let (log, prepares) = futures_lite::future::zip(log.run(), prepares).await;
            log.map_err(DaemonError::journal(group, None, "journal sync"))?;
            prepares.map_err(DaemonError::prepare_log(group, None))
        }
    }

    /// Drops every journaled prepare above `op_max`: records first (none may point past
    /// the log), then their batches. `group` is the partition's.
    pub async fn truncate_after(&mut self, group: u64, op_max: u64) -> Result<(), DaemonError> {
        let Some(base) = self.prepares.get(op_max + 1).map(|e| e.base_offset) else {
            return Ok(());
        };
        let op = Some(op_max + 1);
        self.prepares
            .truncate_after(op_max)
            .await
            .map_err(DaemonError::prepare_log(group, op))?;
        self.log
            .truncate_from(base)
            .await
            .map_err(DaemonError::journal(group, op, "journal truncate"))
    }
}

/// Every partition this node stores, by group.
#[derive(Default)]
pub struct Partitions {
    pub by_group: BTreeMap<u64, Partition>,
    /// Groups whose log or consumer offsets may hold writes not yet synced: the tick
    /// visits these, not every partition (most are idle).
    pub unsynced: BTreeSet<u64>,
    /// Groups whose prepare log file is open (written lately): the tick closes those
    /// idle for `PREPARES_IDLE_CLOSE`, so an idle partition holds one open file.
    pub prepares_open: BTreeSet<u64>,
    /// A partition was written since the node last summed what the partitions store.
    pub grown: bool,
    /// Groups whose storage opens in the background (`Node::spawn_open`).
    pub opening: BTreeSet<u64>,
}

impl Partitions {
    /// Drops from `prepares_open` the partitions gone or reopened since (their prepare
    /// log holds no file).
    pub fn forget_closed_prepares(&mut self) {
        let by_group = &self.by_group;
        self.prepares_open.retain(|group| {
            by_group
                .get(group)
                .is_some_and(|partition| partition.prepares.is_open())
        });
    }
}

/// What opening a partition found on disk for its consensus group.
pub struct Opened {
    pub partition: Partition,
    /// Prepare records from the checkpoint (or op 1) up, reconciled with the log.
    pub records: Vec<Record>,
    pub checkpoint: Option<StoredCheckpoint>,
    pub superblock: replication::vsr::Superblock,
}

/// The folder of a partition inside the data directory's `partitions/`.
pub fn partition_dir(data_dir: &Path, key: PartitionKey) -> PathBuf {
    data_dir
        .join(journal::data_dir::PARTITIONS_DIR)
        .join(format!("{}-{}-{}", key.stream, key.topic, key.partition))
}

/// Opens (creating if absent) one partition's log, offsets, prepare records, VSR
/// superblock and checkpoint, and reconciles the log with the records: records whose
/// batch the log lost are dropped, and batches past the last record (never
/// acknowledged) are cut from the log.
pub async fn open(
    data_dir: &Path,
    key: PartitionKey,
    group: u64,
    config: PartitionConfig,
    offset_durability: Durability,
) -> Result<Opened, DaemonError> {
    let dir = partition_dir(data_dir, key);
    // A new partition's superblock and prepare log files go in before its log's first
    // segment, whose directory sync (PartitionLog::open) makes every entry durable (the
    // prepare log's first write then opens a file that is there already).
    let fresh = !dir.exists();
    files::create_vsr_superblock(&dir, !fresh)
        .map_err(DaemonError::file(group, "VSR superblock"))?;
    if fresh {
        prepares::create_empty(&dir).map_err(DaemonError::prepare_log(group, None))?;
    }
    let (mut log, report) = PartitionLog::open(&dir, group, config)
        .await
        .map_err(DaemonError::journal(group, None, "segment log"))?;
    if let Some((from, to)) = report.truncated_tail {
        tracing::warn!(?key, from, to, "partition log: torn tail truncated");
    }
    let offsets = ConsumerOffsets::open(&dir.join("consumer-offsets"), offset_durability)
        .map_err(DaemonError::journal(group, None, "consumer offsets"))?;
    let (mut prepares, mut records) = PrepareLog::open(&dir)
        .await
        .map_err(DaemonError::prepare_log(group, None))?;
    reconcile(key, group, &mut log, &mut prepares, &mut records).await?;
    let checkpoint =
        files::read_checkpoint(&dir).map_err(DaemonError::file(group, "checkpoint"))?;
    let superblock = files::read_vsr_superblock(&dir).unwrap_or_else(|error| {
        // Its promises are unknown: the group rejoins as a replacement that votes once
        // it caught up (a group of one replica has nobody to catch up from and goes on).
        tracing::error!(?key, %error, "partition VSR superblock unreadable");
        replication::vsr::Superblock {
            replacement: true,
            ..replication::vsr::Superblock::default()
        }
    });
    let (committed_op, committed_end) =
        committed_start(&dir, group, checkpoint.as_ref(), &prepares, &log, &records)?;
    if let Some(checkpoint) = &checkpoint {
        records.retain(|r| r.op() >= checkpoint.op);
    }
    let partition = Partition {
        key,
        dir,
        log,
        offsets,
        prepares,
        state: PartitionState::opened(committed_op, committed_end),
        caught_up: std::cell::Cell::new(false),
    };
    Ok(Opened {
        partition,
        records,
        checkpoint,
        superblock,
    })
}

/// Reconciles a partition's log with its prepare records: records whose batch the log
/// lost are dropped, and batches past the last record (never acknowledged) are cut.
async fn reconcile(
    key: PartitionKey,
    group: u64,
    log: &mut PartitionLog,
    prepares: &mut PrepareLog,
    records: &mut Vec<Record>,
) -> Result<(), DaemonError> {
    let log_end = log.next_offset();
    if let Some(lost) = records.iter().position(|r| r.next_offset > log_end) {
        let op = records[lost].op();
        tracing::warn!(
            ?key,
            op,
            log_end,
            "prepare records past the log's end dropped"
        );
        prepares
            .truncate_after(op - 1)
            .await
            .map_err(DaemonError::prepare_log(group, Some(op)))?;
        records.truncate(lost);
    }
    if let Some(last) = records.last() {
        if log_end > last.next_offset {
            tracing::warn!(
                ?key,
                from = last.next_offset,
                to = log_end,
                "unacknowledged batches past the last prepare record cut"
            );
            log.truncate_from(last.next_offset)
                .await
                .map_err(DaemonError::journal(group, None, "segment log"))?;
        }
    }
    Ok(())
}

/// The op and log offset a partition's committed state starts from: its checkpoint's,
/// else (no checkpoint yet) the log's start.
fn committed_start(
    dir: &Path,
    group: u64,
    checkpoint: Option<&StoredCheckpoint>,
    prepares: &PrepareLog,
    log: &PartitionLog,
    records: &[Record],
) -> Result<(u64, u64), DaemonError> {
    if let Some(checkpoint) = checkpoint {
        if prepares.get(checkpoint.op).is_none() {
            return Err(DaemonError::Corrupt {
                group,
                op: Some(checkpoint.op),
                detail: format!(
                    "{}: the checkpoint at this op has no prepare record",
                    dir.display()
                ),
            });
        }
        return Ok((checkpoint.op, checkpoint.position.next_offset));
    }
    match records.first() {
        Some(first) if first.op() == 1 => Ok((0, first.base_offset)),
        Some(first) => Err(DaemonError::Corrupt {
            group,
            op: Some(first.op()),
            detail: format!(
                "{}: prepare records start at this op but there is no checkpoint",
                dir.display()
            ),
        }),
        None => Ok((0, log.next_offset())),
    }
}

/// The prepare frame of a record of partition group `group`: its header and its body
/// (the batch read back from the log, or the inline body).
pub fn frame_of(group: u64, log: &PartitionLog, record: &Record) -> Result<FrameBuf, DaemonError> {
    let op = record.op();
    let mut bytes = record.header.as_bytes().to_vec();
    if record.next_offset > record.base_offset {
        let batch = log
            .read_from_offset(record.base_offset, 1)
            .map_err(DaemonError::journal(group, Some(op), "batch read back"))?
            .into_iter()
            .next()
            .unwrap_or_default();
        let info =
            replication::wire::batch::verify(&batch).map_err(|source| DaemonError::Batch {
                group,
                op,
                what: "batch read back",
                source,
            })?;
        if info.base_offset != record.base_offset || info.next_offset() != record.next_offset {
            return Err(DaemonError::Corrupt {
                group,
                op: Some(op),
                detail: format!(
                    "the log holds offsets {}..{} where the record says {}..{}",
                    info.base_offset,
                    info.next_offset(),
                    record.base_offset,
                    record.next_offset
                ),
            });
        }
        bytes.extend_from_slice(&batch);
    } else {
        bytes.extend_from_slice(&record.inline);
    }
    Ok(FrameBuf::from_bytes(&bytes))
}
