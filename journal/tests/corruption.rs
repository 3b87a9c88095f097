//! Corruption tests: flip bytes, zero sectors and tear writes in copies of real journal,
//! superblock, segment and snapshot files. Every case must be detected and classified
//! correctly; none may panic; no damaged entry may be accepted as valid.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{batch, body, prepare, run};
use journal::inspect::{journal_verify, segment_verify, superblock as inspect_superblock};
use journal::journal::JOURNAL_FILE;
use journal::layout::{HEADER_SIZE, SECTOR_SIZE};
use journal::recovery::FaultReason;
use journal::segment::log::{
    index_sealed_segment, parse_segment_name, SealedScan, SEALED_SCAN_WINDOW,
};
use journal::segment::{PartitionConfig, PartitionLog, SegmentTail};
use journal::slot::EntryFault;
use journal::snapshot::{checkpoint, load_checkpoint};
use journal::superblock::{CopyFault, SUPERBLOCK_FILE, SUPERBLOCK_RECORD_SIZE};
use journal::{
    Durability, Journal, JournalError, JournalLayout, SlotStatus, Superblock, SuperblockFile,
};

const SLOTS: u64 = 32;
const OPS: u64 = 20;

fn layout() -> JournalLayout {
    JournalLayout::for_body_size(SLOTS, 3 * SECTOR_SIZE).unwrap()
}

/// Body length of `op`: some fit one sector, some span three.
fn body_len(op: u64) -> usize {
    ((op * 2777) % (3 * SECTOR_SIZE)) as usize
}

/// A pristine data directory (journal with ops 1..=OPS, superblock) and its ledger.
fn pristine() -> (tempfile::TempDir, BTreeMap<u64, u128>) {
    let dir = tempfile::tempdir().unwrap();
    let ledger = run(async {
        let mut journal = Journal::create(&dir.path().join(JOURNAL_FILE), layout())
            .await
            .unwrap();
        let mut superblock =
            SuperblockFile::create(&dir.path().join(SUPERBLOCK_FILE), Superblock::default())
                .await
                .unwrap();
        let mut ledger = BTreeMap::new();
        for op in 1..=OPS {
            let durable = journal
                .append(&prepare(op, &body(op, 0, body_len(op))))
                .await
                .unwrap();
            ledger.insert(op, durable.checksum);
        }
        let next = Superblock {
            view: 3,
            log_view: 3,
            commit: OPS,
            ..*superblock.current()
        };
        superblock.write(next).await.unwrap();
        journal.close().await.unwrap();
        superblock.close().await.unwrap();
        ledger
    });
    (dir, ledger)
}

fn mutate(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut image = std::fs::read(path).unwrap();
    f(&mut image);
    std::fs::write(path, image).unwrap();
}

/// Copies a pristine directory so each case starts from the same real files.
fn copy_of(dir: &Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
    }
    copy
}

/// No op is silently lost or silently changed: each is valid with its acked identity,
/// or reported faulty.
fn assert_no_silent_loss(
    dir: &Path,
    ledger: &BTreeMap<u64, u128>,
    case: &str,
) -> journal::Recovery {
    let report = journal_verify(dir).unwrap_or_else(|e| panic!("{case}: verify failed: {e}"));
    let recovery = report.recovery;
    assert!(
        recovery.op_head >= OPS,
        "{case}: head fell to {}",
        recovery.op_head
    );
    for (&op, &checksum) in ledger {
        match recovery.slots[(op % SLOTS) as usize] {
            SlotStatus::Valid {
                op: found,
                checksum: c,
                ..
            } => {
                assert_eq!((found, c), (op, checksum), "{case}: op {op} replaced")
            }
            _ => assert!(
                recovery.faulty.contains(&op),
                "{case}: op {op} neither valid nor faulty"
            ),
        }
    }
    recovery
}

