//! The metadata journal through real direct IO: append, reopen, read by op, truncate,
//! repair, and the wrap rule.

mod common;

use common::{body, prepare, run};
use journal::{Journal, JournalError, JournalLayout};

fn layout() -> JournalLayout {
    JournalLayout::for_body_size(16, 8000).unwrap()
}

#[test]
fn appended_entries_survive_reopen_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let frames: Vec<Vec<u8>> = (1..=10)
        .map(|op| prepare(op, &body(op, 0, op as usize * 500)))
        .collect();
    run(async {
        let mut journal = Journal::create(&path, layout()).await.unwrap();
        for frame in &frames {
            let durable = journal.append(frame).await.unwrap();
            assert_eq!(journal.entry(durable.op).unwrap(), &frame[..]);
        }
        journal.close().await.unwrap();
        let (journal, recovery) = Journal::open(&path, 0).await.unwrap();
        assert!(recovery.is_clean(), "{recovery:?}");
        assert_eq!(journal.op_head(), 10);
        for (i, frame) in frames.iter().enumerate() {
            assert_eq!(journal.entry(i as u64 + 1).unwrap(), &frame[..]);
            assert_eq!(journal.header(i as u64 + 1).unwrap().op, i as u64 + 1);
        }
        assert!(matches!(
            journal.entry(11),
            Err(JournalError::EntryMissing { op: 11 })
        ));
    });
}

#[test]
fn appends_must_be_contiguous_sealed_and_fit_the_slot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    run(async {
        let mut journal = Journal::create(&path, layout()).await.unwrap();
        let gap = prepare(2, b"x");
        assert!(matches!(
            journal.append(&gap).await,
            Err(JournalError::OpOutOfOrder { op: 2, expected: 1 })
        ));
        let mut tampered = prepare(1, b"abc");
        *tampered.last_mut().unwrap() ^= 1;
        assert!(matches!(
            journal.append(&tampered).await,
            Err(JournalError::PrepareInvalid { .. })
        ));
        // An unsealed prepare inside a group: nothing of the group is appended, and the
        // valid op before it (already submitted) does not reappear after a reopen.
        let valid = prepare(1, b"ok");
        let mut unsealed = prepare(2, b"abc");
        *unsealed.last_mut().unwrap() ^= 1;
        assert!(matches!(
            journal.append_batch(&[&valid, &unsealed]).await,
            Err(JournalError::PrepareInvalid { .. })
        ));
        assert_eq!(journal.op_head(), 0);
        let huge = prepare(1, &vec![0; 20_000]);
        assert!(matches!(
            journal.append(&huge).await,
            Err(JournalError::PrepareTooLarge { .. })
        ));
        assert_eq!(journal.op_head(), 0);
        journal.close().await.unwrap();
        let (journal, recovery) = Journal::open(&path, 0).await.unwrap();
        assert_eq!((journal.op_head(), recovery.is_clean()), (0, true));
        assert!(recovery.torn.is_empty(), "{recovery:?}");
    });
}

