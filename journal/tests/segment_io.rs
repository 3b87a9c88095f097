//! Partition segment logs through real direct IO: append, roll, read by offset and by
//! timestamp, index rebuild, torn-tail truncation, retention.

mod common;

use std::time::Duration;

use common::{batch, run};
use journal::durability::Durability;
use journal::segment::{PartitionConfig, PartitionLog};
use journal::JournalError;

const PARTITION: u64 = 42;

fn config(durability: Durability) -> PartitionConfig {
    PartitionConfig {
        segment_size_max: 64 * 1024,
        index_interval_bytes: 4096,
        durability,
    }
}

/// Appends `n` batches of 5 messages (offsets 5i..5i+5, timestamp 1000 + 10i).
async fn fill(log: &mut PartitionLog, n: u64) -> Vec<Vec<u8>> {
    let mut batches = Vec::new();
    for i in 0..n {
        let bytes = batch(
            PARTITION,
            log.next_offset(),
            1000 + 10 * i,
            5,
            300 + (i as usize % 7) * 100,
        );
        let receipt = log.append(&bytes).await.unwrap();
        assert_eq!(receipt.next_offset, 5 * (i + 1));
        batches.push(bytes);
    }
    batches
}

#[test]
fn batches_roll_into_segments_and_read_back_by_offset_and_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let (mut log, report) =
            PartitionLog::open(dir.path(), PARTITION, config(Durability::EveryBatch))
                .await
                .unwrap();
        assert_eq!(report.segments, 1);
        let batches = fill(&mut log, 100).await;
        assert!(log.segments().len() > 3, "no roll: {:?}", log.segments());
        for segment in log.segments() {
            assert!(segment.2 <= 64 * 1024);
        }
        // By offset: offset 237 lives in batch 47.
        let read = log.read_from_offset(237, 1).unwrap();
        assert_eq!(read, vec![batches[47].clone()]);
        let read = log.read_from_offset(0, u64::MAX).unwrap();
        assert_eq!(read, batches);
        assert!(matches!(
            log.read_from_offset(500, 1),
            Err(JournalError::OffsetOutOfRange { .. })
        ));
        // By timestamp: the first batch stamped at or after 1555 is batch 56.
        assert_eq!(
            log.read_from_timestamp(1555, 1).unwrap(),
            vec![batches[56].clone()]
        );
        assert!(log.read_from_timestamp(99_999, 1).unwrap().is_empty());
        log.close().await.unwrap();

        let (log, report) =
            PartitionLog::open(dir.path(), PARTITION, config(Durability::EveryBatch))
                .await
                .unwrap();
        assert!(report.rebuilt_indexes.is_empty() && report.truncated_tail.is_none());
        assert_eq!(log.next_offset(), 500);
        assert_eq!(
            log.read_from_offset(237, 1).unwrap(),
            vec![batches[47].clone()]
        );
        log.close().await.unwrap();
    });
}

#[test]
fn missing_index_files_are_rebuilt_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let (mut log, _) = PartitionLog::open(dir.path(), PARTITION, config(Durability::None))
            .await
            .unwrap();
        let batches = fill(&mut log, 60).await;
        log.close().await.unwrap();
        let mut removed = 0;
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let path = entry.unwrap().path();
            if path
                .extension()
                .is_some_and(|e| e == "index" || e == "timeindex")
            {
                std::fs::remove_file(path).unwrap();
                removed += 1;
            }
        }
        assert!(removed >= 2);
        let (log, report) = PartitionLog::open(dir.path(), PARTITION, config(Durability::None))
            .await
            .unwrap();
        assert_eq!(report.rebuilt_indexes.len(), report.segments - 1);
        assert_eq!(
            log.read_from_timestamp(1300, 1).unwrap(),
            vec![batches[30].clone()]
        );
        log.close().await.unwrap();
    });
}