#[test]
fn flipped_body_byte_marks_that_op_faulty() {
    let (dir, ledger) = pristine();
    let op = 7;
    mutate(&dir.path().join(JOURNAL_FILE), |image| {
        image[(layout().prepare_offset(op) + HEADER_SIZE + 5) as usize] ^= 0x10;
    });
    let recovery = assert_no_silent_loss(dir.path(), &ledger, "body flip");
    assert_eq!(recovery.faulty, vec![op]);
    assert_eq!(
        recovery.slots[op as usize],
        SlotStatus::Faulty {
            op,
            reason: FaultReason::Corrupt {
                fault: EntryFault::BodyChecksum
            }
        }
    );
}

#[test]
fn flipped_prepare_header_byte_marks_that_op_faulty_even_at_the_head() {
    let (dir, ledger) = pristine();
    mutate(&dir.path().join(JOURNAL_FILE), |image| {
        image[(layout().prepare_offset(OPS) + 180) as usize] ^= 0x01;
    });
    let recovery = assert_no_silent_loss(dir.path(), &ledger, "header flip");
    // The redundant header vouches the head op was durable: faulty, not a torn tail.
    assert_eq!(recovery.faulty, vec![OPS]);
    assert!(recovery.torn.is_empty());
}

#[test]
fn flipped_redundant_header_is_repaired_from_the_prepare_on_open() {
    let (dir, ledger) = pristine();
    mutate(&dir.path().join(JOURNAL_FILE), |image| {
        image[(layout().header_offset(5) + 100) as usize] ^= 0x80;
    });
    let recovery = assert_no_silent_loss(dir.path(), &ledger, "ring flip");
    assert!(recovery.faulty.is_empty());
    assert_eq!(recovery.header_repairs, vec![5]);
    run(async {
        let (journal, _) = Journal::open(&dir.path().join(JOURNAL_FILE), 0)
            .await
            .unwrap();
        journal.close().await.unwrap();
    });
    assert!(journal_verify(dir.path())
        .unwrap()
        .recovery
        .header_repairs
        .is_empty());
}

#[test]
fn zeroed_sector_inside_a_multi_sector_prepare_is_faulty() {
    let (dir, ledger) = pristine();
    let op = (1..=OPS)
        .find(|op| body_len(*op) as u64 > 2 * SECTOR_SIZE)
        .unwrap();
    mutate(&dir.path().join(JOURNAL_FILE), |image| {
        let at = (layout().prepare_offset(op % SLOTS) + SECTOR_SIZE) as usize;
        image[at..at + SECTOR_SIZE as usize].fill(0);
    });
    let recovery = assert_no_silent_loss(dir.path(), &ledger, "zero sector");
    assert_eq!(recovery.faulty, vec![op]);
}

#[test]
fn torn_append_after_the_head_is_truncated_and_the_journal_continues() {
    let (dir, ledger) = pristine();
    let next = prepare(OPS + 1, &body(OPS + 1, 0, 3 * SECTOR_SIZE as usize));
    // Crash mid-append: only the prepare's first sector landed; the header never did.
    mutate(&dir.path().join(JOURNAL_FILE), |image| {
        let at = layout().prepare_offset((OPS + 1) % SLOTS) as usize;
        image[at..at + SECTOR_SIZE as usize].copy_from_slice(&next[..SECTOR_SIZE as usize]);
    });
    let recovery = assert_no_silent_loss(dir.path(), &ledger, "torn append");
    assert_eq!(
        (recovery.op_head, recovery.torn.clone()),
        (OPS, vec![OPS + 1])
    );
    assert!(recovery.faulty.is_empty());
    run(async {
        let (mut journal, _) = Journal::open(&dir.path().join(JOURNAL_FILE), 0)
            .await
            .unwrap();
        let _ = journal.append(&next).await.unwrap();
        assert_eq!(journal.entry(OPS + 1).unwrap(), &next[..]);
        journal.close().await.unwrap();
    });
}

