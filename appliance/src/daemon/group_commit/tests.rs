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

const CONFIG: PartitionConfig = PartitionConfig {
    segment_size_max: 64 << 10,
    index_interval_bytes: 4096,
    durability: Durability::EveryBatch,
};

/// A stamped batch of `count` messages of 150 bytes at `base_offset`.
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

async fn open(dir: &std::path::Path, group: u64) -> super::super::partitions::Opened {
    super::super::partitions::open(dir, KEY, group, CONFIG, Durability::EveryBatch)
        .await
        .unwrap()
}

/// Plans `staged` into one write and runs it.
async fn plan_and_write(
    partition: &mut Partition,
    group: u64,
    staged: &[(u64, Frame)],
) -> PlannedLane {
    partition.prepares.open_for_writes().await.unwrap();
    let mut planned = plan_lane(partition, group, staged)
        .unwrap()
        .expect("no roll needed");
    if let Some(io) = planned.io.take() {
        io.await.unwrap();
    }
    planned
}

fn ops_of(planned: &PlannedLane) -> Vec<u64> {
    planned.ops.iter().map(|(op, _)| *op).collect()
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
    let staged = prepares(
        group,
        &[
            (Operation::SendMessages, batch(group, 0, 3)),
            (Operation::StoreConsumerOffset, offsets_body.clone()),
            (Operation::SendMessages, batch(group, 3, 2)),
            // Does not follow offset 5: refused, and the op after it is dropped.
            (Operation::SendMessages, batch(group, 9, 2)),
            (Operation::SendMessages, batch(group, 5, 2)),
        ],
    );
    block_on(async {
        let mut partition = open(dir.path(), group).await.partition;
        let planned = plan_and_write(&mut partition, group, &staged).await;
        assert_eq!(ops_of(&planned), [1, 2, 3]);
        assert_eq!(planned.refused, ["partition_append_refused"]);
        assert!(planned.drop_rest);
        assert_eq!(partition.log.next_offset(), 5);
        let entry = |op| partition.prepares.get(op).copied().unwrap();
        assert_eq!((entry(1).base_offset, entry(1).next_offset), (0, 3));
        // The inline op sits at the log position the batch before it left.
        assert_eq!((entry(2).base_offset, entry(2).next_offset), (3, 3));
        assert_eq!((entry(3).base_offset, entry(3).next_offset), (3, 5));
        assert_eq!(entry(3).identity, staged[2].1.checksum());
        assert!(partition.prepares.get(4).is_none());
        partition.journal_syncer(group).await.unwrap();
        partition.log.note_synced();
        partition.log.close().await.unwrap();
        partition.prepares.close().await.unwrap();
        // Reopened: the same records, and every batch they name.
        let opened = open(dir.path(), group).await;
        let held: Vec<u64> = opened.records.iter().map(|r| r.op()).collect();
        assert_eq!(held, [1, 2, 3]);
        assert_eq!(opened.records[1].inline, offsets_body);
        assert_eq!(opened.partition.log.next_offset(), 5);
    });
}

#[test]
fn an_inline_body_too_large_stops_the_plan_before_any_batch_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let group = KEY.pack().unwrap();
    let staged = prepares(
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
        let mut partition = open(dir.path(), group).await.partition;
        let planned = plan_and_write(&mut partition, group, &staged).await;
        assert_eq!(ops_of(&planned), [1]);
        assert_eq!(planned.refused, ["partition_prepare_body_too_large"]);
        assert!(planned.drop_rest);
        // Op 3's batch is not in the log without a record.
        assert_eq!(partition.log.next_offset(), 3);
        assert_eq!(partition.prepares.head(), 1);
    });
}

#[test]
fn a_plan_stops_at_the_segment_end_and_the_rest_waits_for_a_roll() {
    let dir = tempfile::tempdir().unwrap();
    let group = KEY.pack().unwrap();
    // 40 batches of 20 messages (~4 KiB each): more than one 64 KiB segment holds.
    let bodies: Vec<(Operation, Vec<u8>)> = (0..40)
        .map(|i| (Operation::SendMessages, batch(group, i * 20, 20)))
        .collect();
    let staged = prepares(group, &bodies);
    block_on(async {
        let mut partition = open(dir.path(), group).await.partition;
        let first = plan_and_write(&mut partition, group, &staged).await;
        let planned = first.ops.len();
        assert!(planned > 1 && planned < staged.len(), "{planned}");
        assert!(first.refused.is_empty() && !first.drop_rest);
        assert_eq!(partition.prepares.head(), planned as u64);
        // The next batch starts a new segment: the plan asks for a roll first.
        assert!(plan_lane(&mut partition, group, &staged[planned..])
            .unwrap()
            .is_none());
        partition.log.roll().await.unwrap();
        let mut at = planned;
        while at < staged.len() {
            let planned = match plan_lane(&mut partition, group, &staged[at..]).unwrap() {
                Some(mut planned) => {
                    planned.io.take().unwrap().await.unwrap();
                    planned
                }
                None => {
                    partition.log.roll().await.unwrap();
                    continue;
                }
            };
            at += planned.ops.len();
        }
        assert_eq!(partition.prepares.head(), 40);
        assert_eq!(partition.log.next_offset(), 800);
        assert!(partition.log.segments().len() > 2);
        let read = partition.log.read_from_offset(0, u64::MAX).unwrap();
        let sent: Vec<Vec<u8>> = bodies.into_iter().map(|(_, b)| b).collect();
        assert_eq!(read, sent);
    });
}