#[test]
fn torn_tail_of_the_active_segment_is_truncated_on_open() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let (mut log, _) =
            PartitionLog::open(dir.path(), PARTITION, config(Durability::EveryBatch))
                .await
                .unwrap();
        fill(&mut log, 3).await;
        log.close().await.unwrap();
        let path = dir.path().join(format!("{:020}.log", 0));
        let mut image = std::fs::read(&path).unwrap();
        let cut = image.len() - 100;
        image.truncate(cut);
        std::fs::write(&path, &image).unwrap();
        let (mut log, report) =
            PartitionLog::open(dir.path(), PARTITION, config(Durability::EveryBatch))
                .await
                .unwrap();
        assert!(report.truncated_tail.is_some());
        assert_eq!(log.next_offset(), 10);
        // The log continues where the valid prefix ended.
        let next = batch(PARTITION, 10, 2000, 2, 50);
        let _ = log.append(&next).await.unwrap();
        log.close().await.unwrap();
        let (log, report) =
            PartitionLog::open(dir.path(), PARTITION, config(Durability::EveryBatch))
                .await
                .unwrap();
        assert!(report.truncated_tail.is_none());
        assert_eq!(log.read_from_offset(10, 1).unwrap(), vec![next]);
        log.close().await.unwrap();
    });
}

#[test]
fn batches_that_do_not_follow_the_log_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let (mut log, _) =
            PartitionLog::open(dir.path(), PARTITION, config(Durability::EveryBatch))
                .await
                .unwrap();
        let wrong_offset = batch(PARTITION, 7, 1, 1, 10);
        assert!(matches!(
            log.append(&wrong_offset).await,
            Err(JournalError::BatchRejected { .. })
        ));
        let wrong_partition = batch(PARTITION + 1, 0, 1, 1, 10);
        assert!(matches!(
            log.append(&wrong_partition).await,
            Err(JournalError::BatchRejected { .. })
        ));
        let mut tampered = batch(PARTITION, 0, 1, 1, 10);
        *tampered.last_mut().unwrap() ^= 1;
        assert!(matches!(
            log.append(&tampered).await,
            Err(JournalError::BatchRejected { .. })
        ));
        assert_eq!(log.next_offset(), 0);
        log.close().await.unwrap();
    });
}

/// A batch the caller already verified is appended with only its stamp checked: it must
/// still follow the log, and its body is not hashed again (so a body the caller should
/// never have vouched for is stored, and found by the scan of the next open).
#[test]
fn verified_appends_check_the_stamp_but_not_the_body_and_recovery_still_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let (mut log, _) =
            PartitionLog::open(dir.path(), PARTITION, config(Durability::EveryBatch))
                .await
                .unwrap();
        let first = batch(PARTITION, 0, 1, 3, 50);
        assert_eq!(
            log.append_verified_deferred(&first)
                .await
                .unwrap()
                .next_offset,
            3
        );
        for wrong in [
            batch(PARTITION, 7, 2, 1, 10),
            batch(PARTITION + 1, 3, 2, 1, 10),
            batch(PARTITION, 3, 0, 1, 10),
        ] {
            assert!(matches!(
                log.append_verified_deferred(&wrong).await,
                Err(JournalError::BatchRejected { .. })
            ));
        }
        let mut tampered = batch(PARTITION, 3, 2, 1, 10);
        *tampered.last_mut().unwrap() ^= 1;
        assert!(matches!(
            log.append_deferred(&tampered).await,
            Err(JournalError::BatchRejected { .. })
        ));
        assert_eq!(log.next_offset(), 3);
        log.append_verified_deferred(&tampered).await.unwrap();
        assert_eq!(log.next_offset(), 4);
        log.sync().await.unwrap();
        log.close().await.unwrap();
        match PartitionLog::open(dir.path(), PARTITION, config(Durability::EveryBatch)).await {
            Err(JournalError::SegmentCorrupt { position, .. }) => {
                assert_eq!(position, first.len() as u64, "found at the tampered batch")
            }
            Err(other) => panic!("the open must refuse the stored bad batch: {other}"),
            Ok(_) => panic!("the open must refuse the stored bad batch"),
        }
    });
}