#[test]
fn torn_append_after_an_append_whose_headers_were_pending_loses_nothing() {
    let (dir, ledger) = pristine();
    let path = dir.path().join(JOURNAL_FILE);
    let mut acked = ledger.clone();
    let frames: Vec<Vec<u8>> = (OPS + 1..=OPS + 6)
        .map(|op| prepare(op, &body(op, 0, body_len(op))))
        .collect();
    let crashed = copy_of(dir.path());
    run(async {
        let (mut journal, _) = Journal::open(&path, 0).await.unwrap();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        for durable in journal.append_batch(&refs[..3]).await.unwrap() {
            acked.insert(durable.op, durable.checksum);
        }
        // A crash while the next group (OPS+4..) is in flight: snapshot the file now,
        // with the acked group's headers pending, then tear the next group into it.
        std::fs::copy(&path, crashed.path().join(JOURNAL_FILE)).unwrap();
        journal.close().await.unwrap();
    });
    mutate(&crashed.path().join(JOURNAL_FILE), |image| {
        for (i, op) in (OPS + 4..=OPS + 6).enumerate() {
            let frame = &frames[3 + i];
            let at = layout().prepare_offset(op % SLOTS) as usize;
            // OPS+4 lands whole, OPS+5 tears after its first sector, OPS+6 lands whole.
            let len = if op == OPS + 5 {
                SECTOR_SIZE as usize
            } else {
                frame.len()
            };
            image[at..at + len].copy_from_slice(&frame[..len]);
        }
        // The pending headers' sector write tore too: the acked group has no header.
        for op in OPS + 1..=OPS + 3 {
            let at = layout().header_offset(op % SLOTS) as usize;
            assert!(image[at..at + 256].iter().all(|b| *b == 0));
        }
    });
    let recovery = assert_no_silent_loss(crashed.path(), &acked, "torn after pending");
    assert!(recovery.faulty.is_empty(), "{recovery:?}");
    assert_eq!(recovery.op_head, OPS + 4);
    assert_eq!(recovery.torn, vec![(OPS + 5) % SLOTS, (OPS + 6) % SLOTS]);
    // The same damage to an acked prepare once its header is on disk: faulty, not torn.
    mutate(&dir.path().join(JOURNAL_FILE), |image| {
        let at = layout().prepare_offset((OPS + 3) % SLOTS) as usize + 300;
        image[at] ^= 0x08;
    });
    let recovery = assert_no_silent_loss(dir.path(), &acked, "flip after close");
    assert_eq!(recovery.faulty, vec![OPS + 3]);
}

#[test]
fn torn_header_ring_sector_loses_nothing() {
    let (dir, ledger) = pristine();
    mutate(&dir.path().join(JOURNAL_FILE), |image| {
        let at = layout().header_ring_offset() as usize + 2048;
        image[at..at + 2048].fill(0xC3);
    });
    let recovery = assert_no_silent_loss(dir.path(), &ledger, "torn ring sector");
    assert!(recovery.faulty.is_empty());
    assert_eq!(recovery.header_repairs, (8..16).collect::<Vec<u64>>());
}

#[test]
fn misdirected_prepare_is_reported_and_not_trusted() {
    let (dir, ledger) = pristine();
    mutate(&dir.path().join(JOURNAL_FILE), |image| {
        let from = layout().prepare_offset(3) as usize;
        let to = layout().prepare_offset(4) as usize;
        let slot = image[from..from + layout().slot_size as usize].to_vec();
        image[to..to + slot.len()].copy_from_slice(&slot);
    });
    let recovery = assert_no_silent_loss(dir.path(), &ledger, "misdirected");
    assert_eq!(recovery.faulty, vec![4]);
    assert!(recovery
        .misdirected
        .iter()
        .any(|m| m.slot == 4 && m.op == 3));
}

#[test]
fn damaged_meta_copy_is_survivable_and_both_damaged_is_an_error() {
    let (dir, _) = pristine();
    let path = dir.path().join(JOURNAL_FILE);
    mutate(&path, |image| image[10] ^= 1);
    let report = journal_verify(dir.path()).unwrap();
    assert!(report.meta_copies[0].is_some() && report.meta_copies[1].is_none());
    mutate(&path, |image| image[SECTOR_SIZE as usize + 20] ^= 1);
    assert!(matches!(
        journal_verify(dir.path()),
        Err(JournalError::Format { .. })
    ));
    let opened = run(async { Journal::open(&path, 0).await.map(|_| ()) });
    assert!(matches!(opened, Err(JournalError::Format { .. })));
}