/// The on-disk write order of one flush per append: an append's redundant header reaches
/// the disk with the next flush, never before its prepare is durable, and an
/// acknowledged prepare whose header is still pending survives a crash.
#[test]
fn redundant_headers_follow_their_prepares_by_one_flush() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let crashed = dir.path().join("crashed");
    let layout = layout();
    let frames: Vec<Vec<u8>> = (1..=9)
        .map(|op| prepare(op, &body(op, 0, 700 * op as usize)))
        .collect();
    let header_on_disk = |image: &[u8], op: u64| {
        let at = layout.header_offset(op % layout.slot_count) as usize;
        image[at..at + 256] == frames[op as usize - 1][..256]
    };
    run(async {
        let mut journal = Journal::create(&path, layout).await.unwrap();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        for frame in &refs[..4] {
            let _ = journal.append(frame).await.unwrap();
        }
        let _ = journal.append_batch(&refs[4..7]).await.unwrap();
        // A crash now: ops 1..=7 acknowledged, the headers of 5..=7 still pending.
        std::fs::copy(&path, &crashed).unwrap();
        let image = std::fs::read(&crashed).unwrap();
        assert!((1..=4).all(|op| header_on_disk(&image, op)));
        assert!((5..=7).all(|op| !header_on_disk(&image, op)));
        // A tick right after an append leaves them to the next append and does no IO
        // at all; a tick that finds the journal idle writes them with one fdatasync;
        // the tick after that has nothing to do.
        let before = journal.io();
        journal.tick().await.unwrap();
        assert_eq!(journal.io(), before, "a tick right after an append did IO");
        let image = std::fs::read(&path).unwrap();
        assert!((5..=7).all(|op| !header_on_disk(&image, op)));
        journal.tick().await.unwrap();
        let flushed = journal.io();
        assert_eq!(flushed.syncs, before.syncs + 1);
        assert!(flushed.writes > before.writes);
        let image = std::fs::read(&path).unwrap();
        assert!((1..=7).all(|op| header_on_disk(&image, op)));
        journal.tick().await.unwrap();
        assert_eq!(
            journal.io(),
            flushed,
            "an idle tick with nothing pending did IO"
        );
        journal.sync_headers().await.unwrap();
        let _ = journal.append_batch(&refs[7..]).await.unwrap();
        journal.close().await.unwrap();
        let image = std::fs::read(&path).unwrap();
        assert!((1..=9).all(|op| header_on_disk(&image, op)));

        let (journal, recovery) = Journal::open(&crashed, 0).await.unwrap();
        assert!(
            recovery.is_clean() && recovery.torn.is_empty(),
            "{recovery:?}"
        );
        assert_eq!(recovery.op_head, 7);
        assert_eq!(recovery.header_repairs, vec![5, 6, 7]);
        for op in 1..=7 {
            assert_eq!(journal.entry(op).unwrap(), &frames[op as usize - 1][..]);
        }
        journal.close().await.unwrap();
        // Open rewrote the missing headers durably.
        let image = std::fs::read(&crashed).unwrap();
        assert!((1..=7).all(|op| header_on_disk(&image, op)));
    });
}

#[test]
fn wrap_requires_a_checkpoint_and_then_reuses_slots() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    run(async {
        let mut journal = Journal::create(&path, layout()).await.unwrap();
        for op in 1..=16 {
            let _ = journal
                .append(&prepare(op, &body(op, 0, 100)))
                .await
                .unwrap();
        }
        assert!(matches!(
            journal.append(&prepare(17, b"x")).await,
            Err(JournalError::WrapBeyondCheckpoint { op: 17, .. })
        ));
        journal.set_checkpoint(8).unwrap();
        for op in 17..=24 {
            let _ = journal
                .append(&prepare(op, &body(op, 0, 100)))
                .await
                .unwrap();
        }
        assert!(journal.entry(8).is_err());
        journal.close().await.unwrap();
        let (journal, recovery) = Journal::open(&path, 8).await.unwrap();
        assert!(recovery.is_clean());
        assert_eq!((journal.op_min(), journal.op_head()), (9, 24));
        assert_eq!(
            journal.entry(24).unwrap(),
            &prepare(24, &body(24, 0, 100))[..]
        );
    });
}

#[test]
fn truncated_suffix_does_not_come_back_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    run(async {
        let mut journal = Journal::create(&path, layout()).await.unwrap();
        for op in 1..=6 {
            let _ = journal
                .append(&prepare(op, &body(op, 0, 100)))
                .await
                .unwrap();
        }
        journal.truncate_after(3).await.unwrap();
        assert_eq!(journal.op_head(), 3);
        let replacement = prepare(4, &body(4, 1, 100));
        let _ = journal.append(&replacement).await.unwrap();
        journal.close().await.unwrap();
        let (journal, recovery) = Journal::open(&path, 0).await.unwrap();
        assert!(recovery.is_clean(), "{recovery:?}");
        assert_eq!(journal.op_head(), 4);
        assert_eq!(journal.entry(4).unwrap(), &replacement[..]);
    });
}