#[test]
fn retention_deletes_whole_old_segments_only() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let (mut log, _) = PartitionLog::open(dir.path(), PARTITION, config(Durability::None))
            .await
            .unwrap();
        fill(&mut log, 100).await;
        let before = log.segments();
        let cut = before[2].0; // base offset of the third segment
        assert_eq!(log.delete_segments_before(cut).unwrap(), 2);
        assert_eq!(log.start_offset(), cut);
        assert!(!before[0].1.exists() && before[2].1.exists());
        assert!(matches!(
            log.read_from_offset(0, 1),
            Err(JournalError::OffsetOutOfRange { .. })
        ));
        assert_eq!(log.read_from_offset(cut, 1).unwrap().len(), 1);
        // Never the active segment, even when asked to delete everything.
        log.delete_segments_before(u64::MAX).unwrap();
        assert_eq!(log.segments().len(), 1);
        log.close().await.unwrap();
    });
}

#[test]
fn segments_taken_for_retention_leave_the_log_before_their_files_go() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let (mut log, _) = PartitionLog::open(dir.path(), PARTITION, config(Durability::None))
            .await
            .unwrap();
        fill(&mut log, 100).await;
        let before = log.segments();
        let cut = before[2].0;
        // A cut inside the third segment takes only the two wholly below it.
        let files = log.take_segments_before(cut + 1);
        assert_eq!(files.len(), 6);
        assert_eq!(files[0], before[0].1);
        assert_eq!(log.start_offset(), cut);
        assert!(before[0].1.exists(), "the files are the caller's to remove");
        assert_eq!(log.read_from_offset(cut, 1).unwrap().len(), 1);
        for path in &files {
            let _ = std::fs::remove_file(path);
        }
        log.close().await.unwrap();
        // Reopened, the log starts where the taken segments ended.
        let (mut log, _) = PartitionLog::open(dir.path(), PARTITION, config(Durability::None))
            .await
            .unwrap();
        assert_eq!(log.start_offset(), cut);
        // Never the active segment.
        log.take_segments_before(u64::MAX);
        assert_eq!(log.segments().len(), 1);
        log.close().await.unwrap();
    });
}

#[test]
fn interval_durability_syncs_once_the_interval_passes() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let policy = Durability::Interval {
            interval: Duration::from_millis(20),
        };
        let (mut log, _) = PartitionLog::open(dir.path(), PARTITION, config(policy))
            .await
            .unwrap();
        let receipt = log.append(&batch(PARTITION, 0, 1, 1, 10)).await.unwrap();
        assert!(!receipt.durable);
        assert!(!log.tick().await.unwrap());
        glommio::timer::sleep(Duration::from_millis(25)).await;
        assert!(log.tick().await.unwrap());
        let receipt = log.append(&batch(PARTITION, 1, 2, 1, 10)).await.unwrap();
        assert!(!receipt.durable);
        log.close().await.unwrap();
    });
}