#[test]
fn truncated_journal_file_is_an_error_not_a_panic() {
    let (dir, _) = pristine();
    mutate(&dir.path().join(JOURNAL_FILE), |image| {
        image.truncate(image.len() / 2)
    });
    assert!(matches!(
        journal_verify(dir.path()),
        Err(JournalError::FileTruncated { .. })
    ));
}

#[test]
fn every_zeroed_sector_is_detected_and_loses_nothing_silently() {
    let (dir, ledger) = pristine();
    let path = dir.path().join(JOURNAL_FILE);
    let pristine_image = std::fs::read(&path).unwrap();
    let layout = layout();
    let sectors = pristine_image.len() as u64 / SECTOR_SIZE;
    let work = copy_of(dir.path());
    for sector in 0..sectors {
        let at = (sector * SECTOR_SIZE) as usize;
        let span = at..at + SECTOR_SIZE as usize;
        if pristine_image[span.clone()].iter().all(|b| *b == 0) {
            continue;
        }
        let mut image = pristine_image.clone();
        image[span].fill(0);
        std::fs::write(work.path().join(JOURNAL_FILE), &image).unwrap();
        let case = format!("zeroed sector {sector}");
        if (sector as usize) < 2 {
            assert!(journal_verify(work.path()).unwrap().meta_copies[sector as usize].is_some());
            continue;
        }
        let recovery = assert_no_silent_loss(work.path(), &ledger, &case);
        let detected = !recovery.faulty.is_empty() || !recovery.header_repairs.is_empty();
        assert!(detected, "{case}: damage went unnoticed");
        if (at as u64) >= layout.prepare_ring_offset() {
            assert_eq!(recovery.faulty.len(), 1, "{case}");
        }
    }
}

#[test]
fn random_byte_flips_are_detected_and_lose_nothing_silently() {
    let (dir, ledger) = pristine();
    let path = dir.path().join(JOURNAL_FILE);
    let pristine_image = std::fs::read(&path).unwrap();
    let layout = layout();
    let work = copy_of(dir.path());
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let mut flips = 0;
    while flips < 300 {
        // Pick a byte that belongs to a written prepare or redundant header.
        let op = rng.u64(1..=OPS);
        let (at, len) = if rng.bool() {
            (layout.header_offset(op % SLOTS), HEADER_SIZE)
        } else {
            (
                layout.prepare_offset(op % SLOTS),
                HEADER_SIZE + body_len(op) as u64,
            )
        };
        let byte = (at + rng.u64(0..len)) as usize;
        let mut image = pristine_image.clone();
        image[byte] ^= 1 << rng.u8(0..8);
        std::fs::write(work.path().join(JOURNAL_FILE), &image).unwrap();
        let case = format!("flip at byte {byte} (op {op})");
        let recovery = assert_no_silent_loss(work.path(), &ledger, &case);
        assert!(
            recovery.faulty == vec![op] || recovery.header_repairs == vec![op % SLOTS],
            "{case}: misclassified {:?} / {:?}",
            recovery.faulty,
            recovery.header_repairs
        );
        flips += 1;
    }
}

// ---- superblock ----

fn superblock_dir(writes: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let path = dir.path().join(SUPERBLOCK_FILE);
        let mut superblock = SuperblockFile::create(&path, Superblock::default())
            .await
            .unwrap();
        for view in 1..=writes {
            let next = Superblock {
                view,
                log_view: view,
                commit: u64::from(view) * 10,
                ..*superblock.current()
            };
            superblock.write(next).await.unwrap();
        }
        superblock.close().await.unwrap();
    });
    dir
}