#[test]
fn faulty_entry_is_reported_then_repaired_from_a_peer_copy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let frames: Vec<Vec<u8>> = (1..=5).map(|op| prepare(op, &body(op, 0, 300))).collect();
    run(async {
        let mut journal = Journal::create(&path, layout()).await.unwrap();
        for frame in &frames {
            let _ = journal.append(frame).await.unwrap();
        }
        journal.close().await.unwrap();
    });
    // Corrupt op 3's body on disk.
    let layout = layout();
    let mut image = std::fs::read(&path).unwrap();
    image[(layout.prepare_offset(3) + 300) as usize] ^= 0x80;
    std::fs::write(&path, &image).unwrap();
    run(async {
        let (mut journal, recovery) = Journal::open(&path, 0).await.unwrap();
        assert_eq!(recovery.faulty, vec![3]);
        assert!(journal.entry(3).is_err());
        assert!(matches!(
            journal.write_repair(&frames[1]).await,
            Err(JournalError::RepairUnexpected { op: 2 })
        ));
        let _ = journal.write_repair(&frames[2]).await.unwrap();
        assert_eq!(journal.entry(3).unwrap(), &frames[2][..]);
        journal.close().await.unwrap();
        let (_, recovery) = Journal::open(&path, 0).await.unwrap();
        assert!(recovery.is_clean());
    });
}

#[test]
fn group_commit_appends_every_op_durably() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let frames: Vec<Vec<u8>> = (1..=6).map(|op| prepare(op, &body(op, 0, 3000))).collect();
    run(async {
        let mut journal = Journal::create(&path, layout()).await.unwrap();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let durable = journal.append_batch(&refs[..4]).await.unwrap();
        assert_eq!(
            durable.iter().map(|d| d.op).collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );
        assert!(matches!(
            journal.append_batch(&[refs[5]]).await,
            Err(JournalError::OpOutOfOrder { op: 6, expected: 5 })
        ));
        let _ = journal.append_batch(&refs[4..]).await.unwrap();
        journal.close().await.unwrap();
        let (journal, recovery) = Journal::open(&path, 0).await.unwrap();
        assert!(recovery.is_clean() && recovery.op_head == 6);
        for (i, frame) in frames.iter().enumerate() {
            assert_eq!(journal.entry(i as u64 + 1).unwrap(), &frame[..]);
        }
    });
}

#[test]
fn entries_after_a_torn_group_commit_never_reappear() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let layout = layout();
    run(async {
        let mut journal = Journal::create(&path, layout).await.unwrap();
        for op in 1..=3 {
            let _ = journal
                .append(&prepare(op, &body(op, 0, 100)))
                .await
                .unwrap();
        }
        journal.close().await.unwrap();
    });
    // A crashed group commit of ops 4..=6: prepares 4 and 6 landed, 5 tore, no headers.
    let mut image = std::fs::read(&path).unwrap();
    for op in [4u64, 6] {
        let frame = prepare(op, &body(op, 9, 100));
        let at = layout.prepare_offset(op) as usize;
        image[at..at + frame.len()].copy_from_slice(&frame);
    }
    let torn = prepare(5, &body(5, 9, 100));
    let at = layout.prepare_offset(5) as usize;
    image[at..at + 200].copy_from_slice(&torn[..200]);
    std::fs::write(&path, &image).unwrap();
    let fresh5 = prepare(5, &body(5, 1, 100));
    run(async {
        let (mut journal, recovery) = Journal::open(&path, 0).await.unwrap();
        assert_eq!((recovery.op_head, recovery.torn.clone()), (4, vec![5, 6]));
        assert!(recovery.is_clean());
        let _ = journal.append(&fresh5).await.unwrap();
        journal.close().await.unwrap();
        // The old op 6 (verified but unacknowledged, after the torn op) must not come back.
        let (journal, recovery) = Journal::open(&path, 0).await.unwrap();
        assert_eq!(recovery.op_head, 5, "{recovery:?}");
        assert_eq!(journal.entry(5).unwrap(), &fresh5[..]);
        assert!(journal.entry(6).is_err());
    });
}