#[test]
fn an_uncommitted_suffix_is_truncated_at_a_batch_boundary_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let (mut log, _) =
            PartitionLog::open(dir.path(), PARTITION, config(Durability::EveryBatch))
                .await
                .unwrap();
        let batches = fill(&mut log, 100).await;
        let segments = log.segments();
        assert!(segments.len() > 3);
        // Inside the active segment.
        log.truncate_from(490).await.unwrap();
        assert_eq!(log.next_offset(), 490);
        assert_eq!(log.read_from_offset(0, u64::MAX).unwrap(), batches[..98]);
        // At the base of a sealed segment: that segment and every newer one go.
        let base = segments[2].0;
        log.truncate_from(base).await.unwrap();
        assert_eq!(log.next_offset(), base);
        assert_eq!(log.segments().len(), 2);
        // Inside a sealed segment, not at a boundary: refused, nothing changes.
        assert!(log.truncate_from(base - 3).await.is_err());
        assert_eq!(log.next_offset(), base);
        // Mid-segment boundary; then appending continues from there.
        let cut = base - 10;
        log.truncate_from(cut).await.unwrap();
        assert_eq!(log.next_offset(), cut);
        let n = (cut / 5) as usize;
        assert_eq!(log.read_from_offset(0, u64::MAX).unwrap(), batches[..n]);
        let again = batch(PARTITION, cut, 5_000, 5, 333);
        log.append(&again).await.unwrap();
        log.close().await.unwrap();
        let (log, report) =
            PartitionLog::open(dir.path(), PARTITION, config(Durability::EveryBatch))
                .await
                .unwrap();
        assert!(report.truncated_tail.is_none());
        assert_eq!(log.next_offset(), cut + 5);
        let mut expected = batches[..n].to_vec();
        expected.push(again);
        assert_eq!(log.read_from_offset(0, u64::MAX).unwrap(), expected);
        assert_eq!(log.read_from_timestamp(5_000, 1).unwrap().len(), 1);
    });
}

#[test]
fn index_memory_counts_the_segments_and_grows_with_the_data_then_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(Durability::EveryBatch);
    let (counted, reopened) = run(async {
        let (mut log, _) = PartitionLog::open(dir.path(), PARTITION, config)
            .await
            .unwrap();
        let (segments, empty) = log.index_memory();
        assert_eq!(segments, 1);
        let mut last = empty;
        for i in 0..40u64 {
            let bytes = batch(PARTITION, log.next_offset(), 1000 + i, 8, 900);
            log.append(&bytes).await.unwrap();
            let (_, now) = log.index_memory();
            assert!(now >= last, "index memory shrank: {last} -> {now}");
            last = now;
        }
        let counted = log.index_memory();
        log.close().await.unwrap();
        let (log, _) = PartitionLog::open(dir.path(), PARTITION, config)
            .await
            .unwrap();
        let reopened = log.index_memory();
        log.close().await.unwrap();
        (counted, reopened)
    });
    let files = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".log"))
        })
        .count();
    assert!(counted.0 > 1, "the appends rolled segments: {counted:?}");
    assert_eq!(counted.0, files);
    // One 16-byte entry per index interval at least, for ~290 KiB of batches.
    assert!(counted.1 >= 16 * 40, "{counted:?}");
    assert_eq!(reopened.0, counted.0);
    assert!(reopened.1 >= 16 * 40, "{reopened:?}");
}

/// Stamped batches of varied sizes following each other from offset 0.
fn chain_of_batches(n: u64) -> Vec<Vec<u8>> {
    let mut next = 0;
    (0..n)
        .map(|i| {
            let count = 1 + (i % 4) as u32;
            let bytes = batch(
                PARTITION,
                next,
                2000 + i,
                count,
                200 + (i as usize % 9) * 157,
            );
            next += u64::from(count);
            bytes
        })
        .collect()
}

/// A log in `dir` holding `batches`, appended one at a time and synced: the reference
/// the coalesced and planned writes are compared with.
async fn one_at_a_time(dir: &std::path::Path, batches: &[Vec<u8>]) -> PartitionLog {
    let (mut one, _) = PartitionLog::open(dir, PARTITION, config(Durability::EveryBatch))
        .await
        .unwrap();
    for bytes in batches {
        one.append_verified_deferred(bytes).await.unwrap();
    }
    one.sync().await.unwrap();
    one
}

/// Both logs hold the same segments, byte for byte.
fn assert_same_segments(a: &PartitionLog, b: &PartitionLog) {
    assert_eq!(a.position(), b.position());
    let (a, b) = (a.segments(), b.segments());
    assert_eq!(a.len(), b.len());
    for ((base_a, path_a, len_a), (base_b, path_b, len_b)) in a.iter().zip(&b) {
        assert_eq!((base_a, len_a), (base_b, len_b));
        let bytes_a = std::fs::read(path_a).unwrap();
        let bytes_b = std::fs::read(path_b).unwrap();
        assert!(bytes_a == bytes_b, "segment {base_a} differs");
    }
}

