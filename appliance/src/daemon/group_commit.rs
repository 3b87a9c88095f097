//! Group commit of the partition groups' journals. A partition group's JournalAppend is
//! staged, not written at once: the round's later actions (the chain Send of a prepare
//! above all) go out without waiting for the disk. When the round's actions are done,
//! every partition with staged prepares writes them in one coalesced segment write and
//! one record write, all partitions at once; each written partition then syncs once
//! (under `message_durability = "every"`), and only then are its prepares reported
//! durable to the consensus, which sends the PrepareOks (vsr/mod.rs, "Ordering
//! contract": a JournalAppend completes asynchronously).
//!
//! Prepares that do not extend the journal (a rewrite below the head, a gap) take the
//! one-at-a-time path of `partition_journal`, after the group's staged ones.

use std::time::Instant;

use replication::vsr::Action;
use replication::wire::{Frame, Operation, PrepareHeader};
use zerocopy::FromBytes;

use super::node::{slow_step, Node};
use super::partitions::Partition;
use super::prepares;
use super::DaemonError;

/// Prepares staged per partition group in one round at most: past it the group's staged
/// ones are written before more are taken (bounds the memory a round holds).
const STAGED_OPS_MAX: usize = 1024;

/// What writing a partition's staged prepares did.
struct Written {
    /// The ops now in the journal (not yet synced), with their identities.
    journaled: Vec<(u64, u128)>,
    /// Reasons for `rejected` of the ops refused (they and the ops after them were not
    /// journaled; the consensus asks again).
    refused: Vec<&'static str>,
}

impl Node {
    /// The JournalAppend of a partition group: staged for the round's group commit when
    /// it extends the journal, else journaled one at a time.
    pub(super) async fn partition_append(
        &mut self,
        group: u64,
        op: u64,
        frame: Frame,
    ) -> Result<(), DaemonError> {
        let Some(partition) = self.partitions.by_group.get(&group) else {
            return Ok(());
        };
        let checksum = frame.checksum();
        let staged = self.staged.entry(group).or_default();
        if let Some(at) = staged.iter().position(|(staged_op, _)| *staged_op >= op) {
            if staged[at].0 == op && staged[at].1.checksum() == checksum {
                // Asked again for a prepare staged this round: it is reported with it.
                return Ok(());
            }
            // Replaces staged prepares never written (nor reported): drop them.
            staged.truncate(at);
        }
        let head = staged
            .last()
            .map_or(partition.prepares.head(), |(staged_op, _)| *staged_op);
        let recorded = partition
            .prepares
            .get(op)
            .is_some_and(|e| e.identity == checksum);
        let follows = op == head + 1 || (head == 0 && partition.prepares.is_empty() && op == 1);
        if follows && !recorded && op > partition.committed_op {
            staged.push((op, frame));
            if staged.len() >= STAGED_OPS_MAX {
                self.write_staged(group).await?;
            }
            return Ok(());
        }
        if staged.is_empty() {
            self.staged.remove(&group);
        }
        // Everything staged below it goes first, in order.
        self.write_staged(group).await?;
        if let Some(checksum) = self.partition_journal(group, op, &frame).await? {
            self.unsynced.push((group, op, checksum));
        }
        Ok(())
    }

    /// Writes one group's staged prepares now (before a commit of one of them is
    /// applied, or an action that must not overtake them). Not synced: the round's
    /// flush syncs them.
    pub(super) async fn write_staged(&mut self, group: u64) -> Result<(), DaemonError> {
        let Some(ops) = self.staged.remove(&group) else {
            return Ok(());
        };
        let Some(partition) = self.partitions.by_group.get_mut(&group) else {
            return Ok(());
        };
        let written = write_staged_ops(partition, group, &ops)
            .await
            .map_err(DaemonError::Runtime)?;
        self.note_written(group, written);
        Ok(())
    }

    fn note_written(&mut self, group: u64, written: Written) {
        for reason in written.refused {
            self.bus.stats().reject(reason);
        }
        if !written.journaled.is_empty() {
            self.partitions_written.insert(group);
        }
        self.unsynced.extend(
            written
                .journaled
                .into_iter()
                .map(|(op, checksum)| (group, op, checksum)),
        );
    }