#[test]
fn any_flipped_superblock_byte_is_detected_and_the_other_copies_win() {
    let dir = superblock_dir(4);
    let path = dir.path().join(SUPERBLOCK_FILE);
    let pristine_image = std::fs::read(&path).unwrap();
    let expected = inspect_superblock(dir.path()).unwrap().current.unwrap();
    assert_eq!((expected.sequence, expected.view), (5, 4));
    for copy in 0..4usize {
        for byte in 0..SUPERBLOCK_RECORD_SIZE {
            let mut image = pristine_image.clone();
            image[copy * SECTOR_SIZE as usize + byte] ^= 0x04;
            std::fs::write(&path, &image).unwrap();
            let report = inspect_superblock(dir.path()).unwrap();
            assert_eq!(report.current, Some(expected), "copy {copy} byte {byte}");
            assert!(
                report.copies[copy].fault.is_some() && !report.ok,
                "copy {copy} byte {byte}"
            );
        }
    }
}

#[test]
fn crash_while_writing_a_superblock_copy_loses_nothing() {
    let dir = superblock_dir(2);
    let path = dir.path().join(SUPERBLOCK_FILE);
    let old = inspect_superblock(dir.path()).unwrap().current.unwrap();
    // Simulate the next write: copy 0 done, copy 1 torn halfway, copies 2-3 untouched.
    let newer = dir_with_one_more_write(&dir);
    let new_image = std::fs::read(&newer).unwrap();
    mutate(&path, |image| {
        let half = SUPERBLOCK_RECORD_SIZE / 2;
        image[..SECTOR_SIZE as usize].copy_from_slice(&new_image[..SECTOR_SIZE as usize]);
        let at = SECTOR_SIZE as usize;
        image[at..at + half].copy_from_slice(&new_image[at..at + half]);
    });
    let report = inspect_superblock(dir.path()).unwrap();
    assert_eq!(report.current.unwrap().sequence, old.sequence + 1);
    assert_eq!(report.copies[1].fault, Some(CopyFault::Checksum));
    // Torn before any copy completed: the old state stands.
    mutate(&path, |image| {
        image[..SECTOR_SIZE as usize].fill(0);
        image[SECTOR_SIZE as usize..2 * SECTOR_SIZE as usize].fill(0);
    });
    assert_eq!(inspect_superblock(dir.path()).unwrap().current, Some(old));
}

fn dir_with_one_more_write(dir: &tempfile::TempDir) -> PathBuf {
    let copy = copy_of(dir.path()).keep();
    run(async {
        let mut superblock = SuperblockFile::open(&copy.join(SUPERBLOCK_FILE))
            .await
            .unwrap();
        let next = Superblock {
            view: superblock.current().view + 1,
            ..*superblock.current()
        };
        superblock.write(next).await.unwrap();
        superblock.close().await.unwrap();
    });
    copy.join(SUPERBLOCK_FILE)
}

#[test]
fn misdirected_superblock_copy_and_total_loss_are_reported() {
    let dir = superblock_dir(1);
    let path = dir.path().join(SUPERBLOCK_FILE);
    mutate(&path, |image| {
        let first = image[..SECTOR_SIZE as usize].to_vec();
        image[2 * SECTOR_SIZE as usize..3 * SECTOR_SIZE as usize].copy_from_slice(&first);
    });
    let report = inspect_superblock(dir.path()).unwrap();
    assert_eq!(
        report.copies[2].fault,
        Some(CopyFault::Misdirected { copy: 0 })
    );
    mutate(&path, |image| image.fill(0));
    assert_eq!(inspect_superblock(dir.path()).unwrap().current, None);
    let opened = run(async { SuperblockFile::open(&path).await.map(|_| ()) });
    assert!(matches!(opened, Err(JournalError::SuperblockLost { .. })));
}

// ---- segments ----

const PARTITION: u64 = 5;

fn segment_dir() -> (tempfile::TempDir, Vec<Vec<u8>>) {
    let dir = tempfile::tempdir().unwrap();
    let batches = run(async {
        let config = PartitionConfig {
            segment_size_max: 64 * 1024,
            index_interval_bytes: 2048,
            durability: Durability::EveryBatch,
        };
        let (mut log, _) = PartitionLog::open(dir.path(), PARTITION, config)
            .await
            .unwrap();
        let mut batches = Vec::new();
        for i in 0..12u64 {
            let bytes = batch(
                PARTITION,
                log.next_offset(),
                100 + i,
                4,
                200 + 37 * i as usize,
            );
            let _ = log.append(&bytes).await.unwrap();
            batches.push(bytes);
        }
        log.close().await.unwrap();
        batches
    });
    (dir, batches)
}