#[test]
fn a_plan_stops_at_the_first_batch_that_does_not_follow() {
    use journal::segment::Plan;
    let dir = tempfile::tempdir().unwrap();
    let batches = chain_of_batches(6);
    run(async {
        let (mut log, _) =
            PartitionLog::open(dir.path(), PARTITION, config(Durability::EveryBatch))
                .await
                .unwrap();
        // Batch 3 is left out, so batch 4 does not follow batch 2.
        let slices: Vec<&[u8]> = [0, 1, 2, 4, 5]
            .iter()
            .map(|&i| batches[i].as_slice())
            .collect();
        let Plan::Planned(planned) = log.plan_many_verified(&slices).unwrap() else {
            panic!("an empty segment needs no roll");
        };
        assert_eq!(planned.receipts.len(), 3);
        assert!(
            matches!(planned.refused, Some(JournalError::BatchRejected { .. })),
            "{:?}",
            planned.refused
        );
        let info = replication::wire::batch::info_of_verified(&batches[2]).unwrap();
        assert_eq!(log.next_offset(), info.next_offset());
        planned.write.unwrap().run().await.unwrap();
        assert_eq!(
            log.read_from_offset(0, u64::MAX).unwrap(),
            batches[..3].to_vec()
        );
        // The log goes on from there.
        let rest: Vec<&[u8]> = batches[3..].iter().map(Vec::as_slice).collect();
        let Plan::Planned(planned) = log.plan_many_verified(&rest).unwrap() else {
            panic!("the segment has room");
        };
        assert!(planned.refused.is_none());
        assert_eq!(planned.receipts.len(), 3);
        planned.write.unwrap().run().await.unwrap();
        assert_eq!(log.read_from_offset(0, u64::MAX).unwrap(), batches);
        log.sync().await.unwrap();
        log.close().await.unwrap();
    });
}

#[test]
fn planned_writes_run_beside_syncs_leave_the_same_files_as_appends() {
    use journal::segment::Plan;
    let one_dir = tempfile::tempdir().unwrap();
    let planned_dir = tempfile::tempdir().unwrap();
    let batches = chain_of_batches(150);
    run(async {
        let config = config(Durability::EveryBatch);
        let one = one_at_a_time(one_dir.path(), &batches).await;
        let (mut log, _) = PartitionLog::open(planned_dir.path(), PARTITION, config)
            .await
            .unwrap();
        let mut at = 0;
        let mut rolls = 0;
        let mut pending_sync = None;
        while at < batches.len() {
            let end = (at + 7).min(batches.len());
            let slices: Vec<&[u8]> = batches[at..end].iter().map(Vec::as_slice).collect();
            let planned = match log.plan_many_verified(&slices).unwrap() {
                Plan::Planned(planned) => planned,
                Plan::RollFirst => {
                    // Nothing may be in flight across a roll.
                    if let Some(sync) = pending_sync.take() {
                        journal::segment::Syncer::run(sync).await.unwrap();
                    }
                    log.roll().await.unwrap();
                    rolls += 1;
                    continue;
                }
            };
            assert!(planned.refused.is_none());
            assert!(!planned.receipts.is_empty());
            // The position counts the plan before its write runs.
            assert_eq!(
                log.next_offset(),
                planned.receipts.last().unwrap().next_offset
            );
            // The previous plan's sync runs beside this plan's write.
            let write = planned.write.unwrap().run();
            match pending_sync.take() {
                Some(sync) => {
                    let (w, s) =
                        futures_lite::future::zip(write, journal::segment::Syncer::run(sync)).await;
                    w.unwrap();
                    s.unwrap();
                }
                None => write.await.unwrap(),
            }
            pending_sync = Some(log.syncer());
            at += planned.receipts.len();
        }
        if let Some(sync) = pending_sync.take() {
            sync.run().await.unwrap();
        }
        log.note_synced();
        assert!(rolls > 2, "no roll");
        assert_same_segments(&one, &log);
        assert_eq!(log.read_from_offset(0, u64::MAX).unwrap(), batches);
        one.close().await.unwrap();
        log.close().await.unwrap();
    });
}