#[test]
fn data_dir_formats_once_and_reopens_from_its_checkpoint() {
    use journal::data_dir::{format, open};
    use journal::Superblock;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let identity = Superblock {
        cluster: 99,
        replica: 2,
        replica_count: 3,
        ..Superblock::default()
    };
    run(async {
        format(&root, layout(), identity).await.unwrap();
        assert!(matches!(
            format(&root, layout(), identity).await,
            Err(JournalError::Format { .. })
        ));
        let mut data = open(&root).await.unwrap();
        assert!(data.checkpoint.is_none() && data.recovery.is_clean());
        for op in 1..=12 {
            let _ = data
                .journal
                .append(&prepare(op, &body(op, 0, 64)))
                .await
                .unwrap();
        }
        data.checkpoint(10, b"state at 10").await.unwrap();
        data.close().await.unwrap();
        let data = open(&root).await.unwrap();
        let (info, payload) = data.checkpoint.clone().unwrap();
        assert_eq!((info.op, payload.as_slice()), (10, &b"state at 10"[..]));
        assert_eq!(data.superblock.current().replica, 2);
        assert_eq!((data.journal.op_min(), data.journal.op_head()), (11, 12));
        data.close().await.unwrap();
    });
}

#[test]
fn interrupted_format_can_be_run_again() {
    use journal::data_dir::{format, is_formatted};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    std::fs::create_dir_all(&root).unwrap();
    // A format that died after writing part of the journal and no superblock.
    std::fs::write(root.join("journal"), b"partial").unwrap();
    assert!(!is_formatted(&root));
    run(async {
        format(&root, layout(), journal::Superblock::default())
            .await
            .unwrap();
    });
    assert!(is_formatted(&root));
}

#[test]
fn checkpoint_installed_beyond_the_head_moves_the_journal_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    run(async {
        let mut journal = Journal::create(&path, layout()).await.unwrap();
        for op in 1..=5 {
            let _ = journal
                .append(&prepare(op, &body(op, 0, 80)))
                .await
                .unwrap();
        }
        // State transfer installed a snapshot at op 40.
        journal.set_checkpoint(40).unwrap();
        assert_eq!((journal.op_head(), journal.op_min()), (40, 41));
        let _ = journal.append(&prepare(41, b"after")).await.unwrap();
        journal.close().await.unwrap();
        let (journal, recovery) = Journal::open(&path, 40).await.unwrap();
        assert!(recovery.is_clean(), "{recovery:?}");
        assert_eq!(journal.op_head(), 41);
        assert!(journal.entry(5).is_err());
    });
}

#[test]
fn repair_serving_streams_contiguous_verified_prepares_or_range_evicted() {
    use journal::RepairServe;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let frames: Vec<Vec<u8>> = (1..=24).map(|op| prepare(op, &body(op, 0, 200))).collect();
    run(async {
        let mut journal = Journal::create(&path, layout()).await.unwrap();
        for frame in &frames[..16] {
            let _ = journal.append(frame).await.unwrap();
        }
        journal.set_checkpoint(8).unwrap();
        for frame in &frames[16..] {
            let _ = journal.append(frame).await.unwrap();
        }
        journal.close().await.unwrap();
    });
    // Damage op 14 so serving stops before it.
    let mut image = std::fs::read(&path).unwrap();
    image[(layout().prepare_offset(14) + 300) as usize] ^= 1;
    std::fs::write(&path, &image).unwrap();
    run(async {
        let (journal, recovery) = Journal::open(&path, 8).await.unwrap();
        assert_eq!(recovery.faulty, vec![14]);
        assert_eq!(
            journal.serve_repair(3, 10, 100),
            RepairServe::RangeEvicted { op_min: 9 }
        );
        match journal.serve_repair(9, 20, 100) {
            RepairServe::Prepares { prepares, last_op } => {
                assert_eq!(last_op, 13);
                assert_eq!(
                    prepares,
                    frames[8..13].iter().map(Vec::as_slice).collect::<Vec<_>>()
                );
            }
            other => panic!("{other:?}"),
        }
        match journal.serve_repair(15, 40, 3) {
            RepairServe::Prepares { prepares, last_op } => {
                assert_eq!((prepares.len(), last_op), (3, 17));
            }
            other => panic!("{other:?}"),
        }
        journal.close().await.unwrap();
    });
}