fn segment_path(dir: &Path) -> PathBuf {
    dir.join(format!("{:020}.log", 0))
}

#[test]
fn every_flipped_segment_byte_is_detected_and_never_accepted() {
    let (dir, batches) = segment_dir();
    let path = segment_path(dir.path());
    let pristine_image = std::fs::read(&path).unwrap();
    let last_start = pristine_image.len() - batches.last().unwrap().len();
    for byte in (0..pristine_image.len()).step_by(7) {
        let mut image = pristine_image.clone();
        image[byte] ^= 0x20;
        std::fs::write(&path, &image).unwrap();
        let report = segment_verify(&path).unwrap();
        assert!(!report.ok, "flip at {byte} accepted");
        assert!(
            report.valid_len <= byte as u64,
            "flip at {byte} inside the accepted prefix"
        );
        match report.tail {
            SegmentTail::Corrupt { resumes_at, .. } => {
                assert_eq!(resumes_at.is_none(), byte >= last_start, "flip at {byte}")
            }
            SegmentTail::Discontinuity { .. } => {}
            other => panic!("flip at {byte} classified {other:?}"),
        }
    }
}

#[test]
fn torn_last_segment_write_is_truncated_and_reopen_continues() {
    let (dir, batches) = segment_dir();
    let path = segment_path(dir.path());
    let full = std::fs::read(&path).unwrap().len();
    mutate(&path, |image| image.truncate((full - 1) / 512 * 512));
    let report = segment_verify(&path).unwrap();
    assert!(
        matches!(report.tail, SegmentTail::Torn { .. }),
        "{:?}",
        report.tail
    );
    assert_eq!(
        report.valid_len as usize,
        full - batches.last().unwrap().len()
    );
    run(async {
        let config = PartitionConfig {
            segment_size_max: 64 * 1024,
            index_interval_bytes: 2048,
            durability: Durability::EveryBatch,
        };
        let (log, open) = PartitionLog::open(dir.path(), PARTITION, config)
            .await
            .unwrap();
        assert!(open.truncated_tail.is_some());
        assert_eq!(log.next_offset(), 44);
        log.close().await.unwrap();
    });
}

#[test]
fn corrupt_active_segment_refuses_to_open_rather_than_truncate_acked_data() {
    let (dir, batches) = segment_dir();
    let path = segment_path(dir.path());
    mutate(&path, |image| image[batches[0].len() + 400] ^= 1);
    let result = run(async {
        let config = PartitionConfig {
            segment_size_max: 64 * 1024,
            index_interval_bytes: 2048,
            durability: Durability::EveryBatch,
        };
        PartitionLog::open(dir.path(), PARTITION, config)
            .await
            .map(|_| ())
    });
    assert!(
        matches!(result, Err(JournalError::SegmentCorrupt { .. })),
        "{result:?}"
    );
}

// ---- snapshots ----

#[test]
fn damaged_snapshot_is_refused_against_the_superblock() {
    let (dir, _) = pristine();
    let snapshots = dir.path().join("snapshots");
    let info = run(async {
        let mut journal = Journal::open(&dir.path().join(JOURNAL_FILE), 0)
            .await
            .unwrap()
            .0;
        let mut superblock = SuperblockFile::open(&dir.path().join(SUPERBLOCK_FILE))
            .await
            .unwrap();
        let info = checkpoint(
            &snapshots,
            &mut superblock,
            &mut journal,
            10,
            b"metadata state",
        )
        .await
        .unwrap();
        assert_eq!(journal.op_checkpoint(), 10);
        journal.close().await.unwrap();
        superblock.close().await.unwrap();
        info
    });
    let (current, _) = journal::superblock::read(&dir.path().join(SUPERBLOCK_FILE)).unwrap();
    assert_eq!(
        (current.op_checkpoint, current.snapshot_checksum),
        (10, info.checksum)
    );
    let (loaded, payload) = load_checkpoint(&snapshots, &current).unwrap().unwrap();
    assert_eq!(
        (loaded.op, payload.as_slice()),
        (10, &b"metadata state"[..])
    );
    mutate(&info.path, |image| image[30] ^= 1);
    assert!(matches!(
        load_checkpoint(&snapshots, &current),
        Err(JournalError::SnapshotInvalid { .. })
    ));
}