#[test]
fn a_log_refuses_to_close_while_a_planned_write_holds_its_file() {
    use journal::segment::Plan;
    let dir = tempfile::tempdir().unwrap();
    let batches = chain_of_batches(3);
    run(async {
        let (mut log, _) =
            PartitionLog::open(dir.path(), PARTITION, config(Durability::EveryBatch))
                .await
                .unwrap();
        let slices: Vec<&[u8]> = batches.iter().map(Vec::as_slice).collect();
        let Plan::Planned(planned) = log.plan_many_verified(&slices).unwrap() else {
            panic!("an empty segment needs no roll");
        };
        let write = planned.write.unwrap();
        let closed = log.close().await;
        assert!(
            matches!(&closed, Err(JournalError::Io { .. })),
            "{closed:?}"
        );
        write.run().await.unwrap();
    });
}

#[test]
fn a_read_plan_runs_on_another_thread_while_the_log_goes_on() {
    use journal::segment::ReadFrom;
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let (mut log, _) = PartitionLog::open(dir.path(), PARTITION, config(Durability::None))
            .await
            .unwrap();
        let batches = fill(&mut log, 60).await;
        // Planned up to offset 200 (batch 40), before more batches and segments come.
        let plan = log.read_plan(ReadFrom::Offset(37), 200, u64::MAX).unwrap();
        let by_time = log.read_plan(ReadFrom::Timestamp(1_205), 300, 1).unwrap();
        let small = log.read_plan(ReadFrom::Offset(0), 300, 1).unwrap();
        let segments_before = log.segments().len();
        for i in 60..120 {
            let bytes = common::batch(PARTITION, log.next_offset(), 1000 + 10 * i, 5, 400);
            log.append(&bytes).await.unwrap();
        }
        assert!(log.segments().len() > segments_before);
        let (read, by_time, small) = std::thread::spawn(move || {
            let mut infos = Vec::new();
            plan.read(&mut |bytes, info| {
                infos.push((info.base_offset, bytes.len()));
                true
            })
            .unwrap();
            (
                infos,
                by_time.read_all().unwrap(),
                small.read_all().unwrap(),
            )
        })
        .join()
        .unwrap();
        // Batch 7 holds offset 37; batches from offset 200 on are not read.
        let expected: Vec<_> = (7..40)
            .map(|i| (5 * i, batches[i as usize].len()))
            .collect();
        assert_eq!(read, expected);
        // Timestamp 1205 is batch 21's (1000 + 10 * 21 = 1210 is the first at or after).
        assert_eq!(by_time, vec![batches[21].clone()]);
        assert_eq!(small, vec![batches[0].clone()]);
        // A timestamp that the second segment's first batch bears exactly: the first
        // segment holds no batch that late, and the read still finds it.
        let second = log.segments()[1].0;
        let stamp = 1000 + 10 * (second / 5);
        assert_eq!(
            log.read_from_timestamp(stamp, 1).unwrap(),
            vec![batches[(second / 5) as usize].clone()]
        );
        // A segment that retention removed before the read opens it is NotFound.
        let late = log.read_plan(ReadFrom::Offset(0), 300, u64::MAX).unwrap();
        let first = log.segments()[0].1.clone();
        std::fs::remove_file(&first).unwrap();
        match late.read_all() {
            Err(JournalError::Io { source, .. }) => {
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound)
            }
            other => panic!("expected NotFound, got {other:?}"),
        }
        log.close().await.unwrap();
    });
}