    /// Whether a partition group has prepares staged or written but not yet synced.
    pub(super) fn partition_unflushed(&self, group: u64) -> bool {
        self.staged.contains_key(&group) || self.partitions_written.contains(&group)
    }

    /// Whether any journal work of the round is still to be flushed.
    pub(super) fn journals_unflushed(&self) -> bool {
        !self.staged.is_empty() || !self.unsynced.is_empty() || !self.partitions_written.is_empty()
    }

    /// Group commit: writes every partition's staged prepares (all partitions at once),
    /// syncs the segment logs and prepare records written since the last flush (under
    /// message_durability = every), then reports their prepares durable to the
    /// consensus, which sends the PrepareOks.
    pub(super) async fn flush_partition_journals(&mut self) -> Result<(), DaemonError> {
        if !self.journals_unflushed() {
            return Ok(());
        }
        let started = Instant::now();
        let staged = std::mem::take(&mut self.staged);
        let written_before = std::mem::take(&mut self.partitions_written);
        // One future per partition: its coalesced writes, then its syncs; partitions
        // overlap each other's writes and fdatasyncs.
        let work = self
            .partitions
            .by_group
            .iter_mut()
            .filter(|(group, _)| staged.contains_key(group) || written_before.contains(group))
            .map(|(group, partition)| {
                let ops = staged.get(group).map_or(&[][..], Vec::as_slice);
                let synced_before = written_before.contains(group);
                async move {
                    let written = write_staged_ops(partition, *group, ops).await?;
                    if (synced_before || !written.journaled.is_empty())
                        && partition.log.syncs_every_batch()
                    {
                        partition
                            .sync_journal()
                            .await
                            .map_err(|e| format!("partition group {group}: {e}"))?;
                    }
                    Ok::<_, String>((*group, written))
                }
            });
        let results = journal::join_all(work).await;
        for result in results {
            let (group, written) = result.map_err(DaemonError::Runtime)?;
            self.note_written(group, written);
        }
        // Synced above, with everything else this round wrote.
        self.partitions_written.clear();
        slow_step("partition journal sync", started);
        let pending = std::mem::take(&mut self.unsynced);
        if !pending.is_empty() {
            let _ = self
                .latencies
                .journal_fsync
                .record(started.elapsed().as_micros() as u64);
        }
        for (group, op, checksum) in pending {
            if let Some(replica) = self.groups.get_mut(group) {
                replica.on_journal_durable(op, checksum);
            }
        }
        Ok(())
    }

    /// Before `action` of `group` runs: a truncation or a new view must not overtake
    /// that group's writes still staged or unsynced.
    pub(super) async fn order_before(
        &mut self,
        group: u64,
        action: &Action,
    ) -> Result<(), DaemonError> {
        let ordered = matches!(
            action,
            Action::JournalTruncate { .. } | Action::PersistSuperblock(_)
        );
        if ordered && self.partition_unflushed(group) {
            self.flush_partition_journals().await?;
        }
        Ok(())
    }

    /// Journals the prepare of `op` of a partition group on its own: its batch into the
    /// segment log, its record into the prepare log, both durable per
    /// `message_durability` before it is reported. Returns the identity when it is
    /// journaled, None when it cannot be yet (a gap below it) or must not be (it would
    /// rewrite a committed op).
    pub(super) async fn partition_journal(
        &mut self,
        group: u64,
        op: u64,
        frame: &Frame,
    ) -> Result<Option<u128>, DaemonError> {
        // Staged prepares below it are journaled first.
        self.write_staged(group).await?;
        let Some(partition) = self.partitions.by_group.get_mut(&group) else {
            return Ok(None);
        };
        let checksum = frame.checksum();
        let fail =
            |e: String| DaemonError::Runtime(format!("partition group {group} op {op}: {e}"));
        if partition
            .prepares
            .get(op)
            .is_some_and(|e| e.identity == checksum)
        {
            return Ok(Some(checksum));
        }
        if op <= partition.committed_op {
            self.bus.stats().reject("partition_rewrite_committed");
            tracing::error!(group, op, "refused to rewrite a committed partition op");
            return Ok(None);
        }
        if op <= partition.prepares.head() {
            partition.truncate_after(op - 1).await.map_err(fail)?;
        }
        let head = partition.prepares.head();
        let follows = op == head + 1 || (partition.prepares.is_empty() && op == 1);
        if !follows {
            // Counted (`rejected.journal_append_gap` in /stats), logged at debug: a
            // group that is repairing or fetching its state defers every prepare its
            // primary sends, and the core asks again on each repair timeout (thousands
            // of lines a second at warn, into the journal of the host).
            self.bus.stats().reject("journal_append_gap");
            tracing::debug!(
                group,
                op,
                head,
                "partition journal append past the head deferred"
            );
            return Ok(None);
        }
        let written = write_staged_ops(partition, group, &[(op, frame.clone())])
            .await
            .map_err(fail)?;
        let journaled = written.journaled.first().map(|(_, checksum)| *checksum);
        self.note_written(group, written);
        Ok(journaled)
    }
}