/// A snapshot installed by state transfer lands beyond the journal's head: after a
/// reopen the superblock names it, the journal continues right after it, and entries
/// below it are no longer required.
#[test]
fn a_snapshot_installed_beyond_the_head_survives_reopen_and_the_journal_continues() {
    let dir = tempfile::tempdir().unwrap();
    let identity = journal::Superblock {
        cluster: 1,
        replica: 2,
        replica_count: 3,
        ..Default::default()
    };
    run(async {
        journal::data_dir::format(dir.path(), layout(), identity)
            .await
            .unwrap();
        let mut data = journal::data_dir::open(dir.path()).await.unwrap();
        for op in 1..=3 {
            let durable = data.journal.append(&prepare(op, &body(op, 0, 100))).await;
            assert_eq!(durable.unwrap().op, op);
        }
        // Not above the current checkpoint: refused.
        data.install_checkpoint(50, b"state at 50").await.unwrap();
        assert!(data.install_checkpoint(50, b"again").await.is_err());
        assert_eq!(data.journal.op_checkpoint(), 50);
        assert_eq!(data.journal.op_head(), 50);
        let durable = data.journal.append(&prepare(51, &body(51, 0, 100))).await;
        assert_eq!(
            durable.unwrap().op,
            51,
            "the journal continues after the snapshot"
        );
        data.close().await.unwrap();

        let data = journal::data_dir::open(dir.path()).await.unwrap();
        let (info, payload) = data.checkpoint.clone().expect("installed snapshot");
        assert_eq!((info.op, payload.as_slice()), (50, &b"state at 50"[..]));
        assert_eq!(data.superblock.current().op_checkpoint, 50);
        assert_eq!(data.journal.op_head(), 51);
        assert_eq!(data.journal.header(51).unwrap().op, 51);
        assert!(
            data.journal.entry(3).is_err(),
            "ops below the snapshot are gone"
        );
        data.close().await.unwrap();
    });
}