#[test]
fn garbage_files_are_errors_or_reports_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = fastrand::Rng::with_seed(7);
    for len in [0usize, 1, 255, 4096, 3 * 4096 + 17, 200_000] {
        let garbage: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
        std::fs::write(dir.path().join(JOURNAL_FILE), &garbage).unwrap();
        std::fs::write(dir.path().join(SUPERBLOCK_FILE), &garbage).unwrap();
        let segment = dir.path().join(format!("{:020}.log", 0));
        std::fs::write(&segment, &garbage).unwrap();
        assert!(
            journal_verify(dir.path()).is_err(),
            "garbage journal of {len} bytes accepted"
        );
        assert_eq!(inspect_superblock(dir.path()).unwrap().current, None);
        let report = segment_verify(&segment).unwrap();
        assert!(
            !report.ok || len == 0,
            "garbage segment of {len} bytes accepted"
        );
        assert_eq!(report.batches, 0);
    }
}

/// The base offsets of the segment files in `dir`, ascending.
fn segment_bases(dir: &Path) -> Vec<u64> {
    let mut bases: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| parse_segment_name(&e.file_name().to_string_lossy()))
        .collect();
    bases.sort_unstable();
    bases
}

#[test]
fn a_sealed_segment_verified_and_indexed_apart_is_loaded_by_the_open_and_bad_ones_refused() {
    let config = PartitionConfig {
        segment_size_max: 64 * 1024,
        index_interval_bytes: 2048,
        durability: Durability::EveryBatch,
    };
    let dir = tempfile::tempdir().unwrap();
    let end = run(async {
        let (mut log, _) = PartitionLog::open(dir.path(), PARTITION, config)
            .await
            .unwrap();
        for i in 0..80u64 {
            let bytes = batch(PARTITION, log.next_offset(), 100 + i, 4, 400);
            let _ = log.append(&bytes).await.unwrap();
        }
        let end = log.next_offset();
        log.close().await.unwrap();
        end
    });
    let bases = segment_bases(dir.path());
    assert!(bases.len() >= 3, "{bases:?}");
    // The segment files alone in a fresh directory, as a state transfer stages them.
    let staged = tempfile::tempdir().unwrap();
    let log_name = |base: u64| format!("{base:020}.log");
    for base in &bases {
        std::fs::copy(
            dir.path().join(log_name(*base)),
            staged.path().join(log_name(*base)),
        )
        .unwrap();
    }
    let sealed = &bases[..bases.len() - 1];
    for (i, base) in sealed.iter().enumerate() {
        let path = staged.path().join(log_name(*base));
        let next = index_sealed_segment(&path, staged.path(), PARTITION, *base, config).unwrap();
        assert_eq!(
            next,
            bases[i + 1],
            "segment {base} ends where the next begins"
        );
    }
    let (rebuilt, opened_end) = run(async {
        let (log, report) = PartitionLog::open(staged.path(), PARTITION, config)
            .await
            .unwrap();
        let end = log.next_offset();
        log.close().await.unwrap();
        (report.rebuilt_indexes, end)
    });
    assert!(
        rebuilt.is_empty(),
        "indexes written apart are loaded: {rebuilt:?}"
    );
    assert_eq!(opened_end, end);

    // A flipped byte, a base that does not match the batches, another partition's
    // segment: each refused.
    let first = staged.path().join(log_name(bases[0]));
    let second = staged.path().join(log_name(bases[1]));
    let refused = |path: &Path, partition: u64, base: u64| {
        matches!(
            index_sealed_segment(path, staged.path(), partition, base, config),
            Err(JournalError::SegmentCorrupt { .. })
        )
    };
    assert!(refused(&second, PARTITION, bases[1] + 1));
    assert!(refused(&second, PARTITION + 1, bases[1]));
    mutate(&first, |image| image[600] ^= 1);
    assert!(refused(&first, PARTITION, bases[0]));
}