/// Writes `ops` (each following the one before it and the journal's head) to a
/// partition's journal: their batches in one coalesced segment append (split only at a
/// segment roll), then their records in one write. A batch the log refuses, or an inline
/// body too large, ends the list there. Not synced.
async fn write_staged_ops(
    partition: &mut Partition,
    group: u64,
    ops: &[(u64, Frame)],
) -> Result<Written, String> {
    let mut written = Written {
        journaled: Vec::new(),
        refused: Vec::new(),
    };
    if ops.is_empty() {
        return Ok(written);
    }
    // Headers first; an inline body too large ends the list before anything is written
    // (batches past it would be in the log without records).
    let mut headers = Vec::with_capacity(ops.len());
    let mut batches = Vec::new();
    for (op, frame) in ops {
        let Ok((header, _)) = PrepareHeader::read_from_prefix(frame.as_bytes()) else {
            return Err(format!("partition group {group} op {op}: not a prepare"));
        };
        let body = frame.as_bytes().get(256..).unwrap_or(&[]);
        if header.operation == Operation::SendMessages as u8 {
            batches.push(body);
        } else if body.len() > prepares::INLINE_BODY_MAX {
            written.refused.push("partition_prepare_body_too_large");
            break;
        }
        headers.push(header);
    }
    let before = partition.log.position();
    let (receipts, refused) = partition
        .log
        .append_many_verified_deferred(&batches)
        .await
        .map_err(|e| format!("partition group {group}: {e}"))?;
    let mut records = Vec::with_capacity(headers.len());
    let mut receipts = receipts.into_iter();
    let (mut next_offset, mut last_timestamp) = (before.next_offset, before.last_timestamp);
    for ((op, frame), header) in ops.iter().zip(headers) {
        let record = if header.operation == Operation::SendMessages as u8 {
            let Some(receipt) = receipts.next() else {
                // The core checked the stamp against its own position: a refusal here
                // means the log and the core disagree; do not acknowledge.
                if let Some(error) = &refused {
                    tracing::error!(group, op, %error, "partition batch not journaled");
                }
                written.refused.push("partition_append_refused");
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
        written.journaled.push((*op, frame.checksum()));
    }
    partition
        .prepares
        .append_many(&records)
        .await
        .map_err(|e| format!("partition group {group}: {e}"))?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use journal::segment::PartitionConfig;
    use journal::Durability;
    use replication::wire::batch::{stamp, BatchBuilder, NewMessage};
    use replication::wire::{Header, PartitionKey, PrepareChain};

    const KEY: PartitionKey = PartitionKey {
        stream: 1,
        topic: 2,
        partition: 0,
    };

    /// A stamped batch of `count` messages at `base_offset`.
    fn batch(partition_id: u64, base_offset: u64, count: u32) -> Vec<u8> {
        let mut builder = BatchBuilder::with_capacity(count as usize * 200);
        for i in 0..count {
            builder.push(NewMessage {
                id: u128::from(base_offset) + u128::from(i),
                timestamp_delta: 0,
                payload: &[i as u8; 150],
                user_headers: &[],
            });
        }
        let mut bytes = builder.finish(1_000);
        stamp(&mut bytes, partition_id, base_offset, 1_000 + base_offset).unwrap();
        bytes
    }

    /// Chained prepares of ops 1.. with the given operations and bodies.
    fn prepares(group: u64, bodies: &[(Operation, Vec<u8>)]) -> Vec<(u64, Frame)> {
        let mut chain = PrepareChain::after(0);
        bodies
            .iter()
            .enumerate()
            .map(|(i, (operation, body))| {
                let mut header = PrepareHeader::new();
                header.op = i as u64 + 1;
                header.group = group;
                header.operation = *operation as u8;
                (header.op, chain.append(&mut header, body))
            })
            .collect()
    }

    async fn open(dir: &std::path::Path, group: u64) -> Partition {
        let config = PartitionConfig {
            segment_size_max: 1 << 20,
            index_interval_bytes: 4096,
            durability: Durability::EveryBatch,
        };
        super::super::partitions::open(dir, KEY, group, config, Durability::EveryBatch)
            .await
            .unwrap()
            .partition
    }

    fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
        journal::runtime::raise_memlock(64 << 20);
        journal::runtime::block_on(future).expect("executor")
    }

    #[test]
    fn staged_batches_and_inline_ops_are_recorded_in_order_up_to_a_refused_batch() {
        let dir = tempfile::tempdir().unwrap();
        let group = KEY.pack().unwrap();
        let offsets_body = vec![7u8; 13];
        let ops = prepares(
            group,
            &[
                (Operation::SendMessages, batch(group, 0, 3)),
                (Operation::StoreConsumerOffset, offsets_body.clone()),
                (Operation::SendMessages, batch(group, 3, 2)),
                // Does not follow offset 5: refused, and the op after it is not written.
                (Operation::SendMessages, batch(group, 9, 2)),
                (Operation::SendMessages, batch(group, 5, 2)),
            ],
        );
        block_on(async {
            let mut partition = open(dir.path(), group).await;
            let written = write_staged_ops(&mut partition, group, &ops).await.unwrap();
            let journaled: Vec<u64> = written.journaled.iter().map(|(op, _)| *op).collect();
            assert_eq!(journaled, [1, 2, 3]);
            assert_eq!(written.refused, ["partition_append_refused"]);
            assert_eq!(partition.log.next_offset(), 5);
            let entry = |op| partition.prepares.get(op).copied().unwrap();
            assert_eq!((entry(1).base_offset, entry(1).next_offset), (0, 3));
            // The inline op sits at the log position the batch before it left.
            assert_eq!((entry(2).base_offset, entry(2).next_offset), (3, 3));
            assert_eq!((entry(3).base_offset, entry(3).next_offset), (3, 5));
            assert_eq!(entry(3).identity, ops[2].1.checksum());
            assert!(partition.prepares.get(4).is_none());
            partition.sync_journal().await.unwrap();
            partition.log.close().await.unwrap();
            partition.prepares.close().await.unwrap();
            // Reopened: the same records, and every batch they name.
            let opened = super::super::partitions::open(
                dir.path(),
                KEY,
                group,
                PartitionConfig {
                    segment_size_max: 1 << 20,
                    index_interval_bytes: 4096,
                    durability: Durability::EveryBatch,
                },
                Durability::EveryBatch,
            )
            .await
            .unwrap();
            let ops_held: Vec<u64> = opened.records.iter().map(|r| r.op()).collect();
            assert_eq!(ops_held, [1, 2, 3]);
            assert_eq!(opened.records[1].inline, offsets_body);
            assert_eq!(opened.partition.log.next_offset(), 5);
        });
    }

    #[test]
    fn an_inline_body_too_large_stops_the_list_before_any_batch_after_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let group = KEY.pack().unwrap();
        let ops = prepares(
            group,
            &[
                (Operation::SendMessages, batch(group, 0, 3)),
                (
                    Operation::StoreConsumerOffset,
                    vec![1u8; prepares::INLINE_BODY_MAX + 1],
                ),
                (Operation::SendMessages, batch(group, 3, 2)),
            ],
        );
        block_on(async {
            let mut partition = open(dir.path(), group).await;
            let written = write_staged_ops(&mut partition, group, &ops).await.unwrap();
            let journaled: Vec<u64> = written.journaled.iter().map(|(op, _)| *op).collect();
            assert_eq!(journaled, [1]);
            assert_eq!(written.refused, ["partition_prepare_body_too_large"]);
            // Op 3's batch is not in the log without a record.
            assert_eq!(partition.log.next_offset(), 3);
            assert_eq!(partition.prepares.head(), 1);
        });
    }
}