#[test]
fn join_all_runs_its_futures_together_and_keeps_their_order() {
    use std::cell::RefCell;
    use std::future::poll_fn;
    use std::task::Poll;
    // Each future starts, yields once (as one waiting for IO would), then ends: run
    // together, every one starts before any ends; one after the other, they would not.
    let events = RefCell::new(Vec::new());
    let outputs = run(async {
        let step = |i: usize| {
            let events = &events;
            async move {
                events.borrow_mut().push(format!("start {i}"));
                let mut yielded = false;
                poll_fn(|cx| {
                    if yielded {
                        Poll::Ready(())
                    } else {
                        yielded = true;
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                })
                .await;
                events.borrow_mut().push(format!("end {i}"));
                i * 10
            }
        };
        journal::join_all((0..3).map(step)).await
    });
    assert_eq!(outputs, vec![0, 10, 20]);
    assert_eq!(
        events.into_inner(),
        ["start 0", "start 1", "start 2", "end 0", "end 1", "end 2"]
    );
}

/// `frames` built into the journal's own write buffers.
fn in_buffers(journal: &mut Journal, frames: &[Vec<u8>]) -> Vec<journal::PrepareBuffer> {
    frames
        .iter()
        .map(|frame| {
            let mut buffer = journal.prepare_buffer(frame.len()).unwrap();
            buffer.as_bytes_mut().copy_from_slice(frame);
            buffer
        })
        .collect()
}

#[test]
fn prepares_built_in_journal_buffers_are_appended_without_a_copy_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let frames: Vec<Vec<u8>> = (1..=12)
        .map(|op| prepare(op, &body(op, 3, 700 * op as usize)))
        .collect();
    run(async {
        let mut journal = Journal::create(&path, layout()).await.unwrap();
        // Copied and built-in-place groups interleave on one journal.
        let refs: Vec<&[u8]> = frames[..3].iter().map(Vec::as_slice).collect();
        journal.append_batch(&refs).await.unwrap();
        for group in frames[3..].chunks(4) {
            // Dirty the pool's buffers first: the padding after each prepare must be
            // zeroed by the append, not inherited from an earlier, longer prepare.
            let mut dirty = journal.prepare_buffer(8000).unwrap();
            dirty.as_bytes_mut().fill(0xEE);
            drop(dirty);
            let owned = in_buffers(&mut journal, group);
            let durable = journal.append_buffers(owned).await.unwrap();
            assert_eq!(durable.len(), group.len());
            for (receipt, frame) in durable.iter().zip(group) {
                assert_eq!(journal.entry(receipt.op).unwrap(), &frame[..]);
            }
        }
        assert_eq!(journal.op_head(), 12);
        journal.close().await.unwrap();
        let (journal, recovery) = Journal::open(&path, 0).await.unwrap();
        assert!(recovery.is_clean(), "{recovery:?}");
        assert_eq!(journal.op_head(), 12);
        for (i, frame) in frames.iter().enumerate() {
            assert_eq!(journal.entry(i as u64 + 1).unwrap(), &frame[..]);
        }
    });
    // The slot bytes after each prepare are zero on disk.
    let image = std::fs::read(&path).unwrap();
    let layout = layout();
    for (i, frame) in frames.iter().enumerate() {
        let at = layout.prepare_offset(layout.slot_of(i as u64 + 1)) as usize;
        let padded = frame.len().div_ceil(4096) * 4096;
        assert!(
            image[at + frame.len()..at + padded].iter().all(|b| *b == 0),
            "op {} padding",
            i + 1
        );
    }
}

#[test]
fn buffer_appends_check_order_size_and_header_and_change_nothing_on_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    run(async {
        let mut journal = Journal::create(&path, layout()).await.unwrap();
        let slot = journal.layout().slot_size as usize;
        assert!(matches!(
            journal.prepare_buffer(slot + 1),
            Err(JournalError::PrepareTooLarge { .. })
        ));
        // A gap in the group.
        let frames = vec![prepare(1, b"a"), prepare(3, b"c")];
        let owned = in_buffers(&mut journal, &frames);
        assert!(matches!(
            journal.append_buffers(owned).await,
            Err(JournalError::OpOutOfOrder { op: 3, expected: 2 })
        ));
        // A damaged header.
        let mut damaged = prepare(1, b"a");
        damaged[40] ^= 0x10;
        let owned = in_buffers(&mut journal, &[damaged]);
        assert!(matches!(
            journal.append_buffers(owned).await,
            Err(JournalError::PrepareInvalid { .. })
        ));
        assert_eq!(journal.op_head(), 0);
        // The journal goes on from where it was.
        let owned = in_buffers(&mut journal, &[prepare(1, b"a"), prepare(2, b"b")]);
        journal.append_buffers(owned).await.unwrap();
        assert_eq!(journal.op_head(), 2);
        journal.close().await.unwrap();
        let (journal, recovery) = Journal::open(&path, 0).await.unwrap();
        assert!(recovery.is_clean(), "{recovery:?}");
        assert_eq!(journal.op_head(), 2);
    });
}