#[test]
fn a_sealed_segment_scanned_a_window_at_a_time_indexes_like_the_log_and_refuses_damage_anywhere() {
    let config = PartitionConfig {
        segment_size_max: 4 << 20,
        index_interval_bytes: 4096,
        durability: Durability::EveryBatch,
    };
    let dir = tempfile::tempdir().unwrap();
    run(async {
        let (mut log, _) = PartitionLog::open(dir.path(), PARTITION, config)
            .await
            .unwrap();
        for i in 0..60u64 {
            // Mostly batches of ~100 KiB; every 20th is larger than a scan window.
            let (count, payload) = if i % 20 == 7 {
                (3, 500_000)
            } else {
                (10, 10_000)
            };
            let bytes = batch(PARTITION, log.next_offset(), 100 + i, count, payload);
            let _ = log.append(&bytes).await.unwrap();
        }
        log.close().await.unwrap();
    });
    let bases = segment_bases(dir.path());
    assert!(bases.len() >= 2, "{bases:?}");
    let name = |base: u64, extension: &str| format!("{base:020}.{extension}");
    let sealed = &bases[..bases.len() - 1];
    let staged = tempfile::tempdir().unwrap();
    let mut buffer = Vec::new();
    for (i, base) in sealed.iter().enumerate() {
        let path = dir.path().join(name(*base, "log"));
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(
            len > 2 * SEALED_SCAN_WINDOW as u64,
            "segment of {len} bytes"
        );
        let mut scan = SealedScan::open(&path, PARTITION, *base, config, buffer).unwrap();
        let mut steps = 0;
        let next = loop {
            steps += 1;
            if let Some(next) = scan.step(64 * 1024).unwrap() {
                break next;
            }
        };
        assert_eq!(
            next,
            bases[i + 1],
            "segment {base} ends where the next begins"
        );
        assert!(steps > 10, "{steps} steps of 64 KiB for {len} bytes");
        scan.write_index(staged.path()).unwrap();
        buffer = scan.into_buffer();
        // The same index files as the log wrote when it sealed the segment.
        for extension in ["index", "timeindex"] {
            assert_eq!(
                std::fs::read(staged.path().join(name(*base, extension))).unwrap(),
                std::fs::read(dir.path().join(name(*base, extension))).unwrap(),
                "{extension} of {base}"
            );
        }
    }

    // Damage past the first windows, then a byte after the last batch: each refused at
    // the position of what is wrong.
    let path = dir.path().join(name(bases[0], "log"));
    let scan_all = |path: &Path| {
        let mut scan = SealedScan::open(path, PARTITION, bases[0], config, Vec::new()).unwrap();
        loop {
            match scan.step(256 * 1024) {
                Ok(Some(_)) => return None,
                Ok(None) => {}
                Err(JournalError::SegmentCorrupt { position, .. }) => return Some(position),
                Err(other) => panic!("{other}"),
            }
        }
    };
    assert_eq!(scan_all(&path), None);
    let image = std::fs::read(&path).unwrap();
    let flipped = image.len() - 1000;
    let mut damaged = image.clone();
    damaged[flipped] ^= 1;
    std::fs::write(&path, &damaged).unwrap();
    let position = scan_all(&path).expect("a flipped byte is found");
    assert!(
        position as usize <= flipped && position as usize > 2 * SEALED_SCAN_WINDOW,
        "refused at {position}, flipped {flipped}"
    );
    let mut trailing = image.clone();
    trailing.extend_from_slice(&[0u8; 700]);
    trailing.push(9);
    std::fs::write(&path, &trailing).unwrap();
    assert_eq!(scan_all(&path), Some(image.len() as u64));
    std::fs::write(&path, &image).unwrap();
    assert_eq!(
        index_sealed_segment(&path, staged.path(), PARTITION, bases[0], config).unwrap(),
        bases[1]
    );
}
